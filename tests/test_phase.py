"""Phase per step (contract steps.phase, --phase) on real traces; shapes checked against the raw JSON."""

from __future__ import annotations

import gzip
import json
import re

import polars as pl
import pytest

import tracekit
from tracekit.analyses.phase import gemm_rows, select_phase, step_phases, window_phase
from tracekit.steps import find_steps

from conftest import SAMPLES, shared

B200 = "TraceLens/tests/traces/b200/eager_trace.json.gz"
GB300 = ("lora_perf_lora_profile/runs/Qwen3-30B-A3B-Instruct-2507-BF16-expert_shared-20260609-133913/"
         "current_base_lora/profile/base/bs16-TP-{}.trace.json.gz")
DECODE_TRACES = ["TraceLens/tests/traces/inference/sglang_decode/sglang_Qwen3-8B_decode.json.gz",
                 "TraceLens/tests/traces/inference/vllm_decode_full/graph_execution.json.gz",
                 "nvllm/benchmarks/nvllm/traces/cute_paged_attn/2026-04-13-nsys/"
                 "rank0.1776116491109655086.pt.trace.json.gz",
                 GB300.format(0), GB300.format(3)]
TRAINING = ["HolisticTraceAnalysis/tests/data/nccl_parser_config/nccl_data.json.gz",
            "HolisticTraceAnalysis/tests/data/df_index_resolver/df_index_resolver.json.gz",
            "HolisticTraceAnalysis/tests/data/negative_queue_length_values_check/rank0.json.gz",
            "HolisticTraceAnalysis/tests/data/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
            "HolisticTraceAnalysis/tests/data/trace_diff/control/control.json.gz",
            "HolisticTraceAnalysis/tests/data/trace_diff/test/test.json.gz",
            "HolisticTraceAnalysis/tests/data/timeline_analysis/sampled_rank-0.json.gz",
            "kineto/tb_plugin/samples/resnet50_num_workers_0/worker0.pt.trace.json.gz",
            "profile-data/train.json"]


def _phases(path, **kw):
    t = tracekit.load(path)
    s = find_steps(t, **kw)
    return t, s, step_phases(t, s.windows)


def test_b200_context_step_is_prefill():
    """vLLM on a B200: the one step `execute_context_1(888)_generation_0(0)` is an 888-token prefill: the
    annotation says so, and so do its GEMM inputs (888 rows, counted from the JSON's Input Dims)."""
    path = shared(B200)
    events = json.load(gzip.open(path))["traceEvents"]
    rows = [e["args"]["Input Dims"][0][0] for e in events if e.get("name") == "aten::linear"
            and e.get("args", {}).get("Input Dims")]
    assert max(rows) == 888
    t, s, ph = _phases(path)
    assert ph["phase"].to_list() == ["prefill"] and ph["source"][0] == "annotation"
    assert "execute_context_1(888" in ph["evidence"][0]
    g = gemm_rows(t, s.windows)
    assert g["rows"].to_list() == [888] and g["tokens"].to_list() == [None]
    sel, warnings = select_phase(ph)
    assert sel["reason"].to_list() == [None] and not sel["decode_advice"][0]  # the split, no decode verdict
    assert any("no decode steps" in w for w in warnings)
    assert window_phase(ph["phase"]) == "prefill"


@pytest.mark.parametrize("rel", TRAINING, ids=[r.split("/")[-1] for r in TRAINING])
def test_training_traces_are_not_decode(rel):
    path = shared(rel)
    t, s, ph = _phases(path)
    assert set(ph["phase"]) == {"prefill"} and set(ph["source"]) == {"training"}
    names = t.kernels["name"].cast(pl.String)
    assert names.str.contains(r"(?i)backward|bwd|wgrad|Adam").sum() > 0  # plain evidence, independent of the rule
    sel, warnings = select_phase(ph)
    assert not sel["decode_advice"].any()


@pytest.mark.parametrize("rel", DECODE_TRACES, ids=[r.split("/")[-1] for r in DECODE_TRACES])
def test_serving_decode_traces_are_decode(rel):
    t, s, ph = _phases(shared(rel))
    assert set(ph["phase"]) == {"decode"} and set(ph["source"]) == {"annotation"}
    sel, _ = select_phase(ph)
    assert sel["reason"].null_count() == sel.height and sel["decode_advice"].all()


def test_gb300_every_mode_prefill_steps_excluded_by_phase():
    """With every SGLang mode as steps: 8 EXTEND (prefill) and 8 DECODE steps; --phase decode keeps the 8."""
    path = shared(GB300.format(0))
    events = json.load(gzip.open(path))["traceEvents"]
    names = [e["name"] for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("step[")]
    assert sum(n.startswith("step[EXTEND") for n in names) == 8 and sum(n.startswith("step[DECODE") for n in names) == 8
    t, s, ph = _phases(path, every_phase=True)
    assert s.windows.height == 16 and s.pattern == r"^step\["
    assert ph.group_by("phase").len().sort("phase").rows() == [("decode", 8), ("prefill", 8)]
    sel, warnings = select_phase(ph, "decode")
    assert sel["reason"].to_list().count("phase") == 8
    assert sel.filter(pl.col("reason").is_null())["phase"].unique().to_list() == ["decode"]
    assert select_phase(ph, "prefill")[0]["reason"].to_list().count("phase") == 8
    assert select_phase(ph, "all")[0]["reason"].null_count() == 16
    assert window_phase(ph["phase"]) == "mixed"
    assert find_steps(t).windows.height == 8  # without every_phase: the decode ranges only (as before)


def test_spec_torch_trace_shapes_say_decode():
    """hf-small-spec-torch: the verify forward runs the target over K+1 = 4 tokens per sequence ([1, 4, 896]
    inputs of aten::linear), the drafts over 1: a handful of tokens per sequence, decode."""
    path = SAMPLES / "hf-small-spec-torch/trace.json.gz"
    events = json.load(gzip.open(path))["traceEvents"]
    step = next(e for e in events if e.get("cat") == "user_annotation" and e["name"] == "decode_step 40")
    lo, hi = step["ts"], step["ts"] + step["dur"]
    seq = [e["args"]["Input Dims"][0][-2] for e in events if e.get("name") == "aten::linear"
           and lo <= e["ts"] <= hi and len(e["args"]["Input Dims"][0]) == 3]
    assert max(seq) == 4 and min(seq) == 1
    t = tracekit.load(path)
    s = find_steps(t)
    g = gemm_rows(t, s.windows)
    assert g.filter(pl.col("step") == 0)["tokens"].to_list() == [4]
    # without annotations and manifest the shapes decide
    bare = t.__class__(**{**t.__dict__, "ranges": t.ranges.filter(~pl.col("name").str.starts_with("decode_step")),
                          "manifest": None})
    ph = step_phases(bare, s.windows)
    assert set(ph["phase"]) == {"decode"} and set(ph["source"]) == {"shapes"}
    assert "4 tokens per sequence" in ph["evidence"][0]


@pytest.mark.parametrize("name", ["hf-small-graph", "hf-small-eager-torch", "synthetic-graph", "hf-small-spec"])
def test_sample_traces_are_decode(name):
    path = next((SAMPLES / name).glob("trace.*"))
    t, s, ph = _phases(path)
    assert set(ph["phase"]) == {"decode"}
    # the same trace without its ranges: the manifest (a tracekit capture) says decode
    bare = t.__class__(**{**t.__dict__, "ranges": t.ranges.head(0)})
    ph2 = step_phases(bare, s.windows)
    assert set(ph2["phase"]) == {"decode"} and set(ph2["source"]) <= {"manifest", "shapes"}


def test_no_evidence_is_unknown_and_analysed_with_a_warning():
    """nsys-ai mfu_2gpu_before: no annotation, shapes, manifest or graph replay: unknown; --phase decode keeps
    the steps (no evidence against) and warns."""
    t, s, ph = _phases(shared("nsys-ai/tests/fixtures/mfu_2gpu_before.sqlite"))
    assert set(ph["phase"]) == {"unknown"}
    sel, warnings = select_phase(ph)
    assert sel["reason"].null_count() == sel.height and any("unknown" in w for w in warnings)
    assert window_phase(ph["phase"]) == "unknown"


def test_phase_argument_checked():
    with pytest.raises(tracekit.TracekitError):
        select_phase(pl.DataFrame({"step": [0], "phase": ["decode"]}), "training")


def test_annotation_grammar():
    """The annotation parser on the forms the engines write (synthetic names: a definition unit test)."""
    from tracekit.analyses.phase import _SGLANG_MODES, _SGLANG_RX, _TRTLLM_RX, _VLLM_RX

    def sg(n):
        m = re.search(_SGLANG_RX, n)
        return _SGLANG_MODES[m.group(1)] if m else None

    assert sg("step[DECODE bs=16]") == "decode" and sg("step[EXTEND bs=2 toks=4096]") == "prefill"
    assert sg("step[TARGET_VERIFY bs=8]") == "decode" and sg("step[DRAFT_EXTEND bs=8]") == "decode"
    assert sg("step[MIXED bs=4]") == "mixed" and sg("step[IDLE]") is None and sg("DECODED_THING") is None
    assert re.search(_VLLM_RX, "execute_context_1(888)_generation_0(0)").groups() == ("1", "0")
    assert re.search(_VLLM_RX, "execute_32_context_0(sq0sk0sqsq0sqsk0)_generation_32(sq32sk55086)").groups() == (
        "0", "32")
    assert re.search(_TRTLLM_RX, "_forward_step 12: 2 ctx reqs, 30 gen reqs").groups() == ("2", "30")
