"""Bytes ONE GPU reads in one decode step: weights (+ MTP draft layers) and the KV cache.

Weights (:func:`step_bytes`), per tensor at its stored bytes (:mod:`tracekit.model.roles`
says which tensors a step reads and how parallelism splits them)::

    weights/GPU = sum over read tensors of  stored bytes x read fraction / split
        split          = tp | min(tp, kv_heads) for k/v | 1 if replicated | max(tp, ep) for experts
        read fraction  = 1, or for routed experts the expected distinct experts a forward of
                         b tokens picks, E * (1 - (1 - k/E)^b), over E   (uniform routing)
    draft/GPU   = MTP layers' bytes (same rules; + the lm_head when they store none)
                  x draft forwards per step              (inside weights/GPU)

KV cache (:func:`kv_cache`), per GPU, per layer of each attention kind::

    full attention   2 x ceil(kv_heads / tp) x head_dim x kv dtype      per token of context
    MLA (DeepSeek)   (kv_lora_rank + qk_rope_head_dim) x kv dtype         per token, not split by tp
    sliding window   as full attention, over at most the window's tokens
    linear attention (Qwen3-Next)  a constant state per sequence: v_heads/tp x k_dim x v_dim
                                   (fp32) + the conv state (kernel - 1 columns)
    Mamba2           a constant state per sequence: heads/tp x head_dim x d_state (fp32) + conv

    KV bytes per step = sum over layers of bytes per token x min(context, window) x batch
                        + constant states x batch  (+ the MTP layers' KV x draft forwards)
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from tracekit.errors import BadOptionValue, ConflictingOptions, TracekitError
from tracekit.model.arch import CHUNKED, FULL, LINEAR, MAMBA, SLIDING, Arch
from tracekit.model.synth import DTYPE_ALIASES
from tracekit.model.units import dtype_bytes, dtype_key

if TYPE_CHECKING:  # (the annotations only)
    from tracekit.model.checkpoint import Model


def expected_experts(experts: int, top_k: int, tokens: float) -> float:
    """Expected distinct experts ``tokens`` tokens pick when each picks ``top_k`` of ``experts`` uniformly.

    >>> expected_experts(128, 8, 1), round(expected_experts(128, 8, 64), 1)
    (8.0, 125.9)
    """
    if experts <= 0 or tokens <= 0:
        return 0.0
    if tokens == 1:
        return float(min(top_k, experts))
    return experts * (1.0 - (1.0 - min(top_k, experts) / experts) ** tokens)


def _check_parallel(tp: int, ep: int) -> None:
    if tp < 1 or ep < 1:
        raise BadOptionValue(f"--tp and --ep must be >= 1 (got tp {tp}, ep {ep})")
    if (ep <= tp and tp % ep) or (ep > tp and ep % tp):
        raise ConflictingOptions(f"--ep {ep} must divide --tp {tp} or be a multiple of it")


def _dtype_bytes(name: str | None, default: float) -> float:
    if name is None:
        return default
    try:
        return dtype_bytes(name)
    except ValueError:
        raise BadOptionValue(f"unknown KV-cache dtype {name!r}; known: bf16, fp16, fp32, fp8") from None


# --------------------------------------------------------------------------------------------- KV cache

@dataclass(frozen=True)
class KvCache:
    """KV-cache bytes ONE GPU reads, by what they scale with."""

    full_bytes_per_token: int                       # context-growing layers, per token of context
    windowed: tuple[tuple[int, int], ...]           # (window tokens, bytes per token) per distinct window
    state_bytes_per_sequence: int                   # linear attention / SSM state, per sequence
    draft_bytes_per_token: int                      # MTP layers' KV, per token, per draft forward
    kv_dtype_bytes: float
    tp: int
    layer_counts: dict[str, int]
    notes: tuple[str, ...] = ()

    def per_sequence(self, context: int) -> int:
        """Bytes one sequence's attention reads at ``context`` tokens (target model only)."""
        b = self.full_bytes_per_token * context + self.state_bytes_per_sequence
        b += sum(per_tok * min(context, w) for w, per_tok in self.windowed)
        return int(b)

    def bytes_per_step(self, context: int, batch: int = 1, draft_forwards: float = 0) -> int:
        """KV bytes a step reads: ``batch`` sequences at ``context`` tokens, plus the draft's.

        >>> KvCache(131072, (), 0, 0, 2, 1, {"full": 32}).bytes_per_step(1000, 2)
        262144000
        """
        if context < 0 or batch < 0 or draft_forwards < 0:
            raise BadOptionValue("context, batch and draft forwards must be >= 0")
        return int(round(self.per_sequence(context) * batch
                         + self.draft_bytes_per_token * context * batch * draft_forwards))

    def to_dict(self) -> dict:
        d = asdict(self)
        d["windowed"] = [{"window": w, "bytes_per_token": b} for w, b in self.windowed]
        d["notes"] = list(self.notes)
        return d


def kv_cache(arch: Arch, *, tp: int = 1, kv_dtype: str | None = None, state_dtype: str = "fp32") -> KvCache:
    """The KV-cache model of ``arch`` on one of ``tp`` GPUs (see the module docstring)."""
    if tp < 1:
        raise BadOptionValue(f"--tp must be >= 1, got {tp}")
    model_bytes = _dtype_bytes(arch.torch_dtype, 2.0) if dtype_key(arch.torch_dtype) in DTYPE_ALIASES else 2.0
    kvb = _dtype_bytes(kv_dtype, model_bytes)
    stb = _dtype_bytes(state_dtype, 4.0)
    notes: list[str] = []
    if arch.mla:
        per_layer = (arch.kv_lora_rank + arch.qk_rope_head_dim) * kvb
        notes.append(f"MLA: each layer caches its compressed latent ({arch.kv_lora_rank} + {arch.qk_rope_head_dim} "
                     "values per token), whole on every tensor-parallel GPU")
    else:
        kv_per_gpu = max(1, math.ceil(arch.kv_heads / tp))
        per_layer = 2 * kv_per_gpu * arch.head_dim * kvb
        if tp > arch.kv_heads:
            notes.append(f"{arch.kv_heads} KV heads over {tp} GPUs: each GPU holds one head (replicated)")
    full = 0.0
    windows: dict[int, float] = defaultdict(float)
    state = 0.0
    counts: dict[str, int] = defaultdict(int)
    for kind in arch.layer_kinds:
        counts[kind] += 1
        if kind == FULL:
            full += per_layer
        elif kind == SLIDING:
            windows[int(arch.sliding_window)] += per_layer
        elif kind == CHUNKED:
            windows[int(arch.chunk_size)] += per_layer
        elif kind == LINEAR:
            vh = max(1, math.ceil(arch.linear_v_heads / tp))
            kh = max(1, math.ceil(arch.linear_k_heads / tp))
            recurrent = vh * arch.linear_k_dim * arch.linear_v_dim * stb
            conv = (arch.conv_kernel - 1) * (2 * kh * arch.linear_k_dim + vh * arch.linear_v_dim) * model_bytes
            state += recurrent + conv
        elif kind == MAMBA:
            heads = max(1, math.ceil(arch.mamba_heads / tp))
            groups = arch.mamba_groups // tp if arch.mamba_groups % tp == 0 and arch.mamba_groups >= tp \
                else arch.mamba_groups
            recurrent = heads * arch.mamba_head_dim * arch.ssm_state * stb
            conv = (arch.conv_kernel - 1) * (heads * arch.mamba_head_dim + 2 * groups * arch.ssm_state) * model_bytes
            state += recurrent + conv
    if counts.get(LINEAR) or counts.get(MAMBA):
        notes.append(f"linear-attention/SSM layers read a constant state per sequence ({state_dtype} recurrent "
                     "state + conv state), independent of the context; it is also written back each step")
    if windows:
        notes.append("sliding-window layers read at most " + ", ".join(f"{w:,}" for w in sorted(windows))
                     + " tokens of context")
    return KvCache(
        full_bytes_per_token=int(round(full)),
        windowed=tuple(sorted((w, int(round(b))) for w, b in windows.items())),
        state_bytes_per_sequence=int(round(state)),
        draft_bytes_per_token=int(round(per_layer * arch.mtp_layers)),
        kv_dtype_bytes=kvb, tp=tp, layer_counts=dict(counts), notes=tuple(notes),
    )


# --------------------------------------------------------------------------------------------- weights

@dataclass(frozen=True)
class StepBytes:
    """What one decode step reads, per GPU, with the inputs and assumptions that produced it."""

    weight_bytes_per_step: int                 # target weights + draft weights x forwards, per GPU
    draft_bytes_per_step: int                  # the draft's part of weight_bytes_per_step
    kv_bytes_per_step: int | None              # per GPU; None when the context is unknown
    bytes_per_step: int                        # weights + KV (KV counted 0 when unknown)
    tp: int
    ep: int
    batch: int
    context: int | None
    draft_forwards: float
    weight_bytes_source: str = "model"
    kv_bytes_source: str | None = None
    by_group: dict[str, int] = field(default_factory=dict)   # target weights per GPU by part of the model
    expected_experts: float | None = None      # distinct routed experts one MoE layer reads per step
    checkpoint_bytes: int = 0                  # every stored tensor, whole model (not per GPU)
    kv: KvCache | None = None
    notes: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        d = asdict(self)
        d["kv"] = self.kv.to_dict() if self.kv is not None else None
        d["notes"], d["warnings"] = list(self.notes), list(self.warnings)
        return d


def _split(role_split: str, arch: Arch, tp: int, ep: int) -> float:
    if role_split == "tp":
        return float(tp)
    if role_split == "kv":
        return float(min(tp, arch.kv_heads)) if arch.kv_heads else float(tp)
    if role_split == "expert":
        return float(max(tp, ep))
    return 1.0


def _expert_shares(model: Model, *, tp: int, ep: int, batch: int, target_tokens: int, notes: list[str],
                   warnings: list[str]) -> tuple[float | None, float, float]:
    """The MoE experts a step reads: the expected distinct experts of the target forward (None without experts)
    and the shares of the expert tensors the target and each draft forward read (1.0: every expert)."""
    a = model.arch
    e_target = e_draft = None
    n_experts = a.experts or _experts_in(model)
    if n_experts and not a.top_k:
        warnings.append("expert tensors found but the config has no num_experts_per_tok: every expert counted")
    frac_target = frac_draft = 1.0
    if n_experts and a.top_k:
        e_target = expected_experts(n_experts, a.top_k, target_tokens)
        e_draft = expected_experts(n_experts, a.top_k, batch)
        frac_target, frac_draft = e_target / n_experts, e_draft / n_experts
        notes.append(f"MoE: a forward of {target_tokens} token(s) reads the expected distinct experts under uniform "
                     f"routing, E(1-(1-k/E)^b) = {e_target:.1f} of {n_experts} per layer (top-{a.top_k}), plus "
                     "shared experts and the router whole")
        if max(tp, ep) > 1:
            notes.append(f"experts spread over {max(tp, ep)} GPUs (tp {tp}, ep {ep}): the mean GPU's share; "
                         "the busiest GPU reads more")
    return e_target, frac_target, frac_draft


def _tensor_bytes(model: Model, *, tp: int, ep: int, frac_target: float, frac_draft: float,
                  warnings: list[str]) -> tuple[dict[str, float], float, float, bool]:
    """Each tensor's bytes on one GPU (split by its role; experts at their share; a tied lm_head read through the
    embedding): the target's bytes by group, a draft forward's bytes, the lm_head's bytes, and whether the draft
    has its own lm_head."""
    a = model.arch
    has_head = any(r.group == "lm_head" and not r.draft for r in model.roles)
    draft_has_head = any(r.group == "lm_head" and r.draft for r in model.roles)
    by_group: dict[str, float] = defaultdict(float)
    draft_per_forward = 0.0
    head_bytes = 0.0
    guessed = 0
    for t, r in zip(model.tensors, model.roles):
        if r.split == "none":
            if r.group == "embedding" and not r.draft and not has_head:
                # tied lm_head: the step reads the embedding matrix as the output projection
                b = t.nbytes / tp
                by_group["lm_head"] += b
                head_bytes += b
            continue
        b = t.nbytes / _split(r.split, a, tp, ep)
        if r.split == "qkv" and a.kv_heads and tp > a.kv_heads:
            q = a.heads / (a.heads + 2 * a.kv_heads)
            b = t.nbytes * (q / tp + (1 - q) / a.kv_heads)
        if r.split == "expert":
            b *= frac_draft if r.draft else frac_target
        guessed += r.guessed
        if r.draft:
            draft_per_forward += b
        else:
            by_group[r.group] += b
            if r.group == "lm_head":
                head_bytes += b
    if guessed:
        warnings.append(f"{guessed} tensor(s) of no known role counted as split by tensor parallelism")
    return by_group, draft_per_forward, head_bytes, draft_has_head


def step_bytes(
    model: Model,
    *,
    tp: int = 1,
    ep: int = 1,
    batch: int = 1,
    context: int | None = None,
    draft_forwards: float = 0,
    verify_tokens: int = 1,
    kv_dtype: str | None = None,
) -> StepBytes:
    """Bytes one GPU reads per decode step of ``model``.

    ``batch``: sequences decoded per step. ``verify_tokens``: tokens per sequence in the
    target forward (with speculation: draft tokens + 1), so the MoE target forward routes
    ``batch x verify_tokens`` tokens; each draft forward routes ``batch``. ``context``:
    KV-cache tokens each sequence reads (None: KV unknown -> ``kv_bytes_per_step`` None).
    ``draft_forwards``: MTP forward passes per step (0: the MTP layers are not read).
    """
    _check_parallel(tp, ep)
    if batch < 1 or verify_tokens < 1:
        raise BadOptionValue(f"--batch and the verified tokens must be >= 1 (got {batch}, {verify_tokens})")
    if draft_forwards < 0 or not math.isfinite(draft_forwards):
        raise BadOptionValue(f"draft forwards must be >= 0, got {draft_forwards}")
    if context is not None and context < 0:
        raise BadOptionValue(f"--context must be >= 0, got {context}")
    a = model.arch
    notes = list(model.notes)
    warnings = list(model.warnings)
    target_tokens = batch * verify_tokens
    e_target, frac_target, frac_draft = _expert_shares(model, tp=tp, ep=ep, batch=batch,
                                                       target_tokens=target_tokens, notes=notes, warnings=warnings)
    by_group, draft_per_forward, head_bytes, draft_has_head = _tensor_bytes(model, tp=tp, ep=ep,
                                                                            frac_target=frac_target,
                                                                            frac_draft=frac_draft, warnings=warnings)
    mtp_stored = draft_per_forward > 0
    if draft_forwards and mtp_stored and not draft_has_head:
        draft_per_forward += head_bytes  # Qwen3-Next's MTP computes logits with the target's lm_head
    draft = draft_per_forward * draft_forwards
    if draft_forwards and not mtp_stored:
        warnings.append("draft forwards given but the checkpoint holds no MTP/next-n layers: draft bytes 0 "
                        "(a separate draft model's bytes are not in this checkpoint)")
    elif mtp_stored and draft_forwards:
        notes.append(f"MTP draft: {a.mtp_layers or 'the'} next-n layer(s) read {draft_forwards:g} time(s) per step "
                     f"= {draft / 1e9:.3f} GB per GPU, inside the weights")
    elif mtp_stored:
        notes.append("the checkpoint's MTP/next-n layers are not counted (no draft forwards given)")
    target = sum(by_group.values())
    weights = int(round(target + draft))

    kv = None
    kv_step = None
    if context is not None:
        try:
            kv = kv_cache(a, tp=tp, kv_dtype=kv_dtype)
        except TracekitError:
            raise
        kv_step = kv.bytes_per_step(context, batch, draft_forwards if mtp_stored else 0)
        notes += list(kv.notes)
        notes.append(f"KV cache: {batch} sequence(s) x {context:,} tokens of context read once per step")
    else:
        notes.append("KV cache not counted: the context length is unknown (give --context)")
    return StepBytes(
        weight_bytes_per_step=weights,
        draft_bytes_per_step=int(round(draft)),
        kv_bytes_per_step=kv_step,
        bytes_per_step=weights + (kv_step or 0),
        tp=tp, ep=ep, batch=batch, context=context, draft_forwards=float(draft_forwards),
        weight_bytes_source="model", kv_bytes_source="model" if kv_step is not None else None,
        by_group={k: int(round(v)) for k, v in sorted(by_group.items(), key=lambda kv_: -kv_[1])},
        expected_experts=e_target, checkpoint_bytes=model.checkpoint_bytes, kv=kv,
        notes=tuple(notes), warnings=tuple(warnings),
    )


def _experts_in(model: Model) -> int:
    """Routed experts per layer from ``experts.N`` tensor names, when the config does not say."""
    best = 0
    for t, r in zip(model.tensors, model.roles):
        if r.group == "experts":
            parts = t.name.split(".")
            for i, p in enumerate(parts[:-1]):
                if p == "experts" and parts[i + 1].isdigit():
                    best = max(best, int(parts[i + 1]) + 1)
    return best
