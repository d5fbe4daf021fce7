"""Every kernel is counted (contract, Additions to ``/3`` (2); issue 48 item 1): a conservation check run on real
traces, each figure against one obtained without tracekit's attribution.

Per trace (the analysed device):

* ``coverage.kernel_ms_total`` = the kernel, memcpy and memset time of the device summed by hand: SQL over the nsys
  export's ``CUPTI_ACTIVITY_KIND_KERNEL`` / ``MEMCPY`` / ``MEMSET`` tables, plain JSON over a Kineto trace's
  ``kernel`` / ``gpu_memcpy`` / ``gpu_memset`` events (±0.1%);
* ``kernel_ms_in_steps + kernel_ms_outside_steps = kernel_ms_total`` and ``outside_by_reason`` sums to the outside
  part (±0.1%); ``kernel_ms_in_steps`` = the duration of every activity of the analysed steps;
* per analysed step: its kernel time by category (the activities of the step) = the kernel, memcpy and memset time
  that starts in the step's period on the GPU, from the trace's tables (±0.1%), and ``kernel_ms_per_step`` is
  their mean;
* per analysed step: its GPU-busy time (``per_step_ms``' busy categories) = the union of every GPU activity of the
  device in its period (±0.1% of the period): ``launch_gaps`` and ``idle`` are only time the GPU ran nothing.

The fast tier runs a few committed samples and the derived vLLM V1 input; the sweep over every sample, every
external trace (``../shared/external_traces``) and the validation set (``../shared/validation``) is
``@pytest.mark.slow``.
"""

from __future__ import annotations

import gzip
import json
import lzma
import shutil
import sqlite3
from pathlib import Path

import polars as pl
import pytest

import tracekit
from tracekit.categories import BUSY_CATEGORIES, KERNEL_CATEGORIES
from tracekit.errors import TracekitError
from tracekit.run.pipeline import breakdown

from conftest import DATA, SAMPLES, SHARED

VALIDATION = SHARED.parent / "validation"
DERIVED = DATA / "derived" / "vllm_v1_span_cut.json.gz"
TOL = 1e-3  # ±0.1%
SUFFIXES = (".sqlite", ".sqlite.gz", ".json", ".json.gz", ".sqlite.xz", ".json.xz")
NOT_TRACES = ("manifest.json", "index.json", "device_profile.json", "results.json", "truth.json")


def _plain(path: Path, tmp: Path) -> Path:
    """``path`` readable by sqlite3 / json: a compressed file decompressed into ``tmp`` (the input is never
    modified)."""
    opener = {".gz": gzip.open, ".xz": lzma.open}.get(path.suffix)
    if opener is None:
        return path
    out = tmp / path.name[: -len(path.suffix)]
    with opener(path, "rb") as src, open(out, "wb") as dst:
        shutil.copyfileobj(src, dst)
    return out


def hand_total_ns(path: Path, device: int) -> int:
    """The device's kernel + memcpy + memset time (ns), summed without tracekit."""
    if path.name.endswith(".sqlite"):
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            have = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            total = 0
            for t in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"):
                if t in have:
                    total += con.execute(f"SELECT COALESCE(SUM(end - start), 0) FROM {t} "
                                         "WHERE deviceId = ? AND end >= start", (device,)).fetchone()[0]
            return int(total)
        finally:
            con.close()
    with open(path, "rb") as f:
        doc = json.load(f)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    cats = {"kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset"}
    us = sum(e.get("dur", 0) for e in events
             if isinstance(e, dict) and str(e.get("cat", "")).lower() in cats and e.get("ph") == "X"
             and int((e.get("args") or {}).get("device", -1)) == device and e.get("dur", 0) >= 0)
    return int(round(us * 1000))


def _union_in(iv: pl.DataFrame, lo: pl.Series, hi: pl.Series) -> list[int]:
    """For each period [lo, hi), the length of the union of intervals ``iv`` (start, end) clipped to it."""
    out = []
    for a, b in zip(lo.to_list(), hi.to_list()):  # (one per analysed step: tens, not events)
        c = iv.filter((pl.col("end") > a) & (pl.col("start") < b)).select(
            s=pl.col("start").clip(a, b), e=pl.col("end").clip(a, b)).sort("s")
        if c.height == 0:
            out.append(0)
            continue
        prev = c["e"].cum_max().shift(1).fill_null(a)
        # each interval adds what lies past the furthest end before it
        out.append(int(pl.DataFrame({"s": c["s"], "e": c["e"], "p": prev}).select(
            (pl.col("e") - pl.max_horizontal("s", "p")).clip(lower_bound=0).sum()).item()))
    return out


def _window_ns(trace, b, per: pl.DataFrame) -> list[int]:
    """Per analysed step (``per``: its rows of ``per_step``), the device's kernel + memcpy + memset time of its
    window, joined here by hand: activity -> its launch call (same process and correlation id) -> the step window
    open on the call's thread (by process where the breakdown says it attributed so); an activity whose launch is in
    no window -> the analysed period that holds its GPU start."""
    from tracekit.steps import find_steps

    dev = b.gpu.device
    by = ["pid"] if any("attributed to the step open in the same process" in w for w in b.warnings) else ["pid", "tid"]
    act = pl.concat([f.filter(pl.col("device") == dev).select("pid", "correlation", "start", "end")
                     for f in (trace.kernels, trace.memops) if f.height]).filter(pl.col("end") >= pl.col("start"))
    calls = (trace.launches.filter(pl.col("kind").is_in(["kernel", "graph", "memcpy", "memset"]))
             .select("pid", "tid", "correlation", at="start").unique(["pid", "correlation"], keep="first"))
    act = act.join(calls, on=["pid", "correlation"], how="left")
    wins = find_steps(trace, device=dev, every_phase=True).windows.select(*by, "step", ws="start", we="end").sort("ws")
    launched = act.filter(pl.col("at").is_not_null()).sort("at").join_asof(
        wins, left_on="at", right_on="ws", by=by, strategy="backward", check_sortedness=False).filter(
        pl.col("we").is_null() | (pl.col("at") <= pl.col("we")))
    launched = launched.filter(pl.col("step").is_not_null())
    keys = ["pid", "correlation", "start"]
    free = act.join(launched.select(keys), on=keys, how="anti")
    own = launched.group_by("step").agg(ns=(pl.col("end") - pl.col("start")).sum())
    free = free.sort("start")
    cum = pl.concat([pl.Series([0], dtype=pl.Int64), (free["end"] - free["start"]).cast(pl.Int64).cum_sum()])
    lo = free["start"].search_sorted(per["start_ns"], side="left")
    hi = free["start"].search_sorted(per["end_ns"], side="left")
    claimed = pl.DataFrame({"step": per["step"], "free": cum.gather(hi) - cum.gather(lo)})
    out = claimed.join(own, on="step", how="left").select(pl.col("free") + pl.col("ns").fill_null(0))
    return out.to_series().to_list()


def check_conservation(path: Path, tmp: Path) -> dict:
    """The conservation checks on ``path`` (see the module docstring); returns the coverage (for the caller's own
    checks). Skips a trace tracekit finds no steps in (nothing to conserve: the error says why)."""
    plain = _plain(path, tmp)
    trace = tracekit.load(plain)
    try:
        b = breakdown(trace)
    except TracekitError as e:
        pytest.skip(f"no steps to check: {e}")
    dev = b.gpu.device
    cov = b.coverage
    assert cov is not None
    total = cov.kernel_ms_total
    # the device's kernel time, by hand
    hand = hand_total_ns(plain, dev) / 1e6
    assert total == pytest.approx(hand, rel=TOL, abs=1e-6), f"{path.name}: coverage total {total} vs by hand {hand}"
    # in + outside = total; the reasons sum to the outside part
    assert cov.kernel_ms_in_steps + cov.kernel_ms_outside_steps == pytest.approx(total, rel=TOL, abs=1e-6)
    assert sum(cov.outside_by_reason.values()) == pytest.approx(cov.kernel_ms_outside_steps, rel=TOL, abs=1e-6)
    assert all(v > 0 for v in cov.outside_by_reason.values())
    acts = b.activities.filter(pl.col("kind") != "graph_exec")
    assert acts["dur"].sum() / 1e6 == pytest.approx(cov.kernel_ms_in_steps, rel=TOL, abs=1e-6)

    # per step: kernel time by category = the kernel time of the step's window, from the trace's tables: every
    # kernel, memcpy and memset whose launch call starts in the window on its thread (a graph's kernels: the graph
    # launch's), and one launched in no window whose GPU start is in the step's period
    per = b.per_step.sort("step")
    n = per.height
    by_cat = acts.group_by("step", pl.col("category").cast(pl.String)).agg(ns=pl.col("dur").sum())
    attributed = by_cat.group_by("step").agg(ns=pl.col("ns").sum())
    window = pl.DataFrame({"step": per["step"], "window": _window_ns(trace, b, per)})
    cmp = window.join(attributed, on="step", how="left").with_columns(pl.col("ns").fill_null(0))
    bad = cmp.filter((pl.col("ns") - pl.col("window")).abs() > TOL * pl.col("window") + 1)
    assert bad.height == 0, f"{path.name}: steps whose attributed kernel time is not their window's: {bad.head(5)}"
    # kernel_ms_per_step is the mean of the steps' category sums
    for cat in KERNEL_CATEGORIES:
        v = b.kernel_ms_per_step[cat]
        if v is None:
            continue
        mine = float(by_cat.filter(pl.col("category") == cat)["ns"].sum()) / 1e6 / n
        assert v == pytest.approx(mine, rel=TOL, abs=1e-6), f"{path.name}: kernel_ms_per_step.{cat}"

    # per step: busy = the union of every GPU activity of the device in its period (idle: the GPU ran nothing)
    every = pl.concat([f.filter(pl.col("device") == dev).select("start", "end")
                       for f in (trace.kernels, trace.memops, trace.graph_execs) if f.height])
    every = every.filter(pl.col("end") >= pl.col("start"))
    union = _union_in(every, per["start_ns"], per["end_ns"])
    busy = per.select(pl.sum_horizontal([pl.col(c).fill_null(0) for c in BUSY_CATEGORIES]) * 1e6)[:, 0]
    period = (per["end_ns"] - per["start_ns"]).cast(pl.Float64)
    gap = (busy - pl.Series(union, dtype=pl.Float64)).abs()
    worst = int(gap.arg_max()) if n else 0
    assert bool((gap <= TOL * period + 2).all()), (
        f"{path.name}: step {per['step'][worst]}: busy {busy[worst]:.0f} ns vs GPU activity {union[worst]} ns in a "
        f"{period[worst]:.0f} ns period: idle time the GPU ran something")
    return cov.to_dict()


# ───────────────────────── fast tier ─────────────────────────

FAST = ["hf-small-eager", "spec-small-graph-torch-nomark", "hf-small-graph-wholegraph"]  # (nsys, Kineto, whole-graph)


def _sample_file(name: str) -> Path:
    for f in ("trace.sqlite", "trace.sqlite.gz", "trace.json.gz"):
        if (SAMPLES / name / f).is_file():
            return SAMPLES / name / f
    raise AssertionError(f"sample_traces/{name} has no trace file")


@pytest.mark.parametrize("name", FAST)
def test_every_kernel_is_counted_on_samples(name, tmp_path):
    check_conservation(_sample_file(name), tmp_path)


def test_every_kernel_is_counted_on_the_derived_vllm_v1_span(tmp_path):
    check_conservation(DERIVED, tmp_path)


def test_a_span_around_part_of_the_iteration_reads_as_the_whole_span(tmp_path):
    """vLLM V1 closes its ``execute_context`` span after the target's verify forward; sampling, rejection and the
    drafter run after it (tests/data/derived/README.md). The derived input is the validation set's real trace with
    only those spans cut: every reading of a step (drafting, step time, idle, host work, the categories) equals the
    unmodified trace's, and no kernel of the step is left between steps."""
    src = VALIDATION / "sv_vllm_eagle_vllm_torch.json.xz"
    if not src.exists():
        pytest.skip(f"the validation set is not at {VALIDATION}")
    whole = breakdown(tracekit.load(_plain(src, tmp_path))).to_dict()
    cut = breakdown(tracekit.load(DERIVED)).to_dict()
    # the input really is cut: its spans end after the verify graph, well before the next span
    with gzip.open(DERIVED) as f:
        spans = sorted((e for e in json.load(f)["traceEvents"] if e.get("cat") == "user_annotation"
                        and e["name"].startswith("execute_context_")), key=lambda e: e["ts"])
    assert len(spans) == 12 and all(b["ts"] - (a["ts"] + a["dur"]) > 1000 for a, b in zip(spans, spans[1:]))
    assert cut["steps"] == whole["steps"]
    for key in ("per_step_ms", "kernel_ms_per_step"):
        assert cut[key] == pytest.approx(whole[key], rel=1e-9), key
    causes = ("launch_overhead", "host_stalls", "graph_bubbles", "between_steps")
    assert {k: cut["gaps"][k] for k in causes} == pytest.approx({k: whole["gaps"][k] for k in causes}, rel=1e-9)
    d0, d1 = whole["advice"]["drafting"], cut["advice"]["drafting"]
    assert d1["detection"] == d0["detection"] == "structure" and d1["speculative"] is True
    assert cut["kernel_ms_per_step"]["drafting"] > 0.4  # the drafter's kernels are the step's (0.48 ms a step)
    assert d1["predicted_step_ms"] == pytest.approx(d0["predicted_step_ms"], rel=1e-9)
    assert cut["gaps"]["between_steps"] < 0.01  # the GPU is not idle between steps: the drafter runs there
    assert cut["advice"]["host_work"]["max_saving_ms"] == pytest.approx(whole["advice"]["host_work"]["max_saving_ms"])
    assert cut["coverage"]["kernel_ms_total"] == pytest.approx(whole["coverage"]["kernel_ms_total"], rel=1e-9)
    assert cut["coverage"]["kernel_ms_in_steps"] == pytest.approx(whole["coverage"]["kernel_ms_in_steps"], rel=1e-9)


# ───────────────────────── the sweep (slow) ─────────────────────────

def _sweep() -> list[Path]:
    out = [_sample_file(p.name) for p in sorted(SAMPLES.iterdir()) if p.is_dir() and any(
        (p / f).is_file() for f in ("trace.sqlite", "trace.sqlite.gz", "trace.json.gz"))]
    for base in (SHARED, VALIDATION):
        if base.is_dir():
            out += sorted(p for p in base.rglob("*") if p.is_file() and p.name.endswith(SUFFIXES)
                          and p.name not in NOT_TRACES)
    return out


SWEEP = _sweep()


@pytest.mark.slow
@pytest.mark.parametrize("path", SWEEP, ids=[f"{p.parent.name}/{p.name}" for p in SWEEP])
def test_every_kernel_is_counted_everywhere(path, tmp_path):
    check_conservation(path, tmp_path)
