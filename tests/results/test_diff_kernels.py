"""tracekit diff's per-kernel deltas (``kernels``, ``kernel_categories``, ``delta.kernel_total_ms_per_step``): which
kernels moved, largest first, adding up to the kernel-time delta; checked against raw SQL on the committed H200
captures."""

from __future__ import annotations

import json

import polars as pl
import pytest
from click.testing import CliRunner

import tracekit
from tracekit.cli import cli
from tracekit.results.diff import diff

from conftest import sample_sqlite, sample_trace, sql_rows

_CACHE: dict = {}


def bd(name: str):
    if name not in _CACHE:
        _CACHE[name] = tracekit.breakdown(tracekit.load(sample_trace(name)))
    return _CACHE[name]


def adds_up(d: dict) -> None:
    """The contract's sums: the kernels' deltas add up to the kernel-time delta, per category and in total."""
    ks = d["kernels"]
    assert sum(k["delta_ms_per_step"] for k in ks) == pytest.approx(d["delta"]["kernel_total_ms_per_step"]["abs"],
                                                                     abs=1e-9)
    for cat, c in d["delta"]["kernel_ms_per_step"].items():
        if c["abs"] is not None:
            assert sum(k["delta_ms_per_step"] for k in ks if k["category"] == cat) == pytest.approx(c["abs"], abs=1e-9)
    for k in ks:
        assert k["delta_ms_per_step"] == pytest.approx(k["new_ms_per_step"] - k["base_ms_per_step"], abs=1e-12)
    deltas = [abs(k["delta_ms_per_step"]) for k in ks]
    assert deltas == sorted(deltas, reverse=True)  # largest change first


def test_an_added_kernel_is_the_largest_mover():
    """The same session's synthetic graph loop without and with a symmetric-memory one-shot all-reduce per layer (32
    per step): the all-reduce kernel is new, and first; its time per step is 32 x its mean duration by SQL."""
    d = diff(bd("tp1-synthetic-nccl-graph"), bd("tp1-synthetic-symm1-graph")).to_dict()
    adds_up(d)
    top = d["kernels"][0]
    assert top["name"].startswith("void <unnamed>::one_shot_all_reduce_kernel<c10::BFloat16")
    assert top["category"] == "communication" and top["base_ms_per_step"] == 0.0
    [(n, mean_ns)] = sql_rows(sample_sqlite("tp1-synthetic-symm1-graph"),
                              "SELECT COUNT(*), AVG(k.end - k.start) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s "
                              "ON s.id = k.demangledName WHERE s.value LIKE '%one_shot_all_reduce_kernel%'")
    assert n == 512 == 32 * 16  # 32 per step, 16 profiled steps
    assert top["new_ms_per_step"] == pytest.approx(32 * mean_ns / 1e6, rel=0.005)
    # its copy-in (a device-to-device copy per all-reduce) is second
    assert d["kernels"][1]["name"] == "[CUDA memcpy Device-to-Device]" and d["kernels"][1]["category"] == "memory"
    # the categories that moved: communication first, then memory
    cats = d["kernel_categories"]
    assert [c["category"] for c in cats[:2]] == ["communication", "memory"]
    assert cats[0]["delta_ms_per_step"] == pytest.approx(top["delta_ms_per_step"], abs=1e-9)
    assert {c["category"] for c in cats} == set(d["delta"]["kernel_ms_per_step"])


def test_rows_are_the_breakdowns_own_kernel_tables():
    b, n = bd("hf-small-graph"), bd("hf-small-eager")
    d = diff(b, n).to_dict()
    adds_up(d)
    for side, x in (("base", b), ("new", n)):
        mine = {(k["name"], k["category"]): k[f"{side}_ms_per_step"] for k in d["kernels"]
                if k[f"{side}_ms_per_step"]}
        theirs = {(r["name"], r["category"]): r["per_step_ms"] for r in x.top_kernels.iter_rows(named=True)}
        assert mine == theirs
    assert d["delta"]["kernel_total_ms_per_step"]["base"] == pytest.approx(
        sum(v for v in b.kernel_ms_per_step.values() if v is not None), abs=1e-12)


def test_one_name_in_two_categories_is_two_rows():
    """spec-small-graph: the same elementwise kernels run in the draft model (drafting) and in the target (other);
    each (name, category) is its own row, so the category sums hold."""
    d = diff(bd("spec-small-graph"), bd("spec-small-graph-nomark")).to_dict()
    adds_up(d)
    names = pl.DataFrame(d["kernels"]).group_by("name").agg(pl.col("category").n_unique().alias("n"))
    assert names.filter(pl.col("n") > 1).height > 0
    self_diff = diff(bd("spec-small-graph"), bd("spec-small-graph")).to_dict()
    assert all(k["delta_ms_per_step"] == 0 for k in self_diff["kernels"])
    assert len(self_diff["kernels"]) == bd("spec-small-graph").top_kernels.height


def test_whole_graph_side_only_its_copies():
    """A whole-graph capture has no per-kernel rows (its compute categories are null): its kernels are its copies,
    and the sum still holds against the categories it knows."""
    d = diff(bd("hf-small-graph"), bd("hf-small-graph-wholegraph")).to_dict()
    adds_up(d)
    assert {k["category"] for k in d["kernels"] if k["new_ms_per_step"]} == {"memory"}
    unknown = [c for c in d["kernel_categories"] if c["delta_ms_per_step"] is None]
    assert {c["category"] for c in unknown} == {"gemm", "attention", "communication", "drafting", "other"}
    assert d["kernel_categories"][-len(unknown):] == unknown  # unknown changes last


def test_markdown_and_table_show_the_top_movers():
    a, b = sample_trace("tp1-synthetic-nccl-graph"), sample_trace("tp1-synthetic-symm1-graph")
    r = CliRunner().invoke(cli, ["diff", str(a), str(b), "--format", "md"])
    assert r.exit_code == 0, r.output
    text = r.stdout
    d = json.loads(CliRunner().invoke(cli, ["diff", str(a), str(b), "--format", "json"]).stdout)
    tot = d["delta"]["kernel_total_ms_per_step"]["abs"]
    assert f"kernel time +{tot:.3f} ms per step (+18%): communication +0.129, memory +0.032, gemm +0.006" in text
    moved = [k for k in d["kernels"] if round(k["delta_ms_per_step"], 6) != 0][:10]
    assert f"**kernels that moved** (top {len(moved)} of {len(d['kernels'])}; ms per step)" in text
    row = next(line for line in text.splitlines() if "one\\_shot\\_all\\_reduce\\_kernel" in line)
    assert row.startswith("| void &lt;unnamed&gt;::one\\_shot\\_all\\_reduce\\_kernel&lt;c10::BFloat16")
    assert row.endswith("| communication | 0.000 | 0.129 | +0.129 |")
    table = CliRunner().invoke(cli, ["diff", str(a), str(b)]).stdout
    assert f"kernels that moved (top {len(moved)} of" in table and "one_shot_all_reduce_kernel" in table
