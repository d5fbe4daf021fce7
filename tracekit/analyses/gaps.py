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
  scheduling, a grammar mask). Framework ops and Python functions are not ranges: in an eager forward most of them
  (``aten::view``, a module's ``__call__``) launch nothing and are the dispatch cost CUDA graphs remove, so they
  only *name* gaps;
* ``launch_overhead``: the rest (issuing work one launch at a time: framework dispatch and launch calls -
  what CUDA graphs remove).

Everything is vectorised: the stall intervals of each thread are merged once into disjoint segments with a
running total, and the stalled part of a gap is ``covered(hi) - covered(lo)`` by two as-of lookups.
Only the few largest gaps are named (a search per gap over sorted starts).
"""

from __future__ import annotations

import polars as pl

from tracekit.intervals import merge
from tracekit.trace import WORK_KINDS, Trace

LARGEST = 10  # gaps.largest: the longest single gaps of any cause
STALL_API_KINDS = ("sync", "alloc")


def host_only(intervals: pl.DataFrame, work: pl.DataFrame) -> pl.Series:
    """For each interval (``pid``, ``tid``, ``start``, ``end``), whether no work launch call of its thread starts
    inside it (a range or op that launches no GPU work). ``work``: the work launches, in start order.

    >>> iv = pl.DataFrame({"pid": [1, 1], "tid": [2, 2], "start": [0, 100], "end": [50, 200]})
    >>> w = pl.DataFrame({"pid": [1], "tid": [2], "start": [120]})
    >>> host_only(iv, w).to_list()
    [True, False]
    """
    if intervals.height == 0:
        return pl.Series("host_only", [], dtype=pl.Boolean)
    if work.height == 0:
        return pl.repeat(True, intervals.height, eager=True).alias("host_only")
    w = (work.select("pid", "tid", "start").sort("pid", "tid", "start")
         .with_columns(n=pl.int_range(1, pl.len() + 1).over("pid", "tid")))

    def count_at(col: str, shift: int) -> pl.Series:
        q = intervals.select("pid", "tid", t=pl.col(col) + shift).with_row_index("_i").sort("t")
        j = q.join_asof(w.rename({"start": "ws"}), left_on="t", right_on="ws", by=["pid", "tid"],
                        strategy="backward", check_sortedness=False)
        return j.sort("_i")["n"].fill_null(0)

    inside = count_at("end", 0) - count_at("start", -1)
    return (inside == 0).alias("host_only")


def stall_segments(trace: Trace, launches: pl.DataFrame) -> pl.DataFrame:
    """Disjoint per-thread intervals during which the host is stalled (see the module docstring): columns
    ``pid``, ``tid``, ``start``, ``end``, ``before`` (stalled time of the thread before ``start``)."""
    from tracekit.lookup import row_lookup

    parts = [launches.filter(pl.col("kind").is_in(list(STALL_API_KINDS))).select("pid", "tid", "start", "end")]
    memcpy = launches["kind"] == "memcpy"
    m = trace.memops.filter(pl.col("kind") == "memcpy")
    if m.height and bool(memcpy.any()):
        row = row_lookup(m.select("pid", "correlation"), launches.select("pid", "correlation"), valid=memcpy)
        # (Kineto names its copies "Memcpy HtoD (Pageable -> Device)")
        pageable = pl.coalesce("pageable", pl.col("name").str.contains("Pageable"))
        calls = launches.select("pid", "tid", "start", "end").with_row_index("_r").join(
            m.select(_r=row, copy_kind="copy_kind", pageable=pageable.fill_null(False)).drop_nulls("_r"), on="_r",
            how="inner")
        blocking = calls.filter((pl.col("copy_kind") == "DtoH") | pl.col("pageable"))
        parts.append(blocking.select("pid", "tid", "start", "end").unique())
    work = launches.filter(pl.col("kind").is_in(list(WORK_KINDS)))
    for frame in (trace.ranges,):  # not trace.ops: see the module docstring
        iv = frame.filter(pl.col("end").is_not_null() & (pl.col("end") > pl.col("start"))).select(
            "pid", "tid", "start", "end")
        if iv.height:
            parts.append(iv.filter(host_only(iv, work)))
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
    q = points.select("pid", "tid", "t").with_row_index("_i").sort("t")
    j = q.join_asof(segments.rename({"start": "ss", "end": "se"}).sort("ss"), left_on="t", right_on="ss",
                    by=["pid", "tid"], strategy="backward", check_sortedness=False)
    c = (pl.col("before") + (pl.min_horizontal("t", "se") - pl.col("ss")).clip(lower_bound=0)).fill_null(0)
    return j.with_columns(c=c).sort("_i")["c"].alias("covered")


def stalled_part(holes: pl.DataFrame, launches: pl.DataFrame, segments: pl.DataFrame) -> pl.Series:
    """Nanoseconds of each hole (``h0``, ``h1``, ``launch`` = row of ``launches`` of the work after it) that the
    launching thread spent stalled, within the host interval that ends with that launch call."""
    n = holes.height
    if n == 0 or segments.height == 0:
        return pl.repeat(0, n, dtype=pl.Int64, eager=True).alias("stall")
    call = launches.select("pid", "tid", ls="start", le="end")[holes["launch"].fill_null(0)]
    h = holes.select("h0", "h1", has=pl.col("launch").is_not_null()).hstack(call)
    # The end of the previous work launch call on the thread (the host interval's start).
    work = launches.filter(pl.col("kind").is_in(list(WORK_KINDS))).select("pid", "tid", ws="start", we="end")
    prev = (h.select("pid", "tid", "ls").with_row_index("_i").sort("ls")
            .join_asof(work.sort("ws"), left_on="ls", right_on="ws", by=["pid", "tid"], strategy="backward",
                       allow_exact_matches=False, check_sortedness=False).sort("_i")["we"])
    h = h.with_columns(prev_end=prev)
    h = h.with_columns(lo=pl.max_horizontal("h0", pl.col("prev_end").fill_null(pl.col("h0"))),
                       hi=pl.min_horizontal("h1", "le"))
    lo = covered(h.select("pid", "tid", t="lo"), segments)
    hi = covered(h.select("pid", "tid", t="hi"), segments)
    stall = pl.when(h["has"] & (h["hi"] > h["lo"])).then(hi - lo).otherwise(0)
    return h.select(stall=pl.min_horizontal(stall, pl.col("h1") - pl.col("h0")).clip(lower_bound=0))["stall"]


def name_gaps(gaps: pl.DataFrame, trace: Trace, launches: pl.DataFrame, skip: pl.DataFrame | None = None
              ) -> list[dict | None]:
    """For each gap (``h0``, ``h1``, ``pid``, ``tid``, ``launch``), the innermost range, op or API call on the
    launching thread that covers most of it (not the launch call after it): ``{"kind", "name"}`` or None.
    ``skip``: ranges (``pid``, ``tid``, ``start``) never to name, e.g. the step ranges themselves (they cover
    every gap of their step and say nothing about it).

    Meant for the few largest gaps (one binary search per gap over start-sorted candidates)."""
    cands = []
    for frame, kind in ((trace.ranges, "range"), (trace.ops, "op")):
        if kind == "range" and skip is not None and skip.height and frame.height:
            frame = frame.join(skip.select("pid", "tid", "start"), on=["pid", "tid", "start"], how="anti")
        if frame.height:
            cands.append(frame.select("pid", "tid", "start", "end", name=pl.col("name").cast(pl.String),
                                      kind=pl.lit(kind), row=pl.lit(None, pl.UInt32)))
    if launches.height:
        cands.append(launches.with_row_index("row").select(
            "pid", "tid", "start", "end", name=pl.col("name").cast(pl.String),
            kind=pl.col("kind").cast(pl.String).replace_strict({"sync": "sync", "memcpy": "memcpy"}, default="api"),
            row="row"))
    if not cands:
        return [None] * gaps.height
    c = pl.concat(cands).filter(pl.col("end").is_not_null()).sort("start")
    starts = c["start"]
    longest = int((c["end"] - c["start"]).max() or 0)
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
        # The innermost of those covering most of the gap; else the one covering the most.
        most = win.filter(2 * pl.col("cover") >= g["h1"] - g["h0"])
        best = (most.sort(["dur", "cover"], descending=[False, True]) if most.height
                else win.sort(["cover", "dur"], descending=[True, False]))
        out.append({"kind": best["kind"][0], "name": best["name"][0]} if best.height else None)
    return out


__all__ = ["LARGEST", "host_only", "stall_segments", "covered", "stalled_part", "name_gaps"]
