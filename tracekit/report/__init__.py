"""Reports: render result objects; they never compute.

Every number shown in the table, markdown or CSV comes from the same dict that
``--format json`` prints, so the formats always agree. :func:`render` is the one place a
renderer is picked, for every command: ``terminal`` and ``markdown`` (info, kernels,
breakdown, ranks), ``diff``, ``history``, ``ceiling``, ``perfetto`` (``export``) and ``plot``
(pictures, drawn to a file by ``tracekit.report.plot``). Renderers take the rich console they
print to, so tests print into a ``StringIO``.
"""

from __future__ import annotations

from tracekit.contract import to_json  # the one JSON writer (re-exported: report.to_json)

# kind -> (module, markdown renderer, csv renderer, terminal renderer); names resolved on first use, so
# importing this package imports neither rich nor polars.
_RENDERERS = {
    "info": ("markdown", "info_md", None, "terminal.render_info"),
    "kernels": ("markdown", "kernels_md", "kernels_csv", "terminal.render_kernels"),
    "breakdown": ("markdown", "breakdown_md", "breakdown_csv", "terminal.render_breakdown"),
    "ranks": ("ranks", "ranks_md", "ranks_csv", "ranks.render_ranks"),
    "diff": ("diff", "diff_md", None, "diff.render_diff"),
    "history": ("history", "history_md", None, "history.render_history"),
    "ceiling": ("ceiling", "render_markdown", None, "ceiling.render_table"),
    "stats": ("stats", "stats_md", "stats_csv", "stats.render_stats"),
}
KINDS = (*_RENDERERS, "perfetto")


def _fn(dotted: str | None, module: str):
    if dotted is None:
        return None
    import importlib

    mod, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(f"tracekit.report.{mod or module}"), name)


def render(kind: str, result, fmt: str, console_factory=None) -> str | None:
    """The one place a renderer is picked. Returns text for json/md/csv; prints tables to the console
    ``console_factory()`` makes (and returns None).

    ``result`` is the analysis' result (a dict, or an object with ``to_dict()`` whose dict JSON prints; one with
    ``report()``, such as ``CrossRank``, renders as that whole report).
    ``kind`` is one of :data:`KINDS`; ``perfetto`` takes a breakdown and has only the ``json`` format (the
    Chrome-trace file).

    >>> render("info", {"schema": "tracekit.info/1", "warnings": []}, "json")
    '{\\n  "schema": "tracekit.info/1",\\n  "warnings": []\\n}\\n'
    """
    from tracekit.errors import BadOptionValue

    if kind == "perfetto":
        from tracekit.report.perfetto import perfetto_json

        return perfetto_json(result)
    if hasattr(result, "report"):
        result = result.report()
    if kind not in _RENDERERS:
        raise ValueError(f"unknown report kind {kind!r}; one of {', '.join(KINDS)}")
    if fmt == "json":  # before the renderers: JSON needs neither markdown nor rich
        return to_json(result)
    module, md_name, csv_name, table_name = _RENDERERS[kind]
    if fmt == "md":
        return _fn(md_name, module)(result)
    if fmt == "csv":
        if csv_name is None:
            raise BadOptionValue(f"--format csv is not available for {kind}; use table, md or json")
        return _fn(csv_name, module)(result)
    if fmt != "table":
        raise BadOptionValue(f"--format {fmt}: use table, md, json or csv")
    _fn(table_name, module)(result, console_factory())
    return None
