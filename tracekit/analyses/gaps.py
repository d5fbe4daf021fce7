"""Where the GPU-idle time of a step goes: its gaps, by cause, and what the host was doing in each.

Definitions (../shared/spec/CONTRACT.md, ``gaps``). A *gap* is an interval of a step's period with no GPU
activity of the step. Gaps between the step's first and last activity are ``launch_gaps``; the rest of the
period, after its last activity, is ``idle`` = ``between_steps``. Each gap inside the step is charged to the
host interval that ends with the launch call of the work after it, from the end of the previous launch call on
that thread:

* ``graph_bubbles``: the work after the gap is a kernel replayed from the same CUDA graph launch as the work
  before it (graphs cannot remove these; fusion or programmatic dependent launch can);
* ``host_stalls``: the part of the gap during which that host interval is inside a synchronisation, a copy call
  that blocks the host (device-to-host, or from/to pageable host memory), an allocation, or a *range* (an NVTX
  range, a torch ``record_function`` annotation) that launches no GPU work (host work: sampling on the CPU,
  scheduling, a grammar mask), or a framework op or Python function that launches no GPU work and lasts longer than
  launches take (:data:`HOST_OP_LAUNCHES` x :func:`launch_ns`, the thread's median interval from one work launch
  call to the next; e.g. ``aten::unflatten_dense_tensors`` running 15 ms of views between two copies in HTA's DDP
  trace). A shorter op that launches nothing (``aten::view``, a module's ``__call__``, one slow dispatch under the
  profiler) is the dispatch cost CUDA graphs remove: it only *names* gaps;
* ``launch_overhead``: the rest (issuing work one launch at a time: framework dispatch and launch calls -
  what CUDA graphs remove).

Everything is vectorised: the stall intervals of each thread are merged once into disjoint segments with a
running total, and the stalled part of a gap is ``covered(hi) - covered(lo)`` by two as-of lookups.
Only the few largest gaps are named (a search per gap over sorted starts).
"""

from __future__ import annotations

import re

import polars as pl

from tracekit.intervals import asof, merge, one_thread
from tracekit.trace import WORK_KINDS, Trace

LARGEST = 10  # gaps.largest: the longest single gaps of any cause
# An op that launches nothing is host work when it lasts longer than this many launches take (launch_ns): under a
# profiler one dispatch varies several-fold (aten::t at 4x the median launch interval in hf-small-eager-torch), a
# host stall does not end within a few launches (aten::unflatten_dense_tensors: 15 ms, 170x, in HTA's DDP trace).
HOST_OP_LAUNCHES = 10
STALL_API_KINDS = ("sync", "alloc")


def host_only(intervals: pl.DataFrame, launches: pl.DataFrame) -> pl.Series:
    """For each interval (``pid``, ``tid``, ``start``, ``end``), whether no work launch call of its thread starts
    inside it (a range or op that launches no GPU work). ``launches``: the launch calls, in start order (those of
    :data:`~tracekit.trace.WORK_KINDS` are the work launches).

    >>> iv = pl.DataFrame({"pid": [1, 1], "tid": [2, 2], "start": [0, 100], "end": [50, 200]})
    >>> la = pl.DataFrame({"pid": [1, 1], "tid": [2, 2], "start": [10, 120], "kind": ["sync", "kernel"]})
    >>> host_only(iv, la).to_list()
    [True, False]
    """
    if intervals.height == 0:
        return pl.Series("host_only", [], dtype=pl.Boolean)
    if launches.height == 0:
        return pl.repeat(True, intervals.height, eager=True).alias("host_only")
    # The first work launch of the interval's thread at or after its start: the interval launches work when that
    # one starts by its end.
    ws = launches["start"].gather(work_rows(intervals, launches, "start", strategy="forward"))
    return (ws.is_null() | (ws > intervals["end"])).alias("host_only")


def work_rows(left: pl.DataFrame, launches: pl.DataFrame, on: str, strategy: str = "backward",
              allow_exact_matches: bool = True) -> pl.Series:
    """For each row of ``left`` (``pid``, ``tid``, ``on``): the row of ``launches`` (in start order) of the as-of
    matching *work* launch call (a kernel, graph, copy or memset launch) of its thread, as :func:`~tracekit.intervals.asof`
    matches (``backward``: the last one starting at or before ``on``, before it without exact matches;
    ``forward``: the first at or after it, after it without); null where none.

    When one thread made every call (the usual trace) the work calls are not copied out of ten million launches:
    a binary search over every call's start, then a step over the few other calls (synchronisations, ...) next
    to the match, found among those calls' own rows.

    >>> la = pl.DataFrame({"pid": [1] * 4, "tid": [2] * 4, "start": [0, 10, 20, 30],
    ...                    "kind": ["kernel", "sync", "sync", "kernel"]})
    >>> work_rows(pl.DataFrame({"pid": [1, 1, 1], "tid": [2, 2, 2], "t": [25, 30, 5]}), la, "t").to_list()
    [0, 3, 0]
    >>> work_rows(pl.DataFrame({"pid": [1, 1], "tid": [2, 2], "t": [5, 30]}), la, "t", "forward", False).to_list()
    [3, None]
    """
    is_work = launches["kind"].is_in(list(WORK_KINDS))
    starts = launches["start"]
    one = one_thread(launches)
    if one is None or starts.null_count() or not starts.is_sorted():
        work = launches.select("pid", "tid", ws="start").with_row_index("_row").filter(is_work)
        return asof(left.select("pid", "tid", on), work if work["ws"].is_sorted() else work.sort("ws"), on, "ws",
                    ["pid", "tid"], strategy=strategy, allow_exact_matches=allow_exact_matches)["_row"]
    n = launches.height
    keys = left[on]
    if strategy == "backward":
        j = starts.search_sorted(keys, side="right" if allow_exact_matches else "left").cast(pl.Int64) - 1
    else:
        j = starts.search_sorted(keys, side="left" if allow_exact_matches else "right").cast(pl.Int64)
    other = (~is_work).arg_true().cast(pl.Int64)  # the calls that launch no work: few
    if other.len():
        # runs of consecutive other calls: the work call before a run is its first row - 1, after it its last + 1
        new_run = other.diff().fill_null(2) != 1
        first = pl.select(pl.when(new_run).then(other).forward_fill()).to_series()
        last = pl.select(pl.when(new_run.shift(-1).fill_null(True)).then(other).backward_fill()).to_series()
        at = other.search_sorted(j.clip(0, n - 1), side="left").cast(pl.Int64)
        hit = (at < other.len()) & (other.gather(at.clip(0, other.len() - 1)) == j)
        step = (first if strategy == "backward" else last).gather(at.clip(0, other.len() - 1))
        j = pl.select(pl.when(hit).then(step - 1 if strategy == "backward" else step + 1).otherwise(j)).to_series()
    same = pl.lit(True)
    for c, v in zip(("pid", "tid"), one):
        same = same & (pl.col(c) == v)
    ok = (j >= 0) & (j < n) & keys.is_not_null()
    return left.select(pl.when(same & ok).then(j).cast(pl.UInt32).alias("_row"))["_row"]




def blocking_copies(trace: Trace, launches: pl.DataFrame) -> pl.DataFrame:
    """The launch calls (``pid``, ``tid``, ``start``, ``end``) of the copies that block the host: device-to-host,
    or from/to pageable host memory."""
    from tracekit.lookup import row_lookup

    calls = launches.select("pid", "tid", "start", "end")
    memcpy = launches["kind"] == "memcpy"
    m = trace.memops.filter(pl.col("kind") == "memcpy")
    if not (m.height and bool(memcpy.any())):
        return calls.clear()
    # (looked up among the copy calls alone, then mapped back to launch rows: a lookup over every launch of
    # ten million kernels cost a second for a few thousand copies)
    rows = memcpy.arg_true()  # (the copy calls' rows: few, and no column of every row number)
    row = rows.gather(row_lookup(m.select("pid", "correlation"),
                                 launches.select("pid", "correlation").filter(memcpy)))
    # (Kineto names its copies "Memcpy HtoD (Pageable -> Device)")
    pageable = pl.coalesce("pageable", pl.col("name").str.contains("Pageable"))
    # the launch call of each blocking copy (a gather of the few copies' rows, not a join of every launch)
    copies = m.select(_r=row, copy_kind="copy_kind", pageable=pageable.fill_null(False)).drop_nulls("_r")
    copies = copies.filter((pl.col("copy_kind") == "DtoH") | pl.col("pageable"))
    return calls[copies["_r"]].unique()


def host_waits(trace: Trace, launches: pl.DataFrame, copies: pl.DataFrame | None = None) -> pl.DataFrame:
    """The calls (``pid``, ``tid``, ``start``, ``end``) that return only once the GPU has caught up: device,
    stream and event synchronisations and the blocking copies (not ``cudaStreamWaitEvent``: the GPU waits there,
    not the host). A CUDA graph cannot span one: the host work after its return stays with graphs. ``copies``:
    :func:`blocking_copies`, when the caller has them already."""
    sync = launches.select("pid", "tid", "start", "end", "name").filter(launches["kind"] == "sync")
    sync = sync.filter(~pl.col("name").cast(pl.String).str.contains("WaitEvent")).drop("name")
    return pl.concat([sync, blocking_copies(trace, launches) if copies is None else copies]).unique()


def launch_ns(launches: pl.DataFrame) -> int | None:
    """What issuing one launch takes on the host, in ns: the median interval from one work launch call (a kernel,
    graph, copy or memset launch) to the next of the same thread, framework dispatch included (None without two
    such calls). An op that launches nothing and lasts longer than this is host work, not dispatch.

    >>> la = pl.DataFrame({"pid": [1] * 5, "tid": [2] * 5, "start": [0, 10, 15, 30, 5000],
    ...                    "kind": ["kernel", "sync", "kernel", "kernel", "kernel"]})
    >>> launch_ns(la)
    15
    """
    work = launches.lazy().filter(pl.col("kind").is_in(list(WORK_KINDS))).select("pid", "tid", "start")
    if one_thread(launches) is None:
        work = work.sort("pid", "tid", "start")
        step = pl.col("start").diff().over("pid", "tid")
    else:
        step = pl.col("start").diff()
    gap = work.select(step.alias("d")).filter(pl.col("d") > 0).select(pl.col("d").median()).collect().item()
    return None if gap is None else int(gap)


def stall_segments(trace: Trace, launches: pl.DataFrame, copies: pl.DataFrame | None = None) -> pl.DataFrame:
    """Disjoint per-thread intervals during which the host is stalled (see the module docstring): columns
    ``pid``, ``tid``, ``start``, ``end``, ``before`` (stalled time of the thread before ``start``). ``copies``:
    :func:`blocking_copies`, when the caller has them already."""
    # (narrow columns first, then the filters: a filter of the whole launch table copies every column of it)
    calls = launches.select("pid", "tid", "start", "end")
    parts = [calls.filter(launches["kind"].is_in(list(STALL_API_KINDS))),
             blocking_copies(trace, launches) if copies is None else copies]
    each = launch_ns(launches) if trace.ops.height else None
    longer = None if each is None else HOST_OP_LAUNCHES * each
    for frame, least in ((trace.ranges, 0), (trace.ops, longer)):  # (ops: only those longer than a launch takes)
        if least is None:
            continue
        iv = frame.filter(pl.col("end").is_not_null() & (pl.col("end") - pl.col("start") > least)).select(
            "pid", "tid", "start", "end")
        if iv.height:
            parts.append(iv.filter(host_only(iv, launches)))
    s = pl.concat([p.cast({"pid": pl.Int64, "tid": pl.Int64, "start": pl.Int64, "end": pl.Int64}) for p in parts])
    s = s.filter(pl.col("end") > pl.col("start"))
    if s.height == 0:
        return s.with_columns(before=pl.lit(0, pl.Int64))
    seg = merge(s, ["pid", "tid"]).collect()
    length = pl.col("end") - pl.col("start")
    return seg.with_columns(before=(length.cum_sum() - length).over("pid", "tid"))


def covered(points: pl.DataFrame, segments: pl.DataFrame) -> pl.Series:
    """Stalled time of each point's thread before the point: ``points`` has ``pid``, ``tid``, ``t``."""
    if points.height == 0 or segments.height == 0:
        return pl.repeat(0, points.height, dtype=pl.Int64, eager=True).alias("covered")
    j = asof(points.select("pid", "tid", "t"), segments.rename({"start": "ss", "end": "se"}).sort("ss"), "t", "ss",
             ["pid", "tid"])
    c = (pl.col("before") + (pl.min_horizontal("t", "se") - pl.col("ss")).clip(lower_bound=0)).fill_null(0)
    return j.select(c.alias("covered"))["covered"]


def stalled_part(holes: pl.DataFrame, launches: pl.DataFrame, segments: pl.DataFrame) -> pl.Series:
    """Nanoseconds of each hole (``h0``, ``h1``, ``launch`` = row of ``launches`` of the work after it) that the
    launching thread spent stalled, within the host interval that ends with that launch call."""
    n = holes.height
    if n == 0 or segments.height == 0:
        return pl.repeat(0, n, dtype=pl.Int64, eager=True).alias("stall")
    call = launches.select("pid", "tid", ls="start", le="end")[holes["launch"].fill_null(0)]
    h = holes.select("h0", "h1", has=pl.col("launch").is_not_null()).hstack(call)
    # The end of the previous work launch call on the thread (the host interval's start).
    prev = launches["end"].gather(work_rows(h, launches, "ls", allow_exact_matches=False))
    h = h.with_columns(prev_end=prev)
    h = h.with_columns(lo=pl.max_horizontal("h0", pl.col("prev_end").fill_null(pl.col("h0"))),
                       hi=pl.min_horizontal("h1", "le"))
    lo = covered(h.select("pid", "tid", t="lo"), segments)
    hi = covered(h.select("pid", "tid", t="hi"), segments)
    stall = pl.when(h["has"] & (h["hi"] > h["lo"])).then(hi - lo).otherwise(0)
    return h.select(stall=pl.min_horizontal(stall, pl.col("h1") - pl.col("h0")).clip(lower_bound=0))["stall"]


def waits_before(launches: pl.DataFrame, waits: pl.DataFrame) -> pl.DataFrame:
    """For each work launch call that follows a host wait (:func:`host_waits`) on its thread with no other work
    launch call between: ``launch`` (its row of ``launches``) and ``b_end`` (the latest such wait's return). One
    forward as-of lookup per wait."""
    if waits.height == 0:
        return pl.DataFrame(schema={"launch": pl.UInt32, "b_end": pl.Int64})
    w = waits.select("pid", "tid", "end").cast({"pid": pl.Int64, "tid": pl.Int64})
    if launches.schema["pid"] != pl.Int64 or launches.schema["tid"] != pl.Int64:
        launches = launches.cast({"pid": pl.Int64, "tid": pl.Int64})
    nxt = work_rows(w, launches, "end", strategy="forward")
    # per launch call that follows a wait: the latest return of a wait before it
    return w.with_columns(launch=nxt).drop_nulls("launch").group_by("launch").agg(b_end=pl.col("end").max())


def after_waits(holes: pl.DataFrame, launches: pl.DataFrame, waits: pl.DataFrame, segments: pl.DataFrame,
                ends: pl.DataFrame | None = None) -> pl.Series:
    """Nanoseconds of each hole (``h0``, ``h1``, ``launch``; graph bubbles excluded by the caller) that the
    launching thread spent after the return of a host wait (:func:`host_waits`) and before the launch call of
    the work after the hole, when no other work launch call of the thread came between, and not stalled
    (``segments``): the host work a synchronisation leaves the GPU waiting for (e.g. CPU sampling or a grammar
    mask after ``torch.cuda.synchronize()``). It is a part of the hole's launch overhead (the call itself is not
    in it). A join of the few holes whose launch follows a wait (:func:`waits_before`; ``ends``, when the
    caller has it)."""
    n = holes.height
    zero = pl.repeat(0, n, dtype=pl.Int64, eager=True).alias("after_waits")
    if n == 0 or waits.height == 0:
        return zero
    if ends is None:
        ends = waits_before(launches, waits)
    h = (holes.select("h0", "h1", "launch").with_row_index("_i").drop_nulls("launch")
         .with_columns(pl.col("launch").cast(pl.UInt32)).join(ends, on="launch", how="inner"))
    if h.height == 0:
        return zero
    call = launches.select("pid", "tid", ls="start")[h["launch"]]
    h = h.hstack(call).with_columns(lo=pl.max_horizontal("h0", "b_end"), hi=pl.min_horizontal("h1", "ls"))
    h = h.with_columns(hi=pl.max_horizontal("lo", "hi"))
    lo = covered(h.select("pid", "tid", t="lo"), segments)
    hi = covered(h.select("pid", "tid", t="hi"), segments)
    kept = ((h["hi"] - h["lo"]) - (hi - lo)).clip(lower_bound=0)
    return zero.scatter(h["_i"], kept.cast(pl.Int64))
def _rows_within(start: pl.Series, windows: list[tuple[int, int]]) -> pl.Series | None:
    """The rows (in order) whose ``start`` lies in some window ``[lo, hi)``, when ``start`` is in order without
    nulls (else None: filter instead).

    >>> _rows_within(pl.Series([1, 3, 5, 7, 9]), [(4, 8), (0, 2), (5, 6)]).to_list()
    [0, 2, 3]
    """
    if start.null_count() or not start.is_sorted():
        return None
    spans = sorted((int(start.search_sorted(lo, side="left")), int(start.search_sorted(hi, side="left")))
                   for lo, hi in windows)
    merged: list[list[int]] = []
    for a, b in spans:  # (a dozen windows, not events)
        if a >= b:
            continue
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    parts = [pl.int_range(a, b, dtype=pl.UInt32, eager=True) for a, b in merged]
    return pl.concat(parts) if parts else pl.Series([], dtype=pl.UInt32)


def name_gaps(gaps: pl.DataFrame, trace: Trace, launches: pl.DataFrame, skip: pl.DataFrame | None = None
              ) -> list[dict | None]:
    """For each gap (``h0``, ``h1``, ``pid``, ``tid``, ``launch``), the innermost range, op or API call on the
    launching thread that covers most of it (not the launch call after it): ``{"kind", "name"}`` or None.
    ``skip``: ranges (``pid``, ``tid``, ``start``) never to name, e.g. the step ranges themselves (they cover
    every gap of their step and say nothing about it).

    Meant for the few largest gaps (one binary search per gap over start-sorted candidates)."""
    frames = []
    for frame, kind in ((trace.ranges, "range"), (trace.ops, "op")):
        if kind == "range" and skip is not None and skip.height and frame.height:
            frame = frame.join(skip.select("pid", "tid", "start"), on=["pid", "tid", "start"], how="anti")
        if frame.height:
            frames.append((frame, kind))
    if launches.height:
        frames.append((launches, "api"))
    if not frames:
        return [None] * gaps.height
    # (the longest of the rows with an end: max skips the nulls)
    # (streamed: no ten-million-row column of durations made for one number)
    longest = max(int(f.lazy().select((pl.col("end") - pl.col("start")).max()).collect(engine="streaming").item()
                      or 0) for f, _ in frames)
    # Only candidates that start inside some gap's search window [h0 - longest, h1) can name it: the rest is
    # dropped before any text is made (ten million launches, ten gaps), and before any column is copied: in a
    # frame in start order, the rows of each window found by two binary searches.
    named = gaps.filter(pl.col("pid").is_not_null())
    windows = [(h0 - longest, h1) for h0, h1 in zip(named["h0"], named["h1"])]
    near = pl.any_horizontal(pl.col("start").is_between(lo, hi, closed="left")
                             for lo, hi in windows) if windows else pl.lit(False)
    cands = []
    for frame, kind in frames:
        rows = _rows_within(frame["start"], windows)
        if rows is None:
            frame = (frame.with_row_index("row") if kind == "api" else frame).filter(near)
        else:  # (the row of launches: a launch never names its own gap)
            frame = frame[rows].with_columns(row=rows) if kind == "api" else frame[rows]
        frame = frame.filter(pl.col("end").is_not_null())
        if kind == "api":
            cands.append(frame.select(
                "pid", "tid", "start", "end", name=pl.col("name").cast(pl.String),
                kind=pl.col("kind").cast(pl.String).replace_strict({"sync": "sync", "memcpy": "memcpy"},
                                                                   default="api"), row="row"))
        else:
            cands.append(frame.select("pid", "tid", "start", "end", name=pl.col("name").cast(pl.String),
                                      kind=pl.lit(kind), row=pl.lit(None, pl.UInt32)))
    c = pl.concat(cands).sort("start")
    starts = c["start"]
    out: list[dict | None] = []
    for g in gaps.iter_rows(named=True):  # the few largest gaps only
        if g["pid"] is None:
            out.append(None)
            continue
        lo = int(starts.search_sorted(g["h0"] - longest, side="left"))
        hi = int(starts.search_sorted(g["h1"], side="left"))
        win = c.slice(lo, hi - lo).filter(
            (pl.col("pid") == g["pid"]) & (pl.col("tid") == g["tid"]) & (pl.col("end") > g["h0"])
            & (pl.col("row").is_null() | (pl.col("row") != (g["launch"] if g["launch"] is not None else -1))))
        if win.height == 0:
            out.append(None)
            continue
        win = win.with_columns(cover=pl.min_horizontal("end", pl.lit(g["h1"])) - pl.max_horizontal(
            "start", pl.lit(g["h0"])), dur=pl.col("end") - pl.col("start")).filter(pl.col("cover") > 0)
        # The innermost of those covering most of the gap; none when nothing recorded does (e.g. unrecorded
        # Python after a synchronisation returned: the sync covers the gap's first microseconds only, and naming
        # it would say the host was waiting while the GPU waited for the host).
        best = win.filter(2 * pl.col("cover") >= g["h1"] - g["h0"]).sort(["dur", "cover"], descending=[False, True])
        out.append({"kind": best["kind"][0], "name": frame_name(best["name"][0])} if best.height else None)
    return out


_FRAME = re.compile(r"^<(?P<what>built-in method|built-in function|method|function|bound method) (?P<name>\S+)"
                    r"(?: of (?P<owner>.+?))?(?: object)?(?: at 0x[0-9a-fA-F]+)?>$")


def frame_name(name: str | None) -> str | None:
    """A Python frame's name as a verdict quotes it: the repr Kineto records for a built-in (``<built-in method
    replay of pybind11_builtins.pybind11_detail_function_record_v1_... object at 0xec6e52f70190>``) without its
    address and brackets, and without the owner when that is pybind11's internal record type (it says nothing).

    >>> frame_name("<built-in method acquire of _thread.lock object at 0xfda7d2176100>")
    'built-in method acquire of _thread.lock'
    >>> frame_name("<built-in method replay of pybind11_builtins.pybind11_detail_function_record_v1_x object at 0xec6e>")
    'built-in method replay'
    >>> frame_name("torch/cuda/graphs.py(139): replay")
    'torch/cuda/graphs.py(139): replay'
    """
    m = _FRAME.match(name) if name else None
    if m is None:
        return name
    owner = m.group("owner")
    if owner and owner.startswith("pybind11_builtins."):
        owner = None
    return f"{m.group('what')} {m.group('name')}" + (f" of {owner}" if owner else "")


__all__ = ["LARGEST", "HOST_OP_LAUNCHES", "host_only", "launch_ns", "work_rows", "blocking_copies", "host_waits", "stall_segments", "covered", "stalled_part",
           "waits_before", "after_waits", "name_gaps", "frame_name"]
