"""Readers: one module per file format, each returning a :class:`tracekit.trace.Trace`."""

from __future__ import annotations

from pathlib import Path

from tracekit.errors import TracekitError


def detect_format(path: Path) -> str:
    """'nsys-sqlite' | 'nsys-sqlite-gz' | 'kineto-json' | 'nsys-rep', from the file's first bytes (not its
    name; a gzip stream is looked into: an SQLite export inside is 'nsys-sqlite-gz')."""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
    except IsADirectoryError:
        raise TracekitError(f"{path} is a directory; give a trace file (or use a command that takes several)")
    except OSError as e:
        raise TracekitError(f"cannot read {path}: {e.strerror or e}")
    if head.startswith(b"SQLite format 3\x00"):
        return "nsys-sqlite"
    if head[:2] == b"\x1f\x8b":
        from tracekit.readers.sqlitegz import is_gzipped_sqlite

        return "nsys-sqlite-gz" if is_gzipped_sqlite(path) else "kineto-json"
    if head.lstrip()[:1] in (b"{", b"["):
        return "kineto-json"
    if path.suffix == ".nsys-rep" or path.suffix == ".qdrep":
        return "nsys-rep"
    raise TracekitError(
        f"{path}: not a trace tracekit can read (expected an nsys SQLite export, a Kineto .json/.json.gz, "
        "or an .nsys-rep with nsys on PATH)"
    )


SNIFF_BYTES = 4 << 20  # how far into a JSON file its "traceEvents" key is looked for


def not_a_trace(path: Path) -> str | None:
    """Why the file at ``path`` is not a trace tracekit reads (a few words), or None when it looks like one.

    Cheap: the first bytes (and, for JSON, the first few MiB, decompressed) or an SQLite file's table names; a
    file it cannot tell about (``.nsys-rep``, a gzipped export) is taken as a trace. For directories: a summary
    JSON or a run database beside the rank traces is skipped, not read as a rank.
    """
    import gzip
    import sqlite3
    import zlib

    try:
        fmt = detect_format(path)
    except TracekitError as e:
        return str(e).split(": ", 1)[-1][:80]
    if fmt == "kineto-json":
        try:
            opener = gzip.open if open(path, "rb").read(2) == b"\x1f\x8b" else open
            with opener(path, "rb") as f:
                head = f.read(SNIFF_BYTES)
        except (OSError, EOFError, zlib.error) as e:
            return f"unreadable ({e})"
        text = head.lstrip()
        if text[:1] == b"[":
            return None if b'"ph"' in head else "a JSON array without trace events"
        return None if b'"traceEvents"' in head else "a JSON file without traceEvents (not a Kineto/Chrome trace)"
    if fmt == "nsys-sqlite":
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


def load(path, *, kernel_dims: bool = True):
    """Read one trace file (nsys SQLite export or its ``.sqlite.gz``, Kineto JSON/.json.gz, or .nsys-rep via nsys).

    ``kernel_dims=False`` lets a reader skip kernel grid/block dimensions (no analysis uses them).
    """
    path = Path(path)
    if not path.exists():
        raise TracekitError(f"{path}: no such file")
    fmt = detect_format(path)
    user_path = path
    gzipped_export = fmt == "nsys-sqlite-gz"
    if gzipped_export:
        from tracekit.readers.sqlitegz import decompress_to_cache

        path = decompress_to_cache(path)
        fmt = "nsys-sqlite"
    if fmt == "nsys-rep":
        from tracekit.readers.nsysrep import export_to_cache

        path = export_to_cache(path)
        fmt = "nsys-sqlite"
    if fmt == "nsys-sqlite":
        from tracekit.readers.nsys import read_nsys

        trace = read_nsys(path, kernel_dims=kernel_dims)
        if gzipped_export:  # the user's file, not the decompressed copy in the cache
            from dataclasses import replace

            trace = replace(trace, meta=replace(trace.meta, path=str(user_path)))
    else:
        from tracekit.readers.kineto import read_kineto

        trace = read_kineto(path, kernel_dims=kernel_dims)
    from tracekit.manifest import attach_manifest

    # a .sqlite.gz: the manifest beside the USER's file, matched against that file
    return attach_manifest(trace, user_path if gzipped_export else path)
