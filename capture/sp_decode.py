"""A sequence-parallel decode loop: a reduce-scatter and an all-gather per layer, at world size 1 (pure torch).

    python capture/sp_decode.py --mode eager|graph [--rs nccl|symm|local] [--ag nccl|symm-lc|local] \
        [--layers 16] [--tokens 8] [--no-markers] --profiler nsys|torch|none --steps 16 --facts-out facts.json

Megatron-style sequence parallelism around a tensor-parallel MLP, as SGLang/vLLM run it with sequence
parallelism on (the residual stream split over the ranks by tokens): per layer, ``all_gather`` the token
shards into the full ``[tokens, hidden]``, RMSNorm, the column-parallel up GEMM ``[hidden -> ffn/tp]``, SiLU,
the row-parallel down GEMM ``[ffn/tp -> hidden]`` (partial sums), ``reduce_scatter`` them back to the token
shards, residual add. One GPU gives a world of one (``tp.Dist`` without a launcher: a process group of size
1), where a shard is the whole. ``capture/collectives_probe.py`` tells which implementations launch a kernel
there; ``run_session3.sh`` runs this capture only with ones that do.

``--rs``: ``nccl`` (``dist.reduce_scatter_tensor``), ``symm`` (``torch.ops.symm_mem.reduce_scatter_out`` from
a symmetric buffer), ``local`` (a copy: the CPU smoke run). ``--ag``: ``nccl``
(``dist.all_gather_into_tensor``), ``symm-lc`` (``torch.ops.symm_mem._low_contention_all_gather``), ``local``.
One step: the layers (eager, or ONE CUDA graph), then the last token's hidden state read to the host.
Markers (unless ``--no-markers``): ``decode_step <i>`` only. Manifest: ``speculative: false``, ``tp`` 1, the
collectives per step and their message bytes. The loop (warm-up, unprofiled timing, profiler, facts) is
``capture/harness.py``'s; this file says what one step does (``SPDecode``).
"""

from __future__ import annotations

import sys

import _common
import harness
import tp as tpmod


class SPDecode(harness.Workload):
    """A sequence-parallel decode loop: a reduce-scatter and an all-gather per layer, at world size 1."""

    name = "sp"

    @classmethod
    def add_args(cls, p):
        p.add_argument("--layers", type=int, default=16)
        p.add_argument("--hidden", type=int, default=2048)
        p.add_argument("--ffn", type=int, default=8192)
        p.add_argument("--tokens", type=int, default=8, help="tokens decoded per step (the batch)")
        p.add_argument("--rs", choices=["nccl", "symm", "local"], default="nccl")
        p.add_argument("--ag", choices=["nccl", "symm-lc", "local"], default="nccl")
        p.add_argument("--dtype", choices=["bfloat16", "float16"], default="bfloat16")

    @classmethod
    def check_args(cls, p, args):
        if args.mode == "compile":
            p.error("--mode compile: the sp workload runs eager or graph")

    def build(self):
        import torch.nn.functional as F
        torch, dev, args, cuda = self.torch, self.dev, self.args, self.cuda
        if not cuda and (args.rs != "local" or args.ag != "local"):
            raise SystemExit("--device cpu: use --rs local --ag local")
        dtype = self.dtype = getattr(torch, args.dtype)
        T, H, Fd, L = args.tokens, args.hidden, args.ffn, args.layers
        dist_ = self.dist_ = tpmod.Dist(1, "cuda") if cuda and "local" not in (args.rs, args.ag) else None
        gname = dist_.group.group_name if dist_ is not None else None
        world = self.world = 1
        gen = torch.Generator(device=dev)
        gen.manual_seed(args.seed)

        def w(*shape):
            return (torch.randn(*shape, device=dev, dtype=torch.float32, generator=gen) * 0.02).to(dtype)

        w_up = [w(Fd // world, H) for _ in range(L)]
        w_down = [w(H, Fd // world) for _ in range(L)]
        norm = [torch.ones(H, device=dev, dtype=dtype) for _ in range(L)]
        self.weights = w_up + w_down + norm
        x_shard = self.x_shard = torch.randn(T // world, H, device=dev, dtype=dtype, generator=gen)
        full = torch.empty(T, H, device=dev, dtype=dtype)
        rs_out = torch.empty(T // world, H, device=dev, dtype=dtype)
        symm = None
        if "symm" in args.rs or "symm" in args.ag:
            import torch.distributed._symmetric_memory as symm_mem

            if hasattr(symm_mem, "enable_symm_mem_for_group"):
                symm_mem.enable_symm_mem_for_group(gname)
            symm = symm_mem.empty(T * H, dtype=dtype, device=dev)
            symm_mem.rendezvous(symm, gname)
            ops = torch.ops.symm_mem

        def all_gather(x):
            if args.ag == "nccl":
                dist_.dist.all_gather_into_tensor(full, x.contiguous())
                return full
            if args.ag == "symm-lc":
                symm[: x.numel()].copy_(x.reshape(-1))
                return ops._low_contention_all_gather(symm[: x.numel()].view_as(x), gname)
            full.copy_(x)
            return full

        def reduce_scatter(y):
            if args.rs == "nccl":
                dist_.dist.reduce_scatter_tensor(rs_out, y.contiguous())
                return rs_out
            if args.rs == "symm":
                symm[: y.numel()].copy_(y.reshape(-1))
                ops.reduce_scatter_out(symm[: y.numel()].view_as(y), gname, False, rs_out)
                return rs_out
            rs_out.copy_(y)
            return rs_out

        def layers():
            x = x_shard
            for i in range(L):
                h = F.rms_norm(all_gather(x), (H,), norm[i], 1e-5)
                y = F.linear(F.silu(F.linear(h, w_up[i])), w_down[i])
                x = x + reduce_scatter(y)
            x_shard.copy_(x * 0.5)

        self.core = layers
        if args.mode == "graph":
            self.core = _common.graphed(layers, warm=3)
        self.host = torch.zeros(H, dtype=dtype, pin_memory=cuda)

    def reset(self):
        pass                    # the hidden state runs on from step to step, as before the harness

    def step(self, i):
        self.core()
        self.host.copy_(self.x_shard[-1], non_blocking=True)
        if self.cuda:
            self.torch.cuda.current_stream().synchronize()

    def contract(self):
        wbytes = sum(t.numel() * t.element_size() for t in self.weights)
        return {"weight_bytes": wbytes, "tokens_per_step": self.args.tokens}

    def facts(self, run):
        args = self.args
        T, H, L = args.tokens, args.hidden, args.layers
        msg = T * H * self.dtype.itemsize
        _common.log(f"sp: rs {args.rs}, ag {args.ag}")
        return {
            "speculative": False,
            "sp": {"layers": L, "hidden": H, "ffn": args.ffn, "tokens": T, "world_size": self.world,
                   "reduce_scatter": args.rs, "all_gather": args.ag,
                   "per_step": {"reduce_scatter": L, "all_gather": L},
                   "message_bytes": {"all_gather_out": msg, "reduce_scatter_in": msg},
                   "layout": "per layer: all_gather(token shards) -> rmsnorm -> up [H, F/tp] -> silu -> down "
                             "[F/tp, H] -> reduce_scatter -> residual"},
        }

    def close(self):
        if self.dist_ is not None:          # the world-of-one process group (nccl / symm collectives)
            self.dist_.barrier()
            self.dist_.close()


def main(argv=None) -> int:
    return harness.run(SPDecode, argv)


if __name__ == "__main__":
    sys.exit(main())
