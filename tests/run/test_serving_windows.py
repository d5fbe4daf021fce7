"""Serving windows as users hand them in (issue 24): a step range that holds no step, a folder with a summary file
beside the rank traces, the batch a step decodes, and the step candidates `info` suggests."""

from __future__ import annotations

import gzip
import json
import shutil

import pytest
from click.testing import CliRunner

import tracekit
from tracekit.cli import cli
from tracekit.options import AnalysisOptions
from tracekit.steps import step_candidates

from conftest import sample_trace, shared

GB300 = ("lora_perf_lora_profile/runs/Qwen3-30B-A3B-Instruct-2507-BF16-expert_shared-20260609-133913/"
         "current_base_lora/profile/base/bs16-TP-0.trace.json.gz")
SGLANG = "TraceLens/tests/traces/inference/sglang_decode/sglang_Qwen3-8B_decode.json.gz"
VLLM = "TraceLens/tests/traces/inference/vllm_decode_full/graph_execution.json.gz"


def run(*args):
    r = CliRunner().invoke(cli, list(args))
    return r.exit_code, r.stdout, r.stderr


def _gpu_time_in(events, lo, hi, inside):
    """Kernel µs whose launch (runtime or driver call, by correlation) starts in [lo, hi] and, with ``inside``, lies in one
    of the (start, end) intervals of that list on the same thread: straight from the JSON."""
    launch = {e["args"]["correlation"]: e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")
              and "correlation" in e.get("args", {})}
    total = enclosed = 0.0
    for k in events:
        if k.get("cat") != "kernel":
            continue
        ln = launch.get(k["args"].get("correlation"))
        if ln is None or not lo <= ln["ts"] <= hi:
            continue
        total += k["dur"]
        if any(a <= ln["ts"] <= b and tid == ln["tid"] for a, b, tid in inside):
            enclosed += k["dur"]
    return enclosed, total


@pytest.mark.slow
def test_step_range_around_a_collective_is_refused():
    """GB300 rank 0: `^nccl:_all_gather_base$` repeats once per step, but its ranges hold only the all-gather's
    launch: 1.7% of the GPU work launched in their span (hand count from the JSON below). Refused, exit 2, naming
    the share and the step ranges that do hold the work."""
    path = shared(GB300)
    events = json.load(gzip.open(path))["traceEvents"]
    ag = [(e["ts"], e["ts"] + e["dur"], e["tid"]) for e in events
          if e.get("cat") == "user_annotation" and e["name"] == "nccl:_all_gather_base"]
    enclosed, total = _gpu_time_in(events, min(a for a, _, _ in ag), max(b for _, b, _ in ag), ag)
    share = enclosed / total
    assert len(ag) == 8 and share < 0.05
    code, out, err = run("breakdown", str(path), "--step-range", "^nccl:_all_gather_base$")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert f"{100 * share:.1f}%" in err and r"^step\\[EXTEND" in err and r"^step\\[DECODE" in err
    # a range that does hold its steps is taken as before
    code, out, _ = run("breakdown", str(path), "--step-range", r"^step\[DECODE", "--format", "json")
    assert code == 0 and json.loads(out)["steps"]["count"] == 7


@pytest.mark.slow
def test_info_candidates_enclose_launches_ranked_by_gpu_share():
    """`info` lists as step candidates only ranges that launch GPU work, the best tiling of the GPU time first:
    on GB300 the EXTEND and DECODE steps (their shares sum to ~1: the window is those 16 steps); the all-gather's
    annotation (`nccl:_all_gather_base`, 1.7% of the GPU work in its span launched inside it) is no candidate
    (issue 44: --step-range would refuse it)."""
    t = tracekit.load(shared(GB300))
    c = step_candidates(t)
    assert c["pattern"].to_list() == ["step[EXTEND bs=# toks=#]", "step[DECODE bs=#]"]
    assert 0.98 <= c["gpu_share"][0] + c["gpu_share"][1] <= 1.0
    code, out, _ = run("info", str(shared(GB300)), "--format", "json")
    d = json.loads(out)
    assert [r["pattern"] for r in d["step_candidates"]][:2] == c["pattern"].to_list()[:2]
    launching = {r["pattern"] for r in d["step_candidates"]}
    assert {r["pattern"] for r in d["range_names"]} <= launching


@pytest.mark.slow
def test_directory_with_a_summary_file_beside_the_rank_traces(tmp_path):
    """A folder with two rank traces and a JSON summary (as engines and users write them): the summary is skipped
    with a warning naming it; a folder with only the summary is exit 2, naming it."""
    for i, name in enumerate(("hf-small-graph-torch", "hf-small-eager-torch")):
        shutil.copy(sample_trace(name), tmp_path / f"rank{i}.trace.json.gz")
    (tmp_path / "summary.json").write_text(json.dumps({"tok_s": 75.4, "ranks": 2}))
    code, out, err = run("breakdown", str(tmp_path), "--format", "json")
    assert code == 0 and len(json.loads(out)["ranks"]) == 2
    assert "skipped 1 file(s) that are not traces: summary.json" in err
    for f in tmp_path.glob("rank*"):
        f.unlink()
    code, _, err = run("breakdown", str(tmp_path))
    assert code == 2 and "summary.json" in err and len(err.strip().splitlines()) == 1


def test_tokens_per_step_from_the_engines_step_annotations():
    """Without a flag or manifest the batch comes from the step annotations: SGLang `step[DECODE bs=32]`, vLLM
    `execute_32_context_0(..)_generation_32(..)` (read from the JSON here); every tok/s figure then says it is for
    the whole batch. A flag still wins."""
    for rel, rx in ((SGLANG, r"bs=(\d+)"), (VLLM, r"generation_(\d+)")):
        import re

        events = json.load(gzip.open(shared(rel)))["traceEvents"]
        ann = [e["name"] for e in events if e.get("cat") == "user_annotation" and re.search(rx, e["name"])]
        want = float(re.search(rx, ann[0]).group(1))
        code, out, _ = run("breakdown", str(shared(rel)), "--format", "json", "--weight-bytes", "16e9",
                           "--peak-bw", "5300")
        d = json.loads(out)
        assert code == 0 and d["roofline"]["tokens_per_step"] == want == 32
        assert d["roofline"]["tokens_per_step_source"] == "annotation"
        assert "tok/s for the whole batch of 32" in d["headline"]
        code, out, _ = run("breakdown", str(shared(rel)), "--format", "json", "--tokens-per-step", "8")
        assert json.loads(out)["roofline"]["tokens_per_step_source"] == "flag"


def test_tok_s_without_a_batch_says_per_sequence():
    """No flag, manifest or annotation: tokens per step defaults to 1 and the tok/s figure says per sequence."""
    import dataclasses

    from tracekit.run.pipeline import breakdown

    t = tracekit.load(sample_trace("hf-small-graph"))
    b = breakdown(dataclasses.replace(t, manifest=None), AnalysisOptions(weight_bytes=988010240, peak_bw=4800))
    assert b.roofline["tokens_per_step_source"] == "default"
    assert "tok/s per sequence" in b.headline


def test_framework_op_ranges_are_not_step_candidates():
    """nsys-ai h100_2gpu_1s was captured with emit_nvtx: its ranges are ops (`aten::linear, op_id = 12`), each
    holding a launch or two. They enclose launches (86% of the kernel time under aten::linear) but are no steps."""
    from conftest import sql_rows

    path = shared("nsys-ai/tests/fixtures/h100_2gpu_1s.sqlite")
    n = sql_rows(path, "SELECT count(*) FROM NVTX_EVENTS WHERE text LIKE 'aten::linear, op_id = %'")[0][0]
    assert n == 280
    assert step_candidates(tracekit.load(path)).height == 0
