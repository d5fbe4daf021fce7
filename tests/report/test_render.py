"""Renderers print into a StringIO console (as rich's own tests do), so what a user sees is tested text:
each table once, the answer first, paths that tell runs apart, untrusted text escaped; then what a new user tripped on
in the outputs (a section below)."""

from __future__ import annotations

import dataclasses
import io
import re

import pytest
from click.testing import CliRunner
from rich.console import Console

import tracekit
from tracekit.cli import cli
from tracekit.options import AnalysisOptions
from tracekit.report import KINDS, render
from tracekit.run.history import save_runs

from conftest import DATA, sample, sample_trace, shared

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

# ───────────────────────── what a new user tripped on (formerly test_render_polish.py)
# What a new user tripped on in the outputs (issue 44, fix 9), each on the real trace that showed it: words and
# paths cut in two at 80 columns or piped, two kernels cut to one name, 0.000 ms gaps, Python frame reprs, a piped
# separator thousands of characters wide, nested parentheses, a plot's axis label cut.

LORA = ("lora_perf_lora_profile/runs/Qwen3-30B-A3B-Instruct-2507-BF16-expert_shared-20260609-133913/"
        "current_base_lora/profile/base")
SGLANG_MI300X = "TraceLens/tests/traces/inference/sglang_decode/sglang_Qwen3-8B_decode.json.gz"
HTA_TRAINING = "HolisticTraceAnalysis/tests/data/negative_queue_length_values_check/rank0.json.gz"


@pytest.fixture(scope="module")
def lora_report():
    from tracekit.run.ranks import analyse_files, cross_rank

    return cross_rank(analyse_files(sorted(shared(LORA).glob("*.trace.json.gz")))).report()


@pytest.mark.parametrize("terminal", [True, False])
@pytest.mark.slow
def test_the_collectives_table_never_cuts_a_word_and_paths_stay_whole_when_piped(lora_report, terminal):
    from tracekit.report.ranks import render_ranks

    out = io.StringIO()
    render_ranks(lora_report, Console(file=out, width=80, force_terminal=terminal, color_system=None))
    text = out.getvalue()
    rows = [x for x in text.splitlines() if re.match(r"\s*all-", x)]
    assert len(rows) == 3 and all(re.match(r"\s*(all-reduce|all-gather)\s", x) for x in rows), rows
    assert "all-redu\n" not in text and "\n ce " not in text
    if not terminal:  # piped: every rank's file on one line, whole
        for row in lora_report["table"]:
            assert f"rank {row[0]}: {row[1]}" in text


def test_two_kernels_are_never_cut_to_one_name():
    """The README's top-kernels table (hf-small-eager, markdown) showed two `void at::native::elementwise_kernel<…`
    rows cut to the same 90 characters; the terminal table cut names to its column the same way."""
    from tracekit.report.markdown import breakdown_md
    from tracekit.report.terminal import render_breakdown

    b = tracekit.breakdown(tracekit.load(sample_trace("hf-small-eager")))
    top = b.top_kernels.head(10)
    assert top["name"].n_unique() == 10
    rows = [x for x in breakdown_md(b).split("| top kernels |")[1].splitlines()[2:] if x.startswith("| ")]
    assert len(rows) == 10 and len({x.split(" | ")[0] for x in rows}) == 10
    assert all(len(x.split(" | ")[0]) <= 200 for x in rows)
    out = io.StringIO()
    render_breakdown(b, Console(file=out, width=80, force_terminal=True, color_system=None))
    table = out.getvalue().split("top kernels of")[1].split("roofline")[0]
    names = [x.split("│")[1].strip() for x in table.splitlines() if x.startswith("│")]
    assert len(names) == 5 and len(set(names)) == 5


def test_no_zero_length_gap_is_one_of_the_largest():
    """The MI300X SGLang step listed four gaps of 1 ns (the rounding of microsecond timestamps) as 0.000 ms rows."""
    b = tracekit.breakdown(tracekit.load(shared(SGLANG_MI300X)))
    ms = [g["ms"] for g in b.to_dict()["gaps"]["largest"]]
    assert ms and min(ms) >= 0.001
    from tracekit.report.markdown import breakdown_md

    assert "| 0.000 | launch overhead |" not in breakdown_md(b) and "| 0.000 | graph bubbles |" not in breakdown_md(b)


def test_python_frame_reprs_are_named_without_their_address():
    """The GB300 rank's longest in-step gap: "host was in <built-in method replay of pybind11_builtins.pybind11_
    detail_function_record_v1_... object at 0xec6e52f70190>" is now "built-in method replay"."""
    b = tracekit.breakdown(tracekit.load(shared(LORA) / "bs16-TP-0.trace.json.gz"))
    names = [g["before"]["name"] for g in b.to_dict()["gaps"]["largest"] if g["before"]]
    assert "built-in method replay" in names
    assert not any(" at 0x" in n or n.startswith("<") for n in names)
    assert " at 0x" not in b.advice["cuda_graphs"].verdict


def test_a_piped_kernel_list_has_no_rule_as_wide_as_its_longest_name():
    r = CliRunner().invoke(cli, ["kernels", str(sample_trace("hf-small-eager"))])
    assert r.exit_code == 0
    longest = max(len(x) for x in r.stdout.splitlines())
    rule = max((len(x) for x in r.stdout.splitlines() if set(x.strip()) <= set("─━ ")), default=0)
    assert rule < 100 and longest > 200  # names whole (the longest is hundreds of characters), no rule that long


def test_no_nested_parentheses_around_the_ceiling():
    """"(4,858 tok/s (batch of 1))" in the headline; and a batch of 1 with an accept length of 1.075 was called "the
    whole batch of 1.075" (hf-small-spec's manifest)."""
    b = tracekit.breakdown(tracekit.load(sample_trace("hf-small-eager")))
    assert "(4,858 tok/s for a batch of 1)" in b.headline
    spec = tracekit.breakdown(tracekit.load(sample_trace("hf-small-spec")))
    assert spec.roofline.tokens_per_step == pytest.approx(1.075)
    assert "batch of 1.075" not in spec.headline and "tok/s for a batch of 1)" in spec.headline
    for text in (b.headline, spec.headline):
        depth = deepest = 0
        for ch in text:
            depth += {"(": 1, ")": -1}.get(ch, 0)
            deepest = max(deepest, depth)
        assert deepest == 1, text


def test_the_plot_shows_its_axis_labels_whole():
    """HTA's training trace: the timeline's `communication` lane label was cut at the figure's left edge."""
    from tracekit.report.plot import figure, plot_data

    t = tracekit.load(shared(HTA_TRAINING))
    from tracekit.run.pipeline import breakdown

    b = breakdown(t, AnalysisOptions(phase="all"))
    fig = figure(plot_data(b, b.activities))
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    r = canvas.get_renderer()
    labels = [lab for ax in fig.axes for lab in ax.get_yticklabels() if lab.get_text()]
    assert "communication" in [lab.get_text() for lab in labels]
    assert min(lab.get_window_extent(r).x0 for lab in labels) >= 0
    assert min(ax.yaxis.label.get_window_extent(r).x0 for ax in fig.axes if ax.get_ylabel()) >= 0
