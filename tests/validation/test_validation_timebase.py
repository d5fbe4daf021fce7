"""Issue 15 validation on the H200 captures (docs/validation.md, "Time base and gaps"): the CUDA-graph prediction and
its saving against the manifests' unprofiled steps, the injected host stall against hand SQL on the export, graph
bubbles against hand SQL, the GB300 SGLang trace against its raw JSON, and whether profiler_inflation can be
estimated from the trace alone.

The row builders here are what docs/validation.md's cog blocks print (``sys.path[:0] = ["tests", "tests/validation"]``), so the
doc's tables and these tests are one computation; every figure they compare with comes from elsewhere: the
manifests' unprofiled times (CUDA events, same process, no profiler), SQL on the nsys exports, the Kineto JSON.
"""

from __future__ import annotations

import functools
import gzip
import json
import shutil
import tempfile
from pathlib import Path

import polars as pl
import pytest

import tracekit

from conftest import SAMPLES, sample_sqlite, sample_trace, shared, sql_rows

# The validation sweeps are the slow tier (`python -m pytest -m slow`; .ci/run runs them after the fast tier).
pytestmark = pytest.mark.slow

# (eager trace, the same loop replayed from CUDA graphs); both measured unprofiled in their own capture runs
PAIRS = [("hf-small-eager", "hf-small-graph"), ("hf-small-eager-torch", "hf-small-graph-torch"),
         ("hf-large-eager", "hf-large-graph"), ("hf-large-eager-torch", "hf-large-graph"),
         ("hf-small-spec", "hf-small-spec-graph"), ("hf-small-spec-torch", "hf-small-spec-graph"),
         ("spec-small-eager", "spec-small-graph"), ("spec-small-eager-torch", "spec-small-graph-torch"),
         ("spec-small-eager-nomark", "spec-small-graph-nomark"),
         ("spec-small-eager-torch-nomark", "spec-small-graph-torch-nomark"),
         ("spec-large-eager", "spec-large-graph"), ("serve-small-eager", "serve-small-graph"),
         ("synthetic-eager", "synthetic-graph"), ("synthetic-eager-torch", "synthetic-graph"),
         # issues 23/24 captures (sample_traces/README.md, "Serving-window, LoRA and MoE captures")
         ("serve-prefill-eager-nomark", "serve-prefill-graph-nomark"), ("lora-small-eager", "lora-small-graph-nomark"),
         ("moe-small-eager-nomark", "moe-small-graph-nomark")]
UPPER_BOUND_SAMPLES = ["hf-small-eager", "serve-small-eager", "spec-small-eager-torch"]
SERVE = ["serve-small-eager", "serve-small-graph"]
GRAPHED = ["hf-small-graph", "hf-large-graph", "synthetic-graph", "kv-large-ctx16k", "kv-large-ctx32k",
           "spec-small-graph", "spec-large-graph", "hf-small-spec-graph", "serve-small-graph"]
GB300 = ("lora_perf_lora_profile/runs/Qwen3-30B-A3B-Instruct-2507-BF16-expert_shared-20260609-133913/"
         "current_base_lora/profile/base/bs16-TP-0.trace.json.gz")


def index() -> dict:
    return json.loads((SAMPLES / "index.json").read_text())["traces"]


@functools.cache
def loaded(name: str):
    """Sample ``name`` as committed (beside its manifest), read once per process."""
    return tracekit.load(sample_trace(name))


@functools.cache
def analysed(name: str):
    """The breakdown of sample ``name``, once per process."""
    return tracekit.breakdown(loaded(name))


def pct(a: float, b: float) -> float:
    return 100.0 * (a - b) / b


# --------------------------------------------------------------------------- savings against the unprofiled step

@functools.cache
def savings_rows() -> list[dict]:
    ix = index()
    rows = []
    for eager, graph in PAIRS:
        b = analysed(eager)
        cg = b.advice["cuda_graphs"]
        ue, ug = ix[eager]["unprofiled_step_ms"], ix[graph]["unprofiled_step_ms"]
        rows.append(dict(eager=eager, graph=graph, profiler=ix[eager]["profiler"], traced=b.steps["mean_ms"],
                         unprofiled_eager=ue, reference=b.time_base.reference_step_ms,
                         source=b.time_base.unprofiled_source, predicted=cg["predicted_step_ms"],
                         measured=ug, saving=cg["max_saving_ms"], measured_saving=ue - ug,
                         graph_error=pct(cg["predicted_step_ms"], ug),
                         saving_error=pct(cg["max_saving_ms"], ue - ug), headline=b.headline))
    return rows


def copied_away(name: str, tmp: Path):
    """The breakdown of a copy of the trace file alone (no manifest beside it), in ``tmp``."""
    src = sample_trace(name)
    dst = tmp / name / src.name
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dst)
    return tracekit.breakdown(tracekit.load(dst))


def upper_bound_rows(names=UPPER_BOUND_SAMPLES) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for name in names:
            b = copied_away(name, Path(d))
            rows.append(dict(name=name, manifest=b.manifest is not None, source=b.time_base.unprofiled_source,
                             headline=b.headline, verdict=b.advice["cuda_graphs"]["verdict"]))
    return rows


@pytest.mark.parametrize("eager,graph", PAIRS)
def test_graph_step_and_saving_within_10pct(eager, graph):
    r = next(x for x in savings_rows() if x["eager"] == eager)
    assert r["source"] == "manifest" and r["reference"] == r["unprofiled_eager"]  # the time base is the manifest's
    assert r["headline"].startswith(f"step {r['reference']:.3f} ms unprofiled (manifest")
    assert abs(r["graph_error"]) <= 10, r
    assert abs(r["saving_error"]) <= 10, r


def test_without_unprofiled_time_the_headline_says_upper_bound():
    for r in upper_bound_rows():
        assert not r["manifest"] and r["source"] is None
        assert "no unprofiled time: savings are upper bounds" in r["headline"], r
        assert "at most" in r["headline"] and "upper bound" in r["verdict"]


# --------------------------------------------------------------------------- the injected host stall (serve)

# Per `grammar_mask` range (the injected stall: GPU drained by a synchronize, then ~0.5 ms of Python): the GPU gap
# around it (last GPU activity that started before the range .. first one that starts after it), and the part of
# that gap during which the launching thread was inside the range or a synchronisation / copy call -- what the
# contract calls a host stall.
STALL_SQL = """
WITH acts AS (SELECT start, end FROM CUPTI_ACTIVITY_KIND_KERNEL UNION ALL
              SELECT start, end FROM CUPTI_ACTIVITY_KIND_MEMCPY UNION ALL
              SELECT start, end FROM CUPTI_ACTIVITY_KIND_MEMSET),
gm AS (SELECT e.start, e.end, e.globalTid FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId
       WHERE coalesce(e.text, s.value) = 'grammar_mask'),
gap AS (SELECT gm.start AS rs, gm.end AS re, gm.globalTid AS tid,
               (SELECT max(a.end) FROM acts a WHERE a.start < gm.start) AS gs,
               (SELECT min(a.start) FROM acts a WHERE a.start > gm.end) AS ge FROM gm),
host AS (SELECT gap.rs, r.start, r.end FROM gap
         JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.globalTid = gap.tid AND r.end > gap.gs AND r.start < gap.ge
         JOIN StringIds s ON s.id = r.nameId
         WHERE s.value LIKE 'cudaDeviceSynchronize%' OR s.value LIKE 'cudaStreamSynchronize%'
            OR s.value LIKE 'cudaMemcpy%'
         UNION ALL SELECT gap.rs, gap.rs, gap.re FROM gap)
SELECT gap.rs, gap.ge - gap.gs AS gap_ns, gap.re - gap.rs AS range_ns,
       (SELECT sum(min(h.end, gap.ge) - max(h.start, gap.gs)) FROM host h WHERE h.rs = gap.rs) AS stall_ns
FROM gap ORDER BY gap.rs
"""


@functools.cache
def stall_rows() -> list[dict]:
    rows = []
    for name in SERVE:
        b = analysed(name)
        sql = pl.DataFrame(sql_rows(sample_sqlite(name), STALL_SQL), schema=["rs", "gap_ns", "range_ns", "stall_ns"],
                           orient="row")
        ps = b.per_step.sort("start_ns")
        # the analysed steps' stalls: each range lies in exactly one analysed step
        sql = sql.sort("rs").join_asof(ps.select("step", "start_ns", "end_ns"), left_on="rs", right_on="start_ns"
                                       ).filter(pl.col("rs") < pl.col("end_ns"))
        per = sql.join(ps.select("step", "host_stalls"), on="step")
        top = b.gaps["largest"][0]
        rows.append(dict(name=name, steps=b.steps["count"], matched=per.height,
                         gap_ms=float(per["gap_ns"].median()) / 1e6, range_ms=float(per["range_ns"].median()) / 1e6,
                         stall_ms=float(per["stall_ns"].mean()) / 1e6, host_stalls=b.gaps["host_stalls"],
                         host_stalls_min_over_range=float((per["host_stalls"] - per["range_ns"] / 1e6).min()),
                         host_stalls_share=float((per["host_stalls"] / (per["gap_ns"] / 1e6)).mean()),
                         max_gap_ms=float(per["gap_ns"].max()) / 1e6, largest=top,
                         launch_overhead=b.gaps["launch_overhead"]))
    return rows


@pytest.mark.parametrize("name", SERVE)
def test_injected_stall_is_a_host_stall_and_the_largest_gap(name):
    r = next(x for x in stall_rows() if x["name"] == name)
    assert r["matched"] == r["steps"] == 15
    # every step's host stalls hold its whole injected range, and match the hand-SQL stall within 5%
    assert r["host_stalls_min_over_range"] >= 0
    assert r["host_stalls"] == pytest.approx(r["stall_ms"], rel=0.05)
    assert 0.75 <= r["host_stalls_share"] <= 1.0
    # largest[0] is the longest stall gap, named by its range
    top = r["largest"]
    assert top["ms"] == pytest.approx(r["max_gap_ms"], rel=0.01)
    assert top["cause"] == "host_stalls" and top["before"].to_dict() == {"kind": "range", "name": "grammar_mask"}


# --------------------------------------------------------------------------- host time after host waits

# Per work launch call L (kernel, copy, memset, graph launch): the latest return, on L's thread, of a host wait
# (device / stream / event synchronisation, device-to-host or pageable copy call) after the previous work launch
# call's end and before L starts; then L's first GPU activity and the latest end of any GPU activity that started
# before it (the GPU gap before L's work). The host time after the wait that lies in that gap, up to L's call, is
# the host work a CUDA graph cannot remove (``gaps.after_waits``); in-step only (L's work after the step's first).
AFTER_WAITS_SQL = """
WITH api AS (SELECT r.start, r.end, r.globalTid AS tid, r.correlationId AS corr, s.value AS name
             FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId),
acts AS ({acts}),
work AS (SELECT * FROM api WHERE name LIKE 'cudaLaunch%' OR name LIKE 'cuLaunch%' OR name LIKE 'cudaMemcpy%'
         OR name LIKE 'cudaMemset%' OR name LIKE 'cudaGraphLaunch%'),
waits AS (SELECT start, end, tid FROM api WHERE name LIKE 'cudaDeviceSynchronize%'
          OR name LIKE 'cudaStreamSynchronize%' OR name LIKE 'cudaEventSynchronize%'
          UNION ALL
          SELECT a.start, a.end, a.tid FROM api a JOIN CUPTI_ACTIVITY_KIND_MEMCPY m ON m.correlationId = a.corr
          WHERE m.copyKind = 2 OR m.srcKind = 0 OR m.dstKind = 0),
l AS (SELECT w.*, lag(w.end) OVER (PARTITION BY w.tid ORDER BY w.start) AS prev_end FROM work w),
lw AS (SELECT l.start AS ls, l.tid, l.corr,
              (SELECT max(x.end) FROM waits x WHERE x.tid = l.tid AND x.end >= l.prev_end AND x.end <= l.start) AS w_end
       FROM l),
la AS (SELECT lw.*, (SELECT min(a.start) FROM acts a WHERE a.corr = lw.corr) AS a0 FROM lw WHERE w_end IS NOT NULL)
SELECT la.ls, la.w_end, la.a0, (SELECT max(a.end) FROM acts a WHERE a.start < la.a0) AS h0, la.tid FROM la
WHERE la.a0 IS NOT NULL
"""
# the injected stall's range (serve-small-*): host time inside it is a host stall, not after-wait time
HOST_ONLY_RANGES = {"serve-small-eager": "grammar_mask", "serve-small-graph": "grammar_mask"}


@functools.cache
def after_waits_sql(name: str) -> float:
    """``gaps.after_waits`` per analysed step (ms), by hand: AFTER_WAITS_SQL on the export, the host-only range's
    time subtracted, summed over the gaps inside tracekit's analysed step periods."""
    db = sample_sqlite(name)
    tables = {r[0] for r in sql_rows(db, "SELECT name FROM sqlite_master WHERE type = 'table'")}
    acts = " UNION ALL ".join(f"SELECT start, end, correlationId AS corr FROM {t}" for t in (
        "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET") if t in tables)
    rows = sql_rows(db, AFTER_WAITS_SQL.format(acts=acts))
    ranges = []
    if name in HOST_ONLY_RANGES:
        ranges = sql_rows(db, "SELECT e.start, e.end, e.globalTid FROM NVTX_EVENTS e LEFT JOIN StringIds s "
                              f"ON s.id = e.textId WHERE coalesce(e.text, s.value) = '{HOST_ONLY_RANGES[name]}'")
    periods = analysed(name).per_step.select("start_ns", "end_ns").rows()
    total = 0
    for p0, p1 in periods:
        for ls, w_end, a0, h0, tid in rows:
            lo, hi = max(h0, w_end), min(a0, ls)
            if p0 < a0 < p1 and hi > lo:
                total += hi - lo - sum(max(0, min(hi, re) - max(lo, rs)) for rs, re, rt in ranges if rt == tid)
    return total / len(periods) / 1e6


@functools.cache
def after_waits_rows() -> list[dict]:
    """Per eager/graph pair: the eager trace's host time after host waits (tracekit and hand SQL), the graph twin's,
    and the predicted graph step without that term (the model before) and with it, against the measured one."""
    ix = index()
    rows = []
    for (eager, graph), s in zip(PAIRS, savings_rows()):
        b, bg = analysed(eager), analysed(graph)
        f = b.facts
        before = f.busy_ms + f.launched_per_step * f.replay_gap_us / 1000 + b.gaps["host_stalls"]
        before = min(before, b.time_base.reference_step_ms)
        nsys = ix[eager]["profiler"] == ix[graph]["profiler"] == "nsys"
        rows.append(dict(eager=eager, graph=graph, profiler=ix[eager]["profiler"], after=f.after_waits_ms,
                         sql=after_waits_sql(eager) if ix[eager]["profiler"] == "nsys" else None,
                         graph_after=bg.facts.after_waits_ms, graph_sql=after_waits_sql(graph) if nsys else None,
                         host_stalls=b.gaps["host_stalls"], before=before, predicted=s["predicted"],
                         measured=s["measured"], error_before=pct(before, s["measured"]),
                         error=s["graph_error"]))
    return rows


@pytest.mark.parametrize("name", sorted({n for p in PAIRS for n in p if index()[n]["profiler"] == "nsys"}))
def test_after_waits_equal_hand_sql(name):
    assert analysed(name).facts.after_waits_ms == pytest.approx(after_waits_sql(name), rel=1e-3, abs=1e-6)


def test_host_time_after_waits_stays_with_graphs():
    """The host time after host waits in an eager trace is there in its graph twin's trace too (same profiler):
    graphs do not remove it. Within 0.05 ms or 10% (the host's speed varies between capture processes: the
    serve-small stall ran 0.638 ms unprofiled in the eager capture, 0.542 ms in the graph one, their manifests)."""
    rows = [r for r in after_waits_rows() if r["graph_sql"] is not None]
    assert len(rows) >= 9
    for r in rows:
        assert abs(r["after"] - r["graph_after"]) <= max(0.05, 0.1 * r["graph_after"]), r
    # the unmarked serve loop: the graph twin shows it as much as the eager trace, and no eager trace had it as stall
    r = next(x for x in rows if x["eager"] == "serve-prefill-eager-nomark")
    assert r["after"] > 0.5 and r["graph_after"] > 0.5 and r["host_stalls"] < 0.1


@pytest.mark.parametrize("name", ["serve-prefill-eager-nomark", "serve-prefill-graph-nomark", "serve-small-graph-nomark"])
def test_after_waits_hold_the_unmarked_stall_the_capture_measured(name):
    """Unmarked serve loops: the Python after ``torch.cuda.synchronize()`` (the injected stall, timed with
    perf_counter in the profiled run: the manifest's ``measured_profiled``) is after-wait host time, plus the
    mask copy's dispatch and the small gaps after the step's other waits (under 0.1 ms)."""
    b = analysed(name)
    man = json.loads((SAMPLES / name / "manifest.json").read_text())
    stall = man["serve"]["injected_stall"]["measured_profiled"]["median_ms"]
    assert stall <= b.facts.after_waits_ms <= stall + 0.1, (stall, b.facts.after_waits_ms)


# --------------------------------------------------------------------------- graph bubbles

# Every graph launch inside a decode_step range but the last: the sum, over its replayed nodes (kernels, memcpy and
# memset nodes) in start order, of the time between the end of the nodes before (their running maximum) and each
# node's start.
BUBBLES_SQL = """
WITH steps AS (
  SELECT n.start, n.end, n.globalTid FROM NVTX_EVENTS n
  WHERE n.eventType = 59 AND COALESCE(n.text, (SELECT value FROM StringIds WHERE id = n.textId)) LIKE 'decode_step %'
), analysed AS (SELECT * FROM steps WHERE start < (SELECT max(start) FROM steps)
), launches AS (
  SELECT r.correlationId AS corr FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId
  WHERE s.value LIKE 'cudaGraphLaunch%'
    AND EXISTS (SELECT 1 FROM analysed a WHERE a.globalTid = r.globalTid AND r.start BETWEEN a.start AND a.end)
), nodes AS (SELECT correlationId AS corr, start, end FROM CUPTI_ACTIVITY_KIND_KERNEL {memops}
), k AS (
  SELECT start, max(end) OVER (PARTITION BY corr ORDER BY start, end
                               ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_end
  FROM nodes WHERE corr IN (SELECT corr FROM launches))
SELECT sum(CASE WHEN start > prev_end THEN start - prev_end ELSE 0 END), (SELECT count(*) FROM analysed),
       (SELECT count(*) FROM launches) FROM k
"""


@functools.cache
def bubble_rows() -> list[dict]:
    rows = []
    for name in GRAPHED:
        b, db = analysed(name), sample_sqlite(name)
        tables = {r[0] for r in sql_rows(db, "SELECT name FROM sqlite_master WHERE type = 'table'")}
        memops = "".join(f" UNION ALL SELECT correlationId, start, end FROM {t}"
                         for t in ("CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET") if t in tables)
        total_ns, n_steps, n_launches = sql_rows(db, BUBBLES_SQL.format(memops=memops))[0]
        g = b.gaps
        rows.append(dict(name=name, steps=b.steps["count"], sql_steps=n_steps, graphs=n_launches / n_steps,
                         eager_launches=b.facts.launched_per_step, bubbles=g["graph_bubbles"],
                         sql=total_ns / 1e6 / n_steps, launch_overhead=g["launch_overhead"],
                         step=b.steps["mean_ms"], error=pct(g["graph_bubbles"], total_ns / 1e6 / n_steps)))
    return rows


@pytest.mark.parametrize("name", GRAPHED)
def test_graph_bubbles_equal_hand_sql_and_replays_have_no_launch_overhead(name):
    r = next(x for x in bubble_rows() if x["name"] == name)
    assert r["sql_steps"] == r["steps"]
    assert abs(r["error"]) <= 2, r
    if r["graphs"] == 1:  # the whole step is one replay: almost nothing is issued one by one
        assert r["launch_overhead"] < 0.01 * r["step"], r


# --------------------------------------------------------------------------- GB300 SGLang (public)

def gb300_rows() -> tuple[list[dict], object]:
    """Per decode graph launch (634-kernel graph): the GPU gap before its first kernel and the cudaGraphLaunch
    call's own duration, from the raw JSON; with tracekit's ``largest`` entry for that gap."""
    path = shared(GB300)
    ev = json.load(gzip.open(path))["traceEvents"]
    gpu = pl.DataFrame([(e["ts"], e["ts"] + e["dur"], e["args"].get("correlation")) for e in ev
                        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")],
                       schema=["ts", "end", "corr"], orient="row").sort("ts")
    launches = pl.DataFrame([(e["args"]["correlation"], e["dur"]) for e in ev if e.get("cat") == "cuda_runtime"
                             and e["name"].startswith("cudaGraphLaunch")], schema=["corr", "call_us"], orient="row")
    per = (gpu.join(launches, on="corr").group_by("corr").agg(first=pl.col("ts").min(), n=pl.len(),
                                                              call_us=pl.col("call_us").first())
           .filter(pl.col("n") >= 600).sort("first"))
    prev_end = gpu.with_columns(run_end=pl.col("end").cum_max()).select("ts", "run_end")
    # the latest end of any GPU activity that started before the graph's first kernel
    per = per.join_asof(prev_end.rename({"ts": "pts"}),
                        left_on="first", right_on="pts", strategy="backward", allow_exact_matches=False)
    per = per.with_columns(gap_ms=(pl.col("first") - pl.col("run_end")) / 1e3, call_ms=pl.col("call_us") / 1e3)
    b = tracekit.breakdown(tracekit.load(path))
    graph_gaps = sorted((x for x in b.gaps["largest"] if x["where"] == "graph"), key=lambda x: x["step"])
    rows = [dict(step=x["step"], json_gap_ms=g, call_ms=c, ms=x["ms"], cause=x["cause"], before=x["before"])
            for x, g, c in zip(graph_gaps, per["gap_ms"].to_list(), per["call_ms"].to_list())]
    return rows, b


def test_gb300_names_the_host_gap_before_each_graph_launch():
    rows, b = gb300_rows()
    assert len(rows) == b.steps["count"] == 7  # one decode graph per analysed step, each gap listed
    for r in rows:
        assert r["ms"] == pytest.approx(r["json_gap_ms"], rel=0.01), r
        assert r["call_ms"] > 0.8 * r["ms"]  # most of it is the cudaGraphLaunch call itself (under the profiler)
        assert r["cause"] == "launch_overhead" and r["before"]["kind"] == "op"
        assert r["before"]["name"] == "built-in method replay"  # (its pybind11 repr, cleaned: issue 44)
    v = b.advice["cuda_graphs"]["verdict"]
    # (in a graph-replaying step the gap before the launch is host work graphs cannot remove: named so, issue 23)
    assert f"the longest gap inside a step, {max(r['ms'] for r in rows):.3f} ms (host work before graph launches), comes before " \
           "graph work, while the host was in op 'built-in method replay'" in v


# --------------------------------------------------------------------------- profiler_inflation from the trace?

EAGER = ["hf-small-eager", "hf-small-eager-torch", "hf-large-eager", "hf-large-eager-torch", "hf-small-spec",
         "hf-small-spec-torch", "hf-large-spec", "spec-small-eager", "spec-small-eager-nomark",
         "spec-small-eager-torch", "spec-small-eager-torch-nomark", "spec-large-eager", "serve-small-eager",
         "synthetic-eager", "synthetic-eager-torch", "synthetic-symm-eager", "tp1-hf-small-nccl-eager",
         "tp1-hf-small-symm1-eager", "tp1-synthetic-symm1-eager"]


@functools.cache
def inflation_rows() -> list[dict]:
    """Per H200 eager capture: the true traced/unprofiled ratio and what the trace alone offers to estimate it."""
    ix = index()
    rows = []
    for name in EAGER:
        b = analysed(name)
        t = loaded(name)
        lo, hi = b.per_step["start_ns"].min(), b.per_step["end_ns"].max()
        calls = t.launches.filter((pl.col("kind") == "kernel") & (pl.col("start") >= lo) & (pl.col("start") < hi))
        ops = None
        if t.meta.format == "kineto-json" and t.ops is not None:
            ops = t.ops.filter((pl.col("start") >= lo) & (pl.col("start") < hi)).height / b.steps["count"]
        u = ix[name]["unprofiled_step_ms"]
        rows.append(dict(name=name, profiler=ix[name]["profiler"], traced=b.steps["mean_ms"], unprofiled=u,
                         ratio=b.steps["mean_ms"] / u, inflation=b.time_base.profiler_inflation,
                         launches=b.facts.launched_per_step, call_us=float((calls["end"] - calls["start"]).mean()) / 1e3,
                         ops=ops, host_stalls=b.gaps["host_stalls"]))
    return rows


def best_fit(rows: list[dict], predict, grid) -> tuple[float, float]:
    """(worst |error| of the unprofiled step over ``rows``, parameter) for the parameter of ``grid`` that
    minimises it: the best a one-constant estimator could do, fitted on the answers themselves."""
    return min((max(abs(predict(r, p) / r["unprofiled"] - 1) for r in rows), p) for p in grid)


def estimators(rows: list[dict], launch_us: float) -> list[dict]:
    torch_rows = [r for r in rows if r["ops"]]
    g = [i / 20 for i in range(1, 1201)]  # 0.05 .. 60 in steps of 0.05
    return [
        dict(name="device profile's eager launch cost: unprofiled = launches × c + host stalls",
             param=f"c = {launch_us:.2f} µs (measured)", worst=max(abs(
                 (r["launches"] * launch_us / 1e3 + r["host_stalls"]) / r["unprofiled"] - 1) for r in rows)),
        *[dict(name=n, param=fmt.format(p), worst=w) for n, fmt, (w, p) in [
            ("fitted launch cost: unprofiled = launches × c + host stalls", "c = {:.2f} µs (fitted)",
             best_fit(rows, lambda r, c: r["launches"] * c / 1e3 + r["host_stalls"], g)),
            ("CUPTI cost per launch: unprofiled = traced − launches × d", "d = {:.2f} µs (fitted)",
             best_fit(rows, lambda r, d: r["traced"] - r["launches"] * d / 1e3, g)),
            ("launch-call duration under CUPTI scaled: unprofiled = launches × call × k", "k = {:.2f} (fitted)",
             best_fit(rows, lambda r, k: r["launches"] * r["call_us"] * k / 1e3, g)),
            ("one inflation for all: unprofiled = traced ÷ k", "k = {:.2f} (fitted)",
             best_fit(rows, lambda r, k: r["traced"] / k, g)),
            ("torch per-op overhead: unprofiled = traced − ops × d (torch traces)", "d = {:.2f} µs (fitted)",
             best_fit(torch_rows, lambda r, d: r["traced"] - r["ops"] * d / 1e3, g))]]]


def test_profiler_inflation_is_the_manifest_ratio_and_no_estimator_reaches_15pct():
    rows = inflation_rows()
    assert len(rows) == len(EAGER)
    for r in rows:  # with a manifest: exactly traced / unprofiled
        assert r["inflation"] == pytest.approx(r["ratio"], rel=1e-12)
    launch_us = json.loads((SAMPLES / "device_profile.json").read_text())["launch"]["eager_us_per_kernel"]
    # even fitted on the answers, no one-constant estimator is within 15% on every eager capture: the same
    # workload's unprofiled step moves 1.77x between processes while its traces barely differ
    assert all(e["worst"] > 0.15 for e in estimators(rows, launch_us))
    a, b = (next(r for r in rows if r["name"] == n) for n in ("spec-small-eager", "spec-small-eager-nomark"))
    assert a["launches"] == b["launches"] and a["traced"] / b["traced"] < 1.15
    assert a["unprofiled"] / b["unprofiled"] > 1.7
    # and without a manifest the key stays null (a copy of the trace alone)
    with tempfile.TemporaryDirectory() as d:
        assert copied_away("synthetic-eager", Path(d)).time_base.profiler_inflation is None


def test_graphed_verdict_names_the_host_work_after_a_wait():
    """In a step that already replays graphs, the host time after a sync's return is named in the verdict when it
    is a sizeable part of the step (serve-prefill-graph-nomark: the injected ~0.55 ms of Python after each
    synchronize, hand SQL), and not named when it is small (spec-small-graph: 0.026 ms)."""
    name = "serve-prefill-graph-nomark"
    after = after_waits_sql(name)
    assert after > 0.5
    verdict = analysed(name).advice["cuda_graphs"]["verdict"]
    assert f"{after:.3f} ms of it follows a host wait's return" in verdict
    small = "spec-small-graph"
    assert after_waits_sql(small) < 0.05
    assert "follows a host wait's return" not in analysed(small).advice["cuda_graphs"]["verdict"]
