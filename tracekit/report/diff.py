"""Renderers of ``tracekit diff`` (schema ``tracekit.diff/3``): markdown for a PR comment, and the rich table.

With a gate (``--fail-on-regression``) both lead with its verdict and its one-line reason; the markdown folds
everything else under ``<details>``. Both show the kernels that moved most (``kernels``, top
:data:`TOP_KERNELS`) and, for rank sets, the cross-rank figures compared. Everything shown is read from ``Diff.to_dict()`` (the ``--format json`` output), so the three formats
agree; the analysis is ``tracekit.results.diff.diff``. The markdown is stable: the same two traces give
the same text byte for byte. Untrusted text (paths, verdicts quoting names, warnings) goes through
``report.safe``.
"""

from __future__ import annotations

import html

from tracekit.categories import STEP_CATEGORIES
from tracekit.report._fmt import MINUS, MISSING, num
from tracekit.report.safe import md, plain, rich_text

ROW_ORDER = list(STEP_CATEGORIES)
TOP_KERNELS = 10  # kernels shown in the "kernels that moved" table (the JSON lists them all)

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


def _tok(x) -> str:
    return MISSING if x is None else f"{x:,.1f}"


def per_token_text(pt: dict) -> str:
    """The two sides per token: ``per token (unprofiled): 2.822 → 3.557 ms (+26.0%), 354.4 → 281.2 tok/s for a
    batch of 1 (1 → 1.2 tokens a step; steps 2.822 → 4.268 ms)``; a speculative side without an accept length:
    what is missing, and no comparison."""
    steps = f"{_num(pt['step_ms']['base'])} → {_num(pt['step_ms']['new'])} ms"
    if pt["missing"]:
        who = " and ".join(s.upper() for s in pt["missing"])
        flags = " / ".join(f"--{s}-accept-len X" for s in pt["missing"])
        return (f"{who} {'is' if len(pt['missing']) == 1 else 'are'} speculative without an accept length: the tokens "
                f"a step emits are unknown, so the steps ({pt['basis']} {steps}) are not compared; pass {flags}")
    tps = f"{pt['tokens_per_step']['base']:g} → {pt['tokens_per_step']['new']:g} tokens a step"
    return (f"per token ({pt['basis']}): {_num(pt['base_ms_per_token'])} → {_num(pt['new_ms_per_token'])} ms "
            f"({_pct_text(pt['change_pct'])}), {_tok(pt['base_tok_s'])} → {_tok(pt['new_tok_s'])} "
            f"{pt['tok_s_unit']} ({tps}; steps {steps})")


def headline(d: dict) -> str:
    """The two reference steps, then the traced step's category with the largest absolute change:
    ``unprofiled step 36.670 → 2.822 ms (−92%); in the traced step: launch_gaps −77.202 ms``. An unprofiled step
    against a traced one is named, never stated as a change. When the two sides emit different tokens per step,
    the steps per token instead (:func:`per_token_text`); a speculative side without an accept length: what is
    missing, and no per-step comparison."""
    r = d["delta"]["reference_step_ms"]
    pt = d.get("per_token")
    if pt is not None:
        text = per_token_text(pt)
    elif r["basis"] == "unprofiled":
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
    if r["basis"] == "traced" and pt is None and d["delta"]["steps"].get("within_noise"):
        text += " (within step-to-step noise)"
    return text


def _side_base(d: dict, side: str) -> str:
    """One side's time base: '36.670 ms unprofiled (manifest)' or '78.5 ms traced (no unprofiled time: ...)'
    (from ``delta``: a rank set's is its slowest rank's)."""
    tb, src = d["delta"]["time_base"], d["delta"]["reference_step_ms"][f"{side}_source"]
    if src != "traced":
        return f"{_num(tb['unprofiled_step_ms'][side])} ms unprofiled ({src})"
    return f"{_num(tb['traced_step_ms'][side])} ms traced (no unprofiled time: its savings are upper bounds)"


def time_base_line(d: dict) -> str:
    """Each side's time base, and the change of the reference step (what savings are stated against)."""
    c = d["delta"]["reference_step_ms"]
    if c["basis"] == "traced":
        text = (f"time base: both steps traced, no unprofiled time (savings are upper bounds): base "
                f"{_num(c['base'])} ms, new {_num(c['new'])} ms")
    else:
        text = f"time base: base {_side_base(d, 'base')}, new {_side_base(d, 'new')}"
    if c["basis"] == "mixed":
        text += "; the reference steps are not compared (one unprofiled, one traced)"
    elif d.get("per_token") is not None:
        text += "; the steps emit different tokens: compared per token"
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
    pt = d.get("per_token")
    if pt is not None:
        ch = pt["change_pct"]
        rel = {"rel": None if ch is None else ch / 100}
        a = (None if pt["base_ms_per_token"] is None or pt["new_ms_per_token"] is None
             else pt["new_ms_per_token"] - pt["base_ms_per_token"])
        rows.append((f"ms per token ({pt['basis']})", _num(pt["base_ms_per_token"]), _num(pt["new_ms_per_token"]),
                     _signed(a), _rel(rel), True))
        t = (None if pt["base_tok_s"] is None or pt["new_tok_s"] is None else pt["new_tok_s"] - pt["base_tok_s"])
        rows.append(("tok/s", _tok(pt["base_tok_s"]), _tok(pt["new_tok_s"]), _signed(t, 1),
                     _rel({"rel": None if t is None else t / pt["base_tok_s"]}), False))
        rows.append(("tokens per step", _num(pt["tokens_per_step"]["base"], 2), _num(pt["tokens_per_step"]["new"], 2),
                     "", "", False))
    per_step = pt is None
    if c["basis"] == "unprofiled":
        rows.append(("unprofiled step", _num(c["base"]), _num(c["new"]), _signed(c["abs"]), _rel(c), per_step))
    elif c["basis"] == "mixed":
        label = f"reference step ({_source(c['base_source']).split(' ')[0]} → {_source(c['new_source']).split(' ')[0]})"
        rows.append((label, _num(c["base"]), _num(c["new"]), MISSING, MISSING, per_step))
    for key, label in (("mean_ms", "traced mean"), ("median_ms", "traced median"), ("p10_ms", "traced p10"),
                       ("p90_ms", "traced p90"), ("spread_ms", "spread p90−p10")):
        c = st[key]
        strong = key == "mean_ms" and delta["reference_step_ms"]["basis"] == "traced" and per_step
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


def _pct_text(x) -> str:
    """``+12.3%``, ``−4.6%``, ``±0.0%`` (a percentage with one decimal)."""
    if x is None:
        return MISSING
    return "±0.0%" if abs(x) < 0.05 else _signed(x, 1) + "%"


GATE_WORDS = {"pass": "passed", "fail": "failed", "inconclusive": "inconclusive"}
GATE_ICONS = {"pass": "✅", "fail": "❌", "inconclusive": "⚠️"}
GATE_STYLES = {"pass": "bold green", "fail": "bold red", "inconclusive": "bold yellow"}


def _verdict(g: dict) -> str:
    """The gate's verdict (a gate saved before ``verdict`` existed: from ``failed``)."""
    return g.get("verdict") or ("fail" if g["failed"] else "pass")


def gate_line(g: dict) -> str:
    """The gate's verdict, short: ``perf gate failed: unprofiled step +12.3% (threshold 3%, 95% interval +9.1% to
    +15.2%)``; ``perf gate inconclusive: ...`` when it cannot tell (exit 4)."""
    what = "unprofiled step" if g["basis"] == "unprofiled" else "traced step"
    if g.get("compares") == "token":
        what += " per token"
    ch = _pct_text(g["change_pct"])
    ci = g["ci_pct"]
    band = (f", {100 * g['confidence']:g}% interval {_pct_text(ci[0])} to {_pct_text(ci[1])}" if ci is not None
            else ", no noise estimate")
    return f"perf gate {GATE_WORDS[_verdict(g)]}: {what} {ch} (threshold {g['threshold_pct']:g}%{band})"


def _moved(d: dict) -> list[dict]:
    """The kernels that moved most (nonzero changes, largest first)."""
    return [k for k in (d.get("kernels") or []) if round(k["delta_ms_per_step"], 6) != 0][:TOP_KERNELS]


def _categories_line(d: dict) -> str:
    """``kernel time +0.312 ms per step: gemm +0.301, other +0.011`` (the categories that moved)."""
    tot = d["delta"]["kernel_total_ms_per_step"]
    moved = [c for c in d["kernel_categories"]
             if c["delta_ms_per_step"] is not None and round(c["delta_ms_per_step"], 3) != 0]
    text = f"kernel time {_signed(tot['abs'])} ms per step ({_rel(tot)})"
    if moved:
        text += ": " + ", ".join(f"{c['category']} {_signed(c['delta_ms_per_step'])}" for c in moved)
    return text


def _cross_rows(d: dict):
    """(label, base, new, Δ) rows of the rank sets' cross-rank figures."""
    cr = d["cross_rank"]
    rows = []
    for key, label in (("ranks", "ranks"), ("step_ms", "set step (slowest rank)"), ("skew_ms", "skew"),
                       ("transfer_ms", "transfer"), ("max_wait_ms", "longest wait"),
                       ("mean_exposed_communication_ms", "exposed communication (mean)")):
        c = cr[key]
        nd = 0 if key == "ranks" else 3
        fmt = (lambda x: MISSING if x is None else str(x)) if key == "ranks" else _num  # noqa: E731
        rows.append((label, fmt(c["base"]), fmt(c["new"]), _signed(c["abs"], nd)))
    for key, label in (("slowest_rank", "slowest rank"), ("pacing_rank", "pacing rank")):
        v = cr[key]
        show = lambda x: MISSING if x is None else str(x)  # noqa: E731
        rows.append((label, show(v["base"]), show(v["new"]), ""))
    return rows


def _body_md(d: dict) -> list[str]:
    """Everything but the gate: headline, time base, per-step table, kernels that moved, cross-rank figures,
    advice that changed, warnings, then the details folded."""
    base, new, delta = d["base"], d["new"], d["delta"]
    out = [f"### tracekit diff: {headline(d)}", "", md(time_base_line(d), 600), "",
           "| per step (ms) | base | new | Δ | Δ % |", "|---|---:|---:|---:|---:|"]
    for label, b, n, a, r, strong in _rows(d):
        out.append(f"| {'**' + label + '**' if strong else label} | {b} | {n} | {a} | {r} |")
    out.append("")
    if d.get("kernels") is not None:
        out += [md(_categories_line(d), 600), ""]
        moved = _moved(d)
        if moved:
            out += [f"**kernels that moved** (top {len(moved)} of {len(d['kernels'])}; ms per step)", "",
                    "| kernel | category | base | new | Δ |", "|---|---|---:|---:|---:|"]
            for k in moved:
                out.append(f"| {md(k['name'], 4000)} | {k['category']} | {_num(k['base_ms_per_step'])} | "
                           f"{_num(k['new_ms_per_step'])} | {_signed(k['delta_ms_per_step'])} |")
            out.append("")
    if d.get("cross_rank"):
        out += ["| across ranks (ms per step) | base | new | Δ |", "|---|---:|---:|---:|"]
        out += [f"| {label} | {b} | {n} | {a} |" for label, b, n, a in _cross_rows(d)]
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
        for label, one in _sides(b):
            st, gpu, src = one["steps"], one["gpu"], one["source"]
            pattern = f", pattern {md(st['pattern'])}" if st["pattern"] else ""
            out.append(f"- {side}{label}: {md(src['path'], 200)} ({src['format']}, graph trace mode "
                       f"{src['graph_trace_mode']}); GPU {gpu['device']} {md(gpu['name'] or 'unknown')}; {st['count']} "
                       f"steps analysed, {st['excluded']} excluded (marker {st['marker']}{pattern})")
    out += ["", "| kernel ms / step | base | new | Δ | Δ % |", "|---|---:|---:|---:|---:|"]
    for k, c in delta["kernel_ms_per_step"].items():
        out.append(f"| {k} | {_num(c['base'])} | {_num(c['new'])} | {_signed(c['abs'])} | {_rel(c)} |")
    roof = [(k, c) for k, c in delta["roofline"].items() if c["base"] is not None or c["new"] is not None]
    if roof:
        out += ["", "| roofline | base | new | Δ | Δ % |", "|---|---:|---:|---:|---:|"]
        for k, c in roof:
            out.append(f"| {k} | {_num(c['base'])} | {_num(c['new'])} | {_signed(c['abs'])} | {_rel(c)} |")
    for side, b in (("base", base), ("new", new)):
        if "cross_rank" in b:
            out += ["", f"across ranks ({side}): {md(b['cross_rank']['verdict'], 1500)}"]
            continue
        out += ["", f"verdicts ({side}):"]
        for lever, a in b["advice"].items():
            out.append(f"- {lever}: {md(a['verdict'], 1000)}")
    for side, b in (("base", base), ("new", new)):
        if b["warnings"]:
            out += ["", f"warnings ({side}):"]
            out += [f"- {md(w, 500)}" for w in b["warnings"]]
    out += ["", "</details>", ""]
    return out


def _sides(b: dict):
    """(label, breakdown) of one side: itself, or each rank of a rank set."""
    if "ranks" in b:
        return [(f" rank {i}", r) for i, r in enumerate(b["ranks"])]
    return [("", b)]


def diff_md(d: dict) -> str:
    """PR-comment markdown. With a gate: its verdict and one-line reason first, everything else folded under
    ``<details>``; without: headline, per-step table, the kernels that moved, advice that changed, details folded."""
    g = d.get("gate")
    if g is None:
        return "\n".join(_body_md(d))
    icon = GATE_ICONS[_verdict(g)]
    out = [f"### {icon} {gate_line(g)}", "", md(g["reason"], 1000), "",
           f"<details><summary>tracekit diff: {html.escape(plain(headline(d), 600), quote=False)}</summary>", "", *_body_md(d),
           f"noise: {md(g['noise_basis'], 600)}", "", "</details>", ""]
    return "\n".join(out)


def render_diff(d: dict, console) -> None:
    """The rich table: the gate's verdict (when asked), headline, what was compared, the per-step rows, the kernels
    that moved, the cross-rank figures, the advice that changed, warnings."""
    from rich import box
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from tracekit.report.terminal import SENTENCE_LIMIT, full_names, print_warnings, print_wide, sentence

    g = d.get("gate")
    if g is not None:
        sentence(console, gate_line(g), style=GATE_STYLES[_verdict(g)])
        sentence(console, g["reason"])
    sentence(console, headline(d), style="bold")
    sentence(console, time_base_line(d))
    console.print(Text.assemble("base ", rich_text(d["base"]["source"]["path"] if "source" in d["base"] else
                                                   f"{len(d['base']['ranks'])} rank files"), " → new ",
                                rich_text(d["new"]["source"]["path"] if "source" in d["new"] else
                                          f"{len(d['new']['ranks'])} rank files")))
    t = Table(title="per step (ms)", title_justify="left")
    for col in ("", "base", "new", "Δ", "Δ %"):
        t.add_column(col, justify="left" if not col else "right")
    for *row, strong in _rows(d):
        t.add_row(*row, style="bold" if strong else None)
    console.print(t)
    if d.get("kernels") is not None:
        sentence(console, _categories_line(d))
        moved = _moved(d)
        if moved:
            full = full_names(console)
            k = Table(title=f"kernels that moved (top {len(moved)} of {len(d['kernels'])}; ms per step)",
                      title_justify="left", expand=not full, box=None if full else box.HEAVY_HEAD,
                      pad_edge=not full)  # (piped: no rule as wide as the longest name)
            if not full:
                k.add_column("kernel", overflow="ellipsis", ratio=1, no_wrap=True)
            for col in ("category", "base", "new", "Δ"):
                k.add_column(col, justify="left" if col == "category" else "right")
            if full:
                k.add_column("kernel", no_wrap=True)
            for r in moved:
                cells = [r["category"], _num(r["base_ms_per_step"]), _num(r["new_ms_per_step"]),
                         _signed(r["delta_ms_per_step"])]
                name = rich_text(r["name"], SENTENCE_LIMIT)
                k.add_row(*([*cells, name] if full else [name, *cells]))
            (print_wide if full else Console.print)(console, k)
    if d.get("cross_rank"):
        c = Table(title="across ranks (ms per step)", title_justify="left")
        for col in ("", "base", "new", "Δ"):
            c.add_column(col, justify="left" if not col else "right")
        for row in _cross_rows(d):
            c.add_row(*row)
        console.print(c)
    changed = d["delta"]["advice_changed"]
    console.print(Text("advice that changed" if changed else "advice: no lever changed", style="bold"))
    for a in changed:
        sentence(console, f"{_advice_line(a).replace('**', '')}: {a['verdict']['new']}", "• ")
    print_warnings(console, d["delta"]["warnings"])
    if g is not None:
        sentence(console, f"noise: {g['noise_basis']}")
