"""Attribution: which GPU activity belongs to which decode step (and draft phase), and what it is.

The first half of a breakdown (the second is ``tracekit.analyses.partition``):

* every GPU activity on the analysed device (kernels, memcpy/memset, whole-graph executions) in start
  order, with its name-based category (``tracekit.classify``) and the host launch call that issued it;
* the step (and draft) window open on the launching thread when that call was made (nsys projection
  semantics); kernels replayed from a CUDA graph carry their graph launch's correlation, so they follow it;
* drafting found from draft ranges, else by structure or speculative kernels (``advice.drafting.detection``).

Nothing here is a time split yet; :class:`Attribution` is a typed, immutable value.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

import polars as pl

from tracekit.categories import COMPUTE_CATEGORIES, DEFAULT_DRAFT_RANGE, PRIORITY, UNATTRIBUTED
from tracekit.errors import NoGpuActivity, NoSteps
from tracekit.intervals import keep_rows, one_thread
from tracekit.parallel import in_threads, started
from tracekit.steps import Steps, find_steps, select_ranges, step_candidates
from tracekit.trace import WORK_KINDS, Trace

# Rows (kernels + launches) from which independent stages of a breakdown run on two threads.
THREADS_FROM_ROWS = 1_000_000
# Attribution.activities["kind"] / ["category"]; a category's physical code is its priority (index in PRIORITY):
# the partition's unions read it as their level, so no priority column is kept beside it.
KIND_ENUM = pl.Enum(["kernel", "memop", "graph_exec"])
CATEGORY_ENUM = pl.Enum(list(PRIORITY))


@dataclass(frozen=True)
class Attribution:
    """GPU activity of one device, attributed to steps and draft phases.

    ``activities``: one row per GPU activity on ``device`` in start order, columns ``start``, ``end`` (ns,
    as recorded), ``pid``, ``correlation``, ``stream``, ``name`` (enum), ``kind`` (kernel | memop |
    graph_exec), ``category`` (enum, after drafting; its physical code is its index in ``PRIORITY``), ``launch`` (row of
    ``launches`` that issued it, null if unknown), ``graphed`` (that launch was a graph launch), ``dur``,
    ``step`` (window id, null outside steps) and ``draft`` (draft window id, null outside drafting); where drafting
    was found, ``name_category`` keeps each activity's category by name (before drafting took it).
    ``launches`` is the trace's host calls in start order. ``step_by`` says how steps were matched to launches:
    by thread (``("pid", "tid")``, the definition) or, when the step ranges live on another thread, by process.
    """

    device: int
    steps: Steps
    activities: pl.DataFrame
    launches: pl.DataFrame
    step_by: tuple[str, ...]
    draft_detection: str  # "ranges" | "structure" | "kernels" | "not_detected"
    phases: pl.DataFrame  # every step window's phase: step, phase, source, evidence (tracekit.analyses.phase)
    graph_mode: bool  # whole-graph capture: compute categories cannot be known
    lost_steps: tuple[int, ...]  # windows whose graph launches' work was never recorded
    n_bad: int  # activities dropped because they end before they start
    warnings: tuple[str, ...]
    draft_evidence: tuple[str, ...] = ()  # advice.drafting.evidence: what the detection rests on
    # advice.drafting's speculative / draft_model / verify_tokens (tracekit.analyses.speculation); None: not looked at
    speculation: object | None = None
    # The device's communication kernels (``collectives._comm_kernels``), found before ``attribute(consume=True)``
    # released the trace's kernel columns they are read from; None: not found yet (a later analysis finds them).
    comm_kernels: pl.DataFrame | None = None
    # A function giving ``steady.step_signatures`` of the activities in steps (the rows ``partition`` analyses; the
    # signatures read no category, which drafting changes), begun on a thread of its own beside the phase and drafting
    # analyses of a big trace (they leave a core idle); None: the partition makes them.
    signatures: Callable[[], pl.DataFrame] | None = None


def require_gpu_activity(trace: Trace) -> None:
    """Raise :class:`~tracekit.errors.NoGpuActivity` (a user error: exit 2) when ``trace`` holds no GPU activity."""
    if not trace.has_gpu_activity:
        raise NoGpuActivity(f"{trace.meta.path}: the trace holds no GPU activity (no kernels or memory operations)")


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
    one = _only_device(trace)
    if one is not None and (device is None or device == one):
        return one  # (one GPU in the trace: no group-by over every activity)
    devices = devices_with_activity(trace)
    if device is None:
        return int(devices[0])
    if device not in devices:
        have = ", ".join(str(d) for d in sorted(devices))
        raise NoGpuActivity(f"--device {device}: no GPU activity on that device; devices with activity: {have}")
    return device




def _only_device(trace: Trace) -> int | None:
    """The device of every activity when the trace has GPU activity on one device only, else None."""
    seen = set()
    for f in (trace.kernels, trace.memops, trace.graph_execs):
        d = f["device"]
        if d.len() == 0:
            continue
        if d.null_count() or d.min() != d.max():
            return None
        seen.add(d.min())
    return int(seen.pop()) if len(seen) == 1 else None


# The kernel columns the activities copy as they are (:func:`activities`), and so the columns of ``Trace.kernels`` that
# ``attribute(consume=True)`` releases once copied.
COPIED_KERNEL_COLUMNS = ("start", "end", "pid", "correlation", "stream")


def activities(trace: Trace, device: int, rules=None, work: pl.DataFrame | None = None,
               step_of_launch=None, consume: bool = False, ready=None) -> tuple[pl.DataFrame, int, pl.DataFrame]:
    """All GPU activity on ``device`` in start order (kernels, copies and graph executions), with its
    name-based category and its launch.

    Returns ``(acts, n_bad, work)``: ``work`` is the trace's launches (in start order) and ``acts["launch"]``
    the row of ``work`` (a kernel, graph, memcpy or memset call) that issued each activity
    (null where none was recorded); ``graphed`` says that launch was a graph launch. ``n_bad``
    activities with end before start are dropped. Columns are kept to what the analyses read: at ten
    million rows every extra column costs a copy per step below. ``step_of_launch``: a function of the ``launch``
    column giving each activity's ``step`` (added last), made as part of the merge (beside its other columns).
    ``consume``: the trace's kernel columns of :data:`COPIED_KERNEL_COLUMNS` are dropped from ``trace.kernels`` (in
    place) as the merge copies each, when ``device``'s kernels are the whole table (one GPU): see :func:`attribute`;
    ``ready`` is called first (it waits for, or raises instead of, what must read them before).
    """
    from tracekit.classify import frame_name_table, load_rules, with_op_categories
    from tracekit.lookup import row_lookup

    k = _on_device(trace.kernels, device)
    own = trace.kernels if consume and k is trace.kernels and k.height else None  # (several GPUs: k is a copy)
    m = _on_device(trace.memops, device)
    g = _on_device(trace.graph_execs, device).with_columns(
        name=pl.format("<CUDA graph {}>", pl.col("graph_id")))
    # The launches as they are (a filtered copy would cost half a GB at ten million): calls that put no work on
    # a GPU are simply not valid matches.
    if work is None:
        work = trace.launches if trace.launches["start"].is_sorted() else trace.launches.sort("start")

    def launch_rows() -> tuple[list[pl.Series], pl.Series]:
        # (pid, correlation) -> launch row without hashing (see tracekit.lookup): the hash join it replaces was
        # the slowest step of a breakdown. Part by part: the kernels alone are in key order. And which launches are
        # graph launches (read after the merge).
        is_work = work["kind"].is_in(list(WORK_KINDS))
        keys = work.select("pid", "correlation")
        return [row_lookup(f.select("pid", "correlation"), keys, valid=is_work) for f in (k, m, g)], \
            work["kind"] == "graph"

    def named() -> list[pl.DataFrame]:
        loaded = load_rules(rules) if rules is not None else load_rules()
        pos, names = frame_name_table(k, loaded)  # (made once per trace: the analyses below reuse it)
        names = with_op_categories(names, pos, k, trace, loaded)  # names no rule matches: by their launching op
        # Low-cardinality text as enums (a few bytes a row, not a string each): ten million kernels' names,
        # kinds and categories as strings would cost ~1 GB. Compare them with strings as usual.
        name_enum = pl.Enum(pl.concat([names["name"], m["name"], g["name"]]).drop_nulls().unique(maintain_order=True))
        cols = ("start", "end", "pid", "correlation", "stream")
        return [
            k.select(*cols).with_columns(
                name=names["name"].cast(name_enum).gather(pos), kind=pl.lit("kernel", KIND_ENUM),
                category=names["category"].cast(CATEGORY_ENUM).gather(pos).fill_null("other")),
            m.select(*cols, name=pl.col("name").cast(name_enum)).with_columns(
                kind=pl.lit("memop", KIND_ENUM), category=pl.lit("memory", CATEGORY_ENUM)),
            g.select(*cols, name=pl.col("name").cast(name_enum)).with_columns(
                kind=pl.lit("graph_exec", KIND_ENUM), category=pl.lit("unattributed", CATEGORY_ENUM)),
        ]

    ok = pl.col("end") >= pl.col("start")
    bad = sum(f.select((~ok).sum()).item() for f in (k, m, g))
    starts = [(f.filter(ok) if bad else f)["start"] for f in (k, m, g) if f.height]
    # independent: side by side (for big traces), the merge's row order among them (it reads only the starts)
    (rows, is_graph), frames, plan = in_threads(launch_rows, named,
                                                lambda: _merge_plan([s for s in starts if s.len()]),
                                                threads=k.height + work.height >= THREADS_FROM_ROWS)
    k, m, g = [f.with_columns(launch=r) for f, r in zip(frames, rows)]
    parts = [f for f in (k, m, g) if f.height] or [k]
    if bad:
        parts = [f.filter(ok) for f in parts]
    # One frame in start order, made once: the kernels (in order already) and the few copies and graph
    # executions merged into them (ties: kernels first). It is one copy of the kernels' columns, which is
    # needed anyway: the readers' frames come in many chunks (SQLite engines deliver batches), and a frame
    # whose columns are chunked differently (every gathered column is one chunk) is copied whole by polars
    # at its next filter or group-by. In start order, the unions need no reordering (step_table).
    threads = k.height >= THREADS_FROM_ROWS
    release = None
    if own is not None:
        if ready is not None:
            ready()
        # Nothing else may hold the kernel columns while the merge copies them: each is dropped from the merge's
        # own frame (the one object every name above refers to) and from the trace's as soon as it is copied, so
        # that what it held is given back before the next column is made (the engines' blocks go back to the system
        # at once: readers.nsys.scan.give_back_big_blocks), and the merged frame takes the pages just freed. The
        # kernels' columns made above (name, category, launch) go too: polars reuses what they held at once.
        del frames, starts, rows
        big_frame = parts[0]
        lock = threading.Lock()

        def release(c: str) -> None:
            with lock:
                for f in (big_frame, own) if c in COPIED_KERNEL_COLUMNS else (big_frame,):
                    if c in f.columns:
                        f.drop_in_place(c)
    acts = _merge_by_start(parts, threads=threads, plan=plan,
                           derived=None if step_of_launch is None else ("step", "launch", step_of_launch),
                           release=release)
    # (no graph launch in the trace: no gather of ten million booleans; null where no launch was found)
    graphed = is_graph.gather(acts["launch"]) if is_graph.any() else pl.when(pl.col("launch").is_not_null()).then(False)
    acts = acts.with_columns(graphed=graphed, dur=pl.col("end") - pl.col("start"))
    if step_of_launch is not None:
        acts = acts.select(pl.exclude("step"), "step")  # (as the analyses have always seen it: the last column)
    return acts, bad, work




def in_steps_of(acts: pl.DataFrame) -> pl.DataFrame:
    """The rows of ``acts`` (attributed activities) that are in a step, their ``step`` flagged sorted where it is (in
    start order, steps one after the other: the usual case; group-bys then work on slices)."""
    in_steps = acts if acts["step"].null_count() == 0 else keep_rows(acts, acts["step"].is_not_null())
    return in_steps.with_columns(pl.col("step").set_sorted()) if in_steps["step"].is_sorted() else in_steps


def _on_device(df: pl.DataFrame, device: int) -> pl.DataFrame:
    """The rows of ``df`` on ``device``; ``df`` itself when all are (a filter copies every column even when it
    keeps every row: ten million kernels, ~0.7 GB)."""
    d = df["device"]
    if d.null_count() == 0 and d.len() and d.min() == d.max() == device:
        return df
    return df.filter(pl.col("device") == device)




def _merge_plan(keys: list[pl.Series]) -> tuple[int, pl.Series] | None:
    """The row order :func:`_merge_by_start` gives frames whose key columns are ``keys`` (each in order already;
    else, or for fewer than two, None): ``(b, order)``, ``b`` the largest frame (the first of that height) and
    ``order`` the source row of each output row in that frame's rows followed by the others' in their order. Made from
    the keys alone, so it can be made beside what builds the frames' other columns.

    >>> _merge_plan([pl.Series([1, 3]), pl.Series([0, 3, 5, 9]), pl.Series([2])])[1].to_list()
    [0, 4, 6, 1, 5, 2, 3]
    """
    if len(keys) < 2 or not all(s.is_sorted() for s in keys):
        return None
    b = max(range(len(keys)), key=lambda i: (keys[i].len(), -i))
    big = keys[b]
    others = pl.concat([s for i, s in enumerate(keys) if i != b])
    # (their rows in key order; stable: on ties in their order)
    perm = others.rename("k").to_frame().with_row_index("i").sort("k", maintain_order=True)["i"].cast(pl.UInt32)
    n, m = big.len(), others.len()
    # Output row of each other row, in key order: after the big rows that start at or before it (ties: big rows first).
    at = big.search_sorted(others.gather(perm), side="right").cast(pl.UInt32) + pl.int_range(
        0, m, dtype=pl.UInt32, eager=True)
    # Source row of each output row: a big row's shifted back by the other rows before it.
    before = pl.repeat(0, n + m, dtype=pl.UInt32, eager=True).scatter(at, 1).cum_sum()
    order = (pl.int_range(0, n + m, dtype=pl.UInt32, eager=True) - before).scatter(at, perm + n)
    return b, order


def _merge_by_start(frames: list[pl.DataFrame], key: str = "start", threads: bool = False,
                    plan: tuple[int, pl.Series] | None = None, derived: tuple | None = None,
                    release=None) -> pl.DataFrame:
    """Concatenate frames of one schema (the first frame's; the others are cast to it) into ``key`` order
    (stable; on equal keys the largest frame's rows come first), one chunk per column.

    A linear merge, not a sort: the largest frame (one device's kernels) is sorted already and the few
    others (copies, graph executions) are placed into it by binary search; every column is then one gather
    by the merged order, but a column of one value in every frame (known at once where the big frame's reader
    flagged it sorted), which is kept as that value; the key comes out flagged sorted. A column the reader delivered in many chunks is first copied into one (a memcpy):
    a gather across ~150 chunks looks each row's chunk up and costs ~4× the copy and a gather together
    (10M kernels: the merge's CPU 0.8 → 0.4 s). ``threads``: the columns in two groups of about equal bytes, one
    per thread. Most of the merge's time is the kernel faulting in its fresh memory (the merged frame: ~0.5 GB at
    ten million kernels), work that the thread touching the page does, so two threads halve it. ``plan``: the
    :func:`_merge_plan` of the non-empty frames' keys, made beforehand (beside other work; else made here); it
    must be of these very frames. ``derived``: ``(name, source, fn)``, a column ``name = fn(merged source column)``
    added last, made by the thread that merged ``source`` right after it (so beside the other thread's columns,
    not after the whole merge); ``fn`` is counted as one more column of the source's size in the split.
    ``release``: called with each column's name once it is merged (:func:`activities` drops it from its source there).
    """
    schema = dict(frames[0].schema)
    full = [f for f in frames if f.height]
    if plan is None or len(full) < 2:
        full = [f if f[key].is_sorted() else f.sort(key, maintain_order=True) for f in full]
        plan = _merge_plan([f[key] for f in full])
    full = [f if dict(f.schema) == schema else f.cast(schema) for f in full]
    if len(full) <= 1:
        one = _key_sorted((full[0] if full else frames[0]).rechunk(), key)
        return one if derived is None else one.with_columns(derived[2](one[derived[1]]).alias(derived[0]))
    b, order = plan
    big = full[b]
    small = pl.concat([f for i, f in enumerate(full) if i != b])

    # A column of one value in every frame (one process, one stream: the usual trace), known at once where the big
    # frame's reader flagged it sorted, is not gathered: a constant column of the merged length (polars keeps it as
    # one value until something needs its rows; ten million rows: 80 MB neither gathered nor faulted in).
    consts = {c: big[c][0] for c in big.columns
              if c != key and (derived is None or c != derived[1]) and _one_value([big[c], small[c]])}

    def merged(names: list[str]) -> list[pl.Series]:  # (column by column: one column's contiguous copy at a time)
        out = []
        for c in names:
            if c not in consts:
                out.append(pl.concat([big[c], small[c]], rechunk=True).gather(order))
            if release is not None:
                release(c)
            if derived is not None and c == derived[1]:
                out.append(derived[2](out[-1]).alias(derived[0]))
        return out

    def frame(series: list[pl.Series]) -> pl.DataFrame:
        df = pl.DataFrame(series)
        if consts:
            df = df.with_columns(pl.lit(v, schema[c]).alias(c) for c, v in consts.items())
        return _key_sorted(df.select(*names, *last), key)

    names = big.columns
    last = [derived[0]] if derived is not None else []
    if not threads or len(names) < 2:
        return frame(merged(names))
    groups: tuple[list[str], list[str]] = ([], [])
    load = [0, 0]
    size = {c: 0 if c in consts else big[c].estimated_size() * (2 if derived is not None and c == derived[1] else 1)
            for c in names}
    for c in sorted(names, key=lambda c: -size[c]):  # (largest first, to the lighter group)
        g = 0 if load[0] <= load[1] else 1
        groups[g].append(c)
        load[g] += size[c]
    first, second = in_threads(lambda: merged(groups[0]), lambda: merged(groups[1]))
    return frame(first + second)


def _one_value(parts: list[pl.Series]) -> bool:
    """Whether ``parts`` (the big frame's column first) hold one value and no null, decided without reading the big
    one: only when its reader flagged it sorted (then its min and max are its ends)."""
    if not parts[0].flags["SORTED_ASC"] or any(p.null_count() for p in parts):
        return False
    lo = [p.min() for p in parts if p.len()]
    hi = [p.max() for p in parts if p.len()]
    return bool(lo) and min(lo) == max(hi)


def _key_sorted(df: pl.DataFrame, key: str) -> pl.DataFrame:
    """``df`` (in ``key`` order) with its key column flagged sorted: every later check of it answers at once."""
    return df.with_columns(pl.col(key).set_sorted()) if df.height else df




@dataclass(frozen=True)
class WindowIndex:
    """The window open on each launch, kept narrow: ``index`` (UInt32, one per launch) is 0 where none is open, else
    the window's row in ``ids`` (Int64, ``ids[0]`` null). Ten million launches: 40 MB of index instead of an Int64
    id column and its copies (fresh memory, each page faulted in). :meth:`of` gives the ids of chosen launch rows."""

    index: pl.Series
    ids: pl.Series

    def of(self, rows: pl.Series) -> pl.Series:
        """The window id of each launch row in ``rows`` (null where none is open, or the row is null)."""
        return self.ids.gather(self.index.gather(rows))

    def series(self, name: str) -> pl.Series:
        """The window id of every launch."""
        return self.ids.gather(self.index).alias(name)


def _window_index(launches: pl.DataFrame, windows: pl.DataFrame, by: list[str], col: str) -> WindowIndex:
    """For each launch (a frame in ``start`` order), the ``col`` id of the window open on its (pid[, tid]) at
    its start, else null (as a :class:`WindowIndex`): the last window starting at or before the launch, if the
    launch starts by its end. When one thread (or process) holds every window, each window's launches are one run
    found by binary search; otherwise one backward as-of join on the already sorted launches."""
    n = launches.height
    if windows.height == 0 or n == 0:
        return WindowIndex(pl.repeat(0, n, dtype=pl.UInt32, eager=True),
                           pl.Series(col, [None], dtype=pl.Int64))
    w = windows.select(*by, ws="start", we="end", wid=col).sort("ws")
    ids = pl.concat([pl.Series(col, [None], dtype=w["wid"].dtype), w["wid"].alias(col)])
    groups = w.select(by).unique()
    if groups.height == 1 and bool((w["ws"].diff().slice(1) > 0).all()) and w["wid"].null_count() == 0:
        # One thread (or process) holds every window, the usual case: no join, and no search per launch. A launch
        # belongs to the last window starting at or before it, if it starts by that window's end; the launches in
        # start order, each window's are one run: [first launch at or after its start, first launch after its end
        # or at or after the next window's start). Two searches per window, then each run's window (its row + 1)
        # written at the run's first row, 0 after its last, and carried forward.
        start = launches["start"]
        lo = start.search_sorted(w["ws"], side="left").cast(pl.Int64)
        nxt = lo.shift(-1).fill_null(n)
        hi = pl.select(pl.when(pl.lit(w["we"]).is_null()).then(pl.lit(nxt)).otherwise(pl.min_horizontal(
            pl.lit(start.search_sorted(w["we"], side="right").cast(pl.Int64)), pl.lit(nxt)))).to_series()
        runs = pl.DataFrame({"lo": lo, "hi": hi, "k": pl.int_range(1, w.height + 1, dtype=pl.UInt32, eager=True)}
                            ).filter(pl.col("lo") < pl.col("hi"))
        index = (pl.repeat(None, n, dtype=pl.UInt32, eager=True).scatter([0], 0)
                 .scatter(runs.filter(pl.col("hi") < n)["hi"], 0).scatter(runs["lo"], runs["k"]).forward_fill())
        one = one_thread(launches)  # (asked once per launch table: remembered)
        if one is not None:
            same = all(dict(zip(("pid", "tid"), one))[c] == groups[c][0] for c in by)
        else:
            same = all(launches[c].null_count() == 0 and launches[c].min() == launches[c].max() == groups[c][0]
                       for c in by)
        if not same:  # (launches of other threads are in no window)
            index = launches.select(pl.when(pl.all_horizontal(pl.col(c) == groups[c][0] for c in by))
                                    .then(pl.lit(index)).otherwise(pl.lit(0, pl.UInt32)).alias("i"))["i"]
        return WindowIndex(index, ids)
    w = w.with_columns(_k=pl.int_range(1, w.height + 1, dtype=pl.UInt32))
    out = launches.select(*by, "start").join_asof(w, left_on="start", right_on="ws", by=by, strategy="backward",
                                                  check_sortedness=False)
    index = out.select(pl.when(pl.col("we").is_null() | (pl.col("start") <= pl.col("we"))).then(pl.col("_k"))
                       .fill_null(0).alias("i"))["i"]
    return WindowIndex(index, ids)


def _window_of(launches: pl.DataFrame, windows: pl.DataFrame, by: list[str], col: str) -> pl.Series:
    """:func:`_window_index` as one id per launch (null where no window is open)."""
    return _window_index(launches, windows, by, col).series(col)




def _lost_graph_launches(trace: Trace) -> pl.DataFrame:
    """The graph launches with no GPU activity recorded on any device (when the trace has no graph executions)."""
    graphs = trace.launches.filter(pl.col("kind") == "graph")
    if graphs.height == 0 or trace.graph_execs.height:
        return graphs.clear()
    recorded = pl.concat([trace.kernels.select("pid", "correlation"), trace.memops.select("pid", "correlation")])
    return graphs.join(recorded.unique(), on=["pid", "correlation"], how="anti")


def _lost_graph_steps(lost: pl.DataFrame, windows: pl.DataFrame, by: list[str]) -> pl.Series:
    """Ids of the step windows that hold one of the ``lost`` graph launches (:func:`_lost_graph_launches`)."""
    if lost.height == 0:
        return pl.Series("step", [], dtype=pl.Int64)
    return _window_of(lost.sort("start"), windows, by, "step").drop_nulls().unique()




def _draft_windows(trace: Trace, draft_range: str | None, steps: pl.DataFrame | None = None) -> pl.DataFrame:
    """Disjoint draft windows per thread (nested draft ranges merged into their outermost): the ranges
    ``draft_range`` matches and the engine's own records of its draft forwards in the ``steps`` windows
    (``tracekit.analyses.speculation.engine_draft_windows``: SGLang's eager draft spans, the draft-model frames).
    Column ``engine``: the window holds no matched range, only the engine's records."""
    from tracekit.analyses.drafting import is_off

    empty = pl.DataFrame(schema={"pid": pl.Int64, "tid": pl.Int64, "start": pl.Int64, "end": pl.Int64,
                                 "draft": pl.Int64, "engine": pl.Boolean})
    if is_off(draft_range):
        return empty
    from tracekit.intervals import merge

    cols = ["pid", "tid", "start", "end"]
    parts = []
    if draft_range:
        rng = select_ranges(trace.ranges, draft_range).filter(pl.col("end").is_not_null())
        if rng.height:
            parts.append(rng.select(*cols, engine=pl.lit(False)))
    if steps is not None and steps.height:
        from tracekit.analyses.speculation import engine_draft_windows

        ew, _ = engine_draft_windows(trace, steps)
        if ew.height:
            parts.append(ew.select(cols).with_columns(engine=pl.lit(True)))
    if not parts:
        return empty
    both = pl.concat(parts)
    merged = merge(both.select(cols), ["pid", "tid"]).collect()
    # (a merged window is the engine's alone when no matched range starts inside it)
    ranged = both.filter(~pl.col("engine")).select("pid", "tid", rs="start").sort("rs")
    merged = merged.sort("start").join_asof(ranged, left_on="start", right_on="rs", by=["pid", "tid"],
                                            strategy="forward", check_sortedness=False)
    merged = merged.with_columns(engine=pl.col("rs").is_null() | (pl.col("rs") > pl.col("end"))).drop("rs")
    return merged.with_row_index("draft").with_columns(pl.col("draft").cast(pl.Int64))




def _range_evidence(trace: Trace, draft_range: str, acts: pl.DataFrame, limit: int = 3) -> str:
    """The draft ranges that matched, for ``advice.drafting.evidence``: their names (most frequent first) and
    counts, and how much GPU work was launched inside them."""
    names = (select_ranges(trace.ranges, draft_range).group_by(pl.col("name").cast(pl.String)).len()
             .sort(["len", "name"], descending=[True, False]))
    listed = ", ".join(f"{n[:60]!r} x{c}" for n, c in names.head(limit).iter_rows())
    more = f" and {names.height - limit} more names" if names.height > limit else ""
    inside = acts.filter(pl.col("draft").is_not_null() & (pl.col("kind") != "graph_exec"))
    steps = inside["step"].drop_nulls().n_unique()
    return (f"draft ranges matching --draft-range '{draft_range}': {listed}{more}; "
            f"{inside.height} GPU activities launched inside them, in {steps} steps")


def attribute(trace: Trace, *, step_range: str | None = None, draft_range: str | None = DEFAULT_DRAFT_RANGE,
              device: int | None = None, rules=None, detect_structure: bool = True,
              consume: bool = False) -> Attribution:
    """Attribute every GPU activity of ``device`` (default: the busiest GPU) to its step and draft phase.

    Without draft ranges, drafting is found from the steps' structure (``tracekit.analyses.drafting``);
    ``detect_structure=False`` leaves it to the speculative kernels' names alone; ``draft_range="none"`` turns
    drafting detection off (no ranges, no structure, and the speculative kernels count as ``other``).

    ``consume=True`` (a caller that owns ``trace`` and reads nothing more of it than the breakdown does:
    ``tracekit.run.pipeline.breakdown_file``): the columns of ``trace.kernels`` that the activities copy
    (:data:`COPIED_KERNEL_COLUMNS`) are dropped from it, in place, as they are copied, when the analysed GPU is the
    trace's only one. What is read of them later (the lost graph launches, the communication kernels:
    ``Attribution.comm_kernels``) is found first. At ten million kernels that is ~0.4 GB given back while the
    ~0.6 GB of activities are made, which takes the peak from 2.0-2.1 to 1.75-1.81 GB (docs/performance.md).

    Raises :class:`~tracekit.errors.NoGpuActivity` or :class:`~tracekit.errors.NoSteps` (user errors)."""
    require_gpu_activity(trace)
    warnings: list[str] = []
    dev = pick_device(trace, device)
    work = trace.launches if trace.launches["start"].is_sorted() else trace.launches.sort("start")

    def windows_side():
        """The step and draft windows, and the one open on each launch's thread (needs no activity)."""
        steps = find_steps(trace, step_range=step_range, device=dev, every_phase=True)
        if steps is None or steps.windows.height == 0:
            return steps, None, None, None
        dw = _draft_windows(trace, draft_range, steps.windows)
        draft_of = _window_index(work, dw, ["pid", "tid"], "draft") if dw.height else None
        return steps, _window_index(work, steps.windows, ["pid", "tid"], "step"), dw, draft_of

    # The activities and the launches' windows are independent: computed side by side (two threads). The step of
    # each activity (its launch's window) is made by the merge, beside the merge's other columns, when the windows
    # are in (long before).
    big = trace.kernels.height + trace.launches.height >= THREADS_FROM_ROWS
    windows = started(windows_side, threads=big)

    def step_of_launch(launch: pl.Series) -> pl.Series:
        index = windows()[1]
        return (index.of(launch) if index is not None
                else pl.repeat(None, launch.len(), dtype=pl.Int64, eager=True))  # (no steps: raised below)

    before: dict = {}
    ready = _before_release(trace, dev, rules, windows, step_range, big, before) if consume else None
    acts, n_bad, _ = activities(trace, dev, rules, work=work, step_of_launch=step_of_launch, consume=consume,
                                ready=ready)
    steps, step_of, dw, draft_of = windows()
    if n_bad:
        warnings.append(f"{n_bad} GPU activities with end before start were ignored")
    if steps is None or steps.windows.height == 0:
        raise _no_steps(trace, dev, step_range)
    if consume and "lost" not in before:  # (several GPUs: nothing was released, but they were found already)
        before["comm"], before["lost"] = before["found"]()
    lost = before["lost"] if "lost" in before else _lost_graph_launches(trace)
    warnings.extend(steps.warnings)
    # Attribution is per launch (launches are few and already in time order); activities follow their launch.
    launch = acts["launch"]
    acts, step_by = _by_process_if_elsewhere(acts, work, steps, launch, warnings)
    signatures = None
    if big:
        from tracekit.analyses.steady import SIGNATURE_COLUMNS, step_signatures

        rows = in_steps_of(acts.select(*SIGNATURE_COLUMNS))
        signatures = started(lambda: step_signatures(rows))
        del rows
    from tracekit.analyses.phase import step_phases

    phases = step_phases(trace, steps.windows, acts)
    d = _draft_work(trace, acts, steps, dw, draft_of, launch, draft_range, detect_structure, phases, warnings)
    del launch, step_of, draft_of  # (launch-sized: freed before the per-step work)
    speculation, phases = _speculation(trace, d, steps, phases, before, draft_range)
    acts = d.acts
    if d.drafted is not None:
        acts = acts.with_columns(
            name_category="category",  # (speculative traces only: what each draft kernel is by name)
            category=pl.when(d.drafted).then(pl.lit("drafting", CATEGORY_ENUM)).otherwise(pl.col("category")),
        )
    graph_mode = trace.meta.graph_trace_mode == "graph" and bool((acts["kind"] == "graph_exec").any())
    if graph_mode:
        compute = pl.col("category").is_in(list(COMPUTE_CATEGORIES))
        acts = acts.with_columns(
            category=pl.when(compute).then(pl.lit(UNATTRIBUTED, CATEGORY_ENUM)).otherwise(pl.col("category")))
    lost = _lost_graph_steps(lost, steps.windows, list(step_by))
    return Attribution(device=dev, steps=steps, activities=acts, launches=work, step_by=step_by,
                       draft_detection=d.detection, phases=phases, graph_mode=graph_mode,
                       lost_steps=tuple(int(s) for s in lost.to_list()), n_bad=n_bad, warnings=tuple(warnings),
                       draft_evidence=d.evidence, comm_kernels=before.get("comm"), signatures=signatures,
                       speculation=speculation)


def _no_steps(trace: Trace, dev: int, step_range: str | None) -> NoSteps:
    """The error of a trace without steps, naming the best step candidates."""
    cands = step_candidates(trace, top=5, device=dev)
    hint = ", ".join(f"{r!r} ({c} ranges, {100 * g:.0f}% of the GPU time)"
                     for r, c, g in zip(cands["regex"], cands["count"], cands["gpu_share"])) or "none"
    what = f"no range matches --step-range {step_range!r}" if step_range else "no decode steps found"
    return NoSteps(f"{trace.meta.path}: {what}; pass --step-range REGEX (step candidates: ranges that launch GPU "
                   f"work, best tiling first: {hint})")


def _before_release(trace: Trace, dev: int, rules, windows, step_range: str | None, big: bool,
                    before: dict) -> Callable[[], None]:
    """What reads the kernel columns that ``activities(consume=True)`` releases, done before it releases any: the
    step windows (their search weighs ranges by the GPU time they launch), the step candidates of the error, the
    lost graph launches and the communication kernels (these two beside the activities' first stages). Returns the
    merge's ``ready`` call; fills ``before`` (``found``: the lost launches and the communication kernels; ``comm``,
    ``lost``, ``rows``: the speculation's normalised rows)."""
    from tracekit.analyses.collectives import _comm_kernels

    before["found"] = started(lambda: (_comm_kernels(trace, dev, rules), _lost_graph_launches(trace)), threads=big)

    def ready() -> None:
        if windows()[0] is None or windows()[0].windows.height == 0:
            raise _no_steps(trace, dev, step_range)
        before["comm"], before["lost"] = before["found"]()
        if trace.ranges.height:  # (speculation's verify tokens read the kernels' grids: before they go)
            from tracekit.analyses.speculation import norm_rows

            before["rows"] = norm_rows(trace, windows()[0].windows)
    return ready


def _by_process_if_elsewhere(acts: pl.DataFrame, work: pl.DataFrame, steps: Steps, launch: pl.Series,
                             warnings: list[str]) -> tuple[pl.DataFrame, tuple[str, ...]]:
    """Step ranges on another thread than the launches (e.g. a scheduler thread): the activities attributed by
    process instead, when that places more of them. Returns (activities, how steps were matched)."""
    n_work = launch.is_not_null().sum()
    n_in = acts["step"].is_not_null().sum()
    step_by: tuple[str, ...] = ("pid", "tid")
    if n_work and n_in < 0.5 * n_work and steps.marker != "inferred":
        alt = _window_index(work, steps.windows, ["pid"], "step").of(launch)
        if alt.is_not_null().sum() > n_in:
            acts = acts.with_columns(step=alt)
            step_by = ("pid",)
            warnings.append("step ranges are not on the launching threads: GPU work attributed to the step open "
                            "in the same process instead")
    step = acts["step"]
    if step.null_count() == 0 and step.is_sorted():
        # (every activity in a step, steps one after the other: the usual case. Flagged, the per-step group-bys
        # of the phase and drafting analyses below work on slices instead of hashing ten million step ids.)
        acts = acts.with_columns(step.set_sorted())
    return acts, step_by


@dataclass
class _DraftWork:
    """The draft work found (``acts`` with its ``draft`` column; ``drafted``: the expression of a drafting
    activity, None where none is), how it was found and on what evidence."""

    acts: pl.DataFrame
    drafted: pl.Expr | None
    detection: str
    evidence: tuple[str, ...]
    info: object | None  # drafting.detect_drafting's structure reading, where it ran


def _draft_work(trace: Trace, acts: pl.DataFrame, steps: Steps, dw: pl.DataFrame, draft_of, launch: pl.Series,
                draft_range: str | None, detect_structure: bool, phases: pl.DataFrame,
                warnings: list[str]) -> _DraftWork:
    """Drafting from the draft ranges (and the engine's own records of its draft forwards), else from the steps'
    structure or the speculative kernels' names; turned off by ``--draft-range none``."""
    from tracekit.analyses import speculation as spec
    from tracekit.analyses.drafting import OFF_EVIDENCE, detect_drafting, is_off, spec_kernel_evidence

    drafted = None
    evidence: tuple[str, ...] = ()
    info = None
    if dw.height:
        acts = acts.with_columns(draft=draft_of.of(launch))
        drafted = pl.col("draft").is_not_null() & (pl.col("kind") != "graph_exec")
        if not bool(acts.select(drafted.any()).item()):
            drafted = None
    else:
        acts = acts.with_columns(draft=pl.lit(None, pl.Int64))
    no_ranges = ("no --draft-range given" if not draft_range else
                 f"{dw.height} ranges match --draft-range '{draft_range}' but no GPU work was launched inside them"
                 if dw.height else f"no range matches --draft-range '{draft_range}'")
    if is_off(draft_range):
        # turned off: no ranges, no structure, and the kernels that are drafting by name count as other
        detection, evidence = "not_detected", (OFF_EVIDENCE,)
        by_name = pl.col("category") == "drafting"
        acts = acts.with_columns(
            category=pl.when(by_name).then(pl.lit("other", CATEGORY_ENUM)).otherwise(pl.col("category")))
    elif drafted is not None:
        # draft ranges, and/or the engine's own records of its draft forwards (detection "engine" when the work is
        # found by those alone, or the matched ranges are the engine's own spans: SGLang step[DRAFT ...])
        matched = select_ranges(trace.ranges, draft_range) if draft_range else trace.ranges.head(0)
        said = [_range_evidence(trace, draft_range, acts)] if matched.height else []
        held = acts.filter(drafted)["draft"].unique().implode()
        engine_only = bool(dw.filter(pl.col("draft").is_in(held))["engine"].all())
        engine_spans = matched.height > 0 and bool(matched["name"].str.contains(r"^step\[").all())
        _, by_engine = spec.engine_draft_windows(trace, steps.windows)
        if by_engine:
            said.append(by_engine)
        detection = "engine" if engine_only or engine_spans else "ranges"
        evidence = tuple(said)
    elif not detect_structure:
        ks = spec_kernel_evidence(acts.filter(pl.col("step").is_not_null()))
        detection = "kernels" if ks else "not_detected"
        evidence = (ks,) if ks else (no_ranges, "structure not looked at")
    else:
        # No draft ranges: the draft forwards found from the steps' structure (or the speculative kernels).
        # (only the columns it reads, then the filter: filtering every column of ten million rows cost ~1 s)
        in_steps = acts.select("step", "start", "name", "category", "kind", "dur")
        if in_steps["step"].null_count():  # (else every row is in a step: the rows are the activities' own)
            in_steps = in_steps.with_row_index("_row").filter(pl.col("step").is_not_null())
        ids, info = detect_drafting(in_steps.drop("_row", strict=False), phases=phases)
        detection = info.detection
        evidence = info.evidence if detection == "structure" else (no_ranges, *info.evidence)
        if info.warning and detection != "not_detected":
            warnings.append(info.warning)
        if ids.null_count() < ids.len():
            acts = acts.with_columns(draft=pl.repeat(None, acts.height, dtype=pl.Int64, eager=True).scatter(
                in_steps["_row"], ids) if "_row" in in_steps.columns else ids.cast(pl.Int64))
            drafted = pl.col("draft").is_not_null() & (pl.col("kind") != "graph_exec")
    return _DraftWork(acts, drafted, detection, evidence, info)


def _speculation(trace: Trace, d: _DraftWork, steps: Steps, phases: pl.DataFrame, before: dict,
                 draft_range: str | None):
    """Speculation (contract, Additions to /3), from every source, none waiting for the phase; a speculative step
    is a decode step (the phase's own annotation and training evidence aside). Proposals without a draft model
    (n-gram) count their upload as drafting (``d`` is updated). Returns (speculation, phases)."""
    from tracekit.analyses import speculation as spec
    from tracekit.analyses.drafting import is_off, spec_kernel_evidence

    if is_off(draft_range):
        return spec.OFF, phases
    in_spec = d.acts.filter(pl.col("step").is_not_null())
    spec_kernels = spec_kernel_evidence(in_spec)
    ann = None
    if trace.ranges.height:
        from tracekit.analyses.phase import annotation_phases

        ann = annotation_phases(trace, steps.windows)
    # (draft work with GEMMs: a draft model's forwards, not only the upload of host proposals)
    draft_gemm = d.drafted is not None and bool(
        d.acts.select((d.drafted & (pl.col("category") == "gemm")).any()).item())
    speculation = spec.decide(
        trace, steps.windows, spans=spec.engine_spans(trace, steps.windows),
        frames=spec.engine_frames(trace, steps.windows),
        tokens=spec.shape_tokens(trace, steps.windows, ann), structure=d.info, spec_kernels=spec_kernels,
        draft_found=d.evidence[0] if d.detection in ("ranges", "engine") else None, draft_gemm=draft_gemm,
        rows=before["rows"] if "rows" in before else
        spec.norm_rows(trace, steps.windows) if trace.ranges.height and "pid" in trace.kernels.columns else None)
    if speculation.speculative and speculation.draft_model is False and d.drafted is None:
        # proposals without a draft model (n-gram): their GPU-side cost is their upload, the host-to-device copies
        # of the step before its verify forward's first GEMM
        up = spec.proposal_uploads(d.acts)
        if up.null_count() < up.len():
            d.acts = d.acts.with_columns(draft=up)
            d.drafted = pl.col("draft").is_not_null() & (pl.col("kind") != "graph_exec")
            n = (up.is_not_null().sum()) / max(1, d.acts["step"].drop_nulls().n_unique())
            d.evidence = (*d.evidence, f"proposals without a draft model: their upload, {n:g} host-to-device "
                          "copies per step before the verify forward, counts as drafting")
            if d.detection == "not_detected":
                d.detection = "kernels"
    if not speculation.speculative:
        return speculation, phases
    from tracekit.analyses.phase import with_speculation

    drafted_steps = (in_spec.filter(pl.col("draft").is_not_null() | (pl.col("category") == "drafting"))["step"]
                     .unique() if d.detection != "not_detected" else pl.Series("step", [], pl.Int64))
    marked = pl.concat([drafted_steps.cast(pl.Int64), pl.Series("step", list(speculation.steps), pl.Int64)])
    # (what makes the steps speculative: not a line saying which quantity the trace cannot show)
    said = [e for e in speculation.evidence if e not in (spec.NO_SPEC_EVIDENCE, spec.NO_VERIFY_TOKENS)]
    why = (said[0] if said else
           f"{d.info.draft_forwards_per_step:g} draft forwards of a distinct draft model per step"
           if d.info is not None and d.info.draft_forwards_per_step else "draft work in the step")
    return speculation, with_speculation(phases, marked.unique(), why)
