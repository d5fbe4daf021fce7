"""`tracekit kernels` computes each kernel name's statistics as `nsys stats --report cuda_gpu_kern_sum` does.

The references are nsys's own CSVs, written on the GPU host by nsys stats itself (never by us), for every export we
have one for: ``tests/data/nsys_stats/*.toml`` names each CSV and the trace it was made from (see the index's
header; new CSVs come from ``benchmarks/device_nsys_stats.sh refs``). Each row must agree on the name, the count,
and, within 1 ns or 0.1% (the CSV rounds its averages to 0.1 ns), the total, mean, median, minimum, maximum and
standard deviation; the rows are the same names.

The device script itself is run here too, with a stand-in for nsys that computes the report with Python's
``statistics`` module straight from the export's SQL (a second, independent implementation): the tarball it packs
holds the CSVs and an index this test reads as it reads the committed one.
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

import pytest

import tracekit
from tracekit.results.kernels import kernel_summary

from conftest import DATA, ROOT, SAMPLES, sample, shared

try:  # Python >= 3.11
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

REFS = DATA / "nsys_stats"


def read_index(folder: Path) -> list[dict]:
    """Every ``[[ref]]`` of every ``*.toml`` in ``folder`` (``csv``, ``trace``, ``nsys``), in file order."""
    refs = []
    for f in sorted(folder.glob("*.toml")):
        refs += tomllib.loads(f.read_text(encoding="utf-8")).get("ref", [])
    return refs


def trace_path(spec: str, *, root: Path = ROOT) -> Path:
    """The trace a ``KIND:path`` names (sample: sample_traces/, shared: the external traces, read in place and
    skipped where absent, data: tests/data/)."""
    kind, _, rel = spec.partition(":")
    if kind == "sample":
        return sample(rel)
    if kind == "shared":
        return shared(rel)
    if kind == "data":
        p = DATA / rel
        assert p.is_file(), f"tests/data/{rel} does not exist"
        return p
    raise AssertionError(f"unknown trace kind in {spec!r} (sample, shared or data)")


def nsys_rows(path: Path) -> list[dict]:
    """nsys stats' kern_sum CSV as rows of numbers, by the columns' leading words (their units vary by version)."""
    with path.open(newline="", encoding="utf-8") as fh:
        rows = list(csv.reader(fh))
    if not rows:
        return []
    head = rows[0]

    def col(prefix: str) -> int:
        hits = [i for i, h in enumerate(head) if h.strip().startswith(prefix)]
        assert len(hits) == 1, f"{path}: no single column {prefix!r} in {head}"
        return hits[0]

    ix = {k: col(p) for k, p in (("pct", "Time"), ("total", "Total"), ("count", "Instances"), ("mean", "Avg"),
                                 ("median", "Med"), ("min", "Min"), ("max", "Max"), ("stddev", "StdDev"),
                                 ("name", "Name"))}
    out = []
    for r in rows[1:]:
        if not r:
            continue
        row = {k: float(r[i].replace(",", "")) for k, i in ix.items() if k != "name"}
        row["name"] = r[ix["name"]]
        out.append(row)
    return out


def close(ours_ns: float, ref_ns: float) -> bool:
    """Within 1 ns or 0.1%, whichever is larger."""
    return abs(ours_ns - ref_ns) <= max(1.0, 1e-3 * abs(ref_ns))


def assert_equal_to_nsys(trace: Path, csv_path: Path) -> int:
    """Every row of nsys's CSV equals ours; returns the number of rows compared."""
    ref = nsys_rows(csv_path)
    names = [r["name"] for r in ref]
    assert len(set(names)) == len(names), f"{csv_path}: a name appears twice"
    ours = {k.name: k for k in kernel_summary(tracekit.load(trace)).kernels}
    assert sorted(ours) == sorted(names), f"{csv_path}: the kernel names differ from tracekit's"
    bad = []
    for r in ref:
        k = ours[r["name"]]
        if k.count != int(r["count"]):
            bad.append((r["name"], "count", k.count, r["count"]))
        for key, value_ns in (("total", k.total_ms * 1e6), ("mean", k.mean_us * 1e3), ("median", k.median_ms * 1e6),
                              ("min", k.min_ms * 1e6), ("max", k.max_ms * 1e6), ("stddev", k.stddev_ms * 1e6)):
            if not close(value_ns, r[key]):
                bad.append((r["name"][:80], key, value_ns, r[key]))
        if abs(100 * k.share - r["pct"]) > 0.051:  # (Time (%) is rounded to 0.1)
            bad.append((r["name"][:80], "share %", 100 * k.share, r["pct"]))
    assert not bad, f"{csv_path}: {len(bad)} value(s) differ from nsys stats, e.g. {bad[:5]}"
    return len(ref)


INDEX = read_index(REFS)


@pytest.mark.parametrize("ref", INDEX, ids=[r["trace"] for r in INDEX])
@pytest.mark.slow
def test_kernel_statistics_equal_nsys_stats(ref):
    path = trace_path(ref["trace"])
    n = assert_equal_to_nsys(path, ROOT / ref["csv"])
    assert n > 0 or not kernel_summary(tracekit.load(path)).kernels


def test_every_reference_csv_is_indexed_once():
    named = [ROOT / r["csv"] for r in INDEX]
    assert all(p.is_file() for p in named), [str(p) for p in named if not p.is_file()]
    assert len(set(named)) == len(named)
    on_disk = set(REFS.glob("*.csv")) | set(SAMPLES.glob("*/nsys_stats_kern_sum.csv"))
    assert on_disk <= set(named), f"CSVs with no [[ref]] in {REFS}/*.toml: {sorted(map(str, on_disk - set(named)))}"
    assert len(INDEX) >= 7


def test_the_statistics_are_nsys_stats_definitions_on_a_hand_checked_kernel():
    """hf-small-graph: a kernel with an even count whose median falls between two durations (nsys: 4271.5 ns), and
    one whose durations are all read here by SQL: sample standard deviation, median of the middle two."""
    import statistics

    from conftest import sample_sqlite, sql_rows

    k = {r.name: r for r in kernel_summary(tracekit.load(sample("hf-small-graph/trace.sqlite.gz"))).kernels}
    row = k["nvjet_sm90_tst_8x64_64x16_4x1_v_bz_TNN"]
    assert row.count == 768 and row.median_ms * 1e6 == pytest.approx(4271.5, abs=1e-6)  # nsys's Med (ns)
    durs = [d for (d,) in sql_rows(sample_sqlite("hf-small-graph"), """
        SELECT k.end - k.start FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.demangledName
        WHERE s.value = 'nvjet_sm90_tst_8x64_64x16_4x1_v_bz_TNN'""")]
    assert len(durs) == 768
    assert row.median_ms * 1e6 == statistics.median(durs)
    assert row.stddev_ms * 1e6 == pytest.approx(statistics.stdev(durs), rel=1e-12)
    assert (row.min_ms * 1e6, row.max_ms * 1e6) == (min(durs), max(durs))
    singles = [r for r in k.values() if r.count == 1]
    assert all(r.stddev_ms == 0 and r.min_ms == r.median_ms == r.max_ms for r in singles)


# A stand-in for `nsys stats --report cuda_gpu_kern_sum --format csv --output PREFIX DB`: the same report from the
# export's SQL with Python's statistics module (median of the middle two, sample standard deviation, 0 for one).
FAKE_NSYS = textwrap.dedent('''\
    import csv, sqlite3, statistics, sys
    if sys.argv[1:2] == ["--version"]:
        print("NVIDIA Nsight Systems version 0000.0.0-stand-in"); sys.exit(0)
    args = sys.argv[1:]
    prefix, db = args[args.index("--output") + 1], args[-1]
    con = sqlite3.connect(db)
    by = {}
    for name, dur in con.execute("SELECT s.value, k.end - k.start FROM CUPTI_ACTIVITY_KIND_KERNEL k "
                                 "JOIN StringIds s ON s.id = k.demangledName"):
        by.setdefault(name, []).append(dur)
    grand = sum(map(sum, by.values()))
    with open(prefix + "_cuda_gpu_kern_sum.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["Time (%)", "Total Time (ns)", "Instances", "Avg (ns)", "Med (ns)", "Min (ns)", "Max (ns)",
                    "StdDev (ns)", "Name"])
        for name, d in sorted(by.items(), key=lambda kv: -sum(kv[1])):
            w.writerow([round(100 * sum(d) / grand, 1), sum(d), len(d), round(sum(d) / len(d), 1),
                        statistics.median(d), min(d), max(d), round(statistics.stdev(d), 1) if len(d) > 1 else 0.0,
                        name])
    ''')


@pytest.mark.slow
def test_the_device_script_packs_csvs_and_an_index_the_test_reads(tmp_path):
    """``benchmarks/device_nsys_stats.sh refs`` end to end on the CPU (a stand-in for nsys): a .sqlite.gz sample is
    decompressed, a plain .sqlite read, nothing is written beside them, and what comes back passes the same check."""
    fake = tmp_path / "nsys"
    fake.write_text(f"#!/bin/sh\nexec {sys.executable} {tmp_path / 'fake_nsys.py'} \"$@\"\n")
    fake.chmod(0o755)
    (tmp_path / "fake_nsys.py").write_text(FAKE_NSYS)
    samples = tmp_path / "samples"  # two samples only (a .sqlite.gz and a plain .sqlite), as sample_traces lays them
    for name in ("hf-small-graph", "hf-small-eager"):
        (samples / name).mkdir(parents=True)
        src = next((SAMPLES / name).glob("trace.sqlite*"))
        (samples / name / src.name).symlink_to(src)
    before = {p: p.stat().st_mtime_ns for p in (SAMPLES / "hf-small-graph").iterdir()}
    out = tmp_path / "out"
    r = subprocess.run(["bash", "benchmarks/device_nsys_stats.sh", "refs", str(out), f"sample={samples}"],
                       cwd=ROOT, env={**os.environ, "NSYS": str(fake)}, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "csv: 2, without a CSV: 0" in (out / "nsys_stats.log").read_text()
    dest = tmp_path / "data"
    with tarfile.open(out / "nsys_stats.tar.gz") as tar:
        tar.extractall(dest, filter="data")
    got = dest / "nsys_stats"
    assert sorted(p.name for p in got.glob("*.csv")) == ["sample-hf-small-eager__trace.csv",
                                                          "sample-hf-small-graph__trace.csv"]
    index = read_index(got)
    assert sorted(r["trace"] for r in index) == ["sample:hf-small-eager/trace.sqlite",
                                                  "sample:hf-small-graph/trace.sqlite.gz"]
    assert {r["nsys"] for r in index} == {"0000.0.0"}
    for ref in index:  # (the csv paths are where the integrator puts them: tests/data/nsys_stats/)
        assert ref["csv"].startswith("tests/data/nsys_stats/")
        assert assert_equal_to_nsys(trace_path(ref["trace"]), dest / ref["csv"].removeprefix("tests/data/")) > 30
    assert {p: p.stat().st_mtime_ns for p in (SAMPLES / "hf-small-graph").iterdir()} == before
