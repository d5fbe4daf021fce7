"""Drafting found by structure when the trace has no draft ranges (contract: advice.drafting.detection).

The truth is the capture's own `draft` ranges. A COPY of each speculative sample trace gets its `draft` range
texts renamed to `propose` (NVTX text / StringIds in the export, the annotation names in the Kineto JSON), so the
default --draft-range no longer matches; drafting found by structure on the copy must equal, within 5%, the
drafting kernel time the ranges give on the original (draft forwards are all the ranges hold, plus nothing the
taxonomy names), and never be reported as "no drafting". Non-speculative traces must give `not_detected`.
"""

from __future__ import annotations

import gzip
import json
import shutil
import sqlite3

import polars as pl
import pytest

import tracekit
from tracekit.analyses.drafting import NOT_DETECTED_VERDICT, detect_drafting, forwards
from tracekit.analyses.phase import step_phases
from tracekit.run.pipeline import step_table

from conftest import SAMPLES, sample_sqlite, sample_trace, shared


def _tables(t, **kw):
    """(analysed steps, their activities, the steps) with drafting from ranges or kernel names only."""
    st = step_table(t, detect_structure=False, **kw)
    return st.table, st.activities, st.attribution.steps

SPEC = ["hf-small-spec", "hf-small-spec-graph", "hf-small-spec-torch", "hf-large-spec"]


def renamed_copy(src, tmp_path):
    """A copy of ``src`` whose `draft` ranges are called `propose` (the original is never touched)."""
    dst = tmp_path / src.name
    if src.suffix == ".sqlite":
        shutil.copy(src, dst)
        db = sqlite3.connect(dst)
        n = db.execute("UPDATE StringIds SET value = 'propose' WHERE value = 'draft'").rowcount
        n += db.execute("UPDATE NVTX_EVENTS SET text = 'propose' WHERE text = 'draft'").rowcount
        db.commit()
        db.close()
    else:
        doc = json.load(gzip.open(src))
        n = 0
        for e in doc["traceEvents"]:
            if e.get("name") == "draft" and e.get("cat") in ("user_annotation", "gpu_user_annotation"):
                e["name"] = "propose"
                n += 1
        with gzip.open(dst, "wt") as f:
            json.dump(doc, f)
    assert n > 0
    return dst


def drafting_ms_per_step(table, acts, draft=None):
    """Kernel (and copy) time per step of the drafting activities: category drafting, or a structural draft id."""
    hit = pl.col("category") == "drafting"
    if draft is not None:
        acts = acts.with_columns(draft_s=draft)
        hit = hit | pl.col("draft_s").is_not_null()
    return float(acts.filter(hit)["dur"].sum()) / table.height / 1e6


@pytest.mark.parametrize("rel", SPEC)
@pytest.mark.slow
def test_renamed_draft_ranges_found_by_structure(rel, tmp_path):
    src = sample_trace(rel)
    if src.name.endswith(".sqlite.gz"):
        src = sample_sqlite(rel)  # (renamed_copy edits a plain SQLite copy)
    table, acts, _ = _tables(tracekit.load(src))
    by_ranges = drafting_ms_per_step(table, acts)
    assert by_ranges > 0.5  # 0.65-0.70 ms of draft-forward kernels per step on the H200
    copy = renamed_copy(src, tmp_path)
    t = tracekit.load(copy)
    assert t.ranges.filter(pl.col("name") == "draft").height == 0
    table2, acts2, steps2 = _tables(t)  # default --draft-range: nothing matches now
    assert (acts2["category"] == "drafting").sum() == 0
    phases = step_phases(t, steps2.windows, acts2)
    draft, info = detect_drafting(acts2, phases=phases)
    assert info.detection == "structure"
    looked_at = phases.filter(pl.col("phase").is_in(["decode", "unknown"]))["step"]
    assert info.steps == acts2.filter(pl.col("step").is_in(looked_at.implode()))["step"].n_unique() > 0
    assert info.draft_forwards_per_step == 3  # the manifest's K
    assert json.load(open(SAMPLES / rel / "manifest.json"))["spec"]["draft_tokens"] == 3
    by_structure = drafting_ms_per_step(table2, acts2, draft)
    assert by_structure == pytest.approx(by_ranges, rel=0.05)
    assert "drafting found by structure" in info.warning


def test_structure_on_inferred_steps_too(tmp_path):
    """No draft ranges and steps from the period (each starts after the acceptance read, so its first forward
    is preceded by the previous step's KV rollback): the same drafting time per step."""
    from tracekit.steps import infer_steps

    src = sample_sqlite("hf-small-spec")
    table, acts, _ = _tables(tracekit.load(src))
    by_ranges = drafting_ms_per_step(table, acts)
    t = tracekit.load(renamed_copy(src, tmp_path))
    # every attributed activity (the last marked step's too: the inferred steps are shifted against the marked ones)
    acts2 = step_table(t, detect_structure=False).attribution.activities.filter(pl.col("step").is_not_null())
    windows = infer_steps(t).windows.filter(pl.col("end").is_not_null())
    w = windows.select("pid", "tid", ws="start", we="end", istep="step").sort("ws")
    at = t.launches.sort("start").select("pid", "tid", "correlation", "start").join_asof(
        w, left_on="start", right_on="ws", by=["pid", "tid"], check_sortedness=False).filter(
        pl.col("istep").is_not_null() & (pl.col("start") <= pl.col("we")))
    acts_i = acts2.drop("step").join(at.select("pid", "correlation", step="istep"), on=["pid", "correlation"],
                                     how="inner").sort("step", "start")
    draft, info = detect_drafting(acts_i)
    assert info.detection == "structure" and info.spec_steps == windows.height == 15
    per_step = float(acts_i.with_columns(d=draft).filter(pl.col("d").is_not_null())["dur"].sum()) / 15 / 1e6
    assert per_step == pytest.approx(by_ranges, rel=0.05)


@pytest.mark.parametrize("rel", ["hf-small-eager", "hf-small-graph", "hf-small-graph-torch", "synthetic-eager",
                                 "tp1-hf-small-nccl-graph", "serve-small-graph", "kv-large-ctx16k"])
def test_plain_decode_is_not_detected_never_no_drafting(rel):
    t = tracekit.load(sample_trace(rel))
    table, acts, _ = _tables(t, draft_range=None)
    draft, info = detect_drafting(acts)
    assert info.detection == "not_detected" and draft.null_count() == draft.len()
    assert "drafting not detected" in info.warning and "no drafting" not in info.warning.replace(
        "drafting not detected", "")
    assert info.warning == NOT_DETECTED_VERDICT


@pytest.mark.parametrize("rel", [
    "lora_perf_lora_profile/runs/Qwen3-30B-A3B-Instruct-2507-BF16-expert_shared-20260609-133913/current_base_lora/"
    "profile/base/bs16-TP-0.trace.json.gz",  # MoE: a router top-k in every layer
    "TraceLens/tests/traces/inference/vllm_decode_full/graph_execution.json.gz",  # MoE (triton_kernels routing)
])
def test_moe_router_topk_is_not_a_draft_forward(rel):
    t = tracekit.load(shared(rel))
    table, acts, _ = _tables(t, draft_range=None)
    assert acts.filter(pl.col("name").cast(pl.String).str.contains(r"(?i)topk|routingIndices")).height >= 24
    draft, info = detect_drafting(acts)
    assert info.detection == "not_detected"


def test_target_forward_is_the_heaviest():
    """hf-small-spec: 4 forwards per step; the target's (24 layers, forward 3) holds the most GEMM time; the 3 draft
    forwards (2 thin layers + the 151,936 x 256 lm_head each) have equal GEMM time within 10%."""
    t = tracekit.load(sample_trace("hf-small-spec"))
    table, acts, _ = _tables(t, draft_range=None)
    f = forwards(acts)
    per = (f.filter(pl.col("fwd").is_not_null()).group_by("step", "fwd")
           .agg(g=pl.col("gemm_ns").first(), target=pl.col("target").first()).sort("step", "fwd"))
    assert per.height == 4 * table.height
    assert per.filter(pl.col("target"))["fwd"].unique().to_list() == [3]
    drafts = per.filter(~pl.col("target"))
    assert (drafts["g"].max() / drafts["g"].min()) < 1.1
    assert per.filter(pl.col("target"))["g"].min() > 3 * drafts["g"].max()


def test_steps_looked_at_need_no_phase():
    """Speculation never waits for the phase (contract, Additions to /3; issue 42: drafting was sought only in steps
    already known to be decode, while a speculative step was called decode only once drafting was found). A serving
    capture of one prefill step and eleven decode steps (its manifest: 12 steps, 11 of them decode; the prefill step
    is told by its token-proportional work, not by an engine annotation): every step is looked at, and none shows a
    draft model. Steps an engine's own annotation calls prefill, and training steps, are left out."""
    man = json.load(open(SAMPLES / "serve-prefill-eager-nomark" / "manifest.json"))
    assert (man["steps"], man["decode_steps_profiled"]) == (12, 11)
    t = tracekit.load(sample_trace("serve-prefill-eager-nomark"))
    st = step_table(t, phase="all", detect_structure=False)
    acts = st.attribution.activities.filter(pl.col("step").is_not_null())
    phases = step_phases(t, st.attribution.steps.windows, acts)
    assert sorted(phases.group_by("phase").len().rows()) == [("decode", 11), ("prefill", 1)]
    _, info = detect_drafting(acts, phases=phases)
    assert info.detection == "not_detected" and info.steps == man["steps"]
    # the same prefill step as the engine annotates it: left out
    annotated = phases.with_columns(source=pl.when(pl.col("phase") == "prefill").then(pl.lit("annotation"))
                                    .otherwise(pl.col("source")))
    _, info = detect_drafting(acts, phases=annotated)
    assert info.steps == man["decode_steps_profiled"]
