"""The readers' lean paths (issue 25) give exactly what the plain code they replace gives.

* nsys: the plausibility check in integers (taken when every time fits a float64 exactly) keeps the rows the
  float formula keeps, at the boundaries too;
* Kineto: the ops are sorted a column at a time (``sorted_by_start``): the same rows, the same order of equal
  starts and the same sortedness flags as ``pl.concat(parts).sort("start")``, and named after the sort (a real
  trace's ops read as the names its JSON holds).

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
from tracekit.readers import nsys
from tracekit.readers.kineto import sorted_by_start

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


def test_plausible_wrapping_differences_stay_out():
    # end - start overflows int64: only the float formula can say it is implausible, and it is used here
    df = pl.DataFrame({"start": [-(2**62) - 5, 0], "end": [2**62 + 5, 10]})
    assert not nsys._exact_in_float(df)
    assert nsys._plausible(df, "rows", [])["start"].to_list() == [0]


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


def test_kineto_ops_are_the_json_events_by_start():
    """hf-small-eager-torch: every cpu_op and python_function event of the JSON is one row of Trace.ops, named as
    in the JSON, in start order."""
    path = Path(__file__).parents[1] / "sample_traces" / "hf-small-eager-torch" / "trace.json.gz"
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
