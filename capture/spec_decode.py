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
around (c), ``draft_extend`` around (e). With ``--no-markers`` there are no ranges at all. ``--engine-spans``
adds the spans an SGLang version writes (``sglang``/``sglang-v1``: ``step[TARGET_VERIFY bs=N]`` around (c)
only; ``sglang-v2``: ``step[DRAFT bs=N]``, ``step[VERIFY bs=N]``, ``step[DRAFT_EXTEND_V2 bs=N]``).

A known acceptance (the server validation, ``capture/server_gpu.py``, which drives this loop through
``main(serve=...)``: ``harness.run``'s serve hook): ``--accept-pattern 1,2,0,3``: the step's accepted drafts, in turn,
from the first step after each reset (a value above K counts as K), or ``--accept-prob P``: each draft token
accepted with probability P until the first rejection. Either replaces the target's own greedy match (always a
rejection with random weights); the kernels and the host read of (d) stay as they are. The manifest's
``accept_override`` says which (null: the greedy match).

The loop (warm-up, unprofiled timing, markers, profiler, facts) is ``capture/harness.py``'s; this file says
what one step does (``SpecDecode``). The unprofiled times are measured with markers off.

Facts for the manifest: weight bytes per step (target + draft per forward x K+1 forwards), accept
lengths, and the UNPROFILED step times (CUDA events, median): the spec step, the plain decode step (the
target alone, one token, same mode), the draft phase alone, and each phase's period.
"""

from __future__ import annotations

import sys

import _common
import harness
import llama_torch as lt

EXTEND_RANGE = "draft_extend"   # matches tracekit's default draft regex (?i)\bdraft
PHASES = ("draft", "build_verify_inputs", "verify", "accept", "draft_extend", "process_result")
# the spans SGLang writes (sgl-project/sglang utils/profile_utils.py : build_step_span_name): EAGLE v1 only
# around the target's verify forward (its draft and draft-extend graph replays bypass ModelRunner.forward)
SGLANG_V1 = {"verify": "step[TARGET_VERIFY bs={B}]"}
SGLANG_V2 = {"draft": "step[DRAFT bs={B}]", "verify": "step[VERIFY bs={B}]",
             "draft_extend": "step[DRAFT_EXTEND_V2 bs={B}]"}


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


class SpecDecode(harness.Workload):
    """Speculative decoding shaped like SGLang's EAGLE/NEXTN worker (pure torch, random bf16 weights)."""

    name = "spec"
    PHASES = PHASES
    MARKERS = {"draft": "draft", "verify": "verify", "draft_extend": EXTEND_RANGE}
    SPANS = {"sglang": SGLANG_V1, "sglang-v1": SGLANG_V1, "sglang-v2": SGLANG_V2}

    @classmethod
    def add_args(cls, p):
        p.add_argument("--size", choices=sorted(lt.SIZES), default="small")
        p.add_argument("--spec", type=int, default=3, help="K: draft tokens per step (SGLang speculative_num_steps)")
        p.add_argument("--batch", type=int, default=1, help="sequences decoded together")
        p.add_argument("--prompt-len", type=int, default=128, help="cached tokens each sequence starts from")
        p.add_argument("--dtype", choices=["bfloat16", "float16"], default="bfloat16")
        p.add_argument("--no-probes", action="store_true", help="skip the GEMM bandwidth probe")
        p.add_argument("--accept-pattern", default=None,
                       help="accepted drafts per step, in turn from each reset (e.g. 1,2,0,3: 2.5 tokens per step)")
        p.add_argument("--accept-prob", type=float, default=None,
                       help="accept each draft token with this probability until the first rejection")

    @classmethod
    def check_args(cls, p, args):
        if args.mode == "compile":
            p.error("--mode compile: the spec workload runs eager or graph")
        if args.spec < 1:
            p.error("--spec K: K >= 1")
        args.pattern = None
        if args.accept_pattern is not None and args.accept_prob is not None:
            p.error("--accept-pattern and --accept-prob: give one")
        if args.accept_pattern is not None:
            try:
                pattern = [int(x) for x in args.accept_pattern.split(",")]
            except ValueError:
                pattern = []
            if not pattern or min(pattern) < 0:
                p.error("--accept-pattern: accepted drafts per step, integers >= 0 separated by commas (1,2,0,3)")
            args.pattern = [min(a, args.spec) for a in pattern]
        if args.accept_prob is not None and not 0.0 <= args.accept_prob <= 1.0:
            p.error("--accept-prob P: 0 <= P <= 1")

    def span_fields(self):
        return {"B": self.B}

    def build(self):
        torch, dev, args = self.torch, self.dev, self.args
        dtype = self.dtype = getattr(torch, args.dtype)
        cfg = self.cfg = lt.config(args.size)
        K, B, H = args.spec, args.batch, cfg.hidden
        self.K, self.B = K, B
        phase_len = max(args.timed_steps, args.steps) + args.warmup + 2
        window = self.window = lt.round_up(args.prompt_len + (phase_len + 2) * (K + 1), 64)
        _common.log(f"spec: {args.size} target ({cfg.layers} layers, hidden {H}) + 1-layer MTP draft, "
                    f"K={K}, batch {B}, mode {args.mode}, window {window}")
        target = self.target = lt.Target(cfg, dev, dtype, seed=args.seed)
        draft = self.draft = lt.MTPDraft(target, seed=args.seed + 1)
        gen = torch.Generator(device=dev)
        gen.manual_seed(args.seed + 2)
        tcache = lt.KVCache(cfg, cfg.layers, B, window, dev, dtype, gen)
        dcache = lt.KVCache(cfg, 1, B, window, dev, dtype, gen)
        S = self.S = State(torch, B, K, H, dev, args.prompt_len, cfg.vocab, gen, dtype)
        self.head = []

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

        pattern, prob = args.pattern, args.accept_prob
        self.pattern_at = 0                      # --accept-pattern: the step within the pattern (from each reset)

        def accept_phase():                      # (d): greedy acceptance + host read of the accept lengths
            match = (S.draft_tokens == S.tpred[:, :K]).to(torch.long)
            if pattern:                          # a known acceptance: this step's accepted drafts
                a = pattern[self.pattern_at % len(pattern)]
                self.pattern_at += 1
                match = (S.ar[:K] < a).to(torch.long).expand(B, K)
            elif prob is not None:               # Bernoulli(P) per draft token
                match = (torch.rand(B, K, device=dev, generator=gen) < prob).to(torch.long)
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
        P_tok = self.P_tok = torch.zeros(B, 1, dtype=torch.long, device=dev)
        P_len = self.P_len = torch.zeros(B, dtype=torch.long, device=dev)

        def plain_fwd():
            pos = P_len.view(B, 1)
            _, _, logits = target.forward(P_tok, pos, tcache, pos, window, lengths=P_len, logits_at="last")
            P_tok.copy_(logits.argmax(dim=-1).view(B, 1))
            P_len.add_(1)

        self.build_verify_inputs, self.accept_phase = build_verify_inputs, accept_phase
        self.d_core, self.v_core, self.e_core, self.p_core = draft_phase, verify_phase, extend_phase, plain_fwd
        self.graphs = None
        self.reset()
        if args.mode == "graph":
            pool = torch.cuda.graph_pool_handle()
            build_verify_inputs()
            self.d_core = lt.graphed(draft_phase, pool=pool)
            self.v_core = lt.graphed(verify_phase, pool=pool)
            S.a_idx.zero_()
            S.ext_ids.copy_(S.vids)
            S.ext_pos.copy_(S.vpos)
            S.ext_len.copy_(S.len)
            self.e_core = lt.graphed(extend_phase, pool=pool)
            self.p_core = lt.graphed(plain_fwd, pool=pool)
            self.graphs = {"draft": 1, "verify": 1, "draft_extend": 1, "per_step": 3}

    def reset(self):
        self.S.reset(self.torch)
        self.P_len.fill_(self.args.prompt_len)
        self.pattern_at = 0

    def step(self, i):
        h = self.h
        with h.phase("draft"), h.span("draft"):
            self.d_core()
        with h.phase("build_verify_inputs"):
            self.build_verify_inputs()
        with h.phase("verify"), h.span("verify"):
            self.v_core()
        with h.phase("accept"):
            acc = self.accept_phase()
        with h.phase("draft_extend"), h.span("draft_extend"):
            self.e_core()
        with h.phase("process_result"):
            toks = self.S.verified.tolist()      # process_batch_result: the committed tokens to the host
        h.record_accept(acc)
        if h.stage == "timed" and len(self.head) < 8:
            self.head.append(toks)

    def plain_step(self, i):
        self.p_core()
        self.P_tok.view(-1).tolist()

    def extra_timings(self):
        return {"draft": lambda i: self.d_core(), "draft_extend": lambda i: self.e_core()}

    def probes(self):
        if self.args.no_probes:
            return None
        return {"m1": lt.gemm_probe(self.target, self.B),
                "m_verify": lt.gemm_probe(self.target, self.B * (self.K + 1))}

    def contract(self):
        tb, db = self.target.step_bytes(), self.draft.forward_bytes()
        return {"weight_bytes": tb["bytes"] + db["bytes"] * (self.K + 1), "tokens_per_step": self.B,
                "draft_tokens": self.K, "dtype": self.args.dtype}

    def facts(self, run):
        args, cfg, K, B, H = self.args, self.cfg, self.K, self.B, self.cfg.hidden
        tb, db = self.target.step_bytes(), self.draft.forward_bytes()
        kvpt = cfg.kv_bytes_per_token(self.dtype.itemsize)
        draft_t, ext_t = run["extra"]["draft"]["median_ms"], run["extra"]["draft_extend"]["median_ms"]
        return {
            "model": {"arch": "llama (plain torch, fused qkv/gate_up)", "size": args.size, "params": tb["params"],
                      "weight_bytes": tb["bytes"], "layers_bytes": tb["layers_bytes"],
                      "lm_head_bytes": tb["lm_head_bytes"], "embedding_bytes": tb["embedding_bytes"],
                      "tied_embeddings": tb["tied"], "layers": cfg.layers, "hidden": H, "heads": cfg.heads,
                      "kv_heads": cfg.kv_heads, "head_dim": cfg.head_dim, "ffn": cfg.ffn, "vocab": cfg.vocab,
                      "prompt_len": args.prompt_len, "batch": B},
            "draft_model": {"kind": "mtp-nextn (1 decoder layer + eh_proj, target's embedding and lm_head shared)",
                            "params": db["own_params"], "weight_bytes": db["bytes"],
                            "own_weight_bytes": db["own_bytes"], "shared_lm_head_bytes": db["shared_lm_head_bytes"],
                            "forwards_per_step": K + 1, "forwards": {"draft": K, "draft_extend": 1},
                            "extend_tokens_per_sequence": K + 1},
            "target_bytes_per_step": tb["bytes"],
            "draft_bytes_per_step": int(db["bytes"] * (K + 1)),
            "kv": {"kv_bytes_per_token": kvpt, "attention_window_tokens": self.window,
                   "note": "attention reads the whole fixed window (masked to each sequence's length)",
                   "target_kv_bytes_per_forward": int(kvpt * self.window * B)},
            "unprofiled_draft_ms": round(draft_t, 6),
            "unprofiled_draft_extend_ms": round(ext_t, 6),
            "unprofiled_draft_phase_ms": round(draft_t + ext_t, 6),
            "graphs": self.graphs,
            "host_reads_per_step": 2,
            "accept_override": ({"pattern": args.pattern} if args.pattern
                                else {"prob": args.accept_prob} if args.accept_prob is not None else None),
            "tokens_head": [list(t) for t in self.head],
        }


def main(argv=None, serve=None) -> int:
    """Run the workload; ``serve(loop)``, when given, gets the :class:`harness.Loop` once its unprofiled spec step
    is measured and its result is returned instead of the profiled phase (``capture/server_gpu.py``)."""
    return harness.run(SpecDecode, argv, serve=serve)


if __name__ == "__main__":
    sys.exit(main())
