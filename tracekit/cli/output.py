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

from tracekit.errors import BadOptionValue, CannotWrite

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
    """Files as given; a directory contributes its trace files (one per rank), sorted
    (``tracekit.readers.paths.expand_traces``; a skipped file's warning goes to stderr through click)."""
    from tracekit.readers.paths import expand_traces as _expand

    return _expand(paths, warn=lambda line: click.echo(line, err=True))


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
