"""Advice (``tracekit.analyses.advice``): each lever from the facts a breakdown measured (``Breakdown.facts``), on
real captures. The facts come from the pipeline; the figures the levers are checked against come from elsewhere:
the capture's manifest (its unprofiled step, weight bytes and peak bandwidth: the memory floor is their quotient),
SQL on the export (the work launched one by one per step, the graph-replayed share of kernel time), and the
contract's thresholds (CUDA graphs do not apply from 80% of kernel time replayed; memory-bound from 70% of the
floor). Variations of the real facts (``dataclasses.replace``) test each rule on its own."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

import tracekit
from tracekit.analyses.advice import advise, floor_of

from conftest import sample, sample_sqlite, sample_trace, sql_rows


def facts(name: str):
    return tracekit.breakdown(tracekit.load(sample_trace(name))).facts


@pytest.fixture(scope="module")
def eager():
    """hf-small-eager: 16 eager decode steps on an H200, its manifest beside it."""
    return facts("hf-small-eager")


@pytest.fixture(scope="module")
def manifest():
    return json.loads(sample("hf-small-eager/manifest.json").read_text())


def test_the_time_base_and_the_memory_floor_are_the_manifest(eager, manifest):
    assert (eager.reference_ms, eager.reference_source) == (manifest["unprofiled_step_ms"], "manifest")
    floor_ms = manifest["weight_bytes_per_step"] / (manifest["peak_bw_gbps"] * 1e9) * 1e3  # 988,010,240 B at 4.8 TB/s
    assert floor_of(eager).ms == pytest.approx(floor_ms, rel=1e-12) and floor_ms == pytest.approx(0.20584, abs=1e-5)
    m = advise(eager).levers["memory_bandwidth"]
    assert m.applicable and m.predicted_step_ms == pytest.approx(floor_ms, rel=1e-12)
    assert m.max_saving_ms == pytest.approx(manifest["unprofiled_step_ms"] - floor_ms, rel=1e-12)
    assert not floor_of(eager).bound  # (0.6% of the step)


def test_cuda_graphs_replay_each_launch_at_the_replay_gap(eager):
    """The CUDA-graph model: busy + work launched one by one x the replay gap + host stalls + the host work after
    waits; the launches per step counted by SQL (runtime calls that put work on the GPU, inside a decode_step range)."""
    (launched,), = sql_rows(sample_trace("hf-small-eager"), """
        SELECT count(*) FROM (SELECT correlationId, globalPid FROM CUPTI_ACTIVITY_KIND_KERNEL UNION ALL
                              SELECT correlationId, globalPid FROM CUPTI_ACTIVITY_KIND_MEMCPY UNION ALL
                              SELECT correlationId, globalPid FROM CUPTI_ACTIVITY_KIND_MEMSET) a
        JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = a.correlationId AND (r.globalTid >> 24) = (a.globalPid >> 24)
        JOIN NVTX_EVENTS n ON n.globalTid = r.globalTid AND r.start BETWEEN n.start AND n.end
             AND n.text = 'decode_step 40'""")
    assert launched == eager.launched_per_step == 1209
    lever = advise(eager).levers["cuda_graphs"]
    want = eager.busy_ms + launched * 0.58e-3 + eager.gaps["host_stalls"] + eager.after_waits_ms
    assert lever.applicable and lever.predicted_step_ms == pytest.approx(want, rel=1e-12)
    assert lever.max_saving_ms == pytest.approx(eager.reference_ms - want, rel=1e-12)
    assert lever.basis == "estimated" and lever.bound == "exact"


def test_graphs_already_replayed_leave_nothing_to_graph():
    path = sample_sqlite("hf-small-graph")
    (graphed, total), = sql_rows(path, "SELECT sum(CASE WHEN graphNodeId IS NOT NULL THEN end - start END), "
                                       "sum(end - start) FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE deviceId = 0")
    assert graphed / total >= 0.8  # the contract's threshold
    f = facts("hf-small-graph")
    assert f.graph_kernel_share >= 0.8
    lever = advise(f).levers["cuda_graphs"]
    assert not lever.applicable and lever.max_saving_ms == 0 and lever.basis == "none"
    assert "cuda_graphs" not in advise(f).ranked
    # ... and the same facts with a fifth of the kernel time launched one by one: the lever applies
    assert advise(replace(f, graph_kernel_share=0.79)).levers["cuda_graphs"].applicable


def test_ranked_by_saving_memory_last_unless_bound(eager):
    a = advise(eager)
    savings = {k: a.levers[k].max_saving_ms for k in a.ranked}
    assert a.ranked == tuple(sorted(savings, key=lambda k: -savings[k])) and a.ranked[0] == "cuda_graphs"
    assert "memory_bandwidth" not in a.ranked and a.order[-1] == "memory_bandwidth" and a.bound_by is None
    bound = advise(replace(eager, floor_ms=0.7 * eager.reference_ms))  # at 70% of the floor: memory-bound
    assert bound.bound_by == "memory" and bound.order[0] == "memory_bandwidth"
    assert advise(replace(eager, floor_ms=0.69 * eager.reference_ms)).bound_by is None


def test_without_an_unprofiled_step_every_saving_is_an_upper_bound(eager):
    traced = replace(eager, reference_ms=eager.traced_ms, reference_source=None, upper_bounds=True)
    lever = advise(traced).levers["cuda_graphs"]
    assert lever.basis == "upper_bound" and lever.bound == "upper_bound"
    assert lever.max_saving_ms == pytest.approx(eager.traced_ms - lever.predicted_step_ms, rel=1e-12)


def test_no_host_wait_no_host_lever(eager):
    quiet = replace(eager, gaps={**dict(eager.gaps), "host_stalls": 0.0, "between_steps": 0.0})
    lever = advise(quiet).levers["host_work"]
    assert not lever.applicable and lever.basis == "measured" and "host_work" not in advise(quiet).ranked


def test_unknown_bytes_name_the_flag_that_resolves_them(eager):
    lever = advise(replace(eager, floor_ms=None, weight_bytes_per_step=None)).levers["memory_bandwidth"]
    assert lever.max_saving_ms is None and lever.basis == "unknown" and "--model" in lever.needs


def test_prefill_steps_get_the_split_but_no_lever(eager):
    a = advise(replace(eager, phase="prefill"))
    assert a.ranked == () and not any(lever.applicable for lever in a.levers.values())


def test_speculative_without_measured_drafting_says_which_is_missing():
    """One story (contract, Additions to /3 (2)): a step known to be speculative whose drafting time was not found
    never reads "drafting not detected"; the verdict says what is missing and the plain step is still predicted from
    the verify forward (the same figure as with the drafting found: it rests on the verify forward alone).
    zoo-sglang-chain-nomark: SGLang-shaped EAGLE, found by structure; here its drafting is taken away."""
    f = facts("zoo-sglang-chain-nomark")
    found = advise(f).levers["drafting"]
    assert found.extra["speculative"] is True and found.predicted_step_ms
    lost = advise(replace(f, draft_detection="not_detected",
                          per_step_ms={**f.per_step_ms, "drafting": 0.0})).levers["drafting"]
    text = lost.reading.sentence(lost)
    assert lost.extra["speculative"] is True and "not detected" not in text
    assert "drafting time is not measured" in text and "--draft-range" in text
    assert lost.predicted_step_ms == pytest.approx(found.predicted_step_ms)
    assert lost.max_saving_ms is None and not lost.applicable
