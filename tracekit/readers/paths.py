"""The trace files a path names: a file as given, a directory's trace files (one per rank), what is not a trace
skipped. Shared by the command line (``tracekit.cli.output.expand_traces``) and the Python API (``tracekit.breakdown``
of a directory, ``tracekit.run.sides``)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from tracekit.errors import UnsupportedFormat

NOT_TRACES = {"manifest.json", "device_profile.json", "index.json", "workload_facts.json"}


def _stderr(line: str) -> None:
    print(line, file=sys.stderr)


def expand_traces(paths, warn: Callable[[str], None] = _stderr) -> list[Path]:
    """Files as given; a directory contributes its trace files (one per rank), sorted.

    In a directory, files that are not traces (a summary JSON, a run database beside the rank traces: see
    ``tracekit.readers.not_a_trace``) are skipped with one warning (``warn``, a line: stderr by default) naming them;
    only a directory left with no trace is an error.
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
                warn(f"warning: {p}: skipped {len(skipped)} file(s) that are not traces: {', '.join(skipped)}")
            out.extend(files)
        else:
            out.append(p)
    return out


__all__ = ["NOT_TRACES", "expand_traces"]
