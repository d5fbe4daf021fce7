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


def gpu_activities(trace: Trace) -> list[pl.DataFrame]:
    """Kernels, memory operations and graph executions as X events (column ``correlation`` kept for the flows)."""
    k = _x(trace.kernels, name=pl.col("name").cast(pl.String).fill_null("?"), cat="kernel", pid=_gpu_pid(),
           tid=pl.col("stream"), args={"correlation": pl.col("correlation"), "device": pl.col("device")})
    m = _x(trace.memops, name=pl.col("name"), cat=pl.col("kind"), pid=_gpu_pid(), tid=pl.col("stream"),
           args={"correlation": pl.col("correlation"), "bytes": pl.col("bytes"), "copy_kind": pl.col("copy_kind")})
    g = _x(trace.graph_execs, name=pl.format("graph {}", pl.col("graph_id").fill_null(-1)), cat="graph",
           pid=_gpu_pid(), tid=pl.col("stream"), args={"correlation": pl.col("correlation"),
                                                        "graph_id": pl.col("graph_id")})
    return [k, m, g]


def host_events(trace: Trace, calls: pl.DataFrame) -> list[pl.DataFrame]:
    """Host calls, ranges and (Kineto) ops / Python frames as X events on their own threads."""
    api = _x(calls, name=pl.col("name"), cat="cuda_api", pid=pl.col("pid"), tid=pl.col("tid"),
             args={"correlation": pl.col("correlation")})
    rng = trace.ranges.filter(pl.col("end").is_not_null())
    ranges = _x(rng, name=pl.col("name"), cat="annotation" if trace.meta.producer == "kineto" else "nvtx",
                pid=pl.col("pid"), tid=pl.col("tid"), args={"domain": pl.col("domain"), "depth": pl.col("depth")})
    out = [api, ranges]
    ops = trace.ops.filter(pl.col("end").is_not_null())
    if ops.height:
        names = ops["name"].unique()
        text = names.cast(pl.String)
        kind = pl.DataFrame({"name": names, "py": text.str.contains(r"\.py\(\d+\): ") | text.str.starts_with(
            "nn.Module: ")})
        ops = ops.join(kind, on="name", how="left", maintain_order="left")
        out.append(_x(ops, name=pl.col("name").cast(pl.String), cat=pl.when(pl.col("py")).then(
            pl.lit("python_function")).otherwise(pl.lit("cpu_op")), pid=pl.col("pid"), tid=pl.col("tid"),
            args={"input_dims": pl.col("input_dims").cast(pl.String)}))
    return out


def original_events(trace: Trace, calls: pl.DataFrame) -> tuple[list[dict], list[pl.DataFrame], dict[str, int]]:
    """``(metadata events, event frames, counts)`` of every original event of ``trace`` and its host API ``calls``
    (``start, end, pid, tid, correlation, name``: ``tracekit.run.stats.host_calls``): counts by kind (``kernels``,
    ``memops``, ``graph_execs``, ``api_calls``, ``ranges``, ``ops``, ``flows``)."""
    gpu = gpu_activities(trace)
    host = host_events(trace, calls)
    fl = _flows(trace, calls)
    names = dict(zip(trace.gpus["device"].to_list(), trace.gpus["name"].to_list()))
    devices = sorted(set(pl.concat([f.select("pid") for f in gpu])["pid"].unique().to_list()))
    meta: list[dict] = []
    for pid in devices:
        d = pid - GPU_PID_BASE
        label = f"GPU {d}: {names[d]}" if names.get(d) else f"GPU {d}"
        meta += [{"ph": "M", "pid": pid, "tid": 0, "name": "process_name", "args": {"name": label}},
                 {"ph": "M", "pid": pid, "tid": 0, "name": "process_sort_index", "args": {"sort_index": 1 + d}}]
    streams = pl.concat([f.select("pid", "tid") for f in gpu]).unique().sort("pid", "tid")
    meta += [{"ph": "M", "pid": p, "tid": t, "name": "thread_name", "args": {"name": f"stream {t}"}}
             for p, t in streams.iter_rows()]  # (one per stream: a few dozen)
    counts = {"kernels": gpu[0].height, "memops": gpu[1].height, "graph_execs": gpu[2].height,
              "api_calls": host[0].height, "ranges": host[1].height, "ops": host[2].height if len(host) > 2 else 0,
              "flows": fl[0].height}
    return meta, [*gpu, *host, *fl], counts


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
