#!/usr/bin/env bash
# Session 4 captures (issues 42, 43, 45), in device calls of under 10 minutes each, most important first:
#
#   bash capture/run_session4.sh zoo      # the speculative zoo (capture/run_zoo.sh, ~6 min) + nsys stats references
#   bash capture/run_session4.sh gate     # the diff gate's repeat / unmarked / slower captures (capture/gate_captures.sh)
#   bash capture/run_session4.sh server   # the SGLang test server in front of a real EAGLE loop (capture/server_gpu.sh)
#   bash capture/run_session4.sh k1       # one draft step (K=1: SGLang/vLLM DeepSeek-MTP's usual setting), shapes the
#                                         # zoo was not tuned on: chain, hybrid, vLLM order; unmarked + marked twin
#
# Each writes its tarballs and logs into $OUT (at most 8 files a call). The nsys stats references
# (benchmarks/device_nsys_stats.sh refs) run on the zoo's nsys exports, the committed sample exports (.snsys: a copy of
# sample_traces/*/trace.sqlite* carried beside the tree) and the shared external exports (.ext: a copy of
# ../shared/external_traces/**/*.sqlite), each read from a throwaway copy.
# Needs: .gpu/libdw.so.1 (carry .gpu), torch + click on the GPU host, nsys in its usual folder.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/session4_out}; mkdir -p "$OUT"
export OUT
T0=$SECONDS
case "${1:-}" in
  zoo)
    RES=/tmp/tk_zoo bash capture/run_zoo.sh
    echo "== zoo done [$((SECONDS - T0)) s]"
    refs=(sample=/tmp/tk_zoo)   # (the zoo folders are committed as sample_traces/zoo-*)
    [ -d .snsys ] && refs+=(sample=.snsys)
    [ -d .ext ] && refs+=(shared=.ext)
    # (the zoo's exports are gzipped in their capture folders: refs mode decompresses .sqlite.gz)
    timeout 200 bash benchmarks/device_nsys_stats.sh refs "$OUT" "${refs[@]}"
    echo "== nsys stats done [$((SECONDS - T0)) s]"; ls -la "$OUT"
    ;;
  gate)
    RES=/tmp/tk_gate bash capture/gate_captures.sh
    echo "== gate done [$((SECONDS - T0)) s]"; ls -la "$OUT"
    ;;
  server)
    bash capture/server_gpu.sh
    echo "== server done [$((SECONDS - T0)) s]"; ls -la "$OUT"
    ;;
  k1)
    RES=/tmp/tk_k1 SPEC_STEPS=1 KINDS="nomark marked" ONLY_SHAPES="sglang-chain hybrid-nextn vllm-eagle" \
      HARD_S=${HARD_S:-170} bash capture/run_zoo.sh
    echo "== k1 done [$((SECONDS - T0)) s]"; ls -la "$OUT"
    ;;
  *) echo "usage: $0 zoo|gate|server|k1" >&2; exit 2 ;;
esac
