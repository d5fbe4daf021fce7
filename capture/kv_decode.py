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
"""

from __future__ import annotations

import argparse
import contextlib
import sys

import _common
import llama_torch as lt
import markers


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    _common.add_common_args(p)
    p.add_argument("--size", choices=sorted(lt.SIZES), default="large")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--context", type=int, default=16384, help="cached tokens each sequence's attention reads")
    p.add_argument("--dtype", choices=["bfloat16", "float16"], default="bfloat16")
    p.add_argument("--no-probes", action="store_true")
    args = p.parse_args(argv)
    if args.mode == "compile":
        p.error("--mode compile: the kv workload runs eager or graph")
    _common.apply_marker_flag(args)
    return args


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


def main(argv=None) -> int:
    args = parse_args(argv)
    torch, dev, cuda = _common.torch_device(args)
    dtype = getattr(torch, args.dtype)
    cfg = lt.config(args.size)
    B, C = args.batch, args.context
    kvpt = cfg.kv_bytes_per_token(dtype.itemsize)
    _common.log(f"kv: {args.size} model, batch {B}, context {C}: {kvpt * C * B / 1e9:.2f} GB of KV read per step")
    target = lt.Target(cfg, dev, dtype, seed=args.seed)
    gen = torch.Generator(device=dev)
    gen.manual_seed(args.seed + 2)
    cache = lt.KVCache(cfg, cfg.layers, B, C, dev, dtype, gen)
    tb = target.step_bytes()

    # which SDPA backend reads this cache fastest (q = 1 token, GQA folded into rows, no mask)
    probes = {}
    chosen = None
    ctx_factory = contextlib.nullcontext
    if cuda and not args.no_probes:
        sdpa_kernel, backends = sdpa_backends(torch)
        for name, be in backends.items():
            try:
                with sdpa_kernel(be):
                    probes[name] = lt.attention_probe(target, cache, C, B)
            except Exception as e:  # a backend that cannot run this shape
                probes[name] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}
        ok = {k: v for k, v in probes.items() if "median_ms" in v}
        if ok:
            chosen = min(ok, key=lambda k: ok[k]["median_ms"])
            ctx_factory = lambda: sdpa_kernel(backends[chosen])  # noqa: E731
        _common.log("attention probe: " + ", ".join(
            f"{k} {v.get('achieved_gbps', v.get('error'))} GB/s" for k, v in probes.items()) + f"; using {chosen}")

    tok = torch.randint(3, cfg.vocab, (B, 1), device=dev, generator=gen)
    pos = torch.full((B, 1), C - 1, dtype=torch.long, device=dev)

    def forward():
        _, _, logits = target.forward(tok, pos, cache, pos, C, lengths=None, logits_at="last")
        tok.copy_(logits.argmax(dim=-1).view(B, 1))

    core = forward
    with ctx_factory():
        if args.mode == "graph":
            core = lt.graphed(forward)
        else:
            forward()

    def step(i):
        with ctx_factory():
            core()
        tok.view(-1).tolist()

    for i in range(args.warmup):
        step(-1 - i)
    _common.sync(dev)
    timing = _common.time_steps(step, args.timed_steps, dev, start_index=0)
    gemm = lt.gemm_probe(target, B) if cuda and not args.no_probes else None
    kv_step = kvpt * C * B
    _common.log(f"unprofiled step: median {timing['median_ms']:.3f} ms; weights {tb['bytes'] / 1e9:.2f} GB + KV "
                f"{kv_step / 1e9:.2f} GB -> {(tb['bytes'] + kv_step) / timing['median_ms'] / 1e6:.0f} GB/s")
    prof = _common.profiled_phase(step, args, start_index=args.timed_steps)
    facts = {
        **_common.contract_facts("kv", args, dev, weight_bytes=tb["bytes"], tokens_per_step=B, timing=timing),
        "batch": B,
        "context": C,
        "kv_bytes_per_token": kvpt,
        "kv_bytes_per_step": int(kv_step),
        "bytes_per_step": int(tb["bytes"] + kv_step),
        "model": {"arch": "llama (plain torch, fused qkv/gate_up)", "size": args.size, "params": tb["params"],
                  "weight_bytes": tb["bytes"], "embedding_bytes": tb["embedding_bytes"], "tied_embeddings": tb["tied"],
                  "layers": cfg.layers, "hidden": cfg.hidden, "heads": cfg.heads, "kv_heads": cfg.kv_heads,
                  "head_dim": cfg.head_dim, "ffn": cfg.ffn, "vocab": cfg.vocab},
        "kv": {"kv_bytes_per_token": kvpt, "context": C, "batch": B, "kv_bytes_per_step": int(kv_step),
               "cache_bytes_allocated": cache.nbytes(),
               "formula": "layers x 2 (K,V) x kv_heads x head_dim x 2 bytes x context x batch",
               "attention": "F.scaled_dot_product_attention, q = 1 token, GQA folded into rows, no mask, "
                            "over cache slots 0..context-1"},
        "attention_backend": chosen,
        "attention_probe": probes or None,
        "gemm_probe": gemm,
        "unprofiled": timing,
        "profiled": prof,
        "markers": {"step": "decode_step <i>"} if markers.enabled() else None,
        "nvtx_backend": markers.nvtx_backend_name() if markers.enabled() else None,
    }
    _common.write_facts(args, facts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
