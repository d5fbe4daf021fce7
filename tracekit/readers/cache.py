"""The cache directory: where tracekit writes the SQLite it reads but cannot read in place.

A gzipped export (``.sqlite.gz``, :mod:`tracekit.readers.nsys.sqlitegz`) is decompressed here and an ``.nsys-rep``
(:mod:`tracekit.readers.nsys.rep`) converted here — never beside the user's file. Each entry is one
``NAME-KEY.sqlite`` (the key: the source file's resolved path, size and mtime, so an unchanged file is converted
once); a partial write never becomes an entry (written to a temporary name, then renamed).

The directory is bounded: after each new entry the least recently used ones are removed until the entries fit
under the cap (an entry's mtime is its last use: every cache hit touches it). The cap is ``$TRACEKIT_CACHE_MAX``
(a byte amount: ``4GB``, ``500MiB``; ``0`` keeps only the newest entry), default :data:`DEFAULT_MAX`; the entry just
made is always kept, however large. ``tracekit cache info`` shows the directory, and ``tracekit cache clear``
empties it.

Where: ``$TRACEKIT_CACHE``, else ``$XDG_CACHE_HOME/tracekit``, else ``~/.cache/tracekit``.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from tracekit.errors import BadOptionValue, TracekitError

DEFAULT_MAX = 4 * 10**9  # bytes: a few large exports
SUFFIX = ".sqlite"
STALE_TMP_S = 3600  # a temporary file this old is a conversion that died


def cache_dir() -> Path:
    base = os.environ.get("TRACEKIT_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "tracekit")
    return Path(base)


def max_bytes() -> int:
    """The cap: ``$TRACEKIT_CACHE_MAX`` (a byte amount), else :data:`DEFAULT_MAX`."""
    text = os.environ.get("TRACEKIT_CACHE_MAX")
    if not text:
        return DEFAULT_MAX
    from tracekit.model.units import parse_bytes

    try:
        return parse_bytes(text, what="TRACEKIT_CACHE_MAX")
    except TracekitError as e:
        raise BadOptionValue(f"{e} (TRACEKIT_CACHE_MAX: the cache's size cap, e.g. 4GB)") from None


@dataclass(frozen=True)
class Entry:
    path: Path
    bytes: int
    last_used: float  # mtime: set on creation and on every hit


def entries(directory: Path | None = None) -> list[Entry]:
    """The cache's entries, least recently used first."""
    d = directory or cache_dir()
    out = []
    try:
        files = list(d.iterdir())
    except OSError:
        return []
    for p in files:
        if p.name.endswith(SUFFIX) and not p.name.endswith(".tmp" + SUFFIX):
            try:
                st = p.stat()
            except OSError:  # removed meanwhile (another tracekit evicting)
                continue
            out.append(Entry(p, st.st_size, st.st_mtime))
    return sorted(out, key=lambda e: (e.last_used, e.path.name))


def hit(path: Path) -> bool:
    """Mark ``path`` as just used; False when it is no longer there (evicted meanwhile: make it again)."""
    try:
        os.utime(path)
        return True
    except FileNotFoundError:
        return False
    except OSError:  # a read-only cache still serves what it holds
        return path.exists()


def evict(keep: Path, limit: int | None = None) -> list[Path]:
    """Remove the least recently used entries until the rest fit under ``limit`` (default :func:`max_bytes`);
    ``keep`` (the entry just made) stays. Also removes temporary files of conversions that died. Returns what
    was removed."""
    limit = max_bytes() if limit is None else limit
    d = keep.parent
    removed = []
    now = time.time()
    for p in d.glob("*.tmp*"):
        try:
            if now - p.stat().st_mtime > STALE_TMP_S:
                p.unlink()
                removed.append(p)
        except OSError:
            pass
    listed = entries(d)
    total = sum(e.bytes for e in listed)
    for e in listed:
        if total <= limit:
            break
        if e.path == keep:
            continue
        try:
            e.path.unlink()
        except FileNotFoundError:
            pass
        except OSError:
            continue
        total -= e.bytes
        removed.append(e.path)
    return removed


def info() -> dict:
    """What ``tracekit cache info`` prints: the directory, its entries (most recent first), their size, the cap."""
    listed = entries()
    return {"dir": str(cache_dir()), "max_bytes": max_bytes(), "bytes": sum(e.bytes for e in listed),
            "entries": [{"name": e.path.name, "bytes": e.bytes,
                         "last_used": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(e.last_used))}
                        for e in reversed(listed)]}


def clear() -> tuple[int, int]:
    """Remove every entry (and leftover temporary files); returns (files removed, bytes freed)."""
    n = freed = 0
    d = cache_dir()
    for p in [e.path for e in entries(d)] + (list(d.glob("*.tmp*")) if d.is_dir() else []):
        try:
            size = p.stat().st_size
            p.unlink()
        except OSError:
            continue
        n, freed = n + 1, freed + size
    return n, freed


__all__ = ["cache_dir", "max_bytes", "entries", "hit", "evict", "info", "clear", "DEFAULT_MAX", "Entry"]
