"""Communication of one rank: what its collectives cost besides their kernels.

A pure function over a breakdown's attributed activities (``Breakdown.activities``). The collectives themselves
(sizes, bandwidth, latency-bound, hidden time) are :mod:`tracekit.analyses.collectives`.
"""

from __future__ import annotations

import polars as pl


def collective_overheads(acts: pl.DataFrame | None, n_steps: int, graphed: bool, replay_gap_us: float
                         ) -> dict | None:
    """What a collective costs besides its kernel: memory copies issued right before it on its stream (staging
    into symmetric-memory or custom all-reduce buffers) and, in graph-replayed steps, one replay node each."""
    if acts is None or acts.height == 0:
        return None
    is_comm = (pl.col("category") == "communication") & (pl.col("kind") == "kernel")
    if acts.filter(is_comm).height == 0:
        return None  # (before the sort below: ten million activities, none of them a collective)
    a = acts.select("step", "stream", "start", "dur", "kind", "category").sort(["stream", "start"])
    a = a.with_columns(next_cat=pl.col("category").shift(-1).over("stream"))
    comm = a.filter(is_comm)
    staging = a.filter((pl.col("kind") == "memop") & (pl.col("next_cat") == "communication"))
    n = max(1, n_steps)
    nodes = (comm.height + staging.height) / n
    return {"staging_ms": float(staging["dur"].sum()) / 1e6 / n, "nodes_per_step": nodes,
            "node_ms": nodes * replay_gap_us / 1000.0 if graphed else 0.0}


__all__ = ["collective_overheads"]
