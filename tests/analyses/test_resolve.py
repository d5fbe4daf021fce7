"""The resolvers (``tracekit.analyses.resolve``): one per input quantity, value + source + warnings, the same for
``breakdown`` and ``ceiling``; each case on the real trace that showed it."""

from __future__ import annotations

import polars as pl
import pytest

import tracekit
from tracekit.analyses import resolve

from conftest import shared

SGLANG_MI300X = "TraceLens/tests/traces/inference/sglang_decode/sglang_Qwen3-8B_decode.json.gz"


def test_the_gpu_is_named_from_the_trace_s_device_properties_when_ids_differ():
    """Fix 4: the ROCm trace records its kernels on device 9 and its one GPU's properties under id 0; `info` named
    it (MI300X, 5,300 GB/s), `breakdown` said "GPU 9: unknown peak"."""
    t = tracekit.load(shared(SGLANG_MI300X))
    assert t.kernels["device"].unique().to_list() == [9] and t.gpus["device"].to_list() == [0]
    b = tracekit.breakdown(t)
    g = tracekit.info(t)["gpus"][0]
    assert (g["name"], g["peak_bw_gbps"]) == ("AMD Instinct MI300X", 5300.0)
    assert b.gpu.device == 9  # the device whose kernels are analysed
    assert (b.gpu.name, b.gpu.peak_bw_gbps, b.gpu.peak_bw_source) == ("AMD Instinct MI300X", 5300.0, "table")
    assert not any("peak memory bandwidth unknown" in w for w in b.warnings)


def test_device_properties_are_matched_by_id_then_by_order_then_by_model():
    """(Synthetic property rows, labelled so: the rules on frames of the trace's schema.)"""
    gpus = pl.DataFrame({"device": [0, 1], "name": ["A", "B"], "peak_bw_gbps": [1.0, 2.0]})
    assert resolve.trace_gpu(gpus, 1).value.name == "B"  # by id
    by_order = resolve.trace_gpu(gpus, 9, lambda: [8, 9])
    assert by_order.value.name == "B" and "in order" in by_order.detail
    assert resolve.trace_gpu(gpus, 9, lambda: [9]).value.name is None  # 1 device, 2 different GPUs: unknown
    same = pl.DataFrame({"device": [0, 1], "name": ["A", "A"], "peak_bw_gbps": [1.0, 1.0]})
    assert resolve.trace_gpu(same, 9, lambda: [9]).value.name == "A"


def test_tokens_per_step_flag_manifest_annotation_default():
    assert resolve.tokens_per_step(flag=8, manifest={"tokens_per_step": 4}).source == "flag"
    m = resolve.tokens_per_step(manifest={"tokens_per_step": 4}, accept_len=2.5, annotated=lambda: (32.0, "x"))
    assert (m.value, m.batch, m.source) == (10.0, 4.0, "manifest")
    a = resolve.tokens_per_step(annotated=lambda: (32.0, "step[DECODE bs=32]"))
    assert (a.value, a.source, a.unit) == (32.0, "annotation", "tok/s for the whole batch of 32")
    d = resolve.tokens_per_step()
    assert (d.value, d.source) == (1.0, "default") and "per sequence" in d.unit


def test_ceiling_and_breakdown_resolve_the_peak_the_same_way():
    assert resolve.peak_bandwidth(flag=None, name="NVIDIA H200").value == tracekit.ceiling(
        gpu="NVIDIA H200", params=1e9).peak_bw_gbps == 4800.0
    unknown = resolve.peak_bandwidth(flag=None, name="no such GPU")
    assert unknown.value is None and unknown.warnings and "--peak-bw" in unknown.warnings[0]
    with pytest.raises(tracekit.TracekitError):
        resolve.peak_bandwidth(flag=-1.0)


def test_info_never_offers_a_step_range_that_breakdown_would_refuse():
    """Fix 8: `info` offered `^nccl:_all_gather_base$` as a step candidate (the B200 vLLM trace: its one all-gather's
    annotation; the GB300 SGLang rank: 8 of them, enclosing the launches of 1.7% of the GPU work in their span,
    which `--step-range` refuses). A candidate now passes the --step-range test, and a collective's annotation is
    never one."""
    from tracekit.steps import MIN_STEP_RANGE_SHARE, range_coverage, step_candidates

    for rel in ("TraceLens/tests/traces/b200/eager_trace.json.gz",
                "lora_perf_lora_profile/runs/Qwen3-30B-A3B-Instruct-2507-BF16-expert_shared-20260609-133913/"
                "current_base_lora/profile/base/bs16-TP-0.trace.json.gz"):
        t = tracekit.load(shared(rel))
        i = tracekit.info(t)
        offered = {r["pattern"] for r in i["range_names"]} | {r["pattern"] for r in i["step_candidates"]}
        assert "nccl:_all_gather_base" in set(t.ranges["name"].to_list())
        assert offered and not any(p.startswith("nccl:") for p in offered)
        for regex in step_candidates(t, top=None)["regex"]:
            share, _, _ = range_coverage(t, t.ranges.filter(pl.col("name").str.contains(regex)))
            assert share >= MIN_STEP_RANGE_SHARE, regex
