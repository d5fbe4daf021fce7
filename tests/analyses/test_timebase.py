"""The time base (``tracekit.analyses.timebase``): the step every saving is stated against. On hf-small-eager (16
eager decode steps; its manifest's ``unprofiled_step_ms`` is the median of 40 steps timed with CUDA events before
profiling): the traced step is the mean period of the analysed steps, computed here from SQL (each step from its
first activity to the next step's first, the last of the 16 dropped); the reference is the manifest's step, a flag's
step or a flag's throughput. Its validation against the captures' measured graph steps is
``tests/validation/test_validation_timebase.py``'s."""

from __future__ import annotations

import json

import pytest

import tracekit
from tracekit.analyses.resolve import time_base
from tracekit.analyses.timebase import host_bound

from conftest import sample, sample_trace, sql_rows

PATH = sample_trace("hf-small-eager")


@pytest.fixture(scope="module")
def trace():
    return tracekit.load(PATH)


def traced_step_ms() -> float:
    """The mean period of the 15 analysed steps: (first activity of step 16 - first of step 1) / 15."""
    firsts = [s for (s,) in sql_rows(PATH, """
        SELECT min(a.start) FROM (SELECT start, correlationId, globalPid FROM CUPTI_ACTIVITY_KIND_KERNEL
                                  UNION ALL SELECT start, correlationId, globalPid FROM CUPTI_ACTIVITY_KIND_MEMCPY
                                  UNION ALL SELECT start, correlationId, globalPid FROM CUPTI_ACTIVITY_KIND_MEMSET) a
        JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = a.correlationId AND (r.globalTid >> 24) = (a.globalPid >> 24)
        JOIN NVTX_EVENTS n ON n.globalTid = r.globalTid AND r.start BETWEEN n.start AND n.end
             AND n.text LIKE 'decode_step %'
        GROUP BY n.text ORDER BY min(a.start)""")]
    assert len(firsts) == 16
    return (firsts[15] - firsts[0]) / 15 / 1e6


def test_the_manifest_step_is_the_reference(trace):
    man = json.loads(sample("hf-small-eager/manifest.json").read_text())
    tb = tracekit.breakdown(trace).time_base
    assert tb.traced_step_ms == pytest.approx(traced_step_ms(), rel=1e-12)
    assert (tb.unprofiled_step_ms, tb.unprofiled_source, tb.reference_step_ms) == (
        man["unprofiled_step_ms"], "manifest", man["unprofiled_step_ms"])
    assert tb.profiler_inflation == pytest.approx(traced_step_ms() / man["unprofiled_step_ms"], rel=1e-12)
    assert tb.profiler_inflation > 2  # (the profiler records every one of the step's 1,209 launches)


def test_a_measured_step_or_throughput_replaces_the_manifest(trace):
    tb = tracekit.breakdown(trace, measured_step_ms=30.0).time_base
    assert (tb.reference_step_ms, tb.unprofiled_source) == (30.0, "flag")
    # tok/s of the whole batch: step ms = 1000 x tokens per step / tok/s
    tb = tracekit.breakdown(trace, measured_tok_s=64.0, tokens_per_step=2).time_base
    assert tb.reference_step_ms == pytest.approx(1000 * 2 / 64.0) and tb.unprofiled_source == "flag"


def test_without_an_unprofiled_step_the_traced_one_is_the_reference():
    tb = time_base(traced_step_ms(), tokens=1.0).value
    assert (tb.reference_step_ms, tb.unprofiled_source, tb.profiler_inflation) == (traced_step_ms(), None, None)


def test_host_bound_when_the_gpu_idles_a_fifth_of_the_step(trace):
    """Eager under the profiler: the GPU is busy 2.35 ms of the ~80.6 ms step (the rest waits for the host)."""
    b = tracekit.breakdown(trace)
    per = b.per_step_ms
    assert per["launch_gaps"] + per["idle"] == pytest.approx(traced_step_ms() - b.facts.busy_ms, rel=1e-9)
    assert host_bound(per, b.steps["mean_ms"])
    assert not host_bound({"launch_gaps": 0.1 * 6.0, "idle": 0.09 * 6.0}, 6.0)  # 19% of the step
    assert host_bound({"launch_gaps": 0.1 * 6.0, "idle": 0.1 * 6.0}, 6.0)  # 20%
