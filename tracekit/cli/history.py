"""``tracekit history DB``: the runs saved with ``breakdown --save DB``, regressions flagged."""

from __future__ import annotations

from pathlib import Path

import click

from tracekit.cli.options import output_options
from tracekit.cli.output import emit


@click.command("history")
@click.argument("db", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--path-contains", default=None, metavar="TEXT", help="Only runs whose trace path contains TEXT.")
@click.option("--last", type=click.IntRange(min=1), default=None, metavar="N", help="Only the last N runs.")
@output_options(("table", "md", "json"))
def history(db, path_contains, last, fmt, output, color):
    """Step time and categories over the runs saved with `breakdown --save DB`; regressions flagged.

    Example: tracekit breakdown run.sqlite --save runs.db && tracekit history runs.db
    """
    import tracekit

    emit("history", tracekit.history(db, path_contains=path_contains, last=last), fmt, output, color)


COMMANDS = (history,)
