"""The command line: exit codes, one-line errors, every format (contract: Exit codes)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from tracekit.cli import cli

from conftest import DATA, sample_trace, shared

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
    assert set(d) == {"schema", "source", "gpus", "counts", "range_names", "step_candidates", "warnings"}
    assert set(d["counts"]) == {"kernels", "memops", "launches", "ranges"}
    assert set(d["source"]) >= {"path", "format", "producer_version", "graph_trace_mode"}
    for r in d["range_names"]:
        assert set(r) == {"pattern", "regex", "count"}
    for r in d["step_candidates"]:  # (extension) ranked by the GPU time their ranges enclose
        assert set(r) == {"pattern", "regex", "count", "gpu_share"} and 0 < r["gpu_share"] <= 1


@pytest.mark.parametrize("fmt", ["table", "md", "json", "csv"])
@pytest.mark.slow
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
    import tracekit.results.info as info_mod

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
    import tracekit.results.info as info_mod

    def boom(*a, **k):
        raise RuntimeError("boom")

    monkeypatch.setattr(info_mod, "info", boom)
    r = CliRunner().invoke(cli, ["info", MFU, "--debug"])
    assert isinstance(r.exception, RuntimeError)  # raised for its traceback, not turned into one line
    r = CliRunner().invoke(cli, ["info", "/nonexistent/t.sqlite", "--debug"])
    assert r.exit_code == 2 and "Traceback" in r.stderr and "errors.UnreadableTrace: " in r.stderr  # traceback (the named error), same exit code
    assert r.stderr.strip().splitlines()[-1].startswith("tracekit: error: ")
    code, _, err = run("info", "/nonexistent/t.sqlite", "--", "--debug")  # after `--` it is an argument
    assert code == 2


@pytest.mark.parametrize("cmd,fmt", [("breakdown", "table"), ("breakdown", "md"), ("breakdown", "json"),
                                     ("kernels", "table"), ("info", "md")])
@pytest.mark.slow
def test_output_cut_by_a_closed_pipe_exits_0(cmd, fmt):
    """`tracekit breakdown T | head -1`: the reader closes the pipe; tracekit exits 0, silently."""
    import subprocess
    import sys

    p = subprocess.Popen([sys.executable, "-m", "tracekit", cmd, MFU, "--format", fmt], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    p.stdout.close()  # before tracekit writes its first byte
    err = p.stderr.read()
    assert p.wait() == 0 and err == b""


@pytest.mark.slow
def test_breakdown_table_starts_with_its_headline_not_the_command_line():
    code, out, _ = run("breakdown", MFU, "--format", "json")
    headline_md = run("breakdown", MFU, "--format", "md")[1].splitlines()[0]
    code, out, _ = run("breakdown", MFU)
    first = out.splitlines()[0]
    assert code == 0 and not first.startswith("tracekit")
    assert headline_md == f"### tracekit: {first.strip()}"
    assert f"trace {MFU}" in out


@pytest.mark.slow
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
    ("lora_perf_lora_profile/runs/Qwen3-30B-A3B-Instruct-2507-BF16-expert_shared-20260609-133913/current_base_lora/"
     "profile/base/bs16-TP-0.trace.json.gz", "NVIDIA GB300", 8000.0),   # SGLang's GB300 rank file: 8 TB/s HBM3e
])
@pytest.mark.slow
def test_info_shows_the_gpu_tables_peak_bandwidth_for_kineto_traces(rel, name, bw):
    """Kineto records no memory clock: info takes the GPU table's figure, as breakdown does (datasheets:
    B200, B300 and GB300 8 TB/s HBM3e)."""
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


# ──────────────── the rough edges of issue 19, each as a user meets it: a real process on a real sample ────────────────

EAGER = "sample_traces/hf-small-eager/trace.sqlite"  # the README's first command


def _tracekit(*args, env=None):
    import os
    import subprocess
    import sys

    from conftest import ROOT

    return subprocess.run([sys.executable, "-m", "tracekit", *args], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "COLUMNS": "100", **(env or {})})


@pytest.mark.slow
def test_breakdown_debug_is_the_same_output_with_no_traceback_noise():
    """`breakdown T --debug` (either place on the line) exits 0 with the same stdout and nothing on stderr: --debug
    only changes what an error looks like, and click's own traceback is never printed for a successful run."""
    plain = _tracekit("breakdown", EAGER, "--format", "md")
    for args in (("breakdown", EAGER, "--format", "md", "--debug"), ("--debug", "breakdown", EAGER, "--format", "md")):
        r = _tracekit(*args)
        assert (r.returncode, r.stderr) == (0, ""), r.stderr
        assert r.stdout == plain.stdout
    r = _tracekit("breakdown", EAGER, "--step-range", "^nothing$", "--debug")  # an input error under --debug:
    assert r.returncode == 2 and "Traceback" in r.stderr  # its traceback, its one line, and still exit 2
    assert r.stderr.strip().splitlines()[-1].startswith(f"tracekit: error: {EAGER}: no range matches --step-range")
    r = _tracekit("breakdown", EAGER, "--format", "xml", "--debug")  # a usage error: click's internals are noise
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("cmd", [f"breakdown {EAGER}", f"breakdown {EAGER} --format md", f"kernels {EAGER}",
                                 f"kernels {MFU} --format csv", f"info {EAGER}"])
@pytest.mark.slow
def test_piped_into_head_exits_0(cmd):
    """`tracekit breakdown T | head -1` under `set -o pipefail`: tracekit's own exit status is 0 and it prints nothing
    to stderr (as `kernels | head` always did)."""
    import os
    import subprocess
    import sys

    from conftest import ROOT

    r = subprocess.run(["bash", "-c", f"set -o pipefail; {sys.executable} -m tracekit {cmd} | head -1"],
                       capture_output=True, text=True, cwd=ROOT, env={**os.environ, "COLUMNS": "100"})
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert len(r.stdout.splitlines()) == 1


@pytest.mark.slow
def test_breakdown_stdout_starts_with_the_headline_not_the_command_line():
    r = _tracekit("breakdown", EAGER)
    d = json.loads(_tracekit("breakdown", EAGER, "--format", "json").stdout)
    first = r.stdout.splitlines()[0]
    assert r.returncode == 0 and "tracekit breakdown" not in r.stdout and "python" not in first
    assert " ".join(r.stdout.split("\ntrace ")[0].split()).startswith(d["headline"])


@pytest.mark.slow
def test_markdown_keeps_quotes_literally_and_stays_injection_safe():
    """Quotes are plain text in markdown (`profiler's`, `'grammar_mask'`, never `&#x27;`); what could open a
    tag or a table cell is still escaped."""
    from tracekit.report import safe

    md = _tracekit("breakdown", EAGER, "--format", "md").stdout
    assert "&#x27;" not in md and "&quot;" not in md
    assert "shares of the traced step include the profiler's own overhead" in md
    # a gap named by the host range covering it (serve-small-graph: the injected 'grammar_mask' stall)
    md = _tracekit("breakdown", sample_trace("serve-small-graph"), "--format", "md").stdout
    assert "&#x27;" not in md and "&quot;" not in md
    assert "while the host was in range 'grammar\\_mask'" in md
    assert safe.md("it's <script>alert('x')</script> | x") == "it's &lt;script&gt;alert('x')&lt;/script&gt; \\| x"


@pytest.mark.slow
def test_plot_title_and_history_md_name_the_capture_not_just_trace_sqlite(tmp_path):
    """Every capture names its file trace.sqlite: the plot's title and `history --format md` show the folder too."""
    import re

    out = tmp_path / "p.html"
    assert _tracekit("plot", EAGER, "-o", str(out)).returncode == 0
    assert "<title>tracekit plot: hf-small-eager/trace.sqlite</title>" in out.read_text()
    db = tmp_path / "runs.db"
    for trace in (EAGER, "sample_traces/hf-small-graph/trace.sqlite.gz"):
        assert _tracekit("breakdown", trace, "--save", str(db), "--format", "json").returncode == 0
    md = _tracekit("history", str(db), "--format", "md").stdout
    names = re.findall(r"\| (\S+trace\.sqlite\S*) \|", md.replace("\\_", "_"))
    assert names == ["hf-small-eager/trace.sqlite", "hf-small-graph/trace.sqlite.gz"]


@pytest.mark.slow
def test_external_trace_tests_skip_with_a_visible_reason(tmp_path):
    """In a clone without ../shared/external_traces the tests that read them skip, and pytest's summary says so in a
    line that names TRACEKIT_EXTERNAL_TRACES; pointing that variable at the traces runs them."""
    import os
    import subprocess
    import sys

    from conftest import ROOT, SHARED

    test = "tests/cli/test_app.py::test_breakdown_without_gpu_activity_exits_2_info_exits_0"
    env = {**os.environ, "TRACEKIT_EXTERNAL_TRACES": str(tmp_path / "nowhere")}
    env.pop("TRACEKIT_SHARED_TRACES", None)
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", test],
                       capture_output=True, text=True, cwd=ROOT, env=env)
    assert r.returncode == 0 and "SKIPPED [1]" in r.stdout, r.stdout
    assert f"external trace not present: {tmp_path / 'nowhere'}" in r.stdout  # -rs: the reason
    assert "tracekit: 1 tests skipped, for 1 reason (-rs lists each test):" in r.stdout
    assert (f"     1  the external traces are not at {tmp_path / 'nowhere'}; set TRACEKIT_EXTERNAL_TRACES=DIR"
            in r.stdout)
    if SHARED.is_dir():
        env["TRACEKIT_EXTERNAL_TRACES"] = str(SHARED)
        r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test],
                           capture_output=True, text=True, cwd=ROOT, env=env)
        assert r.returncode == 0 and "SKIPPED" not in r.stdout and "tests skipped" not in r.stdout, r.stdout


@pytest.mark.slow
def test_the_skip_summary_accounts_for_every_skip(tmp_path):
    """One line per reason with its count, summing to the number skipped (the external traces' many paths folded
    into one reason), whatever the reasons are."""
    import os
    import shutil
    import subprocess
    import sys

    from conftest import ROOT

    shutil.copy(ROOT / "tests" / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_skips.py").write_text(
        "import pytest\nfrom conftest import shared\n\n"
        "def test_a():\n    shared('one/trace.json')\n\n"
        "def test_b():\n    shared('two/trace.sqlite')\n\n"
        "@pytest.mark.parametrize('i', range(3))\ndef test_c(i):\n    pytest.skip('needs torch (the GPU-host side)')\n\n"
        "@pytest.mark.skipif(True, reason='needs sglang')\ndef test_d():\n    pass\n\n"
        "def test_e():\n    pass\n")
    env = {**os.environ, "TRACEKIT_EXTERNAL_TRACES": str(tmp_path / "nowhere")}
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_skips.py"],
                       capture_output=True, text=True, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    head = lines.index("tracekit: 6 tests skipped, for 3 reasons (-rs lists each test):")
    counts = {line.split(maxsplit=1)[1]: int(line.split()[0]) for line in lines[head + 1:head + 4]}
    assert counts == {"needs torch (the GPU-host side)": 3, "needs sglang": 1,
                      f"the external traces are not at {tmp_path / 'nowhere'}; set TRACEKIT_EXTERNAL_TRACES=DIR "
                      "(a copy of ../shared/external_traces) to run them": 2}
    assert sum(counts.values()) == 6 and "1 passed, 6 skipped" in r.stdout
