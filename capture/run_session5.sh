#!/usr/bin/env bash
# Session 5 captures (issue 48 items 4 and 6, and the vLLM V1 step shape), in device calls of under 10 minutes:
#
#   bash capture/run_session5.sh PART...
#     vllm           the vLLM V1-shaped speculative loop (zoo.py --shape vllm-v1-draft-model: a standalone draft model,
#                    K=4): its execute_context span closes after the target's verify forward, sampling, rejection
#                    and the drafter's forwards run after it. Three captures: -engine (torch profiler, vllm-v1
#                    spans + stacks, no markers), -nomark (nsys), -marked (nsys, NVTX twin) -> vllm_v1.tar.xz
#     pairs          eager/graph pairs of HF-style loops (issue 48 item 6): capture/hf_decode.py at 3 sizes and the
#                    zoo's plain loop (zoo.py --plain-only) of 4 random shapes, each eager and graph under nsys
#                    (markers), each process measuring its own step unprofiled first -> pairs.tar.xz
#     zoo:A:B        the random zoo's shapes A..B-1 (zoo.py --shape rand-$SEED-i, each with its own --mode and
#                    --attn-backend): -nomark (nsys, no markers) and -marked (nsys, NVTX twin); both measure the spec
#                    step, the plain step and the phases unprofiled first -> zoo_random_<A>.tar.xz per 12 shapes
#
#   SMOKE=cpu bash capture/run_session5.sh vllm pairs zoo:0:3    # the same plan on a CPU (tiny, torch profiler)
#
# Every capture is its own process (capture/zoo_driver.py profile; its nsys export runs in the background, nice 19,
# while the next capture runs; no two GPU workloads at once). No capture starts past HARD_S seconds. The exports
# stay plain trace.sqlite inside the tarballs (xz compresses the archive as a whole). $OUT: at most 8 files.
# Needs python3 with torch (+ triton on the GPU), click; nsys with libdw.so.1 (./.gpu) for `nsys export`.
set -uo pipefail
cd "$(dirname "$0")/.."
RES=${RES:-/tmp/tk_s5}
OUT=${OUT:-/tmp/tk_s5_out}
mkdir -p "$RES" "$OUT"
exec > >(tee -a "$OUT/session5.log") 2>&1
. capture/gpu_env.sh
for d in .gpu shared/device-libs ../shared/device-libs; do
  [ -f "$d/libdw.so.1" ] && export LD_LIBRARY_PATH=$PWD/$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} && break
done
SEED=${SEED:-48}
DRV=(python3 capture/zoo_driver.py)
HARD_S=${HARD_S:-500}
STEP_TIMEOUT=${STEP_TIMEOUT:-90}
T0=$SECONDS
if [ "${SMOKE:-}" = cpu ]; then
  PROF=torch; SIZE=(--size tiny --device cpu); HFSIZE=(--size tiny --device cpu); TIMED=(--timed-steps 3 --warmup 1)
  NSTEPS=(--steps 3); PEAK=(); STEP_TIMEOUT=${SMOKE_TIMEOUT:-600}; HARD_S=100000; MODE_EAGER_ONLY=1
else
  PROF=nsys; SIZE=(); HFSIZE=(); TIMED=(--timed-steps 20 --warmup 3); NSTEPS=(--steps 6); MODE_EAGER_ONLY=0
  case "$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)" in
    *H200*) PEAK=(--peak-bw 4800) ;;
    *H100*) PEAK=(--peak-bw 3350) ;;
    *) PEAK=() ;;
  esac
fi
{
  echo "== host (session 5)"; date -u; hostname
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv 2>/dev/null
  python3 -c "import torch,sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU', 'cudnn', torch.backends.cudnn.version())"
  python3 -c "import triton; print('triton', triton.__version__)" 2>&1 | tail -1
  python3 -c "import transformers; print('transformers', transformers.__version__)" 2>&1 | tail -1
  echo "nsys: ${NSYS:-none}"; [ -n "${NSYS:-}" ] && "$NSYS" --version
  nproc; grep -m1 'model name' /proc/cpuinfo
} 2>&1 | tee "$RES/gpu_session5.txt"

FAILED=(); SKIPPED=(); EXPORTS=()
cap() {  # cap NAME PROFILER SCRIPT args...
  local name=$1 prof=$2 script=$3; shift 3
  local used=$((SECONDS - T0))
  if [ "$used" -ge "$HARD_S" ]; then echo "== $name: skipped (past ${HARD_S} s)"; SKIPPED+=("$name"); return 1; fi
  echo; echo "== $name [${used} s]: $prof $script $*"
  local t0=$SECONDS
  if timeout "$STEP_TIMEOUT" "${DRV[@]}" profile --out "$RES/$name" --profiler "$prof" --script "$script" "${PEAK[@]}" -- "$@"; then
    echo "== $name: captured in $((SECONDS - t0)) s"
    if [ "$prof" = nsys ]; then
      ( nice -n 19 timeout 200 "${DRV[@]}" finish "$RES/$name" --plain > "$RES/$name.export.log" 2>&1 \
          || echo "== $name: export FAILED (see $name.export.log)" ) &
      EXPORTS+=($!)
    fi
    return 0
  fi
  echo "== $name: FAILED (exit $?) after $((SECONDS - t0)) s"; FAILED+=("$name"); rm -rf "${RES:?}/$name"; return 1
}
bundle() {  # bundle TARBALL NAME...: wait for the exports, then tar.xz the folders that have a manifest into $OUT
  local tb=$1; shift
  for pid in "${EXPORTS[@]}"; do wait "$pid" 2>/dev/null; done; EXPORTS=()
  local have=(gpu_session5.txt) n
  for n in "$@"; do [ -f "$RES/$n/manifest.json" ] && have+=("$n"); done
  [ ${#have[@]} -gt 1 ] || { echo "== $tb: nothing to bundle"; return 0; }
  ( cd "$RES" && tar --exclude='*.export.log' --exclude='*.nsys-rep' --exclude='*.qdstrm' -cf - "${have[@]}" \
      | xz -T0 -6 > "$OUT/$tb" ) \
    && echo "== bundled $tb: ${#have[@]} entries, $(stat -c %s "$OUT/$tb") bytes (limit 16 MiB = 16777216) [$((SECONDS - T0)) s]"
}

part_vllm() {
  # the vLLM V1 step (zoo.EXTRA_SHAPES["vllm-v1-draft-model"]): a Qwen3-shaped target (hidden 4096, 16 layers),
  # a standalone draft model (hidden 1024, 4 layers, own embedding and lm_head), K=4, batch 1 (5 verify tokens)
  local v=(zoo.py --shape vllm-v1-draft-model "${SIZE[@]}" "${TIMED[@]}")
  local names=(vllm-v1-standalone-engine vllm-v1-standalone-nomark vllm-v1-standalone-marked)
  local mode=(--mode graph); [ "$MODE_EAGER_ONLY" = 1 ] && mode=(--mode eager)
  cap vllm-v1-standalone-engine torch "${v[0]}" "${v[@]:1}" "${mode[@]}" --steps 8 --no-markers --engine-spans vllm-v1 --with-stack
  cap vllm-v1-standalone-nomark "$PROF" "${v[0]}" "${v[@]:1}" "${mode[@]}" "${NSTEPS[@]}" --no-markers
  cap vllm-v1-standalone-marked "$PROF" "${v[0]}" "${v[@]:1}" "${mode[@]}" "${NSTEPS[@]}"
  bundle vllm_v1.tar.xz "${names[@]}"
}

part_pairs() {
  local names=() sz mode
  # HF transformers decode (batch 1): three sizes we had not captured (layers overridden)
  for sz in "small:8" "small:16" "large:6"; do
    for mode in eager graph; do
      local n="pair-hf-${sz%%:*}${sz##*:}-$mode"; names+=("$n")
      if [ "$MODE_EAGER_ONLY" = 1 ]; then
        cap "$n" "$PROF" hf_decode.py "${HFSIZE[@]}" --layers "${sz##*:}" --mode eager "${TIMED[@]}" "${NSTEPS[@]}"
      else
        cap "$n" "$PROF" hf_decode.py --size "${sz%%:*}" --layers "${sz##*:}" --mode "$mode" "${TIMED[@]}" "${NSTEPS[@]}"
      fi
    done
  done
  # the zoo's plain loop (the target decoding one token per sequence, argmax, host read) of four random shapes
  for i in 0 1 2 3; do
    for mode in eager graph; do
      local n="pair-plain-rand-$((SEED + 1))-$i-$mode"; names+=("$n")
      [ "$MODE_EAGER_ONLY" = 1 ] && [ "$mode" = graph ] && continue
      cap "$n" "$PROF" zoo.py --shape "rand-$((SEED + 1))-$i" --plain-only --mode "$mode" "${SIZE[@]}" "${TIMED[@]}" "${NSTEPS[@]}"
    done
  done
  bundle pairs.tar.xz "${names[@]}"
}

part_zoo() {  # part_zoo A B
  local a=$1 b=$2 i line args names=() first=$1
  mapfile -t PLAN < <(python3 capture/zoo.py --random "$b" --seed "$SEED")
  for ((i = a; i < b; i++)); do
    line=${PLAN[$i]}
    read -r -a args < <(python3 -c "import json,sys; print(' '.join(json.loads(sys.argv[1])['args']))" "$line")
    [ "$MODE_EAGER_ONLY" = 1 ] && args=(--mode eager --attn-backend "${args[-1]}")
    echo "== plan $line"
    local s="rand-$SEED-$i"
    names+=("$s-nomark" "$s-marked")
    cap "$s-nomark" "$PROF" zoo.py --shape "$s" "${args[@]}" "${SIZE[@]}" "${TIMED[@]}" "${NSTEPS[@]}" --no-markers || \
      { [ $((SECONDS - T0)) -ge "$HARD_S" ] && break; }
    cap "$s-marked" "$PROF" zoo.py --shape "$s" "${args[@]}" "${SIZE[@]}" "${TIMED[@]}" "${NSTEPS[@]}" || \
      { [ $((SECONDS - T0)) -ge "$HARD_S" ] && break; }
    if [ $(((i + 1 - a) % 12)) -eq 0 ]; then bundle "zoo_random_$first.tar.xz" "${names[@]}"; names=(); first=$((i + 1)); fi
  done
  [ ${#names[@]} -gt 0 ] && bundle "zoo_random_$first.tar.xz" "${names[@]}"
  return 0
}

for part in "$@"; do
  case "$part" in
    vllm) part_vllm ;;
    pairs) part_pairs ;;
    zoo:*:*) IFS=: read -r _ A B <<< "$part"; part_zoo "$A" "$B" ;;
    *) echo "usage: $0 vllm|pairs|zoo:A:B ..." >&2; exit 2 ;;
  esac
done
for pid in "${EXPORTS[@]}"; do wait "$pid" 2>/dev/null; done
echo; echo "== summary [$((SECONDS - T0)) s]"
python3 - "$RES" <<'EOF' || true
import json, pathlib, sys
for m in sorted(pathlib.Path(sys.argv[1]).glob("*/manifest.json")):
    f = json.loads(m.read_text())
    g = lambda k: f.get(k) if f.get(k) is not None else float("nan")  # noqa: E731
    print(f"   {m.parent.name:34s} step {g('unprofiled_step_ms'):9.3f} ms  plain {g('unprofiled_plain_step_ms'):8.3f} ms"
          f"  accept_len {(f.get('spec') or {}).get('accept_len')}  {f.get('gpu_name')}")
EOF
echo "== failed: ${FAILED[*]:-none}; skipped: ${SKIPPED[*]:-none}; total $((SECONDS - T0)) s"
ls -la "$OUT"
