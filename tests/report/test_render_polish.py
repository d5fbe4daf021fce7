"""What a new user tripped on in the outputs (issue 44, fix 9), each on the real trace that showed it: words and
paths cut in two at 80 columns or piped, two kernels cut to one name, 0.000 ms gaps, Python frame reprs, a piped
separator thousands of characters wide, nested parentheses, a plot's axis label cut."""

from __future__ import annotations

import io
import re

import pytest
from click.testing import CliRunner
from rich.console import Console

import tracekit
from tracekit.cli import cli

from conftest import sample_trace, shared

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

    b = breakdown(t, phase="all")
    fig = figure(plot_data(b, b.activities))
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    r = canvas.get_renderer()
    labels = [lab for ax in fig.axes for lab in ax.get_yticklabels() if lab.get_text()]
    assert "communication" in [lab.get_text() for lab in labels]
    assert min(lab.get_window_extent(r).x0 for lab in labels) >= 0
    assert min(ax.yaxis.label.get_window_extent(r).x0 for ax in fig.axes if ax.get_ylabel()) >= 0
