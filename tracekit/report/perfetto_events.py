"""The trace's own events for ``tracekit export --perfetto``: what the analysis read, kept beside what it found.

Every GPU activity, host call, range, op and launch flow of the :class:`~tracekit.trace.Trace`, as Chrome-trace event
frames (polars; no loop over events), laid out as the profilers draw them:

* one process per GPU (``pid`` :data:`GPU_PID_BASE` + device, named ``GPU <device>: <name>``), one thread per
  stream: every kernel (``cat`` ``kernel``), memcpy / memset (``memcpy`` / ``memset``) and whole-graph execution
  (``graph``), ``args`` with its correlation id (and bytes, copy kind, graph id);
* the host threads under their own process and thread ids: every CUDA runtime / driver call given (``cuda_api``; for
  an nsys export the command reads every call of the runtime table: ``tracekit.run.stats.host_calls``), the
  NVTX ranges or annotations (``nvtx`` / ``annotation``; a range with no end is left out) and, in a Kineto trace, the
  framework ops and Python frames (``cpu_op``, ``python_function``);
* one flow (``ph`` ``s`` at the call, ``f`` at the activity, ``cat`` ``ac2g`` as Kineto names them) from each launch to
  each GPU activity it put on the GPU (joined on process and correlation id; a graph launch to every kernel it
  replayed).

Timestamps are µs on the trace's clock, as tracekit's own tracks (``tracekit.report.perfetto``), so both line up.
"""

from __future__ import annotations

from collections.abc import Callable

import polars as pl

from tracekit.trace import Trace

# GPU "processes": far above any Linux pid (at most 2^22), so that no host process shares one
GPU_PID_BASE = 1 << 30
FLOW = "ac2g"


def _us(col: str) -> pl.Expr:
    return pl.col(col) / 1e3


def _x(df: pl.DataFrame, *, name: pl.Expr, cat: pl.Expr | str, pid: pl.Expr, tid: pl.Expr, args: dict) -> pl.DataFrame:
    """X events: name, cat, ph, pid, tid, ts, dur (µs), args."""
    return df.select(name=name, cat=pl.lit(cat) if isinstance(cat, str) else cat, ph=pl.lit("X"),
                     pid=pid.cast(pl.Int64), tid=tid.cast(pl.Int64), ts=_us("start"),
                     dur=(pl.col("end") - pl.col("start")) / 1e3, args=pl.struct(**args))


def _gpu_pid() -> pl.Expr:
    return pl.lit(GPU_PID_BASE, pl.Int64) + pl.col("device").cast(pl.Int64)


def _kernels(trace: Trace) -> list[pl.DataFrame]:
    return [_x(trace.kernels, name=pl.col("name").cast(pl.String).fill_null("?"), cat="kernel", pid=_gpu_pid(),
               tid=pl.col("stream"), args={"correlation": pl.col("correlation"), "device": pl.col("device")})]


def _memops(trace: Trace) -> list[pl.DataFrame]:
    return [_x(trace.memops, name=pl.col("name"), cat=pl.col("kind"), pid=_gpu_pid(), tid=pl.col("stream"),
               args={"correlation": pl.col("correlation"), "bytes": pl.col("bytes"),
                     "copy_kind": pl.col("copy_kind")})]


def _graph_execs(trace: Trace) -> list[pl.DataFrame]:
    return [_x(trace.graph_execs, name=pl.format("graph {}", pl.col("graph_id").fill_null(-1)), cat="graph",
               pid=_gpu_pid(), tid=pl.col("stream"), args={"correlation": pl.col("correlation"),
                                                            "graph_id": pl.col("graph_id")})]


def _api(calls: pl.DataFrame) -> list[pl.DataFrame]:
    return [_x(calls, name=pl.col("name"), cat="cuda_api", pid=pl.col("pid"), tid=pl.col("tid"),
               args={"correlation": pl.col("correlation")})]


def _ranges(trace: Trace) -> list[pl.DataFrame]:
    rng = trace.ranges.filter(pl.col("end").is_not_null())
    return [_x(rng, name=pl.col("name"), cat="annotation" if trace.meta.producer == "kineto" else "nvtx",
               pid=pl.col("pid"), tid=pl.col("tid"), args={"domain": pl.col("domain"), "depth": pl.col("depth")})]


def _ops(trace: Trace) -> list[pl.DataFrame]:
    ops = trace.ops.filter(pl.col("end").is_not_null())
    if ops.height == 0:
        return []
    names = ops["name"].unique()
    text = names.cast(pl.String)
    kind = pl.DataFrame({"name": names, "py": text.str.contains(r"\.py\(\d+\): ") | text.str.starts_with("nn.Module: ")})
    ops = ops.join(kind, on="name", how="left", maintain_order="left")
    return [_x(ops, name=pl.col("name").cast(pl.String), cat=pl.when(pl.col("py")).then(
        pl.lit("python_function")).otherwise(pl.lit("cpu_op")), pid=pl.col("pid"), tid=pl.col("tid"),
        args={"input_dims": pl.col("input_dims").cast(pl.String)})]


def original_events(trace: Trace, calls: pl.DataFrame
                    ) -> tuple[list[dict], list[tuple[str, Callable[[], list[pl.DataFrame]]]]]:
    """``(metadata events, producers)`` of every original event of ``trace`` and its host API ``calls``
    (``start, end, pid, tid, correlation, name``: ``tracekit.run.stats.host_calls``). A producer is ``(kind, make)``:
    ``make()`` builds that kind's event frames (``kernels``, ``memops``, ``graph_execs``, ``api_calls``, ``ranges``,
    ``ops``, ``flows``: the start and the finish events), one kind at a time, so that a writer holds one kind's
    events at once, never all of them."""
    names = dict(zip(trace.gpus["device"].to_list(), trace.gpus["name"].to_list()))
    streams = pl.concat([f.select("device", "stream") for f in (trace.kernels, trace.memops, trace.graph_execs)],
                        how="vertical_relaxed").unique().drop_nulls().sort("device", "stream")
    meta: list[dict] = []
    for d in streams["device"].unique().sort().to_list():
        pid = GPU_PID_BASE + d
        label = f"GPU {d}: {names[d]}" if names.get(d) else f"GPU {d}"
        meta += [{"ph": "M", "pid": pid, "tid": 0, "name": "process_name", "args": {"name": label}},
                 {"ph": "M", "pid": pid, "tid": 0, "name": "process_sort_index", "args": {"sort_index": 1 + d}}]
    meta += [{"ph": "M", "pid": GPU_PID_BASE + d, "tid": s, "name": "thread_name", "args": {"name": f"stream {s}"}}
             for d, s in streams.iter_rows()]  # (one per stream: a few dozen)
    producers = [("kernels", lambda: _kernels(trace)), ("memops", lambda: _memops(trace)),
                 ("graph_execs", lambda: _graph_execs(trace)), ("api_calls", lambda: _api(calls)),
                 ("ranges", lambda: _ranges(trace)), ("ops", lambda: _ops(trace)),
                 ("flows", lambda: _flows(trace, calls))]
    return meta, producers


def _flows(trace: Trace, calls: pl.DataFrame) -> list[pl.DataFrame]:
    """Flows joined on (host process, correlation): each GPU activity's own process is the trace's ``pid``."""
    acts = pl.concat([
        f.select("pid", "stream", "start", "correlation", dev="device")
        for f in (trace.kernels, trace.memops, trace.graph_execs)], how="vertical_relaxed")
    host = calls.select("pid", "correlation", h_tid="tid", h_start="start").unique(
        ["pid", "correlation"], keep="first", maintain_order=True)
    j = acts.join(host, on=["pid", "correlation"], how="inner").with_row_index("id")
    s = j.select(name=pl.lit("launch"), cat=pl.lit(FLOW), ph=pl.lit("s"), id="id", pid="pid", tid="h_tid",
                 ts=_us("h_start"))
    f = j.select(name=pl.lit("launch"), cat=pl.lit(FLOW), ph=pl.lit("f"), bp=pl.lit("e"), id="id",
                 pid=(pl.lit(GPU_PID_BASE, pl.Int64) + pl.col("dev").cast(pl.Int64)), tid=pl.col("stream"),
                 ts=_us("start"))
    return [s, f]
