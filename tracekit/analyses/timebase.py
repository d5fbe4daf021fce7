"""The time base: which step time every saving, fraction and tok/s figure is stated against.

A profiler slows the host (every launch and op is recorded), so a traced eager step can be several times the
real one while the GPU work itself barely changes. ``reference_step_ms`` is the step measured WITHOUT a
profiler when it is known (``--measured-step-ms`` / ``--measured-tok-s``, else the manifest's
``unprofiled_step_ms``), else the traced step. With no unprofiled time and a host-bound step (``launch_gaps`` +
``idle`` >= 20% of the traced step), every saving is an upper bound on a profiled step, and the headline says so.
Which time is the reference (the precedence) is :func:`tracekit.analyses.resolve.time_base`'s; this module holds
the block it fills and what is read from it.
"""

from __future__ import annotations

from dataclasses import dataclass

from tracekit.categories import GAP_CATEGORIES
from tracekit.contract import Block, extension

HOST_BOUND = 0.2  # launch_gaps + idle >= this share of the traced step: host-bound


@dataclass(frozen=True)
class TimeBase(Block):
    """The contract's ``time_base`` object (a :class:`tracekit.contract.Block`: ``to_dict()`` is its JSON)."""

    traced_step_ms: float
    unprofiled_step_ms: float | None
    unprofiled_source: str | None  # "flag" | "manifest" | None
    reference_step_ms: float
    profiler_inflation: float | None  # traced / unprofiled
    # an extension: an unprofiled step that was given but refused (longer than the traced step: impossible)
    rejected_unprofiled_step_ms: float | None = extension(omit=lambda t: t.rejected_unprofiled_step_ms is None)


def host_bound(per_step_ms, traced_step_ms: float) -> bool:
    """launch_gaps + idle (``per_step_ms``: the block, or a mapping with those keys) >= 20% of the traced step.

    >>> host_bound({"launch_gaps": 1.0, "idle": 1.5}, 10.0), host_bound({"launch_gaps": 0.5, "idle": 0.5}, 10.0)
    (True, False)
    """
    idle = sum(per_step_ms[k] or 0.0 for k in GAP_CATEGORIES)
    return traced_step_ms > 0 and idle >= HOST_BOUND * traced_step_ms


__all__ = ["TimeBase", "host_bound", "HOST_BOUND"]
