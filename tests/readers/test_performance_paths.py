"""The fast SQLite->Arrow paths of the nsys reader give exactly the frames of the plain sqlite3 path.

Correctness only (timings live in benchmarks/): every real export in tests/data/nsys is read
once per engine and every Trace frame must be identical, dtypes included. Also: the fast
paths keep the file untouched (read-only, nothing beside it) and errors stay one-line
TracekitErrors.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

import tracekit.readers.nsys.reader as nsys
from tracekit.errors import TracekitError

DATA = Path(__file__).parents[1] / "data" / "nsys"
FILES = sorted(DATA.glob("*.sqlite"))
FRAMES = ("kernels", "memops", "launches", "ranges", "graph_execs", "gpus")
FAST = [e for e in ("adbc", "connectorx") if nsys._Db.engine_available(e)]


def _read(path: Path, engines, monkeypatch) -> tuple:
    used: list[str] = []
    orig = nsys._Db.__init__

    def init(self, p, engines_=None):
        orig(self, p, engines)
        self.used = used

    monkeypatch.setattr(nsys._Db, "__init__", init)
    trace = nsys.read_nsys(path)
    monkeypatch.setattr(nsys._Db, "__init__", orig)
    return trace, used


@pytest.mark.skipif(not FAST, reason="no fast SQLite engine installed (adbc-driver-sqlite / connectorx)")
@pytest.mark.parametrize("engine", FAST)
@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_fast_path_frames_equal_sqlite3(path, engine, monkeypatch):
    ref, ref_used = _read(path, ("sqlite3",), monkeypatch)
    fast, used = _read(path, (engine, "sqlite3"), monkeypatch)
    assert set(ref_used) == {"sqlite3"}
    assert engine in used, f"{engine} produced no frame at all: {used}"
    for name in FRAMES:
        a, b = getattr(ref, name), getattr(fast, name)
        assert a.schema == b.schema, name
        assert_frame_equal(a, b, check_exact=True), f"{path.name}:{name}"
    assert ref.meta == fast.meta


def test_default_chain_matches_sqlite3(monkeypatch):
    path = DATA / "nsysai_mfu_2gpu_before_2026.2.sqlite"
    ref, _ = _read(path, ("sqlite3",), monkeypatch)
    fast = nsys.read_nsys(path)
    for name in FRAMES:
        assert_frame_equal(getattr(ref, name), getattr(fast, name), check_exact=True)


def test_env_forces_sqlite3(monkeypatch):
    monkeypatch.setenv("TRACEKIT_SQLITE_ENGINES", "sqlite3")
    db = nsys._Db(FILES[0])
    try:
        db.frame("SELECT 1", {"x": pl.Int64}, "probe")
        assert db.used == ["sqlite3"]
    finally:
        db.close()


@pytest.mark.parametrize("engine", FAST)
def test_fast_path_leaves_file_alone(tmp_path, engine, monkeypatch):
    f = tmp_path / "t.sqlite"
    shutil.copyfile(DATA / "nsysai_mfu_2gpu_before_2026.2.sqlite", f)
    before = hashlib.sha256(f.read_bytes()).hexdigest()
    _read(f, (engine, "sqlite3"), monkeypatch)
    assert hashlib.sha256(f.read_bytes()).hexdigest() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.sqlite"]


@pytest.mark.parametrize("engine", [*FAST, "sqlite3"])
def test_errors_are_one_line_tracekit_errors(engine, tmp_path):
    db = nsys._Db(DATA / "nsysai_mock_2026.1.sqlite", engines=(engine, "sqlite3"))
    try:
        with pytest.raises(TracekitError) as e:
            db.frame("SELECT nosuch FROM CUPTI_ACTIVITY_KIND_KERNEL", {"x": pl.Int64}, "probe table")
        assert "\n" not in str(e.value) and "cannot read probe table" in str(e.value)
        with pytest.raises(TracekitError) as e:
            db.frame("SELECT 'text' AS x", {"x": pl.Int64}, "probe values")
        assert "wrong type" in str(e.value)
    finally:
        db.close()
    bad = tmp_path / "bad.sqlite"
    bad.write_bytes(b"SQLite format 3\x00" + b"\x00" * 200)
    with pytest.raises(TracekitError):
        nsys.read_nsys(bad)


# ---- the analysis' fast paths (synthetic keys for the definitions, real traces for the results)


def test_asof_matches_polars_join_asof():
    """tracekit.intervals.asof (binary search when one thread holds every row, else polars' join_asof on sorted
    keys, put back in order) gives join_asof's match for every row. Synthetic keys (a definition check): one and
    several groups, duplicates, unsorted left rows, rows of a group the right side lacks, nulls."""
    import random

    from tracekit.intervals import asof

    rng = random.Random(7)
    for trial in range(200):
        m = rng.randint(1, 40)
        groups = [1] if trial % 2 else [1, 2]
        r = pl.DataFrame({"pid": [rng.choice(groups) for _ in range(m)], "tid": [5] * m,
                          "rt": [rng.randint(0, 60) for _ in range(m)], "v": list(range(m))}).sort("rt")
        n = rng.randint(0, 40)
        left = pl.DataFrame({"pid": [rng.choice([1, 1, 2, 3, None]) for _ in range(n)], "tid": [5] * n,
                             "t": [rng.choice([rng.randint(-5, 65), None]) if trial % 5 == 0 else rng.randint(-5, 65)
                                   for _ in range(n)]}, schema={"pid": pl.Int64, "tid": pl.Int64, "t": pl.Int64})
        for strategy in ("backward", "forward"):
            for exact in (True, False):
                got = asof(left, r, "t", "rt", ["pid", "tid"], strategy=strategy, allow_exact_matches=exact)
                q = left.with_row_index("_i").filter(pl.col("t").is_not_null()).sort("t")
                want = (q.join_asof(r, left_on="t", right_on="rt", by=["pid", "tid"], strategy=strategy,
                                    allow_exact_matches=exact, check_sortedness=False)
                        .select("_i", "v"))
                want = left.with_row_index("_i").join(want, on="_i", how="left").sort("_i")["v"]
                assert got["v"].to_list() == want.to_list(), (trial, strategy, exact)


@pytest.mark.parametrize("name", ["hf-small-eager/trace.sqlite", "serve-small-eager/trace.sqlite.gz",
                                  "synthetic-eager-torch/trace.json.gz"])
def test_stall_prefilter_changes_nothing(name, monkeypatch):
    """partition._holes computes host stalls only for gaps that some stall segment overlaps (the rest are 0):
    the breakdown is the same as with every gap looked up, and the filter does drop gaps on these traces."""
    import tracekit
    import tracekit.analyses.partition as part

    from conftest import sample

    trace = tracekit.load(sample(name))
    seen: list[tuple[int, int]] = []
    orig = part._overlaps_any

    def spy(holes, segments):
        out = orig(holes, segments)
        seen.append((int(out.sum()), out.len()))
        return out

    monkeypatch.setattr(part, "_overlaps_any", spy)
    fast = tracekit.breakdown(trace).to_dict()
    assert seen and seen[0][0] < seen[0][1]  # gaps were skipped
    monkeypatch.setattr(part, "_overlaps_any", lambda holes, segments: pl.repeat(True, holes.height, eager=True))
    assert tracekit.breakdown(trace).to_dict() == fast


def test_small_export_reads_its_tables_on_one_thread(monkeypatch):
    """A small export (plain sqlite3 rows, built under the GIL) reads its big tables one after the other; a big one
    keeps the reading threads. Structural: the frames are the same either way (test_default_chain_matches_sqlite3)."""
    import tracekit.parallel

    seen = []
    orig = tracekit.parallel.in_threads

    def spy(*tasks, threads=True):
        seen.append(threads)
        return orig(*tasks, threads=threads)

    monkeypatch.setattr(tracekit.parallel, "in_threads", spy)
    small = Path(__file__).parents[2] / "sample_traces" / "hf-small-eager" / "trace.sqlite"
    assert small.stat().st_size < nsys._Db.SMALL_FILE_BYTES
    nsys.read_nsys(small)
    assert seen and not any(seen)
    monkeypatch.setattr(nsys._Db, "SMALL_FILE_BYTES", 0)
    seen.clear()
    nsys.read_nsys(small)
    assert seen and all(seen)
