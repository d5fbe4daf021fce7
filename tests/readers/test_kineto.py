"""tracekit.readers.kineto.reader against real Kineto traces, with figures computed independently here.

The oracle (`_oracle`) reads each small test file with plain gzip + json and counts events
by category itself; it shares no code with the reader. The split read (tracekit.readers.kineto.split: a worker
process decodes the second half) follows in a section below.
"""

from __future__ import annotations

import gzip
import json
import re
import shutil
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

import pytest
from polars.testing import assert_frame_equal

from tracekit.errors import TracekitError
from tracekit.readers.kineto import columns as kineto_columns
from tracekit.readers.kineto import reader as kineto
from tracekit.readers.kineto import split as kineto_split
from tracekit.readers.kineto import stream as kineto_stream
from tracekit.readers.kineto.reader import read_kineto
from tracekit.trace import SCHEMAS

from conftest import shared, shared_dir

DATA = Path(__file__).parents[1] / "data" / "kineto"

WORK_PREFIXES = (
    "cudaLaunch", "cuLaunch", "hipLaunch", "hipExtLaunch", "hipModuleLaunch",
    "cudaGraphLaunch", "cuGraphLaunch", "hipGraphLaunch",
    "cudaMemcpy", "cuMemcpy", "hipMemcpy", "cudaMemset", "cuMemset", "hipMemset",
)


def _load_json(path: Path) -> dict:
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    return json.loads(raw)


def _oracle(path: Path) -> dict:
    ev = [e for e in _load_json(path)["traceEvents"] if e.get("ph") == "X"]
    cat = lambda e: str(e.get("cat", "")).lower()  # noqa: E731
    runtime = [e for e in ev if cat(e) in ("cuda_runtime", "runtime", "cuda_driver")]
    return {
        "kernels": sum(cat(e) == "kernel" for e in ev),
        "memops": sum(cat(e) in ("gpu_memcpy", "memcpy", "gpu_memset", "memset") for e in ev),
        "launches_all": len(runtime),
        "launches": sum(e["name"].startswith(WORK_PREFIXES) for e in runtime),
        "graph_launches": sum("GraphLaunch" in e["name"] for e in runtime),
        "ranges": sum(
            cat(e) == "user_annotation" or (e.get("cat") == "Operator" and e["name"].startswith("ProfilerStep#"))
            for e in ev
        ),
    }


def _counts(t) -> dict:
    work = t.launches.filter(t.launches["kind"].is_in(["kernel", "graph", "memcpy", "memset"]))
    return {
        "kernels": t.kernels.height,
        "memops": t.memops.height,
        "launches_all": t.launches.height,
        "launches": work.height,
        "graph_launches": t.launches.filter(t.launches["kind"] == "graph").height,
        "ranges": t.ranges.height,
    }


# file -> (figures also stated in ../shared/external_traces/PROVENANCE.md, expected meta)
CASES = {
    "hta_nccl_data.json.gz": ({"kernels": 2700, "memops": 1074, "ranges": 42}, {"rank": 0, "world_size": 2, "graph_trace_mode": "none"}),
    "kineto_legacy_resnet50_worker0.pt.trace.json.gz": ({"kernels": 9564, "memops": 451, "ranges": 6}, {"rank": None, "world_size": None}),
    "hta_rocm_mi250.json.gz": ({"kernels": 14, "memops": 2, "ranges": 3}, {"graph_trace_mode": "none"}),
    "tracelens_rocm_vllm_decode_graph.json.gz": ({"kernels": 425, "graph_launches": 1}, {"graph_trace_mode": "node", "rank": 0, "world_size": 1}),
    "hta_cpu_only_rank34.json.gz": ({"kernels": 0, "memops": 0, "launches": 0, "ranges": 11}, {"rank": 34, "world_size": 300}),
    "hta_triton_cuda_driver.json.gz": ({"kernels": 1, "launches": 1}, {}),
}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.slow
def test_counts_match_independent_read(name):
    path = DATA / name
    t = read_kineto(path)
    assert _counts(t) == _oracle(path)
    stated, meta = CASES[name]
    got = _counts(t)
    assert {k: got[k] for k in stated} == stated
    for k, v in meta.items():
        assert getattr(t.meta, k) == v, k
    assert t.meta.format == "kineto-json" and t.meta.producer == "kineto" and t.meta.schema_version == "1"


def test_graph_replayed_kernels_join_their_launch():
    # HTA negative_queue rank0 (MIT, 1.3 MB, read in place): 70 cudaGraphLaunch, 135 kernels share their correlation
    path = shared("HolisticTraceAnalysis/tests/data/negative_queue_length_values_check/rank0.json.gz")
    t = read_kineto(path)
    assert _counts(t) == _oracle(path)
    assert t.meta.graph_trace_mode == "node"
    assert (t.meta.rank, t.meta.world_size) == (0, 16)
    g = t.launches.filter(t.launches["kind"] == "graph").select("pid", "correlation")
    assert g.height == 70
    assert t.kernels.join(g, on=["pid", "correlation"]).height == 135
    assert not any("no kernels recorded" in w for w in t.meta.warnings)
    assert t.gpus["name"][0] == "NVIDIA A100-SXM4-80GB"


def test_rocm_graph_launch_and_gpu_side():
    t = read_kineto(DATA / "tracelens_rocm_vllm_decode_graph.json.gz")
    g = t.launches.filter(t.launches["kind"] == "graph")
    assert g["name"].to_list() == ["hipGraphLaunch"]
    assert t.kernels.join(g.select("pid", "correlation"), on=["pid", "correlation"]).height == 421
    assert t.meta.producer_version.startswith("roctracer 4.1")
    assert set(t.kernels["pid"].unique()) == {851}  # host pid from the launch, not the GPU's pid


def test_ns_conversion_on_a_known_event():
    t = read_kineto(DATA / "hta_nccl_data.json.gz")
    # {"cat": "kernel", "name": "void cudnn::bn_bw_1C11_kernel_new<...", "ts": 4458676983543.183, "dur": 41.407,
    #  "args": {"device": 0, "stream": 7, "correlation": 57541, "grid": [512, 1, 1], "block": [512, 1, 1]}}
    k = t.kernels.filter(t.kernels["correlation"] == 57541).row(0, named=True)
    assert (k["start"], k["end"]) == (4458676983543183, 4458676983543183 + 41407)
    assert (k["device"], k["stream"], k["pid"]) == (0, 7, 2910249)
    assert (k["grid"], k["block"]) == ("512,1,1", "512,1,1")
    assert k["name"].startswith("void cudnn::bn_bw_1C11_kernel_new")
    assert k["graph_id"] is None and k["graph_node"] is None
    gpu = t.gpus.filter(t.gpus["device"] == 0).row(0, named=True)
    assert gpu["name"] == "NVIDIA A100-PG509-200" and gpu["peak_bw_gbps"] is None and gpu["memory_bytes"] == 42297524224


def test_epoch_timestamps_keep_nanoseconds():
    # ts such as 1712195495505543.14 µs cannot be held by a float64 to the ns (ulp 0.25 µs):
    # the oracle reads the exact decimal text
    path = shared("HolisticTraceAnalysis/tests/data/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz")
    doc = json.loads(gzip.decompress(path.read_bytes()), parse_float=Decimal)
    raw = [e for e in doc["traceEvents"] if e.get("cat") == "cuda_runtime"][:200]
    want = {e["args"]["correlation"]: int((Decimal(e["ts"]) * 1000).to_integral_value(ROUND_HALF_UP)) for e in raw}
    t = read_kineto(path)
    got = dict(t.launches.filter(t.launches["correlation"].is_in(list(want))).select("correlation", "start").rows())
    assert got == want
    assert any(v % 1000 not in (0, 250, 500, 750) for v in want.values())  # the float path would fail here


@pytest.mark.parametrize("text, ns", [
    ("5366601892462.641", 5366601892462641), ("-12.345", -12345), ("0.000", 0), ("007.120", 7120),
    ("1712195495519695.800", 1712195495519695800),
    # not the usual form: the short way says nothing (null), the exact parse reads them
    ("12.34", None), ("1.2345", None), ("1e3", None), ("12", None), ("1.2.345", None), ("+1.234", None),
    ("9000000000000000.000", None),  # beyond the plausible range (ns would not fit int64 safely)
    ("99999999999999999.999", None),
])
def test_short_timestamp_parse_agrees_with_the_exact_one(text, ns):
    import polars as pl
    df = pl.DataFrame({"ts": [text]})
    fast = df.select(kineto_columns._us_to_ns_fast(pl.col("ts"))).item()
    exact = df.select(kineto_columns._us_to_ns(pl.col("ts"))).item()
    assert fast == ns
    if ns is not None:  # the oracle: decimal arithmetic on the text
        assert exact == ns == int(Decimal(text) * 1000)


def test_a_batch_with_other_timestamp_forms_is_read_exactly(tmp_path):
    # one unusual ts among usual ones: the whole batch takes the exact parse
    texts = ["100.125", "200.5", "300.250", "4e2", "500", "600.0004", "700.0005"]
    events = ",".join('{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, '
                      f'"ts": {t}, "dur": 1}}' for t in texts)
    p = tmp_path / "forms.json"
    p.write_text('{"traceEvents": [' + events + "]}")
    want = [int((Decimal(t) * 1000).to_integral_value(ROUND_HALF_UP)) for t in texts]
    assert read_kineto(p).ops["start"].to_list() == sorted(want)


def test_legacy_format():
    t = read_kineto(DATA / "kineto_legacy_resnet50_worker0.pt.trace.json.gz")
    assert t.kernels["stream"].unique().to_list() == [7]  # tid 'stream 7', args.stream 7
    assert t.ranges["name"].to_list() == [f"ProfilerStep#{i}" for i in range(5, 11)]
    assert t.ranges["tid"][0] == 1890023232  # string tid '1890023232'
    assert t.gpus.height == 1 and t.gpus["name"][0] is None  # no deviceProperties: one row per device seen
    assert t.memops.filter(t.memops["kind"] == "memcpy")["copy_kind"].unique().to_list() == ["HtoD"]  # "Memcpy HtoD (Pageable -> Device)"
    shaped = t.ops.filter(t.ops["name"].is_in(list(kineto_columns.MATMUL_OPS)))  # (the other CPU ops are host work, no shapes)
    assert shaped.height > 0 and shaped["input_dims"].null_count() == 0  # legacy 'Input dims'
    # legacy: ts are absolute epoch µs (Jan 2021)
    assert 1_600_000_000 * 10**9 < t.kernels["start"].min() < 1_700_000_000 * 10**9


def test_cpu_only_trace_loads_with_a_warning():
    t = read_kineto(DATA / "hta_cpu_only_rank34.json.gz")
    assert not t.has_gpu_activity and t.gpus.height == 0
    assert any("no GPU activity" in w for w in t.meta.warnings)


def test_ops_keep_matmul_shapes():
    t = read_kineto(DATA / "hta_rocm_mi250.json.gz")
    lin = t.ops.filter(t.ops["name"] == "aten::linear").row(0, named=True)
    assert json.loads(lin["input_dims"]) == [[5, 128], [128, 128], [128]]
    assert json.loads(lin["input_types"]) == ["float", "float", "float"]
    # shapes are read for matmul-like (and all-reduce) ops only; every other CPU op is host work without them
    shaped = t.ops.filter(t.ops["input_dims"].is_not_null())
    assert set(shaped["name"]) <= set(kineto.MATMUL_OPS) and "aten::linear" in set(shaped["name"])
    raw = [e for e in json.load(gzip.open(DATA / "hta_rocm_mi250.json.gz"))["traceEvents"]
           if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "python_function")]
    assert t.ops.height == len(raw)  # every CPU op and Python function of the trace, once


def test_ranges_depth():
    t = read_kineto(DATA / "hta_rocm_mi250.json.gz")
    assert t.ranges.select("name", "depth").rows() == [("ProfilerStep#1", 0), ("Optimizer.step#SGD.step", 1), ("ProfilerStep#2", 0)]


@pytest.mark.slow
def test_chunked_decode_equals_whole(monkeypatch):
    path = DATA / "hta_nccl_data.json.gz"
    whole = read_kineto(path)
    monkeypatch.setattr(kineto_stream, "_CHUNK", 50_000)
    monkeypatch.setattr(kineto_stream, "_BLOCK", 70_000)
    small = read_kineto(path)
    for name in ("kernels", "memops", "launches", "ranges", "ops", "gpus"):
        assert getattr(small, name).equals(getattr(whole, name)), name
    assert small.meta == whole.meta


@pytest.mark.parametrize("compact", [False, True])
@pytest.mark.slow
def test_tiny_pieces_equal_whole(tmp_path, monkeypatch, compact):
    # An uncompressed file cut into tiny pieces, with '},{' inside names (a cut there must be
    # rejected) and, compact, no space between events; typed in tiny batches.
    doc = _load_json(DATA / "hta_nccl_data.json.gz")
    for e in doc["traceEvents"][::7]:
        if isinstance(e.get("name"), str):
            e["name"] += ' },{ "x": "}, {" '
    p = tmp_path / "t.json"
    p.write_text(json.dumps(doc, separators=(",", ":")) if compact else json.dumps(doc, indent=2))
    whole = read_kineto(p)
    monkeypatch.setattr(kineto_stream, "_CHUNK", 3_000)
    monkeypatch.setattr(kineto_columns, "_BATCH", 50)
    small = read_kineto(p)
    for name in ("kernels", "memops", "launches", "ranges", "ops", "gpus", "collectives"):
        assert getattr(small, name).equals(getattr(whole, name)), name
    assert small.meta == whole.meta
    assert whole.kernels.height == _oracle(p)["kernels"]


# --- hand-made fixtures (labelled: not real captures) ----------------------------------


def _write(tmp_path: Path, doc, name="t.json") -> Path:
    p = tmp_path / name
    p.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return p


def _ev(cat, name, ts, dur, pid=100, tid=100, **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


def test_under_recorded_graph_launches_warn(tmp_path):
    # HAND-MADE: 3 cudaGraphLaunch calls; the activity buffer kept kernels of only the first
    events = [
        _ev("cuda_runtime", "cudaGraphLaunch_v10000", 10.0, 5.0, correlation=1),
        _ev("cuda_runtime", "cudaGraphLaunch_v10000", 20.0, 5.0, correlation=2),
        _ev("cuda_runtime", "cudaGraphLaunch_v10000", 30.0, 5.0, correlation=3),
        _ev("cuda_runtime", "cudaStreamSynchronize", 40.0, 5.0, correlation=4),
        _ev("kernel", "k0", 12.0, 1.0, pid=0, tid=7, device=0, stream=7, correlation=1),
        _ev("kernel", "k1", 13.5, 1.0, pid=0, tid=7, device=0, stream=7, correlation=1),
    ]
    t = read_kineto(_write(tmp_path, {"schemaVersion": 1, "traceEvents": events}))
    assert t.meta.graph_trace_mode == "node"
    assert t.launches["name"].to_list()[:3] == ["cudaGraphLaunch"] * 3
    assert t.launches["kind"].to_list() == ["graph", "graph", "graph", "sync"]
    assert (
        "2 of 3 cudaGraphLaunch calls have no kernels recorded: the profiler's activity buffer likely overflowed; "
        "graph work is missing"
    ) in t.meta.warnings
    assert t.kernels["pid"].to_list() == [100, 100]


def test_new_and_old_spellings_float_ts_and_string_tids(tmp_path):
    # HAND-MADE: mixes capitalised legacy categories with new ones; flows are ignored
    events = [
        _ev("Runtime", "cudaLaunchKernel", "5.0005", 1, pid=9, tid="1234", correlation=7),
        {"ph": "s", "cat": "async", "id": 7, "pid": 9, "tid": 1234, "ts": 5.0005},
        _ev("Kernel", "k", 6.25, 0.5, pid=0, tid="stream 3", correlation=7),
        _ev("gpu_memcpy", "Memcpy DtoH (Device -> Pinned)", 8, 1, pid=0, tid=3, device=0, stream=3, correlation=8, bytes=64),
        _ev("Memset", "Memset (Device)", 9, 1, pid=0, tid=3, device=0, stream=3, correlation=9, bytes=32),
        _ev("gpu_user_annotation", "step", 5, 5, pid=0, tid=3),
        _ev("user_annotation", "step", 4, 6, pid=9, tid=1234),
    ]
    t = read_kineto(_write(tmp_path, {"traceEvents": events, "displayTimeUnit": "ns"}))
    assert t.launches.row(0, named=True) | {} == {
        "start": 5001, "end": 6001, "pid": 9, "tid": 1234, "correlation": 7, "kind": "kernel", "name": "cudaLaunchKernel"
    }
    k = t.kernels.row(0, named=True)
    assert (k["start"], k["end"], k["device"], k["stream"], k["pid"]) == (6250, 6750, 0, 3, 9)
    assert t.memops.select("kind", "copy_kind", "bytes", "pid").rows() == [("memcpy", "DtoH", 64, 9), ("memset", None, 32, 9)]
    assert t.ranges.height == 1 and t.ranges["pid"][0] == 9
    assert t.meta.graph_trace_mode == "none"


def test_bad_durations_are_dropped_and_counted(tmp_path):
    # HAND-MADE, written as Python's json writes NaN (not valid JSON)
    text = json.dumps({"traceEvents": [
        _ev("kernel", "ok", 1, 1, device=0, correlation=1),
        _ev("kernel", "nan", 2, float("nan"), device=0, correlation=2),
        _ev("kernel", "neg", 3, -4, device=0, correlation=3),
        _ev("kernel", "huge", 4, 1e300, device=0, correlation=4),
        {"ph": "X", "cat": "kernel", "name": "nodur", "pid": 0, "tid": 7, "ts": 5, "args": {}},
    ]})
    t = read_kineto(_write(tmp_path, text))
    assert t.kernels["name"].to_list() == ["ok"]
    assert any("dropped 4 events" in w for w in t.meta.warnings)
    assert any("NaN" in w for w in t.meta.warnings)


@pytest.mark.parametrize(
    "content, needle",
    [
        ('{"traceEvents": [{"ph": "X", "cat": "kernel", "ts": 1', "truncated"),
        ("[1, 2, 3]", "JSON array"),
        ('{"schemaVersion": 1}', "traceEvents"),
        ('{"traceEvents": {"a": 1}}', "unexpected JSON structure"),
        ('{"traceEvents": [{"ph": "X", "cat": 5}]}', "unexpected JSON structure"),
        ('{"traceEvents": [{"ph": "X" "cat": "kernel"}]}', "not valid JSON"),
        ("", "truncated"),
        ("hello", "not a JSON object"),
    ],
)
def test_bad_input_is_one_line_error(tmp_path, content, needle):
    p = _write(tmp_path, content)
    with pytest.raises(TracekitError) as e:
        read_kineto(p)
    msg = str(e.value)
    assert needle in msg and "\n" not in msg and str(p) in msg


def test_truncated_gzip_is_one_line_error(tmp_path):
    whole = (DATA / "hta_rocm_mi250.json.gz").read_bytes()
    p = tmp_path / "cut.json.gz"
    p.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(TracekitError, match="gzip stream ends early"):
        read_kineto(p)
    p.write_bytes(whole[:10] + b"\x00" * 50 + whole[60:])
    with pytest.raises(TracekitError, match="gzip"):
        read_kineto(p)


@pytest.mark.parametrize(
    "rel",
    [
        "lora_perf_lora_profile/runs/Qwen3-30B-A3B-Instruct-2507-BF16-expert_shared-20260609-133913/current_base_lora/profile/base/bs16-TP-0.trace.json.gz",
        "profile-data/train.json",
    ],
)
@pytest.mark.slow
def test_non_redistributable_traces_in_place(rel):
    path = shared(rel)
    t = read_kineto(path)
    assert _counts(t) == _oracle(path)
    assert not any("no kernels recorded" in w for w in t.meta.warnings)

# ───────────────────────── the split read (readers/kineto/split.py) (formerly test_kineto_split.py)
# The two-process Kineto read (``tracekit.readers.kineto.split``, ``.worker``) gives exactly the one-process read's Trace.
#
# Every test forces the split on small files (``SPLIT_MIN_BYTES`` 0) and checks that the worker's batches were
# really taken (``Frames.take`` called with at least one batch), or, for the fallbacks, that they were not: a test
# whose two reads could silently both be one-process reads would prove nothing. The reference is the one-process
# read of the same file (the same reader with the split off), compared frame by frame: values, nulls, row order,
# dtypes (Categorical columns as their strings: their codes depend on the order names are met), and the meta.

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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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
