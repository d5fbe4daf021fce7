"""Shared test fixtures: where the real traces are."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"
SAMPLES = ROOT / "sample_traces"
# ../shared/external_traces beside the checkout; TRACEKIT_SHARED_TRACES points elsewhere (a git worktree has no
# ../shared of its own).
SHARED = Path(os.environ.get("TRACEKIT_SHARED_TRACES", ROOT.parent / "shared" / "external_traces"))


def shared(rel: str) -> Path:
    """A trace read in place from ../shared/external_traces (skipped when that folder is absent)."""
    p = SHARED / rel
    if not p.exists():
        pytest.skip(f"{p} not present (CI has ../shared; locally it may be missing)")
    return p


def sample(rel: str) -> Path:
    """A committed file of sample_traces/ (its absence is a failure, never a skip: the samples ship with the repo)."""
    p = SAMPLES / rel
    assert p.exists(), f"sample_traces/{rel} does not exist (renamed or gzipped? see sample_traces/README.md)"
    return p


def sample_trace(name: str) -> Path:
    """The committed trace file of sample ``name``: trace.sqlite, trace.sqlite.gz or trace.json.gz."""
    for f in ("trace.sqlite", "trace.sqlite.gz", "trace.json.gz"):
        if (SAMPLES / name / f).is_file():
            return SAMPLES / name / f
    raise AssertionError(f"sample_traces/{name} has no trace file (see sample_traces/README.md)")


def sample_sqlite(name: str) -> Path:
    """A plain SQLite file of sample ``name`` for raw SQL (sqlite3 cannot read a .sqlite.gz): the committed
    trace.sqlite, or its .sqlite.gz decompressed once into a temp folder (never beside the sample)."""
    import gzip
    import hashlib
    import shutil
    import tempfile

    p = sample_trace(name)
    if p.name.endswith(".sqlite"):
        return p
    key = hashlib.sha256(f"{p.resolve()}|{p.stat().st_size}|{p.stat().st_mtime_ns}".encode()).hexdigest()[:12]
    out = Path(tempfile.gettempdir()) / "tracekit-test-samples" / f"{name}-{key}.sqlite"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f"{out.name}.{__import__('os').getpid()}.tmp")
        with gzip.open(p, "rb") as src, open(tmp, "wb") as dst:
            shutil.copyfileobj(src, dst)
        tmp.replace(out)
    return out
