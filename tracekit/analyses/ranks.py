"""Several rank files analysed together: the per-rank breakdowns plus a cross-rank table."""

from __future__ import annotations

COLUMNS = ["rank", "path", "steps", "mean_ms", "p90_ms", "gemm", "attention", "communication", "drafting", "other",
           "memory", "launch_gaps", "idle", "comm_kernel_ms"]


def cross_rank(results) -> dict:
    table = []
    for i, b in enumerate(results):
        d = b.to_dict()
        ps, st = d["per_step_ms"], d["steps"]
        table.append([str(b.extras.get("rank", i)), d["source"]["path"], st["count"], st["mean_ms"], st["p90_ms"],
                      ps["gemm"], ps["attention"], ps["communication"], ps["drafting"], ps["other"], ps["memory"],
                      ps["launch_gaps"], ps["idle"], d["kernel_ms_per_step"]["communication"]])
    warnings = []
    comm = [r[-1] for r in table if r[-1] is not None]
    if len(comm) > 1 and max(comm) > 0:
        skew = max(comm) - min(comm)
        warnings.append(f"communication kernel time per step ranges from {min(comm):.3f} to {max(comm):.3f} ms across "
                        f"ranks ({skew:.3f} ms): the difference is mostly waiting for the slowest rank (skew), "
                        "not transfer")
    return {"schema": "tracekit.breakdown/1", "ranks": [b.to_dict() for b in results], "columns": COLUMNS,
            "table": table, "warnings": warnings}
