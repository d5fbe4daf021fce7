"""Where the per-file stage of several trace files runs: a local process pool, or a Dask cluster.

``breakdown DIR`` analyses each file (rank) on its own and only then compares the ranks. The per-file stage
(:func:`tracekit.analyses.ranks.analyse_rank`) is the same on every engine; what travels back is its small
result (a :class:`~tracekit.analyses.ranks.RankResult`: the rank's breakdown dict and one row per
communication kernel), never a trace or a per-kernel frame. The cross-rank table is built where the command
runs.

* ``process`` (default): one process per file, as many as there are cores (:mod:`tracekit.parallel`).
* ``dask``: a Dask cluster (``pip install 'tracekit[dask]'``). Without an address, a ``LocalCluster`` of one
  single-threaded worker process per core; with one (``dask=tcp://head:8786``), that scheduler, whose workers
  must see the files at the same paths (a shared filesystem) and have tracekit installed. Start one with
  ``dask scheduler`` and ``dask worker tcp://head:8786`` per node, or from a batch system with dask-jobqueue
  (Slurm, PBS, ...) or on Kubernetes with dask-kubernetes (docs/performance.md).

    from tracekit.analyses.ranks import analyse_rank, cross_rank
    from tracekit.engines import map_files

    results = map_files(analyse_rank, files, {}, engine="dask")     # a local cluster
    print(cross_rank(results).verdict)
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from tracekit.errors import TracekitError

ENGINES = ("process", "dask")
CONNECT_TIMEOUT = "10s"  # how long to try reaching a given Dask scheduler


def parse_engine(spec: str | None) -> tuple[str, str | None]:
    """``'process'``, ``'dask'`` or ``'dask=ADDRESS'`` -> (engine, address)."""
    spec = (spec or "process").strip()
    name, _, address = spec.partition("=")
    name = name.strip().lower()
    if name not in ENGINES:
        raise TracekitError(f"--engine {spec!r}: unknown engine; use process, dask or dask=SCHEDULER_ADDRESS")
    if name == "process" and address:
        raise TracekitError("--engine process takes no address; use --engine dask=SCHEDULER_ADDRESS for a cluster")
    return name, (address.strip() or None)


def map_files(fn, files, opts: dict, *, engine: str = "process", address: str | None = None,
              workers: int | None = None, fmt: str | None = None, what: str = "analysing"):
    """``[fn(f, opts) for f in files]`` on ``engine``, in the order of ``files``; the first user error is raised
    (a ``TracekitError`` on any worker). A progress bar shows on a terminal (not for ``fmt='json'``)."""
    from tracekit.progress import status

    files = [Path(f) for f in files]
    name, addr = parse_engine(engine if address is None else f"{engine}={address}")
    where = "a local process pool" if name == "process" else (f"Dask at {addr}" if addr else "a local Dask cluster")
    with status(f"{what} {len(files)} files on {where}", fmt=fmt, total=len(files)) as st:
        if name == "process":
            from tracekit.parallel import map_files as pool_map

            return pool_map(fn, files, opts, workers=workers, on_done=st.advance)
        return _dask_map(fn, files, opts, addr, workers, st.advance)


def _dask_map(fn, files: list[Path], opts: dict, address: str | None, workers: int | None, on_done):
    try:
        from distributed import Client, LocalCluster, as_completed
    except ImportError:
        raise TracekitError("--engine dask needs dask and distributed: pip install 'tracekit[dask]'") from None
    from tracekit.parallel import _call

    cluster = None
    if address is None:
        n = workers or min(len(files), os.cpu_count() or 1)
        threads = max(1, (os.cpu_count() or 1) // n)
        # one single-threaded worker process per core, each with its share of polars' thread pool (set before
        # polars is imported there), no dashboard, quiet logs
        cluster = LocalCluster(n_workers=n, threads_per_worker=1, processes=True, dashboard_address=None,
                               silence_logs=logging.ERROR,
                               env={"POLARS_MAX_THREADS": str(threads), "TRACEKIT_PROGRESS": "0"})
    try:
        try:
            client = Client(cluster if cluster is not None else address, timeout=CONNECT_TIMEOUT)
        except (OSError, TimeoutError) as e:
            raise TracekitError(f"--engine dask={address}: cannot reach the Dask scheduler ({' '.join(str(e).split())}"
                                "); start one with `dask scheduler`, or leave the address out for a local cluster")
        with client:
            jobs = [(fn, str(f), opts) for f in files]
            futures = client.map(_call, jobs, pure=False)
            index = {f.key: i for i, f in enumerate(futures)}
            results: list = [None] * len(files)
            for fut, res in as_completed(futures, with_results=True):
                results[index[fut.key]] = res
                on_done()
    finally:
        if cluster is not None:
            cluster.close()
    out = []
    for res, err in results:
        if err is not None:
            raise TracekitError(err)
        out.append(res)
    return out


__all__ = ["ENGINES", "map_files", "parse_engine"]
