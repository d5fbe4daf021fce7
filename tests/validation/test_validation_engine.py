"""Issue 16 validation (docs/validation.md, "Serving-engine traces without markers"): the unmarked H200 captures
against their marked twins and manifests, the plain step predicted from a speculative trace against the plain step
measured in the same capture run, the phase of the public SGLang / vLLM / training traces, and renamed draft
ranges. The row builders are what the doc's cog blocks print; the figures they are checked against come from the
manifests (steps, K, unprofiled times), the marked captures' own draft ranges and the traces' annotations.
"""

from __future__ import annotations

import functools
import gzip
import json
import shutil
import sqlite3
import tempfile
from pathlib import Path

import polars as pl
import pytest
from test_validation_timebase import analysed, index, pct

import tracekit

from conftest import SAMPLES, sample_sqlite, sample_trace, shared

# The validation sweeps are the slow tier (`python -m pytest -m slow`; .ci/run runs them after the fast tier).
pytestmark = pytest.mark.slow

# (marked capture, the same workload captured without any range of ours)
TWINS = [("spec-small-eager", "spec-small-eager-nomark"), ("spec-small-eager-torch", "spec-small-eager-torch-nomark"),
         ("spec-small-graph", "spec-small-graph-nomark"), ("spec-small-graph-torch", "spec-small-graph-torch-nomark"),
         ("spec-large-graph", "spec-large-graph-nomark"), ("serve-small-graph", "serve-small-graph-nomark")]
SPEC = ["spec-small-graph", "spec-small-graph-nomark", "spec-small-graph-torch", "spec-small-graph-torch-nomark",
        "spec-large-graph", "spec-large-graph-nomark", "spec-small-eager", "spec-small-eager-nomark",
        "spec-small-eager-torch", "spec-small-eager-torch-nomark", "spec-large-eager"]
# eager captures whose predicted plain step misses the measured one by more than 10% (docs/validation.md says why:
# the manifest timed the spec step at another host speed than the plain step; re-examined for issue 23 and pinned by
# test_drafting_evidence.test_eager_torch_plain_step_miss_is_the_manifests_own_timing)


@functools.cache
def unmarked_rows() -> list[dict]:
    ix = index()
    rows = []
    for marked, bare in TWINS:
        a, b = analysed(marked), analysed(bare)
        da, db = a.kernel_ms_per_step["drafting"], b.kernel_ms_per_step["drafting"]
        rows.append(dict(marked=marked, unmarked=bare, manifest_steps=ix[bare]["steps"],
                         steps=b.steps["count"] + b.steps["excluded"], analysed=b.steps["count"],
                         excluded=b.steps["excluded_reasons"], marker=b.steps["marker"], phase=b.steps["phase"],
                         detection=b.advice["drafting"]["detection"], marked_detection=a.advice["drafting"]["detection"],
                         drafting_marked=da, drafting=db, error=pct(db, da) if da else None,
                         verdict=b.advice["drafting"]["verdict"]))
    return rows


@pytest.mark.parametrize("marked,bare", TWINS)
def test_unmarked_capture_steps_exact_and_drafting_by_structure(marked, bare):
    r = next(x for x in unmarked_rows() if x["unmarked"] == bare)
    assert r["marker"] == "inferred" and r["phase"] == "decode"
    assert r["steps"] == r["manifest_steps"]  # every profiled step found, the last one excluded
    assert r["excluded"] == {"last step (no following step)": 1}
    if bare.startswith("spec"):
        assert r["marked_detection"] == "ranges" and r["detection"] == "structure"
        assert abs(r["error"]) <= 5, r
    else:  # no speculation in the serving loop: never "no drafting"
        assert r["detection"] == "not_detected" and r["verdict"].startswith("drafting not detected")


def span_only_plain(b) -> float:
    """The first version, no longer what tracekit does: the verify forward's whole span re-costed at one token (its
    launch gaps too), on the same time base as ``advice.drafting.predicted_step_ms``."""
    from tracekit.analyses.drafting import step_forwards

    x = step_forwards(b.activities)
    t = x.filter(pl.col("target").fill_null(False)).group_by("step").agg(
        span=pl.col("end").max() - pl.col("start").min(), busy=pl.col("dur").sum())
    span, busy = float(t["span"].mean()) / 1e6, float(t["busy"].mean()) / 1e6
    f = b.facts.verify.token_factor or 1.0
    assert busy <= span
    return (span / f + b.gaps["between_steps"]) * b.time_base.reference_step_ms / b.steps["mean_ms"]


@functools.cache
def plain_rows() -> list[dict]:
    ix = index()
    rows = []
    for name in SPEC:
        b = analysed(name)
        d = b.advice["drafting"]
        meas = ix[name]["unprofiled_plain_step_ms"]
        alt = span_only_plain(b)
        rows.append(dict(name=name, size=ix[name]["size"], mode=ix[name]["mode"], profiler=ix[name]["profiler"],
                         spec_ms=ix[name]["unprofiled_step_ms"], predicted=d["predicted_step_ms"], measured=meas,
                         measured_share=meas / ix[name]["unprofiled_step_ms"],
                         factor=b.facts.verify.token_factor, error=pct(d["predicted_step_ms"], meas),
                         span_only=alt, span_only_error=pct(alt, meas), detection=d["detection"]))
    return rows


@pytest.mark.parametrize("name", SPEC)
def test_plain_step_from_the_spec_trace_within_10pct(name):
    r = next(x for x in plain_rows() if x["name"] == name)
    assert abs(r["error"]) <= 10, r


def test_plain_step_holds_on_both_sizes_in_graph_mode():
    """Graph-replayed verify forwards (the serving case) on both model sizes: within the issue's 10% (issue 42; the
    re-costing, fitted on none of these H200 captures, gives +1.7..+7.0%: docs/validation.md, "The plain step")."""
    graph = [r for r in plain_rows() if r["mode"] == "graph"]
    assert {r["size"] for r in graph} == {"small", "large"} and len(graph) == 6
    assert all(abs(r["error"]) <= 10 for r in graph), graph


# --------------------------------------------------------------------------- public traces: phase and advice

DECODE = ["TraceLens/tests/traces/inference/sglang_decode/sglang_Qwen3-8B_decode.json.gz",
          "TraceLens/tests/traces/inference/vllm_decode_full/graph_execution.json.gz",
          "nvllm/benchmarks/nvllm/traces/cute_paged_attn/2026-04-13-nsys/rank0.1776116491109655086.pt.trace.json.gz",
          "lora_perf_lora_profile/runs/Qwen3-30B-A3B-Instruct-2507-BF16-expert_shared-20260609-133913/"
          "current_base_lora/profile/base/bs16-TP-0.trace.json.gz"]
NOT_DECODE = ["TraceLens/tests/traces/b200/eager_trace.json.gz",
              "HolisticTraceAnalysis/tests/data/nccl_parser_config/nccl_data.json.gz",
              "HolisticTraceAnalysis/tests/data/trace_diff/control/control.json.gz",
              "HolisticTraceAnalysis/tests/data/timeline_analysis/sampled_rank-0.json.gz",
              "kineto/tb_plugin/samples/resnet50_num_workers_0/worker0.pt.trace.json.gz"]
LEVERS = ("cuda_graphs", "communication", "drafting", "memory_bandwidth")


def external_row(rel: str) -> dict:
    b = tracekit.breakdown(tracekit.load(shared(rel)))
    return dict(trace=rel, steps=b.steps["count"], excluded=b.steps["excluded_reasons"], marker=b.steps["marker"],
                phase=b.steps["phase"], levers=[k for k in LEVERS if b.advice[k]["applicable"]],
                headline=b.headline, ceiling_in_headline="tok/s" in b.headline,
                verdict=b.advice["cuda_graphs"]["verdict"])


@pytest.mark.parametrize("rel", DECODE, ids=[r.split("/")[-1] for r in DECODE])
def test_public_decode_traces_are_decode(rel):
    r = external_row(rel)
    assert r["phase"] == "decode" and r["steps"] >= 1 and r["marker"] == "annotation"
    assert "no decode advice" not in r["headline"]


@pytest.mark.parametrize("rel", NOT_DECODE, ids=[r.split("/")[-1] for r in NOT_DECODE])
def test_prefill_and_training_get_the_split_but_no_decode_verdict(rel):
    r = external_row(rel)
    assert r["phase"] != "decode" and r["levers"] == []
    assert "no decode advice" in r["headline"] and not r["ceiling_in_headline"]
    assert "decode advice does not apply" in r["verdict"]


# --------------------------------------------------------------------------- renamed draft ranges

RENAMED = ["hf-small-spec", "hf-small-spec-graph", "hf-small-spec-torch", "spec-small-graph", "spec-small-eager-torch"]


def renamed_copy(name: str, tmp: Path) -> tuple[Path, int]:
    """A copy of sample ``name`` whose draft ranges (`draft`, `draft_extend`) are renamed `propose`,
    `propose_extend`: no range matches the default --draft-range any more. Returns (path, ranges renamed)."""
    src = sample_trace(name)
    new = {"draft": "propose", "draft_extend": "propose_extend"}
    if src.name.endswith(".json.gz"):
        doc = json.load(gzip.open(src))
        n = 0
        for e in doc["traceEvents"]:
            if e.get("name") in new and e.get("cat") in ("user_annotation", "gpu_user_annotation"):
                e["name"] = new[e["name"]]
                n += e["cat"] == "user_annotation"
        dst = tmp / name / "trace.json"  # (not gzipped: faster to write)
        dst.parent.mkdir(parents=True, exist_ok=True)
        with open(dst, "w") as f:
            json.dump(doc, f)
        return dst, n
    dst = tmp / name / "trace.sqlite"
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(sample_sqlite(name), dst)
    db = sqlite3.connect(dst)
    n = db.execute("""SELECT count(*) FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId
                      WHERE coalesce(e.text, s.value) IN ('draft', 'draft_extend')""").fetchone()[0]
    for old, rep in new.items():
        db.execute("UPDATE StringIds SET value = ? WHERE value = ?", (rep, old))
        db.execute("UPDATE NVTX_EVENTS SET text = ? WHERE text = ?", (rep, old))
    db.commit()
    db.close()
    return dst, n


def renamed_rows(names=RENAMED) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for name in names:
            a = analysed(name)
            path, n = renamed_copy(name, Path(d))
            b = tracekit.breakdown(tracekit.load(path))
            da, db = a.kernel_ms_per_step["drafting"], b.kernel_ms_per_step["drafting"]
            rows.append(dict(name=name, renamed=n, detection=b.advice["drafting"]["detection"],
                             drafting_ranges=da, drafting=db, error=pct(db, da), verdict=b.advice["drafting"]["verdict"],
                             k=json.loads((SAMPLES / name / "manifest.json").read_text())["spec"]["draft_tokens"]))
    return rows


def test_renamed_draft_ranges_found_by_structure_never_no_drafting():
    # the hf-* traces are checked below the breakdown in test_drafting_structure.py; this adds the SGLang-shaped
    # graph capture (draft, verify and draft-extend graphs); docs/validation.md has every row
    for r in renamed_rows(["spec-small-graph"]):
        assert r["renamed"] > 0 and r["detection"] in ("structure", "not_detected"), r
        assert "no drafting" not in r["verdict"].replace("drafting not detected", "")
        assert r["detection"] == "structure" and abs(r["error"]) <= 5, r
