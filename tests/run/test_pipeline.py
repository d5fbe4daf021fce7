"""``breakdown(trace, consume=True)``: the analysis gives back the kernel columns it copies, and changes nothing else.

The command line analyses each trace file once (``tracekit.run.pipeline.breakdown_file``) and lets the breakdown drop
the columns of ``trace.kernels`` that the activities copy, as it copies them (issue 25: the 10M-kernel export's
peak 2.1 -> 1.75 GB, benchmarks/results/HISTORY.md). Every result must be the one a breakdown of an untouched trace
gives; a library caller's trace (the default) is never changed; and what reads those columns after the merge (the
communication kernels, the lost graph launches, the step candidates of an error) reads them before.
"""

from __future__ import annotations

import threading
from pathlib import Path

import polars as pl
import pytest

import tracekit
from tracekit.analyses.attribution import COPIED_KERNEL_COLUMNS, _merge_by_start, _merge_plan
from tracekit.errors import NoSteps
from tracekit.options import AnalysisOptions
from tracekit.run.pipeline import breakdown, breakdown_file

ROOT = Path(__file__).resolve().parents[2]
# One GPU with copies beside its kernels (the merge runs), eager, graphs, NCCL kernels, speculative, Kineto; and an
# export of two GPUs (the analysed GPU's kernels are a copy: the trace is never touched).
ONE_GPU = ["sample_traces/hf-small-eager/trace.sqlite", "sample_traces/hf-small-graph/trace.sqlite.gz",
           "sample_traces/tp1-hf-small-symm1-graph/trace.sqlite.gz", "sample_traces/spec-small-eager/trace.sqlite.gz",
           "sample_traces/hf-small-eager-torch/trace.json.gz", "tests/data/kineto/hta_nccl_data.json.gz"]
TWO_GPUS = ROOT / "tests/data/nsys/nsysai_mfu_2gpu_before_2026.2.sqlite"


@pytest.mark.parametrize("name", ONE_GPU)
@pytest.mark.slow
def test_consumed_trace_gives_the_same_breakdown(name):
    path = ROOT / name
    ref = breakdown(tracekit.load(path)).to_dict()
    trace = tracekit.load(path)
    kept = [c for c in trace.kernels.columns if c not in COPIED_KERNEL_COLUMNS]
    assert breakdown(trace, consume=True).to_dict() == ref
    # the copied columns are gone from the trace (the merge ran: copies beside the kernels), the others stay
    assert trace.kernels.columns == kept
    assert breakdown_file(path).to_dict() == ref


def test_communication_kernels_found_before_release():
    """The NCCL kernels (every column of them) are read from the trace before its columns go: the same rows."""
    from tracekit.analyses.collectives import _comm_kernels

    path = ROOT / "sample_traces/tp1-hf-small-symm1-eager/trace.sqlite.gz"
    ref = _comm_kernels(tracekit.load(path), 0)
    assert ref.height == 576
    from tracekit.analyses.attribution import attribute

    attr = attribute(tracekit.load(path), consume=True)
    assert attr.comm_kernels is not None and attr.comm_kernels.equals(ref)
    assert attribute(tracekit.load(path)).comm_kernels is None  # (the default: found later, from the trace)


def test_library_trace_untouched():
    path = ROOT / "sample_traces/hf-small-eager/trace.sqlite"
    trace = tracekit.load(path)
    before = trace.kernels.clone()
    first = breakdown(trace).to_dict()
    assert trace.kernels.equals(before)
    assert breakdown(trace).to_dict() == first


def test_several_gpus_trace_untouched():
    trace = tracekit.load(TWO_GPUS)
    before = trace.kernels.clone()
    ref = breakdown(tracekit.load(TWO_GPUS), AnalysisOptions(device=1)).to_dict()
    assert breakdown(trace, AnalysisOptions(device=1), consume=True).to_dict() == ref
    assert trace.kernels.equals(before)  # (GPU 1's kernels were a filtered copy: nothing of the trace was taken)
    # the communication kernels found beside the activities are kept there too, not found a second time later
    from tracekit.analyses.attribution import attribute
    from tracekit.analyses.collectives import _comm_kernels

    attr = attribute(trace, device=1, consume=True)
    assert attr.comm_kernels is not None and attr.comm_kernels.equals(_comm_kernels(trace, 1))


def test_no_steps_error_before_anything_is_released():
    """The error lists step candidates, which weigh ranges by the GPU time they launch: read from the whole trace."""
    path = ROOT / "sample_traces/hf-small-eager/trace.sqlite"
    with pytest.raises(NoSteps) as ref:
        breakdown(tracekit.load(path), AnalysisOptions(step_range="^no such range$"))
    trace = tracekit.load(path)
    columns = trace.kernels.columns
    with pytest.raises(NoSteps) as got:
        breakdown(trace, AnalysisOptions(step_range="^no such range$"), consume=True)
    assert str(got.value) == str(ref.value)
    assert "step candidates" in str(got.value) and trace.kernels.columns == columns


@pytest.mark.parametrize("threads", [False, True])
def test_merge_releases_each_column_once_after_merging_it(threads):
    """``release`` drops each column from the merge's own frame as ``activities`` does: had it come before that
    column was copied, the copy would fail (on two threads, the other thread still reads the frame)."""
    big = pl.DataFrame({"start": [0, 3, 5, 9], "end": [1, 4, 6, 10], "x": [10, 11, 12, 13]})
    small = pl.DataFrame({"start": [2, 5], "end": [3, 7], "x": [20, 21]})
    seen, lock = [], threading.Lock()

    def release(c):
        with lock:
            seen.append(c)
            big.drop_in_place(c)

    out = _merge_by_start([big, small], threads=threads, plan=_merge_plan([big["start"], small["start"]]),
                          release=release)
    assert out.columns == ["start", "end", "x"]
    assert out["x"].to_list() == [10, 20, 11, 12, 21, 13]
    assert out["start"].to_list() == [0, 2, 3, 5, 5, 9]
    assert sorted(seen) == ["end", "start", "x"] and big.width == 0


@pytest.mark.parametrize("name", ["sample_traces/tp1-hf-small-symm1-eager/trace.sqlite.gz",
                                  "tests/data/kineto/hta_nccl_data.json.gz"])
def test_rank_stage_consumes_and_gives_the_same_result(name):
    """The per-file stage of ``breakdown DIR`` consumes its trace too: the rank's breakdown and its communication
    summary (the kernels' names and communicators, read after the breakdown) are those of an untouched trace."""
    from dataclasses import asdict

    from tracekit.run.ranks import analyse_rank, rank_result

    path = ROOT / name
    trace = tracekit.load(path, kernel_dims=False)
    ref = rank_result(breakdown(trace), trace)
    got = analyse_rank(path, {})
    assert got.to_dict() == ref.to_dict()
    a, b = asdict(got.comm), asdict(ref.comm)
    ka, kb = a.pop("kernels"), b.pop("kernels")
    assert a == b and ka.equals(kb) and ka.height > 0
