"""Synthetic, decode-like calibration loop (torch only, no model framework).

    python capture/synthetic.py --mode eager|graph --layers 32 --hidden 4096 --ffn 4096 \
        [--allreduce symm] [--device-profile-out profile.json] --profiler nsys|torch|none

One "step" = ``--layers`` layers, each: a weight-read GEMV (x[1,H] @ W[H,F] then W2[F,H],
bf16, bytes known exactly) plus a few small elementwise kernels (norm-like scale, SiLU,
residual add), optionally a torch symmetric-memory ``one_shot_all_reduce`` per layer at
world size 1 (a real all-reduce kernel on one GPU). ``--mode graph`` captures the same step
once with ``torch.cuda.CUDAGraph`` and replays it.

Tensor parallelism (``--tp N``, one process per GPU launched by ``tracekit capture --tp N``; or any of
``--allreduce nccl|symm-one-shot|symm-two-shot``, which implies ``--tp 1``): each layer is a Megatron MLP
block -- W1 column-parallel [H, F/N], W2 row-parallel [F/N, H] -- followed by ONE all-reduce of the
[1, H] activation (``capture/tp.py``; symmetric memory degrades to NCCL, saying why). Weight bytes per
step are then one GPU's shard. ``--allreduce symm`` without ``--tp`` is the older world-of-one path
(``SymmAllReduce`` below, no launcher).

``--extra-gemv N`` (issue 45: the diff gate's "slower kernel" capture) adds one more weight-read GEMV per layer,
``x @ W3[H, N]``, whose output gates the first N features of the SiLU output in place (``h[:, :N] *= g``): the same
loop with more GPU work per layer (H x N x 2 more bytes read, one GEMV and one elementwise kernel more), recorded in
the manifest (``synthetic.extra_gemv_cols``, and in ``weight_bytes_per_step``).

``--device-profile-out`` also measures the GPU itself and writes a device profile JSON
(schema ``tracekit.device_profile/1``): device-to-device copy bandwidth, GEMV read bandwidth,
and the per-kernel cost of eager launches vs graph replay of tiny kernels.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import _common
import markers
import tp as tpmod

for _k, _v in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ.setdefault(_k, _v)


class SymmAllReduce:
    """torch symmetric-memory one_shot_all_reduce in a world of size 1 (or None + reason)."""

    def __init__(self, numel: int, dtype, device):
        import torch
        import torch.distributed as dist

        self.reason = None
        self.op = None
        try:
            import torch.distributed._symmetric_memory as symm_mem

            if not dist.is_initialized():
                os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
                os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
                dev = torch.device(device)
                if dev.index is None:
                    dev = torch.device(dev.type, torch.cuda.current_device())
                dist.init_process_group("nccl", rank=0, world_size=1, device_id=dev)
            group_name = dist.group.WORLD.group_name
            if hasattr(symm_mem, "enable_symm_mem_for_group"):
                symm_mem.enable_symm_mem_for_group(group_name)
            self.buf = symm_mem.empty(numel, dtype=dtype, device=device)
            symm_mem.rendezvous(self.buf, group_name)
            self.group_name = group_name
            self.op = torch.ops.symm_mem.one_shot_all_reduce
            # one trial call: fails here (not in the timed loop) if the op is unusable
            out = self.op(self.buf, "sum", group_name)
            torch.cuda.synchronize()
            assert out.shape == self.buf.shape
        except Exception as e:  # degrade gracefully: the loop runs without communication
            self.op = None
            self.reason = f"{type(e).__name__}: {e}".splitlines()[0][:300]

    def __call__(self, x):
        self.buf.copy_(x.view(-1))
        return self.op(self.buf, "sum", self.group_name).view_as(x)


def build(args, dev, dtype, tp: int = 1, rank: int = 0):
    """Weights of one rank: W1 [H, F/tp] (column-parallel), W2 [F/tp, H] (row-parallel)."""
    import torch

    g = torch.Generator(device=dev).manual_seed(args.seed + rank)
    H, F, L = args.hidden, args.ffn // tp, args.layers
    w1 = [torch.randn(H, F, device=dev, dtype=dtype, generator=g) * 0.02 for _ in range(L)]
    w2 = [torch.randn(F, H, device=dev, dtype=dtype, generator=g) * 0.02 for _ in range(L)]
    norm = [torch.ones(H, device=dev, dtype=dtype) for _ in range(L)]
    x = torch.randn(1, H, device=dev, dtype=dtype, generator=g)
    return w1, w2, norm, x


def build_extra(args, dev, dtype, tp: int = 1) -> list:
    """``--extra-gemv N``: W3 [H, N] per layer (empty without it)."""
    import torch

    n = getattr(args, "extra_gemv", 0) or 0
    if not n:
        return []
    if n > args.ffn // tp:
        raise SystemExit(f"--extra-gemv {n}: at most the FFN width per rank ({args.ffn // tp})")
    g = torch.Generator(device=dev).manual_seed(args.seed + 1000)
    return [torch.randn(args.hidden, n, device=dev, dtype=dtype, generator=g) * 0.02 for _ in range(args.layers)]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    _common.add_common_args(p)
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--ffn", type=int, default=4096)
    p.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16")
    p.add_argument("--allreduce", choices=["none", "symm", *tpmod.ALLREDUCE_CHOICES], default="none",
                   help="none; symm (world-of-one one_shot_all_reduce, no launcher); with --tp: "
                        + "|".join(tpmod.ALLREDUCE_CHOICES) + " (default nccl)")
    p.add_argument("--tp", type=int, default=None, help="tensor-parallel world size (launched by torchrun)")
    p.add_argument("--device-profile-out", default=None)
    p.add_argument("--extra-gemv", type=int, default=0, metavar="N",
                   help="one more GEMV per layer, x @ W3[H, N], gating N features of the SiLU output (a slower "
                        "variant of the same loop; default 0: none)")
    p.add_argument("--spec", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    _common.apply_marker_flag(args)
    args.allreduce, args.tp = tp_choice(args.allreduce, args.tp)
    if args.spec:
        raise SystemExit("synthetic: --spec is not supported (use --workload hf)")
    if args.mode == "compile":
        raise SystemExit("synthetic: --mode compile is not supported (eager or graph)")

    import torch

    dtype = getattr(torch, args.dtype)
    dist_ = None
    tp_facts = None
    if args.tp is not None:
        tpmod.check_divisible(args.tp, ffn=args.ffn)
        dist_ = tpmod.Dist(args.tp, args.device)
        args.device = str(dist_.device)
        args.trace_out = tpmod.rank_path(args.trace_out, dist_.rank, dist_.world_size)
        args.facts_out = tpmod.rank_path(args.facts_out, dist_.rank, dist_.world_size)
        if args.device_profile_out and dist_.rank:
            args.device_profile_out = None     # one device profile (rank 0's)
    dev = torch.device(args.device)
    w1, w2, norm, x0 = build(args, dev, dtype, *((dist_.world_size, dist_.rank) if dist_ else (1, 0)))
    w3 = build_extra(args, dev, dtype, dist_.world_size if dist_ else 1)
    state = {"x": x0.clone()}
    xbuf = x0.clone()
    ar = None
    if dist_ is not None:
        ar = tpmod.AllReduce(args.allreduce, dist_, args.hidden, dtype)
        ar_reason = ar.fallback
        tp_facts = dict(world_size=dist_.world_size, rank=dist_.rank, launcher=dist_.launcher,
                        sharding="per layer: W1 column-parallel [H, F/tp], W2 row-parallel [F/tp, H], "
                                 "then one all-reduce",
                        allreduce_per_layer=1, **ar.facts(args.hidden, args.layers))
        _common.log(f"rank {dist_.rank}/{dist_.world_size}: all-reduce {ar.impl} of "
                    f"{tp_facts['allreduce_message_bytes']} bytes x {args.layers} per step")
    elif args.allreduce == "symm":
        if dev.type != "cuda":
            ar_reason = "needs CUDA"
        else:
            ar = SymmAllReduce(args.hidden, dtype, dev)
            ar_reason = ar.reason
            if ar.op is None:
                _common.log(f"--allreduce symm unavailable, running without it: {ar_reason}")
                ar = None
    else:
        ar_reason = None

    def layers():
        x = xbuf
        for l in range(args.layers):
            h = x * norm[l]                       # norm-like scale (elementwise)
            h = torch.nn.functional.silu(h @ w1[l])   # GEMV up + activation
            if w3:                                # --extra-gemv: one more GEMV, gating N features
                h[:, :w3[l].shape[1]] *= x @ w3[l]
            h = h @ w2[l]                         # GEMV down
            if ar is not None:
                h = ar(h)                         # one_shot_all_reduce (world size 1)
            x = x + h                             # residual
        xbuf.copy_(x * 0.5)                       # keep magnitudes bounded across steps
        return xbuf

    core = layers
    if args.mode == "graph":
        core = _common.graphed(layers, warm=3)

    host = torch.zeros(1, dtype=dtype, pin_memory=dev.type == "cuda")

    def step(i):
        core()
        host.copy_(xbuf[0, :1], non_blocking=True)   # the "token" to the host, as a decode loop does
        if dev.type == "cuda":
            torch.cuda.current_stream().synchronize()

    barrier = dist_.barrier if dist_ is not None else None
    for i in range(args.warmup):
        step(-1 - i)
    if barrier:
        barrier()
    timing = _common.time_steps(step, args.timed_steps, dev)
    wbytes = (sum(w.numel() * w.element_size() for w in w1 + w2 + w3)
              + sum(n.numel() * n.element_size() for n in norm))
    _common.log(f"unprofiled step: median {timing['median_ms']:.3f} ms; weight bytes/step {wbytes}")

    profile = None
    if args.device_profile_out:
        profile = device_profile(dev, dtype, args)
        profile["workload_step"] = {"mode": args.mode, "layers": args.layers, "weight_bytes_per_step": wbytes,
                                    "unprofiled_step_ms": timing["median_ms"]}
        with open(args.device_profile_out, "w") as f:
            json.dump(profile, f, indent=2, sort_keys=True)
            f.write("\n")
        _common.log(f"device profile written to {args.device_profile_out}")

    prof = _common.profiled_phase(step, args, start_index=args.timed_steps, barrier=barrier)
    kernels_per_layer = 5 + (2 if ar is not None else 0) + (2 if w3 else 0)
    facts = {
        "workload": "synthetic",
        "mode": args.mode,
        "steps": args.steps,
        "gpu_name": _common.gpu_name(dev),
        "weight_bytes_per_step": int(wbytes),
        "dtype": args.dtype,
        "tp": dist_.world_size if dist_ is not None else 1,
        "spec": None,
        "tokens_per_step": 1,
        "unprofiled_step_ms": round(timing["median_ms"], 6),
        "versions": _common.versions(None),
        "synthetic": {"layers": args.layers, "hidden": args.hidden, "ffn": args.ffn,
                      "allreduce": (ar.impl if dist_ is not None else args.allreduce) if ar is not None else "none",
                      "allreduce_unavailable": ar_reason,
                      "approx_kernels_per_layer": kernels_per_layer,
                      "extra_gemv_cols": args.extra_gemv},
        "unprofiled": timing,
        "profiled": prof,
        "device_profile": profile,
        "nvtx_backend": markers.nvtx_backend_name(),
    }
    return _common.finish(args, facts, tp_facts, dist_)


def tp_choice(allreduce: str, tp: int | None) -> tuple[str, int | None]:
    """(all-reduce, tp) after the defaults: with --tp, none -> nccl and symm -> symm-one-shot;
    a TP all-reduce choice without --tp means --tp 1 (a process group of size 1)."""
    if tp is not None:
        if tp < 1:
            raise SystemExit(f"--tp {tp}: must be >= 1")
        return {"none": "nccl", "symm": "symm-one-shot"}.get(allreduce, allreduce), tp
    if allreduce in tpmod.ALLREDUCE_CHOICES:
        return allreduce, 1
    return allreduce, None


def device_profile(dev, dtype, args) -> dict:
    """Copy bandwidth, GEMV bandwidth, eager-launch vs graph-replay cost per tiny kernel."""
    import torch

    cuda = dev.type == "cuda"
    out: dict = {"schema": "tracekit.device_profile/1", "gpu_name": _common.gpu_name(dev),
                 "versions": _common.versions(None)}
    # 1. device-to-device copy: bytes read + written per second (GB/s = 1e9 B/s)
    nbytes = (1 << 30) if cuda else (1 << 24)
    a = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    b = torch.empty_like(a)
    b.copy_(a)
    ms = _common.median_ms(lambda: b.copy_(a), 10, dev)
    out["copy"] = {"bytes_per_copy": nbytes, "median_ms": ms,
                   "bandwidth_gbps": 2 * nbytes / (ms * 1e-3) / 1e9,
                   "convention": "read + write bytes / time"}
    del a, b
    # 2. GEMV weight-read bandwidth (one large bf16 matrix, x[1,H] @ W[H,N])
    H, N = (8192, 32768) if cuda else (1024, 2048)
    w = torch.randn(H, N, device=dev, dtype=dtype) * 0.02
    x = torch.randn(1, H, device=dev, dtype=dtype)
    x @ w
    ms = _common.median_ms(lambda: x @ w, 20, dev)
    wb = w.numel() * w.element_size()
    out["gemv"] = {"weight_bytes": wb, "median_ms": ms, "bandwidth_gbps": wb / (ms * 1e-3) / 1e9,
                   "shape": [1, H, N]}
    del w
    # 3. per-kernel cost of tiny kernels: eager launches vs one graph replay of the same ones
    n = 2000
    t = torch.zeros(1024, device=dev, dtype=torch.float32)

    def many():
        for _ in range(n):
            t.add_(1.0)

    many()
    eager_ms = _common.median_ms(many, 5, dev)
    res = {"kernels": n, "eager_ms": eager_ms, "eager_us_per_kernel": eager_ms * 1e3 / n}
    if cuda:
        replay = _common.graphed(many, warm=1)
        replay()
        graph_ms = _common.median_ms(replay, 10, dev)
        # the kernel's own duration, from one launch's events, is a floor for both paths
        one_ms = _common.median_ms(lambda: t.add_(1.0), 50, dev)
        res.update(graph_ms=graph_ms, graph_us_per_kernel=graph_ms * 1e3 / n,
                   saving_us_per_kernel=(eager_ms - graph_ms) * 1e3 / n,
                   single_kernel_event_ms=one_ms)
        # host-side launch rate alone (no sync in between): how fast Python+torch can enqueue
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        many()
        host_ms = (time.perf_counter() - t0) * 1e3
        torch.cuda.synchronize()
        res["host_enqueue_us_per_kernel"] = host_ms * 1e3 / n
    out["launch"] = res
    if cuda:
        props = torch.cuda.get_device_properties(dev)
        out["device"] = {"sm_count": props.multi_processor_count, "total_memory_bytes": props.total_memory,
                         "l2_bytes": getattr(props, "L2_cache_size", None)}
    return out


if __name__ == "__main__":
    sys.exit(main())
