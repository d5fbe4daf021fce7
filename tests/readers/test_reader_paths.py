"""The readers' lean paths (issue 25) give exactly what the plain code they replace gives.

* nsys: the plausibility check in integers (taken when every time fits a float64 exactly) keeps the rows the
  float formula keeps, at the boundaries too, and its one-pass "nothing to drop" answers as that formula does;
* Kineto: the ops are put in start order while the trace is read (``OpsInOrder``): the same rows, the same
  order of equal starts and the same sortedness flags as ``pl.concat([ops, host work]).sort("start")``, whether
  the runs arrive in time order or not, and named as the JSON names them.

The expectations are computed here with the plain polars formulas or read from the JSON with ``json``, never
copied from the reader's output.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from polars.testing import assert_frame_equal

import tracekit
from tracekit.readers.kineto import columns as kineto_columns
from tracekit.readers.kineto.columns import sorted_by_start
from tracekit.readers.kineto.reader import by_start
from tracekit.readers.nsys import reader as nsys

DAY = 86_400 * 10**9


def _float_ok(df: pl.DataFrame) -> pl.Series:
    """The check as it was written first: durations as float differences."""
    dur = pl.col("end").cast(pl.Float64) - pl.col("start").cast(pl.Float64)
    return df.select((pl.col("start").is_not_null() & (dur >= 0) & (dur <= DAY)).fill_null(False))["start"]


@pytest.mark.parametrize("base", [0, 2**53 - DAY - 5, -(2**53) + 3, 2**62, -(2**62)])
def test_plausible_in_integers_keeps_the_rows_the_float_formula_keeps(base):
    starts = [base, base, base + 10, base, None, base + 5, base]
    ends = [base + 10, base - 1, base + 10, base + DAY, base + 7, None, base + DAY + 1]
    df = pl.DataFrame({"start": starts, "end": ends}, schema={"start": pl.Int64, "end": pl.Int64})
    warnings: list[str] = []
    got = nsys._plausible(df, "rows", warnings)
    want = df.filter(_float_ok(df))
    assert_frame_equal(got, want)
    assert bool(warnings) == (want.height < df.height)
    # the integer path is taken only where it is exact
    assert nsys._exact_in_float(df) == all(-(2**53) <= v <= 2**53 for v in starts + ends if v is not None)


@pytest.mark.parametrize("base", [0, 2**53 - DAY - 5, -(2**53) + 3, 2**53 - 3, 2**62])
def test_plausible_fast_answer_agrees_with_the_float_formula(base):
    # every pair of the boundary rows: the one-pass answer "nothing to drop" (_all_plausible) must be given exactly
    # when the float formula keeps every row and no time is null or beyond +-2^53
    starts = [base, base, base + 10, base, base + 5, base]
    ends = [base + 10, base - 1, base + 10, base + DAY, base + 5, base + DAY + 1]
    for i in range(len(starts)):
        for j in range(i, len(starts)):
            df = pl.DataFrame({"start": [starts[i], starts[j]], "end": [ends[i], ends[j]]},
                              schema={"start": pl.Int64, "end": pl.Int64})
            every = bool(_float_ok(df).all()) and nsys._exact_in_float(df)
            assert nsys._all_plausible(df) == every, (base, i, j)
            assert_frame_equal(nsys._plausible(df, "rows", []), df.filter(_float_ok(df)))


def test_plausible_wrapping_differences_stay_out():
    # end - start overflows int64: only the float formula can say it is implausible, and it is used here
    df = pl.DataFrame({"start": [-(2**62) - 5, 0], "end": [2**62 + 5, 10]})
    assert not nsys._exact_in_float(df)
    assert nsys._plausible(df, "rows", [])["start"].to_list() == [0]


def _batches(rng, n_batches: int, spread: int, in_order: bool, shapes: bool) -> list[pl.DataFrame]:
    """Typed batches as the reader makes them (start, end, name codes, pid, tid[, shapes][, _run]); in_order: each
    run's starts ascending across batches (equal starts included), else at random."""
    out, t = [], {1: 0, 2: 0, 0: 0}
    for _ in range(n_batches):
        n = int(rng.integers(0, 400))
        runs = np.zeros(n, dtype=np.uint8) if shapes else rng.integers(1, 3, n).astype(np.uint8)
        start = np.empty(n, dtype=np.int64)
        for r in np.unique(runs):
            k = int((runs == r).sum())
            s = t[int(r)] + np.cumsum(rng.integers(0, spread, k)) if in_order else rng.integers(0, 50 * spread, k)
            start[runs == r] = s
            if k:
                t[int(r)] = int(s[-1]) if in_order else t[int(r)]
        cols = {"start": start, "end": start + 7, "name": pl.Series(rng.integers(0, 4, n), dtype=pl.UInt32),
                "pid": np.full(n, 1), "tid": np.full(n, 2)}
        if shapes:
            cols |= {"input_dims": pl.Series([f"[[{i}]]" if i % 3 else None for i in range(n)], dtype=pl.String),
                     "input_types": pl.Series([f"['t{i}']" if i % 3 else None for i in range(n)], dtype=pl.String)}
        else:
            cols[kineto_columns._RUN] = runs
        out.append(pl.DataFrame(cols))
    return out


@pytest.mark.parametrize("first", [500, 10**9])
@pytest.mark.parametrize("in_order", [True, False])
@pytest.mark.parametrize("spread", [3, 10**6])
def test_ops_in_order_are_concat_then_sort(monkeypatch, in_order, spread, first):
    """Fed in batches (the ops with shapes now and then, host work in two runs), OpsInOrder gives the rows of
    ``concat([ops, host work]).sort("start")`` (stable), named, with the same flags: in rounds while reading when
    every run is in time order, all at the end otherwise, or all at once when there are too few rows for a round
    (``first``)."""
    monkeypatch.setattr(kineto_columns, "_SETTLE", 500)  # (several rounds in a few thousand rows)
    monkeypatch.setattr(kineto_columns, "_SETTLE_FIRST", first)
    rng = np.random.default_rng(spread + in_order)
    ops, host = _batches(rng, 6, spread, in_order, True), _batches(rng, 30, spread, in_order, False)
    plain = pl.concat([*ops, *(h.drop(kineto_columns._RUN) for h in host)], how="diagonal")
    names = kineto_columns._Names("op")
    names.index = {"a": 0, "b": 1, None: 2, "d": 3}
    got_ops = kineto_columns.OpsInOrder(names)
    rounds, waiting = [], list(ops)
    for i, h in enumerate(host):  # (the ops arrive every fifth batch, as their rarer batches do)
        if i % 5 == 0 and waiting:
            got_ops.add("op", waiting.pop(0))
        got_ops.add("host", h)
        rounds.append(len(got_ops.done))
    for o in waiting:
        got_ops.add("op", o)
    if first == 500:
        assert got_ops.in_order == in_order
    assert (max(rounds) > 1) == (in_order and first == 500)  # (rows put in place while reading only when in order)
    got = got_ops.finish()
    want = plain.sort("start", maintain_order=True)
    want = want.with_columns(name=pl.Series(["a", "b", None, "d"], dtype=pl.String).gather(want["name"]))
    want = want.select(kineto_columns._OPS).with_columns(  # (Trace.ops' text columns are categorical)
        pl.col("name", "input_dims", "input_types").cast(pl.Categorical))
    assert_frame_equal(got, want)
    assert {c: got[c].flags for c in got.columns} == {c: want[c].flags for c in want.columns}


@pytest.mark.parametrize("spread", [5, 10**9])
def test_sorted_by_start_is_concat_then_sort(spread):
    rng = np.random.default_rng(spread)
    parts = []
    for i in range(7):  # reader batches: many chunks, many equal starts when the spread is small
        n = int(rng.integers(1, 3000))
        parts.append(pl.DataFrame({
            "start": rng.integers(0, spread, n), "i": np.arange(n) + 10_000 * i,
            "name": pl.Series(rng.choice(["a", "b", "c"], n).tolist(), dtype=pl.String), "dims": pl.repeat(None, n, dtype=pl.String, eager=True)}))
    want = pl.concat(parts).sort("start")
    got = sorted_by_start(list(parts))
    assert_frame_equal(got, want)
    assert {c: got[c].flags for c in got.columns} == {c: want[c].flags for c in want.columns}


def test_by_start_is_a_stable_sort():
    rng = np.random.default_rng(7)
    for starts in (np.sort(rng.integers(0, 5, 300)), rng.integers(0, 5, 300)):
        df = pl.DataFrame({"start": starts, "i": np.arange(300)})
        got, want = by_start(df), df.sort("start", maintain_order=True)
        assert_frame_equal(got, want)
        assert got["start"].flags == want["start"].flags


@pytest.mark.slow
def test_kineto_ops_are_the_json_events_by_start():
    """hf-small-eager-torch: every cpu_op and python_function event of the JSON is one row of Trace.ops, named as
    in the JSON, in start order."""
    path = Path(__file__).parents[2] / "sample_traces" / "hf-small-eager-torch" / "trace.json.gz"
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    host = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "python_function")]
    ops = tracekit.load(path).ops
    assert ops.height == len(host)
    assert ops["start"].is_sorted()
    want = sorted(e["name"] for e in host)
    assert sorted(ops["name"].to_list()) == want
    # the first op in time is the event with the smallest ts (ns, exact for these 3-decimal µs stamps)
    first = min(host, key=lambda e: e["ts"])
    assert ops["name"][0] == first["name"]
    assert ops["start"][0] == round(first["ts"] * 1000)
