"""``tracekit diff BASE NEW``: both traces analysed with the same options, then side by side."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import click

from tracekit.cli.options import POSITIVE, analysis_options, output_options
from tracekit.cli.output import emit


@click.command("diff")
@click.argument("base", type=click.Path(exists=False, path_type=Path))
@click.argument("new", type=click.Path(exists=False, path_type=Path))
@analysis_options(measured=False)
@click.option("--base-measured-step-ms", type=POSITIVE, default=None, metavar="X",
              help="BASE's step time measured without a profiler (default: its manifest's).")
@click.option("--new-measured-step-ms", type=POSITIVE, default=None, metavar="X",
              help="NEW's step time measured without a profiler (default: its manifest's).")
@output_options(("table", "md", "json"))
def diff(base, new, opts, base_measured_step_ms, new_measured_step_ms, fmt, output, color):
    """Two breakdowns side by side: deltas per category and step statistic, advice that changed.

    Both traces are analysed with the same options. Example:
    tracekit diff sample_traces/hf-small-eager/trace.sqlite sample_traces/hf-small-graph/trace.sqlite.gz --format md
    """
    import tracekit

    sides = [tracekit.breakdown_file(path, dataclasses.replace(opts, measured_step_ms=ms))
             for path, ms in ((base, base_measured_step_ms), (new, new_measured_step_ms))]
    emit("diff", tracekit.diff(*sides).to_dict(), fmt, output, color)


COMMANDS = (diff,)
