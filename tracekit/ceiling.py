"""``tracekit ceiling``: how fast could decode be, before any trace? (schema ``tracekit.ceiling/1``)

The trace-free roofline: the bytes each GPU must read per decode step (weights / tp,
plus draft weights x draft forwards, plus KV cache reads when given) over the GPU's
peak memory bandwidth gives the floor per step and the tok/s ceiling. The arithmetic
is ``tracekit.analyses.roofline`` (the same code as breakdown's ``roofline`` block).

    tracekit ceiling --gpu "RTX A6000" --params 27e9 --dtype fp8 --tp 2 --accept-len 3.2
    tracekit ceiling --gpu H200 --model ~/.cache/huggingface/hub/models--Qwen--Qwen3-8B --tp 2 \
        --batch 8 --context 8192          # weights from the safetensors headers, KV from the config

:func:`ceiling` is the library call; ``ceiling_command`` is the click command (the CLI
group registers it); ``render_table`` / ``render_markdown`` render a :class:`Ceiling`.
"""

from __future__ import annotations

import io
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import click

from tracekit.analyses.roofline import (
    bytes_per_step,
    dtype_bytes,
    step_roofline,
    tokens_per_step,
    weight_bytes_per_gpu,
)
from tracekit.errors import TracekitError
from tracekit.gpus import list_gpus, lookup, resolve_peak_bw
from tracekit.model.checkpoint import Model
from tracekit.model.units import BYTES

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
    roofline: dict = field(default_factory=dict)   # the breakdown/2 roofline block of the same bytes
    step: dict | None = None                       # tracekit.model.StepBytes.to_dict() with --model

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
            "roofline": dict(self.roofline),
            "step": self.step,
        }


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
    measured_tok_s: float | None = None,
) -> Ceiling:
    """The trace-free roofline, bytes per GPU.

    Weights: ``weight_bytes`` (the bytes a step reads summed over all GPUs, lm_head included,
    embedding excluded; divided by ``tp``), or ``params`` x ``dtype`` (default bf16), or
    ``model`` (a model directory / HF snapshot / ``config.json`` path, a config dict or a
    :class:`tracekit.model.Model`: per-tensor bytes, MoE experts read at ``batch``, MTP layers
    x ``draft_forwards``, the KV cache at ``context``). With ``model`` and ``weight_bytes``
    the flag replaces only the target's weights term. ``model_config`` is the older name of
    ``model``. Raises ``TracekitError`` on unusable input.

    >>> c = ceiling(gpu="NVIDIA RTX A6000", params=27e9, dtype="fp8", tp=2, accept_len=3.2)
    >>> c.bytes_per_step_per_gpu, round(c.floor_ms, 2), round(c.ceiling_tokens_per_s)
    (13500000000, 17.58, 182)
    """
    if model is None:
        model = model_config
    elif model_config is not None:
        raise TracekitError("give --model or --model-config, not both")
    if params is not None and (weight_bytes is not None or model is not None):
        raise TracekitError("give one of --weight-bytes N, --params N (with --dtype) or --model PATH "
                            "(--weight-bytes may go with --model: it replaces the weights term)")
    if weight_bytes is None and params is None and model is None:
        raise TracekitError("give exactly one of --weight-bytes N, --params N (with --dtype) or --model PATH")
    if tp < 1 or ep < 1:
        raise TracekitError(f"--tp and --ep must be >= 1, got --tp {tp} --ep {ep}")
    if batch < 1:
        raise TracekitError(f"--batch must be >= 1, got {batch}")
    if accept_len is not None and not (math.isfinite(accept_len) and accept_len > 0):
        raise TracekitError(f"--accept-len must be > 0 (mean tokens accepted per step), got {accept_len}")
    if measured_tok_s is not None and not (math.isfinite(measured_tok_s) and measured_tok_s > 0):
        raise TracekitError(f"--measured-tok-s must be > 0, got {measured_tok_s}")
    if (draft_bytes or 0) > 0 and not (draft_forwards or 0) > 0:
        raise TracekitError("--draft-bytes needs --draft-forwards K (draft forward passes per step)")
    if context is None or context < 0:
        raise TracekitError(f"--context must be >= 0, got {context}")
    try:
        wsize = dtype_bytes(dtype or "bf16")
        if kv_dtype:
            dtype_bytes(kv_dtype)  # validated here; tracekit.model applies it
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
    inputs: dict = {"tp": tp, "ep": ep, "batch": batch, "accept_len": accept_len, "dtype": None,
                    "weight_bytes": None, "weight_bytes_source": None, "params": None,
                    "draft_bytes": draft_bytes or 0, "draft_forwards": draft_forwards or 0,
                    "draft_sharded": draft_sharded, "kv_bytes_per_token": None, "kv_bytes_source": None,
                    "context": context or 0}
    summary = None
    step = None
    kv_step = None                    # per GPU
    model_draft = 0                   # per GPU, MTP layers x forwards
    if model is not None:
        from tracekit.model import Model as _Model, load_model, model_from_config, step_bytes

        if isinstance(model, _Model):
            m = model
        elif isinstance(model, dict):
            m = model_from_config(model, dtype=dtype)
        else:
            m = load_model(model, dtype=dtype)
        spec_tokens = int(draft_forwards) + 1 if draft_forwards and not draft_bytes else 1
        sb = step_bytes(m, tp=tp, ep=ep, batch=batch, context=context or None,
                        draft_forwards=0 if draft_bytes else (draft_forwards or 0), verify_tokens=spec_tokens,
                        kv_dtype=kv_dtype)
        step = sb.to_dict()
        summary = m.summary()
        model_draft = sb.draft_bytes_per_step
        if kv_bytes_per_token is None and sb.kv_bytes_per_step is not None:
            kv_step = sb.kv_bytes_per_step
            inputs["kv_bytes_source"] = "model"
        for note in sb.notes + sb.warnings:
            if not note.startswith("KV cache not counted"):
                assumptions.append(note)
        inputs["dtype"] = dtype
        if weight_bytes is None:
            wbytes_gpu = float(sb.weight_bytes_per_step - sb.draft_bytes_per_step)
            inputs.update(weight_bytes=int(round(wbytes_gpu * tp)), weight_bytes_source="model")
    if weight_bytes is not None:
        if not (math.isfinite(weight_bytes) and weight_bytes > 0):
            raise TracekitError(f"--weight-bytes must be > 0, got {weight_bytes}")
        wbytes_gpu = weight_bytes_per_gpu(weight_bytes, tp)
        inputs.update(weight_bytes=int(round(weight_bytes)), weight_bytes_source="flag")
        assumptions.append(f"weights: --weight-bytes {int(weight_bytes):,} summed over GPUs / tp {tp}"
                           + (" (replaces the model's weights term)" if model is not None else ""))
    elif params is not None:
        if not (math.isfinite(params) and params > 0):
            raise TracekitError(f"--params must be > 0, got {params}")
        d = dtype or "bf16"
        wbytes_gpu = weight_bytes_per_gpu(float(params) * wsize, tp)
        inputs.update(params=params, dtype=d, weight_bytes=int(round(float(params) * wsize)),
                      weight_bytes_source="params")
        if d in ("fp8", "int8", "int4"):
            assumptions.append(f"{d}: quantization scales and zero points ignored; "
                               "layers kept in higher precision (e.g. lm_head) count as " + d)

    if kv_bytes_per_token is not None or (context and model is None):
        kv = float(kv_bytes_per_token or 0)
        if (kv > 0) != (bool(context) and context > 0):
            raise TracekitError("KV reads need both --kv-bytes-per-token N and --context L"
                                + (" (or --model PATH with --context)" if model is None else ""))
        if kv > 0:
            kv_step = bytes_per_step(0, tp=tp, kv_bytes_per_token=kv, context=context, batch=batch)
            inputs.update(kv_bytes_per_token=int(kv), kv_bytes_source="flag")
            assumptions.append(f"KV cache: {int(kv):,} bytes per token x context {context:,} x batch {batch}"
                               + (f", split over {tp} GPUs" if tp > 1 else "") + " read once per step")
    if kv_step is None:
        assumptions.append("KV cache reads not counted (give --context with --model, or --kv-bytes-per-token "
                           "and --context)")
    if draft_bytes:
        draft_gpu = bytes_per_step(0, tp=tp, draft_bytes=draft_bytes, draft_forwards=draft_forwards,
                                   draft_sharded=draft_sharded)
        assumptions.append(f"draft model: {int(draft_bytes):,} bytes x {draft_forwards:g} forwards per step"
                           + ((", sharded over tp" if draft_sharded else ", replicated on every GPU") if tp > 1 else ""))
    elif model_draft:
        draft_gpu = model_draft
    else:
        draft_gpu = 0
        assumptions.append("no draft model weights counted")
    if wbytes_gpu <= 0:
        raise TracekitError("the model's weights come to 0 bytes per step: check --model")
    total = int(round(wbytes_gpu)) + int(draft_gpu) + int(kv_step or 0)
    breakdown = {"weights": int(round(wbytes_gpu)), "draft": int(draft_gpu), "kv": int(kv_step or 0)}

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
    r = step_roofline(weight_bytes_per_step=int(round(wbytes_gpu)) + int(draft_gpu), peak_bw_gbps=bw,
                      reference_step_ms=step_ms, tokens_per_step=tps, tp=tp,
                      weight_bytes_source=inputs["weight_bytes_source"], kv_bytes_per_step=kv_step,
                      kv_bytes_source=inputs["kv_bytes_source"], draft_bytes_per_step=int(draft_gpu))
    assert r.bytes_per_step == total
    assumptions.append(f"tokens per step = {'accept length ' + format(accept_len, 'g') if accept_len else '1 (no speculation)'}"
                       f" x batch {batch}")
    return Ceiling(
        gpu_name=name,
        peak_bw_gbps=bw,
        peak_bw_source=source,
        bytes_per_step_per_gpu=int(r.bytes_per_step),
        floor_ms=r.floor_ms,
        ceiling_steps_per_s=r.ceiling_steps_per_s,
        tokens_per_step=r.tokens_per_step,
        ceiling_tokens_per_s=r.ceiling_tokens_per_s,
        measured_tokens_per_s=float(measured_tok_s) if measured_tok_s is not None else None,
        fraction_of_ceiling=r.fraction_of_ceiling,
        assumptions=assumptions,
        bytes_breakdown=breakdown,
        inputs=inputs,
        model=summary,
        roofline=r.to_dict(),
        step=step,
    )


# ------------------------------------------------------------------------------ rendering

def _rows(c: Ceiling) -> list[tuple[str, str]]:
    rows = [
        ("GPU", c.gpu_name),
        ("peak bandwidth (GB/s)", f"{_num(c.peak_bw_gbps)} ({c.peak_bw_source})"),
        ("bytes per step per GPU (GB)", _num(c.bytes_per_step_per_gpu / 1e9)),
    ]
    parts = [k for k in ("weights", "draft", "kv") if c.bytes_breakdown.get(k)]
    for k in parts if len(parts) > 1 else []:
        if c.bytes_breakdown.get(k):
            rows.append((f"  {k} (GB)", _num(c.bytes_breakdown[k] / 1e9)))
    rows += [
        ("floor per step (ms)", _num(c.floor_ms)),
        ("ceiling (steps/s)", _num(c.ceiling_steps_per_s)),
        ("tokens per step", _num(c.tokens_per_step)),
        ("ceiling (tok/s)", _num(c.ceiling_tokens_per_s)),
    ]
    if c.measured_tokens_per_s is not None:
        rows.append(("measured (tok/s)", _num(c.measured_tokens_per_s)))
        rows.append(("fraction of ceiling (%)", f"{c.fraction_of_ceiling * 100:.1f}"))
    return rows


def render_table(c: Ceiling, console) -> None:
    """Rich table + the sentence + the assumptions, on the given console."""
    from rich.table import Table

    t = Table(title="tracekit ceiling", title_justify="left")
    t.add_column("quantity", no_wrap=True)
    t.add_column("value", justify="right", no_wrap=True, overflow="ellipsis")
    for k, v in _rows(c):
        t.add_row(k, v)
    console.print(t)
    console.print(c.summary, highlight=False)
    console.print("assumptions:", highlight=False)
    for a in c.assumptions:
        console.print(f"  - {a}", highlight=False, soft_wrap=False)


def render_markdown(c: Ceiling) -> str:
    lines = [f"**{c.summary}**", "", "| quantity | value |", "|---|---:|"]
    lines += [f"| {k.strip()} | {v} |" for k, v in _rows(c)]
    lines += ["", "Assumptions:", ""] + [f"- {a}" for a in c.assumptions]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------ click

_SUFFIX = {"": 1, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12,
           "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12,
           "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


class _Amount(click.ParamType):
    """A positive number, optionally with a decimal suffix: 27e9, 27B, 8.03G, 13.5GB, 4GiB."""

    name = "N"

    def convert(self, value, param, ctx):
        if isinstance(value, (int, float)):
            return float(value)
        m = re.fullmatch(r"\s*([0-9.]+(?:e[+-]?\d+)?)\s*([a-z]*)\s*", str(value), re.IGNORECASE)
        if not m or m.group(2).lower() not in _SUFFIX:
            self.fail(f"{value!r} is not a number (e.g. 27e9, 27B, 13.5GB)", param, ctx)
        try:
            return float(m.group(1)) * _SUFFIX[m.group(2).lower()]
        except ValueError:
            self.fail(f"{value!r} is not a number (e.g. 27e9, 27B, 13.5GB)", param, ctx)


AMOUNT = _Amount()


@click.command("ceiling")
@click.option("--gpu", metavar="NAME", help="GPU name as a trace or nvidia-smi shows it, e.g. 'RTX A6000', 'NVIDIA H200'.")
@click.option("--weight-bytes", type=BYTES, help="Weight bytes a step reads, summed over all GPUs: 27e9, 27GB, 25.1GiB.")
@click.option("--params", type=AMOUNT, help="Parameter count read per step (with --dtype): 27e9, 27B.")
@click.option("--dtype", type=click.Choice(DTYPES), help="Weight dtype for --params (default bf16) or a bare config.json (default: its own).")
@click.option("--model", "--model-config", "model", metavar="PATH", help="Model folder / HF snapshot (config.json + safetensors headers) or a config.json.")
@click.option("--tp", type=click.IntRange(min=1), default=1, show_default=True, help="Tensor-parallel GPUs the weights are split over.")
@click.option("--ep", type=click.IntRange(min=1), default=1, show_default=True, help="Expert-parallel GPUs the experts are split over (with --model).")
@click.option("--accept-len", type=click.FloatRange(min=0, min_open=True), help="Mean tokens accepted per speculative step.")
@click.option("--draft-bytes", type=BYTES, default=0, help="Draft model weight bytes (speculative decoding).")
@click.option("--draft-forwards", type=click.FloatRange(min=0), default=0, help="Draft forward passes per step (a --model's MTP layers when no --draft-bytes).")
@click.option("--draft-replicated", is_flag=True, help="The draft model is not split over --tp (each GPU reads all of it).")
@click.option("--batch", type=click.IntRange(min=1), default=1, show_default=True, help="Sequences decoded per step.")
@click.option("--kv-bytes-per-token", type=BYTES, help="KV cache bytes per token, whole model (all layers, K and V).")
@click.option("--context", type=click.IntRange(min=0), default=0, help="Context length whose KV cache each step reads.")
@click.option("--kv-dtype", type=click.Choice(DTYPES), help="KV cache dtype with --model (default: the model's dtype).")
@click.option("--peak-bw", type=click.FloatRange(min=0, min_open=True), metavar="GBPS", help="Peak memory bandwidth, GB/s; overrides the GPU table.")
@click.option("--measured-tok-s", type=click.FloatRange(min=0, min_open=True), metavar="X", help="Your measured tokens/s, to compare with the ceiling.")
@click.option("--format", "fmt", type=click.Choice(["table", "md", "json"]), default="table", show_default=True)
@click.option("-o", "--output", type=click.Path(dir_okay=False, writable=True), help="Write there instead of stdout.")
def ceiling_command(gpu, weight_bytes, params, dtype, model, tp, ep, accept_len, draft_bytes, draft_forwards,
                    draft_replicated, batch, kv_bytes_per_token, context, kv_dtype, peak_bw, measured_tok_s, fmt, output):
    """How fast could decode be? The memory-bandwidth ceiling, without a trace.

    Example: tracekit ceiling --gpu "RTX A6000" --params 27e9 --dtype fp8 --tp 2 --accept-len 3.2 --measured-tok-s 55
    """
    if not gpu and peak_bw is None:
        raise click.UsageError("give --gpu NAME or --peak-bw GBPS")
    if sum(v is not None for v in (weight_bytes, params, model)) == 0 or (params is not None and (
            weight_bytes is not None or model is not None)):
        raise click.UsageError("give exactly one of --weight-bytes N, --params N or --model PATH "
                               "(--weight-bytes may go with --model)")
    if draft_bytes and not draft_forwards:
        raise click.UsageError("--draft-bytes needs --draft-forwards K (draft forward passes per step)")
    result = ceiling(gpu=gpu, weight_bytes=weight_bytes, params=params, dtype=dtype, model=model,
                     tp=tp, ep=ep, accept_len=accept_len, draft_bytes=draft_bytes, draft_forwards=draft_forwards,
                     draft_sharded=not draft_replicated, batch=batch, kv_bytes_per_token=kv_bytes_per_token,
                     context=context, kv_dtype=kv_dtype, peak_bw=peak_bw, measured_tok_s=measured_tok_s)
    if fmt == "json":
        text = json.dumps(result.to_dict(), indent=2) + "\n"
    elif fmt == "md":
        text = render_markdown(result)
    else:
        from rich.console import Console

        if output is None:
            render_table(result, Console())
            return
        buf = io.StringIO()
        render_table(result, Console(file=buf, width=100, color_system=None))
        text = buf.getvalue()
    if output is None:
        click.echo(text, nl=False)
    else:
        try:
            Path(output).write_text(text, encoding="utf-8")
        except OSError as e:
            raise TracekitError(f"cannot write {output}: {e}") from e
