"""Verdicts as data (contract "Additions to /3": ``bound``, sentences rendered from fields, the self-check on
fields): each test on the real trace that showed what it pins."""

from __future__ import annotations

import pytest

import tracekit
from tracekit.analyses.verdicts import BOUNDS, EPS_MS, Lever, Reference, Statement, check, saving_text

from conftest import sample_trace, shared

NVLLM = ("nvllm/benchmarks/nvllm/traces/cute_paged_attn/2026-04-13-nsys/"
         "rank0.1776116491109655086.pt.trace.json.gz")


@pytest.fixture(scope="module")
def nvllm():
    """The GB10 vLLM server trace of issue 44 with the user's flags and no unprofiled time (a server trace's usual
    case): 15 GB read per step at 273 GB/s, a batch of 4."""
    return tracekit.breakdown(tracekit.load(shared(NVLLM)), weight_bytes="15GB", peak_bw=273, tokens_per_step=4)


def test_a_memory_bound_server_step_without_an_unprofiled_time_gets_a_hedged_verdict(nvllm):
    """Fix 1: the bandwidth verdict was withheld ("its saving (22.507 ms) is an upper bound but the verdict does
    not say so") while the headline said memory-bound. Now the verdict is given, its saving an upper bound."""
    m = nvllm.advice["memory_bandwidth"]
    floor = 15e9 / 273e9 * 1e3  # 54.945 ms: the bytes at the peak, by hand
    assert m.predicted_step_ms == pytest.approx(floor)
    assert m.max_saving_ms == pytest.approx(nvllm.steps.mean_ms - floor)  # 77.452 - 54.945 = 22.507 ms
    assert m.applicable and m.bound == "upper_bound" and m.to_dict()["bound"] == "upper_bound"
    assert "withheld" not in m.verdict
    assert saving_text(m.reference, m.max_saving_ms, "upper_bound") in m.verdict  # "at most 22.507 ms per step (29% ..."
    assert "memory-bound" in m.verdict and nvllm.advice.memory_bound and "memory-bound at 71%" in nvllm.headline
    assert nvllm.advice.order[0] == "memory_bandwidth"  # the verdict the headline gives comes first
    assert nvllm.advice.problems == ()


def test_without_an_unprofiled_time_every_saving_is_an_upper_bound(nvllm):
    d = nvllm.to_dict()
    assert d["time_base"]["unprofiled_step_ms"] is None
    for key, lever in d["advice"].items():
        assert lever["bound"] in BOUNDS
        saving = lever["max_saving_ms"]
        if saving is None:
            assert lever["bound"] == "unknown", key
        elif saving > EPS_MS:
            assert lever["bound"] == "upper_bound", key


def test_with_an_unprofiled_time_savings_are_exact():
    """hf-small-eager's manifest has its unprofiled step (36.670 ms): the CUDA-graph saving is stated against it."""
    b = tracekit.breakdown(tracekit.load(sample_trace("hf-small-eager")))
    g = b.advice["cuda_graphs"]
    assert b.time_base.unprofiled_source == "manifest"
    assert g.bound == "exact" and g.max_saving_ms == pytest.approx(b.time_base.reference_step_ms - g.predicted_step_ms)
    assert "would save ≈" in g.verdict and "at most" not in g.verdict.split(":")[0]


def test_the_self_check_reads_fields_not_words():
    """An unhedged saving on the traced step is caught from its bound, whatever the sentence says; a hedged one
    passes; a saving larger than the step and a bandwidth above the peak are caught from their numbers."""
    ref = Reference(5.0, None, 5.0)
    says_at_most = Statement("could save at most 1 ms")  # the words would have passed the old check
    assert check(Lever(True, 4.0, 1.0, 0.2, basis="estimated", reading=says_at_most, reference=ref)) == [
        "its saving (1.000 ms) is stated against the traced step but is not an upper bound"]
    assert check(Lever(True, 4.0, 1.0, 0.2, basis="upper_bound", reading=Statement("1 ms"), reference=ref)) == []
    assert check(Lever(True, 0.0, 6.0, 1.2, basis="upper_bound", reference=ref)) == [
        "its saving (6.000 ms) exceeds the 5.000 ms step"]
    unprofiled = Reference(5.0, "flag", 9.0)
    assert check(Lever(True, 4.0, 1.0, 0.2, basis="estimated", reference=unprofiled)) == []
