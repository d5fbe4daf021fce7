"""nsys SQLite reader: counts checked against direct SQL on real exports of every era."""

from __future__ import annotations

import sqlite3

import polars as pl
import pytest

import tracekit

from conftest import DATA, shared

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
