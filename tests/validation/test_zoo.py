"""The speculative zoo against its truth (issue 42; contract, Additions to /3).

Seven speculative decode loops shaped like the engines' workers (sample_traces/zoo-*: SGLang EAGLE chain and tree, a
standalone draft model run eagerly, n-gram proposals without a draft model, vLLM's order, multi-layer MTP, a hybrid
linear-attention target with an MTP head), each captured on an H100 three ways: unmarked under nsys, under the torch
profiler with only the engine's own spans and Python frames, and with NVTX marks (the truth twin). Each capture's
process measured, before profiling, its spec step and its plain step (the same target decoding one token per
sequence, no speculation) — independent figures in its manifest. On every capture, with its manifest and without
it (a user's trace):
- speculative true, draft_model right (false for n-gram), every analysed step decode;
- drafting kernel time per step within 5% of the marked twin's draft ranges (n-gram, whose drafting is the upload
  of the host's proposals, within 0.005 ms);
- the predicted plain step within 10% of the measured one;
- verify_tokens the manifest's K+1 where the manifest, the engine's spans or its batch say it.
The zoo is also the fit/check set of the plain step's one fitted constant (the H100's unprofiled graph-node gap):
docs/validation.md, "The speculative zoo".
"""

from __future__ import annotations

import functools
import json
import re
import shutil

import pytest

import tracekit

from conftest import SAMPLES, sample_trace

# The validation sweeps are the slow tier (`python -m pytest -m slow`; .ci/run runs them after the fast tier).
pytestmark = pytest.mark.slow

SHAPES = ("sglang-chain", "sglang-tree", "standalone", "ngram", "vllm-eagle", "mtp-multilayer", "hybrid-nextn")
VARIANTS = ("nomark", "engine", "marked")
CAPTURES = [f"zoo-{s}-{v}" for s in SHAPES for v in VARIANTS]


def manifest(name: str) -> dict:
    return json.loads((SAMPLES / name / "manifest.json").read_text())


@functools.cache
def analysed(name: str, bare: bool) -> dict:
    """The breakdown of capture ``name`` (JSON), with its manifest or from a copy without it."""
    src = sample_trace(name)
    if bare:
        import tempfile
        from pathlib import Path

        tmp = Path(tempfile.mkdtemp(prefix="zoo-bare-"))
        shutil.copy(src, tmp / src.name)
        src = tmp / src.name
    return tracekit.breakdown(tracekit.load(src)).to_dict()


@functools.cache
def truth_ms(shape: str) -> float:
    """Drafting kernel time per step of the marked twin (its draft ranges, with its manifest)."""
    b = analysed(f"zoo-{shape}-marked", False)
    assert b["advice"]["drafting"]["detection"] == "ranges"
    return b["kernel_ms_per_step"]["drafting"]


@pytest.mark.parametrize("bare", [False, True], ids=["manifest", "bare"])
@pytest.mark.parametrize("name", CAPTURES)
def test_zoo_capture_against_its_truth(name, bare):
    shape = name[len("zoo-"):name.rindex("-")]
    m = manifest(name)
    b = analysed(name, bare)
    d = b["advice"]["drafting"]
    assert d["speculative"] is True, d["evidence"]
    assert d["draft_model"] is (shape != "ngram"), d["evidence"]
    assert m["draft_model"]["exists"] is (shape != "ngram")  # (the capture's own word)
    assert set(b["steps"]["phases"]) == {"decode"} and b["steps"]["phase"] == "decode"
    ms, truth = b["kernel_ms_per_step"]["drafting"], truth_ms(shape)
    if shape == "ngram":
        assert ms > 0 and abs(ms - truth) <= 0.005
    else:
        assert ms == pytest.approx(truth, rel=0.05)
    measured = m["unprofiled_plain_step_ms"]
    assert d["predicted_step_ms"] == pytest.approx(measured, rel=0.10)
    k1 = m["spec"]["draft_tokens"] + 1 if shape != "sglang-tree" else m["verify_tokens"]
    if not bare or name.endswith("-engine"):  # (the manifest, the engine's spans or its batch say it)
        assert d["verify_tokens"] == k1, d["evidence"]
    else:
        assert d["verify_tokens"] in (None, k1)


def test_zoo_is_complete_and_independent():
    """Every shape has its three captures, each with its own unprofiled spec and plain steps and accept length
    (measured in its own process: no figure is shared between captures)."""
    for name in CAPTURES:
        m = manifest(name)
        assert m["unprofiled_step_ms"] > m["unprofiled_plain_step_ms"] > 0
        assert 1.0 < m["spec"]["accept_len"] <= m["spec"]["draft_tokens"] + 1
    marked = [manifest(f"zoo-{s}-marked") for s in SHAPES]
    assert len({m["unprofiled_step_ms"] for m in marked}) == len(SHAPES)


@pytest.mark.parametrize("shape", [s for s in SHAPES if s != "ngram"])
def test_draft_forwards_a_step_are_the_engines_k(shape):
    """Each draft-model forward proposes one token per sequence as the engines run them (SGLang: num_steps - 1 draft
    forwards, then the draft-extend whose top-k seeds the next round; vLLM: K proposer forwards after the verify;
    multi-layer MTP: one forward per head): the draft forwards the structure counts in an unmarked capture without
    its manifest are the K its process ran (the manifest's speculative_num_steps), whatever their order around the
    verify. --model without a manifest takes K from this count."""
    b = analysed(f"zoo-{shape}-nomark", True)
    d = b["advice"]["drafting"]
    assert d["detection"] == "structure", d["evidence"]
    run = re.match(r"^\d+ of \d+ steps run (\d+) draft forwards? besides the target forward", d["evidence"][0])
    assert run, d["evidence"]
    assert int(run.group(1)) == manifest(f"zoo-{shape}-nomark")["speculative_num_steps"]
