"""KV-cache-heavy plain decode: a batch of long sequences, the attention reading a fixed context.

    python capture/kv_decode.py --size large --batch 8 --context 32768 --mode graph \
        --profiler nsys|torch|none --steps 16 --facts-out facts.json

Each step decodes one token per sequence; its attention reads EXACTLY ``--context`` cached tokens
per sequence and layer (the new token is written at slot ``context - 1`` and attends slots
``0 .. context-1``: an unmasked fixed-shape SDPA over the first ``context`` slots, graph-safe), so
the KV bytes a step reads are known exactly: layers x 2 x kv_heads x head_dim x 2 bytes x context x batch.
The cache holds random values (a context "prefilled" without a prefill). The step ends with the
sampled tokens read back (``.tolist()``).

Before capturing, the SDPA backends (flash, cuDNN, memory-efficient) are timed on this cache
(``attention_probe``) and the fastest one is used for the workload; the manifest records all.

Markers (unless ``--no-markers``): ``decode_step <i>`` only. The loop (warm-up, unprofiled timing, profiler, facts)
is ``capture/harness.py``'s; this file says what one step does (``KVDecode``).
"""

from __future__ import annotations

import contextlib
import sys

import _common
import harness
import llama_torch as lt


def sdpa_backends(torch):
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        return None, {}
    out = {}
    for name in ("FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION"):
        if hasattr(SDPBackend, name):
            out[name.lower()] = getattr(SDPBackend, name)
    return sdpa_kernel, out


class KVDecode(harness.Workload):
    """KV-cache-heavy plain decode: a batch of long sequences, the attention reading a fixed context."""

    name = "kv"

    @classmethod
    def add_args(cls, p):
        p.add_argument("--size", choices=sorted(lt.SIZES), default="large")
        p.add_argument("--batch", type=int, default=8)
        p.add_argument("--context", type=int, default=16384, help="cached tokens each sequence's attention reads")
        p.add_argument("--dtype", choices=["bfloat16", "float16"], default="bfloat16")
        p.add_argument("--no-probes", action="store_true")

    @classmethod
    def check_args(cls, p, args):
        if args.mode == "compile":
            p.error("--mode compile: the kv workload runs eager or graph")

    def build(self):
        torch, dev, args = self.torch, self.dev, self.args
        dtype = getattr(torch, args.dtype)
        cfg = self.cfg = lt.config(args.size)
        B, C = self.B, self.C = args.batch, args.context
        kvpt = self.kvpt = cfg.kv_bytes_per_token(dtype.itemsize)
        _common.log(f"kv: {args.size} model, batch {B}, context {C}: {kvpt * C * B / 1e9:.2f} GB of KV read per step")
        target = self.target = lt.Target(cfg, dev, dtype, seed=args.seed)
        gen = torch.Generator(device=dev)
        gen.manual_seed(args.seed + 2)
        cache = self.cache = lt.KVCache(cfg, cfg.layers, B, C, dev, dtype, gen)

        # which SDPA backend reads this cache fastest (q = 1 token, GQA folded into rows, no mask)
        probes = self.attention_probe = {}
        self.chosen = None
        self.ctx_factory = contextlib.nullcontext
        if self.cuda and not args.no_probes:
            sdpa_kernel, backends = sdpa_backends(torch)
            for name, be in backends.items():
                try:
                    with sdpa_kernel(be):
                        probes[name] = lt.attention_probe(target, cache, C, B)
                except Exception as e:  # a backend that cannot run this shape
                    probes[name] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}
            ok = {k: v for k, v in probes.items() if "median_ms" in v}
            if ok:
                chosen = self.chosen = min(ok, key=lambda k: ok[k]["median_ms"])
                self.ctx_factory = lambda: sdpa_kernel(backends[chosen])
            _common.log("attention probe: " + ", ".join(
                f"{k} {v.get('achieved_gbps', v.get('error'))} GB/s" for k, v in probes.items())
                + f"; using {self.chosen}")

        tok = self.tok = torch.randint(3, cfg.vocab, (B, 1), device=dev, generator=gen)
        pos = torch.full((B, 1), C - 1, dtype=torch.long, device=dev)

        def forward():
            _, _, logits = target.forward(tok, pos, cache, pos, C, lengths=None, logits_at="last")
            tok.copy_(logits.argmax(dim=-1).view(B, 1))

        self.core = forward
        with self.ctx_factory():
            if args.mode == "graph":
                self.core = lt.graphed(forward)
            else:
                forward()

    def reset(self):
        pass                    # every step reads the same fixed context: no state to go back to

    def step(self, i):
        with self.ctx_factory():
            self.core()
        self.tok.view(-1).tolist()

    def probes(self):
        return None if self.args.no_probes else lt.gemm_probe(self.target, self.B)

    def contract(self):
        return {"weight_bytes": self.target.step_bytes()["bytes"], "tokens_per_step": self.B}

    def facts(self, run):
        args, cfg, B, C, kvpt = self.args, self.cfg, self.B, self.C, self.kvpt
        tb = self.target.step_bytes()
        kv_step = kvpt * C * B
        _common.log(f"kv: weights {tb['bytes'] / 1e9:.2f} GB + KV {kv_step / 1e9:.2f} GB per step -> "
                    f"{(tb['bytes'] + kv_step) / run['timing']['median_ms'] / 1e6:.0f} GB/s at the unprofiled median")
        return {
            "batch": B,
            "context": C,
            "kv_bytes_per_token": kvpt,
            "kv_bytes_per_step": int(kv_step),
            "bytes_per_step": int(tb["bytes"] + kv_step),
            "model": {"arch": "llama (plain torch, fused qkv/gate_up)", "size": args.size, "params": tb["params"],
                      "weight_bytes": tb["bytes"], "embedding_bytes": tb["embedding_bytes"],
                      "tied_embeddings": tb["tied"], "layers": cfg.layers, "hidden": cfg.hidden, "heads": cfg.heads,
                      "kv_heads": cfg.kv_heads, "head_dim": cfg.head_dim, "ffn": cfg.ffn, "vocab": cfg.vocab},
            "kv": {"kv_bytes_per_token": kvpt, "context": C, "batch": B, "kv_bytes_per_step": int(kv_step),
                   "cache_bytes_allocated": self.cache.nbytes(),
                   "formula": "layers x 2 (K,V) x kv_heads x head_dim x 2 bytes x context x batch",
                   "attention": "F.scaled_dot_product_attention, q = 1 token, GQA folded into rows, no mask, "
                                "over cache slots 0..context-1"},
            "attention_backend": self.chosen,
            "attention_probe": self.attention_probe or None,
        }


def main(argv=None) -> int:
    return harness.run(KVDecode, argv)


if __name__ == "__main__":
    sys.exit(main())
