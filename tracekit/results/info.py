"""`tracekit info`: what is in a trace (schema ``tracekit.info/1``)."""

from __future__ import annotations

import polars as pl

from tracekit.contract import INFO_SCHEMA
from tracekit.gpus import resolve_peak_bw
from tracekit.steps import step_candidates
from tracekit.trace import WORK_KINDS, Trace

SCHEMA = INFO_SCHEMA  # "tracekit.info/1" (tracekit.contract names it once)


def info(trace: Trace, *, device: int | None = None, top: int = 10) -> dict:
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
        bw, source = resolve_peak_bw(None, None, r["peak_bw_gbps"], r["name"])
        gpus.append({"device": int(r["device"]), "name": r["name"], "peak_bw_gbps": bw, "peak_bw_source": source})
    out = {
        "schema": SCHEMA,
        "source": {"path": trace.meta.path, "format": trace.meta.format,
                   "producer_version": trace.meta.producer_version,
                   "graph_trace_mode": trace.meta.graph_trace_mode},
        "gpus": gpus,
        "counts": {"kernels": k.height, "memops": m.height, "launches": n_launch, "ranges": trace.ranges.height},
        "range_names": [{"pattern": p, "regex": r, "count": int(c)}
                        for p, r, c in zip(pats["pattern"], pats["regex"], pats["count"])],
        "step_candidates": [{"pattern": p, "regex": r, "count": int(c), "gpu_share": float(g)}
                            for p, r, c, g in zip(cands["pattern"], cands["regex"], cands["count"],
                                                  cands["gpu_share"])],
        "warnings": warnings,
    }
    if trace.graph_execs.height:
        out["counts"]["graph_executions"] = trace.graph_execs.height
    if trace.meta.rank is not None:
        out["source"]["rank"] = trace.meta.rank
        out["source"]["world_size"] = trace.meta.world_size
    return out
