"""Pictures of a breakdown: a stacked bar of the categories for every step, and a timeline of one
representative step (its kernels coloured by category, the GPU's gaps visible).

``plot_data(b, acts)`` gathers exactly what is drawn — ``bars`` is ``Breakdown.per_step``'s
category columns unchanged, so the picture shows the JSON's numbers — and the renderers
only draw it: ``render_matplotlib`` (PNG/SVG, Agg backend, no display needed) and
``render_html`` (one self-contained file: inline SVG + a few lines of inline JS, no CDN, no
network; every name HTML-escaped). The representative step is the step whose period is
closest to the median step (the earliest on ties).

The title is whole (the headline wrapped over as many lines as it needs, never cut), and the bars carry two
level lines: the traced mean step (the bars' own mean) and, where known, the unprofiled step every saving is
stated against (``time_base``) — a profiled eager step can be twice the real one, and the picture says so.
"""

from __future__ import annotations

import html
import textwrap
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from tracekit.categories import GAP_CATEGORIES, PRIORITY, STEP_CATEGORIES
from tracekit.report.safe import plain
from tracekit.text import tail

BAR_KEYS = list(STEP_CATEGORIES)
LANES = list(PRIORITY)
COLORS = {"gemm": "#4c72b0", "attention": "#c44e52", "communication": "#dd8452", "drafting": "#55a868",
          "other": "#8172b3", "memory": "#937860", "unattributed": "#da8bc3", "launch_gaps": "#ff9896",
          "idle": "#c7c7c7"}
GAP_LANE = "GPU gaps"
TITLE_CHARS = 150  # characters per title line at the figure's width and font size
STEP_LINES = {"traced": "#444444", "unprofiled": "#2ca02c"}  # the level lines over the bars


@dataclass
class PlotData:
    """What the pictures show. ``bars``: step, period_ms and the ``per_step_ms`` keys per step (ms,
    exactly ``Breakdown.per_step``); ``timeline``: the representative step's GPU activities (``start_us``,
    ``end_us`` relative to the step start, ``category``, ``name``, ``kind``); ``gaps``: its GPU-idle
    intervals (``start_us``, ``end_us``, ``kind`` = launch_gaps | idle); ``traced_step_ms`` /
    ``unprofiled_step_ms`` / ``unprofiled_source``: the breakdown's ``time_base`` (the level lines over the bars)."""

    title: str
    headline: str
    bars: pl.DataFrame
    step: int
    step_period_ms: float
    timeline: pl.DataFrame
    gaps: pl.DataFrame
    null_categories: list[str]
    traced_step_ms: float | None = None
    unprofiled_step_ms: float | None = None
    unprofiled_source: str | None = None

    def step_lines(self) -> list[tuple[str, float, str]]:
        """``(kind, ms, label)`` of the level lines: the traced mean, and the unprofiled step where known."""
        out = []
        if self.traced_step_ms is not None:
            out.append(("traced", self.traced_step_ms, f"traced mean step {self.traced_step_ms:.3f} ms"))
        if self.unprofiled_step_ms is not None:
            out.append(("unprofiled", self.unprofiled_step_ms,
                        f"unprofiled step {self.unprofiled_step_ms:.3f} ms ({self.unprofiled_source or 'given'}): "
                        "what savings are stated against"))
        return out

    def title_lines(self) -> list[str]:
        """The title and the headline, whole, wrapped on words."""
        return textwrap.wrap(f"{self.title} — {self.headline}", TITLE_CHARS, break_long_words=False,
                             break_on_hyphens=False)


def representative_step(per_step: pl.DataFrame, median_ms: float) -> int:
    """The step whose period is closest to the median (earliest on ties)."""
    return int(per_step.with_row_index("i").with_columns(dist=(pl.col("period_ms") - median_ms).abs())
               .sort(["dist", "i"])["step"][0])


def plot_data(b, acts: pl.DataFrame) -> PlotData:
    """Gather the numbers to draw from a Breakdown and its attributed activities (``step_table``'s)."""
    from tracekit.intervals import merge
    from tracekit.report.markdown import headline

    bars = b.per_step.select("step", "period_ms", *BAR_KEYS)
    nulls = [k for k in BAR_KEYS if b.per_step_ms.get(k) is None]
    step = representative_step(b.per_step, b.steps["median_ms"])
    row = b.per_step.filter(pl.col("step") == step)
    p_start, p_end = int(row["start_ns"][0]), int(row["end_ns"][0])
    mine = acts.filter(pl.col("step") == step)
    timeline = mine.select(
        pl.col("category", "name", "kind").cast(pl.String),
        start_us=(pl.col("start") - p_start) / 1e3, end_us=(pl.col("end") - p_start) / 1e3,
    ).select("start_us", "end_us", "category", "name", "kind").sort("start_us", "end_us")
    segs = merge(mine.select("step", "start", "end"), ["step"]).collect()
    # Gaps between merged busy segments are launch gaps; after the last one, the step is idle.
    gaps = pl.concat([
        segs.select(start=pl.col("end"), end=pl.col("start").shift(-1), kind=pl.lit("launch_gaps")).drop_nulls(),
        segs.select(start=pl.col("end").max(), end=pl.lit(p_end, pl.Int64), kind=pl.lit("idle")),
    ]).filter(pl.col("end") > pl.col("start")).select(
        start_us=(pl.col("start") - p_start) / 1e3, end_us=(pl.col("end") - p_start) / 1e3, kind="kind")
    # The folder tells runs apart (every capture names its file trace.sqlite).
    tb = b.time_base
    return PlotData(title=tail(b.source["path"], 2), headline=headline(b), bars=bars, step=step,
                    step_period_ms=(p_end - p_start) / 1e6, timeline=timeline, gaps=gaps, null_categories=nulls,
                    traced_step_ms=tb.traced_step_ms, unprofiled_step_ms=tb.unprofiled_step_ms,
                    unprofiled_source=tb.unprofiled_source)


def _mpl_text(s: str, limit: int = 120) -> str:
    # matplotlib parses $...$ as mathtext: a name must not.
    return plain(s, limit).replace("$", r"\$")


# A 10-point tick label is ~9 px per character at 110 dpi (DejaVu Sans, measured: "communication" is 117 px), and
# the tick and its pad take ~12 px more; the bar axis' label stands ~22 px left of its tick labels.
_CHAR_PX, _TICK_PX, _YLABEL_PX = 9.2, 12, 22


def _left_margin(data: PlotData, lanes: list[str], fig) -> float:
    """The figure's left margin, wide enough for the longest timeline lane name ("communication", cut before) and
    for the bar axis' tick labels with its y-axis label: fixed margins, measured from the text, not a layout solver."""
    top = max([float(v or 0) for v in data.bars.select(BAR_KEYS).fill_null(0).sum_horizontal().to_list()]
              + [ms for _, ms, _ in data.step_lines()], default=0.0) * 1.15
    lane_px = max(len(lane) for lane in lanes) * _CHAR_PX + _TICK_PX
    bar_px = len(f"{top:.0f}") * _CHAR_PX + _TICK_PX + _YLABEL_PX
    width_px = fig.get_figwidth() * fig.dpi
    return max(0.08, (max(lane_px, bar_px) + 8) / width_px)


def figure(data: PlotData):
    """The matplotlib Figure (two axes: per-step stacked bars, representative-step timeline)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.collections import PolyCollection
    from matplotlib.figure import Figure

    # Fixed margins, not constrained layout: the layout solver measured every text twice and cost a third of
    # the drawing (benchmarks/startup.py).
    fig = Figure(figsize=(13, 8), dpi=110)
    lines = data.title_lines()
    lanes = [c for c in LANES if data.timeline.filter(pl.col("category") == c).height] + [GAP_LANE]
    fig.subplots_adjust(left=_left_margin(data, lanes, fig), right=0.985, top=0.955 - 0.025 * len(lines),
                        bottom=0.065, hspace=0.42)
    ax_bar, ax_tl = fig.subplots(2, 1, height_ratios=[1.15, 1])
    fig.suptitle("\n".join(_mpl_text(line, TITLE_CHARS + 50) for line in lines), fontsize=11, y=0.99,
                 va="top")

    n = data.bars.height
    x = list(range(n))
    bottom = [0.0] * n
    width = 0.85 if n <= 60 else 1.0
    for k in BAR_KEYS:
        # one collection of rectangles per category (one Rectangle artist per bar costs ~1 ms each)
        vals = data.bars[k].fill_null(0.0).to_list()
        verts = [[(i - width / 2, b0), (i - width / 2, b0 + v), (i + width / 2, b0 + v), (i + width / 2, b0)]
                 for i, b0, v in zip(x, bottom, vals)]
        ax_bar.add_collection(PolyCollection(verts, facecolors=COLORS[k], linewidths=0, label=k, gid=k))
        bottom = [a + v for a, v in zip(bottom, vals)]
    i_rep = data.bars["step"].to_list().index(data.step)
    ax_bar.annotate("median step", xy=(i_rep, bottom[i_rep]), xytext=(0, 14), textcoords="offset points",
                    ha="center", fontsize=8, arrowprops={"arrowstyle": "->", "lw": 0.8})
    pad = max(0.0, (10 - n) / 2)  # a lone step should not be a slab across the whole axis
    ax_bar.set_xlim(-0.6 - pad, n - 0.4 + pad)
    top = max([*bottom, *(ms for _, ms, _ in data.step_lines())], default=0)
    ax_bar.set_ylim(0, top * 1.15 if top > 0 else 1)
    for kind, ms, label in data.step_lines():  # the traced mean, and the unprofiled step beside it
        ax_bar.axhline(ms, color=STEP_LINES[kind], linestyle="--" if kind == "traced" else "-", linewidth=1.2,
                       gid=f"{kind}_step", label=label)
    ax_bar.set_ylabel("ms per step")
    ax_bar.set_xlabel(f"step (in time order, {n} step{'s' if n != 1 else ''})")
    if n <= 40:
        ax_bar.set_xticks(x, [str(s) for s in data.bars["step"].to_list()], fontsize=7)
    note = f" (null in this trace: {', '.join(data.null_categories)})" if data.null_categories else ""
    ax_bar.set_title("where each step goes (exclusive time)" + note, fontsize=10, loc="left")
    ax_bar.legend(ncols=9, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), frameon=False,
                  handles=[c for c in ax_bar.collections])
    for kind, ms, label in data.step_lines():
        ax_bar.annotate(label, xy=(1, ms), xycoords=("axes fraction", "data"), xytext=(-4, 3),
                        textcoords="offset points", ha="right", va="bottom", fontsize=8, color=STEP_LINES[kind])

    for y, lane in enumerate(lanes):
        if lane == GAP_LANE:
            for kind in GAP_CATEGORIES:
                g = data.gaps.filter(pl.col("kind") == kind)
                ax_tl.broken_barh(list(zip(g["start_us"], g["end_us"] - g["start_us"])), (y - 0.4, 0.8),
                                  facecolors=COLORS[kind], edgecolor=COLORS[kind], linewidth=0.2, gid=kind)
            continue
        t = data.timeline.filter(pl.col("category") == lane)
        # A hairline edge keeps microsecond kernels visible in a millisecond-wide step.
        ax_tl.broken_barh(list(zip(t["start_us"], t["end_us"] - t["start_us"])), (y - 0.4, 0.8),
                          facecolors=COLORS[lane], edgecolor=COLORS[lane], linewidth=0.4, gid=lane)
    ax_tl.set_yticks(range(len(lanes)), lanes)
    ax_tl.set_ylim(len(lanes) - 0.5, -0.5)
    span_us = data.step_period_ms * 1e3
    ax_tl.set_xlim(0, span_us if span_us > 0 else 1)
    ax_tl.set_xlabel("µs from the step's first GPU activity")
    ax_tl.set_title(f"step {data.step} (median, {data.step_period_ms:.3f} ms): GPU activity by category; "
                    "gaps = GPU waiting for the host (launch gaps) or idle after the step's work", fontsize=10,
                    loc="left")
    ax_tl.grid(axis="x", alpha=0.3)
    return fig


def render_matplotlib(data: PlotData, path: Path) -> None:
    import matplotlib

    fmt = path.suffix.lower().lstrip(".")
    fig = figure(data)
    with matplotlib.rc_context({"svg.hashsalt": "tracekit", "svg.fonttype": "none"}):
        meta = {"Date": None} if fmt == "svg" else {"Software": "tracekit"}
        fig.savefig(path, format=fmt, metadata=meta)


def _e(s, limit=300) -> str:
    return html.escape(plain(s, limit), quote=True)


def render_html(data: PlotData) -> str:
    """A self-contained interactive page: hover a bar or a kernel to read its numbers."""
    W, H1, PAD = 1100, 300, 50
    n = data.bars.height
    totals = data.bars.select(pl.sum_horizontal(*[pl.col(k).fill_null(0) for k in BAR_KEYS]).alias("t"))["t"]
    levels = data.step_lines()
    ymax = max([float(totals.max()) if n else 1.0, *(ms for _, ms, _ in levels)]) * 1.1 or 1.0
    bw = (W - 2 * PAD) / max(n, 1)
    sy = (H1 - 40) / ymax
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H1 + 30}" class="bars">',
             f'<text x="{PAD}" y="14" font-size="12">ms per step (each bar one step, in time order; '
             f'max {ymax / 1.1:.3f} ms)</text>']
    steps = data.bars["step"].to_list()
    bottom = [0.0] * n
    for k in BAR_KEYS:
        vals = data.bars[k].fill_null(0.0).to_list()
        for i, (v, s) in enumerate(zip(vals, steps)):
            if v > 0:
                y = H1 - (bottom[i] + v) * sy
                parts.append(f'<rect x="{PAD + i * bw:.2f}" y="{y:.2f}" width="{max(bw * 0.9, 0.5):.2f}" '
                             f'height="{v * sy:.2f}" fill="{COLORS[k]}" data-tip="step {s}: {k} {v:.3f} ms">'
                             f'<title>step {s}: {k} {v:.3f} ms</title></rect>')
            bottom[i] += v
    parts.append(f'<line x1="{PAD}" y1="{H1}" x2="{W - PAD}" y2="{H1}" stroke="#333"/>')
    for kind, ms, label in levels:  # the traced mean, and the unprofiled step beside it
        y = H1 - ms * sy
        dash = ' stroke-dasharray="6 4"' if kind == "traced" else ""
        parts.append(f'<line class="{kind}_step" x1="{PAD}" y1="{y:.2f}" x2="{W - PAD}" y2="{y:.2f}" '
                     f'stroke="{STEP_LINES[kind]}" stroke-width="1.5"{dash}><title>{_e(label)}</title></line>'
                     f'<text x="{W - PAD}" y="{y - 3:.2f}" font-size="11" text-anchor="end" '
                     f'fill="{STEP_LINES[kind]}">{_e(label)}</text>')
    parts.append("</svg>")

    lanes = [c for c in LANES if data.timeline.filter(pl.col("category") == c).height] + [GAP_LANE]
    LH, LW = 26, 110
    span = data.step_period_ms * 1e3 or 1.0
    sx = (W - LW - PAD) / span
    H2 = LH * len(lanes) + 40
    tl = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H2}" class="timeline">']
    for y, lane in enumerate(lanes):
        tl.append(f'<text x="4" y="{y * LH + 17}" font-size="12">{_e(lane)}</text>')
        if lane == GAP_LANE:
            rows = data.gaps.select("start_us", "end_us", color=pl.col("kind").replace_strict(COLORS),
                                    tip=pl.format("{} {} µs", pl.col("kind"),
                                                  (pl.col("end_us") - pl.col("start_us")).round(2)))
        else:
            rows = data.timeline.filter(pl.col("category") == lane).select(
                "start_us", "end_us", color=pl.lit(COLORS[lane]),
                tip=pl.format("{} µs  {}", (pl.col("end_us") - pl.col("start_us")).round(2), pl.col("name")))
        for s, e, c, tip in rows.iter_rows():  # drawing: one rect per activity of one step
            t = _e(tip)
            tl.append(f'<rect x="{LW + s * sx:.2f}" y="{y * LH + 3}" width="{max((e - s) * sx, 0.6):.2f}" '
                      f'height="{LH - 6}" fill="{c}" data-tip="{t}"><title>{t}</title></rect>')
    tl.append(f'<text x="{LW}" y="{H2 - 8}" font-size="11">0 µs</text>'
              f'<text x="{W - PAD}" y="{H2 - 8}" font-size="11" text-anchor="end">{span:.1f} µs</text></svg>')
    legend = " ".join(f'<span><i style="background:{COLORS[k]}"></i>{k}</span>' for k in BAR_KEYS)
    js = ("document.querySelectorAll('[data-tip]').forEach(function(el){el.addEventListener('mouseenter',"
          "function(){document.getElementById('tip').textContent=el.getAttribute('data-tip');});});")
    nulls = (f"<p>null in this trace (drawn as 0): {_e(', '.join(data.null_categories))}</p>"
             if data.null_categories else "")
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>tracekit plot: {_e(data.title)}</title>",
        "<style>body{font-family:system-ui,sans-serif;margin:16px;color:#222}"
        ".legend span{margin-right:12px;font-size:13px}.legend i{display:inline-block;width:12px;height:12px;"
        "margin-right:4px;vertical-align:middle}#tip{font-family:monospace;min-height:1.4em;background:#f4f4f4;"
        "padding:4px 8px;white-space:pre-wrap;word-break:break-all}rect:hover{stroke:#000;stroke-width:1}</style>",
        "</head><body>",
        f"<h2>{_e(data.title)}</h2>", f"<p><b>{_e(data.headline, 4000)}</b></p>", nulls,
        f'<div class="legend">{legend}</div>', '<div id="tip">hover a bar or a kernel</div>',
        "".join(parts),
        f"<h3>step {data.step} (median step, {data.step_period_ms:.3f} ms): GPU activity by category</h3>",
        "".join(tl), f"<script>{js}</script>", "</body></html>", ""])
