"""Build a large SYNTHETIC nsys SQLite export by replicating a real one along the timeline.

The source export is copied, then every GPU-activity table that breakdown reads (kernels,
memcpy, memset, synchronisation, graph trace) and the runtime API table are replicated
in SQL (``INSERT ... SELECT`` against a copy-number table): copy ``k`` is shifted by
``k * period`` ns (period = the source's span + 1 ms) and its correlation ids by
``k * (max correlation id + 1)``, so every launch still joins its kernel, per process.

Step ranges: the source's ``decode_step N`` NVTX ranges (what ``tracekit capture``
writes) are replicated and renumbered per copy. A source without them (e.g. the nsys-ai
torchrun slice in tests/data) gets synthetic ``decode_step N`` push/pop ranges on each
thread that launches kernels (fixed ``--step-ms`` windows over its launches). Other NVTX
rows (torch op ranges) stay in copy 0 only: replicating them (~5 per kernel in the
nsys-ai slice) would make the benchmark measure NVTX bloat, not kernels. The output is labelled synthetic: ``META_DATA_EXPORT`` gets a row
``SYNTHETIC = replicated from <source> ...``.

    python benchmarks/make_nsys.py --kernels 1M -o /tmp/nsys_1M.sqlite
    python benchmarks/make_nsys.py --kernels 1M --no-markers -o /tmp/nsys_1M_inferred.sqlite

``--no-markers`` drops the step ranges (the source's and any synthetic ones): tracekit then infers the steps
from the period of the launch sequence, the path a capture without markers takes.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sqlite3
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CANDIDATES = [
    REPO / "sample_traces/hf-small-eager/trace.sqlite",
    REPO / "tests/data/nsys/nsysai_mfu_2gpu_before_2026.2.sqlite",
]
KERNEL_TABLES = ("CUPTI_ACTIVITY_KIND_KERNEL",)
# Tables whose rows are shifted in time and correlation (if present in the source).
GPU_TABLES = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET",
              "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", "CUPTI_ACTIVITY_KIND_GRAPH_TRACE",
              "CUPTI_ACTIVITY_KIND_RUNTIME")


def default_source() -> Path:
    return next(p for p in CANDIDATES if p.exists())


def parse_count(s: str) -> int:
    s = s.strip().upper()
    mult = {"K": 10**3, "M": 10**6, "G": 10**9}.get(s[-1:], 1)
    return int(float(s[:-1] if s[-1:] in "KMG" else s) * mult)


def _cols(con, table):
    return [r[1] for r in con.execute(f'PRAGMA table_info("{table}")')]


def make(source: Path, out: Path, kernels: int, step_ms: float = 3.0, markers: bool = True) -> dict:
    t0 = time.perf_counter()
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.exists():
        out.unlink()
    shutil.copyfile(source, out)
    con = sqlite3.connect(out, isolation_level=None)
    con.executescript("PRAGMA journal_mode=OFF; PRAGMA synchronous=OFF; PRAGMA temp_store=MEMORY;"
                      "PRAGMA cache_size=-262144;")
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    present = [t for t in GPU_TABLES if t in tables]
    base_kernels = con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    copies = max(1, -(-kernels // base_kernels))
    # Span and id range over everything that is shifted.
    lo = min(con.execute(f"SELECT min(start) FROM {t}").fetchone()[0] or 0 for t in present)
    hi = max(con.execute(f"SELECT max(end) FROM {t}").fetchone()[0] or 0 for t in present)
    if "NVTX_EVENTS" in tables:
        hi = max(hi, con.execute("SELECT max(end) FROM NVTX_EVENTS").fetchone()[0] or 0)
    period = (hi - lo) + 1_000_000
    corr = max(con.execute(f"SELECT max(correlationId) FROM {t}").fetchone()[0] or 0 for t in present) + 1

    con.execute("BEGIN")
    push_pop = 59
    if "ENUM_NSYS_EVENT_TYPE" in tables:
        row = con.execute("SELECT id FROM ENUM_NSYS_EVENT_TYPE WHERE name='NvtxPushPopRange'").fetchone()
        push_pop = row[0] if row else 59
    con.execute("CREATE TEMP TABLE steps0 (start INTEGER, end INTEGER, globalTid INTEGER, n INTEGER)")
    real_steps = 0
    if "NVTX_EVENTS" in tables:
        # The source's own step ranges (tracekit capture names them `decode_step N`), renumbered per copy.
        con.execute("INSERT INTO steps0 SELECT start, end, globalTid, CAST(substr(text, 13) AS INTEGER) "
                    "FROM NVTX_EVENTS WHERE text GLOB 'decode_step [0-9]*' AND end IS NOT NULL")
        real_steps = con.execute("SELECT count(*) FROM steps0").fetchone()[0]
    threads = []
    if real_steps:
        con.execute("DELETE FROM NVTX_EVENTS WHERE text GLOB 'decode_step [0-9]*' AND end IS NOT NULL")
    else:
        # No step ranges in the source: fixed windows over each launching thread's launches.
        step_ns = int(step_ms * 1e6)
        threads = con.execute(
            "SELECT r.globalTid, min(r.start), max(r.end) FROM CUPTI_ACTIVITY_KIND_RUNTIME r "
            "JOIN CUPTI_ACTIVITY_KIND_KERNEL k ON k.correlationId = r.correlationId "
            "AND (k.globalPid IS NULL OR (k.globalPid >> 24) = (r.globalTid >> 24)) "
            "GROUP BY r.globalTid HAVING count(*) >= 100").fetchall()
        for tid, first, last in threads:
            n, s = 0, first - 1000
            while s <= last:
                con.execute("INSERT INTO steps0 VALUES (?, ?, ?, ?)", (s, s + step_ns - 1000, tid, n))
                s += step_ns
                n += 1
        # Keep only windows that launch GPU work (an empty window is an excluded step, not a step).
        con.execute(
            "DELETE FROM steps0 WHERE NOT EXISTS (SELECT 1 FROM CUPTI_ACTIVITY_KIND_RUNTIME r "
            "JOIN CUPTI_ACTIVITY_KIND_KERNEL kk ON kk.correlationId = r.correlationId "
            "WHERE r.globalTid = steps0.globalTid AND r.start >= steps0.start AND r.start < steps0.end)")
    per_copy = (con.execute("SELECT max(n) FROM steps0").fetchone()[0] or 0) + 1

    # Copy numbers 1..copies-1 (copy 0 is the source itself).
    con.execute("CREATE TEMP TABLE k (k INTEGER PRIMARY KEY)")
    con.executemany("INSERT INTO k VALUES (?)", [(i,) for i in range(1, copies)])
    rows = {}
    for t in present:
        cols = _cols(con, t)
        con.execute(f"CREATE TEMP TABLE base AS SELECT * FROM {t}")
        sel = []
        for c in cols:
            if c in ("start", "end"):
                sel.append(f'"{c}" + k.k * {period}')
            elif c == "correlationId":
                sel.append(f"correlationId + k.k * {corr}")
            else:
                sel.append(f'"{c}"')
        con.execute(f'INSERT INTO {t} ({", ".join(chr(34) + c + chr(34) for c in cols)}) '
                    f"SELECT {', '.join(sel)} FROM k CROSS JOIN base")
        con.execute("DROP TABLE base")
        rows[t] = con.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
    if "NVTX_EVENTS" in tables and markers:
        con.execute(
            "INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid, endGlobalTid) "
            f"SELECT s.start + k.k * {period}, s.end + k.k * {period}, {push_pop}, "
            f"'decode_step ' || (s.n + k.k * {per_copy}), s.globalTid, s.globalTid "
            "FROM (SELECT 0 AS k UNION ALL SELECT k FROM k) AS k CROSS JOIN steps0 AS s")
        rows["NVTX_EVENTS"] = con.execute("SELECT count(*) FROM NVTX_EVENTS").fetchone()[0]
    steps = ((f"{'its own' if real_steps else f'synthetic {step_ms} ms'} decode_step ranges renumbered per copy")
             if markers else "no step ranges (steps are inferred)")
    label = (f"replicated from {source.name} x{copies} along the timeline (period {period} ns, correlation "
             f"offset {corr}); {steps}; tracekit benchmarks/make_nsys.py; not a real capture")
    for t in ("META_DATA_EXPORT", "EXPORT_META_DATA"):
        if t in tables:
            con.execute(f"INSERT INTO {t} (name, value) VALUES ('SYNTHETIC', ?)", (label,))
            break
    con.execute("COMMIT")
    con.close()
    return {"out": str(out), "source": str(source), "copies": copies, "kernels": rows.get(KERNEL_TABLES[0]),
            "rows": rows, "bytes": out.stat().st_size, "seconds": round(time.perf_counter() - t0, 1)}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--source", type=Path, default=None, help="a real nsys SQLite export (default: the repo's)")
    p.add_argument("--kernels", default="1M", help="kernel rows to reach, e.g. 1M, 10M")
    p.add_argument("--step-ms", type=float, default=3.0, help="length of the synthetic step ranges")
    p.add_argument("--no-markers", action="store_true",
                   help="drop every decode_step range: the steps of the copy are inferred (the no-marker path)")
    p.add_argument("-o", "--out", type=Path, required=True)
    a = p.parse_args(argv)
    json.dump(make(a.source or default_source(), a.out, parse_count(a.kernels), a.step_ms, not a.no_markers),
              sys.stdout)
    print()


if __name__ == "__main__":
    main()
