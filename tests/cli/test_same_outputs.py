"""benchmarks/same_outputs.py: a change that must not change results (a refactor) records every JSON output at a
base commit and at this checkout and compares them byte for byte."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT

SCRIPT = ROOT / "benchmarks" / "same_outputs.py"
BASE = os.environ.get("TRACEKIT_SAME_OUTPUTS_BASE")


def _record(d, args, rc=0, stdout="{}", stderr=""):
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        from same_outputs import _key
    finally:
        sys.path.remove(str(SCRIPT.parent))
    d.mkdir(exist_ok=True)
    (d / f"{_key(args)}.json").write_text(json.dumps({"args": args, "rc": rc, "stdout": stdout, "stderr": stderr}))


def test_compare_names_every_output_that_differs(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        _record(d, ["info", "t.sqlite", "--format", "json"])
    _record(a, ["breakdown", "t.sqlite", "--format", "json"], stdout='{"x": 1}')
    _record(b, ["breakdown", "t.sqlite", "--format", "json"], stdout='{"x": 2}')
    _record(a, ["ceiling", "--gpu", "H200"], rc=2, stderr="tracekit: error: give exactly one of ...\n")
    _record(b, ["ceiling", "--gpu", "H200"], rc=2, stderr="tracekit: error: something else\n")
    out = subprocess.run([sys.executable, str(SCRIPT), "compare", str(a), str(b)], capture_output=True, text=True)
    assert out.returncode == 1, out.stderr
    assert "DIFFERENT stdout: breakdown t.sqlite --format json" in out.stdout
    assert "DIFFERENT stderr: ceiling --gpu H200" in out.stdout
    assert out.stdout.strip().splitlines()[-1] == "3 outputs compared, 2 differ"
    same = subprocess.run([sys.executable, str(SCRIPT), "compare", str(a), str(a)], capture_output=True, text=True)
    assert same.returncode == 0 and "0 differ" in same.stdout


def test_the_runs_cover_every_trace_command_ceiling_and_bad_input():
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        from same_outputs import BAD, CEILING, TRACE_COMMANDS, runs
    finally:
        sys.path.remove(str(SCRIPT.parent))
    got = runs("samples")
    traces = {a[1] for a in got if a[0] == "info"}
    per_trace = got[:len(TRACE_COMMANDS) * len(traces)]
    assert len(traces) >= 20 and all(a[0] in TRACE_COMMANDS and a[-2:] == ["--format", "json"] for a in per_trace)
    assert {a[0] for a in got} >= {"breakdown", "info", "kernels", "ceiling"}
    assert len(got) == 3 * len(traces) + len(CEILING) + len(BAD)


@pytest.mark.slow
@pytest.mark.skipif(not BASE, reason="set TRACEKIT_SAME_OUTPUTS_BASE=REV (e.g. main) to compare this checkout's "
                                     "outputs with that commit's")
def test_outputs_are_those_of_the_base_commit():
    """Every breakdown/info/kernels JSON of the samples and tests/data, ceiling's JSON and the bad inputs' one-line
    errors are byte-identical to those of ``$TRACEKIT_SAME_OUTPUTS_BASE`` (a refactor's check; the shared traces
    too: ``python benchmarks/same_outputs.py check --base REV``)."""
    out = subprocess.run([sys.executable, str(SCRIPT), "check", "--base", BASE, "--traces", "samples"],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
