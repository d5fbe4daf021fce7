"""Renderers print into a StringIO console (as rich's own tests do), so what a user sees is tested text:
each table once, the answer first, paths that tell runs apart, untrusted text escaped."""

from __future__ import annotations

import dataclasses
import io

import pytest
from rich.console import Console

import tracekit
from tracekit.report import KINDS, render
from tracekit.run.history import save_runs

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
    assert two_runs["runs"][2]["delta_ms"] == 0.0


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
    assert text.splitlines()[0].startswith("traced step 255.715 → 255.715 ms (±0%; no unprofiled time on either side)")
    assert text.count("per step (ms)") == 1
    assert render("diff", d, "md").startswith("### tracekit diff: traced step 255.715 → 255.715 ms")
    assert render("diff", d, "json").startswith('{\n  "schema": "tracekit.diff/3"')


def test_ceiling_renders_the_users_gpu_name_as_text():
    c = tracekit.ceiling(gpu="[bold]my GPU[/bold] <i>", params=1e9, peak_bw=1000)
    text = rendered("ceiling", c)
    assert "[bold]my GPU[/bold] <i>" in text
    assert "| GPU | \\[bold\\]my GPU\\[/bold\\] &lt;i&gt; |" in render("ceiling", c, "md")


def test_every_kind_renders_or_says_why(saxpy):
    from tracekit.errors import TracekitError

    assert set(KINDS) == {"info", "kernels", "breakdown", "ranks", "diff", "history", "ceiling", "perfetto",
                          "stats"}
    with pytest.raises(TracekitError, match="csv is not available for diff"):
        render("diff", tracekit.diff(saxpy, saxpy).to_dict(), "csv")
    assert render("perfetto", saxpy, "json").startswith('{"traceEvents":[')


def test_plot_title_is_the_folder_and_file(saxpy):
    from tracekit.report.plot import plot_data

    eager = tracekit.breakdown_file(sample("hf-small-eager/trace.sqlite"))
    assert plot_data(eager, eager.activities).title == "hf-small-eager/trace.sqlite"
    assert plot_data(saxpy, saxpy.activities).title == "nsys/pipit_saxpy_2022.2.sqlite"


# ───────────────────────── output a user pastes: nothing cut short ─────────────────────────

EAGER = "hf-small-eager/trace.sqlite"


def console_text(kind: str, result, width: int = 80, terminal: bool = False, wide: bool = False) -> str:
    """What ``kind`` prints at ``width`` columns: piped (the default) or on a terminal (``terminal``)."""
    buf = io.StringIO()
    con = Console(file=buf, width=width, color_system=None, force_terminal=terminal)
    con.wide = wide
    assert render(kind, result, "table", lambda: con) is None
    return buf.getvalue()


def kernel_names_by_sql(path, n: int) -> list[str]:
    """The ``n`` kernel names of most total time, from the export by hand."""
    from conftest import sql_rows

    return [r[0] for r in sql_rows(path, "SELECT s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON "
                                         "s.id = k.demangledName GROUP BY s.value ORDER BY sum(k.end - k.start) DESC "
                                         f"LIMIT {n}")]


def test_piped_kernels_show_whole_names():
    """Piped (not a terminal), every name is whole — the nvjet names the 80-column table used to end in '…'."""
    path = sample(EAGER)
    k = tracekit.kernels(tracekit.load(path), top=12)
    names = kernel_names_by_sql(path, 12)
    assert [r["name"] for r in k["kernels"]] == names
    assert max(map(len, names)) > 200  # templated at:: kernels: far wider than 80 columns
    piped = console_text("kernels", k)
    assert "…" not in piped
    lines = piped.splitlines()
    for name in names:  # each whole, on one line, at the end of its row
        assert sum(line.endswith(" " + name) for line in lines) == 1, name
    assert all(line == line.rstrip() for line in lines)  # a pasted line ends where its text does
    # on an 80-column terminal the table fits the window (names shortened) unless --wide
    term = console_text("kernels", k, terminal=True)
    assert max(map(len, term.splitlines())) <= 80 and "nvjet_sm90_tst_64x8_64x16_4x1_v_bz_TNT" not in term
    wide = console_text("kernels", k, terminal=True, wide=True)
    assert all(sum(line.endswith(" " + name) for line in wide.splitlines()) == 1 for name in names)


def test_kernels_wide_flag_and_file_output(tmp_path):
    from click.testing import CliRunner

    from tracekit.cli import cli

    path = sample(EAGER)
    longest = max(kernel_names_by_sql(path, 40), key=len)
    out = tmp_path / "k.txt"
    r = CliRunner().invoke(cli, ["kernels", str(path), "--top", "40", "--wide", "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert longest in out.read_text()
    assert "--wide" in CliRunner().invoke(cli, ["kernels", "--help"]).output


def verdict_text(text: str) -> str:
    return " ".join(text.split())


def test_sentences_wrap_on_words_on_a_terminal():
    """An 80-column terminal: the headline and every verdict wrap on words (no word cut, no line over 80), each
    verdict's continuation indented under its first word; piped, each is one whole line."""
    from tracekit.report.markdown import headline, verdict_lines

    b = tracekit.breakdown(tracekit.load(sample(EAGER)))
    verdicts = verdict_lines(b)
    assert max(map(len, verdicts)) > 160  # (long enough to need two or three lines at 80)
    term = console_text("breakdown", b, terminal=True)
    lines = term.splitlines()
    assert max(map(len, lines)) <= 80
    start = lines.index("verdicts") + 1
    body = lines[start:]
    for v in verdicts:
        first = next(i for i, line in enumerate(body) if line.startswith("• "))
        end = next((i for i, line in enumerate(body[first + 1:], first + 1) if not line.startswith("  ")), len(body))
        block = body[first:end]
        assert all(line.startswith("  ") for line in block[1:])  # the hanging indent
        assert verdict_text(" ".join(block))[2:] == verdict_text(v)  # every word whole, in order
        words = set(v.split())
        assert all(w in words for line in block for w in line.replace("• ", "", 1).split())
        body = body[end:]
    head = verdict_text(" ".join(lines[:3]))
    assert head.startswith(verdict_text(headline(b))) or verdict_text(headline(b)) in verdict_text(term)
    piped = console_text("breakdown", b).splitlines()
    assert piped[0] == headline(b)
    assert all(f"• {v}" in piped for v in verdicts)


def test_every_rank_table_is_labelled_with_its_file(tmp_path):
    from tracekit.run.ranks import kernels_ranks

    files = [DATA / "nsys" / "nsysai_mfu_2gpu_before_2026.2.sqlite", DATA / "nsys" / "nsysai_mfu_2gpu_after_2026.2.sqlite"]
    multi = kernels_ranks([tracekit.kernels(tracekit.load(f), top=3) for f in files], files)
    text = console_text("kernels", multi)
    at = [text.index(f"rank {i}: {f}") for i, f in enumerate(files)]
    assert at == sorted(at)
    # each label stands right above its own rank's table: the second file's first kernel follows its label only
    assert text.index(multi["ranks"][1]["kernels"][0]["name"], at[1]) > at[1]
    assert "…" not in text and max(map(len, text.splitlines()[-6:])) > 80  # the cross table whole, not cropped
    md_text = render("kernels", multi, "md")
    assert md_text.count("### rank ") == 2 and "### rank 1: " in md_text


def test_plot_title_is_whole_and_the_unprofiled_step_is_marked():
    import json

    from tracekit.report.plot import figure, plot_data, render_html

    path = sample(EAGER)
    unprofiled = json.loads((path.parent / "manifest.json").read_text())["unprofiled_step_ms"]
    b = tracekit.breakdown_file(path)
    data = plot_data(b, b.activities)
    assert " ".join(data.title_lines()) == f"{data.title} — {data.headline}"  # whole: wrapped, never cut
    fig = figure(data)
    assert fig._suptitle.get_text().replace("\n", " ") == f"{data.title} — {data.headline}"
    ax = fig.axes[0]
    level = {line.get_gid(): line.get_ydata()[0] for line in ax.lines}
    assert level["unprofiled_step"] == pytest.approx(unprofiled)
    assert level["traced_step"] == pytest.approx(b.per_step["period_ms"].mean())  # the bars' own mean
    assert ax.get_ylim()[1] > max(level.values())
    html_text = render_html(data)
    assert 'class="unprofiled_step"' in html_text and f"unprofiled step {unprofiled:.3f} ms" in html_text
    # no unprofiled time: only the traced line
    saxpy = tracekit.breakdown_file(SAXPY, tracekit.AnalysisOptions(step_range="^saxpy$"))
    lines = [line.get_gid() for line in figure(plot_data(saxpy, saxpy.activities)).axes[0].lines]
    assert lines == ["traced_step"]
