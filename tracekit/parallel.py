"""Independent stages of one analysis at once, on threads (several files: :mod:`tracekit.run.engines`)."""

from __future__ import annotations

import os


def usable_cpus() -> int:
    """The CPUs this process may run on: its affinity (``taskset``, a container's cpuset), not every CPU of the
    machine as ``os.cpu_count()`` says. Polars sizes its thread pool the same way."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # (no sched_getaffinity: macOS, Windows)
        return os.cpu_count() or 1


def in_threads(*tasks, threads: bool = True, per_cpu: int = 1):
    """``[t() for t in tasks]``, run at once on threads (one per task, up to the number of usable CPUs) and returned in
    order; an exception is raised as if they had run one after the other (the first task's first).

    For independent stages of one analysis: polars and the SQLite engines release the GIL while they work,
    so on two cores two such stages take about the time of the longer one. ``threads=False`` runs them one
    after the other (small inputs: threads would only add their stacks and allocator arenas). ``per_cpu``: up to
    that many threads per CPU, for many tasks that each hold the GIL or wait on one thread between their polars
    calls (pieces of one frame: two per CPU kept both cores busier, 0.47-0.50 -> 0.38-0.41 s for the partition's
    pieces of ten million activities on two cores); one per CPU in a process whose polars has fewer threads than
    CPUs (a rank worker, whose siblings take the other cores).
    """
    from concurrent.futures import ThreadPoolExecutor

    cpus = usable_cpus()
    if per_cpu > 1 and _polars_share() < cpus:
        per_cpu = 1  # (a worker process given its share of the cores: no more threads than the one-per-CPU rule)
    workers = min(len(tasks), cpus * per_cpu if cpus > 1 else 1) if threads else 1
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


def _polars_share() -> int:
    """The threads polars may use in this process: ``POLARS_MAX_THREADS`` where set (a rank worker's share of the
    cores, ``tracekit.run.engines``), else every CPU."""
    try:
        return max(1, int(os.environ["POLARS_MAX_THREADS"]))
    except (KeyError, ValueError):
        return usable_cpus()


def started(task, threads: bool = True):
    """``task`` begun on a thread of its own (``threads`` and two CPUs or more; else run now); returns a function
    that waits for its result, raising what the task raised. For a stage that the caller's next stages do not need,
    so that the two run side by side (polars releases the GIL while it works); the thread is a daemon's, so a caller
    that fails before waiting leaves nothing behind."""
    import threading

    box: dict = {}

    def run():
        try:
            box["value"] = task()
        except BaseException as e:  # noqa: BLE001 - raised again by wait(), in the caller's thread
            box["err"] = e

    thread = None
    if threads and usable_cpus() >= 2:
        thread = threading.Thread(target=run, name="tracekit-stage", daemon=True)
        thread.start()
    else:
        run()

    def wait():
        if thread is not None:
            thread.join()
        if "err" in box:
            raise box["err"]
        return box["value"]

    return wait
