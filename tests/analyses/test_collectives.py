"""Collectives (``tracekit.analyses.collectives``): the communication kernels of a GPU with their kind, communicator
and message bytes, and the per-kind table (counts, times, algorithm and bus bandwidth). On HTA's real NCCL trace
(tests/data/kineto/hta_nccl_data.json.gz: NCCL 2.17 all-reduces and broadcasts with their NCCL arguments), against
the JSON read here; bus bandwidth by NCCL's own convention (nccl-tests' PERFORMANCE.md: all-reduce 2(n-1)/n,
all-gather and reduce-scatter (n-1)/n, broadcast and reduce 1)."""

from __future__ import annotations

import gzip
import json
from decimal import Decimal

import polars as pl
import pytest

import tracekit
from tracekit.analyses.collectives import bus_factor, collectives_of, comm_kernels

from conftest import DATA

PATH = DATA / "kineto/hta_nccl_data.json.gz"
DTYPE = {"Float": 4, "Long": 8, "Int": 4, "BFloat16": 2, "Half": 2, "Byte": 1, "Char": 1}
KIND = {"allreduce": "all_reduce", "broadcast": "broadcast"}


@pytest.fixture(scope="module")
def nccl() -> list[dict]:
    """The NCCL kernels of device 0 as the JSON has them."""
    with gzip.open(PATH) as f:
        events = json.load(f, parse_float=Decimal)["traceEvents"]
    return sorted((e for e in events if e.get("cat") == "kernel" and e["name"].startswith("nccl")
                   and e["args"]["device"] == 0), key=lambda e: e["ts"])


@pytest.fixture(scope="module")
def kernels():
    found, warnings = comm_kernels(tracekit.load(PATH), None, 0)
    assert warnings == []
    return found


def test_each_nccl_kernel_with_its_kind_communicator_and_bytes(nccl, kernels):
    assert len(nccl) == 21
    assert kernels["name"].cast(pl.String).to_list() == [e["name"] for e in nccl]
    assert kernels["kind"].cast(pl.String).to_list() == [KIND[e["args"]["Collective name"]] for e in nccl]
    assert kernels["group_size"].to_list() == [e["args"]["Group size"] for e in nccl]
    assert kernels["group"].cast(pl.String).to_list() == [e["args"]["Process Group Name"] for e in nccl]
    assert kernels["bytes"].to_list() == [max(e["args"]["In msg nelems"], e["args"]["Out msg nelems"])
                                          * DTYPE[e["args"]["dtype"]] for e in nccl]
    assert kernels["start"].to_list() == [int(e["ts"] * 1000) for e in nccl]  # (µs with 3 decimals: exact ns)
    assert kernels["end"].to_list() == [int((e["ts"] + e["dur"]) * 1000) for e in nccl]


def test_the_table_sums_and_bandwidths(nccl, kernels):
    """One step holding every kernel: per kind, the count, the time and algbw = bytes / time; busbw = algbw x NCCL's
    factor (2 ranks: all-reduce 2(n-1)/n = 1)."""
    rows = {r["kind"]: r for r in collectives_of(kernels.with_columns(step=pl.lit(0, pl.Int64)), 1,
                                                  "NVIDIA A100-PG509-200")}
    assert set(rows) == {"all_reduce", "broadcast"}
    for kind, name in (("all_reduce", "allreduce"), ("broadcast", "broadcast")):
        mine = [e for e in nccl if e["args"]["Collective name"] == name]
        dur_ns = sum(int(e["dur"] * 1000) for e in mine)
        nbytes = sum(max(e["args"]["In msg nelems"], e["args"]["Out msg nelems"]) * DTYPE[e["args"]["dtype"]]
                     for e in mine)
        r = rows[kind]
        assert (r["count"], r["count_per_step"], r["group_size"], r["implementation"]) == (len(mine), len(mine), 2,
                                                                                           "nccl")
        assert r["total_ms"] == pytest.approx(dur_ns / 1e6, rel=1e-12)
        assert r["algbw_gbps"] == pytest.approx(nbytes / dur_ns, rel=1e-12)  # B/ns = GB/s
        assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * bus_factor(kind, 2), rel=1e-12)
    assert (rows["all_reduce"]["count"], rows["broadcast"]["count"]) == (15, 6)
    # the GPU table's link of an A100 (NVLink 3, 300 GB/s per direction: tracekit/data/gpus.toml)
    assert rows["all_reduce"]["link"] == "NVLink 3" and rows["all_reduce"]["link_gbps"] == 300.0


def test_bus_factors_are_nccl_tests_factors():
    assert [bus_factor("all_reduce", n) for n in (2, 4, 8)] == [1.0, 1.5, 1.75]
    assert [bus_factor(k, 8) for k in ("all_gather", "reduce_scatter")] == [0.875, 0.875]
    assert bus_factor("broadcast", 8) == bus_factor("reduce", 8) == 1.0
    assert bus_factor("all_reduce", None) is None
