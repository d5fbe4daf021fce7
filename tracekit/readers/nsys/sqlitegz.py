"""``.sqlite.gz`` input (a gzipped nsys SQLite export): decompressed into the cache directory, then
read as an export.

Never next to the user's file (the input is never modified and nothing is written beside it), and
SQLite cannot read a compressed file in place. The cache key is the file's resolved path, size and
mtime (as for ``.nsys-rep``), so an unchanged file is decompressed once; a partial decompression
never becomes a cache entry (written to a temporary name, then renamed). The cache is bounded
(:mod:`tracekit.readers.cache`: least recently used entries go first).
"""

from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import zlib
from pathlib import Path

from tracekit.errors import CannotWrite, UnreadableTrace
from tracekit.readers.cache import cache_dir, evict, hit

SQLITE_MAGIC = b"SQLite format 3\x00"


def is_gzipped_sqlite(path: Path) -> bool:
    """True when ``path`` is a gzip stream whose content starts like an SQLite database."""
    try:
        with gzip.open(path, "rb") as f:
            return f.read(len(SQLITE_MAGIC)) == SQLITE_MAGIC
    except (OSError, EOFError, zlib.error):
        return False


def decompress_to_cache(path: Path) -> Path:
    """The decompressed export of ``path`` in the cache dir (made once per file version)."""
    path = Path(path)
    st = path.stat()
    key = hashlib.sha256(f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:16]
    stem = path.name[:-len(".gz")] if path.name.endswith(".gz") else path.name
    stem = stem[:-len(".sqlite")] if stem.endswith(".sqlite") else stem
    out = cache_dir() / f"{stem}-{key}.sqlite"
    if out.exists() and hit(out):
        return out
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CannotWrite(f"{path}: cannot create the cache dir {out.parent} to decompress into "
                            f"({e.strerror or e}); set TRACEKIT_CACHE to a writable folder or gunzip it yourself")
    tmp = out.with_name(f"{out.name}.{os.getpid()}.tmp")
    try:
        with gzip.open(path, "rb") as src, open(tmp, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    except (OSError, EOFError, zlib.error) as e:
        tmp.unlink(missing_ok=True)
        if isinstance(e, OSError) and not isinstance(e, gzip.BadGzipFile) and e.errno is not None:
            raise CannotWrite(f"{path}: cannot decompress into {out.parent} ({e.strerror or e}); "
                                f"set TRACEKIT_CACHE to a writable folder or gunzip it yourself")
        raise UnreadableTrace(f"{path}: damaged gzip file ({e}); check the download, or gunzip it to see how much "
                            f"is readable")
    os.replace(tmp, out)
    evict(keep=out)
    return out
