"""The partition (``tracekit.analyses.partition``): each analysed step's period, split exactly into categories, on
a real capture (hf-small-eager, 16 decode_step ranges), against figures computed here from SQL on the export: each
activity of device 0 in the step whose range was open on the launching thread at its launch call, the step's period
from its first activity to the next step's first, its GPU-busy time as the union of its activities' intervals (a
sweep in plain Python), its kernel time and count."""

from __future__ import annotations

from collections import defaultdict

import pytest

import tracekit
from tracekit.analyses.attribution import attribute
from tracekit.analyses.partition import partition
from tracekit.categories import LAST_STEP

from conftest import sample_trace, sql_rows

PATH = sample_trace("hf-small-eager")
GAPS = ("x_launch_gaps", "x_idle")


def _by_step() -> dict[str, list[tuple[int, int, str]]]:
    """decode_step name -> its activities (start, end, kind), by SQL."""
    rows = sql_rows(PATH, """
        SELECT n.text, a.start, a.end, a.kind FROM (
            SELECT start, end, correlationId, globalPid, deviceId, 'kernel' AS kind FROM CUPTI_ACTIVITY_KIND_KERNEL
            UNION ALL SELECT start, end, correlationId, globalPid, deviceId, 'memop' FROM CUPTI_ACTIVITY_KIND_MEMCPY
            UNION ALL SELECT start, end, correlationId, globalPid, deviceId, 'memop' FROM CUPTI_ACTIVITY_KIND_MEMSET) a
        JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = a.correlationId AND (r.globalTid >> 24) = (a.globalPid >> 24)
        JOIN NVTX_EVENTS n ON n.globalTid = r.globalTid AND r.start BETWEEN n.start AND n.end
             AND n.text LIKE 'decode_step %'
        WHERE a.deviceId = 0""")
    out = defaultdict(list)
    for name, s, e, kind in rows:
        out[name].append((s, e, kind))
    return out


def union_length(intervals) -> int:
    total, cur_s, cur_e = 0, None, None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            total += 0 if cur_e is None else cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    return total + (0 if cur_e is None else cur_e - cur_s)


@pytest.fixture(scope="module")
def trace():
    return tracekit.load(PATH)


@pytest.fixture(scope="module")
def by_step():
    return _by_step()


def test_periods_run_from_a_step_first_activity_to_the_next_one(trace, by_step):
    st = partition(attribute(trace, step_range=r"^decode_step "), trace)
    first = [min(s for s, _, _ in by_step[f"decode_step {i}"]) for i in range(40, 56)]
    assert st.excluded_reasons == {LAST_STEP: 1} and st.count == 15  # (16 ranges: the last has no next step)
    t = st.table
    assert t["step"].to_list() == list(range(15))
    assert t["p_start"].to_list() == first[:15]
    assert t["p_end"].to_list() == first[1:]
    assert (t["period"] == t["p_end"] - t["p_start"]).all()
    assert st.periods["reason"].to_list() == [None] * 15 + [LAST_STEP]


def test_the_categories_split_each_period_exactly(trace, by_step):
    st = partition(attribute(trace, step_range=r"^decode_step "), trace)
    t = st.table
    x = [c for c in t.columns if c.startswith("x_")]
    assert set(GAPS) <= set(x) and len(x) > len(GAPS)
    assert (t.select(sum(t[c] for c in x)).to_series() == t["period"]).all()
    for row in t.iter_rows(named=True):
        acts = by_step[f"decode_step {40 + row['step']}"]
        p0, p1 = row["p_start"], row["p_end"]
        busy = union_length((max(s, p0), min(e, p1)) for s, e, _ in acts if min(e, p1) > max(s, p0))
        assert sum(row[c] for c in x if c not in GAPS) == busy, row["step"]
        kernels = [(s, e) for s, e, kind in acts if kind == "kernel"]
        assert (row["n_kernels"], row["k_all"]) == (len(kernels), sum(e - s for s, e in kernels)), row["step"]


def test_with_two_steps_the_last_is_analysed_to_its_range_end(trace, by_step):
    """Fewer than three steps: none is dropped as 'the last'; the last one ends at the later of its last activity's
    end and its range's end."""
    st = partition(attribute(trace, step_range=r"^decode_step 4[01]$"), trace)
    assert st.count == 2 and st.excluded_reasons == {}
    (range_end,), = sql_rows(PATH, "SELECT end FROM NVTX_EVENTS WHERE text = 'decode_step 41'")
    acts = by_step["decode_step 41"]
    last = st.table.row(1, named=True)
    assert last["p_start"] == min(s for s, _, _ in acts)
    assert last["p_end"] == max(range_end, max(e for _, e, _ in acts))
