"""The nsys reader's head start (tracekit.readers.nsys.scan): the big scans begun before polars is imported must
give the very frames the reader reads itself, and a head start that guessed wrong must only go unused."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

import tracekit.readers.nsys.reader as nsys
import tracekit.readers.nsys.scan as nsys_scan
from tracekit.readers.api_names import launch_kind, strip_version
from tracekit.readers.common import api_kind, strip_api_version

from conftest import DATA, ROOT, sample

TRACES = [DATA / "nsys" / "pipit_saxpy_2022.2.sqlite", sample("hf-small-eager/trace.sqlite")]
needs_connectorx = pytest.mark.skipif(not nsys._Db.engine_available("connectorx"), reason="connectorx not installed")


@pytest.fixture
def as_big(monkeypatch):
    """Read the (small) test exports as a big export is read: connectorx first, head start wanted."""
    monkeypatch.delenv("TRACEKIT_SQLITE_ENGINES", raising=False)
    monkeypatch.setattr(nsys_scan, "SMALL_FILE_BYTES", 0)
    monkeypatch.setattr(nsys._Db, "SMALL_FILE_BYTES", 0)


def _hits(monkeypatch) -> list[str]:
    """The SQL of every table the reader took from a head start (filled as it reads)."""
    hits: list[str] = []
    take = nsys_scan.take

    def counting(uri, sql):
        table = take(uri, sql)
        if table is not None:
            hits.append(sql)
        return table

    monkeypatch.setattr(nsys_scan, "take", counting)
    return hits


def _assert_same_trace(a, b):
    for name in ("kernels", "launches", "memops", "ranges", "graph_execs", "gpus"):
        assert_frame_equal(getattr(a, name), getattr(b, name), check_exact=True)
    assert a.meta == b.meta


@needs_connectorx
@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.parent.name + "/" + p.name)
def test_head_start_gives_the_frames_the_reader_reads(path, as_big, monkeypatch):
    plain = nsys.read_nsys(path, kernel_dims=False)
    hits = _hits(monkeypatch)
    with nsys_scan.head_start(path, kernel_dims=False) as scanning:
        assert scanning and nsys_scan.pending(nsys_scan.export_uri(path))
        with nsys_scan.head_start(path, kernel_dims=False) as inner:  # (the CLI's block around breakdown_file's)
            assert inner
            early = nsys.read_nsys(path, kernel_dims=False)
    # both big tables came from the head start: the kernels, and the runtime calls that launch or synchronise
    assert [("KERNEL" in q, "RUNTIME" in q) for q in hits] == [(True, False), (False, True)]
    assert not nsys_scan._PENDING
    _assert_same_trace(early, plain)
    # the runtime rows it scanned are the launching calls, counted here with sqlite3 from the names themselves
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    names = dict(con.execute("SELECT id, value FROM StringIds"))
    ec = "AND eventClass IN (0, 1)" if "eventClass" in [r[1] for r in con.execute(
        "PRAGMA table_info(CUPTI_ACTIVITY_KIND_RUNTIME)")] else ""
    n = sum(1 for (i,) in con.execute(f"SELECT nameId FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE 1 {ec}")
            if names[i].startswith(("cudaLaunch", "cuLaunch", "cudaMemcpy", "cudaMemset", "cudaGraphLaunch",
                                    "cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize",
                                    "cudaStreamWaitEvent", "cuStreamSynchronize", "cuEventSynchronize",
                                    "cuCtxSynchronize", "cuMemcpy", "cuMemset", "cuGraphLaunch")))
    con.close()
    assert early.launches.height == n > 0


@needs_connectorx
def test_a_head_start_that_guessed_wrong_goes_unused(as_big, monkeypatch):
    path = TRACES[0]
    hits = _hits(monkeypatch)
    with nsys_scan.head_start(path, kernel_dims=True):  # the grid/block columns: not the query read below
        early = nsys.read_nsys(path, kernel_dims=False)
        assert nsys_scan.pending(nsys_scan.export_uri(path))  # the kernels' scan, never taken
    assert len(hits) == 1 and "RUNTIME" in hits[0]
    assert not nsys_scan._PENDING  # dropped on leaving the block
    _assert_same_trace(early, nsys.read_nsys(path, kernel_dims=False))


def test_no_head_start_for_a_small_export_or_a_forced_engine(monkeypatch, tmp_path):
    monkeypatch.delenv("TRACEKIT_SQLITE_ENGINES", raising=False)
    path = TRACES[1]
    assert path.stat().st_size < nsys_scan.SMALL_FILE_BYTES
    with nsys_scan.head_start(path) as scanning:
        assert not scanning and not nsys_scan._PENDING
    monkeypatch.setattr(nsys_scan, "SMALL_FILE_BYTES", 0)
    monkeypatch.setenv("TRACEKIT_SQLITE_ENGINES", "sqlite3")
    with nsys_scan.head_start(path):
        assert not nsys_scan._PENDING
    monkeypatch.delenv("TRACEKIT_SQLITE_ENGINES")
    json_trace = tmp_path / "t.json"
    json_trace.write_text('{"traceEvents": []}')
    for p in (json_trace, tmp_path / "missing.sqlite"):
        with nsys_scan.head_start(p):
            assert not nsys_scan._PENDING


@pytest.mark.parametrize("name, stripped, kind", [
    ("cudaLaunchKernel_v7000", "cudaLaunchKernel", "kernel"),
    ("cudaMemcpyAsync_ptsz_v7000", "cudaMemcpyAsync", "memcpy"),
    ("cudaMemsetAsync_v3020_ptds", "cudaMemsetAsync", "memset"),
    ("cuGraphLaunch", "cuGraphLaunch", "graph"),
    ("cudaStreamWaitEvent_v3020", "cudaStreamWaitEvent", "sync"),
    ("cudaGetDevice_v3020", "cudaGetDevice", "other"),
    ("cudaLaunchKernel_v7000\n", "cudaLaunchKernel_v7000\n", "kernel"),  # ($ is the very end, as in polars)
    ("my_v2_kernel", "my_v2_kernel", "other"),
    ("", "", "other"),
])
def test_api_names_in_python_and_in_polars(name, stripped, kind):
    assert (strip_version(name), launch_kind(strip_version(name))) == (stripped, kind)
    df = pl.DataFrame({"name": [name]}).select(s=strip_api_version(pl.col("name"))).with_columns(k=api_kind(pl.col("s")))
    assert df.row(0) == (stripped, kind)


@needs_connectorx
@pytest.mark.slow
def test_command_line_head_start_without_numpy(tmp_path):
    """The console script's own process: the head start imports pyarrow as if numpy were absent, reads both big
    tables from it, and prints what the plain sqlite3 path prints."""
    path = TRACES[1]
    code = (
        "import sys\n"
        "import tracekit.readers.nsys.scan as s, tracekit.readers.nsys.reader as n\n"
        "s.SMALL_FILE_BYTES = 0; n._Db.SMALL_FILE_BYTES = 0\n"
        "take = s.take\n"
        "def counting(uri, sql):\n"
        "    t = take(uri, sql)\n"
        "    if t is not None: sys.stderr.write('HIT\\n')\n"
        "    return t\n"
        "s.take = counting\n"
        f"sys.argv = ['tracekit', 'breakdown', r'{path}', '--format', 'json']\n"
        "from tracekit.cli import main\n"
        "def report():\n"
        "    sys.stderr.write('numpy %s\\n' % ('numpy' in sys.modules)); sys.stderr.flush()\n"
        "import tracekit.cli.app as app\n"
        "exit_now = app._exit_now\n"
        "def _exit_now(e):\n"
        "    report(); exit_now(e)\n"
        "app._exit_now = _exit_now\n"
        "main()\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRACEKIT_SQLITE_ENGINES"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stderr.split() == ["HIT", "HIT", "numpy", "False"], out.stderr
    plain = subprocess.run([sys.executable, "-m", "tracekit", "breakdown", str(path), "--format", "json"],
                           capture_output=True, text=True, cwd=ROOT, env={**env, "TRACEKIT_SQLITE_ENGINES": "sqlite3"})
    assert plain.returncode == 0 and out.stdout == plain.stdout


def _allocator_setting(args: list[str], env: dict, small_bytes: int = 0) -> str:
    """``_RJEM_MALLOC_CONF`` as the console script leaves it before any command runs (a fresh process)."""
    code = ("import os, sys\n"
            "import tracekit.readers.nsys.scan as s\n"
            f"s.SMALL_FILE_BYTES = {small_bytes}\n"
            f"s.keep_freed_memory({args!r})\n"
            "print(os.environ.get('_RJEM_MALLOC_CONF', '-'), 'polars' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.mark.slow
def test_freed_memory_kept_for_big_exports_only(tmp_path):
    """Polars' allocator reuses freed memory (issue 25, sixth and eighth passes) only for a big trace given to the
    console script: a big nsys export (kept 5 s too) or a big Kineto trace (polars' decay), by their first bytes; not a
    small one, another file, a pipe (never read), ``capture``, or where the user set the allocator's configuration."""
    env = {k: v for k, v in os.environ.items() if k != "_RJEM_MALLOC_CONF"}
    export, kineto = str(TRACES[1]), str(sample("hf-large-eager-torch/trace.json.gz"))
    assert _allocator_setting(["breakdown", export, "--format", "json"], env) == f"{nsys_scan.KEEP_FREED} False"
    assert _allocator_setting(["breakdown", export], env, small_bytes=16 << 20) == "- False"
    assert _allocator_setting(["breakdown", kineto], env) == f"{nsys_scan.REUSE_FREED} False"  # (gzip)
    assert _allocator_setting(["breakdown", kineto], env, small_bytes=16 << 20) == "- False"
    plain, text = tmp_path / "t.json", tmp_path / "notes.txt"
    plain.write_text('  \n{"traceEvents": []}')
    text.write_text("traceEvents, not a JSON object")
    assert _allocator_setting(["breakdown", str(plain)], env) == f"{nsys_scan.REUSE_FREED} False"
    assert _allocator_setting(["breakdown", str(text)], env) == "- False"
    gz = tmp_path / "t.sqlite.gz"  # (gzip, but not a Kineto trace's name)
    gz.write_bytes(Path(kineto).read_bytes())
    assert _allocator_setting(["breakdown", str(gz)], env) == "- False"
    # A directory (several ranks) counts by its trace files.
    ranks = tmp_path / "ranks"
    ranks.mkdir()
    assert _allocator_setting(["breakdown", str(ranks)], env) == "- False"
    (ranks / "rank0.sqlite").write_bytes(Path(export).read_bytes())
    assert _allocator_setting(["breakdown", str(ranks), "--engine", "process"], env) == f"{nsys_scan.KEEP_FREED} False"
    # (the nsys setting wins when both kinds are given: a diff of an export against a Kineto trace)
    assert _allocator_setting(["diff", kineto, export], env) == f"{nsys_scan.KEEP_FREED} False"
    assert _allocator_setting(["breakdown", export], {**env, "_RJEM_MALLOC_CONF": "narenas:2"}) == "narenas:2 False"
    assert _allocator_setting(["capture", "--", "python", export], env) == "- False"  # (the profiled workload's env)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    assert not nsys_scan.big_export(fifo)  # (an open() would block here: nothing writes to it)
    assert not nsys_scan.big_kineto(fifo)
    assert _allocator_setting(["breakdown", str(fifo)], env) == "- False"


def test_big_blocks_given_back_for_big_exports(tmp_path):
    """For a big export the C library gives every block of 128 KiB or more back to the system when it is freed
    (``readers.common.give_back_big_blocks``): in the console script's process (``mallopt``) and, through
    ``MALLOC_MMAP_THRESHOLD_``, in those it starts (the rank pool's workers). Not for a Kineto trace (its columns are
    polars' own), not where the user set the variable or polars' allocator configuration."""
    code = ("import os, sys\n"
            "import tracekit.readers.nsys.scan as s\n"
            "s.keep_freed_memory(sys.argv[1:])\n"
            "print(os.environ.get('MALLOC_MMAP_THRESHOLD_', '-'))\n")
    env = {k: v for k, v in os.environ.items() if k not in ("_RJEM_MALLOC_CONF", "MALLOC_MMAP_THRESHOLD_")}

    def threshold(args, extra=None):
        out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=ROOT,
                             env={**env, **(extra or {})}, timeout=60)
        assert out.returncode == 0, out.stderr
        return out.stdout.strip()

    export, kineto = str(TRACES[1]), str(sample("hf-large-eager-torch/trace.json.gz"))
    # (SMALL_FILE_BYTES is not patched here: TRACES[1] counts as big only if it is; the rank folder below is)
    ranks = tmp_path / "ranks"
    ranks.mkdir()
    big = ranks / "rank0.sqlite"
    big.write_bytes(Path(export).read_bytes() + b"\0" * max(0, nsys_scan.SMALL_FILE_BYTES + 1 - Path(export).stat().st_size))
    from tracekit.readers.nsys.scan import BIG_BLOCK

    assert threshold(["breakdown", str(big)]) == str(BIG_BLOCK)
    assert threshold(["breakdown", str(ranks), "--engine", "process"]) == str(BIG_BLOCK)
    assert threshold(["breakdown", kineto]) == "-"
    assert threshold(["breakdown", str(big)], {"MALLOC_MMAP_THRESHOLD_": "65536"}) == "65536"
    assert threshold(["breakdown", str(big)], {"_RJEM_MALLOC_CONF": "narenas:2"}) == "-"
