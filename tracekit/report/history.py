"""Renderers of ``tracekit history`` (schema ``tracekit.history/1``): the rich table and stable markdown.

Both read the dict :func:`tracekit.runs.history` returns (the ``--format json`` output). Traces are
shown by the shortest tail of their path that tells them apart (every capture names its file
``trace.sqlite``); the table lists the full paths under it.
"""

from __future__ import annotations

from tracekit.categories import BREAKDOWN_SCHEMA, STEP_CATEGORIES
from tracekit.report._fmt import MINUS, distinct_tails, num
from tracekit.report.safe import md, rich_text

SHOWN = [k for k in STEP_CATEGORIES if k not in ("memory", "unattributed")]
SHORT = {"communication": "comm", "attention": "attn", "drafting": "draft", "launch_gaps": "gaps"}


def _delta(r) -> str:
    if r["delta_rel"] is None:
        return ""
    s = f"{100 * r['delta_rel']:+.0f}%".replace("-", MINUS)
    return s + (" REGRESSION" if r["regression"] else "")


def _commit(r) -> str:
    c = r.get("git_commit")
    return "" if not c else c[:8] + ("+" if r.get("git_dirty") else "")


def _id(r) -> str:
    """The run id, with the schema of a run saved by an older tracekit (``3 (/1)``; the warnings explain)."""
    schema = r.get("schema") or ""
    return str(r["id"]) + (f" ({schema.rsplit('breakdown', 1)[-1]})" if schema and schema != BREAKDOWN_SCHEMA else "")


def _title(h: dict) -> str:
    return f"{len(h['runs'])} runs, {len(h['regressions'])} regressions"


def history_md(h: dict) -> str:
    """Markdown for a PR or a wiki page: one row per run, regressions in bold."""
    out = [f"### tracekit history: {_title(h)}", "",
           "| id | when (UTC) | commit | trace | steps | step ms | p10–p90 | " + " | ".join(SHOWN) + " | Δ vs prev |",
           "|---:|---|---|---|---:|---:|---:|" + "---:|" * len(SHOWN) + "---|"]
    names = distinct_tails([r["path"] for r in h["runs"]])
    for r, name in zip(h["runs"], names):
        flag = "**" if r["regression"] else ""
        out.append(f"| {md(_id(r))} | {r['timestamp']} | {md(_commit(r))} | {md(name, 80)} | "
                   f"{r['step_count']} | {flag}{num(r['step_mean_ms'])}{flag} | "
                   f"{num(r['step_p10_ms'])}–{num(r['step_p90_ms'])} | "
                   + " | ".join(num(r[f"{k}_ms"]) for k in SHOWN) + f" | {flag}{_delta(r)}{flag} |")
    out += [f"- {md(w, 500)}" for w in h["warnings"]]
    return "\n".join(out) + "\n"


def render_history(h: dict, console) -> None:
    """The table (fits 80 columns: the paths and full times are listed under it), then the warnings."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    from tracekit.report.terminal import print_warnings

    t = Table(title=f"{_title(h)} (ms per step; Δ vs the previous run of the same trace)", title_justify="left",
              box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    for col in ("id", "steps", "step", *[SHORT.get(k, k) for k in SHOWN], "Δ"):
        t.add_column(col, justify="right", no_wrap=True, min_width=len(col))
    for r in h["runs"]:
        style = "bold red" if r["regression"] else ""
        t.add_row(_id(r), str(r["step_count"]), Text(num(r["step_mean_ms"], 2), style=style),
                  *[num(r[f"{k}_ms"], 2) for k in SHOWN], Text(_delta(r), style=style))
    console.print(t)
    for r in h["runs"]:
        console.print(Text(f"{r['id']}: {r['timestamp']} {_commit(r)} ") + rich_text(r["path"]))
    print_warnings(console, h["warnings"])


__all__ = ["history_md", "render_history"]
