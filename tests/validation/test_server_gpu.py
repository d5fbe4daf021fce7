"""`tracekit capture --server URL` against the SGLang test server in front of a real EAGLE loop on an H100 (issue 43;
docs/validation.md, "Profiling a server over HTTP"; sample_traces/server-gpu/).

The independent figures are the loop's own, measured in the server's process with CUDA events before the client ran
(sample_traces/server-gpu/results.json, ``loop``): its unprofiled spec step and its accept length (a known
acceptance: 1, 2, 0, 3 drafts accepted in turn, 2.5 tokens a step). The manifest the client wrote from the HTTP
stream must agree within 5%, and ``breakdown DIR`` must state its savings against the manifest's step with no flag.
"""

from __future__ import annotations

import json

import pytest

import tracekit

from conftest import SAMPLES

# The validation sweeps are the slow tier (`python -m pytest -m slow`; .ci/run runs them after the fast tier).
pytestmark = pytest.mark.slow

RESULTS = SAMPLES / "server-gpu" / "results.json"


@pytest.mark.parametrize("size", ["small", "large"])
def test_server_capture_on_the_gpu_matches_the_loop(size):
    r = json.loads(RESULTS.read_text())[size]
    man = json.loads((SAMPLES / "server-gpu" / size / "manifest.json").read_text())
    assert man["schema"] == "tracekit.manifest/2" and man["server"]["engine"] == "sglang"
    assert man["unprofiled_step_ms"] == pytest.approx(r["loop"]["unprofiled_step_ms"], rel=0.05)
    assert man["spec"]["accept_len"] == pytest.approx(r["loop"]["accept_len"], rel=0.05)
    lo, hi = man["unprofiled_step_ms_spread"]
    assert lo <= man["unprofiled_step_ms"] <= hi
    assert man["tp"] == 1 and man["concurrency"] == man["tokens_per_step"] == 1
    assert man["spec"]["draft_tokens"] == man["server"]["config"]["speculative_num_steps"] == 3
    # the whole directory, no flag typed: the manifest's time base, tp and accept length apply
    b = tracekit.breakdown_file(SAMPLES / "server-gpu" / size / man["trace_files"][0]["name"])
    d = b.advice["drafting"]
    assert b.time_base.unprofiled_step_ms == man["unprofiled_step_ms"] and b.time_base.unprofiled_source == "manifest"
    assert d["speculative"] is True and d["draft_model"] is True and d["detection"] == "structure"
    assert b.steps["phase"] == "decode" and b.steps["count"] >= 15  # whole iterations, not the verify spans alone
    acc = man["spec"]["accept_len"]
    assert d["max_saving_ms"] == pytest.approx(man["unprofiled_step_ms"] - acc * d["predicted_step_ms"])
    assert d["max_saving_ms"] < 0  # speculation pays at 2.5 accepted tokens a step
