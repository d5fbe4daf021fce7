"""The typed blocks of a per-decode-step breakdown (../shared/spec/CONTRACT.md, ``tracekit.breakdown/3``).

Every block of the contract JSON is a frozen dataclass (:class:`tracekit.contract.Block`): :class:`Source`,
:class:`Gpu`, :class:`Steps`, ``TimeBase``, :class:`PerStepMs`, :class:`Gaps` (its ``largest`` entries
:class:`LargestGap`), :class:`KernelMsPerStep`, :class:`TraceRoofline`, ``Advice`` (of ``Lever``) and
:class:`CaptureSummary`, held by :class:`Breakdown`; ``Breakdown.to_dict()`` is ``tracekit.contract.to_dict``: the
JSON is written in one place, from these types. The pipeline that fills them is ``tracekit.run.pipeline``; the
stages it runs are ``tracekit.analyses``. Code reads the blocks' attributes (``b.steps.count``); the blocks are
also read-only mappings by JSON key (``b.steps["count"]``: what the docs and scripts use), and a misspelt key
raises ``KeyError``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, make_dataclass

import polars as pl

from tracekit.analyses.advice import StepFacts
from tracekit.analyses.resolve import TP_EVIDENCE_SOURCES
from tracekit.analyses.roofline import RooflineBlock
from tracekit.analyses.timebase import TimeBase
from tracekit.analyses.verdicts import Advice
from tracekit.categories import BREAKDOWN_SCHEMA, GAP_CAUSES, KERNEL_CATEGORIES, STEP_CATEGORIES
from tracekit.contract import Block, extension, internal
from tracekit.results.common import Gpu, Source

SCHEMA = BREAKDOWN_SCHEMA  # "tracekit.breakdown/3" (tracekit.contract names it once)


# ───────────────────────── the contract's blocks ─────────────────────────

@dataclass(frozen=True)
class Steps(Block):
    """``steps``: how the steps were found, their traced period's statistics, their phase and what was excluded
    (``excluded_reasons``: keys of ``tracekit.categories.EXCLUSION_REASONS``)."""

    count: int
    excluded: int
    marker: str
    pattern: str | None
    mean_ms: float
    median_ms: float
    p10_ms: float
    p90_ms: float
    phase: str
    phases: dict[str, int]
    excluded_reasons: dict[str, int]


def _per_category(name: str, keys: tuple[str, ...], doc: str, bases: tuple = (Block,), more=()) -> type:
    """A frozen block with one ``float | None`` field per name of ``keys`` (the categories, named once in
    ``tracekit.categories``), plus ``more`` fields."""
    cls = make_dataclass(name, [(k, float | None) for k in keys] + list(more), bases=bases, frozen=True)
    cls.__module__, cls.__doc__ = __name__, doc  # (pickled by name: each is a global of this module)
    return cls


PerStepMs = _per_category(
    "PerStepMs", STEP_CATEGORIES,
    "``per_step_ms``: the exact partition of the traced step, one field per ``tracekit.categories.STEP_CATEGORIES`` "
    "(ms per step; compute categories null for whole-graph captures).")
KernelMsPerStep = _per_category(
    "KernelMsPerStep", KERNEL_CATEGORIES,
    "``kernel_ms_per_step``: plain kernel time per ``tracekit.categories.KERNEL_CATEGORIES`` (ms per step).")
GapCauses = _per_category(
    "GapCauses", GAP_CAUSES,
    "The gaps by cause, one field per ``tracekit.categories.GAP_CAUSES`` (ms per step): what the advice reads.")


@dataclass(frozen=True)
class HostActivity(Block):
    """``gaps.largest[].before``: what the host was doing during a gap (``kind``: api, op, sync, range, memcpy)."""

    kind: str
    name: str


@dataclass(frozen=True)
class LargestGap(Block):
    """One of ``gaps.largest``: a single gap, where in its step, its cause and what the host was doing."""

    step: int
    at_ms: float
    ms: float
    where: str
    cause: str
    before: HostActivity | None

    @classmethod
    def of(cls, gap: dict) -> LargestGap:
        """From a ``tracekit.analyses.partition`` gap row."""
        before = gap["before"]
        return cls(step=gap["step"], at_ms=gap["at_ms"], ms=gap["ms"], where=gap["where"], cause=gap["cause"],
                   before=HostActivity(**before) if before is not None else None)


Gaps = _per_category(
    "Gaps", (), "``gaps``: the gaps by cause (:class:`GapCauses`' fields, ms per step) and the ``largest`` single gaps.",
    bases=(GapCauses,), more=[("largest", tuple)])


@dataclass(frozen=True, kw_only=True)
class TraceRoofline(RooflineBlock):
    """``roofline``: the :class:`~tracekit.analyses.roofline.RooflineBlock` figures, then where ``tp`` came from
    (``tp_source``; ``tp_evidence``, the trace's evidence, written for a ``tp`` read from the trace or defaulted:
    ``tracekit.analyses.resolve.TP_EVIDENCE_SOURCES``), the recorded shapes' share of the steps' GEMM time
    (``shape_coverage``, written when shapes were weighed), why the figures were refused (``refused``: null when
    they hold, ``tracekit.analyses.roofline.physical_check``), where ``tokens_per_step`` came from
    (``tracekit.analyses.resolve``) and what a tok/s figure counts (``tokens_per_s_unit``: the batch's words, "tok/s
    for the whole batch of 32"; the accept length is in ``tokens_per_step``, not in the batch), and the accept
    length ``tokens_per_step`` holds with where it came from (``accept_len``, ``accept_len_source``: ``flag`` or
    ``manifest``; null without one — a plain step, or a speculative step whose accept length is unknown: what
    ``diff`` reads to compare steps per token)."""

    tp_source: str
    tp_evidence: str | None = extension(omit=lambda r: r.tp_source not in TP_EVIDENCE_SOURCES)
    shape_coverage: float | None = extension(omit=lambda r: r.shape_coverage is None)
    refused: str | None
    tokens_per_step_source: str | None
    tokens_per_s_unit: str | None = extension(omit=lambda r: r.tokens_per_s_unit is None)
    accept_len: float | None = extension(omit=lambda r: False)
    accept_len_source: str | None = extension(omit=lambda r: False)


@dataclass(frozen=True)
class Coverage(Block):
    """``coverage``: every kernel, memcpy and memset of the analysed device counted, over the whole trace (ms, not per
    step): ``kernel_ms_in_steps`` (in the analysed steps) + ``kernel_ms_outside_steps`` = ``kernel_ms_total``;
    ``outside_by_reason``: the outside part by why (before the first step, the excluded steps by their
    ``steps.excluded_reasons`` key, after the last step). ``claimed_by_gpu_start`` (not in the JSON): activities
    launched in no step window that belong to the step whose period their GPU start is in
    (``tracekit.analyses.partition.claim_by_gpu_start``)."""

    kernel_ms_total: float
    kernel_ms_in_steps: float
    kernel_ms_outside_steps: float
    outside_by_reason: dict[str, float]
    claimed_by_gpu_start: int = internal(default=0)

    @property
    def outside_share(self) -> float:
        """The share of the device's kernel time outside the analysed steps (0 without kernel time)."""
        return self.kernel_ms_outside_steps / self.kernel_ms_total if self.kernel_ms_total else 0.0


@dataclass(frozen=True)
class CaptureSummary(Block):
    """``manifest`` (an extension): what the capture beside the trace measured without a profiler; with
    ``unprofiled_periods_ms``, every step it timed without a profiler (the manifest's ``unprofiled.periods_ms``,
    whose median is ``unprofiled_step_ms``: the noise of the unprofiled step, what ``diff``'s gate reads), written
    when the manifest holds them."""

    workload: str | None
    mode: str | None
    unprofiled_step_ms: float | None
    tp: int | None
    unprofiled_periods_ms: tuple[float, ...] | None = extension(omit=lambda m: m.unprofiled_periods_ms is None)

    @classmethod
    def of(cls, manifest: dict) -> CaptureSummary:
        """From the manifest that applies to the trace."""
        periods = (manifest.get("unprofiled") or {}).get("periods_ms")
        ok = isinstance(periods, list) and periods and all(
            isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0 for x in periods)
        return cls(**{f.name: manifest.get(f.name) for f in fields(cls) if f.name != "unprofiled_periods_ms"},
                   unprofiled_periods_ms=tuple(float(x) for x in periods) if ok else None)


@dataclass(frozen=True)
class Breakdown(Block):
    """The result of :func:`breakdown`; ``to_dict()`` is the contract JSON (``tracekit.breakdown/3``), written by
    ``tracekit.contract.to_dict`` from the typed blocks below (in the JSON's order).

    Besides the contract's blocks (not in the JSON): ``per_step`` (one row per analysed step: the CSV output and
    the plots), ``top_kernels`` (name, category, count, total_ms, mean_us, per_step_ms), ``activities`` (the
    attributed GPU activity of the analysed steps, serialised per stream and clipped to each step's period;
    ``start0`` is the recorded start; None once shipped from a worker), ``facts`` (what the advice was computed
    from) and ``rank`` (the trace's rank, where it records one).
    """

    SCHEMA = BREAKDOWN_SCHEMA

    source: Source
    gpu: Gpu
    steps: Steps
    time_base: TimeBase
    per_step_ms: PerStepMs
    gaps: Gaps
    kernel_ms_per_step: KernelMsPerStep
    roofline: TraceRoofline
    advice: Advice
    headline: str
    warnings: tuple[str, ...]
    per_step: pl.DataFrame = internal()
    top_kernels: pl.DataFrame = internal()
    activities: pl.DataFrame | None = internal()
    facts: StepFacts = internal()
    rank: int | None = internal(default=None)
    # every kernel counted (contract, Additions to /3 (2)): in the analysed steps and outside them
    coverage: Coverage | None = extension(omit=lambda b: b.coverage is None)
    manifest: CaptureSummary | None = extension(omit=lambda b: not b.manifest)  # what the capture measured

    @property
    def ranked_levers(self) -> tuple[str, ...]:
        """The levers worth pulling, largest saving first."""
        return self.advice.ranked

    @property
    def display_levers(self) -> tuple[str, ...]:
        """Every lever in the order the reports list them (decided by the analysis: ``Advice.order``)."""
        return self.advice.order


__all__ = ["Breakdown", "Source", "Gpu", "Steps", "PerStepMs", "KernelMsPerStep", "GapCauses", "Gaps", "LargestGap",
           "HostActivity", "TraceRoofline", "CaptureSummary", "SCHEMA"]
