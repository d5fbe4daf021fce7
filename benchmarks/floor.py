"""The floor: the least work any tool must do to get breakdown's inputs off the disk.

* SQLite: a bare scan of only the columns ``tracekit breakdown`` reads (the same SELECTs
  as ``tracekit/readers/nsys.py``: kernels, runtime launches, memcpy/memset, NVTX ranges,
  StringIds) into Arrow, by one engine: ``sqlite3`` (stdlib rows -> Arrow arrays),
  ``adbc`` (adbc-driver-sqlite, Arrow-native) or ``connectorx``. No joins, no analysis.
* JSON: a bare parse of the whole document (``orjson.loads`` of the decompressed bytes,
  or msgspec), building nothing else.

Run as a subprocess by benchmarks/run.py so its wall time and peak RSS are its own:

    python benchmarks/floor.py sqlite /tmp/nsys_10M.sqlite --engine adbc
    python benchmarks/floor.py json /tmp/kineto_1gb.json
"""

from __future__ import annotations

import argparse
import gzip
import json
import sqlite3
import sys
import time
import urllib.parse
from pathlib import Path

PID = "(({c} >> 24) & 16777215)"
TID = "({c} & 16777215)"


def queries(path: Path) -> list[str]:
    """The SELECTs breakdown needs, restricted to the tables/columns this file has."""
    con = sqlite3.connect(_uri(path), uri=True)
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}

    def cols(t):
        return {r[1] for r in con.execute(f'PRAGMA table_info("{t}")')}

    out = []
    for t in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL"):
        if t in tables:
            c = cols(t)
            extra = [x for x in ("graphId", "graphNodeId", "gridX", "gridY", "gridZ", "blockX", "blockY", "blockZ")
                     if x in c]
            name = next(x for x in ("demangledName", "shortName", "mangledName") if x in c)
            out.append(f"SELECT start, end, deviceId, streamId, correlationId, {PID.format(c='globalPid')}, {name}"
                       + "".join(", " + x for x in extra) + f" FROM {t}")
            break
    if "CUPTI_ACTIVITY_KIND_RUNTIME" in tables:
        where = " WHERE eventClass IN (0, 1)" if "eventClass" in cols("CUPTI_ACTIVITY_KIND_RUNTIME") else ""
        out.append(f"SELECT start, end, {PID.format(c='globalTid')}, {TID.format(c='globalTid')}, correlationId, "
                   f"nameId FROM CUPTI_ACTIVITY_KIND_RUNTIME{where}")
    for t in ("CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"):
        if t in tables:
            out.append(f"SELECT start, end, deviceId, streamId, correlationId, {PID.format(c='globalPid')}, bytes "
                       f"FROM {t}")
    if "NVTX_EVENTS" in tables:
        c = cols("NVTX_EVENTS")
        out.append(f"SELECT start, end, {PID.format(c='globalTid')}, {TID.format(c='globalTid')}, text, "
                   f"{'textId' if 'textId' in c else 'NULL'} FROM NVTX_EVENTS WHERE eventType IN (59, 60, 70, 71)")
    if "StringIds" in tables:
        out.append("SELECT id, value FROM StringIds")
    con.close()
    return out


def _uri(path: Path) -> str:
    return "file:" + urllib.parse.quote(str(Path(path).resolve())) + "?mode=ro&immutable=1"


def scan(path: Path, engine: str) -> dict:
    import pyarrow as pa

    qs = queries(path)
    t0 = time.perf_counter()
    rows = 0
    if engine == "sqlite3":
        con = sqlite3.connect(_uri(path), uri=True)
        for q in qs:
            cur = con.execute(q)
            data = cur.fetchall()
            n = len(cur.description)
            cols = list(zip(*data)) if data else [()] * n
            rows += pa.table({str(i): pa.array(c) for i, c in enumerate(cols)}).num_rows
            del data, cols
        con.close()
    elif engine == "adbc":
        import adbc_driver_sqlite.dbapi as adbc

        con = adbc.connect(_uri(path))
        cur = con.cursor()
        cur.adbc_statement.set_options(**{"adbc.sqlite.query.batch_rows": str(1 << 20)})
        for q in qs:
            cur.execute(q)
            rows += cur.fetch_arrow_table().num_rows
        cur.close()
        con.close()
    elif engine == "connectorx":
        import connectorx as cx

        # A percent-encoded file: URI keeps mode=ro&immutable=1 (the file is opened O_RDONLY).
        url = "sqlite://" + urllib.parse.quote(_uri(path), safe="")
        for q in qs:
            rows += cx.read_sql(url, q, return_type="arrow").num_rows
    else:
        raise SystemExit(f"unknown engine {engine}")
    return {"engine": engine, "rows": rows, "queries": len(qs), "seconds": time.perf_counter() - t0}


def parse_json(path: Path, engine: str = "orjson") -> dict:
    t0 = time.perf_counter()
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    if engine == "msgspec":
        import msgspec

        doc = msgspec.json.decode(raw)
    else:
        import orjson

        doc = orjson.loads(raw)
    n = len(doc.get("traceEvents", []))
    return {"engine": engine, "events": n, "bytes": len(raw), "seconds": time.perf_counter() - t0}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("kind", choices=["sqlite", "json"])
    p.add_argument("path", type=Path)
    p.add_argument("--engine", default=None, help="sqlite: sqlite3|adbc|connectorx; json: orjson|msgspec")
    a = p.parse_args(argv)
    if a.kind == "sqlite":
        res = scan(a.path, a.engine or "adbc")
    else:
        res = parse_json(a.path, a.engine or "orjson")
    json.dump(res, sys.stdout)
    print()


if __name__ == "__main__":
    main()
