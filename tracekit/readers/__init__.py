"""Readers: one package per file format (``readers/<format>/``), each returning a :class:`tracekit.trace.Trace`.

A format is a package whose ``FORMAT`` (a :class:`Format`) says everything about it that is not the Trace: how its
files are recognised, how one is read, and what may start before polars is imported (its head start). Its reader
sets what the Trace says of it (``meta.format``, ``meta.markers``: what its step markers are called, the GPUs'
names and ids in ``gpus``). The formats are registered in :data:`FORMATS`, one line each; adding a format is one
package and one line there, nothing downstream changes (``tests/readers/test_formats.py`` registers one).
Shared by the formats: :mod:`~tracekit.readers.common` (polars expressions), :mod:`~tracekit.readers.api_names`
(the host API table), :mod:`~tracekit.readers.cache` (the cache directory of converted copies).

This package and each format's ``__init__`` import neither polars nor the reader itself: the command line
recognises files and starts head starts before polars is imported.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tracekit.errors import BadOptionValue, TracekitError, UnreadableTrace, UnsupportedFormat

if TYPE_CHECKING:  # pragma: no cover
    from tracekit.trace import Trace

# The registry: the format packages, in the order their files are recognised (the first that claims a file reads it).
FORMATS: tuple[str, ...] = ("tracekit.readers.nsys", "tracekit.readers.kineto")

HEAD_BYTES = 64  # how much of a file every format's ``recognise`` is shown


@dataclass(frozen=True)
class Format:
    """One file format: ``FORMAT`` in its package's ``__init__`` (which imports neither polars nor the reader)."""

    name: str  # what its traces' ``meta.format`` says ("nsys-sqlite")
    what: str  # what it reads, for the error on a file no format reads ("an nsys SQLite export")
    # whether a file is its own, by content: (path, its first HEAD_BYTES bytes) -> bool (it may look further)
    recognise: Callable[[Path, bytes], bool]
    # (path, *, kernel_dims) -> Trace, the manifest not yet attached (load() attaches it beside meta.path)
    load: Callable[..., Trace]
    # why a file it recognised is not a trace after all, cheaply (a directory's other files): (path, head) -> words
    not_a_trace: Callable[[Path, bytes], str | None] | None = None
    # (path, *, kernel_dims, own_process) -> a context manager: work begun before polars is imported, taken by
    # ``load`` inside the block; it yields whether it runs. Each format's decides alone whether the file is its own.
    head_start: Callable[..., AbstractContextManager] | None = None
    # files it reads by name, when no format recognises their content ((".nsys-rep",)), and what they are
    suffixes: tuple[str, ...] = ()
    what_by_name: str = ""
    # how its files are named: plain (".sqlite") and gzipped (".sqlite.gz"), as a capture writes them and a folder
    # of rank traces holds them
    extension: str = ""
    compressed: str = ""
    # the profiler whose captures it reads ("nsys", "torch": the manifest's ``profiler``)
    profiler: str = ""
    # whether a file in a folder is the other form of a trace beside it (an .nsys-rep beside its export): (path) -> bool
    duplicate: Callable[[Path], bool] | None = None

    @property
    def files(self) -> tuple[str, ...]:
        """The suffixes of its files in a folder of traces: plain, gzipped, then those read by name."""
        return tuple(s for s in (self.extension, self.compressed, *self.suffixes[:1]) if s)


def formats() -> tuple[Format, ...]:
    """The registered formats (:data:`FORMATS`), in order."""
    from importlib import import_module

    return tuple(import_module(name).FORMAT for name in FORMATS)


def trace_suffixes() -> tuple[str, ...]:
    """What the files of a folder of traces end with: every format's plain and gzipped files, then the files read by
    name (``.sqlite``, ``.sqlite.gz``, ``.json``, ``.json.gz``, ``.nsys-rep``)."""
    registered = formats()
    return (*(s for f in registered for s in (f.extension, f.compressed) if s),
            *(f.suffixes[0] for f in registered if f.suffixes))


def of_profiler(profiler: str) -> Format:
    """The format that reads the captures of ``profiler`` (``"nsys"``, ``"torch"``)."""
    found = [f for f in formats() if f.profiler == profiler]
    if not found:
        raise BadOptionValue(f"--profiler {profiler}: use {' or '.join(f.profiler for f in formats() if f.profiler)}")
    return found[0]


def is_duplicate(path: Path) -> bool:
    """Whether ``path`` is the other form of a trace that lies beside it in a folder (one rank, listed once)."""
    return any(f.duplicate(path) for f in formats() if f.duplicate is not None)


def _head(path: Path) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(HEAD_BYTES)
    except IsADirectoryError:
        raise UnreadableTrace(f"{path} is a directory; give a trace file (or use a command that takes several)")
    except OSError as e:
        raise UnreadableTrace(f"cannot read {path}: {e.strerror or e}")


def detect_format(path: Path, head: bytes | None = None) -> Format:
    """The format that reads ``path``: the first whose ``recognise`` claims its first bytes (not its name), else the
    first that reads its suffix. A file none reads is a :class:`TracekitError` naming what they read."""
    path = Path(path)
    head = _head(path) if head is None else head
    registered = formats()
    for fmt in registered:
        if fmt.recognise(path, head):
            return fmt
    for fmt in registered:
        if path.suffix in fmt.suffixes:
            return fmt
    expected = [f.what for f in registered] + [f.what_by_name for f in registered if f.suffixes and f.what_by_name]
    listed = expected[0] if len(expected) == 1 else f"{', '.join(expected[:-1])}, or {expected[-1]}"
    raise UnsupportedFormat(f"{path}: not a trace tracekit can read (expected {listed})")


def not_a_trace(path: Path) -> str | None:
    """Why the file at ``path`` is not a trace tracekit reads (a few words), or None when it looks like one.

    Cheap: the first bytes, then the format's own look (a JSON file's first few MiB, an SQLite file's table names);
    a file it cannot tell about (``.nsys-rep``, a gzipped export) is taken as a trace. For directories: a summary
    JSON or a run database beside the rank traces is skipped, not read as a rank.
    """
    try:
        head = _head(path)
        fmt = detect_format(path, head)
    except TracekitError as e:
        return str(e).split(": ", 1)[-1][:80]
    return fmt.not_a_trace(path, head) if fmt.not_a_trace is not None else None


@contextmanager
def head_start(path, *, kernel_dims: bool = True, own_process: bool = False):
    """Inside this block, what each format begins for ``path`` before polars is imported is under way (the nsys
    export's big scans, a big Kineto trace's second reader); :func:`load` inside takes it, and what it has not taken
    is dropped on leaving. ``own_process``: the caller is the command line's own process (a format may then do what
    only a process of our own may). The block gets whether any is running. Never an error: a file a format cannot
    look at gets no head start, and the read reports it."""
    with ExitStack() as stack:
        running = [stack.enter_context(f.head_start(path, kernel_dims=kernel_dims, own_process=own_process))
                   for f in formats() if f.head_start is not None]
        yield any(running)


def load(path, *, kernel_dims: bool = True):
    """Read one trace file, with the format that recognises it (:func:`detect_format`), and attach the
    ``manifest.json`` beside it when it matches (:func:`tracekit.manifest.attach_manifest`; beside the file the
    trace names: the user's file, or for an ``.nsys-rep`` its export in the cache).

    ``kernel_dims=False`` lets a reader skip kernel grid/block dimensions (no analysis uses them).
    """
    path = Path(path)
    if not path.exists():
        raise UnreadableTrace(f"{path}: no such file")
    fmt = detect_format(path)
    trace = fmt.load(path, kernel_dims=kernel_dims)
    from tracekit.manifest import attach_manifest

    return attach_manifest(trace, Path(trace.meta.path), fmt.profiler)
