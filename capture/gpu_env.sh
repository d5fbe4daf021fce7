# Sourced by the capture scripts (run from the repo root): environment for captures on a GPU host.
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
# NVLink multicast stays off (it can take a shared host's GPUs out of service).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# libdw.so.1 for `nsys export` / `nsys stats` on the lent H200 (copied into ./.gpu).
[ -d "$PWD/.gpu" ] && export LD_LIBRARY_PATH=$PWD/.gpu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
if [ -z "${NSYS:-}" ]; then
  for c in /opt/nvidia/nsight-compute/2025.3.1/host/target-linux-x64/nsys /opt/nvidia/nsight-systems/*/bin/nsys; do
    [ -x "$c" ] && { export NSYS=$c; break; }
  done
fi
PEAK_BW=${PEAK_BW:-4800}   # H200 SXM datasheet: 4.8 TB/s
