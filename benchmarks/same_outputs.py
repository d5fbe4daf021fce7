#!/usr/bin/env python
"""A change that must not change results (a refactor, performance work): record the outputs, then compare.

    python benchmarks/same_outputs.py check --base main                 # record main and this checkout, compare
    python benchmarks/same_outputs.py record /tmp/before --commit main  # ... or step by step: a commit's outputs
    python benchmarks/same_outputs.py record /tmp/after                 # this checkout's (the working tree)
    python benchmarks/same_outputs.py compare /tmp/before /tmp/after

``record`` runs ``python -m tracekit breakdown|info|kernels TRACE --format json`` on every trace of
sample_traces/, tests/data/ and the external traces (``$TRACEKIT_EXTERNAL_TRACES`` or ../shared/external_traces),
``tracekit ceiling --format json`` on a list of models, GPUs and flags, and a list of bad inputs (their one-line
error and exit code), and stores stdout, stderr and the exit code of each (run in-process by ``--jobs`` workers, through click's test
runner; ``--subprocesses``: one ``python -m tracekit`` each, slower). The code that runs is this checkout, a
checkout elsewhere (``--code DIR``) or a commit (``--commit REV``: ``git archive`` of it into a temporary folder).
Trace paths are absolute, so every side reads the very same files. ``--traces samples`` keeps to the bundled
samples and tests/data (the slow test's subset). ``compare`` exits 1 and names every output that differs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
from conformance import find_traces  # noqa: E402

TRACE_COMMANDS = ("breakdown", "info", "kernels")
CONFIGS = ROOT / "tests" / "data" / "configs"
# tracekit ceiling: a GPU from the table, every way to give the weights, the KV and draft terms, and the flags
CEILING = (
    ["--gpu", "H200", "--params", "8e9"],
    ["--gpu", "RTX A6000", "--params", "27e9", "--dtype", "fp8", "--tp", "2", "--accept-len", "3.2",
     "--measured-tok-s", "55"],
    ["--gpu", "H100", "--weight-bytes", "16GB", "--kv-bytes-per-token", "128KiB", "--context", "8192",
     "--batch", "8"],
    ["--peak-bw", "3350", "--peak-tflops", "989", "--weight-bytes", "70e9", "--tp", "4"],
    ["--gpu", "H200", "--model", str(CONFIGS / "Llama-3.1-8B.json"), "--batch", "16", "--context", "4096"],
    ["--gpu", "H200", "--model", str(CONFIGS / "Qwen3-30B-A3B.json"), "--tp", "2", "--ep", "2"],
    ["--gpu", "B200", "--model", str(CONFIGS / "DeepSeek-V3.json"), "--tp", "8", "--draft-forwards", "1",
     "--accept-len", "1.8", "--kv-dtype", "fp8", "--context", "16384"],
    ["--gpu", "H200", "--model", str(CONFIGS / "Qwen3-Next-80B-A3B-Instruct.json"), "--dtype", "fp8"],
    ["--gpu", "H200", "--params", "8e9", "--draft-bytes", "1e9", "--draft-forwards", "3", "--draft-replicated",
     "--tp", "2", "--accept-len", "2.5"],
)
# bad input: one line on stderr and exit 2, the same words before and after
BAD = (
    ["breakdown", "/nonexistent/trace.sqlite"],
    ["breakdown", str(ROOT / "tests" / "data")],
    ["breakdown", str(ROOT / "README.md")],
    ["breakdown", str(ROOT / "tests" / "data" / "nsys" / "nsysai_mock_2026.1.sqlite"), "--phase", "nope"],
    ["breakdown", str(ROOT / "tests" / "data" / "nsys" / "nsysai_mock_2026.1.sqlite"), "--measured-step-ms", "3",
     "--measured-tok-s", "5"],
    ["breakdown", str(ROOT / "tests" / "data" / "nsys" / "nsysai_mock_2026.1.sqlite"), "--step-range", "("],
    ["breakdown", str(ROOT / "tests" / "data" / "nsys" / "nsysai_mock_2026.1.sqlite"), "--model", "/nonexistent"],
    ["breakdown", str(ROOT / "tests" / "data" / "nsys" / "nsysai_mock_2026.1.sqlite"), "--device", "7"],
    ["breakdown", str(ROOT / "tests" / "data" / "nsys" / "nsysai_mock_2026.1.sqlite"), "--rules", "/nonexistent"],
    ["ceiling", "--gpu", "H200"],
    ["ceiling", "--gpu", "H200", "--params", "8e9", "--weight-bytes", "1e9"],
    ["ceiling", "--gpu", "NoSuchGPU", "--params", "8e9"],
    ["ceiling", "--gpu", "H200", "--params", "8e9", "--draft-bytes", "1e9"],
    ["ceiling", "--gpu", "H200", "--params", "8e9", "--tp", "0"],
    ["ceiling", "--gpu", "H200", "--model", str(CONFIGS / "README.md")],
    ["breakdown", str(ROOT / "tests" / "data" / "nsys" / "nsysai_mock_2026.1.sqlite"), "--model",
     str(ROOT / "tests" / "data" / "nsys")],
    ["diff", str(ROOT / "README.md"), str(ROOT / "README.md")],
)


def _dirs(traces: str) -> list[Path]:
    dirs = [ROOT / "sample_traces", ROOT / "tests" / "data"]
    if traces == "all":
        ext = Path(os.environ.get("TRACEKIT_EXTERNAL_TRACES") or ROOT.parent / "shared" / "external_traces")
        if not ext.is_dir():
            ext = Path("/work/shared/external_traces")
        dirs.append(ext)
    return [d for d in dirs if d.exists()]


def runs(traces: str = "all", commands: tuple[str, ...] = (*TRACE_COMMANDS, "ceiling", "bad")) -> list[list[str]]:
    """The command lines ``record`` runs (``tracekit`` arguments)."""
    out = []
    paths = [str(t.resolve()) for t in find_traces(_dirs(traces))]
    for cmd in TRACE_COMMANDS:
        if cmd in commands:
            out += [[cmd, p, "--format", "json"] for p in paths]
    if "ceiling" in commands:
        out += [["ceiling", *a, "--format", "json"] for a in CEILING]
    if "bad" in commands:
        out += [list(a) for a in BAD]
    return out


def _key(args: list[str]) -> str:
    return hashlib.sha1("|".join(args).encode()).hexdigest()[:16]


def checkout(rev: str, into: Path) -> Path:
    """``rev``'s files (``git archive``) under ``into``: the code a record runs."""
    into.mkdir(parents=True, exist_ok=True)
    blob = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", rev, "tracekit", "tools"],
                          capture_output=True, check=True).stdout
    tar = into / "code.tar"
    tar.write_bytes(blob)
    with tarfile.open(tar) as t:
        t.extractall(into, filter="data")
    tar.unlink()
    return into


def _worker(out: Path) -> None:
    """Run the command lines read from stdin (a JSON list) in this process, with the tracekit on ``sys.path`` (the
    side's code: PYTHONPATH), through click's test runner: imports once, not once per output."""
    from click.testing import CliRunner

    import tracekit
    from tracekit.cli import cli

    runner = CliRunner()
    for args in json.loads(sys.stdin.read()):
        r = runner.invoke(cli, args, env={"COLUMNS": "120", "TRACEKIT_PROGRESS": "0"})
        rec = {"args": args, "rc": r.exit_code, "stdout": r.stdout, "stderr": r.stderr}
        (out / f"{_key(args)}.json").write_text(json.dumps(rec))
    print(tracekit.__file__)


def record(out: Path, code: Path, jobs: int, traces: str = "all",
           commands: tuple[str, ...] = (*TRACE_COMMANDS, "ceiling", "bad"), subprocesses: bool = False) -> None:
    """The outputs of :func:`runs` with the tracekit in ``code``, one JSON file each in ``out``: by ``jobs`` worker
    processes that each run their share in-process (``subprocesses``: one ``python -m tracekit`` per output, as a
    user runs it; slower)."""
    out.mkdir(parents=True, exist_ok=True)
    todo = runs(traces, commands)
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "PYTHONPATH": str(code), "TRACEKIT_PROGRESS": "0", "COLUMNS": "120",
               "TRACEKIT_CACHE": os.environ.get("TRACEKIT_CACHE", cache)}
        env.pop("TRACEKIT_DEBUG", None)

        def one(args: list[str]) -> None:
            p = subprocess.run([sys.executable, "-m", "tracekit", *args], capture_output=True, text=True,
                               cwd=code, env=env, timeout=600)
            rec = {"args": args, "rc": p.returncode, "stdout": p.stdout, "stderr": p.stderr}
            (out / f"{_key(args)}.json").write_text(json.dumps(rec))

        def share(part: list[list[str]]) -> None:
            p = subprocess.run([sys.executable, __file__, "_worker", str(out)], input=json.dumps(part),
                               capture_output=True, text=True, cwd=code, env=env)
            where = p.stdout.strip().splitlines()[-1:] or ["?"]
            if p.returncode != 0 or not where[0].startswith(str(code)):
                raise SystemExit(f"worker failed (rc {p.returncode}, tracekit from {where[0]}): {p.stderr[-2000:]}")

        with ThreadPoolExecutor(jobs) as pool:
            if subprocesses:
                list(pool.map(one, todo))
            else:
                list(pool.map(share, [todo[i::jobs] for i in range(jobs)]))
    rcs = sorted({json.loads((out / f"{_key(a)}.json").read_text())["rc"] for a in todo})
    print(f"{len(todo)} outputs in {out} (code: {code}); exit codes: {rcs}")


def compare(a: Path, b: Path) -> int:
    bad = 0
    files = sorted(p.name for p in a.glob("*.json"))
    for name in files:
        ra = json.loads((a / name).read_text())
        what = " ".join(ra.get("args") or [ra.get("trace", "?"), ra.get("format", "")])
        if not (b / name).exists():
            print(f"missing in {b}: {what}")
            bad += 1
            continue
        rb = json.loads((b / name).read_text())
        for k in ("rc", "stdout", "stderr"):
            if ra[k] != rb[k]:
                print(f"DIFFERENT {k}: {what}")
                bad += 1
                break
    print(f"{len(files)} outputs compared, {bad} differ")
    return 1 if bad else 0


def check(base: str, jobs: int, traces: str, commands: tuple[str, ...], subprocesses: bool = False) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        record(tmp / "base", checkout(base, tmp / "code"), jobs, traces, commands, subprocesses)
        record(tmp / "head", ROOT, jobs, traces, commands, subprocesses)
        return compare(tmp / "base", tmp / "head")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record", aliases=["dump"])
    r.add_argument("out", type=Path)
    code = r.add_mutually_exclusive_group()
    code.add_argument("--code", type=Path, default=ROOT, help="the checkout whose tracekit runs")
    code.add_argument("--commit", help="the commit whose tracekit runs (git archive into a temporary folder)")
    k = sub.add_parser("check")
    k.add_argument("--base", required=True, help="the commit to compare this checkout with")
    for p in (r, k):
        p.add_argument("--jobs", type=int, default=2)
        p.add_argument("--traces", choices=("all", "samples"), default="all")
        p.add_argument("--commands", default=",".join((*TRACE_COMMANDS, "ceiling", "bad")),
                       help="comma-separated (default: breakdown,info,kernels,ceiling,bad)")
        p.add_argument("--subprocesses", action="store_true",
                       help="one `python -m tracekit` per output (as a user runs it) instead of in-process workers")
    c = sub.add_parser("compare")
    c.add_argument("a", type=Path)
    c.add_argument("b", type=Path)
    if sys.argv[1:2] == ["_worker"]:
        _worker(Path(sys.argv[2]))
        return 0
    args = ap.parse_args()
    if args.cmd == "compare":
        return compare(args.a, args.b)
    commands = tuple(args.commands.split(","))
    if args.cmd == "check":
        return check(args.base, args.jobs, args.traces, commands, args.subprocesses)
    if args.commit:
        with tempfile.TemporaryDirectory() as tmp:
            record(args.out, checkout(args.commit, Path(tmp)), args.jobs, args.traces, commands, args.subprocesses)
    else:
        record(args.out, args.code.resolve(), args.jobs, args.traces, commands, args.subprocesses)
    return 0


if __name__ == "__main__":
    sys.exit(main())
