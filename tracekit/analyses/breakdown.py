"""Per-decode-step breakdown: where every nanosecond of a step's GPU period goes.

Definitions (../shared/spec/CONTRACT.md, `tracekit.breakdown/1`):

* GPU work (kernels, memcpy/memset, whole-graph executions) belongs to the step, and to
  a draft range, open on the launching thread when its launch API call was made;
  graph-replayed kernels carry their graph launch's correlation, so they follow it.
* A step's period runs from its first GPU activity's start to the next step's first;
  the last ends at the later of its last activity's end and its range's end.
* ``per_step_ms`` partitions the period exactly: each instant goes to the first active
  category of drafting > gemm > attention > other > communication > memory >
  unattributed; the GPU-idle rest is ``launch_gaps`` (between the step's first and
  last activity) and ``idle`` (after its last activity).

Computed with cumulative unions: exclusive(c) = |U(categories <= c)| - |U(categories < c)|,
each union a sorted sweep (``tracekit.intervals``). No Python loop touches events.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl

from tracekit.categories import COMPUTE_CATEGORIES, KERNEL_CATEGORIES, PRIORITY, STEP_CATEGORIES
from tracekit.errors import NoGpuActivity, NoSteps, TracekitError
from tracekit.intervals import cumulative_union_lengths
from tracekit.parallel import in_threads
from tracekit.steps import Steps, find_steps, range_patterns, select_ranges
from tracekit.trace import WORK_KINDS, Trace

SCHEMA = "tracekit.breakdown/1"
# Partition priority (first active wins). "unattributed" is GPU-busy time of unknown category.
PRIORITY = list(PRIORITY)
KERNEL_CATEGORIES = list(KERNEL_CATEGORIES)
PER_STEP_KEYS = list(STEP_CATEGORIES)
COMPUTE_CATEGORIES = list(COMPUTE_CATEGORIES)
DEFAULT_DRAFT_RANGE = r"(?i)\bdraft"
# Rows (kernels + launches) from which independent stages of a breakdown run on two threads.
_THREADS_FROM_ROWS = 1_000_000
# Breakdown.activities["kind"]
KIND_ENUM = pl.Enum(["kernel", "memop", "graph_exec"])
CATEGORY_ENUM = pl.Enum(PRIORITY)  # Breakdown.activities["category"]


@dataclass
class Breakdown:
    """The result of :func:`breakdown`; ``to_dict()`` is the contract JSON."""

    source: dict
    gpu: dict
    steps: dict
    per_step_ms: dict
    kernel_ms_per_step: dict
    roofline: dict
    advice: dict
    warnings: list[str]
    per_step: pl.DataFrame  # one row per analysed step (csv output, plots)
    top_kernels: pl.DataFrame  # name, category, count, total_ms, mean_us, per_step_ms
    extras: dict = field(default_factory=dict)  # facts the advice used (graph share, gaps, counts)
    activities: pl.DataFrame | None = None  # attributed GPU activity of the analysed steps (plots, export), in
    # order of the unclipped start; start/end clipped to the step's period

    def to_dict(self) -> dict:
        out = {
            "schema": SCHEMA,
            "source": self.source,
            "gpu": self.gpu,
            "steps": self.steps,
            "per_step_ms": self.per_step_ms,
            "kernel_ms_per_step": self.kernel_ms_per_step,
            "roofline": self.roofline,
            "advice": self.advice,
            "warnings": self.warnings,
        }
        if self.extras.get("manifest"):
            out["manifest"] = self.extras["manifest"]  # extension: what the capture measured without a profiler
        return out


def devices_with_activity(trace: Trace) -> list[int]:
    """GPUs with any kernel, memory operation or graph execution, busiest first."""
    acts = pl.concat([
        trace.kernels.select("device", dur=pl.col("end") - pl.col("start")),
        trace.memops.select("device", dur=pl.col("end") - pl.col("start")),
        trace.graph_execs.select("device", dur=pl.col("end") - pl.col("start")),
    ])
    return acts.group_by("device").agg(pl.col("dur").sum()).sort(["dur", "device"], descending=[True, False])[
        "device"].to_list()


def pick_device(trace: Trace, device: int | None) -> int:
    acts = pl.concat([
        trace.kernels.select("device", dur=pl.col("end") - pl.col("start")),
        trace.memops.select("device", dur=pl.col("end") - pl.col("start")),
        trace.graph_execs.select("device", dur=pl.col("end") - pl.col("start")),
    ])
    devices = acts.group_by("device").agg(pl.col("dur").sum()).sort(["dur", "device"], descending=[True, False])
    if device is None:
        return int(devices["device"][0])
    if device not in devices["device"].to_list():
        have = ", ".join(str(d) for d in sorted(devices["device"].to_list()))
        raise TracekitError(f"--device {device}: no GPU activity on that device; devices with activity: {have}")
    return device


def activities(trace: Trace, device: int, rules=None, work: pl.DataFrame | None = None
               ) -> tuple[pl.DataFrame, int, pl.DataFrame]:
    """All GPU activity on ``device`` in start order (kernels, copies and graph executions), with its
    name-based category and its launch.

    Returns ``(acts, n_bad, work)``: ``work`` is the trace's launches (in start order) and ``acts["launch"]``
    the row of ``work`` (a kernel, graph, memcpy or memset call) that issued each activity
    (null where none was recorded); ``graphed`` says that launch was a graph launch. ``n_bad``
    activities with end before start are dropped. Columns are kept to what the analyses read: at ten
    million rows every extra column costs a copy per step below.
    """
    from tracekit.classify import load_rules, name_table
    from tracekit.lookup import row_lookup

    k = _on_device(trace.kernels, device)
    m = _on_device(trace.memops, device)
    g = _on_device(trace.graph_execs, device).with_columns(
        name=pl.format("<CUDA graph {}>", pl.col("graph_id")))
    # The launches as they are (a filtered copy would cost half a GB at ten million): calls that put no work on
    # a GPU are simply not valid matches.
    if work is None:
        work = trace.launches if trace.launches["start"].is_sorted() else trace.launches.sort("start")

    def launch_rows() -> list[pl.Series]:
        # (pid, correlation) -> launch row without hashing (see tracekit.lookup): the hash join it replaces was
        # the slowest step of a breakdown. Part by part: the kernels alone are in key order.
        is_work = work["kind"].is_in(list(WORK_KINDS))
        keys = work.select("pid", "correlation")
        return [row_lookup(f.select("pid", "correlation"), keys, valid=is_work) for f in (k, m, g)]

    def named() -> list[pl.DataFrame]:
        pos, names = name_table(k["name"], load_rules(rules) if rules is not None else None)
        prio = {c: i for i, c in enumerate(PRIORITY)}
        names = names.with_columns(prio=pl.col("category").replace_strict(prio, default=len(PRIORITY) - 1,
                                                                           return_dtype=pl.Int32))
        # Low-cardinality text as enums (a few bytes a row, not a string each): ten million kernels' names,
        # kinds and categories as strings would cost ~1 GB. Compare them with strings as usual.
        name_enum = pl.Enum(pl.concat([names["name"], m["name"], g["name"]]).drop_nulls().unique(maintain_order=True))
        cols = ("start", "end", "pid", "correlation", "stream")
        return [
            k.select(*cols).with_columns(
                name=names["name"].cast(name_enum).gather(pos), kind=pl.lit("kernel", KIND_ENUM),
                category=names["category"].cast(CATEGORY_ENUM).gather(pos).fill_null("other"),
                prio=names["prio"].gather(pos).fill_null(prio["other"])),
            m.select(*cols, name=pl.col("name").cast(name_enum)).with_columns(
                kind=pl.lit("memop", KIND_ENUM), category=pl.lit("memory", CATEGORY_ENUM),
                prio=pl.lit(prio["memory"], pl.Int32)),
            g.select(*cols, name=pl.col("name").cast(name_enum)).with_columns(
                kind=pl.lit("graph_exec", KIND_ENUM), category=pl.lit("unattributed", CATEGORY_ENUM),
                prio=pl.lit(prio["unattributed"], pl.Int32)),
        ]

    # independent: side by side (for big traces)
    rows, frames = in_threads(launch_rows, named, threads=k.height + work.height >= _THREADS_FROM_ROWS)
    k, m, g = [f.with_columns(launch=r) for f, r in zip(frames, rows)]
    parts = [f for f in (k, m, g) if f.height] or [k]
    bad = sum(f.select((pl.col("end") < pl.col("start")).sum()).item() for f in parts)
    if bad:
        parts = [f.filter(pl.col("end") >= pl.col("start")) for f in parts]
    # One frame in start order, made once: the kernels (in order already) and the few copies and graph
    # executions merged into them (ties: kernels first). It is one copy of the kernels' columns, which is
    # needed anyway: the readers' frames come in many chunks (SQLite engines deliver batches), and a frame
    # whose columns are chunked differently (every gathered column is one chunk) is copied whole by polars
    # at its next filter or group-by. In start order, the unions need no reordering (step_table).
    acts = _merge_by_start(parts)
    is_graph = work["kind"] == "graph"
    # (no graph launch in the trace: no gather of ten million booleans; null where no launch was found)
    graphed = is_graph.gather(acts["launch"]) if is_graph.any() else pl.when(pl.col("launch").is_not_null()).then(False)
    acts = acts.with_columns(graphed=graphed, dur=pl.col("end") - pl.col("start"))
    return acts, bad, work


def _on_device(df: pl.DataFrame, device: int) -> pl.DataFrame:
    """The rows of ``df`` on ``device``; ``df`` itself when all are (a filter copies every column even when it
    keeps every row: ten million kernels, ~0.7 GB)."""
    d = df["device"]
    if d.null_count() == 0 and d.len() and d.min() == d.max() == device:
        return df
    return df.filter(pl.col("device") == device)


def _merge_by_start(frames: list[pl.DataFrame], key: str = "start") -> pl.DataFrame:
    """Concatenate frames of one schema (the first frame's; the others are cast to it) into ``key`` order
    (stable; on equal keys the largest frame's rows come first), one chunk per column.

    A linear merge, not a sort: the largest frame (one device's kernels) is sorted already and the few
    others (copies, graph executions) are placed into it by binary search; every column is then one gather
    by the merged order, straight from the frames as they are (a reader's frame comes in many chunks: no
    copy into one chunk first, as polars' ``merge_sorted`` would make; 10M kernels: 0.5 s against 1-1.6 s).
    """
    schema = dict(frames[0].schema)
    full = [f if f[key].is_sorted() else f.sort(key, maintain_order=True) for f in frames if f.height]
    full = [f if dict(f.schema) == schema else f.cast(schema) for f in full]
    if len(full) <= 1:
        return (full[0] if full else frames[0]).rechunk()
    big = max(full, key=lambda f: f.height)
    small = pl.concat([f for f in full if f is not big]).sort(key, maintain_order=True)
    n, m = big.height, small.height
    # Output row of each small row: after the big rows that start at or before it (ties: big rows first).
    at = big[key].search_sorted(small[key], side="right").cast(pl.UInt32) + pl.int_range(0, m, dtype=pl.UInt32,
                                                                                        eager=True)
    mark = pl.lit(pl.repeat(0, n + m, dtype=pl.UInt32, eager=True).scatter(at, 1))
    before = mark.cum_sum()  # small rows at or before each output row
    order = pl.when(mark == 1).then(n + before - 1).otherwise(pl.int_range(0, n + m, dtype=pl.UInt32) - before)
    return pl.concat([big, small], rechunk=False).select(pl.all().gather(pl.select(order).to_series()))


def _window_of(launches: pl.DataFrame, windows: pl.DataFrame, by: list[str], col: str) -> pl.Series:
    """For each launch (a frame in ``start`` order), the ``col`` id of the window open on its (pid[, tid]) at
    its start, else null. One backward as-of join on already sorted launches."""
    if windows.height == 0 or launches.height == 0:
        return pl.repeat(None, launches.height, dtype=pl.Int64, eager=True).alias(col)
    w = windows.select(*by, ws="start", we="end", wid=col).sort("ws")
    groups = w.select(by).unique()
    if groups.height == 1 and bool((w["ws"].diff().slice(1) > 0).all()):
        # One thread (or process) holds every window, the usual case: a binary search per launch, no join.
        # Row 0 of the lookup is "no window yet": index = number of window starts at or before the launch.
        ends = pl.concat([pl.Series([None], dtype=w["we"].dtype), w["we"]])
        ids = pl.concat([pl.Series([None], dtype=w["wid"].dtype), w["wid"]])
        i = w["ws"].search_sorted(launches["start"], side="right")
        end = pl.lit(ends).gather(pl.col("i"))
        inside = end.is_null() | (pl.col("start") <= end)
        if not all(launches[c].null_count() == 0 and launches[c].min() == launches[c].max() == groups[c][0]
                   for c in by):
            inside = inside & pl.all_horizontal(pl.col(c) == groups[c][0] for c in by)
        return launches.select(*by, "start", i=i).select(
            pl.when(inside).then(pl.lit(ids).gather(pl.col("i"))).alias(col))[col]
    out = launches.select(*by, "start").join_asof(w, left_on="start", right_on="ws", by=by, strategy="backward",
                                                  check_sortedness=False)
    return out.select(pl.when(pl.col("we").is_null() | (pl.col("start") <= pl.col("we"))).then(pl.col("wid"))
                      .alias(col))[col]


def _lost_graph_steps(trace: Trace, windows: pl.DataFrame, by: list[str]) -> pl.Series:
    """Ids of the step windows that hold a graph launch with no GPU activity recorded on any device."""
    graphs = trace.launches.filter(pl.col("kind") == "graph")
    if graphs.height == 0 or trace.graph_execs.height:
        return pl.Series("step", [], dtype=pl.Int64)
    recorded = pl.concat([trace.kernels.select("pid", "correlation"), trace.memops.select("pid", "correlation")])
    lost = graphs.join(recorded.unique(), on=["pid", "correlation"], how="anti")
    if lost.height == 0:
        return pl.Series("step", [], dtype=pl.Int64)
    return _window_of(lost.sort("start"), windows, by, "step").drop_nulls().unique()


def _draft_windows(trace: Trace, draft_range: str | None) -> pl.DataFrame:
    """Disjoint draft windows per thread (nested draft ranges merged into their outermost)."""
    if not draft_range:
        return pl.DataFrame(schema={"pid": pl.Int64, "tid": pl.Int64, "start": pl.Int64, "end": pl.Int64,
                                    "draft": pl.Int64})
    from tracekit.intervals import merge

    rng = select_ranges(trace.ranges, draft_range).filter(pl.col("end").is_not_null())
    if rng.height == 0:
        return pl.DataFrame(schema={"pid": pl.Int64, "tid": pl.Int64, "start": pl.Int64, "end": pl.Int64,
                                    "draft": pl.Int64})
    return merge(rng, ["pid", "tid"]).collect().with_row_index("draft").with_columns(pl.col("draft").cast(pl.Int64))


def _quantiles(values: pl.Series) -> dict:
    ms = values.cast(pl.Float64) / 1e6
    return {
        "mean_ms": float(ms.mean()),
        "median_ms": float(ms.quantile(0.5, interpolation="linear")),
        "p10_ms": float(ms.quantile(0.1, interpolation="linear")),
        "p90_ms": float(ms.quantile(0.9, interpolation="linear")),
    }


def step_table(trace: Trace, *, step_range: str | None = None, draft_range: str | None = DEFAULT_DRAFT_RANGE,
               device: int | None = None, rules=None):
    """Everything per step: (per_step frame, attributed activities, Steps, device, warnings)."""
    if not trace.has_gpu_activity:
        raise NoGpuActivity(f"{trace.meta.path}: the trace holds no GPU activity (no kernels or memory operations)")
    warnings: list[str] = []
    dev = pick_device(trace, device)
    work = trace.launches if trace.launches["start"].is_sorted() else trace.launches.sort("start")

    def windows_side():
        """The step and draft windows, and the one open on each launch's thread (needs no activity)."""
        steps = find_steps(trace, step_range=step_range, device=dev)
        if steps is None or steps.windows.height == 0:
            return steps, None, None, None
        dw = _draft_windows(trace, draft_range)
        draft_of = _window_of(work, dw, ["pid", "tid"], "draft") if dw.height else None
        return steps, _window_of(work, steps.windows, ["pid", "tid"], "step"), dw, draft_of

    # The activities and the launches' windows are independent: computed side by side (two threads).
    big = trace.kernels.height + trace.launches.height >= _THREADS_FROM_ROWS
    (acts, n_bad, _), (steps, step_of, dw, draft_of) = in_threads(lambda: activities(trace, dev, rules, work=work),
                                                                 windows_side, threads=big)
    if n_bad:
        warnings.append(f"{n_bad} GPU activities with end before start were ignored")
    if steps is None or steps.windows.height == 0:
        cands = range_patterns(trace.ranges, top=5)
        hint = ", ".join(f"{r!r} ({c})" for r, c in zip(cands["regex"], cands["count"])) or "none"
        what = f"no range matches --step-range {step_range!r}" if step_range else "no decode steps found"
        raise NoSteps(f"{trace.meta.path}: {what}; pass --step-range REGEX (range patterns in this trace: {hint})")
    warnings.extend(steps.warnings)
    windows = steps.windows
    # Attribution is per launch (launches are few and already in time order); activities follow their launch.
    launch = acts["launch"]
    acts = acts.with_columns(step=step_of.gather(launch))
    n_work = launch.is_not_null().sum()
    n_in = acts["step"].is_not_null().sum()
    step_by = ["pid", "tid"]
    if n_work and n_in < 0.5 * n_work and steps.marker != "inferred":
        # Step ranges on another thread than the launches (e.g. a scheduler thread): attribute by process.
        alt = _window_of(work, windows, ["pid"], "step").gather(launch)
        if alt.is_not_null().sum() > n_in:
            acts = acts.with_columns(step=alt)
            step_by = ["pid"]
            warnings.append("step ranges are not on the launching threads: GPU work attributed to the step open "
                            "in the same process instead")
    if dw.height:
        acts = acts.with_columns(draft=draft_of.gather(launch)).drop("launch")
        drafted = pl.col("draft").is_not_null() & (pl.col("kind") != "graph_exec")
        acts = acts.with_columns(
            category=pl.when(drafted).then(pl.lit("drafting", CATEGORY_ENUM)).otherwise(pl.col("category")),
            prio=pl.when(drafted).then(pl.lit(PRIORITY.index("drafting"), pl.Int32)).otherwise(pl.col("prio")),
        )
    else:
        acts = acts.with_columns(draft=pl.lit(None, pl.Int64)).drop("launch")
    del launch, step_of, draft_of  # (launch-sized: freed before the per-step work)
    graph_mode = trace.meta.graph_trace_mode == "graph" and bool((acts["kind"] == "graph_exec").any())
    if graph_mode:
        compute = pl.col("category").is_in(COMPUTE_CATEGORIES)
        acts = acts.with_columns(
            category=pl.when(compute).then(pl.lit("unattributed", CATEGORY_ENUM)).otherwise(pl.col("category")),
            prio=pl.when(compute).then(pl.lit(PRIORITY.index("unattributed"), pl.Int32)).otherwise(pl.col("prio")))

    in_steps = acts if acts["step"].null_count() == 0 else acts.filter(pl.col("step").is_not_null())
    if in_steps["step"].is_sorted():  # (activities in start order, steps one after the other: the usual case)
        in_steps = in_steps.with_columns(pl.col("step").set_sorted())  # group-bys then work on slices, no hashing
    # Per step: the span of its activities (which decides its period), then, side by side with the unions below,
    # every per-step sum (kernel time per category, graph-replayed share, launch counts), of unclipped durations;
    # the clipped span follows from the unclipped one.
    per = in_steps.group_by("step").agg(first=pl.col("start").min(), last=pl.col("end").max(), n_acts=pl.len(),
                                        n_kernels=(pl.col("kind") == "kernel").sum())

    def step_sums():
        not_memop = pl.col("kind") != "memop"
        graphed = pl.col("graphed").fill_null(False)
        return in_steps.group_by("step").agg(
            *[pl.col("dur").filter(pl.col("prio") == PRIORITY.index(c)).sum().alias(f"k_{c}")
              for c in KERNEL_CATEGORIES + ["unattributed"]],
            k_graphed=pl.col("dur").filter(graphed & not_memop).sum(),
            k_all=pl.col("dur").filter(not_memop).sum(),
            n_graph_launches=pl.col("correlation").filter(pl.col("graphed")).n_unique(),
            n_launched=pl.col("correlation").filter(~graphed).n_unique(),
        )

    allw = windows.join(per, on="step", how="left")
    cut = allw.filter(pl.col("end").is_null())
    empty_steps = allw.filter(pl.col("end").is_not_null() & pl.col("first").is_null())
    # Graph launches whose replayed work was never recorded (Kineto activity-buffer overflow): the step's GPU
    # time cannot be known, so the step is excluded rather than reported as idle.
    lost = _lost_graph_steps(trace, windows, step_by)
    lost_steps = allw.filter(pl.col("end").is_not_null() & pl.col("first").is_not_null()
                             & pl.col("step").is_in(lost.implode()))
    good = allw.filter(pl.col("end").is_not_null() & pl.col("first").is_not_null()
                       & ~pl.col("step").is_in(lost.implode())).sort("first")
    excluded = cut.height + empty_steps.height + lost_steps.height
    if lost_steps.height:
        warnings.append(f"{lost_steps.height} step(s) launched CUDA graphs whose kernels were not recorded "
                        "(profiler activity buffer overflow?): excluded, their GPU time cannot be known")
    if empty_steps.height:
        warnings.append(f"{empty_steps.height} step range(s) launched no GPU work on device {dev}: excluded")
    if cut.height:
        warnings.append(f"{cut.height} step range(s) cut off by the capture window: excluded")
    if good.height == 0 and lost_steps.height:
        raise NoSteps(f"{trace.meta.path}: every step launched CUDA graphs whose kernels were not recorded (the "
                      "profiler's activity buffer likely overflowed); profile fewer steps or enlarge the buffer")
    if good.height == 0:
        raise NoSteps(f"{trace.meta.path}: {windows.height} step range(s) found but none launched GPU work on "
                      f"device {dev}; try --device or --step-range")
    good = good.with_columns(
        p_start=pl.col("first"),
        p_end=pl.col("first").shift(-1).fill_null(pl.max_horizontal("last", "end")),
    )

    def clipped_unions():
        # Each activity's step period, by step id (window ids are row numbers): two gathers, no join.
        slots = pl.Series([None], dtype=pl.Int64).extend_constant(None, windows.height - 1)
        step_idx = in_steps["step"].cast(pl.UInt32)
        p_start = slots.clone().scatter(good["step"], good["p_start"]).gather(step_idx)
        p_end = slots.clone().scatter(good["step"], good["p_end"]).gather(step_idx)
        acts_g = in_steps.with_columns(start=pl.col("start").clip(p_start, p_end),
                                       end=pl.col("end").clip(p_start, p_end))
        if p_start.null_count():  # activities of excluded steps
            acts_g = acts_g.filter(p_start.is_not_null())
        del p_start, p_end, step_idx
        # The unions want each step's activities in start order: they are (activities() merged them into start
        # order). Ordered by the unclipped start, clipping keeps that order within each step (one pair of
        # bounds), and the clipped periods tile the timeline (a late activity of a step becomes zero-length at
        # its period's end): what tiled= needs.
        narrow = acts_g.select("step", "start", "end", "prio")
        return acts_g, cumulative_union_lengths(narrow, "step", "prio", len(PRIORITY), presorted=True, tiled=True)

    (acts_g, unions), sums = in_threads(clipped_unions, step_sums, threads=big)
    table = good.select("step", "p_start", "p_end", "n_kernels", period=pl.col("p_end") - pl.col("p_start"))
    table = table.join(unions, on="step", how="left")
    cum_cols = [f"u{i}" for i in range(len(PRIORITY))]
    prev = pl.lit(0, pl.Int64)
    for i, cat in enumerate(PRIORITY):
        table = table.with_columns(pl.col(f"u{i}").fill_null(0))
        table = table.with_columns((pl.col(f"u{i}") - prev).alias(f"x_{cat}"))
        prev = pl.col(f"u{i}")
    # The clipped span of each step's activities: the first starts at the period's start; the last end, clipped.
    span = good.select("step", a_first="first", a_last=pl.col("last").clip(pl.col("p_start"), pl.col("p_end")))
    sums = sums.join(span, on="step", how="inner")
    table = table.join(sums, on="step", how="left").with_columns(
        x_launch_gaps=(pl.col("a_last") - pl.col("a_first")) - pl.col(f"u{len(PRIORITY) - 1}"),
        x_idle=pl.col("period") - (pl.col("a_last") - pl.col("a_first")),
    )
    # Wall time of the draft phases on the GPU timeline: first to last activity of each draft range
    # (gaps between its kernels included), summed per step.
    drafts = acts_g.filter(pl.col("draft").is_not_null())
    if drafts.height:
        dspan = (drafts.group_by("step", "draft").agg(span=pl.col("end").max() - pl.col("start").min())
                 .group_by("step").agg(draft_span=pl.col("span").sum()))
        table = table.join(dspan, on="step", how="left")
    else:
        table = table.with_columns(draft_span=pl.lit(None, pl.Int64))
    table = table.with_columns(pl.col("draft_span").fill_null(0))
    table = table.drop(cum_cols + ["a_first", "a_last"]).sort("p_start")
    table = table.join(windows.select("step", "pid", "tid", w_start="start", w_end="end"), on="step", how="left")
    return table, acts_g, steps, dev, warnings, excluded, graph_mode


def breakdown(trace: Trace, *, step_range: str | None = None, draft_range: str | None = DEFAULT_DRAFT_RANGE,
              device: int | None = None, rules=None, weight_bytes: int | None = None, peak_bw: float | None = None,
              accept_len: float | None = None, tokens_per_step: float | None = None,
              device_profile: dict | None = None) -> Breakdown:
    """Per-step breakdown of ``trace`` (see the module docstring for the definitions)."""
    table, acts, steps, dev, warnings, excluded, graph_mode = step_table(
        trace, step_range=step_range, draft_range=draft_range, device=device, rules=rules)
    n = table.height
    stats = {"count": n, "excluded": excluded, "marker": steps.marker, "pattern": steps.pattern,
             **_quantiles(table["period"])}
    mean = lambda col: float(table[col].cast(pl.Float64).mean()) / 1e6  # noqa: E731
    per_step_ms = {k: mean(f"x_{k}") for k in PER_STEP_KEYS}
    kernel_ms = {k: mean(f"k_{k}") for k in KERNEL_CATEGORIES}
    if graph_mode:
        for k in COMPUTE_CATEGORIES:
            per_step_ms[k] = None
            kernel_ms[k] = None
    total_ns = acts.filter(pl.col("kind") != "graph_exec")
    top = (total_ns.group_by("name", "category").agg(count=pl.len(), total=pl.col("dur").sum())
           .with_columns(pl.col("name", "category").cast(pl.String))  # (enums sort by code, not by text)
           .with_columns(total_ms=pl.col("total") / 1e6, mean_us=pl.col("total") / pl.col("count") / 1e3,
                         per_step_ms=pl.col("total") / 1e6 / n)
           .drop("total").sort(["total_ms", "name"], descending=[True, False]))
    per_step = table.select(
        "step", start_ns="p_start", end_ns="p_end", period_ms=pl.col("period") / 1e6,
        **{k: pl.col(f"x_{k}") / 1e6 for k in PER_STEP_KEYS},
        n_kernels="n_kernels",
    )
    if graph_mode:
        per_step = per_step.with_columns(*[pl.lit(None, pl.Float64).alias(k) for k in COMPUTE_CATEGORIES])
    graph_share = float(table["k_graphed"].sum() / table["k_all"].sum()) if table["k_all"].sum() else 0.0
    extras = {
        "graph_kernel_share": graph_share,
        "kernels_per_step": float(table["n_kernels"].mean()),
        "launched_per_step": float(table["n_launched"].fill_null(0).mean()),
        "graph_launches_per_step": float(table["n_graph_launches"].fill_null(0).mean()),
        "busy_ms": sum(v for k, v in per_step_ms.items() if k not in ("launch_gaps", "idle") and v is not None),
        "graph_mode": graph_mode,
        "rank": trace.meta.rank,
        "draft_phase_ms": float(table["draft_span"].mean()) / 1e6,
        "step_windows": table.select("step", "pid", "tid", start="w_start", end="w_end"),
    }
    gpu_name, trace_bw = None, None
    g = trace.gpus.filter(pl.col("device") == dev)
    if g.height:
        gpu_name, trace_bw = g["name"][0], g["peak_bw_gbps"][0]
    from tracekit.analyses.advice import advise

    result = Breakdown(
        source={"path": trace.meta.path, "format": trace.meta.format, "producer_version": trace.meta.producer_version,
                "graph_trace_mode": trace.meta.graph_trace_mode},
        gpu={"device": dev, "name": gpu_name, "peak_bw_gbps": None, "peak_bw_source": None},
        steps=stats, per_step_ms=per_step_ms, kernel_ms_per_step=kernel_ms, roofline={}, advice={},
        warnings=list(trace.meta.warnings) + warnings, per_step=per_step, top_kernels=top, extras=extras,
        activities=acts,
    )
    return advise(result, trace, trace_bw=trace_bw, weight_bytes=weight_bytes, peak_bw=peak_bw,
                  accept_len=accept_len, tokens_per_step=tokens_per_step, device_profile=device_profile)
