"""Several ranks analysed together: the per-rank breakdowns plus a cross-rank table.

A collective's kernel on each rank lasts from that rank's arrival to the end of the
transfer, which ends at about the same time everywhere; so for the i-th collective of the
step, the shortest duration across ranks is the transfer (the last rank to arrive did not
wait) and each rank's excess over it is waiting for the slowest rank (skew). Collectives are
matched by their order on each rank (tensor parallelism issues them in the same order).
"""

from __future__ import annotations

import polars as pl

from tracekit.categories import STEP_CATEGORIES, UNATTRIBUTED

COLUMNS = ["rank", "path", "device", "steps", "mean_ms", "p90_ms",
           *[k for k in STEP_CATEGORIES if k != UNATTRIBUTED], "comm_kernel_ms", "comm_transfer_ms", "comm_wait_ms"]


def _comm_durations(b) -> pl.Series | None:
    acts = b.activities
    if acts is None:
        return None
    comm = acts.filter((pl.col("category") == "communication") & (pl.col("kind") == "kernel")).sort("start")
    return comm["dur"]


def wait_and_transfer(results) -> tuple[list[tuple[float | None, float | None]], list[str]]:
    """Per rank: (transfer ms per step, wait ms per step), by matching collectives in order across ranks."""
    durs = [_comm_durations(b) for b in results]
    warnings = []
    if len(results) < 2 or any(d is None or d.len() == 0 for d in durs):
        return [(None, None)] * len(results), warnings
    m = min(d.len() for d in durs)
    if len({d.len() for d in durs}) > 1:
        warnings.append(f"ranks have different numbers of communication kernels ({', '.join(str(d.len()) for d in durs)}"
                        f"): wait/transfer matched on the first {m} of each")
    mat = pl.DataFrame({f"r{i}": d.head(m) for i, d in enumerate(durs)})
    transfer = mat.min_horizontal()
    out = []
    for i, b in enumerate(results):
        n = max(1, b.steps["count"])
        t = float(transfer.sum()) / 1e6 / n
        w = float((mat[f"r{i}"] - transfer).sum()) / 1e6 / n
        out.append((t, w))
    return out, warnings


def cross_rank(results, labels=None) -> dict:
    wt, warnings = wait_and_transfer(results)
    table = []
    for i, b in enumerate(results):
        d = b.to_dict()
        ps, st = d["per_step_ms"], d["steps"]
        rank = b.rank
        label = labels[i] if labels else str(i if rank is None else rank)
        table.append([label, d["source"]["path"], d["gpu"]["device"], st["count"], st["mean_ms"], st["p90_ms"],
                      *[ps[k] for k in STEP_CATEGORIES if k != UNATTRIBUTED], d["kernel_ms_per_step"]["communication"], wt[i][0], wt[i][1]])
    waits = [w for _, w in wt if w is not None]
    if waits and max(waits) > 0:
        worst = max(range(len(wt)), key=lambda i: wt[i][1] or 0)
        warnings.append(f"communication per step is {wt[0][0]:.3f} ms of transfer; ranks wait {min(waits):.3f}–"
                        f"{max(waits):.3f} ms for the slowest (rank {table[worst][0]} waits most): skew between ranks, "
                        "not the transfer, is what a faster all-reduce cannot fix")
    return {"schema": "tracekit.breakdown/1", "ranks": [b.to_dict() for b in results], "columns": COLUMNS,
            "table": table, "warnings": warnings}


INFO_COLUMNS = ["rank", "path", "producer_version", "kernels", "memops", "launches", "ranges"]
KERNEL_COLUMNS = ["rank", "path", "kernel_ms", "gemm_ms", "attention_ms", "communication_ms", "other_ms",
                  "unmatched_share"]


def info_ranks(results: list[dict]) -> dict:
    """Several files given to `tracekit info`: each file's result plus a cross-rank table of counts."""
    table = [[str(r["source"].get("rank", i)), r["source"]["path"], r["source"]["producer_version"] or "",
              *[r["counts"][k] for k in ("kernels", "memops", "launches", "ranges")]] for i, r in enumerate(results)]
    return {"schema": "tracekit.info/1", "ranks": results, "columns": INFO_COLUMNS, "table": table}


def kernels_ranks(results: list[dict], paths) -> dict:
    """Several files given to `tracekit kernels`: each file's result plus kernel time per category per rank."""
    table = []
    for i, (r, path) in enumerate(zip(results, paths)):
        ks = r["kernels"]
        by = {}
        for k in ks:
            by[k["category"]] = by.get(k["category"], 0.0) + k["total_ms"]
        total = sum(by.values())
        unmatched = sum(k["total_ms"] for k in ks if k["rule"] is None)
        table.append([str(i), str(path), total, by.get("gemm", 0.0), by.get("attention", 0.0),
                      by.get("communication", 0.0), by.get("other", 0.0), unmatched / total if total else 0.0])
    return {"schema": "tracekit.kernels/1", "ranks": results, "columns": KERNEL_COLUMNS, "table": table}
