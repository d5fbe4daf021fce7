"""Interval primitives over polars frames, written once (sorted sweeps, no Python loops).

Every function takes intervals as columns ``start``/``end`` (int ns, end >= start) plus
grouping columns, and works for millions of rows.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence

import polars as pl

_BEFORE_ALL = -(2**62)  # the running maximum's start: before any time (traces may hold negative times)


def merge(df: pl.LazyFrame | pl.DataFrame, by: Sequence[str]) -> pl.LazyFrame:
    """Merge overlapping intervals within each ``by`` group into disjoint segments.

    Returns a lazy frame with ``by`` + ``start``, ``end`` (one row per merged segment).

    >>> df = pl.DataFrame({"g": [1, 1, 1], "start": [0, 5, 20], "end": [10, 12, 30]})
    >>> merge(df, ["g"]).collect().rows()
    [(1, 0, 12), (1, 20, 30)]
    """
    lf = df.lazy() if isinstance(df, pl.DataFrame) else df
    by = list(by)
    lf = lf.select(*by, "start", "end").sort([*by, "start"])
    # A new segment starts where an interval begins after every earlier interval of its group ended.
    prev_end = pl.col("end").cum_max().shift(1).over(by)
    lf = lf.with_columns(new=(prev_end.is_null() | (pl.col("start") > prev_end)).cast(pl.Int64))
    lf = lf.with_columns(seg=pl.col("new").cum_sum().over(by))
    return lf.group_by([*by, "seg"]).agg(pl.col("start").min(), pl.col("end").max()).drop("seg").sort([*by, "start"])


def union_length(df: pl.LazyFrame | pl.DataFrame, by: Sequence[str], name: str = "union_ns") -> pl.LazyFrame:
    """Total length covered by the union of the intervals of each ``by`` group.

    >>> df = pl.DataFrame({"g": [1, 1, 2], "start": [0, 5, 0], "end": [10, 12, 3]})
    >>> union_length(df, ["g"]).collect().sort("g").rows()
    [(1, 12), (2, 3)]
    """
    by = list(by)
    return merge(df, by).group_by(by).agg((pl.col("end") - pl.col("start")).sum().alias(name))


def cumulative_union_lengths(df: pl.DataFrame, group: str, level: str, n_levels: int,
                             prefix: str = "u", presorted: bool = False, tiled: bool = False) -> pl.DataFrame:
    """For each ``group``, the union length of the intervals with ``level`` <= k, for k = 0 .. n_levels-1.

    One pass: for intervals sorted by start, |union| = sum(max(0, end - max(start, max end so far))); each
    level keeps its own running maximum over the rows inside it. ``presorted=True`` says the rows of each
    group are already in start order (e.g. the frame is sorted by start), which saves the sort.
    ``tiled=True`` (with ``presorted``) says more: every row ends no later than any row that follows it in
    a later group starts, or has zero length (groups tile the timeline, as clipped step periods do). Then
    the running maximum may run across groups, one pass over the frame instead of one per group, and
    only the sums are grouped. Levels with no rows repeat the level below. Returns ``group`` +
    ``{prefix}{k}`` columns, groups in order of first appearance.

    >>> df = pl.DataFrame({"g": [1, 1, 1], "start": [0, 5, 20], "end": [10, 12, 25], "lvl": [1, 0, 1]})
    >>> cumulative_union_lengths(df, "g", "lvl", 2).rows()
    [(1, 7, 17)]
    >>> cumulative_union_lengths(df, "g", "lvl", 2, presorted=True, tiled=True).rows()
    [(1, 7, 17)]
    """
    present = set(df[level].unique().to_list())
    levels = [k for k in range(n_levels) if k == 0 or k in present]
    parts = {}
    for k in levels:
        inside = pl.col(level) <= k
        carried = pl.when(inside).then(pl.col("end")).otherwise(_BEFORE_ALL).cum_max().shift(1).fill_null(_BEFORE_ALL)
        parts[f"{prefix}{k}"] = pl.when(inside).then(
            (pl.col("end") - pl.max_horizontal("start", carried)).clip(lower_bound=0)).otherwise(0)
    if df[group].is_sorted():  # (usually so when tiled): polars then groups by slices, without hashing
        df = df.with_columns(pl.col(group).set_sorted())
    if tiled and presorted and df.height:
        out = _tiled_with_singles(df, group, level, levels, parts, prefix)
        if out is not None:
            return _fill_levels(out, group, levels, n_levels, prefix)
    lf = df.lazy().select(group, "start", "end", level)
    if tiled and presorted:
        lf = lf.select(group, **parts).group_by(group, maintain_order=True).agg(pl.exclude(group).sum())
    else:
        if not presorted:
            lf = lf.sort([group, "start"])
        lf = lf.group_by(group, maintain_order=True).agg(e.sum().alias(name) for name, e in parts.items())
    return _fill_levels(lf.collect(), group, levels, n_levels, prefix)


def _fill_levels(out: pl.DataFrame, group: str, levels: list[int], n_levels: int, prefix: str) -> pl.DataFrame:
    last, cols = 0, []
    for k in range(n_levels):
        last = k if k in levels else last
        cols.append(pl.col(f"{prefix}{last}").alias(f"{prefix}{k}"))
    return out.select(group, *cols)


def _tiled_with_singles(df: pl.DataFrame, group: str, level: str, levels: list[int], parts: dict,
                        prefix: str) -> pl.DataFrame | None:
    """The tiled sweep, with the rows that overlap nothing summed directly (most GPU activity on one stream).

    A row that starts at or after every earlier row ended, and ends at or before the next row starts, adds its
    whole length to every level it is in, whatever the other levels hold; and it cannot change what any later
    row adds (it ends before they start). So those "single" rows are summed per group in one pass, and the
    per-level running maxima run only over the rest (overlapping rows and their cluster heads), usually a
    few. None when most rows overlap: the plain sweep is then as fast.
    """
    ended = pl.col("end").cum_max().shift(1).fill_null(_BEFORE_ALL)
    # (two steps: in one expression the running maximum was computed twice, for the row and for the next)
    fresh = df.select((pl.col("start") >= ended).alias("single"))
    single = fresh.select(pl.col("single") & pl.col("single").shift(-1).fill_null(True))["single"]
    n_rest = df.height - int(single.sum())
    if n_rest > df.height // 2:
        return None
    length = pl.when(pl.col("single")).then(pl.col("end") - pl.col("start")).otherwise(0)
    sums = (df.lazy().with_columns(single=single).select(group, level, length.alias("_len"))
            .select(group, *[pl.when(pl.col(level) <= k).then(pl.col("_len")).otherwise(0).alias(f"{prefix}{k}")
                             for k in levels])
            .group_by(group, maintain_order=True).agg(pl.exclude(group).sum()).collect())
    if n_rest == 0:
        return sums
    rest = df.filter(~single).lazy().select(group, **parts).group_by(group).agg(pl.exclude(group).sum())
    rest = rest.collect()
    cols = [f"{prefix}{k}" for k in levels]
    return sums.join(rest, on=group, how="left", suffix="_r", maintain_order="left").select(
        group, *[(pl.col(c) + pl.col(f"{c}_r").fill_null(0)).alias(c) for c in cols])


def keep_rows(df: pl.DataFrame, mask: pl.Series) -> pl.DataFrame:
    """The rows of ``df`` where ``mask`` is true: a slice (no copy) when they are one run of rows, the usual case
    (the analysed steps are every step but the warm-up and the last), else a filter. A filter copies every column
    even to drop one step: ten million activities, ~0.8 GB of fresh memory.

    >>> keep_rows(pl.DataFrame({"x": [1, 2, 3, 4]}), pl.Series([False, True, True, False]))["x"].to_list()
    [2, 3]
    """
    mask = mask.fill_null(False)
    n = int(mask.sum())
    if n == mask.len():
        return df
    if n == 0:
        return df.clear()
    first = int(mask.arg_max())
    last = mask.len() - 1 - int(mask.reverse().arg_max())
    return df.slice(first, n) if last - first + 1 == n else df.filter(mask)


# Rows per piece where an analysis works on whole steps piece by piece (gaps, step signatures): ten million
# activities at once make columns of 80 MB each, faulted in fresh and given back to the system at once by polars'
# allocator; pieces of about this many rows keep each column under its 8 MiB threshold and reuse the same memory.
CHUNK_ROWS = 1 << 19


def step_chunks(step: pl.Series, rows: int | None = None) -> list[tuple[int, int]]:
    """``(offset, length)`` slices of a frame grouped by ``step`` (each step's rows one run), each of whole steps
    and about ``rows`` rows (default :data:`CHUNK_ROWS`; a step longer than that is one slice of its own). One
    slice of everything when ``step`` is not sorted or has nulls (its steps may not be runs).

    >>> step_chunks(pl.Series([0, 0, 1, 1, 1, 2, 3, 3]), rows=3)
    [(0, 5), (5, 3)]
    """
    n = step.len()
    rows = rows or CHUNK_ROWS
    if n <= rows or step.null_count() or not step.is_sorted():
        return [(0, n)] if n else []
    out, at = [], 0
    while at < n:  # (a few slices, not steps)
        # the slice ends where the first step starting at or after row ``at + rows`` starts (a step longer than
        # ``rows``: a slice of its own): two binary searches in the sorted ids, no column of step starts
        cut = at + rows
        if cut >= n:
            end = n
        else:
            v = step[cut]
            first = int(step.search_sorted(v, side="left"))  # (the first row of the step holding row ``cut``)
            end = cut if first == cut else int(step.search_sorted(v, side="right"))
        out.append((at, end - at))
        at = end
    return out


def by_pieces(fn, frame: pl.DataFrame, step: str = "step", threads: bool = True) -> list:
    """``fn`` of each :func:`step_chunks` piece of ``frame`` (whole steps), in order; two pieces per CPU at a time
    on threads when there are several (polars releases the GIL while it works) unless ``threads`` is false.
    ``[fn(frame)]`` when ``frame`` is one piece or its steps are not runs."""
    from tracekit.parallel import in_threads

    pieces = step_chunks(frame[step])
    if len(pieces) < 2:
        return [fn(frame)]
    return in_threads(*[lambda o=o, n=n: fn(frame.slice(o, n)) for o, n in pieces], threads=threads, per_cpu=2)


def one_group(df: pl.DataFrame, by: Sequence[str]) -> tuple | None:
    """The single value of each ``by`` column when every row of ``df`` has the same, non-null ones; else None."""
    vals = []
    for c in by:
        col = df[c]
        if col.null_count() or col.min() != col.max():
            return None
        vals.append(col.min())
    return tuple(vals)


def one_thread(frame: pl.DataFrame) -> tuple | None:
    """``one_group(frame, ["pid", "tid"])``: the (pid, tid) of every row when one thread holds them all (a launch
    table: one thread made every call), else None. Remembered for the last few frames asked about: a breakdown asks
    about the same launch table several times, and at ten million calls each answer reads two columns twice
    (~50 ms). The memo holds those frames weakly and answers only for the very same object."""
    for ref, one in _THREADS:
        if ref() is frame:
            return one
    one = one_group(frame, ["pid", "tid"]) if frame.height else None
    _THREADS[:] = [(weakref.ref(frame), one), *[e for e in _THREADS if e[0]() is not None][:3]]
    return one


_THREADS: list = []  # [(weak reference to a frame, its one_thread)], the latest first


def asof(left: pl.DataFrame, right: pl.DataFrame, left_on: str, right_on: str, by: Sequence[str],
         strategy: str = "backward", allow_exact_matches: bool = True) -> pl.DataFrame:
    """``left`` (in its own row order) with the columns of ``right`` (other than ``by``) of its as-of match:
    the last ``right`` row of the same ``by`` group with ``right_on`` <= ``left_on`` (``backward``; ``<`` without
    exact matches), or the first with ``>=`` (``forward``; ``>``); nulls where none. ``right`` must be sorted by
    ``right_on`` (within each group; a frame in time order is), and its columns other than ``by`` must not be
    named as ``left``'s.

    The same result as polars' ``join_asof`` on ``left`` sorted by ``left_on`` and put back in its order.
    When one thread (one ``by`` group) holds every row, the usual trace, it is one binary search per left row
    and a gather: no sort of ``left``, no sort back, no grouping of ten million right rows.

    >>> r = pl.DataFrame({"g": [1, 1], "rt": [10, 20], "v": ["a", "b"]})
    >>> l = pl.DataFrame({"g": [1, 1, 1], "t": [25, 5, 10]})
    >>> asof(l, r, "t", "rt", ["g"])["v"].to_list()
    ['b', None, 'a']
    >>> asof(l, r, "t", "rt", ["g"], strategy="forward", allow_exact_matches=False)["v"].to_list()
    [None, 'a', 'b']
    >>> asof(l.with_columns(g=pl.Series([1, 2, 1])), r, "t", "rt", ["g"])["v"].to_list()  # (no group 2 in r)
    ['b', None, 'a']
    """
    by = list(by)
    rest = [c for c in right.columns if c not in by]
    g = one_group(right, by) if right.height else None
    if g is not None and right[right_on].null_count() == 0:
        keys = left[left_on]
        if strategy == "backward":
            i = right[right_on].search_sorted(keys, side="right" if allow_exact_matches else "left").cast(pl.Int64) - 1
            ok = i >= 0
        else:
            i = right[right_on].search_sorted(keys, side="left" if allow_exact_matches else "right").cast(pl.Int64)
            ok = i < right.height
        same = pl.lit(True)
        for c, v in zip(by, g):
            same = same & (pl.col(c) == v)
        take = left.select(pl.when(same & ok.alias("_ok") & keys.is_not_null()).then(i).alias("_i"))["_i"]
        return left.hstack(right.select(pl.col(rest).gather(take)).get_columns())
    q = left.with_row_index("_asof_i")
    ordered = q[left_on].is_sorted()
    j = (q if ordered else q.sort(left_on)).join_asof(
        right, left_on=left_on, right_on=right_on, by=by, strategy=strategy,
        allow_exact_matches=allow_exact_matches, check_sortedness=False)
    return (j if ordered else j.sort("_asof_i")).drop("_asof_i")


def nesting_depth(ranges: pl.DataFrame) -> pl.Series:
    """Nesting depth of each range on its (pid, tid), 0 = outermost, by a sorted sweep.

    ``ranges`` must have start, end, pid, tid. Depth of a range = number of ranges on the
    same thread that started at or before it and end after it starts (strict push/pop
    nesting assumed; crossing start/end ranges get a best-effort depth).
    """
    if ranges.height == 0:
        return pl.Series("depth", [], dtype=pl.Int32)
    df = ranges.select("start", "end", "pid", "tid").with_row_index("_i")
    # +1 at each start, -1 at each end; depth at a start = running sum before it.
    # Ends sort before starts at the same instant, and a longer range opens first.
    ev = pl.concat(
        [
            df.select("_i", "pid", "tid", ts="start", d=pl.lit(1, pl.Int32), o=pl.lit(1, pl.Int8), neg_end=-pl.col("end")),
            df.select("_i", "pid", "tid", ts="end", d=pl.lit(-1, pl.Int32), o=pl.lit(0, pl.Int8), neg_end=pl.lit(0, pl.Int64)),
        ]
    ).sort(["pid", "tid", "ts", "o", "neg_end"])
    ev = ev.with_columns(level=pl.col("d").cum_sum().over(["pid", "tid"]) - pl.col("d"))
    starts = ev.filter(pl.col("o") == 1).select("_i", "level").sort("_i")
    return starts["level"].clip(lower_bound=0).cast(pl.Int32).alias("depth")
