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


def union_length_sorted(df: pl.LazyFrame, group: str, name: str = "union_ns") -> pl.LazyFrame:
    """``union_length`` for input sorted by (``group``, start) whose groups occupy disjoint, increasing
    time ranges (the clipped periods of consecutive steps): no re-sort and no window function.

    A filter of a sorted frame stays sorted, so the breakdown sorts its activities once and calls this
    for each cumulative category set. Under the precondition, the running maximum end carried over
    from earlier groups never exceeds a later group's starts, so one global ``cum_max`` is exact.

    >>> df = pl.DataFrame({"g": [1, 1, 1, 2, 2], "start": [0, 5, 20, 30, 40], "end": [10, 12, 25, 35, 41]})
    >>> union_length_sorted(df.lazy(), "g").collect().sort("g").rows()
    [(1, 17), (2, 6)]
    """
    g = pl.col(group)
    prev_end = pl.col("end").cum_max().shift(1)
    new = (g != g.shift(1)).fill_null(True) | (pl.col("start") > prev_end).fill_null(True)
    lf = df.select(group, "start", "end").with_columns(seg=new.cast(pl.Int64).cum_sum())
    return (lf.group_by("seg").agg(g.first(), pl.col("start").min(), pl.col("end").max())
            .group_by(group).agg((pl.col("end") - pl.col("start")).sum().alias(name)))
