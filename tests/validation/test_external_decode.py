"""Real SGLang and vLLM decode traces made by other people (read in place from ../shared/external_traces):
steps are found, gemm and attention are recognised, graph replays are seen as such. Step counts are checked
against the annotations counted with plain gzip + json."""

from __future__ import annotations

import gzip
import json
import re

import pytest

import tracekit

from conftest import shared

# The validation sweeps are the slow tier (`python -m pytest -m slow`; .ci/run runs them after the fast tier).
pytestmark = pytest.mark.slow

LORA = ("lora_perf_lora_profile/runs/Qwen3-30B-A3B-Instruct-2507-BF16-expert_shared-20260609-133913/"
        "current_base_lora/profile/base/bs16-TP-{}.trace.json.gz")
CASES = [
    # (trace, regex of the step annotation, graph-replayed decode?)
    ("TraceLens/tests/traces/inference/sglang_decode/sglang_Qwen3-8B_decode.json.gz", r"^step\[DECODE", True),
    ("TraceLens/tests/traces/inference/vllm_decode_full/graph_execution.json.gz", r"^execute_", True),
    (LORA.format(0), r"^step\[DECODE", True),
    (LORA.format(3), r"^step\[DECODE", True),
    ("TraceLens/tests/traces/b200/eager_trace.json.gz", r"^execute_", False),
]


@pytest.mark.parametrize("rel,step_rx,graphed", CASES, ids=[c[0].split("/")[-1] for c in CASES])
def test_decode_steps_found_and_categories_recognised(rel, step_rx, graphed):
    path = shared(rel)
    events = json.load(gzip.open(path))["traceEvents"]
    names = [e.get("name", "") for e in events if e.get("cat") == "user_annotation"]
    n_steps = sum(1 for n in names if re.search(step_rx, n))
    # SGLang's step ranges of every forward mode are steps (EXTEND ones are prefill: excluded by --phase decode)
    every = r"^step\[" if step_rx.startswith(r"^step\[") else step_rx
    n_all = sum(1 for n in names if re.search(every, n))
    b = tracekit.breakdown(tracekit.load(path))
    assert b.steps["count"] + b.steps["excluded"] == n_all >= n_steps >= 1
    assert b.steps["excluded_reasons"].get("phase", 0) == n_all - n_steps
    assert b.steps["marker"] == "annotation"
    assert b.per_step_ms["gemm"] > 0 and b.per_step_ms["attention"] > 0
    assert sum(v for v in b.per_step_ms.values() if v is not None) == pytest.approx(b.steps["mean_ms"], rel=0.005)
    if "b200" in rel:  # vLLM's execute_context_1(888)_generation_0(0): an 888-token prefill, no decode advice
        assert b.steps["phase"] == "prefill" and not b.advice["cuda_graphs"]["applicable"]
        assert "decode advice does not apply" in b.advice["cuda_graphs"]["verdict"]
        assert b.roofline.get("ceiling_tokens_per_s") is None or "no decode advice" in b.headline
        return
    assert b.steps["phase"] == "decode"
    assert b.advice["cuda_graphs"]["applicable"] is (not graphed)
    if graphed:
        assert b.facts.graph_kernel_share >= 0.8


def test_the_gb300_trace_has_communication_every_step():
    b = tracekit.breakdown(tracekit.load(shared(LORA.format(0))))
    # PROVENANCE.md: 8 step[DECODE bs=16] steps, one 634-kernel graph replay each; the last has no following step
    # (and 8 step[EXTEND ...] prefill steps, excluded by --phase decode)
    assert b.steps["count"] == 7
    assert b.steps["excluded_reasons"] == {"phase": 8, "last step (no following step)": 1}
    assert b.facts.graph_launches_per_step == 1
    assert b.facts.kernels_per_step >= 634  # the graph's 634 plus the step's few eager kernels
    assert b.kernel_ms_per_step["communication"] > 0 and b.advice["communication"]["applicable"]
