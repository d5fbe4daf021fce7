"""Tensor parallelism for the capture workloads: one process per GPU over torch.distributed (NCCL),
Megatron-style sharding helpers and a choice of all-reduce implementation.

Launched by ``tracekit capture --tp N`` through ``torchrun --standalone --nproc_per_node N`` (under
nsys that is ONE report covering every rank, thanks to ``--trace-fork-before-exec=true``). A workload
run without a launcher and ``--tp 1`` still makes a process group of size 1 itself, so the
distributed code path is the same at every world size.

All-reduce choices (``--allreduce``):

* ``nccl``           -- ``torch.distributed.all_reduce`` (NCCL). At world size 1 NCCL launches no kernel.
* ``symm-one-shot``  -- PyTorch symmetric memory ``torch.ops.symm_mem.one_shot_all_reduce``: each rank
  reads every peer's buffer and reduces (one kernel, a real kernel even at world size 1).
* ``symm-two-shot``  -- ``torch.ops.symm_mem.two_shot_all_reduce_``: reduce-scatter + all-gather in one
  kernel, in place on the symmetric buffer.

The symmetric-memory paths copy the input into one pre-registered buffer of the decode message size
(like vLLM's SymmMemCommunicator); a larger message (the prefill) goes through NCCL. Where symmetric
memory is unusable the choice degrades to ``nccl`` with a clear message, kept in the manifest
(``tensor_parallel.allreduce_fallback``). NVLink multicast (NVLS / multimem) is never used: the
environment below is forced in every worker, and no ``multimem_*`` op is called.

The pure functions at the top (environment, argument checks, shard arithmetic) need no torch.
"""

from __future__ import annotations

import os
import sys

ALLREDUCE_CHOICES = ("nccl", "symm-one-shot", "symm-two-shot")
# NVLink SHARP / multicast off, for NCCL, torch symmetric memory and NVSHMEM
NO_MULTICAST_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def force_no_multicast(env=None) -> dict:
    """Set (not default) the no-multicast variables in ``env`` (``os.environ`` by default)."""
    env = os.environ if env is None else env
    for k, v in NO_MULTICAST_ENV.items():
        env[k] = v
    return env


def dist_env(env=None) -> dict:
    """rank / world_size / local_rank from a launcher's environment (torchrun), else a world of 1."""
    env = os.environ if env is None else env
    if "RANK" in env and "WORLD_SIZE" in env:
        return {"rank": int(env["RANK"]), "world_size": int(env["WORLD_SIZE"]),
                "local_rank": int(env.get("LOCAL_RANK", env["RANK"])), "launcher": "torchrun"}
    return {"rank": 0, "world_size": 1, "local_rank": 0, "launcher": "none"}


def check_divisible(tp: int, **dims: int) -> None:
    """Every sharded dimension must split evenly over ``tp`` ranks (else a clear SystemExit)."""
    bad = [f"{k}={v}" for k, v in dims.items() if v % tp]
    if bad:
        raise SystemExit(f"--tp {tp}: these sizes do not divide by {tp}: {', '.join(bad)}")


def shard_range(n: int, tp: int, rank: int) -> tuple[int, int]:
    """[start, stop) of rank's equal 1/tp share of ``n`` rows or columns."""
    if n % tp:
        raise ValueError(f"{n} does not divide by tp={tp}")
    k = n // tp
    return rank * k, (rank + 1) * k


def rank_path(path: str | None, rank: int, world_size: int) -> str | None:
    """``trace.json.gz`` -> ``trace.rank1.json.gz`` (and ``facts.json`` -> ``facts.rank1.json``)
    when world_size > 1; unchanged at world size 1."""
    if path is None or world_size <= 1:
        return path
    d, base = os.path.split(path)
    for ext in (".json.gz", ".json", ".gz"):
        if base.endswith(ext):
            return os.path.join(d, f"{base[:-len(ext)]}.rank{rank}{ext}")
    return os.path.join(d, f"{base}.rank{rank}")


def add_tp_args(p, allreduce_default: str | None = "nccl") -> None:
    p.add_argument("--tp", type=int, default=None,
                   help="tensor-parallel world size (one process per GPU, launched by torchrun); "
                        "1 = a process group of size 1")
    p.add_argument("--allreduce", choices=list(ALLREDUCE_CHOICES), default=allreduce_default,
                   help="all-reduce after each row-parallel linear (with --tp)")


def log(*a) -> None:
    print("[workload]", *a, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------
# torch side
# --------------------------------------------------------------------------------------------

class Dist:
    """The process group of this rank (NCCL on GPUs), initialized once. ``--device cpu`` uses gloo:
    only for tests of the sharding on a machine without GPUs (symmetric memory then degrades)."""

    def __init__(self, tp: int, device: str = "cuda"):
        import torch
        import torch.distributed as dist

        force_no_multicast()
        e = dist_env()
        if e["world_size"] != tp:
            raise SystemExit(f"--tp {tp} but the launcher started WORLD_SIZE={e['world_size']} processes "
                             "(use tracekit capture --tp N, or torchrun --nproc_per_node N)")
        self.rank, self.world_size, self.local_rank, self.launcher = (
            e["rank"], e["world_size"], e["local_rank"], e["launcher"])
        self.cuda = str(device).startswith("cuda")
        if self.cuda:
            if not torch.cuda.is_available():
                raise SystemExit("--tp needs CUDA GPUs (NCCL); --device cpu runs it over gloo (tests only)")
            if self.local_rank >= torch.cuda.device_count():
                raise SystemExit(f"rank {self.rank}: local rank {self.local_rank} but only "
                                 f"{torch.cuda.device_count()} GPU(s) visible")
            torch.cuda.set_device(self.local_rank)
            self.device = torch.device("cuda", self.local_rank)
        else:
            self.device = torch.device("cpu")
        self.backend = "nccl" if self.cuda else "gloo"
        if self.launcher == "none":  # a world of one without a launcher
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
            os.environ.setdefault("RANK", "0")
            os.environ.setdefault("WORLD_SIZE", "1")
        if not dist.is_initialized():
            kw = {"device_id": self.device} if self.cuda else {}
            dist.init_process_group(self.backend, rank=self.rank, world_size=self.world_size, **kw)
        self.group = dist.group.WORLD
        self.dist = dist

    def barrier(self) -> None:
        import torch

        if self.cuda:
            self.dist.barrier(device_ids=[self.local_rank])
            torch.cuda.synchronize()
        else:
            self.dist.barrier()

    def all_gather_last_dim(self, x):
        """Concatenate every rank's ``x`` along its last dimension (NCCL all-gather)."""
        import torch

        if self.world_size == 1:
            return x
        flat = x.contiguous().view(-1)
        out = torch.empty(self.world_size * flat.numel(), dtype=x.dtype, device=x.device)
        self.dist.all_gather_into_tensor(out, flat, group=self.group)
        out = out.view(self.world_size, *x.shape)                    # [tp, ..., V/tp]
        return torch.movedim(out, 0, -2).reshape(*x.shape[:-1], self.world_size * x.shape[-1])

    def close(self) -> None:
        try:
            if self.dist.is_initialized():
                self.dist.destroy_process_group()
        except Exception:
            pass


class AllReduce:
    """Sum all-reduce of one implementation (``ALLREDUCE_CHOICES``), graph-capturable.

    ``max_numel``: the decode message size (elements); the symmetric buffer is that large, and a larger
    message (prefill) is reduced with NCCL instead. ``self.impl`` is what is really used;
    ``self.fallback`` says why when it differs from ``requested``."""

    def __init__(self, requested: str, dist_: Dist, max_numel: int, dtype):
        import torch

        if requested not in ALLREDUCE_CHOICES:
            raise SystemExit(f"--allreduce {requested}: use one of {', '.join(ALLREDUCE_CHOICES)}")
        self.requested = requested
        self.impl = requested
        self.fallback = None
        self.d = dist_
        self.max_numel = int(max_numel)
        self.dtype = dtype
        self.calls = 0
        self.buf = None
        if requested.startswith("symm"):
            try:
                self._init_symm(torch)
            except Exception as e:  # degrade: NCCL, saying why
                self.fallback = f"{type(e).__name__}: {e}".splitlines()[0][:300]
                self.impl = "nccl"
                self.buf = None
                log(f"--allreduce {requested} unavailable here ({self.fallback}); using nccl instead")

    def _init_symm(self, torch) -> None:
        if not self.d.cuda:
            raise RuntimeError("symmetric memory needs CUDA GPUs")
        import torch.distributed._symmetric_memory as symm_mem

        op_name = "one_shot_all_reduce" if self.requested == "symm-one-shot" else "two_shot_all_reduce_"
        ops = getattr(torch.ops, "symm_mem", None)
        if ops is None or not hasattr(ops, op_name):
            raise RuntimeError(f"torch {torch.__version__} has no torch.ops.symm_mem.{op_name}")
        gname = self.d.group.group_name
        if hasattr(symm_mem, "enable_symm_mem_for_group"):
            symm_mem.enable_symm_mem_for_group(gname)
        self.buf = symm_mem.empty(self.max_numel, dtype=self.dtype, device=self.d.device)
        symm_mem.rendezvous(self.buf, gname)
        self.group_name = gname
        self.op = getattr(ops, op_name)
        # one trial call (fails here, not inside the timed loop or a graph capture, if unusable)
        self.buf.fill_(1)
        out = self.op(self.buf, "sum", gname)
        torch.cuda.synchronize()
        got = float(out.view(-1)[0])
        if abs(got - self.d.world_size) > 1e-3:
            raise RuntimeError(f"trial {op_name} of ones gave {got}, expected {self.d.world_size}")

    @property
    def kernel_expected(self) -> bool:
        """Whether this all-reduce launches a GPU kernel in a world of this size."""
        return self.d.cuda and (self.impl.startswith("symm") or self.d.world_size > 1)

    def __call__(self, x):
        import torch

        self.calls += 1
        n = x.numel()
        if self.buf is None or n > self.max_numel:   # nccl (also a symm choice's prefill-sized message)
            x = x.contiguous()
            self.d.dist.all_reduce(x, group=self.d.group)
            return x
        work = self.buf[:n]
        work.copy_(x.reshape(-1))
        if self.impl == "symm-one-shot":
            return self.op(work, "sum", self.group_name).view_as(x)
        self.op(work, "sum", self.group_name)        # two-shot: in place on the symmetric buffer
        out = torch.empty_like(x)
        out.copy_(work.view_as(x))
        return out

    def facts(self, message_numel: int, per_step: int) -> dict:
        esz = {"float32": 4, "bfloat16": 2, "float16": 2}.get(str(self.dtype).replace("torch.", ""), 2)
        return {"allreduce": self.impl, "allreduce_requested": self.requested, "allreduce_fallback": self.fallback,
                "allreduce_message_bytes": int(message_numel * esz), "allreduce_per_step": int(per_step),
                "allreduce_launches_kernel": bool(self.kernel_expected)}


class RowParallel:
    """A row-parallel linear (input features sharded) followed by the all-reduce: wraps the
    sharded ``nn.Linear`` so a model's ``self.o_proj(x)`` / ``self.down_proj(x)`` call works unchanged."""

    def __new__(cls, linear, allreduce):
        import torch

        class _RowParallel(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.linear = linear
                self.allreduce = allreduce

            def forward(self, x):
                return self.allreduce(self.linear(x))

        return _RowParallel()


class VocabParallelHead:
    """lm_head with its vocabulary rows sharded, then an all-gather of the logits."""

    def __new__(cls, linear, dist_):
        import torch

        class _VocabParallelHead(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.linear = linear

            def forward(self, x):
                return dist_.all_gather_last_dim(self.linear(x))

        return _VocabParallelHead()


def sliced_linear(linear, dim: int, tp: int, rank: int):
    """A new ``nn.Linear`` holding rank's shard: ``dim=0`` = column-parallel (output features, the
    weight's rows, bias too), ``dim=1`` = row-parallel (input features; no bias allowed)."""
    import torch

    w = linear.weight.data
    a, b = shard_range(w.shape[dim], tp, rank)
    ws = (w[a:b] if dim == 0 else w[:, a:b]).contiguous()
    bias = linear.bias
    if dim == 1 and bias is not None:
        raise SystemExit("row-parallel linear with a bias is not supported")
    # skip_init: no random initialization (it would also advance the RNG that makes the prompt)
    new = torch.nn.utils.skip_init(torch.nn.Linear, ws.shape[1], ws.shape[0], bias=bias is not None,
                                   device=ws.device, dtype=ws.dtype)
    with torch.no_grad():
        new.weight.copy_(ws)
        if bias is not None:
            new.bias.copy_(bias.data[a:b])
    return new
