"""The floor: the least work any tool must do to get breakdown's inputs off the disk.

* SQLite: a bare scan of only the columns ``tracekit breakdown`` reads (the very SELECTs
  ``tracekit/readers/nsys/reader.py`` runs, from ``scan_plan``: kernels, the launching runtime calls,
  memcpy/memset, NVTX ranges, StringIds, GPUs) into Arrow, by one engine: ``sqlite3`` (stdlib
  rows -> Arrow arrays), ``adbc`` (adbc-driver-sqlite, Arrow-native) or ``connectorx``; one
  query after the other, or with ``--parallel`` all at once (a thread and connection each,
  as tracekit reads its two big tables). No joins, no analysis.
* JSON: a bare parse of the whole document (``orjson.loads`` of the decompressed bytes,
  or msgspec), building nothing else.

Run as a subprocess by benchmarks/run.py so its wall time and peak RSS are its own:

    python benchmarks/floor.py sqlite /tmp/nsys_10M.sqlite --engine adbc [--parallel]
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def queries(path: Path) -> list[str]:
    """Exactly the SELECTs ``tracekit breakdown`` runs on this file (``tracekit.readers.nsys.reader.scan_plan``:
    the reader's own query builders, so floor and tool can never drift apart)."""
    from tracekit.readers.nsys.reader import scan_plan

    return scan_plan(path, kernel_dims=False)


def _uri(path: Path) -> str:
    return "file:" + urllib.parse.quote(str(Path(path).resolve())) + "?mode=ro&immutable=1"


def scan(path: Path, engine: str, parallel: bool = False) -> dict:
    """Scan the queries with one engine: one after the other, or (``parallel``) all at once, one thread and
    one connection each, as many threads as CPUs (every engine releases the GIL while SQLite reads)."""
    qs = queries(path)
    t0 = time.perf_counter()
    run = {"sqlite3": _sqlite3, "adbc": _adbc, "connectorx": _connectorx}.get(engine)
    if run is None:
        raise SystemExit(f"unknown engine {engine}")
    if parallel:
        import os
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
            rows = sum(pool.map(lambda q: run(path, q), qs))
    else:
        rows = sum(run(path, q) for q in qs)
    return {"engine": engine, "parallel": parallel, "rows": rows, "queries": len(qs),
            "seconds": time.perf_counter() - t0}


def _sqlite3(path: Path, q: str) -> int:
    import pyarrow as pa

    con = sqlite3.connect(_uri(path), uri=True)
    cur = con.execute(q)
    data = cur.fetchall()
    n = len(cur.description)
    cols = list(zip(*data)) if data else [()] * n
    rows = pa.table({str(i): pa.array(c) for i, c in enumerate(cols)}).num_rows
    con.close()
    return rows


def _adbc(path: Path, q: str) -> int:
    import adbc_driver_sqlite.dbapi as adbc

    con = adbc.connect(_uri(path))
    cur = con.cursor()
    cur.adbc_statement.set_options(**{"adbc.sqlite.query.batch_rows": str(1 << 20)})
    cur.execute(q)
    rows = cur.fetch_arrow_table().num_rows
    cur.close()
    con.close()
    return rows


def _connectorx(path: Path, q: str) -> int:
    import connectorx as cx

    # A percent-encoded file: URI keeps mode=ro&immutable=1 (the file is opened O_RDONLY).
    url = "sqlite://" + urllib.parse.quote(_uri(path), safe="")
    if " LIMIT " in q:  # (connectorx appends its own LIMIT to probe the schema: a limited query goes inside)
        q = f"SELECT * FROM ({q})"
    return cx.read_sql(url, q, return_type="arrow").num_rows


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
    p.add_argument("--parallel", action="store_true", help="sqlite: run the queries at once, a thread each")
    a = p.parse_args(argv)
    if a.kind == "sqlite":
        res = scan(a.path, a.engine or "adbc", a.parallel)
    else:
        res = parse_json(a.path, a.engine or "orjson")
    json.dump(res, sys.stdout)
    print()


if __name__ == "__main__":
    main()
