"""Communication: collective sizes from Kineto NCCL kernel args, bus bandwidth (NCCL convention), and several rank
files analysed together (the cross-rank object; its figures are pinned in tests/test_ranks.py)."""

from __future__ import annotations

import gzip
import json

import polars as pl
import pytest
from click.testing import CliRunner

import tracekit
from tracekit.analyses.communication import collective_bandwidth
from tracekit.cli import cli

from conftest import DATA, shared

NCCL = DATA / "kineto" / "hta_nccl_data.json.gz"
MFU = DATA / "nsys" / "nsysai_mfu_2gpu_before_2026.2.sqlite"
LORA = ("lora_perf_lora_profile/runs/Qwen3-30B-A3B-Instruct-2507-BF16-expert_shared-20260609-133913/"
        "current_base_lora/profile/base")


def test_collective_args_are_read():
    events = json.load(gzip.open(NCCL))["traceEvents"]
    want = [e for e in events if e.get("cat") == "kernel" and "Collective name" in e.get("args", {})]
    t = tracekit.load(NCCL)
    assert t.collectives.height == len(want) == 21
    first = min(want, key=lambda e: e["ts"])
    row = t.collectives.row(0, named=True)
    assert row["collective"] == first["args"]["Collective name"]
    assert row["in_nelems"] == first["args"]["In msg nelems"]
    assert row["group_size"] == first["args"]["Group size"] == 2


def test_bus_bandwidth_follows_nccl_convention():
    t = tracekit.load(NCCL)
    b = tracekit.breakdown(t)
    bw = collective_bandwidth(b.activities, t.collectives)
    assert bw["collective"] == "allreduce" and bw["group_size"] == 2
    # by hand from the same events: median over the analysed allreduce kernels of
    # nelems * 4 bytes (Float) * 2(n-1)/n / duration
    acts = b.activities.filter(pl.col("category") == "communication")
    j = acts.join(t.collectives.filter(pl.col("collective") == "allreduce"), left_on=["pid", "correlation", "start0"],
                  right_on=["pid", "correlation", "start"])
    by_hand = (j["in_nelems"] * 4 * 2 * (2 - 1) / 2 / (j["dur"] * 1e-9) / 1e9).median()
    assert bw["median_busbw_gbps"] == pytest.approx(by_hand)
    # HTA's DDP trace is training (backward and optimizer kernels): the split and these figures, no decode advice
    assert b.steps["phase"] == "prefill" and not b.advice["communication"]["applicable"]


def test_several_files_give_the_cross_rank_object():
    # `breakdown DIR`: every rank's breakdown, the per-rank table and the contract's cross_rank object
    # (the figures themselves are checked against the raw JSON in tests/test_ranks.py)
    r = CliRunner().invoke(cli, ["breakdown", str(shared(LORA)), "--format", "json"])
    assert r.exit_code == 0, r.stderr
    d = json.loads(r.stdout)
    cr = d["cross_rank"]
    assert len(d["ranks"]) == cr["ranks"] == 4 and d["headline"] == cr["verdict"]
    cols = d["columns"]
    w, x = cols.index("comm_wait_ms"), cols.index("comm_transfer_ms")
    assert [row[w] for row in d["table"]] == cr["wait_ms_by_rank"]
    assert {row[x] for row in d["table"]} == {cr["transfer_ms"]}  # the same matched transfer on every rank
    waits = cr["wait_ms_by_rank"]
    # PROVENANCE.md: the all-reduce totals differ by rank: waiting skew; the pacing rank waits least
    assert waits.index(max(waits)) != waits.index(min(waits))
    assert cr["verdict"].startswith(f"rank {cr['pacing_rank']} sets the pace") and "skew" in cr["verdict"]


def test_all_devices_of_one_report():
    r = CliRunner().invoke(cli, ["breakdown", str(MFU), "--all-devices", "--format", "json"])
    assert r.exit_code == 0, r.stderr
    d = json.loads(r.stdout)
    assert [x["gpu"]["device"] for x in d["ranks"]] == [0, 1]
    assert [row[0] for row in d["table"]] == ["gpu0", "gpu1"]
    # the same cross_rank object as for several files (the devices of one report share one clock)
    from tracekit.analyses.ranks import CONTRACT_KEYS

    cr = d["cross_rank"]
    assert set(cr) == set(CONTRACT_KEYS) and cr["ranks"] == 2 and cr["clock_offset_ms_by_rank"] is None
    k = d["cross_rank_detail"]["comm_kernel_ms_by_rank"]
    assert k == pytest.approx([x["kernel_ms_per_step"]["communication"] for x in d["ranks"]], rel=0.05)
    r = CliRunner().invoke(cli, ["breakdown", str(MFU), "--all-devices", "--device", "0"])
    assert r.exit_code == 2 and r.stderr.startswith("tracekit: error: --all-devices")


def test_several_files_give_ranks_and_a_cross_rank_table():
    files = sorted(str(p) for p in shared(LORA).glob("*.json.gz"))
    d = json.loads(CliRunner().invoke(cli, ["info", *files, "--format", "json"]).stdout)
    assert len(d["ranks"]) == 4 and d["columns"][:2] == ["rank", "path"]
    kernels = d["columns"].index("kernels")
    assert [row[kernels] for row in d["table"]] == [r["counts"]["kernels"] for r in d["ranks"]] == [13398] * 4
    k = json.loads(CliRunner().invoke(cli, ["kernels", *files, "--top", "3", "--format", "json"]).stdout)
    total = k["columns"].index("kernel_ms")
    for row, f in zip(k["table"], files):
        single = json.loads(CliRunner().invoke(cli, ["kernels", f, "--format", "json"]).stdout)
        assert row[total] == pytest.approx(sum(x["total_ms"] for x in single["kernels"]))  # over all kernels
    assert all(len(r["kernels"]) == 3 for r in k["ranks"])
