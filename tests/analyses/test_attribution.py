"""Attribution (``tracekit.analyses.attribution``): every GPU activity of the analysed device, the step and draft
window its launch call was made in (on the launching thread), the device chosen. Checked on real captures against
the same question asked independently: SQL joins on the nsys exports (activity -> runtime call by correlation id
within the process -> the NVTX range open on that thread at the call), plain JSON on the Kineto trace."""

from __future__ import annotations

import gzip
import json
from collections import Counter

import polars as pl
import pytest

import tracekit
from tracekit.analyses.attribution import attribute, devices_with_activity, pick_device
from tracekit.errors import TracekitError

from conftest import DATA, sample_sqlite, sample_trace, sql_rows

# every GPU activity of device 0 with its launching runtime call (same correlation id, same process)
LAUNCHED = """
    SELECT r.globalTid AS tid, r.start AS call FROM (
        SELECT correlationId, globalPid, deviceId FROM CUPTI_ACTIVITY_KIND_KERNEL
        UNION ALL SELECT correlationId, globalPid, deviceId FROM CUPTI_ACTIVITY_KIND_MEMCPY
        UNION ALL SELECT correlationId, globalPid, deviceId FROM CUPTI_ACTIVITY_KIND_MEMSET) a
    JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = a.correlationId AND (r.globalTid >> 24) = (a.globalPid >> 24)
    WHERE a.deviceId = 0"""


def launched_in_ranges(path, like: str) -> dict[str, int]:
    """Activities per NVTX range whose text is LIKE ``like``: the range open on the launching thread at the call."""
    return dict(sql_rows(path, f"SELECT n.text, count(*) FROM ({LAUNCHED}) l JOIN NVTX_EVENTS n ON n.globalTid = l.tid "
                               f"AND l.call BETWEEN n.start AND n.end AND n.text LIKE '{like}' GROUP BY n.text"))


def test_each_activity_goes_to_the_step_its_launch_was_made_in():
    path = sample_trace("hf-small-eager")
    per_range = launched_in_ranges(path, "decode_step %")
    assert len(per_range) == 16 and set(per_range.values()) == {1209}
    total = sql_rows(path, "SELECT (SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE deviceId = 0) + "
                           "(SELECT count(*) FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE deviceId = 0) + "
                           "(SELECT count(*) FROM CUPTI_ACTIVITY_KIND_MEMSET WHERE deviceId = 0)")[0][0]
    attr = attribute(tracekit.load(path), step_range=r"^decode_step ")
    acts = attr.activities
    assert attr.device == 0 and attr.step_by == ("pid", "tid") and acts.height == total == 19344
    names = dict(zip(attr.steps.windows["step"], attr.steps.windows["name"]))
    got = {names[s]: n for s, n in acts.group_by("step").len().rows() if s is not None}
    assert got == per_range
    assert acts["step"].null_count() == total - sum(per_range.values())
    # kinds as the tables hold them; the launch row each activity names is the call of its correlation id
    assert Counter(acts["kind"].cast(pl.String)) == {"kernel": 19280, "memop": 64}
    launched = acts.filter(pl.col("launch").is_not_null())
    calls = attr.launches[launched["launch"]]
    assert (calls["correlation"] == launched["correlation"]).all() and (calls["pid"] == launched["pid"]).all()
    assert attr.draft_detection == "not_detected"


def test_draft_ranges_make_drafting():
    """hf-small-spec: a draft range inside each decode step; what was launched inside it is drafting."""
    path = sample_sqlite("hf-small-spec")
    in_drafts = launched_in_ranges(path, "draft")
    attr = attribute(tracekit.load(path), step_range=r"^decode_step ")
    acts = attr.activities
    assert attr.draft_detection == "ranges"
    assert acts["draft"].drop_nulls().n_unique() == 16
    assert acts.filter(pl.col("draft").is_not_null()).height == in_drafts["draft"] == 6208
    assert (acts.filter(pl.col("draft").is_not_null())["category"].cast(pl.String) == "drafting").all()
    assert acts.filter(pl.col("category").cast(pl.String) == "drafting").height == 6208


def test_kineto_kernels_follow_their_runtime_call():
    """hf-small-eager-torch: a kernel's step is the decode_step annotation around its cudaLaunchKernel (joined on
    args.correlation), on the annotation's thread."""
    path = sample_trace("hf-small-eager-torch")
    with gzip.open(path) as f:
        events = json.load(f)["traceEvents"]
    spans = [e for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("decode_step ")]
    calls = {e["args"]["correlation"]: e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")
             and "correlation" in e.get("args", {})}
    want = Counter()
    for k in (e for e in events if e.get("cat") == "kernel"):
        call = calls.get(k["args"].get("correlation"))
        for s in spans if call else ():
            if s["tid"] == call["tid"] and s["ts"] <= call["ts"] <= s["ts"] + s["dur"]:
                want[s["name"]] += 1
    assert len(want) == 16
    attr = attribute(tracekit.load(path), step_range=r"^decode_step ")
    names = dict(zip(attr.steps.windows["step"], attr.steps.windows["name"]))
    kernels = attr.activities.filter(pl.col("kind").cast(pl.String) == "kernel")
    assert {names[s]: n for s, n in kernels.group_by("step").len().rows() if s is not None} == dict(want)


def test_the_busiest_device_is_analysed_unless_one_is_named():
    """Two GPUs (nsysai_mfu_2gpu_before): the busiest by kernel time is the default; a GPU without work is refused."""
    path = DATA / "nsys/nsysai_mfu_2gpu_before_2026.2.sqlite"
    busy = sql_rows(path, "SELECT deviceId FROM (SELECT deviceId, end - start AS d FROM CUPTI_ACTIVITY_KIND_KERNEL "
                          "UNION ALL SELECT deviceId, end - start FROM CUPTI_ACTIVITY_KIND_MEMCPY "
                          "UNION ALL SELECT deviceId, end - start FROM CUPTI_ACTIVITY_KIND_MEMSET) "
                          "GROUP BY deviceId ORDER BY sum(d) DESC")
    t = tracekit.load(path)
    assert devices_with_activity(t) == [d for (d,) in busy] == [0, 1]
    assert pick_device(t, None) == 0 and pick_device(t, 1) == 1
    with pytest.raises(TracekitError, match="--device 5: no GPU activity on that device; devices with activity: 0, 1"):
        pick_device(t, 5)
    assert attribute(t, device=1, step_range=None).device == 1
