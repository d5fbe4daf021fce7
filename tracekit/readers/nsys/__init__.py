"""The nsys format: Nsight Systems SQLite exports (``.sqlite``, gzipped ``.sqlite.gz``) and ``.nsys-rep`` reports.

:mod:`~tracekit.readers.nsys.reader` reads an export into a Trace (markers: NVTX ranges, ``nvtx``);
:mod:`~tracekit.readers.nsys.scan` holds its SQL and the head start (the two big scans, before polars is
imported); :mod:`~tracekit.readers.nsys.sqlitegz` decompresses a gzipped export and
:mod:`~tracekit.readers.nsys.rep` converts a report with ``nsys export``, both into the cache directory.
Importing this package imports neither polars nor the reader (each function below imports what it needs).
"""

from __future__ import annotations

from pathlib import Path

from tracekit.readers import Format

SQLITE_MAGIC = b"SQLite format 3\x00"
GZIP_MAGIC = b"\x1f\x8b"


def recognise(path: Path, head: bytes) -> bool:
    """An SQLite database, or a gzip stream whose content starts as one (the gzipped export)."""
    if head.startswith(SQLITE_MAGIC):
        return True
    if head[:2] == GZIP_MAGIC:
        from tracekit.readers.nsys.sqlitegz import is_gzipped_sqlite

        return is_gzipped_sqlite(path)
    return False


def load(path: Path, *, kernel_dims: bool = True):
    """The Trace of an export: read in place, or from its decompressed / exported copy in the cache (a gzipped
    export's Trace names the user's file)."""
    from dataclasses import replace

    from tracekit.readers.nsys.reader import read_nsys

    with open(path, "rb") as f:
        head = f.read(len(SQLITE_MAGIC))
    if head.startswith(SQLITE_MAGIC):
        return read_nsys(path, kernel_dims=kernel_dims)
    if head[:2] == GZIP_MAGIC:
        from tracekit.readers.nsys.sqlitegz import decompress_to_cache

        trace = read_nsys(decompress_to_cache(path), kernel_dims=kernel_dims)
        return replace(trace, meta=replace(trace.meta, path=str(path)))  # (the user's file, not the copy)
    from tracekit.readers.nsys.rep import export_to_cache

    return read_nsys(export_to_cache(path), kernel_dims=kernel_dims)


def not_a_trace(path: Path, head: bytes) -> str | None:
    """An SQLite file without nsys tables (a run database beside the rank traces); a gzipped export or a report is
    taken as a trace."""
    if not head.startswith(SQLITE_MAGIC):
        return None
    import sqlite3

    try:
        con = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        try:
            names = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        finally:
            con.close()
    except sqlite3.Error as e:
        return f"an unreadable SQLite file ({e})"
    if not any(n.startswith(("CUPTI_ACTIVITY_KIND_", "NVTX_EVENTS", "StringIds", "TARGET_INFO_")) for n in names):
        return "an SQLite database without nsys tables"
    return None


def head_start(path, *, kernel_dims: bool = True, own_process: bool = False):
    """:func:`tracekit.readers.nsys.scan.head_start` (a big export's two big scans with connectorx, on threads)."""
    from tracekit.readers.nsys.scan import head_start as scans

    return scans(path, kernel_dims=kernel_dims, arrow_without_numpy=own_process)


def duplicate(path: Path) -> bool:
    """A report whose export lies beside it (plain or gzipped), or a gzipped export beside the plain one."""
    if path.suffix == FORMAT.suffixes[0]:
        return path.with_suffix(FORMAT.extension).exists() or path.with_suffix(FORMAT.compressed).exists()
    if path.name.endswith(FORMAT.compressed):
        return path.with_name(path.name[:-len(FORMAT.compressed) + len(FORMAT.extension)]).exists()
    return False


FORMAT = Format(name="nsys-sqlite", what="an nsys SQLite export", recognise=recognise, load=load,
                not_a_trace=not_a_trace, head_start=head_start,
                suffixes=(".nsys-rep", ".qdrep"), what_by_name="an .nsys-rep with nsys on PATH",
                extension=".sqlite", compressed=".sqlite.gz", profiler="nsys", duplicate=duplicate)
