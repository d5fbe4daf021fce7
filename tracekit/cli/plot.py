"""``tracekit plot`` and ``tracekit export``: a picture and a Perfetto trace of one breakdown.

Both run the same analysis as ``breakdown`` (same options) and write only the ``-o`` /
``--perfetto`` file the user names, never anything beside the input trace.
"""

from __future__ import annotations

from pathlib import Path

import click

from tracekit.cli.options import analysis_options
from tracekit.cli.output import check_output, write_text
from tracekit.errors import CannotWrite

PLOT_SUFFIXES = (".png", ".svg", ".html")


def _import_matplotlib() -> bool:
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.backends.backend_agg  # noqa: F401
    import matplotlib.figure  # noqa: F401

    return True


@click.command("plot")
@click.argument("trace", type=click.Path(exists=False, path_type=Path))
@analysis_options
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="FILE.png, FILE.svg (static, for PRs) or FILE.html (interactive, self-contained).")
def plot(trace, opts, output):
    """Stacked bar of the categories for every step + a timeline of the median step.

    Example: tracekit plot sample_traces/hf-small-eager/trace.sqlite -o eager.png
    """
    import polars  # noqa: F401  (first, in this thread: the import below runs beside the analysis)

    import tracekit
    from tracekit.parallel import in_threads
    from tracekit.report.plot import plot_data, render_html, render_matplotlib

    check_output(output, trace, PLOT_SUFFIXES)
    html = output.suffix.lower() == ".html"
    # matplotlib takes ~0.7 s to import; SQLite reads and polars release the GIL, so on a second core the
    # import overlaps the analysis (benchmarks/startup.py)
    b, _ = in_threads(lambda: tracekit.breakdown_file(trace, opts), lambda: html or _import_matplotlib())
    data = plot_data(b, b.activities)
    if html:
        write_text(render_html(data), output)
    else:
        try:
            render_matplotlib(data, output)
        except OSError as e:
            raise CannotWrite(f"cannot write {output}: {e.strerror or e}") from None
    click.echo(f"wrote {output} ({b.steps['count']} steps; timeline of step {data.step})", err=True)


@click.command("export")
@click.argument("trace", type=click.Path(exists=False, path_type=Path))
@analysis_options
@click.option("--perfetto", "perfetto", type=click.Path(dir_okay=False, path_type=Path), required=True,
              metavar="OUT.json", help="Chrome-trace JSON to open in ui.perfetto.dev.")
def export(trace, opts, perfetto):
    """Write the trace to Perfetto (Chrome-trace JSON): every original event (kernels, memcpy/memset, graph
    executions, CUDA API calls, ranges, ops, launch flows) plus tracekit's steps, categories and gaps as tracks.

    Example: tracekit export sample_traces/hf-small-eager/trace.sqlite --perfetto eager.perfetto.json
    """
    from tracekit.cli.output import load
    from tracekit.report.perfetto import write_perfetto
    from tracekit.run.pipeline import breakdown
    from tracekit.run.stats import host_calls

    check_output(perfetto, trace, (".json",))
    t = load(trace, True)
    b = breakdown(t, opts)
    try:
        counts = write_perfetto(perfetto, b, t, host_calls(t))
    except OSError as e:
        raise CannotWrite(f"cannot write {perfetto}: {e.strerror or e}") from None
    kept = ", ".join(f"{n:,} {k.replace('_', ' ')}" for k, n in counts.items() if k != "tracekit" and n)
    click.echo(f"wrote {perfetto}: {b.steps['count']} steps, {counts['tracekit']} tracekit events; the trace's own "
               f"events kept: {kept or 'none'}; open it in https://ui.perfetto.dev", err=True)


COMMANDS = (plot, export)
