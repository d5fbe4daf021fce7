"""Reader for PyTorch profiler / Kineto Chrome-trace JSON (``.json`` and ``.json.gz``).

This module and its three parts own every Kineto quirk; what leaves them is a :class:`tracekit.trace.Trace`.
As Perfetto splits its JSON importer into a tokenizer and a parser, the work is split in three:

* ``stream``: bytes -> decoded events, chunk by chunk (streaming, gzip, cutting, msgspec Structs);
* ``columns``: decoded events -> typed polars frames, one per event group;
* ``header``: the top-level keys around ``traceEvents`` -> versions, ranks, GPUs;

and :func:`read_kineto` here assembles the frames into a ``Trace`` (host pids, graph mode, warnings). A plain-JSON
file of 256 MB or more is read by two processes, this one up to a cut and a worker from it (``split``,
``worker``: the same pieces, the same code, the same frames row for row).

How it reads (and why):

* No ``json.load``: the file is streamed (read, or gunzipped, 1 MB at a time in a second
  thread: I/O and zlib release the GIL) and the ``traceEvents`` array is cut between two
  events into ~1 MB pieces, each decoded by ``msgspec`` into small typed Structs that name
  only the fields we use (msgspec skips everything else, e.g. ``Concrete Inputs``, without
  building Python objects for it; an event's ``args`` stays JSON text until its group needs it:
  the host work's never does). A piece is decoded from a memoryview of its buffer, with
  the byte after its last event overwritten by ``]``: it is copied once, when its blocks
  are joined. Memory is bounded by the piece size plus the normalized frames, not by the
  file (docs/kineto-reader.md has the numbers).
* Events are grouped by category with C-level maps over the Structs (``map``,
  ``compress``, dict lookups), never a Python loop per event; of the ``cpu_op`` events only
  matmul-like ones are kept. A group's fields become polars columns piece by piece and are
  typed in batches of ``_BATCH`` rows, one polars query each (a query costs about the same
  for 10 rows as for 10 000), in a second thread while the next pieces are decoded.
* Exact timestamps: scalars whose JSON type varies between producers (``ts``, ``dur``,
  ``pid``, ``args.stream`` ...) are decoded untyped, with ``float_hook`` keeping a float as
  its JSON text. A column of ints becomes Int64 as is; any other column is text, parsed by
  polars. ``ts`` is float microseconds, and a float64 cannot hold an epoch-µs value to the
  nanosecond (1.7e15 µs has a 0.25 µs ulp), so its integer and fraction digits are parsed
  apart and rounded to int64 ns (Perfetto's ``CoerceToTs`` does the same for string
  timestamps). Array fields (``grid``, ``Input Dims``) and rare strings are kept as
  ``msgspec.Raw`` (the exact JSON text), turned into str by a C-level ``map``.
* Names: a decode loop repeats a few dozen kernel names of hundreds of bytes each; every
  distinct name is stored once and the rows are views of it (runtime API names get their
  version suffix stripped and their ``kind`` once per distinct name).
* Categories old and new: ``kernel``/``Kernel``, ``cuda_runtime``/``Runtime``,
  ``cuda_driver``, ``gpu_memcpy``/``Memcpy``, ``gpu_memset``/``Memset``,
  ``user_annotation``, ``cpu_op``/``Operator`` (matched case-insensitively). Flow events
  (``ac2g``, ``async_cpu_to_gpu``, ``async``) are not needed: GPU activity and its launch
  share ``args.correlation``, and graph-replayed kernels carry their graph launch's.
  ``gpu_user_annotation`` mirrors are not ranges. ``displayTimeUnit`` is a display hint
  only; ``ts``/``dur`` are µs in every variant (legacy PyTorch 1.8 traces use absolute
  epoch µs, which needs no special case).
* Legacy (PyTorch 1.8) traces: string tids such as ``'stream 7'`` or ``'1890023232'``
  (the trailing integer is taken), ``Operator`` for both ops and annotations (only
  ``ProfilerStep#N`` can be told apart, so only those become ranges), ``Input dims``.
"""

from __future__ import annotations

import io
import time
from pathlib import Path

import polars as pl

import tracekit.readers.kineto.split as split
from tracekit import trace as schema
from tracekit.readers.common import nesting_depth, release_freed_memory
from tracekit.readers.kineto.columns import MATMUL_OPS, Frames
from tracekit.readers.kineto.header import (
    distributed,
    gpus_from_header,
    header_text,
    merge_into,
    process_groups,
    producer_version,
)
from tracekit.readers.kineto.stream import (
    DECODER,
    ArgsError,
    Decoded,
    Doc,
    fail,
    iter_chunks,
    iter_chunks_from,
)
from tracekit.trace import Trace, TraceMeta, conform, empty

__all__ = ["read_kineto", "MATMUL_OPS"]


def by_start(df: pl.DataFrame) -> pl.DataFrame:
    """``df.sort("start")`` (stable): ``df`` itself, flagged, when it is in start order already (the runtime calls
    and kernels of a trace mostly are): no copy of every column.

    >>> by_start(pl.DataFrame({"start": [1, 1, 2], "x": [3, 1, 2]}))["x"].to_list(), by_start(pl.DataFrame({"start": [2, 1, 1], "x": [3, 1, 2]}))["x"].to_list()
    ([3, 1, 2], [1, 2, 3])
    """
    return df.with_columns(pl.col("start").set_sorted()) if df["start"].is_sorted() else df.sort("start")


# torch.profiler's own frame that starts recording, as the Python tracer records it (with_stack=True): a frame
# open when the tracer started, so it is recorded on the thread that called it (torch/profiler/profiler.py).
_START_FRAME = r"torch/profiler/profiler\.py\(\d+\): start_trace$"


def _capture_start(spans: pl.DataFrame | None, ops: pl.DataFrame, names: pl.Series | None = None
                   ) -> schema.CaptureStart | None:
    """When recording began: the end of torch.profiler's ``start_trace`` frame on its thread where the Python
    tracer recorded it, else the start of the profiler's ``PyTorch Profiler (N)`` span (thread unknown), else
    None. ``names``: every distinct name of ``ops`` (the pattern is then matched once per distinct name, not once
    per op: two million ops of a 1 GB trace)."""
    if names is None:
        frame = ops.filter(pl.col("name").cast(pl.String).str.contains(_START_FRAME).fill_null(False)).head(1)
    else:
        hits = names.filter(names.str.contains(_START_FRAME).fill_null(False))
        frame = ops.filter(pl.col("name").is_in(hits.implode())).head(1) if hits.len() else ops.clear()
    if frame.height:
        r = frame.row(0, named=True)
        return schema.CaptureStart(ns=int(r["end"]), call="torch.profiler start_trace", pid=r["pid"], tid=r["tid"])
    if spans is not None:
        span = spans.filter(pl.col("name").str.starts_with("PyTorch Profiler")).sort("start").head(1)
        if span.height:
            return schema.CaptureStart(ns=int(span["start"][0]), call="PyTorch Profiler span")
    return None


def read_kineto(path: Path, *, kernel_dims: bool = True) -> Trace:
    """Read a PyTorch profiler / Kineto trace (``.json`` or ``.json.gz``) into a :class:`Trace`.

    Raises :class:`tracekit.errors.TracekitError` (one line) for unusable input. A trace with
    no GPU activity loads, with empty frames and a warning. ``kernel_dims=False`` skips the
    kernels' grid/block (then null), which no analysis uses.
    """
    path = Path(path)
    worker = split.take(path, kernel_dims)  # (None: read here alone)
    st = Decoded(path)
    frames = Frames(kernel_dims)
    try:
        return _read(path, st, frames, worker)
    finally:
        frames.close()
        if worker is not None:
            worker.stop()


def _batches(records, end: dict):
    """The worker's batch records as Frames.take wants them."""
    for header, body in records:
        df = pl.read_ipc(io.BytesIO(body))
        del body
        # (a column null in every row, e.g. the kernels' graph ids, costs nothing as read here: as read from IPC it
        # is 8 bytes a row, 16 MB of the 1 GB read's end)
        nulls = [pl.lit(None, s.dtype).alias(s.name) for s in df.iter_columns() if s.null_count() == df.height]
        yield header["g"], header["names"], df.with_columns(nulls) if nulls and df.height else df
    yield "ops", end["names"], pl.DataFrame()


def _add(path: Path, chunks, header: Doc, frames: Frames, codes_of: dict) -> None:
    for events, doc in chunks:
        if doc is not None:  # header fields (before traceEvents) and tail fields (after it)
            merge_into(header, doc)
        try:
            frames.add(events, codes_of)
        except ArgsError as e:
            raise fail(path, f"unexpected JSON structure ({e})") from None
        del events, doc


def _decode(path: Path, st: Decoded, frames: Frames, worker: split.Worker | None) -> tuple[Doc, dict]:
    """Decode the file into ``frames``: alone, or this process up to the worker's cut and the worker's records
    after it (read here when the worker fails). Returns the header and the worker's dropped-event counts."""
    header = Doc()
    codes_of: dict = {None: 0}
    extra_dropped: dict = {}
    if worker is None:
        _add(path, iter_chunks(path, st), header, frames, codes_of)
    else:
        # (the pieces up to the cut are those of a read alone; if none ends at the cut, this reads on to the end)
        began = time.monotonic()
        _add(path, iter_chunks(path, st, worker.cut), header, frames, codes_of)
        # (a worker still running long after this part took its time is stuck: its part is read here then)
        wait = max(split.WAIT_MIN_S, 4 * (time.monotonic() - began))
        got = worker.records(timeout=wait) if st.cut else None
        if st.cut and got is None:  # (the worker failed: the rest read here, errors and all)
            _add(path, iter_chunks_from(path, st, worker.cut), header, frames, codes_of)
        elif got is not None:
            records, end = got
            frames.take(_batches(records, end), end["in_order"])
            if end["tail"] is not None:
                merge_into(header, DECODER.decode(end["tail"]))
            st.nan_literals += end["nan"]
            extra_dropped = end["dropped"]
    return header, extra_dropped


def _device_frames(frames: Frames) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """The host API calls, then the kernels, collectives and memory operations, each GPU row given the pid of
    the process that launched it (its runtime call's, by correlation): launches, kernels, collectives, memops."""
    # --- host API calls -------------------------------------------------------------
    rt = frames.pop("runtime")
    if rt is not None:
        launches = conform(by_start(rt), schema.LAUNCHES)  # name without version suffix, kind: see _names
        del rt  # (each group's frame as read is freed once conformed, not held to the end of the read)
    else:
        launches = empty(schema.LAUNCHES)
    # (the first call of each correlation: what unique(keep="first", maintain_order=True) keeps, without its hash
    # table of every row: 47 MB of the 1 GB read's peak)
    corr_pid = (
        launches.filter(pl.col("correlation").is_not_null() & pl.col("correlation").is_first_distinct())
        .select("correlation", _host_pid="pid")
    )
    host_pids = launches["pid"].drop_nulls()
    default_pid = int(host_pids.mode().sort()[0]) if host_pids.len() else 0

    def host_pid(df: pl.DataFrame) -> pl.DataFrame:
        # GPU rows carry the device as pid; the launching process is the runtime call's
        # (the join of the correlations alone: the frame's other columns are not copied)
        pid = (df.select("correlation").join(corr_pid, on="correlation", how="left", maintain_order="left")
               .select(pid=pl.col("_host_pid").fill_null(default_pid)))
        return df.drop("pid", strict=False).hstack(pid)

    k = frames.pop("kernel")
    if k is not None:
        k = host_pid(k)
        collectives = conform(k.filter(pl.col("collective").is_not_null() & (pl.col("collective") != "")),
                              schema.COLLECTIVES).sort("start")
        kernels = by_start(conform(k, schema.KERNELS))
        del k
    else:
        kernels, collectives = empty(schema.KERNELS), empty(schema.COLLECTIVES)

    parts = []
    for kind in ("memcpy", "memset"):
        m = frames.pop(kind)
        if m is not None:
            parts.append(conform(host_pid(m).with_columns(kind=pl.lit(kind)), schema.MEMOPS))
    if parts:
        m = pl.concat(parts).with_columns(
            # 'Memcpy DtoH (Device -> Pinned)' -> DtoH; memsets have none
            copy_kind=pl.when(pl.col("kind") == "memcpy").then(pl.col("name").str.extract(r"(?i)memcpy\s+([A-Za-z]+to[A-Za-z]+)"))
        )
        memops = conform(m, schema.MEMOPS).sort("start")
        del m
    else:
        memops = empty(schema.MEMOPS)
    return launches, kernels, collectives, memops


def _graph_mode_and_warnings(st: Decoded, launches: pl.DataFrame, kernels: pl.DataFrame, memops: pl.DataFrame,
                             dropped: dict) -> tuple[str, list[str]]:
    """The graph trace mode ("node" when graphs were launched) and the read's warnings: the decoder's, NaN
    literals, graph launches without kernels (an overflowed buffer), no GPU activity, dropped events."""
    warnings = list(st.warnings)
    if st.nan_literals:
        warnings.append(f"{st.nan_literals} NaN/Infinity literals (not valid JSON) were read as null")
    graph_launches = launches.filter(pl.col("kind") == "graph")
    if graph_launches.height:
        mode = "node"
        recorded = pl.concat([kernels.select("pid", "correlation"), memops.select("pid", "correlation")]).unique()
        missing = graph_launches.join(recorded, on=["pid", "correlation"], how="anti").height
        if missing:
            api = graph_launches["name"].mode().sort()[0]
            warnings.append(
                f"{missing} of {graph_launches.height} {api} calls have no kernels recorded: the profiler's activity "
                "buffer likely overflowed; graph work is missing"
            )
    else:
        mode = "none"
    if kernels.height + memops.height == 0:
        warnings.append(
            "no GPU activity (kernels, memcpy, memset) in this trace: it was captured without CUDA activities "
            "(profile with activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])"
        )
    if dropped:
        what = ", ".join(f"{n} {g}" for g, n in sorted(dropped.items()))
        warnings.append(
            f"dropped {sum(dropped.values())} events with a missing, negative, NaN or implausible (> 1 day) time ({what})"
        )
    return mode, warnings


def _read(path: Path, st: Decoded, frames: Frames, worker: split.Worker | None = None) -> Trace:
    header, extra_dropped = _decode(path, st, frames, worker)

    launches, kernels, collectives, memops = _device_frames(frames)

    r = frames.pop("annotation")
    if r is not None:
        r = r.sort("pid", "tid", "start")
        ranges = conform(r.with_columns(depth=nesting_depth(r)), schema.RANGES).sort("start")
        del r
    else:
        ranges = empty(schema.RANGES)

    # ops: the matmul-like and all-reduce ops with their shapes, then every other CPU op and Python function
    # (host work, no shapes), in one frame in start order, put in order while the trace was read
    # (columns.OpsInOrder)
    spans = frames.pop("profiler")
    release_freed_memory()  # (what the decoding freed)
    ops = frames.pop_ops()
    if ops is not None:
        capture_start = _capture_start(spans, ops, frames.op_names())  # (matched once per distinct name)
        ops = conform(ops, schema.OPS)
    else:
        ops = empty(schema.OPS)
        capture_start = _capture_start(spans, ops)
    del spans
    dropped = dict(frames.dropped)
    for g, n in extra_dropped.items():
        dropped[g] = dropped.get(g, 0) + n
    del frames

    gpus = gpus_from_header(header.deviceProperties)
    if gpus is None or gpus.height == 0:
        seen = pl.concat([kernels.select("device"), memops.select("device")]).drop_nulls().unique().sort("device")
        gpus = conform(seen, schema.GPUS)

    mode, warnings = _graph_mode_and_warnings(st, launches, kernels, memops, dropped)

    rank, world_size = distributed(header.distributedInfo)
    meta = TraceMeta(
        path=str(path),
        format="kineto-json",
        producer="kineto",
        markers="annotation",
        producer_version=producer_version(header),
        schema_version=header_text(header.schemaVersion),
        graph_trace_mode=mode,
        rank=rank,
        world_size=world_size,
        process_groups=process_groups(header.distributedInfo),
        warnings=tuple(warnings),
        capture_start=capture_start,
    )
    return Trace(kernels=kernels, memops=memops, launches=launches, ranges=ranges, ops=ops, gpus=gpus, meta=meta,
                 graph_execs=empty(schema.GRAPH_EXECS), collectives=collectives).validate()
