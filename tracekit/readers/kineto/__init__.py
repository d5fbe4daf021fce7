"""The Kineto format: PyTorch profiler / Kineto Chrome-trace JSON (``.json``, ``.json.gz``).

:mod:`~tracekit.readers.kineto.reader` assembles the Trace (markers: ``user_annotation`` ranges, ``annotation``)
from its three parts, :mod:`~tracekit.readers.kineto.stream` (bytes -> decoded events),
:mod:`~tracekit.readers.kineto.columns` (events -> typed frames) and :mod:`~tracekit.readers.kineto.header` (the
keys around ``traceEvents``); a big plain-JSON file is read by two processes (:mod:`~tracekit.readers.kineto.split`,
whose head start spawns :mod:`~tracekit.readers.kineto.worker`). docs/kineto-reader.md tells how and why.
Importing this package imports neither polars nor msgspec (each function below imports what it needs).
"""

from __future__ import annotations

from pathlib import Path

from tracekit.readers import Format

SNIFF_BYTES = 4 << 20  # how far into a JSON file its "traceEvents" key is looked for


def recognise(path: Path, head: bytes) -> bool:
    """A gzip stream (an SQLite export inside is the nsys format's, recognised before) or JSON text."""
    return head[:2] == b"\x1f\x8b" or head.lstrip()[:1] in (b"{", b"[")


def load(path: Path, *, kernel_dims: bool = True):
    from tracekit.readers.kineto.reader import read_kineto

    return read_kineto(path, kernel_dims=kernel_dims)


def not_a_trace(path: Path, head: bytes) -> str | None:
    """JSON without trace events in its first :data:`SNIFF_BYTES` (decompressed): a summary file, not a rank."""
    import gzip
    import zlib

    try:
        opener = gzip.open if head[:2] == b"\x1f\x8b" else open
        with opener(path, "rb") as f:
            text = f.read(SNIFF_BYTES)
    except (OSError, EOFError, zlib.error) as e:
        return f"unreadable ({e})"
    if text.lstrip()[:1] == b"[":
        return None if b'"ph"' in text else "a JSON array without trace events"
    return None if b'"traceEvents"' in text else "a JSON file without traceEvents (not a Kineto/Chrome trace)"


def head_start(path, *, kernel_dims: bool = True, own_process: bool = False):
    """:func:`tracekit.readers.kineto.split.head_start` for a plain ``.json`` (a big one's second reader); nothing
    is imported for another file (the worker's imports, msgspec's ~0.04 s)."""
    if Path(path).suffix.lower() != ".json":
        from contextlib import nullcontext

        return nullcontext()
    from tracekit.readers.kineto.split import head_start as second_reader

    return second_reader(path, kernel_dims=kernel_dims)


FORMAT = Format(name="kineto-json", what="a Kineto .json/.json.gz", recognise=recognise, load=load,
                not_a_trace=not_a_trace, head_start=head_start, extension=".json", compressed=".json.gz",
                profiler="torch")
