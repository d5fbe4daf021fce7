"""tracekit: where every microsecond of an LLM decode step goes.

Public API::

    import tracekit
    trace = tracekit.load("run.sqlite")          # nsys SQLite export or Kineto JSON
    result = tracekit.breakdown(trace)           # per-step split, roofline, advice
    tracekit.diff(result, tracekit.breakdown(tracekit.load("new.sqlite")))   # side by side
"""

from __future__ import annotations

__version__ = "0.1.0"

from tracekit.errors import TracekitError  # noqa: E402


def load(path, **kwargs):
    """Read a trace file into a :class:`tracekit.trace.Trace`."""
    from tracekit.readers import load as _load

    return _load(path, **kwargs)


def breakdown(trace, **kwargs):
    """Per-decode-step breakdown of a trace (see ``tracekit.analyses.breakdown``)."""
    from tracekit.analyses.breakdown import breakdown as _breakdown

    return _breakdown(trace, **kwargs)


def diff(base, new):
    """Two breakdowns side by side (schema ``tracekit.diff/1``; see ``tracekit.analyses.diff``)."""
    from tracekit.analyses.diff import diff as _diff

    return _diff(base, new)


__all__ = ["load", "breakdown", "diff", "TracekitError", "__version__"]
