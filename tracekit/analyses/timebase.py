"""The time base: which step time every saving, fraction and tok/s figure is stated against.

A profiler slows the host (every launch and op is recorded), so a traced eager step can be several times the
real one while the GPU work itself barely changes. ``reference_step_ms`` is the step measured WITHOUT a
profiler when it is known (``--measured-step-ms`` / ``--measured-tok-s``, else the manifest's
``unprofiled_step_ms``), else the traced step. With no unprofiled time and a host-bound step (``launch_gaps`` +
``idle`` >= 20% of the traced step), every saving is an upper bound on a profiled step, and the headline says so.

>>> tb = time_base(78.5, measured_step_ms=None, measured_tok_s=None, tokens_per_step=1.0, manifest_ms=36.67)
>>> tb.reference_step_ms, tb.unprofiled_source, round(tb.profiler_inflation, 2)
(36.67, 'manifest', 2.14)
>>> time_base(10.0, measured_step_ms=None, measured_tok_s=100.0, tokens_per_step=2.0).reference_step_ms
20.0
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


def time_base(traced_step_ms: float, *, measured_step_ms: float | None, measured_tok_s: float | None,
              tokens_per_step: float | None, manifest_ms: float | None = None) -> TimeBase:
    """The time base of a breakdown whose analysed steps average ``traced_step_ms``.

    ``measured_tok_s`` (whole-batch throughput) converts as step ms = 1000 × ``tokens_per_step`` ÷ tok/s, where
    ``tokens_per_step`` = accept length × batch. The flags arrive checked (positive, not both:
    ``tracekit.options``, where every option is declared and validated once)."""
    unprof, source = None, None
    if measured_step_ms is not None:
        unprof, source = float(measured_step_ms), "flag"
    elif measured_tok_s is not None:
        unprof, source = 1000.0 * float(tokens_per_step or 1.0) / float(measured_tok_s), "flag"
    elif manifest_ms is not None and manifest_ms > 0:
        unprof, source = float(manifest_ms), "manifest"
    ref = unprof if unprof is not None else float(traced_step_ms)
    inflation = traced_step_ms / unprof if unprof else None
    return TimeBase(traced_step_ms=float(traced_step_ms), unprofiled_step_ms=unprof, unprofiled_source=source,
                    reference_step_ms=ref, profiler_inflation=inflation)


def host_bound(per_step_ms, traced_step_ms: float) -> bool:
    """launch_gaps + idle (``per_step_ms``: the block, or a mapping with those keys) >= 20% of the traced step.

    >>> host_bound({"launch_gaps": 1.0, "idle": 1.5}, 10.0), host_bound({"launch_gaps": 0.5, "idle": 0.5}, 10.0)
    (True, False)
    """
    idle = sum(per_step_ms[k] or 0.0 for k in GAP_CATEGORIES)
    return traced_step_ms > 0 and idle >= HOST_BOUND * traced_step_ms


__all__ = ["TimeBase", "time_base", "host_bound", "HOST_BOUND"]
