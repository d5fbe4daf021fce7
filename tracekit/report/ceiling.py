"""Renderers of ``tracekit ceiling`` (schema ``tracekit.ceiling/1``): the rich table and markdown.

Both show a :class:`tracekit.results.ceiling.Ceiling` (whose ``to_dict()`` is the JSON): the quantities (the
compute floor and which floor bounds the step where the FLOPs and the peak are known), the one-sentence summary,
and every assumption. The GPU name may be whatever the user typed, so it goes
through ``report.safe`` like a name from a trace.
"""

from __future__ import annotations

from tracekit.report._fmt import sig
from tracekit.report.safe import md, rich_text


def _rows(c) -> list[tuple[str, str]]:
    rows = [
        ("GPU", c.gpu_name),
        ("peak bandwidth (GB/s)", f"{sig(c.peak_bw_gbps)} ({c.peak_bw_source})"),
        ("bytes per step per GPU (GB)", sig(c.bytes_per_step_per_gpu / 1e9)),
    ]
    parts = [k for k in ("weights", "draft", "kv") if c.bytes_breakdown.get(k)]
    for k in parts if len(parts) > 1 else []:
        rows.append((f"  {k} (GB)", sig(c.bytes_breakdown[k] / 1e9)))
    if c.peak_tflops is not None:
        rows.append(("peak compute (TFLOP/s)", f"{sig(c.peak_tflops)} ({c.peak_tflops_source})"))
    if c.flops_per_step_per_gpu is not None:
        rows.append(("FLOPs per step per GPU (TFLOP)", sig(c.flops_per_step_per_gpu / 1e12)))
    rows.append(("floor per step (ms)", sig(c.floor_ms)))
    if c.compute_floor_ms is not None:  # the floor is the larger of the two: both shown, and which bounds
        rows += [("  memory floor (ms)", sig(c.memory_floor_ms)), ("  compute floor (ms)", sig(c.compute_floor_ms)),
                 ("bound", c.bound)]
    rows += [
        ("ceiling (steps/s)", sig(c.ceiling_steps_per_s)),
        ("tokens per step", sig(c.tokens_per_step)),
        ("ceiling (tok/s)", sig(c.ceiling_tokens_per_s)),
    ]
    if c.measured_tokens_per_s is not None:
        rows.append(("measured (tok/s)", sig(c.measured_tokens_per_s)))
        rows.append(("fraction of ceiling (%)", f"{c.fraction_of_ceiling * 100:.1f}"))
    return rows


def render_table(c, console) -> None:
    """Rich table + the sentence + the assumptions, on the given console."""
    from rich.table import Table
    from rich.text import Text

    t = Table(title="tracekit ceiling", title_justify="left")
    t.add_column("quantity", no_wrap=True)
    t.add_column("value", justify="right", no_wrap=True, overflow="ellipsis")
    for k, v in _rows(c):
        t.add_row(k, rich_text(v))
    console.print(t)
    console.print(rich_text(c.summary, 1000))
    console.print("assumptions:", highlight=False)
    for a in c.assumptions:
        console.print(Text("  - ") + rich_text(a, 1000), soft_wrap=False)


def render_markdown(c) -> str:
    """Markdown: the sentence in bold, the quantities as a table, the assumptions as a list."""
    lines = [f"**{md(c.summary, 1000)}**", "", "| quantity | value |", "|---|---:|"]
    lines += [f"| {k.strip()} | {md(v)} |" for k, v in _rows(c)]
    lines += ["", "Assumptions:", ""] + [f"- {md(a, 1000)}" for a in c.assumptions]
    return "\n".join(lines) + "\n"


__all__ = ["render_table", "render_markdown"]
