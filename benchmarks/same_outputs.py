#!/usr/bin/env python
"""Performance work must not change results: dump every real trace's breakdown, then compare.

    python benchmarks/same_outputs.py dump /tmp/before            # with the code before the change
    python benchmarks/same_outputs.py dump /tmp/after             # ... and after
    python benchmarks/same_outputs.py compare /tmp/before /tmp/after

``dump`` runs ``python -m tracekit breakdown --format json`` and ``--format md`` on every trace of
sample_traces/, tests/data/ and the external traces (``$TRACEKIT_EXTERNAL_TRACES`` or
../shared/external_traces; trace paths are absolute, so a checkout elsewhere, given with
``--code DIR``, reads the very same files) and stores stdout, stderr and the exit code of each.
``compare`` exits 1 and names every output that differs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
from conformance import find_traces  # noqa: E402

FORMATS = ("json", "md")


def _dirs() -> list[Path]:
    ext = Path(os.environ.get("TRACEKIT_EXTERNAL_TRACES") or ROOT.parent / "shared" / "external_traces")
    if not ext.is_dir():
        ext = Path("/work/shared/external_traces")
    return [ROOT / "sample_traces", ROOT / "tests" / "data", ext]


def _key(trace: Path, fmt: str) -> str:
    return hashlib.sha1(f"{trace}|{fmt}".encode()).hexdigest()[:16]


def dump(out: Path, code: Path, jobs: int, formats: tuple[str, ...] = FORMATS) -> None:
    out.mkdir(parents=True, exist_ok=True)
    traces = [t.resolve() for t in find_traces([d for d in _dirs() if d.exists()])]
    env = {**os.environ, "PYTHONPATH": str(code), "TRACEKIT_PROGRESS": "0", "COLUMNS": "120"}

    def one(job: tuple[Path, str]) -> dict:
        trace, fmt = job
        p = subprocess.run([sys.executable, "-m", "tracekit", "breakdown", "--format", fmt, str(trace)],
                           capture_output=True, text=True, cwd=code, env=env, timeout=600)
        rec = {"trace": str(trace), "format": fmt, "rc": p.returncode, "stdout": p.stdout, "stderr": p.stderr}
        (out / f"{_key(trace, fmt)}.json").write_text(json.dumps(rec))
        return rec

    jobs_ = [(t, f) for t in traces for f in formats]
    with ThreadPoolExecutor(jobs) as pool:
        recs = list(pool.map(one, jobs_))
    print(f"{len(recs)} outputs of {len(traces)} traces in {out}; exit codes: "
          f"{sorted({r['rc'] for r in recs})}")


def compare(a: Path, b: Path) -> int:
    bad = 0
    files = sorted(p.name for p in a.glob("*.json"))
    for name in files:
        ra = json.loads((a / name).read_text())
        if not (b / name).exists():
            print(f"missing in {b}: {ra['trace']} ({ra['format']})")
            bad += 1
            continue
        rb = json.loads((b / name).read_text())
        for k in ("rc", "stdout", "stderr"):
            if ra[k] != rb[k]:
                print(f"DIFFERENT {k}: {ra['trace']} ({ra['format']})")
                bad += 1
                break
    print(f"{len(files)} outputs compared, {bad} differ")
    return 1 if bad else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dump")
    d.add_argument("out", type=Path)
    d.add_argument("--code", type=Path, default=ROOT, help="the checkout whose tracekit runs")
    d.add_argument("--jobs", type=int, default=2)
    d.add_argument("--formats", default=",".join(FORMATS), help="comma-separated (default: json,md)")
    c = sub.add_parser("compare")
    c.add_argument("a", type=Path)
    c.add_argument("b", type=Path)
    args = ap.parse_args()
    if args.cmd == "dump":
        dump(args.out, args.code.resolve(), args.jobs, tuple(args.formats.split(",")))
        return 0
    return compare(args.a, args.b)


if __name__ == "__main__":
    sys.exit(main())
