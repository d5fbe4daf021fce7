"""The shape the architecture promises: analyses and reports never touch readers; the analyzer never imports
torch; `tracekit capture` runs where polars is absent (the GPU host)."""

from __future__ import annotations

import ast
import subprocess
import sys

from conftest import ROOT

PKG = ROOT / "tracekit"


def imports_of(path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.module


def test_analyses_and_reports_never_import_readers():
    offenders = [(p.relative_to(ROOT), m) for sub in ("analyses", "report") for p in (PKG / sub).glob("*.py")
                 for m in imports_of(p) if m.startswith("tracekit.readers")]
    assert offenders == []


def test_no_torch_in_the_analyzer():
    offenders = [(p.relative_to(ROOT), m) for p in PKG.rglob("*.py") for m in imports_of(p)
                 if m.split(".")[0] in ("torch", "nvtx")]
    assert offenders == []
    code = ("import sys, tracekit; from tracekit.cli import cli; from click.testing import CliRunner; "
            f"r = CliRunner().invoke(cli, ['breakdown', r'{ROOT / 'tests/data/nsys/nsysai_mock_2026.1.sqlite'}', "
            "'--step-range', '.', '--format', 'json']); "
            "print(r.exit_code, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT).stdout.split()
    assert out[-1] == "False"


def test_capture_runs_without_polars():
    code = ("import sys; sys.modules['polars'] = None; from tracekit.cli import cli; "
            "from click.testing import CliRunner; r = CliRunner().invoke(cli, ['capture', '--help']); "
            "print(r.exit_code, 'polars' in sys.modules and sys.modules['polars'] is not None)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.stdout.split() == ["0", "False"], out.stderr
