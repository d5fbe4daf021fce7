"""Steady state (contract steps.excluded_reasons): the last step, warm-up/transition steps, by sequence."""

from __future__ import annotations

import json

import polars as pl
import pytest

import tracekit
from tracekit.analyses.steady import (
    LAST_STEP,
    MIN_COMPOSITION_OVERLAP,
    TRANSITION,
    reason_counts,
    steady_exclusions,
    step_signatures,
)
from tracekit.run.pipeline import step_table

from conftest import SAMPLES, sample_trace, shared


def _tables(t, **kw):
    """(every step window with GPU work and its period, the attributed activities in steps, the steps)."""
    st = step_table(t, **kw)
    return st.periods, st.attribution.activities.filter(pl.col("step").is_not_null()), st.attribution.steps

SAMPLE_TRACES = sorted(p for p in SAMPLES.glob("*/trace.*") if "wholegraph" not in p.parent.name)


def _prior(steps, table):
    """The caller's reasons: cut windows (no end), windows without GPU work on the device."""
    w = steps.windows.select("step", reason=pl.when(pl.col("end").is_null()).then(pl.lit("cut by capture window")))
    return w.with_columns(reason=pl.when(pl.col("reason").is_null() & ~pl.col("step").is_in(table["step"].implode()))
                          .then(pl.lit("no GPU work")).otherwise(pl.col("reason")))


def test_hf_small_graph_last_step_excluded():
    """hf-small-graph: 16 steps; the last has no following step, so no trailing host time: 3.1 ms against 5.2-6.6
    ms for the others (the unprofiled step is 2.8 ms: the profiled steps carry the host's time to the next)."""
    t = tracekit.load(sample_trace("hf-small-graph"))
    table, acts, steps = _tables(t)
    ex = steady_exclusions(acts, _prior(steps, table))
    assert reason_counts(ex) == {LAST_STEP: 1}
    last = int(table.sort("p_start")["step"][-1])
    assert ex.filter(pl.col("reason") == LAST_STEP)["step"].to_list() == [last]
    period = table.select("step", ms=pl.col("period") / 1e6)
    assert period.filter(pl.col("step") == last)["ms"][0] == pytest.approx(3.08, abs=0.05)
    assert period.filter(pl.col("step") != last)["ms"].min() > 5.0
    assert ex["sig"].n_unique() == 1  # one graph replay + the token copy, the same every step


def _listed_phases(path, steps, prior):
    """``prior`` with each step's phase as the capture ran it, where its manifest lists one per profiled step
    (``phases``: the serve-prefill captures run a prefill step, then decode steps); unchanged otherwise."""
    man = json.load(open(path.parent / "manifest.json"))
    listed = man.get("phases")  # (a speculative capture's ``phases`` names the parts of its loop instead)
    if not (listed and set(listed) <= {"prefill", "decode", "mixed"}):
        return prior
    w = steps.windows.filter(pl.col("end").is_not_null()).sort("start")
    assert w.height == len(listed) == man["steps"]  # every profiled step is a complete step
    return prior.join(w.select("step", phase=pl.Series(listed)), on="step", how="left")


@pytest.mark.parametrize("path", SAMPLE_TRACES, ids=[p.parent.name for p in SAMPLE_TRACES])
@pytest.mark.slow
def test_captures_have_no_warm_up_steps(path):
    """Every capture profiles steps after 40 timed ones: no step is a warm-up, only the last is excluded. A capture
    that runs steps of two phases (serve-prefill-*: a prefill step, then 11 decode steps, manifest ``phases``) has
    a steady step per phase: its prefill step is a step of another phase, not a warm-up, and the decode steps'
    compositions are compared among themselves."""
    t = tracekit.load(path)
    table, acts, steps = _tables(t)
    man = json.load(open(path.parent / "manifest.json"))
    if (man.get("draft_model") or {}).get("overlap_scheduler") and steps.marker == "inferred":
        # (an overlap scheduler's read lands mid-iteration: the inferred steps are the iterations rotated, the
        # capture's first and last partial: tests/analyses/test_inferred_steps.py)
        from tracekit.categories import CUT_BY_WINDOW

        ex = steady_exclusions(acts, _prior(steps, table))
        assert reason_counts(ex) == {LAST_STEP: 1, CUT_BY_WINDOW: 2}  # (no warm-up)
        assert ex["overlap"].drop_nulls().min() >= 0.95
        return
    ex = steady_exclusions(acts, _listed_phases(path, steps, _prior(steps, table)))
    assert reason_counts(ex) == {LAST_STEP: 1}
    assert ex["overlap"].drop_nulls().min() >= 0.95


def test_speculative_step_with_fewer_launches_is_kept():
    """hf-small-spec: one marked step launches 26 fewer kernels (its acceptance skipped a KV rollback): another
    sequence, yet the same step; kept."""
    t = tracekit.load(sample_trace("hf-small-spec"))
    table, acts, steps = _tables(t)
    per = acts.group_by("step").len()
    assert per["len"].n_unique() == 2  # two step shapes, counted straight from the attributed activities
    ex = steady_exclusions(acts, _prior(steps, table))
    assert ex["sig"].n_unique() == 2 and reason_counts(ex) == {LAST_STEP: 1}
    odd = per.filter(pl.col("len") != pl.col("len").mode().first())["step"].to_list()
    assert ex.filter(pl.col("step").is_in(odd))["reason"].to_list() == [None]


def test_warm_up_and_merged_steps_are_transitions():
    """Definition unit test (real activities, arranged here): hf-small-graph's graph-replayed steps, plus one eager
    step of hf-small-eager as a warm-up step (the same kernels, launched one by one), plus two graph steps merged
    into one: both differ from the steady sequence in composition, the others do not."""
    g = tracekit.load(sample_trace("hf-small-graph"))
    e = tracekit.load(SAMPLES / "hf-small-eager/trace.sqlite")
    _, ga, _ = _tables(g)
    _, ea, _ = _tables(e)
    cols = ["step", "start", "name", "kind", "category", "graphed", "stream"]
    ga = ga.select(cols).with_columns(pl.col("name").cast(pl.String), pl.col("kind").cast(pl.String),
                                      pl.col("category").cast(pl.String))
    warm = ea.filter(pl.col("step") == 3).select(cols).with_columns(
        pl.col("name").cast(pl.String), pl.col("kind").cast(pl.String), pl.col("category").cast(pl.String),
        step=pl.lit(100, pl.Int64))
    merged = ga.filter(pl.col("step").is_in([4, 5])).with_columns(step=pl.lit(101, pl.Int64))
    acts = pl.concat([warm, ga.filter(~pl.col("step").is_in([4, 5])), merged], how="vertical_relaxed")
    order = [100] + [s for s in range(16) if s not in (4, 5)] + [101]
    ex = steady_exclusions(acts, pl.DataFrame({"step": order, "reason": [None] * len(order)},
                                              schema={"step": pl.Int64, "reason": pl.String}))
    got = dict(ex.select("step", "reason").iter_rows())
    assert got[100] == TRANSITION  # eager where the steady steps replay a graph
    assert got[101] == LAST_STEP  # (the last one: its own reason comes first)
    # a step excluded by phase still follows the one before it: that one has its trailing host time
    ex2 = steady_exclusions(acts, pl.DataFrame({"step": order, "reason": [None] * (len(order) - 1) + ["phase"]},
                                               schema={"step": pl.Int64, "reason": pl.String}))
    assert dict(ex2.select("step", "reason").iter_rows())[15] is None
    # the merged step in the middle: half its composition is the steady step's
    mid = [100, 101] + order[1:-1]
    ex3 = steady_exclusions(acts, pl.DataFrame({"step": mid, "reason": [None] * len(mid)},
                                               schema={"step": pl.Int64, "reason": pl.String}))
    got3 = dict(ex3.select("step", "reason").iter_rows())
    ov = dict(ex3.select("step", "overlap").iter_rows())
    assert got3[101] == TRANSITION and ov[101] == pytest.approx(0.5, abs=0.01) and ov[101] < MIN_COMPOSITION_OVERLAP
    assert got3[100] == TRANSITION and ov[100] < 0.1
    assert all(ov[s] == 1.0 for s in order[1:-1] if s != 15) and got3[15] == LAST_STEP


def test_signature_is_order_sensitive_per_stream():
    """Definition unit test: the same kernels in another order make another signature; interleaving across
    streams does not."""
    a = pl.DataFrame({"step": [0, 0, 0, 1, 1, 1, 2, 2, 2], "start": [1, 2, 3, 1, 2, 3, 1, 2, 3],
                      "name": ["a", "b", "c", "b", "a", "c", "a", "c", "b"], "kind": ["kernel"] * 9,
                      "graphed": [False] * 9, "stream": [7, 7, 7, 7, 7, 7, 7, 9, 7]})
    s = dict(step_signatures(a).select("step", "sig").iter_rows())
    assert s[0] != s[1]  # a b c / b a c on one stream
    a2 = a.with_columns(start=pl.when(pl.col("step") == 2).then(pl.Series([1, 3, 2] * 3)).otherwise("start"))
    s2 = dict(step_signatures(a2).select("step", "sig").iter_rows())
    assert s2[2] == s[2]  # c on stream 9 started before or after b on stream 7: the same step


def test_gb300_batch_merge_steps_kept():
    """SGLang GB300, inferred steps: the first two decode steps after the prefills also merge the new requests into
    the batch (CatArrayBatchedCopy and a few copies: 8-15 more eager kernels than the ~690 of a steady step):
    real decode steps, kept."""
    import tracekit.analyses.attribution as bd
    from tracekit.analyses.phase import select_phase, step_phases
    from tracekit.steps import infer_steps

    path = shared("lora_perf_lora_profile/runs/Qwen3-30B-A3B-Instruct-2507-BF16-expert_shared-20260609-133913/"
                  "current_base_lora/profile/base/bs16-TP-0.trace.json.gz")
    t = tracekit.load(path)
    orig = bd.find_steps
    bd.find_steps = lambda trace, step_range=None, device=None, every_phase=False: infer_steps(trace, device=device)
    try:
        table, acts, steps = _tables(t)
    finally:
        bd.find_steps = orig
    ph = step_phases(t, steps.windows, acts)
    sel, _ = select_phase(ph)
    prior = _prior(steps, table).join(sel.select("step", r2="reason"), on="step", how="left").select(
        "step", reason=pl.coalesce("reason", "r2"))
    ex = steady_exclusions(acts, prior)
    assert reason_counts(ex) == {"cut by capture window": 2, "phase": 7, LAST_STEP: 1}
    kept = ex.filter(pl.col("reason").is_null())
    assert kept.height == 7 and kept["sig"].n_unique() >= 2
    cat = acts.filter(pl.col("name").cast(pl.String).str.contains("CatArrayBatchedCopy")).group_by("step").len()
    assert cat.filter(pl.col("step").is_in(kept["step"].implode())).height >= 1
