"""tracekit plot / export: the pictures draw the JSON's numbers; the Perfetto file has the expected tracks."""

from __future__ import annotations

import json
import sqlite3

import polars as pl
import pytest
from click.testing import CliRunner

import tracekit
from tracekit.categories import STEP_CATEGORIES as PER_STEP_KEYS
from tracekit.cli import cli
from tracekit.options import AnalysisOptions
from tracekit.report.perfetto import PID, TRACKS, perfetto_trace
from tracekit.report.plot import BAR_KEYS, figure, plot_data, render_html

from conftest import DATA, sample

MFU = DATA / "nsys" / "nsysai_mfu_2gpu_before_2026.2.sqlite"
SAXPY = DATA / "nsys" / "pipit_saxpy_2022.2.sqlite"


def analyse(path, opts: AnalysisOptions | None = None):
    """(Breakdown, its attributed activities): what plot and export draw."""
    b = tracekit.breakdown_file(path, opts)
    return b, b.activities


@pytest.fixture(scope="module")
def mfu():
    return analyse(MFU)


def test_plot_data_is_the_breakdown(mfu):
    b, acts = mfu
    data = plot_data(b, acts)
    assert data.bars.equals(b.per_step.select("step", "period_ms", *BAR_KEYS))
    # The bar means are the JSON's per_step_ms.
    for k in PER_STEP_KEYS:
        assert data.bars[k].mean() == pytest.approx(b.to_dict()["per_step_ms"][k], rel=1e-12)
    # Representative step: the one closest to the median period.
    med = b.steps["median_ms"]
    closest = b.per_step.with_columns(d=(pl.col("period_ms") - med).abs()).sort("d")["period_ms"][0]
    assert data.step_period_ms == pytest.approx(closest)
    row = b.per_step.filter(pl.col("step") == data.step)
    # The gaps drawn are that step's launch_gaps and idle, to the nanosecond.
    g = data.gaps.group_by("kind").agg((pl.col("end_us") - pl.col("start_us")).sum())
    got = dict(zip(g["kind"], g["end_us"]))
    assert got.get("launch_gaps", 0) / 1e3 == pytest.approx(row["launch_gaps"][0], abs=1e-6)
    assert got.get("idle", 0) / 1e3 == pytest.approx(row["idle"][0], abs=1e-6)
    assert data.timeline.height == acts.filter(pl.col("step") == data.step).height


def test_figure_bars_have_the_plotted_heights(mfu):
    b, acts = mfu
    data = plot_data(b, acts)
    fig = figure(data)
    ax = fig.axes[0]
    assert [c.get_label() for c in ax.collections] == BAR_KEYS
    for c, k in zip(ax.collections, BAR_KEYS):  # one rectangle per step: (x0, bottom) -> (x0, top) ...
        heights = [path.vertices[1][1] - path.vertices[0][1] for path in c.get_paths()]
        assert heights == pytest.approx(b.per_step[k].fill_null(0).to_list(), abs=1e-12)


@pytest.mark.parametrize("suffix", [".png", ".svg", ".html"])
@pytest.mark.slow
def test_plot_cli_writes_only_the_output(tmp_path, suffix):
    out = tmp_path / f"p{suffix}"
    r = CliRunner().invoke(cli, ["plot", str(MFU), "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert out.stat().st_size > 1000
    assert sorted(p.name for p in tmp_path.iterdir()) == [out.name]
    head = out.read_bytes()[:8]
    if suffix == ".png":
        assert head.startswith(b"\x89PNG")
    if suffix == ".html":
        text = out.read_text()
        assert "http://" not in text.replace('xmlns="http://www.w3.org/2000/svg"', "")
        assert "https://" not in text and "<script src" not in text


def test_plot_refuses_other_suffixes(tmp_path):
    r = CliRunner().invoke(cli, ["plot", str(MFU), "-o", str(tmp_path / "x.pdf")])
    assert r.exit_code == 2 and r.output.startswith("tracekit: error: ")


def test_html_escapes_names(mfu):
    b, acts = mfu
    data = plot_data(b, acts)
    data.timeline = data.timeline.with_columns(name=pl.lit('<script>alert("x")</script>'))
    data.title = "<img src=x onerror=alert(1)>"
    text = render_html(data)
    assert "<script>alert" not in text and "<img" not in text
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in text
    assert text.count("<script>") == 1  # ours


def _events(path):
    """tracekit's own tracks (process ``tracekit``, pid 1) of an export: the file, track names, X events, counts."""
    d = json.loads(path.read_text())
    names = {e["tid"]: e["args"]["name"] for e in d["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"
             and e["pid"] == PID}
    x = [e for e in d["traceEvents"] if e["ph"] == "X" and e["pid"] == PID]
    counts = {}
    for e in x:
        counts[names[e["tid"]]] = counts.get(names[e["tid"]], 0) + 1
    return d, names, x, counts


def _sql_counts(path, step_regex_name):
    """Independently of tracekit: NVTX step ranges named exactly ``step_regex_name`` but the last (the last of
    >= 3 steps has no following step: excluded) and the kernels/memops whose runtime launch (same process:
    correlation ids repeat across processes; a launch may have two runtime rows) lies in one's window on the same
    thread — from its start to the next range's start (a step is a whole iteration: contract, "Every kernel is
    counted"; saxpy's two uploads before each range are the previous step's) — straight from the nsys tables."""
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    text = "coalesce(n.text, (select value from StringIds s where s.id = n.textId))"
    last = con.execute(f"select max(n.start) from NVTX_EVENTS n where n.eventType = 59 and {text} = ?",
                       (step_regex_name,)).fetchone()[0]
    steps = con.execute(f"select count(*) from NVTX_EVENTS n where n.eventType = 59 and {text} = ? "
                        f"and n.start < {last}", (step_regex_name,)).fetchone()[0]
    work = 0
    windows = (f"(select n.globalTid, n.start, lead(n.start) over (partition by n.globalTid order by n.start) "
               f"as next from NVTX_EVENTS n where n.eventType = 59 and {text} = ?)")
    for table in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"):
        work += con.execute(
            f"select count(*) from {table} k where exists (select 1 from CUPTI_ACTIVITY_KIND_RUNTIME r "
            f"join {windows} w on w.globalTid = r.globalTid and r.start >= w.start and r.start < w.next "
            f"where r.correlationId = k.correlationId and (r.globalTid >> 24) = (k.globalPid >> 24) "
            f"and w.start < {last})",
            (step_regex_name,)).fetchone()[0]
    return steps, work


def test_perfetto_tracks_and_counts_match_the_trace(tmp_path):
    out = tmp_path / "saxpy.json"
    r = CliRunner().invoke(cli, ["export", str(SAXPY), "--step-range", "^saxpy$", "--perfetto", str(out)])
    assert r.exit_code == 0, r.output
    d, names, x, counts = _events(out)
    assert sorted(names.values()) == sorted(TRACKS)
    assert [e["args"]["name"] for e in d["traceEvents"] if e["name"] == "process_name"][0] == "tracekit"
    steps, work = _sql_counts(SAXPY, "saxpy")
    assert (steps, work) == (4, 16)  # per step a saxpy kernel and three copies (those before the next range included)
    assert counts["steps"] == steps
    cats = ["drafting", "gemm", "attention", "other", "communication", "memory", "unattributed"]
    assert sum(counts.get(c, 0) for c in cats) == work
    assert counts["other"] == 4 and counts["memory"] == 12  # saxpy is elementwise; its copies are memory
    assert all(e["dur"] >= 0 for e in x)
    step_ev = [e for e in x if names[e["tid"]] == "steps"]
    b = tracekit.breakdown(tracekit.load(SAXPY), step_range="^saxpy$")
    assert [e["args"]["period_ms"] for e in step_ev] == pytest.approx(b.per_step["period_ms"].to_list(), abs=1e-6)
    assert sum(e["dur"] for e in step_ev) / 1e3 / len(step_ev) == pytest.approx(b.steps["mean_ms"], rel=1e-9)


def test_perfetto_gap_events_sum_to_the_json(mfu, tmp_path):
    b, acts = mfu
    tr = perfetto_trace(b, acts)
    x = [e for e in tr["traceEvents"] if e["ph"] == "X"]
    tid = {t: i + 1 for i, t in enumerate(TRACKS)}
    n = b.steps["count"]
    for key in ("launch_gaps", "idle"):
        total_us = sum(e["dur"] for e in x if e["tid"] == tid[key])
        assert total_us / 1e3 / n == pytest.approx(b.per_step_ms[key], rel=1e-9)
    assert sum(1 for e in x if e["tid"] == tid["steps"]) == n == 15  # 16 inferred steps, the last has no following step
    assert sum(1 for e in x if e["tid"] not in (tid["steps"], tid["launch_gaps"], tid["idle"])) == acts.height


@pytest.mark.slow
def test_perfetto_sample_counts():
    """Our H200 eager capture: one step event per decode_step range and one activity event per kernel/memop
    launched inside one (counted in SQL with LIKE, independently of tracekit's step detection)."""
    path = sample("hf-small-eager/trace.sqlite")
    b, acts = analyse(path)
    tr = perfetto_trace(b, acts)
    x = [e for e in tr["traceEvents"] if e["ph"] == "X"]
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    text = "coalesce(n.text, (select value from StringIds s where s.id = n.textId))"
    steps = con.execute(f"select count(*) from NVTX_EVENTS n where n.eventType = 59 and {text} like 'decode_step %'"
                        ).fetchone()[0]
    last = con.execute(f"select max(n.start) from NVTX_EVENTS n where n.eventType = 59 and {text} like 'decode_step %'"
                       ).fetchone()[0]
    work = sum(con.execute(
        f"select count(*) from {table} k where exists (select 1 from CUPTI_ACTIVITY_KIND_RUNTIME r "
        f"join NVTX_EVENTS n on n.globalTid = r.globalTid and r.start >= n.start and r.start <= n.end "
        f"where r.correlationId = k.correlationId and (r.globalTid >> 24) = (k.globalPid >> 24) "
        f"and n.eventType = 59 and {text} like 'decode_step %' and n.start < {last})").fetchone()[0]
        for table in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"))
    tid = {t: i + 1 for i, t in enumerate(TRACKS)}
    assert steps == 16
    assert sum(1 for e in x if e["tid"] == tid["steps"]) == steps - 1  # the last step has no following step
    assert sum(1 for e in x if e["tid"] not in (tid["steps"], tid["launch_gaps"], tid["idle"])) == work
