"""The independent validation set (``../shared/validation``: speculative decode loops captured by a harness outside
this project, on an H200 and an H100, with truth measured without a profiler and NVTX-marked twins; issue 48).

Per unmarked trace, against ``truth.json`` (figures this project did not compute): speculative and draft_model
right (an unmarked nsys n-gram loop without shapes may abstain: null, with the reason in the evidence); drafting
kernel time per step within 5% of the marked twin's (``draft_kernel_ms``, SQL over its draft ranges); the plain step
(``advice.drafting.predicted_step_ms``) within 10% of the plain step measured without a profiler
(``plain_step_ms``); every analysed step decode. The two known misses are pinned as strict xfails with their reason
(docs/validation.md, "The validation set"). The folder is read in place: absent, the tests skip.
"""

from __future__ import annotations

import functools
import gzip
import json
import lzma
import os
import shutil
import tempfile
from pathlib import Path

import pytest

import tracekit

ROOT = Path(__file__).resolve().parents[2]
VALIDATION = Path(os.environ.get("TRACEKIT_VALIDATION") or ROOT.parent / "shared" / "validation")
if not VALIDATION.is_dir():
    VALIDATION = Path("/work/shared/validation")

pytestmark = pytest.mark.slow


@functools.cache
def truth() -> dict:
    f = VALIDATION / "truth.json"
    if not f.exists():
        pytest.skip(f"the validation set is not at {VALIDATION} (set TRACEKIT_VALIDATION=DIR)")
    return json.loads(f.read_text())


def unmarked() -> list[str]:
    try:
        t = json.loads((VALIDATION / "truth.json").read_text())
    except OSError:
        return []
    return sorted(n for n, v in t.items() if not (v.get("nvtx") or n.endswith("_mark.sqlite")
                                                  or v.get("markers") == "nvtx"))


@functools.cache
def _dir() -> Path:
    return Path(tempfile.mkdtemp(prefix="tk-validation-"))


def unpack(name: str) -> Path:
    """The trace ``name`` of truth.json unpacked from its ``.xz`` (a ``.json.gz`` stays gzipped)."""
    src = VALIDATION / ((name[:-3] if name.endswith(".json.gz") else name) + ".xz")
    dst = _dir() / name
    if not dst.exists():
        with lzma.open(src) as i, (gzip.open(dst, "wb") if name.endswith(".gz") else open(dst, "wb")) as o:
            shutil.copyfileobj(i, o)
    return dst


@functools.cache
def reading(name: str) -> dict:
    t = truth()[name]
    return tracekit.breakdown(tracekit.load(unpack(name)), measured_step_ms=t["spec_step_ms"]).to_dict()


def rel(a: float, b: float) -> float:
    return (a - b) / b


# the plain step misses kept as they are (docs/validation.md, "The validation set"): an eager verify forward whose
# measured plain step (7.67 ms) is above the speculative step less its draft phase (≈7.0 ms), host-bound and noisy
# (the loop's own note: eager unprofiled steps vary 9.4-10.4 ms); and the tree under the torch profiler, whose traced
# host turnaround (read to next launch) is three times the nsys capture's of the same loop.
PLAIN_MISSES = {"spec_small_eager.sqlite": "eager, host-bound verify: the measured plain step is above spec - draft",
                "sv_tree_torch.json.gz": "torch profiler's host turnaround, 3x the nsys twin's"}


@pytest.mark.parametrize("name", unmarked())
def test_speculation_recognised_or_abstained_with_a_reason(name):
    t, d = truth()[name], reading(name)["advice"]["drafting"]
    if t.get("variant") == "ngram" and name.endswith(".sqlite"):
        # nothing in an unmarked nsys n-gram loop without shapes says K+1 tokens are verified: null, with the reason
        assert d["speculative"] is None and d["predicted_step_ms"] is None
        assert any(e.startswith("speculative unknown (null)") for e in d["evidence"]), d["evidence"]
        return
    assert d["speculative"] is True and d["draft_model"] is t.get("draft_model", True), d
    assert "not detected" not in d["verdict"]


def with_twin() -> list[str]:
    t = json.loads((VALIDATION / "truth.json").read_text()) if (VALIDATION / "truth.json").exists() else {}
    return [n for n in unmarked() if t[n].get("draft_kernel_ms") is not None and t[n].get("draft_model", True)]


@pytest.mark.parametrize("name", with_twin())
def test_drafting_within_5pct_of_the_marked_twin(name):
    t, b = truth()[name], reading(name)
    got = b["kernel_ms_per_step"]["drafting"]
    assert abs(rel(got, t["draft_kernel_ms"])) <= 0.05, (got, t["draft_kernel_ms"])


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=PLAIN_MISSES[n]))
                                  if n in PLAIN_MISSES else n for n in unmarked() if "ngram" not in n])
def test_plain_step_within_10pct_of_the_measured(name):
    t, d = truth()[name], reading(name)["advice"]["drafting"]
    assert d["predicted_step_ms"] is not None
    assert abs(rel(d["predicted_step_ms"], t["plain_step_ms"])) <= 0.10, (d["predicted_step_ms"], t["plain_step_ms"])


@pytest.mark.parametrize("name", unmarked())
def test_every_complete_step_is_decode(name):
    ph = reading(name)["steps"]["phases"]
    assert not set(ph) - {"decode", "unknown"} and ph.get("unknown", 0) <= 1, ph


def test_the_sglang_extend_without_sampling_is_a_forward_of_its_own():
    """spec_small_graph (H200): K = 3 chained one-layer draft forwards, the verify, and a draft-extend over K+1 that
    samples nothing: the structure counts 4 draft forwards a step (K + the extend), 1 layer each, beside the target's
    L = 16 layers (truth.json's K and L)."""
    t = truth()["spec_small_graph.sqlite"]
    d = reading("spec_small_graph.sqlite")["advice"]["drafting"]
    assert d["detection"] == "structure"
    assert d["evidence"][0].split(" run ")[1].startswith(f"{t['K'] + 1} draft forwards"), d["evidence"]
    assert f"against the target forward's {t['L']} layers" in d["evidence"][1], d["evidence"]
