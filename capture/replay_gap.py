"""Graph-replay gap per kernel from a node-traced nsys SQLite export; optionally stored in a
device profile JSON as ``graph_replay_gap_us`` (what ``tracekit breakdown --device-profile`` reads).

    python capture/replay_gap.py sample_traces/synthetic-graph/trace.sqlite.gz [--update device_profile.json]

The gap is the mean time from one graph-replayed kernel's end to the next one's start, over
consecutive pairs that are both graph nodes and less than 50 µs apart (so the host gaps between
steps are left out). It is measured under nsys ``--cuda-graph-trace=node``, whose per-node
tracing may add to it. A ``.sqlite.gz`` is decompressed into a temporary file first. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
import sys


def replay_gaps_ns(sqlite_path: str, max_gap_ns: int = 50_000) -> list[int]:
    if str(sqlite_path).endswith(".gz"):
        import gzip
        import os
        import shutil
        import tempfile

        fd, tmp = tempfile.mkstemp(suffix=".sqlite")
        try:
            with os.fdopen(fd, "wb") as dst, gzip.open(sqlite_path, "rb") as src:
                shutil.copyfileobj(src, dst)
            return replay_gaps_ns(tmp, max_gap_ns)
        finally:
            os.unlink(tmp)
    db = sqlite3.connect(f"file:{sqlite_path}?mode=ro", uri=True)
    try:
        rows = db.execute(
            "SELECT start, end, graphNodeId FROM CUPTI_ACTIVITY_KIND_KERNEL ORDER BY deviceId, start").fetchall()
    except sqlite3.OperationalError:  # no kernel table (e.g. --cuda-graph-trace=graph): no per-node rows
        rows = []
    finally:
        db.close()
    gaps = []
    for (s0, e0, n0), (s1, _e1, n1) in zip(rows, rows[1:]):
        if n0 is not None and n1 is not None and 0 <= s1 - e0 < max_gap_ns:
            gaps.append(s1 - e0)
    return gaps


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("sqlite")
    p.add_argument("--update", help="device profile JSON to add graph_replay_gap_us to")
    a = p.parse_args(argv)
    gaps = replay_gaps_ns(a.sqlite)
    if not gaps:
        print(f"{a.sqlite}: no consecutive graph-replayed kernels (captured with --cuda-graph-trace=node?)",
              file=sys.stderr)
        return 2
    res = {"graph_replay_gap_us": statistics.fmean(gaps) / 1e3,
           "graph_replay_gap": {"mean_us": statistics.fmean(gaps) / 1e3, "median_us": statistics.median(gaps) / 1e3,
                                "pairs": len(gaps), "source": a.sqlite,
                                "method": "mean end-to-start gap of consecutive graph-replayed kernels < 50 us "
                                          "apart, nsys --cuda-graph-trace=node"}}
    print(json.dumps(res, indent=2))
    if a.update:
        with open(a.update) as f:
            prof = json.load(f)
        prof.update(res)
        with open(a.update, "w") as f:
            json.dump(prof, f, indent=2, sort_keys=True)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
