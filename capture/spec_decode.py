"""Speculative decoding shaped like SGLang's EAGLE/NEXTN worker (pure torch, random bf16 weights).

    python capture/spec_decode.py --size small|large --mode eager|graph --spec K [--batch B] \
        [--no-markers] --profiler nsys|torch|none --steps 16 --facts-out facts.json

A Llama-style target (``llama_torch.Target``) and a 1-layer MTP/NEXTN draft (``llama_torch.MTPDraft``)
that shares the target's embedding and lm_head, as ``EAGLEWorker.__init__`` shares them
(``set_embed_and_head``). One decode step, in order (SGLang ``EAGLEWorker.forward_batch_generation``:
``draft`` -> ``verify`` -> ``forward_draft_extend_after_decode``; then the scheduler's
``process_batch_result``):

(a) draft: K draft forwards (one token per sequence each) + softmax/top-k, ONE CUDA graph in graph mode
    (``EAGLEDraftCudaGraphRunner``);
(b) verify inputs: eager small kernels (``build_tree_kernel_efficient``: tokens, positions, tree mask,
    retrieve indices);
(c) verify: the target forward over K+1 tokens per sequence + argmax, a CUDA graph in graph mode
    (``CudaGraphRunner`` in TARGET_VERIFY mode);
(d) acceptance: eager greedy acceptance (``verify_tree_greedy``) with a host read of the accept lengths
    (``accept_length_per_req_cpu``, ``.tolist()``);
(e) draft extend: one draft forward over K+1 tokens per sequence (fixed shape, like
    ``EAGLEDraftExtendCudaGraphRunner``), a CUDA graph in graph mode;
then the token read of ``process_batch_result`` (``.tolist()``): two host reads per step.

(SGLang's draft graph holds ``speculative_num_steps - 1`` forwards because its draft-extend logits
give the first draft token; here the draft graph holds K forwards and the extend forward refreshes
the draft's KV cache of the accepted tokens: K + 1 draft forwards per step.)

Markers (unless ``--no-markers``): ``decode_step <i>`` per step, ``draft`` around (a), ``verify``
around (c), ``draft_extend`` around (e). With ``--no-markers`` there are no ranges at all.
``--engine-spans sglang``: no markers of ours, only the span SGLang's EAGLE v1 writes: ``step[TARGET_VERIFY
bs=N]`` (``record_function``) around the verify forward (c); the draft and draft-extend graph replays get none
(``ModelRunner.forward`` wraps each forward it runs; the draft runners replay their graphs without it).
``--accept-pattern 1,2,0,3``: the step's accepted drafts, in turn (from the first step after a reset), or
``--accept-prob P``: each draft token accepted with probability P until the first rejection; either replaces the
target's own greedy match (always a rejection with random weights): a known acceptance length for the server
validation (``capture/server_gpu.py``, which drives this loop through ``main(serve=...)``).

Facts for the manifest: weight bytes per step (target + draft per forward x K+1 forwards), accept
lengths, and the UNPROFILED step times (CUDA events, median): the spec step, the plain decode step (the
target alone, one token, same mode), the draft phase alone, and each phase's period.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

if __package__:
    from . import _common, markers  # type: ignore
    from . import llama_torch as lt
else:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import _common  # type: ignore
    import llama_torch as lt  # type: ignore
    import markers  # type: ignore

EXTEND_RANGE = "draft_extend"   # matches tracekit's default draft regex (?i)\bdraft
PHASES = ("draft", "build_verify_inputs", "verify", "accept", "draft_extend", "process_result")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    _common.add_common_args(p)
    p.add_argument("--size", choices=sorted(lt.SIZES), default="small")
    p.add_argument("--spec", type=int, default=3, help="K: draft tokens per step (SGLang speculative_num_steps)")
    p.add_argument("--batch", type=int, default=1, help="sequences decoded together")
    p.add_argument("--prompt-len", type=int, default=128, help="cached tokens each sequence starts from")
    p.add_argument("--dtype", choices=["bfloat16", "float16"], default="bfloat16")
    p.add_argument("--no-probes", action="store_true", help="skip the GEMM bandwidth probe")
    p.add_argument("--engine-spans", choices=["none", "sglang"], default="none",
                   help="sglang: only SGLang's step[TARGET_VERIFY bs=N] span around the verify (no markers of ours)")
    p.add_argument("--accept-prob", type=float, default=None,
                   help="accept each draft token with this probability until the first rejection")
    p.add_argument("--accept-pattern", default=None,
                   help="accepted drafts per step, cycled from each reset (e.g. 1,2,0,3: 2.5 tokens per step)")
    args = p.parse_args(argv)
    args.pattern = [min(int(x), args.spec) for x in args.accept_pattern.split(",")] if args.accept_pattern else None
    if args.engine_spans == "sglang":
        args.no_markers = True
    if args.mode == "compile":
        p.error("--mode compile: the spec workload runs eager or graph")
    if args.spec < 1:
        p.error("--spec K: K >= 1")
    _common.apply_marker_flag(args)
    return args


class State:
    """Every tensor a step reads or writes, at fixed addresses (graph replay needs static buffers)."""

    def __init__(self, torch, B, K, H, dev, prompt_len, vocab, gen, dtype):
        self.B, self.K, self.prompt_len, self.vocab = B, K, prompt_len, vocab
        L = torch.long
        self.verified = torch.zeros(B, dtype=L, device=dev)         # last accepted token (bonus), not yet cached
        self.hid = torch.zeros(B, H, dtype=dtype, device=dev)   # hidden state the next draft starts from
        self.len = torch.zeros(B, dtype=L, device=dev)              # committed (cached) tokens per sequence
        self.draft_tokens = torch.zeros(B, K, dtype=L, device=dev)
        self.vids = torch.zeros(B, K + 1, dtype=L, device=dev)      # verify input tokens
        self.vpos = torch.zeros(B, K + 1, dtype=L, device=dev)      # verify positions (= KV slots)
        self.tree_mask = torch.zeros(B, K + 1, K + 1, dtype=torch.bool, device=dev)
        self.retrive_index = torch.zeros(B, K + 1, dtype=L, device=dev)
        self.retrive_next = torch.zeros(B, K + 1, dtype=L, device=dev)
        self.tpred = torch.zeros(B, K + 1, dtype=L, device=dev)     # target's argmax after each verify token
        self.thid = torch.zeros(B, K + 1, H, dtype=dtype, device=dev)
        self.a_idx = torch.zeros(B, dtype=L, device=dev)            # accepted drafts per sequence
        self.ext_ids = torch.zeros(B, K + 1, dtype=L, device=dev)
        self.ext_pos = torch.zeros(B, K + 1, dtype=L, device=dev)
        self.ext_len = torch.zeros(B, dtype=L, device=dev)
        self.ext_top = torch.zeros(B, 1, dtype=L, device=dev)
        self.ar = torch.arange(K + 1, dtype=L, device=dev)
        self.gen = gen

    def reset(self, torch):
        self.len.fill_(self.prompt_len)
        self.verified.copy_(torch.randint(3, self.vocab, (self.B,), device=self.len.device, generator=self.gen))
        self.hid.normal_(0.0, 1.0, generator=self.gen)


def main(argv=None, serve=None) -> int:
    """Run the workload; ``serve(loop)``, when given, is called once the loop's own unprofiled step is measured
    (``loop``: the step, its reset, the accepted drafts, the timing) and its result returned instead of the
    profiled phase (``capture/server_gpu.py``)."""
    args = parse_args(argv)
    torch, dev, cuda = _common.torch_device(args)
    dtype = getattr(torch, args.dtype)
    cfg = lt.config(args.size)
    K, B, H = args.spec, args.batch, cfg.hidden
    phase_len = max(args.timed_steps, args.steps) + args.warmup + 2
    window = lt.round_up(args.prompt_len + (phase_len + 2) * (K + 1), 64)
    _common.log(f"spec: {args.size} target ({cfg.layers} layers, hidden {H}) + 1-layer MTP draft, K={K}, "
                f"batch {B}, mode {args.mode}, window {window}, markers {'on' if markers.enabled() else 'off'}")

    target = lt.Target(cfg, dev, dtype, seed=args.seed)
    draft = lt.MTPDraft(target, seed=args.seed + 1)
    gen = torch.Generator(device=dev)
    gen.manual_seed(args.seed + 2)
    tcache = lt.KVCache(cfg, cfg.layers, B, window, dev, dtype, gen)
    dcache = lt.KVCache(cfg, 1, B, window, dev, dtype, gen)
    S = State(torch, B, K, H, dev, args.prompt_len, cfg.vocab, gen, dtype)
    tb = target.step_bytes()
    db = draft.forward_bytes()
    draft_forwards = K + 1

    # ---- the phases ---------------------------------------------------------------------------
    def draft_phase():                       # (a): K draft forwards + top-k
        tok = S.verified.view(B, 1)
        h = S.hid.view(B, 1, H)
        for j in range(K):
            lens = S.len + j
            pos = lens.view(B, 1)
            h, logits = draft.forward(tok, h, pos, dcache, pos, window, lengths=lens, logits_at="last")
            probs = torch.softmax(logits.float(), dim=-1)
            _, idx = torch.topk(probs, 1, dim=-1)
            S.draft_tokens[:, j:j + 1].copy_(idx)
            tok = idx

    def build_verify_inputs():               # (b): eager bookkeeping kernels
        S.vids[:, :1].copy_(S.verified.view(B, 1))
        S.vids[:, 1:].copy_(S.draft_tokens)
        S.vpos.copy_(S.len.view(B, 1) + S.ar)
        S.tree_mask.copy_((S.ar.view(1, -1, 1) >= S.ar.view(1, 1, -1)).expand(B, -1, -1))
        S.retrive_index.copy_(torch.arange(B * (K + 1), device=dev).view(B, K + 1))
        S.retrive_next.copy_(torch.where(S.ar < K, S.ar + 1, -1).expand(B, -1))

    def verify_phase():                      # (c): target forward over K+1 tokens
        _, x, logits = target.forward(S.vids, S.vpos, tcache, S.vpos, window, lengths=S.len)
        S.tpred.copy_(logits.argmax(dim=-1))
        S.thid.copy_(x)

    def accept_phase():                      # (d): greedy acceptance + host read of the accept lengths
        match = (S.draft_tokens == S.tpred[:, :K]).to(torch.long)
        if args.pattern:                     # a known acceptance (--accept-pattern): this step's accepted drafts
            a = args.pattern[pattern_at[0] % len(args.pattern)]
            pattern_at[0] += 1
            match = (S.ar[:K] < a).to(torch.long).expand(B, K)
        elif args.accept_prob is not None:   # (--accept-prob): Bernoulli(P) per draft token
            match = (torch.rand(B, K, device=dev, generator=gen) < args.accept_prob).to(torch.long)
        acc = match.cumprod(dim=1).sum(dim=1)
        acc_cpu = acc.tolist()
        S.a_idx.copy_(acc)
        bonus = S.tpred.gather(1, acc.view(B, 1))
        S.ext_ids[:, :K].copy_(S.vids[:, 1:])
        S.ext_ids.scatter_(1, acc.view(B, 1), bonus)
        S.ext_pos.copy_(S.vpos)
        S.ext_len.copy_(S.len)
        S.verified.copy_(bonus.view(B))
        S.len.add_(acc + 1)
        return acc_cpu

    def extend_phase():                      # (e): one draft forward over K+1 tokens (fixed shape)
        h, logits = draft.forward(S.ext_ids, S.thid, S.ext_pos, dcache, S.ext_pos, window, lengths=S.ext_len)
        sel = S.a_idx.view(B, 1, 1)
        S.hid.copy_(h.gather(1, sel.expand(B, 1, H)).view(B, H))
        last = logits.gather(1, sel.expand(B, 1, logits.shape[-1])).view(B, -1)
        _, idx = torch.topk(torch.softmax(last.float(), dim=-1), 1, dim=-1)
        S.ext_top.copy_(idx)

    # plain decode: the target alone, one token per sequence, same mode (for the manifest's comparison)
    P_tok = torch.zeros(B, 1, dtype=torch.long, device=dev)
    P_len = torch.zeros(B, dtype=torch.long, device=dev)

    def plain_fwd():
        pos = P_len.view(B, 1)
        _, _, logits = target.forward(P_tok, pos, tcache, pos, window, lengths=P_len, logits_at="last")
        P_tok.copy_(logits.argmax(dim=-1).view(B, 1))
        P_len.add_(1)

    d_core, v_core, e_core, p_core = draft_phase, verify_phase, extend_phase, plain_fwd
    graphs = None
    S.reset(torch)
    P_len.fill_(args.prompt_len)
    if args.mode == "graph":
        pool = torch.cuda.graph_pool_handle()
        build_verify_inputs()
        d_core = lt.graphed(draft_phase, pool=pool)
        v_core = lt.graphed(verify_phase, pool=pool)
        S.a_idx.zero_()
        S.ext_ids.copy_(S.vids)
        S.ext_pos.copy_(S.vpos)
        S.ext_len.copy_(S.len)
        e_core = lt.graphed(extend_phase, pool=pool)
        p_core = lt.graphed(plain_fwd, pool=pool)
        graphs = {"draft": 1, "verify": 1, "draft_extend": 1, "per_step": 3}

    accepted: list[int] = []                 # accepted drafts per sequence per step (this phase)
    tokens_head: list = []
    pattern_at = [0]                         # --accept-pattern: the step within the pattern
    if args.engine_spans == "sglang":        # ModelRunner.forward's span (profile_utils.build_step_span_name)
        verify_span = lambda: torch.profiler.record_function(f"step[TARGET_VERIFY bs={B}]")  # noqa: E731
    else:
        import contextlib

        verify_span = contextlib.nullcontext

    def spec_step(i, ev=None):
        rec = (lambda k: ev[k].record()) if ev is not None else (lambda k: None)
        rec(0)
        with markers.draft():
            d_core()
        rec(1)
        build_verify_inputs()
        rec(2)
        with markers.verify(), verify_span():
            v_core()
        rec(3)
        acc = accept_phase()
        rec(4)
        with markers.range_(EXTEND_RANGE):
            e_core()
        rec(5)
        toks = S.verified.tolist()           # process_batch_result: the committed tokens to the host
        accepted.extend(acc)
        if len(tokens_head) < 8:
            tokens_head.append(toks)

    def plain_step(i):
        p_core()
        P_tok.view(-1).tolist()

    def draft_only(i):
        d_core()

    def extend_only(i):
        e_core()

    # ---- unprofiled timing ---------------------------------------------------------------------------
    def reset():
        S.reset(torch)
        P_len.fill_(args.prompt_len)
        accepted.clear()
        tokens_head.clear()
        pattern_at[0] = 0

    reset()
    for i in range(args.warmup):
        spec_step(-1 - i)
        plain_step(-1 - i)
    _common.sync(dev)
    reset()
    timing = _common.time_steps(spec_step, args.timed_steps, dev, start_index=0)
    acc_timed = list(accepted)
    head = [list(t) for t in tokens_head]
    reset()
    plain = _common.time_steps(plain_step, args.timed_steps, dev)
    reset()
    draft_t = _common.time_steps(draft_only, args.timed_steps, dev)
    reset()
    ext_t = _common.time_steps(extend_only, args.timed_steps, dev)
    phases = None
    if cuda:  # per-phase periods on the GPU timeline: events between the phases of 40 more spec steps
        reset()
        per = {k: [] for k in PHASES}
        evs = []
        for i in range(args.timed_steps):
            ev = [torch.cuda.Event(enable_timing=True) for _ in range(6)]
            spec_step(i, ev)
            evs.append(ev)
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        torch.cuda.synchronize()
        for n, ev in enumerate(evs):
            nxt = evs[n + 1][0] if n + 1 < len(evs) else end
            for k in range(5):
                per[PHASES[k]].append(ev[k].elapsed_time(ev[k + 1]))
            per["process_result"].append(ev[5].elapsed_time(nxt))
        phases = {k: round(statistics.median(v), 6) for k, v in per.items()}
    probes = None
    if cuda and not args.no_probes:
        probes = {"m1": lt.gemm_probe(target, B), "m_verify": lt.gemm_probe(target, B * (K + 1))}
    accept_len = 1 + statistics.fmean(acc_timed) if acc_timed else None
    _common.log(f"unprofiled: spec step {timing['median_ms']:.3f} ms, plain step {plain['median_ms']:.3f} ms, "
                f"draft alone {draft_t['median_ms']:.3f} ms, extend alone {ext_t['median_ms']:.3f} ms; "
                f"accept_len {accept_len}")
    if phases:
        _common.log("phases (median ms): " + ", ".join(f"{k} {v:.3f}" for k, v in phases.items()))
    if probes:
        _common.log("GEMM probe: " + ", ".join(f"{k} {v['achieved_gbps']} GB/s ({v['median_ms']:.3f} ms)"
                                                for k, v in probes.items()))

    if serve is not None:
        import types

        return serve(types.SimpleNamespace(
            torch=torch, device=dev, cuda=cuda, args=args, B=B, K=K, spec_step=spec_step, reset=reset,
            accepted=accepted, timing=timing, accept_len=accept_len, window=window, prompt_len=args.prompt_len,
            weight_bytes_per_step=tb["bytes"] + db["bytes"] * draft_forwards,
            time_steps=lambda n: _common.time_steps(spec_step, n, dev)))

    # ---- the profiled steps ----------------------------------------------------------------------------
    reset()
    prof = _common.profiled_phase(spec_step, args, start_index=args.timed_steps)
    acc_prof = list(accepted)
    per_step_prof = [acc_prof[s * B:(s + 1) * B] for s in range(args.steps)]

    weight_bytes_per_step = tb["bytes"] + db["bytes"] * draft_forwards
    kvpt = cfg.kv_bytes_per_token(dtype.itemsize)
    facts = {
        **_common.contract_facts(
            "spec", args, dev, weight_bytes=weight_bytes_per_step, tokens_per_step=B, timing=timing,
            spec={"draft_tokens": K, "accept_len": round(accept_len, 4) if accept_len is not None else None}),
        "model": {"arch": "llama (plain torch, fused qkv/gate_up)", "size": args.size, "params": tb["params"],
                  "weight_bytes": tb["bytes"], "layers_bytes": tb["layers_bytes"], "lm_head_bytes": tb["lm_head_bytes"],
                  "embedding_bytes": tb["embedding_bytes"], "tied_embeddings": tb["tied"], "layers": cfg.layers,
                  "hidden": H, "heads": cfg.heads, "kv_heads": cfg.kv_heads, "head_dim": cfg.head_dim,
                  "ffn": cfg.ffn, "vocab": cfg.vocab, "prompt_len": args.prompt_len, "batch": B},
        "draft_model": {"kind": "mtp-nextn (1 decoder layer + eh_proj, target's embedding and lm_head shared)",
                        "params": db["own_params"], "weight_bytes": db["bytes"], "own_weight_bytes": db["own_bytes"],
                        "shared_lm_head_bytes": db["shared_lm_head_bytes"], "forwards_per_step": draft_forwards,
                        "forwards": {"draft": K, "draft_extend": 1}, "extend_tokens_per_sequence": K + 1},
        "target_bytes_per_step": tb["bytes"],
        "draft_bytes_per_step": int(db["bytes"] * draft_forwards),
        "kv": {"kv_bytes_per_token": kvpt, "attention_window_tokens": window,
               "note": "attention reads the whole fixed window (masked to each sequence's length)",
               "target_kv_bytes_per_forward": int(kvpt * window * B)},
        "unprofiled": timing,
        "unprofiled_plain_step_ms": round(plain["median_ms"], 6),
        "unprofiled_plain": plain,
        "unprofiled_draft_ms": round(draft_t["median_ms"], 6),
        "unprofiled_draft_extend_ms": round(ext_t["median_ms"], 6),
        "unprofiled_draft_phase_ms": round(draft_t["median_ms"] + ext_t["median_ms"], 6),
        "unprofiled_phases_ms": phases,
        "accept": {"accept_len_timed": round(accept_len, 4) if accept_len is not None else None,
                   "accepted_drafts_timed_hist": {str(a): acc_timed.count(a) for a in range(K + 1)},
                   "accepted_drafts_profiled": per_step_prof,
                   "accept_len_profiled": round(1 + statistics.fmean(acc_prof), 4) if acc_prof else None},
        "phases": list(PHASES),
        "graphs": graphs,
        "host_reads_per_step": 2,
        "markers": ({"step": "decode_step <i>", "draft": markers.DRAFT, "verify": markers.VERIFY,
                     "draft_extend": EXTEND_RANGE} if markers.enabled() else None),
        "gemm_probe": probes,
        "profiled": prof,
        "nvtx_backend": markers.nvtx_backend_name() if markers.enabled() else None,
        "tokens_head": head,
    }
    _common.write_facts(args, facts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
