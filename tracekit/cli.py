"""The ``tracekit`` command line: parse options, call the library, pick a renderer.

Commands are thin: load, one library call, ``emit``. Errors users can cause are
``TracekitError`` (and click usage errors) and become exactly one line on stderr,
``tracekit: error: ...``, exit 2; anything else is an internal error, exit 1
(``--debug`` shows the traceback). polars is imported lazily so that
``tracekit capture`` runs on a GPU host that has only torch and click.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from tracekit import __version__
from tracekit.errors import TracekitError

FORMATS = ("table", "md", "json", "csv")
TRACE_SUFFIXES = (".sqlite", ".json", ".json.gz", ".nsys-rep")
NOT_TRACES = {"manifest.json", "device_profile.json", "index.json", "workload_facts.json"}


def _one_line(msg: str) -> str:
    return " ".join(str(msg).split())


class TracekitGroup(click.Group):
    """A click group whose errors are one line and whose exit codes follow the contract."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        argv = list(sys.argv[1:] if args is None else args)
        debug = "--debug" in argv or os.environ.get("TRACEKIT_DEBUG") == "1"
        try:
            rv = super().main(args=argv, prog_name=prog_name or "tracekit", complete_var=complete_var,
                              standalone_mode=False, **extra)
        except click.exceptions.Exit as e:  # pragma: no cover - click converts these itself
            sys.exit(e.exit_code)
        except click.exceptions.Abort:
            click.echo("tracekit: error: aborted", err=True)
            sys.exit(130)
        except click.UsageError as e:
            if debug:
                raise
            hint = f" (see `tracekit {e.ctx.command_path.split(' ', 1)[1]} --help`)" if e.ctx and " " in (
                e.ctx.command_path or "") else " (see `tracekit --help`)"
            click.echo(f"tracekit: error: {_one_line(e.format_message())}{hint}", err=True)
            sys.exit(2)
        except click.ClickException as e:
            if debug:
                raise
            click.echo(f"tracekit: error: {_one_line(e.format_message())}", err=True)
            sys.exit(2)
        except TracekitError as e:
            if debug:
                raise
            click.echo(f"tracekit: error: {_one_line(e)}", err=True)
            sys.exit(2)
        except BrokenPipeError:  # `tracekit kernels x | head`
            sys.exit(0)
        except KeyboardInterrupt:
            click.echo("tracekit: error: interrupted", err=True)
            sys.exit(130)
        except Exception as e:  # noqa: BLE001 - the last line of defence
            if debug:
                raise
            click.echo(f"tracekit: internal error: {type(e).__name__}: {_one_line(e)[:300]} "
                       "(rerun with --debug for the traceback, and please report it)", err=True)
            sys.exit(1)
        sys.exit(rv if isinstance(rv, int) else 0)


@click.group(cls=TracekitGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="tracekit")
@click.option("--debug", is_flag=True, help="Show Python tracebacks instead of one-line errors.")
def cli(debug):
    """Where every microsecond of an LLM decode step goes.

    \b
    tracekit info TRACE        what is in a trace (nsys .sqlite, Kineto .json[.gz])
    tracekit breakdown TRACE   per-step time split, roofline and advice
    tracekit kernels TRACE     every kernel with its category
    tracekit diff BASE NEW     two breakdowns side by side
    tracekit ceiling ...       the tok/s ceiling without a trace
    tracekit capture ...       (GPU host) capture a decode loop under nsys / torch profiler
    """


# ───────────────────────────── shared options ─────────────────────────────

def _format_option(choices=FORMATS):
    return click.option("--format", "fmt", type=click.Choice(choices), default="table", show_default=True,
                        help="Output format.")


def output_options(choices=FORMATS):
    def deco(fn):
        for opt in reversed([
            _format_option(choices),
            click.option("-o", "--output", type=click.Path(dir_okay=False, writable=True, path_type=Path),
                         help="Write there instead of stdout."),
            click.option("--color/--no-color", default=None, help="Colour in the table (default: auto; NO_COLOR)."),
        ]):
            fn = opt(fn)
        return fn
    return deco


trace_arguments = click.argument("traces", nargs=-1, required=True,
                                 type=click.Path(exists=False, path_type=Path), metavar="TRACE...")

analysis_options = [
    click.option("--device", type=int, default=None, help="GPU to analyse (default: the busiest)."),
    click.option("--step-range", default=None, metavar="REGEX",
                 help="Range names (NVTX / torch annotations) that mark a decode step (Python re.search)."),
    click.option("--draft-range", default=r"(?i)\bdraft", show_default=True, metavar="REGEX",
                 help="Range names whose GPU work is drafting."),
    click.option("--weight-bytes", type=click.IntRange(min=1), default=None, metavar="N",
                 help="Parameter bytes a step reads (default: manifest, else the trace)."),
    click.option("--peak-bw", type=click.FloatRange(min=0, min_open=True), default=None, metavar="GBPS",
                 help="Peak memory bandwidth in GB/s (default: manifest > trace > GPU table)."),
    click.option("--accept-len", type=click.FloatRange(min=0, min_open=True), default=None, metavar="X",
                 help="Mean tokens accepted per speculative step."),
    click.option("--tokens-per-step", type=click.FloatRange(min=0, min_open=True), default=None, metavar="N",
                 help="Tokens a step produces without speculation (batch size; default 1 or the manifest's)."),
    click.option("--rules", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
                 help="Extra kernel-classification rules (TOML), tried before the shipped ones."),
    click.option("--device-profile", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
                 help="Device profile JSON from `tracekit capture --workload synthetic` (graph replay cost)."),
]


def analysis_opts(fn):
    for opt in reversed(analysis_options):
        fn = opt(fn)
    return fn


def expand_traces(paths) -> list[Path]:
    """Files as given; a directory contributes its trace files (one per rank), sorted."""
    out: list[Path] = []
    for p in paths:
        if p.is_dir():
            # capture side files are not traces; an .nsys-rep whose SQLite export is there is the same trace
            files = sorted(f for f in p.iterdir() if f.is_file() and f.name.endswith(TRACE_SUFFIXES)
                           and f.name not in NOT_TRACES
                           and not (f.suffix == ".nsys-rep" and f.with_suffix(".sqlite").exists()))
            if not files:
                raise TracekitError(f"{p}: directory holds no trace files ({', '.join(TRACE_SUFFIXES)})")
            out.extend(files)
        else:
            out.append(p)
    return out


def _console(output, color):
    from rich.console import Console

    if output is not None:
        return Console(file=open(output, "w", encoding="utf-8"), width=160, color_system=None, soft_wrap=False)
    no_color = (color is False) or (color is None and bool(os.environ.get("NO_COLOR")))
    return Console(no_color=no_color, force_terminal=True if color else None, soft_wrap=False)


def emit_text(text: str, output: Path | None):
    if output is None:
        click.echo(text, nl=False)
    else:
        try:
            output.write_text(text, encoding="utf-8")
        except OSError as e:
            raise TracekitError(f"cannot write {output}: {e.strerror or e}")


def emit(kind: str, result, fmt: str, output: Path | None, color) -> None:
    from tracekit.report import render

    text = render(kind, result, fmt, lambda: _console(output, color))
    if text is not None:
        emit_text(text, output)


def _load(path: Path, quiet: bool):
    """Load for an analysis command, with a transient progress line on a terminal (never with --format json)."""
    import tracekit
    from tracekit.progress import status

    with status(f"reading {path.name}", fmt="json" if quiet else "table"):
        return tracekit.load(path, kernel_dims=False)


def _read_json_file(path: Path | None, what: str):
    if path is None:
        return None
    import json

    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise TracekitError(f"{path}: unreadable {what} ({e})")
    if not isinstance(data, dict):
        raise TracekitError(f"{path}: {what} must be a JSON object")
    return data


# ───────────────────────────── info ─────────────────────────────

@cli.command()
@trace_arguments
@click.option("--device", type=int, default=None, help="Restrict counts to this GPU (default: all).")
@output_options(("table", "md", "json"))
def info(traces, device, fmt, output, color):
    """What is in a trace: producer, GPUs, counts, graph mode, step candidates.

    Example: tracekit info sample_traces/hf-small-eager/trace.sqlite
    """
    from tracekit.analyses.info import info as info_of

    files = expand_traces(traces)
    results = [info_of(_load(p, fmt == "json"), device=device) for p in files]
    if len(files) == 1:
        emit("info", results[0], fmt, output, color)
    else:
        from tracekit.analyses.ranks import info_ranks

        emit("info", info_ranks(results), fmt, output, color)


# ───────────────────────────── kernels ─────────────────────────────

@cli.command()
@trace_arguments
@click.option("--device", type=int, default=None, help="Restrict to this GPU (default: all GPUs).")
@click.option("--top", type=click.IntRange(min=1), default=None, help="Show only the N largest (default: all).")
@click.option("--rules", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="Extra kernel-classification rules (TOML), tried before the shipped ones.")
@output_options()
def kernels(traces, device, top, rules, fmt, output, color):
    """Every kernel name with its category, count, total and mean time and share.

    Totals are over all GPUs unless --device is given, so they equal
    `nsys stats --report cuda_gpu_kern_sum`. Names no rule matches are flagged.
    """
    from tracekit.analyses.kernels import kernel_summary

    files = expand_traces(traces)
    if len(files) == 1:
        emit("kernels", kernel_summary(_load(files[0], fmt == "json"), device=device, top=top, rules=rules), fmt,
             output, color)
    else:
        from tracekit.analyses.ranks import kernels_ranks

        # the cross-rank totals are over every kernel; --top only shortens each rank's list
        full = [kernel_summary(_load(p, fmt == "json"), device=device, rules=rules) for p in files]
        multi = kernels_ranks(full, files)
        if top is not None:
            multi["ranks"] = [{**r, "kernels": r["kernels"][:top]} for r in multi["ranks"]]
        emit("kernels", multi, fmt, output, color)


# ───────────────────────────── breakdown ─────────────────────────────

def run_breakdown(path: Path, opts: dict):
    import tracekit

    trace = _load(path, True)
    return tracekit.breakdown(trace, **opts)


def _breakdown_opts(device, step_range, draft_range, weight_bytes, peak_bw, accept_len, tokens_per_step, rules,
                    device_profile) -> dict:
    return dict(device=device, step_range=step_range, draft_range=draft_range or None, weight_bytes=weight_bytes,
                peak_bw=peak_bw, accept_len=accept_len, tokens_per_step=tokens_per_step, rules=rules,
                device_profile=_read_json_file(device_profile, "device profile"))


@cli.command()
@trace_arguments
@analysis_opts
@click.option("--all-devices", is_flag=True,
              help="Analyse every GPU of the trace (one nsys report of several ranks) and add a cross-rank table.")
@click.option("--save", type=click.Path(dir_okay=False, path_type=Path), default=None, metavar="RUNS.DB",
              help="Append the result to a SQLite run history (see `tracekit history`).")
@output_options()
def breakdown(traces, device, step_range, draft_range, weight_bytes, peak_bw, accept_len, tokens_per_step, rules,
              device_profile, all_devices, save, fmt, output, color):
    """Per-decode-step time split, memory-bandwidth roofline and advice.

    Example: tracekit breakdown sample_traces/hf-small-eager/trace.sqlite --format md
    """
    opts = _breakdown_opts(device, step_range, draft_range, weight_bytes, peak_bw, accept_len, tokens_per_step,
                           rules, device_profile)
    files = expand_traces(traces)
    labels = None
    if all_devices:
        if len(files) != 1 or device is not None:
            raise TracekitError("--all-devices takes one trace file and no --device")
        import tracekit
        from tracekit.analyses.breakdown import devices_with_activity

        trace = _load(files[0], True)
        devs = devices_with_activity(trace)
        results = [tracekit.breakdown(trace, **{**opts, "device": d}) for d in devs]
        labels = [f"gpu{d}" for d in devs]
    elif len(files) == 1:
        results = [run_breakdown(files[0], opts)]
    else:
        from tracekit.parallel import map_files

        results = map_files(run_breakdown, files, opts)
    if save is not None:
        from tracekit.history import save_runs

        save_runs(save, results)
    if len(results) == 1 and not all_devices:
        emit("breakdown", results[0], fmt, output, color)
        return
    from tracekit.analyses.ranks import cross_rank

    emit("ranks", cross_rank(results, labels), fmt, output, color)


def _register_optional():
    """Commands that live in their own modules (registered when present)."""
    import importlib

    for module, attr in (("tracekit.capture", "capture_command"), ("tracekit.ceiling", "ceiling_command"),
                         ("tracekit.diffcmd", "diff_command"), ("tracekit.plotcmd", "plot_command"),
                         ("tracekit.plotcmd", "export_command"), ("tracekit.history", "history_command")):
        try:
            mod = importlib.import_module(module)
        except ImportError as e:
            # Absent module, or an analyzer dependency missing on a capture-only GPU host.
            if getattr(e, "name", None) in (module, "polars", "rich", "matplotlib", "msgspec", "sqlite_utils"):
                continue
            raise
        cmd = getattr(mod, attr, None)
        if cmd is not None:
            cli.add_command(cmd)


_register_optional()


def main():
    cli.main()


if __name__ == "__main__":  # pragma: no cover
    main()
