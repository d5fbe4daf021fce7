"""``.nsys-rep`` input: converted to SQLite with the user's ``nsys``, into a cache directory.

Never next to the user's file (the input is never modified and nothing is written beside
it). The cache key is the report's size, mtime and path, so an unchanged report is
exported once; the cache is bounded (:mod:`tracekit.readers.cache`).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

from tracekit.errors import ToolMissing, UnreadableTrace
from tracekit.readers.cache import cache_dir, evict, hit


def export_to_cache(report: Path) -> Path:
    nsys = os.environ.get("NSYS") or shutil.which("nsys")
    if not nsys:
        raise ToolMissing(
            f"{report}: .nsys-rep needs an nsys binary on PATH to convert it; or convert it yourself: "
            f"nsys export --type sqlite -o {report.with_suffix('.sqlite').name} {report}")
    st = report.stat()
    key = hashlib.sha256(f"{report.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:16]
    out = cache_dir() / f"{report.stem}-{key}.sqlite"
    if out.exists() and hit(out):
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp.sqlite")
    cmd = [nsys, "export", "--type", "sqlite", "--force-overwrite", "true", "-o", str(tmp), str(report)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise UnreadableTrace(f"{report}: nsys export failed to run ({e})")
    if proc.returncode != 0 or not tmp.exists():
        last = (proc.stderr or proc.stdout or "").strip().splitlines()[-1:] or ["no output"]
        raise UnreadableTrace(f"{report}: `nsys export` failed (exit {proc.returncode}): {last[0]}")
    tmp.replace(out)
    evict(keep=out)
    return out
