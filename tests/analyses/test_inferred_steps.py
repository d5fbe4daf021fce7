"""Steps inferred from the launch sequence's period (contract "Inferred steps"), with every range ignored.

The truth is the capture's own `decode_step` ranges: each step ends by reading the sampled token (a device-to-host
copy and a synchronisation), so an inferred step must start at the first launch after the last read of the marked
step before it. Where that read is the marked step's last call (plain decode), the inferred steps ARE the marked
steps; in the speculative captures a few launches (KV-cache rollback, the bonus token's copy) follow the read
inside the marked step, so the inferred steps are the marked ones shifted by those launches, one fewer complete.
The expected starts are computed here straight from the launches and ranges, not by the code under test.
"""

from __future__ import annotations

import json
import sqlite3

import polars as pl
import pytest

import tracekit
from tracekit.steps import find_steps, infer_steps

from conftest import SAMPLES, sample_trace, shared

SAMPLE_TRACES = sorted(SAMPLES.glob("*/trace.*"))
WORK = ["kernel", "graph", "memcpy", "memset"]


def _thread_launches(t, windows):
    pid, tid = windows["pid"][0], windows["tid"][0]
    return t.launches.filter((pl.col("pid") == pid) & (pl.col("tid") == tid)).sort("start")


def _expected_starts(t, marked: pl.DataFrame, launches: pl.DataFrame) -> tuple[list[int], bool]:
    """First work launch after the last host read of each marked step (reads: synchronisations that block the
    host, device-to-host copies), and whether the step's first launch is that one (the read ends the step)."""
    dtoh = t.memops.filter(pl.col("copy_kind") == "DtoH").select("pid", "correlation").unique()
    reads = pl.concat([
        launches.filter((pl.col("kind") == "sync") & (pl.col("name") != "cudaStreamWaitEvent")).select("start", "end"),
        launches.join(dtoh, on=["pid", "correlation"], how="semi").select("start", "end"),
    ]).sort("start")
    work = launches.filter(pl.col("kind").is_in(WORK)).select("start")
    last_read = (reads.join_asof(marked.select(ms="start", me="end", step="step"), left_on="start", right_on="ms")
                 .filter(pl.col("start") <= pl.col("me")).group_by("step").agg(pl.col("end").max()).sort("step"))
    nxt = last_read.sort("end").join_asof(work.rename({"start": "next"}), left_on="end", right_on="next",
                                          strategy="forward")
    first = (work.join_asof(marked.select(ms="start", me="end", step="step"), left_on="start", right_on="ms")
             .filter(pl.col("start") <= pl.col("me")).group_by("step").agg(pl.col("start").min()).sort("step"))
    # (step by step: a capture's last window may hold work but no read -- vllm-v1-standalone-engine's trailing span)
    pairs = nxt.select("step", "next").join(first.select(step=pl.col("step") - 1, following="start"), on="step")
    read_ends_step = bool((pairs["next"] == pairs["following"]).all())
    return nxt["next"].drop_nulls().to_list(), read_ends_step


@pytest.mark.parametrize("path", SAMPLE_TRACES, ids=[p.parent.name for p in SAMPLE_TRACES])
@pytest.mark.slow
def test_inferred_steps_are_the_marked_steps(path):
    t = tracekit.load(path)
    found = find_steps(t)
    s = infer_steps(t)
    assert s is not None and s.marker == "inferred" and s.pattern is None
    complete = s.windows.filter(pl.col("end").is_not_null())
    if found.marker == "inferred":
        # An unmarked capture has no ranges to compare with (find_steps infers too): the truth is the capture's
        # own record. The capture starts (cuProfilerStart / the profiler) before its first profiled step and every
        # profiled step ends with its token read, so every profiled step is a complete step: manifest ``steps``
        # (12 for serve-prefill-*: the prefill step and 11 decode steps, its ``phases`` one per step), the first
        # starting at the thread's first work launch.
        man = json.load(open(path.parent / "manifest.json"))
        if (man.get("draft_model") or {}).get("overlap_scheduler"):
            # An overlap scheduler reads step i-1's tokens in the middle of step i: the inferred step is the same
            # iteration rotated (it starts after that read), so the capture holds one complete step fewer and its
            # first one starts after the first read (zoo-mtp-multilayer: 9 of 31 launches each, against 10 marked)
            assert complete.height == man["steps"] - 1
            return
        assert complete.height == man["steps"]
        if "prefill" in man:  # a serving window: its phases, one per profiled step (prefill then decode)
            assert len(man["phases"]) == man["steps"] and man["phases"][0] == "prefill"
        first = _thread_launches(t, s.windows).filter(pl.col("kind").is_in(WORK))["start"].min()
        assert complete["start"].min() == first
        assert (complete["end"] < complete["start"].shift(-1)).drop_nulls().all()
        return
    marked = found.windows.sort("start")
    man = json.load(open(path.parent / "manifest.json"))
    if (man.get("draft_model") or {}).get("overlap_scheduler"):
        # (the read of step i-1's tokens lands mid-iteration: the inferred steps are the marked ones rotated, as
        # long as them — the same launches each — one complete step fewer)
        assert complete.height == marked.height - 1
        assert s.period is not None and s.period.describe().startswith(f"{complete.height} complete steps")
        return
    expected, read_ends_step = _expected_starts(t, marked, _thread_launches(t, s.windows))
    if read_ends_step:  # plain decode: the very steps of the ranges (the first one starts the capture)
        first_launch = (_thread_launches(t, s.windows).filter(pl.col("kind").is_in(WORK)).select("start")
                        .join_asof(marked.select(ms="start", me="end", step="step"), left_on="start", right_on="ms")
                        .filter(pl.col("start") <= pl.col("me")).group_by("step").agg(pl.col("start").min()))
        assert sorted(complete["start"].to_list()) == sorted(first_launch["start"].to_list())
        assert complete.height == marked.height
    else:  # speculative: after each read; the part before the first read and after the last one are cut
        assert complete["start"].to_list() == expected[:-1]
        assert complete.height == marked.height - 1
        assert s.windows.height - complete.height == 2
    # a complete step ends with the end of the read that closes it, before the next step's first launch
    assert (complete["end"] < complete["start"].shift(-1)).drop_nulls().all()
    assert "steps inferred from the period of the launch sequence" in s.warnings[0]


def test_two_reads_per_step_make_one_step():
    """hf-small-spec reads from the GPU twice per step (a copy inside the verify forward, then the acceptance):
    one synchronisation per step would have given 32 steps; the period gives one step per marked step."""
    t = tracekit.load(sample_trace("hf-small-spec"))
    launches = t.launches.filter(pl.col("kind") == "sync")
    assert launches.filter(pl.col("name") == "cudaStreamSynchronize").height == 32  # 2 per marked step
    s = infer_steps(t)
    assert s.period.segments == 2 and s.period.reads == 2
    marked = find_steps(t).windows
    # launches per step = the marked steps' work launches, device-to-host copies (reads) left out: 1654
    dtoh = t.memops.filter(pl.col("copy_kind") == "DtoH").select("pid", "correlation")
    work = t.launches.filter(pl.col("kind").is_in(WORK)).join(dtoh, on=["pid", "correlation"], how="anti").select(
        "start").sort("start").join_asof(
        marked.select(ms="start", me="end", step="step"), left_on="start", right_on="ms").filter(
        pl.col("start") <= pl.col("me")).group_by("step").len()
    assert s.period.launches == float(work["len"].mode()[0]) == 1654.0
    assert "2 host reads each" in s.warnings[0]


def test_gb300_prefill_then_decode_regimes():
    """SGLang GB300 (rank 0), annotations ignored: 8 EXTEND steps (8 host reads each) then 8 DECODE steps (one
    graph launch each). Each decode annotation lies in exactly one inferred complete step."""
    path = shared("lora_perf_lora_profile/runs/Qwen3-30B-A3B-Instruct-2507-BF16-expert_shared-20260609-133913/"
                  "current_base_lora/profile/base/bs16-TP-0.trace.json.gz")
    t = tracekit.load(path)
    s = infer_steps(t)
    assert len(s.period.regimes) == 2
    prefill, decode = s.period.regimes
    assert (prefill["steps"], prefill["reads"], prefill["graph_launches"]) == (7, 8, 49)
    assert (decode["steps"], decode["reads"], decode["graph_launches"]) == (8, 1, 1)
    w = s.windows.filter(pl.col("end").is_not_null())
    dec = t.ranges.filter(pl.col("name").str.starts_with("step[DECODE")).select("start")
    hits = dec.join_asof(w.select(ws="start", we="end", step="step"), left_on="start", right_on="ws").filter(
        pl.col("start") <= pl.col("we"))
    assert hits.height == 8 and hits["step"].n_unique() == 8


def test_mfu_trace_period_not_one_step_per_sync():
    """nsys-ai mfu_2gpu_before (a Wan DiT forward on 2 H100s, no step ranges): 17 cudaStreamSynchronize on the
    busiest rank's thread (hand SQL below), 102 cudaStreamWaitEvent (a GPU-side wait, not a read). One step per
    'sync' gave 119 steps with a 70x spread; the period is one 163-launch unit with one read (a transformer block,
    16-22 ms each)."""
    path = shared("nsys-ai/tests/fixtures/mfu_2gpu_before.sqlite")
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    n_sync = db.execute(
        "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId "
        "WHERE (r.globalTid >> 24) % 16777216 = 145 AND s.value LIKE 'cudaStreamSynchronize%'").fetchone()[0]
    db.close()
    assert n_sync == 17
    t = tracekit.load(path)
    s = infer_steps(t, device=1)
    assert s.period.launches == 163 and s.period.reads == 1
    w = s.windows.filter(pl.col("end").is_not_null())
    assert w.height == n_sync - 1  # between consecutive reads
    span = (w["end"] - w["start"]) / 1e6
    assert span.max() / span.min() < 1.5


def test_no_period_no_steps():
    """A trace with no repeating unit that holds a host read (nsys-ai mock: two kernels) has no inferred steps."""
    t = tracekit.load(shared("nsys-ai/tests/fixtures/mock.sqlite"))
    assert infer_steps(t) is None


def _serve_window(skip_first: int = 0):
    """SYNTHETIC (definition test): a serving window that starts with a prefill step (more and other GEMM launches)
    and continues with six decode steps; every step begins with the embedding kernel and ends by reading the
    sampled token (a device-to-host copy). ``skip_first`` drops the first launches, as a capture that started
    mid-step would."""
    from factory import make_trace

    decode = ["embed", "rmsnorm", "nvjet_tst_64x8", "flash_fwd_kernel", "nvjet_tst_64x8", "rmsnorm", "nvjet_tst_64x8",
              "argmax"]
    prefill = ["embed", "rmsnorm", "nvjet_tst_256x128", "flash_fwd_kernel", "nvjet_tst_256x128", "rmsnorm",
               "nvjet_tst_256x128", "nvjet_tst_256x128", "argmax"]
    kernels, memops, at = [], [], 0
    for step in range(7):
        for name in prefill if step == 0 else decode:
            if at // 10 >= skip_first:
                kernels.append((name, at + 2, at + 8, at))
            at += 10
        memops.append(("memcpy", at + 2, at + 4, at))
        at += 100
    return make_trace(kernels=kernels, memops=memops)


def test_prefill_step_at_the_start_of_a_window_is_whole():
    """A complete prefill step at the start of a window is a step, not a part cut by the capture window: it begins
    with the launch every step begins with (and only the start of a step holds). Dropping its first launch (a
    capture that started mid-step) cuts it."""
    s = infer_steps(_serve_window())
    assert s.windows.height == 7 and s.windows["end"].is_not_null().all()
    first = s.windows.sort("start").row(0, named=True)
    assert first["start"] == 0  # the prefill step's first launch (the embedding), in ns
    cut = infer_steps(_serve_window(skip_first=1))
    assert cut.windows.sort("start")["end"].to_list()[0] is None  # the part before the first read: cut
    assert cut.windows["end"].is_not_null().sum() == 6
