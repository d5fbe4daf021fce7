"""`tracekit stats`: the tables an ``nsys stats`` user looks for first (schema ``tracekit.stats/1``).

* ``kernels``: as ``tracekit kernels`` (``cuda_gpu_kern_sum``: :mod:`tracekit.results.kernels`).
* ``memops``: memcpy by direction and memset (``cuda_gpu_mem_time_sum``, plus the bytes of
  ``cuda_gpu_mem_size_sum``): count, bytes, total, mean, median, min, max, standard deviation of the durations.
* ``api``: CUDA runtime / driver API calls by name (``cuda_api_sum``). nsys: every row of the runtime table
  (:func:`tracekit.readers.nsys.stats.api_calls`, read by ``tracekit.run.stats``); Kineto: every ``cuda_runtime``
  / ``cuda_driver`` event.
* ``ranges``: NVTX push/pop and start/end ranges by name and style (``nvtx_sum``:
  :func:`tracekit.readers.nsys.stats.nvtx_ranges`); Kineto: the ``user_annotation`` ranges (style
  ``annotation``).
* ``utilisation``: over the trace's GPU window (first GPU activity start to last end, every GPU): per GPU and per
  stream, the time the union of its kernels, memory operations and whole-graph executions covers, and that share
  of the window.
* ``coverage``: the kernel (and memcpy/memset) time of the analysed GPU inside and outside the steps the breakdown
  pipeline finds (``tracekit.run.pipeline.step_table``), outside split by reason (before the first step, after the
  last, between step windows, excluded steps by their reason; ``tracekit.run.stats`` runs the pipeline's steps
  stage): ``kernel_ms_in_steps + kernel_ms_outside_steps =
  kernel_ms_total`` exactly (the same rows, summed two ways). Null, with a warning, when no steps can be found.
* ``launched_by``: kernel time grouped by what launched it, each grouping a partition of all kernel time (its rows
  add up to the kernels' total, the kernels whose launch or launcher the trace does not record in a row of their
  own): ``api`` (the runtime call: ``cudaLaunchKernel``, ``cudaGraphLaunch``, ...), ``op`` (the innermost framework
  op open on the launching thread when the call was made: Kineto ``cpu_op``, or ``emit_nvtx`` ranges), ``module``
  and ``python`` (Kineto ``with_stack``: the innermost ``nn.Module`` frame, the innermost Python function), and
  ``range`` (the innermost NVTX range / annotation open on the launching thread: what ``nvtx_kern_sum`` projects).
  The kernel reaches its call through the correlation id (``(pid, correlation)``: nsys' ``correlationId``, Kineto's
  ``args.correlation``, the same id the ``ac2g`` flows join); a kernel replayed from a CUDA graph counts for the
  graph launch. Range and module names are grouped by pattern (digits as ``#``: ``decode_step #``).

Every table is a group-by over the event frames (polars, no loop over events); statistics as ``nsys stats``
computes them (median of an even count: the mean of the middle two; sample standard deviation, 0 for one).
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from tracekit.contract import STATS_SCHEMA, Block, internal
from tracekit.results.common import Source
from tracekit.results.kernels import KernelRow, kernel_summary
from tracekit.trace import Trace

SCHEMA = STATS_SCHEMA
NO_LAUNCH = "(launch not recorded)"
NONE_OPEN = "(none open)"
GROUPINGS = ("api", "op", "module", "python", "range")
SHOWN_ROWS = 20


@dataclass(frozen=True)
class MemopRow(Block):
    """One memory operation kind: ``[CUDA memcpy Host-to-Device]`` ... ``[CUDA memset]``."""

    name: str
    kind: str  # memcpy | memset
    copy_kind: str | None  # HtoD, DtoH, DtoD, ... (memset: null)
    count: int
    bytes: int
    total_ms: float
    mean_us: float
    median_ms: float
    min_ms: float
    max_ms: float
    stddev_ms: float
    share: float


@dataclass(frozen=True)
class ApiRow(Block):
    """One CUDA API function (``cuda_api_sum``)."""

    name: str
    count: int
    total_ms: float
    mean_us: float
    median_ms: float
    min_ms: float
    max_ms: float
    stddev_ms: float
    share: float


@dataclass(frozen=True)
class RangeRow(Block):
    """One NVTX range name and style (``nvtx_sum``), or a Kineto annotation."""

    name: str
    style: str  # PushPop | StartEnd | annotation
    count: int
    total_ms: float
    mean_us: float
    median_ms: float
    min_ms: float
    max_ms: float
    stddev_ms: float
    share: float


@dataclass(frozen=True)
class DeviceUse(Block):
    """One GPU over the trace's GPU window."""

    device: int
    busy_ms: float  # the union of its activities
    kernel_ms: float  # the plain sum of its kernel durations
    utilisation: float  # busy_ms / window_ms


@dataclass(frozen=True)
class StreamUse(Block):
    """One stream of one GPU over the trace's GPU window."""

    device: int
    stream: int
    count: int  # activities (kernels, memory operations, graph executions)
    busy_ms: float
    kernel_ms: float
    utilisation: float


@dataclass(frozen=True)
class Utilisation(Block):
    """GPU utilisation over the trace's GPU window (``start_ns``..``end_ns``)."""

    start_ns: int | None
    end_ns: int | None
    window_ms: float
    devices: tuple[DeviceUse, ...]
    streams: tuple[StreamUse, ...]


@dataclass(frozen=True)
class StatsCoverage(Block):
    """Kernel time of the analysed GPU in and outside the steps (``coverage`` of the breakdown)."""

    device: int
    steps: int  # analysed steps
    kernel_ms_total: float
    kernel_ms_in_steps: float
    kernel_ms_outside_steps: float
    outside_share: float  # kernel_ms_outside_steps / kernel_ms_total
    outside_by_reason: dict[str, float]


@dataclass(frozen=True)
class LaunchRow(Block):
    """Kernel time launched by one launcher (an API function, op, module, Python frame or range)."""

    name: str
    kernels: int
    total_ms: float
    share: float


@dataclass(frozen=True)
class Stats(Block):
    """The result of :func:`stats` (``tracekit.stats/1``)."""

    SCHEMA = STATS_SCHEMA

    source: Source
    device: int | None  # --device (null: every GPU)
    kernels: tuple[KernelRow, ...]
    memops: tuple[MemopRow, ...]
    api: tuple[ApiRow, ...]
    ranges: tuple[RangeRow, ...]
    utilisation: Utilisation
    coverage: StatsCoverage | None
    launched_by: dict[str, tuple[LaunchRow, ...]]
    warnings: tuple[str, ...]
    # rows per table the table and markdown views show (JSON and CSV: every row)
    shown: int = internal(default=SHOWN_ROWS)


# ───────────────────────── the tables ─────────────────────────

def _summary(df: pl.DataFrame, by: list[str], extra: dict | None = None) -> pl.DataFrame:
    """Per ``by`` group of ``df`` (a ``dur`` column, ns): count, total, min, median, max, sample stddev (nsys
    stats' columns), and ``share`` of the grand total; largest total first."""
    d = pl.col("dur")
    out = (df.group_by(by).agg(count=pl.len(), total_ns=d.sum(), min_ns=d.min(), max_ns=d.max(),
                               median_ns=d.median(), stddev_ns=d.std(ddof=1).fill_null(0.0), **(extra or {}))
           .sort(["total_ns", *by], descending=[True, *([False] * len(by))], nulls_last=True))
    grand = out["total_ns"].sum() or 0
    return out.with_columns(share=(pl.col("total_ns") / grand) if grand else pl.lit(0.0))


def _stat_fields(r: dict) -> dict:
    n = r["count"]
    return dict(count=int(n), total_ms=r["total_ns"] / 1e6, mean_us=r["total_ns"] / n / 1e3,
                median_ms=r["median_ns"] / 1e6, min_ms=r["min_ns"] / 1e6, max_ms=r["max_ns"] / 1e6,
                stddev_ms=r["stddev_ns"] / 1e6, share=float(r["share"]))


def memop_table(memops: pl.DataFrame) -> tuple[MemopRow, ...]:
    """``cuda_gpu_mem_time_sum``: the memory operations by name (their kind and direction), with their bytes."""
    df = memops.select("name", "kind", "copy_kind", "bytes", dur=pl.col("end") - pl.col("start"))
    agg = _summary(df, ["name"], {"kind": pl.col("kind").first(), "copy_kind": pl.col("copy_kind").first(),
                                  "bytes": pl.col("bytes").sum()})
    return tuple(MemopRow(name=r["name"], kind=r["kind"], copy_kind=r["copy_kind"], bytes=int(r["bytes"] or 0),
                          **_stat_fields(r)) for r in agg.iter_rows(named=True))


def api_table(calls: pl.DataFrame) -> tuple[ApiRow, ...]:
    """``cuda_api_sum`` of ``calls`` (``name``, ``dur``; nsys: also ``name_id``, what nsys groups by)."""
    by = ["name_id", "name"] if "name_id" in calls.columns else ["name"]
    agg = _summary(calls.select(*by, "dur"), by)
    return tuple(ApiRow(name=r["name"], **_stat_fields(r)) for r in agg.iter_rows(named=True))


def range_table(ranges: pl.DataFrame) -> tuple[RangeRow, ...]:
    """``nvtx_sum`` of ``ranges`` (``name``, ``style``, ``dur``)."""
    agg = _summary(ranges.select("name", "style", "dur"), ["name", "style"])
    return tuple(RangeRow(name=r["name"], style=r["style"], **_stat_fields(r)) for r in agg.iter_rows(named=True))


# ───────────────────────── utilisation ─────────────────────────

def _gpu_activity(trace: Trace, device: int | None) -> pl.DataFrame:
    cols = ["start", "end", "device", "stream"]
    parts = [trace.kernels.select(*cols, is_kernel=pl.lit(True)),
             trace.memops.select(*cols, is_kernel=pl.lit(False)),
             trace.graph_execs.select(*cols, is_kernel=pl.lit(False))]
    acts = pl.concat(parts, how="vertical_relaxed")
    return acts.filter(pl.col("device") == device) if device is not None else acts


def _union(acts: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    """``by`` + ``union_ns`` (the length the group's intervals cover) + ``n`` + ``kernel_ns``; one group (one GPU, one
    stream: the usual trace) is swept without a window over the groups."""
    from tracekit.intervals import union_length

    dur = pl.col("end") - pl.col("start")
    kern = acts.group_by(by).agg(n=pl.len(), kernel_ns=dur.filter(pl.col("is_kernel")).sum())
    if kern.height == 1:
        reach = pl.col("end").cum_max().shift(1)
        u = acts.lazy().select("start", "end").sort("start").select(union_ns=(pl.col("end") - pl.max_horizontal(
            "start", reach.fill_null(pl.col("start")))).clip(lower_bound=0).sum()).collect()
        return kern.with_columns(union_ns=pl.lit(u["union_ns"][0], pl.Int64))
    return union_length(acts, by).collect().join(kern, on=by)


def utilisation(trace: Trace, device: int | None = None) -> Utilisation:
    """GPU and stream utilisation over the trace's GPU window (every GPU's activities: the same window whatever
    ``device`` restricts the rows to)."""
    every = _gpu_activity(trace, None)
    if every.height == 0:
        return Utilisation(start_ns=None, end_ns=None, window_ms=0.0, devices=(), streams=())
    t0, t1 = int(every["start"].min()), int(every["end"].max())
    window = max(t1 - t0, 1)
    acts = _gpu_activity(trace, device)
    dev = _union(acts, ["device"]).sort("device")
    st = _union(acts, ["device", "stream"]).sort(["union_ns", "device", "stream"], descending=[True, False, False])
    return Utilisation(
        start_ns=t0, end_ns=t1, window_ms=(t1 - t0) / 1e6,
        devices=tuple(DeviceUse(device=int(r["device"]), busy_ms=r["union_ns"] / 1e6, kernel_ms=r["kernel_ns"] / 1e6,
                                utilisation=r["union_ns"] / window) for r in dev.iter_rows(named=True)),
        streams=tuple(StreamUse(device=int(r["device"]), stream=int(r["stream"]), count=int(r["n"]),
                                busy_ms=r["union_ns"] / 1e6, kernel_ms=r["kernel_ns"] / 1e6,
                                utilisation=r["union_ns"] / window) for r in st.iter_rows(named=True)))


# ───────────────────────── coverage ─────────────────────────

def coverage_of(st) -> StatsCoverage:
    """In and outside the analysed steps of a :class:`~tracekit.analyses.partition.StepTable`: the kernel and
    memcpy/memset records of its device (as recorded, unclipped), each counted once."""
    acts = st.attribution.activities.filter(pl.col("kind") != "graph_exec").select(
        "step", "start", dur=pl.col("end") - pl.col("start"))
    periods = st.periods.select("step", "p_start", "p_end", "reason")
    analysed = periods.filter(pl.col("reason").is_null())
    first = analysed["p_start"].min() if analysed.height else None
    last = analysed["p_end"].max() if analysed.height else None
    a = acts.join(periods.select("step", "reason"), on="step", how="left")
    in_step = pl.col("step").is_not_null() & pl.col("step").is_in(analysed["step"].implode())
    reason = (pl.when(in_step).then(pl.lit(None, pl.String))
              .when(pl.col("step").is_not_null() & pl.col("reason").is_not_null()).then(pl.col("reason"))
              .when(pl.lit(first is None)).then(pl.lit("no analysed step"))
              .when(pl.col("start") < (first if first is not None else 0)).then(pl.lit("before the first step"))
              .when(pl.col("start") >= (last if last is not None else 0)).then(pl.lit("after the last step"))
              .otherwise(pl.lit("between step windows")))
    by = a.with_columns(why=reason).group_by("why").agg(ns=pl.col("dur").sum())
    total = int(acts["dur"].sum() or 0)
    inside = int(by.filter(pl.col("why").is_null())["ns"].sum() or 0)
    outside = {r["why"]: r["ns"] / 1e6 for r in by.filter(pl.col("why").is_not_null()).sort(
        "ns", descending=True).iter_rows(named=True)}
    return StatsCoverage(device=int(st.device), steps=int(st.table.height), kernel_ms_total=total / 1e6,
                         kernel_ms_in_steps=inside / 1e6, kernel_ms_outside_steps=(total - inside) / 1e6,
                         outside_share=(total - inside) / total if total else 0.0, outside_by_reason=outside)


# ───────────────────────── what launched the kernels ─────────────────────────

def _frames(trace: Trace) -> dict[str, pl.DataFrame]:
    """Host intervals per grouping (``pid, tid, start, end, op``: the launcher's name in ``op``)."""
    from tracekit.classify import op_frames
    from tracekit.steps import name_pattern

    out = {"op": op_frames(trace)}
    host = trace.ops.filter(pl.col("end").is_not_null())
    if host.height:
        names = host["name"].unique()
        text = names.cast(pl.String)
        kinds = pl.DataFrame({"name": names, "module": text.str.starts_with("nn.Module: "),
                              "python": text.str.contains(r"\.py\(\d+\): ")})
        host = host.join(kinds, on="name", how="inner", maintain_order="left")
        mod = host.filter(pl.col("module"))
        out["module"] = mod.select("pid", "tid", "start", "end", op=name_pattern(pl.col("name").cast(pl.String)))
        out["python"] = host.filter(pl.col("python")).select("pid", "tid", "start", "end",
                                                             op=pl.col("name").cast(pl.String))
    rng = trace.ranges.filter(pl.col("end").is_not_null())
    out["range"] = rng.select("pid", "tid", "start", "end", op=name_pattern(pl.col("name")))
    return {k: v.sort("start") for k, v in out.items() if v.height}


def launched_by(trace: Trace, kernels: pl.DataFrame) -> dict[str, tuple[LaunchRow, ...]]:
    """Kernel time of ``kernels`` per launcher, one partition per grouping the trace records (module docstring)."""
    from tracekit.classify import launching_ops

    if kernels.height == 0:
        return {}
    k = kernels.select("pid", "correlation", dur=pl.col("end") - pl.col("start"))
    calls = trace.launches.select("pid", "correlation", "tid", "start", api="name")  # (api: categorical)
    joined = k.join(calls, on=["pid", "correlation"], how="left")
    if joined.height != k.height:  # a correlation id on two calls of one process (a damaged table): the first call
        calls = calls.unique(["pid", "correlation"], keep="first", maintain_order=True)
        joined = k.join(calls, on=["pid", "correlation"], how="left")
    k = joined
    grand = int(k["dur"].sum() or 0)
    out: dict[str, tuple[LaunchRow, ...]] = {}

    def rows(names: pl.Expr, frame: pl.DataFrame) -> tuple[LaunchRow, ...]:
        agg = (frame.select(name=names, dur="dur").group_by("name").agg(kernels=pl.len(), ns=pl.col("dur").sum())
               .with_columns(pl.col("name").cast(pl.String)).sort(["ns", "name"], descending=[True, False]))
        return tuple(LaunchRow(name=r["name"], kernels=int(r["kernels"]), total_ms=r["ns"] / 1e6,
                               share=r["ns"] / grand if grand else 0.0) for r in agg.iter_rows(named=True))

    out["api"] = rows(pl.col("api").cast(pl.String).fill_null(NO_LAUNCH), k.select("api", "dur")) if \
        k["api"].null_count() else rows(pl.col("api"), k.select("api", "dur"))
    launched = k.filter(pl.col("tid").is_not_null())
    for key, frames in _frames(trace).items():
        found = launched.select("dur", launcher=launching_ops(frames, launched))
        if found["launcher"].null_count() == found.height:
            continue  # none of the launches is inside one: no such grouping in this trace
        # (the kernels with no recorded launch: one row of their own)
        unlaunched = k.height - launched.height
        both = found.select(name=pl.col("launcher").fill_null(NONE_OPEN), dur="dur")
        if unlaunched:
            both = pl.concat([both, k.filter(pl.col("tid").is_null()).select(name=pl.lit(NO_LAUNCH), dur="dur")])
        out[key] = rows(pl.col("name"), both)
    return {g: out[g] for g in GROUPINGS if g in out}


# ───────────────────────── the result ─────────────────────────

def summarise(trace: Trace, *, calls: pl.DataFrame, ranges: pl.DataFrame, steps=None, device: int | None = None,
              rules=None, warnings: tuple[str, ...] = ()) -> Stats:
    """The ``tracekit stats`` tables of ``trace`` (see the module docstring) from the host tables the run layer read
    (``calls``: API calls, ``name`` and ``dur``; ``ranges``: ``name``, ``style``, ``dur``) and the
    :class:`~tracekit.analyses.partition.StepTable` of its steps (None: none found). ``device``: restrict the GPU
    tables (kernels, memops, utilisation rows, launched_by) to that GPU (default: every GPU)."""
    ks = kernel_summary(trace, device=device, rules=rules)
    memops = trace.memops if device is None else trace.memops.filter(pl.col("device") == device)
    kernels = trace.kernels if device is None else trace.kernels.filter(pl.col("device") == device)
    return Stats(source=Source.of(trace.meta), device=device, kernels=ks.kernels, memops=memop_table(memops),
                 api=api_table(calls), ranges=range_table(ranges), utilisation=utilisation(trace, device),
                 coverage=None if steps is None else coverage_of(steps), launched_by=launched_by(trace, kernels),
                 warnings=tuple(dict.fromkeys([*ks.warnings, *warnings])))
