"""Renderers of several ranks analysed together (``CrossRank.report()``): the cross-rank headline first, then
the per-rank table, then the collectives table. Markdown is made to be pasted into a pull request; every
name that comes from a trace (kernel names, paths, labels) goes through ``report.safe``.

They render the report dict that ``--format json`` prints, so every format shows the same numbers.
"""

from __future__ import annotations

import csv
import io

from tracekit.report.safe import md, md_code, plain, rich_text
from tracekit.text import num, size

# (header, cross_rank list key or callable over (cross_rank, i), digits)
_RANK_COLS = (
    ("step", "step_ms_by_rank", 3),
    ("exposed", "exposed_communication_ms_by_rank", 3),
    ("comm k", "comm_kernel_ms_by_rank", 3),
    ("wait", "wait_ms_by_rank", 3),
    ("last", "last_arrival_share_by_rank", None),
    ("hidden", "hidden_communication_ms_by_rank", 3),
    ("offset", "clock_offset_ms_by_rank", 3),
)
_COLL_COLS = (
    ("kind", "kind"), ("impl", "implementation"), ("n/step", "count_per_step"), ("bytes", "bytes"),
    ("ms", "ms_per_step"), ("xfer", "transfer_ms"), ("skew", "skew_ms"), ("algbw", "algbw_gbps"),
    ("busbw", "busbw_gbps"), ("link", "link_gbps"), ("lat-bound", "latency_bound"),
)


def _rank_cells(cr: dict, label: str, i: int) -> list[str]:
    cells = [label]
    for _, key, nd in _RANK_COLS:
        values = cr.get(key)
        v = values[i] if values else None
        if nd is None:
            cells.append("—" if v is None else f"{100 * v:.0f}%")
        else:
            cells.append(num(v, nd))
    return cells


def _coll_cells(row: dict) -> list[str]:
    out = []
    for _, key in _COLL_COLS:
        v = row.get(key)
        if key == "bytes":
            out.append(size(v))
        elif key == "latency_bound":
            out.append(("yes" + ("*" if row.get("latency_bound_basis") == "time" else "")) if v else "no")
        elif key in ("kind", "implementation"):
            out.append("" if v is None else str(v).replace("_", "-") if key == "kind" else str(v))
        elif key == "count_per_step":
            out.append(num(v, 1))
        elif key.endswith("_gbps"):
            out.append(num(v, 1))
        else:
            out.append(num(v))
    return out


def _cross(report: dict) -> dict:
    """The cross_rank object with its extension figures (``cross_rank_detail``)."""
    return {**(report.get("cross_rank_detail") or {}), **report["cross_rank"]}


def _labels(report: dict) -> list[str]:
    return [str(row[0]) for row in report["table"]]


def _lever_lines(report: dict) -> tuple[str | None, list[str]]:
    """The rank set's levers besides communication (``report["levers"]``): a title naming whose verdicts they are,
    and one line per lever, each with every rank's saving where they differ."""
    levers = report.get("levers") or []
    if not levers:
        return None, []
    labels = _labels(report)
    lines = []
    for x in levers:
        savings = x["max_saving_ms_by_rank"]
        per_rank = ""
        if any(v is not None for v in savings) and len({None if v is None else round(v, 3) for v in savings}) > 1:
            per_rank = " [saving by rank: " + ", ".join(f"{label} {num(v)}" for label, v in zip(labels, savings)) + " ms]"
        text = plain(x["verdict"], 2000) + per_rank
        if text not in lines:  # (one verdict for several levers, e.g. "no decode advice": said once)
            lines.append(text)
    why = _WHY.get(_cross(report).get("saving_rank_is"), _WHY["longest_step"])
    return f"Levers on rank {plain(levers[0]['rank'], 40)} ({why}; communication: above):", lines


# why the levers are those of that rank (``cross_rank_detail.saving_rank_is``): the one rank the report singles out
_WHY = {"pacing": "it sets the pace: the others wait for it",
        "least_wait": "no single rank sets the pace; it waits least, so the others wait for it most",
        "longest_step": "the longest step; no collectives matched across ranks"}


def ranks_md(report: dict) -> str:
    cr = _cross(report)
    labels = _labels(report)
    out = [f"**{md(cr['verdict'], 2000)}**", ""]
    title, lines = _lever_lines(report)
    if title:
        out += [md(title, 200), ""] + [f"- {md(line, 3000)}" for line in lines] + [""]
    heads = ["rank"] + [h for h, _, _ in _RANK_COLS]
    out += ["| " + " | ".join(heads) + " |", "|---" + "|---:" * (len(heads) - 1) + "|"]
    for i, label in enumerate(labels):
        out.append("| " + " | ".join([md(label, 40)] + _rank_cells(cr, label, i)[1:]) + " |")
    out.append("")
    out.append(f"ms per step over {cr.get('steps')} step(s). *exposed*: communication no compute hides; *comm k*: "
               "communication kernel time (serialised on its stream); *wait*: from a rank's arrival at a collective "
               "to the last rank's; *transfer* (the same on every rank): " + num(cr.get("transfer_ms")) + " ms; "
               "*last*: share of collectives the rank reaches last; *hidden*: communication overlapped by compute "
               "on other streams; *offset*: clock offset aligned on collective ends.")
    if cr.get("collectives"):
        out += ["", "Collectives (ms per step; *xfer*, *algbw*, *busbw*: from the transfer on the last-arriving "
                "rank; bus bandwidth in NCCL's convention; *lat-bound*: latency-bound, * = judged from the call "
                "time where the size is unknown):",
                "", "| " + " | ".join(h for h, _ in _COLL_COLS) + " | kernel |",
                "|---|---" + "|---:" * (len(_COLL_COLS) - 2) + "|---|"]
        for row in cr["collectives"]:
            cells = _coll_cells(row)
            cells[0] = md(cells[0], 40)
            cells[1] = md(cells[1], 40)
            out.append("| " + " | ".join(cells) + f" | {md_code(row.get('kernel'), 80)} |")
    if cr.get("communicator_evidence"):
        out += ["", f"Communicator size {cr.get('communicator_size') or '—'}: {md(cr['communicator_evidence'], 300)}."]
    warnings = report.get("warnings") or []
    if warnings:
        out.append("")
        out += [f"- {md(w, 500)}" for w in warnings]
    out += ["", "<details><summary>files</summary>", ""]
    out += [f"- rank {md(label, 40)}: {md_code(row[1], 300, table=False)}" for label, row in zip(labels, report["table"])]
    out += ["", "</details>"]
    return "\n".join(out) + "\n"


def ranks_csv(report: dict) -> str:
    """One row per rank: the per-rank table (``columns``/``table``) plus the cross-rank figures of that rank."""
    cr = _cross(report)
    extra = [key for _, key, _ in _RANK_COLS if key not in ("step_ms_by_rank",)]
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(list(report["columns"]) + extra)
    for i, row in enumerate(report["table"]):
        cells = [_csv_safe(v) if isinstance(v, str) else ("" if v is None else v) for v in row]
        for key in extra:
            values = cr.get(key)
            v = values[i] if values else None
            cells.append("" if v is None else v)
        w.writerow(cells)
    return buf.getvalue()


def _csv_safe(v: str) -> str:
    text = plain(v)
    return "'" + text if text[:1] in ("=", "+", "-", "@") else text


def render_ranks(report: dict, console) -> None:
    from rich import box
    from rich.table import Table
    from rich.text import Text

    cr = _cross(report)
    labels = _labels(report)
    from tracekit.report.terminal import full_names, line, print_warnings, print_wide, sentence

    sentence(console, cr["verdict"], style="bold")
    console.print()
    title, levers = _lever_lines(report)
    if title:
        console.print(Text(title, style="bold"))
        for lever in levers:
            sentence(console, lever, "• ")
        console.print()
    t = Table(title=f"per rank (ms per step over {cr.get('steps')} steps; transfer {num(cr.get('transfer_ms'))} ms on "
                    "every rank)", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1))
    t.add_column("rank", no_wrap=True)
    for head, _, _ in _RANK_COLS:
        t.add_column(head, justify="right", no_wrap=True)
    for i, label in enumerate(labels):
        cells = _rank_cells(cr, label, i)
        t.add_row(rich_text(label, 40), *cells[1:])
    console.print(t)
    if cr.get("collectives"):
        first = cr["collectives"][0]
        link = (f"; link {num(first.get('link_gbps'), 0)} GB/s {first.get('link') or ''}"
                if first.get("link_gbps") else "")
        c = Table(title=f"collectives (ms per step; bandwidths GB/s from the transfer{link})", title_justify="left",
                  box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1), collapse_padding=True)
        cols = [(h, k) for h, k in _COLL_COLS if k != "link_gbps"]
        # never a word cut in two ("all-redu/ce"): the kind whole, the implementation cut with an ellipsis where
        # the terminal is narrow; piped, the table at the width it needs
        for i, (head, _) in enumerate(cols):
            c.add_column(head, justify="left" if i < 2 else "right", no_wrap=True,
                         overflow="ellipsis" if i == 1 else "fold", min_width=14 if i == 0 else None)
        for row in cr["collectives"]:
            cells = [cell for cell, (_, k) in zip(_coll_cells(row), _COLL_COLS) if k != "link_gbps"]
            c.add_row(rich_text(cells[0], 40), rich_text(cells[1], 40), *cells[2:])
        (print_wide if full_names(console) else type(console).print)(console, c)
    if cr.get("communicator_evidence"):
        sentence(console, cr["communicator_evidence"], f"communicator size {cr.get('communicator_size') or '—'}: ")
    for label, row in zip(labels, report["table"]):
        line(console, Text(f"rank {plain(label, 40)}: ") + rich_text(row[1]))
    print_warnings(console, report.get("warnings") or [])
