"""Renderers of ``tracekit history`` (schema ``tracekit.history/2``): the rich table and stable markdown.

Both read the dict :func:`tracekit.run.history.history` returns (the ``--format json`` output). The step shown and
compared is each run's *reference step* (unprofiled where known), marked with its source; the traced mean and
the categories (shares of the traced step) beside it. Traces are shown by the shortest tail of their path that
tells them apart (every capture names its file ``trace.sqlite``); the table lists the full paths under it.
"""

from __future__ import annotations

from tracekit.categories import STEP_CATEGORIES
from tracekit.report.safe import md, rich_text
from tracekit.text import MINUS, distinct_tails, num

SHOWN = [k for k in STEP_CATEGORIES if k not in ("memory", "unattributed")]
SHORT = {"communication": "comm", "attention": "attn", "drafting": "draft", "launch_gaps": "gaps"}
# the reference step's source, one letter in the table (the legend under it spells them out)
MARK = {"manifest": "m", "flag": "f", "traced": "t"}
LEGEND = ("step: the reference step, m = unprofiled (the capture's manifest), f = unprofiled (--measured-step-ms / "
          "--measured-tok-s), t = traced (no unprofiled time); Δ compares runs of the same trace and source")


def _delta(r) -> str:
    if r.get("delta_rel") is None:
        return ""
    s = f"{100 * r['delta_rel']:+.0f}%".replace("-", MINUS)
    return s + (" REGRESSION" if r["regression"] else "")


def _commit(r) -> str:
    c = r.get("git_commit")
    return "" if not c else c[:8] + ("+" if r.get("git_dirty") else "")


def _id(r, h: dict) -> str:
    """The run id, with the schema of a run saved by an older tracekit (``3 (/1)``; the warnings explain)."""
    schema = r.get("schema") or ""
    old = schema and schema != h.get("breakdown_schema")
    return str(r["id"]) + (f" ({schema.rsplit('breakdown', 1)[-1]})" if old else "")


def _step(r, nd: int = 3) -> str:
    """The reference step with its source's letter: ``36.670 m``."""
    return f"{num(r.get('reference_step_ms'), nd)} {MARK.get(r.get('reference_source'), '?')}"


def _title(h: dict) -> str:
    return f"{len(h['runs'])} runs, {len(h['regressions'])} regressions"


def history_md(h: dict) -> str:
    """Markdown for a PR or a wiki page: one row per run, regressions in bold."""
    out = [f"### tracekit history: {_title(h)}", "",
           "| id | when (UTC) | commit | trace | steps | step ms | traced ms | traced p10–p90 | " + " | ".join(SHOWN)
           + " | Δ vs prev |",
           "|---:|---|---|---|---:|---:|---:|---:|" + "---:|" * len(SHOWN) + "---|"]
    names = distinct_tails([r["path"] for r in h["runs"]])
    for r, name in zip(h["runs"], names):
        flag = "**" if r["regression"] else ""
        out.append(f"| {md(_id(r, h))} | {r['timestamp']} | {md(_commit(r))} | {md(name, 80)} | "
                   f"{r['step_count']} | {flag}{_step(r)}{flag} | {num(r['step_mean_ms'])} | "
                   f"{num(r['step_p10_ms'])}–{num(r['step_p90_ms'])} | "
                   + " | ".join(num(r[f"{k}_ms"]) for k in SHOWN) + f" | {flag}{_delta(r)}{flag} |")
    out += [f"- {md(w, 500)}" for w in [LEGEND, *h["warnings"]]]
    return "\n".join(out) + "\n"


def render_history(h: dict, console) -> None:
    """The table (fits 80 columns: the paths and full times are listed under it, and categories no run has are
    left out), then the legend and the warnings."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    from tracekit.report.terminal import print_warnings

    t = Table(title=f"{_title(h)} (ms per step; Δ vs the previous run of the same trace and source)", title_justify="left",
              box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    # (a category no run has is left out, and the step count: the table must fit 80 columns; md and JSON keep them)
    shown = [k for k in SHOWN if any(r[f"{k}_ms"] for r in h["runs"])]
    for col in ("id", "step", "traced", *[SHORT.get(k, k) for k in shown], "Δ"):
        t.add_column(col, justify="right", no_wrap=True, min_width=len(col))
    for r in h["runs"]:
        style = "bold red" if r["regression"] else ""
        t.add_row(_id(r, h), Text(_step(r, 2), style=style), num(r["step_mean_ms"], 2),
                  *[num(r[f"{k}_ms"], 2) for k in shown], Text(_delta(r), style=style))
    console.print(t)
    console.print(Text(LEGEND), style="italic")
    for r in h["runs"]:
        console.print(Text(f"{r['id']}: {r['timestamp']} {_commit(r)} ") + rich_text(r["path"]))
    print_warnings(console, h["warnings"])


__all__ = ["history_md", "render_history"]
