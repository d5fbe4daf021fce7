"""Rich terminal tables. Renderers take the console (tests inject a StringIO one).

Output a user pastes (what is not a terminal: a pipe, ``-o FILE``, a StringIO console) is never cut short:

* ``kernels`` shows names whole (:func:`full_names`: not a terminal, or ``--wide``), last on each row; the table
  grows as wide as its longest name instead of ending the name in ``…`` (:func:`print_wide`);
* a sentence (headline, verdict, warning) is never cut mid-word (:func:`sentence`): on a terminal it wraps on
  words, its continuation lines indented under its first word; elsewhere it is one whole line (the window it is
  pasted into wraps it);
* every table of several files or ranks is titled with its rank and file.
"""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from tracekit.report.safe import plain, rich_text
from tracekit.text import MISSING, distinct_short, num, pct

CAT_STYLE = {"gemm": "cyan", "attention": "magenta", "communication": "yellow", "drafting": "green",
             "other": "blue", "memory": "bright_black", "unattributed": "red", "launch_gaps": "red",
             "idle": "bright_black"}


SENTENCE_LIMIT = 4000  # characters of one sentence shown (a safety cap for text that quotes trace names)
TOP_OTHER_COLUMNS = 40  # what the top-kernels table's other columns, borders and padding take of its width


def full_names(console: Console) -> bool:
    """Whether names are shown whole: always when the output is not a terminal (piped, ``-o FILE``: text a user
    pastes), and on a terminal with ``--wide`` (the command line sets ``console.wide``)."""
    return bool(getattr(console, "wide", False)) or not console.is_terminal


def print_wide(console: Console, table: Table) -> None:
    """``table`` at the width its content needs, however wide (full names, nothing cut), each line without the
    trailing padding (a pasted line ends where its text does)."""
    from rich.measure import Measurement

    need = Measurement.get(console, console.options.update_width(1 << 16), table).maximum
    for line in console.render_lines(table, console.options.update_width(max(need, 1)), pad=False):
        text = Text.assemble(*[(seg.text, seg.style) for seg in line if not seg.control])
        text.rstrip()
        console.print(text, soft_wrap=True, crop=False)


def sentence(console: Console, text, prefix: str = "", style: str = "", prefix_style: str = "") -> None:
    """One sentence (untrusted text: shown, never parsed as markup), never cut mid-word: on a terminal it wraps on
    words with its continuation lines indented under its first word; elsewhere it is one line."""
    body = rich_text(text, SENTENCE_LIMIT, style=style)
    if not console.is_terminal:
        console.print(Text(prefix, style=prefix_style) + body, soft_wrap=True)
        return
    if not prefix:
        console.print(body)
        return
    grid = Table.grid()
    grid.add_column(no_wrap=True)
    grid.add_column(ratio=1)
    grid.add_row(Text(prefix, style=prefix_style), body)
    console.print(grid)


def line(console: Console, text) -> None:
    """One line of text that quotes a path or a name: piped, whole on one line (never broken mid-name); on a
    terminal, as the terminal fits it."""
    console.print(text, soft_wrap=not console.is_terminal)


def print_warnings(console: Console, warnings) -> None:
    """``warning: ...`` lines (untrusted text: shown, never parsed as markup)."""
    for w in warnings:
        sentence(console, w, "warning: ", prefix_style="yellow")


def _rank_titles(result: dict) -> list[str]:
    """``rank 0: PATH`` for every file of a multi-file result (its cross table's first two columns)."""
    return [f"rank {row[0]}: {plain(row[1], 500)}" for row in result.get("table") or []]


def render_info(result: dict, console: Console) -> None:
    if "ranks" in result:
        for r, title in zip(result["ranks"], _rank_titles(result)):
            console.print(Text(title, style="bold"))
            render_info(r, console)
            console.print()
        _cross_table(result, console)
        return
    s = result["source"]
    console.print(Text.assemble(("trace ", "bold"), rich_text(s["path"])))
    # Text, not an f-string: console.print parses a str as rich markup, and these values come from the trace.
    console.print(Text.assemble(f"format {s['format']}  producer ", rich_text(s['producer_version'] or 'unknown'),
                                f"  CUDA-graph trace mode {s['graph_trace_mode']}"))
    t = Table(title="GPUs", title_justify="left")
    t.add_column("device", justify="right")
    t.add_column("name")
    t.add_column("peak BW (GB/s)", justify="right")
    for g in result["gpus"]:
        t.add_row(str(g["device"]), rich_text(g["name"] or "unknown"), num(g["peak_bw_gbps"], 0))
    console.print(t)
    c = result["counts"]
    t = Table(title="counts", title_justify="left")
    for k in c:
        t.add_column(k, justify="right")
    t.add_row(*[f"{v:,}" for v in c.values()])
    console.print(t)
    cands = result.get("step_candidates", result["range_names"])
    if cands:
        t = Table(title="step candidates (ranges that launch GPU work; best tiling of the GPU time first)",
                  title_justify="left")
        t.add_column("pattern", overflow="ellipsis", max_width=70)
        t.add_column("count", justify="right")
        t.add_column("GPU time", justify="right")
        t.add_column("--step-range", overflow="ellipsis", max_width=60)
        for r in cands:
            share = f"{100 * r['gpu_share']:.0f}%" if r.get("gpu_share") is not None else ""
            t.add_row(rich_text(r["pattern"]), f"{r['count']:,}", share, rich_text(r["regex"]))
        console.print(t)
    print_warnings(console, result["warnings"])


def _cross_table(result: dict, console: Console) -> None:
    if "table" not in result:
        return
    t = Table(title="per rank", title_justify="left")
    skip = ("path", "producer_version")
    for col in result["columns"]:
        if col not in skip:
            t.add_column(col, justify="left" if col == "rank" else "right", no_wrap=True, min_width=len(col))
    idx = [i for i, c in enumerate(result["columns"]) if c not in skip]
    for row in result["table"]:
        t.add_row(*[rich_text(row[i]) if isinstance(row[i], str) else
                    (f"{row[i]:,}" if isinstance(row[i], int) else num(row[i])) for i in idx])
    (print_wide if full_names(console) else Console.print)(console, t)


# the narrowest terminal whose kernels table shows the duration statistics beside an ellipsized name
STATS_WIDTH = 150


def render_kernels(result: dict, console: Console, title: str | None = None) -> None:
    if "ranks" in result:
        for r, rank_title in zip(result["ranks"], _rank_titles(result)):
            render_kernels(r, console, rank_title)
        _cross_table(result, console)
        return
    full = full_names(console)
    # a whole name goes last (a row reads: the numbers, then the name as long as it is), in a light frame
    # (whole names: no box, whose header rule would run as wide as the longest name, thousands of characters)
    t = Table(expand=not full, title=title, title_justify="left", title_style="bold",
              box=None if full else box.HEAVY_HEAD, pad_edge=not full)
    if not full:
        t.add_column("kernel", overflow="ellipsis", ratio=1, no_wrap=True)
    t.add_column("category")
    t.add_column("rule")
    t.add_column("count", justify="right")
    t.add_column("total (ms)", justify="right")
    t.add_column("mean (µs)", justify="right")
    # nsys stats' Med / Min / Max / StdDev of the durations: where the names are whole (piped, --wide) or the
    # terminal leaves the names room (the JSON, md and csv always carry them)
    stats = ("median_ms", "min_ms", "max_ms", "stddev_ms") if full or console.width >= STATS_WIDTH else ()
    for k in stats:
        t.add_column(f"{k.removesuffix('_ms')} (µs)", justify="right")
    t.add_column("share", justify="right")
    if full:
        t.add_column("kernel", no_wrap=True)
    for r in result["kernels"]:
        rule = Text("no rule", style="bold red") if r["rule"] is None else Text(r["rule"])
        name = rich_text(r["name"], SENTENCE_LIMIT)
        cells = [Text(r["category"], style=CAT_STYLE.get(r["category"], "")), rule, f"{r['count']:,}",
                 num(r["total_ms"]), num(r["mean_us"], 1),
                 *(num(r[k] * 1e3, 1) for k in stats),
                 f"{100 * r['share']:.1f}%"]
        t.add_row(*([*cells, name] if full else [name, *cells]))
    (print_wide if full else Console.print)(console, t)
    print_warnings(console, result["warnings"])


def render_breakdown(b, console: Console) -> None:
    from tracekit.report.markdown import (
        biggest_category,
        coverage_line,
        gap_rows,
        headline,
        speculation_line,
        split_rows,
        time_base_line,
        verdict_lines,
    )
    from tracekit.tokens import tok_s_unit

    d = b.to_dict()
    st, gpu, roof = d["steps"], d["gpu"], d["roofline"]
    src = d["source"]
    # The headline first (the answer), what it is stated against, then what was read; the command line is not echoed.
    # (piped: one line however long, as the markdown heading; on a terminal: wrapped on words)
    sentence(console, headline(b), style="bold")
    sentence(console, time_base_line(d), style="italic")
    line(console, Text.assemble("trace ", rich_text(src["path"]), f" ({src['format']}, ",
                                rich_text(src["producer_version"] or "unknown version"),
                                f", graph trace mode {src['graph_trace_mode']})"))
    line(console, Text.assemble(
        f"GPU {gpu['device']}: ", rich_text(gpu['name'] or 'unknown'), f"  peak {num(gpu['peak_bw_gbps'], 0)} GB/s "
        f"({gpu['peak_bw_source'] or 'unknown'})   steps {st['count']} ({st['marker']}",
        rich_text(', ' + repr(st['pattern']) if st['pattern'] else ''), f"), excluded {st['excluded']}", rich_text(
            " (" + "; ".join(f"{k}: {v}" for k, v in st["excluded_reasons"].items()) + ")" if st["excluded"] else "")))
    console.print(f"traced step ms: mean {num(st['mean_ms'])}  median {num(st['median_ms'])}  p10 {num(st['p10_ms'])}  "
                  f"p90 {num(st['p90_ms'])}")
    outside = coverage_line(d)
    if outside:
        sentence(console, outside)
    t = Table(title="where a traced step goes (exclusive, per step)", title_justify="left")
    t.add_column("category")
    t.add_column("ms / step", justify="right")
    t.add_column("% of traced", justify="right")
    t.add_column("kernel ms / step", justify="right")
    for name, ms, share, kms in split_rows(b):
        t.add_row(Text(name, style=CAT_STYLE.get(name, "")), num(ms), MISSING if share is None else f"{share:.1f}%",
                  num(kms))
    t.add_row(Text("traced step", style="bold"), num(st["mean_ms"]), "100.0%", "")
    console.print(t)
    t = Table(title="gaps by cause", title_justify="left")
    t.add_column("cause")
    t.add_column("ms / step", justify="right")
    t.add_column("% of traced", justify="right")
    for name, ms, share in gap_rows(b):
        t.add_row(name.replace("_", " "), num(ms), MISSING if share is None else f"{share:.1f}%")
    console.print(t)
    for g in d["gaps"]["largest"][:3]:
        before = g.get("before")
        line(console, Text(f"  gap of {g['ms']:.3f} ms at {g['at_ms']:.3f} ms into step {g['step']} "
                           f"({g['cause'].replace('_', ' ')}, {g['where']}); the host was in ")
             + (rich_text(f"{before['kind']} {before['name']}", 120) if before else Text("nothing recorded")))
    top = b.top_kernels
    if top.height:
        biggest = biggest_category(b)
        rows = top.filter(top["category"] == biggest).head(5) if biggest else top.head(5)
        # (names shortened to fit: `tracekit kernels` lists them whole)
        t = Table(title=f"top kernels of {biggest or 'all categories'}", title_justify="left", expand=True)
        t.add_column("kernel", overflow="ellipsis", ratio=1, no_wrap=True)
        t.add_column("per step", justify="right")
        t.add_column("ms / step", justify="right")
        t.add_column("mean (µs)", justify="right")
        n = max(1, st["count"])
        # cut to the kernel column's width here, so that two names never cut to one (rich would cut at the end)
        names = distinct_short([plain(x, 4000) for x in rows["name"]], max(16, console.width - TOP_OTHER_COLUMNS))
        for name, r in zip(names, rows.iter_rows(named=True)):
            t.add_row(rich_text(name, 4000), f"{r['count'] / n:.1f}", num(r["per_step_ms"]), num(r["mean_us"], 1))
        console.print(t)
    if roof.get("floor_ms") is not None:
        kv = roof.get("kv_bytes_per_step")
        kv_txt = f" + {kv / 1e9:.3f} GB of KV cache ({roof['kv_bytes_source']})" if kv else ""
        line(console, f"roofline per GPU: {roof['weight_bytes_per_step'] / 1e9:.3f} GB of weights/step "
                      f"({roof['weight_bytes_source']}){kv_txt} → "
                      f"floor {num(roof['floor_ms'])} ms, ceiling {num(roof['ceiling_tokens_per_s'], 1)} "
                      f"{tok_s_unit(roof)}; "
                      f"at {pct(roof['fraction_of_ceiling'])} of it; gemm reads at "
                      f"{num(roof['gemm_achieved_bw_gbps'], 0)} GB/s")
    console.print(Text("verdicts", style="bold"))
    for verdict in verdict_lines(b):
        sentence(console, verdict, "• ")
    spec = speculation_line(d)
    if spec:
        sentence(console, spec, style="italic")
    print_warnings(console, d["warnings"])
