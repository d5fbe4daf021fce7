#!/usr/bin/env bash
# Peer (c): `nsys stats --report cuda_gpu_kern_sum` on the same 10M-kernel SYNTHETIC SQLite,
# on the GPU machine where nsys exists (needs only python3 + this repo; no polars).
#   mkdir -p .gpu && cp /work/shared/device-libs/* .gpu/   # then, on the device (carry: [".gpu"]):
#   bash benchmarks/device_nsys_stats.sh 10M "$OUT"
set -u
SIZE=${1:-10M}; OUT=${2:-/tmp/nsys_stats_out}; mkdir -p "$OUT"
NSYS=${NSYS:-/opt/nvidia/nsight-compute/2025.3.1/host/target-linux-x64/nsys}
export LD_LIBRARY_PATH=$PWD/.gpu:${LD_LIBRARY_PATH:-}
DB=/tmp/nsys_${SIZE}.sqlite
python3 benchmarks/make_nsys.py --kernels "$SIZE" -o "$DB" > "$OUT/make.json"
nproc > "$OUT/machine.txt"; free -g >> "$OUT/machine.txt"; "$NSYS" --version >> "$OUT/machine.txt" 2>&1
# The input is a throwaway copy under /tmp (nsys stats may add indexes to an export it reads).
timeout ${STATS_TIMEOUT:-190} /usr/bin/time -v "$NSYS" stats --report cuda_gpu_kern_sum --format csv --force-export=false \
  --output "$OUT/kern_sum" "$DB" > "$OUT/stats.log" 2> "$OUT/time.txt"
echo "rc=$?" >> "$OUT/stats.log"
grep -E "Elapsed|Maximum resident" "$OUT/time.txt"
head -c 1500 "$OUT"/kern_sum*.csv 2>/dev/null; tail -5 "$OUT/stats.log"
