"""Where the per-file stage of several trace files runs: a local process pool, or a Dask cluster.

``breakdown DIR`` analyses each file (rank) on its own and only then compares the ranks. The per-file stage
(:func:`tracekit.run.ranks.analyse_rank`) is the same on every engine; what travels back is its small
result (a :class:`~tracekit.run.ranks.RankResult`: the rank's typed breakdown without its per-activity frame,
and one row per communication kernel), never a trace or a per-kernel frame. The cross-rank table is built where the command
runs.

* ``process`` (default): a pool of spawned processes, one per file at a time, as many as there are cores.
* ``dask``: a Dask cluster (``pip install 'tracekit[dask]'``). Without an address, a ``LocalCluster`` of one
  single-threaded worker process per core; with one (``dask=tcp://head:8786``), that scheduler, whose workers
  must see the files at the same paths (a shared filesystem) and have tracekit installed. Start one with
  ``dask scheduler`` and ``dask worker tcp://head:8786`` per node, or from a batch system with dask-jobqueue
  (Slurm, PBS, ...) or on Kubernetes with dask-kubernetes (docs/performance.md).

    from tracekit.run.ranks import analyse_rank, cross_rank
    from tracekit.run.engines import map_files

    results = map_files(analyse_rank, files, {}, engine="dask")     # a local cluster
    print(cross_rank(results).verdict)
"""

from __future__ import annotations

import logging
import multiprocessing
import os
from pathlib import Path

from tracekit.errors import BadOptionValue, ServerUnreachable, ToolMissing, TracekitError
from tracekit.options import ENGINES, parse_engine  # (--engine is checked where every option is)
from tracekit.parallel import usable_cpus

CONNECT_TIMEOUT = "10s"  # how long to try reaching a given Dask scheduler


def map_files(fn, files, opts: dict, *, engine: str | None = "process", address: str | None = None,
              workers: int | None = None, fmt: str | None = None, what: str = "analysing"):
    """``[fn(f, opts) for f in files]`` on ``engine``, in the order of ``files``; the first user error is raised
    (a ``TracekitError`` on any worker). A progress bar shows on a terminal (not for ``fmt='json'``).

    ``fn`` must be importable by name (a module-level function): it runs in other processes.
    """
    from tracekit.progress import status

    files = [Path(f) for f in files]
    name, addr = parse_engine(engine if address is None else f"{engine or 'dask'}={address}")
    where = "a local process pool" if name == "process" else (f"Dask at {addr}" if addr else "a local Dask cluster")
    with status(f"{what} {len(files)} files on {where}", fmt=fmt, total=len(files)) as st:
        if name == "process":
            results = _pool_map(fn, files, opts, workers, st.advance)
        else:
            results = _dask_map(fn, files, opts, addr, workers, st.advance)
    out = []
    for res, err in results:
        if err is not None:
            raise TracekitError(err)
        out.append(res)
    return out


def _call(args):
    """One file's task: ``(result, None)``, or ``(None, message)`` for a user error (sent back as text)."""
    fn, path, opts = args
    try:
        return fn(path, opts), None
    except TracekitError as e:
        return None, f"{e}"


def _init_worker(threads: int) -> None:
    # Set before polars is first imported in this fresh (spawned) process: one worker per core, each with
    # its share of polars' thread pool, instead of every worker starting a pool the size of the machine.
    os.environ.setdefault("POLARS_MAX_THREADS", str(threads))
    os.environ["TRACEKIT_PROGRESS"] = "0"


def _pool_map(fn, files: list[Path], opts: dict, workers: int | None, on_done) -> list:
    """The process engine: spawned worker processes (one file here when there is one file or one core)."""
    workers = workers or min(len(files), usable_cpus())
    jobs = [(fn, str(f), opts) for f in files]
    if workers <= 1 or len(files) == 1:
        results = []
        for j in jobs:
            results.append(_call(j))
            on_done()
        return results
    from concurrent.futures import ProcessPoolExecutor, as_completed

    threads = max(1, usable_cpus() // workers)
    # spawn, not fork: forking a process whose polars thread pool is running can deadlock
    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"),
                             initializer=_init_worker, initargs=(threads,)) as ex:
        futures = [ex.submit(_call, j) for j in jobs]
        for _ in as_completed(futures):
            on_done()
        return [f.result() for f in futures]


def _dask_map(fn, files: list[Path], opts: dict, address: str | None, workers: int | None, on_done):
    try:
        from distributed import Client, LocalCluster, as_completed
    except ImportError:
        raise ToolMissing("--engine dask needs dask and distributed: pip install 'tracekit[dask]'") from None
    cluster = None
    if address is None:
        n = workers or min(len(files), usable_cpus())
        threads = max(1, usable_cpus() // n)
        # one single-threaded worker process per core, each with its share of polars' thread pool (set before
        # polars is imported there), no dashboard, quiet logs
        cluster = LocalCluster(n_workers=n, threads_per_worker=1, processes=True, dashboard_address=None,
                               silence_logs=logging.ERROR,
                               env={"POLARS_MAX_THREADS": str(threads), "TRACEKIT_PROGRESS": "0"})
    try:
        try:
            client = Client(cluster if cluster is not None else address, timeout=CONNECT_TIMEOUT)
        except ValueError as e:  # not an address: no scheme or port
            raise BadOptionValue(f"--engine dask={address}: not a Dask scheduler address ({' '.join(str(e).split())}); "
                                "give it as tcp://HOST:PORT, or leave it out for a local cluster") from None
        except (OSError, TimeoutError) as e:
            raise ServerUnreachable(f"--engine dask={address}: cannot reach the Dask scheduler ({' '.join(str(e).split())}"
                                "); start one with `dask scheduler`, or leave the address out for a local cluster") from None
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
    return results


__all__ = ["ENGINES", "map_files", "parse_engine"]
