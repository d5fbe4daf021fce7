"""A decode loop with LoRA adapters on every projection, shaped like vLLM's punica path (pure torch + Triton,
random weights). No speculative decoding.

    python capture/lora_decode.py --size small --mode eager|graph [--batch 4] [--adapters 2] [--rank 16] \
        [--no-markers] --profiler nsys|torch|none --steps 16 --facts-out facts.json

The target is ``llama_torch.Target`` (fused qkv and gate_up, as vLLM's ``QKVParallelLinear`` /
``MergedColumnParallelLinear`` hold them). Every projection is a LoRA linear, as vLLM's
``ColumnParallelLinearWithLoRA`` family runs it (``punica_gpu.add_lora_linear``): the base GEMM, then
``_lora_shrink_kernel`` (x @ A.T into a float32 buffer ``[slices, tokens, rank]``) and
``_lora_expand_kernel`` (buffer @ B.T added into the base output), one launch each per linear, all slices
and adapters of the linear in that launch: qkv (3 slices: q, k, v), o (1), gate_up (2), down (1), so
4 x (GEMM + buffer zero + shrink + expand) per layer. Kernels: ``capture/lora_ops.py`` (Triton on a GPU,
the same sums in torch on a CPU: ``--lora-impl``).

One step, in order (vLLM's ``GPUModelRunner``: ``set_active_loras`` -> ``PunicaWrapperGPU.update_metadata``
-> ``LoRAKernelMeta.prepare_tensors`` before the forward; then the forward; then the sampled tokens read):

1. the token -> adapter mapping (sequence b uses adapter ``b % --adapters``) copied to the GPU, sorted,
   ``torch.unique`` (a device-to-host sync), cumsum: eager, outside any graph (as vLLM prepares it);
2. the forward with its LoRA deltas and the greedy argmax: eager, or ONE CUDA graph in graph mode;
3. the token read, ``.tolist()``.

Markers (unless ``--no-markers``): ``decode_step <i>`` only. The manifest states ``speculative: false``, the
rank, the adapters, the kernels, and the weight bytes a step reads: the base model plus the A and B matrices
of every adapter that some sequence of the batch uses (``lora.adapter_bytes_per_step``); also the unprofiled
step of the same model WITHOUT adapters (``lora.unprofiled_base_step_ms``, same mode) for comparison.

The loop (warm-up, unprofiled timing, profiler, facts) is ``capture/harness.py``'s; this file says what one step
does (``LoRADecode``; the step without adapters is its extra timing ``base``).
"""

from __future__ import annotations

import sys

import _common
import harness
import llama_torch as lt
import lora_ops


def linears(cfg) -> dict:
    """name -> (input width K, output slices) of each LoRA linear of a layer."""
    D = cfg.head_dim
    return {"qkv": (cfg.hidden, (cfg.heads * D, cfg.kv_heads * D, cfg.kv_heads * D)),
            "o": (cfg.heads * D, (cfg.hidden,)),
            "gate_up": (cfg.hidden, (cfg.ffn, cfg.ffn)),
            "down": (cfg.ffn, (cfg.hidden,))}


class Adapters:
    """Stacked LoRA weights per layer and linear: ``a [slices, adapters, rank, K]`` (vLLM ``lora_a_stacked``,
    one per slice there) and ``b [adapters, sum(slices), rank]`` (``lora_b_stacked``, slices side by side)."""

    def __init__(self, torch, cfg, n: int, rank: int, device, dtype, gen):
        self.n, self.rank = n, rank
        self.specs = linears(cfg)
        self.a, self.b, self.slice_start, self.slice_n = [], [], {}, {}
        for name, (_k, sl) in self.specs.items():
            starts = [sum(sl[:i]) for i in range(len(sl))]
            self.slice_start[name] = torch.tensor(starts, dtype=torch.long, device=device)
            self.slice_n[name] = torch.tensor(sl, dtype=torch.long, device=device)
        for _ in range(cfg.layers):
            la, lb = {}, {}
            for name, (K, sl) in self.specs.items():
                la[name] = lt._randn((len(sl), n, rank, K), device, dtype, gen, 0.02)
                lb[name] = lt._randn((n, sum(sl), rank), device, dtype, gen, 0.02)
            self.a.append(la)
            self.b.append(lb)

    def bytes_per_adapter(self) -> int:
        per = 0
        for la, lb in zip(self.a, self.b):
            for name in self.specs:
                per += (lt._nbytes(la[name]) + lt._nbytes(lb[name])) // self.n
        return int(per)


class LoRADecode(harness.Workload):
    """A decode loop with LoRA adapters on every projection, shaped like vLLM's punica path."""

    name = "lora"

    @classmethod
    def add_args(cls, p):
        p.add_argument("--size", choices=sorted(lt.SIZES), default="small")
        p.add_argument("--batch", type=int, default=4, help="sequences decoded together")
        p.add_argument("--adapters", type=int, default=2,
                       help="LoRA adapters loaded (vLLM max_loras); seq b uses b %% N")
        p.add_argument("--rank", type=int, default=16, help="LoRA rank r (<< hidden)")
        p.add_argument("--scaling", type=float, default=2.0, help="alpha / r")
        p.add_argument("--prompt-len", type=int, default=128, help="cached tokens each sequence starts from")
        p.add_argument("--dtype", choices=["bfloat16", "float16"], default="bfloat16")
        p.add_argument("--lora-impl", choices=["auto", "triton", "torch"], default="auto",
                       help="auto: the Triton kernels on a GPU, torch ops on a CPU")
        p.add_argument("--split-k", type=int, default=4, help="shrink kernel split-K")
        p.add_argument("--no-base-timing", action="store_true", help="skip timing the model without adapters")

    @classmethod
    def check_args(cls, p, args):
        if args.mode == "compile":
            p.error("--mode compile: the lora workload runs eager or graph")
        if args.adapters < 1 or args.rank < 1:
            p.error("--adapters and --rank must be >= 1")

    def build(self):
        import torch.nn.functional as F
        torch, dev, args, cuda = self.torch, self.dev, self.args, self.cuda
        impl = self.impl = args.lora_impl if args.lora_impl != "auto" else ("triton" if cuda else "torch")
        dtype = self.dtype = getattr(torch, args.dtype)
        cfg = self.cfg = lt.config(args.size)
        B, R, N = args.batch, args.rank, args.adapters
        self.B = B
        phase_len = max(args.timed_steps, args.steps) + args.warmup + 4
        window = self.window = lt.round_up(args.prompt_len + phase_len + 2, 64)
        _common.log(f"lora: {args.size} target ({cfg.layers} layers), batch {B}, {N} adapter(s) of rank {R} ({impl}), "
                    f"mode {args.mode}, markers {'on' if self.h.markers_requested else 'off'}")
        target = self.target = lt.Target(cfg, dev, dtype, seed=args.seed)
        gen = self.gen = torch.Generator(device=dev)
        gen.manual_seed(args.seed + 5)
        adapters = self.adapters = Adapters(torch, cfg, N, R, dev, dtype, gen)
        cache = lt.KVCache(cfg, cfg.layers, B, window, dev, dtype, gen)
        meta = self.meta = lora_ops.LoRAMeta(torch, N, B, dev)
        mapping = torch.tensor([b % N for b in range(B)], dtype=torch.long)
        self.mapping_cpu = mapping.pin_memory() if cuda else mapping
        self.active = sorted({b % N for b in range(B)})

        def lora_linear(i, name, x, w):
            """vLLM ``add_lora_linear``: base GEMM, float32 buffer, shrink, expand (add_inputs)."""
            y = F.linear(x, w)
            x2 = x.reshape(-1, x.shape[-1])
            y2 = y.view(-1, y.shape[-1])
            sl = adapters.specs[name][1]
            buf = torch.empty(len(sl), x2.shape[0], R, dtype=torch.float32, device=x.device)
            lora_ops.lora_shrink(x2, adapters.a[i][name], buf, meta, args.scaling, impl, split_k=args.split_k)
            lora_ops.lora_expand(buf, adapters.b[i][name], y2, meta, adapters.slice_start[name],
                                 adapters.slice_n[name], sl, impl)
            return y

        tok = self.tok = torch.zeros(B, 1, dtype=torch.long, device=dev)
        lens = self.lens = torch.zeros(B, dtype=torch.long, device=dev)

        def forward(with_lora: bool = True):
            pos = lens.view(B, 1)
            _, _, logits = target.forward(tok, pos, cache, pos, window, lengths=lens, logits_at="last",
                                          linear=lora_linear if with_lora else None)
            tok.copy_(logits.argmax(dim=-1).view(B, 1))
            lens.add_(1)

        self.reset()
        meta.prepare(self.mapping_cpu)
        self.core = forward
        self.base_core = lambda: forward(False)
        self.graphs = None
        if args.mode == "graph":
            pool = torch.cuda.graph_pool_handle()
            self.core = lt.graphed(forward, warm=3, pool=pool)
            if not args.no_base_timing:
                self.base_core = lt.graphed(self.base_core, warm=2, pool=pool)
            self.graphs = {"forward": 1, "per_step": 1,
                           "note": "the LoRA metadata is prepared eagerly before each replay"}
        else:
            forward()

    def reset(self):
        self.lens.fill_(self.args.prompt_len)
        self.tok.copy_(self.torch.randint(3, self.cfg.vocab, (self.B, 1), device=self.dev, generator=self.gen))

    def step(self, i):
        self.meta.prepare(self.mapping_cpu)       # LoRAKernelMeta.prepare_tensors (H2D, sort, unique: a sync)
        self.core()
        self.tok.view(-1).tolist()                # the sampled tokens to the host

    def base_step(self, i):
        self.base_core()
        self.tok.view(-1).tolist()

    def extra_timings(self):
        return {} if self.args.no_base_timing else {"base": self.base_step}

    def contract(self):
        adapter_step = self.adapters.bytes_per_adapter() * len(self.active)
        return {"weight_bytes": self.target.step_bytes()["bytes"] + adapter_step, "tokens_per_step": self.B}

    def facts(self, run):
        args, cfg, B, N, impl = self.args, self.cfg, self.B, self.args.adapters, self.impl
        tb = self.target.step_bytes()
        base_timing = run["extra"].get("base")
        per_adapter = self.adapters.bytes_per_adapter()
        adapter_step = per_adapter * len(self.active)
        per_layer_kernels = {"base_gemm": 4, "buffer_zero": 4, lora_ops.SHRINK_KERNEL: 4, lora_ops.EXPAND_KERNEL: 4}
        return {
            "speculative": False,
            "model": {"arch": "llama (plain torch, fused qkv/gate_up) + LoRA on qkv/o/gate_up/down",
                      "size": args.size, "params": tb["params"], "weight_bytes": tb["bytes"],
                      "embedding_bytes": tb["embedding_bytes"], "tied_embeddings": tb["tied"], "layers": cfg.layers,
                      "hidden": cfg.hidden, "ffn": cfg.ffn, "vocab": cfg.vocab, "prompt_len": args.prompt_len,
                      "batch": B},
            "lora": {
                "rank": args.rank, "adapters_loaded": N, "adapters_active": len(self.active),
                "scaling": args.scaling, "mapping": [b % N for b in range(B)], "impl": impl,
                "kernels": ([lora_ops.SHRINK_KERNEL, lora_ops.EXPAND_KERNEL] if impl == "triton"
                            else "torch einsum (no Triton on this device)"),
                "split_k": args.split_k if impl == "triton" else None,
                "linears": {k: {"in": v[0], "slices": list(v[1])} for k, v in linears(cfg).items()},
                "per_layer_launches": per_layer_kernels,
                "bytes_per_adapter": per_adapter, "adapter_bytes_per_step": int(adapter_step),
                "adapter_bytes_loaded": int(per_adapter * N), "base_weight_bytes_per_step": tb["bytes"],
                "weight_bytes_rule": "base model + A and B of every adapter some sequence of the batch uses",
                "unprofiled_base_step_ms": round(base_timing["median_ms"], 6) if base_timing else None,
                "unprofiled_base": base_timing,
                "metadata": "per step, eager: mapping H2D, torch.sort, torch.unique (sync), cumsum (vLLM "
                            "LoRAKernelMeta.prepare_tensors)",
                "source": "vllm lora/punica_wrapper/punica_gpu.py add_lora_linear; lora/ops/triton_ops/"
                          "lora_shrink_op.py, lora_expand_op.py, lora_kernel_metadata.py",
            },
            "kv": {"kv_bytes_per_token": cfg.kv_bytes_per_token(self.dtype.itemsize),
                   "attention_window_tokens": self.window},
            "graphs": self.graphs,
        }


def main(argv=None) -> int:
    return harness.run(LoRADecode, argv)


if __name__ == "__main__":
    sys.exit(main())
