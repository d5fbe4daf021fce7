"""The Perfetto renderer: a breakdown as a Chrome-trace JSON (the "JSON trace event format") for ui.perfetto.dev.

One process, ``tracekit``, with one thread (track) per kind of time:

* ``steps``: one X event per analysed step (its period), args = its ``per_step_ms`` split;
* ``drafting``, ``gemm``, ``attention``, ``other``, ``communication``, ``memory``,
  ``unattributed``: one X event per GPU activity of that category attributed to an analysed
  step (clipped to the step period, as the breakdown counts it);
* ``launch_gaps`` and ``idle``: the GPU-idle intervals of each step (between its activities,
  and after its last one).

Timestamps are microseconds (floats) on the trace's own clock, so the file lines up with
the original trace opened beside it. Built with polars expressions; no loop over events.
``report.render("perfetto", b, "json")`` is :func:`perfetto_json` (these tracks alone); ``tracekit export
--perfetto OUT.json`` writes :func:`write_perfetto`: these tracks *and* every original event of the trace (every
kernel, memcpy/memset, graph execution, host API call, range, op and launch flow: ``tracekit.report.perfetto_events``),
streamed to the file in slices of :data:`CHUNK_ROWS` events (a big trace's JSON is never one string in memory).
"""

from __future__ import annotations

import json

import polars as pl

from tracekit.categories import GAP_CATEGORIES, PRIORITY

PID = 1
CHUNK_ROWS = 500_000
TRACKS = ["steps", *PRIORITY, *GAP_CATEGORIES]


def gaps_frame(acts: pl.DataFrame, per_step: pl.DataFrame) -> pl.DataFrame:
    """GPU-idle intervals per step: ``step``, ``start``, ``end`` (ns), ``kind`` = launch_gaps | idle."""
    from tracekit.intervals import merge

    segs = merge(acts.select("step", "start", "end"), ["step"]).collect().sort("step", "start")
    between = segs.with_columns(nxt=pl.col("start").shift(-1).over("step")).filter(
        pl.col("nxt").is_not_null() & (pl.col("nxt") > pl.col("end"))).select(
        "step", start=pl.col("end"), end=pl.col("nxt"), kind=pl.lit("launch_gaps"))
    last = segs.group_by("step").agg(start=pl.col("end").max()).join(
        per_step.select("step", end="end_ns"), on="step").filter(pl.col("end") > pl.col("start")).select(
        "step", "start", "end", kind=pl.lit("idle"))
    return pl.concat([between, last]).sort("start")


def perfetto_events(b, acts: pl.DataFrame) -> pl.DataFrame:
    """All X events as a frame: name, cat, step, tid, track, ts (µs), dur (µs)."""
    tid = {t: i + 1 for i, t in enumerate(TRACKS)}
    analysed = acts.filter(pl.col("step").is_in(b.per_step["step"].implode()))
    steps = b.per_step.select(
        pl.format("step {}", pl.col("step")).alias("name"), cat=pl.lit("step"), track=pl.lit("steps"),
        start="start_ns", end="end_ns", step="step")
    kern = analysed.select(name=pl.col("name").cast(pl.String).fill_null("?"), cat=pl.col("kind").cast(pl.String),
                           track=pl.col("category").cast(pl.String),
                           start="start", end="end", step="step")
    gaps = gaps_frame(analysed, b.per_step).select(name="kind", cat=pl.lit("gap"), track="kind", start="start",
                                                   end="end", step="step")
    ev = pl.concat([steps, kern, gaps], how="vertical_relaxed")
    return ev.select("name", "cat", "step", tid=pl.col("track").replace_strict(tid, default=len(TRACKS) + 1),
                     track="track", ts=pl.col("start") / 1e3,
                     dur=(pl.col("end") - pl.col("start")) / 1e3).sort("tid", "ts")


def _parts(b, acts: pl.DataFrame):
    ev = perfetto_events(b, acts).with_columns(ph=pl.lit("X"), pid=pl.lit(PID))
    cols = ["name", "cat", "ph", "pid", "tid", "ts", "dur"]
    meta = [{"ph": "M", "pid": PID, "tid": 0, "name": "process_name", "args": {"name": "tracekit"}}]
    meta += [{"ph": "M", "pid": PID, "tid": i + 1, "name": "thread_name", "args": {"name": t}}
             for i, t in enumerate(TRACKS)]
    meta += [{"ph": "M", "pid": PID, "tid": i + 1, "name": "thread_sort_index", "args": {"sort_index": i}}
             for i, t in enumerate(TRACKS)]
    split = b.per_step.select("step", *[pl.col(k).round(6) for k in b.per_step.columns
                                        if k not in ("step", "start_ns", "end_ns", "phase")])
    step_ev = (ev.filter(pl.col("track") == "steps").join(split, on="step", how="left")
               .select(*cols, args=pl.struct(pl.exclude([*cols, "step", "track"]))))
    other = ev.filter(pl.col("track") != "steps").select(cols)
    other_data = {"tool": "tracekit", "source": b.source["path"], "device": b.gpu["device"],
                  "steps": b.steps["count"]}
    return meta, step_ev, other, other_data


def perfetto_trace(b, acts: pl.DataFrame) -> dict:
    """The Chrome-trace dict: ``{"traceEvents": [...], "displayTimeUnit": "ns", "otherData": {...}}``."""
    meta, step_ev, other, other_data = _parts(b, acts)
    return {"traceEvents": meta + step_ev.to_dicts() + other.to_dicts(), "displayTimeUnit": "ns",
            "otherData": other_data}


def perfetto_json(b, acts: pl.DataFrame | None = None) -> str:
    """The file's text (events serialised by polars, not row by row); ``acts`` defaults to ``b.activities``."""
    meta, step_ev, other, other_data = _parts(b, b.activities if acts is None else acts)
    chunks = [json.dumps(meta, ensure_ascii=False)[1:-1]]
    chunks += [f.write_json()[1:-1] for f in (step_ev, other) if f.height]
    return ('{"traceEvents":[' + ",".join(chunks) + '],"displayTimeUnit":"ns","otherData":'
            + json.dumps(other_data, ensure_ascii=False) + "}\n")


def write_perfetto(out, b, trace=None, calls: pl.DataFrame | None = None, acts: pl.DataFrame | None = None
                   ) -> dict[str, int]:
    """Write the Chrome-trace JSON of breakdown ``b`` to the file ``out``: tracekit's tracks and, with ``trace``
    (the :class:`~tracekit.trace.Trace` ``b`` was computed from) and its host API ``calls``
    (``tracekit.run.stats.host_calls``), every original event of it. Streamed: each frame
    is serialised by polars in slices of :data:`CHUNK_ROWS` rows, written as it is made. Returns the number of
    events written by kind (``tracekit`` for the added tracks' slices; the original kinds of
    :func:`tracekit.report.perfetto_events.original_events`)."""
    meta, step_ev, other, other_data = _parts(b, b.activities if acts is None else acts)
    producers = [("tracekit", lambda: [step_ev, other])]
    counts: dict[str, int] = {}
    if trace is not None:
        from tracekit.report.perfetto_events import original_events

        ometa, oproducers = original_events(trace, calls)
        # tracekit's process first in the UI, then the GPUs, then the host
        meta = [*meta, {"ph": "M", "pid": PID, "tid": 0, "name": "process_sort_index", "args": {"sort_index": 0}},
                *ometa]
        producers += oproducers
    with open(out, "w", encoding="utf-8") as fh:
        fh.write('{"traceEvents":[' + json.dumps(meta, ensure_ascii=False)[1:-1])
        for kind, make in producers:  # (one kind's frames at a time: the others are not made yet, or gone)
            frames = make()
            counts[kind] = sum(f.height for f in frames) // (2 if kind == "flows" else 1)
            for f in frames:
                for off in range(0, f.height, CHUNK_ROWS):
                    fh.write("," + f.slice(off, CHUNK_ROWS).write_json()[1:-1])
            del frames
        if trace is not None:
            other_data = {**other_data, "original_events": {k: n for k, n in counts.items() if k != "tracekit"}}
        fh.write('],"displayTimeUnit":"ns","otherData":' + json.dumps(other_data, ensure_ascii=False) + "}\n")
    return counts
