"""Conformance over the traces the repository carries (tests/data and sample_traces/).

Every trace through ``info``, ``kernels`` and ``breakdown`` (real CLI, in-process): exit 0, or
exit 2 with exactly one ``tracekit: error:`` line and no traceback; a breakdown that exits 0
has ``per_step_ms`` non-null values summing to ``steps.mean_ms`` within 0.5%. Our own captures
in sample_traces/ carry step markers, so for them every command must succeed.
tools/conformance.py runs the same over ../shared/external_traces too, in subprocesses
(docs/conformance.md); its own logic is smoke-tested here on one small trace.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from _robust import assert_clean, run_cli
from conftest import DATA, ROOT, SAMPLES

# The validation sweeps are the slow tier (`python -m pytest -m slow`; .ci/run runs them after the fast tier).
pytestmark = pytest.mark.slow

SUFFIXES = (".sqlite", ".sqlite.gz", ".json", ".json.gz")


def _traces():
    out = []
    for base in (DATA, SAMPLES):
        if base.is_dir():
            out += sorted(p for p in base.rglob("*") if p.is_file() and p.name.endswith(SUFFIXES)
                          and p.name not in ("manifest.json", "index.json", "device_profile.json", "results.json")
                          and DATA / "configs" not in p.parents  # model config.json files, not traces
                          and DATA / "saved" not in p.parents  # results saved by tracekit, not traces
                          and "h200_checkpoints" not in p.parts)
    return out


TRACES = _traces()


@pytest.mark.parametrize("trace", TRACES, ids=[str(p.relative_to(ROOT)) for p in TRACES])
def test_every_trace_conforms(trace):
    ours = SAMPLES in trace.parents
    for cmd in ("info", "kernels", "stats", "breakdown"):
        args = [cmd, "--format", "json", trace]
        res = run_cli(args, timeout=120)
        doc = assert_clean(res, args)  # breakdown exit 0: partition and sanity checked there
        if cmd in ("info", "kernels", "stats"):
            assert res.exit_code == 0, f"{cmd} must read every readable trace: {res.stderr}"
        if ours:
            assert res.exit_code == 0, f"{trace}: {cmd}: {res.stderr}"
        if cmd == "breakdown" and doc is not None:
            assert doc["source"]["path"] == str(trace)


def test_conformance_script_smoke(tmp_path):
    """tools/conformance.py on two copies: one that conforms with exit 2 (no steps), one with exit 0."""
    import shutil

    for name in ("nsys/nsysai_mock_2026.1.sqlite", "kineto/hta_rocm_mi250.json.gz"):
        shutil.copyfile(DATA / name, tmp_path / name.split("/")[1])
    doc = tmp_path / "conformance.md"
    p = subprocess.run([sys.executable, str(ROOT / "tools" / "conformance.py"), str(tmp_path), "--doc", str(doc)],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert p.returncode == 0, p.stdout + p.stderr
    text = doc.read_text(encoding="utf-8")
    assert "| file | producer / version | result | steps found | warnings |" in text
    assert "breakdown exit 2: " in text and "no decode steps found" in text
    assert "2 traces: 2 conform" in text
    rows = [ln for ln in text.splitlines() if ln.startswith("| ") and ("nsysai" in ln or "hta" in ln)]
    assert len(rows) == 2
    assert "mock" not in text.split("breakdown exit 2: ", 1)[1].split("|", 1)[0]  # the reason, without the path
