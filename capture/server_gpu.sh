#!/usr/bin/env bash
# GPU validation of `tracekit capture --server` (issue 43): the SGLang TEST SERVER (tests/servers/sglang.py) in front
# of capture/spec_decode.py's real EAGLE-shaped loop, captured by the real client; see capture/server_gpu.py.
# Writes into $OUT, per size: server_gpu_<size>.tar.gz (traces + manifest.json + server_gpu_result.json) and
# server_gpu_<size>.log. SIZES (default "small large"), ACCEPT_PATTERN (1,2,0,3), STEPS (20), MODE (graph) override.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=.
OUT=${OUT:-/tmp/server_gpu_out}
mkdir -p "$OUT"
python3 -c "import torch, click; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
rc=0
for size in ${SIZES:-small large}; do
  python3 capture/server_gpu.py --size "$size" --mode "${MODE:-graph}" --spec 3 --accept-pattern "${ACCEPT_PATTERN:-1,2,0,3}" \
      --steps "${STEPS:-20}" --decode-tokens 121 --out "$OUT" > "$OUT/server_gpu_$size.log" 2>&1 || rc=$?
  grep -E "RESULT|wrote|error|Error" "$OUT/server_gpu_$size.log" | cut -c1-3000
done
exit $rc
