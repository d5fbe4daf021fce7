"""Renderers print into a StringIO console (as rich's own tests do), so what a user sees is tested text:
each table once, the answer first, paths that tell runs apart, untrusted text escaped."""

from __future__ import annotations

import dataclasses
import io

import pytest
from rich.console import Console

import tracekit
from tracekit.report import KINDS, render
from tracekit.runs import save_runs

from conftest import DATA, sample

SAXPY = DATA / "nsys" / "pipit_saxpy_2022.2.sqlite"
MFU = DATA / "nsys" / "nsysai_mfu_2gpu_before_2026.2.sqlite"


def rendered(kind: str, result, width: int = 100) -> str:
    buf = io.StringIO()
    assert render(kind, result, "table", lambda: Console(file=buf, width=width, color_system=None)) is None
    return buf.getvalue()


@pytest.fixture(scope="module")
def saxpy():
    return tracekit.breakdown(tracekit.load(SAXPY), step_range="^saxpy$")


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """A run history of two captures that both name their file trace.sqlite (as every capture does)."""
    db = tmp_path_factory.mktemp("h") / "runs.db"
    eager = tracekit.breakdown(tracekit.load(sample("hf-small-eager/trace.sqlite")))
    graph = tracekit.breakdown(tracekit.load(sample("hf-small-graph/trace.sqlite.gz")))
    save_runs(db, [eager, graph, eager], timestamp="2026-01-01T00:00:00+00:00", git={})
    return tracekit.history(db)


def test_history_table_is_printed_once(two_runs):
    text = rendered("history", two_runs, 80)
    assert text.count("3 runs, 0 regressions") == 1
    assert text.count("┃") == 0 and text.count(" id ") == 1  # one header row
    for line in text.splitlines():
        assert len(line) <= 80
    # the full paths are listed under the table, one per run
    assert text.count("sample_traces/hf-small-eager/trace.sqlite") == 2
    assert text.count("sample_traces/hf-small-graph/trace.sqlite.gz") == 1


def test_history_md_names_the_folder_not_just_trace_sqlite(two_runs):
    md = render("history", two_runs, "md")
    rows = [ln for ln in md.splitlines() if ln.startswith("| 1 ") or ln.startswith("| 2 ")]
    assert "| hf-small-eager/trace.sqlite |" in rows[0].replace("\\_", "_").replace("\\-", "-")
    assert "| hf-small-graph/trace.sqlite.gz |" in rows[1].replace("\\_", "_")
    # run 3 is run 1's trace again: compared with it
    assert two_runs["runs"][2]["delta_mean_ms"] == 0.0


def test_breakdown_table_opens_with_the_headline(saxpy):
    text = rendered("breakdown", saxpy)
    lines = text.splitlines()
    md_head = render("breakdown", saxpy, "md").splitlines()[0]
    assert md_head == f"### tracekit: {lines[0].strip()}"
    assert lines[1].startswith("no unprofiled time: savings are upper bounds")  # the time base, second
    assert lines[2].startswith(f"trace {SAXPY} (nsys-sqlite")
    assert text.count("where a traced step goes") == 1


def test_markdown_keeps_quotes_but_escapes_html(saxpy):
    b = tracekit.breakdown(tracekit.load(SAXPY), step_range="^saxpy$")
    b = dataclasses.replace(b, warnings=(*b.warnings, "the profiler's <b>own</b> overhead"))
    md = render("breakdown", b, "md")
    assert "the profiler's &lt;b&gt;own&lt;/b&gt; overhead" in md and "&#x27;" not in md


def test_diff_renders_in_every_format(saxpy):
    d = tracekit.diff(saxpy, saxpy).to_dict()
    text = rendered("diff", d)
    assert text.splitlines()[0].startswith("step 255.7 → 255.7 ms (±0%)")
    assert text.count("per step (ms)") == 1
    assert render("diff", d, "md").startswith("### tracekit diff: step 255.7 → 255.7 ms")
    assert render("diff", d, "json").startswith('{\n  "schema": "tracekit.diff/2"')


def test_ceiling_renders_the_users_gpu_name_as_text():
    c = tracekit.ceiling(gpu="[bold]my GPU[/bold] <i>", params=1e9, peak_bw=1000)
    text = rendered("ceiling", c)
    assert "[bold]my GPU[/bold] <i>" in text
    assert "| GPU | \\[bold\\]my GPU\\[/bold\\] &lt;i&gt; |" in render("ceiling", c, "md")


def test_every_kind_renders_or_says_why(saxpy):
    from tracekit.errors import TracekitError

    assert set(KINDS) == {"info", "kernels", "breakdown", "ranks", "diff", "history", "ceiling", "perfetto"}
    with pytest.raises(TracekitError, match="csv is not available for diff"):
        render("diff", tracekit.diff(saxpy, saxpy).to_dict(), "csv")
    assert render("perfetto", saxpy, "json").startswith('{"traceEvents":[')


def test_plot_title_is_the_folder_and_file(saxpy):
    from tracekit.report.plot import plot_data

    eager = tracekit.breakdown_file(sample("hf-small-eager/trace.sqlite"))
    assert plot_data(eager, eager.activities).title == "hf-small-eager/trace.sqlite"
    assert plot_data(saxpy, saxpy.activities).title == "nsys/pipit_saxpy_2022.2.sqlite"
