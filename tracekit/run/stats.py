"""``tracekit stats``: read what the tables need beyond the Trace, find the steps, summarise
(``tracekit.results.stats``).

For an nsys export the API calls and the NVTX ranges are read from the export itself, as ``nsys stats`` reads them
(:mod:`tracekit.readers.nsys.stats`: every runtime call, nvtx_sum's names and styles); for a Kineto trace they are the
Trace's runtime / driver calls and annotations. The steps are the breakdown pipeline's (``step_table``); a trace in
which none can be found gets its tables without ``coverage``, and a warning.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    import polars as pl

    from tracekit.results.stats import Stats
    from tracekit.trace import Trace


def _nsys_export(trace: Trace, warnings: list[str] | None = None) -> Path | None:
    """The export file of an nsys trace that is still there (None: a Kineto trace, or the file is gone)."""
    if trace.meta.format != "nsys-sqlite":
        return None
    path = Path(trace.meta.path)
    if path.is_file():
        return path
    if warnings is not None:
        warnings.append(f"{path} is no longer readable: the API table lists only the calls that launch work or "
                        "synchronise, and the ranges carry no style")
    return None


def host_tables(trace: Trace, warnings: list[str]) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(API calls: ``name``, ``dur``; ranges: ``name``, ``style``, ``dur``) of ``trace``."""
    import polars as pl

    path = _nsys_export(trace, warnings)
    if path is not None:
        from tracekit.readers.nsys.stats import api_calls, nvtx_ranges

        return api_calls(path), nvtx_ranges(path)
    calls = trace.launches.select(name=pl.col("name").cast(pl.String), dur=pl.col("end") - pl.col("start"))
    style = "annotation" if trace.meta.producer == "kineto" else "range"
    rng = trace.ranges.filter(pl.col("end").is_not_null()).select(
        "name", style=pl.lit(style), dur=pl.col("end") - pl.col("start"))
    return calls, rng


def host_calls(trace: Trace) -> pl.DataFrame:
    """Every host API call the trace records (``start, end, pid, tid, correlation, name``): for an nsys export every
    row of its runtime table (the Trace keeps only the calls that launch work or synchronise)."""
    import polars as pl

    path = _nsys_export(trace)
    if path is not None:
        from tracekit.readers.nsys.stats import runtime_calls

        return runtime_calls(path)
    return trace.launches.select("start", "end", "pid", "tid", "correlation", name=pl.col("name").cast(pl.String))


def stats(trace: Trace, *, device: int | None = None, rules=None, step_range: str | None = None,
          draft_range: str | None = None) -> Stats:
    """The ``tracekit stats`` result of ``trace`` (``tracekit.results.stats``). ``device``: restrict the GPU tables
    to that GPU and take its steps (default: every GPU; the busiest GPU's steps); ``step_range`` / ``draft_range``:
    as ``breakdown``'s, for the coverage."""
    from tracekit.categories import DEFAULT_DRAFT_RANGE
    from tracekit.errors import TracekitError
    from tracekit.results.stats import summarise
    from tracekit.run.pipeline import step_table

    warnings: list[str] = []
    calls, ranges = host_tables(trace, warnings)
    st = None
    if trace.has_gpu_activity:
        try:
            st = step_table(trace, step_range=step_range, device=device, rules=rules,
                            draft_range=DEFAULT_DRAFT_RANGE if draft_range is None else draft_range)
        except TracekitError as e:
            warnings.append(f"no steps found, so no kernel time in or outside steps: {e}")
    return summarise(trace, calls=calls, ranges=ranges, steps=st, device=device, rules=rules, warnings=tuple(warnings))
