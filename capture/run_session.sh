#!/usr/bin/env bash
# The engine-shaped captures of issues 15/16/17 (spec, serve, kv workloads + safetensors checkpoints),
# planned as ONE device session in two parts (each well under the 10-minute call limit):
#
#   bash capture/run_session.sh A     # spec small (nsys + torch, marked + unmarked), serve, checkpoints
#   bash capture/run_session.sh B     # spec large (nsys), kv at two contexts (nsys)
#   SMOKE=cpu bash capture/run_session.sh A   # the same plan on a CPU: tiny sizes, torch profiler, eager only
#
# Needs python3 with torch (+ safetensors for the checkpoints) and click; nsys (via $NSYS, PATH or the usual
# install folders) with libdw.so.1 (./.gpu) for `nsys export` / `nsys stats`. Writes RES/<name>/ (manifest.json
# + trace.sqlite.gz / trace.json.gz), RES/checkpoints/headers/, and with $OUT set, tarballs into $OUT as each
# group finishes (the quick and most important captures first, so a timeout still returns them).
set -uo pipefail
cd "$(dirname "$0")/.."
PART=${1:-A}
RES=${RES:-/tmp/tk_session}
mkdir -p "$RES"
. capture/gpu_env.sh
TK=(python3 -m tracekit capture)          # imports neither polars nor rich (absent on the GPU host)
STEP_TIMEOUT=${STEP_TIMEOUT:-170}
T0=$SECONDS

if [ "${SMOKE:-}" = cpu ]; then   # CPU dry run of the same plan
  SMALL=tiny; LARGE=tiny; NSYSP=torch; GRAPH=eager; DEV=(--device cpu); CTX1=256; CTX2=512
  S16=(--steps 2 --timed-steps 3 --warmup 1); S12=("${S16[@]}"); PEAK=()
else
  SMALL=small; LARGE=large; NSYSP=nsys; GRAPH=graph; DEV=(); CTX1=16384; CTX2=32768
  S16=(--steps 16 --timed-steps 40); S12=(--steps 12 --timed-steps 40); PEAK=(--peak-bw "${PEAK_BW:-4800}")
fi

{
  echo "== host (part $PART)"; date -u; hostname
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv 2>/dev/null
  python3 -c "import torch,sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU')"
  python3 -c "import safetensors; print('safetensors', safetensors.__version__)" 2>&1
  echo "nsys: ${NSYS:-none}"; [ -n "${NSYS:-}" ] && "$NSYS" --version
  nproc; grep -m1 'model name' /proc/cpuinfo
} 2>&1 | tee "$RES/gpu_$PART.txt"

FAILED=()
cap() {  # cap NAME tracekit-capture-args...   (nsys exports gzipped in place, the .nsys-rep left out)
  local name=$1; shift
  if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]]; then return 0; fi
  echo; echo "== $name [$((SECONDS - T0)) s]: tracekit capture $*"
  local t0=$SECONDS
  if timeout "$STEP_TIMEOUT" "${TK[@]}" --out "$RES/$name" "$@"; then
    [ -f "$RES/$name/trace.sqlite" ] && python3 -c "import sys; from tracekit.capture import gzip_capture_export as g; g(sys.argv[1])" "$RES/$name"
    echo "== $name: ok in $((SECONDS - t0)) s; $(ls -l "$RES/$name" | awk 'NR>1 {printf "%s %s  ", $9, $5}')"
  else
    echo "== $name: FAILED (exit $?) after $((SECONDS - t0)) s"; FAILED+=("$name")
  fi
}
kern_sum() {  # nsys stats on a COPY of the export (stats may add tables to the file it reads)
  local d=$RES/$1
  [ -n "${NSYS:-}" ] && [ -f "$d/trace.sqlite.gz" ] || return 0
  local tmp; tmp=$(mktemp -d)
  gunzip -c "$d/trace.sqlite.gz" > "$tmp/t.sqlite"
  "$NSYS" stats --report cuda_gpu_kern_sum --format csv -o "$tmp/ks" "$tmp/t.sqlite" >/dev/null 2>"$tmp/err" \
    && mv "$tmp"/ks*cuda_gpu_kern_sum*.csv "$d/nsys_stats_kern_sum.csv" \
    && echo "== $1: nsys_stats_kern_sum.csv ($(wc -l < "$d/nsys_stats_kern_sum.csv") lines)" \
    || { echo "== $1: nsys stats failed"; cat "$tmp/err"; }
  rm -rf "$tmp"
}
bundle() {  # bundle TARBALL NAME... : into $OUT right away (no .nsys-rep)
  local tb=$1; shift
  [ -n "${OUT:-}" ] || return 0
  local have=(); for n in "$@"; do [ -d "$RES/$n" ] && have+=("$n"); done
  [ ${#have[@]} -gt 0 ] || return 0
  ( cd "$RES" && tar --exclude='*.nsys-rep' -czf "$OUT/$tb" "${have[@]}" ) && echo "== bundled $tb: $(du -h "$OUT/$tb" | cut -f1)"
}

if [ "$PART" = A ]; then
  SPEC=(--workload spec --spec 3 --size "$SMALL" "${DEV[@]}")
  cap spec-small-graph           "${SPEC[@]}" --profiler "$NSYSP" --mode "$GRAPH" "${S16[@]}" "${PEAK[@]}"
  cap spec-small-graph-nomark    "${SPEC[@]}" --profiler "$NSYSP" --mode "$GRAPH" "${S16[@]}" "${PEAK[@]}" --no-markers
  cap spec-small-eager           "${SPEC[@]}" --profiler "$NSYSP" --mode eager    "${S16[@]}" "${PEAK[@]}"
  cap spec-small-eager-nomark    "${SPEC[@]}" --profiler "$NSYSP" --mode eager    "${S16[@]}" "${PEAK[@]}" --no-markers
  kern_sum spec-small-graph
  kern_sum spec-small-eager
  bundle spec_small_nsys.tar.gz spec-small-graph spec-small-graph-nomark spec-small-eager spec-small-eager-nomark
  SERVE=(--workload serve --size "$SMALL" "${DEV[@]}")
  cap serve-small-eager          "${SERVE[@]}" --profiler "$NSYSP" --mode eager    "${S16[@]}" "${PEAK[@]}"
  cap serve-small-graph          "${SERVE[@]}" --profiler "$NSYSP" --mode "$GRAPH" "${S16[@]}" "${PEAK[@]}"
  cap serve-small-graph-nomark   "${SERVE[@]}" --profiler "$NSYSP" --mode "$GRAPH" "${S16[@]}" "${PEAK[@]}" --no-markers
  bundle serve_nsys.tar.gz serve-small-eager serve-small-graph serve-small-graph-nomark
  cap spec-small-graph-torch         "${SPEC[@]}" --profiler torch --mode "$GRAPH" "${S16[@]}" "${PEAK[@]}"
  cap spec-small-graph-torch-nomark  "${SPEC[@]}" --profiler torch --mode "$GRAPH" "${S16[@]}" "${PEAK[@]}" --no-markers
  cap spec-small-eager-torch         "${SPEC[@]}" --profiler torch --mode eager    "${S12[@]}" "${PEAK[@]}"
  cap spec-small-eager-torch-nomark  "${SPEC[@]}" --profiler torch --mode eager    "${S12[@]}" "${PEAK[@]}" --no-markers
  bundle spec_small_torch.tar.gz spec-small-graph-torch spec-small-graph-torch-nomark spec-small-eager-torch \
    spec-small-eager-torch-nomark
  if [ -z "${ONLY:-}" ] || [[ " $ONLY " == *" checkpoints "* ]]; then
    echo; echo "== checkpoints [$((SECONDS - T0)) s]"
    t0=$SECONDS
    ckdev=cuda; [ "${SMOKE:-}" = cpu ] && ckdev=cpu
    if timeout "$STEP_TIMEOUT" python3 capture/save_checkpoint.py --size "$SMALL" --spec 3 --device "$ckdev" \
        --out "$RES/checkpoints"; then
      echo "== checkpoints: ok in $((SECONDS - t0)) s"; du -sh "$RES/checkpoints"/*
      [ -n "${OUT:-}" ] && ( cd "$RES/checkpoints" && tar -czf "$OUT/checkpoint_headers.tar.gz" headers )
    else
      echo "== checkpoints: FAILED after $((SECONDS - t0)) s"; FAILED+=(checkpoints)
    fi
    rm -rf "$RES/checkpoints/bf16" "$RES/checkpoints/fp8"
  fi
else
  SPEC=(--workload spec --spec 3 --size "$LARGE" "${DEV[@]}")
  cap spec-large-graph           "${SPEC[@]}" --profiler "$NSYSP" --mode "$GRAPH" "${S16[@]}" "${PEAK[@]}"
  cap spec-large-graph-nomark    "${SPEC[@]}" --profiler "$NSYSP" --mode "$GRAPH" "${S16[@]}" "${PEAK[@]}" --no-markers
  kern_sum spec-large-graph
  bundle spec_large_graph_nsys.tar.gz spec-large-graph spec-large-graph-nomark
  KV=(--workload kv --size "$LARGE" --batch 8 "${DEV[@]}")
  cap kv-large-ctx16k            "${KV[@]}" --profiler "$NSYSP" --mode "$GRAPH" --context "$CTX1" "${S16[@]}" "${PEAK[@]}"
  cap kv-large-ctx32k            "${KV[@]}" --profiler "$NSYSP" --mode "$GRAPH" --context "$CTX2" "${S16[@]}" "${PEAK[@]}"
  bundle kv_nsys.tar.gz kv-large-ctx16k kv-large-ctx32k
  cap spec-large-eager           "${SPEC[@]}" --profiler "$NSYSP" --mode eager    "${S12[@]}" "${PEAK[@]}"
  bundle spec_large_eager_nsys.tar.gz spec-large-eager
fi

echo; echo "== sizes [$((SECONDS - T0)) s]"; du -ah "$RES" | sort -k2 | grep -v nsys-rep
echo "== failed: ${FAILED[*]:-none}"
[ -n "${OUT:-}" ] && { cp "$RES/gpu_$PART.txt" "$OUT/"; ls -la "$OUT"; }
[ ${#FAILED[@]} -eq 0 ]
