"""`tracekit kernels`: every kernel name with its category (schema ``tracekit.kernels/1``).

Sums as ``nsys stats --report cuda_gpu_kern_sum`` does: every kernel record counts in full,
over all GPUs unless a device is given. Memory operations are not kernels and are left out.
The statistics of each name's durations are nsys stats' too (its ``Min``, ``Med``, ``Max`` and ``StdDev``
columns): the median of an even count is the mean of the middle two, the standard deviation is the sample one
(n - 1) and 0 for a single instance. All of them are group-by aggregations over the kernel frame (one pass, no
per-name loop), pinned against nsys stats' own CSVs by ``tests/results/test_kernels.py``.

A name no rule matches takes its category from the framework op that launched it where the trace records one
(``tracekit.classify.with_op_categories``); its ``rule`` is then ``op:<op name>``. The warning counts the names
left with no rule, and says how many were categorised by their op.

:func:`kernel_summary` returns a :class:`KernelSummary` (typed rows, :class:`tracekit.contract.Block`);
``tracekit.kernels()`` returns its ``to_dict()``, the dict the command prints with ``--format json``.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from tracekit.contract import KERNELS_SCHEMA, Block
from tracekit.trace import Trace

SCHEMA = KERNELS_SCHEMA  # "tracekit.kernels/1" (tracekit.contract names it once)


@dataclass(frozen=True)
class KernelRow(Block):
    """One kernel name: its category and the rule that gave it (null: none matched), count, total and mean time,
    the minimum, median, maximum and sample standard deviation of its durations (as ``nsys stats`` computes
    them), and share of all kernel time."""

    name: str
    category: str
    rule: str | None
    count: int
    total_ms: float
    mean_us: float
    min_ms: float
    median_ms: float
    max_ms: float
    stddev_ms: float
    share: float


@dataclass(frozen=True)
class KernelSummary(Block):
    """The result of :func:`kernel_summary` (``tracekit.kernels/1``): rows largest total first."""

    SCHEMA = KERNELS_SCHEMA

    kernels: tuple[KernelRow, ...]
    warnings: tuple[str, ...]


def kernel_summary(trace: Trace, *, device: int | None = None, top: int | None = None, rules=None
                   ) -> KernelSummary:
    from tracekit.classify import OP_RULE_PREFIX, load_rules, name_table, with_op_categories

    k = trace.kernels
    if device is not None:
        k = k.filter(pl.col("device") == device)
    warnings = list(trace.meta.warnings)
    if trace.meta.graph_trace_mode == "graph":
        warnings.append("graph work has no per-kernel rows in this capture: these totals miss it")
    loaded = load_rules(rules) if rules is not None else load_rules()
    pos, table = name_table(k["name"], loaded)
    table = with_op_categories(table, pos, k, trace, loaded)
    dur = pl.col("dur")
    agg = (k.select(pos=pos, dur=pl.col("end") - pl.col("start")).group_by("pos")
           .agg(count=pl.len(), total_ns=dur.sum(), min_ns=dur.min(), max_ns=dur.max(),
                # nsys stats' Med and StdDev: the middle two averaged for an even count; the sample deviation,
                # 0 for one instance (polars gives null there)
                median_ns=dur.median(), stddev_ns=dur.std(ddof=1).fill_null(0.0))
           .join(table.with_row_index("pos"), on="pos", how="left")
           .select("name", "count", "total_ns", "min_ns", "median_ns", "max_ns", "stddev_ns", "category", "rule")
           .sort(["total_ns", "name"], descending=[True, False]))
    grand = agg["total_ns"].sum() or 0
    unmatched = agg.filter(pl.col("rule").is_null())
    by_op = agg.filter(pl.col("rule").str.starts_with(OP_RULE_PREFIX))
    if by_op.height and grand:
        warnings.append(f"{by_op.height} kernel name(s) matched no name rule and were categorised by the framework "
                        f"op that launched them ({100 * by_op['total_ns'].sum() / grand:.1f}% of kernel time; rule "
                        "op:<op>)")
    if unmatched.height and grand:
        share = unmatched["total_ns"].sum() / grand
        warnings.append(f"{unmatched.height} kernel name(s) matched no rule ({100 * share:.1f}% of kernel time): "
                        "counted as other; add rules with --rules FILE")
    if top is not None:
        agg = agg.head(top)
    rows = tuple(
        KernelRow(name=r["name"], category=r["category"], rule=r["rule"], count=int(r["count"]),
                  total_ms=r["total_ns"] / 1e6, mean_us=r["total_ns"] / r["count"] / 1e3,
                  min_ms=r["min_ns"] / 1e6, median_ms=r["median_ns"] / 1e6, max_ms=r["max_ns"] / 1e6,
                  stddev_ms=r["stddev_ns"] / 1e6, share=(r["total_ns"] / grand) if grand else 0.0)
        for r in agg.iter_rows(named=True)
    )
    return KernelSummary(kernels=rows, warnings=tuple(warnings))
