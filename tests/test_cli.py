"""The command line: exit codes, one-line errors, every format (contract: Exit codes)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from conftest import DATA, shared
from tracekit.cli import cli

MFU = str(DATA / "nsys" / "nsysai_mfu_2gpu_before_2026.2.sqlite")


def run(*args):
    r = CliRunner().invoke(cli, list(args))
    return r.exit_code, r.stdout, r.stderr


def assert_one_line_error(code, err, needle=""):
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("tracekit: error: ")
    assert "Traceback" not in err
    assert needle in lines[0]


@pytest.mark.parametrize("args,needle", [
    (["info", "/nonexistent/trace.sqlite"], "no such file"),
    (["info"], "Missing argument"),
    (["breakdown", MFU, "--format", "xml"], "xml"),
    (["breakdown", MFU, "--peak-bw", "-3"], "peak-bw"),
    (["breakdown", MFU, "--step-range", "(unclosed"], "invalid regular expression"),
    (["breakdown", MFU, "--step-range", "^no such range$"], "--step-range"),
    (["breakdown", MFU, "--device", "7"], "--device 7"),
    (["nosuchcommand"], "nosuchcommand"),
])
def test_usage_and_input_errors_are_one_line_exit_2(args, needle):
    code, _, err = run(*args)
    assert_one_line_error(code, err, needle)


def test_not_a_trace(tmp_path):
    p = tmp_path / "notes.txt"
    p.write_text("hello")
    code, _, err = run("info", str(p))
    assert_one_line_error(code, err, "not a trace")


def test_breakdown_without_gpu_activity_exits_2_info_exits_0():
    qcu = str(shared("qcu/report1.sqlite"))
    code, out, _ = run("info", qcu, "--format", "json")
    assert code == 0
    d = json.loads(out)
    assert d["counts"]["kernels"] == 0 and any("no GPU activity" in w for w in d["warnings"])
    code, _, err = run("breakdown", qcu)
    assert_one_line_error(code, err, "no GPU activity")


def test_info_json_contract_keys():
    code, out, _ = run("info", MFU, "--format", "json")
    assert code == 0
    d = json.loads(out)
    assert d["schema"] == "tracekit.info/1"
    assert set(d) == {"schema", "source", "gpus", "counts", "range_names", "warnings"}
    assert set(d["counts"]) == {"kernels", "memops", "launches", "ranges"}
    assert set(d["source"]) >= {"path", "format", "producer_version", "graph_trace_mode"}
    for r in d["range_names"]:
        assert set(r) == {"pattern", "regex", "count"}


@pytest.mark.parametrize("fmt", ["table", "md", "json", "csv"])
def test_every_format_of_every_analysis_command(fmt, tmp_path):
    for cmd in ("kernels", "breakdown"):
        out_file = tmp_path / f"{cmd}.{fmt}"
        code, out, err = run(cmd, MFU, "--format", fmt, "-o", str(out_file))
        assert code == 0, err
        assert out_file.read_text().strip()
    if fmt != "csv":
        code, out, err = run("info", MFU, "--format", fmt)
        assert code == 0 and out.strip(), err


def test_kernels_totals_equal_plain_sql_sum():
    import sqlite3

    con = sqlite3.connect(f"file:{MFU}?mode=ro", uri=True)
    total_ns = con.execute("SELECT sum(end - start) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    n = con.execute("SELECT count(DISTINCT demangledName) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    code, out, _ = run("kernels", MFU, "--format", "json")
    d = json.loads(out)
    assert len(d["kernels"]) == n
    assert sum(k["total_ms"] for k in d["kernels"]) == pytest.approx(total_ns / 1e6)
    assert sum(k["share"] for k in d["kernels"]) == pytest.approx(1.0)
    code, out, _ = run("kernels", MFU, "--format", "json", "--top", "3")
    assert len(json.loads(out)["kernels"]) == 3


def test_debug_shows_traceback_for_internal_errors(monkeypatch):
    import tracekit.analyses.info as info_mod

    def boom(*a, **k):
        raise RuntimeError("boom")

    monkeypatch.setattr(info_mod, "info", boom)
    code, _, err = run("info", MFU)
    assert code == 1 and err.strip().startswith("tracekit: internal error: RuntimeError: boom")
    assert len(err.strip().splitlines()) == 1
