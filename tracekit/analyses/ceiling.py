"""``tracekit ceiling``: how fast could decode be, before any trace? (schema ``tracekit.ceiling/1``)

The trace-free roofline: the bytes each GPU must read per decode step (weights / tp,
plus draft weights x draft forwards, plus KV cache reads when given) over the GPU's
peak memory bandwidth gives the floor per step and the tok/s ceiling. The arithmetic
is ``tracekit.analyses.roofline`` (the same code as breakdown's ``roofline`` block).

    tracekit ceiling --gpu "RTX A6000" --params 27e9 --dtype fp8 --tp 2 --accept-len 3.2

:func:`ceiling` is the library call and returns a :class:`Ceiling`; ``tracekit.report.ceiling``
renders it and ``tracekit.cli.ceiling`` is the command.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from tracekit.errors import TracekitError
from tracekit.report._fmt import sig as _num

SCHEMA = "tracekit.ceiling/1"
DTYPES = ("bf16", "fp16", "fp32", "fp8", "int8", "int4")


@dataclass(frozen=True)
class Ceiling:
    """Everything ``tracekit ceiling`` reports; ``to_dict()`` is the JSON."""

    gpu_name: str
    peak_bw_gbps: float
    peak_bw_source: str
    bytes_per_step_per_gpu: int
    floor_ms: float
    ceiling_steps_per_s: float
    tokens_per_step: float
    ceiling_tokens_per_s: float
    measured_tokens_per_s: float | None
    fraction_of_ceiling: float | None
    assumptions: list[str]
    bytes_breakdown: dict = field(default_factory=dict)
    inputs: dict = field(default_factory=dict)
    model: dict | None = None

    @property
    def summary(self) -> str:
        """The plain sentence: 'ceiling 84 tok/s; you are at 65% of it'."""
        head = f"ceiling {_tok(self.ceiling_tokens_per_s)} tok/s"
        if self.fraction_of_ceiling is None:
            return (f"{head} ({_num(self.ceiling_steps_per_s)} steps/s x {_num(self.tokens_per_step)} tokens/step) "
                    f"on {self.gpu_name} at {_num(self.peak_bw_gbps)} GB/s")
        pct = self.fraction_of_ceiling * 100
        s = f"{head}; you are at {pct:.0f}% of it"
        if self.fraction_of_ceiling > 1.0:
            s += " (above the ceiling: check the weight bytes, the peak bandwidth and the accept length)"
        return s

    def to_dict(self) -> dict:
        return {
            "schema": SCHEMA,
            "gpu": {"name": self.gpu_name, "peak_bw_gbps": self.peak_bw_gbps, "peak_bw_source": self.peak_bw_source},
            "bytes_per_step_per_gpu": self.bytes_per_step_per_gpu,
            "floor_ms": self.floor_ms,
            "ceiling_steps_per_s": self.ceiling_steps_per_s,
            "tokens_per_step": self.tokens_per_step,
            "ceiling_tokens_per_s": self.ceiling_tokens_per_s,
            "measured_tokens_per_s": self.measured_tokens_per_s,
            "fraction_of_ceiling": self.fraction_of_ceiling,
            "assumptions": list(self.assumptions),
            "summary": self.summary,
            "bytes_breakdown": dict(self.bytes_breakdown),
            "inputs": dict(self.inputs),
            "model": self.model,
        }


def _tok(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 10 else f"{x:.3g}"


def ceiling(
    *,
    gpu: str | None = None,
    weight_bytes: float | None = None,
    params: float | None = None,
    dtype: str = "bf16",
    model_config: str | Path | dict | None = None,
    tp: int = 1,
    accept_len: float | None = None,
    draft_bytes: float = 0,
    draft_forwards: float = 0,
    draft_sharded: bool = True,
    batch: int = 1,
    kv_bytes_per_token: float | None = None,
    context: int = 0,
    kv_dtype: str = "bf16",
    peak_bw: float | None = None,
    measured_tok_s: float | None = None,
) -> Ceiling:
    """The trace-free roofline. Exactly one of ``weight_bytes`` (the whole model's
    weight bytes read per step, lm_head included, embedding excluded), ``params``
    (x ``dtype`` bytes) or ``model_config`` (a HF config.json path or dict; counts the
    parameters a step reads). Raises ``TracekitError`` on unusable input.

    >>> c = ceiling(gpu="NVIDIA RTX A6000", params=27e9, dtype="fp8", tp=2, accept_len=3.2)
    >>> c.bytes_per_step_per_gpu, round(c.floor_ms, 2), round(c.ceiling_tokens_per_s)
    (13500000000, 17.58, 182)
    """
    from tracekit.analyses.roofline import bytes_per_step, dtype_bytes, roofline, tokens_per_step
    from tracekit.gpus import list_gpus, lookup, resolve_peak_bw

    given = [n for n, v in (("--weight-bytes", weight_bytes), ("--params", params),
                            ("--model-config", model_config)) if v is not None]
    if len(given) != 1:
        raise TracekitError("give exactly one of --weight-bytes N, --params N (with --dtype) or --model-config FILE"
                            + (f" (got {', '.join(given)})" if given else ""))
    if tp < 1:
        raise TracekitError(f"--tp must be >= 1, got {tp}")
    if batch < 1:
        raise TracekitError(f"--batch must be >= 1, got {batch}")
    if accept_len is not None and not (math.isfinite(accept_len) and accept_len > 0):
        raise TracekitError(f"--accept-len must be > 0 (mean tokens accepted per step), got {accept_len}")
    if measured_tok_s is not None and not (math.isfinite(measured_tok_s) and measured_tok_s > 0):
        raise TracekitError(f"--measured-tok-s must be > 0, got {measured_tok_s}")
    if (draft_bytes or 0) > 0 and not (draft_forwards or 0) > 0:
        raise TracekitError("--draft-bytes needs --draft-forwards K (draft forward passes per step)")
    try:
        wsize = dtype_bytes(dtype)
        kvsize = dtype_bytes(kv_dtype)
    except ValueError as e:
        raise TracekitError(str(e)) from e

    assumptions: list[str] = [
        "memory-bound decode: every byte counted is read once per step from DRAM at the GPU's datasheet peak "
        "bandwidth (kernels reach about 80-90% of it, so the real floor is higher)",
        "compute ignored (small-batch decode GEMMs are bandwidth-bound)",
        "communication ignored" + (f" (tensor parallelism {tp} adds all-reduces on top)" if tp > 1 else ""),
        "kernel launch overhead, host gaps and scheduling ignored (CUDA graphs come closest)",
        "activation bytes ignored",
    ]
    inputs: dict = {"tp": tp, "batch": batch, "accept_len": accept_len, "dtype": None,
                    "weight_bytes": None, "weight_bytes_source": None, "params": None,
                    "draft_bytes": draft_bytes or 0, "draft_forwards": draft_forwards or 0,
                    "draft_sharded": draft_sharded, "kv_bytes_per_token": None, "context": context or 0}
    model = None
    if weight_bytes is not None:
        if not (math.isfinite(weight_bytes) and weight_bytes > 0):
            raise TracekitError(f"--weight-bytes must be > 0, got {weight_bytes}")
        wbytes = float(weight_bytes)
        inputs["weight_bytes_source"] = "flag"
    elif params is not None:
        if not (math.isfinite(params) and params > 0):
            raise TracekitError(f"--params must be > 0, got {params}")
        wbytes = float(params) * wsize
        inputs.update(params=params, dtype=dtype, weight_bytes_source="params")
        if dtype in ("fp8", "int8", "int4"):
            assumptions.append(f"{dtype}: quantization scales and zero points ignored; "
                               "layers kept in higher precision (e.g. lm_head) count as " + dtype)
    else:
        from tracekit.modelconfig import count_params, load_config

        cfg = model_config if isinstance(model_config, dict) else load_config(model_config)
        mp = count_params(cfg)
        per_step = mp.params_per_step(batch)
        wbytes = per_step * wsize
        inputs.update(params=per_step, dtype=dtype, weight_bytes_source="model-config")
        model = mp.to_dict()
        assumptions.append("weights: active non-embedding parameters + lm_head (the embedding table is a gather, "
                           "not a full read) x " + dtype)
        if mp.experts and batch > 1:
            assumptions.append(f"MoE at batch {batch}: experts read = the expected distinct experts under uniform "
                               f"routing ({mp.experts_per_token} of {mp.experts} per token)")
        for w in mp.warnings:
            assumptions.append(w)
        if kv_bytes_per_token is None and context:
            kv_bytes_per_token = mp.kv_bytes_per_token(kvsize)
            assumptions.append(f"KV bytes per token from the config: {mp.kv_elements_per_token:,} elements x {kv_dtype}")
    inputs["weight_bytes"] = int(round(wbytes))

    kv = float(kv_bytes_per_token or 0)
    if (kv > 0) != (bool(context) and context > 0):
        raise TracekitError("KV reads need both --kv-bytes-per-token N and --context L"
                            + (" (or --model-config with --context)" if model_config is None else ""))
    if kv > 0:
        inputs.update(kv_bytes_per_token=int(kv), context=context)
        assumptions.append(f"KV cache: {int(kv):,} bytes per token x context {context:,} x batch {batch}"
                           + (f", split over {tp} GPUs" if tp > 1 else "") + " read once per step")
    else:
        assumptions.append("KV cache reads not counted (give --kv-bytes-per-token and --context)")
    if draft_bytes:
        assumptions.append(f"draft model: {int(draft_bytes):,} bytes x {draft_forwards:g} forwards per step"
                           + ((", sharded over tp" if draft_sharded else ", replicated on every GPU") if tp > 1 else ""))
    else:
        assumptions.append("no draft model weights counted")

    try:
        total = bytes_per_step(wbytes, tp=tp, draft_bytes=draft_bytes or 0, draft_forwards=draft_forwards or 0,
                               draft_sharded=draft_sharded, kv_bytes_per_token=kv, context=context or 0, batch=batch)
    except ValueError as e:
        raise TracekitError(str(e)) from e
    breakdown = {
        "weights": bytes_per_step(wbytes, tp=tp),
        "draft": bytes_per_step(0, tp=tp, draft_bytes=draft_bytes or 0, draft_forwards=draft_forwards or 0,
                                draft_sharded=draft_sharded),
        "kv": bytes_per_step(0, tp=tp, kv_bytes_per_token=kv, context=context or 0, batch=batch),
    }

    spec = lookup(gpu) if gpu else None
    bw, source = resolve_peak_bw(peak_bw, None, None, gpu)
    if bw is None:
        if not gpu:
            raise TracekitError("give --gpu NAME (see docs/roofline.md for the table) or --peak-bw GBPS")
        known = ", ".join(s.name for s in list_gpus()[:6])
        raise TracekitError(f"unknown GPU {gpu!r}: pass its peak memory bandwidth with --peak-bw GBPS "
                            f"(the table knows e.g. {known}, ...)")
    name = spec.name if spec is not None else (gpu or "custom")
    if spec is not None and spec.devices_per_package > 1 and source == "table":
        assumptions.append(f"{spec.name}: one device = one of {spec.devices_per_package} dies, "
                           f"{spec.device_bw_gbps:g} GB/s each")

    tps = tokens_per_step(accept_len, batch)
    step_ms = tps * 1000.0 / measured_tok_s if measured_tok_s is not None else None
    r = roofline(total, bw, step_ms, tps, None)
    assumptions.append(f"tokens per step = {'accept length ' + format(accept_len, 'g') if accept_len else '1 (no speculation)'}"
                       f" x batch {batch}")
    return Ceiling(
        gpu_name=name,
        peak_bw_gbps=bw,
        peak_bw_source=source,
        bytes_per_step_per_gpu=int(r.weight_bytes_per_step),
        floor_ms=r.floor_ms,
        ceiling_steps_per_s=r.ceiling_steps_per_s,
        tokens_per_step=r.tokens_per_step,
        ceiling_tokens_per_s=r.ceiling_tokens_per_s,
        measured_tokens_per_s=float(measured_tok_s) if measured_tok_s is not None else None,
        fraction_of_ceiling=r.fraction_of_ceiling,
        assumptions=assumptions,
        bytes_breakdown=breakdown,
        inputs=inputs,
        model=model,
    )
