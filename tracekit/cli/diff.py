"""``tracekit diff BASE NEW``: both traces analysed with the same options, then side by side."""

from __future__ import annotations

from pathlib import Path

import click

from tracekit.cli.options import analysis_options, output_options, side_option, side_options
from tracekit.cli.output import emit


@click.command("diff")
@click.argument("base", type=click.Path(exists=False, path_type=Path))
@click.argument("new", type=click.Path(exists=False, path_type=Path))
@analysis_options(measured=False)
@side_option("measured_step_ms", "base")
@side_option("measured_step_ms", "new")
@output_options(("table", "md", "json"))
def diff(base, new, opts, base_measured_step_ms, new_measured_step_ms, fmt, output, color):
    """Two breakdowns side by side: the reference steps, deltas per category and step statistic, advice that changed.

    Both traces are analysed with the same options; each side's unprofiled step comes from its flag, else its
    own manifest, and the headline compares the two reference steps (unprofiled where each side has one; an
    unprofiled and a traced step are not compared). A side may be a breakdown saved with `breakdown --format
    json` by this version. Example:
    tracekit diff sample_traces/hf-small-eager/trace.sqlite sample_traces/hf-small-graph/trace.sqlite.gz --format md
    """
    import tracekit

    sides = [_side(path, side_options(opts, name, measured_step_ms=ms), name)
             for path, ms, name in ((base, base_measured_step_ms, "base"), (new, new_measured_step_ms, "new"))]
    emit("diff", tracekit.diff(*sides).to_dict(), fmt, output, color)


def _side(path: Path, opts, name: str):
    """The breakdown of one side: a trace analysed with ``opts``, or a breakdown saved as JSON."""
    import tracekit
    from tracekit.errors import TracekitError
    from tracekit.results.diff import read_saved

    saved = read_saved(path)
    if saved is None:
        return tracekit.breakdown_file(path, opts)
    if opts.measured_step_ms is not None:
        raise TracekitError(f"--{name}-measured-step-ms: {path} is a saved breakdown, whose time base is fixed; "
                            "give the trace file instead")
    return saved


COMMANDS = (diff,)
