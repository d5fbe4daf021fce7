"""The speculative zoo against its truth (issue 42): one row per capture of sample_traces/zoo-*.

    python tools/zoo_report.py [--no-manifest] [--json]

For each shape: detection, speculative / draft_model / verify_tokens, drafting kernel ms per step against the
NVTX-marked twin's (its draft ranges), the predicted plain step against the plain step measured unprofiled in the
same process (manifest unprofiled_plain_step_ms), and the phases. ``--no-manifest`` analyses a copy of each trace
without its manifest (a user's trace: no unprofiled time, no spec facts).
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import tracekit  # noqa: E402

VARIANTS = ("nomark", "engine", "marked")


def trace_file(d: Path) -> Path:
    for f in ("trace.sqlite.gz", "trace.sqlite", "trace.json.gz"):
        if (d / f).exists():
            return d / f
    raise FileNotFoundError(d)


def analyse(d: Path, bare: bool) -> dict:
    src = trace_file(d)
    if bare:
        tmp = Path(tempfile.mkdtemp())
        shutil.copy(src, tmp / src.name)
        src = tmp / src.name
    b = tracekit.breakdown(tracekit.load(src)).to_dict()
    return b


def rows(bare: bool = False, shapes: list[str] | None = None) -> list[dict]:
    out = []
    dirs = sorted(ROOT.glob("sample_traces/zoo-*-marked"))
    for marked in dirs:
        shape = marked.name[len("zoo-"):-len("-marked")]
        if shapes and shape not in shapes:
            continue
        truth = analyse(marked, False)
        truth_ms = truth["kernel_ms_per_step"]["drafting"]
        for v in VARIANTS:
            d = ROOT / "sample_traces" / f"zoo-{shape}-{v}"
            if not d.exists():
                continue
            man = json.loads((d / "manifest.json").read_text())
            b = truth if v == "marked" and not bare else analyse(d, bare)
            dr = b["advice"]["drafting"]
            plain = man.get("unprofiled_plain_step_ms")
            pred = dr.get("predicted_step_ms")
            out.append({
                "shape": shape, "variant": v, "steps": b["steps"]["count"], "marker": b["steps"]["marker"],
                "phases": b["steps"]["phases"], "detection": dr["detection"], "speculative": dr["speculative"],
                "draft_model": dr["draft_model"], "verify_tokens": dr["verify_tokens"],
                "want_verify": (man.get("draft_model") or {}).get("verify_tokens") or
                ((man.get("spec") or {}).get("draft_tokens") or 0) + 1,
                "draft_ms": b["kernel_ms_per_step"]["drafting"], "truth_ms": truth_ms,
                "draft_err": (b["kernel_ms_per_step"]["drafting"] / truth_ms - 1) if truth_ms else None,
                "plain_pred": pred, "plain_meas": plain,
                "plain_err": (pred / plain - 1) if pred and plain else None,
                "spec_step": man.get("unprofiled_step_ms"), "traced": b["time_base"]["traced_step_ms"],
                "evidence": dr["evidence"],
            })
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--no-manifest", action="store_true")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--shape", action="append")
    ap.add_argument("--node-gap", type=float, help="the H100's unprofiled graph-node gap to use (us; a fit's check)")
    a = ap.parse_args()
    if a.node_gap is not None:
        import tracekit.analyses.drafting as dr

        dr.NODE_GAP_US_BY_GPU = (("H100", a.node_gap), *dr.NODE_GAP_US_BY_GPU[1:])
    rs = rows(a.no_manifest, a.shape)
    if a.json:
        print(json.dumps(rs, indent=1))
        return
    f = lambda x, p=3: "-" if x is None else (f"{x:+.1%}" if p == "%" else f"{x:.{p}f}")  # noqa: E731
    print(f"{'shape':15s} {'var':6s} {'n':>3s} {'det':10s} {'spec':5s} {'dm':5s} {'vt':>3s}/{'w':<2s} "
          f"{'draft':>7s} {'truth':>7s} {'err':>7s} {'pred':>7s} {'plain':>7s} {'err':>7s} phases")
    for r in rs:
        print(f"{r['shape']:15s} {r['variant']:6s} {r['steps']:3d} {r['detection']:10s} {str(r['speculative']):5s} "
              f"{str(r['draft_model']):5s} {str(r['verify_tokens']):>3s}/{r['want_verify']:<2d} {f(r['draft_ms'])} "
              f"{f(r['truth_ms'])} {f(r['draft_err'], '%'):>7s} {f(r['plain_pred'])} {f(r['plain_meas'])} "
              f"{f(r['plain_err'], '%'):>7s} {r['phases']}")


if __name__ == "__main__":
    main()
