"""Gaps by cause (contract ``gaps``) on real traces, against figures computed independently from the raw rows."""

from __future__ import annotations

import sqlite3

import pytest

import tracekit

from conftest import sample_sqlite, sample_trace, shared

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
