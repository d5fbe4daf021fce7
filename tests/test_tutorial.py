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


def commands():
    return [line[2:] for line in DOC.read_text().splitlines() if line.startswith("$ tracekit ")]


def test_the_tutorial_has_its_commands():
    assert len(commands()) >= 5


@pytest.mark.parametrize("cmd", commands())
def test_tutorial_command_runs(cmd, monkeypatch):
    sample("hf-small-eager/trace.sqlite")
    monkeypatch.chdir(ROOT)
    r = CliRunner().invoke(cli, shlex.split(cmd)[1:])
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize("name", ["hf-small-eager", "hf-large-eager", "synthetic-eager", "hf-small-spec"])
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
