"""Reader for PyTorch profiler / Kineto Chrome-trace JSON (``.json`` and ``.json.gz``).

This module owns every Kineto quirk; what leaves it is a :class:`tracekit.trace.Trace`.

How it reads (and why):

* No ``json.load``: the file is streamed (read, or gunzipped, 1 MB at a time in a second
  thread: I/O and zlib release the GIL) and the ``traceEvents`` array is cut between two
  events into ~1 MB pieces, each decoded by ``msgspec`` into small typed Structs that name
  only the fields we use (msgspec skips everything else, e.g. ``Concrete Inputs``, without
  building Python objects for it). A piece is decoded from a memoryview of its buffer, with
  the byte after its last event overwritten by ``]``: it is copied once, when its blocks
  are joined. Memory is bounded by the piece size plus the normalized frames, not by the
  file (docs/kineto-reader.md has the numbers).
* Events are grouped by category with C-level maps over the Structs (``map``,
  ``compress``, dict lookups), never a Python loop per event; of the ``cpu_op`` events only
  matmul-like ones are kept. A group's fields become polars columns piece by piece and are
  typed in batches of ``_BATCH`` rows, one polars query each (a query costs about the same
  for 10 rows as for 10 000).
* Exact timestamps: scalars whose JSON type varies between producers (``ts``, ``dur``,
  ``pid``, ``args.stream`` ...) are decoded untyped, with ``float_hook`` keeping a float as
  its JSON text. A column of ints becomes Int64 as is; any other column is text, parsed by
  polars. ``ts`` is float microseconds, and a float64 cannot hold an epoch-µs value to the
  nanosecond (1.7e15 µs has a 0.25 µs ulp), so its integer and fraction digits are parsed
  apart and rounded to int64 ns (Perfetto's ``CoerceToTs`` does the same for string
  timestamps). Array fields (``grid``, ``Input Dims``) and rare strings are kept as
  ``msgspec.Raw`` (the exact JSON text), turned into str by a C-level ``map``.
* Names: a decode loop repeats a few dozen kernel names of hundreds of bytes each; every
  distinct name is stored once and the rows are views of it (runtime API names get their
  version suffix stripped and their ``kind`` once per distinct name).
* Categories old and new: ``kernel``/``Kernel``, ``cuda_runtime``/``Runtime``,
  ``cuda_driver``, ``gpu_memcpy``/``Memcpy``, ``gpu_memset``/``Memset``,
  ``user_annotation``, ``cpu_op``/``Operator`` (matched case-insensitively). Flow events
  (``ac2g``, ``async_cpu_to_gpu``, ``async``) are not needed: GPU activity and its launch
  share ``args.correlation``, and graph-replayed kernels carry their graph launch's.
  ``gpu_user_annotation`` mirrors are not ranges. ``displayTimeUnit`` is a display hint
  only; ``ts``/``dur`` are µs in every variant (legacy PyTorch 1.8 traces use absolute
  epoch µs, which needs no special case).
* Legacy (PyTorch 1.8) traces: string tids such as ``'stream 7'`` or ``'1890023232'``
  (the trailing integer is taken), ``Operator`` for both ops and annotations (only
  ``ProfilerStep#N`` can be told apart, so only those become ranges), ``Input dims``.
"""

from __future__ import annotations

import queue
import re
import threading
import zlib
from collections.abc import Iterator
from functools import cache
from itertools import compress, count, repeat
from operator import attrgetter, eq
from pathlib import Path
from typing import Any

import msgspec
import polars as pl
from msgspec import Raw, Struct, field

from tracekit.errors import TracekitError
from tracekit.readers.common import api_kind, nesting_depth, strip_api_version
from tracekit.trace import COLLECTIVES, COMM_OPS, GPUS, GRAPH_EXECS, KERNELS, LAUNCHES, MEMOPS, OPS, RANGES, Trace, TraceMeta, conform, empty

__all__ = ["read_kineto", "MATMUL_OPS", "COMM_OPS"]

# Framework ops whose input shapes tell the weight bytes a step reads (kept in Trace.ops).
MATMUL_OPS = (
    "aten::linear",
    "aten::matmul",
    "aten::mm",
    "aten::addmm",
    "aten::_addmm_activation",
    "aten::bmm",
    "aten::baddbmm",
    "aten::addbmm",
    "aten::mv",
    "aten::addmv",
    "aten::_scaled_mm",
    "aten::_scaled_grouped_mm",
    "aten::_grouped_mm",
    "aten::_int_mm",
    "aten::_weight_int4pack_mm",
    "aten::_weight_int8pack_mm",
    "aten::_mixed_dtypes_linear",
)

# Longest plausible single event: anything longer is a corrupt record, not a measurement.
_MAX_DUR_US = 86_400 * 1_000_000  # one day
_MAX_TS_US = 9_000_000_000_000_000  # µs; year 2255 since the epoch, and * 1000 fits int64
_NULL = Raw(b"null")


class _Args(Struct, frozen=True, gc=False):
    device: Any = None
    stream: Any = None
    correlation: Any = None
    nbytes: Any = field(name="bytes", default=None)
    grid: Raw = _NULL
    block: Raw = _NULL
    graph_id: Any = field(name="graph id", default=None)
    graph_node: Any = field(name="graph node id", default=None)
    input_dims: Raw = field(name="Input Dims", default=_NULL)
    input_dims_legacy: Raw = field(name="Input dims", default=_NULL)
    input_types: Raw = field(name="Input type", default=_NULL)
    coll_name: Raw = field(name="Collective name", default=_NULL)
    in_nelems: Any = field(name="In msg nelems", default=None)
    out_nelems: Any = field(name="Out msg nelems", default=None)
    group_size: Any = field(name="Group size", default=None)
    dtype: Raw = _NULL
    pg_name: Raw = field(name="Process Group Name", default=_NULL)


_NOARGS = _Args()  # shared by every event without args (frozen, so msgspec may reuse it)


class _Event(Struct, gc=False):
    ph: str | None = None
    cat: str | None = None
    name: str | None = None
    pid: Any = None
    tid: Any = None
    ts: Any = None
    dur: Any = None
    args: _Args | None = _NOARGS  # None only for an explicit "args": null


class _Device(Struct):
    id: Raw = _NULL
    name: Raw = _NULL
    totalGlobalMem: Raw = _NULL
    numSms: Raw = _NULL


class _Doc(Struct):
    traceEvents: list[_Event] | None = None
    schemaVersion: Raw = _NULL
    deviceProperties: Raw = _NULL
    distributedInfo: Raw = _NULL
    cupti_version: Raw = _NULL
    cuda_runtime_version: Raw = _NULL
    cuda_driver_version: Raw = _NULL
    roctracer_version: Raw = _NULL
    hip_runtime_version: Raw = _NULL
    torch_version: Raw = _NULL
    pytorch_version: Raw = _NULL


# Untyped (Any) fields keep a float as its JSON text (``float_hook``): exact, and cheaper than a float.
_DECODER = msgspec.json.Decoder(_Doc, float_hook=str.strip)
_EVENTS = msgspec.json.Decoder(list[_Event], float_hook=str.strip)

# Event groups by (lower-cased) category.
_GROUPS = {
    "kernel": "kernel",
    "cuda_runtime": "runtime",
    "runtime": "runtime",
    "cuda_driver": "runtime",
    "gpu_memcpy": "memcpy",
    "memcpy": "memcpy",
    "gpu_memset": "memset",
    "memset": "memset",
    "user_annotation": "annotation",
    "cpu_op": "op",
    "operator": "op",
}
# Small-integer codes for the groups; 0: not read. 'Operator' (legacy) is ops and ProfilerStep#N ranges.
_CODES = {g: i for i, g in enumerate(dict.fromkeys(_GROUPS.values()), 1)}
_LEGACY_OP = len(_CODES) + 1
_KEEP_OPS = frozenset(MATMUL_OPS) | frozenset(COMM_OPS) | {None}  # ops without a name are kept too

_GET_CAT, _GET_PH, _GET_NAME, _GET_ARGS = attrgetter("cat"), attrgetter("ph"), attrgetter("name"), attrgetter("args")


def _cat_code(cat: str | None) -> int:
    if cat == "Operator":
        return _LEGACY_OP
    return _CODES.get(_GROUPS.get(cat.lower()), 0) if isinstance(cat, str) else 0


def _complete(events: list) -> list:
    """The complete ('X') events of ``events``."""
    return list(compress(events, map(eq, map(_GET_PH, events), repeat("X"))))


# (code, is ProfilerStep#N) -> code: legacy 'Operator' events are ranges or ops by name.
_RECODE = {(c, step): c for c in range(_LEGACY_OP) for step in (False, True)} | {
    (_LEGACY_OP, True): _CODES["annotation"], (_LEGACY_OP, False): _CODES["op"]}


def _grouped(events: list, codes_of: dict) -> dict[str, list]:
    """Complete ('X') events by group, chosen by category with C-level maps (no Python loop per event).

    ``codes_of`` caches category -> group code across chunks (categories are few). Legacy traces
    file record_function ranges under 'Operator'; ProfilerStep#N is the one we can tell apart
    from ops, so it joins the annotations. Only matmul-like (weight shapes) and all-reduce ops
    (message sizes) are kept.
    """
    codes = list(map(codes_of.get, map(_GET_CAT, events), repeat(-1)))
    present = set(codes)
    if -1 in present:  # categories not seen before
        cats = list(map(_GET_CAT, events))
        codes_of.update((c, _cat_code(c)) for c in set(cats) - codes_of.keys())
        codes = list(map(codes_of.__getitem__, cats))
        present = set(codes)
    if _LEGACY_OP in present:
        names = pl.Series(list(map(_GET_NAME, events)), dtype=pl.String)
        steps = names.str.starts_with("ProfilerStep#").fill_null(False).to_list()
        codes = list(map(_RECODE.__getitem__, zip(codes, steps)))
        present = set(codes)
    out: dict[str, list] = {}
    for g, code in _CODES.items():
        if code in present:
            evs = list(compress(events, map(eq, codes, repeat(code))))
            if g == "op":  # most events are ops; few are matmuls
                evs = list(compress(evs, map(_KEEP_OPS.__contains__, map(_GET_NAME, evs))))
            evs = _complete(evs)
            if evs:
                out[g] = evs
    return out


def _fail(path: Path, what: str, todo: str = "check that it is a complete PyTorch profiler / Kineto trace") -> TracekitError:
    return TracekitError(f"{path}: {what}; {todo}")


def _one_line(e: Exception) -> str:
    return " ".join(str(e).split())


# --- streaming input ---------------------------------------------------------------------
_BLOCK = 1 << 20  # bytes read / decompressed at a time
_CHUNK = 1 << 20  # event text decoded at a time (bounds the Python objects alive at once)
_BATCH = 1 << 14  # rows of a group typed at once (one polars query)
_WINDOW = 1 << 16  # a piece is cut at the first event boundary in its last _WINDOW bytes


def _raw_blocks(path: Path) -> Iterator[bytes]:
    """The file's (decompressed) bytes, block by block."""
    try:
        f = open(path, "rb")
    except OSError as e:
        raise _fail(path, f"cannot read the file ({e.strerror or e})", "check the path and its permissions")
    with f:
        head = f.read(2)
        f.seek(0)
        if head != b"\x1f\x8b":
            while block := f.read(_BLOCK):
                yield block
            return
        d, fed = zlib.decompressobj(wbits=31), False
        try:
            while comp := f.read(_BLOCK // 4):
                data = comp
                while data:
                    out = d.decompress(data, _BLOCK)
                    fed = True
                    if out:
                        yield out
                    if d.eof:  # concatenated gzip members
                        data, d, fed = d.unused_data, zlib.decompressobj(wbits=31), False
                    else:
                        data = d.unconsumed_tail
            if fed and not d.eof:
                raise _fail(path, "the gzip stream ends early (truncated file)", "copy or download the file again")
        except zlib.error as e:
            raise _fail(path, f"the gzip stream is damaged ({e})", "copy or download the file again")


def _prefetched(it: Iterator[bytes], depth: int = 2) -> Iterator[bytes]:
    """Run ``it`` in a thread: reading and zlib release the GIL, so decompression overlaps decoding."""
    q: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def work():
        try:
            for b in it:
                if stop.is_set():
                    return
                q.put(b)
            q.put(None)
        except BaseException as e:  # handed to the consumer
            q.put(e)

    t = threading.Thread(target=work, daemon=True)
    t.start()
    try:
        while True:
            b = q.get()
            if b is None:
                return
            if isinstance(b, BaseException):
                raise b
            yield b
    finally:
        stop.set()
        while t.is_alive():
            try:
                q.get_nowait()
            except queue.Empty:
                t.join(0.01)


_BAD_LITERAL = re.compile(rb"(?<=[:,\[])(\s*)(-?Infinity|NaN)(?=\s*[,\]\}])")
_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_SPLIT = re.compile(rb"\}\s*,\s*\{")


class _Decoded:
    """Decode-time state: warnings and counters."""

    def __init__(self, path: Path):
        self.path = path
        self.warnings: list[str] = []
        self.nan_literals = 0


def _decode_bytes(st: _Decoded, decoder, data):
    """msgspec decode with one-line errors; NaN/Infinity (Python's json writes them) are read as null."""
    try:
        return decoder.decode(data)
    except msgspec.ValidationError as e:
        raise _fail(st.path, f"unexpected JSON structure ({_one_line(e)})")
    except msgspec.DecodeError as e:
        msg = _one_line(e)
        if "truncated" in msg:
            raise _fail(st.path, "the JSON ends early (truncated file)", "the profiler may not have finished writing it; capture or copy it again")
        fixed, n = _BAD_LITERAL.subn(rb"\1null", data)
        if n:
            try:
                out = decoder.decode(fixed)
            except (msgspec.ValidationError, msgspec.DecodeError):
                pass
            else:
                st.nan_literals += n
                return out
        raise _fail(st.path, f"not valid JSON ({msg})")


def _is_bad_split(e: msgspec.DecodeError, n: int) -> bool:
    """True when decoding a candidate chunk failed only because it was cut inside a string or nested value."""
    msg = str(e)
    if "truncated" in msg:
        return True
    m = re.search(r"\(byte (\d+)\)", msg)
    return bool(m) and int(m.group(1)) >= n - 1


class _Blocks:
    """The prefetched blocks, with an end-of-input flag."""

    def __init__(self, path: Path):
        self._it = _prefetched(_raw_blocks(path))
        self.eof = False

    def next(self) -> bytes | None:
        b = None if self.eof else next(self._it, None)
        self.eof = b is None
        return b


def _whole(st: _Decoded, data: bytes) -> "_Doc":
    doc = _decode_bytes(st, _DECODER, data)
    if doc.traceEvents is None:
        raise _fail(st.path, "no 'traceEvents' list at the top level, so this is not a Kineto trace")
    return doc


def _header(st: _Decoded, blocks: _Blocks) -> tuple["_Doc", bool, bytes]:
    """Read up to ``"traceEvents": [``: (header, whole, rest). ``whole``: the header is the whole
    document (it could not be split there), else ``rest`` is the text read after the ``[``."""
    buf = b""
    while True:
        stripped = buf.lstrip()
        if stripped and stripped[:1] != b"{":
            if stripped[:1] == b"[":
                raise _fail(st.path, "the top level is a JSON array, not a Kineto trace object with 'traceEvents'",
                            "give the trace file the PyTorch profiler wrote (export_chrome_trace / tensorboard_trace_handler)")
            raise _fail(st.path, "not a JSON object (a Kineto trace starts with '{')")
        m = _EVENTS_KEY.search(buf)
        if m:
            break
        b = blocks.next()
        if b is None:  # no events key: let msgspec say what is wrong with the (small) document
            return _whole(st, buf), True, b""
        buf += b
    try:
        return _DECODER.decode(buf[: m.start()] + b'"traceEvents":null}'), False, buf[m.end():]
    except (msgspec.DecodeError, msgspec.ValidationError):  # "traceEvents" was not a top-level key after all
        parts = [buf]
        while (b := blocks.next()) is not None:
            parts.append(b)
        return _whole(st, b"".join(parts)), True, b""


def _cut(st: _Decoded, buf: bytearray, blocks: _Blocks) -> tuple[list | None, bytearray, int]:
    """Decode the events of ``buf`` (``[`` + event text) up to its last clean event boundary.

    Returns (events, buffer, where the next event starts); events is None when no boundary
    worked before the end of the input (then the buffer holds all the rest). The ``,`` or space
    after the chosen ``}`` is overwritten with ``]`` and the events are decoded from a
    memoryview, so the piece is not copied (their ``Raw`` fields point into ``buf``).
    """
    pos = max(1, len(buf) - _WINDOW)
    while True:
        s = _SPLIT.search(buf, pos)
        if s is None:
            if pos > 1 and len(buf) - pos <= _WINDOW:  # no boundary in the window: try the whole piece
                pos = 1
                continue
            b = blocks.next()
            if b is None:
                return None, buf, 0
            buf = bytearray().join((buf, b))
            continue
        end = s.start() + 1
        keep = buf[end]
        buf[end] = 0x5D  # ']'
        view = memoryview(buf)[: end + 1]
        try:
            return _EVENTS.decode(view), buf, s.end() - 1
        except msgspec.ValidationError as e:  # a DecodeError too: first
            raise _fail(st.path, f"unexpected JSON structure ({_one_line(e)})")
        except msgspec.DecodeError as e:
            if _is_bad_split(e, end + 1):
                buf[end] = keep
                pos = end
                continue
            events = _with_nan_literals(st, bytes(view), e)
            buf[end] = keep
            if events is None:  # NaN literals and a cut inside a string or nested value
                pos = end
                continue
            return events, buf, s.end() - 1


def _with_nan_literals(st: _Decoded, data: bytes, error: msgspec.DecodeError) -> list | None:
    """Events of a piece that is not valid JSON: NaN/Infinity literals read as null (Python's json
    writes them); None when the piece, so fixed, turns out to be cut inside a value."""
    fixed, n = _BAD_LITERAL.subn(rb"\1null", data)
    if n:
        try:
            events = _EVENTS.decode(fixed)
        except msgspec.DecodeError as e:
            if _is_bad_split(e, len(fixed)):
                return None
        except msgspec.ValidationError:
            pass
        else:
            st.nan_literals += n
            return events
    raise _fail(st.path, f"not valid JSON ({_one_line(error)})")


def _iter_chunks(path: Path, st: _Decoded) -> Iterator[tuple[list, "_Doc | None"]]:
    """Yield (events, header-or-None) chunk by chunk, never holding the whole document.

    The top-level object is cut into: the text before ``"traceEvents": [`` (the header),
    the events (decoded ~_CHUNK bytes at a time, cut between two events), and the tail
    (the last events, the closing ``]`` and any keys after it, e.g. ``displayTimeUnit``,
    decoded as one small document). Whatever this cannot cut cleanly is decoded whole by
    msgspec, so errors are always msgspec's. The consumer must drop each chunk's events
    before asking for the next (their ``Raw`` fields point into the chunk's buffer).
    """
    blocks = _Blocks(path)
    header, whole, rest = _header(st, blocks)
    if whole:
        yield header.traceEvents, header
        return
    yield [], header
    while True:
        parts, size = [b"[", rest], 1 + len(rest)
        del rest
        while size < _CHUNK and (b := blocks.next()) is not None:
            parts.append(b)
            size += len(b)
        if blocks.eof:
            parts[0] = b'{"traceEvents":['
            tail = _decode_bytes(st, _DECODER, b"".join(parts))
            yield tail.traceEvents or [], tail
            return
        buf = bytearray().join(parts)
        del parts
        events, buf, nxt = _cut(st, buf, blocks)
        if events is None:  # no boundary before the end: the rest is the tail
            tail = _decode_bytes(st, _DECODER, b'{"traceEvents":' + buf)
            yield tail.traceEvents or [], tail
            return
        rest = bytes(memoryview(buf)[nxt:])
        yield events, None
        del events, buf


def _texts(raws: list) -> pl.Series:
    """The JSON texts of ``raws`` (msgspec.Raw) as a String series (invalid UTF-8 replaced), in C."""
    return pl.Series(list(map(str, raws, repeat("utf-8"), repeat("replace"))), dtype=pl.String)


def _unquote(e: pl.Expr) -> pl.Expr:
    """JSON text -> its value as a string ('"x"' -> 'x', 'null' -> null)."""
    return pl.when(e == "null").then(None).otherwise(e.str.strip_chars('"'))


def _int(e: pl.Expr) -> pl.Expr:
    """JSON number or numeric string -> Int64 (integral floats such as 7.0 too; others -> null)."""
    s = e.str.strip_chars('"')
    f = s.cast(pl.Float64, strict=False)
    return pl.coalesce(s.cast(pl.Int64, strict=False), pl.when(f.round(0) == f).then(f.cast(pl.Int64, strict=False)))


def _trailing_int(e: pl.Expr) -> pl.Expr:
    """pid/tid: an int, or the trailing integer of a string such as 'stream 7' (legacy traces)."""
    s = e.str.strip_chars('"')
    return pl.coalesce(s.cast(pl.Int64, strict=False), s.str.extract(r"(-?\d+)\s*$").cast(pl.Int64, strict=False))


def _us_to_ns(e: pl.Expr) -> pl.Expr:
    """JSON µs text -> int64 ns, exactly: integer and fraction digits apart, rounded half away from 0.

    A float64 cannot hold an epoch-µs timestamp to the ns, so '1712195495519695.8' is not
    parsed as one number.
    """
    s = e.str.strip_chars('"')
    parts = s.str.split_exact(".", 1)
    whole = parts.struct.field("field_0").cast(pl.Int64, strict=False).abs()
    whole = pl.when(whole < _MAX_TS_US).then(whole)  # ns must fit int64 (and not wrap)
    frac4 = (parts.struct.field("field_1").fill_null("") + "0000").str.slice(0, 4).cast(pl.UInt32, strict=False)
    mag = whole * 1000 + (frac4.cast(pl.Int64) + 5) // 10
    exact = pl.when(s.str.starts_with("-")).then(-mag).otherwise(mag)
    # exponent forms (1.5e+12) and the like: via float64, still rounded to the ns
    f = s.cast(pl.Float64, strict=False)
    approx = pl.when(f.is_finite() & (f.abs() < _MAX_TS_US)).then((f * 1000.0).round(0).cast(pl.Int64, strict=False))
    return pl.coalesce(exact, approx)


def _dims(e: pl.Expr) -> pl.Expr:
    """grid/block JSON array text '[8, 16, 5]' -> '8,16,5'."""
    return _unquote(e).str.replace_all(r"[\s\[\]]", "")


def _raw_json(e: pl.Expr) -> pl.Expr:
    """A JSON value's text, or null when absent."""
    return pl.when(e == "null").then(None).otherwise(e)


def _positive(e: pl.Expr) -> pl.Expr:
    return pl.when(e > 0).then(e)  # Kineto writes 'graph id' 0 for work not replayed from a graph


# How each column's values become typed, by kind: (from an Int64 column, from a String column).
# A column is Int64 when all its values were JSON integers; else String: floats' JSON texts,
# JSON strings, and the texts of anything else (see _column). _RAW_KINDS are Raw JSON texts.
_KINDS = {
    "ts": (lambda e: pl.when((e < _MAX_TS_US) & (e > -_MAX_TS_US)).then(e * 1000), _us_to_ns),
    "dur": (lambda e: e.cast(pl.Float64), lambda e: e.str.strip_chars('"').cast(pl.Float64, strict=False)),
    "int": (lambda e: e, _int),
    "id": (lambda e: e, _trailing_int),
    "positive": (_positive, lambda e: _positive(_int(e))),
    "text": (None, _unquote),
    "dims": (None, _dims),
    "json": (None, _raw_json),
}
_RAW_KINDS = frozenset({"text", "dims", "json"})

# group -> ({column: (event attribute, kind)}, {output column: expression over the typed columns})
_T = {"ts": ("ts", "ts"), "dur": ("dur", "dur"), "pid": ("pid", "id"), "tid": ("tid", "id")}
_HOST = {"pid": pl.col("pid"), "tid": pl.col("tid")}
_GPU_T = {**_T, "device": ("args.device", "int"), "stream": ("args.stream", "int"),
          "correlation": ("args.correlation", "int")}
_GPU = {"device": pl.coalesce("device", "pid"), "stream": pl.coalesce("stream", "tid"), "correlation": pl.col("correlation")}
_SPECS: dict[str, tuple[dict[str, tuple[str, str]], dict[str, pl.Expr]]] = {
    "runtime": ({**_T, "correlation": ("args.correlation", "int")}, {**_HOST, "correlation": pl.col("correlation")}),
    "kernel": (
        {**_GPU_T, "grid": ("args.grid", "dims"), "block": ("args.block", "dims"),
         "graph_id": ("args.graph_id", "positive"), "graph_node": ("args.graph_node", "positive"),
         "collective": ("args.coll_name", "text"), "in_nelems": ("args.in_nelems", "int"),
         "out_nelems": ("args.out_nelems", "int"), "group_size": ("args.group_size", "int"), "dtype": ("args.dtype", "text"),
         "pg_name": ("args.pg_name", "text")},
        {**_GPU, **{c: pl.col(c) for c in ("grid", "block", "graph_id", "graph_node", "collective", "in_nelems",
                                           "out_nelems", "group_size", "dtype", "pg_name")}},
    ),
    "memcpy": ({**_GPU_T, "bytes": ("args.nbytes", "int")}, {**_GPU, "bytes": pl.col("bytes")}),
    "memset": ({**_GPU_T, "bytes": ("args.nbytes", "int")}, {**_GPU, "bytes": pl.col("bytes")}),
    "annotation": (_T, _HOST),
    "op": (
        {**_T, "input_dims": ("args.input_dims", "json"), "input_dims_legacy": ("args.input_dims_legacy", "json"),
         "input_types": ("args.input_types", "json")},
        {**_HOST, "input_dims": pl.coalesce("input_dims", "input_dims_legacy"), "input_types": pl.col("input_types")},
    ),
}
_OK = (
    pl.col("ts").is_not_null() & pl.col("dur").is_finite() & (pl.col("dur") >= 0) & (pl.col("dur") <= _MAX_DUR_US)
).fill_null(False)
_SELECT = {
    g: [pl.col("ts").alias("start"), (pl.col("ts") + (pl.col("dur") * 1000.0).round(0).cast(pl.Int64)).alias("end"),
        pl.col("name"), *(e.alias(c) for c, e in exprs.items())]
    for g, (_, exprs) in _SPECS.items()
}
_SELECT["runtime"].append(pl.col("kind"))


def _values(events: list, args: list | None, attr: str, default) -> list:
    """One field of every event (``args.x``: of its args; ``default`` where args is null)."""
    if not attr.startswith("args."):
        return list(map(attrgetter(attr), events))
    if args.count(None):  # explicit "args": null
        return list(map(getattr, args, repeat(attr[5:]), repeat(default)))
    return list(map(attrgetter(attr[5:]), args))


def _column(values: list) -> pl.Series:
    """Decoded values of one field -> Int64 when all are ints (or null), else String.

    Floats arrive as their JSON text (str), so a String column holds exact texts; bools, lists,
    objects and mixtures become text too (and so null once parsed as numbers).
    """
    try:
        s = pl.Series(values, strict=True)
    except (TypeError, ValueError, OverflowError, pl.exceptions.PolarsError):
        s = None
    if s is not None:
        if s.dtype == pl.String:
            return s
        if s.dtype == pl.Null:
            return s.cast(pl.String)
        if s.dtype == pl.Int64 and not any(map(isinstance, values, repeat(bool))):
            return s
    try:
        return pl.Series(values, dtype=pl.String, strict=False)
    except Exception:  # noqa: BLE001 - values polars cannot show as text: their JSON instead
        return _texts(list(map(msgspec.json.encode, values)))


class _Names:
    """A group's distinct names; its rows carry their name's code, resolved when typed.

    A decode loop repeats a few dozen kernel names (hundreds of bytes each) millions of times:
    each distinct name is stored once and the rows are views of it. Runtime API names lose
    their version suffix and get their ``kind`` once per distinct name.
    """

    def __init__(self, group: str):
        self.group = group
        self.index: dict[str | None, int] = {}

    def codes(self, events: list) -> pl.Series:
        names = list(map(_GET_NAME, events))
        codes = list(map(self.index.get, names, repeat(-1)))
        if -1 in codes:  # names not seen before
            new = dict.fromkeys(names).keys() - self.index.keys()
            self.index.update(zip(new, count(len(self.index))))
            codes = list(map(self.index.__getitem__, names))
        return pl.Series("name", codes, dtype=pl.UInt32)

    def resolve(self, df: pl.DataFrame) -> pl.DataFrame:
        """``df`` with its name codes replaced by the names (and runtime calls' ``kind``)."""
        distinct = pl.DataFrame({"name": pl.Series(list(self.index), dtype=pl.String)})
        if self.group == "runtime":
            distinct = distinct.select(name=strip_api_version(pl.col("name").fill_null(""))).with_columns(
                kind=api_kind(pl.col("name")))
        return df.with_columns(distinct[df["name"]].get_columns())


@cache
def _typing(col: str, kind: str, is_int: bool) -> pl.Expr:
    """The expression typing a column of this kind (built once)."""
    return _KINDS[kind][not is_int](pl.col(col)).alias(col)


def _columns(group: str, events: list, names: _Names, kernel_dims: bool) -> pl.DataFrame:
    """One group's events of one chunk -> their fields as Int64/String columns, not yet typed.

    A field absent from every event (most kernel args, legacy 'Input dims', grid/block without
    ``kernel_dims``) gets no column: _typed makes it null.
    """
    spec, _ = _SPECS[group]
    n = len(events)
    args = list(map(_GET_ARGS, events)) if any(a.startswith("args.") for a, _ in spec.values()) else None
    cols: list[pl.Series] = [names.codes(events)]
    for col, (attr, kind) in spec.items():
        if kind == "dims" and not kernel_dims:
            continue
        absent = _NULL if kind in _RAW_KINDS else None
        values = _values(events, args, attr, absent)
        if values[0] is absent and values.count(absent) == n:
            continue
        cols.append((_column(values) if absent is None else _texts(values)).alias(col))
    return pl.DataFrame(cols)


def _typed(group: str, parts: list[pl.DataFrame], names: _Names, dropped: dict[str, int]) -> pl.DataFrame:
    """A group's untyped frames (see _columns) -> one typed frame: start, end, name + the group's columns.

    Events with a missing or implausible time are dropped and counted in ``dropped``.
    """
    df = names.resolve(pl.concat(parts, how="diagonal_relaxed") if len(parts) > 1 else parts[0])
    spec = _SPECS[group][0]
    absent = [pl.lit(None, pl.String).alias(c) for c in spec if c not in df.schema]  # typed as text: null
    typed = [_typing(c, spec[c][1], df.schema.get(c) == pl.Int64) for c in spec]
    out = df.lazy().with_columns(absent).with_columns(typed).filter(_OK).select(_SELECT[group]).collect()
    if out.height != df.height:
        dropped[group] = dropped.get(group, 0) + df.height - out.height
    return out


class _Frames:
    """Typed frames by group. A group's columns wait until it has _BATCH rows: typing them (one
    polars query) costs about as much for 10 rows as for 10 000."""

    def __init__(self, kernel_dims: bool):
        self.kernel_dims = kernel_dims
        self.typed: dict[str, list[pl.DataFrame]] = {g: [] for g in _SPECS}
        self.pending: dict[str, list[pl.DataFrame]] = {g: [] for g in _SPECS}
        self.rows = dict.fromkeys(_SPECS, 0)
        self.names = {g: _Names(g) for g in _SPECS}
        self.dropped: dict[str, int] = {}

    def add(self, events: list, codes_of: dict) -> None:
        """One chunk's events."""
        for g, evs in _grouped(events, codes_of).items():
            self.pending[g].append(_columns(g, evs, self.names[g], self.kernel_dims))
            self.rows[g] += len(evs)
            if self.rows[g] >= _BATCH:
                self._flush(g)

    def _flush(self, g: str) -> None:
        if self.pending[g]:
            self.typed[g].append(_typed(g, self.pending[g], self.names[g], self.dropped))
            self.pending[g], self.rows[g] = [], 0

    def pop(self, g: str) -> pl.DataFrame | None:
        """All of a group's rows as one frame (None without any), handed over."""
        self._flush(g)
        frames = [f for f in self.typed.pop(g) if f.height]
        return pl.concat(frames, how="vertical_relaxed") if frames else None


def _header_int(raw: Raw) -> int | None:
    try:
        v = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return None
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, str) and v.strip().lstrip("-").isdigit():
        return int(v)
    return None


def _header_text(raw: Raw) -> str | None:
    try:
        v = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return None
    if v is None or isinstance(v, (dict, list)):
        return None
    return str(v)


def _producer_version(doc: _Doc) -> str | None:
    parts = []
    for label, raw in (
        ("pytorch", doc.torch_version),
        ("pytorch", doc.pytorch_version),
        ("cupti", doc.cupti_version),
        ("cuda runtime", doc.cuda_runtime_version),
        ("cuda driver", doc.cuda_driver_version),
        ("roctracer", doc.roctracer_version),
        ("hip runtime", doc.hip_runtime_version),
    ):
        v = _header_text(raw)
        if v is not None and v != "":
            parts.append(f"{label} {v}")
    return ", ".join(parts) or None


def _distributed(path: Path, raw: Raw) -> tuple[int | None, int | None]:
    try:
        info = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return None, None
    if not isinstance(info, dict):
        return None, None
    return (
        _header_int(msgspec.json.encode(info.get("rank"))),
        _header_int(msgspec.json.encode(info.get("world_size"))),
    )


def _gpus_from_header(raw: Raw) -> pl.DataFrame | None:
    try:
        devs = msgspec.json.decode(raw, type=list[_Device] | None)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    if devs is None:
        return None
    rows = []
    for i, d in enumerate(devs):
        name = _header_text(d.name)
        rows.append(
            {
                "device": _header_int(d.id) if _header_int(d.id) is not None else i,
                "name": name or None,
                "peak_bw_gbps": None,  # Kineto records no memory clock or bus width
                "sm_count": _header_int(d.numSms),
                "memory_bytes": _header_int(d.totalGlobalMem),
            }
        )
    if not rows:
        return empty(GPUS)
    return conform(pl.DataFrame(rows, schema={k: v[0] for k, v in GPUS.items()}), GPUS)


def read_kineto(path: Path, *, kernel_dims: bool = True) -> Trace:
    """Read a PyTorch profiler / Kineto trace (``.json`` or ``.json.gz``) into a :class:`Trace`.

    Raises :class:`tracekit.errors.TracekitError` (one line) for unusable input. A trace with
    no GPU activity loads, with empty frames and a warning. ``kernel_dims=False`` skips the
    kernels' grid/block (then null), which no analysis uses.
    """
    path = Path(path)
    st = _Decoded(path)
    frames = _Frames(kernel_dims)
    header = _Doc()
    codes_of: dict = {None: 0}
    for events, doc in _iter_chunks(path, st):
        if doc is not None:  # header fields (before traceEvents) and tail fields (after it)
            for f in _Doc.__struct_fields__:
                v = getattr(doc, f)
                if f != "traceEvents" and not (isinstance(v, Raw) and bytes(v) == b"null"):
                    setattr(header, f, v)
        frames.add(events, codes_of)
        del events, doc

    # --- host API calls -------------------------------------------------------------
    rt = frames.pop("runtime")
    if rt is not None:
        launches = conform(rt.sort("start"), LAUNCHES)  # name without version suffix, kind: see _names
    else:
        launches = empty(LAUNCHES)
    corr_pid = (
        launches.filter(pl.col("correlation").is_not_null())
        .select("correlation", _host_pid="pid")
        .unique("correlation", keep="first", maintain_order=True)
    )
    host_pids = launches["pid"].drop_nulls()
    default_pid = int(host_pids.mode().sort()[0]) if host_pids.len() else 0

    def host_pid(df: pl.DataFrame) -> pl.DataFrame:
        # GPU rows carry the device as pid; the launching process is the runtime call's
        return (
            df.drop("pid", strict=False)
            .join(corr_pid, on="correlation", how="left")
            .with_columns(pid=pl.col("_host_pid").fill_null(default_pid))
            .drop("_host_pid")
        )

    k = frames.pop("kernel")
    if k is not None:
        k = host_pid(k)
        collectives = conform(k.filter(pl.col("collective").is_not_null() & (pl.col("collective") != "")),
                              COLLECTIVES).sort("start")
        kernels = conform(k, KERNELS).sort("start")
    else:
        kernels, collectives = empty(KERNELS), empty(COLLECTIVES)

    parts = []
    for kind in ("memcpy", "memset"):
        m = frames.pop(kind)
        if m is not None:
            parts.append(conform(host_pid(m).with_columns(kind=pl.lit(kind)), MEMOPS))
    if parts:
        m = pl.concat(parts).with_columns(
            # 'Memcpy DtoH (Device -> Pinned)' -> DtoH; memsets have none
            copy_kind=pl.when(pl.col("kind") == "memcpy").then(pl.col("name").str.extract(r"(?i)memcpy\s+([A-Za-z]+to[A-Za-z]+)"))
        )
        memops = conform(m, MEMOPS).sort("start")
    else:
        memops = empty(MEMOPS)

    r = frames.pop("annotation")
    if r is not None:
        r = r.sort("pid", "tid", "start")
        ranges = conform(r.with_columns(depth=nesting_depth(r)), RANGES).sort("start")
    else:
        ranges = empty(RANGES)

    o = frames.pop("op")
    ops = conform(o.sort("start"), OPS) if o is not None else empty(OPS)
    dropped = frames.dropped
    del frames

    gpus = _gpus_from_header(header.deviceProperties)
    if gpus is None or gpus.height == 0:
        seen = pl.concat([kernels.select("device"), memops.select("device")]).drop_nulls().unique().sort("device")
        gpus = conform(seen, GPUS)

    # --- graphs, warnings, meta ---------------------------------------------------------
    warnings = list(st.warnings)
    if st.nan_literals:
        warnings.append(f"{st.nan_literals} NaN/Infinity literals (not valid JSON) were read as null")
    graph_launches = launches.filter(pl.col("kind") == "graph")
    if graph_launches.height:
        mode = "node"
        recorded = pl.concat([kernels.select("pid", "correlation"), memops.select("pid", "correlation")]).unique()
        missing = graph_launches.join(recorded, on=["pid", "correlation"], how="anti").height
        if missing:
            api = graph_launches["name"].mode().sort()[0]
            warnings.append(
                f"{missing} of {graph_launches.height} {api} calls have no kernels recorded: the profiler's activity "
                "buffer likely overflowed; graph work is missing"
            )
    else:
        mode = "none"
    if kernels.height + memops.height == 0:
        warnings.append(
            "no GPU activity (kernels, memcpy, memset) in this trace: it was captured without CUDA activities "
            "(profile with activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])"
        )
    if dropped:
        what = ", ".join(f"{n} {g}" for g, n in sorted(dropped.items()))
        warnings.append(
            f"dropped {sum(dropped.values())} events with a missing, negative, NaN or implausible (> 1 day) time ({what})"
        )

    rank, world_size = _distributed(path, header.distributedInfo)
    meta = TraceMeta(
        path=str(path),
        format="kineto-json",
        producer="kineto",
        producer_version=_producer_version(header),
        schema_version=_header_text(header.schemaVersion),
        graph_trace_mode=mode,
        rank=rank,
        world_size=world_size,
        warnings=tuple(warnings),
    )
    return Trace(
        kernels=kernels,
        memops=memops,
        launches=launches,
        ranges=ranges,
        graph_execs=empty(GRAPH_EXECS),
        ops=ops,
        gpus=gpus,
        meta=meta,
        collectives=collectives,
    ).validate()
