"""Per-file work in parallel: one process per trace file (rank), as many as there are cores."""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from tracekit.errors import TracekitError


def _call(args):
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


def map_files(fn, files: list[Path], opts: dict, workers: int | None = None, on_done=None):
    """``[fn(f, opts) for f in files]`` in worker processes; the first user error is raised.

    ``on_done()`` is called as each file finishes (in the order they finish), e.g. to advance a progress bar.
    Several engines (this process pool, a Dask cluster) behind one call: :func:`tracekit.engines.map_files`.
    """
    workers = workers or min(len(files), os.cpu_count() or 1)
    jobs = [(fn, f, opts) for f in files]
    if workers <= 1 or len(files) == 1:
        results = []
        for j in jobs:
            results.append(_call(j))
            if on_done is not None:
                on_done()
    else:
        from concurrent.futures import as_completed

        threads = max(1, (os.cpu_count() or 1) // workers)
        # spawn, not fork: forking a process whose polars thread pool is running can deadlock
        with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"),
                                 initializer=_init_worker, initargs=(threads,)) as ex:
            futures = [ex.submit(_call, j) for j in jobs]
            for _ in as_completed(futures):
                if on_done is not None:
                    on_done()
            results = [f.result() for f in futures]
    out = []
    for (res, err) in results:
        if err is not None:
            raise TracekitError(err)
        out.append(res)
    return out


def in_threads(*tasks, threads: bool = True):
    """``[t() for t in tasks]``, run at once on threads (one per task, up to the number of CPUs) and returned in
    order; an exception is raised as if they had run one after the other (the first task's first).

    For independent stages of one analysis: polars and the SQLite engines release the GIL while they work,
    so on two cores two such stages take about the time of the longer one. ``threads=False`` runs them one
    after the other (small inputs: threads would only add their stacks and allocator arenas).
    """
    from concurrent.futures import ThreadPoolExecutor

    workers = min(len(tasks), os.cpu_count() or 1) if threads else 1
    if workers < 2:
        return [t() for t in tasks]

    def run(task):
        try:
            return task(), None
        except BaseException as e:  # noqa: BLE001 - raised again below, in the caller's thread
            return None, e

    with ThreadPoolExecutor(workers) as pool:
        results = list(pool.map(run, tasks))
    for _, err in results:
        if err is not None:
            raise err
    return [r for r, _ in results]
