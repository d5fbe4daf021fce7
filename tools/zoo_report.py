"""The speculative zoo against its truth (issue 42): one row per capture of sample_traces/zoo-*; and the random zoo
(issue 48 item 4: sample_traces/zoo-random) against its NVTX twins, fitted on half, the worst case of the other half.

    python tools/zoo_report.py [--no-manifest] [--json]
    python tools/zoo_report.py --random [--split-seed 48] [--jobs 2] [--json] [--write-doc]

For each shape: detection, speculative / draft_model / verify_tokens, drafting kernel ms per step against the
NVTX-marked twin's (its draft ranges), the predicted plain step against the plain step measured unprofiled in the
same process (manifest unprofiled_plain_step_ms), and the phases. ``--no-manifest`` analyses a copy of each trace
without its manifest (a user's trace: no unprofiled time, no spec facts).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# the tracekit evaluated: this checkout's, or another's (ZOO_REPORT_TRACEKIT=/path/to/checkout, e.g. main's)
sys.path.insert(0, os.environ.get("ZOO_REPORT_TRACEKIT") or str(ROOT))

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


# ------------------------------------------------------------------------------------------------ the random zoo

RANDOM = ROOT / "sample_traces" / "zoo-random"
DOC = ROOT / "docs" / "validation.md"
DOC_BEGIN, DOC_END = "<!-- zoo-random:begin (tools/zoo_report.py --random --write-doc) -->", "<!-- zoo-random:end -->"
CHECKS = ("speculative", "draft_ms", "plain", "phases")
DRAFT_TOL, PLAIN_TOL = 0.05, 0.10


def unpack_random(dest: Path | None = None) -> Path:
    """The random zoo's capture folders (``rand-<seed>-<i>-nomark`` / ``-marked``), extracted once from
    ``sample_traces/zoo-random/*.tar.xz`` into ``dest`` (default: the user's cache)."""
    import tarfile

    archives = sorted(RANDOM.glob("*.tar.xz"))
    key = "-".join(str(a.stat().st_size) for a in archives)
    dest = dest or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tracekit-samples" / \
        f"zoo-random-{key}"
    if not (dest / ".done").exists():
        dest.mkdir(parents=True, exist_ok=True)
        for a in archives:
            with tarfile.open(a) as t:
                t.extractall(dest, filter="data")
        (dest / ".done").write_text("")
    return dest


def split(names: list[str], seed: int) -> tuple[list[str], list[str]]:
    """The shapes in two halves: shuffled with ``random.Random(seed)``, the first half fitted on, the rest held out."""
    xs = sorted(names, key=lambda n: int(n.rsplit("-", 1)[1]))
    random.Random(seed).shuffle(xs)
    k = (len(xs) + 1) // 2
    return sorted(xs[:k]), sorted(xs[k:])


def _rel(a: float, b: float) -> float:
    return abs(a - b) / abs(b) if b else abs(a - b)


def random_row(d: Path, shape: str) -> dict:
    """One random shape: its unmarked trace read as a user's (a copy without its manifest, the unprofiled spec step
    given as --measured-step-ms, as ../shared/tools/validate.py does) against its NVTX twin and its manifest."""
    nomark, marked = d / f"{shape}-nomark", d / f"{shape}-marked"
    man = json.loads((nomark / "manifest.json").read_text())
    truth = tracekit.breakdown(tracekit.load(trace_file(marked))).to_dict()
    tmp = Path(tempfile.mkdtemp())
    try:
        src = tmp / trace_file(nomark).name
        shutil.copy(trace_file(nomark), src)
        b = tracekit.breakdown(tracekit.load(src), measured_step_ms=man["unprofiled_step_ms"]).to_dict()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    dr = b["advice"]["drafting"]
    rs = man.get("random_shape", {}).get("shape", {})
    has_dm = bool((man.get("draft_model") or {}).get("exists"))
    ngram = rs.get("engine") == "sglang-ngram"
    abstain = ngram and dr.get("speculative") is None
    got, want = b["kernel_ms_per_step"]["drafting"], truth["kernel_ms_per_step"]["drafting"]
    pred, plain = dr.get("predicted_step_ms"), man["unprofiled_plain_step_ms"]
    ph = b["steps"].get("phases") or {}
    row = {
        "shape": shape, "engine": rs.get("engine"), "draft": rs.get("draft"), "K": rs.get("steps"),
        "topk": rs.get("topk"), "verify_tokens": man.get("verify_tokens"), "batch": rs.get("batch"),
        "mode": man.get("mode"), "attn": rs.get("attn"), "extend_sample": rs.get("extend_sample"),
        "hidden": (rs.get("target") or {}).get("hidden"), "layers": (rs.get("target") or {}).get("layers"),
        "spec_step_ms": man["unprofiled_step_ms"], "plain_step_ms": plain,
        "marked_spec_step_ms": json.loads((marked / "manifest.json").read_text())["unprofiled_step_ms"],
        "accept_len": (man.get("spec") or {}).get("accept_len"),
        "speculative": dr.get("speculative"), "draft_model": dr.get("draft_model"), "want_draft_model": has_dm,
        "detection": dr.get("detection"), "verify_tokens_read": dr.get("verify_tokens"),
        "speculative_ok": abstain or (dr.get("speculative") is True and dr.get("draft_model") is has_dm),
        "draft_ms": got, "truth_draft_ms": want,
        "draft_err": _rel(got, want) if has_dm else None,
        "plain_pred_ms": pred, "plain_err": (None if abstain and pred is None else
                                             (_rel(pred, plain) if pred is not None else float("inf"))),
        "phases": ph, "phases_ok": not (set(ph) - {"decode", "unknown"}) and ph.get("unknown", 0) <= 1,
        "steps": b["steps"]["count"],
    }
    return row


def random_rows(jobs: int = 1, shapes: list[str] | None = None) -> list[dict]:
    d = unpack_random()
    names = sorted({p.name[:-len("-nomark")] for p in d.glob("rand-*-nomark")
                    if (d / (p.name[:-len("-nomark")] + "-marked")).is_dir()}, key=lambda n: int(n.rsplit("-", 1)[1]))
    if shapes:
        names = [n for n in names if n in shapes]
    if jobs > 1:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        # (spawned, never forked: a fork of a process whose polars thread pool has run -- a test worker -- deadlocks
        # in the child's first polars query; CI hung there for an hour)
        with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as ex:
            return list(ex.map(random_row, [d] * len(names), names))
    return [random_row(d, n) for n in names]


def worst(rows: list[dict]) -> dict:
    """Per check, the worst case over ``rows`` (and the shape it is)."""
    out = {"shapes": len(rows)}
    bad = [r["shape"] for r in rows if not r["speculative_ok"]]
    out["speculative"] = {"ok": len(rows) - len(bad), "of": len(rows), "wrong": bad}
    d = [r for r in rows if r["draft_err"] is not None]
    w = max(d, key=lambda r: r["draft_err"], default=None)
    out["draft_ms"] = {"worst_err": w and w["draft_err"], "shape": w and w["shape"], "of": len(d),
                       "within": sum(r["draft_err"] <= DRAFT_TOL for r in d)}
    p = [r for r in rows if r["plain_err"] is not None]
    w = max(p, key=lambda r: r["plain_err"], default=None)
    out["plain"] = {"worst_err": w and w["plain_err"], "shape": w and w["shape"], "of": len(p),
                    "within": sum(r["plain_err"] <= PLAIN_TOL for r in p)}
    bad = [r["shape"] for r in rows if not r["phases_ok"]]
    out["phases"] = {"ok": len(rows) - len(bad), "of": len(rows), "wrong": bad}
    return out


def random_report(rows: list[dict], seed: int) -> dict:
    fit, held = split([r["shape"] for r in rows], seed)
    by = {r["shape"]: r for r in rows}
    return {"split_seed": seed, "fit": fit, "held_out": held, "worst_held_out": worst([by[n] for n in held]),
            "worst_fit": worst([by[n] for n in fit]), "worst_all": worst(rows)}


def _pct(x):
    return "—" if x is None else ("∞ (no prediction)" if x == float("inf") else f"{x:.1%}")


def random_markdown(rows: list[dict], rep: dict) -> str:
    held = set(rep["held_out"])
    out = ["| shape | half | loop | draft | K | topk | batch | mode | SDPA | extend samples | spec step ms | plain ms "
           "| speculative / draft model | drafting ms (got / twin) | plain step predicted | phases |",
           "|---|---|---|---|---:|---:|---:|---|---|---|---:|---:|---|---|---|---|"]
    for r in rows:
        dm = "—" if r["draft_err"] is None else f"{r['draft_ms']:.3f} / {r['truth_draft_ms']:.3f} ({_pct(r['draft_err'])})"
        pp = "—" if r["plain_pred_ms"] is None else f"{r['plain_pred_ms']:.3f} ({_pct(r['plain_err'])})"
        out.append(f"| {r['shape']} | {'held out' if r['shape'] in held else 'fit'} | {r['engine']} | {r['draft']} | "
                   f"{r['K']} | {r['topk']} | {r['batch']} | {r['mode']} | {r['attn']} | {r['extend_sample']} | "
                   f"{r['spec_step_ms']:.3f} | {r['plain_step_ms']:.3f} | "
                   f"{r['speculative']}/{r['draft_model']} {'ok' if r['speculative_ok'] else 'MISS'} | {dm} | {pp} | "
                   f"{'ok' if r['phases_ok'] else r['phases']} |")
    return "\n".join(out)


def summary_lines(rep: dict) -> list[str]:
    lines = []
    for half, key in (("held-out half", "worst_held_out"), ("fit half", "worst_fit")):
        w = rep[key]
        lines.append(
            f"- **{half}** ({w['shapes']} shapes): speculative and draft_model right on {w['speculative']['ok']} of "
            f"{w['speculative']['of']}{' (wrong: ' + ', '.join(w['speculative']['wrong']) + ')' if w['speculative']['wrong'] else ''}; "
            f"drafting kernel ms against the NVTX twin: worst {_pct(w['draft_ms']['worst_err'])} "
            f"({w['draft_ms']['shape']}), {w['draft_ms']['within']} of {w['draft_ms']['of']} within 5%; plain step "
            f"against the one measured unprofiled: worst {_pct(w['plain']['worst_err'])} ({w['plain']['shape']}), "
            f"{w['plain']['within']} of {w['plain']['of']} within 10%; every complete step decode on "
            f"{w['phases']['ok']} of {w['phases']['of']}")
    return lines


def write_doc(rows: list[dict], rep: dict, label: str) -> None:
    text = DOC.read_text()
    body = "\n".join([DOC_BEGIN, "", f"Evaluated with {label}; split seed {rep['split_seed']}.", "",
                      *summary_lines(rep), "", "<details><summary>every shape</summary>", "",
                      random_markdown(rows, rep), "", "</details>", "", DOC_END])
    if DOC_BEGIN in text:
        a, rest = text.split(DOC_BEGIN, 1)
        text = a + body + rest.split(DOC_END, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + body + "\n"
    DOC.write_text(text)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--no-manifest", action="store_true")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--shape", action="append")
    ap.add_argument("--random", action="store_true", help="the random zoo (sample_traces/zoo-random)")
    ap.add_argument("--split-seed", type=int, default=48)
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--write-doc", action="store_true", help="--random: rewrite docs/validation.md's section")
    ap.add_argument("--label", default=None, help="--write-doc: what was evaluated (default: git describe)")
    a = ap.parse_args()
    if a.random:
        rows = random_rows(a.jobs, a.shape)
        rep = random_report(rows, a.split_seed)
        if a.json:
            print(json.dumps({"report": rep, "rows": rows}, indent=1, default=str))
        else:
            print(random_markdown(rows, rep))
            print("\n".join(summary_lines(rep)))
        if a.write_doc:
            import subprocess

            label = a.label or "tracekit at " + subprocess.run(
                ["git", "-C", str(Path(tracekit.__file__).parents[1]), "log", "-1", "--format=%h (%s)"],
                capture_output=True, text=True).stdout.strip()[:120]
            write_doc(rows, rep, label)
        return
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
