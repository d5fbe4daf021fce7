"""``tracekit ceiling``: how fast could decode be, before any trace? (schema ``tracekit.ceiling/1``)

The trace-free roofline: the bytes each GPU must read per decode step (weights / tp,
plus draft weights x draft forwards, plus KV cache reads when given) over the GPU's
peak memory bandwidth gives the memory floor per step; the FLOPs it must do (2 x the
parameters a token multiplies x the tokens the step runs, + attention over the context,
/ tp) over the GPU's dense peak TFLOP/s for the weights' dtype gives the compute floor.
The floor is the larger of the two (``bound`` says which); the tok/s ceiling follows it.
The arithmetic is ``tracekit.analyses.roofline`` (the same code as breakdown's ``roofline``
block).

    tracekit ceiling --gpu "RTX A6000" --params 27e9 --dtype fp8 --tp 2 --accept-len 3.2
    tracekit ceiling --gpu H200 --model ~/.cache/huggingface/hub/models--Qwen--Qwen3-8B --tp 2 \
        --batch 8 --context 8192          # weights from the safetensors headers, KV from the config

:func:`ceiling` is the library call (``tracekit.ceiling``); the command is ``tracekit.cli.ceiling`` and the
renderers ``tracekit.report.ceiling``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from tracekit.contract import CEILING_SCHEMA, Block
from tracekit.errors import BadModelConfig, BadOptionValue, ConflictingOptions, MissingOption, UnknownGpu
from tracekit.model.units import DTYPES, dtype_key  # noqa: F401  (DTYPES: the dtypes of --params / --dtype / --kv-dtype)

if TYPE_CHECKING:  # (annotations only: `tracekit ceiling` imports no polars)
    from tracekit.analyses.roofline import RooflineBlock
    from tracekit.model.checkpoint import Model

SCHEMA = CEILING_SCHEMA  # "tracekit.ceiling/1" (tracekit.contract names it once)


@dataclass(frozen=True)
class CeilingGpu(Block):
    """``gpu``: the GPU (its table name, or the name given) and its peak bandwidth, with where that came from."""

    name: str
    peak_bw_gbps: float
    peak_bw_source: str


@dataclass(frozen=True)
class Ceiling(Block):
    """Everything ``tracekit ceiling`` reports (a :class:`tracekit.contract.Block`: ``to_dict()`` is the JSON, written
    by the one serialiser). ``summary`` is the plain sentence ('ceiling 84 tok/s; you are at 65% of it');
    ``roofline`` the breakdown/3 roofline figures of the same bytes (the memory roofline: its ``floor_ms`` is the
    memory floor; the top-level ``floor_ms`` is the larger of it and ``compute_floor_ms``). ``bytes_breakdown`` (weights, draft, kv),
    ``inputs`` (the inputs as resolved), ``model`` (the model's summary) and ``step``
    (``tracekit.model.StepBytes.to_dict()`` with ``--model``) are reports of their inputs, kept as plain dicts."""

    SCHEMA = CEILING_SCHEMA

    gpu: CeilingGpu
    bytes_per_step_per_gpu: int
    floor_ms: float
    ceiling_steps_per_s: float
    tokens_per_step: float
    ceiling_tokens_per_s: float
    measured_tokens_per_s: float | None
    fraction_of_ceiling: float | None
    peak_tflops: float | None
    peak_tflops_source: str | None
    flops_per_step_per_gpu: float | None
    memory_floor_ms: float | None
    compute_floor_ms: float | None
    bound: str | None
    assumptions: tuple[str, ...]
    summary: str
    bytes_breakdown: dict = field(default_factory=dict)
    inputs: dict = field(default_factory=dict)
    model: dict | None = None
    roofline: RooflineBlock | None = None
    step: dict | None = None

    @property
    def gpu_name(self) -> str:
        return self.gpu.name

    @property
    def peak_bw_gbps(self) -> float:
        return self.gpu.peak_bw_gbps

    @property
    def peak_bw_source(self) -> str:
        return self.gpu.peak_bw_source


def _summary(gpu: CeilingGpu, r: RooflineBlock) -> str:
    """The plain sentence: 'ceiling 84 tok/s; you are at 65% of it', naming compute where it bounds the step."""
    head = f"ceiling {_tok(r.ceiling_tokens_per_s)} tok/s"
    compute = r.bound == "compute"
    if r.fraction_of_ceiling is None:
        rate = f"{_num(r.ceiling_steps_per_s)} steps/s x {_num(r.tokens_per_step)} tokens/step) on {gpu.name}"
        if compute:
            return (f"{head} ({rate}: compute-bound at {_num(r.peak_tflops)} TFLOP/s ({r.compute_floor_ms:.3g} ms "
                    f"of FLOPs per step against {r.memory_floor_ms:.3g} ms of memory reads)")
        return f"{head} ({rate} at {_num(gpu.peak_bw_gbps)} GB/s"
    pct = r.fraction_of_ceiling * 100
    s = f"{head}{' (compute-bound)' if compute else ''}; you are at {pct:.0f}% of it"
    if r.fraction_of_ceiling > 1.0:
        s += (" (above the ceiling: check the weight bytes, the peak bandwidth"
              + (", the peak TFLOP/s" if compute else "") + " and the accept length)")
    return s


def _num(x: float) -> str:
    if x is None:
        return "-"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.4g}"


def _tok(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 10 else f"{x:.3g}"


def ceiling(
    *,
    gpu: str | None = None,
    weight_bytes: float | None = None,
    params: float | None = None,
    dtype: str | None = None,
    model: str | Path | dict | Model | None = None,
    model_config: str | Path | dict | None = None,
    tp: int = 1,
    ep: int = 1,
    accept_len: float | None = None,
    draft_bytes: float = 0,
    draft_forwards: float = 0,
    draft_sharded: bool = True,
    batch: int = 1,
    kv_bytes_per_token: float | None = None,
    context: int = 0,
    kv_dtype: str | None = None,
    peak_bw: float | None = None,
    peak_tflops: float | None = None,
    measured_tok_s: float | None = None,
) -> Ceiling:
    """The trace-free roofline, bytes per GPU.

    Weights: ``weight_bytes`` (the bytes a step reads summed over all GPUs, lm_head included,
    embedding excluded; divided by ``tp``), or ``params`` x ``dtype`` (default bf16), or
    ``model`` (a model directory / HF snapshot / ``config.json`` path, a config dict or a
    :class:`tracekit.model.Model`: per-tensor bytes, MoE experts read at ``batch``, MTP layers
    x ``draft_forwards``, the KV cache at ``context``). With ``model`` and ``weight_bytes``
    the flag replaces only the target's weights term. ``model_config`` is the older name of
    ``model``. Compute: ``peak_tflops`` (default: the GPU table's dense peak for the weights' dtype);
    the FLOPs come from ``params`` or ``model`` (none from ``weight_bytes`` alone). Raises
    ``TracekitError`` on unusable input.

    >>> c = ceiling(gpu="NVIDIA RTX A6000", params=27e9, dtype="fp8", tp=2, accept_len=3.2)
    >>> c.bytes_per_step_per_gpu, round(c.floor_ms, 2), round(c.ceiling_tokens_per_s)
    (13500000000, 17.58, 182)
    >>> [(c.bound, round(c.floor_ms, 2)) for b in (1, 512)
    ...  for c in [ceiling(gpu="H100", params=8e9, dtype="bf16", batch=b)]]   # 8B bf16 on an H100 SXM
    [('memory', 4.78), ('compute', 8.28)]
    """
    # (imported here: `tracekit ceiling --help` and the capture-only GPU host need no polars)
    from tracekit.analyses import resolve
    from tracekit.analyses.roofline import with_compute

    model, kv_flag = _check_options(model=model, model_config=model_config, weight_bytes=weight_bytes, params=params,
                                    dtype=dtype, tp=tp, ep=ep, batch=batch, accept_len=accept_len,
                                    measured_tok_s=measured_tok_s, draft_bytes=draft_bytes,
                                    draft_forwards=draft_forwards, context=context, kv_dtype=kv_dtype,
                                    kv_bytes_per_token=kv_bytes_per_token)

    rb, assumptions = _bytes(tp=tp, ep=ep, weight_bytes=weight_bytes, params=params, dtype=dtype, model=model,
                             kv_dtype=kv_dtype, batch=batch, context=context, kv_flag=kv_flag,
                             kv_bytes_per_token=kv_bytes_per_token, draft_forwards=draft_forwards,
                             draft_bytes=draft_bytes, draft_sharded=draft_sharded)
    wbytes_gpu = rb.target_bytes_per_step or 0
    draft_gpu = rb.draft_bytes_per_step or 0
    kv_step = rb.kv_bytes_per_step
    inputs = _inputs(rb, tp=tp, ep=ep, batch=batch, accept_len=accept_len, dtype=dtype, weight_bytes=weight_bytes,
                     params=params, model_given=model is not None, draft_bytes=draft_bytes,
                     draft_forwards=draft_forwards, draft_sharded=draft_sharded,
                     kv_bytes_per_token=kv_bytes_per_token, context=context)
    total = int(round(wbytes_gpu)) + int(draft_gpu) + int(kv_step or 0)
    breakdown = {"weights": int(round(wbytes_gpu)), "draft": int(draft_gpu), "kv": int(kv_step or 0)}

    name, bw, source = _bandwidth(gpu, peak_bw, assumptions)

    tps = resolve.tokens_per_step(flag=batch, accept_len=accept_len).value
    step_ms = tps * 1000.0 / measured_tok_s if measured_tok_s is not None else None
    r = rb.roofline(peak_bw_gbps=bw, reference_step_ms=step_ms, tokens_per_step=tps)
    if r.draft_bytes_per_step is None:  # (ceiling states a draft of 0 bytes; breakdown leaves it unknown)
        r = replace(r, draft_bytes_per_step=0)
    assert r.bytes_per_step == total
    # compute: the FLOPs of the tokens the target runs (a verify forward runs draft forwards + 1 per sequence)
    ran = float(batch * (int(draft_forwards) + 1)) if draft_forwards else tps
    flops, peak = _compute_inputs(rb, params=params, dtype=dtype, model_given=model is not None, tokens=ran, tp=tp,
                                  ep=ep, context=context, gpu=gpu, peak_tflops=peak_tflops, assumptions=assumptions)
    memory = r  # (the ``roofline`` block: the breakdown/3 figures of these bytes alone)
    r = with_compute(r, gemm_flops_per_step=flops[0], attention_flops_per_step=flops[1], peak_tflops=peak[0],
                     reference_step_ms=step_ms)
    assumptions.append(_compute_line(r, peak))
    assumptions.append(f"tokens per step = {'accept length ' + format(accept_len, 'g') if accept_len else '1 (no speculation)'}"
                       f" x batch {batch}")
    g = CeilingGpu(name=name, peak_bw_gbps=bw, peak_bw_source=source)
    return Ceiling(
        gpu=g, bytes_per_step_per_gpu=int(r.bytes_per_step), floor_ms=r.floor_ms,
        ceiling_steps_per_s=r.ceiling_steps_per_s, tokens_per_step=r.tokens_per_step,
        ceiling_tokens_per_s=r.ceiling_tokens_per_s,
        measured_tokens_per_s=float(measured_tok_s) if measured_tok_s is not None else None,
        fraction_of_ceiling=r.fraction_of_ceiling, peak_tflops=r.peak_tflops,
        peak_tflops_source=peak[1] if r.peak_tflops is not None else None, flops_per_step_per_gpu=r.flops_per_step,
        memory_floor_ms=r.memory_floor_ms, compute_floor_ms=r.compute_floor_ms, bound=r.bound,
        assumptions=tuple(assumptions), summary=_summary(g, r), bytes_breakdown=breakdown, inputs=inputs,
        model=rb.model.summary() if rb.model is not None else None, roofline=memory,
        step=rb.step.to_dict() if rb.step is not None else None,
    )


def _bytes(*, tp, ep, weight_bytes, params, dtype, model, kv_dtype, batch, context, kv_flag, kv_bytes_per_token,
           draft_forwards, draft_bytes, draft_sharded):
    """The bytes a step reads per GPU (weights, draft, KV), through the resolver breakdown uses, and the
    assumptions stated so far (the memory model's, then the resolver's). Raises when the weights come to 0."""
    from tracekit.analyses.bytes import resolve_bytes
    from tracekit.analyses.resolve import resolve_tp

    assumptions: list[str] = [
        "memory: every byte counted is read once per step from DRAM at the GPU's datasheet peak "
        "bandwidth (kernels reach about 80-90% of it, so the real floor is higher)",
        "communication ignored" + (f" (tensor parallelism {tp} adds all-reduces on top)" if tp > 1 else ""),
        "kernel launch overhead, host gaps and scheduling ignored (CUDA graphs come closest)",
        "activation bytes ignored",
    ]
    # the bytes: one resolver, the same as breakdown's (a verify forward of K+1 tokens routes the MoE experts)
    rb = resolve_bytes(parallel=resolve_tp(flag=tp, ep=ep), weight_bytes=weight_bytes, params=params, dtype=dtype,
                       model=model, kv_dtype=kv_dtype, batch=batch, context=(context or None) if model is not None
                       else context, kv_bytes_per_token=kv_bytes_per_token if kv_flag else None,
                       draft_forwards=draft_forwards or 0,
                       verify_tokens=int(draft_forwards) + 1 if draft_forwards and not draft_bytes else 1,
                       draft_bytes=draft_bytes or 0, draft_sharded=draft_sharded)
    assumptions += list(rb.assumptions)
    if rb.kv_bytes_per_step is None:
        assumptions.append("KV cache reads not counted (give --context with --model, or --kv-bytes-per-token "
                           "and --context)")
    if not rb.draft_bytes_per_step:
        assumptions.append("no draft model weights counted")
    if (rb.target_bytes_per_step or 0) <= 0:
        raise BadModelConfig("the model's weights come to 0 bytes per step: check --model")
    return rb, assumptions


def _check_options(*, model, model_config, weight_bytes, params, dtype, tp, ep, batch, accept_len, measured_tok_s,
                   draft_bytes, draft_forwards, context, kv_dtype, kv_bytes_per_token):
    """Check :func:`ceiling`'s options together (one way to give the weights, ranges, dtypes, the KV pair);
    returns the model (``model_config`` is its older name) and whether the KV term comes from the flags."""
    from tracekit.model.units import dtype_bytes

    if model is None:
        model = model_config
    elif model_config is not None:
        raise ConflictingOptions("give --model or --model-config, not both")
    if params is not None and (weight_bytes is not None or model is not None):
        raise MissingOption("give exactly one of --weight-bytes N, --params N (with --dtype) or --model PATH "
                            "(--weight-bytes may go with --model: it replaces the weights term)")
    if weight_bytes is None and params is None and model is None:
        raise MissingOption("give exactly one of --weight-bytes N, --params N (with --dtype) or --model PATH")
    if tp < 1 or ep < 1:
        raise BadOptionValue(f"--tp and --ep must be >= 1, got --tp {tp} --ep {ep}")
    if batch < 1:
        raise BadOptionValue(f"--batch must be >= 1, got {batch}")
    if accept_len is not None and not (math.isfinite(accept_len) and accept_len > 0):
        raise BadOptionValue(f"--accept-len must be > 0 (mean tokens accepted per step), got {accept_len}")
    if measured_tok_s is not None and not (math.isfinite(measured_tok_s) and measured_tok_s > 0):
        raise BadOptionValue(f"--measured-tok-s must be > 0, got {measured_tok_s}")
    if (draft_bytes or 0) > 0 and not (draft_forwards or 0) > 0:
        raise ConflictingOptions("--draft-bytes needs --draft-forwards K (draft forward passes per step)")
    if context is None or context < 0:
        raise BadOptionValue(f"--context must be >= 0, got {context}")
    try:
        dtype_bytes(dtype or "bf16")
        if kv_dtype:
            dtype_bytes(kv_dtype)  # validated here; tracekit.model applies it
    except ValueError as e:
        raise BadOptionValue(str(e)) from e
    kv_flag = kv_bytes_per_token is not None or (context and model is None)
    if kv_flag:
        kv = float(kv_bytes_per_token or 0)
        if (kv > 0) != (bool(context) and context > 0):
            raise ConflictingOptions("KV reads need both --kv-bytes-per-token N and --context L"
                                + (" (or --model PATH with --context)" if model is None else ""))
    return model, kv_flag


def _inputs(rb, *, tp, ep, batch, accept_len, dtype, weight_bytes, params, model_given: bool, draft_bytes,
            draft_forwards, draft_sharded, kv_bytes_per_token, context) -> dict:
    """The ``inputs`` block: the options as given, and the weight bytes summed over GPUs from whichever source
    resolved them (the flag, ``params`` x ``dtype``, or the model's target weights)."""
    from tracekit.model.units import dtype_bytes

    wbytes_gpu = rb.target_bytes_per_step or 0
    inputs: dict = {"tp": tp, "ep": ep, "batch": batch, "accept_len": accept_len,
                    "dtype": dtype if (model_given or params is not None) else None,
                    "weight_bytes": None, "weight_bytes_source": rb.weight_bytes_source, "params": None,
                    "draft_bytes": draft_bytes or 0, "draft_forwards": draft_forwards or 0,
                    "draft_sharded": draft_sharded, "kv_bytes_per_token": None, "kv_bytes_source": rb.kv_bytes_source,
                    "context": context or 0}
    if rb.weight_bytes_source == "flag":
        inputs["weight_bytes"] = int(round(weight_bytes))
    elif rb.weight_bytes_source == "params":
        inputs.update(params=params, dtype=dtype or "bf16", weight_bytes=int(round(float(params)
                                                                                   * dtype_bytes(dtype or "bf16"))))
    else:  # the model's target weights, summed over GPUs
        inputs["weight_bytes"] = int(round(wbytes_gpu * tp))
    if rb.kv_bytes_source == "flag":
        inputs["kv_bytes_per_token"] = int(kv_bytes_per_token)
    return inputs


def _bandwidth(gpu, peak_bw, assumptions: list[str]) -> tuple[str, float, str]:
    """The GPU's name, peak bandwidth (GB/s) and its source (the flag or the GPU table; the resolver breakdown
    uses); a multi-die package adds its assumption line. Raises when neither gives a bandwidth."""
    from tracekit.analyses import resolve
    from tracekit.gpus import list_gpus, lookup

    spec = lookup(gpu) if gpu else None
    found = resolve.peak_bandwidth(flag=peak_bw, name=gpu)  # (the resolvers breakdown uses)
    bw, source = found.value, found.source
    if bw is None:
        if not gpu:
            raise MissingOption("give --gpu NAME (see docs/roofline.md for the table) or --peak-bw GBPS")
        known = ", ".join(s.name for s in list_gpus()[:6])
        raise UnknownGpu(f"unknown GPU {gpu!r}: pass its peak memory bandwidth with --peak-bw GBPS "
                            f"(the table knows e.g. {known}, ...)")
    name = spec.name if spec is not None else (gpu or "custom")
    if spec is not None and spec.devices_per_package > 1 and source == "table":
        assumptions.append(f"{spec.name}: one device = one of {spec.devices_per_package} dies, "
                           f"{spec.device_bw_gbps:g} GB/s each")
    return name, bw, source


def _compute_inputs(rb, *, params, dtype, model_given: bool, tokens: float, tp: int, ep: int, context, gpu,
                    peak_tflops, assumptions: list[str]) -> tuple[tuple[float | None, float | None],
                                                                   tuple[float | None, str | None, str | None,
                                                                         str | None]]:
    """``((gemm FLOPs, attention FLOPs), (peak TFLOP/s, its source, the dtype, the table's key))`` per GPU per step, from
    ``--params`` (x tokens, dense) or the model (``tracekit.analyses.roofline.model_flops``); what was assumed goes
    to ``assumptions``."""
    from tracekit.analyses.resolve import peak_tflops as resolve_peak_tflops
    from tracekit.analyses.roofline import model_compute_dtype, model_flops
    from tracekit.gpus import WEIGHT_ONLY

    gemm = attention = None
    kind = None
    if params is not None:
        kind = dtype or "bf16"
        gemm = 2.0 * float(params) * tokens / tp
        assumptions.append(f"FLOPs: 2 x {float(params):,.0f} parameters x {tokens:g} tokens per step"
                           + (f" / tp {tp}" if tp > 1 else "") + " (a dense model: every parameter multiplies every "
                           "token; attention FLOPs not counted)")
    elif model_given and rb.model is not None:
        kind, told = model_compute_dtype(rb.model)
        f = model_flops(rb.model, tokens=tokens, context=context or None, tp=tp, ep=ep)
        gemm, attention = f.gemm, f.attention
        assumptions.extend(f.notes)
        assumptions.append(f"the GEMMs run at the {kind or 'unknown'} rate ({told})")
    if kind is not None and dtype_key(kind) in WEIGHT_ONLY:
        assumptions.append(f"{kind}: weight-only quantization assumed (dequantized to bf16: the GEMMs run at the "
                           "bf16 rate)")
    if kind is not None and dtype_key(kind) in ("nvfp4", "mxfp4"):
        assumptions.append(f"{kind}: the GEMMs run at the FP4 tensor-core rate (4-bit activations too)")
    value, source, key = resolve_peak_tflops(peak_tflops, gpu, kind)
    return (gemm, attention), (value, source, kind, key)


def _compute_line(r: RooflineBlock, peak: tuple) -> str:
    """The assumption that states the compute floor, or why there is none."""
    from tracekit.gpus import WEIGHT_ONLY

    if r.compute_floor_ms is not None:
        at = f"the given peak {r.peak_tflops:,.4g} TFLOP/s (--peak-tflops)" if peak[1] == "flag" else \
            f"the dense {peak[2]} peak {r.peak_tflops:,.4g} TFLOP/s (table)"
        if peak[1] == "table" and peak[3] == "bf16" and dtype_key(peak[2]) not in ("bf16", "bfloat16", *WEIGHT_ONLY):
            at = (f"the dense bf16 peak {r.peak_tflops:,.4g} TFLOP/s (table: this GPU has no {peak[2]} tensor-core "
                  "figure, so the weights are taken as dequantized to bf16)")
        return (f"compute: {r.flops_per_step / 1e12:.4g} TFLOP per step per GPU at {at} = "
                f"{r.compute_floor_ms:.3f} ms; the floor is the larger of "
                f"it and the {r.memory_floor_ms:.3f} ms memory floor: {r.bound}-bound"
                + (" (GEMMs reach about 70-80% of the datasheet peak, so the real floor is higher)"
                   if r.bound == "compute" else ""))
    if r.flops_per_step is None:
        return "compute not bounded: the FLOPs need the parameters (--params N or --model PATH, not --weight-bytes)"
    if peak[2] is None:
        return "compute not bounded: the dtype the GEMMs run at is unknown (pass --peak-tflops TFLOPS)"
    return (f"compute not bounded: no dense {peak[2]} peak for this GPU in the table (pass --peak-tflops TFLOPS; "
            "docs/roofline.md lists the table)")
