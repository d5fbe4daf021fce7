"""Rich terminal tables. Renderers take the console (tests inject a StringIO one)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from tracekit.report._fmt import MISSING, num, pct
from tracekit.report.safe import rich_text

CAT_STYLE = {"gemm": "cyan", "attention": "magenta", "communication": "yellow", "drafting": "green",
             "other": "blue", "memory": "bright_black", "unattributed": "red", "launch_gaps": "red",
             "idle": "bright_black"}


def print_warnings(console: Console, warnings) -> None:
    """``warning: ...`` lines (untrusted text: shown, never parsed as markup)."""
    for w in warnings:
        console.print(Text("warning: ", style="yellow") + rich_text(w, 500))


def render_info(result: dict, console: Console) -> None:
    if "ranks" in result:
        for r in result["ranks"]:
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
    console.print(t)


def render_kernels(result: dict, console: Console) -> None:
    if "ranks" in result:
        for r in result["ranks"]:
            render_kernels(r, console)
        _cross_table(result, console)
        return
    t = Table(expand=True)
    t.add_column("kernel", overflow="ellipsis", ratio=1, no_wrap=True)
    t.add_column("category")
    t.add_column("rule")
    t.add_column("count", justify="right")
    t.add_column("total (ms)", justify="right")
    t.add_column("mean (µs)", justify="right")
    t.add_column("share", justify="right")
    for r in result["kernels"]:
        rule = Text("no rule", style="bold red") if r["rule"] is None else Text(r["rule"])
        t.add_row(rich_text(r["name"]), Text(r["category"], style=CAT_STYLE.get(r["category"], "")), rule,
                  f"{r['count']:,}", num(r["total_ms"]), num(r["mean_us"], 1), f"{100 * r['share']:.1f}%")
    console.print(t)
    print_warnings(console, result["warnings"])


def render_breakdown(b, console: Console) -> None:
    from tracekit.report.markdown import biggest_category, gap_rows, headline, split_rows, time_base_line, verdict_lines
    from tracekit.tokens import tok_s_unit

    d = b.to_dict()
    st, gpu, roof = d["steps"], d["gpu"], d["roofline"]
    src = d["source"]
    # The headline first (the answer), what it is stated against, then what was read; the command line is not echoed.
    # (one line however long, as the markdown heading: the terminal wraps it, copy-paste keeps it whole)
    console.print(rich_text(headline(b), 1000, style="bold"), soft_wrap=True)
    console.print(rich_text(time_base_line(d), 500, style="italic"), soft_wrap=True)
    console.print(Text.assemble("trace ", rich_text(src["path"]), f" ({src['format']}, ",
                                rich_text(src["producer_version"] or "unknown version"),
                                f", graph trace mode {src['graph_trace_mode']})"))
    console.print(Text.assemble(
        f"GPU {gpu['device']}: ", rich_text(gpu['name'] or 'unknown'), f"  peak {num(gpu['peak_bw_gbps'], 0)} GB/s "
        f"({gpu['peak_bw_source'] or 'unknown'})   steps {st['count']} ({st['marker']}",
        rich_text(', ' + repr(st['pattern']) if st['pattern'] else ''), f"), excluded {st['excluded']}", rich_text(
            " (" + "; ".join(f"{k}: {v}" for k, v in st["excluded_reasons"].items()) + ")" if st["excluded"] else "")))
    console.print(f"traced step ms: mean {num(st['mean_ms'])}  median {num(st['median_ms'])}  p10 {num(st['p10_ms'])}  "
                  f"p90 {num(st['p90_ms'])}")
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
        console.print(Text(f"  gap of {g['ms']:.3f} ms at {g['at_ms']:.3f} ms into step {g['step']} "
                           f"({g['cause'].replace('_', ' ')}, {g['where']}); the host was in ")
                      + (rich_text(f"{before['kind']} {before['name']}", 120) if before else Text("nothing recorded")))
    top = b.top_kernels
    if top.height:
        biggest = biggest_category(b)
        rows = top.filter(top["category"] == biggest).head(5) if biggest else top.head(5)
        t = Table(title=f"top kernels of {biggest or 'all categories'}", title_justify="left", expand=True)
        t.add_column("kernel", overflow="ellipsis", ratio=1, no_wrap=True)
        t.add_column("per step", justify="right")
        t.add_column("ms / step", justify="right")
        t.add_column("mean (µs)", justify="right")
        n = max(1, st["count"])
        for r in rows.iter_rows(named=True):
            t.add_row(rich_text(r["name"]), f"{r['count'] / n:.1f}", num(r["per_step_ms"]), num(r["mean_us"], 1))
        console.print(t)
    if roof.get("floor_ms") is not None:
        kv = roof.get("kv_bytes_per_step")
        kv_txt = f" + {kv / 1e9:.3f} GB of KV cache ({roof['kv_bytes_source']})" if kv else ""
        console.print(f"roofline per GPU: {roof['weight_bytes_per_step'] / 1e9:.3f} GB of weights/step "
                      f"({roof['weight_bytes_source']}){kv_txt} → "
                      f"floor {num(roof['floor_ms'])} ms, ceiling {num(roof['ceiling_tokens_per_s'], 1)} "
                      f"{tok_s_unit(roof)}; "
                      f"at {pct(roof['fraction_of_ceiling'])} of it; gemm reads at "
                      f"{num(roof['gemm_achieved_bw_gbps'], 0)} GB/s")
    console.print(Text("verdicts", style="bold"))
    for line in verdict_lines(b):
        console.print(Text("• ") + rich_text(line, 1000))
    print_warnings(console, d["warnings"])
