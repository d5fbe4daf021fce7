"""Reader for PyTorch profiler / Kineto Chrome-trace JSON (``.json`` and ``.json.gz``).

This module owns every Kineto quirk; what leaves it is a :class:`tracekit.trace.Trace`.

How it reads (and why):

* No ``json.load``: the file is streamed (gunzipped in a second thread) and the
  ``traceEvents`` array is cut between events into ~32 MB pieces, each decoded by
  ``msgspec`` into small typed Structs that name only the fields we use (msgspec skips
  everything else, e.g. ``python_function`` stacks, without building Python objects for
  it) and turned into typed polars frames at once. Memory is bounded by the piece size
  plus the normalized frames, not by the file (docs/kineto-reader.md has the numbers).
* Scalars whose JSON type varies between producers (``ts``, ``dur``, ``pid``, ``tid``,
  ``args.stream`` ...) are kept as ``msgspec.Raw`` (the exact JSON text) and parsed in bulk
  by polars: all texts of one column are joined with a byte that valid JSON cannot
  contain (0x1E) and read as one CSV column. That gives exact timestamps: ``ts`` is float
  microseconds, and a float64 cannot hold an epoch-µs value to the nanosecond
  (1.7e15 µs has a 0.25 µs ulp), so the integer and fraction digits are parsed apart and
  rounded to int64 ns (Perfetto's ``CoerceToTs`` does the same for string timestamps).
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

import io
import queue
import re
import threading
import zlib
from collections.abc import Iterator
from operator import attrgetter, itemgetter
from pathlib import Path

import msgspec
import polars as pl
from msgspec import Raw, Struct, field

from tracekit.errors import TracekitError
from tracekit.readers.common import api_kind, nesting_depth, strip_api_version
from tracekit.trace import COLLECTIVES, GPUS, GRAPH_EXECS, KERNELS, LAUNCHES, MEMOPS, OPS, RANGES, Trace, TraceMeta, conform, empty

__all__ = ["read_kineto", "MATMUL_OPS"]

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
_SEP, _EOL = "\x1f", "\x1e"  # control bytes cannot occur raw in valid JSON text


class _Args(Struct, gc=False):
    device: Raw = _NULL
    stream: Raw = _NULL
    correlation: Raw = _NULL
    nbytes: Raw = field(name="bytes", default=_NULL)
    grid: Raw = _NULL
    block: Raw = _NULL
    graph_id: Raw = field(name="graph id", default=_NULL)
    graph_node: Raw = field(name="graph node id", default=_NULL)
    input_dims: Raw = field(name="Input Dims", default=_NULL)
    input_dims_legacy: Raw = field(name="Input dims", default=_NULL)
    input_types: Raw = field(name="Input type", default=_NULL)
    coll_name: Raw = field(name="Collective name", default=_NULL)
    in_nelems: Raw = field(name="In msg nelems", default=_NULL)
    out_nelems: Raw = field(name="Out msg nelems", default=_NULL)
    group_size: Raw = field(name="Group size", default=_NULL)
    dtype: Raw = _NULL


_NOARGS = _Args()


class _Event(Struct, gc=False):
    ph: str | None = None
    cat: str | None = None
    name: str | None = None
    pid: Raw = _NULL
    tid: Raw = _NULL
    ts: Raw = _NULL
    dur: Raw = _NULL
    args: _Args | None = None


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


_DECODER = msgspec.json.Decoder(_Doc)
_EVENTS = msgspec.json.Decoder(list[_Event])

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


_GET_CAT, _GET_PH, _GET_NAME, _GET_ARGS = attrgetter("cat"), attrgetter("ph"), attrgetter("name"), attrgetter("args")


def _pick(events: list, idx: pl.Series) -> list:
    """events[i] for i in idx, without a Python-level loop."""
    if idx.len() == 0:
        return []
    if idx.len() == 1:
        return [events[idx[0]]]
    return list(itemgetter(*idx.to_list())(events))


def _grouped(events: list, wanted_ops: frozenset) -> dict[str, list]:
    """Complete ('X') events by group, chosen with polars over their category/name columns.

    Legacy traces file record_function ranges under 'Operator'; ProfilerStep#N is the one we can tell
    apart from ops, so it joins the annotations. Only matmul-like ops are kept (for weight shapes).
    """
    if not events:
        return {}
    df = pl.DataFrame({
        "cat": pl.Series(list(map(_GET_CAT, events)), dtype=pl.String),
        "ph": pl.Series(list(map(_GET_PH, events)), dtype=pl.String),
        "name": pl.Series(list(map(_GET_NAME, events)), dtype=pl.String),
    }).with_row_index("i")
    df = df.filter(pl.col("ph") == "X").with_columns(
        group=pl.col("cat").str.to_lowercase().replace_strict(_GROUPS, default=None, return_dtype=pl.String))
    legacy_step = (pl.col("cat") == "Operator") & pl.col("name").str.starts_with("ProfilerStep#")
    df = df.with_columns(
        group=pl.when(legacy_step).then(pl.lit("annotation"))
        .when((pl.col("group") == "op") & ~pl.col("name").is_in(list(wanted_ops))).then(None)
        .otherwise(pl.col("group"))
    ).filter(pl.col("group").is_not_null())
    idx = df.group_by("group").agg(pl.col("i"))
    return {g: _pick(events, pl.Series(i, dtype=pl.UInt32)) for g, i in idx.iter_rows()}


def _fail(path: Path, what: str, todo: str = "check that it is a complete PyTorch profiler / Kineto trace") -> TracekitError:
    return TracekitError(f"{path}: {what}; {todo}")


def _one_line(e: Exception) -> str:
    return " ".join(str(e).split())


# --- streaming input ---------------------------------------------------------------------
_BLOCK = 16 << 20  # bytes read / decompressed at a time
_CHUNK = 32 << 20  # event text decoded at a time (bounds the Python objects alive at once)


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


def _decode_bytes(st: _Decoded, decoder, data: bytes):
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


def _iter_chunks(path: Path, st: _Decoded) -> Iterator[tuple[list, "_Doc | None"]]:
    """Yield (events, header-or-None) chunk by chunk, never holding the whole document.

    The top-level object is cut into: the text before ``"traceEvents": [`` (the header),
    the events (decoded ~_CHUNK bytes at a time, cut between two events), and the tail
    (closing ``]`` plus any keys after it, e.g. ``displayTimeUnit``). Whatever this cannot
    cut cleanly is decoded whole by msgspec, so errors are always msgspec's.
    """
    blocks = _prefetched(_raw_blocks(path))
    buf = b""
    eof = False

    def more() -> bool:
        nonlocal buf, eof
        if eof:
            return False
        b = next(blocks, None)
        if b is None:
            eof = True
            return False
        buf = buf + b if buf else b
        return True

    # header
    while True:
        stripped = buf.lstrip()
        if stripped and stripped[:1] != b"{":
            if stripped[:1] == b"[":
                raise _fail(path, "the top level is a JSON array, not a Kineto trace object with 'traceEvents'",
                            "give the trace file the PyTorch profiler wrote (export_chrome_trace / tensorboard_trace_handler)")
            raise _fail(path, "not a JSON object (a Kineto trace starts with '{')")
        m = _EVENTS_KEY.search(buf)
        if m or not more():
            break
    if m is None:  # no events key: let msgspec say what is wrong with the (small) document
        doc = _decode_bytes(st, _DECODER, buf)
        if doc.traceEvents is None:
            raise _fail(path, "no 'traceEvents' list at the top level, so this is not a Kineto trace")
        yield doc.traceEvents, doc
        return
    try:
        header = _DECODER.decode(buf[: m.start()] + b'"traceEvents":null}')
    except (msgspec.DecodeError, msgspec.ValidationError):
        header = None  # "traceEvents" was not a top-level key after all: decode the whole document
    if header is None:
        while more():
            pass
        doc = _decode_bytes(st, _DECODER, buf)
        if doc.traceEvents is None:
            raise _fail(path, "no 'traceEvents' list at the top level, so this is not a Kineto trace")
        yield doc.traceEvents, doc
        return
    yield [], header
    buf = buf[m.end():]

    # events, chunk by chunk
    while True:
        while len(buf) < _CHUNK and more():
            pass
        if eof and len(buf) < 2 * _CHUNK:
            tail = _decode_bytes(st, _DECODER, b'{"traceEvents":[' + buf)
            yield tail.traceEvents or [], tail
            return
        cut = _CHUNK
        while True:
            s = _SPLIT.search(buf, cut)
            if s is None:
                if more():
                    continue
                tail = _decode_bytes(st, _DECODER, b'{"traceEvents":[' + buf)
                yield tail.traceEvents or [], tail
                return
            chunk = b"[" + buf[: s.start() + 1] + b"]"
            try:
                events = _EVENTS.decode(chunk)
            except msgspec.DecodeError as e:
                if _is_bad_split(e, len(chunk)):
                    cut = s.start() + 1
                    continue
                events = _decode_bytes(st, _EVENTS, chunk)
            except msgspec.ValidationError as e:
                raise _fail(path, f"unexpected JSON structure in traceEvents ({_one_line(e)})")
            del chunk
            yield events, None
            buf = buf[s.end() - 1 :]
            break


def _texts(raws: list) -> pl.Series:
    """The JSON texts of ``raws`` (msgspec.Raw) as one String series, in bulk."""
    if not raws:
        return pl.Series("v", [], dtype=pl.String)
    buf = _EOL.encode().join(raws)
    s = pl.read_csv(
        io.BytesIO(buf),
        has_header=False,
        separator=_SEP,
        eol_char=_EOL,
        quote_char=None,
        schema={"v": pl.String},
    )["v"]
    if s.len() != len(raws):  # cannot happen for valid JSON; stay correct if it does
        s = pl.Series("v", [bytes(r).decode("utf-8", "replace") for r in raws], dtype=pl.String)
    return s


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
    v = _int(e)
    return pl.when(v > 0).then(v)  # Kineto writes 'graph id' 0 for work not replayed from a graph


# group -> (event attribute per text column, typed columns computed from them)
_T = {"ts": "ts", "dur": "dur", "pid": "pid", "tid": "tid"}
_HOST = {"pid": _trailing_int(pl.col("pid")), "tid": _trailing_int(pl.col("tid"))}
_GPU = {
    "device": pl.coalesce(_int(pl.col("device")), _trailing_int(pl.col("pid"))),
    "stream": pl.coalesce(_int(pl.col("stream")), _trailing_int(pl.col("tid"))),
    "correlation": _int(pl.col("correlation")),
}
_GPU_T = {**_T, "device": "args.device", "stream": "args.stream", "correlation": "args.correlation"}
_SPECS: dict[str, tuple[dict[str, str], dict[str, pl.Expr]]] = {
    "runtime": ({**_T, "correlation": "args.correlation"}, {**_HOST, "correlation": _int(pl.col("correlation"))}),
    "kernel": (
        {**_GPU_T, "grid": "args.grid", "block": "args.block", "graph_id": "args.graph_id", "graph_node": "args.graph_node",
         "collective": "args.coll_name", "in_nelems": "args.in_nelems", "out_nelems": "args.out_nelems",
         "group_size": "args.group_size", "dtype": "args.dtype"},
        {**_GPU, "grid": _dims(pl.col("grid")), "block": _dims(pl.col("block")),
         "graph_id": _positive(pl.col("graph_id")), "graph_node": _positive(pl.col("graph_node")),
         "collective": _unquote(pl.col("collective")), "in_nelems": _int(pl.col("in_nelems")),
         "out_nelems": _int(pl.col("out_nelems")), "group_size": _int(pl.col("group_size")),
         "dtype": _unquote(pl.col("dtype"))},
    ),
    "memcpy": ({**_GPU_T, "bytes": "args.nbytes"}, {**_GPU, "bytes": _int(pl.col("bytes"))}),
    "memset": ({**_GPU_T, "bytes": "args.nbytes"}, {**_GPU, "bytes": _int(pl.col("bytes"))}),
    "annotation": (_T, _HOST),
    "op": (
        {**_T, "input_dims": "args.input_dims", "input_dims_legacy": "args.input_dims_legacy", "input_types": "args.input_types"},
        {**_HOST, "input_dims": pl.coalesce(_raw_json(pl.col("input_dims")), _raw_json(pl.col("input_dims_legacy"))),
         "input_types": _raw_json(pl.col("input_types"))},
    ),
}


def _typed(group: str, events: list, dropped: dict[str, int]) -> pl.DataFrame:
    """One group's events -> a typed frame (start, end, name + the group's columns)."""
    texts, exprs = _SPECS[group]
    out = {"name": pl.Series("name", list(map(_GET_NAME, events)), dtype=pl.String)}
    args = None
    for col, attr in texts.items():
        if attr.startswith("args."):
            if args is None:
                args = [a if a is not None else _NOARGS for a in map(_GET_ARGS, events)]
            raws = list(map(attrgetter(attr[5:]), args))
        else:
            raws = list(map(attrgetter(attr), events))
        out[col] = _texts(raws).alias(col)
    df = pl.DataFrame(out)
    dur = _unquote(pl.col("dur")).cast(pl.Float64, strict=False)
    df = df.with_columns(start=_us_to_ns(pl.col("ts")), _dur_us=dur, **exprs)
    ok = (
        pl.col("start").is_not_null()
        & pl.col("_dur_us").is_finite()
        & (pl.col("_dur_us") >= 0)
        & (pl.col("_dur_us") <= _MAX_DUR_US)
    ).fill_null(False)
    n_bad = df.height - df.select(ok.sum()).item()
    if n_bad:
        dropped[group] = dropped.get(group, 0) + n_bad
        df = df.filter(ok)
    df = df.with_columns(end=pl.col("start") + (pl.col("_dur_us") * 1000.0).round(0).cast(pl.Int64))
    return df.select("start", "end", "name", *exprs)


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


def _concat(frames: list[pl.DataFrame]) -> pl.DataFrame | None:
    frames = [f for f in frames if f.height]
    return pl.concat(frames, how="vertical_relaxed") if frames else None


def read_kineto(path: Path) -> Trace:
    """Read a PyTorch profiler / Kineto trace (``.json`` or ``.json.gz``) into a :class:`Trace`.

    Raises :class:`tracekit.errors.TracekitError` (one line) for unusable input. A trace with
    no GPU activity loads, with empty frames and a warning.
    """
    path = Path(path)
    st = _Decoded(path)
    frames: dict[str, list[pl.DataFrame]] = {g: [] for g in _SPECS}
    dropped: dict[str, int] = {}
    header = _Doc()
    wanted_ops = frozenset(MATMUL_OPS)
    for events, doc in _iter_chunks(path, st):
        if doc is not None:  # header fields (before traceEvents) and tail fields (after it)
            for f in _Doc.__struct_fields__:
                v = getattr(doc, f)
                if f != "traceEvents" and not (isinstance(v, Raw) and bytes(v) == b"null"):
                    setattr(header, f, v)
        for g, evs in _grouped(events, wanted_ops).items():
            if evs:
                frames[g].append(_typed(g, evs, dropped))
        del events

    # --- host API calls -------------------------------------------------------------
    rt = _concat(frames["runtime"])
    if rt is not None:
        rt = rt.with_columns(name=strip_api_version(pl.col("name").fill_null(""))).with_columns(kind=api_kind(pl.col("name")))
        launches = conform(rt, LAUNCHES).sort("start")
    else:
        launches = empty(LAUNCHES)
    corr_pid = (
        launches.filter(pl.col("correlation").is_not_null())
        .group_by("correlation", maintain_order=True)
        .agg(_host_pid=pl.col("pid").first())
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

    k = _concat(frames["kernel"])
    if k is not None:
        k = host_pid(k)
        collectives = conform(k.filter(pl.col("collective").is_not_null() & (pl.col("collective") != "")),
                              COLLECTIVES).sort("start")
        kernels = conform(k, KERNELS).sort("start")
    else:
        kernels, collectives = empty(KERNELS), empty(COLLECTIVES)

    parts = []
    for kind in ("memcpy", "memset"):
        m = _concat(frames[kind])
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

    r = _concat(frames["annotation"])
    if r is not None:
        r = r.sort("pid", "tid", "start")
        ranges = conform(r.with_columns(depth=nesting_depth(r)), RANGES).sort("start")
    else:
        ranges = empty(RANGES)

    o = _concat(frames["op"])
    ops = conform(o, OPS).sort("start") if o is not None else empty(OPS)
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
