"""The breakdown's fast paths give exactly what the plain ones give (timings live in benchmarks/).

* ``row_lookup`` (activity -> launch): its sorted-merge and dense-table paths against the hash join,
  on the real traces (every kernel/memop against the work launches) and on generated keys
  (duplicates, several processes, nulls, negative and huge ids).
* ``_merge_by_start`` against concat + stable sort.
* ``cumulative_union_lengths(tiled=True)`` (one running maximum across steps, isolated rows summed
  directly) against the grouped, sorted computation, on the clipped activities of every sample trace and
  on generated intervals.
* The nsys reader's parallel table reads against one-by-one reads (every engine), and ``scan_plan`` (the floor's queries)
  against the statements the reader runs.
* The evening pass: ``_overlaps_any``'s runs of time-ordered gaps against its per-gap search, step signatures from
  per-stream lists against the full sort, the Enum name paths against text, and the premise of the drafting precheck.
* Issue 25, phase 3: the per-step analyses on pieces of a few steps against one piece of all, and ``gaps.work_rows``
  (a search among every launch call) against an as-of join over a filtered copy of the work calls.
* Issue 25, fifth pass: the steady-state tokens packed from Enum codes against the hashed text, and the step window
  of each launch from the runs of launches per window against the as-of join.
* Issue 49: the launching thread of inferred steps by a keyed lookup against the semi-join, and the launch sequence
  (kernel tokens from one hash per name code, the few other rows joined alone) against a chain of joins of every
  launch, on unmarked samples (eager, graphs, a serving engine) and a two-GPU export, for every device.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from unittest.mock import patch

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from polars.testing import assert_frame_equal

import tracekit
import tracekit.errors
import tracekit.intervals as iv
import tracekit.lookup as lookup
import tracekit.readers.nsys.reader as nsys
from tracekit.analyses.attribution import _merge_by_start, _merge_plan, _window_of
from tracekit.intervals import cumulative_union_lengths
from tracekit.run.pipeline import step_table
from tracekit.steps import find_steps
from tracekit.trace import WORK_KINDS

from conftest import budget

ROOT = Path(__file__).resolve().parents[2]
NSYS = sorted((ROOT / "tests/data/nsys").glob("*.sqlite"))
SAMPLES = sorted(p for p in (ROOT / "sample_traces").glob("*/trace.*") if p.suffix in (".sqlite", ".gz", ".json"))
TRACES = NSYS + SAMPLES + sorted((ROOT / "tests/data/kineto").glob("*.json.gz"))


def _hash(left: pl.DataFrame, right: pl.DataFrame) -> pl.Series:
    return lookup._hash_lookup(left, right, "pid", "correlation")


@pytest.mark.parametrize("path", TRACES, ids=[f"{p.parent.name}/{p.name}" for p in TRACES])
@pytest.mark.slow
def test_row_lookup_equals_hash_join_on_real_traces(path):
    t = tracekit.load(path, kernel_dims=False)
    work = t.launches.filter(pl.col("kind").is_in(list(WORK_KINDS)))
    for acts in (t.kernels, t.memops, t.kernels.sort("correlation")):
        left = acts.select("pid", "correlation")
        assert lookup.row_lookup(left, work).to_list() == _hash(left, work).to_list()


def test_row_lookup_takes_each_path(monkeypatch):
    """The sorted merge, the dense table and the hash join all run, and agree (one real trace)."""
    t = tracekit.load(ROOT / "sample_traces/hf-small-eager/trace.sqlite", kernel_dims=False)
    work = t.launches.filter(pl.col("kind").is_in(list(WORK_KINDS)))
    left = t.kernels.select("pid", "correlation")
    want = _hash(left, work).to_list()
    assert left["correlation"].is_sorted()  # one stream: kernels in launch order, so the merge path applies
    assert lookup.row_lookup(left, work).to_list() == want
    shuffled = left.sample(fraction=1.0, shuffle=True, seed=1)  # not sorted: the dense table
    assert lookup.row_lookup(shuffled, work).to_list() == _hash(shuffled, work).to_list()
    monkeypatch.setattr(lookup, "DENSITY", 0)
    monkeypatch.setattr(lookup, "_SLACK_ROWS", 0)  # too sparse for a table: the hash join
    assert lookup.row_lookup(shuffled, work).to_list() == _hash(shuffled, work).to_list()


keys = st.lists(st.tuples(st.sampled_from([1, 2, 7]), st.one_of(st.none(), st.integers(-3, 40))), max_size=60)
big = st.lists(st.tuples(st.sampled_from([1, 2]), st.one_of(st.integers(0, 30), st.integers(2**40, 2**40 + 3))),
               max_size=30)


def _frame(rows) -> pl.DataFrame:
    return pl.DataFrame(rows, schema={"pid": pl.Int64, "correlation": pl.Int64}, orient="row")


@pytest.mark.fuzz
@settings(max_examples=budget(300), deadline=None)
@given(left=keys, right=st.one_of(keys, big), sort_both=st.booleans(), chunk=st.sampled_from([1, 3, 1 << 19]))
def test_row_lookup_generated_keys(left, right, sort_both, chunk):
    """Generated (synthetic) keys: duplicates (first row wins), nulls, several pids, negative and huge ids; the
    sorted merge in pieces of a few rows (``chunk``) as in one."""
    lf, rf = _frame(left), _frame(right)
    if sort_both:
        lf, rf = lf.sort("pid", "correlation", nulls_last=True), rf.sort("pid", "correlation", nulls_last=True)
    with patch.object(iv, "CHUNK_ROWS", chunk):
        assert lookup.row_lookup(lf, rf).to_list() == _hash(lf, rf).to_list()


@pytest.mark.fuzz
@settings(max_examples=budget(300), deadline=None)
@given(ids=st.sets(st.integers(-5, 60), min_size=1, max_size=40), left=keys, sort_left=st.booleans(),
       data=st.data(), chunk=st.sampled_from([1, 3, 1 << 19]))
def test_row_lookup_valid_rows(ids, left, sort_left, data, chunk):
    """``valid=`` (only work launches may match) on every path, the sorted one above all (one process, ids
    strictly increasing: launches in time order): as the hash join against the right side with the invalid
    rows' keys removed."""
    right = _frame([(1, i) for i in sorted(ids)])
    valid = pl.Series(data.draw(st.lists(st.booleans(), min_size=right.height, max_size=right.height)),
                      dtype=pl.Boolean)
    lf = _frame(left)
    if sort_left:
        lf = lf.sort("correlation", nulls_last=True)
    want = _hash(lf, right.with_columns(correlation=pl.when(valid).then(pl.col("correlation"))))
    with patch.object(iv, "CHUNK_ROWS", chunk):  # (the sorted merge in pieces of a few rows, as in one)
        assert lookup.row_lookup(lf, right, valid=valid).to_list() == want.to_list()
    shuffled = right.with_row_index("i").sample(fraction=1.0, shuffle=True, seed=2)  # not sorted: other paths
    v2 = valid.gather(shuffled["i"])
    shuffled = shuffled.drop("i")
    want2 = _hash(lf, shuffled.with_columns(correlation=pl.when(v2).then(pl.col("correlation"))))
    assert lookup.row_lookup(lf, shuffled, valid=v2).to_list() == want2.to_list()


@pytest.mark.fuzz
@settings(max_examples=budget(200), deadline=None)
@given(sizes=st.lists(st.integers(0, 25), min_size=1, max_size=4), data=st.data())
def test_merge_by_start_equals_stable_sort(sizes, data):
    frames = [pl.DataFrame({"start": sorted(data.draw(st.lists(st.integers(0, 30), min_size=n, max_size=n))),
                            "src": [i] * n}, schema={"start": pl.Int64, "src": pl.Int64})
              for i, n in enumerate(sizes)]
    got = _merge_by_start(frames)
    want = pl.concat(frames).sort("start", maintain_order=True)
    assert got["start"].to_list() == want["start"].to_list()
    assert sorted(got.rows()) == sorted(want.rows())
    # on equal starts the largest frame's rows first (the first of that height), then the others' as a stable sort
    # of them puts them; the same frame when the order is planned from the starts alone (beside the other columns)
    present = [f for f in frames if f.height]
    if present:
        b = max(range(len(present)), key=lambda i: (present[i].height, -i))
        ranked = pl.concat([f.with_columns(_big=pl.lit(i != b), _r=pl.int_range(0, pl.len()))
                            for i, f in enumerate(present)])
        ties = ranked.with_row_index("_n").sort("start", "_big", "_n", maintain_order=True).drop("_big", "_r", "_n")
        assert got.rows() == ties.rows()
        plan = _merge_plan([f["start"] for f in present])
        assert _merge_by_start(frames, plan=plan).rows() == got.rows()
    # the columns merged on two threads (big traces): the very same frame, every column one chunk
    wide = [f.with_columns(row=pl.int_range(0, pl.len()), cat=pl.col("src").cast(pl.String).cast(pl.Categorical),
                           end=pl.col("start") + 1) for f in frames]
    one = _merge_by_start(wide)
    two = _merge_by_start(wide, threads=True)
    assert two.columns == one.columns and two.rows() == one.rows()
    assert all(two[c].n_chunks() == 1 for c in two.columns)
    # a column of one value, flagged sorted by its reader (one process, one stream): kept as that value, never gathered
    # (the same frame); where one frame holds another value, or the big frame's column is not flagged, gathered
    for other, flag in ((7, True), (8, True), (7, False)):
        flagged = [f.with_columns(pid=pl.lit(7 if i == 0 else other, pl.Int64)) for i, f in enumerate(wide)]
        flagged = [f.with_columns(pl.col("pid").set_sorted()) if flag else f for f in flagged]
        present_ = [f for f in flagged if f.height]
        if present_:
            b = max(range(len(present_)), key=lambda i: (present_[i].height, -i))
            order = pl.concat([f.with_columns(_big=pl.lit(i != b)) for i, f in enumerate(present_)]).with_row_index(
                "_n").sort("start", "_big", "_n", maintain_order=True)["pid"]
            for threads in (False, True):
                got_ = _merge_by_start(flagged, threads=threads)
                assert got_["pid"].to_list() == order.to_list()
                assert got_.drop("pid").rows() == one.rows()
    # a column derived from a merged one (the step of each activity's launch) by the thread that merged it: the
    # function of the merged column, added last, on one thread or two
    fn = lambda s: (s * 7 - 3).cast(pl.Int64)  # noqa: E731
    for threads in (False, True):
        d = _merge_by_start(wide, threads=threads, derived=("der", "row", fn))
        assert d.columns == [*one.columns, "der"] and d.drop("der").rows() == one.rows()
        assert d["der"].to_list() == fn(one["row"]).to_list()


STEP_TRACES = [p for p in SAMPLES]


def _really_sorted(s: pl.Series) -> bool:
    """Non-decreasing, read value by value (``Series.is_sorted`` trusts a sorted flag: it is what is tested); nulls,
    if any, all first or all last (as polars' flag means them: a column of nulls alone is in order)."""
    v = s.to_list()
    n = v.count(None)
    if n and not (all(x is None for x in v[:n]) or all(x is None for x in v[len(v) - n:])):
        return False
    v = [x for x in v if x is not None]
    return all(a <= b for a, b in zip(v, v[1:]))


@pytest.mark.parametrize("path", TRACES, ids=[f"{p.parent.name}/{p.name}" for p in TRACES])
@pytest.mark.slow
def test_sorted_flags_are_true(path):
    """The readers flag a frame's start column, and a device, process, thread or stream column that holds one value,
    as sorted (their min, max and sortedness then answer at once); the merged activities their start. A flag on a
    column that is not in order would make polars answer wrongly (a min that is not the least, a search that misses):
    every flag must be true, read value by value."""
    trace = tracekit.load(path, kernel_dims=False)
    flagged = 0
    for what in ("kernels", "launches", "memops", "graph_execs"):
        frame = getattr(trace, what)
        for c in frame.columns:
            if frame[c].flags["SORTED_ASC"]:
                flagged += 1
                assert _really_sorted(frame[c]), f"{what}.{c} is flagged sorted but is not in order"
    if trace.meta.format == "nsys-sqlite" and trace.kernels.height:
        assert trace.kernels["start"].flags["SORTED_ASC"] and trace.launches["start"].flags["SORTED_ASC"]
    try:
        acts = step_table(trace).attribution.activities
    except tracekit.errors.TracekitError:  # (a trace without steps or GPU work: nothing merged)
        return
    assert acts["start"].flags["SORTED_ASC"] and _really_sorted(acts["start"])


def test_one_value_columns_are_flagged_and_others_not():
    """On a one-GPU, one-thread capture the kernels' device and process and the launches' process and thread are
    flagged; on a trace of several streams, its stream column is not."""
    t = tracekit.load(ROOT / "sample_traces/hf-small-eager/trace.sqlite", kernel_dims=False)
    assert all(t.kernels[c].flags["SORTED_ASC"] for c in ("device", "pid"))
    assert all(t.launches[c].flags["SORTED_ASC"] for c in ("pid", "tid"))
    several = [p for p in NSYS if tracekit.load(p, kernel_dims=False).kernels["stream"].n_unique() > 1]
    assert several, "no test trace of several streams"
    for p in several:
        assert not tracekit.load(p, kernel_dims=False).kernels["stream"].flags["SORTED_ASC"]


@pytest.mark.parametrize("path", STEP_TRACES, ids=[p.parent.name for p in STEP_TRACES])
@pytest.mark.slow
def test_tiled_unions_equal_grouped_sorted_unions(path):
    t = tracekit.load(path, kernel_dims=False)
    acts = step_table(t).activities.with_columns(prio=pl.col("category").to_physical())  # (priority = enum code)
    n = acts["prio"].max() + 1
    # (by clipped start: ties at a period boundary are zero-length rows of the step before, which add nothing)
    in_order = acts.sort("start", maintain_order=True)
    tiled = cumulative_union_lengths(in_order, "step", "prio", n, presorted=True, tiled=True).sort("step")
    plain = cumulative_union_lengths(acts.sample(fraction=1.0, shuffle=True, seed=3), "step", "prio", n).sort("step")
    assert_frame_equal(tiled, plain)
    assert tiled.height == acts["step"].n_unique()


@pytest.mark.fuzz
@settings(max_examples=budget(200), deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(-50, 50), st.integers(0, 30), st.integers(0, 6)),
                min_size=1, max_size=60),
       st.integers(-10**12, 10**12))
def test_tiled_unions_generated(rows, offset):
    """Generated steps that tile the timeline (step g lives in [g*1000, g*1000+900]), with overlapping and
    isolated intervals, zero lengths and negative times: the tiled sweep (its fast path for rows that overlap
    nothing, and its plain path when most rows overlap) against the grouped, sorted computation."""
    df = pl.DataFrame([(g, offset + g * 1000 + 400 + s, offset + g * 1000 + 400 + s + d, lvl) for g, s, d, lvl in rows],
                      schema={"step": pl.Int64, "start": pl.Int64, "end": pl.Int64, "prio": pl.Int32}, orient="row")
    in_order = df.sort("start", maintain_order=True)
    tiled = cumulative_union_lengths(in_order, "step", "prio", 7, presorted=True, tiled=True).sort("step")
    plain = cumulative_union_lengths(df.reverse(), "step", "prio", 7).sort("step")
    assert_frame_equal(tiled, plain)


ENGINES = [e for e in ("connectorx", "adbc") if nsys._Db.engine_available(e)] + ["sqlite3"]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("path", NSYS, ids=[p.name for p in NSYS])
def test_parallel_reads_equal_one_by_one(path, engine, monkeypatch):
    monkeypatch.setenv("TRACEKIT_SQLITE_ENGINES", engine)
    threads: set[int] = set()
    orig = nsys._Db._frame

    def spy(self, *a, **k):
        threads.add(__import__("threading").get_ident())
        return orig(self, *a, **k)

    monkeypatch.setattr(nsys._Db, "_frame", spy)
    nsys.read_nsys(path)
    assert len(threads) == 1  # a small export (all of these are) reads on one thread: threads only contend for the GIL
    threads.clear()
    monkeypatch.setattr(nsys._Db, "SMALL_FILE_BYTES", 0)  # read it as a big export is read
    ref = nsys.read_nsys(path)
    if __import__("tracekit.parallel").parallel.usable_cpus() > 1:
        assert len(threads) > 1  # the big tables were read on worker threads
    monkeypatch.setattr(nsys._Db, "parallel", lambda self, tasks: [t() for t in tasks])
    plain = nsys.read_nsys(path)
    for name in ("kernels", "memops", "launches", "ranges", "graph_execs", "gpus"):
        assert_frame_equal(getattr(ref, name), getattr(plain, name), check_exact=True)


def test_scan_plan_is_what_the_reader_runs(monkeypatch):
    path = ROOT / "sample_traces/hf-small-eager/trace.sqlite"
    plan = nsys.scan_plan(path, kernel_dims=False)
    ran: list[str] = []
    orig = nsys._Db._frame

    def spy(self, sql, *a, **k):
        ran.append(sql)
        return orig(self, sql, *a, **k)

    monkeypatch.setattr(nsys._Db, "_frame", spy)
    nsys.read_nsys(path, kernel_dims=False)
    assert sorted(ran) == sorted(plan)
    runtime = next(q for q in plan if "CUPTI_ACTIVITY_KIND_RUNTIME" in q)
    assert "nameId IN (" in runtime  # the launch filter is in SQL, in the floor too


@pytest.mark.parametrize("path", STEP_TRACES, ids=[p.parent.name for p in STEP_TRACES])
@pytest.mark.slow
def test_window_search_equals_asof_join(path):
    """One step thread: launches are placed by binary search; the as-of join it replaces says the same."""
    t = tracekit.load(path, kernel_dims=False)
    windows = find_steps(t).windows
    for by in (["pid", "tid"], ["pid"]):
        w = windows.select(*by, ws="start", we="end", wid="step").sort("ws")
        ref = t.launches.select(*by, "start").join_asof(w, left_on="start", right_on="ws", by=by,
                                                        strategy="backward", check_sortedness=False)
        ref = ref.select(pl.when(pl.col("we").is_null() | (pl.col("start") <= pl.col("we"))).then("wid"))
        assert _window_of(t.launches, windows, by, "step").to_list() == ref.to_series().to_list()


@pytest.mark.fuzz
@settings(max_examples=budget(300), deadline=None)
@given(wins=st.lists(st.tuples(st.integers(1, 30), st.one_of(st.none(), st.integers(-5, 40))), min_size=1, max_size=12),
       calls=st.lists(st.tuples(st.integers(-10, 400), st.integers(0, 2)), max_size=60))
def test_window_runs_equal_asof_join_generated(wins, calls):
    """The window of each launch from the runs of launches per window (issue 25, fifth pass) against the as-of
    join: windows that overlap the next, open ones (no end), ends before starts, launches on their start or end,
    before the first window, ties, and launches of other threads."""
    t, rows = 0, []
    for i, (gap, length) in enumerate(wins):  # window starts strictly increasing
        t += gap
        rows.append((i * 10 + 3, 1, 1, t, None if length is None else t + length))
    windows = pl.DataFrame(rows, schema={"step": pl.Int64, "pid": pl.Int64, "tid": pl.Int64, "start": pl.Int64,
                                         "end": pl.Int64}, orient="row")
    launches = pl.DataFrame([(1, 1 if k else 2, s) for s, k in calls], schema={"pid": pl.Int64, "tid": pl.Int64,
                                                                            "start": pl.Int64}, orient="row").sort("start")
    for by in (["pid", "tid"], ["pid"]):
        w = windows.select(*by, ws="start", we="end", wid="step").sort("ws")
        ref = launches.select(*by, "start").join_asof(w, left_on="start", right_on="ws", by=by, strategy="backward",
                                                      check_sortedness=False)
        ref = ref.select(pl.when(pl.col("we").is_null() | (pl.col("start") <= pl.col("we"))).then("wid"))
        assert _window_of(launches, windows, by, "step").to_list() == ref.to_series().to_list()


@pytest.mark.parametrize("path", STEP_TRACES[:6], ids=[p.parent.name for p in STEP_TRACES[:6]])
def test_threaded_stages_equal_sequential(path, monkeypatch):
    """The breakdown's independent stages on two threads (big traces) give what they give one after the other."""
    import tracekit.analyses.attribution as at
    import tracekit.analyses.partition as pa
    import tracekit.run.pipeline as bd

    t = tracekit.load(path, kernel_dims=False)
    for m in (at, pa):
        monkeypatch.setattr(m, "THREADS_FROM_ROWS", 10**12)
    seq = bd.breakdown(t)
    for m in (at, pa):
        monkeypatch.setattr(m, "THREADS_FROM_ROWS", 0)
    threads: set[int] = set()
    orig = at.find_steps

    def spy(*a, **k):
        threads.add(__import__("threading").get_ident())
        return orig(*a, **k)

    monkeypatch.setattr(at, "find_steps", spy)  # (the step windows: found beside the activities)
    gap_calls: list[int] = []
    orig_gi = pa._gap_inputs

    def spy_gi(*a, **k):
        gap_calls.append(__import__("threading").get_ident())
        return orig_gi(*a, **k)

    monkeypatch.setattr(pa, "_gap_inputs", spy_gi)
    par = bd.breakdown(t)
    if __import__("tracekit.parallel").parallel.usable_cpus() > 1:
        assert threads and __import__("threading").get_ident() not in threads  # it did run on a worker thread
        # the gaps' host-side inputs: made once, begun before the attribution when the launches are in order
        assert len(gap_calls) == 1 and gap_calls[0] != __import__("threading").get_ident()
        assert (pa.early_gap_inputs(t) is not None) == t.launches["start"].is_sorted()
    assert par.to_dict() == seq.to_dict()
    assert_frame_equal(par.activities, seq.activities)
    assert_frame_equal(par.per_step, seq.per_step)
    # the step signatures, begun beside the phase and drafting analyses: those of the final activities in steps
    from tracekit.analyses.steady import step_signatures

    attr = bd.step_table(t).attribution
    assert attr.signatures is not None
    assert_frame_equal(attr.signatures(), step_signatures(at.in_steps_of(attr.activities)))


# ---- the evening pass's fast paths (benchmarks/results/HISTORY.md, "The breakdown/2 regression, cut")

@pytest.mark.fuzz
@settings(max_examples=budget(300), deadline=None)
@given(gaps=st.lists(st.tuples(st.integers(0, 40), st.integers(1, 30)), min_size=1, max_size=40),
       segs=st.lists(st.tuples(st.integers(-20, 1500), st.integers(0, 60)), max_size=15))
def test_overlaps_any_runs_equal_per_gap_search(gaps, segs):
    """Time-ordered gaps: the per-segment runs mark exactly the gaps the per-gap binary search finds (the plain
    path runs on the same gaps out of order), and both say what the definition says."""
    from tracekit.analyses.partition import _overlaps_any

    h0, t = [], 0
    for skip, length in gaps:  # disjoint, in time order
        t += skip
        h0.append((t, t + length))
        t += length
    holes = pl.DataFrame(h0, schema={"h0": pl.Int64, "h1": pl.Int64}, orient="row")
    segments = pl.DataFrame([(s, s + d) for s, d in segs], schema={"start": pl.Int64, "end": pl.Int64}, orient="row")
    fast = _overlaps_any(holes, segments).to_list()
    plain = _overlaps_any(holes.reverse(), segments).reverse().to_list()
    truth = [any(s < b and e > a for s, e in segments.rows()) for a, b in holes.rows()]
    assert fast == plain == truth


@pytest.mark.parametrize("path", STEP_TRACES, ids=[p.parent.name for p in STEP_TRACES])
@pytest.mark.slow
def test_step_signatures_lists_equal_sorted(path):
    """Activities in start order: the per-(step, stream) lists give the signatures of the full three-key sort."""
    from tracekit.analyses.steady import step_signatures

    acts = step_table(tracekit.load(path, kernel_dims=False)).activities
    fast = step_signatures(acts.sort("start", maintain_order=True))
    shuffled = acts.sample(fraction=1.0, shuffle=True, seed=7)  # not in start order: the sort path
    assert not shuffled["start"].is_sorted() or acts.height < 3
    assert_frame_equal(fast.sort("step"), step_signatures(shuffled).sort("step"))


@pytest.mark.parametrize("path", STEP_TRACES, ids=[p.parent.name for p in STEP_TRACES])
@pytest.mark.slow
def test_enum_name_paths_equal_text_paths(path):
    """name_matches and the communication test on the activities' Enum names (one lookup per category) equal
    the same tests on the names as text."""
    from tracekit.analyses.collectives import _is_comm
    from tracekit.analyses.drafting import SAMPLING_KERNELS, TOPK_KERNELS
    from tracekit.analyses.phase import TRAINING_KERNELS, name_matches

    names = step_table(tracekit.load(path, kernel_dims=False)).activities["name"]
    assert isinstance(names.dtype, pl.Enum)
    text = names.cast(pl.String)
    for rx in (SAMPLING_KERNELS, TOPK_KERNELS, TRAINING_KERNELS, "no kernel is named so", "."):
        assert name_matches(names, rx).to_list() == name_matches(text, rx).to_list()
    (c1, s1), (c2, s2) = _is_comm(names), _is_comm(text)
    assert c1.to_list() == c2.to_list() and s1.to_list() == s2.to_list()


@pytest.mark.parametrize("path", STEP_TRACES, ids=[p.parent.name for p in STEP_TRACES])
@pytest.mark.slow
def test_packed_tokens_equal_text_tokens(path):
    """Issue 25, fifth pass: the steady-state tokens packed from the Enum codes (one number per (name, graphed,
    kind) and per (category, graphed, kind)) group the steps exactly as the hashed text does: the same steps share
    a signature, and every step's composition overlap is the same."""
    from tracekit.analyses.steady import composition_overlap, step_signatures

    acts = step_table(tracekit.load(path, kernel_dims=False)).activities
    text = acts.with_columns(pl.col("name", "kind", "category").cast(pl.String))
    packed, hashed = step_signatures(acts).sort("step"), step_signatures(text).sort("step")
    assert packed["step"].to_list() == hashed["step"].to_list() and packed["n"].to_list() == hashed["n"].to_list()
    same = packed.select(pl.col("sig").rank("dense").alias("a")).with_columns(b=hashed["sig"].rank("dense"))
    assert same.group_by("a").agg(pl.col("b").n_unique())["b"].max() == 1
    assert same.group_by("b").agg(pl.col("a").n_unique())["a"].max() == 1
    steps = packed["step"]
    cands = steps.head(max(2, steps.len() // 2))
    assert_frame_equal(composition_overlap(acts, cands).sort("step"), composition_overlap(text, cands).sort("step"))


@pytest.mark.parametrize("rel", ["hf-small-spec", "spec-small-graph-nomark", "hf-small-eager", "serve-small-graph"])
def test_drafting_precheck_premise(rel):
    """detect_drafting skips cutting forwards when too few steps hold two sampling/top-k kernels. That is safe
    because no step has more forwards than such kernels (each forward ends with one): checked on the full cut."""
    import tracekit.analyses.drafting as dr
    from tracekit.analyses.phase import name_matches

    path = next(p for p in SAMPLES if p.parent.name == rel)
    acts = step_table(tracekit.load(path, kernel_dims=False), draft_range=None).attribution.activities
    acts = acts.filter(pl.col("step").is_not_null())
    if "name_category" in acts.columns:  # (drafting found: the cut runs on the categories by name, as detection does)
        acts = acts.with_columns(category="name_category")
    samp = (name_matches(acts["name"], dr.SAMPLING_KERNELS) | name_matches(acts["name"], dr.TOPK_KERNELS)) & (
        acts["kind"] == "kernel")
    kernels = acts.select(pl.col("step").cast(pl.Int64)).filter(samp).group_by("step").len()
    fwd = dr.forwards(acts).group_by("step").agg(n=pl.col("n_fwd").first())
    both = fwd.join(kernels, on="step", how="left").with_columns(pl.col("len").fill_null(0))
    assert (both["n"] <= both["len"]).all()
    assert (both["n"] >= 2).any() == (rel.startswith(("hf-small-spec", "spec-")))  # the spec samples do cut


# ---- issue 25's pass (benchmarks/results/HISTORY.md, "Issue 25, phase 2"): names classified once per trace, the largest gaps' candidates

def test_frame_name_table_once_across_threads(monkeypatch):
    """Two threads asking for one frame's name table at the same moment (the attribution's names and the
    communication kernels do) get one table, made once: the second waits for the first's."""
    import threading

    from tracekit import classify

    k = tracekit.load(STEP_TRACES[0], kernel_dims=False).kernels
    made, inside, release = [], threading.Event(), threading.Event()
    plain = classify.name_table

    def slow(names, rules=None):
        made.append(threading.current_thread().name)
        inside.set()
        release.wait(5)  # (the other thread asks while this one is making it)
        return plain(names, rules)

    monkeypatch.setattr(classify, "name_table", slow)
    got = {}
    first = threading.Thread(target=lambda: got.setdefault("a", classify.frame_name_table(k)), name="a")
    second = threading.Thread(target=lambda: got.setdefault("b", classify.frame_name_table(k)), name="b")
    first.start()
    assert inside.wait(5)
    second.start()
    second.join(0.2)
    assert second.is_alive()  # waiting for the first thread's table, not making its own
    release.set()
    first.join(5)
    second.join(5)
    assert made == ["a"] and got["a"][0] is got["b"][0]


@pytest.mark.parametrize("path", STEP_TRACES, ids=[p.parent.name for p in STEP_TRACES])
@pytest.mark.slow
def test_frame_name_table_is_name_table_once(path):
    """The kernels' name table made once per frame: the same table as name_table, the same objects on a second
    call, a new one for another rules object or another frame; the communication and training-kernel tests from
    it equal the plain per-row ones (classify's category compared as text, name_matches on the names)."""
    import gc

    from tracekit import classify
    from tracekit.analyses.collectives import _is_comm
    from tracekit.analyses.phase import TRAINING_KERNELS, _kernel_matches, name_matches

    k = tracekit.load(path, kernel_dims=False).kernels
    pos, table = classify.frame_name_table(k)
    pos2, table2 = classify.name_table(k["name"])
    assert pos.to_list() == pos2.to_list() and table.equals(table2)
    assert classify.frame_name_table(k)[0] is pos  # made once
    shipped = classify.load_rules()
    assert classify.frame_name_table(k, shipped)[0] is pos  # (the shipped rules are one object)
    other = classify.Rules(shipped.rules, files=shipped.files, ops=shipped.ops)
    pos3, table3 = classify.frame_name_table(k, other)
    assert pos3 is not pos and pos3.to_list() == pos.to_list() and table3.equals(table)
    copy = k.clone()
    assert classify.frame_name_table(copy)[0] is not pos
    assert id(copy) in classify._FRAME_TABLES
    key = id(copy)
    del copy
    gc.collect()
    assert key not in classify._FRAME_TABLES  # the entry went with its frame
    plain = (classify.classify(k["name"])["category"] == "communication").to_list()
    assert _is_comm(k, sub=False)[0].to_list() == plain == _is_comm(k["name"])[0].to_list()
    for rx in (TRAINING_KERNELS, "no kernel is named so", "."):
        assert _kernel_matches(k, rx).to_list() == name_matches(k["name"], rx).to_list()


@pytest.mark.fuzz
@settings(max_examples=budget(300), deadline=None)
@given(starts=st.lists(st.integers(-50, 50), max_size=60),
       windows=st.lists(st.tuples(st.integers(-60, 60), st.integers(0, 40)), max_size=12))
def test_rows_within_equals_filter(starts, windows):
    """The largest gaps' candidates by binary search (frames in start order) are the rows the plain filter keeps,
    in order."""
    from tracekit.analyses.gaps import _rows_within

    s = pl.Series("start", sorted(starts), dtype=pl.Int64)
    wins = [(lo, lo + w) for lo, w in windows]
    near = pl.any_horizontal(pl.col("start").is_between(lo, hi, closed="left") for lo, hi in wins) if wins else (
        pl.lit(False))
    want = s.to_frame().with_row_index("i").filter(near)["i"].to_list()
    assert _rows_within(s, wins).to_list() == want
    assert _rows_within(s.reverse(), wins) is None or s.n_unique() < 2  # (not in order: the caller filters)


# ---- issue 25, phase 3: whole steps piece by piece (benchmarks/results/HISTORY.md, "Issue 25, phase 3")

@pytest.mark.parametrize("path", STEP_TRACES, ids=[p.parent.name for p in STEP_TRACES])
@pytest.mark.slow
def test_pieces_of_whole_steps_equal_one_piece(path, monkeypatch):
    """The partition's unions, sums and gaps, the steady-state signatures and phase's step sums made on pieces of a
    few steps (threads on) give exactly what one piece of every step gives: the whole breakdown and its frames."""
    import tracekit.analyses.attribution as at
    import tracekit.analyses.partition as pa
    import tracekit.intervals as iv
    import tracekit.run.pipeline as bd

    t = tracekit.load(path, kernel_dims=False)
    monkeypatch.setattr(iv, "CHUNK_ROWS", 10**12)
    whole = bd.breakdown(t)
    seen: list[int] = []
    orig = iv.step_chunks

    def spy(step, rows=None):
        out = orig(step, rows)
        seen.append(len(out))
        return out

    monkeypatch.setattr(iv, "CHUNK_ROWS", 8)  # (a step or a few a piece)
    monkeypatch.setattr(iv, "step_chunks", spy)
    for m in (at, pa):
        monkeypatch.setattr(m, "THREADS_FROM_ROWS", 0)
    pieces = bd.breakdown(t)
    if whole.activities.height > 16 and whole.steps.count > 2:
        assert max(seen) > 1  # it did cut the steps into pieces
    assert pieces.to_dict() == whole.to_dict()
    assert_frame_equal(pieces.activities, whole.activities)
    assert_frame_equal(pieces.per_step, whole.per_step)


@pytest.mark.fuzz
@settings(max_examples=budget(300), deadline=None)
@given(kinds=st.lists(st.sampled_from(["kernel", "sync", "memcpy", "alloc", "graph"]), min_size=1, max_size=30),
       gaps=st.lists(st.integers(0, 3), min_size=30, max_size=30),
       keys=st.lists(st.integers(-5, 100), max_size=20), strategy=st.sampled_from(["backward", "forward"]),
       exact=st.booleans(), other_thread=st.booleans())
def test_work_rows_equal_asof_over_the_work_calls(kinds, gaps, keys, strategy, exact, other_thread):
    """``gaps.work_rows`` on a one-thread trace (a search among every call, then a step over the other calls) gives
    the as-of match of a filtered copy of the work calls, ties in start time included."""
    from tracekit.analyses.gaps import work_rows
    from tracekit.intervals import asof

    starts = pl.Series(gaps[:len(kinds)], dtype=pl.Int64).cum_sum()
    la = pl.DataFrame({"start": starts, "kind": kinds}).with_columns(pid=pl.lit(1, pl.Int64), tid=pl.lit(2, pl.Int64))
    tid = pl.when(pl.int_range(pl.len()) % 3 == 0).then(3).otherwise(2) if other_thread else pl.lit(2)
    left = pl.DataFrame({"t": pl.Series(keys, dtype=pl.Int64)}).with_columns(
        pid=pl.lit(1, pl.Int64), tid=tid.cast(pl.Int64))
    work = la.select("pid", "tid", ws="start").with_row_index("_row").filter(la["kind"].is_in(list(WORK_KINDS)))
    want = asof(left, work, "t", "ws", ["pid", "tid"], strategy=strategy, allow_exact_matches=exact)["_row"]
    got = work_rows(left, la, "t", strategy=strategy, allow_exact_matches=exact)
    assert got.to_list() == want.to_list()


@pytest.mark.fuzz
@settings(max_examples=budget(300), deadline=None)
@given(spans=st.lists(st.tuples(st.integers(0, 6), st.integers(-1, 8)), min_size=0, max_size=25),
       streams=st.lists(st.sampled_from([7, 8, None]), min_size=25, max_size=25), one=st.booleans())
def test_serialise_skips_only_what_it_would_leave(spans, streams, one):
    """``serialise`` returns the frame as it is only where the running-maximum formula moves nothing: any
    overlap, nesting or end before start on one stream, and several streams, take the full computation."""
    from tracekit.analyses.partition import _already_serial, serialise

    starts = pl.Series([s for s, _ in spans], dtype=pl.Int64).cum_sum()
    ends = starts + pl.Series([d for _, d in spans], dtype=pl.Int64)
    st_col = [7] * len(spans) if one else streams[:len(spans)]
    a = pl.DataFrame({"stream": pl.Series(st_col, dtype=pl.Int64), "start": starts, "end": ends})
    prev = pl.col("end").cum_max().shift(1)
    if a["stream"].n_unique() > 1:
        prev = prev.over("stream")
    want = a.with_columns(start=pl.max_horizontal("start", prev.fill_null(pl.col("start")))).with_columns(
        end=pl.max_horizontal("end", "start"))
    assert_frame_equal(serialise(a), want)
    if one and _already_serial(a):
        assert want.equals(a)  # the shortcut is taken only where the formula is the identity


def test_categorical_name_matches_equal_text_paths():
    """name_matches on a Categorical (Trace.kernels.name, Trace.ops.name: the candidates are every string of its
    categories, shared by the whole process) marks exactly the rows whose text matches: strings of the categories
    that no row holds, nulls and non-matching rows are False, as a plain regex over the text says."""
    import re

    from tracekit.analyses.phase import TRAINING_HOST, name_matches

    pl.Series(["aten::other", "autograd::engine::evaluate_function: Foo"], dtype=pl.Categorical)  # (in the pool)
    rows = ["aten::mm", "MmBackward0", None, "python/x.py(3): f", "AccumulateGrad", "aten::mm"]
    names = pl.Series("name", rows, dtype=pl.Categorical)
    for rx in ("^aten::", TRAINING_HOST):
        want = [r is not None and re.search(rx, r) is not None for r in rows]
        assert name_matches(names, rx).to_list() == want
        assert name_matches(names.cast(pl.String), rx).to_list() == want


@pytest.mark.parametrize("threads", [False, True])
def test_started_stage_gives_its_result_or_its_error(threads):
    """tracekit.parallel.started: the value of a stage run beside the caller, or its exception where it is waited for."""
    from tracekit.parallel import started

    assert started(lambda: sum(range(10)), threads=threads)() == 45

    def fails():
        raise ValueError("boom")

    wait = started(fails, threads=threads)
    with pytest.raises(ValueError, match="boom"):
        wait()


@pytest.mark.parametrize("share, want", [(None, 4), ("2", 4), ("1", 2), ("junk", 4)])
def test_in_threads_per_cpu_respects_a_workers_share(monkeypatch, share, want):
    """in_threads(per_cpu=2) on two CPUs runs four tasks at once, unless polars was given fewer threads than CPUs (a
    rank worker: POLARS_MAX_THREADS=1 beside a sibling), where it keeps to one thread per CPU; results in order."""
    import threading
    import time

    import tracekit.parallel as par

    monkeypatch.setattr(par, "usable_cpus", lambda: 2)
    if share is None:
        monkeypatch.delenv("POLARS_MAX_THREADS", raising=False)
    else:
        monkeypatch.setenv("POLARS_MAX_THREADS", share)
    lock, running, peak = threading.Lock(), [0], [0]

    def task(i):
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.2)  # (long enough that every worker holds a task at once, even on a loaded machine)
        with lock:
            running[0] -= 1
        return i

    assert par.in_threads(*[lambda i=i: task(i) for i in range(8)], per_cpu=2) == list(range(8))
    assert peak[0] == want


@pytest.mark.skipif(not hasattr(__import__("os"), "sched_setaffinity"), reason="no CPU affinity on this platform")
def test_usable_cpus_are_the_affinity_not_the_machine():
    """A process pinned to one CPU (taskset, a container's cpuset) is given one: its stages run one after the other,
    the rank engine starts one worker and a big Kineto trace is read by one process, where os.cpu_count() still says
    every CPU of the machine (issue 25, eighth pass). Checked in a fresh process pinned to one CPU."""
    code = ("import os; os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})\n"
            "import threading; from tracekit.parallel import in_threads, started, usable_cpus\n"
            "names = in_threads(*[lambda: threading.current_thread().name] * 3, per_cpu=2)\n"
            "from tracekit.readers.kineto.split import _cores_to_spare\n"
            "print(usable_cpus(), len(set(names)), started(lambda: threading.current_thread().name)() == names[0],"
            " _cores_to_spare())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    # (one CPU; every task on the caller's own thread; a big Kineto trace read by one process: the documented way
    # to keep its read to one process on a busy machine)
    assert out.stdout.split() == ["1", "1", "True", "False"]


@pytest.mark.fuzz
@settings(max_examples=budget(300), deadline=None)
@given(vals=st.lists(st.integers(-3, 15), max_size=40), rows=st.integers(1, 12))
def test_step_chunks_cut_at_the_first_step_start_after_each_target(vals, rows):
    """intervals.step_chunks by two binary searches per slice (issue 25, sixth pass) against the column of every
    step's first row it replaces: each slice ends at the first step start at or after ``rows`` rows."""
    from tracekit.intervals import step_chunks

    step = pl.Series(sorted(vals), dtype=pl.Int64)
    n = step.len()
    if n <= rows:
        want = [(0, n)] if n else []
    else:
        starts = (step != step.shift(1)).fill_null(True).arg_true()
        want, at = [], 0
        while at < n:
            nxt = int(starts.search_sorted(at + rows, side="left"))
            end = int(starts[nxt]) if nxt < starts.len() else n
            want.append((at, end - at))
            at = end
    assert step_chunks(step, rows) == want


@pytest.mark.fuzz
@settings(max_examples=budget(300), deadline=None)
@given(counts=st.lists(st.integers(0, 4), min_size=1, max_size=12), data=st.data())
def test_rows_of_steps_equals_membership_filter(counts, data):
    """The analysed steps' rows by two binary searches (steps in order, the wanted ones one run of the present ones)
    are the rows a membership test of every row keeps, for any choice of steps, runs or not."""
    from tracekit.analyses.partition import rows_of_steps

    df = pl.DataFrame({"step": [i for i, c in enumerate(counts) for _ in range(c)]}, schema={"step": pl.Int64}
                      ).with_row_index("r")
    present = df["step"].unique().sort()
    if present.len() == 0:
        return
    steps = pl.Series(sorted(data.draw(st.sets(st.sampled_from(present.to_list()), min_size=1))), dtype=pl.Int64)
    want = df.filter(pl.col("step").is_in(steps.implode()))
    assert rows_of_steps(df, steps, present).rows() == want.rows()
    shuffled = df.sample(fraction=1.0, shuffle=True, seed=1)  # (not in step order: the membership test)
    assert sorted(rows_of_steps(shuffled, steps, present).rows()) == sorted(want.rows())


@pytest.mark.parametrize("path", STEP_TRACES[:4], ids=[p.parent.name for p in STEP_TRACES[:4]])
def test_activities_drop_rows_ending_before_they_start(path):
    """Activities whose end is before their start (a reader other than nsys may keep them) are counted and dropped
    before the merge is planned: the same frame as the activities of the trace without them."""
    import dataclasses

    from tracekit.analyses.attribution import activities, pick_device

    t = tracekit.load(path, kernel_dims=False)
    dev = pick_device(t, None)
    k = t.kernels.with_row_index("_r")
    broken = k.with_columns(end=pl.when(pl.col("_r") % 7 == 3).then(pl.col("start") - 1).otherwise("end")).drop("_r")
    n = int((k["_r"] % 7 == 3).sum())
    if n == 0:
        pytest.skip("too few kernels to break")
    got, bad, _ = activities(dataclasses.replace(t, kernels=broken), dev)
    want, none, _ = activities(dataclasses.replace(t, kernels=k.filter(pl.col("_r") % 7 != 3).drop("_r")), dev)
    assert (bad, none) == (n, 0)
    assert_frame_equal(got, want)


def _launch_counts_by_hashing(a: pl.DataFrame) -> pl.DataFrame:
    """The per-step launch counts as the contract defines them: distinct correlation ids of the graph-replayed
    activities (graph launches) and of the rest (work launched one by one)."""
    return a.group_by("step").agg(
        n_graph_launches=pl.col("correlation").filter(pl.col("graphed")).n_unique(),
        n_launched=pl.col("correlation").filter(~pl.col("graphed").fill_null(False)).n_unique()).sort("step")


@pytest.mark.parametrize("path", STEP_TRACES, ids=[p.parent.name for p in STEP_TRACES])
@pytest.mark.slow
def test_launch_counts_equal_distinct_ids(path):
    """``_kernel_sums`` counts each activity as its own launch where none is graph-replayed and every launch is later
    than the one before (no hashing of ten million ids): the same counts as the distinct ids, on every real trace
    (eager ones take that path, graph-replaying ones the other)."""
    from tracekit.analyses.partition import _kernel_sums

    a = step_table(tracekit.load(path, kernel_dims=False)).activities
    got = _kernel_sums(a).select("step", "n_graph_launches", "n_launched").sort("step")
    assert_frame_equal(got, _launch_counts_by_hashing(a))


@pytest.mark.fuzz
@settings(max_examples=budget(200), deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.one_of(st.none(), st.integers(0, 6)), st.one_of(st.none(), st.booleans())),
                min_size=1, max_size=20), st.booleans())
def test_launch_counts_generated(rows, increasing):
    from tracekit.analyses.partition import _kernel_sums

    rows = sorted(rows, key=lambda r: r[0])
    corr = list(range(1, len(rows) + 1)) if increasing else [r[1] for r in rows]
    a = pl.DataFrame({"step": [r[0] for r in rows], "dur": [1] * len(rows), "category": ["gemm"] * len(rows),
                      "kind": ["kernel"] * len(rows), "graphed": [r[2] for r in rows], "correlation": corr,
                      "end": list(range(len(rows)))}, schema_overrides={"correlation": pl.Int64, "graphed": pl.Boolean})
    got = _kernel_sums(a).select("step", "n_graph_launches", "n_launched").sort("step")
    assert_frame_equal(got, _launch_counts_by_hashing(a))


@pytest.mark.fuzz
@settings(max_examples=budget(200), deadline=None)
@given(st.lists(st.one_of(st.none(), st.integers(0, 12)), max_size=30), st.lists(st.integers(0, 14), max_size=6),
       st.booleans())
def test_follows_equals_membership(launches, ends, in_order):
    """The gaps whose launch follows a host wait: by binary search where the gaps' launches are in order (one
    launching thread), else by membership; the same answer as membership either way (a null launch: no match)."""
    from tracekit.analyses.partition import _follows

    if in_order:
        launches = sorted(x for x in launches if x is not None)
    s = pl.Series("launch", launches, dtype=pl.UInt32)
    want = s.is_in(pl.Series(ends, dtype=pl.UInt32).implode()).fill_null(False).to_list()
    got = _follows(s, pl.DataFrame({"launch": pl.Series(ends, dtype=pl.Int64)})).fill_null(False).to_list()
    assert got == want


# ---- issue 49: inferred steps without full-frame joins (docs/performance.md, "Inferred steps at scale")

def _plain_main_thread(trace, device):
    """The launching thread as a semi-join of the work launches against the unique keys of the device's kernels."""
    work = trace.launches.filter(pl.col("kind").is_in(["kernel", "graph"]))
    if device is not None:
        on_dev = (trace.kernels.filter(pl.col("device") == device).select("pid", "correlation").unique())
        work = work.join(on_dev, on=["pid", "correlation"], how="semi")
    if work.height == 0:
        return None
    return work.group_by("pid", "tid").agg(n=pl.len()).sort(["n", "pid", "tid"], descending=[True, False, False]).row(0)[:2]


def _plain_sequence(trace, pid, tid):
    """The launch sequence as a chain of joins of every launch, each launch's token one struct hash of its own."""
    import tracekit.steps as S

    base = trace.launches.filter((pl.col("pid") == pid) & pl.col("kind").is_in(list(S._SEQ_KINDS))).select(
        "start", "end", "tid", "correlation", "kind", api=pl.col("name"))
    k = trace.kernels.filter(pl.col("pid") == pid).select(
        "correlation", "start", code=pl.col("name").to_physical().cast(pl.Int64))
    firsts = k.group_by("correlation").agg(first_k=pl.col("code").first())  # (kernels are in time order)
    graphs = k.join(base.filter(pl.col("kind") == "graph"), on="correlation", how="semi").group_by("correlation").agg(
        n_k=pl.len(), g_first=pl.col("code").sort_by("start").first(), last_k=pl.col("code").sort_by("start").last())
    m = trace.memops.filter(pl.col("pid") == pid).join(base.filter(pl.col("kind") == "memcpy"), on="correlation",
                                                      how="semi").group_by("correlation").agg(
        n_m=pl.len(), copy_kind=pl.col("copy_kind").first())
    seq = (base.join(firsts, on="correlation", how="left", maintain_order="left")
           .join(graphs, on="correlation", how="left", maintain_order="left")
           .join(m, on="correlation", how="left", maintain_order="left")
           .with_columns(first_k=pl.coalesce("g_first", "first_k"),
                         dtoh=((pl.col("kind") == "memcpy") & (pl.col("copy_kind") == "DtoH")).fill_null(False)))
    seq = seq.with_columns(read=((pl.col("kind") == "sync") & ~pl.col("api").is_in(list(S._NOT_READS))) | pl.col("dtoh"))
    own = seq.filter(pl.col("tid") == tid)
    if own["read"].sum() < 2:
        own = pl.concat([own.filter(~pl.col("read")), seq.filter(pl.col("read"))])
    own = own.filter((pl.col("tid") == tid) | pl.col("read")).sort("start", maintain_order=True)
    code = pl.col("kind").cast(pl.String).replace_strict(S._KIND_CODE, default=0, return_dtype=pl.Int8)
    token = pl.struct(kind=code,
                      a=pl.when(pl.col("kind") == "sync").then(pl.col("api").to_physical().cast(pl.Int64))
                      .otherwise(pl.col("first_k")),
                      b="last_k", n="n_k", m="n_m", c=pl.when(pl.col("kind") == "memcpy").then(pl.col("copy_kind"))).hash(7)
    return own.select("start", "end", "tid", "correlation", pl.col("kind").cast(pl.String), token=token, read="read",
                      dtoh="dtoh")


# unmarked eager and graph captures (graph launches, copies, reads), two GPUs, a serving engine's threads
ISSUE49 = ["spec-small-eager-nomark", "spec-small-graph-nomark", "moe-small-graph-nomark", "serve-small-graph-nomark"]


@pytest.mark.parametrize("path", [ROOT / "sample_traces" / n / "trace.sqlite.gz" for n in ISSUE49]
                         + [ROOT / "tests/data/nsys/nsysai_mfu_2gpu_before_2026.2.sqlite"],
                         ids=ISSUE49 + ["nsysai_mfu_2gpu"])
def test_launch_sequence_equals_plain_joins(path):
    import tracekit.steps as S

    t = tracekit.load(path, kernel_dims=False)
    devices = [None, *sorted(t.kernels["device"].unique().drop_nulls().to_list()), 99]
    first = S._first_kernels(t)
    for device in devices:
        main = S._main_thread(t, device)
        assert main == S._main_thread(t, device, first) == _plain_main_thread(t, device), device
    pid, tid = S._main_thread(t, None)
    seq = S.launch_sequence(t, pid, tid)
    assert seq.height > 20 and seq["read"].sum() >= 2
    assert_frame_equal(seq, _plain_sequence(t, pid, tid))
    assert_frame_equal(S.launch_sequence(t, pid, tid, first), seq)
