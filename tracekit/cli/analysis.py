"""``tracekit info``, ``tracekit kernels`` and ``tracekit breakdown``: one trace (or one per rank) in, one report out.

Each command is load, one library call (``tracekit.info`` / ``kernels`` / ``breakdown_file``), ``emit``.
Several files (or a directory of rank files) give one result per rank plus the cross-rank table of
``tracekit.run.ranks``; ``breakdown`` runs the per-file stage on ``--engine`` (``tracekit.run.engines``).
"""

from __future__ import annotations

from pathlib import Path

import click

from tracekit.cli.options import analysis_options, device_option, output_options, rules_option, trace_arguments
from tracekit.cli.output import beside_renderer_import, emit, expand_traces, load
from tracekit.errors import ConflictingOptions


@click.command()
@trace_arguments
@device_option("Restrict counts to this GPU (default: all).")
@output_options(("table", "md", "json"))
def info(traces, device, fmt, output, color):
    """What is in a trace: producer, GPUs, counts, graph mode, step candidates.

    Example: tracekit info sample_traces/hf-small-eager/trace.sqlite
    """
    import tracekit

    files = expand_traces(traces)
    results = [tracekit.info(load(p, fmt == "json"), device=device) for p in files]
    if len(files) == 1:
        emit("info", results[0], fmt, output, color)
    else:
        from tracekit.run.ranks import info_ranks

        emit("info", info_ranks(results), fmt, output, color)


@click.command()
@trace_arguments
@device_option("Restrict to this GPU (default: all GPUs).")
@click.option("--top", type=click.IntRange(min=1), default=None, help="Show only the N largest (default: all).")
@rules_option
@click.option("--wide", is_flag=True,
              help="Whole kernel names in the table on a terminal too (piped or -o FILE, they are always whole).")
@output_options()
def kernels(traces, device, top, rules, wide, fmt, output, color):
    """Every kernel name: category, count, total, mean, median, min, max, stddev, share.

    Totals and statistics are over all GPUs unless --device is given, and computed as `nsys stats --report
    cuda_gpu_kern_sum` computes them (median of an even count: the mean of the middle two; sample standard
    deviation, 0 for one instance). Names no rule matches are flagged. On a terminal narrower than 150
    columns the table leaves the four statistics out (--wide, piped, md, csv and json always have them).
    """
    import tracekit

    files = expand_traces(traces)
    if len(files) == 1:
        emit("kernels", tracekit.kernels(load(files[0], fmt == "json"), device=device, top=top, rules=rules), fmt,
             output, color, wide)
        return
    from tracekit.run.ranks import kernels_ranks

    # the cross-rank totals are over every kernel; --top only shortens each rank's list
    full = [tracekit.kernels(load(p, fmt == "json"), device=device, rules=rules) for p in files]
    multi = kernels_ranks(full, files)
    if top is not None:
        multi["ranks"] = [{**r, "kernels": r["kernels"][:top]} for r in multi["ranks"]]
    emit("kernels", multi, fmt, output, color, wide)


@click.command()
@trace_arguments
@analysis_options(engine=True)
@click.option("--save", type=click.Path(dir_okay=False, path_type=Path), default=None, metavar="RUNS.DB",
              help="Append the result to a SQLite run history (see `tracekit history`).")
@output_options()
def breakdown(traces, opts, save, fmt, output, color):
    """Per-decode-step time split, memory-bandwidth roofline and advice.

    Several files (or a directory of rank files) are analysed one per rank, on --engine, and compared: one
    cross-rank verdict (pacing rank, skew against transfer, the collectives). Example:
    tracekit breakdown sample_traces/hf-small-eager/trace.sqlite --format md
    """
    import tracekit

    files = expand_traces(traces)
    if opts.engine is not None and (len(files) == 1 or opts.all_devices):
        click.echo("warning: --engine places the per-file work of several trace files; this one trace is analysed "
                   "in this process", err=True)
    if opts.all_devices:
        if len(files) != 1:
            raise ConflictingOptions("--all-devices takes one trace file")
        from tracekit.run.ranks import analyse_devices

        results, labels = analyse_devices(load(files[0], True), opts)
    elif len(files) == 1:
        import tracekit.cli.app as app
        from tracekit.readers import head_start

        if app.OWN_PROCESS:
            _one_thread_for_a_small_trace(files[0])

        # (the big scans, or a big Kineto trace's second reader, begin before polars and rich are imported)
        with head_start(files[0], kernel_dims=False, own_process=app.OWN_PROCESS):
            result = beside_renderer_import(
                lambda: tracekit.breakdown_file(files[0], opts, own_process=app.OWN_PROCESS), fmt)
        if save is not None:
            from tracekit.run.history import save_runs

            save_runs(save, [result])
        emit("breakdown", result, fmt, output, color)
        return
    else:
        from tracekit.run.ranks import analyse_files

        results, labels = analyse_files(files, opts, fmt=fmt), None
    from tracekit.run.ranks import cross_rank

    cr = cross_rank(results, labels)
    if save is not None:
        from tracekit.run.history import save_runs

        # each rank as the cross-rank analysis left it (its advice.communication from the matched transfer)
        save_runs(save, cr.rank_breakdowns)
    emit("ranks", cr, fmt, output, color)


# A trace file smaller than this is analysed on one polars thread by the command line (its own process): on frames
# of a few thousand rows the pool's hand-offs cost more CPU than the parallel work saves (hf-small-eager, 3.7 MB:
# ~4% less CPU, no slower). A user's own POLARS_MAX_THREADS is kept.
SMALL_TRACE_BYTES = 8 << 20


def _one_thread_for_a_small_trace(path: Path) -> None:
    """Before polars is imported: one polars thread for a small trace file (:data:`SMALL_TRACE_BYTES`)."""
    import os
    import sys

    try:
        small = path.stat().st_size < SMALL_TRACE_BYTES
    except OSError:
        return
    if small and "polars" not in sys.modules:
        os.environ.setdefault("POLARS_MAX_THREADS", "1")


COMMANDS = (info, kernels, breakdown)
