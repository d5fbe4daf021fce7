"""Measure proposed hot-spot fixes in modules this benchmark does not own, without editing them.

Each fix is a drop-in replacement applied by monkeypatching, timed against the shipped
function on the same big export in the same process, and checked for identical output:

1. ``readers/nsys.py::_launches``: strip the API version and classify the API kind on the
   few thousand ``StringIds`` rows *before* joining them onto the launches, instead of
   running two regex/prefix passes over every launch row (21.7M rows at 10M kernels).
2. ``readers/nsys.py::read_nsys``: ``launches.sort("start")`` / ``kernels.sort("start")`` on
   frames that are already sorted (nsys writes rows in time order): check ``is_sorted()``
   (one pass) and skip the sort.

    python benchmarks/prototype_fixes.py /tmp/tracekit-bench/nsys_10M.sqlite
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import polars as pl

import tracekit.readers.nsys as nsys
from tracekit.readers.common import api_kind, strip_api_version
from tracekit.trace import LAUNCHES, conform, empty


def launches_fixed(db, strings: pl.DataFrame) -> pl.DataFrame:
    table = "CUPTI_ACTIVITY_KIND_RUNTIME"
    if not db.has(table):
        return empty(LAUNCHES)
    cols = set(db.columns(table))
    where = " WHERE eventClass IN (0, 1)" if "eventClass" in cols else ""
    sql = (f"SELECT start, end, {nsys._PID.format(c='globalTid')}, {nsys._TID.format(c='globalTid')}, "
           f"correlationId, nameId FROM {table}{where}")
    df = db.frame(sql, {"start": pl.Int64, "end": pl.Int64, "pid": pl.Int64, "tid": pl.Int64,
                        "correlation": pl.Int64, "name_id": pl.Int64}, table)
    # The string work on the small table, once per distinct name.
    unknown = "<unknown api>"
    names = (strings.rename({"id": "name_id", "value": "name"})
             .with_columns(name=strip_api_version(pl.col("name").fill_null(unknown)))
             .with_columns(kind=api_kind(pl.col("name"))))
    unknown_kind = pl.select(api_kind(pl.lit(unknown))).item()
    df = df.join(names, on="name_id", how="left").drop("name_id")
    df = df.with_columns(name=pl.col("name").fill_null(unknown), kind=pl.col("kind").fill_null(unknown_kind))
    return conform(df, LAUNCHES)


def timed(fn, *a):
    t = time.perf_counter()
    out = fn(*a)
    return out, time.perf_counter() - t


def main(path: str) -> None:
    db = nsys._Db(Path(path))
    strings = nsys._strings(db)
    res = {}
    ref, res["launches_shipped_s"] = timed(nsys._launches, db, strings)
    new, res["launches_fixed_s"] = timed(launches_fixed, db, strings)
    res["launches_identical"] = ref.equals(new)
    res["launch_rows"] = ref.height
    _, res["sort_launches_s"] = timed(ref.sort, "start")
    is_sorted, res["is_sorted_check_s"] = timed(lambda: ref["start"].is_sorted())
    res["launches_already_sorted"] = bool(is_sorted)
    db.close()
    res = {k: round(v, 2) if isinstance(v, float) else v for k, v in res.items()}
    print(json.dumps(res))


if __name__ == "__main__":
    main(sys.argv[1])
