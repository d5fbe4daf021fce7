"""A status indicator for long loads: a rich spinner with elapsed time, on a terminal only.

The CLI wraps a load (or a multi-file analysis) in :func:`status`; it shows on stderr
only when stderr is a terminal, the output format is not ``json`` (scripts parse that)
and ``TRACEKIT_PROGRESS`` is not ``0``. Otherwise it does nothing at all, so piped
output, CI logs and ``--format json`` stay byte-for-byte what they were. The indicator
is transient: it disappears when the block ends, leaving no trace in the terminal.

    from tracekit.progress import status

    with status(f"reading {path.name}", fmt=fmt) as st:
        trace = tracekit.load(path)
        st.update("computing the breakdown")
        result = tracekit.breakdown(trace)

    with status("analysing ranks", fmt=fmt, total=len(files)) as st:   # a bar of N files
        for f in files:
            ...; st.advance()
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager


class _Quiet:
    """The indicator when nothing may be shown: every call is a no-op."""

    shown = False

    def update(self, message: str | None = None) -> None:
        pass

    def advance(self, n: int = 1) -> None:
        pass


class _Shown:
    shown = True

    def __init__(self, progress, task):
        self._p, self._t = progress, task

    def update(self, message: str | None = None) -> None:
        if message is not None:
            self._p.update(self._t, description=message)

    def advance(self, n: int = 1) -> None:
        self._p.advance(self._t, n)


def enabled(fmt: str | None = None, stream=None) -> bool:
    """Whether an indicator may be shown: a terminal, not JSON, not switched off."""
    stream = stream if stream is not None else sys.stderr
    if fmt == "json" or os.environ.get("TRACEKIT_PROGRESS", "1") == "0":
        return False
    if os.environ.get("TERM") == "dumb" or os.environ.get("CI"):
        return False
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


@contextmanager
def status(message: str, *, fmt: str | None = None, total: int | None = None, stream=None) -> Iterator:
    """Show ``message`` with a spinner and elapsed time (a bar when ``total`` is given) while the block runs.

    Yields an object with ``update(message)`` and ``advance(n=1)``; both are no-ops when
    the indicator is not shown (see :func:`enabled`).
    """
    if not enabled(fmt, stream):
        yield _Quiet()
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    columns = [SpinnerColumn(), TextColumn("{task.description}")]
    if total is not None:
        columns += [BarColumn(), MofNCompleteColumn()]
    columns.append(TimeElapsedColumn())
    console = Console(file=stream if stream is not None else sys.stderr, stderr=stream is None)
    with Progress(*columns, console=console, transient=True, refresh_per_second=8) as progress:
        task = progress.add_task(message, total=total)
        yield _Shown(progress, task)
