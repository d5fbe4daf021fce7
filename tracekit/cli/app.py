"""The click group ``tracekit`` and the one place errors become exit codes.

Exit codes (the contract): 0 success; 2 unusable input or arguments (a click usage error, or one of the named
errors of :mod:`tracekit.errors`, all ``TracekitError``: the class's ``exit_code``, 2 for each) with exactly one
line on stderr, ``tracekit: error: ...``; 1 an internal error (one line too, unless ``--debug``, which shows the
traceback). ``--debug`` is accepted anywhere on the command line (``tracekit
breakdown T --debug``), and ``TRACEKIT_DEBUG=1`` does the same; it never changes an exit code: an input error
under ``--debug`` prints its traceback, then its one line, and exits 2; a usage error (click's own parsing) stays
one line, as its traceback would only show click's internals. Output cut short by a closed pipe
(``tracekit breakdown T | head -1``) exits 0, as ``head`` users expect.

This module imports only click and the standard library: ``tracekit --help`` and ``--version`` must not
load polars or pyarrow.
"""

from __future__ import annotations

import os
import sys

import click

from tracekit import __version__
from tracekit.errors import TracekitError
from tracekit.text import one_line

DEBUG_FLAG = "--debug"


def _split_debug(argv: list[str]) -> tuple[list[str], bool]:
    """``argv`` without ``--debug`` (wherever it stands before a ``--``), and whether it was there."""
    stop = argv.index("--") if "--" in argv else len(argv)
    head = [a for a in argv[:stop] if a != DEBUG_FLAG]
    return head + argv[stop:], len(head) != stop


def _quiet_stdout() -> None:
    """After a closed pipe: point stdout at /dev/null so the interpreter's final flush cannot fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # no real stdout (an in-process test runner)
        pass


class _PipeClosed(Exception):
    """stdout's reader went away (``| head``). Not an OSError, so click's own EPIPE handler (exit 1) skips it."""


def fail(e: TracekitError, debug: bool = False):
    """The one mapping of a named error (:mod:`tracekit.errors`) to the command line: its traceback under
    ``--debug``, then its one line ``tracekit: error: ...``, and exit with the class's ``exit_code``."""
    if debug:
        import traceback

        traceback.print_exc()
    click.echo(f"tracekit: error: {one_line(e)}", err=True)
    sys.exit(e.exit_code)


class TracekitGroup(click.Group):
    """A click group whose errors are one line and whose exit codes follow the contract."""

    def invoke(self, ctx):
        try:
            rv = super().invoke(ctx)
            sys.stdout.flush()  # here, so that a pipe closed early is seen now (not at interpreter exit)
            return rv
        except BrokenPipeError:
            raise _PipeClosed from None

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        argv, debug = _split_debug(list(sys.argv[1:] if args is None else args))
        debug = debug or os.environ.get("TRACEKIT_DEBUG") == "1"
        try:
            rv = super().main(args=argv, prog_name=prog_name or "tracekit", complete_var=complete_var,
                              standalone_mode=False, **extra)
        except click.exceptions.Exit as e:  # pragma: no cover - click converts these itself
            sys.exit(e.exit_code)
        except click.exceptions.Abort:
            click.echo("tracekit: error: aborted", err=True)
            sys.exit(130)
        except click.UsageError as e:
            path = (e.ctx.command_path or "") if e.ctx else ""
            hint = f" (see `tracekit {path.split(' ', 1)[1]} --help`)" if " " in path else " (see `tracekit --help`)"
            click.echo(f"tracekit: error: {one_line(e.format_message())}{hint}", err=True)
            sys.exit(2)
        except click.ClickException as e:
            click.echo(f"tracekit: error: {one_line(e.format_message())}", err=True)
            sys.exit(2)
        except TracekitError as e:
            fail(e, debug)
        except (_PipeClosed, BrokenPipeError):  # `tracekit kernels x | head`: the reader has all it wanted
            _quiet_stdout()
            sys.exit(0)
        except KeyboardInterrupt:
            click.echo("tracekit: error: interrupted", err=True)
            sys.exit(130)
        except Exception as e:  # noqa: BLE001 - the last line of defence
            if debug:
                raise
            click.echo(f"tracekit: internal error: {type(e).__name__}: {one_line(e)[:300]} "
                       "(rerun with --debug for the traceback, and please report it)", err=True)
            sys.exit(1)
        sys.exit(rv if isinstance(rv, int) else 0)


@click.group(cls=TracekitGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="tracekit")
@click.option(DEBUG_FLAG, is_flag=True, help="Show the Python traceback of an input or internal error before its "
                                             "one line; exit codes stay (anywhere on the command line; or "
                                             "TRACEKIT_DEBUG=1).")
def cli(debug):
    """Where every microsecond of an LLM decode step goes.

    \b
    tracekit info TRACE        what is in a trace (nsys .sqlite, Kineto .json[.gz])
    tracekit breakdown TRACE   per-step time split, roofline and advice
    tracekit kernels TRACE     every kernel with its category
    tracekit stats TRACE       the nsys stats tables, utilisation, what launched the kernels
    tracekit diff BASE NEW     two breakdowns side by side
    tracekit ceiling ...       the tok/s ceiling without a trace
    tracekit export TRACE      the trace and tracekit's tracks for ui.perfetto.dev
    tracekit capture ...       (GPU host) capture a decode loop under nsys / torch profiler
    tracekit cache info|clear  the cache of decompressed / converted exports
    """


# True in the console script's own process (main()), not when the group is called in-process (tests, library users):
# what only a process of our own may do (tracekit.readers.nsys.scan's arrow_without_numpy) asks this.
OWN_PROCESS = False


def main():
    """The ``tracekit`` console script."""
    global OWN_PROCESS
    OWN_PROCESS = True
    from tracekit.readers.nsys.scan import keep_freed_memory

    keep_freed_memory(sys.argv[1:])  # (before polars is imported: its allocator reads the setting once)
    try:
        cli.main()
    except SystemExit as e:
        _exit_now(e)
        raise


def _exit_now(e: SystemExit) -> None:
    """Leave at once with ``e``'s status when nothing is left to do: stdout and stderr flushed, no other thread or
    child process. The interpreter's teardown would otherwise free every frame one by one (~0.1 s after a
    1M-kernel breakdown, ~0.2 s at 10M) only to hand the memory back to the system. (The exit handlers skipped
    are the libraries' own, e.g. pyarrow's S3 finaliser: nothing for a finished command. Anything still running,
    a pool or a client, takes the normal way out.)"""
    import multiprocessing
    import threading

    if not isinstance(e.code, int | None):
        return  # (a message to print: Python's own exit does it)
    if threading.active_count() > 1 or multiprocessing.active_children():
        return
    code = e.code or 0
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        return
    os._exit(code)
