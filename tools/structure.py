#!/usr/bin/env python
"""What tracekit finds in a trace's structure, without markers: steps from the period, phase, drafting, steady state.

For validating the structural analyses on a new capture (a marked and an unmarked copy of the same run): prints,
per trace, the step windows found from the ranges and from the period alone, the phase of each step with its
evidence, drafting by structure (with the draft ranges ignored) against drafting by ranges, and the steady-state
exclusions. One JSON object per trace on stdout.

    python tools/structure.py sample_traces/hf-small-spec/trace.sqlite.gz [MORE ...] [--device N]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def report(path: str, device: int | None = None) -> dict:
    import polars as pl

    import tracekit
    import tracekit.run.pipeline as bd
    from tracekit.analyses.drafting import detect_drafting
    from tracekit.analyses.phase import select_phase, step_phases
    from tracekit.analyses.steady import reason_counts, steady_exclusions
    from tracekit.steps import find_steps, infer_steps

    t = tracekit.load(path)
    out: dict = {"path": path}
    marked = find_steps(t, device=device, every_phase=True)
    inferred = infer_steps(t, device=device)
    out["marked"] = None if marked is None or marked.marker == "inferred" else {
        "marker": marked.marker, "pattern": marked.pattern, "windows": marked.windows.height}
    if inferred is not None:
        w = inferred.windows
        out["inferred"] = {"windows": w.height, "complete": int(w["end"].is_not_null().sum()),
                           "period": vars(inferred.period), "warning": inferred.warnings[0]}
    else:
        out["inferred"] = None
    for label, steps in (("with_ranges", marked), ("inferred_only", inferred)):
        if steps is None:
            continue
        orig = bd.find_steps
        bd.find_steps = lambda trace, step_range=None, device=None, _s=steps: _s  # noqa: E731
        try:
            table, acts, _, dev, *_ = bd.step_table(t, device=device)
            _, acts_nodraft, *_ = bd.step_table(t, device=device, draft_range=None)
        finally:
            bd.find_steps = orig
        ph = step_phases(t, steps.windows, acts)
        sel, warnings = select_phase(ph)
        prior = steps.windows.select("step", reason=pl.when(pl.col("end").is_null())
                                     .then(pl.lit("cut by capture window")))
        prior = prior.with_columns(reason=pl.when(pl.col("reason").is_null()
                                                  & ~pl.col("step").is_in(table["step"].implode()))
                                   .then(pl.lit("no GPU work")).otherwise(pl.col("reason")))
        prior = prior.join(sel.select("step", r2="reason"), on="step", how="left").select(
            "step", reason=pl.coalesce("reason", "r2"))
        ex = steady_exclusions(acts, prior)
        n = table.height
        ranged = float(acts.filter(pl.col("category") == "drafting")["dur"].sum()) / n / 1e6 if n else None
        draft, info = detect_drafting(acts_nodraft, phases=ph)
        by_struct = float(acts_nodraft.with_columns(d=draft).filter(
            pl.col("d").is_not_null() | (pl.col("category") == "drafting"))["dur"].sum()) / n / 1e6 if n else None
        kept = ex.filter(pl.col("reason").is_null())["step"]
        period = table.filter(pl.col("step").is_in(kept.implode()))["period"] / 1e6
        out[label] = {
            "device": dev,
            "phases": dict(ph.group_by("phase").len().iter_rows()),
            "phase_evidence": ph.group_by("phase", "source").agg(pl.col("evidence").first()).rows(),
            "phase_warnings": warnings,
            "excluded_reasons": reason_counts(ex),
            "analysed": kept.len(),
            "mean_step_ms": float(period.mean()) if period.len() else None,
            "drafting_kernel_ms_per_step": {"ranges_or_names": ranged, "structure": by_struct,
                                            "detection": info.detection, "forwards_per_step": info.forwards_per_step,
                                            "warning": info.warning, "evidence": list(info.evidence)},
        }
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("traces", nargs="+")
    ap.add_argument("--device", type=int, default=None)
    args = ap.parse_args(argv)
    for p in args.traces:
        print(json.dumps(report(p, args.device), default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
