"""Interval primitives over polars frames, written once (sorted sweeps, no Python loops).

Every function takes intervals as columns ``start``/``end`` (int ns, end >= start) plus
grouping columns, and works for millions of rows.
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl


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
        carried = pl.when(inside).then(pl.col("end")).otherwise(0).cum_max().shift(1).fill_null(0)
        parts[f"{prefix}{k}"] = pl.when(inside).then(
            (pl.col("end") - pl.max_horizontal("start", carried)).clip(lower_bound=0)).otherwise(0)
    lf = df.lazy().select(group, "start", "end", level)
    if tiled and presorted:
        lf = lf.select(group, **parts).group_by(group, maintain_order=True).agg(pl.exclude(group).sum())
    else:
        if not presorted:
            lf = lf.sort([group, "start"])
        lf = lf.group_by(group, maintain_order=True).agg(e.sum().alias(name) for name, e in parts.items())
    out = lf.collect()
    last, cols = 0, []
    for k in range(n_levels):
        last = k if k in levels else last
        cols.append(pl.col(f"{prefix}{last}").alias(f"{prefix}{k}"))
    return out.select(group, *cols)
