"""Gaps by cause (contract ``gaps``) on real traces, against figures computed independently from the raw rows."""

from __future__ import annotations

import sqlite3

import pytest

import tracekit

from conftest import sample_sqlite, sample_trace, shared, sql_rows

LORA = ("lora_perf_lora_profile/runs/Qwen3-30B-A3B-Instruct-2507-BF16-expert_shared-20260609-133913/"
        "current_base_lora/profile/base/bs16-TP-{}.trace.json.gz")

# Every graph launch inside a decode_step range but the last: the sum, over its replayed kernels in start order, of
# the time between the end of the kernels before (their running maximum) and each kernel's start.
BUBBLES_SQL = """
WITH steps AS (
  SELECT n.start, n.end, n.globalTid FROM NVTX_EVENTS n
  WHERE n.eventType = 59 AND COALESCE(n.text, (SELECT value FROM StringIds WHERE id = n.textId)) LIKE 'decode_step %'
), analysed AS (
  SELECT * FROM steps WHERE start < (SELECT max(start) FROM steps)
), launches AS (
  SELECT r.correlationId AS corr, r.globalTid FROM CUPTI_ACTIVITY_KIND_RUNTIME r
  JOIN StringIds s ON s.id = r.nameId
  WHERE s.value LIKE 'cudaGraphLaunch%'
    AND EXISTS (SELECT 1 FROM analysed a WHERE a.globalTid = r.globalTid AND r.start BETWEEN a.start AND a.end)
), k AS (
  SELECT k.correlationId AS corr, k.start, k.end,
         max(k.end) OVER (PARTITION BY k.correlationId ORDER BY k.start, k.end
                          ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_end
  FROM CUPTI_ACTIVITY_KIND_KERNEL k WHERE k.correlationId IN (SELECT corr FROM launches)
)
SELECT sum(CASE WHEN start > prev_end THEN start - prev_end ELSE 0 END), (SELECT count(*) FROM analysed) FROM k
"""


@pytest.mark.parametrize("name", ["hf-small-graph", "hf-large-graph", "synthetic-graph"])
def test_graph_bubbles_equal_the_gaps_inside_each_replay(name):
    b = tracekit.breakdown(tracekit.load(sample_trace(name)))
    con = sqlite3.connect(f"file:{sample_sqlite(name)}?mode=ro", uri=True)
    total_ns, n_steps = con.execute(BUBBLES_SQL).fetchone()
    con.close()
    assert n_steps == b.steps["count"]
    assert b.gaps["graph_bubbles"] == pytest.approx(total_ns / 1e6 / n_steps, rel=0.02)
    # replayed steps issue almost nothing one by one
    assert b.gaps["launch_overhead"] < 0.01 * b.steps["mean_ms"]


@pytest.mark.parametrize("name", ["hf-small-eager", "hf-small-graph", "hf-small-spec", "synthetic-symm-eager",
                                  "hf-small-eager-torch", "hf-small-graph-torch", "serve-small-eager",
                                  "spec-small-graph"])
@pytest.mark.slow
def test_gaps_split_launch_gaps_and_idle_exactly(name):
    b = tracekit.breakdown(tracekit.load(sample_trace(name)))
    g, ps = b.gaps, b.per_step_ms
    assert g["between_steps"] == pytest.approx(ps["idle"], rel=1e-9)
    assert g["launch_overhead"] + g["host_stalls"] + g["graph_bubbles"] == pytest.approx(ps["launch_gaps"], rel=0.005)
    assert all(g[k] >= 0 for k in ("launch_overhead", "host_stalls", "graph_bubbles", "between_steps"))
    # the per-step rows (CSV) carry the same split
    assert b.per_step["host_stalls"].mean() == pytest.approx(g["host_stalls"], rel=1e-9, abs=1e-12)
    largest = g["largest"]
    assert 0 < len(largest) <= 10 and [x["ms"] for x in largest] == sorted((x["ms"] for x in largest), reverse=True)
    assert all(x["where"] in ("eager", "graph") for x in largest)


def test_eager_loop_gaps_are_launch_overhead():
    """hf-small-eager issues ~1200 launches one by one under nsys: its in-step gaps are launch overhead, not stalls."""
    b = tracekit.breakdown(tracekit.load(sample_trace("hf-small-eager")))
    assert b.gaps["launch_overhead"] > 0.9 * b.per_step_ms["launch_gaps"]
    assert b.gaps["graph_bubbles"] == 0


def test_gb300_names_the_host_gap_between_steps():
    """SGLang decode on GB300 (graph replay): the gap before each step's first launch is host time between steps."""
    b = tracekit.breakdown(tracekit.load(shared(LORA.format(0))))
    between = [x for x in b.gaps["largest"] if x["cause"] == "between_steps"]
    assert between and between[0]["before"] is not None
    assert b.gaps["between_steps"] > 0
    assert "between steps" in b.advice["host_work"]["verdict"]
    assert b.time_base.unprofiled_step_ms is None and "upper bounds" in b.headline


def _waits_trace():
    """SYNTHETIC (tests/factory.py), 4 steps of 100 µs; each: kernel A (GPU 2-10) then a cudaDeviceSynchronize
    (1-10), 40 µs of host work, kernel C launched at 50 (GPU 52-60), a device-to-host copy launched at 61 (GPU
    62-64), a cudaStreamWaitEvent (70-71: the GPU waits there, not the host), kernel D launched at 80 (GPU 82-90).
    Step 1 marks 20 µs of its host work (20-40) with a range that launches nothing (a host stall)."""
    from dataclasses import replace

    import polars as pl

    from tracekit.trace import LAUNCHES, conform

    from factory import make_trace

    kernels, memops, ranges, calls = [], [], [], []
    for i in range(4):
        b = 100 * i
        ranges.append((f"decode_step {i}", b, b + 99))
        kernels += [("vectorized_elementwise_kernel", b + 2, b + 10, b),
                    ("vectorized_elementwise_kernel", b + 52, b + 60, b + 50),
                    ("vectorized_elementwise_kernel", b + 82, b + 90, b + 80)]
        memops.append(("memcpy", b + 62, b + 64, b + 61, "DtoH"))
        calls += [("cudaDeviceSynchronize", b + 1, b + 10), ("cudaStreamWaitEvent", b + 70, b + 71)]
    ranges.append(("grammar_mask", 120, 140))
    t = make_trace(kernels=kernels, memops=memops, ranges=ranges)
    extra = pl.DataFrame([{"start": s * 1000, "end": e * 1000, "pid": 1, "tid": 1, "kind": "sync", "name": n}
                          for n, s, e in calls])
    return replace(t, launches=pl.concat([t.launches, conform(extra, LAUNCHES)]).sort("start"))


def test_after_waits_is_the_launch_overhead_after_a_host_wait():
    """docs/definitions.md-style example, by hand: the host time from a host wait's return (a synchronisation, a
    device-to-host copy call) to the next launch call, inside a gap, not stalled; nothing else."""
    b = tracekit.breakdown(_waits_trace())
    assert b.steps["count"] == 3  # steps 0-2 (the last has no following step)
    # gap before C: 10..52, host after the sync 10..50 = 40 µs (step 1: 20 of them inside the range = stall);
    # gap before D: 64..82, host after the copy call's return (62) from 64 to D's call (80) = 16 µs, less the
    # 1 µs inside cudaStreamWaitEvent (a stall); the wait-event is not a host wait (else 71..80 = 9 µs)
    per_step_us = [40 + 15, 20 + 15, 40 + 15]
    assert b.facts.after_waits_ms == pytest.approx(sum(per_step_us) / 3 / 1000, abs=1e-9)
    # a part of the launch overhead: the gap split itself is unchanged (stalls: the copy call, the wait-event, the range)
    assert b.gaps["host_stalls"] == pytest.approx((2 + 22 + 2) / 3 / 1000, abs=1e-9)
    assert b.gaps["launch_overhead"] >= b.facts.after_waits_ms
    f = b.facts
    assert b.advice["cuda_graphs"]["predicted_step_ms"] == pytest.approx(
        f.busy_ms + f.launched_per_step * f.replay_gap_us / 1000 + b.gaps["host_stalls"] + f.after_waits_ms, abs=1e-9)
    assert "ms of host time after synchronisations" in b.advice["cuda_graphs"]["verdict"]


# Per synchronisation call: the GPU gap that follows the last GPU activity (kernel, copy, memset) to end before the
# call returned (to the next activity's start), and how much of that gap the call itself covers.
SYNC_GAPS_SQL = """
WITH s AS (
  SELECT r.start, r.end FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds n ON n.id = r.nameId
  WHERE n.value LIKE 'cudaDeviceSynchronize%'
), a AS (
  SELECT start, end FROM CUPTI_ACTIVITY_KIND_KERNEL UNION ALL SELECT start, end FROM CUPTI_ACTIVITY_KIND_MEMCPY
  UNION ALL SELECT start, end FROM CUPTI_ACTIVITY_KIND_MEMSET
), g AS (
  SELECT s.end AS send,
         (SELECT max(a.end) FROM a WHERE a.end <= s.end) AS g0,
         (SELECT min(a.start) FROM a WHERE a.start >= s.end) AS g1
  FROM s
)
SELECT g1 - g0, send - g0 FROM g WHERE g0 IS NOT NULL AND g1 IS NOT NULL
"""


@pytest.mark.slow
def test_a_gap_after_a_sync_returned_is_not_named_after_the_sync():
    """serve-prefill-graph-nomark: each decode step synchronises, then runs ~0.55 ms of Python (no range in this
    capture) before its next launch. The sync covers only the gap's first microseconds, so it is not what the host
    was doing: ``before`` is null (contract: the call that covers *most* of the gap), not "sync
    cudaDeviceSynchronize" (which read as the host waiting while the GPU waited for the host)."""
    rows = sql_rows(sample_sqlite("serve-prefill-graph-nomark"), SYNC_GAPS_SQL)
    after_sync = [(gap, cover) for gap, cover in rows if gap >= 500_000]
    assert len(after_sync) >= 11  # one per decode step
    assert max(cover / gap for gap, cover in after_sync) < 0.25  # far from most of it
    b = tracekit.breakdown(tracekit.load(sample_trace("serve-prefill-graph-nomark")))
    largest = b.gaps["largest"]
    assert len(largest) == 10
    for x in largest:
        # each is one of those gaps (to the nanosecond, up to float rounding) and is left unnamed
        assert min(abs(x["ms"] * 1e6 - gap) for gap, _ in after_sync) < 2
        assert x["before"] is None


def test_a_long_op_that_launches_nothing_is_a_host_stall_not_launch_overhead():
    """Issue 51 item 4, on HTA's DDP trace (nccl_data): twice a step the host spends ~15 ms inside
    ``aten::unflatten_dense_tensors`` (views of the gradient bucket: no GPU work) while the GPU idles. That is host
    work, not the launch overhead CUDA graphs remove. Figures from the raw JSON: each such op's span that lies in a GPU-idle
    interval (no kernel, copy or memset running) and launches nothing (no runtime call of its thread inside it)."""
    import gzip
    import json

    import polars as pl

    from conftest import DATA

    path = DATA / "kineto" / "hta_nccl_data.json.gz"
    ev = json.loads(gzip.open(path).read())["traceEvents"]
    x = [e for e in ev if e.get("ph") == "X" and "dur" in e]
    gpu = pl.DataFrame([(e["ts"], e["ts"] + e["dur"]) for e in x if e.get("cat") in ("kernel", "gpu_memcpy",
                                                                                      "gpu_memset")],
                       schema=["s", "e"], orient="row").sort("s")
    runtime = pl.DataFrame([(e["tid"], e["ts"]) for e in x if e.get("cat") == "cuda_runtime"
                            and not e["name"].startswith(("cudaEventRecord", "cudaStreamWaitEvent"))],
                           schema=["tid", "ts"], orient="row")
    steps = sorted((e["ts"], e["ts"] + e["dur"]) for e in x if e.get("cat") == "user_annotation"
                   and e["name"].startswith("ProfilerStep#"))
    b = tracekit.breakdown(tracekit.load(path))
    assert b.steps["count"] == len(steps) - 1  # the last has no following step
    # the GPU-idle intervals: between one activity's end (running maximum) and the next one's start
    idle = gpu.with_columns(prev=pl.col("e").cum_max().shift(1)).filter(pl.col("s") > pl.col("prev"))
    ops = [e for e in x if e.get("cat") == "cpu_op" and e["name"] == "aten::unflatten_dense_tensors"]
    stalled = 0.0
    for op in ops:  # (a handful of ops)
        lo, hi = op["ts"], op["ts"] + op["dur"]
        if not any(a <= lo and hi <= z for a, z in steps[:-1]):
            continue
        inside = idle.filter((pl.col("prev") <= lo) & (pl.col("s") >= hi))
        launched = runtime.filter((pl.col("tid") == op["tid"]) & pl.col("ts").is_between(lo, hi)).height
        if inside.height and not launched:
            stalled += op["dur"] / 1e3
    assert stalled > 30  # ms: at least two ~15 ms ops a step
    per_step = stalled / b.steps["count"]
    assert b.gaps["host_stalls"] >= per_step * 0.999
    # the longest gaps are those: host stalls, while the host was in the op, not launch overhead
    top = b.to_dict()["gaps"]["largest"][:2]
    assert [g["cause"] for g in top] == ["host_stalls", "host_stalls"] and all(g["ms"] > 15 for g in top)
    assert all(g["before"] == {"kind": "op", "name": "aten::unflatten_dense_tensors"} for g in top)
    # and the launch overhead no longer holds them: launch gaps = launch overhead + host stalls (no graphs here)
    assert b.gaps["launch_overhead"] + b.gaps["host_stalls"] == pytest.approx(b.per_step_ms["launch_gaps"], rel=1e-6)


def test_a_short_op_that_launches_nothing_stays_launch_overhead():
    """The other side of the rule: in an eager forward under the torch profiler, single dispatches that launch
    nothing (``aten::t``, ``aten::view``; one at up to 4x the median launch interval) are what CUDA graphs remove:
    hf-small-eager-torch's in-step gaps stay launch overhead (its graph prediction is validated against the measured
    graph run, docs/validation.md)."""
    from tracekit.analyses.gaps import HOST_OP_LAUNCHES, launch_ns

    t = tracekit.load(sample_trace("hf-small-eager-torch"))
    b = tracekit.breakdown(t)
    assert b.gaps["host_stalls"] < 0.001 * b.per_step_ms["launch_gaps"]
    # the median launch interval, from the launch calls' own starts (work launches of the one launching thread)
    starts = t.launches.filter(t.launches["kind"].is_in(["kernel", "memcpy", "memset", "graph"]))["start"].sort()
    d = starts.diff().drop_nulls()
    assert launch_ns(t.launches) == int(d.filter(d > 0).median())
    longest = t.ops.filter(t.ops["end"].is_not_null()).select((t.ops["end"] - t.ops["start"]).max()).item()
    assert longest > HOST_OP_LAUNCHES * launch_ns(t.launches)  # long ops exist (they launch work: not host stalls)
