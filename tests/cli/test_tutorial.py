"""docs/tutorial.md: every `$ tracekit ...` command on the page runs as shown (exit 0) on the sample traces,
and tracekit ceiling agrees exactly with breakdown's roofline on our H200 captures."""

from __future__ import annotations

import json
import re
import shlex

import pytest
from click.testing import CliRunner

from tracekit.cli import cli

from conftest import ROOT, SAMPLES, sample, sample_trace

DOC = ROOT / "docs" / "tutorial.md"


SCRATCH = "/tmp/tracekit-tutorial"  # the folder §7 copies a trace into, away from its manifest


def commands():
    return [line[2:] for line in DOC.read_text().splitlines() if line.startswith("$ tracekit ")]


def setup_commands():
    """The page's shell steps (mkdir, cp, python -c ...), not tracekit itself and not the GPU-host capture."""
    return [line[2:] for line in DOC.read_text().splitlines()
            if line.startswith("$ ") and not line.startswith("$ tracekit ") and "tracekit capture" not in line]


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    """Run the page's setup steps as shown, with its scratch folder moved into pytest's temp dir."""
    import subprocess
    import sys

    d = tmp_path_factory.mktemp("tutorial")
    for cmd in setup_commands():
        cmd = cmd.replace(SCRATCH, str(d))
        if cmd.startswith("python "):  # the interpreter running the tests, wherever `python` points
            cmd = f'"{sys.executable}" {cmd[len("python "):]}'
        subprocess.run(cmd, shell=True, check=True, cwd=ROOT)
    return d


def test_the_tutorial_has_its_commands():
    assert len(commands()) >= 5
    assert any("--model" in c for c in commands()) and setup_commands()


@pytest.mark.parametrize("cmd", commands())
@pytest.mark.slow
def test_tutorial_command_runs(cmd, monkeypatch, scratch):
    sample("hf-small-eager/trace.sqlite")
    monkeypatch.chdir(ROOT)
    r = CliRunner().invoke(cli, shlex.split(cmd.replace(SCRATCH, str(scratch)))[1:])
    assert r.exit_code == 0, r.output


def test_model_on_a_trace_without_its_manifest_says_per_gpu_and_source(scratch):
    """§7: the copied trace has no manifest; --model gives exactly the bytes torch counted for one target forward
    (tests/data/h200_checkpoints/bf16/torch_counts.json, counted on the H200 before saving), per GPU, with its
    source; the headline says the savings are upper bounds, and a measured step restores the time base."""
    trace = scratch / "trace.sqlite.gz"
    assert trace.is_file() and not (scratch / "manifest.json").exists()
    counts = json.loads((ROOT / "tests/data/h200_checkpoints/bf16/torch_counts.json").read_text())
    args = ["breakdown", str(trace), "--model", str(scratch / "bf16")]
    d = json.loads(CliRunner().invoke(cli, [*args, "--format", "json"]).stdout)
    r = d["roofline"]
    assert r["weight_bytes_per_step"] == counts["step_read"]["target_bytes"] == 988_010_240
    assert (r["weight_bytes_source"], r["tp"]) == ("model", 1)
    assert d["time_base"]["unprofiled_step_ms"] is None and "savings are upper bounds" in d["headline"]
    table = CliRunner().invoke(cli, args).stdout
    assert "roofline per GPU: 0.988 GB of weights/step (model)" in " ".join(table.split())
    man = json.loads((SAMPLES / "hf-small-graph" / "manifest.json").read_text())
    d = json.loads(CliRunner().invoke(cli, [*args, "--tp", "1", "--context", str(man["model"]["max_cache_len"]),
                                            "--measured-step-ms", "2.822", "--format", "json"]).stdout)
    assert d["time_base"]["unprofiled_source"] == "flag" and d["headline"].startswith("step 2.822 ms unprofiled (flag")
    # KV bytes per token from the config: 24 layers x 2 (K and V) x 2 KV heads x 64 head dim x 2 bytes (bf16)
    assert d["roofline"]["kv_bytes_per_step"] == 24 * 2 * 2 * 64 * 2 * 189


@pytest.mark.parametrize("name", ["hf-small-eager", "hf-large-eager", "synthetic-eager", "hf-small-spec"])
@pytest.mark.slow
def test_ceiling_agrees_with_breakdown_roofline(name):
    path = sample_trace(name)
    man = json.loads((SAMPLES / name / "manifest.json").read_text())
    r = CliRunner().invoke(cli, ["breakdown", str(path), "--format", "json"])
    roof = json.loads(r.stdout)["roofline"]
    args = ["ceiling", "--gpu", man["gpu_name"], "--weight-bytes", str(man["weight_bytes_per_step"]),
            "--peak-bw", str(man["peak_bw_gbps"]), "--format", "json"]
    if man["spec"]:
        args += ["--accept-len", str(man["spec"]["accept_len"])]
    c = json.loads(CliRunner().invoke(cli, args).stdout)
    assert c["bytes_per_step_per_gpu"] == roof["weight_bytes_per_step"]
    assert c["floor_ms"] == roof["floor_ms"]
    assert c["ceiling_steps_per_s"] == roof["ceiling_steps_per_s"]
    assert c["tokens_per_step"] == roof["tokens_per_step"]
    assert c["ceiling_tokens_per_s"] == roof["ceiling_tokens_per_s"]


def test_hand_computed_ceiling_for_the_users_question():
    # 27e9 fp8 parameters at TP 2 on RTX A6000 (768 GB/s): 13.5 GB per GPU per step -> 17.58 ms -> 56.9 steps/s;
    # x 3.2 accepted tokens = 182 tok/s.
    r = CliRunner().invoke(cli, ["ceiling", "--gpu", "RTX A6000", "--params", "27e9", "--dtype", "fp8", "--tp", "2",
                                 "--accept-len", "3.2", "--measured-tok-s", "55", "--format", "json"])
    c = json.loads(r.stdout)
    assert c["bytes_per_step_per_gpu"] == 13_500_000_000
    assert c["floor_ms"] == pytest.approx(17.578, abs=1e-3)
    assert c["ceiling_steps_per_s"] == pytest.approx(56.89, abs=1e-2)
    assert c["ceiling_tokens_per_s"] == pytest.approx(182.0, abs=0.1)
    assert c["fraction_of_ceiling"] == pytest.approx(55 / 182.04, abs=1e-3)
    assert re.search(r"ceiling 182 tok/s; you are at 30% of it", CliRunner().invoke(
        cli, ["ceiling", "--gpu", "RTX A6000", "--params", "27e9", "--dtype", "fp8", "--tp", "2", "--accept-len",
              "3.2", "--measured-tok-s", "55"]).stdout)
