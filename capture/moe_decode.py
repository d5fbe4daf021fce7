"""A mixture-of-experts decode loop (pure torch, random weights; Triton for ``--experts triton``). No
speculative decoding.

    python capture/moe_decode.py --size small --mode eager|graph [--batch 8] [--experts auto|grouped_mm|triton|loop] \
        [--no-markers] --profiler nsys|torch|none --steps 16 --facts-out facts.json

The model is ``llama_torch.Target`` with ``MOE_SIZES`` (attention as the dense workloads; every layer's MLP
replaced by a router and routed experts, vLLM's ``FusedMoE`` weight layout ``w13 [E, 2F, H]``,
``w2 [E, H, F]``; no shared expert). Each layer: router GEMM, softmax, top-k, renormalise (``fused_topk``),
then the experts (``capture/moe_ops.py``): ``grouped_mm`` (transformers' ``grouped_mm_experts_forward``:
permute by expert, ``histc`` offsets, two ``torch._grouped_mm``, unpermute, ``index_add_``), ``triton`` (vLLM's
``fused_experts``: ``moe_align_block_size``, ``fused_moe_kernel`` x2, SiLU-and-mul, ``moe_sum``) or ``loop``
(transformers' eager per-expert loop; a host sync per layer; eager only). ``auto``: ``grouped_mm`` where
``torch._grouped_mm`` exists and (on a GPU) the device is SM90 or newer, else ``triton`` on a GPU, ``loop`` on a
CPU; the choice is checked once against ``loop`` on real inputs before anything is timed, and a failing one
falls through to the next (the manifest says which ran and why).

One step: the forward and the greedy argmax (eager, or ONE CUDA graph in graph mode), then the token read
(``.tolist()``). Markers (unless ``--no-markers``): ``decode_step <i>`` only.

Manifest: ``speculative: false``; ``weight_bytes_per_step`` = every non-expert weight read once (attention,
norms, routers, lm_head) + the routed experts x E(distinct experts) / E, with E(distinct) = E(1 - (1 - k/E)^B)
for B tokens (uniform routing; ``tracekit/model/step.py`` ``expected_experts``, the same definition);
``moe.measured_distinct_experts`` is the mean over layers and steps of the experts the random router really
picked (measured after profiling, eagerly, over ``--timed-steps`` steps).

The loop (warm-up, unprofiled timing, profiler, facts) is ``capture/harness.py``'s; this file says what one step
does (``MoEDecode``).
"""

from __future__ import annotations

import statistics
import sys

import _common
import harness
import llama_torch as lt
import moe_ops


def candidates(torch, requested: str, cuda: bool, graph: bool) -> list[str]:
    if requested != "auto":
        return [requested]
    has_gmm = hasattr(torch, "_grouped_mm")
    if cuda:
        sm90 = torch.cuda.get_device_capability() >= (9, 0)
        order = (["grouped_mm"] if has_gmm and sm90 else []) + ["triton"] + ([] if graph else ["loop"])
    else:
        order = (["grouped_mm"] if has_gmm else []) + ["loop"]
    return order


def pick(torch, order, layer, h2, top_k) -> tuple[str, dict]:
    """The first implementation in ``order`` that runs and matches ``loop`` on ``h2`` (one layer's input)."""
    w, ids = moe_ops.route(torch, h2, layer.router, top_k)
    ref = moe_ops.experts_loop(torch, h2, layer.w13, layer.w2, w, ids).float()
    tried = {}
    for name in order:
        try:
            out = moe_ops.EXPERTS[name](torch, h2, layer.w13, layer.w2, w, ids).float()
            _common.sync(h2.device)
            err = float((out - ref).abs().max()) / max(float(ref.abs().max()), 1e-6)
            if err > 5e-2:
                raise RuntimeError(f"differs from the loop reference (max relative error {err:.3g})")
            tried[name] = "ok"
            return name, tried
        except Exception as e:   # noqa: BLE001 - any failure moves on to the next implementation
            tried[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
            _common.log(f"--experts {name} unusable here: {tried[name]}")
    raise SystemExit(f"no routed-experts implementation works here: {tried}")


class MoEDecode(harness.Workload):
    """A mixture-of-experts decode loop (pure torch, random weights; Triton for ``--experts triton``)."""

    name = "moe"

    @classmethod
    def add_args(cls, p):
        p.add_argument("--size", choices=sorted(lt.MOE_SIZES), default="small")
        p.add_argument("--batch", type=int, default=8, help="sequences decoded together (tokens routed per layer)")
        p.add_argument("--experts", choices=["auto", *moe_ops.IMPLS], default="auto",
                       help="routed-experts implementation")
        p.add_argument("--prompt-len", type=int, default=128, help="cached tokens each sequence starts from")
        p.add_argument("--dtype", choices=["bfloat16", "float16"], default="bfloat16")

    @classmethod
    def check_args(cls, p, args):
        if args.mode == "compile":
            p.error("--mode compile: the moe workload runs eager or graph")
        if args.mode == "graph" and args.experts == "loop":
            p.error("--experts loop syncs with the host in every layer: eager only")

    def build(self):
        torch, dev, args = self.torch, self.dev, self.args
        dtype = self.dtype = getattr(torch, args.dtype)
        cfg = self.cfg = lt.moe_config(args.size)
        B, E, K = self.B, self.E, self.K = args.batch, cfg.experts, cfg.top_k
        phase_len = max(args.timed_steps, args.steps) + args.warmup + 8
        window = self.window = lt.round_up(args.prompt_len + 2 * phase_len + 8, 64)
        target = self.target = lt.Target(cfg, dev, dtype, seed=args.seed)
        gen = self.gen = torch.Generator(device=dev)
        gen.manual_seed(args.seed + 2)
        cache = lt.KVCache(cfg, cfg.layers, B, window, dev, dtype, gen)
        tb = target.step_bytes()
        self.experts_all = experts_all = sum(l.expert_nbytes() for l in target.layers)
        self.e_expected = e_expected = moe_ops.expected_experts(E, K, B)
        self.weight_bytes = weight_bytes = tb["bytes"] - experts_all + experts_all * e_expected / E

        probe_in = torch.randn(B, cfg.hidden, device=dev, dtype=dtype, generator=gen)
        impl, self.tried = pick(torch, candidates(torch, args.experts, self.cuda, args.mode == "graph"),
                                target.layers[0], probe_in, K)
        self.impl = impl
        experts_fn = moe_ops.EXPERTS[impl]
        _common.log(f"moe: {args.size} ({cfg.layers} layers, {E} experts top-{K}, hidden {cfg.hidden}, expert ffn "
                    f"{cfg.ffn}), batch {B}, experts via {impl}, mode {args.mode}; expected distinct experts "
                    f"{e_expected:.2f}/{E} -> {weight_bytes / 1e9:.3f} GB read per step of {tb['bytes'] / 1e9:.3f} GB")

        self.record = None              # a list while the routing is measured (facts), else None

        def moe_mlp(i, h):
            layer = target.layers[i]
            Bq, Q, H = h.shape
            h2 = h.reshape(-1, H)
            w, ids = moe_ops.route(torch, h2, layer.router, K)
            if self.record is not None:
                self.record.append(len(set(ids.view(-1).tolist())))
            return experts_fn(torch, h2, layer.w13, layer.w2, w, ids).view(Bq, Q, H)

        tok = self.tok = torch.zeros(B, 1, dtype=torch.long, device=dev)
        lens = self.lens = torch.zeros(B, dtype=torch.long, device=dev)

        def forward():
            pos = lens.view(B, 1)
            _, _, logits = target.forward(tok, pos, cache, pos, window, lengths=lens, logits_at="last", mlp=moe_mlp)
            tok.copy_(logits.argmax(dim=-1).view(B, 1))
            lens.add_(1)

        self.reset()
        self.forward = self.core = forward
        self.graphs = None
        if args.mode == "graph":
            self.core = lt.graphed(forward, warm=3)
            self.graphs = {"forward": 1, "per_step": 1}
        else:
            forward()

    def reset(self):
        self.lens.fill_(self.args.prompt_len)
        self.tok.copy_(self.torch.randint(3, self.cfg.vocab, (self.B, 1), device=self.dev, generator=self.gen))

    def step(self, i):
        self.core()
        self.tok.view(-1).tolist()

    def contract(self):
        return {"weight_bytes": int(round(self.weight_bytes)), "tokens_per_step": self.B}

    def measure_routing(self) -> float | None:
        """The routing the random router really does: eagerly, after profiling (not in any timed or traced step)."""
        self.record = []
        self.reset()
        for _ in range(max(self.args.timed_steps, 1)):
            self.forward()
        measured = statistics.fmean(self.record) if self.record else None
        self.record = None
        return measured

    def facts(self, run):
        args, cfg, B, E, K = self.args, self.cfg, self.B, self.E, self.K
        tb, experts_all, e_expected, impl = self.target.step_bytes(), self.experts_all, self.e_expected, self.impl
        measured = self.measure_routing()
        per_expert = experts_all / (E * cfg.layers)
        return {
            "speculative": False,
            "model": {"arch": "llama attention + routed experts (plain torch, vLLM FusedMoE layout)",
                      "size": args.size, "params": tb["params"], "weight_bytes_stored": tb["bytes"],
                      "embedding_bytes": tb["embedding_bytes"], "tied_embeddings": tb["tied"], "layers": cfg.layers,
                      "hidden": cfg.hidden, "heads": cfg.heads, "kv_heads": cfg.kv_heads, "vocab": cfg.vocab,
                      "prompt_len": args.prompt_len, "batch": B},
            "moe": {
                "experts": E, "top_k": K, "moe_ffn": cfg.ffn, "shared_experts": 0,
                "router": "softmax, top-k, renormalised",
                "impl": impl, "impl_requested": args.experts, "impl_checks": self.tried,
                "kernels": {"grouped_mm": "torch._grouped_mm (x2 per layer)",
                            "triton": moe_ops.FUSED_MOE_KERNEL + " (x2 per layer)",
                            "loop": "F.linear per hit expert"}[impl],
                "tokens_routed_per_layer": B,
                "expected_distinct_experts": round(e_expected, 6),
                "expected_rule": "E * (1 - (1 - k/E)^tokens), uniform routing (tracekit.model.step.expected_experts)",
                "measured_distinct_experts": round(measured, 6) if measured is not None else None,
                "measured_over": f"{len(self.target.layers)} layers x {max(args.timed_steps, 1)} eager steps after "
                                 "profiling",
                "expert_bytes_stored": int(experts_all), "bytes_per_expert_per_layer": int(per_expert),
                "expert_bytes_per_step": int(round(experts_all * e_expected / E)),
                "non_expert_bytes_per_step": int(tb["bytes"] - experts_all),
                "weight_bytes_per_step_measured_routing": (
                    int(round(tb["bytes"] - experts_all + experts_all * measured / E)) if measured is not None
                    else None),
                "source": "transformers integrations/moe.py grouped_mm_experts_forward; vllm fused_moe/fused_moe.py "
                          "fused_experts, moe_align_block_size, fused_moe_kernel",
            },
            "kv": {"kv_bytes_per_token": cfg.kv_bytes_per_token(self.dtype.itemsize),
                   "attention_window_tokens": self.window},
            "graphs": self.graphs,
        }


def main(argv=None) -> int:
    return harness.run(MoEDecode, argv)


if __name__ == "__main__":
    sys.exit(main())
