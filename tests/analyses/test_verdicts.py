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


SGLANG_MI300X = "TraceLens/tests/traces/inference/sglang_decode/sglang_Qwen3-8B_decode.json.gz"


def test_an_unprofiled_step_longer_than_the_traced_step_is_refused():
    """Fix 3: --measured-tok-s 2000 --tokens-per-step 32 on the MI300X SGLang decode step gives an unprofiled step
    of 1000 x 32 / 2000 = 16 ms against a traced ~10.4 ms: impossible (a profiler only slows a step down). It is
    refused with a warning, and no saving is stated against it (they were: "13.144 ms per step are not spent
    reading memory", more than the whole traced step)."""
    t = tracekit.load(shared(SGLANG_MI300X))
    b = tracekit.breakdown(t, measured_tok_s=2000, tokens_per_step=32, weight_bytes="16GB", peak_bw=5300)
    tb = b.time_base
    assert tb.rejected_unprofiled_step_ms == pytest.approx(1000 * 32 / 2000)
    assert b.steps.mean_ms < 16.0 / 1.25  # the trace's own step (one decode step of bs=32), well under 16 ms
    assert tb.unprofiled_step_ms is None and tb.unprofiled_source is None
    assert tb.reference_step_ms == b.steps.mean_ms and tb.profiler_inflation is None
    assert any("is longer than the traced step" in w and "--measured-tok-s" in w for w in b.warnings)
    assert b.to_dict()["time_base"]["rejected_unprofiled_step_ms"] == pytest.approx(16.0)
    for key, lever in b.advice.levers.items():  # every saving against the traced step, each an upper bound
        if (lever.max_saving_ms or 0) > EPS_MS:
            assert lever.max_saving_ms <= b.steps.mean_ms and lever.bound == "upper_bound", key
    assert "savings are upper bounds" in b.headline
    # a time base that holds is kept: the same step measured at 40,000 tok/s (0.8 ms per step of 32)
    ok = tracekit.breakdown(t, measured_tok_s=40000, tokens_per_step=32).time_base
    assert ok.unprofiled_step_ms == pytest.approx(0.8) and ok.rejected_unprofiled_step_ms is None


LORA = ("lora_perf_lora_profile/runs/Qwen3-30B-A3B-Instruct-2507-BF16-expert_shared-20260609-133913/"
        "current_base_lora/profile/base")


@pytest.fixture(scope="module")
def lora_set():
    """The four GB300 TP ranks of the LoRA profile, analysed together (the folder)."""
    from tracekit.run.ranks import analyse_files, cross_rank

    files = sorted(shared(LORA).glob("*.trace.json.gz"))
    return cross_rank(analyse_files(files))


@pytest.mark.slow
def test_one_rank_and_the_rank_set_agree_on_latency_bound(lora_set):
    """Fix 7: TP-0 alone said the fused all-reduce+norm is not latency-bound (its median kernel, 7.3 µs, waiting
    included, against twice the 3.6 µs latency of a 4-rank NVLink ring), the folder said it is (its transfer,
    5.3 µs). One rule now: each call's transfer — measured across ranks, estimated from one rank's file."""
    alone = tracekit.breakdown(tracekit.load(shared(LORA) / "bs16-TP-0.trace.json.gz"))
    one = {(r["kind"], r["implementation"]): r for r in alone.advice["communication"]["collectives"]}
    together = {(r["kind"], r["implementation"]): r for r in lora_set.collectives}
    for key in together:
        assert one[key]["latency_bound"] == together[key]["latency_bound"], key
    fused = one[("all_reduce", "fused_ar_norm")]
    assert fused["latency_bound"] and fused["latency_us"] == pytest.approx(2 * 3 * 0.6)  # 2(n-1) hops of 0.6 µs
    # the transfer it is judged from is below the kernel's own median duration (which includes waiting)
    kernels = alone.facts.comm_split.kernels
    k = kernels.filter((kernels["impl"] == "fused_ar_norm") & kernels["step"].is_not_null())
    assert fused["call_us"] < float((k["end"] - k["start"]).median()) / 1e3
    assert "latency-bound" in alone.advice["communication"].verdict
    assert all(b.advice["communication"]["collectives"][0]["latency_bound"] for b in lora_set.rank_breakdowns)


def test_a_rank_set_shows_the_levers_of_its_ranks_not_only_the_cross_rank_verdict(lora_set):
    """Fix 2: `breakdown` of the LoRA folder printed (table and md) the cross-rank communication verdict and nothing
    on CUDA graphs, drafting or bandwidth, which the JSON had per rank."""
    import io

    from rich.console import Console

    from tracekit.report.ranks import ranks_md, render_ranks

    rep = lora_set.report()
    # issue 51 item 5: the levers are those of the one rank the verdict singles out: no pacing rank here, so the
    # one that waits least (the others wait for it most), not the slowest step (in lockstep, the one that waits most)
    assert lora_set.pacing_rank is None
    lead = min(range(4), key=lambda i: lora_set.wait_ms_by_rank[i])
    assert lead != max(range(4), key=lambda i: lora_set.step_ms_by_rank[i])
    b = lora_set.rank_breakdowns[lead]
    assert [x["lever"] for x in rep["levers"]] == [k for k in b.advice.order if k != "communication"]
    assert {x["rank"] for x in rep["levers"]} == {lora_set.labels[lead]}
    host = next(x for x in rep["levers"] if x["lever"] == "host_work")
    assert host["max_saving_ms_by_rank"] == [r.advice["host_work"].max_saving_ms for r in lora_set.rank_breakdowns]
    text = io.StringIO()
    render_ranks(rep, Console(file=text, width=80))
    for out in (ranks_md(rep), text.getvalue()):
        assert f"Levers on rank {lora_set.labels[lead]} (no single rank sets the pace; it waits least" in out
        assert "slowest" not in out
        assert "steps already replay CUDA graphs" in out  # cuda_graphs
        assert "drafting not detected" in out  # drafting
        assert "memory-bandwidth floor" in out  # memory bandwidth (no weight bytes given)
        assert "saving by rank: 0 " in out
