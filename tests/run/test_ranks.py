"""Several ranks: the contract's cross_rank object on the real GB300 TP4 SGLang files (waits checked against the
arrival spread computed by hand from the raw JSON), the per-collective table (totals = `tracekit kernels`; the b200
multimem all-reduce with its own bandwidth), hidden communication, the tensor-parallel size from the trace, and
the engines (process pool and a Dask LocalCluster)."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import polars as pl
import pytest

import tracekit
from tracekit.analyses.collectives import (
    collective_table,
    collectives_verdict,
    comm_summary,
    hidden_communication,
    is_latency_bound,
    tp_from_trace,
)
from tracekit.categories import BREAKDOWN_SCHEMA
from tracekit.errors import TracekitError
from tracekit.results.kernels import kernel_summary
from tracekit.run.engines import map_files, parse_engine
from tracekit.run.ranks import CrossRank, analyse_rank, cross_rank, rank_result

from conftest import DATA, shared

LORA = ("lora_perf_lora_profile/runs/Qwen3-30B-A3B-Instruct-2507-BF16-expert_shared-20260609-133913/"
        "current_base_lora/profile/base")
B200 = "TraceLens/tests/traces/b200/eager_trace.json.gz"
OPTS = {}
CONTRACT = {"ranks", "slowest_rank", "pacing_rank", "step_ms_by_rank", "skew_ms", "wait_ms_by_rank", "transfer_ms",
            "exposed_communication_ms_by_rank", "clock_offset_ms_by_rank", "collectives", "verdict"}


@pytest.fixture(scope="module")
def gb300_files():
    return sorted(shared(LORA).glob("bs16-TP-*.trace.json.gz"))


@pytest.fixture(scope="module")
def gb300(gb300_files) -> tuple[list, CrossRank]:
    results = map_files(analyse_rank, gb300_files, OPTS)  # a process pool, one file per process
    return results, cross_rank(results)


# ───────────────────────────── by hand, from the raw JSON ─────────────────────────────

def _raw(path) -> list[dict]:
    return json.load(gzip.open(path))["traceEvents"]


def _decode_comm_by_hand(path) -> pl.DataFrame:
    """The communication kernels of the decode steps, straight from the JSON: kernels whose launch (runtime call,
    by correlation) lies inside a CPU 'step[DECODE' annotation on the same thread; arrival = the kernel's start,
    or the end of the kernels and copies before it on its stream when they end later."""
    ev = _raw(path)
    x = [e for e in ev if e.get("ph") == "X"]
    steps = pl.DataFrame([{"tid": e["tid"], "s": e["ts"], "e": e["ts"] + e["dur"]} for e in x
                          if e.get("cat") == "user_annotation" and e["name"].startswith("step[DECODE")])
    calls = pl.DataFrame([{"tid": e["tid"], "ts": e["ts"], "correlation": e["args"]["correlation"]} for e in x
                          if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})])
    in_decode = (calls.join(steps, on="tid").filter((pl.col("ts") >= pl.col("s")) & (pl.col("ts") <= pl.col("e")))
                 .with_columns(step=pl.col("s").rank("dense"))).select("correlation", "step").unique("correlation")
    gpu = pl.DataFrame([{"name": e["name"], "ts": e["ts"], "dur": e["dur"], "stream": e["args"]["stream"],
                         "correlation": e["args"].get("correlation"), "kernel": e["cat"] == "kernel"} for e in x
                        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")])
    gpu = gpu.with_columns(start=(pl.col("ts") * 1000).round(0).cast(pl.Int64),
                           end=((pl.col("ts") + pl.col("dur")) * 1000).round(0).cast(pl.Int64)).sort("stream", "start")
    gpu = gpu.with_columns(arrival=pl.max_horizontal(
        "start", pl.col("end").cum_max().shift(1).over("stream").fill_null(pl.col("start"))))
    comm = gpu.filter(pl.col("kernel") & pl.col("name").str.contains(r"all_reduce|allreduce|nccl"))
    return comm.join(in_decode, on="correlation", how="inner").sort("start").with_columns(
        seq=pl.int_range(pl.len()).over("name"))


@pytest.mark.slow
def test_gb300_waits_are_the_arrival_spread_by_hand(gb300, gb300_files):
    _, cr = gb300
    frames = [_decode_comm_by_hand(f).with_columns(rank=pl.lit(r)) for r, f in enumerate(gb300_files)]
    allc = pl.concat(frames)
    assert allc.group_by("rank").len().sort("rank")["len"].to_list() == [784] * 4  # 98 per decode step x 8
    # the last of the 8 steps has no following step: excluded (contract), 7 analysed
    allc = allc.filter(pl.col("step") < 8)
    for arrival in ("arrival", "start"):  # serialised (what tracekit uses) and the raw kernel start: both within 2%
        w = allc.with_columns(wait=pl.col(arrival).max().over("name", "seq") - pl.col(arrival))
        by_hand = w.group_by("rank").agg(pl.col("wait").sum() / 1e6 / 7).sort("rank")["wait"].to_list()
        assert cr.wait_ms_by_rank == pytest.approx(by_hand, rel=0.02), arrival
    # the share of collectives each rank reaches last, by hand from the serialised arrivals: no rank leads the
    # next by the contract's 10 percentage points (27/28/20/25%), so there is no pacing rank
    w = allc.with_columns(last=pl.col("arrival") == pl.col("arrival").max().over("name", "seq"),
                          wait=pl.col("arrival").max().over("name", "seq") - pl.col("arrival"))
    counts = w.group_by("rank").agg(pl.col("last").sum(), pl.col("wait").sum()).sort("rank")
    shares = (counts["last"] / allc.filter(pl.col("rank") == 0).height).to_list()
    assert cr.last_arrival_share_by_rank == pytest.approx(shares, abs=0.005)
    top, second = sorted(shares)[-1], sorted(shares)[-2]
    assert top - second < 0.10 and cr.pacing_rank is None
    # transfer = the duration (from arrival) on the last-arriving rank, the same for every rank
    t = (allc.sort("arrival").group_by("name", "seq").agg((pl.col("end") - pl.col("arrival")).last())
         ["end"].sum() / 1e6 / 7)
    assert cr.transfer_ms == pytest.approx(t, rel=0.02)
    # skew = mean per step of the largest (per-rank) wait
    per_step = w.group_by("step", "rank").agg(pl.col("wait").sum()).group_by("step").agg(pl.col("wait").max())
    assert cr.skew_ms == pytest.approx(per_step["wait"].mean() / 1e6, rel=0.02)
    # one story: each rank's communication kernel time (serialised) = its wait + the transfer (+ end jitter)
    for k, wait in zip(cr.comm_kernel_ms_by_rank, cr.wait_ms_by_rank):
        assert k == pytest.approx(wait + cr.transfer_ms, rel=0.06)


def test_gb300_cross_rank_object_and_headline(gb300):
    _, cr = gb300
    d = cr.to_dict()
    assert set(d) == CONTRACT  # exactly the contract's keys; the extensions are beside it
    d.update(cr.detail())
    assert d["ranks"] == 4 and d["rank_ids"] == [0, 1, 2, 3]
    assert d["clock_offset_ms_by_rank"] is None  # one host: the collective ends agree within 0.2 us
    assert d["slowest_rank"] == max(range(4), key=lambda r: d["step_ms_by_rank"][r])
    assert d["matched_per_step"] == 98  # 95 fused all-reduce+norm, 2 one-shot all-reduce, 1 all-gather
    v = d["verdict"]
    # no pacing rank (27/28/20/25%): the verdict names the ranks that share the pace, and the kind where one leads
    assert d["pacing_rank"] is None
    assert v.startswith("no single rank sets the pace: ranks 0, 1, 2 and 3 arrive last about equally often "
                        "(27%, 28%, 20%, 25% of the 98 collective(s) per step)")
    assert "by kind, rank 3 is last at 43% of the all-gathers" in v  # 3 of the 7 all-gathers
    assert f"skew {d['skew_ms']:.3f} ms" in v and f"{d['transfer_ms']:.3f} ms of transfer" in v
    # the saving is named after the kinds that hold it (95 + 2 all-reduces, 1 all-gather per step), on the rank
    # the others wait for without a pacing rank: the one that waits least (issue 51 item 5: not the slowest step,
    # which in lockstep TP is the rank that waits most), its exposed transfer (it hides nothing: all of the transfer)
    waits = d["wait_ms_by_rank"]
    assert d["slowest_rank"] == 3 == max(range(4), key=lambda r: waits[r])  # the longest step waits most
    assert d["saving_rank"] == min(range(4), key=lambda r: waits[r]) == 0 and d["saving_rank_is"] == "least_wait"
    assert "on rank 0 (the rank that waits least;" in v and "slowest" not in v
    assert "faster all-reduce could save at most" in v and "all-gather could" not in v
    assert d["faster_collectives_saving_ms"] == pytest.approx(
        min(d["exposed_communication_ms_by_rank"][0], d["transfer_ms"]), rel=0.01)
    for row in d["collectives"]:
        assert {"kind", "count_per_step", "bytes", "ms_per_step", "algbw_gbps", "busbw_gbps", "link_gbps",
                "latency_bound"} <= set(row)
        assert row["link_gbps"] == 900  # GB300: NVLink 5, from the GPU table
    kinds = {(r["kind"], r["implementation"]): r for r in d["collectives"]}
    assert kinds[("all_reduce", "fused_ar_norm")]["count_per_step"] == 95
    # the bs16 decode all-reduce is latency-bound (size unknown in graph replays: judged from the call time)
    assert kinds[("all_reduce", "fused_ar_norm")]["latency_bound"]
    v = collectives_verdict(d["collectives"], across_ranks=True)
    assert "is latency-bound" in v and "already a one-shot/custom kernel" in v and "bus bandwidth is not" in v
    json.dumps(d)  # plain JSON


def test_gb300_hidden_communication_is_zero_on_one_stream(gb300):
    results, _ = gb300
    # the decode forwards run on one stream: programmatic-dependent-launch overlap hides nothing; the scheduler's
    # next-batch work on a second stream (alloc_decode_kernel, copies: launched after the step[DECODE] span, so in
    # the step's iteration) overlaps under 0.1% of the collectives
    assert all(r.comm.hidden_ms < 1e-3 * r.breakdown["kernel_ms_per_step"]["communication"] for r in results)
    assert all(r.breakdown["kernel_ms_per_step"]["communication"] > 0.8 for r in results)


def test_hidden_communication_on_other_streams():
    # HTA's DDP trace: NCCL on its own stream under the backward pass. With no same-stream overlap, the
    # communication kernel time the partition does not count as exposed is exactly what compute hides.
    t = tracekit.load(DATA / "kineto" / "hta_nccl_data.json.gz")
    b = tracekit.breakdown(t)
    hidden = hidden_communication(b.activities)
    assert hidden > 1.0
    assert hidden == pytest.approx(b.kernel_ms_per_step["communication"] - b.per_step_ms["communication"], rel=0.01)


# ───────────────────────────── the collectives table ─────────────────────────────

@pytest.mark.slow
def test_collective_totals_equal_kernels_totals(gb300_files):
    t = tracekit.load(gb300_files[0])
    b = tracekit.breakdown(t)
    rows = collective_table(comm_summary(b, t))
    by_name = {k["name"]: k for k in kernel_summary(t)["kernels"]}
    fused = next(r for r in rows if r["implementation"] == "fused_ar_norm")
    k = by_name[fused["kernel"]]  # every one of them runs in the 8 decode steps, 95 a step
    assert k["count"] == 760 and b.steps["count"] == 7  # the last step has no following step: excluded
    # the 7 analysed steps' kernels, straight from the JSON
    raw = _decode_comm_by_hand(gb300_files[0]).filter((pl.col("name") == fused["kernel"]) & (pl.col("step") < 8))
    assert fused["count"] == raw.height == 665
    assert fused["total_ms"] == pytest.approx(float(raw["dur"].sum()) / 1e3, rel=1e-6)
    assert fused["ms_per_step"] == pytest.approx(fused["total_ms"] / 7, rel=1e-9)


@pytest.mark.slow
def test_b200_multimem_all_reduce_has_its_own_row_with_bandwidth():
    path = shared(B200)
    t = tracekit.load(path)
    b = tracekit.breakdown(t)
    rows = collective_table(comm_summary(b, t))
    mm = next(r for r in rows if r["implementation"] == "symm_mem")
    assert mm["kind"] == "all_reduce" and mm["count"] == 73 and mm["group_size"] == 8
    assert mm["busbw_gbps"] is not None and mm["link_gbps"] == 900 and not mm["latency_bound"]
    # by hand: each multimem kernel's size = its launching op symm_mem::multimem_all_reduce_'s input (elements x 2
    # bytes of BFloat16), found by External id; algbw = all bytes / all kernel time; busbw x 2(8-1)/8
    ev = [e for e in _raw(path) if e.get("ph") == "X"]
    ops = {e["args"]["External id"]: e for e in ev if e.get("name") == "symm_mem::multimem_all_reduce_"}
    ks = [e for e in ev if e.get("cat") == "kernel" and "multimem_all_reduce_kernel" in e["name"]]
    sizes = []
    for k in ks:
        op = ops[k["args"]["External id"]]["args"]
        dims, types = op["Input Dims"][0], op["Input type"][0]
        assert types == "c10::BFloat16"
        n = 1
        for d in dims:
            n *= d
        sizes.append(2 * n)
    algbw = sum(sizes) / (sum(k["dur"] for k in ks) * 1e3)  # bytes per ns = GB/s
    assert mm["algbw_gbps"] == pytest.approx(algbw, rel=1e-3)
    assert mm["busbw_gbps"] == pytest.approx(algbw * 2 * 7 / 8, rel=1e-3)
    assert mm["bytes"] == sorted(sizes)[len(sizes) // 2]  # median message: 888 x 2880 tokens x hidden, BF16
    assert mm["ms_per_step"] == pytest.approx(sum(k["dur"] for k in ks) / 1e3, rel=1e-6)  # one (prefill) step
    # the single-rank verdict (what advice.communication quotes) is about this row, not the all-gather
    v = collectives_verdict(rows)
    assert v.startswith("the all-reduce (symm_mem) of 5.1 MB reaches 318.4 GB/s bus bandwidth") and "lower bound" in v
    # the NCCL all-gather keeps its own row (it was the one quoted before: 16.0 GB/s of a 22 us all-gather)
    ag = next(r for r in rows if r["kind"] == "all_gather")
    assert ag["count"] == 1 and ag["busbw_gbps"] == pytest.approx(16.03, abs=0.01) and ag["latency_bound"]


def test_latency_bound_threshold():
    # definition (synthetic figures): bus bytes at link speed against 2(n-1) ring steps x 0.6 us (NVLink)
    assert is_latency_bound("all_reduce", 8, 16_384, None, "NVLink 4", 450) == (True, "bytes")  # bs1 decode, 8 GPUs
    assert is_latency_bound("all_reduce", 8, 64 << 20, None, "NVLink 4", 450) == (False, "bytes")
    # threshold: 8.4 us x 450 GB/s / 1.75 = 2.16 MB
    assert is_latency_bound("all_reduce", 8, 2_150_000, None, "NVLink 4", 450)[0]
    assert not is_latency_bound("all_reduce", 8, 2_170_000, None, "NVLink 4", 450)[0]
    assert is_latency_bound("all_reduce", 2, 30_000, None, "PCIe 5.0 x16", 64)[0]  # 2 x 1.0 us x 64 GB/s = 128 KB
    assert is_latency_bound("all_reduce", 4, None, 5.0, "NVLink 5", 900) == (True, "time")  # <= 2 x 3.6 us
    assert is_latency_bound("all_reduce", 4, None, 9.0, "NVLink 5", 900) == (False, None)
    assert is_latency_bound("all_reduce", None, 16_384, None, "NVLink 5", 900) == (False, None)


# ───────────────────────────── communicator size ─────────────────────────────

@pytest.mark.parametrize("rel, want, evidence", [
    ("HolisticTraceAnalysis/tests/data/nccl_parser_config/nccl_data.json.gz", 2, "Kineto NCCL args"),
    (B200, 8, "inferred"),  # multimem all-reduces; the NCCL all-gather's group has 8 ranks (world size 8 too)
    (LORA + "/bs16-TP-0.trace.json.gz", 4, "inferred"),
    # HTA's traces of an 8-rank and a 128-rank job and DeepSeek's EP64 trace: the world size is not a TP size
    ("HolisticTraceAnalysis/tests/data/trace_diff/control/control.json.gz", None, "no communicator size"),
    ("HolisticTraceAnalysis/tests/data/timeline_analysis/sampled_rank-0.json.gz", None, "no all-reduce"),
    ("profile-data/train.json", None, "no all-reduce"),
    ("nsys-ai/tests/fixtures/mfu_2gpu_before.sqlite", None, "no all-reduce"),
])
@pytest.mark.slow
def test_tp_from_trace(rel, want, evidence):
    t = tracekit.load(shared(rel))
    n, why = tp_from_trace(t)
    assert n == want and evidence in why
    if n is None and t.meta.world_size:
        assert t.meta.world_size > 1  # a world size was there, and not taken


# ───────────────────────────── matching robustness (derived from the real files) ─────────────────────────────

def test_order_offset_and_clock_offset_are_recovered(gb300):
    """Damaged copies of the GB300 summaries: rank 2's capture starts 3 fused all-reduces late (they are dropped),
    and, in the second copy, its clock also runs 1.234567 ms ahead. Matching by order after the offset gives the
    same waits; aligning on collective ends recovers the clock offset."""
    results, cr = gb300
    cut = results[2].comm.kernels.filter(pl.col("impl") == "fused_ar_norm")["start"].sort()[2]

    def damaged(clock_ns):
        out = []
        for i, r in enumerate(results):
            k = r.comm.kernels
            if i == 2:
                k = k.filter(~((pl.col("impl") == "fused_ar_norm") & (pl.col("start") <= cut)))
                k = k.with_columns(pl.col("start", "end", "arrival") + clock_ns)
            out.append(type(r)(r.breakdown, type(r.comm)(**{**r.comm.__dict__, "kernels": k})))
        return cross_rank(out)

    late = damaged(0)
    assert any("rank 2: its capture starts 3 collective(s) later than that of rank 0" in w for w in late.warnings)
    assert late.clock_offset_ms_by_rank is None
    assert late.wait_ms_by_rank == pytest.approx(cr.wait_ms_by_rank, rel=0.01)  # 3 of 784 collectives left out
    both = damaged(1_234_567)
    off = both.clock_offset_ms_by_rank
    assert off[2] == pytest.approx(1.234567, abs=0.001) and off[0] == off[1] == off[3] == 0.0
    assert any("aligned on collective ends" in w for w in both.warnings)
    # the alignment also removes rank 2's own median end difference (a fraction of a us per collective)
    tol = both.matched_per_step * abs(off[2] - 1.234567) * 1.5 + 1e-4
    for w_both, w_late in zip(both.wait_ms_by_rank, late.wait_ms_by_rank):
        assert abs(w_both - w_late) <= tol
    # (no rank leads by 10 points: dropping 3 collectives or the alignment's residue does not make one)
    assert both.pacing_rank is None and late.pacing_rank is None


@pytest.mark.slow
def test_files_of_different_captures_are_not_matched():
    # HTA's sampled rank pair (trimmed by its authors): a few send/recv kernels whose ends do not line up
    a = shared("HolisticTraceAnalysis/tests/data/timeline_analysis/sampled_rank-0.json.gz")
    b = a.parents[1] / "trace_filter" / "sampled_rank-1.json.gz"
    cr = cross_rank(map_files(analyse_rank, [a, b], OPTS))
    assert cr.pacing_rank is None and cr.skew_ms is None and cr.wait_ms_by_rank == [None, None]
    assert any("do not line up" in w for w in cr.warnings)
    assert "could not be matched" in cr.verdict


# ───────────────────────────── engines ─────────────────────────────

@pytest.mark.slow
def test_dask_engine_at_a_scheduler_address():
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None) as cluster:
        files = [DATA / "kineto" / "hta_rocm_mi250.json.gz",
                 DATA / "kineto" / "tracelens_rocm_vllm_decode_graph.json.gz"]
        got = map_files(analyse_rank, files, OPTS, engine=f"dask={cluster.scheduler_address}")
        assert [r.breakdown["source"]["path"] for r in got] == [str(f) for f in files]  # in the order given
        # a user error on a worker is a one-line TracekitError here
        with pytest.raises(TracekitError, match="no GPU activity"):
            map_files(analyse_rank, [DATA / "kineto" / "hta_cpu_only_rank34.json.gz"], OPTS, engine="dask",
                      address=cluster.scheduler_address)


def test_engine_spec(monkeypatch):
    assert parse_engine("dask") == ("dask", None)
    assert parse_engine("dask=tcp://head:8786") == ("dask", "tcp://head:8786")
    assert parse_engine(None) == ("process", None)
    with pytest.raises(TracekitError, match="unknown engine"):
        parse_engine("ray")
    with pytest.raises(TracekitError, match="cannot reach the Dask scheduler"):
        pytest.importorskip("distributed")
        monkeypatch.setattr("tracekit.run.engines.CONNECT_TIMEOUT", "1s")
        map_files(analyse_rank, [DATA / "kineto" / "hta_nccl_data.json.gz"], OPTS, engine="dask=tcp://127.0.0.1:9")


# ───────────────────────────── renderers ─────────────────────────────

def test_renderers_headline_first_and_names_escaped(gb300):
    from io import StringIO

    from rich.console import Console

    from tracekit.report import render

    results, cr = gb300
    md_text = render("ranks", cr, "md", None)
    assert md_text.startswith("**no single rank sets the pace")
    assert md_text.index("| rank | step |") < md_text.index("| kind | impl |")
    assert "fused\\_ar\\_norm" in md_text  # markdown metacharacters of names escaped
    # kernel names in code spans are shown as written: no entity (GitHub shows `&lt;` in code literally)
    spans = re.findall(r"`([^`]*)`", md_text)
    assert spans and not any("&lt;" in x or "&gt;" in x for x in spans)
    assert any("<" in x for x in spans), spans
    out = StringIO()
    render("ranks", cr, "table", lambda: Console(file=out, width=160, color_system=None))
    text = out.getvalue()
    assert text.startswith("no single rank sets the pace") and "collectives" in text
    report = json.loads(render("ranks", cr, "json", None))
    assert report["cross_rank"] == json.loads(json.dumps(cr.to_dict())) and len(report["ranks"]) == 4
    assert report["cross_rank_detail"] == json.loads(json.dumps(cr.detail()))
    assert report["headline"] == cr.verdict
    csv_text = render("ranks", cr, "csv", None)
    assert csv_text.splitlines()[0].startswith("rank,path,device") and len(csv_text.splitlines()) == 5
    # an untrusted label cannot inject markdown or HTML
    evil = cross_rank(results, labels=["<b>x</b>|", "a", "b", "c"])
    text = render("ranks", evil, "md", None)
    assert "<b>" not in text and "&lt;b&gt;x&lt;/b&gt;\\|" in text
    assert re.search(r"\| rank \| step \|", text)


@pytest.mark.slow
def test_breakdown_without_trace_still_matches(gb300):
    # Breakdowns alone (what the CLI's process pool returned before): the same waits, without sizes
    results, cr = gb300
    files = [r.breakdown["source"]["path"] for r in results[:2]]
    bs = [tracekit.breakdown(tracekit.load(f)) for f in files]
    cr2 = cross_rank(bs)
    with_trace = cross_rank(results[:2])
    assert cr2.wait_ms_by_rank == pytest.approx(with_trace.wait_ms_by_rank, rel=1e-6)
    assert rank_result(bs[0]).comm.tp is None


# ───────────────────────────── the command: tracekit breakdown FILES --engine ... ─────────────────────────────

def _cli(*args):
    from click.testing import CliRunner

    from tracekit.cli import cli

    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.fixture(scope="module")
def gb300_cli(gb300_files):
    r = _cli("breakdown", gb300_files[0].parent, "--engine", "process", "--format", "json")
    assert r.exit_code == 0, r.stderr
    return json.loads(r.stdout)


@pytest.mark.slow
def test_cli_cross_rank_is_the_contract_object_and_the_waits_by_hand(gb300_cli, gb300, gb300_files):
    d = gb300_cli
    cr = d["cross_rank"]
    assert set(cr) == CONTRACT and cr["ranks"] == 4
    assert [r["source"]["path"] for r in d["ranks"]] == [str(f) for f in gb300_files]  # single-file breakdowns
    assert all(r["schema"] == BREAKDOWN_SCHEMA and "per_step_ms" in r for r in d["ranks"])
    assert d["cross_rank_detail"]["rank_ids"] == [0, 1, 2, 3]
    # the headline says who sets the pace (no one here), and splits skew from transfer
    assert d["headline"] == cr["verdict"]
    assert cr["pacing_rank"] is None and cr["verdict"].startswith("no single rank sets the pace")
    assert f"skew {cr['skew_ms']:.3f} ms" in cr["verdict"] and f"{cr['transfer_ms']:.3f} ms of transfer" in cr["verdict"]
    # per-rank wait = the arrival spread computed by hand from the raw JSON (raw kernel starts), within 2%
    allc = pl.concat([_decode_comm_by_hand(f).with_columns(rank=pl.lit(r)) for r, f in enumerate(gb300_files)])
    allc = allc.filter(pl.col("step") < 8)  # the last of 8 decode steps has no following step: excluded
    w = allc.with_columns(wait=pl.col("start").max().over("name", "seq") - pl.col("start"))
    by_hand = w.group_by("rank").agg(pl.col("wait").sum() / 1e6 / 7).sort("rank")["wait"].to_list()
    assert cr["wait_ms_by_rank"] == pytest.approx(by_hand, rel=0.02)
    assert min(by_hand) > 0.1 and max(by_hand) > 2 * min(by_hand)  # (a real spread, not a vacuous match)
    # the same object as the library's
    assert cr == json.loads(json.dumps(gb300[1].to_dict()))


@pytest.mark.slow
def test_cli_dask_local_cluster_gives_the_process_pool_cross_rank(gb300_cli, gb300_files, monkeypatch):
    pytest.importorskip("distributed")
    monkeypatch.setattr("tracekit.run.engines.usable_cpus", lambda: 2)  # a LocalCluster of 2 workers anywhere
    r = _cli("breakdown", *gb300_files, "--engine", "dask", "--format", "json")
    assert r.exit_code == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["cross_rank"] == gb300_cli["cross_rank"]  # identical, to the last digit
    assert d["ranks"] == gb300_cli["ranks"]


@pytest.mark.parametrize("spec, message", [
    ("ray", "unknown engine"),
    ("process=tcp://h:1", "takes no address"),
    ("dask=nonsense", "not a Dask scheduler address"),
    ("dask=tcp://127.0.0.1:9", "cannot reach the Dask scheduler"),
])
def test_cli_bad_engine_is_one_line_exit_2(spec, message, monkeypatch):
    if spec.startswith("dask="):
        pytest.importorskip("distributed")
    monkeypatch.setattr("tracekit.run.engines.CONNECT_TIMEOUT", "1s")
    files = [DATA / "kineto" / "hta_nccl_data.json.gz", DATA / "kineto" / "hta_rocm_mi250.json.gz"]
    r = _cli("breakdown", *files, "--engine", spec)
    assert r.exit_code == 2, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tracekit: error: ") and message in lines[0], r.stderr


@pytest.mark.slow
def test_cli_engine_on_one_file_says_it_is_not_used():
    """--engine places the per-file stage of several files: with one file it says so instead of ignoring it."""
    r = _cli("breakdown", DATA / "kineto" / "hta_nccl_data.json.gz", "--engine", "process", "--format", "json")
    assert r.exit_code == 0, r.output
    assert "--engine places the per-file work of several trace files" in r.stderr
    assert json.loads(r.stdout)["schema"] == BREAKDOWN_SCHEMA


def test_directory_expansion_includes_gzipped_exports(tmp_path):
    from tracekit.cli.output import expand_traces

    from conftest import sample

    gz, plain = sample("hf-large-graph/trace.sqlite.gz"), sample("hf-small-eager/trace.sqlite")
    (tmp_path / "r0.sqlite.gz").symlink_to(gz)
    (tmp_path / "r1.sqlite").symlink_to(plain)
    (tmp_path / "r1.sqlite.gz").symlink_to(gz)  # the same rank gzipped beside its plain export: listed once
    (tmp_path / "manifest.json").write_text("{}")
    assert [p.name for p in expand_traces([tmp_path])] == ["r0.sqlite.gz", "r1.sqlite"]


def test_docs_ranks_quotes_what_the_tool_prints(gb300):
    """docs/ranks.md quotes the GB300 cross-rank verdict and its per-rank table by hand: they must be what the
    tool prints for these four files."""
    from tracekit.report import render

    _, cr = gb300
    doc = (Path(__file__).parents[2] / "docs" / "ranks.md").read_text()
    quote = re.search(r"\n((?:> [^\n]*\n)+)\n\| rank \| step \|", doc)
    assert quote, "the quoted verdict before the per-rank table"
    assert " ".join(line[2:] for line in quote.group(1).splitlines()) == cr.verdict
    md_text = render("ranks", cr, "md", None)
    table = re.search(r"\| rank \| step \| exposed[^\n]*\n(?:\|[^\n]*\n)+", doc).group(0)
    for row in table.splitlines()[2:]:
        assert row in md_text, row
