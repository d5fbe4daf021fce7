"""What a short command costs: the small-export path of the nsys reader imports neither pyarrow nor ADBC.

(Timings live in benchmarks/startup.py and docs/performance.md; this file pins the import choices they rely on.)
"""

from __future__ import annotations

import subprocess
import sys

import pytest

import tracekit.readers.nsys.reader as nsys

from conftest import DATA, ROOT, sample

MFU = DATA / "nsys" / "nsysai_mfu_2gpu_before_2026.2.sqlite"


def test_small_exports_read_with_plain_sqlite3(monkeypatch):
    monkeypatch.delenv("TRACEKIT_SQLITE_ENGINES", raising=False)
    assert MFU.stat().st_size < nsys._Db.SMALL_FILE_BYTES
    assert nsys._Db.default_engines(MFU) == ("sqlite3",)
    monkeypatch.setattr(nsys._Db, "SMALL_FILE_BYTES", 1000)  # as if the export were large
    assert nsys._Db.default_engines(MFU) == nsys._Db.ENGINES


@pytest.mark.slow
def test_breakdown_of_a_small_export_imports_no_arrow():
    path = sample("hf-small-eager/trace.sqlite")
    code = ("import sys, io, contextlib\nfrom tracekit.cli import cli\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            f"    try:\n        cli.main(args=['breakdown', r'{path}', '--format', 'json'])\n"
            "    except SystemExit as e:\n        code = e.code\n"
            "print(code, sorted(m for m in ('pyarrow', 'adbc_driver_sqlite', 'connectorx', 'matplotlib', 'rich') "
            "if m in sys.modules))")
    env = {k: v for k, v in __import__("os").environ.items() if k != "TRACEKIT_SQLITE_ENGINES"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env)
    assert out.stdout.split("\n")[-2] == "0 []", out.stderr


def test_command_line_start_imports_only_what_it_needs():
    """Before a command runs (``import tracekit.cli``): no polars, pyarrow or numpy, and of the model package only
    the units table the options need (tracekit.model imports each name when first asked for)."""
    code = ("import sys, tracekit.cli, tracekit.model\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('polars', 'pyarrow', 'numpy', 'rich') "
            "or m.startswith('tracekit.model')))\n"
            "from tracekit.model import parse_command, step_bytes\n"
            "print(parse_command.__module__, step_bytes.__module__, 'parse_command' in dir(tracekit.model))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.stdout.splitlines() == ["['tracekit.model', 'tracekit.model.units']",
                                       "tracekit.model.discover tracekit.model.step True"], out.stderr
