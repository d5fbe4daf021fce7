#!/usr/bin/env bash
# Tensor-parallel captures with `tracekit capture --tp N`, on one GPU host with N GPUs.
#
#   TP=1 bash capture/run_tp_h200.sh [RESULTS_DIR]   # world size 1 (one GPU): what ran on our H200
#   TP=2 bash capture/run_tp_h200.sh [RESULTS_DIR]   # two GPUs: every all-reduce choice, eager and graph
#   ONLY="tp2-hf-small-nccl-eager" TP=2 bash capture/run_tp_h200.sh
#
# Names: tp<N>-<workload>-<allreduce>-<mode>[-torch], allreduce = nccl | symm1 (symm-one-shot) |
# symm2 (symm-two-shot). Needs what capture/run_h200.sh needs. NVLink multicast stays off
# (the driver forces NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 too).
# With $OUT set: after every capture, $OUT/tp_captures.tar.gz holds everything so far (no .nsys-rep).
set -uo pipefail

cd "$(dirname "$0")/.."
TP=${TP:-1}
RES=${1:-${OUT:+/tmp/tracekit_tp_captures}}
RES=${RES:-sample_traces_tp_new}
mkdir -p "$RES"
. capture/gpu_env.sh
STEP_TIMEOUT=${STEP_TIMEOUT:-120}
if python3 -c "import tracekit.cli" >/dev/null 2>&1; then TK=(python3 -m tracekit capture)
else TK=(python3 -m tracekit.capture); fi

{
  echo "== host"; date -u; hostname
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv 2>/dev/null
  nvidia-smi topo -m 2>/dev/null
  python3 -c "import torch,sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'gpus', torch.cuda.device_count()); import torch.distributed as d; print('nccl', torch.cuda.nccl.version()); print('symm_mem ops', [o for o in ('one_shot_all_reduce','two_shot_all_reduce_') if hasattr(torch.ops.symm_mem, o)])" 2>&1
  echo "nsys: ${NSYS:-none}"; [ -n "${NSYS:-}" ] && "$NSYS" --version
  echo "TP=$TP driver: ${TK[*]}"
} 2>&1 | tee "$RES/gpu_tp.txt"

FAILED=()
bundle() {
  [ -n "${OUT:-}" ] || return 0
  ( cd "$RES" && tar --exclude='*.nsys-rep' -czf "$OUT/tp_captures.tar.gz.part" . && mv "$OUT/tp_captures.tar.gz.part" "$OUT/tp_captures.tar.gz" )
}
cap() {  # cap NAME tracekit-capture-args...
  local name=$1; shift
  if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]]; then return 0; fi
  echo; echo "== $name: tracekit capture $* --out $RES/$name"
  local t0=$SECONDS
  if timeout "$STEP_TIMEOUT" "${TK[@]}" --out "$RES/$name" "$@" > >(tee "$RES/$name.log") 2>&1; then
    echo "== $name: ok in $((SECONDS - t0)) s"
  else
    echo "== $name: FAILED (exit $?) after $((SECONDS - t0)) s"; FAILED+=("$name")
  fi
  bundle
}

N=(--steps 16 --timed-steps 40 --peak-bw "$PEAK_BW")
H=(--steps 12 --timed-steps 40 --peak-bw "$PEAK_BW")   # hf small: 12 steps keep the SQLite < 5 MB
T=(--tp "$TP")
cap "tp$TP-synthetic-symm1-eager"  --workload synthetic --profiler nsys --mode eager "${T[@]}" --allreduce symm-one-shot "${N[@]}"
cap "tp$TP-synthetic-symm1-graph"  --workload synthetic --profiler nsys --mode graph "${T[@]}" --allreduce symm-one-shot "${N[@]}"
cap "tp$TP-hf-small-symm1-eager"   --workload hf --size small --profiler nsys --mode eager "${T[@]}" --allreduce symm-one-shot "${H[@]}"
cap "tp$TP-hf-small-nccl-eager"    --workload hf --size small --profiler nsys --mode eager "${T[@]}" --allreduce nccl "${H[@]}"
cap "tp$TP-hf-small-symm1-graph"   --workload hf --size small --profiler nsys --mode graph "${T[@]}" --allreduce symm-one-shot "${N[@]}"
cap "tp$TP-hf-small-nccl-graph"    --workload hf --size small --profiler nsys --mode graph "${T[@]}" --allreduce nccl "${N[@]}"
cap "tp$TP-synthetic-symm2-eager"  --workload synthetic --profiler nsys --mode eager "${T[@]}" --allreduce symm-two-shot "${N[@]}"
cap "tp$TP-synthetic-nccl-graph"   --workload synthetic --profiler nsys --mode graph "${T[@]}" --allreduce nccl "${N[@]}"
cap "tp$TP-hf-tiny-symm1-eager-torch" --workload hf --size tiny --profiler torch --mode eager "${T[@]}" --allreduce symm-one-shot --steps 4 --timed-steps 20 --peak-bw "$PEAK_BW"
if [ "$TP" -gt 1 ]; then   # the rest of the matrix, only where there are several GPUs
  cap "tp$TP-synthetic-nccl-eager"   --workload synthetic --profiler nsys --mode eager "${T[@]}" --allreduce nccl "${N[@]}"
  cap "tp$TP-synthetic-symm2-graph"  --workload synthetic --profiler nsys --mode graph "${T[@]}" --allreduce symm-two-shot "${N[@]}"
  cap "tp$TP-hf-small-symm2-eager"   --workload hf --size small --profiler nsys --mode eager "${T[@]}" --allreduce symm-two-shot "${H[@]}"
  cap "tp$TP-hf-small-symm2-graph"   --workload hf --size small --profiler nsys --mode graph "${T[@]}" --allreduce symm-two-shot "${N[@]}"
  cap "tp$TP-hf-large-nccl-graph"    --workload hf --size large --profiler nsys --mode graph "${T[@]}" --allreduce nccl "${N[@]}"
  cap "tp$TP-hf-large-symm1-graph"   --workload hf --size large --profiler nsys --mode graph "${T[@]}" --allreduce symm-one-shot "${N[@]}"
  cap "tp$TP-hf-small-nccl-eager-torch"  --workload hf --size small --profiler torch --mode eager "${T[@]}" --allreduce nccl "${H[@]}"
  cap "tp$TP-hf-small-symm1-graph-torch" --workload hf --size small --profiler torch --mode graph "${T[@]}" --allreduce symm-one-shot "${N[@]}"
fi

echo; echo "== sizes"; du -ah "$RES" | sort -k2 | grep -v nsys-rep
echo "== failed: ${FAILED[*]:-none}"
bundle
[ ${#FAILED[@]} -eq 0 ]
