"""Step windows from ranges (``tracekit.steps``: ``find_steps``, ``range_patterns``, ``select_ranges``) on real
captures, against the ranges read independently: SQL on the nsys export (``NVTX_EVENTS``), plain JSON on the Kineto
trace (``user_annotation`` events, timestamps as decimal text). Both captures ran 16 profiled decode steps
(``decode_step 40`` .. ``55``: their manifests' ``steps`` and ``first_step_index``). Inferred steps (no ranges) are
``test_inferred_steps.py``'s."""

from __future__ import annotations

import gzip
import json
from dataclasses import replace
from decimal import Decimal

import pytest

import tracekit
from tracekit.steps import find_step_spans, find_steps, range_patterns, select_ranges

from conftest import sample, sample_trace, sql_rows

NSYS = "hf-small-eager"  # plain trace.sqlite: SQL reads it as committed
KINETO = "hf-small-eager-torch"


@pytest.fixture(scope="module")
def nsys_trace():
    return tracekit.load(sample_trace(NSYS))


@pytest.fixture(scope="module")
def kineto_trace():
    return tracekit.load(sample_trace(KINETO))


def nvtx_steps() -> list[tuple]:
    """(start, end, pid, tid, name) of the export's decode_step ranges, by hand: globalTid is (pid << 24) | tid."""
    return sql_rows(sample_trace(NSYS), "SELECT start, end, (globalTid >> 24) & 16777215, globalTid & 16777215, text "
                                        "FROM NVTX_EVENTS WHERE text LIKE 'decode_step %' ORDER BY start")


def iterations(rows: list[tuple]) -> list[tuple]:
    """(start, end, ...) ranges of one thread in time order as whole iterations: each ends 1 ns before the next one
    starts, the last where its range ends (contract, "Every kernel is counted")."""
    return [(r[0], nxt[0] - 1, *r[2:]) for r, nxt in zip(rows, rows[1:])] + rows[-1:]


def test_the_manifest_and_the_export_agree_on_the_steps():
    man = json.loads(sample(f"{NSYS}/manifest.json").read_text())
    rows = nvtx_steps()
    assert len(rows) == man["steps"] == 16
    assert [r[4] for r in rows] == [f"decode_step {i}" for i in range(40, 56)]


def test_a_step_range_gives_the_ranges_it_names(nsys_trace):
    spans = find_step_spans(nsys_trace, step_range=r"^decode_step ")
    assert spans.marker == "nvtx" and spans.pattern == r"^decode_step "
    assert spans.windows["step"].to_list() == list(range(16))
    assert spans.windows.select("start", "end", "pid", "tid", "name").rows() == nvtx_steps()
    # the steps: each range to the next one's start (the host work between two ranges is the step's)
    steps = find_steps(nsys_trace, step_range=r"^decode_step ")
    assert steps.windows["step"].to_list() == list(range(16))
    assert steps.windows.select("start", "end", "pid", "tid", "name").rows() == iterations(nvtx_steps())
    assert all(a[1] < b[1] for a, b in zip(nvtx_steps(), iterations(nvtx_steps())[:-1]))  # (they did not tile)


def test_without_a_flag_the_repeating_range_is_the_step(nsys_trace):
    pats = range_patterns(nsys_trace.ranges)
    assert pats.rows() == [("decode_step #", r"^decode_step \d+$", 16, 0)]  # (the export has no other range)
    steps = find_steps(nsys_trace)
    assert steps.pattern == "decode_step #"
    assert steps.windows.select("start", "end", "pid", "tid", "name").rows() == iterations(nvtx_steps())


@pytest.mark.slow
def test_kineto_annotations_are_steps_too(kineto_trace):
    with gzip.open(sample_trace(KINETO)) as f:
        events = json.load(f, parse_float=Decimal)["traceEvents"]
    spans = sorted((e for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("decode_step ")),
                   key=lambda e: e["ts"])
    assert len(spans) == 16
    steps = find_steps(kineto_trace)
    assert steps.marker == "annotation" and steps.pattern == "decode_step #"
    w = steps.windows
    assert w["name"].to_list() == [e["name"] for e in spans]
    assert w.select("pid", "tid").rows() == [(e["pid"], e["tid"]) for e in spans]
    # µs with three decimals in the JSON: exact integer ns
    assert w["start"].to_list() == [int(e["ts"] * 1000) for e in spans]
    ends = [int((e["ts"] + e["dur"]) * 1000) for e in spans]
    assert find_step_spans(kineto_trace).windows["end"].to_list() == ends
    assert w["end"].to_list() == [int(e["ts"] * 1000) - 1 for e in spans[1:]] + ends[-1:]


def test_the_marker_is_what_the_reader_calls_it(nsys_trace):
    """Steps are named by the trace's own word for its ranges (TraceMeta.markers, set by the format's reader)."""
    renamed = replace(nsys_trace, meta=replace(nsys_trace.meta, markers="region"))
    assert find_steps(renamed, step_range=r"^decode_step ").marker == "region"


def test_a_step_range_is_searched_not_matched(nsys_trace):
    """``re.search`` semantics: a regex without ^ matches inside a name; one that matches no range gives no steps."""
    assert select_ranges(nsys_trace.ranges, r"step 4[0-2]$")["name"].to_list() == [
        "decode_step 40", "decode_step 41", "decode_step 42"]
    assert sql_rows(sample_trace(NSYS), "SELECT count(*) FROM NVTX_EVENTS WHERE text GLOB '*step 4[0-2]'") == [(3,)]
    assert find_steps(nsys_trace, step_range=r"^step ") is None
