"""Communication of one rank: what its collectives cost besides their kernels, and the bus bandwidth they reach.

Pure functions over a breakdown's attributed activities (``Breakdown.activities``) and the trace's collective
metadata (``Trace.collectives``: message sizes from Kineto NCCL kernel arguments).
"""

from __future__ import annotations

import polars as pl

_DTYPE_BYTES = {"float": 4, "float32": 4, "double": 8, "float64": 8, "bfloat16": 2, "half": 2, "float16": 2,
                "long": 8, "int64": 8, "int": 4, "int32": 4, "short": 2, "byte": 1, "char": 1, "bool": 1,
                "float8_e4m3fn": 1, "float8_e5m2": 1, "uint8": 1, "int8": 1}


def collective_bandwidth(acts: pl.DataFrame | None, collectives: pl.DataFrame) -> dict | None:
    """Achieved bus bandwidth of the step's collectives whose message sizes the trace records (NCCL convention:
    all-reduce algbw × 2(n−1)/n; all-gather / reduce-scatter × (n−1)/n). None when no sizes are known."""
    if acts is None or collectives.height == 0:
        return None
    comm = acts.filter((pl.col("category") == "communication") & (pl.col("kind") == "kernel"))
    coll = collectives.with_columns(
        size=pl.col("dtype").str.to_lowercase().replace_strict(_DTYPE_BYTES, default=None, return_dtype=pl.Int64))
    # join on the recorded kernel start (``start0``: the partition's ``start`` is serialised and clipped)
    j = comm.join(coll, left_on=["pid", "correlation", "start0"], right_on=["pid", "correlation", "start"],
                  how="inner").filter(pl.col("size").is_not_null() & (pl.col("dur") > 0) & (pl.col("group_size") > 1))
    if j.height == 0:
        return None
    name = pl.col("collective").str.to_lowercase()
    n = pl.col("group_size").cast(pl.Float64)
    factor = (pl.when(name.str.contains("allreduce|all_reduce")).then(2 * (n - 1) / n)
              .when(name.str.contains("allgather|all_gather|reduce_scatter|reducescatter")).then((n - 1) / n)
              .otherwise(1.0))
    j = j.with_columns(bytes=pl.max_horizontal("in_nelems", "out_nelems") * pl.col("size"),
                       busbw=pl.max_horizontal("in_nelems", "out_nelems") * pl.col("size") * factor
                       / (pl.col("dur") * 1e-9) / 1e9)
    top = j.group_by("collective").agg(count=pl.len(), bytes=pl.col("bytes").median(),
                                       busbw=pl.col("busbw").median()).sort("count", descending=True)
    return {"collective": top["collective"][0], "count": int(top["count"][0]),
            "median_bytes": float(top["bytes"][0]), "median_busbw_gbps": float(top["busbw"][0]),
            "group_size": int(j["group_size"][0])}


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


__all__ = ["collective_bandwidth", "collective_overheads"]
