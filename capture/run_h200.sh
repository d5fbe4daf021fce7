#!/usr/bin/env bash
# Make the sample traces of 2026-12-02 (sample_traces/: hf-*, synthetic-*) with `tracekit capture`, on one GPU host.
# (Their exports were committed gzipped afterwards, as trace.sqlite.gz; the engine-shaped captures of
# 2026-12-03 are capture/run_session.sh.)
#
#   bash capture/run_h200.sh [RESULTS_DIR]          # all captures (~6 min on an H200; we ran it in 3 parts)
#   SMOKE=1 bash capture/run_h200.sh [RESULTS_DIR]  # tiny models, 2 steps: checks the APIs (~1-2 min)
#   ONLY="hf-small-eager synthetic-graph" bash capture/run_h200.sh   # a subset, by name
#
# Needs: python3 with torch (+ transformers for hf), click; nsys (found via $NSYS, PATH or the
# usual install folders); libdw.so.1 for `nsys export` (put its folder on LD_LIBRARY_PATH, e.g.
# ./.gpu). Writes RESULTS_DIR/<name>/{trace.sqlite,trace.nsys-rep,manifest.json,trace.json.gz},
# RESULTS_DIR/device_profile.json, RESULTS_DIR/gpu.txt, and (with $OUT set) tarballs into $OUT.
set -uo pipefail

cd "$(dirname "$0")/.."
RES=${1:-${OUT:+/tmp/tracekit_captures}}
RES=${RES:-sample_traces_new}
mkdir -p "$RES"
. capture/gpu_env.sh

# `python -m tracekit capture` when the CLI imports here, else the driver module on its own.
if python3 -c "import tracekit.cli" >/dev/null 2>&1; then TK=(python3 -m tracekit capture)
else TK=(python3 -m tracekit.capture); fi

{
  echo "== host"; date -u; hostname
  nvidia-smi -q 2>/dev/null | sed -n '1,/^GPU 0/p;/Product Name/p;/Driver Version/p;/CUDA Version/p' | head -20
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv 2>/dev/null
  python3 -c "import torch,sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))"
  python3 -c "import transformers; print('transformers', transformers.__version__)" 2>&1
  echo "nsys: ${NSYS:-none}"; [ -n "${NSYS:-}" ] && "$NSYS" --version
  echo "driver: ${TK[*]}"
} 2>&1 | tee "$RES/gpu.txt"

FAILED=()
cap() {  # cap NAME tracekit-capture-args...
  local name=$1; shift
  if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]]; then return 0; fi
  echo; echo "== $name: tracekit capture $* --out $RES/$name"
  local t0=$SECONDS
  if "${TK[@]}" --out "$RES/$name" "$@"; then
    echo "== $name: ok in $((SECONDS - t0)) s"
  else
    echo "== $name: FAILED (exit $?) after $((SECONDS - t0)) s"; FAILED+=("$name")
  fi
}
kern_sum() {  # nsys stats on a COPY (stats may add tables to the file it reads)
  local d=$RES/$1
  [ -f "$d/trace.sqlite" ] || return 0
  local tmp; tmp=$(mktemp -d)
  cp "$d/trace.sqlite" "$tmp/t.sqlite"
  "$NSYS" stats --report cuda_gpu_kern_sum --format csv -o "$tmp/ks" "$tmp/t.sqlite" >/dev/null 2>"$tmp/err" \
    && mv "$tmp"/ks*cuda_gpu_kern_sum*.csv "$d/nsys_stats_kern_sum.csv" \
    && echo "== $1: nsys_stats_kern_sum.csv ($(wc -l < "$d/nsys_stats_kern_sum.csv") lines)" \
    || { echo "== $1: nsys stats failed"; cat "$tmp/err"; }
  rm -rf "$tmp"
}

if [ -n "${SMOKE:-}" ]; then
  S=(--steps 2 --timed-steps 5 --warmup 2)
  cap smoke-synthetic-graph  --workload synthetic --profiler nsys  --mode graph "${S[@]}" --layers 4 --allreduce symm --device-profile-out "$RES/device_profile.json"
  cap smoke-hf-tiny-eager    --workload hf        --profiler nsys  --mode eager "${S[@]}" --size tiny
  cap smoke-hf-tiny-graph    --workload hf        --profiler torch --mode graph "${S[@]}" --size tiny
  cap smoke-hf-tiny-spec     --workload hf        --profiler nsys  --mode graph --spec 3 "${S[@]}" --size tiny
  kern_sum smoke-hf-tiny-eager
else
  N=(--steps 16 --timed-steps 40 --peak-bw "$PEAK_BW")
  cap synthetic-eager        --workload synthetic --profiler nsys  --mode eager "${N[@]}" --device-profile-out "$RES/device_profile.json"
  cap synthetic-graph        --workload synthetic --profiler nsys  --mode graph "${N[@]}"
  cap synthetic-eager-torch  --workload synthetic --profiler torch --mode eager "${N[@]}"
  cap synthetic-symm-eager   --workload synthetic --profiler nsys  --mode eager "${N[@]}" --allreduce symm
  cap hf-small-eager         --workload hf --size small --profiler nsys  --mode eager "${N[@]}"
  cap hf-small-graph         --workload hf --size small --profiler nsys  --mode graph "${N[@]}"
  cap hf-small-spec          --workload hf --size small --profiler nsys  --mode eager --spec 3 "${N[@]}"
  cap hf-small-spec-graph    --workload hf --size small --profiler nsys  --mode graph --spec 3 "${N[@]}"
  cap hf-small-spec-torch    --workload hf --size small --profiler torch --mode eager --spec 3 --steps 12 --timed-steps 40 --peak-bw "$PEAK_BW"
  cap hf-small-eager-torch   --workload hf --size small --profiler torch --mode eager "${N[@]}"
  cap hf-small-graph-torch   --workload hf --size small --profiler torch --mode graph "${N[@]}"
  cap hf-small-graph-wholegraph --workload hf --size small --profiler nsys --mode graph --nsys-graph-trace graph "${N[@]}"
  cap hf-large-eager         --workload hf --size large --profiler nsys  --mode eager "${N[@]}"
  cap hf-large-graph         --workload hf --size large --profiler nsys  --mode graph "${N[@]}"
  cap hf-large-spec          --workload hf --size large --profiler nsys  --mode eager --spec 3 --steps 12 --timed-steps 40 --peak-bw "$PEAK_BW"   # 16 steps: 5.2 MB
  cap hf-large-eager-torch   --workload hf --size large --profiler torch --mode eager --steps 12 --timed-steps 40 --peak-bw "$PEAK_BW"
  kern_sum hf-small-eager
  kern_sum hf-small-graph
  [ -f "$RES/synthetic-graph/trace.sqlite" ] && [ -f "$RES/device_profile.json" ] && \
    python3 capture/replay_gap.py "$RES/synthetic-graph/trace.sqlite" --update "$RES/device_profile.json"
fi

echo; echo "== sizes"; du -ah "$RES" | sort -k2 | grep -v nsys-rep
echo "== failed: ${FAILED[*]:-none}"

if [ -n "${OUT:-}" ]; then  # bundle for the trip back (no .nsys-rep: large and not committed)
  cp "$RES/gpu.txt" "$OUT/gpu.txt" 2>/dev/null
  ( cd "$RES" && tar --exclude='*.nsys-rep' -czf "$OUT/captures_sqlite.tar.gz" --exclude='*.json.gz' . \
      && tar -czf "$OUT/captures_torch.tar.gz" $(find . -name '*.json.gz') 2>/dev/null )
  ls -la "$OUT"
fi
[ ${#FAILED[@]} -eq 0 ]
