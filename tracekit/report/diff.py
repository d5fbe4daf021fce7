"""Renderers of ``tracekit diff`` (schema ``tracekit.diff/3``): markdown for a PR comment, and the rich table.

Everything shown is read from ``Diff.to_dict()`` (the ``--format json`` output), so the three formats
agree; the analysis is ``tracekit.results.diff.diff``. The markdown is stable: the same two traces give
the same text byte for byte. Untrusted text (paths, verdicts quoting names, warnings) goes through
``report.safe``.
"""

from __future__ import annotations

from tracekit.categories import STEP_CATEGORIES
from tracekit.report._fmt import MINUS, MISSING, num
from tracekit.report.safe import md, rich_text

ROW_ORDER = list(STEP_CATEGORIES)

def _num(x, nd=3) -> str:
    return num(x, nd, minus=True)


def _signed(x, nd=3) -> str:
    if x is None:
        return MISSING
    s = f"{abs(x):,.{nd}f}"
    if float(s.replace(",", "")) == 0:
        return f"±{s}"
    return ("+" if x > 0 else MINUS) + s


def _rel(c) -> str:
    r = c.get("rel")
    if r is None:
        return MISSING
    pct = 100 * r
    if round(abs(pct)) == 0:
        return "±0%" if abs(pct) < 0.05 else _signed(pct, 1) + "%"
    return _signed(pct, 0) + "%"


def _source(src: str) -> str:
    return "traced" if src == "traced" else f"unprofiled ({src})"


def headline(d: dict) -> str:
    """The two reference steps, then the traced step's category with the largest absolute change:
    ``unprofiled step 36.670 → 2.822 ms (−92%); in the traced step: launch_gaps −77.202 ms``. An unprofiled step
    against a traced one is named, never stated as a change."""
    r = d["delta"]["reference_step_ms"]
    if r["basis"] == "unprofiled":
        text = f"unprofiled step {_num(r['base'])} → {_num(r['new'])} ms ({_rel(r)})"
    elif r["basis"] == "traced":
        text = f"traced step {_num(r['base'])} → {_num(r['new'])} ms ({_rel(r)}; no unprofiled time on either side)"
    else:
        text = (f"step {_num(r['base'])} ms {_source(r['base_source'])} → {_num(r['new'])} ms "
                f"{_source(r['new_source'])}: not compared (an unprofiled and a traced step)")
    big = d["delta"]["largest_change"]
    if big is not None:
        c = d["delta"]["per_step_ms"][big]
        text += f"; in the traced step: {big} {_signed(c['abs'])} ms"
    if r["basis"] == "traced" and d["delta"]["steps"].get("within_noise"):
        text += " (within step-to-step noise)"
    return text


def _side_base(b: dict) -> str:
    """One side's time base: '36.670 ms unprofiled (manifest)' or '78.5 ms traced (no unprofiled time: ...)'."""
    tb = b.get("time_base") or {}
    if tb.get("unprofiled_step_ms") is not None:
        return f"{_num(tb['unprofiled_step_ms'])} ms unprofiled ({tb.get('unprofiled_source') or 'given'})"
    return f"{_num(tb.get('traced_step_ms'))} ms traced (no unprofiled time: its savings are upper bounds)"


def time_base_line(d: dict) -> str:
    """Each side's time base, and the change of the reference step (what savings are stated against)."""
    c = d["delta"]["reference_step_ms"]
    if c["basis"] == "traced":
        text = (f"time base: both steps traced, no unprofiled time (savings are upper bounds): base "
                f"{_num(c['base'])} ms, new {_num(c['new'])} ms")
    else:
        text = f"time base: base {_side_base(d['base'])}, new {_side_base(d['new'])}"
    if c["basis"] == "mixed":
        text += "; the reference steps are not compared (one unprofiled, one traced)"
    elif c["abs"] is not None:
        text += f"; reference step {_signed(c['abs'])} ms ({_rel(c)})"
    return text


def _rows(d: dict):
    """(label, base, new, Δ, Δ%, strong) rows shared by markdown and the terminal table; ``strong``: the row the
    headline compares."""
    delta = d["delta"]
    rows = []
    st = delta["steps"]
    c = delta["reference_step_ms"]
    if c["basis"] == "unprofiled":
        rows.append(("unprofiled step", _num(c["base"]), _num(c["new"]), _signed(c["abs"]), _rel(c), True))
    elif c["basis"] == "mixed":
        label = f"reference step ({_source(c['base_source']).split(' ')[0]} → {_source(c['new_source']).split(' ')[0]})"
        rows.append((label, _num(c["base"]), _num(c["new"]), MISSING, MISSING, True))
    for key, label in (("mean_ms", "traced mean"), ("median_ms", "traced median"), ("p10_ms", "traced p10"),
                       ("p90_ms", "traced p90"), ("spread_ms", "spread p90−p10")):
        c = st[key]
        strong = key == "mean_ms" and delta["reference_step_ms"]["basis"] == "traced"
        rows.append((label, _num(c["base"]), _num(c["new"]), _signed(c["abs"]), _rel(c), strong))
    for k in ROW_ORDER:
        c = delta["per_step_ms"].get(k)
        if c is not None:
            rows.append((k, _num(c["base"]), _num(c["new"]), _signed(c["abs"]), _rel(c), False))
    c = st["count"]
    rows.append(("steps analysed", str(c["base"]), str(c["new"]), _signed(c["abs"], 0), "", False))
    return rows


def _advice_line(a: dict) -> str:
    ap = a["applicable"]
    state = lambda v: "applicable" if v else "not applicable"  # noqa: E731
    s = f"**{a['lever']}**: "
    s += f"{state(ap['base'])} → {state(ap['new'])}" if a["applicable_flipped"] else f"{state(ap['new'])}"
    ms = a["max_saving_ms"]
    if ms["base"] is not None or ms["new"] is not None:
        s += f"; max saving {_num(ms['base'])} → {_num(ms['new'])} ms"
    return s


def diff_md(d: dict) -> str:
    """PR-comment markdown: headline, per-step table, advice that changed, details folded."""
    base, new, delta = d["base"], d["new"], d["delta"]
    out = [f"### tracekit diff: {headline(d)}", "", md(time_base_line(d), 600), "",
           "| per step (ms) | base | new | Δ | Δ % |", "|---|---:|---:|---:|---:|"]
    for label, b, n, a, r, strong in _rows(d):
        out.append(f"| {'**' + label + '**' if strong else label} | {b} | {n} | {a} | {r} |")
    out.append("")
    if delta["advice_changed"]:
        out.append("**advice that changed**")
        out.append("")
        for a in delta["advice_changed"]:
            out.append(f"- {_advice_line(a)}: {md(a['verdict']['new'], 1000)}")
    else:
        out.append("**advice**: no lever changed")
    for w in delta["warnings"]:
        out.append(f"- ⚠ {md(w, 500)}")
    out += ["", "<details><summary>details</summary>", ""]
    for side, b in (("base", base), ("new", new)):
        st, gpu, src = b["steps"], b["gpu"], b["source"]
        pattern = f", pattern {md(st['pattern'])}" if st["pattern"] else ""
        out.append(f"- {side}: {md(src['path'], 200)} ({src['format']}, graph trace mode {src['graph_trace_mode']}); "
                   f"GPU {gpu['device']} {md(gpu['name'] or 'unknown')}; {st['count']} steps analysed, "
                   f"{st['excluded']} excluded (marker {st['marker']}{pattern})")
    out += ["", "| kernel ms / step | base | new | Δ | Δ % |", "|---|---:|---:|---:|---:|"]
    for k, c in delta["kernel_ms_per_step"].items():
        out.append(f"| {k} | {_num(c['base'])} | {_num(c['new'])} | {_signed(c['abs'])} | {_rel(c)} |")
    roof = [(k, c) for k, c in delta["roofline"].items() if c["base"] is not None or c["new"] is not None]
    if roof:
        out += ["", "| roofline | base | new | Δ | Δ % |", "|---|---:|---:|---:|---:|"]
        for k, c in roof:
            out.append(f"| {k} | {_num(c['base'])} | {_num(c['new'])} | {_signed(c['abs'])} | {_rel(c)} |")
    for side, b in (("base", base), ("new", new)):
        out += ["", f"verdicts ({side}):"]
        for lever, a in b["advice"].items():
            out.append(f"- {lever}: {md(a['verdict'], 1000)}")
    for side, b in (("base", base), ("new", new)):
        if b["warnings"]:
            out += ["", f"warnings ({side}):"]
            out += [f"- {md(w, 500)}" for w in b["warnings"]]
    out += ["", "</details>", ""]
    return "\n".join(out)


def render_diff(d: dict, console) -> None:
    """The rich table: headline, what was compared, the per-step rows, the advice that changed, warnings."""
    from rich.table import Table
    from rich.text import Text

    from tracekit.report.terminal import print_warnings, sentence

    sentence(console, headline(d), style="bold")
    sentence(console, time_base_line(d))
    console.print(Text.assemble("base ", rich_text(d["base"]["source"]["path"]), " → new ",
                                rich_text(d["new"]["source"]["path"])))
    t = Table(title="per step (ms)", title_justify="left")
    for col in ("", "base", "new", "Δ", "Δ %"):
        t.add_column(col, justify="left" if not col else "right")
    for *row, strong in _rows(d):
        t.add_row(*row, style="bold" if strong else None)
    console.print(t)
    changed = d["delta"]["advice_changed"]
    console.print(Text("advice that changed" if changed else "advice: no lever changed", style="bold"))
    for a in changed:
        sentence(console, f"{_advice_line(a).replace('**', '')}: {a['verdict']['new']}", "• ")
    print_warnings(console, d["delta"]["warnings"])
