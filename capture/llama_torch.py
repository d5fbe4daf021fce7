"""A Llama-architecture decoder in plain torch (random weights), shaped like a serving engine's.

Shared by the engine-shaped capture workloads (``spec_decode.py``, ``serve_decode.py``,
``kv_decode.py``) and ``save_checkpoint.py``. No transformers, no model download: every kernel
and every byte is ours to count.

Like SGLang's and vLLM's Llama (``python/sglang/srt/models/llama.py``: ``QKVParallelLinear``,
``MergedColumnParallelLinear``), q/k/v and gate/up are fused into one weight each; the checkpoint
writer splits them back into the Hugging Face names. Per layer: RMSNorm, the fused QKV GEMM, RoPE,
the KV-cache write at each token's slot, attention, the output GEMM, residual, RMSNorm, the fused
gate/up GEMM, SiLU*mul, the down GEMM, residual.

Attention is ``F.scaled_dot_product_attention`` over a FIXED-shape window of the KV cache
(``window`` tokens per sequence), graph-replay safe: grouped-query heads are folded into the query
rows (``[B, kv_heads, group*q, head_dim]``), so every cached K/V byte of the window is read once.
With ``lengths`` the window is masked to each sequence's length (+ causal among the new tokens);
without, every token of the window is attended (the KV workload: exactly ``context`` tokens).

Prefill (``Target.forward(..., window=None)``): the prompt's tokens go through the same layers, their K/V
written to the cache, and attention is causal over the new tokens only (an extend batch without a cached
prefix, as SGLang's ``forward_extend`` runs one), with grouped-query heads given to SDPA as they are
(``enable_gqa``). Hooks: ``linear(layer, name, x, w)`` replaces ``F.linear`` of a layer's projections (the LoRA
workload adds its adapter delta there) and ``mlp(layer, h)`` replaces the dense gate_up/SiLU/down (the MoE
workload's routed experts); without them every kernel is as before.

Mixture of experts (``MOE_SIZES``, ``Config.experts``): each layer holds a router ``[experts, hidden]`` and
stacked expert weights ``w13 [experts, 2*moe_ffn, hidden]`` / ``w2 [experts, hidden, moe_ffn]`` (vLLM's
``FusedMoE`` layout) instead of the dense gate_up/down; ``capture/moe_decode.py`` runs them.

The MTP/NEXTN draft (``MTPDraft``) is DeepSeek-V3's multi-token-prediction module as SGLang's
``deepseek_nextn.py`` runs it: ``eh_proj(cat(enorm(embed(token)), hnorm(hidden)))``, one decoder
layer, ``shared_head.norm``, and the TARGET's lm_head and embedding (shared, as
``EAGLEWorker.__init__`` does with ``set_embed_and_head``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import _common

# name: hidden, layers, heads, kv_heads, ffn, vocab, tied embeddings
SIZES = {
    # a few MB: CPU tests and smoke runs
    "tiny": dict(hidden=256, layers=2, heads=4, kv_heads=2, ffn=512, vocab=2048, tied=True),
    # the hf_decode "small" shape (Qwen2.5-0.5B-like, no biases): 988,010,240 bytes read per step, launch-bound
    "small": dict(hidden=896, layers=24, heads=14, kv_heads=2, ffn=4864, vocab=151936, tied=True),
    # a Llama-3-8B shape: 15.0 GB of bf16 weights read per step (16.1 GB in all), memory-bound
    "large": dict(hidden=4096, layers=32, heads=32, kv_heads=8, ffn=14336, vocab=128256, tied=False),
}
# MoE shapes (capture/moe_decode.py): ffn = the routed experts' intermediate size (moe_ffn); no shared expert
MOE_SIZES = {
    "tiny": dict(hidden=256, layers=2, heads=4, kv_heads=2, ffn=128, vocab=2048, tied=True, experts=8, top_k=2),
    # 16 routed experts, top-2 (Mixtral-style softmax router, renormalised), 2.2 GB of experts, 16 layers
    "small": dict(hidden=1024, layers=16, heads=16, kv_heads=4, ffn=1408, vocab=32768, tied=False, experts=16,
                  top_k=2),
}


@dataclass(frozen=True)
class Config:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    tied: bool
    rope_theta: float = 500000.0
    eps: float = 1e-5
    experts: int = 0           # routed experts per layer (0: dense MLP)
    top_k: int = 0             # experts each token picks

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def kv_bytes_per_token(self, elem: int = 2) -> int:
        """K and V of one token over every layer (one GPU, no TP)."""
        return self.layers * 2 * self.kv_heads * self.head_dim * elem

    def hf_config(self) -> dict:
        """The ``config.json`` keys a Hugging Face Llama checkpoint of this shape carries."""
        return {
            "architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "hidden_size": self.hidden, "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads, "num_key_value_heads": self.kv_heads,
            "head_dim": self.head_dim, "intermediate_size": self.ffn, "vocab_size": self.vocab,
            "tie_word_embeddings": self.tied, "rope_theta": self.rope_theta, "rms_norm_eps": self.eps,
            "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
            "max_position_embeddings": 131072, "torch_dtype": "bfloat16",
            "bos_token_id": 1, "eos_token_id": 2,
        }


def config(size: str) -> Config:
    return Config(**SIZES[size])


def moe_config(size: str) -> Config:
    return Config(**MOE_SIZES[size])


def _nbytes(t) -> int:
    return int(t.numel() * t.element_size())


class Layer:
    """One decoder layer's weights (fused qkv and gate_up, as the engines hold them)."""

    def __init__(self, cfg: Config, device, dtype, gen):
        import torch

        H, D = cfg.hidden, cfg.head_dim

        def w(*shape):
            return _randn(shape, device, dtype, gen)

        self.input_norm = torch.ones(H, device=device, dtype=dtype)
        self.qkv = w((cfg.heads + 2 * cfg.kv_heads) * D, H)
        self.o = w(H, cfg.heads * D)
        self.post_norm = torch.ones(H, device=device, dtype=dtype)
        if cfg.experts:   # routed experts instead of the dense MLP (vLLM FusedMoE: w13 = gate|up, w2 = down)
            self.router = w(cfg.experts, H)
            self.w13 = w(cfg.experts, 2 * cfg.ffn, H)
            self.w2 = w(cfg.experts, H, cfg.ffn)
        else:
            self.gate_up = w(2 * cfg.ffn, H)
            self.down = w(H, cfg.ffn)

    def tensors(self) -> dict:
        t = {"input_norm": self.input_norm, "qkv": self.qkv, "o": self.o, "post_norm": self.post_norm}
        if hasattr(self, "router"):
            return {**t, "router": self.router, "w13": self.w13, "w2": self.w2}
        return {**t, "gate_up": self.gate_up, "down": self.down}

    def expert_nbytes(self) -> int:
        """Bytes of the routed experts' weights (0 for a dense layer)."""
        return _nbytes(self.w13) + _nbytes(self.w2) if hasattr(self, "w13") else 0

    def nbytes(self) -> int:
        return sum(_nbytes(t) for t in self.tensors().values())


def _randn(shape, device, dtype, gen, scale=0.02):
    import torch

    if str(device).startswith("cuda"):  # generate on the GPU in bf16 directly (tens of GB for the KV cache)
        t = torch.empty(shape, device=device, dtype=dtype)
        return t.normal_(0.0, scale, generator=gen)
    return (torch.randn(*shape, device=device, dtype=torch.float32, generator=gen) * scale).to(dtype)


class KVCache:
    """Static cache ``[layers, B, kv_heads, max_len, head_dim]`` for K and V (random contents: a context
    that was 'prefilled' without spending a prefill)."""

    def __init__(self, cfg: Config, layers: int, batch: int, max_len: int, device, dtype, gen):
        shape = (layers, batch, cfg.kv_heads, max_len, cfg.head_dim)
        self.k = _randn(shape, device, dtype, gen, 1.0)
        self.v = _randn(shape, device, dtype, gen, 1.0)
        self.max_len = max_len

    def nbytes(self) -> int:
        return _nbytes(self.k) + _nbytes(self.v)


class Rope:
    def __init__(self, cfg: Config, device):
        import torch

        D = cfg.head_dim
        self.inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, D, 2, device=device, dtype=torch.float32) / D))

    def cos_sin(self, positions, dtype):
        freqs = positions.to(self.inv_freq.dtype).unsqueeze(-1) * self.inv_freq      # [B, Q, D/2]
        return freqs.cos().to(dtype), freqs.sin().to(dtype)


def _rotate(x, cos, sin):
    import torch

    # x [B, Q, heads, D]; cos/sin [B, Q, D/2]
    half = x.shape[-1] // 2
    c, s = cos.unsqueeze(2), sin.unsqueeze(2)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)


def window_mask(lengths, q: int, window: int, group: int, dtype):
    """Additive mask ``[B, 1, group*q, window]``: new token i of sequence b sees cached slots
    ``0 .. lengths[b] + i`` (its own slot included). Computed on the device (graph-safe)."""
    import torch

    dev = lengths.device
    j = torch.arange(window, device=dev).view(1, 1, window)
    lim = lengths.view(-1, 1, 1) + torch.arange(q, device=dev).view(1, q, 1)
    m = torch.zeros(lim.shape[0], q, window, device=dev, dtype=dtype)
    m = m.masked_fill(j > lim, float("-inf"))
    return m.repeat(1, group, 1).unsqueeze(1)


def _plain_linear(name, x, w):
    import torch.nn.functional as F

    return F.linear(x, w)


def decoder_layer(cfg: Config, layer: Layer, x, cos, sin, k_cache, v_cache, bidx, slots, window, mask,
                  linear=None, mlp=None):
    """One layer over ``x [B, Q, H]``; writes K/V at ``slots [B, Q]`` of ``k_cache/v_cache [B, kvh, L, D]``
    and attends over the first ``window`` cached tokens (``window`` None: prefill, causal attention over the
    ``Q`` new tokens alone). ``linear(name, x, w)`` replaces ``F.linear`` for qkv/o/gate_up/down; ``mlp(h)``
    replaces the dense MLP."""
    import torch.nn.functional as F

    lin = linear or _plain_linear
    B, Q, H = x.shape
    D, nh, nkv = cfg.head_dim, cfg.heads, cfg.kv_heads
    h = F.rms_norm(x, (H,), layer.input_norm, cfg.eps)
    qkv = lin("qkv", h, layer.qkv)
    q, k, v = qkv.split([nh * D, nkv * D, nkv * D], dim=-1)
    q = _rotate(q.view(B, Q, nh, D), cos, sin)
    k = _rotate(k.view(B, Q, nkv, D), cos, sin)
    v = v.view(B, Q, nkv, D)
    k_cache[bidx, :, slots] = k
    v_cache[bidx, :, slots] = v
    if window is None:     # prefill: causal over the new tokens (no cached prefix)
        att = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                             is_causal=True, enable_gqa=nh != nkv)
        att = att.transpose(1, 2).reshape(B, Q, nh * D)
    else:
        g = nh // nkv
        qg = q.view(B, Q, nkv, g, D).permute(0, 2, 3, 1, 4).reshape(B, nkv, g * Q, D)
        att = F.scaled_dot_product_attention(qg, k_cache[:, :, :window], v_cache[:, :, :window], attn_mask=mask)
        att = att.view(B, nkv, g, Q, D).permute(0, 3, 1, 2, 4).reshape(B, Q, nh * D)
    x = x + lin("o", att, layer.o)
    h = F.rms_norm(x, (H,), layer.post_norm, cfg.eps)
    if mlp is not None:
        return x + mlp(h)
    gu = lin("gate_up", h, layer.gate_up)
    a = F.silu(gu[..., :cfg.ffn]) * gu[..., cfg.ffn:]
    return x + lin("down", a, layer.down)


class Target:
    """The target model: embedding, ``cfg.layers`` layers, final norm, lm_head (tied or not)."""

    def __init__(self, cfg: Config, device, dtype, seed: int = 0):
        import torch

        self.cfg, self.device, self.dtype = cfg, device, dtype
        gen = torch.Generator(device=device)
        gen.manual_seed(seed)
        self.embed = _randn((cfg.vocab, cfg.hidden), device, dtype, gen)
        self.layers = [Layer(cfg, device, dtype, gen) for _ in range(cfg.layers)]
        self.norm = torch.ones(cfg.hidden, device=device, dtype=dtype)
        self.lm_head = self.embed if cfg.tied else _randn((cfg.vocab, cfg.hidden), device, dtype, gen)
        self.rope = Rope(cfg, device)

    def step_bytes(self) -> dict:
        """Bytes one forward reads: every layer, the final norm and the lm_head; the embedding
        table only as the lm_head when tied (a lookup reads a row, not the table)."""
        layers = sum(l.nbytes() for l in self.layers)
        head = _nbytes(self.lm_head)
        total = layers + _nbytes(self.norm) + head
        params = sum(t.numel() for l in self.layers for t in l.tensors().values()) + self.norm.numel() \
            + self.embed.numel() + (0 if self.cfg.tied else self.lm_head.numel())
        return {"bytes": int(total), "layers_bytes": int(layers), "lm_head_bytes": int(head),
                "embedding_bytes": int(_nbytes(self.embed)), "params": int(params), "tied": self.cfg.tied}

    def forward(self, tokens, positions, cache: KVCache, slots, window, lengths=None, logits_at=None,
                linear=None, mlp=None):
        """Returns (hidden after the final norm [B, Q, H], pre-norm hidden [B, Q, H], logits).
        ``logits_at``: None = logits for every token ([B, Q, V]); "last" = only the last token ([B, V]).
        ``window`` None: a prefill (causal attention over the Q new tokens; ``lengths`` unused).
        ``linear(i, name, x, w)`` / ``mlp(i, h)``: per-layer hooks (see ``decoder_layer``)."""
        import functools

        import torch.nn.functional as F

        B, Q = tokens.shape
        x = F.embedding(tokens, self.embed)
        cos, sin = self.rope.cos_sin(positions, self.dtype)
        mask = None if (lengths is None or window is None) else window_mask(
            lengths, Q, window, self.cfg.heads // self.cfg.kv_heads, self.dtype)
        bidx = _bidx(B, Q, tokens.device)
        for i, layer in enumerate(self.layers):
            x = decoder_layer(self.cfg, layer, x, cos, sin, cache.k[i], cache.v[i], bidx, slots, window, mask,
                              linear=None if linear is None else functools.partial(linear, i),
                              mlp=None if mlp is None else functools.partial(mlp, i))
        h = F.rms_norm(x, (self.cfg.hidden,), self.norm, self.cfg.eps)
        hs = h[:, -1] if logits_at == "last" else h
        return h, x, F.linear(hs, self.lm_head)


_BIDX = {}


def _bidx(B, Q, device):
    import torch

    key = (B, Q, str(device))
    if key not in _BIDX:
        _BIDX[key] = torch.arange(B, device=device).view(B, 1).expand(B, Q).contiguous()
    return _BIDX[key]


class MTPDraft:
    """One NEXTN/MTP layer (DeepSeek-V3 ``model.layers.<N>``) sharing the target's embedding and lm_head."""

    def __init__(self, target: Target, seed: int = 1):
        import torch

        cfg, device, dtype = target.cfg, target.device, target.dtype
        self.cfg, self.device, self.dtype, self.target = cfg, device, dtype, target
        gen = torch.Generator(device=device)
        gen.manual_seed(seed)
        H = cfg.hidden
        self.enorm = torch.ones(H, device=device, dtype=dtype)
        self.hnorm = torch.ones(H, device=device, dtype=dtype)
        self.eh_proj = _randn((H, 2 * H), device, dtype, gen)
        self.layer = Layer(cfg, device, dtype, gen)
        self.shared_head_norm = torch.ones(H, device=device, dtype=dtype)

    def own_tensors(self) -> dict:
        return {"enorm": self.enorm, "hnorm": self.hnorm, "eh_proj": self.eh_proj,
                "shared_head_norm": self.shared_head_norm, **{f"layer.{k}": v for k, v in self.layer.tensors().items()}}

    def forward_bytes(self) -> dict:
        """Bytes one draft forward reads: its own layer + eh_proj + norms, and the shared lm_head
        (read again by every draft forward). The embedding lookup reads a row only."""
        own = sum(_nbytes(t) for t in self.own_tensors().values())
        head = _nbytes(self.target.lm_head)
        params = sum(t.numel() for t in self.own_tensors().values())
        return {"bytes": int(own + head), "own_bytes": int(own), "shared_lm_head_bytes": int(head),
                "own_params": int(params)}

    def forward(self, tokens, hidden, positions, cache: KVCache, slots, window: int, lengths=None, logits_at=None):
        """tokens [B, Q], hidden [B, Q, H] (the target's pre-norm hidden states): (hidden, logits)."""
        import torch
        import torch.nn.functional as F

        B, Q = tokens.shape
        H = self.cfg.hidden
        e = F.rms_norm(F.embedding(tokens, self.target.embed), (H,), self.enorm, self.cfg.eps)
        h = F.rms_norm(hidden, (H,), self.hnorm, self.cfg.eps)
        x = F.linear(torch.cat((e, h), dim=-1), self.eh_proj)
        cos, sin = self.target.rope.cos_sin(positions, self.dtype)
        mask = None if lengths is None else window_mask(lengths, Q, window, self.cfg.heads // self.cfg.kv_heads,
                                                        self.dtype)
        x = decoder_layer(self.cfg, self.layer, x, cos, sin, cache.k[0], cache.v[0], _bidx(B, Q, tokens.device),
                          slots, window, mask)
        hn = F.rms_norm(x, (H,), self.shared_head_norm, self.cfg.eps)
        hs = hn[:, -1] if logits_at == "last" else hn
        return x, F.linear(hs, self.target.lm_head)


def linear_weights(target: Target) -> list:
    """Every weight-read GEMM's weight of one target forward (the GEMM bandwidth probe reads these)."""
    out = []
    for l in target.layers:
        out += [l.qkv, l.o, l.gate_up, l.down]
    return out + [target.lm_head]


def gemm_probe(target: Target, rows: int, reps: int = 20) -> dict:
    """Achieved bandwidth of the target's weight GEMMs alone: all of them (layers + lm_head) for an
    input of ``rows`` tokens, captured in one CUDA graph and replayed; median of ``reps`` replays."""
    import torch
    import torch.nn.functional as F

    ws = linear_weights(target)
    xs = {}
    for w in ws:
        k = w.shape[1]
        if k not in xs:
            xs[k] = torch.randn(rows, k, device=target.device, dtype=target.dtype)
    nbytes = sum(_nbytes(w) for w in ws)

    def run():
        for w in ws:
            F.linear(xs[w.shape[1]], w)

    replay = _common.graphed(run, warm=1)
    ms = _common.median_ms(replay, reps, target.device)
    del replay
    return {"rows": rows, "weight_bytes": int(nbytes), "median_ms": round(ms, 6),
            "achieved_gbps": round(nbytes / ms / 1e6, 1), "gemms": len(ws), "reps": reps}


def attention_probe(target: Target, cache: KVCache, window: int, batch: int, reps: int = 20) -> dict:
    """Achieved bandwidth of attention alone: one SDPA per layer over ``window`` cached tokens
    (q = 1 token per sequence, GQA folded into the rows as in the model), graphed, median of ``reps``."""
    import torch
    import torch.nn.functional as F

    cfg = target.cfg
    g_ = cfg.heads // cfg.kv_heads
    q = torch.randn(batch, cfg.kv_heads, g_, cfg.head_dim, device=target.device, dtype=target.dtype)

    def run():
        for i in range(cfg.layers):
            F.scaled_dot_product_attention(q, cache.k[i][:, :, :window], cache.v[i][:, :, :window])

    # eagerly first: a backend that cannot run this shape raises here, not inside a graph capture
    F.scaled_dot_product_attention(q, cache.k[0][:, :, :window], cache.v[0][:, :, :window])
    torch.cuda.synchronize()
    replay = _common.graphed(run, warm=1)
    ms = _common.median_ms(replay, reps, target.device)
    kv = cfg.kv_bytes_per_token(target.dtype.itemsize) * window * batch
    del replay
    return {"window": window, "batch": batch, "kv_bytes": int(kv), "median_ms": round(ms, 6),
            "achieved_gbps": round(kv / ms / 1e6, 1), "reps": reps}


graphed = _common.graphed   # one CUDA-graph capture/replay helper for every workload (capture/_common.py)


def round_up(n: int, m: int) -> int:
    return int(math.ceil(n / m) * m)
