"""Reports: render result objects; they never compute.

Every number shown in the table, markdown or CSV comes from the same dict that
``--format json`` prints, so the formats always agree.
"""

from __future__ import annotations

import json
import math


def _clean(obj):
    """JSON-safe copy: NaN/inf -> None, tuples -> lists."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def to_json(obj) -> str:
    return json.dumps(_clean(obj), indent=2, ensure_ascii=False, allow_nan=False) + "\n"


def rounded(x, nd=3):
    return None if x is None else round(float(x), nd)


def _renderers(kind: str):
    """kind -> (markdown, csv or None, terminal) renderers."""
    from tracekit.report import markdown, ranks, terminal

    return {
        "info": (markdown.info_md, None, terminal.render_info),
        "kernels": (markdown.kernels_md, markdown.kernels_csv, terminal.render_kernels),
        "breakdown": (markdown.breakdown_md, markdown.breakdown_csv, terminal.render_breakdown),
        "ranks": (ranks.ranks_md, ranks.ranks_csv, ranks.render_ranks),
    }[kind]


def render(kind: str, result, fmt: str, console_factory) -> str | None:
    """The one place a renderer is picked. Returns text for json/md/csv; prints tables to the console.

    ``result`` is the analysis' result (a dict, or an object with ``to_dict()`` whose dict JSON prints; one with
    ``report()``, such as ``CrossRank``, renders as that whole report).
    """
    if hasattr(result, "report"):
        result = result.report()
    if fmt == "json":  # before _renderers: JSON needs neither markdown nor rich
        return to_json(result.to_dict() if hasattr(result, "to_dict") else result)
    md_fn, csv_fn, table_fn = _renderers(kind)
    if fmt == "md":
        return md_fn(result)
    if fmt == "csv":
        if csv_fn is None:
            from tracekit.errors import TracekitError

            raise TracekitError(f"--format csv is not available for {kind}; use table, md or json")
        return csv_fn(result)
    table_fn(result, console_factory())
    return None
