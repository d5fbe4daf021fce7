"""Prototype: thousands of rank files, the per-file stage on Dask (not a home-made scheduler).

The per-file stage is exactly what `tracekit breakdown DIR` runs in its process pool
(`tracekit.breakdown_file(path, options)` -> a `Breakdown`); only the small per-rank dicts
travel back, and the cross-rank table is built locally by `tracekit.analyses.ranks`. Point
`--scheduler` at a cluster (`dask scheduler` + `dask worker` on each node, or
dask-jobqueue/dask-kubernetes) and the same script fans out over it; traces are read where
the workers can see them (shared filesystem or object store), never shipped whole.

    pip install "dask[distributed]"            # not a tracekit dependency
    python benchmarks/dask_ranks.py /tmp/tracekit-bench/ranks_4x1M            # local cluster
    python benchmarks/dask_ranks.py DIR --scheduler tcp://head:8786 --format json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def per_file(path: str, opts) -> dict:
    import tracekit

    b = tracekit.breakdown_file(Path(path), opts)
    # The Breakdown itself (with its per-step frame) stays on the worker: send back the contract dict.
    return b.to_dict() | {"_extras_rank": b.extras.get("rank")}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("traces", type=Path, nargs="+")
    p.add_argument("--scheduler", default=None, help="address of a Dask scheduler (default: a local cluster)")
    p.add_argument("--workers", type=int, default=None)
    p.add_argument("--format", choices=["table", "json"], default="table")
    a = p.parse_args(argv)
    from dask.distributed import Client, LocalCluster, as_completed

    from tracekit.cli.output import expand_traces
    from tracekit.options import AnalysisOptions

    files = [str(f) for f in expand_traces(a.traces)]
    opts = AnalysisOptions()
    t0 = time.perf_counter()
    cluster = None if a.scheduler else LocalCluster(n_workers=a.workers, threads_per_worker=1, processes=True)
    with Client(a.scheduler or cluster) as client:
        futures = client.map(per_file, files, opts=opts, pure=False)
        results = {}
        for _fut, res in as_completed(futures, with_results=True):
            results[res["source"]["path"]] = res
    if cluster is not None:
        cluster.close()
    ranks = [results[f] for f in files]
    table = [[r["_extras_rank"] if r["_extras_rank"] is not None else i, r["source"]["path"], r["steps"]["count"],
              r["steps"]["mean_ms"], r["per_step_ms"]["communication"]] for i, r in enumerate(ranks)]
    out = {"files": len(files), "seconds": round(time.perf_counter() - t0, 2), "table": table}
    if a.format == "json":
        json.dump(out, sys.stdout)
        print()
    else:
        print(f"{len(files)} rank files in {out['seconds']} s")
        for row in table:
            print("  rank {} {} steps={} mean_ms={:.3f} comm_ms={}".format(*row))


if __name__ == "__main__":
    main()
