"""Kineto JSON, part 2 of 3: the columns. Decoded events -> typed polars frames, one per event group.

Events are grouped by category with C-level maps over the Structs (``map``, ``compress``, dict lookups),
never a Python loop per event; of the ``cpu_op`` events only matmul-like ones are kept. A group's fields
become polars columns piece by piece and are typed in batches of ``_BATCH`` rows, one polars query each, in a
second thread.
Scalars whose JSON type varies between producers (``ts``, ``dur``, ``pid``, ``args.stream`` ...) arrive
untyped, floats as their JSON text, so ``ts`` (float µs) becomes exact int64 ns: integer and fraction digits
are parsed apart (a float64 cannot hold an epoch-µs value to the ns). Every distinct name is stored once.
"""

from __future__ import annotations

from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from functools import cache
from itertools import compress, count, repeat
from operator import attrgetter, eq, not_

import msgspec
import polars as pl

from tracekit.readers.common import api_kind, strip_api_version
from tracekit.readers.kineto.stream import NULL, decode_args
from tracekit.trace import COMM_OPS

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
    "python_function": "host",
    "trace": "profiler",  # the profiler's own span ('PyTorch Profiler (0)'): when recording began
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


def _grouped(events: list, codes_of: dict, split_host: bool = False) -> dict[str, list]:
    """Complete ('X') events by group, chosen by category with C-level maps (no Python loop per event).

    ``codes_of`` caches category -> group code across chunks (categories are few). Legacy traces
    file record_function ranges under 'Operator'; ProfilerStep#N is the one we can tell apart
    from ops, so it joins the annotations. Matmul-like (weight shapes) and all-reduce ops (message sizes)
    are ops with their shapes; every other CPU op and Python function is host work (group ``host``: name and
    interval only). ``split_host``: the Python functions apart, as group ``python`` (``host`` is then the other
    CPU ops only).
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
            if g == "op":  # most events are ops; few are matmuls (their shapes are read): the rest is host work
                keep = list(map(_KEEP_OPS.__contains__, map(_GET_NAME, evs)))
                rest = _complete(list(compress(evs, map(not_, keep))))
                if rest:
                    out.setdefault("host", []).extend(rest)
                evs = list(compress(evs, keep))
            evs = _complete(evs)
            if evs:
                out.setdefault("python" if split_host and g == "host" else g, []).extend(evs)
    return out


_BATCH = 1 << 14  # rows of a group typed at once (one polars query)
_AHEAD = 2  # batches typed in the background at most while the next pieces are decoded
# Groups whose typed frames keep their names as codes (UInt32) into one shared name table (Frames.op_names): the
# ops and host work that become Trace.ops (millions of rows, a few hundred names) are sorted as 4-byte codes and
# named once, after the sort (a view per row into one table), instead of carrying and gathering a string view
# per row and a copy of the name table per batch.
CODED = frozenset({"op", "host"})


# Groups whose names (and kinds) are Categorical in the Trace (kernels.name, launches.name and kind): typed so at once.
_CATEGORICAL = frozenset({"runtime", "kernel"})


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


_MAX_TS_NS = _MAX_TS_US * 1000


def _us_to_ns_fast(e: pl.Expr) -> pl.Expr:
    """:func:`_us_to_ns` for the texts every profiler writes ('5366601892462.641': digits, a dot, three digits),
    null for any other: the digits without the dot are the ns (a quarter of the cost; :func:`_typed` falls back
    to the exact parse for a batch that has any other text)."""
    v = e.str.replace(".", "", literal=True, n=1).cast(pl.Int64, strict=False)
    return pl.when(e.str.contains(r"^-?[0-9]+\.[0-9]{3}$") & (v < _MAX_TS_NS) & (v > -_MAX_TS_NS)).then(v)


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
    # every other CPU op and Python function: what the host did (gaps are named and classified by it)
    "host": (_T, _HOST),
    "profiler": (_T, _HOST),
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


_WITH_ARGS = frozenset(g for g, (spec, _) in _SPECS.items() if any(a.startswith("args.") for a, _ in spec.values()))


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
        if s.dtype == pl.Int64 and bool not in set(map(type, values)):  # (polars reads True as 1)
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
        if self.group in _CATEGORICAL:  # (4 bytes a row from here on: the sort and conform at the read's end too)
            distinct = distinct.cast(pl.Categorical)
        return df.with_columns(distinct[df["name"]].get_columns())


@cache
def _typing(col: str, kind: str, is_int: bool) -> pl.Expr:
    """The expression typing a column of this kind (built once)."""
    return _KINDS[kind][not is_int](pl.col(col)).alias(col)


def _columns(group: str, events: list, names: _Names, kernel_dims: bool, run: int | None = None) -> pl.DataFrame:
    """One group's events of one chunk -> their fields as Int64/String columns, not yet typed.

    A field absent from every event (most kernel args, legacy 'Input dims', grid/block without
    ``kernel_dims``) gets no column: _typed makes it null. ``run``: the host rows' run (column ``_run``).
    """
    spec, _ = _SPECS[group]
    n = len(events)
    args = decode_args(list(map(_GET_ARGS, events))) if group in _WITH_ARGS else None
    cols: list[pl.Series] = [names.codes(events)]
    for col, (attr, kind) in spec.items():
        if kind == "dims" and not kernel_dims:
            continue
        absent = NULL if kind in _RAW_KINDS else None
        values = _values(events, args, attr, absent)
        if values[0] is absent and values.count(absent) == n:
            continue
        cols.append((_column(values) if absent is None else _texts(values)).alias(col))
    if run:  # (a repeated value: not a polars query per piece, ~5% of the decoding thread's time)
        cols.append(pl.Series(_RUN, [run], dtype=pl.UInt8).new_from_index(0, n))
    return pl.DataFrame(cols)


def _typed(group: str, parts: list[pl.DataFrame], names: _Names, dropped: dict[str, int], _ops=None, _hold=False
           ) -> pl.DataFrame:
    """A group's untyped frames (see _columns) -> one typed frame: start, end, name + the group's columns.

    Events with a missing or implausible time are dropped and counted in ``dropped``.
    """
    df = pl.concat(parts, how="diagonal_relaxed") if len(parts) > 1 else parts[0]
    if group not in CODED:
        df = names.resolve(df)
    spec = _SPECS[group][0]
    done = set()
    if df.schema.get("ts") == pl.String:  # (floats: the usual texts parsed the short way when all of them are)
        ts = df.select(_us_to_ns_fast(pl.col("ts"))).to_series()
        if ts.null_count() == df["ts"].null_count():
            df, done = df.with_columns(ts), {"ts"}
        del ts
    absent = [pl.lit(None, pl.String).alias(c) for c in spec if c not in df.schema]  # typed as text: null
    typed = [_typing(c, spec[c][1], df.schema.get(c) == pl.Int64) for c in spec if c not in done]
    # (one chunk per column: the pieces' columns come out chunked unalike, and a frame of unaligned columns is
    # copied whole into one chunk by the first select on it: 70 MB for the ops of a 1 GB trace)
    select = [*_SELECT[group], pl.col(_RUN)] if _RUN in df.schema else _SELECT[group]
    out = df.lazy().with_columns(absent).with_columns(typed).filter(_OK).select(select).collect().rechunk()
    if out.height != df.height:
        dropped[group] = dropped.get(group, 0) + df.height - out.height
    return out


def _typed_ops(group: str, parts: list[pl.DataFrame], names: _Names, dropped: dict[str, int],
               ops: OpsInOrder, hold: bool) -> None:
    """:func:`_typed` for the ops and host work: the typed rows go to ``ops`` (``hold``: see OpsInOrder.add)."""
    ops.add(group, _typed(group, parts, names, dropped), hold)


# Host work by where it came from: the CPU ops that are not matmul-like or all-reduce (_grouped's "host") and the
# Python functions ("python", with split_host): each its own run of rows in start order, as a profiler writes them.
_HOST_RUNS = {"host": 1, "python": 2}
_RUN = "_run"
_SEQ = "_seq"  # a row's place in the reading order: (0 for ops with shapes, 1 for host work) << 32 | row
_SETTLE = 1 << 17
_SETTLE_FIRST = 1 << 19  # ops before the first round: a smaller trace's are sorted once, at the end, as one
_CODED_ORDER = ("op", "host")  # rows of Trace.ops put in start order at a time while reading (about eight typed batches)
_OPS = ["start", "end", "pid", "tid", "name", "input_dims", "input_types"]


def sorted_by_start(parts: list[pl.DataFrame], lead: pl.DataFrame | None = None) -> pl.DataFrame:
    """``pl.concat(parts).sort("start")`` (the same rows in the same order), a column at a time: ``parts`` is
    emptied and each column of the input is freed once it is gathered, so the sort holds one column twice, not
    the whole frame (the ops of a 1 GB trace: 2M rows, ~120 MB a copy). ``lead``: more columns of the rows of
    ``parts[0]`` only (null in the other parts' rows), gathered in the same order: columns only the first part
    has (the few ops with shapes) are never widened to every row before the sort.

    >>> parts = [pl.DataFrame({"start": [3, 1], "x": ["c", "a"]}), pl.DataFrame({"start": [2], "x": ["b"]})]
    >>> sorted_by_start(parts, pl.DataFrame({"y": ["C", "A"]})).rows(), parts
    ([(1, 'a', 'A'), (2, 'b', None), (3, 'c', 'C')], [])
    """
    first = parts[0].height
    df = pl.concat(parts, rechunk=False)
    parts.clear()
    # (what DataFrame.sort computes for one column, ties alike; on one chunk: an arg_sort over a frame's ~100 reader
    # batches takes twice the memory)
    order = df["start"].rechunk().arg_sort()
    out = []
    for name in df.columns:
        out.append(df.select(name)[order])  # a frame's gather, as DataFrame.sort makes it (flags alike)
        df = df.drop(name)  # (the input column is freed here)
    if lead is not None and lead.width:
        at = pl.select(pl.when(order < first).then(order)).to_series()  # (null: a row of another part)
        out.append(lead.select(pl.all().gather(at)))
    # start flagged sorted, as DataFrame.sort leaves it: a later sort by start is then free
    return pl.concat(out, how="horizontal").with_columns(pl.col("start").set_sorted())


class OpsInOrder:
    """Trace.ops put in start order while the trace is read, not after it.

    Trace.ops is the matmul-like and all-reduce ops with their shapes (group ``op``), then the host work (``host``),
    in one frame stably sorted by start: the order of ``pl.concat([op rows, host rows]).sort("start",
    maintain_order=True)``; each row's ``_seq`` is its place in that concatenation. Profilers write each thread's
    events in time order, so the rows arrive in a few runs each in start order (ops with shapes, the other CPU ops,
    the Python functions): every row earlier than the last start of every run so far can be put in its final place
    already (sorted by ``start, _seq``, named), in chunks of about :data:`_SETTLE` rows. The millions of host
    rows of a big trace are then put in order and named beside the decoding (in the typing thread), and the
    memory the typed batches held is freed as the read goes, not in one sort at its end that allocates the whole
    frame again (jemalloc, polars' allocator, keeps freed memory for a second or so: the read's peak).

    A run that goes back in time (threads written one after the other, a file not written in time order) ends
    this: then every row is sorted at the end, by ``start, _seq`` (the same order). The first round waits for
    :data:`_SETTLE_FIRST` rows: a smaller trace's ops are sorted once at the end (:func:`sorted_by_start`). All
    methods but :meth:`finish` run in the typing thread, one call at a time.
    """

    def __init__(self, names: _Names):
        self.names = names
        self.runs: dict[int, list[pl.DataFrame]] = {}  # run -> typed rows not yet in place
        self.last: dict[int, int] = {}  # run -> its latest start so far
        self.waiting = 0  # rows in self.runs
        self.done: list[pl.DataFrame] = []  # chunks in their final order, named
        self.done_max: int | None = None  # the latest start in self.done
        self.in_order = True
        self.rows = {"op": 0, "host": 0}  # rows given their _seq
        self.added = {"op": 0, "host": 0}  # rows added
        self.incoming: list[tuple[str, pl.DataFrame]] = []  # typed batches not yet sorted out
        self.next_at = _SETTLE_FIRST  # waiting rows that make the next round

    def table(self) -> pl.Series:
        """The names by code (null for an event without a name). A null more at the end, so that the table is never
        flagged sorted (a one-row series is), a flag a gather would carry to every row."""
        return pl.Series("name", [*self.names.index, None], dtype=pl.String)

    def categories(self) -> pl.Series:
        """:meth:`table` as Categorical (Trace.ops.name): a gather of it is 4 bytes a row, not a 16-byte view."""
        return self.table().cast(pl.Categorical)

    def add(self, group: str, df: pl.DataFrame, hold: bool = False) -> None:
        """A typed batch of ``op`` or ``host`` rows, in reading order. ``hold``: rows of the other group were read
        and are not typed yet, and none of that group was typed before (so no run of theirs is known): nothing is
        put in place now."""
        if df.height:
            self.incoming.append((group, df))
            self.waiting += df.height
            self.added[group] += df.height
        if self.waiting >= self.next_at and not hold:
            self._sort_out()
            if self.in_order:
                self._settle(min(self.last.values()))
            self.next_at = self.waiting + _SETTLE  # (rows a lagging run holds back wait for the next round)

    def _sort_out(self) -> None:
        """The batches come in: each row's ``_seq``, each into its run (a few polars calls per ~_SETTLE rows, not
        per batch: each call in this thread waits for the GIL the decoding holds)."""
        for group in _CODED_ORDER:
            frames = [df for g, df in self.incoming if g == group]
            if not frames:
                continue
            df = pl.concat(frames, how="vertical") if len(frames) > 1 else frames[0]
            del frames
            first = self.rows[group] | (0 if group == "op" else 1 << 32)
            df = df.with_columns(pl.int_range(first, first + df.height, dtype=pl.Int64, eager=True).alias(_SEQ))
            self.rows[group] += df.height
            if group == "op":
                parts = [(0, df)]
            else:
                parts = [(int(r), p.drop(_RUN)) for (r,), p in
                         df.partition_by(_RUN, maintain_order=True, as_dict=True).items()]
            for run, p in parts:
                start = p["start"]
                if self.in_order:
                    prev = self.last.get(run)
                    self.in_order = start.is_sorted() and (
                        start[0] >= prev if prev is not None else self.done_max is None or start[0] > self.done_max)
                self.runs.setdefault(run, []).append(p)
                self.last[run] = start[-1]
        self.incoming = []

    def _settle(self, before: int | None) -> None:
        """Put the waiting rows that start before ``before`` (None: every row) in their final place."""
        take = []
        for run, frames in self.runs.items():
            f = pl.concat(frames, how="vertical") if len(frames) > 1 else frames[0]
            k = f.height if before is None else int(f["start"].search_sorted(before, side="left"))
            if k:
                take.append(f.slice(0, k))
            self.runs[run] = [f.slice(k)] if k < f.height else []
            self.waiting -= k
        if take:
            chunk = pl.concat(take, how="diagonal").sort("start", _SEQ)
            self.done.append(self._named(chunk))
            self.done_max = chunk["start"][-1]

    def _sorted_at_once(self, keep_seq: bool = False) -> pl.DataFrame | None:
        """Every row, when none were put in place while reading (a smaller trace): the ops with shapes, then the
        host work, sorted by start (:func:`sorted_by_start`: the same order as the rounds give), then named.
        ``keep_seq``: with each row's ``_seq``."""
        op, host = ([df for g, df in self.incoming if g == group] for group in _CODED_ORDER)
        self.incoming = []
        parts = [pl.concat(fs, how="vertical") for fs in (op, host) if fs]
        if not parts:
            return None
        lead = parts[0].select(pl.col("input_dims", "input_types").cast(pl.Categorical)) if op else None
        seq = [pl.int_range(pl.len(), dtype=pl.Int64).alias(_SEQ)] if keep_seq else []
        parts = [f.select("start", "end", "pid", "tid", "name", *seq) for f in parts]
        if keep_seq and host:
            parts[-1] = parts[-1].with_columns(pl.col(_SEQ) + (1 << 32))
        df = sorted_by_start(parts, lead)
        return df.with_columns(self.categories().gather(df["name"]).alias("name"))

    def _named(self, df: pl.DataFrame) -> pl.DataFrame:
        """``df`` in Trace.ops' columns, names for codes (and ``_seq``)."""
        # (the shapes as Categorical: 4 bytes a row, null in most; a String column is a 16-byte view a row)
        shapes = [pl.col(c).cast(pl.Categorical) if c in df.schema else pl.lit(None, pl.Categorical).alias(c)
                  for c in ("input_dims", "input_types")]
        df = df.with_columns(*shapes, self.categories().gather(df["name"]).alias("name"))
        return df.select(*_OPS, _SEQ)

    def finish(self, keep_seq: bool = False) -> pl.DataFrame | None:
        """All the rows, in order (the typing done); ``keep_seq``: with their ``_seq``."""
        if self.done_max is None and not self.runs:  # (no round yet: one sort, a column at a time, of every row)
            return self._sorted_at_once(keep_seq)
        self._sort_out()
        if self.in_order:
            self._settle(None)
            chunks, self.done = self.done, []
            if not chunks:
                return None
            df = pl.concat(chunks, how="vertical")
            return (df if keep_seq else df.drop(_SEQ)).with_columns(pl.col("start").set_sorted())
        # (a run went back in time: every row sorted here, a column at a time)
        frames = self.done + [self._named(f) for fs in self.runs.values() for f in fs]
        self.done, self.runs = [], {}
        if not frames:
            return None
        return _sorted_by_seq(frames, keep_seq)

    # --- the worker's side of a read in two processes (worker) ---

    def take_done(self) -> list[pl.DataFrame]:
        """The rows put in their final place so far (named, with ``_seq``), handed over."""
        chunks, self.done = self.done, []
        return chunks

    def finish_parts(self) -> tuple[list[pl.DataFrame], bool]:
        """The rows not handed over by :meth:`take_done` (the typing done), named, with ``_seq``, and whether
        they and the chunks handed over before are in order (by start, ``_seq``): False when a run went back in
        time (then every row must be sorted)."""
        if self.done_max is None and not self.runs:
            df = self._sorted_at_once(keep_seq=True)
            return [df] if df is not None else [], True
        self._sort_out()
        if self.in_order:
            self._settle(None)
            return self.take_done(), True
        frames = self.done + [self._named(f) for fs in self.runs.values() for f in fs]
        self.done, self.runs = [], {}
        return frames, False


def _sorted_by_seq(frames: list[pl.DataFrame], keep_seq: bool = False) -> pl.DataFrame | None:
    """Rows of Trace.ops (with ``_seq``) sorted by start, then ``_seq``, a column at a time; ``frames`` is
    emptied."""
    if not frames:
        return None
    df = pl.concat(frames, how="vertical")
    frames.clear()
    order = df.select(pl.arg_sort_by("start", _SEQ)).to_series()
    if not keep_seq:
        df = df.drop(_SEQ)
    out = []
    for name in df.columns:
        out.append(df.select(name)[order])
        df = df.drop(name)  # (the input column is freed here)
    return pl.concat(out, how="horizontal").with_columns(pl.col("start").set_sorted())


def _as_ops(df: pl.DataFrame) -> pl.DataFrame:
    """Trace.ops' columns and ``_seq``, in order (the shapes null where a part had no ops with shapes)."""
    shapes = [pl.lit(None, pl.Categorical).alias(c) for c in ("input_dims", "input_types") if c not in df.schema]
    return df.with_columns(shapes).select(*_OPS, _SEQ)


def merged_ops(here: pl.DataFrame | None, added: dict[str, int], there: list[pl.DataFrame], in_order: bool
               ) -> pl.DataFrame | None:
    """Trace.ops from the rows read here (``here``: in order, with ``_seq``; ``added``: its rows by group) and the
    worker's (``there``: its chunks, with its own ``_seq``; ``in_order``: they are in order, chunk after chunk):
    the order of one read of both parts, the worker's rows after these in each group's reading order. Only the rows
    where the two parts overlap in time are sorted (a trace written in time order: the few around the cut)."""
    # (the worker's _seq made this read's: its rows follow these in each group's reading order)
    shift = pl.when(pl.col(_SEQ) < (1 << 32)).then(pl.col(_SEQ) + added["op"]).otherwise(pl.col(_SEQ) + added["host"])
    there = [_as_ops(f) for f in there if f.height]
    here = _as_ops(here) if here is not None and here.height else None
    if not in_order:
        return _sorted_by_seq([*([here] if here is not None else []), *(f.with_columns(shift) for f in there)])
    if not there:
        return None if here is None else here.drop(_SEQ).with_columns(pl.col("start").set_sorted())
    w = pl.concat(there, how="vertical")
    del there
    parts = [w]
    if here is not None:
        lo, hi = w["start"][0], here["start"][-1]
        k = int(here["start"].search_sorted(lo, side="left"))  # here[k:] start at or after the worker's first row
        j = int(w["start"].search_sorted(hi, side="right"))  # w[:j] start at or before the last row here
        middle = pl.concat([here.slice(k), w.slice(0, j).with_columns(shift)], how="vertical").sort("start", _SEQ)
        parts = [here.slice(0, k), middle, w.slice(j)]
    return pl.concat([p.drop(_SEQ) for p in parts], how="vertical").with_columns(pl.col("start").set_sorted())


class Frames:
    """Typed frames by group. A group's columns wait until it has _BATCH rows: typing them (one
    polars query) costs about as much for 10 rows as for 10 000. The typing runs in a second thread (polars
    releases the GIL), beside the decoding of the next pieces, at most _AHEAD batches behind; :meth:`close` ends
    it."""

    # Type the rows of Trace.ops' other group (op / host) whenever one of them reaches _BATCH rows: the sparse ops
    # with shapes (a few per 100 host rows) then never hold OpsInOrder's rounds back by a whole batch, so fewer rows
    # wait for their place (the worker's memory: worker).
    ops_together = False

    def __init__(self, kernel_dims: bool):
        self.kernel_dims = kernel_dims
        self.typed: dict[str, list[Future]] = {g: [] for g in _SPECS}
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="tracekit-kineto-typing")
        self._ahead: deque[Future] = deque()
        self.pending: dict[str, list[pl.DataFrame]] = {g: [] for g in _SPECS}
        self.rows = dict.fromkeys(_SPECS, 0)
        self.names = {g: _Names(g) for g in _SPECS}
        self.names["host"] = self.names["op"]  # (one name table for Trace.ops: see CODED)
        self.dropped: dict[str, int] = {}
        self.ops = OpsInOrder(self.names["op"])
        self.worker_ops: list[pl.DataFrame] | None = None  # Trace.ops' rows read by a worker (take)
        self.worker_in_order = True

    def add(self, events: list, codes_of: dict) -> None:
        """One chunk's events."""
        for g, evs in _grouped(events, codes_of, split_host=True).items():
            run = _HOST_RUNS.get(g)
            g = "host" if run else g
            self.pending[g].append(_columns(g, evs, self.names[g], self.kernel_dims, run))
            self.rows[g] += len(evs)
            if self.rows[g] >= _BATCH:
                self._flush(g)
                if self.ops_together and g in CODED:
                    for h in _CODED_ORDER:
                        if h != g and self.pending[h]:
                            self._flush(h)

    def _flush(self, g: str) -> None:
        if self.pending[g]:
            # (one worker: the batches are typed one after the other, so ``dropped`` has one writer, and the ops
            # reach self.ops in the order they were read)
            # (OpsInOrder may put rows in place only when no ops or host rows read so far are still untyped with
            # none of their group typed before: such rows could start earlier than every row it has)
            hold = any(self.pending[h] and not self.typed[h] for h in CODED if h != g)
            job = self._pool.submit(_typed_ops if g in CODED else _typed, g, self.pending[g], self.names[g],
                                    self.dropped, self.ops, hold)
            self.typed[g].append(job)
            self._ahead.append(job)
            self.pending[g], self.rows[g] = [], 0
            while len(self._ahead) > _AHEAD:  # (bounds the untyped batches held)
                self._ahead.popleft().result()

    def take(self, batches, in_order: bool = True) -> None:
        """The typed batches of the events after a cut (:mod:`tracekit.readers.kineto.worker` read them in a
        second process), as if typed here: ``(group, names, frame)`` in their reading order, which follows every
        event added so far. Group ``ops``: rows of Trace.ops, put in order and named by the worker (chunks in
        order, with the worker's ``_seq``; ``in_order``: see OpsInOrder.finish_parts), merged by
        :meth:`pop_ops`. ``names``: the names of Trace.ops the worker met since its previous batch (this
        process' table gets them)."""
        for g in _SPECS:  # (what this process read: before the worker's rows)
            self._flush(g)
        index = self.names["op"].index
        self.worker_ops, self.worker_in_order = [], in_order
        for g, names, df in batches:
            for n in names:
                index.setdefault(n, len(index))
            if g == "ops":
                self.worker_ops.append(df)
            else:
                job = Future()
                job.set_result(df)
                self.typed[g].append(job)
            del df

    def close(self) -> None:
        """Wait for the typing thread and end it."""
        self._pool.shutdown(wait=True, cancel_futures=True)

    def op_names(self) -> pl.Series:
        """The names of the CODED groups, by code (null for an event without a name)."""
        return self.ops.table()

    def pop_ops(self) -> pl.DataFrame | None:
        """Trace.ops (:class:`OpsInOrder`), handed over; None without any."""
        for g in _CODED_ORDER:
            self._flush(g)
        for g in _CODED_ORDER:
            for job in self.typed.pop(g):
                job.result()
        if self.worker_ops is None:
            return self.ops.finish()
        here = self.ops.finish(keep_seq=True)
        there, self.worker_ops = self.worker_ops, None
        return merged_ops(here, self.ops.added, there, self.worker_in_order)

    def pop(self, g: str) -> pl.DataFrame | None:
        """All of a group's rows as one frame (None without any), handed over."""
        self._flush(g)
        frames = [f for f in (job.result() for job in self.typed.pop(g)) if f.height]
        return pl.concat(frames, how="vertical_relaxed") if frames else None

