"""The models of the speculative-decoding zoo (``capture/zoo.py``): random bf16 weights, plain torch, every byte
ours to count. Built on ``llama_torch`` (its decoder layer, RoPE, KV cache and random init).

* ``DenseLM`` -- a Llama-architecture LM with its own embedding and lm_head: the dense targets, and the
  standalone draft model (smaller hidden, a few layers, the target's vocabulary).
* ``DraftHead`` -- a one-layer draft head on the target's hidden states sharing the target's embedding and
  lm_head: ``kind="nextn"`` is DeepSeek-V3's MTP module as SGLang's ``deepseek_nextn.py`` / ``qwen3_next_mtp``
  run it (``eh_proj(cat(enorm(embed(tok)), hnorm(hidden)))``, one decoder layer, ``shared_head.norm``);
  ``kind="eagle"`` is vLLM's EAGLE-Llama head (``fc(cat(embed(tok), hidden))``, one decoder layer).
* ``HybridLM`` -- a Qwen3-Next / Qwen3.5-style hybrid target: of every ``full_every`` layers, the last is full
  attention and the others Gated DeltaNet linear attention (``in_proj_qkvz``, ``in_proj_ba``, a width-4 causal
  conv over q|k|v, ``fused_gdn_gating``, the gated delta rule, a gated RMSNorm with z, ``out_proj``; then the
  dense MLP). Its verify forward keeps every token's recurrent and conv state (``DISABLE_STATE_UPDATE``,
  ``CACHE_INTERMEDIATE_STATES``, as SGLang's ``hybrid_linear_attn_backend`` does in TARGET_VERIFY) and
  ``rollback`` restores those of the last accepted token (SGLang ``update_mamba_state_after_mtp_verify``).

Attention is ``llama_torch``'s: SDPA over a fixed window of a static KV cache with an additive mask, graph-replay
safe. ``tree_mask`` turns a draft tree's ``[B, N, N]`` mask (``build_tree_efficient``) into that additive mask
(each verify token sees the cached prefix, itself and its ancestors); a chain's tree mask is causal.
"""

from __future__ import annotations

from dataclasses import dataclass

import llama_torch as lt
import zoo_kernels as zk


def _nbytes(t) -> int:
    return int(t.numel() * t.element_size())


def tree_mask(lengths, tmask, window: int, group: int, dtype):
    """Additive mask ``[B, 1, group*N, window]``: verify token x of sequence b sees cached slots ``< lengths[b]``
    and slot ``lengths[b] + y`` where ``tmask[b, x, y]`` (its ancestors and itself)."""
    import torch

    B, N, _ = tmask.shape
    rel = torch.arange(window, device=lengths.device).view(1, 1, window) - lengths.view(B, 1, 1)   # [B, 1, W]
    in_tree = (rel >= 0) & (rel < N)
    seen = tmask.bool().gather(2, rel.clamp(0, N - 1).expand(B, N, window)) & in_tree
    allowed = (rel < 0) | seen
    m = torch.zeros(B, N, window, device=lengths.device, dtype=dtype).masked_fill(~allowed, float("-inf"))
    return m.repeat(1, group, 1).unsqueeze(1)


def select_rows(h, rows):
    """``rows`` None: every token ``[B, Q, H]``; "last": ``[B, H]``; a ``[B]`` index tensor: that token of each
    sequence ``[B, H]``."""
    if rows is None:
        return h
    if isinstance(rows, str):
        return h[:, -1]
    B, _, H = h.shape
    return h.gather(1, rows.view(B, 1, 1).expand(B, 1, H)).view(B, H)


class DenseLM:
    """A Llama-architecture LM with its own embedding, final norm and lm_head (``llama_torch.Target``)."""

    def __init__(self, cfg: lt.Config, device, dtype, seed: int):
        self.m = lt.Target(cfg, device, dtype, seed=seed)
        self.cfg, self.device, self.dtype = cfg, device, dtype
        self.embed, self.lm_head, self.rope, self.final_norm = self.m.embed, self.m.lm_head, self.m.rope, self.m.norm

    @property
    def group(self) -> int:
        return self.cfg.heads // self.cfg.kv_heads

    def kv_cache(self, batch: int, window: int, gen):
        return lt.KVCache(self.cfg, self.cfg.layers, batch, window, self.device, self.dtype, gen)

    def forward(self, tokens, positions, kv, slots, window: int, mask, rows=None, logits=True):
        """tokens/positions/slots ``[B, Q]``: (pre-norm hidden ``[B, Q, H]``, logits of ``rows``; None with
        ``logits=False``: no final norm, no lm_head)."""
        import torch.nn.functional as F

        B, Q = tokens.shape
        x = F.embedding(tokens, self.embed)
        cos, sin = self.rope.cos_sin(positions, self.dtype)
        bidx = lt._bidx(B, Q, tokens.device)
        for i, layer in enumerate(self.m.layers):
            x = lt.decoder_layer(self.cfg, layer, x, cos, sin, kv.k[i], kv.v[i], bidx, slots, window, mask)
        if not logits:
            return x, None
        h = F.rms_norm(x, (self.cfg.hidden,), self.m.norm, self.cfg.eps)
        return x, F.linear(select_rows(h, rows), self.lm_head)

    def weight_bytes(self) -> dict:
        return self.m.step_bytes()


class DraftHead:
    """One decoder layer on the target's hidden states, the target's embedding and lm_head shared."""

    def __init__(self, target, seed: int, kind: str = "nextn"):
        import torch

        cfg, device, dtype = target.cfg, target.device, target.dtype
        self.cfg, self.device, self.dtype, self.target, self.kind = cfg, device, dtype, target, kind
        gen = torch.Generator(device=device)
        gen.manual_seed(seed)
        H = cfg.hidden
        self.own = {}
        if kind == "nextn":
            self.own["enorm"] = torch.ones(H, device=device, dtype=dtype)
            self.own["hnorm"] = torch.ones(H, device=device, dtype=dtype)
            self.own["eh_proj"] = lt._randn((H, 2 * H), device, dtype, gen)
            self.own["shared_head.norm"] = torch.ones(H, device=device, dtype=dtype)
        else:   # vLLM EAGLE-Llama: fc over cat(embedding, hidden); the target's final norm before the lm_head
            self.own["fc"] = lt._randn((H, 2 * H), device, dtype, gen)
        self.layer = lt.Layer(cfg, device, dtype, gen)

    @property
    def group(self) -> int:
        return self.cfg.heads // self.cfg.kv_heads

    def kv_cache(self, batch: int, window: int, gen):
        return lt.KVCache(self.cfg, 1, batch, window, self.device, self.dtype, gen)

    def forward(self, tokens, hidden, positions, k_cache, v_cache, slots, window: int, mask, rows=None, logits=True):
        """tokens/positions/slots ``[B, Q]``, hidden ``[B, Q, H]``; ``k_cache/v_cache [B, kvh, W, D]``:
        (hidden ``[B, Q, H]``, logits of ``rows``)."""
        import torch
        import torch.nn.functional as F

        B, Q = tokens.shape
        H, eps = self.cfg.hidden, self.cfg.eps
        e = F.embedding(tokens, self.target.embed)
        if self.kind == "nextn":
            e = F.rms_norm(e, (H,), self.own["enorm"], eps)
            h = F.rms_norm(hidden, (H,), self.own["hnorm"], eps)
            x = F.linear(torch.cat((e, h), dim=-1), self.own["eh_proj"])
        else:
            x = F.linear(torch.cat((e, hidden), dim=-1), self.own["fc"])
        cos, sin = self.target.rope.cos_sin(positions, self.dtype)
        x = lt.decoder_layer(self.cfg, self.layer, x, cos, sin, k_cache, v_cache, lt._bidx(B, Q, tokens.device),
                             slots, window, mask)
        if not logits:
            return x, None
        norm = self.own["shared_head.norm"] if self.kind == "nextn" else self.target.final_norm
        hn = F.rms_norm(x, (H,), norm, eps)
        return x, F.linear(select_rows(hn, rows), self.target.lm_head)

    def weight_bytes(self) -> dict:
        """One forward: its layer and own weights, and the shared lm_head (read again by every forward)."""
        own = sum(_nbytes(t) for t in self.own.values()) + self.layer.nbytes()
        head = _nbytes(self.target.lm_head)
        params = sum(t.numel() for t in self.own.values()) + sum(t.numel() for t in self.layer.tensors().values())
        return {"bytes": int(own + head), "own_bytes": int(own), "shared_lm_head_bytes": int(head),
                "own_params": int(params)}


# ---------------------------------------------------------------------------------------------------------------
# the hybrid linear-attention target
# ---------------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class HybridConfig:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    full_every: int = 4        # layer i is full attention when (i + 1) % full_every == 0
    k_heads: int = 16          # linear attention: query/key heads, value heads, their head dims
    v_heads: int = 32
    k_dim: int = 128
    v_dim: int = 128
    tied: bool = False
    rope_theta: float = 10000000.0
    eps: float = 1e-6

    def attention_config(self) -> lt.Config:
        return lt.Config(hidden=self.hidden, layers=self.layers // self.full_every, heads=self.heads,
                         kv_heads=self.kv_heads, ffn=self.ffn, vocab=self.vocab, tied=self.tied,
                         rope_theta=self.rope_theta, eps=self.eps)

    @property
    def conv_dim(self) -> int:
        return 2 * self.k_heads * self.k_dim + self.v_heads * self.v_dim


class GDNLayer:
    """One Gated DeltaNet layer (Qwen3-Next ``Qwen3NextGatedDeltaNet``) + its dense MLP."""

    def __init__(self, c: HybridConfig, device, dtype, gen):
        import torch

        H = c.hidden
        kd, vd = c.k_heads * c.k_dim, c.v_heads * c.v_dim

        def w(*shape, scale=0.02):
            return lt._randn(shape, device, dtype, gen, scale)

        self.t = {
            "input_norm": torch.ones(H, device=device, dtype=dtype),
            "in_proj_qkvz": w(2 * kd + 2 * vd, H),
            "in_proj_ba": w(2 * c.v_heads, H),
            "conv1d": w(c.conv_dim, 4, scale=0.5),
            "A_log": torch.zeros(c.v_heads, device=device, dtype=torch.float32).uniform_(0.0, 2.0, generator=gen),
            "dt_bias": torch.ones(c.v_heads, device=device, dtype=torch.float32),
            "norm": torch.ones(c.v_dim, device=device, dtype=dtype),
            "out_proj": w(H, vd),
            "post_norm": torch.ones(H, device=device, dtype=dtype),
            "gate_up": w(2 * c.ffn, H),
            "down": w(H, c.ffn),
        }

    def nbytes(self) -> int:
        return sum(_nbytes(t) for t in self.t.values())


class HybridLM:
    """Embedding, ``layers`` layers (Gated DeltaNet, with full attention every ``full_every``-th), final norm,
    lm_head. Holds its decode state: the KV cache of the attention layers, and per linear layer the conv state
    ``[B, C, 3]`` and the recurrent state ``[B, HV, K, V]`` (float32), with the verify's per-token copies."""

    def __init__(self, c: HybridConfig, device, dtype, seed: int, impl: str):
        import torch

        self.c, self.cfg, self.device, self.dtype, self.impl = c, c.attention_config(), device, dtype, impl
        gen = torch.Generator(device=device)
        gen.manual_seed(seed)
        self.embed = lt._randn((c.vocab, c.hidden), device, dtype, gen)
        self.kinds = ["attn" if (i + 1) % c.full_every == 0 else "gdn" for i in range(c.layers)]
        self.layers = [lt.Layer(self.cfg, device, dtype, gen) if k == "attn" else GDNLayer(c, device, dtype, gen)
                       for k in self.kinds]
        self.final_norm = torch.ones(c.hidden, device=device, dtype=dtype)
        self.lm_head = self.embed if c.tied else lt._randn((c.vocab, c.hidden), device, dtype, gen)
        self.rope = lt.Rope(self.cfg, device)
        self.n_lin = self.kinds.count("gdn")
        self.n_attn = self.kinds.count("attn")

    @property
    def group(self) -> int:
        return self.cfg.heads // self.cfg.kv_heads

    def alloc_state(self, batch: int, window: int, verify_tokens: int, gen):
        """The decode state for ``batch`` sequences (random: a context 'prefilled' for free)."""
        import torch

        c = self.c
        self.kv = lt.KVCache(self.cfg, self.n_attn, batch, window, self.device, self.dtype, gen)
        self.conv = torch.empty(self.n_lin, batch, c.conv_dim, 3, device=self.device, dtype=self.dtype)
        self.conv.normal_(0.0, 1.0, generator=gen)
        self.ssm = torch.empty(self.n_lin, batch, c.v_heads, c.k_dim, c.v_dim, device=self.device,
                               dtype=torch.float32).normal_(0.0, 0.1, generator=gen)
        T = verify_tokens
        self.inter_conv = torch.zeros(self.n_lin, batch, T, c.conv_dim, 3, device=self.device, dtype=self.dtype)
        self.inter_ssm = torch.zeros(self.n_lin, batch, T, c.v_heads, c.k_dim, c.v_dim, device=self.device,
                                     dtype=torch.float32)
        self.state_idx = torch.arange(batch, device=self.device)
        self.batch = batch

    def state_bytes(self) -> dict:
        return {"ssm_state_bytes": _nbytes(self.ssm), "conv_state_bytes": _nbytes(self.conv),
                "intermediate_ssm_bytes": _nbytes(self.inter_ssm),
                "intermediate_conv_bytes": _nbytes(self.inter_conv), "kv_cache_bytes": self.kv.nbytes()}

    def _gdn(self, layer: GDNLayer, li: int, x, verify: bool):
        import torch
        import torch.nn.functional as F

        c, t = self.c, layer.t
        B, Q, H = x.shape
        kd, vd = c.k_heads * c.k_dim, c.v_heads * c.v_dim
        h = F.rms_norm(x, (H,), t["input_norm"], c.eps)
        qkvz = F.linear(h, t["in_proj_qkvz"])
        ba = F.linear(h, t["in_proj_ba"])
        q, k, v, z = qkvz.split([kd, kd, vd, vd], dim=-1)
        b_, a_ = ba.split([c.v_heads, c.v_heads], dim=-1)
        mixed = torch.cat((q, k, v), dim=-1)
        conv_out = torch.empty_like(mixed)
        zk.causal_conv1d_update(mixed, self.conv[li], t["conv1d"], conv_out, self.inter_conv[li] if verify else None,
                                disable_state_update=verify, impl=self.impl)
        q, k, v = conv_out.split([kd, kd, vd], dim=-1)
        q = q.reshape(B, Q, c.k_heads, c.k_dim).contiguous()
        k = k.reshape(B, Q, c.k_heads, c.k_dim).contiguous()
        v = v.reshape(B, Q, c.v_heads, c.v_dim).contiguous()
        g = torch.empty(B * Q, c.v_heads, device=x.device, dtype=torch.float32)
        beta = torch.empty(B * Q, c.v_heads, device=x.device, dtype=x.dtype)
        zk.gdn_gating(t["A_log"], a_.reshape(B * Q, c.v_heads).contiguous(),
                      b_.reshape(B * Q, c.v_heads).contiguous(), t["dt_bias"], g, beta, impl=self.impl)
        o = torch.empty(B, Q, c.v_heads, c.v_dim, device=x.device, dtype=x.dtype)
        zk.gated_delta_rule_update(q, k, v, g.view(B, Q, c.v_heads), beta.view(B, Q, c.v_heads), o, self.ssm[li],
                                   self.state_idx, self.inter_ssm[li] if verify else None, c.k_dim ** -0.5,
                                   disable_state_update=verify, impl=self.impl)
        o = F.rms_norm(o, (c.v_dim,), t["norm"], c.eps) * F.silu(z.reshape(B, Q, c.v_heads, c.v_dim))
        x = x + F.linear(o.reshape(B, Q, vd), t["out_proj"])
        h = F.rms_norm(x, (H,), t["post_norm"], c.eps)
        gu = F.linear(h, t["gate_up"])
        return x + F.linear(F.silu(gu[..., :c.ffn]) * gu[..., c.ffn:], t["down"])

    def forward(self, tokens, positions, slots, window: int, mask, rows=None, verify: bool = False):
        """``verify``: keep every token's linear-attention state and leave the state itself unchanged."""
        import torch.nn.functional as F

        B, Q = tokens.shape
        x = F.embedding(tokens, self.embed)
        cos, sin = self.rope.cos_sin(positions, self.dtype)
        bidx = lt._bidx(B, Q, tokens.device)
        ai = li = 0
        for kind, layer in zip(self.kinds, self.layers):
            if kind == "attn":
                x = lt.decoder_layer(self.cfg, layer, x, cos, sin, self.kv.k[ai], self.kv.v[ai], bidx, slots, window,
                                     mask)
                ai += 1
            else:
                x = self._gdn(layer, li, x, verify)
                li += 1
        h = F.rms_norm(x, (self.c.hidden,), self.final_norm, self.c.eps)
        return x, F.linear(select_rows(h, rows), self.lm_head)

    def rollback(self, accepted) -> None:
        """After a verify: the state of each sequence's last accepted token (``accepted [B]``: accepted drafts)."""
        self.ssm.copy_(self.inter_ssm[:, self.state_idx, accepted])
        self.conv.copy_(self.inter_conv[:, self.state_idx, accepted])

    def weight_bytes(self) -> dict:
        layers = sum(l.nbytes() for l in self.layers)
        head = _nbytes(self.lm_head)
        params = sum(t.numel() for l in self.layers for t in (l.t.values() if isinstance(l, GDNLayer)
                                                               else l.tensors().values()))
        params += self.final_norm.numel() + self.embed.numel() + (0 if self.c.tied else self.lm_head.numel())
        return {"bytes": int(layers + _nbytes(self.final_norm) + head), "layers_bytes": int(layers),
                "lm_head_bytes": int(head), "embedding_bytes": _nbytes(self.embed), "params": int(params),
                "tied": self.c.tied, "linear_attention_layers": self.n_lin, "full_attention_layers": self.n_attn}


__all__ = ["DenseLM", "DraftHead", "HybridConfig", "HybridLM", "GDNLayer", "tree_mask", "select_rows"]
