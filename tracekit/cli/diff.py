"""``tracekit diff BASE NEW``: both sides analysed with the same options, then side by side; ``--fail-on-regression``
makes it a CI gate (exit 3: failed, exit 4: inconclusive).

A side is a trace file, a breakdown saved as JSON, or a directory of rank files (several traces: analysed one per
rank and compared as a set, ``tracekit.run.ranks``). The same GPU is analysed on both sides unless told otherwise
(``tracekit.run.sides.pair_devices``). The work is ``tracekit.run.sides.diff_sides``, which ``tracekit.diff`` runs too.
"""

from __future__ import annotations

from pathlib import Path

import click

from tracekit.cli.options import analysis_options, output_options, side_option
from tracekit.cli.output import emit
from tracekit.results.diff import EXIT_GATE_FAILED, EXIT_GATE_INCONCLUSIVE  # noqa: F401  (3 and 4: docs/ci.md)
from tracekit.run.sides import pair_devices  # noqa: F401  (where it lived)


@click.command("diff")
@click.argument("base", type=click.Path(exists=False, path_type=Path))
@click.argument("new", type=click.Path(exists=False, path_type=Path))
@analysis_options(measured=False)
@side_option("measured_step_ms", "base")
@side_option("measured_step_ms", "new")
@side_option("accept_len", "base")
@side_option("accept_len", "new")
@click.option("--base-device", type=click.IntRange(min=0), default=None, metavar="N",
              help="BASE's GPU to analyse (default: --device, else BASE's busiest).")
@click.option("--new-device", type=click.IntRange(min=0), default=None, metavar="N",
              help="NEW's GPU to analyse (default: --device, else the GPU BASE analyses when NEW ran work on it).")
@click.option("--fail-on-regression", "fail_on_regression", default=None, metavar="PCT",
              help="CI gate: exit 3 when NEW's reference step (per token when the sides emit different tokens per "
                   "step) is slower than BASE's by more than PCT (e.g. 3%) and beyond the noise; exit 4 when it is "
                   "slower by more than PCT but the noise cannot tell; the output is still written in full "
                   "(docs/ci.md).")
@output_options(("table", "md", "json"))
def diff(base, new, opts, base_measured_step_ms, new_measured_step_ms, base_accept_len, new_accept_len, base_device,
         new_device, fail_on_regression, fmt, output, color):
    """Two breakdowns side by side: the reference steps, deltas per category, step statistic and kernel, advice that
    changed; with --fail-on-regression, a CI gate (exit 3 on a regression beyond the noise, 4 when it cannot tell).

    Both sides are analysed with the same options and on the same GPU; each side's unprofiled step comes from its
    flag, else its own manifest, and the headline compares the two reference steps (unprofiled where each side
    has one; an unprofiled and a traced step are not compared). When the two sides emit different tokens per step
    (accept length x batch: --base-accept-len / --new-accept-len / --accept-len, else each manifest), they are
    compared per token (ms per token, tok/s). A side may be a breakdown saved with `breakdown --format json` by
    this version, or a directory of rank files (compared as a set). Example:
    tracekit diff sample_traces/hf-small-graph/trace.sqlite.gz sample_traces/hf-small-eager/trace.sqlite
    --fail-on-regression 3% --format md
    """
    import tracekit  # noqa: F401  (the facade: its lazy imports)
    from tracekit.cli.output import load
    from tracekit.errors import TracekitError
    from tracekit.results.diff import parse_threshold
    from tracekit.run.sides import diff_sides

    if fail_on_regression is not None:
        try:
            parse_threshold(fail_on_regression)
        except TracekitError as e:
            raise click.UsageError(str(e)) from None
    d = diff_sides(base, new, opts, fail_on_regression=fail_on_regression,
                   base_changes={"measured_step_ms": base_measured_step_ms, "accept_len": base_accept_len,
                                 "device": base_device},
                   new_changes={"measured_step_ms": new_measured_step_ms, "accept_len": new_accept_len,
                                "device": new_device},
                   loader=lambda p: load(p, fmt == "json"))
    emit("diff", d.to_dict(), fmt, output, color)
    return d.exit_code


COMMANDS = (diff,)
