"""One resolver per input quantity that can come from several places; every command calls the same one.

Each resolver takes every source of its quantity, applies the contract's precedence once (command-line flag >
manifest beside the trace > the trace itself > shipped tables) and returns a :class:`Resolved`: the value, where it
came from (the ``*_source`` key the JSON writes) and the warnings a user should read. ``breakdown`` (the pipeline,
``tracekit.run.pipeline``: every rank of a rank set and both sides of a ``diff`` run it), and ``ceiling`` call
them::

    quantity             resolver                       precedence
    peak bandwidth       peak_bandwidth()               --peak-bw > manifest > the trace's device > GPU table
    peak TFLOP/s         peak_tflops()                  --peak-tflops > GPU table (the weights' dtype)
    the GPU              trace_gpu()                    the trace's device properties of the analysed device
    tokens per step      tokens_per_step()              --tokens-per-step (ceiling: --batch) > manifest
                                                        > the engine's step annotations > 1; x the accept length
    accept length        accept_length()                --accept-len > the manifest's spec.accept_len
    context              context_tokens()               --context > manifest
    the time base        time_base()                    --measured-step-ms / --measured-tok-s > manifest > traced
    tensor parallelism   resolve_tp()                   --tp > manifest > the command line recorded in the trace
                                                        > the communicator size of the step's all-reduces
                                                        > the process group they use (Kineto pg_config) > 1
    weight bytes         target_weight_bytes()          --weight-bytes > --params x --dtype > --model > manifest
      per step                                          > the model the recorded command names > shapes > NVTX
    KV bytes per step    kv_bytes()                     --kv-bytes-per-token > the model's > manifest
    draft bytes          draft_bytes()                  --draft-bytes > the model's MTP layers > manifest
      per step                                          (``tracekit.analyses.bytes.resolve_bytes`` gathers the
                                                        three, and loads the model they are read from)

>>> peak_bandwidth(flag=None, manifest=None, trace=None, name="NVIDIA H200").value
4800.0
>>> p = resolve_tp(flag=None, manifest=None, command=None, communicator=(None, "no all-reduce in the trace"))
>>> p.tp, p.source
(1, 'default')
>>> tokens_per_step(flag=8, accept_len=2.5).value, tokens_per_step(flag=8, accept_len=2.5).batch
(20.0, 8.0)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TypeVar

from tracekit.errors import BadOptionValue
from tracekit.tokens import TokensPerStep

if TYPE_CHECKING:  # pragma: no cover
    from pathlib import Path

    import polars as pl

    from tracekit.analyses.timebase import TimeBase
    from tracekit.trace import Trace

T = TypeVar("T")

# A profiler only ever slows a step down, so an unprofiled step longer than the traced one is wrong: up to this
# factor it is timing noise, kept with a warning (an eager step's host time varies between the timed and the
# profiled part of one capture on a shared VM: spec-small-eager's manifest step is 1.12x its traced step,
# docs/validation.md); beyond it, an input error (a whole-batch tok/s without its batch, another workload's step),
# refused.
UNPROFILED_NOISE = 1.05
UNPROFILED_TOLERANCE = 1.25
# A traced step this many times the unprofiled one is worth a warning (shares of it include the profiler).
INFLATION_WARNING = 1.2
# A figure above the GPU's peak (bandwidth, TFLOP/s; a floor longer than the step) by more than this margin rests on
# wrong inputs: datasheet peaks are rounded, kernel times are measured (:func:`above_peak`).
PEAK_TOLERANCE = 1.05


@dataclass(frozen=True)
class Resolved(Generic[T]):
    """A resolved input: ``value`` (None: unknown), ``source`` (the contract's ``*_source`` word; None: unknown),
    ``warnings`` (what the user should know, in the order they are printed) and ``detail`` (what was read)."""

    value: T
    source: str | None
    warnings: tuple[str, ...] = ()
    detail: str | None = None


def _usable(x: float | None) -> bool:
    return x is not None and isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def peak_bandwidth(*, flag: float | None, manifest: float | None = None, trace: float | None = None,
                   name: str | None = None, table: str | Path | None = None) -> Resolved[float | None]:
    """The GPU's peak memory bandwidth (GB/s): ``--peak-bw`` > manifest > the trace's device properties > the
    shipped GPU table by ``name`` (``tracekit.gpus``; one device's share: an MI250 GCD gets half the package's).
    A missing, zero, negative or NaN manifest/trace value is skipped (nsys writes 0 when it does not know); a bad
    ``flag`` is the user's error.

    >>> [(r.value, r.source) for r in (peak_bandwidth(flag=900.0, manifest=1000.0, trace=4800.0, name="NVIDIA H200"),
    ...                                  peak_bandwidth(flag=None, trace=0.0, name="NVIDIA H200"), peak_bandwidth(flag=None))]
    [(900.0, 'flag'), (4800.0, 'table'), (None, None)]
    """
    from tracekit.gpus import lookup

    if flag is not None:
        if not _usable(flag):
            raise BadOptionValue(f"--peak-bw must be a positive number of GB/s, got {flag!r}")
        return Resolved(float(flag), "flag")
    if _usable(manifest):
        return Resolved(float(manifest), "manifest")
    if _usable(trace):
        return Resolved(float(trace), "trace")
    spec = lookup(name, table=table)
    if spec is not None:
        return Resolved(float(spec.device_bw_gbps), "table")
    return Resolved(None, None, ("peak memory bandwidth unknown (GPU not in the trace or the table): pass "
                                 "--peak-bw GBPS",))


def peak_tflops(flag: float | None, name: str | None, dtype: str | None, *,
                table: str | Path | None = None) -> tuple[float | None, str | None, str | None]:
    """Dense peak TFLOP/s for GEMMs of ``dtype`` on the GPU ``name``, where it came from (``--peak-tflops`` > the
    GPU table) and the table key used (None for the flag); ``(None, None, None)`` when neither gives one. A
    multi-die package's device gets its share, as for bandwidth. A bad ``flag`` is the user's error.

    >>> peak_tflops(500.0, "NVIDIA H200", "bf16"), peak_tflops(None, "NVIDIA GB10", "bf16")
    ((500.0, 'flag', None), (None, None, None))
    >>> peak_tflops(None, "NVIDIA H100 80GB HBM3", "bf16")[:2], peak_tflops(None, "NVIDIA B200", "nvfp4")[:2]
    ((989.0, 'table'), (9000.0, 'table'))
    """
    from tracekit.gpus import lookup

    if flag is not None:
        if not _usable(flag):
            raise BadOptionValue(f"--peak-tflops must be a positive number of TFLOP/s, got {flag!r}")
        return float(flag), "flag", None
    spec = lookup(name, table=table)
    if spec is None:
        return None, None, None
    value, key = spec.tflops(dtype)
    if value is None:
        return None, None, None
    return value / spec.devices_per_package, "table", key


def above_peak(value: float | None, peak: float | None) -> bool:
    """Whether ``value`` (a bandwidth, a TFLOP/s, a fraction of the ceiling against 1) is above what ``peak``
    allows: the one ceiling check (:data:`PEAK_TOLERANCE`), of the roofline (``roofline.physical_check``) and of
    the verdicts' readings (``verdicts.check``).

    >>> above_peak(5000, 4800), above_peak(5100, 4800), above_peak(None, 4800), above_peak(5100, None)
    (False, True, False, False)
    """
    return value is not None and bool(peak) and value > PEAK_TOLERANCE * peak


# tp_source values (the contract's), in precedence order.
TP_SOURCES = ("flag", "manifest", "command", "communicator", "process_group", "default")
# those read from the trace (its recorded command line, communicators, process groups) or defaulted: breakdown's
# roofline writes their evidence (tp_evidence)
TP_EVIDENCE_SOURCES = TP_SOURCES[2:]
# those that state tp (the user, the capture, the run's own command line) rather than infer it from collectives
STATED_TP_SOURCES = TP_SOURCES[:3]
@dataclass(frozen=True)
class Parallelism:
    """How many GPUs share the model's bytes: ``tp`` with where it came from (:data:`TP_SOURCES`) and the
    evidence; ``ep`` = expert-parallel GPUs."""

    tp: int
    source: str
    evidence: str | None = None
    ep: int = 1

    @property
    def known(self) -> bool:
        return self.source != "default"


def resolve_tp(*, flag: int | None = None, manifest: int | None = None, command: int | None = None,
               communicator: tuple[int | None, str] = (None, "not looked for"),
               process_group: tuple[int | None, str] | None = None, ep: int | None = None) -> Parallelism:
    """Tensor parallelism by the contract's precedence (the module docstring); ``process_group`` is consulted
    only when given (the caller gives it when the step has all-reduces whose communicator is unknown)."""
    if flag is not None:
        if flag < 1:
            raise BadOptionValue(f"--tp must be >= 1, got {flag}")
        found = (int(flag), "flag", None)
    elif manifest:
        found = (int(manifest), "manifest", None)
    elif command:
        found = (int(command), "command", "the command line recorded in the trace")
    elif communicator[0]:
        found = (int(communicator[0]), "communicator", communicator[1])
    elif process_group is not None and process_group[0]:
        found = (int(process_group[0]), "process_group", process_group[1])
    else:
        why = communicator[1] + (f"; {process_group[1]}" if process_group is not None else "")
        found = (1, "default", why)
    if ep is not None and ep < 1:
        raise BadOptionValue(f"--ep must be >= 1, got {ep}")
    return Parallelism(tp=found[0], source=found[1], evidence=found[2], ep=int(ep or 1))


@dataclass(frozen=True)
class TraceGpu:
    """What the trace says of a GPU: its ``name`` and its own peak bandwidth (None where it does not say)."""

    name: str | None
    peak_bw_gbps: float | None


def trace_gpu(gpus: pl.DataFrame, device: int, devices: Callable[[], list[int]] | None = None) -> Resolved[TraceGpu]:
    """The trace's GPU ``device`` (``trace.gpus``: one row per device with its properties), named from the trace's
    device properties even where their ids differ from the activities' device ids (a ROCm Kineto trace records its
    kernels on device 9 and its one GPU's properties under id 0): by id; else, when ``devices()`` (the devices with
    activity) are as many as the property rows, by their order; else, when every property row names one GPU model,
    that one. ``detail`` says how when it was not by id."""
    import polars as pl

    g = gpus.filter(pl.col("device") == device)
    if g.height:
        return Resolved(TraceGpu(g["name"][0], g["peak_bw_gbps"][0]), "trace")
    props = gpus.filter(pl.col("name").is_not_null()).sort("device")
    if props.height == 0:
        return Resolved(TraceGpu(None, None), None)
    active = sorted(devices()) if devices is not None else []
    row = None
    if device in active and len(active) == props.height:
        row = active.index(device)
        how = (f"the device properties of id {props['device'][row]} (the activities' device ids "
               f"{', '.join(map(str, active))} are the properties' {', '.join(map(str, props['device']))} in order)")
    elif props["name"].n_unique() == 1 and props["peak_bw_gbps"].n_unique() == 1:
        row = 0
        how = (f"the trace's device properties (id {props['device'][0]}{' and the others' if props.height > 1 else ''}"
               f": one GPU model)")
    if row is None:
        return Resolved(TraceGpu(None, None), None)
    return Resolved(TraceGpu(props["name"][row], props["peak_bw_gbps"][row]), "trace", detail=how)


def tokens_per_step(*, flag: float | None = None, manifest: dict | None = None, accept_len: float | None = None,
                    annotated: Callable[[], tuple[float, str] | None] | None = None) -> StepTokens:
    """The tokens a step produces: the batch (``--tokens-per-step``, ceiling's ``--batch`` > the manifest's
    ``tokens_per_step`` > ``annotated()``, the engine's step annotations > 1) x the accept length where there is
    speculation. ``annotated`` is called only when nothing above gives the batch."""
    if flag is not None:
        batch = TokensPerStep(float(flag), "flag")
    elif manifest and manifest.get("tokens_per_step") is not None:
        batch = TokensPerStep(float(manifest["tokens_per_step"]), "manifest")
    elif annotated is not None and (found := annotated()) is not None:
        value, seen = found
        batch = TokensPerStep(value, "annotation", f"batch {value:g} from the step annotations ({seen})")
    else:
        batch = TokensPerStep(1.0, "default")
    return StepTokens(value=(accept_len if accept_len else 1) * batch.value, source=batch.source, batch=batch.value,
                      accept_len=accept_len, unit=batch.unit, detail=batch.detail)


@dataclass(frozen=True)
class StepTokens(Resolved):
    """:func:`tokens_per_step`'s answer: ``value`` = accept length x ``batch``; ``source`` is the batch's (flag,
    manifest, annotation, default); ``unit`` the words every tok/s figure computed with it carries."""

    batch: float = 1.0
    accept_len: float | None = None
    unit: str = "tok/s"


def annotated_batch(trace: Trace, windows: pl.DataFrame) -> tuple[float, str] | None:
    """The batch the engine's step annotations name for ``windows`` (median over the steps that name one) and the
    first such annotation, or None (SGLang ``step[DECODE bs=128]``, vLLM ``execute_context_0(0)_generation_32(32)``
    / ``generation_32``, TensorRT-LLM ``N gen reqs``)."""
    import polars as pl

    from tracekit.analyses.phase import annotation_phases

    if trace.ranges.height == 0 or windows.height == 0:
        return None
    ann = annotation_phases(trace, windows).filter(pl.col("bs").is_not_null() & (pl.col("bs") > 0))
    if ann.height == 0:
        return None
    return float(ann["bs"].median()), str(ann.sort("step")["evidence"][0])


def accept_length(*, flag: float | None, manifest: dict | None = None) -> Resolved[float | None]:
    """Mean tokens accepted per speculative step per sequence: ``--accept-len`` > the manifest's
    ``spec.accept_len`` (None: unknown, or no speculation)."""
    if flag is not None:
        return Resolved(float(flag), "flag")
    value = ((manifest or {}).get("spec") or {}).get("accept_len")
    return Resolved(value, "manifest" if value is not None else None)


def context_tokens(*, flag: int | None, manifest: dict | None = None) -> Resolved[int | None]:
    """Tokens of KV cache each sequence reads per step: ``--context`` > the manifest's ``context``."""
    if flag is not None:
        return Resolved(flag, "flag")
    value = (manifest or {}).get("context")
    return Resolved(value, "manifest" if value is not None else None)


def time_base(traced_step_ms: float, *, measured_step_ms: float | None = None, measured_tok_s: float | None = None,
              tokens: float | None = None, manifest_ms: float | None = None) -> Resolved[TimeBase]:
    """The step every saving is stated against (``tracekit.analyses.timebase``: the unprofiled step from
    ``--measured-step-ms`` > ``--measured-tok-s`` x ``tokens`` (accept length x batch) > the manifest, else the
    traced step), with the warning that the traced step is inflated by the profiler.

    An unprofiled step longer than the traced one is impossible — a profiler only ever slows a step down: beyond
    ``UNPROFILED_TOLERANCE`` it is a wrong flag, a wrong tokens per step, or a step of another run; it is refused
    with a warning that names what to check, and savings are stated against the traced step (upper bounds). Within
    it (more than ``UNPROFILED_NOISE``) it is kept, with a warning that the two were timed at different host speeds.

    >>> tb = time_base(78.5, manifest_ms=36.67).value
    >>> tb.reference_step_ms, tb.unprofiled_source, round(tb.profiler_inflation, 2)
    (36.67, 'manifest', 2.14)
    >>> time_base(30.0, measured_tok_s=100.0, tokens=2.0).value.reference_step_ms
    20.0
    >>> r = time_base(10.4, measured_tok_s=2000, tokens=32)
    >>> r.value.reference_step_ms, r.value.unprofiled_step_ms, r.value.rejected_unprofiled_step_ms
    (10.4, None, 16.0)
    >>> r.warnings[0][:75]
    'the unprofiled step (16.000 ms, from --measured-tok-s 2000 x 32 tokens per '
    """
    from dataclasses import replace

    from tracekit.analyses.timebase import TimeBase

    unprof, source = None, None
    if measured_step_ms is not None:  # (the flags arrive checked: positive, not both; tracekit.options)
        unprof, source = float(measured_step_ms), "flag"
    elif measured_tok_s is not None:  # whole-batch throughput: step ms = 1000 x tokens per step / tok/s
        unprof, source = 1000.0 * float(tokens or 1.0) / float(measured_tok_s), "flag"
    elif manifest_ms is not None and manifest_ms > 0:
        unprof, source = float(manifest_ms), "manifest"
    tb = TimeBase(traced_step_ms=float(traced_step_ms), unprofiled_step_ms=unprof, unprofiled_source=source,
                  reference_step_ms=unprof if unprof is not None else float(traced_step_ms),
                  profiler_inflation=traced_step_ms / unprof if unprof else None)
    warnings = []
    unprof = tb.unprofiled_step_ms
    if unprof is not None and unprof > UNPROFILED_TOLERANCE * traced_step_ms:
        if measured_step_ms is not None:
            given, check = "--measured-step-ms", "--measured-step-ms (the step of this workload, in ms)"
        elif measured_tok_s is not None:
            given = f"from --measured-tok-s {measured_tok_s:g} x {tokens or 1:g} tokens per step"
            check = ("--measured-tok-s (the whole batch's tokens/s) and the tokens per step (--tokens-per-step, "
                     "--accept-len)")
        else:
            given, check = "the manifest's", "the manifest's unprofiled_step_ms (a step timed in another process?)"
        warnings.append(f"the unprofiled step ({unprof:.3f} ms, {given}) is longer than the traced step "
                        f"({traced_step_ms:.3f} ms, {unprof / traced_step_ms:.2f}x): impossible, a profiler only slows "
                        f"a step down; check {check}. Savings are stated against the traced step instead (upper "
                        "bounds)")
        tb = replace(tb, unprofiled_step_ms=None, unprofiled_source=None, reference_step_ms=float(traced_step_ms),
                     profiler_inflation=None, rejected_unprofiled_step_ms=unprof)
    elif unprof is not None and unprof > UNPROFILED_NOISE * traced_step_ms:
        warnings.append(f"the unprofiled step ({unprof:.3f} ms, {tb.unprofiled_source}) is longer than the traced step "
                        f"({traced_step_ms:.3f} ms, {unprof / traced_step_ms:.2f}x), though a profiler only slows a "
                        "step down: the two were timed at different host speeds (savings are stated against the "
                        "unprofiled step; predictions scaled to it carry that difference)")
    elif tb.profiler_inflation is not None and tb.profiler_inflation > INFLATION_WARNING:
        warnings.append(f"the traced steps ({traced_step_ms:.3f} ms) are {tb.profiler_inflation:.1f}x the unprofiled "
                        f"step ({tb.unprofiled_step_ms:.3f} ms, {tb.unprofiled_source}): every saving is stated "
                        "against the unprofiled step; shares of the traced step include the profiler's own overhead")
    return Resolved(tb, tb.unprofiled_source, tuple(warnings))


# ───────────────────────── the bytes a step reads (tracekit.analyses.bytes.resolve_bytes calls these)

def bytes_per_step(
    weight_bytes: int | float,
    tp: int = 1,
    draft_bytes: int | float = 0,
    draft_forwards: int | float = 0,
    draft_sharded: bool = True,
    kv_bytes_per_token: int | float = 0,
    context: int | float = 0,
    batch: int = 1,
    *,
    kv_sharded: bool = True,
) -> int:
    """Bytes ONE GPU must read from memory per decode step.

    ``weight_bytes / tp`` (the target model's weights, split by tensor parallelism)
    ``+ draft_bytes * draft_forwards`` (``/ tp`` when the draft is sharded too)
    ``+ kv_bytes_per_token * context * batch`` (``/ tp`` when KV heads are split).
    Weights are read once per step whatever the batch; the KV cache once per sequence.
    ``kv_bytes_per_token`` is the whole model's (all layers, K and V).

    >>> bytes_per_step(27e9, tp=2)
    13500000000
    >>> bytes_per_step(4e9, draft_bytes=1e8, draft_forwards=3, kv_bytes_per_token=131072, context=1000)
    4431072000
    """
    if tp < 1:
        raise ValueError("tp must be >= 1")
    if batch < 1:
        raise ValueError("batch must be >= 1")
    for label, v in (("weight_bytes", weight_bytes), ("draft_bytes", draft_bytes),
                     ("draft_forwards", draft_forwards), ("kv_bytes_per_token", kv_bytes_per_token),
                     ("context", context)):
        if v is None or not math.isfinite(v) or v < 0:
            raise ValueError(f"{label} must be a non-negative number, got {v!r}")
    total = weight_bytes / tp
    total += draft_bytes * draft_forwards / (tp if draft_sharded else 1)
    total += kv_bytes_per_token * context * batch / (tp if kv_sharded else 1)
    return int(round(total))


def weight_bytes_per_gpu(weight_bytes: int | float, tp: int = 1) -> int:
    """Per-GPU weight bytes from ``--weight-bytes`` (the contract: bytes a step reads summed over
    all GPUs) and ``--tp``. ``ceiling`` and ``breakdown`` both divide here.

    >>> weight_bytes_per_gpu(16e9, tp=2)
    8000000000
    """
    if tp < 1:
        raise ValueError("tp must be >= 1")
    if weight_bytes is None or not math.isfinite(weight_bytes) or weight_bytes < 0:
        raise ValueError(f"weight bytes must be a non-negative number, got {weight_bytes!r}")
    return int(round(weight_bytes / tp))


def manifest_draft_bytes(man: dict) -> int | None:
    """The draft's part of a capture manifest's ``weight_bytes_per_step``: its ``draft_bytes_per_step``, else the
    draft model's weight bytes x its forwards per step (``draft_model``), else unknown."""
    if man.get("draft_bytes_per_step") is not None:
        return int(man["draft_bytes_per_step"])
    dm = man.get("draft_model") or {}
    if dm.get("weight_bytes") and dm.get("forwards_per_step"):
        return int(dm["weight_bytes"]) * int(dm["forwards_per_step"])
    return None


def target_weight_bytes(weight_bytes, params, dtype, sb, man: dict, from_trace, tp: int, assumptions: list[str]):
    """The target's weight bytes per GPU per step and their source, by precedence: the flag, ``params`` x
    ``dtype``, the model (its step's bytes less the draft's), the manifest, the trace (``from_trace``). Returns
    (bytes | None, source | None, the trace's warnings)."""
    from tracekit.model.units import dtype_bytes

    trace_warnings: list[str] = []
    target = src = None
    if weight_bytes is not None:
        if not (math.isfinite(weight_bytes) and weight_bytes > 0):
            raise BadOptionValue(f"--weight-bytes must be > 0, got {weight_bytes}")
        target, src = weight_bytes_per_gpu(weight_bytes, tp), "flag"
        assumptions.append(f"weights: --weight-bytes {int(weight_bytes):,} summed over GPUs / tp {tp}"
                           + (" (replaces the model's weights term)" if sb is not None else ""))
    elif params is not None:
        if not (math.isfinite(params) and params > 0):
            raise BadOptionValue(f"--params must be > 0, got {params}")
        d = dtype or "bf16"
        target, src = weight_bytes_per_gpu(float(params) * dtype_bytes(d), tp), "params"
        if d in ("fp8", "int8", "int4"):
            assumptions.append(f"{d}: quantization scales and zero points ignored; "
                               "layers kept in higher precision (e.g. lm_head) count as " + d)
    elif sb is not None:
        target, src = sb.weight_bytes_per_step - sb.draft_bytes_per_step, "model"
    elif man.get("weight_bytes_per_step") is not None:  # (target + draft x forwards, as the contract's key)
        target, src = int(man["weight_bytes_per_step"]) - (manifest_draft_bytes(man) or 0), "manifest"
    elif from_trace is not None:
        target, src, seen = from_trace()
        trace_warnings = list(seen)

    return target, src, trace_warnings


def kv_bytes(kv_bytes_per_token, sb, man: dict, *, tp: int, context, batch: int, assumptions: list[str]):
    """The KV-cache bytes per GPU per step and their source: the flag, else the model's, else the manifest's."""

    kv = kv_src = None
    if kv_bytes_per_token:
        kv = bytes_per_step(0, tp=tp, kv_bytes_per_token=kv_bytes_per_token, context=context or 0, batch=batch)
        kv_src = "flag"
        assumptions.append(f"KV cache: {int(kv_bytes_per_token):,} bytes per token x context {context or 0:,} x batch "
                           f"{batch}" + (f", split over {tp} GPUs" if tp > 1 else "") + " read once per step")
    elif sb is not None and sb.kv_bytes_per_step is not None:
        kv, kv_src = sb.kv_bytes_per_step, "model"
    elif man.get("kv_bytes_per_step") is not None:
        kv, kv_src = int(man["kv_bytes_per_step"]), "manifest"
    return kv, kv_src


def draft_bytes(draft_bytes, draft_forwards, draft_sharded: bool, sb, man: dict, src, tp: int,
                 assumptions: list[str]):
    """The draft's bytes per GPU per step: a separate draft model's bytes, else the model's MTP layers (inside the
    weights), else the manifest's when it gave the weights; None: none counted."""

    draft = None
    if draft_bytes:
        draft = bytes_per_step(0, tp=tp, draft_bytes=draft_bytes, draft_forwards=draft_forwards,
                               draft_sharded=draft_sharded)
        assumptions.append(f"draft model: {int(draft_bytes):,} bytes x {draft_forwards:g} forwards per step"
                           + ((", sharded over tp" if draft_sharded else ", replicated on every GPU")
                              if tp > 1 else ""))
    elif sb is not None and sb.draft_bytes_per_step:
        draft = sb.draft_bytes_per_step
    elif src == "manifest":
        draft = manifest_draft_bytes(man)
    return draft


__all__ = ["Parallelism", "resolve_tp", "TP_SOURCES", "TP_EVIDENCE_SOURCES", "STATED_TP_SOURCES", "Resolved", "StepTokens", "TraceGpu", "trace_gpu", "peak_bandwidth", "tokens_per_step", "annotated_batch", "accept_length",
           "context_tokens", "time_base", "UNPROFILED_NOISE", "UNPROFILED_TOLERANCE", "INFLATION_WARNING", "peak_tflops",
           "above_peak", "PEAK_TOLERANCE", "target_weight_bytes", "kv_bytes", "draft_bytes", "manifest_draft_bytes", "bytes_per_step", "weight_bytes_per_gpu"]
