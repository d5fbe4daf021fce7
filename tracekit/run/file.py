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


def breakdown_file(path: str | Path, options: AnalysisOptions | None = None) -> Breakdown:
    """:func:`tracekit.breakdown` of the trace file ``path`` with :class:`~tracekit.options.AnalysisOptions`
    (what ``tracekit breakdown`` runs per file, also in its worker processes: picklable by name).

    >>> breakdown_file("tests/data/nsys/pipit_saxpy_2022.2.sqlite", AnalysisOptions(step_range="^saxpy$")).steps.count
    4
    """
    from tracekit.readers.nsys_scan import head_start

    # A big nsys export's two big scans start first, and the ~0.3 s of imports below (polars, the analysis) run
    # while they read (tracekit.readers.nsys_scan).
    with head_start(path, kernel_dims=False):
        from tracekit.readers import load
        from tracekit.results.breakdown import breakdown

        trace = load(path, kernel_dims=False)
    return breakdown(trace, **(options or AnalysisOptions()).analysis_kwargs())


__all__ = ["breakdown_file"]
