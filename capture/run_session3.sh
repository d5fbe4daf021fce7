#!/usr/bin/env bash
# Session 3 captures (issues 23, 24): ONE device call, most important first, each group tarred into $OUT as it ends.
#
#   bash capture/run_session3.sh                 # on the lent H200 (about 5 minutes; refuses optional work past BUDGET_S)
#   SMOKE=cpu bash capture/run_session3.sh       # the same plan on a CPU: tiny sizes, torch profiler, eager only
#
# Groups (tarball in $OUT):
#   1 serve_prefill_nsys.tar.gz  serve-prefill-eager-nomark, serve-prefill-graph-nomark: the first profiled step is a
#                                prefill (4 x 512 prompt tokens), then 11 decode steps; no markers (issue 24)
#   2 lora_nsys.tar.gz           lora-small-graph-nomark, lora-small-eager: LoRA rank 16 on every projection, 2 adapters,
#                                batch 4, vLLM-shaped Triton _lora_shrink_kernel/_lora_expand_kernel; no speculation (23)
#   3 moe_nsys.tar.gz            moe-small-graph-nomark, moe-small-eager-nomark (torch._grouped_mm where it works), and
#                                moe-small-graph-triton-nomark (Triton fused_moe_kernel): 16 experts top-2, batch 8 (23)
#   4 collectives.tar.gz         collectives probe at world size 1 (torch.profiler table + nsys table), and IF
#                                reduce-scatter and all-gather launch kernels there, sp-graph-nomark (23)
#   5 serve_prefill_torch.tar.gz serve-prefill-eager-torch-nomark: a torch-profiler twin (optional, if time is left)
# plus $OUT/session3.log when the caller tees into it. Nothing else is written to $OUT (at most 8 files come back).
#
# Needs python3 with torch (+ triton on the GPU for lora/moe-triton) and click; nsys (via $NSYS, PATH or the usual
# install folders) with libdw.so.1 (./.gpu) for `nsys export` / `nsys stats`.
set -uo pipefail
cd "$(dirname "$0")/.."
RES=${RES:-/tmp/tk_session3}
rm -rf "$RES"; mkdir -p "$RES"
. capture/gpu_env.sh
TK=(python3 -m tracekit capture)          # imports neither polars nor rich (absent on the GPU host)
STEP_TIMEOUT=${STEP_TIMEOUT:-150}
BUDGET_S=${BUDGET_S:-400}                 # optional captures start only before this many seconds
HARD_S=${HARD_S:-465}                     # nothing runs past this many seconds (the call must end within 8 minutes)
T0=$SECONDS

if [ "${SMOKE:-}" = cpu ]; then   # CPU dry run of the same plan
  SMALL=tiny; NSYSP=torch; GRAPH=eager; DEV=(--device cpu); PEAK=()
  S16=(--steps 3 --timed-steps 3 --warmup 1); S12=("${S16[@]}"); PROMPT=(--prompt-len 64 --batch 2)
  STEP_TIMEOUT=${SMOKE_TIMEOUT:-600}; BUDGET_S=100000; HARD_S=100000
else
  SMALL=small; NSYSP=nsys; GRAPH=graph; DEV=(); PEAK=(--peak-bw "${PEAK_BW:-4800}")
  S16=(--steps 16 --timed-steps 40); S12=(--steps 12 --timed-steps 40); PROMPT=(--prompt-len 512 --batch 4)
fi

{
  echo "== host (session 3)"; date -u; hostname
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv 2>/dev/null
  python3 -c "import torch,sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU', 'grouped_mm', hasattr(torch, '_grouped_mm'))"
  python3 -c "import triton; print('triton', triton.__version__)" 2>&1 | tail -1
  echo "nsys: ${NSYS:-none}"; [ -n "${NSYS:-}" ] && "$NSYS" --version
  nproc; grep -m1 'model name' /proc/cpuinfo
} 2>&1 | tee "$RES/gpu_3.txt"

FAILED=()
SKIPPED=()
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
    echo "== $name: ok in $((SECONDS - t0)) s; $(ls -l "$RES/$name" | awk 'NR>1 {printf "%s %s  ", $9, $5}')"
    python3 - "$RES/$name/manifest.json" <<'EOF' || true
import json, sys
m = json.load(open(sys.argv[1]))
keys = ("unprofiled_step_ms", "weight_bytes_per_step", "tokens_per_step", "phases", "speculative")
print("   manifest:", {k: m.get(k) for k in keys if k in m},
      {k: {kk: m[k].get(kk) for kk in ("impl", "unprofiled_base_step_ms", "expected_distinct_experts",
                                         "measured_distinct_experts", "unprofiled_prefill_step_ms")
           if kk in m[k]} for k in ("lora", "moe", "prefill") if isinstance(m.get(k), dict)})
EOF
  else
    echo "== $name: FAILED (exit $?) after $((SECONDS - t0)) s"; FAILED+=("$name")
  fi
}
optional() {  # optional NAME ...: cap only while the budget allows
  if [ $((SECONDS - T0)) -ge "$BUDGET_S" ]; then echo "== $1: skipped (past ${BUDGET_S} s)"; SKIPPED+=("$1"); return 0; fi
  cap "$@"
}
kern_sum() {  # nsys stats on a COPY of the export (stats may add tables to the file it reads)
  local d=$RES/$1
  [ -n "${NSYS:-}" ] && [ -f "$d/trace.sqlite.gz" ] || return 0
  local t; t=$(left 60); [ "$t" -gt 0 ] || return 0
  local tmp; tmp=$(mktemp -d)
  gunzip -c "$d/trace.sqlite.gz" > "$tmp/t.sqlite"
  timeout "$t" "$NSYS" stats --report cuda_gpu_kern_sum --format csv -o "$tmp/ks" "$tmp/t.sqlite" >/dev/null 2>"$tmp/err" \
    && mv "$tmp"/ks*cuda_gpu_kern_sum*.csv "$d/nsys_stats_kern_sum.csv" \
    && echo "== $1: nsys_stats_kern_sum.csv ($(wc -l < "$d/nsys_stats_kern_sum.csv") lines)" \
    || { echo "== $1: nsys stats failed"; cat "$tmp/err"; }
  rm -rf "$tmp"
}
bundle() {  # bundle TARBALL NAME... : into $OUT right away (no .nsys-rep)
  local tb=$1; shift
  [ -n "${OUT:-}" ] || return 0
  local have=(); for n in "$@"; do [ -e "$RES/$n" ] && have+=("$n"); done
  [ ${#have[@]} -gt 0 ] || return 0
  ( cd "$RES" && tar --exclude='*.nsys-rep' -czf "$OUT/$tb" "${have[@]}" ) && echo "== bundled $tb: $(du -h "$OUT/$tb" | cut -f1)"
}

# 1. serve: a prefill step at the start of the window, then decode; no markers (eager, and decode graphs)
SERVE=(--workload serve --size "$SMALL" --prefill-in-window "${PROMPT[@]}" "${DEV[@]}")
cap serve-prefill-eager-nomark "${SERVE[@]}" --profiler "$NSYSP" --mode eager    "${S12[@]}" "${PEAK[@]}" --no-markers
cap serve-prefill-graph-nomark "${SERVE[@]}" --profiler "$NSYSP" --mode "$GRAPH" "${S12[@]}" "${PEAK[@]}" --no-markers
bundle serve_prefill_nsys.tar.gz gpu_3.txt serve-prefill-eager-nomark serve-prefill-graph-nomark

# 2. LoRA adapters on every projection, no speculation
LORA=(--workload lora --size "$SMALL" "${DEV[@]}")
cap lora-small-graph-nomark    "${LORA[@]}" --profiler "$NSYSP" --mode "$GRAPH" "${S16[@]}" "${PEAK[@]}" --no-markers
cap lora-small-eager           "${LORA[@]}" --profiler "$NSYSP" --mode eager    "${S12[@]}" "${PEAK[@]}"
kern_sum lora-small-graph-nomark
bundle lora_nsys.tar.gz lora-small-graph-nomark lora-small-eager

# 3. mixture of experts, no speculation
MOE=(--workload moe --size "$SMALL" "${DEV[@]}")
cap moe-small-graph-nomark     "${MOE[@]}" --profiler "$NSYSP" --mode "$GRAPH" "${S16[@]}" "${PEAK[@]}" --no-markers
cap moe-small-eager-nomark     "${MOE[@]}" --profiler "$NSYSP" --mode eager    "${S12[@]}" "${PEAK[@]}" --no-markers
TRITON_MOE=(--experts triton); [ "${SMOKE:-}" = cpu ] && TRITON_MOE=(--experts loop)   # no Triton on the CPU run
optional moe-small-graph-triton-nomark "${MOE[@]}" --profiler "$NSYSP" --mode "$GRAPH" "${S16[@]}" "${PEAK[@]}" \
  --no-markers "${TRITON_MOE[@]}"
kern_sum moe-small-graph-nomark
bundle moe_nsys.tar.gz moe-small-graph-nomark moe-small-eager-nomark moe-small-graph-triton-nomark

# 4. collectives at world size 1: which launch a GPU kernel (and a reduce-scatter/all-gather loop if they do)
CD=$RES/collectives; mkdir -p "$CD"
echo; echo "== collectives probe [$((SECONDS - T0)) s]"
PROBE_OK=0
if [ "$(left 90)" -gt 0 ] && timeout "$(left 90)" python3 capture/collectives_probe.py --json-out "$CD/probe_torch.json" 2>&1 \
     | tee "$CD/probe_torch.txt"; then
  PROBE_OK=1
else
  echo "== collectives probe: FAILED or skipped"; FAILED+=(collectives-probe)
fi
if [ -n "${NSYS:-}" ] && [ "${SMOKE:-}" != cpu ] && [ "$PROBE_OK" = 1 ] && [ "$(left 90)" -gt 0 ]; then
  echo "== collectives probe under nsys [$((SECONDS - T0)) s]"
  if timeout "$(left 90)" "$NSYS" profile -t cuda,nvtx --capture-range=cudaProfilerApi --capture-range-end=stop \
       --force-overwrite=true -o "$CD/probe" python3 capture/collectives_probe.py --detect none > "$CD/probe_nsys_run.txt" 2>&1 \
     && timeout "$(left 60)" "$NSYS" export --type sqlite -o "$CD/probe.sqlite" "$CD/probe.nsys-rep" >/dev/null 2>&1; then
    python3 capture/collectives_probe.py --from-sqlite "$CD/probe.sqlite" --json-out "$CD/probe_nsys.json" 2>&1 \
      | tee "$CD/probe_nsys.txt"
    gzip -9 -n "$CD/probe.sqlite"; rm -f "$CD/probe.nsys-rep"
  else
    echo "== collectives probe under nsys: FAILED"; tail -20 "$CD/probe_nsys_run.txt"; FAILED+=(collectives-probe-nsys)
  fi
fi
SP_ARGS=$(python3 - "$CD/probe_torch.json" "${SMOKE:-}" <<'EOF'
import json, sys
if sys.argv[2] == "cpu":             # the CPU run exercises the loop with copies standing in for the collectives
    print("--rs local --ag local --mode eager"); sys.exit()
try:
    s = json.load(open(sys.argv[1]))
except (OSError, ValueError):
    sys.exit()
rows = {r["op"]: r for r in s.get("rows", [])}
rs_map = {"nccl reduce_scatter_tensor": "nccl", "symm reduce_scatter_out": "symm"}
ag_map = {"nccl all_gather_into_tensor": "nccl", "symm _low_contention_all_gather": "symm-lc"}
summ = s.get("summary", {})
rs = [o for o in summ.get("reduce_scatter_kernel_ops", []) if o in rs_map]
ag = [o for o in summ.get("all_gather_kernel_ops", []) if o in ag_map]
if rs and ag:
    graph = all(rows[o].get("graph") == "ok" for o in (rs[0], ag[0]))
    print(f"--rs {rs_map[rs[0]]} --ag {ag_map[ag[0]]} --mode {'graph' if graph else 'eager'}")
EOF
)
if [ -n "$SP_ARGS" ]; then
  # shellcheck disable=SC2086
  optional sp-nomark --workload sp "${DEV[@]}" --profiler "$NSYSP" $SP_ARGS "${S16[@]}" "${PEAK[@]}" --no-markers \
    $([ "${SMOKE:-}" = cpu ] && echo --layers 2 --hidden 256 --ffn 512)
  [ -d "$RES/sp-nomark" ] && mv "$RES/sp-nomark" "$CD/"
elif [ "$PROBE_OK" = 1 ]; then
  echo "== no reduce-scatter + all-gather pair launches a kernel at world size 1: no sp capture (the probe tables above are the evidence)"
else
  echo "== no sp capture: the probe did not finish"
fi
bundle collectives.tar.gz collectives

# 5. optional: a torch-profiler twin of the eager prefill window
optional serve-prefill-eager-torch-nomark "${SERVE[@]}" --profiler torch --mode eager "${S12[@]}" "${PEAK[@]}" --no-markers
bundle serve_prefill_torch.tar.gz serve-prefill-eager-torch-nomark

echo; echo "== sizes [$((SECONDS - T0)) s]"; du -ah "$RES" | sort -k2 | grep -v nsys-rep
echo "== failed: ${FAILED[*]:-none}; skipped: ${SKIPPED[*]:-none}"
[ -n "${OUT:-}" ] && ls -la "$OUT"
[ ${#FAILED[@]} -eq 0 ]
