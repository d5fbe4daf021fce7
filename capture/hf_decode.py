"""HF transformers decode loop with RANDOM weights (no downloads), batch 1, static KV cache.

    python capture/hf_decode.py --size small --mode eager|graph|compile [--spec K] \
        --profiler nsys|torch|none --steps 16 --facts-out facts.json

* The model is a Llama-architecture ``LlamaForCausalLM`` (``--arch qwen2`` for Qwen2) built
  from a config preset; weights are random (the kernels and bytes are what matter here).
* ``--mode eager``: the decode step launched op by op. ``--mode graph``: the SAME eager step
  captured once with ``torch.cuda.CUDAGraph`` and replayed (no torch.compile).
  ``--mode compile``: the step function through ``torch.compile`` (default mode).
* ``--spec K``: speculative decoding with a tiny draft model of the same vocabulary: K
  greedy draft forwards inside ``draft`` ranges, one K+1-token target forward inside
  ``verify``, greedy acceptance, KV caches rolled back to the accepted prefix.
* Each step ends by copying the sampled token to the host (what a serving loop does to
  detokenize and check for a stop), so steps are synchronous and comparable across modes.

Facts written for the manifest: weight bytes read per step (target parameters without the
input embedding unless it is tied to lm_head, lm_head included; plus draft weights x draft
forwards per step), the unprofiled step time (median over ``--timed-steps`` steps timed with
CUDA events BEFORE profiling starts), dtype, versions.

Tensor parallelism (``--tp N [--allreduce nccl|symm-one-shot|symm-two-shot] [--lm-head ...]``, one
process per GPU, launched by ``tracekit capture --tp N`` through torchrun; see ``capture/tp.py``):
Megatron-style sharding of the target model -- q/k/v and gate/up column-parallel, o_proj and down_proj
row-parallel, each followed by an all-reduce (2 per layer per forward); the input embedding replicated;
lm_head vocab-parallel + an all-gather of the logits (default) or replicated (``--lm-head replicated``).
The ``--spec`` draft model is replicated on every rank (no communication). ``weight_bytes_per_step``
is then the bytes ONE GPU reads (its shard).

Markers (unless ``--no-markers``): ``decode_step <i>``, and with ``--spec`` ``draft`` and ``verify``. The loop
(warm-up, unprofiled timing, markers, profiler, facts; every rank's timed and profiled windows between barriers) is
``capture/harness.py``'s; this file says what one step does (``HFDecode``). The unprofiled times are measured with
markers off; with ``--spec`` the harness also measures each phase (``draft``, ``verify``) unprofiled.
"""

from __future__ import annotations

import inspect
import sys

import _common
import harness
import markers
import tp as tpmod

# name: (hidden, layers, heads, kv_heads, intermediate, vocab, tie_word_embeddings)
SIZES = {
    # a few MB: CPU tests and smoke runs
    "tiny": dict(hidden_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=512, vocab_size=2048, tie_word_embeddings=True),
    # ~0.49 B params, Qwen2.5-0.5B-like shape (tied embeddings): ~0.99 GB read per step
    "small": dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                  intermediate_size=4864, vocab_size=151936, tie_word_embeddings=True),
    # ~2.58 B params, untied lm_head: ~4.5 GB read per step (5.2 GB of bf16 weights in all)
    "large": dict(hidden_size=2560, num_hidden_layers=28, num_attention_heads=20, num_key_value_heads=4,
                  intermediate_size=6912, vocab_size=128256, tie_word_embeddings=False),
}
# the draft model of --spec: same vocabulary as the target, 2 thin layers, own lm_head tied
DRAFT = dict(hidden_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=768)


def build_config(arch: str, preset: dict, max_pos: int):
    import transformers

    cls = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config}[arch]
    kw = dict(preset)
    kw.update(max_position_embeddings=max(4096, max_pos), rms_norm_eps=1e-6, use_cache=True,
              bos_token_id=1, eos_token_id=2, pad_token_id=0)
    cfg = cls(**kw)
    cfg._attn_implementation = "sdpa"
    return cfg


def build_model(cfg, device, dtype):
    import torch
    import transformers

    cls = {"llama": transformers.LlamaForCausalLM, "qwen2": transformers.Qwen2ForCausalLM}[cfg.model_type]
    torch.manual_seed(0)
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = cls(cfg)
    finally:
        torch.set_default_dtype(prev)
    model = model.to(device=device, dtype=dtype).eval()
    with torch.no_grad():  # keep activations finite with random weights
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.02)
    return model


def weight_bytes(model) -> dict:
    """Bytes of the parameters one forward reads: all of them except the input embedding,
    unless the embedding is tied to lm_head (then it is read once, as lm_head)."""
    emb = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    tied = emb.data_ptr() == head.data_ptr()
    seen = set()
    total = 0
    params = 0
    for p in model.parameters():
        if p.data_ptr() in seen:
            continue
        seen.add(p.data_ptr())
        params += p.numel()
        if p is emb and not tied:
            continue
        total += p.numel() * p.element_size()
    return {"bytes": int(total), "params": int(params), "embedding_bytes": int(emb.numel() * emb.element_size()),
            "tied": bool(tied)}


class Decoder:
    """One model + its StaticCache, with a fixed-shape forward of ``q`` new tokens whose
    positions come from the cache's own on-device length (graph-replay safe)."""

    def __init__(self, model, max_cache_len: int, device, q: int = 1, cache_config=None):
        import torch
        from transformers import StaticCache

        self.model = model
        self.device = device
        sig = inspect.signature(StaticCache.__init__).parameters
        kw = dict(config=cache_config or model.config, max_cache_len=max_cache_len)
        if "max_batch_size" in sig:  # transformers 4.x
            kw.update(max_batch_size=1, device=device, dtype=model.dtype)
        self.cache = StaticCache(**kw)
        fwd = inspect.signature(model.forward).parameters
        self.cache_kw = "past_key_values" if "past_key_values" in fwd else "cache"
        self.q = q
        self.input_ids = torch.zeros((1, q), dtype=torch.long, device=device)
        self.offsets = torch.arange(q, dtype=torch.long, device=device).view(1, q)
        self.logits = None

    def lengths(self):
        return [layer.cumulative_length for layer in self.cache.layers]

    def prefill(self, ids):
        import torch

        with torch.no_grad():
            pos = torch.arange(ids.shape[1], device=self.device).view(1, -1)
            out = self.model(input_ids=ids, position_ids=pos, use_cache=True, **{self.cache_kw: self.cache})
        return out.logits

    def forward(self):
        """Forward ``self.input_ids`` at positions length..length+q-1; returns logits [1,q,V]."""
        import torch

        with torch.no_grad():
            pos = self.cache.layers[0].cumulative_length.view(1, 1) + self.offsets
            out = self.model(input_ids=self.input_ids, position_ids=pos, use_cache=True,
                             **{self.cache_kw: self.cache})
        return out.logits

    def set_length(self, n: int) -> None:
        for t in self.lengths():
            t.fill_(n)

    def rollback(self, n) -> None:
        """Forget the last ``n`` cached tokens (``n`` an int or a 0-d device tensor)."""
        if isinstance(n, int) and n == 0:
            return
        for t in self.lengths():
            t.sub_(n)


class HFDecode(harness.Workload):
    """HF transformers decode loop with RANDOM weights (no downloads), batch 1, static KV cache."""

    name = "hf"

    @classmethod
    def add_args(cls, p):
        p.add_argument("--size", choices=sorted(SIZES), default="small")
        p.add_argument("--layers", type=int, default=None, help="override the size's number of layers")
        p.add_argument("--arch", choices=["llama", "qwen2"], default="llama")
        p.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16")
        p.add_argument("--prompt-len", type=int, default=128)
        p.add_argument("--spec", type=int, default=0, help="speculative decoding: K draft tokens per step")
        tpmod.add_tp_args(p)
        p.add_argument("--lm-head", choices=["vocab-parallel", "replicated"], default="vocab-parallel",
                       help="with --tp: lm_head rows sharded + all-gather of the logits, or a full copy per GPU")

    @classmethod
    def setup(cls, args):
        """``--tp``: join the process group; this rank's device and output files."""
        args.dist = None
        if args.tp is None:
            return
        tpmod.check_divisible(args.tp, **{k: v for k, v in SIZES[args.size].items()
                                         if k in ("num_attention_heads", "num_key_value_heads", "intermediate_size")})
        if args.lm_head == "vocab-parallel":
            tpmod.check_divisible(args.tp, vocab_size=SIZES[args.size]["vocab_size"])
        dist_ = args.dist = tpmod.Dist(args.tp, args.device)
        args.device = str(dist_.device)
        args.trace_out = tpmod.rank_path(args.trace_out, dist_.rank, dist_.world_size)
        args.facts_out = tpmod.rank_path(args.facts_out, dist_.rank, dist_.world_size)

    def __init__(self, h):
        super().__init__(h)
        self.K = int(self.args.spec)
        if self.K:   # the speculative step's parts and their ranges
            self.PHASES = ("draft", "verify")
            self.MARKERS = {"draft": markers.DRAFT, "verify": markers.VERIFY}

    def build(self):
        import transformers

        torch, dev, args, K = self.torch, self.dev, self.args, self.K
        dist_ = args.dist
        self.framework = f"transformers {transformers.__version__}"
        dtype = getattr(torch, args.dtype)
        per_step_tokens = K + 1 if K else 1
        phase_len = max(args.timed_steps, args.steps + 2) + args.warmup
        max_cache_len = self.max_cache_len = args.prompt_len + phase_len * per_step_tokens + 16

        size = {**SIZES[args.size], **({"num_hidden_layers": args.layers} if args.layers else {})}
        cfg = self.cfg = build_config(args.arch, size, max_cache_len)
        _common.log(f"building {args.arch}-{args.size} ({cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}) "
                    f"on {dev} in {args.dtype}")
        model = build_model(cfg, dev, dtype)
        wb = self.wb = weight_bytes(model)
        self.tp_facts = None
        cache_cfg = None
        if dist_ is not None:
            ar = tpmod.AllReduce(args.allreduce, dist_, per_step_tokens * cfg.hidden_size, dtype)
            shard = shard_model(model, dist_, ar, args.lm_head)
            cache_cfg = shard_config(cfg, dist_.world_size)
            self.tp_facts = dict(
                world_size=dist_.world_size, rank=dist_.rank, launcher=dist_.launcher,
                sharding="column-parallel q/k/v + gate/up; row-parallel o_proj + down_proj, each followed by an "
                         "all-reduce",
                embedding="replicated", lm_head=args.lm_head,
                lm_head_allgather_bytes=(per_step_tokens * cfg.vocab_size * dtype.itemsize
                                         if args.lm_head == "vocab-parallel" and dist_.world_size > 1 else 0),
                draft=("replicated" if K else None),
                allreduce_per_layer=2, shard_weight_bytes=shard["bytes"], full_weight_bytes=wb["bytes"],
                **ar.facts(per_step_tokens * cfg.hidden_size, 2 * cfg.num_hidden_layers))
            _common.log(f"rank {dist_.rank}/{dist_.world_size}: sharded, {shard['bytes']} weight bytes on this GPU, "
                        f"all-reduce {ar.impl} of {self.tp_facts['allreduce_message_bytes']} bytes x "
                        f"{2 * cfg.num_hidden_layers}")
        target = self.target = Decoder(model, max_cache_len, dev, q=per_step_tokens, cache_config=cache_cfg)
        prompt = torch.randint(3, cfg.vocab_size, (1, args.prompt_len), device=dev)
        first = target.prefill(prompt)[:, -1].argmax(-1)

        self.draft_wb = None
        if K:
            dcfg = build_config(args.arch, dict(DRAFT, vocab_size=cfg.vocab_size, tie_word_embeddings=True),
                                max_cache_len)
            draft_model = build_model(dcfg, dev, dtype)
            self.draft_wb = weight_bytes(draft_model)
            draft = self.draft = Decoder(draft_model, max_cache_len, dev, q=1)
            draft.prefill(prompt)
            draft.input_ids.copy_(first.view(1, 1))
        else:
            target.input_ids.copy_(first.view(1, 1))

        self.host_tok = torch.zeros(per_step_tokens + 1, dtype=torch.long, pin_memory=dev.type == "cuda")
        self.token_log: list[int] = []  # the first greedy tokens of the timed (then profiled) steps: TP checks

        # ---- the decode step's compute, built per mode ----
        if not K:
            def eager_step():
                logits = target.forward()
                nxt = logits[:, -1].argmax(-1)
                target.input_ids.copy_(nxt.view(1, 1))
                return nxt

            self.core = eager_step
            if args.mode == "compile":
                self.core = torch.compile(eager_step, dynamic=False)
            elif args.mode == "graph":
                self.core = _graphed(eager_step, target, dev, warm=3)
        else:
            def draft_one():
                logits = draft.forward()
                nxt = logits[:, -1].argmax(-1)
                draft.input_ids.copy_(nxt.view(1, 1))
                return nxt

            def verify_fwd():
                logits = target.forward()
                return logits[0].argmax(-1)  # [K+1]: the target's token after each prefix

            self.d_core, self.v_core = draft_one, verify_fwd
            if args.mode == "compile":
                self.d_core = torch.compile(draft_one, dynamic=False)
                self.v_core = torch.compile(verify_fwd, dynamic=False)
            elif args.mode == "graph":
                self.d_core = _graphed(draft_one, draft, dev, warm=3)
                self.v_core = _graphed(verify_fwd, target, dev, warm=3)
            self.drafted = torch.zeros(K, dtype=torch.long, device=dev)

    def reset(self):
        self.target.set_length(self.args.prompt_len)
        if self.K:
            self.draft.set_length(self.args.prompt_len)

    def _host_sync(self):
        if self.cuda:
            self.torch.cuda.current_stream().synchronize()

    def step(self, i):
        if self.K:
            return self.spec_step(i)
        nxt = self.core()
        self.host_tok[:1].copy_(nxt, non_blocking=True)
        self._host_sync()
        if self.h.stage in ("timed", "profiled") and len(self.token_log) < 16:
            self.token_log.append(int(self.host_tok[0]))

    def spec_step(self, i):
        torch, K, target, draft, drafted, h = self.torch, self.K, self.target, self.draft, self.drafted, self.h
        with h.phase("draft"):
            last = draft.input_ids[0, 0].clone()
            for j in range(K):
                drafted[j:j + 1].copy_(self.d_core().view(1))
        with h.phase("verify"):
            target.input_ids[0, 0].copy_(last)
            target.input_ids[0, 1:].copy_(drafted)
            tgt = self.v_core()
            # greedy acceptance: the longest prefix where draft == target
            match = (drafted == tgt[:K]).to(torch.long).cumprod(0).sum()
            self.host_tok[:1].copy_(match.view(1), non_blocking=True)
            self._host_sync()
            a = int(self.host_tok[0])
            bonus = tgt[a]
            target.rollback(K - a)          # keep last + a accepted drafts
            draft.rollback(max(K - 1 - a, 0) if a < K else 0)
            draft.input_ids.copy_(bonus.view(1, 1))
        h.record_accept([a])

    def barrier(self):
        if self.args.dist is not None:
            self.args.dist.barrier()

    def close(self):
        if self.args.dist is not None:      # every rank has written its facts: leave the process group
            self.args.dist.barrier()
            self.args.dist.close()

    def target_bytes(self) -> int:
        return self.tp_facts["shard_weight_bytes"] if self.tp_facts else self.wb["bytes"]

    def contract(self):
        K = self.K
        wbytes = self.target_bytes() + (self.draft_wb["bytes"] * K if K else 0)
        return {"weight_bytes": int(wbytes), "tokens_per_step": 1, "draft_tokens": K or None,
                "dtype": self.args.dtype, "tp": self.args.dist.world_size if self.args.dist is not None else 1,
                "framework": self.framework}

    def facts(self, run):
        args, cfg, wb, K = self.args, self.cfg, self.wb, self.K
        _common.log(f"weight bytes/step (this GPU) {self.contract()['weight_bytes']}")
        facts = {
            "model": {
                "arch": args.arch, "size": args.size, "params": wb["params"], "weight_bytes": wb["bytes"],
                "embedding_bytes": wb["embedding_bytes"], "tied_embeddings": wb["tied"],
                "layers": cfg.num_hidden_layers, "hidden": cfg.hidden_size, "vocab": cfg.vocab_size,
                "prompt_len": args.prompt_len, "max_cache_len": self.max_cache_len,
            },
            "draft_model": (None if not K else {"params": self.draft_wb["params"],
                                                 "weight_bytes": self.draft_wb["bytes"], "forwards_per_step": K}),
            # hf's facts always named the NVTX backend, markers on or off (the harness: only with markers)
            "nvtx_backend": markers.nvtx_backend_name(),
            "tokens_head": list(self.token_log) if not K else None,
        }
        if self.tp_facts:
            facts["tensor_parallel"] = self.tp_facts
            facts["allreduce"] = self.tp_facts["allreduce"]
            facts["allreduce_message_bytes"] = self.tp_facts["allreduce_message_bytes"]
        return facts


def main(argv=None) -> int:
    return harness.run(HFDecode, argv)


def shard_config(cfg, tp: int):
    """A copy of ``cfg`` with one rank's heads (for the per-rank KV cache)."""
    import copy

    c = copy.deepcopy(cfg)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    c.head_dim = head_dim
    c.num_attention_heads = cfg.num_attention_heads // tp
    c.num_key_value_heads = cfg.num_key_value_heads // tp
    return c


def shard_model(model, dist_, ar, lm_head: str = "vocab-parallel") -> dict:
    """Megatron-style sharding in place: keep rank's slice of every linear; row-parallel linears are
    followed by ``ar`` (2 all-reduces per layer). Returns the bytes one forward reads on this GPU."""
    tp, r = dist_.world_size, dist_.rank
    for layer in model.model.layers:
        at, mlp = layer.self_attn, layer.mlp
        for n in ("q_proj", "k_proj", "v_proj"):
            setattr(at, n, tpmod.sliced_linear(getattr(at, n), 0, tp, r))
        at.o_proj = tpmod.RowParallel(tpmod.sliced_linear(at.o_proj, 1, tp, r), ar)
        for n in ("gate_proj", "up_proj"):
            setattr(mlp, n, tpmod.sliced_linear(getattr(mlp, n), 0, tp, r))
        mlp.down_proj = tpmod.RowParallel(tpmod.sliced_linear(mlp.down_proj, 1, tp, r), ar)
        for attr in ("num_heads", "num_key_value_heads"):  # older transformers keep these on the module
            if isinstance(getattr(at, attr, None), int):
                setattr(at, attr, getattr(at, attr) // tp)
    if lm_head == "vocab-parallel":
        model.lm_head = tpmod.VocabParallelHead(tpmod.sliced_linear(model.lm_head, 0, tp, r), dist_)
    return shard_weight_bytes(model)


def shard_weight_bytes(model) -> dict:
    """Bytes one forward reads on this rank: every parameter except the input embedding, plus the
    (possibly sharded) lm_head; a tied lm_head is the embedding, read once."""
    emb = model.get_input_embeddings().weight
    total, seen = 0, set()
    for _, p in model.named_parameters(remove_duplicate=False):
        if p is emb or id(p) in seen:
            continue
        seen.add(id(p))
        total += p.numel() * p.element_size()
    head = getattr(model.lm_head, "weight", None)
    if head is emb:
        total += emb.numel() * emb.element_size()
    return {"bytes": int(total)}


def _graphed(fn, decoder, dev, warm: int = 3):
    """Capture ``fn`` (an eager step over static buffers) in a CUDA graph (``_common.graphed``); return
    replay(). The capture advances the KV cache length like one real step, so it is undone after."""
    lengths = [t.clone() for t in decoder.lengths()]
    replay = _common.graphed(fn, warm=warm)
    for t, v in zip(decoder.lengths(), lengths):
        t.copy_(v)
    return replay


if __name__ == "__main__":
    sys.exit(main())
