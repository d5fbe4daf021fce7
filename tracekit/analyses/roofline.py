"""The roofline: bytes a decode step must read and FLOPs it must do, the floor and the tok/s ceiling.

One implementation, shared by ``tracekit breakdown`` (its ``roofline`` block) and
``tracekit ceiling`` (trace-free). Pure functions: no file access, no printing.

The arithmetic (units: bytes and FLOPs per GPU, GB/s = 1e9 B/s, TFLOP/s = 1e12 FLOP/s, milliseconds)::

    bytes_per_step             = weight bytes (draft x forwards included) + KV-cache bytes
    memory_floor_ms            = bytes_per_step / (peak_bw_gbps * 1e9) * 1e3
    flops_per_step             = GEMM FLOPs + attention FLOPs          (:func:`model_flops`, or recorded shapes)
    compute_floor_ms           = flops_per_step / (peak_tflops * 1e12) * 1e3
    floor_ms                   = max(memory_floor_ms, compute_floor_ms);  bound = which one is larger
    ceiling_steps_per_s        = 1000 / floor_ms
    ceiling_tokens_per_s       = ceiling_steps_per_s * tokens_per_step
    fraction_of_ceiling        = floor_ms / reference_step_ms
    gemm_achieved_bw_gbps      = (weight - draft bytes) / (gemm_ms * 1e-3) / 1e9
    gemm_achieved_tflops       = GEMM FLOPs / (gemm_ms * 1e-3) / 1e12
    attention_achieved_bw_gbps = KV bytes / (attention_ms * 1e-3) / 1e9

:func:`step_roofline` is the memory roofline; :func:`with_compute` adds the compute floor to it (``peak_tflops``:
the GPU table's dense peak for the weights' dtype, ``tracekit.analyses.resolve.peak_tflops``). Where the FLOPs or the
peak are unknown, the compute keys are null and the floor is the memory floor (``bound`` null: not decided).

:func:`step_roofline` gives the contract's ``roofline`` block (``tracekit.breakdown/3``);
:func:`roofline` is its weights-only form (the ``/1`` keys). The per-GPU bytes come from
``--weight-bytes`` / ``--tp`` (:func:`weight_bytes_per_gpu`), from ``tracekit.model``
(``--model``: weights, MoE, MTP draft and the KV cache) or from the trace (below).

It also infers the weight bytes a step reads from what a trace records: the input
shapes of matmul-like torch ops (Kineto ``record_shapes``), or SGLang's layer-wise
NVTX text (``--enable-layerwise-nvtx-marker``), which names each module's parameters.

>>> r = roofline(13_500_000_000, 768.0, None, 3.2, None)
>>> round(r.floor_ms, 2), round(r.ceiling_steps_per_s, 1), round(r.ceiling_tokens_per_s)
(17.58, 56.9, 182)
"""

from __future__ import annotations

import ast
import math
import re
from dataclasses import dataclass, replace

import polars as pl

from tracekit.analyses.resolve import above_peak, bytes_per_step, weight_bytes_per_gpu  # noqa: F401  (re-exported)
from tracekit.contract import Block, extension, internal
from tracekit.model.units import DTYPE_BITS, dtype_bytes, dtype_key

# Element sizes: the one table (tracekit.model.units); dtype_bytes is re-exported here for the roofline's callers.
DTYPE_BYTES: dict[str, float] = {k: v / 8 for k, v in DTYPE_BITS.items()}  # by dtype_key(name)


@dataclass(frozen=True)
class RooflineBlock(Block):
    """The roofline's figures (a :class:`tracekit.contract.Block`; ``to_dict()`` has its keys, in order): the
    ``roofline`` of ``tracekit ceiling``, and the first keys of breakdown's
    (``tracekit.results.breakdown.TraceRoofline``).

    Every byte figure is per GPU; ``tp`` says by how many GPUs the model's bytes were divided.
    """

    weight_bytes_per_step: int | None
    weight_bytes_source: str | None
    kv_bytes_per_step: int | None
    kv_bytes_source: str | None
    draft_bytes_per_step: int | None
    bytes_per_step: int | None
    tp: int
    floor_ms: float | None
    ceiling_steps_per_s: float | None
    tokens_per_step: float | None
    ceiling_tokens_per_s: float | None
    fraction_of_ceiling: float | None
    gemm_achieved_bw_gbps: float | None
    attention_achieved_bw_gbps: float | None
    # the compute roofline (:func:`with_compute`): written once it was asked for, null where unknown
    memory_floor_ms: float | None = extension(omit=lambda r: not r.compute)
    peak_tflops: float | None = extension(omit=lambda r: not r.compute)
    flops_per_step: float | None = extension(omit=lambda r: not r.compute)
    compute_floor_ms: float | None = extension(omit=lambda r: not r.compute)
    bound: str | None = extension(omit=lambda r: not r.compute)  # "memory" | "compute" | None (not decided)
    gemm_achieved_tflops: float | None = extension(omit=lambda r: not r.compute)
    compute: bool = internal(default=False)


def with_compute(block: RooflineBlock, *, gemm_flops_per_step: float | None, peak_tflops: float | None,
                 attention_flops_per_step: float | None = None, gemm_ms: float | None = None,
                 reference_step_ms: float | None = None) -> RooflineBlock:
    """``block`` (a memory roofline, :func:`step_roofline`) with its compute floor: the floor becomes the larger of
    the two and the ceilings and ``fraction_of_ceiling`` follow it; ``bound`` says which. FLOPs per GPU per step:
    ``gemm_flops_per_step`` (the target's GEMMs; None = unknown: no compute floor) plus
    ``attention_flops_per_step`` (None: not counted). ``gemm_ms``: gemm kernel time per step, for
    ``gemm_achieved_tflops``.

    A dense 8B bf16 model on an H100 SXM (3,350 GB/s, 989 TFLOP/s), 512 tokens per step: 16 GB of weights take
    4.78 ms to read, 2 x 8e9 x 512 FLOPs 8.28 ms to compute: compute-bound.

    >>> m = step_roofline(weight_bytes_per_step=16e9, peak_bw_gbps=3350, tokens_per_step=512)
    >>> r = with_compute(m, gemm_flops_per_step=2 * 8e9 * 512, peak_tflops=989)
    >>> round(r.memory_floor_ms, 2), round(r.compute_floor_ms, 2), r.bound, r.floor_ms == r.compute_floor_ms
    (4.78, 8.28, 'compute', True)
    >>> with_compute(m, gemm_flops_per_step=2 * 8e9, peak_tflops=989).bound
    'memory'
    """
    memory = block.memory_floor_ms if block.compute else block.floor_ms
    flops = float(gemm_flops_per_step) + (float(attention_flops_per_step) if _pos(attention_flops_per_step)
                                          else 0.0) if _pos(gemm_flops_per_step) else None
    peak = float(peak_tflops) if _pos(peak_tflops) else None
    compute = flops / (peak * 1e12) * 1e3 if flops is not None and peak is not None else None
    floor = max(memory, compute) if memory is not None and compute is not None else memory
    bound = ("compute" if compute > memory else "memory") if memory is not None and compute is not None else None
    steps_s = 1000.0 / floor if floor else None
    tok_s = steps_s * block.tokens_per_step if steps_s is not None and block.tokens_per_step is not None else None
    frac = floor / reference_step_ms if floor is not None and _pos(reference_step_ms) else None
    achieved = gemm_flops_per_step / (gemm_ms * 1e-3) / 1e12 if _pos(gemm_flops_per_step) and _pos(gemm_ms) \
        else None
    return replace(block, floor_ms=floor, ceiling_steps_per_s=steps_s, ceiling_tokens_per_s=tok_s,
                   fraction_of_ceiling=frac, memory_floor_ms=memory, peak_tflops=peak, flops_per_step=flops,
                   compute_floor_ms=compute, bound=bound, gemm_achieved_tflops=achieved, compute=True)


def step_roofline(
    *,
    weight_bytes_per_step: int | float | None,
    peak_bw_gbps: float | None,
    reference_step_ms: float | None = None,
    tokens_per_step: float | None = None,
    tp: int = 1,
    weight_bytes_source: str | None = None,
    kv_bytes_per_step: int | float | None = None,
    kv_bytes_source: str | None = None,
    draft_bytes_per_step: int | float | None = None,
    gemm_ms: float | None = None,
    attention_ms: float | None = None,
) -> RooflineBlock:
    """The roofline block from per-GPU byte streams. Pure; never guesses: an input that is None
    (or not > 0) makes what depends on it None.

    ``weight_bytes_per_step``: per GPU, the draft's weights x forwards included
    (``draft_bytes_per_step`` says how much of it is the draft's). ``kv_bytes_per_step``: per
    GPU, the KV cache attention reads; None = unknown (the floor then counts weights only and
    the caller warns). ``reference_step_ms``: the step time savings are stated against
    (``time_base.reference_step_ms``; for ``ceiling``, tokens_per_step x 1000 / measured tok/s).
    ``gemm_ms`` / ``attention_ms``: kernel time per step of those categories::

        bytes_per_step             = weights + KV
        floor_ms                   = bytes_per_step / peak bandwidth
        fraction_of_ceiling        = floor_ms / reference_step_ms
        gemm_achieved_bw_gbps      = (weights - draft) / gemm time   (the draft's GEMMs are `drafting`)
        attention_achieved_bw_gbps = KV bytes / attention time

    >>> r = step_roofline(weight_bytes_per_step=4e9, kv_bytes_per_step=8e8, peak_bw_gbps=4800,
    ...                   reference_step_ms=1.25, tokens_per_step=8, attention_ms=0.25)
    >>> r.bytes_per_step, r.floor_ms, r.fraction_of_ceiling, r.attention_achieved_bw_gbps
    (4800000000, 1.0, 0.8, 3200.0)
    """
    if tp < 1:
        raise ValueError("tp must be >= 1")
    w = int(round(weight_bytes_per_step)) if _pos(weight_bytes_per_step) else None
    kv = int(round(kv_bytes_per_step)) if kv_bytes_per_step is not None and math.isfinite(kv_bytes_per_step) \
        and kv_bytes_per_step >= 0 else None
    draft = int(round(draft_bytes_per_step)) if draft_bytes_per_step is not None \
        and math.isfinite(draft_bytes_per_step) and draft_bytes_per_step >= 0 else None
    if draft is not None and w is not None and draft > w:
        raise ValueError(f"draft bytes ({draft}) cannot exceed the weight bytes they are part of ({w})")
    total = w + (kv or 0) if w is not None else None
    floor_ms = total / (peak_bw_gbps * 1e9) * 1e3 if total and _pos(peak_bw_gbps) else None
    steps_s = 1000.0 / floor_ms if floor_ms is not None else None
    tps = float(tokens_per_step) if _pos(tokens_per_step) else None
    tok_s = steps_s * tps if steps_s is not None and tps is not None else None
    frac = floor_ms / reference_step_ms if floor_ms is not None and _pos(reference_step_ms) else None
    target = w - (draft or 0) if w is not None else None
    gemm_bw = target / (gemm_ms * 1e-3) / 1e9 if target and _pos(gemm_ms) else None
    attn_bw = kv / (attention_ms * 1e-3) / 1e9 if kv and _pos(attention_ms) else None
    return RooflineBlock(
        weight_bytes_per_step=w, weight_bytes_source=weight_bytes_source if w is not None else None,
        kv_bytes_per_step=kv, kv_bytes_source=kv_bytes_source if kv is not None else None,
        draft_bytes_per_step=draft if w is not None else None, bytes_per_step=total, tp=int(tp),
        floor_ms=floor_ms, ceiling_steps_per_s=steps_s, tokens_per_step=tps, ceiling_tokens_per_s=tok_s,
        fraction_of_ceiling=frac, gemm_achieved_bw_gbps=gemm_bw, attention_achieved_bw_gbps=attn_bw,
    )


def physical_check(block: RooflineBlock, peak_bw_gbps: float | None, *, gemm_ms: float | None = None,
                   attention_ms: float | None = None, reference_step_ms: float | None = None,
                   drafting_ms: float | None = None,
                   suspects: list[str] | tuple[str, ...] = ()) -> tuple[RooflineBlock, str | None]:
    """Refuse a physically impossible roofline: ``(block, None)`` when it holds, else the block with no floor,
    ceiling, fraction of it or impossible bandwidth, and the reason (naming ``suspects``, the inputs to check).

    Impossible: the target's weight bytes over the gemm kernel time, or the KV bytes over the attention kernel
    time, above ``PEAK_TOLERANCE`` x the peak bandwidth; the GEMM FLOPs over the gemm kernel time above
    ``PEAK_TOLERANCE`` x the peak TFLOP/s (a block with its compute floor, :func:`with_compute`); or a floor (the
    larger of memory and compute) longer than ``PEAK_TOLERANCE`` x the whole reference step. A refused block
    states no floor of either kind and no ``bound``; its FLOPs and peak stay, as the bytes do. The bytes themselves stay (they are the inputs to check). When the weights hold a draft of
    unknown size (``draft_bytes_per_step`` None) and the step has drafting kernels (``drafting_ms``), the draft's
    GEMMs run as ``drafting``: the weights are checked against gemm + drafting time, and the gemm bandwidth
    (weights over gemm time alone) is not stated.

    >>> b = step_roofline(weight_bytes_per_step=8e9, peak_bw_gbps=4000, reference_step_ms=3.0, gemm_ms=1.0)
    >>> b2, why = physical_check(b, 4000, gemm_ms=1.0, reference_step_ms=3.0, suspects=["--tp (1, default)"])
    >>> b2.floor_ms, b2.gemm_achieved_bw_gbps, b2.weight_bytes_per_step
    (None, None, 8000000000)
    >>> why
    '8.00 GB of weights per GPU cannot be read in 1.000 ms of gemm kernels at the peak 4,000 GB/s (that takes at least 2.000 ms); check --tp (1, default)'
    """
    if not _pos(peak_bw_gbps):
        return block, None
    problems: list[str] = []
    changes: dict = {}
    target = (block.weight_bytes_per_step or 0) - (block.draft_bytes_per_step or 0)
    if block.draft_bytes_per_step is None and drafting_ms and block.gemm_achieved_bw_gbps is not None and gemm_ms:
        changes["gemm_achieved_bw_gbps"] = None  # (its bytes include the draft's, read by drafting kernels)
        if above_peak(target / ((gemm_ms + drafting_ms) * 1e-3) / 1e9, peak_bw_gbps):
            problems.append(f"{target / 1e9:.2f} GB of weights per GPU (a draft included) cannot be read in "
                            f"{gemm_ms + drafting_ms:.3f} ms of gemm and drafting kernels at the peak "
                            f"{peak_bw_gbps:,.0f} GB/s (that takes at least "
                            f"{target / (peak_bw_gbps * 1e9) * 1e3:.3f} ms)")
    elif above_peak(block.gemm_achieved_bw_gbps, peak_bw_gbps):
        problems.append(f"{target / 1e9:.2f} GB of weights per GPU cannot be read in {gemm_ms:.3f} ms of gemm kernels "
                        f"at the peak {peak_bw_gbps:,.0f} GB/s (that takes at least "
                        f"{target / (peak_bw_gbps * 1e9) * 1e3:.3f} ms)")
        changes["gemm_achieved_bw_gbps"] = None
    kv = block.kv_bytes_per_step or 0
    if above_peak(block.attention_achieved_bw_gbps, peak_bw_gbps):
        problems.append(f"{kv / 1e9:.2f} GB of KV cache per GPU cannot be read in {attention_ms:.3f} ms of attention "
                        f"kernels at the peak {peak_bw_gbps:,.0f} GB/s (that takes at least "
                        f"{kv / (peak_bw_gbps * 1e9) * 1e3:.3f} ms)")
        changes["attention_achieved_bw_gbps"] = None
    peak_tf = block.peak_tflops
    if above_peak(block.gemm_achieved_tflops, peak_tf):
        gemm_flops = block.gemm_achieved_tflops * 1e12 * gemm_ms * 1e-3
        problems.append(f"{gemm_flops / 1e12:.3f} TFLOP of GEMMs per GPU cannot run in {gemm_ms:.3f} ms of gemm "
                        f"kernels at the peak {peak_tf:,.0f} TFLOP/s (that takes at least "
                        f"{gemm_flops / (peak_tf * 1e12) * 1e3:.3f} ms)")
        changes["gemm_achieved_tflops"] = None
    if above_peak(block.fraction_of_ceiling, 1.0) and reference_step_ms:
        if block.bound == "compute":
            problems.append(f"computing {block.flops_per_step / 1e12:.3f} TFLOP per GPU at the peak {peak_tf:,.0f} "
                            f"TFLOP/s takes {block.floor_ms:.3f} ms, longer than the whole {reference_step_ms:.3f} ms "
                            "step")
        else:
            problems.append(f"reading {block.bytes_per_step / 1e9:.2f} GB per GPU at the peak {peak_bw_gbps:,.0f} "
                            f"GB/s takes {block.floor_ms:.3f} ms, longer than the whole {reference_step_ms:.3f} ms "
                            "step")
    if not problems:
        return replace(block, **changes) if changes else block, None
    changes.update(floor_ms=None, ceiling_steps_per_s=None, ceiling_tokens_per_s=None, fraction_of_ceiling=None)
    if block.compute:  # (no floor of either kind is stated; the inputs, FLOPs and peak, stay to be checked)
        changes.update(memory_floor_ms=None, compute_floor_ms=None, bound=None)
    why = "; ".join(problems) + (f"; check {', '.join(suspects)}" if suspects else "")
    return replace(block, **changes), why


def _pos(x: float | None) -> bool:
    return x is not None and math.isfinite(x) and x > 0


def roofline(
    weight_bytes_per_step: int | None,
    peak_bw_gbps: float | None,
    step_ms: float | None,
    tokens_per_step: float | None,
    gemm_ms: float | None,
) -> RooflineBlock:
    """The weight-read floor and what follows from it (weights only; :func:`step_roofline` with
    no KV and no draft; the ``/1`` keys are a subset of its block). Any input None (or not > 0) makes the outputs that depend on it None.

    ``step_ms``: the reference step time (breakdown's; for ``ceiling``, tokens_per_step *
    1000 / measured tok/s). ``gemm_ms``: gemm kernel time per step.

    >>> roofline(4_000_000_000, 4800.0, 1.0, 1.0, 0.9).to_dict()["fraction_of_ceiling"]
    0.8333333333333334
    >>> roofline(None, 4800.0, 1.0, 1.0, 0.9).floor_ms is None
    True
    """
    return step_roofline(weight_bytes_per_step=weight_bytes_per_step, peak_bw_gbps=peak_bw_gbps,
                         reference_step_ms=step_ms, tokens_per_step=tokens_per_step, gemm_ms=gemm_ms)


# --------------------------------------------------------------------------------------
# FLOPs from a model's config (--model) and the dtype its GEMMs run at
# --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class StepFlops:
    """FLOPs ONE GPU does per decode step: ``gemm`` (every weight a token multiplies: 2 x parameters x tokens, the
    routed experts at top-k of E, the embedding table left out unless tied to the lm_head), ``attention`` (scores
    and values over the context; None when the context is unknown), with the notes that say what was assumed."""

    gemm: float | None
    attention: float | None
    tokens: float
    notes: tuple[str, ...] = ()


def model_flops(model, *, tokens: float, context: int | None = None, tp: int = 1, ep: int = 1) -> StepFlops:
    """FLOPs per GPU of one decode step that runs ``tokens`` tokens (batch x tokens verified per sequence) through
    ``model`` (a :class:`tracekit.model.Model`), each attending to ``context`` tokens of KV cache.

    GEMMs: 2 FLOPs per parameter per token, over the parameters the config implies (element counts, whatever the
    checkpoint's quantization): the routed experts count top-k / E of their parameters per token and spread over
    ``max(tp, ep)`` GPUs; the rest as ``tracekit.model.roles`` splits it (``tp``, k/v over ``min(tp, kv_heads)``,
    replicated parts whole); 1-D tensors (norms, biases) and the embedding table (a gather) are left out, a tied
    lm_head counted through it. Attention per token per layer: ``4 x heads/tp x head_dim x context`` (QK^T and
    PV); MLA (absorbed, as decode kernels run it) ``2 x heads/tp x (2 kv_lora_rank + rope_dim) x context``;
    sliding-window and chunked layers over at most their window. Linear-attention / SSM state updates (constant per
    token) and the MTP draft layers are not counted.

    >>> from tracekit.model import model_from_config, load_config
    >>> f = model_flops(model_from_config(load_config("tests/data/configs/Llama-3.1-8B.json")), tokens=1)
    >>> f.gemm == 2 * (8_030_261_248 - 128_256 * 4096 - 65 * 4096), f.attention  # params - embedding - 65 norms
    (True, None)
    """
    import math as _m

    from tracekit.errors import TracekitError
    from tracekit.model import classify
    from tracekit.model.arch import CHUNKED, FULL, SLIDING
    from tracekit.model.synth import tensor_shapes

    a = model.arch
    notes: list[str] = []
    try:
        shapes = [(n, s) for n, s, _ in tensor_shapes(a, include_mtp=False)]
    except TracekitError:  # (Mamba hybrids: the checkpoint's own shapes, where they are not packed integers)
        floats = ("BF16", "F16", "F32", "F8_E4M3", "F8_E5M2")
        if model.source != "safetensors" or any(t.dtype not in floats and len(t.shape) >= 2 for t in model.tensors):
            return StepFlops(None, None, tokens, ("GEMM FLOPs unknown: the config alone does not size this model "
                                                  "and its checkpoint's tensors are packed"))
        shapes = [(t.name, tuple(t.shape)) for t in model.tensors]
    has_head = any(classify(n, len(s), layers=a.layers).group == "lm_head" for n, s in shapes)
    per_token = 0.0
    for name, shape in shapes:
        if len(shape) < 2:
            continue
        r = classify(name, len(shape), layers=a.layers)
        if r.draft:
            continue
        n = float(_m.prod(shape))
        if r.split == "none":
            if r.group == "embedding" and not has_head:
                per_token += n / tp  # tied: the embedding matrix is the vocab-parallel lm_head
            continue
        if r.split == "expert":
            experts = a.experts or 1
            per_token += n * (min(a.top_k, experts) / experts if a.top_k else 1.0) / max(tp, ep)
        elif r.split == "kv":
            per_token += n / (min(tp, a.kv_heads) if a.kv_heads else tp)
        elif r.split in ("tp", "qkv"):
            per_token += n / tp
        else:  # whole: replicated, every GPU computes it
            per_token += n
    gemm = 2.0 * per_token * tokens
    notes.append(f"FLOPs: 2 x {per_token * tp:,.0f} parameters a token multiplies (embedding table excluded"
                 + (f", routed experts at top-{a.top_k} of {a.experts}" if a.experts else "")
                 + f") x {tokens:g} tokens per step" + (f" / tp {tp}" if tp > 1 else ""))
    attention = None
    if context is not None:
        heads = _m.ceil(a.heads / tp) if a.heads else 0
        per_layer = 0.0
        for kind in a.layer_kinds:
            span = context if kind == FULL else min(context, a.sliding_window or context) if kind == SLIDING \
                else min(context, a.chunk_size or context) if kind == CHUNKED else 0
            if a.mla:
                per_layer += 2.0 * heads * (2 * a.kv_lora_rank + a.qk_rope_head_dim) * span
            else:
                per_layer += 4.0 * heads * a.head_dim * span
        attention = per_layer * tokens
        notes.append(f"attention FLOPs: scores and values over {context:,} tokens of context per token")
    if any(k not in (FULL, SLIDING, CHUNKED) for k in a.layer_kinds):
        notes.append("linear-attention/SSM state updates not counted in the FLOPs (constant per token)")
    return StepFlops(gemm=gemm, attention=attention, tokens=float(tokens), notes=tuple(notes))


# quantization_config methods whose weights are dequantized to the activations' dtype (GEMMs at the bf16 rate)
_WEIGHT_ONLY = ("gptq", "awq", "auto-round", "autoround", "bitsandbytes", "gptq_marlin", "awq_marlin", "marlin",
                "hqq", "eetq")


def model_compute_dtype(model) -> tuple[str | None, str]:
    """The dtype a model's GEMMs run at (a dtype name ``tracekit.gpus.PEAK_KEYS`` reads) and how it was told:
    ``--dtype`` when given, else the checkpoint's ``quantization_config`` (fp8; NVFP4 / MXFP4, assumed to run with
    4-bit activations too; GPTQ/AWQ-style weight-only quantization runs at the activations' dtype), else its
    ``torch_dtype``. ``(None, why)`` when it cannot be told.

    >>> from tracekit.model import model_from_config, load_config
    >>> model_compute_dtype(model_from_config(load_config("tests/data/configs/DeepSeek-V3.json")))
    ('fp8', "quantization_config: quant_method 'fp8'")
    """
    if model.dtype:
        return dtype_key(model.dtype), "--dtype"
    a = model.arch
    q = a.quantization or {}
    method = str(q.get("quant_method") or "").lower()
    inner = q.get("quantization") if isinstance(q.get("quantization"), dict) else {}  # (modelopt's nesting)
    algo = str(q.get("quant_algo") or inner.get("quant_algo") or "").lower()
    fmt = str(q.get("format") or "").lower()
    told = f"quantization_config: quant_method {method!r}" + (f", quant_algo {algo!r}" if algo else "") \
        + (f", format {fmt!r}" if fmt else "")
    if "nvfp4" in algo or "nvfp4" in fmt:
        return "nvfp4", told
    if method == "mxfp4" or "mxfp4" in algo or "mxfp4" in fmt:
        return "mxfp4", told
    if method == "fp8" or algo.startswith("fp8") or fmt == "float-quantized":
        return "fp8", told
    base = dtype_key(a.torch_dtype or "bfloat16")
    if method in _WEIGHT_ONLY or fmt == "pack-quantized":
        return base, told + " (weight-only: the GEMMs run at the activations' dtype)"
    if method:
        return None, f"quantization {method!r} is not modelled: the GEMMs' dtype is unknown (pass --peak-tflops)"
    return base, "the config's torch_dtype"


def trace_compute(model, shapes: dict, weight_bytes_source: str | None, *, gpu_name: str | None,
                  tokens: float | None, context: int | None, tp: int = 1, ep: int = 1) -> dict:
    """The compute inputs of breakdown's roofline (keywords of :func:`with_compute`: ``gemm_flops_per_step``,
    ``attention_flops_per_step``, ``peak_tflops``). The FLOPs come from the model (``--model``:
    :func:`model_flops` at ``tokens`` per step, the batch x the tokens each sequence verifies; None when the batch
    is unknown: the compute keys are then null) or, where the weight bytes came from the trace's recorded shapes, from the same shapes
    (``shapes["flops"]``, their dtype ``shapes["weight_dtype"]``); the peak from the GPU table for that dtype."""
    from tracekit.analyses.resolve import peak_tflops

    gemm = attention = kind = None
    if model is not None:
        kind, _ = model_compute_dtype(model)
        if tokens:
            f = model_flops(model, tokens=tokens, context=context, tp=tp, ep=ep)
            gemm, attention = f.gemm, f.attention
    elif weight_bytes_source == "shapes" and shapes.get("flops"):
        gemm, kind = shapes["flops"], shapes.get("weight_dtype")
    peak = peak_tflops(None, gpu_name, kind)[0] if gemm else None
    return {"gemm_flops_per_step": gemm, "attention_flops_per_step": attention, "peak_tflops": peak}


# --------------------------------------------------------------------------------------
# Weight bytes from Kineto op shapes
# --------------------------------------------------------------------------------------

# op -> (index of the weight operand, index of the bias operand or None). aten::mm and
# aten::matmul have no fixed weight slot: the weight is the 2-D operand that is not the
# activation (see _SHAPE_DOC).
_WEIGHT_SLOT = {
    "aten::linear": (1, 2),
    "aten::addmm": (2, 0),
    "aten::mm": (None, None),
    "aten::matmul": (None, None),
}

_SHAPE_DOC = """
Rules, per top-level matmul-like op (an op nested inside another matmul-like op on the
same thread, e.g. the aten::mm under an aten::linear, is skipped so nothing counts twice):
  aten::linear(input, weight, bias)   weight = input 1, bias = input 2 (when given)
  aten::addmm(bias, mat1, mat2)       weight = input 2 (transposed weight), bias = input 0 if 1-D
  aten::mm / aten::matmul(a, b)       the 2-D operand that is not the activation: if only
                                      one operand is 2-D, that one; if both are, the larger
                                      (decode activations are [tokens, hidden]); if none
                                      is 2-D (batched attention matmuls), no weight
Every occurrence counts (each layer's weight is read once per step; the same shape
appears once per layer), then the total is divided by the number of steps.
The same ops give the GEMMs' FLOPs (``detail["flops_per_step"]``): 2 x the activation's rows
(its elements over the reduced dimension) x the weight's elements, per op; and the weights'
dtype (``detail["weight_dtype"]``, the one holding most of their bytes).
"""


def _outermost(df: pl.DataFrame) -> pl.DataFrame:
    """The matmul-like ops not nested in an earlier one of the same thread (aten::linear -> aten::matmul ->
    aten::mm count once): those starting at or after the running max of earlier ends."""
    if {"start", "end", "tid"} <= set(df.columns):
        keys = [c for c in ("pid", "tid") if c in df.columns]
        df = (
            df.sort([*keys, "start", "end"], descending=[False] * len(keys) + [False, True])
            .with_columns(_prev_end=pl.col("end").cum_max().shift(1).over(keys))
            .filter(pl.col("_prev_end").is_null() | (pl.col("start") >= pl.col("_prev_end")))
            .drop("_prev_end")
        )
    return df


def _weight_operands(df: pl.DataFrame) -> pl.DataFrame:
    """``df`` with each op's weight operand (``_w``, its dtype ``_wt``), its bytes (``_wbytes``, with the bias's
    ``_bbytes``) and the FLOPs of the op (``_flops``), from the shape texts (decoded once per distinct pair)."""
    shape_t = pl.List(pl.List(pl.Int64))

    def operand(i: int, prefix: str) -> list[pl.Expr]:
        shape = pl.col("_dims").list.get(i, null_on_oob=True)
        return [
            shape.list.len().alias(f"{prefix}_nd"),
            shape.list.eval(pl.element().cast(pl.Float64)).list.eval(pl.element().product()).list.first().alias(f"{prefix}_n"),
            pl.col("_types").list.get(i, null_on_oob=True).alias(f"{prefix}_t"),
            shape.list.first().cast(pl.Float64).alias(f"{prefix}_first"),
            shape.list.last().cast(pl.Float64).alias(f"{prefix}_last"),
        ]

    # (the operands of each distinct pair of shape texts, joined to its rows: a decode loop repeats a few dozen
    # shapes ten thousand times; no per-row list of lists is made)
    shapes = df.select("input_dims", "input_types").unique().with_columns(
        _dims=pl.col("input_dims").cast(pl.String).str.json_decode(shape_t),
        _types=pl.col("input_types").cast(pl.String).fill_null("[]").str.json_decode(pl.List(pl.String)),
    ).with_columns(*operand(0, "a0"), *operand(1, "a1"), *operand(2, "a2")).drop("_dims", "_types")
    df = df.join(shapes, on=["input_dims", "input_types"], how="left", nulls_equal=True, maintain_order="left")
    name = pl.col("name")
    is_mm = name.is_in(["aten::mm", "aten::matmul"])
    mm_pick1 = (pl.col("a1_nd") == 2) & ((pl.col("a0_nd") != 2) | (pl.col("a1_n") >= pl.col("a0_n")))
    mm_pick0 = (pl.col("a0_nd") == 2) & ~mm_pick1
    w_idx = (
        pl.when(name == "aten::linear").then(pl.lit(1))
        .when(name == "aten::addmm").then(pl.lit(2))
        .when(is_mm & mm_pick1).then(pl.lit(1))
        .when(is_mm & mm_pick0).then(pl.lit(0))
        .otherwise(pl.lit(None, dtype=pl.Int32))
    )
    b_idx = (
        pl.when((name == "aten::linear") & (pl.col("a2_nd") == 1)).then(pl.lit(2))
        .when((name == "aten::addmm") & (pl.col("a0_nd") == 1)).then(pl.lit(0))
        .otherwise(pl.lit(None, dtype=pl.Int32))
    )

    def pick(idx: pl.Expr, field: str) -> pl.Expr:
        return (pl.when(idx == 0).then(pl.col(f"a0_{field}"))
                .when(idx == 1).then(pl.col(f"a1_{field}"))
                .when(idx == 2).then(pl.col(f"a2_{field}")))

    def size(t: pl.Expr) -> pl.Expr:  # (dtype_key, in polars: lower case, no torch./c10:: prefix)
        key = t.str.strip_chars().str.to_lowercase().str.strip_prefix("torch.").str.strip_prefix("c10::")
        return key.replace_strict(DTYPE_BYTES, default=None, return_dtype=pl.Float64)

    df = df.with_columns(_w=w_idx, _b=b_idx)
    df = df.with_columns(
        _wn=pick(pl.col("_w"), "n"), _wt=pick(pl.col("_w"), "t"),
        _bn=pick(pl.col("_b"), "n"), _bt=pick(pl.col("_b"), "t"),
    )
    # the activation operand: linear's input 0, addmm's mat1, mm's other operand; its rows = its elements over the
    # reduced dimension (its last, or its first when the weight is mm's first operand): FLOPs = 2 x rows x weight
    act = (pl.when(name == "aten::linear").then(pl.lit(0)).when(name == "aten::addmm").then(pl.lit(1))
           .when(pl.col("_w") == 1).then(pl.lit(0)).when(pl.col("_w") == 0).then(pl.lit(1))
           .otherwise(pl.lit(None, dtype=pl.Int32)))
    df = df.with_columns(_a=act)
    reduced = pl.when(is_mm & (pl.col("_w") == 0)).then(pick(pl.col("_a"), "first")).otherwise(
        pick(pl.col("_a"), "last"))
    df = df.with_columns(
        _wbytes=pl.col("_wn") * size(pl.col("_wt")),
        _bbytes=(pl.col("_bn") * size(pl.col("_bt"))).fill_null(0.0),
        _flops=2.0 * pick(pl.col("_a"), "n") / pl.when(reduced > 0).then(reduced) * pl.col("_wn"),
    )
    return df


def _per_step(used: pl.DataFrame, n_steps: int | None, detail: dict) -> float:
    """The weight bytes per step: the median over the ``step`` column's steps, else the sum over ``n_steps``;
    sets the step count, FLOPs per step and the per-op bytes per step in ``detail``."""
    if "step" in used.columns:
        per_step = used.group_by("step").agg(pl.col("_bytes").sum(), pl.col("_flops").sum())
        detail["n_steps"] = per_step.height
        value = per_step["_bytes"].median()
        detail["flops_per_step"] = float(per_step["_flops"].median())
        detail["bytes_by_op"] = {k: int(v / per_step.height) for k, v in detail["bytes_by_op"].items()}
    else:
        steps = 1 if n_steps is None else n_steps
        if steps < 1:
            raise ValueError("n_steps must be >= 1")
        detail["n_steps"] = steps
        value = used["_bytes"].sum() / steps
        detail["flops_per_step"] = float(used["_flops"].sum()) / steps
        detail["bytes_by_op"] = {k: int(v / steps) for k, v in detail["bytes_by_op"].items()}
    return value


def weight_bytes_from_shapes(ops: pl.DataFrame, n_steps: int | None = None) -> tuple[int | None, dict]:
    """Weight bytes per decode step from the input shapes of matmul-like torch ops.

    ``ops``: rows of ``Trace.ops`` (columns ``name``, ``input_dims``, ``input_types``,
    and ``pid``/``tid``/``start``/``end`` when nesting must be resolved) covering whole
    decode steps. Either give the ops of the analysed steps with ``n_steps`` = how
    many steps they span, or add a ``step`` column (one id per step, null = outside):
    then bytes are summed per step and the median step is reported (robust to a
    partial first/last step). Returns ``(bytes_per_step | None, detail)``; ``detail``
    says how many ops and weights were used and why the result is None when it is.
    """
    detail: dict = {"method": "shapes", "ops": 0, "weights": 0, "n_steps": None,
                    "bytes_by_op": {}, "skipped_ops": 0, "reason": None}
    need = {"name", "input_dims", "input_types"}
    if ops is None or ops.height == 0 or not need <= set(ops.columns):
        detail["reason"] = "no matmul-like ops with recorded shapes in the trace"
        return None, detail
    df = ops.filter(pl.col("name").is_in(list(_WEIGHT_SLOT)) & pl.col("input_dims").is_not_null())
    if "step" in df.columns:
        df = df.filter(pl.col("step").is_not_null())
    if df.height == 0:
        detail["reason"] = "no matmul-like ops with recorded shapes (record the torch trace with record_shapes=True)"
        return None, detail

    df = _weight_operands(_outermost(df))
    used = df.filter(pl.col("_wbytes").is_not_null())
    detail["ops"] = df.height
    detail["weights"] = used.height
    detail["skipped_ops"] = df.height - used.height
    unknown = df.filter(pl.col("_w").is_not_null() & pl.col("_wbytes").is_null())["_wt"].unique().drop_nulls().to_list()
    if unknown:
        detail["unknown_dtypes"] = sorted(unknown)
    if used.height == 0:
        detail["reason"] = "no weight operand with a known shape and dtype among the matmul-like ops"
        return None, detail
    used = used.with_columns(_bytes=pl.col("_wbytes") + pl.col("_bbytes"), _flops=pl.col("_flops").fill_null(0.0))
    # the weights' dtype (the one holding most of their bytes): the peak their GEMMs run at
    by_type = used.group_by("_wt").agg(pl.col("_wbytes").sum()).sort("_wbytes", descending=True)
    detail["weight_dtype"] = dtype_key(by_type["_wt"][0]) if by_type.height else None
    if {"pid", "tid", "start", "end"} <= set(used.columns):  # where the counted ops ran (shape_coverage reads it)
        detail["intervals"] = used.select("pid", "tid", "start", "end")
    detail["bytes_by_op"] = {
        r["name"]: int(r["_bytes"]) for r in used.group_by("name").agg(pl.col("_bytes").sum()).to_dicts()
    }

    value = _per_step(used, n_steps, detail)
    return int(round(value)), detail


weight_bytes_from_shapes.__doc__ += _SHAPE_DOC  # type: ignore[operator]

# Weight bytes from recorded shapes are used only when the ops they come from launched at least this share of the
# step's GEMM kernel time (docs/roofline.md, "Weight bytes from a Kineto trace").
SHAPE_COVERAGE = 0.8


def shape_coverage(gemm: pl.DataFrame, launches: pl.DataFrame, intervals: pl.DataFrame | None) -> float | None:
    """The share of GEMM kernel time launched from inside an op whose weight shape was counted.

    ``gemm``: the steps' GEMM kernels (``pid``, ``correlation``, ``dur``); ``launches``: ``Trace.launches``;
    ``intervals``: the counted ops (``pid``, ``tid``, ``start``, ``end``; disjoint per thread, as
    :func:`weight_bytes_from_shapes` leaves them). A kernel replayed from a CUDA graph was launched by the graph
    launch, not by the op that captured it: it is not covered. None when the steps have no GEMM time.

    >>> g = pl.DataFrame({"pid": [1, 1], "correlation": [10, 11], "dur": [300, 100]})
    >>> l = pl.DataFrame({"pid": [1, 1], "tid": [2, 2], "correlation": [10, 11], "start": [5, 50]})
    >>> shape_coverage(g, l, pl.DataFrame({"pid": [1], "tid": [2], "start": [0], "end": [10]}))
    0.75
    """
    total = float(gemm["dur"].sum() or 0) if gemm.height else 0.0
    if total <= 0:
        return None
    if intervals is None or intervals.height == 0:
        return 0.0
    keys = ["pid", "correlation"]
    # (only the launches of these kernels are made unique: not a hash table of every launch of the trace)
    mine = launches.select(*keys, "tid", ls="start").join(gemm.select(keys).unique(), on=keys, how="semi")
    g = gemm.select("pid", "correlation", "dur").join(mine.unique(keys), on=keys, how="inner").sort("ls")
    iv = intervals.select("pid", "tid", os="start", oe="end").sort("os")
    j = g.join_asof(iv, left_on="ls", right_on="os", by=["pid", "tid"], strategy="backward", check_sortedness=False)
    covered = float(j.filter(pl.col("oe").is_not_null() & (pl.col("ls") <= pl.col("oe")))["dur"].sum() or 0)
    return covered / total


# --------------------------------------------------------------------------------------
# Weight bytes from SGLang layer-wise NVTX text
# --------------------------------------------------------------------------------------

# Modules whose parameters a decode step does not stream as weights: the token embedding
# is a gather of `batch` rows, not a read of the table. (A tied lm_head reads it in full,
# but SGLang's lm_head has no forward call of its own, so it never gets a range.)
_EMBEDDING = re.compile(r"(^|\.)(embed_tokens|embed_in|embeddings?|wte|wpe|tok_embeddings|word_embeddings)$")
_MODULE = re.compile(r"'Module':\s*'([^']*)'")
_PARAMS = re.compile(r"'TrainableParams':\s*(\{[^{}]*\})")


def _module_params(text: str) -> tuple[str, dict[str, list[int]], bool] | None:
    """(module name, {param: shape}, is_embedding) from one SGLang NVTX range text."""
    if "'TrainableParams'" not in text:
        return None
    m, p = _MODULE.search(text), _PARAMS.search(text)
    if not m or not p:
        return None
    try:
        params = ast.literal_eval(p.group(1))
    except (ValueError, SyntaxError):
        return None
    if not isinstance(params, dict):
        return None
    module = m.group(1)
    is_emb = bool(_EMBEDDING.search(module)) or "'num_embeddings'" in text
    return module, params, is_emb


def weight_bytes_from_nvtx(
    range_names: pl.Series,
    *,
    n_steps: int | None = None,
    dtype: str = "bf16",
    param_dtypes: dict[str, str] | None = None,
) -> int | None:
    """Weight bytes per decode step from SGLang's layer-wise NVTX text, or None.

    See :func:`weight_bytes_from_nvtx_detail` (same arguments), which also says what
    was counted and why the result is None when it is.
    """
    return weight_bytes_from_nvtx_detail(range_names, n_steps=n_steps, dtype=dtype, param_dtypes=param_dtypes)[0]


def weight_bytes_from_nvtx_detail(
    range_names: pl.Series,
    *,
    n_steps: int | None = None,
    dtype: str = "bf16",
    param_dtypes: dict[str, str] | None = None,
) -> tuple[int | None, dict]:
    """Weight bytes per decode step from SGLang's layer-wise NVTX range text.

    Each text is the ``str()`` of a dict such as ``{'Module': 'top.model.layers.0.mlp.
    down_proj', 'TrainableParams': {'weight': [4096, 11008]}, 'Inputs': [[1, 11008]], ...}``
    (``sglang/srt/utils/nvtx_pytorch_hooks.py``; ``TrainableParams`` are the module's own
    parameters, ``recurse=False``, so nothing counts twice up the module tree).
    Parameters are elements x ``dtype`` bytes (the text carries no dtype; default bf16;
    ``param_dtypes`` overrides by parameter name, e.g. ``{'qweight': 'int32'}``).
    Embedding modules are excluded.

    Without ``n_steps``: each distinct module counts once (one forward per module per
    step). With ``n_steps``: every range counts and the sum is divided by ``n_steps``
    (use it when a module runs several times per step, e.g. a draft model's forwards).
    GPTQ/AWQ packed ``qweight``/``qzeros``/``g_idx`` are int32 unless overridden.
    Returns ``(bytes | None, detail)``.
    """
    detail: dict = {"method": "nvtx", "modules": 0, "ranges": 0, "excluded_embedding": [], "reason": None}
    if range_names is None or len(range_names) == 0:
        detail["reason"] = "no NVTX ranges"
        return None, detail
    counts = (
        range_names.drop_nulls().filter(range_names.drop_nulls().str.contains("'TrainableParams'", literal=True))
        .value_counts(name="n")
    )
    col = counts.columns[0]
    overrides = {**{"qweight": "int32", "qzeros": "int32", "g_idx": "int32"}, **(param_dtypes or {})}
    default_size = dtype_bytes(dtype)
    per_module: dict[str, float] = {}
    occurrences: dict[str, int] = {}
    for text, n in zip(counts[col].to_list(), counts["n"].to_list()):  # distinct texts only: small
        parsed = _module_params(text)
        if parsed is None:
            continue
        module, params, is_emb = parsed
        if is_emb:
            if module not in detail["excluded_embedding"]:
                detail["excluded_embedding"].append(module)
            continue
        b = 0.0
        for pname, shape in params.items():
            if not isinstance(shape, (list, tuple)) or not all(isinstance(d, int) for d in shape):
                continue
            size = dtype_bytes(overrides[pname]) if pname in overrides else default_size
            b += math.prod(shape) * size
        per_module[module] = b
        occurrences[module] = occurrences.get(module, 0) + int(n)
    if not per_module:
        detail["reason"] = "no NVTX range carries module parameters (SGLang --enable-layerwise-nvtx-marker)"
        return None, detail
    detail["modules"] = len(per_module)
    detail["ranges"] = sum(occurrences.values())
    if n_steps is None:
        total = sum(per_module.values())
    else:
        if n_steps < 1:
            raise ValueError("n_steps must be >= 1")
        total = sum(per_module[m] * occurrences[m] for m in per_module) / n_steps
    detail["n_steps"] = n_steps
    if total <= 0:
        detail["reason"] = "module parameters sum to 0 bytes"
        return None, detail
    return int(round(total)), detail
