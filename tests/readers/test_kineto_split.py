"""The two-process Kineto read (``tracekit.readers.kineto.split``, ``.worker``) gives exactly the one-process read's Trace.

Every test forces the split on small files (``SPLIT_MIN_BYTES`` 0) and checks that the worker's batches were
really taken (``Frames.take`` called with at least one batch), or, for the fallbacks, that they were not: a test
whose two reads could silently both be one-process reads would prove nothing. The reference is the one-process
read of the same file (the same reader with the split off), compared frame by frame: values, nulls, row order,
dtypes (Categorical columns as their strings: their codes depend on the order names are met), and the meta.
"""

from __future__ import annotations

import gzip
import json
import re
import shutil
from pathlib import Path

import pytest
from polars.testing import assert_frame_equal

from tracekit.errors import TracekitError
from tracekit.readers.kineto import columns as kineto_columns
from tracekit.readers.kineto import split as kineto_split
from tracekit.readers.kineto import stream as kineto_stream
from tracekit.readers.kineto.reader import read_kineto
from tracekit.trace import SCHEMAS

from conftest import shared_dir

ROOT = Path(__file__).resolve().parents[2]
# Real Kineto traces whose licence lets a test write a decompressed copy to its temporary directory (MIT, BSD,
# Apache: PROVENANCE.md); the others are read in place (only plain JSON can be cut).
_LICENSED = ("HolisticTraceAnalysis", "TraceLens", "kineto", "nvllm")


def _same(a, b) -> None:
    for name in SCHEMAS:
        assert_frame_equal(getattr(a, name), getattr(b, name), categorical_as_str=True, check_exact=True), name
    assert a.meta == b.meta


_CORES_TO_SPARE = kineto_split._cores_to_spare


@pytest.fixture(autouse=True)
def small_pieces(monkeypatch):
    """Blocks and pieces of 32 kB (the worker gets the same sizes): the test files have dozens of pieces. (And the
    split allowed on a machine of one core too.)"""
    for name, v in (("_BLOCK", 1 << 15), ("_CHUNK", 1 << 15), ("_WINDOW", 1 << 12)):
        monkeypatch.setattr(kineto_stream, name, v)
    monkeypatch.setattr(kineto_split, "_cores_to_spare", lambda: True)


@pytest.fixture
def taken(monkeypatch):
    """Counts the worker batches the reads take (Frames.take)."""
    counts: list[int] = []
    original = kineto_columns.Frames.take

    def take(self, batches, *args):
        seen = []

        def counting():
            for b in batches:
                seen.append(1)
                yield b

        original(self, counting(), *args)
        counts.append(len(seen) - 1)  # (the last: the names met last)

    monkeypatch.setattr(kineto_columns.Frames, "take", take)
    return counts


def _one_process(path: Path, monkeypatch, **kw):
    with monkeypatch.context() as m:
        m.setattr(kineto_split, "SPLIT_MIN_BYTES", 1 << 62)
        return read_kineto(path, **kw)


def _plain(src: Path, tmp_path: Path) -> Path:
    """``src`` as plain JSON (a gzipped one decompressed into the test's directory)."""
    if src.suffix != ".gz":
        return src
    out = tmp_path / src.name[:-3]
    with gzip.open(src) as f, open(out, "wb") as g:
        shutil.copyfileobj(f, g)
    return out


def _real_traces() -> list[Path]:
    found = sorted((ROOT / "sample_traces").glob("*-torch*/*.json.gz")) + sorted((ROOT / "tests/data/kineto").glob("*.json*"))
    try:
        ext = shared_dir()
    except pytest.skip.Exception:
        return found
    for p in sorted(ext.rglob("*.json*")):
        if p.name.endswith(".json") or (p.name.endswith(".json.gz") and p.relative_to(ext).parts[0] in _LICENSED):
            found.append(p)
    return found


def _is_kineto(path: Path) -> bool:
    with (gzip.open if path.suffix == ".gz" else open)(path, "rb") as f:
        return b'"traceEvents"' in f.read(1 << 16)


@pytest.mark.parametrize("src", [p for p in _real_traces() if _is_kineto(p)], ids=lambda p: p.name)
@pytest.mark.slow
def test_real_traces_two_processes_exactly(src, tmp_path, monkeypatch, taken):
    path = _plain(src, tmp_path)
    want = _one_process(path, monkeypatch, kernel_dims=False)
    monkeypatch.setattr(kineto_split, "SPLIT_MIN_BYTES", 0)
    if kineto_stream.split_at(path, int(path.stat().st_size * kineto_split.SPLIT_AT)) is None:
        pytest.skip("too small to cut")  # (a trace of a handful of events)
    got = read_kineto(path, kernel_dims=False)
    assert taken and taken[0] > 0
    _same(got, want)


def _synthetic(tmp_path: Path, n: int = 6000, by_thread: bool = False) -> Path:
    """A plain-JSON trace with every group, two host threads and Python functions interleaved, equal starts across
    groups, names first met near its end, a record_function name holding ``},{``, events with a bad duration and
    keys after traceEvents."""
    ev = []
    for i in range(n):
        ts = 1_700_000_000_000 + i * 7 // 3  # (equal starts: several events share a ts)
        t = f"{ts}.{(i * 37) % 1000 if i % 3 else 0:03d}"  # (every third: the Python function's start too)
        ev.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm" if i % 5 == 0 else f"aten::op{i % 13}", "pid": 1,
                   "tid": 1 + i % 2, "ts": float(t) if i % 11 else t, "dur": 1.5,
                   "args": {"Input Dims": [[4, i % 7], [i % 7, 8]], "Input type": ["float", "float"]}})
        late = i > n * 0.9  # (names first met after every cut: the worker's codes are not this process')
        ev.append({"ph": "X", "cat": "python_function", "name": f"late{i % 7}" if late else f"f{i % 17}", "pid": 1,
                   "tid": 1, "ts": ts, "dur": 2})
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": ts + 1,
                   "dur": 3, "args": {"correlation": i}})
        ev.append({"ph": "X", "cat": "kernel", "name": f"kern_{i % 9}", "pid": 0, "tid": 7, "ts": ts + 5, "dur": 2,
                   "args": {"device": 0, "stream": 7, "correlation": i, "grid": [1, 2, 3], "block": [4, 1, 1]}})
        if i % 50 == 0:
            ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{i // 50}", "pid": 1, "tid": 1,
                       "ts": ts, "dur": 100})
            ev.append({"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pageable -> Device)", "pid": 0, "tid": 7,
                       "ts": ts + 9, "dur": 1, "args": {"device": 0, "stream": 7, "correlation": i, "bytes": 64}})
        if i % 97 == 0:
            ev.append({"ph": "X", "cat": "user_annotation", "name": 'odd },{"ph":"X"} name', "pid": 1, "tid": 1,
                       "ts": ts, "dur": 1})
        if i % 301 == 0:
            ev.append({"ph": "X", "cat": "kernel", "name": "bad", "pid": 0, "tid": 7, "ts": ts, "dur": -1})
    if by_thread:  # (each thread's events after the other's: runs that go back in time)
        ev.sort(key=lambda e: (e["tid"], float(e["ts"])))
    doc = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "GPU", "totalGlobalMem": 1, "numSms": 2}],
           "traceEvents": ev, "traceName": "x", "displayTimeUnit": "ms"}
    p = tmp_path / "synthetic.json"
    p.write_text(json.dumps(doc, indent=1))
    return p


@pytest.mark.parametrize("at", [0.2, 0.5, 0.8])
@pytest.mark.parametrize("rounds", [False, True])
@pytest.mark.parametrize("by_thread", [False, True])
@pytest.mark.slow
def test_cut_anywhere_same_trace(at, rounds, by_thread, tmp_path, monkeypatch, taken):
    """Cuts early, in the middle and late; with the ops put in order while reading (small rounds, in both
    processes) or at the end; events in time order (the parts overlap in time only around the cut) or thread
    after thread (they overlap everywhere, and the runs go back in time)."""
    path = _synthetic(tmp_path, by_thread=by_thread)
    if rounds:
        sizes = (400, 700, 1500)
        for name, v in zip(("_BATCH", "_SETTLE", "_SETTLE_FIRST"), sizes):
            monkeypatch.setattr(kineto_columns, name, v)
        monkeypatch.setenv("TRACEKIT_KINETO_TEST_SIZES", ",".join(map(str, sizes)))
    want = _one_process(path, monkeypatch)
    monkeypatch.setattr(kineto_split, "SPLIT_MIN_BYTES", 0)
    monkeypatch.setattr(kineto_split, "SPLIT_AT", at)
    got = read_kineto(path)
    assert taken == [taken[0]] and taken[0] > 0
    _same(got, want)
    assert got.meta.warnings and "dropped" in got.meta.warnings[-1]  # (the worker's dropped events counted too)


def test_cut_inside_a_string_reads_alone(tmp_path, monkeypatch, taken):
    """A cut candidate inside a string (an event name holding ``},{``): no piece ends there, so this process
    reads on to the end (the worker's batches unused), with the same result."""
    path = _synthetic(tmp_path)
    text = path.read_bytes()
    inside = text.index(b'odd },{', len(text) // 2) + 4  # (the candidate '},{' in the name)
    end = (inside // kineto_stream._BLOCK + 1) * kineto_stream._BLOCK
    monkeypatch.setattr(kineto_stream, "_WINDOW", end - inside + 1)  # (the window starts just before it)
    monkeypatch.setattr(kineto_split, "SPLIT_MIN_BYTES", 0)
    monkeypatch.setattr(kineto_split, "SPLIT_AT", inside / len(text))
    assert kineto_stream.split_at(path, inside) == inside + 2
    got = read_kineto(path)
    assert taken == []  # (the worker's batches were not taken)
    _same(got, _one_process(path, monkeypatch))


@pytest.mark.slow
def test_worker_failure_reads_its_part_here(tmp_path, monkeypatch, taken):
    """A worker that fails (here: it cannot import polars) costs time, never the result: the events after the cut
    are read in this process."""
    path = _synthetic(tmp_path)
    monkeypatch.setattr(kineto_split, "SPLIT_MIN_BYTES", 0)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    (tmp_path / "polars.py").write_text("raise ImportError('no polars here')\n")
    got = read_kineto(path)
    assert taken == []
    _same(got, _one_process(path, monkeypatch))


@pytest.mark.slow
def test_stuck_worker_is_not_waited_for(tmp_path, monkeypatch, taken):
    """A worker that never ends (here: its polars import sleeps) is given up after the wait and stopped; the
    events after the cut are read in this process."""
    path = _synthetic(tmp_path)
    monkeypatch.setattr(kineto_split, "SPLIT_MIN_BYTES", 0)
    monkeypatch.setattr(kineto_split, "WAIT_MIN_S", 0.5)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    (tmp_path / "polars.py").write_text("import time\ntime.sleep(60)\n")
    workers = []
    start = kineto_split.Worker.start.__func__
    monkeypatch.setattr(kineto_split.Worker, "start", classmethod(lambda cls, *a: workers.append(start(cls, *a)) or workers[-1]))
    got = read_kineto(path)
    assert taken == [] and len(workers) == 1 and workers[0].proc.poll() is not None  # (given up, and stopped)
    _same(got, _one_process(path, monkeypatch))


def test_error_after_the_cut_is_reported_as_alone(tmp_path, monkeypatch, taken):
    """A file damaged after the cut: the one-line error the one-process read gives (msgspec's byte offset in it is
    within the piece decoded, which differs)."""
    path = _synthetic(tmp_path)
    text = path.read_bytes()
    bad = text.index(b'"cat": "kernel"', len(text) * 3 // 4)
    path.write_bytes(text[:bad] + b'"cat": kernel"' + text[bad + 15:])
    with pytest.raises(TracekitError) as alone:
        _one_process(path, monkeypatch)
    monkeypatch.setattr(kineto_split, "SPLIT_MIN_BYTES", 0)
    with pytest.raises(TracekitError) as split:
        read_kineto(path)
    same = lambda e: re.sub(r"\(byte \d+\)", "(byte N)", str(e.value))  # noqa: E731
    assert same(split) == same(alone) and "not valid JSON" in str(alone.value)
    assert taken == []


def test_small_and_gzipped_files_are_not_split(tmp_path, monkeypatch):
    path = _synthetic(tmp_path, 300)
    assert kineto_split.Worker.start(path, True) is None  # (below SPLIT_MIN_BYTES)
    gz = tmp_path / "synthetic.json.gz"
    gz.write_bytes(gzip.compress(path.read_bytes()))
    monkeypatch.setattr(kineto_split, "SPLIT_MIN_BYTES", 0)
    assert kineto_split.Worker.start(gz, True) is None
    worker = kineto_split.Worker.start(path, True)
    assert worker is not None
    worker.stop()


def test_not_split_without_a_core_to_spare(tmp_path, monkeypatch):
    """One core, or a process of --engine process' pool (files already read one per core): one process."""
    import multiprocessing
    import os

    monkeypatch.setattr(os, "sched_getaffinity", lambda _: {0, 1})
    assert _CORES_TO_SPARE()
    with monkeypatch.context() as m:
        m.setattr(multiprocessing, "parent_process", lambda: object())
        assert not _CORES_TO_SPARE()
    monkeypatch.setattr(os, "sched_getaffinity", lambda _: {0})
    assert not _CORES_TO_SPARE()


def test_cli_head_start_same_output(tmp_path, monkeypatch, taken):
    """The command's head start (the worker started before polars is imported) is taken by the read."""
    from click.testing import CliRunner

    from tracekit.cli import cli

    path = _synthetic(tmp_path)
    with monkeypatch.context() as m:
        m.setattr(kineto_split, "SPLIT_MIN_BYTES", 1 << 62)
        want = CliRunner().invoke(cli, ["breakdown", str(path), "--format", "json"])
    started = []
    original = kineto_split.Worker.start.__func__
    monkeypatch.setattr(kineto_split.Worker, "start",
                        classmethod(lambda cls, *a: started.append(a) or original(cls, *a)))
    monkeypatch.setattr(kineto_split, "SPLIT_MIN_BYTES", 0)
    got = CliRunner().invoke(cli, ["breakdown", str(path), "--format", "json"])
    assert got.exit_code == want.exit_code == 0, got.output
    assert got.output == want.output
    assert len(started) == 1 and taken and taken[0] > 0 and not kineto_split._PENDING
