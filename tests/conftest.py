"""Shared test fixtures: where the real traces are, and a test session that leaves nothing behind.

Traces by other people that may not be redistributed are read in place from ``../shared/external_traces``
(beside the checkout), or from the folder ``$TRACEKIT_EXTERNAL_TRACES`` names. Where that folder is absent the
tests that need it skip. pytest's summary accounts for every skip: one line per reason with its count (the
external traces' line says how to point the tests at a copy). The committed samples (``sample_traces/``,
``tests/data/``) never skip: a missing one fails (:func:`sample`).

The session reads gzipped samples through a cache directory of its own (``$TRACEKIT_CACHE``, set here for the
session and every subprocess a test starts), removed when the session ends: the suite leaves no decompressed
copies in ``~/.cache/tracekit``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"
SAMPLES = ROOT / "sample_traces"
# ../shared/external_traces beside the checkout, or where $TRACEKIT_EXTERNAL_TRACES (or the older
# TRACEKIT_SHARED_TRACES) says: a git worktree or a CI layout may keep them elsewhere.
EXTERNAL_ENV = "TRACEKIT_EXTERNAL_TRACES"
SHARED = Path(os.environ.get(EXTERNAL_ENV) or os.environ.get("TRACEKIT_SHARED_TRACES")
              or ROOT.parent / "shared" / "external_traces")
_SKIP_TAG = "external trace not present"
# The fuzz/property tests' budget: a twentieth in the fast tier, all of it in CI's slow tier (TRACEKIT_FULL_BUDGET=1).
FULL_BUDGET = os.environ.get("TRACEKIT_FULL_BUDGET") == "1"


def budget(n: int) -> int:
    """A property test's example count: ``n`` with ``TRACEKIT_FULL_BUDGET=1`` (.ci/run's slow tier), else a twentieth."""
    return n if FULL_BUDGET else max(5, n // 20)


_SESSION_CACHE: dict[str, str | None] = {}  # the session's cache dir (and the $TRACEKIT_CACHE it replaced)


def shared(rel: str) -> Path:
    """A trace read in place from the external traces folder (the test skips when it is absent)."""
    p = SHARED / rel
    if not p.exists():
        pytest.skip(f"{_SKIP_TAG}: {p} (set {EXTERNAL_ENV}=DIR to read them from elsewhere)")
    return p


def shared_dir() -> Path:
    """The external traces folder itself (the test skips when it is absent)."""
    if not SHARED.is_dir():
        pytest.skip(f"{_SKIP_TAG}: {SHARED} (set {EXTERNAL_ENV}=DIR to read them from elsewhere)")
    return SHARED


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


def sql_rows(path: Path, query: str) -> list[tuple]:
    """The rows of ``query`` on the SQLite file ``path``, opened read-only (hand SQL that tests compare with)."""
    import sqlite3

    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return con.execute(query).fetchall()
    finally:
        con.close()


def sample_sqlite(name: str) -> Path:
    """A plain SQLite file of sample ``name`` for raw SQL (sqlite3 cannot read a .sqlite.gz): the committed
    trace.sqlite, or its .sqlite.gz decompressed once into a temp folder (never beside the sample)."""
    import gzip
    import hashlib

    p = sample_trace(name)
    if p.name.endswith(".sqlite"):
        return p
    key = hashlib.sha256(f"{p.resolve()}|{p.stat().st_size}|{p.stat().st_mtime_ns}".encode()).hexdigest()[:12]
    # (in the session's cache dir, whatever a test points $TRACEKIT_CACHE at meanwhile)
    out = Path(_SESSION_CACHE.get("dir") or tempfile.gettempdir()) / "test-samples" / f"{name}-{key}.sqlite"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f"{out.name}.{__import__('os').getpid()}.tmp")
        with gzip.open(p, "rb") as src, open(tmp, "wb") as dst:
            shutil.copyfileobj(src, dst)
        tmp.replace(out)
    return out


TIER_ENV = "TRACEKIT_TEST_TIER"   # "fast": the slow tier is left out (set once by the controlling process)


def _runs_the_fast_tier(config) -> bool:
    """``python -m pytest`` with no path and no ``-m``: the README's command, the fast tier. A path, a node id or a
    ``-m`` expression runs what it names, slow tests included (so ``pytest tests/validation/test_zoo.py`` runs)."""
    given_m = any(a == "-m" or (a.startswith("-m") and not a.startswith("--")) for a in config.invocation_params.args)
    return config.args_source == pytest.Config.ArgsSource.TESTPATHS and not given_m


def pytest_collection_modifyitems(config, items):
    """The fast tier leaves the tests marked ``slow`` out (reported as deselected); xdist's workers read the choice
    their controller made from the environment they inherit."""
    if os.environ.get(TIER_ENV) != "fast":
        return
    slow = [it for it in items if it.get_closest_marker("slow")]
    if slow:
        keep = [it for it in items if not it.get_closest_marker("slow")]
        config.hook.pytest_deselected(items=slow)
        items[:] = keep


def pytest_configure(config):
    if not hasattr(config, "workerinput"):   # the controlling process (or a run without xdist) decides the tier
        os.environ[TIER_ENV] = "fast" if _runs_the_fast_tier(config) else "chosen"
    _session_cache(config)


def _session_cache(config):
    """The session's own cache dir (the readers decompress .sqlite.gz samples into it), for this process and the
    subprocesses tests start; removed at the end (pytest_unconfigure)."""
    _SESSION_CACHE["previous"] = os.environ.get("TRACEKIT_CACHE")
    _SESSION_CACHE["dir"] = tempfile.mkdtemp(prefix="tracekit-test-cache-")
    os.environ["TRACEKIT_CACHE"] = _SESSION_CACHE["dir"]


def pytest_unconfigure(config):
    if _SESSION_CACHE.get("dir"):
        shutil.rmtree(_SESSION_CACHE.pop("dir"), ignore_errors=True)
        previous = _SESSION_CACHE.pop("previous", None)
        if previous is None:
            os.environ.pop("TRACEKIT_CACHE", None)
        else:
            os.environ["TRACEKIT_CACHE"] = previous


def pytest_report_header(config):
    state = "found" if SHARED.is_dir() else f"ABSENT (set {EXTERNAL_ENV}=DIR)"
    return f"tracekit external traces: {SHARED} {state}"


def skip_reason(report) -> str:
    """The reason a test was skipped, as ``-rs`` shows it."""
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return text.removeprefix("Skipped: ")


def pytest_terminal_summary(terminalreporter):
    """Every skip accounted for: the count per reason, the external traces' reasons folded into one line."""
    skipped = terminalreporter.stats.get("skipped", [])
    if not skipped:
        return
    external = f"the external traces are not at {SHARED}; set {EXTERNAL_ENV}=DIR (a copy of ../shared/external_traces) to run them"
    reasons = Counter(external if _SKIP_TAG in skip_reason(r) else skip_reason(r) for r in skipped)
    terminalreporter.write_line(f"tracekit: {len(skipped)} tests skipped, for {len(reasons)} "
                                f"reason{'s' if len(reasons) != 1 else ''} (-rs lists each test):", yellow=True)
    for reason, n in reasons.most_common():
        terminalreporter.write_line(f"  {n:>4}  {reason}", yellow=True)
