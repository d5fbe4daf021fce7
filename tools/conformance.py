#!/usr/bin/env python
"""Conformance run: every real trace through ``info``, ``kernels`` and ``breakdown`` via the real CLI.

Each command runs in its own subprocess (``python -m tracekit CMD --format json TRACE``),
exactly as a user would run it. A trace conforms when every command exits 0, or exits 2
with exactly one ``tracekit: error:`` line on stderr and no Python traceback, and, for a
breakdown that exits 0, the non-null ``per_step_ms`` values sum to ``steps.mean_ms``
within 0.5%. The result is a markdown table on stdout (docs/conformance.md is this
table), one row per trace: file, producer/version, result (exit code + the one-line
reason per command), steps found, warnings.

    python tools/conformance.py                  # sample_traces/ + ../shared/external_traces
    python tools/conformance.py DIR_OR_FILE ...  # other traces
    python tools/conformance.py --doc docs/conformance.md   # also write the doc (date + commit)

Exit status: 0 when every trace conforms, 1 otherwise (the offending rows say why).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# ../shared/external_traces, or where $TRACEKIT_EXTERNAL_TRACES says (as the tests read them)
DEFAULT_DIRS = [ROOT / "sample_traces",
                Path(os.environ.get("TRACEKIT_EXTERNAL_TRACES") or ROOT.parent / "shared" / "external_traces")]
SUFFIXES = (".sqlite", ".sqlite.gz", ".json", ".json.gz", ".nsys-rep")
COMMANDS = ("info", "kernels", "breakdown")
TIMEOUT_S = 300


def _looks_like_trace(f: Path) -> bool:
    """Directories also hold JSON that is not a trace (manifest.json, index.json, device profiles)."""
    if not f.name.endswith((".json", ".json.gz")):
        return True
    import gzip

    try:
        with (gzip.open(f, "rb") if f.name.endswith(".gz") else open(f, "rb")) as fh:
            return b'"traceEvents"' in fh.read(1 << 20)
    except (OSError, EOFError):
        return True  # unreadable: let tracekit say so


def find_traces(paths: list[Path]) -> list[Path]:
    out: list[Path] = []
    for p in paths:
        if p.is_dir():
            out += sorted(f for f in p.rglob("*") if f.is_file() and f.name.endswith(SUFFIXES)
                          and _looks_like_trace(f))
        elif p.is_file():
            out.append(p)
    return out


def run_cli(cmd: str, trace: Path) -> dict:
    """One CLI run: rc, stdout JSON (or None), stderr lines, and what is wrong with it (problems)."""
    argv = [sys.executable, "-m", "tracekit", cmd, "--format", "json", str(trace)]
    env = dict(os.environ, NO_COLOR="1", PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S, env=env, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"rc": None, "json": None, "err": [], "problems": [f"hung (> {TIMEOUT_S} s)"]}
    err = [ln for ln in p.stderr.splitlines() if ln.strip()]
    problems = []
    if "Traceback (most recent call last)" in p.stderr:
        problems.append("Python traceback on stderr")
    doc = None
    if p.returncode == 0:
        try:
            doc = json.loads(p.stdout)
        except ValueError as e:
            problems.append(f"stdout is not JSON ({e})")
    elif p.returncode == 2:
        if len(err) != 1 or not err[0].startswith("tracekit: error: "):
            problems.append(f"exit 2 without exactly one 'tracekit: error:' line ({len(err)} lines)")
    else:
        problems.append(f"exit {p.returncode}")
    if cmd == "breakdown" and doc is not None:
        problems += check_partition(doc)
    return {"rc": p.returncode, "json": doc, "err": err, "problems": problems}


def check_partition(b: dict) -> list[str]:
    """Contract: non-null per_step_ms values sum to steps.mean_ms within 0.5%."""
    docs = b.get("ranks") or [b]
    out = []
    for d in docs:
        mean = d["steps"]["mean_ms"]
        total = sum(v for v in d["per_step_ms"].values() if v is not None)
        if mean is None or abs(total - mean) > 0.005 * abs(mean) + 1e-9:
            out.append(f"per_step_ms sums to {total:.6g} ms, steps.mean_ms is {mean}")
    return out


def reason(r: dict, trace: Path) -> str:
    """The one-line error, without its 'tracekit: error: PATH: ' prefix."""
    if r["rc"] == 0 or not r["err"]:
        return ""
    line = r["err"][-1]
    for prefix in ("tracekit: error: ", "tracekit: internal error: "):
        if line.startswith(prefix):
            line = line[len(prefix):]
    if line.startswith(f"{trace}: "):
        line = line[len(str(trace)) + 2:]
    return line


def check_trace(trace: Path) -> dict:
    runs = {cmd: run_cli(cmd, trace) for cmd in COMMANDS}
    info = runs["info"]["json"] or {}
    src = info.get("source", {}) if "ranks" not in info else info["ranks"][0].get("source", {})
    producer = src.get("format") or "?"
    if src.get("producer_version"):
        producer += f" {src['producer_version']}"
    if src.get("graph_trace_mode") not in (None, "none"):
        producer += f" (graphs: {src['graph_trace_mode']})"
    b = runs["breakdown"]["json"]
    steps = "—"
    if b is not None and "steps" in b:
        s = b["steps"]
        steps = f"{s['count']} ({s['marker']}), {s['excluded']} excluded, mean {s['mean_ms']:.3f} ms"
    warnings: list[str] = []
    for cmd in COMMANDS:
        d = runs[cmd]["json"]
        for w in (d or {}).get("warnings", []):
            if w not in warnings:
                warnings.append(w)
    problems = [f"{cmd}: {p}" for cmd in COMMANDS for p in runs[cmd]["problems"]]
    return {"trace": trace, "producer": producer, "runs": runs, "steps": steps, "warnings": warnings,
            "problems": problems}


def _md(s: str, limit: int = 300) -> str:
    from tracekit.report.safe import md

    return md(s, limit)


def _display(trace: Path) -> str:
    for base, label in ((ROOT, ""), (ROOT.parent / "shared", "../shared/")):
        try:
            return label + str(trace.resolve().relative_to(base.resolve()))
        except ValueError:
            continue
    return str(trace)


def table(rows: list[dict]) -> str:
    out = ["| file | producer / version | result | steps found | warnings |", "|---|---|---|---|---|"]
    for r in rows:
        parts = []
        for cmd in COMMANDS:
            run = r["runs"][cmd]
            rc = "hung" if run["rc"] is None else f"exit {run['rc']}"
            why = reason(run, r["trace"])
            parts.append(f"{cmd} {rc}" + (f": {_md(why, 220)}" if why else ""))
        result = "<br>".join(parts)
        if r["problems"]:
            result += "<br>**NOT CONFORMING**: " + _md("; ".join(r["problems"]), 400)
        warns = "<br>".join(f"{i + 1}. {_md(w, 200)}" for i, w in enumerate(r["warnings"])) or "—"
        out.append(f"| {_md(_display(r['trace']), 200)} | {_md(r['producer'])} | {result} | {r['steps']} | {warns} |")
    return "\n".join(out) + "\n"


def _commit() -> str:
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "tracekit"], cwd=ROOT,
                               capture_output=True, text=True).stdout.strip()
        return sha + (" (with uncommitted changes under tracekit/)" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="*", type=Path, help="trace files or directories (default: sample_traces/ "
                                                        "and ../shared/external_traces)")
    ap.add_argument("--doc", type=Path, default=None, help="also write this markdown file (with date and commit)")
    ap.add_argument("-j", "--jobs", type=int, default=max(1, (os.cpu_count() or 2)), help="traces in parallel")
    a = ap.parse_args(argv)
    traces = find_traces(a.paths or DEFAULT_DIRS)
    if not traces:
        print("no traces found", file=sys.stderr)
        return 1
    with ThreadPoolExecutor(max_workers=a.jobs) as ex:
        rows = list(ex.map(check_trace, traces))
    text = table(rows)
    bad = [r for r in rows if r["problems"]]
    n_ok = sum(1 for r in rows if all(r["runs"][c]["rc"] == 0 for c in COMMANDS))
    summary = (f"{len(rows)} traces: {len(rows) - len(bad)} conform ({n_ok} with every command exiting 0), "
               f"{len(bad)} do not.")
    print(text)
    print(summary)
    if a.doc is not None:
        today = _dt.date.today().isoformat()
        doc = (
            "# Conformance: every real trace through info, kernels, breakdown\n\n"
            f"Generated by `python tools/conformance.py --doc docs/conformance.md` on {today}, "
            f"commit {_commit()}.\n\n"
            "Each command ran as `python -m tracekit CMD --format json TRACE` in its own process. A trace conforms "
            "when every command exits 0, or exits 2 with exactly one `tracekit: error:` line and no traceback, and "
            "every breakdown that exits 0 has `per_step_ms` summing to `steps.mean_ms` within 0.5%. "
            "Exit 2 is the correct answer for a trace that cannot support a breakdown (no GPU work, no step "
            "markers): the reason is shown. Inputs: `sample_traces/` (our captures) and `../shared/external_traces` "
            "(public traces, see its PROVENANCE.md; not redistributed).\n\n"
            f"**{summary}**\n\n" + text
        )
        a.doc.write_text(doc, encoding="utf-8")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
