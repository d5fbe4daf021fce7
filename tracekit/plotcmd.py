"""``tracekit plot`` and ``tracekit export``: pictures and a Perfetto trace of one breakdown.

Both run the same analysis as ``breakdown`` (same options) and write only the ``-o`` /
``--perfetto`` file the user names — never anything beside the input trace.
"""

from __future__ import annotations

from pathlib import Path

import click

from tracekit.cli import _breakdown_opts, _load, analysis_opts
from tracekit.errors import TracekitError

PLOT_SUFFIXES = (".png", ".svg", ".html")


def analyse(path: Path, opts: dict):
    """(Breakdown, attributed activities of the analysed steps) for ``path``."""
    import tracekit

    b = tracekit.breakdown(_load(path, True), **opts)
    return b, b.activities


def _check_output(out: Path, trace: Path, suffixes) -> None:
    if suffixes and not out.name.lower().endswith(suffixes):
        raise TracekitError(f"{out}: the output must end with {', '.join(suffixes)}")
    try:
        if out.resolve() == trace.resolve():
            raise TracekitError(f"{out}: refusing to overwrite the input trace; pick another output file")
    except OSError:
        pass


def _write(path: Path, text: str) -> None:
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as e:
        raise TracekitError(f"cannot write {path}: {e.strerror or e}")


@click.command("plot")
@click.argument("trace", type=click.Path(exists=False, path_type=Path))
@analysis_opts
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="FILE.png, FILE.svg (static, for PRs) or FILE.html (interactive, self-contained).")
def plot_command(trace, device, step_range, draft_range, weight_bytes, peak_bw, accept_len, tokens_per_step, rules,
                 device_profile, output):
    """Stacked bar of the categories for every step + a timeline of the median step.

    Example: tracekit plot sample_traces/hf-small-eager/trace.sqlite -o eager.png
    """
    from tracekit.report.plot import plot_data, render_html, render_matplotlib

    _check_output(output, trace, PLOT_SUFFIXES)
    opts = _breakdown_opts(device, step_range, draft_range, weight_bytes, peak_bw, accept_len, tokens_per_step,
                           rules, device_profile)
    b, acts = analyse(trace, opts)
    data = plot_data(b, acts)
    if output.suffix.lower() == ".html":
        _write(output, render_html(data))
    else:
        try:
            render_matplotlib(data, output)
        except OSError as e:
            raise TracekitError(f"cannot write {output}: {e.strerror or e}")
    click.echo(f"wrote {output} ({b.steps['count']} steps; timeline of step {data.step})", err=True)


@click.command("export")
@click.argument("trace", type=click.Path(exists=False, path_type=Path))
@analysis_opts
@click.option("--perfetto", "perfetto", type=click.Path(dir_okay=False, path_type=Path), required=True,
              metavar="OUT.json", help="Chrome-trace JSON to open in ui.perfetto.dev.")
def export_command(trace, device, step_range, draft_range, weight_bytes, peak_bw, accept_len, tokens_per_step,
                   rules, device_profile, perfetto):
    """Write the steps and categories as Perfetto tracks (Chrome-trace JSON).

    Example: tracekit export sample_traces/hf-small-eager/trace.sqlite --perfetto eager.perfetto.json
    """
    from tracekit.export import write_perfetto

    _check_output(perfetto, trace, (".json",))
    opts = _breakdown_opts(device, step_range, draft_range, weight_bytes, peak_bw, accept_len, tokens_per_step,
                           rules, device_profile)
    b, acts = analyse(trace, opts)
    try:
        counts = write_perfetto(b, acts, perfetto)
    except OSError as e:
        raise TracekitError(f"cannot write {perfetto}: {e.strerror or e}")
    summary = ", ".join(f"{k} {v}" for k, v in counts.items())
    click.echo(f"wrote {perfetto}: {summary} events; open it in https://ui.perfetto.dev", err=True)


def _ensure_registered():
    from tracekit import cli as _cli

    for cmd in (plot_command, export_command):
        if cmd.name not in _cli.cli.commands:
            _cli.cli.add_command(cmd)


_ensure_registered()
