"""The Python API (``tracekit.breakdown`` and friends) does what the command line does, with the same names."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

import tracekit
from tracekit.cli import cli

from conftest import DATA

MFU = DATA / "nsys" / "nsysai_mfu_2gpu_before_2026.2.sqlite"


@pytest.mark.slow
def test_breakdown_all_devices_is_the_command_s_rank_set():
    """Fix 8: `tracekit.breakdown()` lacked `all_devices` (`breakdown --all-devices`): every GPU of the 2-GPU
    nsys report as a rank, the same cross-rank object as the command's JSON."""
    cr = tracekit.breakdown(tracekit.load(MFU), all_devices=True)
    r = CliRunner().invoke(cli, ["breakdown", str(MFU), "--all-devices", "--format", "json"])
    assert r.exit_code == 0, r.stderr
    d = json.loads(r.stdout)
    assert cr.ranks == 2 and cr.labels == ["gpu0", "gpu1"]
    assert cr.to_dict() == d  # (the typed result's JSON is the command's, issue 51 item 3)
    assert cr.cross_rank.to_dict() == d["cross_rank"]
    assert [b.gpu.device for b in cr.rank_breakdowns] == [0, 1]
    assert json.loads(json.dumps(cr.report()["levers"])) == d["levers"]
    with pytest.raises(tracekit.TracekitError, match="--all-devices"):
        tracekit.breakdown(tracekit.load(MFU), all_devices=True, device=0)
    assert "all_devices" in str(__import__("inspect").signature(tracekit.breakdown))


# ───────────────────────── the API takes paths (issue 51 item 3) ─────────────────────────

import re  # noqa: E402
from pathlib import Path  # noqa: E402

from conftest import ROOT, sample_trace, shared  # noqa: E402


def cli_json(*args) -> tuple[int, dict]:
    r = CliRunner().invoke(cli, [*map(str, args), "--format", "json"])
    assert r.exit_code in (0, 3, 4), r.output
    return r.exit_code, json.loads(r.stdout)


def test_breakdown_info_and_kernels_take_a_path_and_return_the_command_s_json():
    """`tracekit.breakdown("x.sqlite")` raised AttributeError ('str' object has no attribute 'launches'): a str, a
    Path, a folder holding one trace and a loaded Trace now give the typed result whose to_dict() is the command's
    JSON."""
    path = sample_trace("hf-small-graph")
    _, want = cli_json("breakdown", path)
    for given in (str(path), path):
        b = tracekit.breakdown(given)
        assert type(b).__name__ == "Breakdown" and b.to_dict() == want
    assert tracekit.breakdown(tracekit.load(path)).to_dict() == want
    by_dir = tracekit.breakdown(path.parent).to_dict()  # (a folder of one trace: that trace)
    assert by_dir == want
    # the options by the command's names
    saxpy = DATA / "nsys" / "pipit_saxpy_2022.2.sqlite"
    _, want = cli_json("breakdown", saxpy, "--step-range", "^saxpy$", "--measured-step-ms", "200")
    assert tracekit.breakdown(str(saxpy), step_range="^saxpy$", measured_step_ms=200).to_dict() == want
    # info and kernels: typed results too
    _, want = cli_json("info", path)
    i = tracekit.info(str(path))
    assert type(i).__name__ == "Info" and i.to_dict() == want
    _, want = cli_json("kernels", path, "--top", "5")
    k = tracekit.kernels(path, top=5)
    assert type(k).__name__ == "KernelSummary" and k.to_dict() == want and len(k.kernels) == 5


def test_diff_takes_paths_with_the_command_s_options():
    """`tracekit.diff(p1, p2)` was a TypeError: now both sides by path (or a Trace), the shared options and each
    side's own, and the same JSON and exit code as the command."""
    base, new = sample_trace("gate-graph-nomark"), sample_trace("gate-graph-slow512")
    code, want = cli_json("diff", base, new, "--fail-on-regression", "3%")
    d = tracekit.diff(str(base), new, fail_on_regression="3%")
    assert type(d).__name__ == "Diff" and d.to_dict() == want and d.exit_code == code == 3
    assert tracekit.diff(tracekit.load(base), tracekit.load(new), fail_on_regression=3).to_dict() == want
    # one side's own values
    plain, spec = sample_trace("hf-small-graph"), sample_trace("hf-small-spec-graph")
    code, want = cli_json("diff", plain, spec, "--new-accept-len", "2", "--base-measured-step-ms", "2.5",
                          "--fail-on-regression", "1%")
    d = tracekit.diff(plain, spec, new_accept_len=2, base_measured_step_ms=2.5, fail_on_regression="1%")
    assert d.to_dict() == want and d.exit_code == code
    assert d.per_token.source.to_dict() == {"base": "plain", "new": "flag"}
    assert d.per_token.step_ms.base == 2.5
    # analysed results are sides as they are; options cannot apply to them
    b = tracekit.breakdown(plain)
    assert tracekit.diff(b, b).to_dict()["delta"]["steps"]["mean_ms"]["abs"] == 0
    with pytest.raises(tracekit.TracekitError, match="already analysed"):
        tracekit.diff(b, plain, step_range="decode")
    with pytest.raises(TypeError):
        tracekit.diff(plain, spec, measured_step_ms=2.0)  # (each side has its own: base_/new_measured_step_ms)
    with pytest.raises(TypeError):
        tracekit.breakdown(plain, no_such_option=1)


def test_api_errors_are_tracekit_errors(tmp_path):
    """Bad input raises a TracekitError (what the command prints as one line, exit 2), never AttributeError."""
    missing = tmp_path / "x.sqlite"
    for call in (lambda: tracekit.breakdown(str(missing)), lambda: tracekit.info(missing),
                 lambda: tracekit.kernels(str(missing)), lambda: tracekit.diff(missing, missing),
                 lambda: tracekit.breakdown(42), lambda: tracekit.breakdown(sample_trace("hf-small-graph"),
                                                                           tokens_per_step=-1)):
        with pytest.raises(tracekit.TracekitError):
            call()
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(tracekit.TracekitError, match="no trace files"):
        tracekit.breakdown(empty)


@pytest.mark.slow
def test_a_rank_directory_through_the_api(tmp_path):
    """A directory of two rank files (the LoRA TP4 capture's ranks 0 and 1, symlinked): `breakdown` gives a RankSet,
    `info` and `kernels` a RankReport, `diff` compares the sets; each to_dict() is the command's JSON."""
    lora = shared("lora_perf_lora_profile/runs/Qwen3-30B-A3B-Instruct-2507-BF16-expert_shared-20260609-133913/"
                  "current_base_lora/profile/base")
    two = tmp_path / "two"
    two.mkdir()
    for f in ("bs16-TP-0.trace.json.gz", "bs16-TP-1.trace.json.gz"):
        (two / f).symlink_to(lora / f)
    rs = tracekit.breakdown(two)
    _, want = cli_json("breakdown", two)
    assert type(rs).__name__ == "RankSet" and rs.to_dict() == want
    assert rs.cross_rank.ranks == 2 and len(rs.rank_breakdowns) == 2
    for cmd, fn in (("info", tracekit.info), ("kernels", tracekit.kernels)):
        _, want = cli_json(cmd, two)
        r = fn(str(two))
        assert type(r).__name__ == "RankReport" and r.to_dict() == want and len(r["ranks"]) == 2
    code, want = cli_json("diff", two, two, "--fail-on-regression", "3%")
    d = tracekit.diff(two, rs, fail_on_regression="3%")  # (a path and the analysed set: the same set)
    got = d.to_dict()
    assert got["cross_rank"] == want["cross_rank"] and got["gate"] == want["gate"] and d.exit_code == code == 0


def test_the_readme_s_api_example_runs():
    """The README's Python API section is a doctest: run it as written."""
    import doctest

    text = (ROOT / "README.md").read_text(encoding="utf-8")
    head = text.index("## Python API")
    block = re.search(r"```python\n(.*?)```", text[head:], re.S).group(1)
    assert ">>> import tracekit" in block
    test = doctest.DocTestParser().get_doctest(block, {}, "README.md", str(ROOT / "README.md"), 0)
    import os

    here = os.getcwd()
    os.chdir(ROOT)
    try:
        runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
        runner.run(test)
    finally:
        os.chdir(here)
    assert runner.failures == 0 and runner.tries >= 5, runner.summarize()
    assert Path(ROOT / "sample_traces" / "hf-small-graph").is_dir()
