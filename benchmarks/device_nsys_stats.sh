#!/usr/bin/env bash
# nsys stats on the GPU machine (where nsys exists; needs only bash, python3 and this repo: no polars). Two modes.
#
# 1. Peer (c) of the benchmark: `nsys stats --report cuda_gpu_kern_sum` on the same 10M-kernel SYNTHETIC SQLite.
#      mkdir -p .gpu && cp /work/shared/device-libs/* .gpu/   # then, on the device (carry: [".gpu"]):
#      bash benchmarks/device_nsys_stats.sh 10M "$OUT"
#
# 2. Reference CSVs for `tracekit kernels` (tests/results/test_kernels.py): `nsys stats --report cuda_gpu_kern_sum
#    --format csv` on every nsys SQLite export (.sqlite, or .sqlite.gz decompressed first) under each folder given,
#    packed with an index that names each CSV's trace, in ONE tarball: $OUT/nsys_stats.tar.gz.
#      bash benchmarks/device_nsys_stats.sh refs "$OUT" sample=sample_traces shared=.gpu/ext data=tests/data/nsys
#    KIND=DIR: KIND is how the test finds the trace again (sample: sample_traces/, shared: the external traces
#    folder read in place, data: tests/data/); DIR is where it lies on this machine. The tarball unpacks into
#    tests/data/ as nsys_stats/<KIND>-<path with / as __>.csv plus nsys_stats/index-<time>.toml (one [[ref]] per
#    CSV: csv, trace = "KIND:<path under DIR>", nsys version); $OUT/nsys_stats.log says what ran and what failed.
#    Every export is read from a throwaway copy under /tmp: nsys stats may add indexes to an export it reads.
#    EXTRA_REPORTS="cuda_gpu_mem_time_sum cuda_api_sum nvtx_sum" (the `tracekit stats` tables,
#    tests/results/test_stats.py) runs those reports in the same nsys stats call: each report's CSVs go to
#    nsys_stats/<report>/<KIND>-<path>.csv with an index-<time>.toml of their own there (the kernel CSVs and their
#    index stay where they were).
set -u
MODE=${1:-10M}; OUT=${2:-/tmp/nsys_stats_out}; mkdir -p "$OUT"
NSYS=${NSYS:-/opt/nvidia/nsight-compute/2025.3.1/host/target-linux-x64/nsys}
export LD_LIBRARY_PATH=$PWD/.gpu:${LD_LIBRARY_PATH:-}

if [ "$MODE" != refs ]; then
  SIZE=$MODE
  DB=/tmp/nsys_${SIZE}.sqlite
  python3 benchmarks/make_nsys.py --kernels "$SIZE" -o "$DB" > "$OUT/make.json"
  nproc > "$OUT/machine.txt"; free -g >> "$OUT/machine.txt"; "$NSYS" --version >> "$OUT/machine.txt" 2>&1
  timeout ${STATS_TIMEOUT:-190} /usr/bin/time -v "$NSYS" stats --report cuda_gpu_kern_sum --format csv --force-export=false \
    --output "$OUT/kern_sum" "$DB" > "$OUT/stats.log" 2> "$OUT/time.txt"
  echo "rc=$?" >> "$OUT/stats.log"
  grep -E "Elapsed|Maximum resident" "$OUT/time.txt"
  head -c 1500 "$OUT"/kern_sum*.csv 2>/dev/null; tail -5 "$OUT/stats.log"
  exit 0
fi

shift 2
[ $# -gt 0 ] || { echo "refs mode: give at least one KIND=DIR (sample=sample_traces ...)" >&2; exit 2; }
WORK=$(mktemp -d /tmp/nsys_refs.XXXXXX)
STAGE=$WORK/stage/nsys_stats; mkdir -p "$STAGE"
LOG=$OUT/nsys_stats.log; : > "$LOG"
VERSION=$("$NSYS" --version 2>/dev/null | grep -oE '[0-9]{4}\.[0-9]+\.[0-9]+(\.[0-9]+)?' | head -1)
STAMP=$(date -u +%Y-%m-%d)
INDEX=$STAGE/index-$(date -u +%Y%m%dT%H%M%S).toml  # (one per run: two runs' indexes unpack side by side)
{ echo "# nsys stats --report cuda_gpu_kern_sum --format csv, run by benchmarks/device_nsys_stats.sh refs on $STAMP"
  echo "# (nsys ${VERSION:-unknown} on $(hostname)); trace = KIND:path (tests/results/test_kernels.py resolves it)"; } > "$INDEX"
echo "nsys: $NSYS (${VERSION:-version unknown})" >> "$LOG"
ok=0; failed=0
for spec in "$@"; do
  kind=${spec%%=*}; dir=${spec#*=}; dir=${dir%/}
  case "$kind" in sample|shared|data) ;; *) echo "unknown KIND in $spec (sample, shared or data)" >&2; exit 2;; esac
  [ -d "$dir" ] || { echo "$spec: no such folder" >> "$LOG"; continue; }
  while IFS= read -r -d '' f; do
    rel=${f#"$dir"/}
    slug=$kind-$(printf '%s' "$rel" | sed -e 's/\.sqlite\(\.gz\)\{0,1\}$//' -e 's#/#__#g' -e 's/[^A-Za-z0-9._-]/_/g')
    db=$WORK/$slug.sqlite
    case "$f" in *.gz) gzip -dc "$f" > "$db" ;; *) cp "$f" "$db" ;; esac
    extra=(); for r in ${EXTRA_REPORTS:-}; do extra+=(--report "$r"); done
    timeout "${STATS_TIMEOUT:-120}" "$NSYS" stats --report cuda_gpu_kern_sum "${extra[@]}" --format csv \
      --force-export=false --output "$WORK/$slug" "$db" > "$WORK/$slug.out" 2>&1
    rc=$?
    for r in ${EXTRA_REPORTS:-}; do  # (nsys names each <prefix>_<report>.csv)
      rcsv=$(ls "$WORK/$slug"*"_$r".csv 2>/dev/null | head -1)
      if [ -n "$rcsv" ] && [ -s "$rcsv" ]; then
        mkdir -p "$STAGE/$r"
        rindex=$STAGE/$r/$(basename "$INDEX")
        [ -f "$rindex" ] || echo "# nsys stats --report $r --format csv (nsys ${VERSION:-unknown}); trace = KIND:path" > "$rindex"
        mv "$rcsv" "$STAGE/$r/$slug.csv"
        { echo; echo "[[ref]]"; echo "csv = \"tests/data/nsys_stats/$r/$slug.csv\""; echo "trace = \"$kind:$rel\""
          echo "nsys = \"${VERSION:-unknown}\""; } >> "$rindex"
        echo "ok   $kind:$rel -> $r/$slug.csv" >> "$LOG"
      fi
    done
    csv=$(ls "$WORK/$slug"*_cuda_gpu_kern_sum.csv 2>/dev/null | head -1)
    if [ -n "$csv" ] && [ -s "$csv" ]; then
      mv "$csv" "$STAGE/$slug.csv"
      { echo; echo "[[ref]]"; echo "csv = \"tests/data/nsys_stats/$slug.csv\""; echo "trace = \"$kind:$rel\""
        echo "nsys = \"${VERSION:-unknown}\""; } >> "$INDEX"
      ok=$((ok + 1)); echo "ok   $kind:$rel -> $slug.csv (rc=$rc)" >> "$LOG"
    else  # (an export without kernels, or one this nsys cannot read: its words go to the log)
      failed=$((failed + 1)); echo "none $kind:$rel (rc=$rc): $(tr '\n' ' ' < "$WORK/$slug.out" | cut -c1-400)" >> "$LOG"
    fi
    rm -f "$db" "$WORK/$slug"*.csv
  done < <(find -L "$dir" \( -name '*.sqlite' -o -name '*.sqlite.gz' \) -type f -print0 | sort -z)
done
tar czf "$OUT/nsys_stats.tar.gz" -C "$WORK/stage" nsys_stats
echo "csv: $ok, without a CSV: $failed" >> "$LOG"
rm -rf "$WORK"
cat "$LOG"
