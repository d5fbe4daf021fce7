#!/usr/bin/env bash
# GPU validation of `tracekit capture --server` (issue 43): the SGLang TEST SERVER (tests/servers/sglang.py) in front
# of capture/spec_decode.py's real EAGLE-shaped loop (capture/harness.py), captured by the real client; see
# capture/server_gpu.py. Needs torch + click (no polars). Writes into $OUT: server_gpu_<size>.tar.gz per size (traces +
# manifest.json + server_gpu_<size>_result.json) and ONE log, server_gpu.log (SIZES="small large": 3 files).
# Overrides: SIZES (default "small"; "small large" adds the 8B shape), ACCEPT_PATTERN (1,2,0,3), STEPS (20),
# MODE (graph), DEVICE (cuda). CPU smoke run: DEVICE=cpu MODE=eager SIZES=tiny bash capture/server_gpu.sh
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=.
OUT=${OUT:-/tmp/server_gpu_out}
mkdir -p "$OUT"
LOG="$OUT/server_gpu.log"
: > "$LOG"
python3 -c "import torch, click; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())" 2>&1 | tee -a "$LOG"
rc=0
for size in ${SIZES:-small}; do
  echo "=== size $size ($(date +%T))" >> "$LOG"
  from=$(($(wc -l < "$LOG") + 1))
  python3 capture/server_gpu.py --size "$size" --mode "${MODE:-graph}" --device "${DEVICE:-cuda}" --spec 3 \
      --accept-pattern "${ACCEPT_PATTERN:-1,2,0,3}" --steps "${STEPS:-20}" --decode-tokens 121 --out "$OUT" \
      >> "$LOG" 2>&1 || rc=$?
  tail -n "+$from" "$LOG" | grep -E "RESULT|wrote|rror" | cut -c1-3000
done
echo "=== done rc=$rc ($(date +%T))" >> "$LOG"
exit $rc
