"""`tracekit export --perfetto` keeps the trace's own events and adds tracekit's tracks.

The counts of the file's events are checked against the trace itself, never against tracekit: SQL on the nsys
export (kernels, memcpys, memsets per GPU and stream, runtime calls, NVTX ranges, the launch -> activity pairs joined
on process and correlation id) and the Kineto JSON's own events; the added tracks (steps, categories, gaps) are
tracekit's process, as before.
"""

from __future__ import annotations

import gzip
import json
from collections import Counter

import pytest
from click.testing import CliRunner

from tracekit.cli import cli
from tracekit.report.perfetto import PID, TRACKS
from tracekit.report.perfetto_events import GPU_PID_BASE

from conftest import DATA, ROOT, sample, sql_rows

GPU_TABLES = {"kernel": "CUPTI_ACTIVITY_KIND_KERNEL", "memcpy": "CUPTI_ACTIVITY_KIND_MEMCPY",
              "memset": "CUPTI_ACTIVITY_KIND_MEMSET"}


def export(trace, tmp_path, *args) -> dict:
    out = tmp_path / "out.perfetto.json"
    r = CliRunner().invoke(cli, ["export", str(trace), *args, "--perfetto", str(out)])
    assert r.exit_code == 0, r.output
    assert "the trace's own events kept" in r.stderr
    return json.loads(out.read_text(encoding="utf-8"))


def _gpu_counts(events) -> Counter:
    """(cat, device, stream) -> X events in the GPU processes."""
    return Counter((e["cat"], e["pid"] - GPU_PID_BASE, e["tid"]) for e in events
                   if e["ph"] == "X" and e["pid"] >= GPU_PID_BASE)


def _sql_gpu_counts(path) -> Counter:
    tables = {r[0] for r in sql_rows(path, "SELECT name FROM sqlite_master WHERE type = 'table'")}
    out = Counter()
    for cat, table in GPU_TABLES.items():
        if table in tables:
            for dev, stream, n in sql_rows(path, f"SELECT deviceId, streamId, count(*) FROM {table} GROUP BY 1, 2"):
                out[(cat, dev, stream)] = n
    return out


def _sql_flows(path) -> int:
    """GPU activities whose runtime call is in the export (same process, same correlation id)."""
    # (the calls' distinct keys as a subquery: SQLite indexes it on the fly, where a correlated EXISTS scans the
    # runtime table once per activity)
    return sum(sql_rows(path, f"""SELECT count(*) FROM {table} k JOIN (SELECT DISTINCT correlationId AS c,
               globalTid >> 24 AS p FROM CUPTI_ACTIVITY_KIND_RUNTIME) r ON r.c = k.correlationId
               AND r.p = (k.globalPid >> 24)""")[0][0] for table in GPU_TABLES.values())


def _tracekit_tracks(events) -> dict[int, str]:
    return {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["pid"] == PID
            and e["name"] == "thread_name"}


@pytest.mark.parametrize("trace, step", [
    pytest.param(sample("hf-small-eager/trace.sqlite"), None, marks=pytest.mark.slow),  # (~15 s: 140k events)
    (DATA / "nsys" / "pipit_saxpy_2022.2.sqlite", "^saxpy$"),
    pytest.param(DATA / "nsys" / "nsysai_mfu_2gpu_before_2026.2.sqlite", None, marks=pytest.mark.slow),
], ids=["hf-small-eager", "saxpy-2022.2", "mfu-2gpu-2proc"])
def test_nsys_export_keeps_every_kernel_memcpy_call_range_and_flow(trace, step, tmp_path):
    d = export(trace, tmp_path, *(["--step-range", step] if step else []))
    ev = d["traceEvents"]
    # every kernel, memcpy and memset, on its GPU and stream, as many as the export's tables hold
    assert _gpu_counts(ev) == _sql_gpu_counts(trace)
    cats = Counter(e.get("cat") for e in ev if e["ph"] != "M" and e["pid"] != PID)
    runtime = "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME"
    if "eventClass" in {r[1] for r in sql_rows(trace, "PRAGMA table_info(CUPTI_ACTIVITY_KIND_RUNTIME)")}:
        runtime += " WHERE eventClass != 67"  # (nsys 2022.2's backtrace copies of a call)
    assert cats["cuda_api"] == sql_rows(trace, runtime)[0][0]
    assert cats["nvtx"] == sql_rows(trace, "SELECT count(*) FROM NVTX_EVENTS WHERE eventType IN (59, 60, 70, 71) "
                                           "AND end IS NOT NULL AND end >= start")[0][0]
    starts = [e for e in ev if e["ph"] == "s"]
    ends = [e for e in ev if e["ph"] == "f"]
    assert len(starts) == len(ends) == _sql_flows(trace) > 0
    assert {e["id"] for e in starts} == {e["id"] for e in ends}
    assert all(e["pid"] >= GPU_PID_BASE and e["bp"] == "e" for e in ends)
    # the host side of each flow is a host thread, where the call is
    assert all(e["pid"] < GPU_PID_BASE for e in starts)
    # tracekit's own tracks are there, in their process
    assert sorted(_tracekit_tracks(ev).values()) == sorted(TRACKS)
    steps = [e for e in ev if e["ph"] == "X" and e["pid"] == PID and e["cat"] == "step"]
    assert len(steps) == d["otherData"]["steps"] > 0
    assert d["otherData"]["original_events"]["kernels"] == sum(n for (c, _, _), n in _sql_gpu_counts(trace).items()
                                                              if c == "kernel")


@pytest.mark.slow
def test_kineto_export_keeps_the_json_events(tmp_path):
    """synthetic-eager-torch: the kernels, memcpys, runtime and driver calls, cpu_ops and annotations of the JSON, and
    one flow per GPU activity whose correlation a runtime or driver call carries (Kineto's ac2g pairs)."""
    path = ROOT / "sample_traces" / "synthetic-eager-torch" / "trace.json.gz"
    src = [e for e in json.loads(gzip.decompress(path.read_bytes()))["traceEvents"] if e.get("ph") == "X"]
    by_cat = Counter(e.get("cat") for e in src)
    d = export(path, tmp_path)
    ev = d["traceEvents"]
    ours = Counter(e.get("cat") for e in ev if e["ph"] == "X" and e["pid"] != PID)
    assert ours["kernel"] == by_cat["kernel"] == 3600
    assert ours["memcpy"] == by_cat["gpu_memcpy"]
    assert ours["cuda_api"] == by_cat["cuda_runtime"] + by_cat["cuda_driver"]
    assert ours["cpu_op"] + ours["python_function"] == by_cat["cpu_op"]
    assert ours["annotation"] == by_cat["user_annotation"]
    launched = {e["args"]["correlation"] for e in src if e.get("cat") in ("cuda_runtime", "cuda_driver")}
    gpu = [e for e in src if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    assert sum(1 for e in ev if e["ph"] == "f") == sum(1 for e in gpu if e["args"]["correlation"] in launched)
    assert sorted(_tracekit_tracks(ev).values()) == sorted(TRACKS)


def test_the_export_is_streamed_in_slices(tmp_path, monkeypatch):
    """Slices of a few rows give the same file as one slice (the writer never needs the whole text at once)."""
    import tracekit.report.perfetto as pf

    trace = DATA / "nsys" / "pipit_saxpy_2022.2.sqlite"
    whole = export(trace, tmp_path, "--step-range", "^saxpy$")
    monkeypatch.setattr(pf, "CHUNK_ROWS", 7)
    sliced = export(trace, tmp_path, "--step-range", "^saxpy$")
    assert sliced == whole
