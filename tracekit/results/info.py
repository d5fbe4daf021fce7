"""`tracekit info`: what is in a trace (schema ``tracekit.info/1``).

:func:`info` returns an :class:`Info` (typed blocks, :class:`tracekit.contract.Block`); ``tracekit.info()`` returns
its ``to_dict()``, the dict the command prints with ``--format json``.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from tracekit.analyses.resolve import peak_bandwidth
from tracekit.contract import INFO_SCHEMA, Block, extension
from tracekit.results.common import Gpu, Source
from tracekit.steps import step_candidates
from tracekit.trace import WORK_KINDS, Trace

SCHEMA = INFO_SCHEMA  # "tracekit.info/1" (tracekit.contract names it once)


@dataclass(frozen=True, kw_only=True)
class InfoSource(Source):
    """``source``, with the trace's ``rank`` and ``world_size`` where it records a rank."""

    rank: int | None = extension(omit=lambda s: s.rank is None)
    world_size: int | None = extension(omit=lambda s: s.rank is None)


@dataclass(frozen=True)
class Counts(Block):
    """``counts``; ``graph_executions`` (an extension) where the trace has whole-graph records."""

    kernels: int
    memops: int
    launches: int
    ranges: int
    graph_executions: int | None = extension(omit=lambda c: c.graph_executions is None)


@dataclass(frozen=True)
class RangeName(Block):
    """One of ``range_names``: a range-name pattern, the ``--step-range`` regex that selects it, its count."""

    pattern: str
    regex: str
    count: int


@dataclass(frozen=True)
class StepCandidate(RangeName):
    """One of ``step_candidates`` (an extension): a :class:`RangeName` with the share of the GPU time whose launch
    its ranges enclose."""

    gpu_share: float


@dataclass(frozen=True)
class Info(Block):
    """The result of :func:`info` (``tracekit.info/1``)."""

    SCHEMA = INFO_SCHEMA

    source: InfoSource
    gpus: tuple[Gpu, ...]
    counts: Counts
    range_names: tuple[RangeName, ...]
    step_candidates: tuple[StepCandidate, ...]
    warnings: tuple[str, ...]


def info(trace: Trace, *, device: int | None = None, top: int = 10) -> Info:
    """Counts, GPUs, graph mode, step candidates and warnings of ``trace``.

    ``device`` restricts the GPU-side counts (kernels, memops), the GPU list and the GPU time the step
    candidates are weighed by; host-side counts (launches, ranges) are over the whole trace. A GPU's peak
    bandwidth is the trace's figure, else the GPU table's (``peak_bw_source``: ``"trace"`` or ``"table"``; null
    when neither knows it).

    Step candidates are range-name patterns whose ranges enclose launches of GPU work (a range that launches
    nothing cannot be a step): ``range_names`` lists them most frequent first (the contract's order; ties: the
    better tiling first), ``step_candidates`` (an extension) ranks them by ``gpu_share``, the share of the GPU
    time whose launch their ranges enclose: how well they tile the GPU timeline.
    """
    k, m, g = trace.kernels, trace.memops, trace.gpus
    if device is not None:
        k = k.filter(pl.col("device") == device)
        m = m.filter(pl.col("device") == device)
        g = g.filter(pl.col("device") == device)
    warnings = list(trace.meta.warnings)
    if not trace.has_gpu_activity:
        warnings.append("no GPU activity in this trace (no kernels, memory operations or graph executions)")
    cands = step_candidates(trace, top=None, device=device)
    pats = cands.sort(["count", "gpu_share", "pattern"], descending=[True, True, False]).head(top)
    cands = cands.head(top)
    n_launch = trace.launches.filter(pl.col("kind").is_in(WORK_KINDS)).height
    gpus = []
    for r in g.iter_rows(named=True):  # a few GPUs, not events
        # the trace's own figure, else the GPU table's (Kineto records none): as breakdown resolves it
        bw = peak_bandwidth(flag=None, trace=r["peak_bw_gbps"], name=r["name"])
        gpus.append(Gpu(device=int(r["device"]), name=r["name"], peak_bw_gbps=bw.value, peak_bw_source=bw.source))
    return Info(
        source=InfoSource.of(trace.meta, rank=trace.meta.rank, world_size=trace.meta.world_size),
        gpus=tuple(gpus),
        counts=Counts(kernels=k.height, memops=m.height, launches=n_launch, ranges=trace.ranges.height,
                      graph_executions=trace.graph_execs.height or None),
        range_names=tuple(RangeName(pattern=p, regex=r, count=int(c))
                          for p, r, c in zip(pats["pattern"], pats["regex"], pats["count"])),
        step_candidates=tuple(StepCandidate(pattern=p, regex=r, count=int(c), gpu_share=float(g))
                              for p, r, c, g in zip(cands["pattern"], cands["regex"], cands["count"],
                                                    cands["gpu_share"])),
        warnings=tuple(warnings))
