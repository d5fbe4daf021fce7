"""Per-file work in parallel: one process per trace file (rank), as many as there are cores."""

from __future__ import annotations

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


def map_files(fn, files: list[Path], opts: dict, workers: int | None = None):
    """``[fn(f, opts) for f in files]`` in worker processes; the first user error is raised."""
    workers = workers or min(len(files), os.cpu_count() or 1)
    jobs = [(fn, f, opts) for f in files]
    if workers <= 1 or len(files) == 1:
        results = [_call(j) for j in jobs]
    else:
        with ProcessPoolExecutor(max_workers=workers) as ex:
            results = list(ex.map(_call, jobs))
    out = []
    for (res, err) in results:
        if err is not None:
            raise TracekitError(err)
        out.append(res)
    return out
