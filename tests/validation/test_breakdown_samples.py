"""Breakdown on our real H200 captures (sample_traces/), pinned against independent figures:
direct SQL over the nsys exports, `nsys stats` run on the GPU machine, the workloads' known weight bytes
and their unprofiled step times measured in the capture run (sample_traces/index.json)."""

from __future__ import annotations

import csv
import json
import sqlite3
from dataclasses import replace

import pytest

import tracekit

from conftest import SAMPLES, sample, sample_sqlite, sample_trace

# The validation sweeps are the slow tier (`python -m pytest -m slow`; .ci/run runs them after the fast tier).
pytestmark = pytest.mark.slow

NSYS_SAMPLES = ["hf-small-eager", "hf-small-graph", "hf-small-spec", "hf-small-spec-graph", "hf-large-eager",
                "hf-large-graph", "hf-large-spec", "synthetic-eager", "synthetic-graph", "synthetic-symm-eager"]
GEMM_LIKE = ("(s.value LIKE 'nvjet%' OR s.value LIKE '%gemv%' OR s.value LIKE '%gemm%' "
             "OR s.value LIKE '%splitKreduce%')")
# Launch inside a range on the same thread whose text matches LIKE {pattern}.
IN_RANGE = """EXISTS (SELECT 1 FROM NVTX_EVENTS n WHERE n.globalTid = r.globalTid AND r.start BETWEEN n.start AND n.end
              AND COALESCE(n.text, (SELECT value FROM StringIds WHERE id = n.textId)) LIKE '{pattern}')"""
# Launch inside a decode_step range other than the last one (the last of >= 3 steps has no following step and is
# excluded: contract, steps.excluded_reasons).
IN_ANALYSED_STEP = """EXISTS (SELECT 1 FROM NVTX_EVENTS n WHERE n.globalTid = r.globalTid AND r.start BETWEEN n.start AND n.end
              AND COALESCE(n.text, (SELECT value FROM StringIds WHERE id = n.textId)) LIKE 'decode_step %'
              AND n.start < (SELECT max(m.start) FROM NVTX_EVENTS m
                             WHERE COALESCE(m.text, (SELECT value FROM StringIds WHERE id = m.textId)) LIKE 'decode_step %'))"""


def index():
    return json.loads(sample("index.json").read_text())["traces"]


def sql(path, query):
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return con.execute(query).fetchone()
    finally:
        con.close()


def kernel_sum_ms(path, where):
    q = f"""SELECT coalesce(sum(k.end - k.start), 0) FROM CUPTI_ACTIVITY_KIND_KERNEL k
            JOIN StringIds s ON k.demangledName = s.id
            JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = k.correlationId
                 AND (r.globalTid >> 24) = (k.globalPid >> 24)
            WHERE {where}"""
    return sql(path, q)[0] / 1e6


@pytest.fixture(scope="module")
def results():
    # (every one is committed: a missing sample is a failure, never a skip)
    return {name: tracekit.breakdown(tracekit.load(sample_trace(name))) for name in NSYS_SAMPLES
            if sample(f"{name}/manifest.json")}


@pytest.mark.parametrize("name", NSYS_SAMPLES)
def test_partition_sums_to_step_time(results, name):
    b = results[name]
    total = sum(v for v in b.per_step_ms.values() if v is not None)
    assert total == pytest.approx(b.steps["mean_ms"], rel=0.005)
    assert all(v >= -1e-9 for v in b.per_step_ms.values() if v is not None)


@pytest.mark.parametrize("name", NSYS_SAMPLES)
def test_step_count_equals_step_ranges(results, name):
    b = results[name]
    path = sample_sqlite(name)
    n = sql(path, """SELECT count(*) FROM NVTX_EVENTS n WHERE eventType = 59 AND
                     COALESCE(n.text, (SELECT value FROM StringIds WHERE id = n.textId)) LIKE 'decode_step %'""")[0]
    assert n == index()[name]["steps"]  # what the capture recorded
    assert b.steps["count"] + b.steps["excluded"] == n
    assert b.steps["count"] == n - 1 and b.steps["excluded_reasons"] == {"last step (no following step)": 1}
    assert b.steps["marker"] == "nvtx" and b.steps["pattern"] == "decode_step #"


@pytest.mark.parametrize("name", NSYS_SAMPLES)
def test_gemm_time_equals_sql_sum(results, name):
    b = results[name]
    path = sample_sqlite(name)
    in_draft = IN_RANGE.format(pattern="draft")
    want = kernel_sum_ms(path, f"{GEMM_LIKE} AND {IN_ANALYSED_STEP} AND NOT {in_draft}") / b.steps["count"]
    assert b.kernel_ms_per_step["gemm"] == pytest.approx(want, rel=1e-9)
    assert want > 0


def test_drafting_is_nonzero_exactly_in_the_speculative_trace(results):
    for name, b in results.items():
        if "spec" in name:
            path = sample_sqlite(name)
            in_draft = IN_RANGE.format(pattern="draft") + " AND " + IN_ANALYSED_STEP
            memops = sum(sql(path, f"""SELECT coalesce(sum(m.end - m.start), 0) FROM {t} m
                        JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = m.correlationId
                        AND (r.globalTid >> 24) = (m.globalPid >> 24) WHERE {in_draft}""")[0]
                         for t in ("CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET")) / 1e6
            # all GPU work launched inside a draft range: kernels and memory operations
            want = (kernel_sum_ms(path, in_draft) + memops) / b.steps["count"]
            assert b.kernel_ms_per_step["drafting"] == pytest.approx(want, rel=1e-9)
            assert b.per_step_ms["drafting"] > 0 and b.advice["drafting"]["applicable"]
            assert b.advice["drafting"]["detection"] == "ranges"
        else:
            assert b.per_step_ms["drafting"] == 0 and not b.advice["drafting"]["applicable"]
            # never "no drafting": the verdict says what tracekit could and could not see
            assert b.advice["drafting"]["detection"] == "not_detected"
            assert b.advice["drafting"]["verdict"].startswith("drafting not detected")


@pytest.mark.parametrize("name", ["hf-small-eager", "hf-small-graph"])
def test_kernel_totals_match_nsys_stats(name):
    """`nsys stats --report cuda_gpu_kern_sum`, run on the H200 machine on the same export."""
    path = sample_trace(name)
    stats = sample(f"{name}/nsys_stats_kern_sum.csv")
    from tracekit.results.kernels import kernel_summary

    ours = {k["name"]: k for k in kernel_summary(tracekit.load(path))["kernels"]}
    rows = list(csv.DictReader(stats.open()))
    assert len(rows) == len(ours)
    for r in rows:
        k = ours[r["Name"]]
        assert k["count"] == int(r["Instances"])
        assert round(k["total_ms"] * 1e6) == int(r["Total Time (ns)"])


def test_cuda_graph_predictions_within_10pct_of_measured(results):
    """Predicted graph-replay step (from each eager trace) vs the unprofiled graph step measured on the H200."""
    ix = index()
    pairs = [("hf-small-eager", "hf-small-graph"), ("hf-large-eager", "hf-large-graph"),
             ("synthetic-eager", "synthetic-graph"), ("hf-small-spec", "hf-small-spec-graph")]
    for eager, graph in pairs:
        if eager not in results:
            continue
        adv = results[eager].advice["cuda_graphs"]
        measured = ix[graph]["unprofiled_step_ms"]
        assert adv["applicable"] is True
        assert adv["predicted_step_ms"] == pytest.approx(measured, rel=0.10), (eager, adv, measured)
        # the saving is against the unprofiled eager step of the manifest (the time base), not the traced one
        tb = results[eager].time_base
        assert tb.unprofiled_source == "manifest" and tb.reference_step_ms == ix[eager]["unprofiled_step_ms"]
        assert adv["max_saving_ms"] == pytest.approx(tb.reference_step_ms - adv["predicted_step_ms"])


def test_graph_replayed_traces_are_not_applicable(results):
    for name in ("hf-small-graph", "hf-large-graph", "synthetic-graph", "hf-small-spec-graph"):
        if name in results:
            adv = results[name].advice["cuda_graphs"]
            assert adv["applicable"] is False and "already replay CUDA graphs" in adv["verdict"]


def test_single_gpu_without_collectives_has_no_communication_saving(results):
    for name, b in results.items():
        if "symm" in name:
            # torch symmetric-memory one_shot_all_reduce at world size 1 launches real kernels
            assert b.kernel_ms_per_step["communication"] > 0
            assert b.advice["communication"]["max_saving_ms"] == pytest.approx(b.per_step_ms["communication"])
        else:
            assert b.advice["communication"]["max_saving_ms"] == 0


def test_roofline_from_the_manifest(results):
    b = results["hf-large-eager"]
    man = json.loads((SAMPLES / "hf-large-eager" / "manifest.json").read_text())
    r = b.roofline
    assert r["weight_bytes_per_step"] == man["weight_bytes_per_step"] and r["weight_bytes_source"] == "manifest"
    assert b.gpu["peak_bw_source"] == "manifest" and b.gpu["peak_bw_gbps"] == man["peak_bw_gbps"]
    assert r["floor_ms"] == pytest.approx(man["weight_bytes_per_step"] / (man["peak_bw_gbps"] * 1e9) * 1e3)
    assert r["fraction_of_ceiling"] == pytest.approx(r["floor_ms"] / man["unprofiled_step_ms"])
    assert r["gemm_achieved_bw_gbps"] == pytest.approx(
        man["weight_bytes_per_step"] / (b.kernel_ms_per_step["gemm"] * 1e-3) / 1e9)


@pytest.mark.parametrize("name", ["hf-small-eager-torch", "hf-large-eager-torch"])
def test_weight_bytes_from_recorded_shapes_within_5pct(name):
    """Shapes-recorded torch traces: inferred bytes vs the model's true parameter bytes (manifest)."""
    path = sample(f"{name}/trace.json.gz")
    trace = tracekit.load(path)
    truth = trace.manifest["weight_bytes_per_step"]
    b = tracekit.breakdown(replace(trace, manifest=None), peak_bw=4800)
    assert b.roofline["weight_bytes_source"] == "shapes"
    assert b.roofline["weight_bytes_per_step"] == pytest.approx(truth, rel=0.05)


def test_torch_and_nsys_traces_of_the_same_loop_agree_on_kernel_time():
    """Same workload captured by the two profilers: per-step gemm kernel time agrees within 10%."""
    a = tracekit.breakdown(tracekit.load(sample("hf-small-eager/trace.sqlite")))
    b = tracekit.breakdown(tracekit.load(sample("hf-small-eager-torch/trace.json.gz")))
    assert b.steps["marker"] == "annotation"
    assert b.kernel_ms_per_step["gemm"] == pytest.approx(a.kernel_ms_per_step["gemm"], rel=0.10)


@pytest.mark.parametrize("workload", ["synthetic", "hf-small"])
def test_allreduce_implementation_cost_within_15pct_of_measured(workload):
    """Symmetric-memory one-shot all-reduce vs NCCL (no kernel at world size 1), both graph-replayed: the measured
    unprofiled step difference against the all-reduce's estimated cost from the symm trace alone."""
    ix = index()
    s, n = f"tp1-{workload}-symm1-graph", f"tp1-{workload}-nccl-graph"
    assert s in ix and n in ix, "the tp1 captures are committed (sample_traces/index.json)"
    c = tracekit.breakdown(tracekit.load(SAMPLES.parent / ix[s]["path"])).advice["communication"]
    measured = ix[s]["unprofiled_step_ms"] - ix[n]["unprofiled_step_ms"]
    assert c["implementation_cost_ms"] == pytest.approx(measured, rel=0.15)
    assert c["max_saving_ms"] < c["implementation_cost_ms"]  # kernel time alone understates it
    nccl = tracekit.breakdown(tracekit.load(SAMPLES.parent / ix[n]["path"])).advice["communication"]
    assert nccl["max_saving_ms"] == 0 and nccl["applicable"] is False
