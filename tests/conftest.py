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
    p = SAMPLES / rel
    if not p.exists():
        pytest.skip(f"sample trace {rel} not captured yet")
    return p
