"""tracekit.readers.nsys: the SQLite reader's counts checked against direct SQL on real exports of every era; then
`.nsys-rep` input (converted with the user's nsys) and the reader's head start (scan.py), each in a section below."""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner
from polars.testing import assert_frame_equal

import tracekit
import tracekit.readers.nsys.reader as nsys
import tracekit.readers.nsys.scan as nsys_scan
from tracekit.cli import cli
from tracekit.readers.api_names import launch_kind, strip_version
from tracekit.readers.common import api_kind, strip_api_version

from conftest import DATA, ROOT, sample, shared

LAUNCH_SQL = """
SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON r.nameId = s.id
WHERE r.eventClass IN (0, 1) AND (s.value LIKE 'cudaLaunch%' OR s.value LIKE 'cuLaunch%'
   OR s.value LIKE 'cudaGraphLaunch%' OR s.value LIKE 'cuGraphLaunch%' OR s.value LIKE 'cudaMemcpy%'
   OR s.value LIKE 'cuMemcpy%' OR s.value LIKE 'cudaMemset%' OR s.value LIKE 'cuMemset%')
"""


def sql_counts(path):
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}

    def count(sql, table):
        return con.execute(sql).fetchone()[0] if table in tables else 0

    out = {
        "kernels": count("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_KERNEL"),
        "memops": count("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMCPY")
        + count("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_MEMSET", "CUPTI_ACTIVITY_KIND_MEMSET"),
        "launches": count(LAUNCH_SQL, "CUPTI_ACTIVITY_KIND_RUNTIME"),
        "ranges": count("SELECT count(*) FROM NVTX_EVENTS WHERE eventType IN (59, 60, 70, 71)", "NVTX_EVENTS"),
    }
    con.close()
    return out


ERA_FILES = [
    (DATA / "nsys" / "pipit_saxpy_2022.2.sqlite", "2022.2.1.31"),
    (DATA / "nsys" / "fuser_report2_2024.6.sqlite", "2024.6.2.25"),
    (DATA / "nsys" / "nsysai_mock_2026.1.sqlite", "2026.1.1.204"),
    (DATA / "nsys" / "nsysai_mfu_2gpu_before_2026.2.sqlite", "2026.2.1.210"),
]


@pytest.mark.parametrize("path,version", ERA_FILES, ids=[p.name for p, _ in ERA_FILES])
def test_counts_match_direct_sql(path, version):
    trace = tracekit.load(path)
    from tracekit.results.info import info

    got = info(trace)
    assert got.counts.to_dict() == sql_counts(path)
    assert got["source"]["producer_version"] == version
    assert got["source"]["format"] == "nsys-sqlite"


def test_2022_duplicate_backtrace_rows_are_dropped():
    # nsys 2022.2 writes each backtraced call twice (eventClass 0 and 67, same correlationId).
    path = DATA / "nsys" / "pipit_saxpy_2022.2.sqlite"
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    n_all = con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME").fetchone()[0]
    n_real = con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE eventClass IN (0,1)").fetchone()[0]
    assert n_all > n_real  # the quirk is really there
    trace = tracekit.load(path)
    n_work_sync = con.execute(LAUNCH_SQL.replace("AND (s.value LIKE 'cudaLaunch%'", """AND (
        s.value LIKE '%Synchronize%' OR s.value LIKE 'cudaStreamWaitEvent%' OR s.value LIKE 'cudaLaunch%'""")
                              ).fetchone()[0]
    assert 0 < n_work_sync < n_real  # other runtime calls (cudaGetDevice, ...) are not read
    assert trace.launches.height == n_work_sync
    assert trace.launches.select("pid", "correlation").is_duplicated().sum() == 0


def test_correlation_is_joined_per_process():
    # reference/nsys-sqlite.md §6.1: 4,010 kernels; joining on correlationId and the process gives 3,986 matches.
    trace = tracekit.load(DATA / "nsys" / "nsysai_mfu_2gpu_before_2026.2.sqlite")
    assert trace.kernels.height == 4010
    joined = trace.kernels.join(trace.launches, on=["pid", "correlation"], how="inner")
    assert joined.height == 3986
    assert trace.kernels["pid"].n_unique() == 2


def test_gpu_info_and_bandwidth_from_target_info():
    trace = tracekit.load(DATA / "nsys" / "fuser_report2_2024.6.sqlite")
    row = trace.gpus.row(0, named=True)
    con = sqlite3.connect(f"file:{DATA / 'nsys' / 'fuser_report2_2024.6.sqlite'}?mode=ro", uri=True)
    name, bw = con.execute("SELECT name, memoryBandwidth FROM TARGET_INFO_GPU").fetchone()
    assert row["name"] == name == "NVIDIA H200"
    assert row["peak_bw_gbps"] == pytest.approx(bw / 1e9)


def test_nvtx_text_and_registered_strings():
    # mfu export: 18,656 NVTX rows carry text inline and 462 only a registered textId.
    trace = tracekit.load(DATA / "nsys" / "nsysai_mfu_2gpu_before_2026.2.sqlite")
    assert trace.ranges.height == 19118
    assert (trace.ranges["name"] == "").sum() == 0


def test_missing_gpu_table_warns():
    trace = tracekit.load(DATA / "nsys" / "nsysai_mfu_2gpu_before_2026.2.sqlite")
    assert any("TARGET_INFO_GPU" in w for w in trace.meta.warnings)
    assert sorted(trace.gpus["device"].to_list()) == [0, 1]


def test_no_cupti_tables_is_empty_not_an_error():
    trace = tracekit.load(shared("qcu/report1.sqlite"))
    assert trace.kernels.height == 0 and not trace.has_gpu_activity
    assert any("no CUDA activity tables" in w for w in trace.meta.warnings)


def test_2023_1_export_metadata_table():
    trace = tracekit.load(shared("memfusion_artifact/report1.sqlite"))
    assert trace.meta.producer_version == "2023.1.2.43"
    assert trace.kernels.height == sql_counts(shared("memfusion_artifact/report1.sqlite"))["kernels"] == 36


def test_trace_frames_follow_the_schema():
    for path, _ in ERA_FILES:
        tracekit.load(path).validate()
        assert tracekit.load(path).kernels["start"].is_sorted()


def test_times_are_ns_as_in_the_file():
    path = DATA / "nsys" / "nsysai_mock_2026.1.sqlite"
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    rows = con.execute("SELECT start, end FROM CUPTI_ACTIVITY_KIND_KERNEL ORDER BY start").fetchall()
    k = tracekit.load(path).kernels
    assert k.select("start", "end").rows() == rows
    assert k.schema["start"] == pl.Int64


def test_kernel_name_missing_from_stringids_is_unnamed(tmp_path):
    """A kernel whose name id is not in StringIds (a damaged export; made here on a copy of a real one) is named
    ``<unnamed kernel>``; the others keep their names; the column stays categorical."""
    import shutil
    import sqlite3

    import polars as pl

    from tracekit.readers.nsys.reader import read_nsys

    src = DATA / "nsys/pipit_saxpy_2022.2.sqlite"
    copy = tmp_path / "damaged.sqlite"
    shutil.copyfile(src, copy)
    con = sqlite3.connect(copy)
    table = next(t for (t,) in con.execute("SELECT name FROM sqlite_master WHERE type='table'")
                 if t.startswith("CUPTI_ACTIVITY_KIND_KERNEL"))
    n = con.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
    con.execute(f"UPDATE {table} SET shortName = -12345, demangledName = -12345 WHERE rowid = "
                f"(SELECT min(rowid) FROM {table})")
    con.commit()
    con.close()
    before = read_nsys(src).kernels["name"]
    after = read_nsys(copy).kernels["name"]
    assert after.dtype == pl.Categorical and after.len() == n
    assert (after == "<unnamed kernel>").sum() == 1
    assert (before == "<unnamed kernel>").sum() == 0

# ───────────────────────── .nsys-rep input (formerly test_nsysrep.py)
# `.nsys-rep` input: converted with the user's nsys into a cache dir, never beside the report; a clear error
# without nsys. A stand-in `nsys` script (it copies a real export) plays the converter.

REAL = DATA / "nsys" / "nsysai_mock_2026.1.sqlite"


def fake_nsys(tmp_path):
    script = tmp_path / "bin" / "nsys"
    script.parent.mkdir()
    # nsys export --type sqlite --force-overwrite true -o OUT REPORT
    script.write_text(f"#!/bin/sh\nwhile [ $# -gt 2 ]; do [ \"$1\" = -o ] && out=$2; shift; done\n"
                      f"cp '{REAL}' \"$out\"\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


def test_nsys_rep_is_exported_to_the_cache_not_beside(tmp_path, monkeypatch):
    report_dir = tmp_path / "reports"
    report_dir.mkdir()
    rep = report_dir / "run.nsys-rep"
    rep.write_bytes(b"not really a report; the stand-in nsys ignores it")
    monkeypatch.setenv("NSYS", str(fake_nsys(tmp_path)))
    monkeypatch.setenv("TRACEKIT_CACHE", str(tmp_path / "cache"))
    r = CliRunner().invoke(cli, ["info", str(rep), "--format", "json"])
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["counts"]["kernels"] == 2  # the real export's two kernels
    assert sorted(os.listdir(report_dir)) == ["run.nsys-rep"]  # nothing written beside the report
    assert len(list((tmp_path / "cache").glob("*.sqlite"))) == 1
    r = CliRunner().invoke(cli, ["info", str(rep), "--format", "json"])  # second time: from the cache
    assert r.exit_code == 0 and len(list((tmp_path / "cache").glob("*.sqlite"))) == 1


def test_nsys_rep_without_nsys_says_what_to_run(tmp_path, monkeypatch):
    rep = tmp_path / "run.nsys-rep"
    rep.write_bytes(b"x")
    monkeypatch.delenv("NSYS", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no nsys anywhere
    r = CliRunner().invoke(cli, ["breakdown", str(rep)])
    assert r.exit_code == 2
    line = r.stderr.strip()
    assert line.startswith("tracekit: error: ") and "nsys export --type sqlite" in line and "\n" not in line

# ───────────────────────── the head start (readers/nsys/scan.py) (formerly test_head_start.py)
# The nsys reader's head start (tracekit.readers.nsys.scan): the big scans begun before polars is imported must
# give the very frames the reader reads itself, and a head start that guessed wrong must only go unused.

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
    # both big tables came from the head start, once each: the kernels, and the runtime calls that launch or
    # synchronise (the two scans run side by side: either may reach the engine first)
    assert sorted(("KERNEL" in q, "RUNTIME" in q) for q in hits) == [(False, True), (True, False)]
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
