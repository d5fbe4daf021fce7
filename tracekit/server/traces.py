"""Waiting for a server's trace files: one per rank, each complete (its size unchanged for a while), with a
progress line and a timeout that names what is missing.

The server writes its traces on ITS file system, into the folder it was told (SGLang's ``output_dir``) or was
started with (vLLM's ``torch_profiler_dir``); tracekit watches the same path on this machine, so client and server
must share it (the same host, or a folder both mount at the same path). Standard library only.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tracekit.server.engines import FILE_PATTERNS, RankFile, rank_file


@dataclass(frozen=True)
class Found:
    """The rank files a capture wrote, in rank order, and the other new files of the folder (not traces)."""

    ranks: tuple[RankFile, ...]
    others: tuple[str, ...]
    waited_s: float


class Progress:
    """One status line: rewritten in place on a terminal's stderr; elsewhere a line on stdout now and then (stderr
    then carries nothing but an error's one line)."""

    def __init__(self, stream=None, every_s: float = 5.0):
        self.tty = bool(getattr(sys.stderr, "isatty", lambda: False)())
        self.stream = stream
        self.every, self._last, self._shown = every_s, 0.0, False

    def say(self, msg: str, force: bool = False) -> None:
        if self.tty and self.stream is None:
            sys.stderr.write("\r\x1b[2K" + msg[:200])
            sys.stderr.flush()
            self._shown = True
            return
        now = time.monotonic()
        if force or now - self._last >= self.every:
            self._last = now
            print(f"tracekit capture: {msg}", file=self.stream or sys.stdout, flush=True)

    def clear(self) -> None:
        if self._shown:
            sys.stderr.write("\r\x1b[2K")
            sys.stderr.flush()
            self._shown = False


def _size(p: Path) -> int | None:
    try:
        return p.stat().st_size
    except OSError:
        return None


def new_files(folder: Path, before: set[str]) -> list[str]:
    try:
        return sorted(n for n in os.listdir(folder) if n not in before and (folder / n).is_file())
    except OSError:
        return []


def wait_for_ranks(folder: Path, engine: str, expected: int | None, *, before: set[str] = frozenset(),
                   timeout: float, settle: float, poll: float = 0.25, progress: Progress | None = None,
                   alive=lambda: True, where_hint: str = "", layout: list[str] | None = None) -> Found:
    """Wait until ``folder`` holds ``expected`` new rank trace files of ``engine`` (any count, once no new one has
    appeared for ``3 x settle``, when ``expected`` is None), each with a size unchanged for ``settle`` seconds.
    ``before``: the names already there (not this capture's). ``alive()`` is asked between polls: False (the
    server went away) ends the wait early. ``layout``: the expected ranks' labels (``TP-0``, ``TP-1-DP-0``, ...),
    so that the timeout names the missing ones. Raises :class:`TracesMissing` on timeout."""
    t0 = time.monotonic()
    sizes: dict[str, tuple[int, float]] = {}       # name -> (size, since when unchanged)
    last_new = t0
    seen: set[str] = set()
    while True:
        now = time.monotonic()
        names = new_files(folder, set(before))
        ranks = {}
        others = []
        for n in names:
            rf = rank_file(engine, n)
            if rf is None:
                others.append(n)
                continue
            ranks[n] = rf
            size = _size(folder / n)
            if size is None:
                continue
            prev = sizes.get(n)
            if prev is None or prev[0] != size:
                sizes[n] = (size, now)
            if n not in seen:
                seen.add(n)
                last_new = now
        stable = [n for n in ranks if n in sizes and sizes[n][0] > 0 and now - sizes[n][1] >= settle]
        want = expected if expected is not None else None
        if want is not None and len(stable) >= want and len(ranks) >= want:
            return Found(tuple(sorted(ranks[n] for n in stable)), tuple(others), now - t0)
        if want is None and stable and len(stable) == len(ranks) and now - last_new >= 3 * settle:
            return Found(tuple(sorted(ranks[n] for n in stable)), tuple(others), now - t0)
        if progress is not None:
            total = sum(sizes[n][0] for n in ranks if n in sizes)
            of = f"{len(ranks)} of {want}" if want is not None else f"{len(ranks)}"
            progress.say(f"waiting for the traces in {folder}: {of} rank file(s), {len(stable)} complete, "
                         f"{total / 1e6:.1f} MB, {now - t0:.0f} s")
        if now - t0 >= timeout or not alive():
            raise TracesMissing(folder, engine, expected, sorted(ranks.values()), others, now - t0,
                                where_hint, gone=not alive(), layout=layout)
        time.sleep(poll)


class TracesMissing(Exception):
    """The wait ended without every rank's trace: the message names what is there and what is missing."""

    def __init__(self, folder: Path, engine: str, expected: int | None, have: list[RankFile], others: list[str],
                 waited: float, hint: str, gone: bool = False, layout: list[str] | None = None):
        self.gone = gone
        got = ", ".join(r.label for r in have) or "none"
        want = f"{expected} expected" if expected is not None else "the number of ranks unknown"
        missing = [x for x in (layout or []) if x not in {r.label for r in have}]
        if missing:
            want += f"; missing {', '.join(missing[:16])}" + (f" and {len(missing) - 16} more" if len(missing) > 16
                                                               else "")
        pattern = FILE_PATTERNS.get(engine, "")
        tail = f"; other new files: {', '.join(others[:5])}" if others else ""
        why = "the server went away" if gone else f"after {waited:.0f} s"
        super().__init__(f"the traces did not appear in {folder} ({why}): rank files found: {got} ({want}, named "
                         f"{pattern}){tail}. {hint}".strip())


__all__ = ["Found", "Progress", "TracesMissing", "new_files", "wait_for_ranks"]
