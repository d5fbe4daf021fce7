"""Shared test fixtures: where the real traces are.

Traces by other people that may not be redistributed are read in place from ``../shared/external_traces``
(beside the checkout), or from the folder ``$TRACEKIT_EXTERNAL_TRACES`` names. Where that folder is absent the
tests that need it skip, and pytest's summary says so in one line (with how to point the tests at a copy).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"
SAMPLES = ROOT / "sample_traces"
EXTERNAL_ENV = "TRACEKIT_EXTERNAL_TRACES"
SHARED = Path(os.environ.get(EXTERNAL_ENV) or ROOT.parent / "shared" / "external_traces")
_SKIP_TAG = "external trace not present"


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
    p = SAMPLES / rel
    if not p.exists():
        pytest.skip(f"sample trace {rel} not captured yet")
    return p


def pytest_report_header(config):
    state = "found" if SHARED.is_dir() else f"ABSENT (set {EXTERNAL_ENV}=DIR)"
    return f"tracekit external traces: {SHARED} {state}"


def pytest_terminal_summary(terminalreporter):
    """One line in the summary when tests skipped for want of the external traces (not silent in a fresh clone)."""
    n = sum(1 for r in terminalreporter.stats.get("skipped", []) if _SKIP_TAG in str(r.longrepr))
    if n:
        terminalreporter.write_line(
            f"tracekit: {n} tests skipped because the external traces are not at {SHARED}; "
            f"set {EXTERNAL_ENV}=DIR (a copy of ../shared/external_traces) to run them", yellow=True)
