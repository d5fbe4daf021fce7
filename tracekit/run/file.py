"""One trace file in, one result out: what every analysis command runs per file (and each worker per rank).

:func:`breakdown_file` is ``tracekit.breakdown_file`` (the facade re-exports it): read the file, then
``tracekit.results.breakdown.breakdown`` with the options' keyword arguments. It is module-level, so process pools
and Dask workers call it by reference; importing this module imports neither polars nor the readers.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from tracekit.options import AnalysisOptions

if TYPE_CHECKING:  # pragma: no cover
    from tracekit.results.breakdown import Breakdown


def breakdown_file(path: str | Path, options: AnalysisOptions | None = None, *, own_process: bool = False
                   ) -> Breakdown:
    """:func:`tracekit.breakdown` of the trace file ``path`` with :class:`~tracekit.options.AnalysisOptions`
    (what ``tracekit breakdown`` runs per file, also in its worker processes: picklable by name).

    ``own_process``: the caller's process is the command line's own, about to exit: after the read, every object
    the interpreter holds (the imported modules, ~50k) is frozen out of the cyclic garbage collector
    (``gc.freeze``), whose full collections during the analysis walked them all for nothing (~0.02-0.03 s). Never
    for a library caller: frozen objects are not collected again.

    >>> breakdown_file("tests/data/nsys/pipit_saxpy_2022.2.sqlite", AnalysisOptions(step_range="^saxpy$")).steps.count
    4
    """
    from tracekit.readers.nsys_scan import head_start

    # A big nsys export's two big scans start first, and the ~0.3 s of imports below (polars, the analysis) run
    # while they read (tracekit.readers.nsys_scan).
    with head_start(path, kernel_dims=False) as scanning:
        from tracekit.readers import load
        from tracekit.results.breakdown import breakdown

        if scanning:
            _warm()
        trace = load(path, kernel_dims=False)
    if own_process:
        import gc

        gc.freeze()
    # (the trace is this function's alone: the analysis may give back its kernel columns as it copies them)
    return breakdown(trace, **(options or AnalysisOptions()).analysis_kwargs(), consume=True)


def _warm() -> None:
    """Load what every breakdown loads before it looks at the trace, none of it from the trace: the shipped kernel
    rules (~0.02 s: the TOML and its patterns), the GPU table and the model modules the roofline imports. Called
    while a head start's scans read (the main thread would only wait for them), so that the analysis after the read
    finds them loaded (~0.03 s off the end of a 1M-kernel command on a quiet machine)."""
    import tracekit.model.discover  # noqa: F401  (tracekit.model imports each name when first asked for)
    import tracekit.model.step  # noqa: F401
    from tracekit.classify import load_rules
    from tracekit.gpus import lookup

    load_rules()
    lookup("NVIDIA")  # (the table is parsed once per process; any name loads it)


__all__ = ["breakdown_file"]
