"""Renderers of ``tracekit stats`` (``tracekit.results.stats``): table, markdown and CSV from the same dict JSON prints.

Each table is described once (:func:`sections`: a title, its columns and its rows of cells) and drawn three ways;
names come from the trace, so every one is made safe for where it lands (``tracekit.report.safe``). The table and
markdown views show the first ``shown`` rows of each table (``--top``); CSV and JSON have every row.
"""

from __future__ import annotations

import csv
import io

from tracekit.report.safe import md, plain, rich_text
from tracekit.text import num

_STATS = (("count", "count"), ("total ms", "total_ms"), ("mean µs", "mean_us"), ("median µs", "median_ms"),
          ("min µs", "min_ms"), ("max µs", "max_ms"), ("stddev µs", "stddev_ms"), ("share", "share"))
STATS_WIDTH = 150
_NARROW_DROP = ("median_ms", "min_ms", "max_ms", "stddev_ms")
GROUPING_TITLES = {"api": "kernel time by the CUDA API call that launched it",
                   "op": "kernel time by the framework op that launched it",
                   "module": "kernel time by the nn.Module that launched it",
                   "python": "kernel time by the Python function that launched it",
                   "range": "kernel time by the innermost NVTX range / annotation open at its launch"}


def _cell(key: str, v) -> str:
    if v is None:
        return "—"
    if key == "share" or key == "utilisation":
        return f"{100 * v:.1f}%"
    if key in ("count", "kernels", "bytes", "device", "stream"):
        return f"{int(v):,}"
    if key.endswith("_us"):
        return num(v, 1)
    if key in ("median_ms", "min_ms", "max_ms", "stddev_ms"):
        return num(v * 1e3, 1)  # shown in µs, as nsys stats' columns read
    return num(v)


def sections(d: dict) -> list[tuple[str, list[str], list[str], list[list]]]:
    """``(title, headers, keys, rows)`` per table: ``rows`` are the result's rows (dicts), ``keys`` their keys in
    column order; the first column is the name (text from the trace)."""
    u = d["utilisation"]
    out = [
        (f"GPU utilisation over the trace's GPU window ({num(u['window_ms'])} ms)",
         ["GPU", "busy ms", "kernel ms", "utilisation"], ["device", "busy_ms", "kernel_ms", "utilisation"],
         u["devices"]),
        ("streams", ["GPU", "stream", "activities", "busy ms", "kernel ms", "utilisation"],
         ["device", "stream", "count", "busy_ms", "kernel_ms", "utilisation"], u["streams"]),
        ("kernels (nsys stats: cuda_gpu_kern_sum)", ["kernel", "category", *(h for h, _ in _STATS)],
         ["name", "category", *(k for _, k in _STATS)], d["kernels"]),
        ("memory operations (cuda_gpu_mem_time_sum)", ["operation", "bytes", *(h for h, _ in _STATS)],
         ["name", "bytes", *(k for _, k in _STATS)], d["memops"]),
        ("CUDA API calls (cuda_api_sum)", ["function", *(h for h, _ in _STATS)], ["name", *(k for _, k in _STATS)],
         d["api"]),
        ("NVTX ranges / annotations (nvtx_sum)", ["range", "style", *(h for h, _ in _STATS)],
         ["name", "style", *(k for _, k in _STATS)], d["ranges"]),
    ]
    for g, rows in d["launched_by"].items():
        out.append((GROUPING_TITLES.get(g, g), [g, "kernels", "total ms", "share"], ["name", "kernels", "total_ms", "share"],
                    rows))
    return out


def coverage_line(d: dict) -> str | None:
    """The kernel time outside the steps, said out loud (plain text; reasons are tracekit's words)."""
    c = d["coverage"]
    if c is None:
        return None
    why = "; ".join(f"{r} {num(ms)} ms" for r, ms in c["outside_by_reason"].items())
    return (f"kernel time outside the {c['steps']} analysed steps (GPU {c['device']}): "
            f"{num(c['kernel_ms_outside_steps'])} ms of {num(c['kernel_ms_total'])} ms "
            f"({100 * c['outside_share']:.1f}%)" + (f": {why}" if why else ""))


def _source_line(d: dict) -> str:
    s = d["source"]
    dev = "every GPU" if d["device"] is None else f"GPU {d['device']}"
    return f"trace {s['path']} ({s['format']}, {s['producer_version'] or 'unknown version'}); {dev}"


def stats_md(result) -> str:
    d = result.to_dict()
    shown = getattr(result, "shown", 20)
    out = [f"### tracekit stats: {md(_source_line(d), 600)}", ""]
    cov = coverage_line(d)
    if cov:
        out += [f"- {md(cov, 2000)}", ""]
    for title, heads, keys, rows in sections(d):
        if not rows:
            continue
        more = f" (first {shown} of {len(rows)})" if len(rows) > shown else ""
        out += [f"#### {md(title, 200)}{more}", "", "| " + " | ".join(heads) + " |",
                "|" + "|".join("---" if i == 0 or k in ("category", "style") else "---:"
                               for i, k in enumerate(keys)) + "|"]
        for r in rows[:shown]:
            cells = [md(r[k], 4000) if i == 0 or k in ("category", "style") else _cell(k, r[k])
                     for i, k in enumerate(keys)]
            out.append("| " + " | ".join(cells) + " |")
        out.append("")
    if d["warnings"]:
        out += [f"- warning: {md(w, 500)}" for w in d["warnings"]]
    return "\n".join(out).rstrip("\n") + "\n"


def _csv_safe(s) -> str:
    s = plain(s, 2000)
    return "'" + s if s[:1] in ("=", "+", "-", "@") else s


CSV_COLUMNS = ["table", "name", "detail", "count", "bytes", "total_ms", "mean_us", "median_ms", "min_ms", "max_ms",
               "stddev_ms", "share"]


def stats_csv(result) -> str:
    """One row per table row: ``table`` says which (``kernels``, ``memops``, ``api``, ``ranges``, ``gpu``,
    ``stream``, ``coverage``, ``launched_by:<grouping>``); ``detail`` the category, kind, style or stream."""
    d = result.to_dict()
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CSV_COLUMNS)

    def row(table, name, detail, r, **more):
        vals = {**r, **more}
        w.writerow([table, _csv_safe(name), _csv_safe("" if detail is None else detail),
                    *("" if vals.get(k) is None else vals[k] for k in CSV_COLUMNS[3:])])

    for r in d["kernels"]:
        row("kernels", r["name"], r["category"], r)
    for r in d["memops"]:
        row("memops", r["name"], r["copy_kind"] or r["kind"], r)
    for r in d["api"]:
        row("api", r["name"], None, r)
    for r in d["ranges"]:
        row("ranges", r["name"], r["style"], r)
    for r in d["utilisation"]["devices"]:
        row("gpu", f"GPU {r['device']}", None, {}, total_ms=r["busy_ms"], share=r["utilisation"])
    for r in d["utilisation"]["streams"]:
        row("stream", f"GPU {r['device']}", f"stream {r['stream']}", {}, count=r["count"], total_ms=r["busy_ms"],
            share=r["utilisation"])
    c = d["coverage"]
    if c is not None:
        row("coverage", "in steps", f"GPU {c['device']}", {}, total_ms=c["kernel_ms_in_steps"])
        for why, ms in c["outside_by_reason"].items():
            row("coverage", "outside steps", why, {}, total_ms=ms)
    for g, rows in d["launched_by"].items():
        for r in rows:
            row(f"launched_by:{g}", r["name"], None, r, count=r["kernels"])
    return buf.getvalue()


def render_stats(result, console) -> None:
    from rich import box
    from rich.table import Table

    from tracekit.report.terminal import line, print_warnings

    d = result.to_dict()
    shown = getattr(result, "shown", 20)
    line(console, rich_text(_source_line(d), 2000))
    cov = coverage_line(d)
    if cov:
        line(console, rich_text(cov, 2000, style="bold"))
    # a terminal narrower than STATS_WIDTH leaves the four nsys statistics out (md, csv and json always have them)
    narrow = console.width < STATS_WIDTH and not getattr(console, "wide", False)
    for title, heads, keys, rows in sections(d):
        if not rows:
            continue
        cols = [(h, k) for h, k in zip(heads, keys) if not (narrow and k in _NARROW_DROP)]
        more = f" (first {shown} of {len(rows)})" if len(rows) > shown else ""
        t = Table(title=title + more, title_justify="left", title_style="bold", box=box.HEAVY_HEAD, expand=False)
        room = max(24, console.width - 12 * (len(cols) - 1))
        for i, (h, k) in enumerate(cols):
            if i == 0:
                t.add_column(h, overflow="ellipsis", no_wrap=True, max_width=room)
            else:
                t.add_column(h, justify="left" if k in ("category", "style") else "right", no_wrap=True)
        for r in rows[:shown]:
            t.add_row(*(rich_text(r[k], 300) if i == 0 or k in ("category", "style") else _cell(k, r[k])
                        for i, (_, k) in enumerate(cols)))
        console.print(t)
    print_warnings(console, d["warnings"])
