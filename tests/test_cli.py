"""The command line: exit codes, one-line errors, every format (contract: Exit codes)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from tracekit.cli import cli

from conftest import DATA, shared

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


# ───────────────────────── rough edges (issue 19) ─────────────────────────

def test_debug_after_the_subcommand_is_the_debug_flag(monkeypatch):
    code, out, err = run("breakdown", MFU, "--format", "json", "--debug")
    assert code == 0 and json.loads(out)["steps"]["count"] == 15, err  # 16 inferred steps, the last excluded
    import tracekit.analyses.info as info_mod

    def boom(*a, **k):
        raise RuntimeError("boom")

    monkeypatch.setattr(info_mod, "info", boom)
    r = CliRunner().invoke(cli, ["info", MFU, "--debug"])
    assert isinstance(r.exception, RuntimeError)  # raised for its traceback, not turned into one line
    r = CliRunner().invoke(cli, ["info", "/nonexistent/t.sqlite", "--debug"])
    assert type(r.exception).__name__ == "TracekitError"
    code, _, err = run("info", "/nonexistent/t.sqlite", "--", "--debug")  # after `--` it is an argument
    assert code == 2


@pytest.mark.parametrize("cmd,fmt", [("breakdown", "table"), ("breakdown", "md"), ("breakdown", "json"),
                                     ("kernels", "table"), ("info", "md")])
def test_output_cut_by_a_closed_pipe_exits_0(cmd, fmt):
    """`tracekit breakdown T | head -1`: the reader closes the pipe; tracekit exits 0, silently."""
    import subprocess
    import sys

    p = subprocess.Popen([sys.executable, "-m", "tracekit", cmd, MFU, "--format", fmt], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    p.stdout.close()  # before tracekit writes its first byte
    err = p.stderr.read()
    assert p.wait() == 0 and err == b""


def test_breakdown_table_starts_with_its_headline_not_the_command_line():
    code, out, _ = run("breakdown", MFU, "--format", "json")
    headline_md = run("breakdown", MFU, "--format", "md")[1].splitlines()[0]
    code, out, _ = run("breakdown", MFU)
    first = out.splitlines()[0]
    assert code == 0 and not first.startswith("tracekit")
    assert headline_md == f"### tracekit: {first.strip()}"
    assert f"trace {MFU}" in out


def test_both_measured_flags_are_exit_2_and_byte_amounts_parse():
    code, _, err = run("breakdown", MFU, "--measured-step-ms", "20", "--measured-tok-s", "48")
    assert_one_line_error(code, err, "not both")
    code, _, err = run("breakdown", MFU, "--weight-bytes", "27B")
    assert_one_line_error(code, err, "ambiguous")  # bytes or billions? (27GB or 27e9 say which)
    b = {w: json.loads(run("breakdown", MFU, "--format", "json", "--weight-bytes", w)[1])["roofline"]
         for w in ("27e9", "27GB", "25.1GiB", "512MiB")}
    assert b["27e9"]["weight_bytes_per_step"] == b["27GB"]["weight_bytes_per_step"] == 27_000_000_000
    assert b["25.1GiB"]["weight_bytes_per_step"] == round(25.1 * 2**30)
    assert b["512MiB"]["weight_bytes_per_step"] == 512 * 2**20 and b["512MiB"]["weight_bytes_source"] == "flag"


@pytest.mark.parametrize("rel,name,bw", [
    ("TraceLens/tests/traces/b200/eager_trace.json.gz", "NVIDIA B200", 8000.0),
    ("TraceLens/evals/unit_tests_nv/moe/moe_01_many_experts_few_tokens_analysis_output/"
     "moe_01_many_experts_few_tokens.json.gz", "NVIDIA B300 SXM6 AC", 8000.0),
])
def test_info_shows_the_gpu_tables_peak_bandwidth_for_kineto_traces(rel, name, bw):
    """Kineto records no memory clock: info takes the GPU table's figure, as breakdown does (datasheets:
    B200 and B300 8 TB/s HBM3e)."""
    code, out, _ = run("info", str(shared(rel)), "--format", "json")
    g = json.loads(out)["gpus"][0]
    assert (g["name"], g["peak_bw_gbps"], g["peak_bw_source"]) == (name, bw, "table")
    code, out, _ = run("info", str(shared(rel)), "--format", "md")
    assert f"| {name} | 8,000 |" in out


def test_info_peak_bandwidth_for_our_h200_kineto_capture_matches_breakdown():
    from conftest import sample

    path = str(sample("hf-small-eager-torch/trace.json.gz"))
    g = json.loads(run("info", path, "--format", "json")[1])["gpus"][0]
    assert (g["name"], g["peak_bw_gbps"], g["peak_bw_source"]) == ("NVIDIA H200", 4800.0, "table")
    nsys = json.loads(run("info", str(sample("hf-small-eager/trace.sqlite")), "--format", "json")[1])["gpus"][0]
    assert nsys["peak_bw_source"] == "trace"  # nsys records the memory clock and bus width
