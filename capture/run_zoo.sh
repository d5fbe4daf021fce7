#!/usr/bin/env bash
# The speculative-decoding zoo (issue 42): 7 engine-shaped loops x 3 captures in ONE device call, most important
# first, each group tarred into $OUT as soon as it is done.
#
#   bash capture/run_zoo.sh                   # on the lent H100/H200: about 5 minutes, nothing starts past HARD_S
#   SMOKE=cpu bash capture/run_zoo.sh         # the same plan on a CPU: tiny sizes, the torch profiler, eager
#
# Per shape (capture/zoo.py --shape NAME), three captures, each its own process that first measures, unprofiled,
# the spec step, the plain step, every phase and the accept length (-> manifest.json):
#   zoo-<shape>-nomark    nsys -t cuda,nvtx --cuda-graph-trace=node, no markers at all (a user's trace)
#   zoo-<shape>-engine    torch profiler, record_shapes + with_stack, no markers, the engine's own spans
#                         (sglang-v1, sglang-v2 or vllm: zoo.SHAPES[...].spans)
#   zoo-<shape>-marked    nsys with NVTX ranges decode_step <i> / draft / verify / draft_extend (the truth twin)
# The nsys export + gzip of a capture runs in the background (nice 19) while the next capture runs; no two GPU
# workloads ever run at once. Tarballs in $OUT (at most 3, each <= 14 MiB) + $OUT/zoo.log:
#   zoo_1.tar.gz  gpu_zoo.txt + hybrid-nextn, sglang-chain, vllm-eagle
#   zoo_2.tar.gz  sglang-tree, standalone
#   zoo_3.tar.gz  ngram, mtp-multilayer
# Needs python3 with torch (+ triton on the GPU) and click, no polars; nsys (via $NSYS, PATH or the usual install
# folders) with libdw.so.1 (./.gpu) for `nsys export`.
set -uo pipefail
cd "$(dirname "$0")/.."
RES=${RES:-/tmp/tk_zoo}
rm -rf "$RES"; mkdir -p "$RES"
if [ -n "${OUT:-}" ]; then mkdir -p "$OUT"; exec > >(tee -a "$OUT/zoo.log") 2>&1; fi
. capture/gpu_env.sh
for d in shared/device-libs ../shared/device-libs; do   # libdw.so.1 for `nsys export`, wherever the copy lies
  [ -f "$d/libdw.so.1" ] && export LD_LIBRARY_PATH=$PWD/$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} && break
done
DRV=(python3 capture/zoo_driver.py)          # imports neither polars nor torch
STEP_TIMEOUT=${STEP_TIMEOUT:-120}
HARD_S=${HARD_S:-310}                     # no capture starts past this many seconds (the zoo must end within 6 min)
T0=$SECONDS
SHAPES=(hybrid-nextn sglang-chain vllm-eagle sglang-tree standalone ngram mtp-multilayer)
GROUP1=(hybrid-nextn sglang-chain vllm-eagle); GROUP2=(sglang-tree standalone); GROUP3=(ngram mtp-multilayer)
[ -n "${ONLY_SHAPES:-}" ] && read -r -a SHAPES <<< "$ONLY_SHAPES"
# SPEC_STEPS=K: every shape with K draft steps (zoo.py --spec-steps), captures named zoo-<shape>-k<K>-<kind>;
# KINDS: which of the three captures run (default all three)
TAG=""; SPEC=(); [ -n "${SPEC_STEPS:-}" ] && TAG="-k$SPEC_STEPS" && SPEC=(--spec-steps "$SPEC_STEPS")
read -r -a KINDS <<< "${KINDS:-nomark engine marked}"

if [ "${SMOKE:-}" = cpu ]; then   # the same plan on a CPU: tiny sizes, eager, every capture with the torch profiler
  NSYSP=torch; COMMON=(--size tiny --device cpu --mode eager --timed-steps 3 --warmup 1)
  NSTEPS=(--steps 3); TSTEPS=(--steps 3); PEAK=()
  STEP_TIMEOUT=${SMOKE_TIMEOUT:-600}; HARD_S=100000
else
  NSYSP=nsys; COMMON=(--size full --mode graph --timed-steps 30 --warmup 4)
  NSTEPS=(--steps 10); TSTEPS=(--steps 8)
  case "$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)" in   # datasheet peaks, GB/s
    *H200*) PEAK=(--peak-bw 4800) ;;
    *H100*) PEAK=(--peak-bw 3350) ;;
    *) PEAK=() ;;
  esac
fi

{
  echo "== host (zoo)"; date -u; hostname
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv 2>/dev/null
  python3 -c "import torch,sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU')"
  python3 -c "import triton; print('triton', triton.__version__)" 2>&1 | tail -1
  echo "nsys: ${NSYS:-none}"; [ -n "${NSYS:-}" ] && "$NSYS" --version
  nproc; grep -m1 'model name' /proc/cpuinfo
} 2>&1 | tee "$RES/gpu_zoo.txt"
KEEP_REP=0   # without libdw.so.1 `nsys export` fails: then the .nsys-rep files go into the tarballs instead
if [ "$NSYSP" = nsys ] && ! python3 -c "import ctypes; ctypes.CDLL('libdw.so.1')" 2>/dev/null; then
  echo "== WARNING: libdw.so.1 not loadable (put it in ./.gpu): exports will fail, the .nsys-rep files are kept"
  KEEP_REP=1
fi

FAILED=(); SKIPPED=(); declare -A EXPORT_PID=(); declare -A TOOK=()
cap() {  # cap NAME PROFILER zoo-args...
  local name=$1 prof=$2; shift 2
  local used=$((SECONDS - T0))
  if [ "$used" -ge "$HARD_S" ]; then echo "== $name: skipped (past ${HARD_S} s)"; SKIPPED+=("$name"); return 0; fi
  local tmo=$STEP_TIMEOUT; [ $((HARD_S + 30 - used)) -lt "$tmo" ] && tmo=$((HARD_S + 30 - used))
  echo; echo "== $name [${used} s]: $prof $*"
  local t0=$SECONDS
  if timeout "$tmo" "${DRV[@]}" profile --out "$RES/$name" --profiler "$prof" "${PEAK[@]}" -- "$@"; then
    TOOK[$name]=$((SECONDS - t0))
    echo "== $name: captured in ${TOOK[$name]} s"
    if [ "$prof" = nsys ]; then   # export + gzip in the background while the next capture runs
      ( nice -n 19 timeout 240 "${DRV[@]}" finish "$RES/$name" > "$RES/$name.export.log" 2>&1 \
          || echo "== $name: export FAILED (see $name.export.log)" ) &
      EXPORT_PID[$name]=$!
    fi
  else
    echo "== $name: FAILED (exit $?) after $((SECONDS - t0)) s"; FAILED+=("$name")
  fi
}
shape_spans() { python3 -c "import sys; sys.path.insert(0, 'capture'); import zoo; print(zoo.SHAPES['$1'].spans)"; }
run_shape() {  # the captures of a shape (KINDS)
  local s=$1 spans; spans=$(shape_spans "$s")
  in_list nomark "${KINDS[@]}" && cap "zoo-$s$TAG-nomark" "$NSYSP" --shape "$s" "${COMMON[@]}" "${SPEC[@]}" "${NSTEPS[@]}" --no-markers
  in_list engine "${KINDS[@]}" && cap "zoo-$s$TAG-engine" torch --shape "$s" "${COMMON[@]}" "${SPEC[@]}" "${TSTEPS[@]}" \
    --no-markers --engine-spans "$spans" --with-stack
  in_list marked "${KINDS[@]}" && cap "zoo-$s$TAG-marked" "$NSYSP" --shape "$s" "${COMMON[@]}" "${SPEC[@]}" "${NSTEPS[@]}"
  return 0
}
bundle() {  # bundle TARBALL SHAPE...: wait for their exports, then tar them into $OUT (no .nsys-rep)
  local tb=$1; shift
  local have=() n pid
  for s in "$@"; do for k in nomark engine marked; do
    n="zoo-$s$TAG-$k"; pid=${EXPORT_PID[$n]:-}
    [ -n "$pid" ] && wait "$pid"
    [ -f "$RES/$n/manifest.json" ] && have+=("$n") && cat "$RES/$n.export.log" 2>/dev/null | tail -2
  done; done
  [ "$tb" = zoo_1.tar.gz ] && have=(gpu_zoo.txt "${have[@]}")
  [ ${#have[@]} -gt 0 ] || return 0
  [ -n "${OUT:-}" ] || { echo "== (no \$OUT: $tb not written)"; return 0; }
  local excl=(--exclude='*.export.log'); [ "$KEEP_REP" = 1 ] || excl+=(--exclude='*.nsys-rep')
  ( cd "$RES" && tar "${excl[@]}" -czf "$OUT/$tb" "${have[@]}" ) \
    && echo "== bundled $tb: $(du -h "$OUT/$tb" | cut -f1) ($(stat -c %s "$OUT/$tb") bytes; limit 14 MiB = 14680064)"
}
in_list() { local x=$1; shift; for y in "$@"; do [ "$x" = "$y" ] && return 0; done; return 1; }

for s in "${SHAPES[@]}"; do
  run_shape "$s"
  [ "$s" = "${GROUP1[-1]}" ] && bundle zoo_1.tar.gz "${GROUP1[@]}"
  [ "$s" = "${GROUP2[-1]}" ] && bundle zoo_2.tar.gz "${GROUP2[@]}"
  [ "$s" = "${GROUP3[-1]}" ] && bundle zoo_3.tar.gz "${GROUP3[@]}"
done
# a partial plan (ONLY_SHAPES): bundle what ran into the group tarballs
for g in 1 2 3; do
  eval "grp=(\"\${GROUP$g[@]}\")"
  ran=(); for s in "${grp[@]}"; do in_list "$s" "${SHAPES[@]}" && ran+=("$s"); done
  if [ ${#ran[@]} -gt 0 ] && ! in_list "${grp[-1]}" "${SHAPES[@]}"; then bundle "zoo_$g.tar.gz" "${ran[@]}"; fi
done
for pid in "${EXPORT_PID[@]}"; do wait "$pid"; done     # (a bare `wait` would also wait for the log's tee)

echo; echo "== per capture (s): $(for k in "${!TOOK[@]}"; do printf '%s=%s ' "$k" "${TOOK[$k]}"; done)"
echo "== sizes [$((SECONDS - T0)) s]"; du -ah "$RES" | sort -k2 | grep -v nsys-rep
python3 - "$RES" <<'EOF' || true
import json, pathlib, sys
for m in sorted(pathlib.Path(sys.argv[1]).glob("zoo-*/manifest.json")):
    f = json.loads(m.read_text())
    print(f"   {m.parent.name:34s} step {f.get('unprofiled_step_ms'):9.3f} ms  plain {f.get('unprofiled_plain_step_ms'):8.3f} ms"
          f"  accept_len {(f.get('spec') or {}).get('accept_len')}  traces {[t['name'] for t in f.get('trace_files', [])]}")
EOF
echo "== failed: ${FAILED[*]:-none}; skipped: ${SKIPPED[*]:-none}; total $((SECONDS - T0)) s"
[ -n "${OUT:-}" ] && ls -la "$OUT"
[ ${#FAILED[@]} -eq 0 ]
