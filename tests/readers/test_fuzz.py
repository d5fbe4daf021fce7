"""Fuzzing: corrupted copies of real traces never crash, hang or print a traceback.

Every case is built in a temporary directory from a COPY of a real trace in tests/data
(nsys: pipit saxpy 2022.2, slimmed to the tables tracekit reads, and the nsys-ai mock
2026.1; Kineto: HTA ROCm MI250, HTA triton driver-API, TraceLens vLLM graph decode) and
run through the real CLI in-process. Each must exit 2 with one ``tracekit: error:`` line,
or exit 0 (with a breakdown whose numbers are still sane: finite, non-negative and
partitioning the step). Hypothesis runs derandomized, so CI sees the same cases every run.
"""

from __future__ import annotations

import gzip
import json
import random
import resource
import shutil
import sqlite3
import zlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _robust import assert_clean, run_cli
from conftest import DATA, budget

SETTINGS = dict(deadline=None, derandomize=True, database=None, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])

NSYS_SRC = DATA / "nsys" / "pipit_saxpy_2022.2.sqlite"
NSYS_MOCK = DATA / "nsys" / "nsysai_mock_2026.1.sqlite"
KINETO_SRCS = [DATA / "kineto" / n for n in ("hta_rocm_mi250.json.gz", "hta_triton_cuda_driver.json.gz",
                                            "tracelens_rocm_vllm_decode_graph.json.gz")]
# Tables tracekit reads; the slim copy keeps only these (smaller file, every truncation offset matters).
KEEP = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_MEMCPY",
        "CUPTI_ACTIVITY_KIND_MEMSET", "NVTX_EVENTS", "StringIds", "TARGET_INFO_GPU", "EXPORT_META_DATA",
        "TARGET_INFO_CUDA_DEVICE")

# A step range that exists in the saxpy trace, so breakdown reaches the partition code.
COMMANDS = [
    ["info", "--format", "json"],
    ["kernels", "--format", "json"],
    ["breakdown", "--format", "json", "--step-range", "^saxpy$"],
    ["breakdown", "--format", "json"],
    ["breakdown", "--format", "md", "--step-range", "saxpy"],
    ["kernels", "--format", "csv"],
]


def _check(cmd, path):
    args = [*cmd, path]
    assert_clean(run_cli(args), args)


# ───────────────────────────── nsys ─────────────────────────────

@pytest.fixture(scope="module")
def slim_nsys(tmp_path_factory) -> Path:
    """A copy of the saxpy export with only the tables tracekit reads, vacuumed (~100 KB)."""
    d = tmp_path_factory.mktemp("nsys_base")
    p = d / "saxpy.sqlite"
    shutil.copyfile(NSYS_SRC, p)
    con = sqlite3.connect(p)
    tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")]
    for t in tables:
        if t not in KEEP:
            con.execute(f'DROP TABLE "{t}"')
    con.commit()
    con.execute("VACUUM")
    con.close()
    res = run_cli(["breakdown", "--format", "json", "--step-range", "^saxpy$", p])
    assert res.exit_code == 0, res.stderr  # the base case works, so mutations are what is tested
    return p


_COUNTER = iter(range(10**9))


def _fresh(base: Path, suffix=".sqlite") -> Path:
    d = base.parent / f"case{next(_COUNTER)}"
    d.mkdir()
    p = d / f"trace{suffix}"
    shutil.copyfile(base, p)
    return p


NSYS_COLUMNS = {
    "CUPTI_ACTIVITY_KIND_KERNEL": ["start", "end", "deviceId", "streamId", "correlationId", "globalPid",
                                   "demangledName", "shortName", "graphNodeId", "gridX", "blockX"],
    "CUPTI_ACTIVITY_KIND_RUNTIME": ["start", "end", "globalTid", "correlationId", "nameId", "eventClass"],
    "CUPTI_ACTIVITY_KIND_MEMCPY": ["start", "end", "deviceId", "streamId", "correlationId", "bytes", "copyKind"],
    "NVTX_EVENTS": ["start", "end", "eventType", "text", "globalTid", "textId", "domainId"],
    "StringIds": ["id", "value"],
    "TARGET_INFO_GPU": ["id", "name", "memoryBandwidth", "smCount", "cuDevice", "totalMemory"],
    "EXPORT_META_DATA": ["name", "value"],
}
TABLES = list(NSYS_COLUMNS)

bad_values = st.sampled_from([
    "NULL", "'abc'", "''", "-1", "-1000000000000", "9223372036854775807", "-9223372036854775808",
    "4611686018427387904", "1.5", "-0.0", "1e308", "x'00ff'", "'12'", "0",
])


@st.composite
def sql_mutation(draw) -> str:
    kind = draw(st.sampled_from(["drop", "rename_table", "drop_col", "rename_col", "set", "end_before_start",
                                 "dup_corr", "nvtx_open", "nvtx_cross", "nvtx_shift", "neg_dur", "huge_dur",
                                 "delete_rows", "dup_rows"]))
    t = draw(st.sampled_from(TABLES))
    c = draw(st.sampled_from(NSYS_COLUMNS[t]))
    k = draw(st.integers(1, 4))
    sel = f"rowid % {k + 1} = {draw(st.integers(0, k))}"
    if kind == "drop":
        return f'DROP TABLE "{t}"'
    if kind == "rename_table":
        return f'ALTER TABLE "{t}" RENAME TO "{t}_old"'
    if kind == "drop_col":
        return f'ALTER TABLE "{t}" DROP COLUMN "{c}"'
    if kind == "rename_col":
        return f'ALTER TABLE "{t}" RENAME COLUMN "{c}" TO "{c}_x"'
    if kind == "set":
        return f'UPDATE "{t}" SET "{c}" = {draw(bad_values)} WHERE {sel}'
    if kind == "delete_rows":
        return f'DELETE FROM "{t}" WHERE {sel}'
    if kind == "dup_rows":
        return f'INSERT INTO "{t}" SELECT * FROM "{t}" WHERE {sel}'
    act = draw(st.sampled_from(["CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME",
                                "CUPTI_ACTIVITY_KIND_MEMCPY", "NVTX_EVENTS"]))
    if kind == "end_before_start":
        return f'UPDATE "{act}" SET "end" = "start" - {draw(st.integers(1, 10**12))} WHERE {sel}'
    if kind == "neg_dur":
        return f'UPDATE "{act}" SET "start" = "end" + {draw(st.integers(1, 10**6))} WHERE {sel}'
    if kind == "huge_dur":
        return f'UPDATE "{act}" SET "end" = "start" + {draw(st.sampled_from([10**15, 2**62, 2**63 - 1 - 2**61]))} WHERE {sel}'
    if kind == "dup_corr":
        t2 = draw(st.sampled_from(["CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME",
                                   "CUPTI_ACTIVITY_KIND_MEMCPY"]))
        return f'UPDATE "{t2}" SET "correlationId" = "correlationId" % {k + 1}'
    if kind == "nvtx_open":  # unbalanced: ranges that never end
        return f'UPDATE NVTX_EVENTS SET "end" = NULL WHERE {sel}'
    if kind == "nvtx_cross":  # crossing ranges: every range ends after the next one starts
        return (f'UPDATE NVTX_EVENTS SET "end" = "end" + {draw(st.integers(1, 10**9))} WHERE {sel}')
    # nvtx_shift: ranges moved, so they no longer enclose their launches
    return f'UPDATE NVTX_EVENTS SET "start" = "start" + {draw(st.integers(-10**9, 10**9))} WHERE {sel}'


def _apply(path: Path, stmts: list[str]) -> int:
    con = sqlite3.connect(path)
    applied = 0
    for s in stmts:
        try:
            con.execute(s)
            applied += 1
        except sqlite3.Error:
            pass  # e.g. the column was already renamed by an earlier mutation
    con.commit()
    con.close()
    return applied


@pytest.mark.fuzz
@settings(max_examples=budget(380), **SETTINGS)
@given(stmts=st.lists(sql_mutation(), min_size=1, max_size=4), cmd=st.sampled_from(COMMANDS))
def test_nsys_schema_and_value_corruption(slim_nsys, stmts, cmd):
    p = _fresh(slim_nsys)
    _apply(p, stmts)
    _check(cmd, p)


@pytest.mark.fuzz
@settings(max_examples=budget(200), **SETTINGS)
@given(frac=st.floats(0.0, 1.0), cmd=st.sampled_from(COMMANDS), src=st.sampled_from(["slim", "mock"]))
def test_nsys_truncated(slim_nsys, frac, cmd, src):
    base = slim_nsys if src == "slim" else NSYS_MOCK
    data = base.read_bytes()
    p = _fresh(slim_nsys)
    p.write_bytes(data[: int(frac * len(data))])
    _check(cmd, p)


@pytest.mark.fuzz
@settings(max_examples=budget(120), **SETTINGS)
@given(hits=st.lists(st.tuples(st.floats(0.0, 1.0), st.binary(min_size=1, max_size=64)), min_size=1, max_size=8),
       cmd=st.sampled_from(COMMANDS))
def test_nsys_overwritten_bytes(slim_nsys, hits, cmd):
    data = bytearray(slim_nsys.read_bytes())
    for frac, junk in hits:
        off = int(frac * (len(data) - 1))
        data[off:off + len(junk)] = junk
    p = _fresh(slim_nsys)
    p.write_bytes(bytes(data[: len(slim_nsys.read_bytes())]))
    _check(cmd, p)


def test_nsys_plain_corruptions(slim_nsys):
    """Hand-written cases hypothesis might not reach: every table gone, empty file, text in start/end."""
    cases = {
        "empty": b"",
        "header only": b"SQLite format 3\x00",
        "not sqlite": b"\x00" * 4096,
    }
    for data in cases.values():
        p = _fresh(slim_nsys)
        p.write_bytes(data)
        for cmd in COMMANDS:
            _check(cmd, p)
    for stmts in (
        [f'DROP TABLE "{t}"' for t in KEEP],
        ['UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = \'soon\', "end" = \'later\''],
        ['UPDATE CUPTI_ACTIVITY_KIND_RUNTIME SET start = \'soon\''],
        ['UPDATE NVTX_EVENTS SET start = \'x\', "end" = NULL'],
        ["UPDATE StringIds SET value = x'ff00fe'"],
        ["UPDATE StringIds SET value = 12"],
        ['UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET "end" = start - 5'],
        ["UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET correlationId = 1", "UPDATE CUPTI_ACTIVITY_KIND_RUNTIME SET correlationId = 1"],
        ["DELETE FROM CUPTI_ACTIVITY_KIND_KERNEL", "DELETE FROM CUPTI_ACTIVITY_KIND_MEMCPY"],
        ["CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL_V3 (x)"],
        ["ALTER TABLE CUPTI_ACTIVITY_KIND_KERNEL RENAME TO CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL"],
    ):
        p = _fresh(slim_nsys)
        _apply(p, stmts)
        for cmd in COMMANDS:
            _check(cmd, p)


# ───────────────────────────── Kineto ─────────────────────────────

@pytest.fixture(scope="module")
def kineto_docs(tmp_path_factory):
    d = tmp_path_factory.mktemp("kineto_base")
    docs = []
    for src in KINETO_SRCS:
        cp = d / src.name
        shutil.copyfile(src, cp)
        docs.append(json.loads(gzip.decompress(cp.read_bytes())))
    return d, docs


def _kineto_case(base: Path, name: str) -> Path:
    d = base / f"case{next(_COUNTER)}"
    d.mkdir()
    return d / name


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12) | st.sampled_from(["", "7", "1e400", "-5", "stream 7", "NaN"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)
EVENT_FIELDS = ["ph", "cat", "name", "pid", "tid", "ts", "dur", "args", "args.correlation", "args.device",
                "args.stream", "args.graph id", "args.bytes", "args.grid", "args.Input Dims"]
TOP_FIELDS = ["traceEvents", "deviceProperties", "distributedInfo", "schemaVersion", "cupti_version",
              "displayTimeUnit", "baseTimeNanoseconds"]
K_COMMANDS = [
    ["info", "--format", "json"],
    ["kernels", "--format", "json"],
    ["breakdown", "--format", "json"],
    ["breakdown", "--format", "csv"],
    ["kernels", "--format", "md"],
]


@st.composite
def kineto_mutation(draw, n_events: int):
    kind = draw(st.sampled_from(["event_field", "event_field", "event_field", "delete_field", "top_field",
                                 "dup_corr", "drop_cat", "shuffle", "nan_times"]))
    if kind in ("event_field", "delete_field"):
        idx = draw(st.lists(st.integers(0, max(0, n_events - 1)), min_size=1, max_size=5))
        return (kind, idx, draw(st.sampled_from(EVENT_FIELDS)), draw(json_values))
    if kind == "top_field":
        return (kind, None, draw(st.sampled_from(TOP_FIELDS)), draw(json_values))
    if kind == "dup_corr":
        return (kind, None, None, draw(st.integers(1, 5)))
    if kind == "drop_cat":
        return (kind, None, draw(st.sampled_from(["kernel", "cuda_runtime", "user_annotation", "gpu_memcpy",
                                                  "cuda_driver", "cpu_op"])), None)
    return (kind, None, None, draw(st.integers(0, 2**32)))


def _mutate(doc: dict, m) -> dict:
    kind, idx, fld, val = m
    evs = doc.get("traceEvents") if isinstance(doc.get("traceEvents"), list) else []
    if kind in ("event_field", "delete_field"):
        for i in idx:
            if not evs:
                break
            e = evs[i % len(evs)]
            if not isinstance(e, dict):
                continue
            if fld.startswith("args."):
                args = e.get("args")
                if not isinstance(args, dict):
                    args = e["args"] = {}
                target, key = args, fld[5:]
            else:
                target, key = e, fld
            if kind == "delete_field":
                target.pop(key, None)
            else:
                target[key] = val
    elif kind == "top_field":
        doc[fld] = val
    elif kind == "dup_corr":
        for e in evs:
            if isinstance(e, dict) and isinstance(e.get("args"), dict) and isinstance(e["args"].get("correlation"), int):
                e["args"]["correlation"] %= val
    elif kind == "drop_cat":
        doc["traceEvents"] = [e for e in evs if not (isinstance(e, dict) and e.get("cat") == fld)]
    elif kind == "shuffle":
        random.Random(val).shuffle(evs)
    elif kind == "nan_times":
        rnd = random.Random(val)
        for e in evs:
            if isinstance(e, dict) and rnd.random() < 0.2:
                e[rnd.choice(["ts", "dur"])] = rnd.choice([float("nan"), float("inf"), -1.0, 1e300])
    return doc


@pytest.mark.fuzz
@settings(max_examples=budget(250), **SETTINGS)
@given(data=st.data(), which=st.integers(0, len(KINETO_SRCS) - 1), cmd=st.sampled_from(K_COMMANDS),
       gz=st.booleans())
def test_kineto_wrong_types_and_missing_fields(kineto_docs, data, which, cmd, gz):
    base, docs = kineto_docs
    doc = json.loads(json.dumps(docs[which]))
    n = len(doc["traceEvents"])
    for m in data.draw(st.lists(kineto_mutation(n), min_size=1, max_size=3)):
        doc = _mutate(doc, m)
    text = json.dumps(doc, allow_nan=True).encode()  # Python's json writes NaN/Infinity literals
    p = _kineto_case(base, "trace.json.gz" if gz else "trace.json")
    p.write_bytes(gzip.compress(text, 1) if gz else text)
    _check(cmd, p)


@pytest.mark.fuzz
@settings(max_examples=budget(150), **SETTINGS)
@given(which=st.integers(0, len(KINETO_SRCS) - 1), frac=st.floats(0.0, 1.0), cmd=st.sampled_from(K_COMMANDS),
       mode=st.sampled_from(["text", "gz_of_truncated", "truncated_gz"]))
def test_kineto_truncated(kineto_docs, which, frac, cmd, mode):
    base, _ = kineto_docs
    raw = KINETO_SRCS[which].read_bytes()
    text = gzip.decompress(raw)
    if mode == "text":
        p, data = _kineto_case(base, "trace.json"), text[: int(frac * len(text))]
    elif mode == "gz_of_truncated":
        p, data = _kineto_case(base, "trace.json.gz"), gzip.compress(text[: int(frac * len(text))], 1)
    else:
        p, data = _kineto_case(base, "trace.json.gz"), raw[: int(frac * len(raw))]
    p.write_bytes(data)
    _check(cmd, p)


@pytest.mark.fuzz
@settings(max_examples=budget(120), **SETTINGS)
@given(which=st.integers(0, len(KINETO_SRCS) - 1),
       hits=st.lists(st.tuples(st.floats(0.0, 1.0), st.binary(min_size=1, max_size=16)), min_size=1, max_size=4),
       cmd=st.sampled_from(K_COMMANDS), plain=st.booleans())
def test_kineto_corrupted_bytes(kineto_docs, which, hits, cmd, plain):
    """Overwritten bytes in the gzip stream (CRC, deflate blocks) or in the plain JSON text."""
    base, _ = kineto_docs
    raw = KINETO_SRCS[which].read_bytes()
    data = bytearray(gzip.decompress(raw) if plain else raw)
    for frac, junk in hits:
        off = int(frac * (len(data) - 1))
        data[off:off + len(junk)] = junk
    p = _kineto_case(base, "trace.json" if plain else "trace.json.gz")
    p.write_bytes(bytes(data))
    _check(cmd, p)


def test_kineto_plain_corruptions(kineto_docs):
    base, docs = kineto_docs
    src = json.dumps(docs[0]).encode()
    cases = {
        "empty.json": b"",
        "ws.json": b"   \n",
        "array.json": b"[]",
        "null.json": b"null",
        "number.json": b"{\"traceEvents\": 5}",
        "events_dict.json": b"{\"traceEvents\": {}}",
        "events_of_ints.json": b"{\"traceEvents\": [1, 2, 3]}",
        "empty_events.json": b"{\"traceEvents\": []}",
        "nan.json": src.replace(b'"dur": ', b'"dur": NaN, "x": ', 50),
        "infinity.json": src.replace(b'"ts": ', b'"ts": -Infinity, "y": ', 50),
        "garbage_tail.json": src + b"\x00garbage",
        "gz_header_only.json.gz": b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03",
        "gz_empty_payload.json.gz": gzip.compress(b""),
        "gz_bad_crc.json.gz": (lambda g: g[:-8] + bytes(8))(gzip.compress(src)),
        "double_gz.json.gz": gzip.compress(gzip.compress(src)),
        "zlib_not_gzip.json": zlib.compress(src),
        "utf16.json": json.dumps(docs[0]).encode("utf-16"),
        "deep.json": b"{\"traceEvents\": [" + b"[" * 100000 + b"]" * 100000 + b"]}",
    }
    for name, data in cases.items():
        p = _kineto_case(base, name)
        p.write_bytes(data)
        for cmd in K_COMMANDS:
            _check(cmd, p)


def test_fuzz_memory_bounded():
    """After all the fuzzing above (same process), the peak RSS stayed far from 'unbounded'."""
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
    assert peak_mb < 3000, f"peak RSS {peak_mb:.0f} MB"
