"""Helpers shared by the readers (and only by them)."""

from __future__ import annotations

import polars as pl

# Host API name (version suffix stripped) -> launch kind. Matched by prefix, first match wins.
_API_KINDS: list[tuple[str, str]] = [
    ("cudaGraphLaunch", "graph"),
    ("cuGraphLaunch", "graph"),
    ("hipGraphLaunch", "graph"),
    ("cudaLaunch", "kernel"),  # cudaLaunchKernel, cudaLaunchKernelExC, cudaLaunchCooperativeKernel
    ("cuLaunch", "kernel"),  # cuLaunchKernel, cuLaunchKernelEx, cuLaunchCooperativeKernel
    ("hipLaunch", "kernel"),
    ("hipExtLaunch", "kernel"),
    ("hipModuleLaunch", "kernel"),
    ("cudaMemset", "memset"),
    ("cuMemset", "memset"),
    ("hipMemset", "memset"),
    ("cudaMemcpy", "memcpy"),
    ("cuMemcpy", "memcpy"),
    ("hipMemcpy", "memcpy"),
    ("cudaDeviceSynchronize", "sync"),
    ("cudaStreamSynchronize", "sync"),
    ("cudaEventSynchronize", "sync"),
    ("cudaStreamWaitEvent", "sync"),
    ("cuStreamSynchronize", "sync"),
    ("cuEventSynchronize", "sync"),
    ("cuCtxSynchronize", "sync"),
    ("hipDeviceSynchronize", "sync"),
    ("hipStreamSynchronize", "sync"),
    ("hipEventSynchronize", "sync"),
]

from tracekit.trace import WORK_KINDS  # noqa: E402,F401  (re-exported for the readers)


def strip_api_version(name: pl.Expr) -> pl.Expr:
    """``cudaLaunchKernel_v7000`` -> ``cudaLaunchKernel``; ``cudaMemcpyAsync_ptsz_v7000`` -> ``cudaMemcpyAsync``."""
    return name.str.replace(r"(_ptsz|_ptds)?(_v\d+)?(_ptsz|_ptds)?$", "")


def api_kind(name: pl.Expr) -> pl.Expr:
    """Launch kind of a (suffix-stripped) host API name, as a polars expression."""
    expr = pl.lit("other")
    for prefix, kind in reversed(_API_KINDS):
        expr = pl.when(name.str.starts_with(prefix)).then(pl.lit(kind)).otherwise(expr)
    return expr


def nesting_depth(ranges: pl.DataFrame) -> pl.Series:
    """Nesting depth of each range on its (pid, tid), 0 = outermost, by a sorted sweep.

    ``ranges`` must have start, end, pid, tid. Depth of a range = number of ranges on the
    same thread that started at or before it and end after it starts (strict push/pop
    nesting assumed; crossing start/end ranges get a best-effort depth).
    """
    if ranges.height == 0:
        return pl.Series("depth", [], dtype=pl.Int32)
    df = ranges.select("start", "end", "pid", "tid").with_row_index("_i")
    # +1 at each start, -1 at each end; depth at a start = running sum before it.
    # Ends sort before starts at the same instant, and a longer range opens first.
    ev = pl.concat(
        [
            df.select("_i", "pid", "tid", ts="start", d=pl.lit(1, pl.Int32), o=pl.lit(1, pl.Int8), neg_end=-pl.col("end")),
            df.select("_i", "pid", "tid", ts="end", d=pl.lit(-1, pl.Int32), o=pl.lit(0, pl.Int8), neg_end=pl.lit(0, pl.Int64)),
        ]
    ).sort(["pid", "tid", "ts", "o", "neg_end"])
    ev = ev.with_columns(level=pl.col("d").cum_sum().over(["pid", "tid"]) - pl.col("d"))
    starts = ev.filter(pl.col("o") == 1).select("_i", "level").sort("_i")
    return starts["level"].clip(lower_bound=0).cast(pl.Int32).alias("depth")
