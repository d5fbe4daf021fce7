"""steps.phases of every shared real trace against what its authors say it is (../shared/external_traces/FACTS.toml).

FACTS.toml gives each trace's workload from its provenance, never from an analysis of ours: decode, prefill, mixed
(decode and prefill/extend steps), training, inference (not an LLM), microbenchmark, none. tracekit's phases must
not contradict it: a decode trace's steps are decode, a prefill trace's prefill, a mixed window holds both, and
training, non-LLM inference and micro-benchmarks are never decode. A trace where no steps can be found has no
phases to contradict (serving traces must have steps, though).

The serving traces are checked a second time with their annotations removed (the engines' step ranges and every
other range): the phases must then come from the steps' own work (token-proportional GEMMs and collectives, graph
replays, decode kernels) and still agree.
"""

from __future__ import annotations

import dataclasses
import sys

import pytest

import tracekit
from tracekit.errors import NoGpuActivity, NoSteps
from tracekit.run.pipeline import step_table

from conftest import SHARED

# The validation sweeps are the slow tier (`python -m pytest -m slow`; .ci/run runs them after the fast tier).
pytestmark = pytest.mark.slow

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

FACTS_FILE = SHARED / "FACTS.toml"
FACTS = tomllib.loads(FACTS_FILE.read_text()) if FACTS_FILE.is_file() else {}
SERVING = ("decode", "prefill", "mixed")
# Serving traces whose steps can be inferred without any range (the two single-step TraceLens windows have one
# step each: no period to infer a step from).
UNMARKED = [rel for rel, f in FACTS.items() if f.get("workload") in SERVING and "TraceLens" not in rel]


def _phases(trace) -> dict[str, int]:
    return step_table(trace, phase="all").phases_found


def agrees(workload: str, phases: dict[str, int]) -> bool:
    """Whether ``phases`` (steps.phases) agrees with a FACTS workload."""
    known = {p for p, n in phases.items() if n and p != "unknown"}
    if workload == "decode":
        return known == {"decode"}
    if workload == "prefill":
        return known == {"prefill"}
    if workload == "mixed":
        return "decode" in known and bool(known & {"prefill", "mixed"})
    if workload == "training":  # (contract, Additions to /3: training steps are "training", never prefill)
        return known <= {"training"}
    return "decode" not in known  # inference (not an LLM), microbenchmark, none


def test_agreement_rule():
    """The rule itself (a definition test)."""
    assert agrees("decode", {"decode": 9}) and not agrees("decode", {"decode": 8, "prefill": 1})
    assert agrees("mixed", {"decode": 8, "prefill": 8}) and not agrees("mixed", {"decode": 16})
    assert agrees("training", {"training": 5}) and agrees("training", {"unknown": 3})
    assert not agrees("training", {"prefill": 5})
    assert not agrees("microbenchmark", {"decode": 2})


@pytest.mark.parametrize("rel", sorted(FACTS) or ["<no FACTS.toml>"], ids=lambda r: r.split("/")[-1][:40])
def test_phases_agree_with_facts(rel):
    if rel not in FACTS:
        pytest.skip(f"external trace not present: {FACTS_FILE}")
    workload = FACTS[rel]["workload"]
    path = SHARED / rel
    if not path.exists():
        pytest.skip(f"external trace not present: {path}")
    trace = tracekit.load(path)
    try:
        phases = _phases(trace)
    except (NoSteps, NoGpuActivity) as e:
        assert workload not in SERVING, f"a {workload} trace must have steps: {e}"
        return
    assert agrees(workload, phases), f"{rel}: FACTS says {workload}, steps.phases is {phases}"


@pytest.mark.parametrize("rel", UNMARKED or ["<no FACTS.toml>"], ids=lambda r: r.split("/")[-1][:40])
def test_unmarked_serving_phases_agree_with_facts(rel):
    """The same serving traces without any range: steps inferred, phases from the steps' own work."""
    if rel not in FACTS:
        pytest.skip(f"external trace not present: {FACTS_FILE}")
    path = SHARED / rel
    if not path.exists():
        pytest.skip(f"external trace not present: {path}")
    trace = tracekit.load(path)
    bare = dataclasses.replace(trace, ranges=trace.ranges.head(0), manifest=None)
    phases = _phases(bare)
    assert agrees(FACTS[rel]["workload"], phases), f"{rel} unmarked: FACTS says {FACTS[rel]['workload']}, {phases}"
