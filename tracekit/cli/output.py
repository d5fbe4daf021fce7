"""Where command output goes: the console, ``-o FILE``, and the one ``emit`` every command calls.

A command computes a result and calls :func:`emit` with its kind; ``tracekit.report.render`` picks the
renderer. Tables print to a rich console on stdout (colour: ``--color/--no-color``, else auto: a
terminal and no ``NO_COLOR``); with ``-o FILE`` they are rendered 160 columns wide without colour and
written there. Also here: the trace list of the analysis commands (a directory = its rank files) and the
load with a transient progress line.
"""

from __future__ import annotations

import os
from pathlib import Path

import click

from tracekit.errors import BadOptionValue, CannotWrite, UnsupportedFormat

NOT_TRACES = {"manifest.json", "device_profile.json", "index.json", "workload_facts.json"}
FILE_WIDTH = 160


def console(color: bool | None = None, file=None, wide: bool = False):
    """The rich console of a command: stdout (or ``file``) with the colour rule above.

    A pipe closed by its reader (``| head``) ends the command quietly with exit 0 (rich's own
    handler would exit 1, the internal-error code). ``wide`` (``--wide``): names whole on a terminal too
    (``tracekit.report.terminal.full_names``; output that is not a terminal always has them whole).
    """
    from rich.console import Console

    class _Console(Console):
        def on_broken_pipe(self) -> None:
            raise BrokenPipeError

    if file is not None:
        out = _Console(file=file, width=FILE_WIDTH, color_system=None, soft_wrap=False)
    else:
        no_color = (color is False) or (color is None and bool(os.environ.get("NO_COLOR")))
        out = _Console(no_color=no_color, force_terminal=True if color else None, soft_wrap=False)
    out.wide = wide
    return out


def write_text(text: str, output: Path | None) -> None:
    """``text`` to stdout, or to ``output`` (a one-line error when it cannot be written)."""
    if output is None:
        click.echo(text, nl=False)
        return
    try:
        Path(output).write_text(text, encoding="utf-8")
    except OSError as e:
        raise CannotWrite(f"cannot write {output}: {e.strerror or e}") from None


def emit(kind: str, result, fmt: str, output: Path | None = None, color: bool | None = None,
         wide: bool = False) -> None:
    """Render ``result`` (a ``tracekit.report.render`` kind) in ``fmt`` to stdout or ``output``."""
    import io

    from tracekit.report import render

    buf = io.StringIO() if output is not None else None
    text = render(kind, result, fmt, lambda: console(color, buf, wide))
    if text is None and buf is not None:
        text = buf.getvalue()
    if text is not None:
        write_text(text, output)


def expand_traces(paths) -> list[Path]:
    """Files as given; a directory contributes its trace files (one per rank), sorted.

    In a directory, files that are not traces (a summary JSON, a run database beside the rank traces: see
    ``tracekit.readers.not_a_trace``) are skipped with one warning on stderr naming them; only a directory left
    with no trace is an error.
    """
    from tracekit.readers import is_duplicate, not_a_trace, trace_suffixes

    suffixes = trace_suffixes()
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            # capture side files are not traces; an .nsys-rep whose SQLite export is there (plain or gzipped), or a
            # gzipped export beside the plain one, is the same trace
            files = sorted(f for f in p.iterdir() if f.is_file() and f.name.endswith(suffixes)
                           and f.name not in NOT_TRACES and not is_duplicate(f))
            why = {f: not_a_trace(f) for f in files}  # (a handful of files)
            skipped = [f"{f.name} ({w})" for f, w in why.items() if w]
            files = [f for f, w in why.items() if not w]
            if not files:
                also = f"; skipped: {', '.join(skipped)}" if skipped else ""
                raise UnsupportedFormat(f"{p}: directory holds no trace files ({', '.join(suffixes)}){also}")
            if skipped:
                click.echo(f"warning: {p}: skipped {len(skipped)} file(s) that are not traces: {', '.join(skipped)}",
                           err=True)
            out.extend(files)
        else:
            out.append(p)
    return out


def load(path: Path, quiet: bool):
    """Load for an analysis command, with a transient progress line on a terminal (never when ``quiet``)."""
    import tracekit
    import tracekit.cli.app as app
    from tracekit.progress import status
    from tracekit.readers import head_start

    with (status(f"reading {Path(path).name}", fmt="json" if quiet else "table"),
          head_start(path, kernel_dims=False, own_process=app.OWN_PROCESS)):
        return tracekit.load(path, kernel_dims=False)


def beside_renderer_import(fn, fmt: str):
    """``fn()``, with the table renderer's modules (rich) imported on a second thread meanwhile.

    SQLite reads and polars release the GIL, so on a second core the ~0.1 s import of rich overlaps the
    analysis instead of following it (benchmarks/startup.py). polars is imported first, on this thread.
    """
    if fmt != "table":
        return fn()
    import polars  # noqa: F401

    from tracekit.parallel import in_threads

    def import_rich() -> None:
        import rich.console  # noqa: F401
        import rich.table  # noqa: F401

        import tracekit.report.terminal  # noqa: F401

    return in_threads(fn, import_rich)[0]


def check_output(out: Path, trace: Path, suffixes=()) -> None:
    """Refuse an output file with the wrong suffix, or one that is the input trace itself."""
    if suffixes and not out.name.lower().endswith(tuple(suffixes)):
        raise BadOptionValue(f"{out}: the output must end with {', '.join(suffixes)}")
    try:
        same = out.resolve() == Path(trace).resolve()
    except OSError:
        same = False
    if same:
        raise CannotWrite(f"{out}: refusing to overwrite the input trace; pick another output file")


__all__ = ["console", "write_text", "emit", "expand_traces", "load", "beside_renderer_import", "check_output"]
