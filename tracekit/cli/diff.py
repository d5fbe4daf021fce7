"""``tracekit diff BASE NEW``: both sides analysed with the same options, then side by side; ``--fail-on-regression``
makes it a CI gate (exit 3).

A side is a trace file, a breakdown saved as JSON, or a directory of rank files (several traces: analysed one per
rank and compared as a set, ``tracekit.run.ranks``). The same GPU is analysed on both sides unless told otherwise
(:func:`pair_devices`).
"""

from __future__ import annotations

from pathlib import Path

import click

from tracekit.cli.options import analysis_options, output_options, side_option, side_options
from tracekit.cli.output import emit

EXIT_GATE_FAILED = 3  # the contract's exit code of a failed gate


@click.command("diff")
@click.argument("base", type=click.Path(exists=False, path_type=Path))
@click.argument("new", type=click.Path(exists=False, path_type=Path))
@analysis_options(measured=False)
@side_option("measured_step_ms", "base")
@side_option("measured_step_ms", "new")
@click.option("--base-device", type=click.IntRange(min=0), default=None, metavar="N",
              help="BASE's GPU to analyse (default: --device, else BASE's busiest).")
@click.option("--new-device", type=click.IntRange(min=0), default=None, metavar="N",
              help="NEW's GPU to analyse (default: --device, else the GPU BASE analyses when NEW ran work on it).")
@click.option("--fail-on-regression", "fail_on_regression", default=None, metavar="PCT",
              help="CI gate: exit 3 when NEW's reference step is slower than BASE's by more than PCT (e.g. 3%) and "
                   "beyond the noise of the two sides' steps; the output is still written in full (docs/ci.md).")
@output_options(("table", "md", "json"))
def diff(base, new, opts, base_measured_step_ms, new_measured_step_ms, base_device, new_device, fail_on_regression,
         fmt, output, color):
    """Two breakdowns side by side: the reference steps, deltas per category, step statistic and kernel, advice that
    changed; with --fail-on-regression, a CI gate (exit 3 on a regression beyond the noise).

    Both sides are analysed with the same options and on the same GPU; each side's unprofiled step comes from its
    flag, else its own manifest, and the headline compares the two reference steps (unprofiled where each side
    has one; an unprofiled and a traced step are not compared). A side may be a breakdown saved with `breakdown
    --format json` by this version, or a directory of rank files (compared as a set). Example:
    tracekit diff sample_traces/hf-small-graph/trace.sqlite.gz sample_traces/hf-small-eager/trace.sqlite
    --fail-on-regression 3% --format md
    """
    import tracekit  # noqa: F401  (the facade: its lazy imports)
    from tracekit.errors import TracekitError
    from tracekit.results.diff import diff as diff_sides
    from tracekit.results.diff import parse_threshold

    threshold = None
    if fail_on_regression is not None:
        try:
            threshold = parse_threshold(fail_on_regression)
        except TracekitError as e:
            raise click.UsageError(str(e)) from None
    side_opts = {name: side_options(opts, name, measured_step_ms=ms)
                 for name, ms in (("base", base_measured_step_ms), ("new", new_measured_step_ms))}
    sides, notes = analyse_pair(base, new, side_opts["base"], side_opts["new"],
                                base_device=base_device if base_device is not None else opts.device,
                                new_device=new_device if new_device is not None else opts.device, quiet=fmt == "json")
    d = diff_sides(sides[0], sides[1], fail_on_regression=threshold,
                   labels=(str(base) if base.is_dir() else None, str(new) if new.is_dir() else None), warnings=notes)
    emit("diff", d.to_dict(), fmt, output, color)
    return EXIT_GATE_FAILED if d.failed else 0


def analyse_pair(base: Path, new: Path, base_opts, new_opts, *, base_device: int | None = None,
                 new_device: int | None = None, quiet: bool = True):
    """The two sides (a Breakdown, a saved breakdown or a rank set each) and the notes on how their devices were
    paired (:func:`pair_devices`). BASE is analysed first (its trace given back before NEW's is read), so that NEW
    can be analysed on the GPU BASE was."""
    from tracekit.cli.output import expand_traces, load
    from tracekit.errors import ConflictingOptions
    from tracekit.results.diff import read_saved
    from tracekit.run.pipeline import breakdown

    out, notes = [], []
    analysed = None  # the GPU BASE was analysed on (one trace, or a saved breakdown)
    for name, path, opts, dev in (("base", base, base_opts, base_device), ("new", new, new_opts, new_device)):
        s = read_saved(path)
        if s is not None:
            if opts.measured_step_ms is not None:
                raise ConflictingOptions(f"--{name}-measured-step-ms: {path} is a saved breakdown, whose time base is "
                                    "fixed; give the trace file instead")
            out.append(s)
            analysed = s.data["gpu"].get("device") if name == "base" else analysed
            continue
        files = expand_traces([path])
        if len(files) > 1:
            from tracekit.run.ranks import analyse_files, cross_rank

            out.append(cross_rank(analyse_files(files, side_options(opts, name, device=dev) if dev is not None
                                                else opts)))
            continue
        trace = load(files[0], quiet)
        if name == "new" and dev is None:
            dev, note = pair_devices(analysed, trace)
            notes.extend(note)
        b = breakdown(trace, **side_options(opts, name, device=dev).analysis_kwargs(), consume=True)
        del trace
        out.append(b)
        if name == "base":
            analysed = b.gpu.device
    return out, notes


def pair_devices(base_device: int | None, new_trace) -> tuple[int | None, list[str]]:
    """The GPU NEW is analysed on when no flag says, and a note when it is not BASE's: ``(device, notes)``.

    NEW analyses the GPU BASE was analysed on (``base_device``) where NEW ran work on it (issue 44: a two-GPU
    before/after pair must not compare GPU 0 with GPU 1); where it did not, NEW's busiest GPU, with a note, unless
    NEW ran work on one GPU only (a single-GPU capture on another device number: nothing to choose)."""
    from tracekit.analyses.attribution import devices_with_activity

    if base_device is None:
        return None, []
    devs = devices_with_activity(new_trace)
    if not devs:
        return None, []  # (no GPU work: the analysis says so)
    if base_device in devs:
        return base_device, []
    if len(devs) == 1:
        return int(devs[0]), []
    return int(devs[0]), [f"NEW ran no work on GPU {base_device} (the one BASE was analysed on): NEW analyses its "
                          f"busiest, GPU {devs[0]} (pass --new-device N to pick another)"]


COMMANDS = (diff,)
