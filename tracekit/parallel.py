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


def map_files(fn, files: list[Path], opts: dict, workers: int | None = None):
    """``[fn(f, opts) for f in files]`` in worker processes; the first user error is raised."""
    workers = workers or min(len(files), os.cpu_count() or 1)
    jobs = [(fn, f, opts) for f in files]
    if workers <= 1 or len(files) == 1:
        results = [_call(j) for j in jobs]
    else:
        threads = max(1, (os.cpu_count() or 1) // workers)
        # spawn, not fork: forking a process whose polars thread pool is running can deadlock
        with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"),
                                 initializer=_init_worker, initargs=(threads,)) as ex:
            results = list(ex.map(_call, jobs))
    out = []
    for (res, err) in results:
        if err is not None:
            raise TracekitError(err)
        out.append(res)
    return out
