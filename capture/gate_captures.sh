#!/usr/bin/env bash
# Captures that validate the diff gate's noise model (issue 45): ONE device call, everything into ONE tarball in $OUT.
#
#   bash capture/gate_captures.sh                # on a lent GPU (about 4-5 minutes; optional work stops past BUDGET_S)
#   SMOKE=cpu bash capture/gate_captures.sh      # the same plan on a CPU: tiny sizes, torch profiler, eager only
#
# What it captures (the synthetic decode-like loop, capture/synthetic.py: 32 layers of GEMV up, SiLU, GEMV down over
# bf16 4096x4096 matrices, CUDA-graph replay, nsys with --cuda-graph-trace=node, 16 profiled steps after 40 timed):
#   gate-graph-r1 .. gate-graph-r$N   N repeat captures of ONE configuration, each its own process (default N=6):
#                                     every pair of them must pass the gate at 3% (exit 0)
#   gate-graph-nomark                 the same loop without NVTX step markers (the unmarked twin): must pass
#                                     against every repeat
#   gate-graph-slow2048               the same loop with a slower layer: --extra-gemv 2048 (one more GEMV per layer,
#                                     x @ W3[4096, 2048], gating half the SiLU output; +16 MiB read per layer): must
#                                     fail against every repeat (exit 3) and pass the other way round
#   gate-graph-slow512                the same with --extra-gemv 512 (+4 MiB per layer): the detection limit, reported
#                                     whatever it says (optional)
#   gate-eager-r1, gate-eager-r2      two eager captures (host-bound steps: the between-process noise the docs warn
#                                     about), reported whatever they say (optional)
# into $OUT/gate_captures.tar.gz (each folder: manifest.json + trace.sqlite.gz, the .nsys-rep left out) with
# gpu_gate.txt (host, GPU, versions) and gate_captures.log (this script's output, when the caller tees into it:
# `bash capture/gate_captures.sh 2>&1 | tee $OUT/gate_captures.log` also works; the log is copied in anyway).
#
# Needs python3 with torch and click (no polars: the gate itself runs later, on the analyzer's machine); nsys (via
# $NSYS, PATH or the usual install folders; see capture/gpu_env.sh) with libdw.so.1 (./.gpu) for `nsys export`.
set -uo pipefail
cd "$(dirname "$0")/.."
RES=${RES:-/tmp/tk_gate}
rm -rf "$RES"; mkdir -p "$RES"
. capture/gpu_env.sh
TK=(python3 -m tracekit capture)          # imports neither polars nor rich (absent on the GPU host)
N=${N:-6}
STEP_TIMEOUT=${STEP_TIMEOUT:-120}
BUDGET_S=${BUDGET_S:-330}                 # optional captures start only before this many seconds
HARD_S=${HARD_S:-450}                     # nothing starts past this many seconds (the call must end within 10 minutes)
T0=$SECONDS
LOG=$RES/gate_captures.log
exec > >(tee -a "$LOG") 2>&1

if [ "${SMOKE:-}" = cpu ]; then   # CPU dry run of the same plan
  PROF=torch; GRAPH=eager; DEV=(--device cpu); PEAK=()
  SIZE=(--layers 2 --hidden 256 --ffn 512); SLOW=256; SLOW_SMALL=64
  STEPS=(--steps 4 --timed-steps 5 --warmup 1)
  STEP_TIMEOUT=${SMOKE_TIMEOUT:-300}; BUDGET_S=100000; HARD_S=100000
else
  PROF=nsys; GRAPH=graph; DEV=()
  case "$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)" in   # datasheet peaks, GB/s
    *H200*) PEAK=(--peak-bw "${PEAK_BW:-4800}") ;;
    *H100*) PEAK=(--peak-bw "${PEAK_BW:-3350}") ;;
    *) PEAK=() ;;
  esac
  SIZE=(); SLOW=2048; SLOW_SMALL=512
  STEPS=(--steps 16 --timed-steps 40)
fi

{
  echo "== host (gate captures)"; date -u; hostname
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv 2>/dev/null
  python3 -c "import torch,sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU')"
  echo "nsys: ${NSYS:-none}"; [ -n "${NSYS:-}" ] && "$NSYS" --version
  nproc; grep -m1 'model name' /proc/cpuinfo
} 2>&1 | tee "$RES/gpu_gate.txt"

FAILED=()
SKIPPED=()
DONE=()
left() {  # left N: the seconds a step may take (at most N, never past HARD_S); 0 when under 20 s remain
  local remain=$((HARD_S - (SECONDS - T0)))
  if [ "$remain" -lt 20 ]; then echo 0; elif [ "$remain" -lt "$1" ]; then echo "$remain"; else echo "$1"; fi
}
cap() {  # cap NAME tracekit-capture-args...   (nsys exports gzipped in place, the .nsys-rep left out)
  local name=$1; shift
  if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]]; then return 0; fi
  local tmo; tmo=$(left "$STEP_TIMEOUT")
  if [ "$tmo" -eq 0 ]; then echo "== $name: skipped (past ${HARD_S} s)"; SKIPPED+=("$name"); return 0; fi
  echo; echo "== $name [$((SECONDS - T0)) s]: tracekit capture $*"
  local t0=$SECONDS
  if timeout "$tmo" "${TK[@]}" --out "$RES/$name" "$@"; then
    [ -f "$RES/$name/trace.sqlite" ] && python3 -c "import sys; from tracekit.capture import gzip_capture_export as g; g(sys.argv[1])" "$RES/$name"
    rm -f "$RES/$name"/*.nsys-rep
    echo "== $name: ok in $((SECONDS - t0)) s; $(ls -l "$RES/$name" | awk 'NR>1 {printf "%s %s  ", $9, $5}')"
    python3 - "$RES/$name/manifest.json" <<'EOF' || true
import json, sys
m = json.load(open(sys.argv[1]))
u = m.get("unprofiled") or {}
print("   manifest: unprofiled_step_ms", m.get("unprofiled_step_ms"), "min-max", u.get("min_ms"), u.get("max_ms"),
      "weight_bytes_per_step", m.get("weight_bytes_per_step"), "extra_gemv_cols",
      (m.get("synthetic") or {}).get("extra_gemv_cols"))
EOF
    DONE+=("$name")
  else
    echo "== $name: FAILED (exit $?) after $((SECONDS - t0)) s"; FAILED+=("$name")
  fi
}
optional() {  # optional NAME ...: cap only while the budget allows
  if [ $((SECONDS - T0)) -ge "$BUDGET_S" ]; then echo "== $1: skipped (past ${BUDGET_S} s)"; SKIPPED+=("$1"); return 0; fi
  cap "$@"
}

W=(--workload synthetic "${DEV[@]}" "${SIZE[@]}" "${STEPS[@]}" "${PEAK[@]}")
# 1. the repeats, the unmarked twin and the slower variant, interleaved so that a drift of the host over the call
#    does not line up with one kind of capture
cap gate-graph-r1 "${W[@]}" --profiler "$PROF" --mode "$GRAPH"
cap gate-graph-slow2048 "${W[@]}" --profiler "$PROF" --mode "$GRAPH" --extra-gemv "$SLOW"
cap gate-graph-r2 "${W[@]}" --profiler "$PROF" --mode "$GRAPH"
cap gate-graph-nomark "${W[@]}" --profiler "$PROF" --mode "$GRAPH" --no-markers
for i in $(seq 3 "$N"); do
  cap "gate-graph-r$i" "${W[@]}" --profiler "$PROF" --mode "$GRAPH"
done
# 2. optional: the detection limit and the eager (host-bound) between-process noise
optional gate-graph-slow512 "${W[@]}" --profiler "$PROF" --mode "$GRAPH" --extra-gemv "$SLOW_SMALL"
optional gate-eager-r1 "${W[@]}" --profiler "$PROF" --mode eager
optional gate-eager-r2 "${W[@]}" --profiler "$PROF" --mode eager

echo; echo "== sizes [$((SECONDS - T0)) s]"; du -ah "$RES" | sort -k2
echo "== done: ${DONE[*]:-none}"
echo "== failed: ${FAILED[*]:-none}; skipped: ${SKIPPED[*]:-none}"
if [ -n "${OUT:-}" ]; then
  ( cd "$RES" && tar --exclude='*.nsys-rep' -czf "$OUT/gate_captures.tar.gz" gpu_gate.txt gate_captures.log \
      "${DONE[@]}" ) && echo "== bundled gate_captures.tar.gz: $(du -h "$OUT/gate_captures.tar.gz" | cut -f1)"
  ls -la "$OUT"
fi
[ ${#FAILED[@]} -eq 0 ]
