"""Keyed row lookup: for each GPU activity, which launch (row of another frame) it belongs to.

GPU work joins its host launch on ``(pid, correlation)``. With ten million kernels and as many launches
a hash join is the slowest step of a breakdown (~2-5 s on two cores), yet the keys are almost
dense: a correlation id is a per-process counter (nsys numbers every API call, so the launches hold
1 id in 6 to 20). :func:`row_lookup` exploits that. When the ids of every process fit an array
``DENSITY`` times the number of rows, each key gets a slot (``pid``'s base offset + correlation);
the right frame's row numbers are scattered into the slots and the left frame's keys gathered from
them: two linear passes, no hashing (on 10M kernels x 8.4M launches: 0.5 s instead of 4 s). When both
sides are already in key order (one process, one stream), a merge of the sorted keys is faster still.
Sparser or exotic keys (huge or negative ids) fall back to a hash join with the same result.
"""

from __future__ import annotations

import polars as pl

_SLACK_ROWS = 1 << 20  # dense table may hold this many empty slots beyond DENSITY x rows
DENSITY = 32  # at most this many slots (4 bytes each) per row of the right frame


def row_lookup(left: pl.DataFrame, right: pl.DataFrame, on: tuple[str, str] = ("pid", "correlation"),
               valid: pl.Series | None = None) -> pl.Series:
    """For each row of ``left``, the index of the first row of ``right`` with the same ``on`` key (null if none).

    ``on`` is (group, id): both integer columns; null keys never match. ``valid`` (booleans, one per row of
    ``right``) limits the match to those rows, as if the others had null keys.

    >>> left = pl.DataFrame({"pid": [1, 1, 2, 1], "correlation": [10, 12, 10, None]})
    >>> right = pl.DataFrame({"pid": [1, 1, 2, 1], "correlation": [12, 10, 10, 12]})
    >>> row_lookup(left, right).to_list()
    [1, 0, 2, None]
    >>> row_lookup(left, right, valid=pl.Series([False, True, True, True])).to_list()
    [1, 3, 2, None]
    """
    g, k = on
    if right.height == 0 or left.height == 0:
        return pl.repeat(None, left.height, dtype=pl.UInt32, eager=True).alias("row")
    found = _sorted_lookup(left, right, g, k, valid)
    if found is not None:
        return found
    if valid is not None:
        right = right.select(g, pl.when(valid).then(pl.col(k)).alias(k))
    spans = (right.select(g, k).drop_nulls().group_by(g)
             .agg(lo=pl.col(k).min(), hi=pl.col(k).max()).sort(g))
    total = int((spans["hi"] - spans["lo"] + 1).sum()) if spans.height else 0
    dense = (spans.height > 0 and int(spans["lo"].min()) >= 0
             and total <= DENSITY * right.height + _SLACK_ROWS and right.height < 2**32 - 1)
    if not dense:
        return _hash_lookup(left, right, g, k)
    spans = spans.with_columns(base=(pl.col("hi") - pl.col("lo") + 1).cum_sum() - (pl.col("hi") - pl.col("lo") + 1))
    groups = spans[g].to_list()
    offset = dict(zip(groups, (spans["base"] - spans["lo"]).to_list()))
    lo = dict(zip(groups, spans["lo"].to_list()))
    hi = dict(zip(groups, spans["hi"].to_list()))

    def slot(df: pl.DataFrame) -> pl.Series:
        gc, kc = pl.col(g), pl.col(k)
        if len(groups) == 1:  # one process (the usual trace): scalars, no per-row lookup of the group
            (one,) = groups
            inside = (gc == one) & (kc >= lo[one]) & (kc <= hi[one])
            s = pl.when(inside).then(kc + offset[one])
        else:
            inside = (kc >= gc.replace_strict(lo, default=None, return_dtype=pl.Int64)) & (
                kc <= gc.replace_strict(hi, default=None, return_dtype=pl.Int64))
            s = pl.when(inside).then(kc + gc.replace_strict(offset, default=None, return_dtype=pl.Int64))
        return df.select(s.alias("slot"))["slot"]

    rslot = slot(right)
    rows = pl.int_range(0, right.height, dtype=pl.UInt32, eager=True)
    keep = rslot.is_not_null()
    rslot, rows = rslot.filter(keep), rows.filter(keep)
    lslot = slot(left)
    if lslot.null_count() == 0 and lslot.is_sorted() and _increasing(rslot):
        # Both sides in key order (one process, one stream: launches and kernels alike follow the counter):
        # polars merges sorted keys without hashing (0.15 s on 10M x 8.4M, half the scatter's time).
        r = pl.DataFrame({"slot": rslot, "row": rows}).set_sorted("slot")
        out = lslot.rename("slot").to_frame().set_sorted("slot").join(r, on="slot", how="left",
                                                                        maintain_order="left")
        return out["row"]
    table = pl.Series("row", [None], dtype=pl.UInt32).extend_constant(None, total - 1)
    # Reversed, so that with duplicate keys the first row wins (scatter writes in order; the last write stays).
    table = table.scatter(rslot.reverse(), rows.reverse())
    return table.gather(lslot).rename("row")


def _sorted_lookup(left: pl.DataFrame, right: pl.DataFrame, g: str, k: str, valid: pl.Series | None) -> pl.Series | None:
    """One process on the right and its keys strictly increasing (launches in time order follow the counter):
    a merge of sorted keys when the left keys are sorted too and not far fewer (10M x 10M: ~0.1 s), else a binary
    search per left row; no slot table, no hashing. None when the right side is not like that."""
    rk = right[k]
    gs = right[g]
    if rk.null_count() or gs.null_count() or gs.min() != gs.max() or not rk.is_sorted():
        return None
    rk = rk.set_sorted()
    if not _increasing(rk):
        return None
    one, n = gs[0], right.height
    lk = left[k]
    if lk.null_count() == 0 and lk.is_sorted() and 8 * left.height >= n:
        # (a merge reads the right keys between the first and last left key: for a few left rows, such as the
        # copies of a trace, the binary search below reads far less)
        return _merge_pieces(left, rk, g, k, one, valid)
    row = rk.search_sorted(lk, side="left").cast(pl.UInt32)
    return _hits(left.select(g, k, row=row), g, one, valid, n,
                 pl.lit(rk).gather(pl.col("row").clip(0, n - 1)) == pl.col(k))


def _hits(found: pl.DataFrame, g: str, one, valid: pl.Series | None, n: int, hit: pl.Expr | None = None) -> pl.Series:
    """``found``'s ``row`` where it is a match: ``hit`` (default: every row), the right side's one group, and a
    ``valid`` row of the right side (``n`` rows); else null."""
    hit = (pl.col(g) == one) if hit is None else hit & (pl.col(g) == one)
    if valid is not None:
        hit = hit & pl.lit(valid).gather(pl.col("row").clip(0, n - 1))
    return found.select(pl.when(hit.fill_null(False)).then(pl.col("row")).alias("row"))["row"]


def _merge_pieces(left: pl.DataFrame, rk: pl.Series, g: str, k: str, one, valid: pl.Series | None) -> pl.Series:
    """:func:`_sorted_lookup` when the left keys are sorted too: a merge of sorted keys, piece by piece of the left
    rows, each against the run of right keys its own keys span (found by binary search). Each piece's columns stay
    small and reuse the same memory; at ten million rows the merge in one piece faulted in ~0.45 GB of fresh
    memory (join indices, row numbers, masks) to return a 40 MB column."""
    from tracekit.intervals import CHUNK_ROWS
    from tracekit.parallel import in_threads

    lk, n = left[k], rk.len()
    valid = valid.rechunk() if valid is not None else None  # (gathered from by every piece: one chunk, 1 bit a row)

    def piece(o: int) -> pl.Series:
        lp = left.slice(o, CHUNK_ROWS)
        keys = lk.slice(o, CHUNK_ROWS)
        lo = int(rk.search_sorted(keys[0], side="left"))
        hi = int(rk.search_sorted(keys[-1], side="right"))
        r = pl.DataFrame({k: rk.slice(lo, hi - lo), "row": pl.int_range(lo, hi, dtype=pl.UInt32, eager=True)}
                         ).set_sorted(k)
        row = lp.select(k).set_sorted(k).join(r, on=k, how="left", maintain_order="left")["row"]
        return _hits(lp.select(g, row=row), g, one, valid, n)

    # (the pieces are independent: two per CPU at a time, as intervals.by_pieces runs its pieces)
    out = in_threads(*[lambda o=o: piece(o) for o in range(0, left.height, CHUNK_ROWS)], per_cpu=2)
    return pl.concat(out, rechunk=True) if out else pl.Series("row", [], dtype=pl.UInt32)


def _increasing(s: pl.Series) -> bool:
    """Strictly increasing (so also free of duplicates)."""
    from tracekit.intervals import CHUNK_ROWS

    # (each value against the next, piece by piece: bitmasks of small pieces, where diff() or n_unique() made
    # a column of ten million values, and two misaligned slices of a reader's many-chunk column a copy of each)
    n = s.len()
    return all(bool((s.slice(o + 1, CHUNK_ROWS) > s.slice(o, min(CHUNK_ROWS, n - 1 - o))).all())
               for o in range(0, n - 1, CHUNK_ROWS))


def _hash_lookup(left: pl.DataFrame, right: pl.DataFrame, g: str, k: str) -> pl.Series:
    r = (right.select(g, k).with_row_index("row").drop_nulls([g, k])
         .unique([g, k], keep="first", maintain_order=True))
    out = left.select(g, k).join(r, on=[g, k], how="left", maintain_order="left")
    return out["row"].cast(pl.UInt32)
