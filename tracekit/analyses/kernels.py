"""`tracekit kernels`: every kernel name with its category (schema ``tracekit.kernels/1``).

Sums as ``nsys stats --report cuda_gpu_kern_sum`` does: every kernel record counts in full,
over all GPUs unless a device is given. Memory operations are not kernels and are left out.
"""

from __future__ import annotations

import polars as pl

from tracekit.trace import Trace

SCHEMA = "tracekit.kernels/1"


def kernel_summary(trace: Trace, *, device: int | None = None, top: int | None = None, rules=None) -> dict:
    from tracekit.classify import classify, load_rules

    k = trace.kernels
    if device is not None:
        k = k.filter(pl.col("device") == device)
    warnings = list(trace.meta.warnings)
    if trace.meta.graph_trace_mode == "graph":
        warnings.append("graph work has no per-kernel rows in this capture: these totals miss it")
    agg = (k.group_by("name").agg(count=pl.len(), total_ns=(pl.col("end") - pl.col("start")).sum())
           .sort(["total_ns", "name"], descending=[True, False]))
    cats = classify(agg["name"], load_rules(rules) if rules is not None else None)
    agg = agg.with_columns(category=cats["category"], rule=cats["rule"])
    grand = agg["total_ns"].sum() or 0
    unmatched = agg.filter(pl.col("rule").is_null())
    if unmatched.height and grand:
        share = unmatched["total_ns"].sum() / grand
        warnings.append(f"{unmatched.height} kernel name(s) matched no rule ({100 * share:.1f}% of kernel time): "
                        "counted as other; add rules with --rules FILE")
    if top is not None:
        agg = agg.head(top)
    rows = [
        {"name": r["name"], "category": r["category"], "rule": r["rule"], "count": int(r["count"]),
         "total_ms": r["total_ns"] / 1e6, "mean_us": r["total_ns"] / r["count"] / 1e3,
         "share": (r["total_ns"] / grand) if grand else 0.0}
        for r in agg.iter_rows(named=True)
    ]
    return {"schema": SCHEMA, "kernels": rows, "warnings": warnings}
