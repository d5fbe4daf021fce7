"""Nsight Systems SQLite exports (``nsys export --type sqlite``), nsys 2022.2 to 2026.x.

Owns every quirk of the nsys schema (see ../shared/reference/nsys-sqlite.md): the
metadata table's two names, lazily created tables, ``text`` vs ``textId``, NVTX event
types resolved by name, versioned runtime API names, duplicate CUDABACKTRACE runtime
rows (2022.2), per-process correlation ids, graph-level GRAPH_TRACE rows, and GPUs
joined through TARGET_INFO_CUDA_DEVICE. Nothing downstream sees any of it.

The file is opened read-only and immutable (``mode=ro&immutable=1``): nothing is
written to it or beside it. String ids are read as integers and resolved by an
elementwise map against ``StringIds`` (a few thousand rows), never by a per-row SQL join.
"""

from __future__ import annotations

import re
import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path

import polars as pl

import tracekit.readers.nsys.scan as scan
from tracekit.errors import UnreadableTrace, UnsupportedFormat
from tracekit.readers.common import api_kind, nesting_depth, release_freed_memory, strip_api_version
from tracekit.readers.nsys.scan import KERNEL_TABLES as _KERNEL_TABLES
from tracekit.readers.nsys.scan import PID as _PID
from tracekit.readers.nsys.scan import TID as _TID
from tracekit.readers.nsys.scan import Export
from tracekit.trace import (
    GPUS,
    GRAPH_EXECS,
    KERNELS,
    LAUNCHES,
    MEMOPS,
    OPS,
    RANGES,
    CaptureStart,
    Trace,
    TraceMeta,
    conform,
    empty,
)

_MEMCPY_TABLES = ("CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMCPY2")

# ENUM_CUDA_MEMCPY_OPER ids (stable since 2022) -> short kind, used when the enum table is absent.
_COPY_KINDS = {0: "Unknown", 1: "HtoD", 2: "DtoH", 3: "HtoA", 4: "AtoH", 5: "AtoA", 6: "AtoD", 7: "DtoA",
               8: "DtoD", 9: "HtoH", 10: "PtoP", 11: "UVM HtoD", 12: "UVM DtoH", 13: "UVM DtoD"}
_COPY_LABELS = {0: "Unknown", 1: "Host-to-Device", 2: "Device-to-Host", 3: "Host-to-Array", 4: "Array-to-Host",
                5: "Array-to-Array", 6: "Array-to-Device", 7: "Device-to-Array", 8: "Device-to-Device",
                9: "Host-to-Host", 10: "Peer-to-Peer", 11: "Unified Host-to-Device",
                12: "Unified Device-to-Host", 13: "Unified Device-to-Device"}
# NVTX range event types (official ids), used when ENUM_NSYS_EVENT_TYPE is absent (nsys 2022.2).
_NVTX_RANGE_TYPES = {59: "NvtxPushPopRange", 60: "NvtxStartEndRange", 70: "NvtxtPushPopRange", 71: "NvtxtStartEndRange"}
_NVTX_DOMAIN_CREATE = 75
# Longest plausible single GPU activity or API call: anything longer is a corrupt record, not a measurement.
_MAX_DUR_NS = 86_400 * 10**9  # one day


class _Db(Export):
    """A read-only view of one export (:class:`tracekit.readers.nsys.scan.Export`: tables, columns) and SQL -> polars.

    ``frame()`` is the one place rows become frames. It reads straight into Arrow with the
    fastest engine installed (measured in docs/performance.md): connectorx, then ADBC's
    SQLite driver, then plain ``sqlite3`` rows (always there, and the reference: any
    failure of a fast engine, e.g. connectorx refusing an all-NULL column, falls through
    to the next, so errors and values are those of the ``sqlite3`` path). Every engine
    opens the same ``mode=ro&immutable=1`` URI: nothing is written to or beside the file. A table the
    command line's head start already scanned with connectorx (``scan.head_start``) is taken, not read again.
    """

    ENGINES = scan.ENGINES
    _available: dict[str, bool] = {}  # engine -> its packages import (checked once per process)

    @classmethod
    def engine_available(cls, engine: str) -> bool:
        if engine not in cls._available:
            import importlib.util

            mods = {"connectorx": ("connectorx", "pyarrow"), "adbc": ("adbc_driver_sqlite", "pyarrow")}[engine]
            cls._available[engine] = all(importlib.util.find_spec(m) is not None for m in mods)
        return cls._available[engine]

    SMALL_FILE_BYTES = scan.SMALL_FILE_BYTES  # (below it: plain sqlite3 rows; the reason is there)

    @classmethod
    def default_engines(cls, path: Path) -> tuple[str, ...]:
        """The engines to try, fastest first, for this file: plain ``sqlite3`` alone for a small export."""
        try:
            small = path.stat().st_size < cls.SMALL_FILE_BYTES
        except OSError:
            small = False
        return ("sqlite3",) if small else cls.ENGINES

    def __init__(self, path: Path, engines: tuple[str, ...] | None = None, record: list | None = None):
        super().__init__(path)
        self.record = record  # scan_plan(): note each statement, read only StringIds
        # TRACEKIT_SQLITE_ENGINES=sqlite3 forces the plain path (benchmarks, debugging).
        import os

        env = tuple(e.strip() for e in os.environ.get("TRACEKIT_SQLITE_ENGINES", "").split(",") if e.strip())
        wanted = engines or env or self.default_engines(path)
        self._engines = [e for e in wanted if e in self.ENGINES and (e == "sqlite3" or self.engine_available(e))]
        self.small = self.default_engines(path) == ("sqlite3",)  # a small export (SMALL_FILE_BYTES)
        self._adbc = None
        self._owner = threading.get_ident()  # frame() calls from other threads open their own connections
        self.used: list[str] = []  # engine that produced each frame (tests, benchmarks)

    def frame(self, sql: str, schema: dict[str, pl.DataType], what: str) -> pl.DataFrame:
        """Run ``sql`` and return its rows as a frame with ``schema`` (column order = select order)."""
        if self.record is not None:
            self.record.append(sql)
            if what != "StringIds":
                return pl.DataFrame(schema=schema)
        return self._frame(sql, schema, what, threaded=threading.get_ident() != self._owner)

    def parallel(self, tasks: list) -> list:
        """Run the callables ``tasks`` (each reads a big table, or the small ones, and shapes its frame) at once,
        one thread each up to the number of CPUs, and return their results in order; an exception is raised as if they
        had run one after the other. SQLite scans are single-threaded and every engine releases the GIL
        while it reads, so on two cores the kernel and runtime tables of a 10M-kernel export come off the
        disk in about half the time of one after the other. Inside a task, ``frame()`` opens its own
        connection (connections are not shared between threads)."""
        from tracekit.parallel import in_threads

        # (scan_plan records the statements in order; a small export reads faster on one thread: two plain
        # sqlite3 readers build their Python rows under the GIL, so threads only add contention)
        return in_threads(*tasks, threads=self.record is None and not self.small)

    def _frame(self, sql: str, schema: dict[str, pl.DataType], what: str, threaded: bool = False) -> pl.DataFrame:
        for engine in self._engines:
            if engine == "sqlite3":
                break
            try:
                table = self._arrow(engine, sql, threaded)
                if table.num_columns != len(schema):
                    raise ValueError("column count")
                df = pl.from_arrow(table.rename_columns(list(schema)), rechunk=False)
                df = df.cast(schema, strict=True)
            except Exception:  # noqa: BLE001 - any failure: the next engine (sqlite3 last) decides
                continue
            self.used.append(engine)
            return df
        self.used.append("sqlite3")
        return self._rows_frame(sql, schema, what, threaded)

    def _arrow(self, engine: str, sql: str, threaded: bool = False):
        if engine == "connectorx":
            head_start = scan.take(self.uri, sql)
            if head_start is not None:
                return head_start
            import connectorx

            # A percent-encoded file: URI keeps mode=ro&immutable=1 (the file is opened O_RDONLY).
            # (Not return_type="arrow_stream": its batches are made holding the GIL, so two tables would be
            # read one after the other.)
            # (connectorx appends its own LIMIT to probe the schema: a limited query goes inside a subquery, else
            # it fails and the capture-start lookup fell back to ADBC, whose import alone costs ~0.1 s)
            if " LIMIT " in sql:
                sql = f"SELECT * FROM ({sql})"
            return connectorx.read_sql(scan.connectorx_uri(self.uri), sql, return_type="arrow")
        import adbc_driver_sqlite.dbapi as adbc

        if threaded:
            con = adbc.connect(self.uri)  # a connection per thread: ADBC connections are not shared
        else:
            if self._adbc is None:
                self._adbc = adbc.connect(self.uri)
            con = self._adbc
        cur = con.cursor()
        try:
            # Big batches: the driver infers each column's type from the first batch.
            cur.adbc_statement.set_options(**{"adbc.sqlite.query.batch_rows": str(1 << 20)})
            cur.execute(sql)
            return cur.fetch_arrow_table()
        finally:
            cur.close()
            if threaded:
                con.close()

    def _rows_frame(self, sql: str, schema: dict[str, pl.DataType], what: str, threaded: bool = False) -> pl.DataFrame:
        con = sqlite3.connect(self.uri, uri=True) if threaded else self.con
        try:
            cur = con.execute(sql)
            rows = cur.fetchall()
        except sqlite3.DatabaseError as e:
            raise UnreadableTrace(f"{self.path}: cannot read {what} ({e}); the file may be truncated or not an nsys export")
        finally:
            if threaded:
                con.close()
        try:
            return pl.DataFrame(rows, schema=schema, orient="row")
        except (TypeError, ValueError, OverflowError, pl.exceptions.PolarsError) as e:
            raise UnreadableTrace(f"{self.path}: {what} has values of the wrong type ({str(e).splitlines()[0]})")

    def close(self):
        if self._adbc is not None:
            try:
                self._adbc.close()
            except Exception:  # noqa: BLE001 - closing a read-only handle cannot lose data
                pass
            self._adbc = None
        super().close()



def _strings(db: _Db) -> pl.DataFrame:
    if not db.has("StringIds"):
        return pl.DataFrame(schema={"id": pl.Int64, "value": pl.String})
    df = db.frame("SELECT id, value FROM StringIds", {"id": pl.Int64, "value": pl.String}, "StringIds")
    return df.unique("id", keep="first", maintain_order=True)  # the primary key, unless the file is damaged


def _resolve(df: pl.DataFrame, strings: pl.DataFrame, id_col: str, out: str,
             dtype: pl.DataType = pl.String) -> pl.DataFrame:
    """Replace integer string-id column ``id_col`` by its text in column ``out`` (``dtype``: String, or
    Categorical for a column of millions of rows and few values: kernel names).

    An elementwise map (a hash lookup in a table of a few thousand ids), not a gather: it keeps the frame's
    chunks as the SQLite engine delivered them. A column chunked differently makes polars copy the whole
    frame into one chunk at the next ``drop`` (on 10M kernels: 600 MB and half a second for nothing).
    """
    text = pl.col(id_col).replace_strict(strings["id"], strings["value"].cast(dtype), default=None)
    return df.with_columns(text.alias(out)).drop(id_col)


def _metadata(db: _Db) -> tuple[dict, dict]:
    export = {}
    for t in ("META_DATA_EXPORT", "EXPORT_META_DATA"):
        if db.has(t):
            export = db.scalar_map(f"SELECT name, value FROM {t}")
            break
    capture = db.scalar_map("SELECT name, value FROM META_DATA_CAPTURE") if db.has("META_DATA_CAPTURE") else {}
    return export, capture


def _command(capture: dict) -> tuple[str, ...] | None:
    """The launched command line (``PROCESS_<n>:COMMAND`` + ``PROCESS_<n>:ARGUMENT_<i>``, lowest n), or None."""
    procs = sorted(int(k[8:-8]) for k in capture if k.startswith("PROCESS_") and k.endswith(":COMMAND")
                   and k[8:-8].isdigit())
    if not procs:
        return None
    p = f"PROCESS_{procs[0]}:"
    argv = [str(capture[p + "COMMAND"])[:4096]]
    while len(argv) <= 4096 and f"{p}ARGUMENT_{len(argv) - 1}" in capture:
        argv.append(str(capture[f"{p}ARGUMENT_{len(argv) - 1}"])[:4096])
    return tuple(argv)


def _kernels_query(db: _Db, dims: bool = True) -> tuple[str, dict[str, pl.DataType], str] | None:
    """(sql, schema, table) of the kernel read, or None when the export has no kernel table."""
    q = scan.kernels_query(db, dims)
    return None if q is None else (q[0], dict.fromkeys(q[1], pl.Int64), q[2])


def _kernels(db: _Db, strings: pl.DataFrame, dims: bool = True) -> pl.DataFrame:
    q = _kernels_query(db, dims)
    if q is None:
        return empty(KERNELS)
    df = db.frame(*q)
    absent = [c for c in ("name_id", "graph_id", "graph_node") if c not in df.columns]
    df = df.with_columns(pl.lit(None, pl.Int64).alias(c) for c in absent)
    dims = [c for c in ("gridX", "gridY", "gridZ", "blockX", "blockY", "blockZ") if c in df.columns]
    df = _resolve(df, strings, "name_id", "name", pl.Categorical)
    extra = []
    if len(dims) == 6:
        extra = [
            pl.concat_str([pl.col("gridX"), pl.col("gridY"), pl.col("gridZ")], separator=",").alias("grid"),
            pl.concat_str([pl.col("blockX"), pl.col("blockY"), pl.col("blockZ")], separator=",").alias("block"),
        ]
    # graphNodeId 0 means "not a graph node" in exports that always fill the column. (Each fix only where needed:
    # rewriting ten million values that are fine costs a copy each.)
    fixes = {}
    for c in ("graph_node", "graph_id"):
        if c in absent:  # (null already: asking would make ten million nulls to compare)
            continue
        positive = df[c] > 0
        if not bool(positive.any()):  # e.g. graphNodeId all 0 without graphs: one null, not ten million
            fixes[c] = pl.lit(None, pl.Int64)
        elif not bool(positive.all()):
            fixes[c] = pl.when(pl.col(c) > 0).then(pl.col(c))
    if df["name"].null_count():
        fixes["name"] = pl.col("name").fill_null(pl.lit("<unnamed kernel>", pl.Categorical))
    df = df.with_columns(*extra, **fixes)
    return conform(df, KERNELS)


def _memops(db: _Db) -> pl.DataFrame:
    frames = []
    for table in _MEMCPY_TABLES:
        if not db.has(table):
            continue
        cols = set(db.columns(table))
        pid = _PID.format(c="globalPid") if "globalPid" in cols else "0"
        kind = "copyKind" if "copyKind" in cols else "0"
        # srcKind/dstKind 0 = pageable host memory (ENUM_CUDA_MEM_KIND)
        pageable = ("(srcKind = 0 OR dstKind = 0)" if {"srcKind", "dstKind"} <= cols else "NULL")
        sql = (f"SELECT start, end, deviceId, streamId, correlationId, {pid}, "
               f"{'bytes' if 'bytes' in cols else 'NULL'}, {kind}, {pageable} FROM {table}")
        df = db.frame(sql, {"start": pl.Int64, "end": pl.Int64, "device": pl.Int64, "stream": pl.Int64,
                            "correlation": pl.Int64, "pid": pl.Int64, "bytes": pl.Int64, "ck": pl.Int64,
                            "pageable": pl.Int64}, table)
        df = df.with_columns(
            pageable=pl.col("pageable").cast(pl.Boolean),
            kind=pl.lit("memcpy"),
            copy_kind=pl.col("ck").replace_strict(_COPY_KINDS, default="Unknown", return_dtype=pl.String),
            name=pl.format("[CUDA memcpy {}]", pl.col("ck").replace_strict(_COPY_LABELS, default="Unknown",
                                                                            return_dtype=pl.String)),
        )
        frames.append(conform(df, MEMOPS))
    if db.has("CUPTI_ACTIVITY_KIND_MEMSET"):
        cols = set(db.columns("CUPTI_ACTIVITY_KIND_MEMSET"))
        pid = _PID.format(c="globalPid") if "globalPid" in cols else "0"
        sql = (f"SELECT start, end, deviceId, streamId, correlationId, {pid}, "
               f"{'bytes' if 'bytes' in cols else 'NULL'} FROM CUPTI_ACTIVITY_KIND_MEMSET")
        df = db.frame(sql, {"start": pl.Int64, "end": pl.Int64, "device": pl.Int64, "stream": pl.Int64,
                            "correlation": pl.Int64, "pid": pl.Int64, "bytes": pl.Int64}, "CUPTI_ACTIVITY_KIND_MEMSET")
        df = df.with_columns(kind=pl.lit("memset"), copy_kind=pl.lit(None, pl.String), name=pl.lit("[CUDA memset]"))
        frames.append(conform(df, MEMOPS))
    if not frames:
        return empty(MEMOPS)
    return pl.concat(frames).sort("start")


def _api_table(strings: pl.DataFrame) -> pl.DataFrame:
    """The runtime/driver API names (string ids) that launch work or synchronise: name_id, name, kind."""
    return (strings.rename({"id": "name_id", "value": "name"})
            .with_columns(name=strip_api_version(pl.col("name").fill_null("<unknown api>")))
            .with_columns(kind=api_kind(pl.col("name")))
            .filter(pl.col("kind") != "other"))


def _launches_query(db: _Db, apis: pl.DataFrame) -> tuple[str, dict[str, pl.DataType], str] | None:
    """(sql, schema, table) of the runtime-call read, or None when there is nothing to read."""
    q = scan.launches_query(db, apis["name_id"].to_list())
    return None if q is None else (q[0], dict.fromkeys(q[1], pl.Int64), q[2])


def _launches(db: _Db, apis: pl.DataFrame) -> pl.DataFrame:
    q = _launches_query(db, apis)
    if q is None:
        return empty(LAUNCHES)
    df = db.frame(*q)
    # Elementwise maps keep the engine's chunks (see _resolve): no copy of the frame at the drop.
    df = df.with_columns(
        name=pl.col("name_id").replace_strict(apis["name_id"], apis["name"].cast(pl.Categorical), default=None),
        kind=pl.col("name_id").replace_strict(apis["name_id"], apis["kind"].cast(pl.Categorical), default=None),
    ).drop("name_id")
    return conform(df, LAUNCHES)


# The calls that start an nsys capture from the application (``--capture-range=cudaProfilerApi``), any version suffix.
_CAPTURE_START_RX = r"^(cuProfilerStart|cudaProfilerStart)(_v\d+)?$"


def _capture_start(db: _Db, strings: pl.DataFrame) -> CaptureStart | None:
    """The first ``cuProfilerStart`` / ``cudaProfilerStart`` call recorded, with its thread: recording began when
    it returned, on that thread. None without one (a capture started by time or from the command line). Looked up
    only when the string table names the call, and the scan stops at the first rows found (the call opens the
    capture), so a trace without one costs nothing."""
    table = "CUPTI_ACTIVITY_KIND_RUNTIME"
    ids = strings.filter(pl.col("value").str.contains(_CAPTURE_START_RX).fill_null(False))
    if ids.height == 0 or not db.has(table):
        return None
    sql = (f"SELECT start, end, {_PID.format(c='globalTid')}, {_TID.format(c='globalTid')}, nameId FROM {table} "
           f"WHERE nameId IN ({','.join(str(int(i)) for i in ids['id'])}) LIMIT 16")
    rows = db.frame(sql, {"start": pl.Int64, "end": pl.Int64, "pid": pl.Int64, "tid": pl.Int64, "name_id": pl.Int64},
                    table).drop_nulls(["start", "end"])
    if rows.height == 0:
        return None
    first = rows.sort("start").row(0, named=True)
    call = ids.filter(pl.col("id") == first["name_id"])["value"][0]
    return CaptureStart(ns=int(first["end"]), call=re.sub(r"_v\d+$", "", call), pid=first["pid"], tid=first["tid"])


def _ranges(db: _Db, strings: pl.DataFrame, warnings: list[str]) -> pl.DataFrame:
    if not db.has("NVTX_EVENTS"):
        return empty(RANGES)
    cols = set(db.columns("NVTX_EVENTS"))
    types = dict(_NVTX_RANGE_TYPES)
    if db.has("ENUM_NSYS_EVENT_TYPE"):
        enum = db.scalar_map("SELECT id, name FROM ENUM_NSYS_EVENT_TYPE")
        found = {i: n for i, n in enum.items() if n in _NVTX_RANGE_TYPES.values()}
        if found:
            types = found
    type_list = ", ".join(str(int(i)) for i in types)
    text_id = "textId" if "textId" in cols else "NULL"
    domain = "domainId" if "domainId" in cols else "0"
    sql = (f"SELECT start, end, {_PID.format(c='globalTid')}, {_TID.format(c='globalTid')}, text, {text_id}, "
           f"{domain} FROM NVTX_EVENTS WHERE eventType IN ({type_list})")
    df = db.frame(sql, {"start": pl.Int64, "end": pl.Int64, "pid": pl.Int64, "tid": pl.Int64, "text": pl.String,
                        "text_id": pl.Int64, "domain_id": pl.Int64}, "NVTX_EVENTS")
    df = _resolve(df, strings, "text_id", "registered")
    df = df.with_columns(name=pl.coalesce("text", "registered").fill_null(""))
    # Domain names come from the NvtxDomainCreate rows.
    dsql = f"SELECT {domain}, text FROM NVTX_EVENTS WHERE eventType = {_NVTX_DOMAIN_CREATE}"
    if db.has("ENUM_NSYS_EVENT_TYPE"):
        dsql = (f"SELECT {domain}, text FROM NVTX_EVENTS WHERE eventType = "
                f"(SELECT id FROM ENUM_NSYS_EVENT_TYPE WHERE name = 'NvtxDomainCreate')")
    domains = db.frame(dsql, {"domain_id": pl.Int64, "domain": pl.String}, "NVTX domains").unique("domain_id")
    df = df.join(domains, on="domain_id", how="left")
    df = df.with_columns(
        domain=pl.when(pl.col("domain_id") != 0).then(
            pl.coalesce("domain", pl.format("domain {}", pl.col("domain_id"))))
    )
    # A range still open at capture stop has no (or a bogus) end.
    bad = df.filter(pl.col("end").is_null() | (pl.col("end") < pl.col("start")))
    if bad.height:
        warnings.append(f"{bad.height} NVTX range(s) have no valid end (open at capture stop); they count as cut off")
        df = df.with_columns(end=pl.when(pl.col("end") >= pl.col("start")).then(pl.col("end")))
    df = df.sort(["pid", "tid", "start"])
    filled = df.with_columns(end=pl.col("end").fill_null(pl.col("start").max() + 1))
    df = df.with_columns(depth=nesting_depth(filled.select("start", "end", "pid", "tid")))
    return conform(df, RANGES)


def _graph_execs(db: _Db) -> pl.DataFrame:
    table = "CUPTI_ACTIVITY_KIND_GRAPH_TRACE"
    if not db.has(table):
        return empty(GRAPH_EXECS)
    cols = set(db.columns(table))
    pid = _PID.format(c="globalPid") if "globalPid" in cols else "0"
    gid = "graphId" if "graphId" in cols else "NULL"
    sql = f"SELECT start, end, deviceId, streamId, correlationId, {pid}, {gid} FROM {table}"
    df = db.frame(sql, {"start": pl.Int64, "end": pl.Int64, "device": pl.Int64, "stream": pl.Int64,
                        "correlation": pl.Int64, "pid": pl.Int64, "graph_id": pl.Int64}, table)
    return conform(df, GRAPH_EXECS)


def _gpus(db: _Db) -> pl.DataFrame:
    if not db.has("TARGET_INFO_GPU"):
        return empty(GPUS)
    cols = set(db.columns("TARGET_INFO_GPU"))

    def c(name, default="NULL"):
        return name if name in cols else default

    sql = (f"SELECT {c('id', '0')}, {c('cuDevice')}, {c('name')}, {c('memoryBandwidth')}, {c('smCount')}, "
           f"{c('totalMemory')} FROM TARGET_INFO_GPU")
    df = db.frame(sql, {"gpu_id": pl.Int64, "cu_device": pl.Int64, "name": pl.String, "bw": pl.Float64,
                        "sm_count": pl.Int64, "memory_bytes": pl.Int64}, "TARGET_INFO_GPU")
    device = pl.coalesce("cu_device", "gpu_id")
    if db.has("TARGET_INFO_CUDA_DEVICE") and {"gpuId", "cudaId"} <= set(db.columns("TARGET_INFO_CUDA_DEVICE")):
        m = db.frame("SELECT DISTINCT gpuId, cudaId FROM TARGET_INFO_CUDA_DEVICE",
                     {"gpu_id": pl.Int64, "cuda_id": pl.Int64}, "TARGET_INFO_CUDA_DEVICE").unique("gpu_id")
        df = df.join(m, on="gpu_id", how="left")
        device = pl.coalesce("cuda_id", "cu_device", "gpu_id")
    df = df.with_columns(
        device=device,
        peak_bw_gbps=pl.when(pl.col("bw") > 0).then(pl.col("bw") / 1e9),
    ).unique("device", keep="first").sort("device")
    return conform(df, GPUS)


def _graph_mode(capture: dict, kernels: pl.DataFrame, launches: pl.DataFrame, graph_execs: pl.DataFrame) -> str:
    graph_launches = launches.filter(pl.col("kind") == "graph")
    if graph_execs.height:
        return "graph"
    if graph_launches.height == 0:
        return "none"
    linked = graph_launches.join(kernels.select("pid", "correlation").unique(), on=["pid", "correlation"], how="semi")
    if linked.height:
        return "node"
    mode = next((str(v) for k, v in capture.items() if str(k).endswith("CUDA_GRAPH_TRACE_OPTIONS:MODE")), "")
    if mode.lower() == "graph":
        return "graph"
    return "unknown"


def _plausible(df: pl.DataFrame, what: str, warnings: list[str], one: list[str] | None = None) -> pl.DataFrame:
    """Drop rows whose times cannot be a measurement (null, end before start, longer than a day), with a warning.
    ``one``: receives the columns of :data:`ONE_VALUE_COLUMNS` that hold one value (:func:`_all_plausible`)."""
    if _all_plausible(df, one):
        return df
    if _exact_in_float(df):
        # Every time within +-2^53 ns (104 days: nsys times count from the session start): the float difference
        # below is then exact up to its comparison with 0 and _MAX_DUR_NS, and the integer one cannot wrap, so
        # both say the same; the integer one makes no float copies of ten million values.
        dur = pl.col("end") - pl.col("start")
    else:
        dur = pl.col("end").cast(pl.Float64) - pl.col("start").cast(pl.Float64)  # float: int64 end - start can wrap
    ok = (pl.col("start").is_not_null() & (dur >= 0) & (dur <= _MAX_DUR_NS)).fill_null(False)
    n_bad = df.height - df.select(ok.sum()).item()
    if n_bad:
        warnings.append(f"dropped {n_bad} {what} with a missing, negative or implausible (> 1 day) duration")
        df = df.filter(ok)
    return df


# The columns a frame of the trace may hold one value in (one GPU, one process, one launching thread, one stream: the
# usual trace): the big tables' are flagged sorted where they do, so that their min and max answer at once (the
# analyses ask whether they are one value many times; ten million rows: ~25 ms each time otherwise).
ONE_VALUE_COLUMNS = ("device", "pid", "tid", "stream")


def _all_plausible(df: pl.DataFrame, one: list[str] | None = None) -> bool:
    """The usual case, decided by one pass of reductions (no mask of every row): no null time, every time within
    +-2^53 (so the integer differences are exact, as in :func:`_plausible`), and the shortest and longest durations
    within [0, one day]. ``one``: receives the columns of :data:`ONE_VALUE_COLUMNS` that hold one value and no null,
    decided in the same pass (whatever the answer: dropping rows leaves them so).

    >>> _all_plausible(pl.DataFrame({"start": [0, 5], "end": [2, 5]})), _all_plausible(pl.DataFrame({"start": [0, 5], "end": [2, 4]}))
    (True, False)
    >>> one = []; _ = _all_plausible(pl.DataFrame({"start": [0, 5], "end": [2, 5], "pid": [3, 3], "tid": [1, 2]}), one); one
    ['pid']
    """
    if df.height == 0:
        return True
    s, e = pl.col("start"), pl.col("end")
    cols = [c for c in ONE_VALUE_COLUMNS if c in df.columns] if one is not None else []
    q = df.lazy().select(n=s.null_count() + e.null_count(), lo=pl.min_horizontal(s.min(), e.min()),
                         hi=pl.max_horizontal(s.max(), e.max()), d_lo=(e - s).min(), d_hi=(e - s).max(),
                         **{f"_n_{c}": pl.col(c).null_count() for c in cols},
                         **{f"_lo_{c}": pl.col(c).min() for c in cols}, **{f"_hi_{c}": pl.col(c).max() for c in cols})
    # On the streaming engine: the durations are reduced morsel by morsel, never a column of ten million of them (in
    # memory, ~80 MB fresh per table each time: 38k and 29k page faults while a 10M export is read).
    try:
        r = q.collect(engine="streaming").row(0, named=True)
    except (TypeError, ValueError, pl.exceptions.PolarsError):  # (a polars without that engine, or not for this)
        r = q.collect().row(0, named=True)
    if one is not None:
        one.extend(c for c in cols if r[f"_n_{c}"] == 0 and r[f"_lo_{c}"] is not None and r[f"_lo_{c}"] == r[f"_hi_{c}"])
    lim = 2**53
    return (r["n"] == 0 and -lim <= r["lo"] and r["hi"] <= lim and r["d_lo"] >= 0 and r["d_hi"] <= _MAX_DUR_NS)


def _exact_in_float(df: pl.DataFrame) -> bool:
    """Whether every ``start`` and ``end`` of ``df`` lies within +-2^53 (exact as a float64; two reductions).

    >>> _exact_in_float(pl.DataFrame({"start": [0, -5], "end": [2**53, None]}))
    True
    >>> _exact_in_float(pl.DataFrame({"start": [0], "end": [2**53 + 1]}))
    False
    """
    lim = 2**53
    for c in ("start", "end"):
        lo, hi = df[c].min(), df[c].max()
        if lo is not None and (lo < -lim or hi > lim):
            return False
    return True


def _sorted(df: pl.DataFrame, one: Sequence[str] = ()) -> pl.DataFrame:
    """Sorted by start; nsys rows are usually in time order already, and checking costs far less than sorting. The
    column is flagged sorted either way, so that the analyses' own checks of it (a dozen at ten million rows, ~15 ms
    each) answer at once; so are the columns ``one`` names (each of one value: :data:`ONE_VALUE_COLUMNS`)."""
    if not df["start"].is_sorted():
        df = df.sort("start")
    elif df.height:
        df = df.with_columns(pl.col("start").set_sorted())
    return df.with_columns(pl.col(c).set_sorted() for c in one) if one and df.height else df


def _checked(df: pl.DataFrame, what: str, warnings: list[str]) -> pl.DataFrame:
    """A big table made ready: :func:`_plausible`, then :func:`_sorted` with its one-value columns flagged (found in the
    plausibility check's own pass)."""
    one: list[str] = []
    return _sorted(_plausible(df, what, warnings, one), one)


def read_nsys(path: Path, *, kernel_dims: bool = True) -> Trace:
    """Read an nsys SQLite export into a :class:`Trace`.

    ``kernel_dims=False`` skips the six grid/block columns (``kernels.grid``/``block`` are then null): the
    command-line analyses do not use them, and on a 10M-kernel export they are a quarter of the scan.
    """
    return _read(_Db(Path(path)), kernel_dims)


def scan_plan(path: Path, *, kernel_dims: bool = False) -> list[str]:
    """The SQL statements :func:`read_nsys` runs on ``path``, in order (benchmarks/floor.py times exactly
    these as the floor). Only ``StringIds`` is read to build them (the runtime filter needs its ids)."""
    db = _Db(Path(path), record=[])
    _read(db, kernel_dims)
    return db.record


def _read(db: _Db, kernel_dims: bool) -> Trace:
    path = db.path
    try:
        warnings: list[str] = []
        export, capture = _metadata(db)
        strings = _strings(db)
        apis = _api_table(strings)
        # The two big tables are read, checked and put in time order side by side (one thread each); the small ones
        # are a third task, started when the first big one is in. (Each task's warnings are kept apart, then listed
        # in the order of the tables.)
        k_warn: list[str] = []
        l_warn: list[str] = []

        def small_tables():
            # (a third task: on two threads it starts when the first big table is in, beside the other one)
            return _memops(db), _ranges(db, strings, warnings), _graph_execs(db), _gpus(db), _capture_start(db, strings)

        tasks = [
            lambda: _checked(_kernels(db, strings, kernel_dims), "kernel records", k_warn),
            lambda: _checked(_launches(db, apis), "CUDA API calls", l_warn),
            small_tables,
        ]
        if scan.pending(db.uri):
            # The big tables are being scanned already (the command line's head start): the small ones first, while
            # the two scans run, instead of after the first of them is in.
            small, kernels, launches = db.parallel([tasks[2], tasks[0], tasks[1]])
        else:
            kernels, launches, small = db.parallel(tasks)
        memops, ranges, graph_execs, gpus, capture_start = small
    finally:
        db.close()
    release_freed_memory()  # (what the engines' threads freed while they read: the analysis' peak starts here)
    warnings += k_warn
    memops = _plausible(memops, "memcpy/memset records", warnings)
    warnings += l_warn
    graph_execs = _plausible(graph_execs, "graph executions", warnings)
    if not any(db.has(t) for t in _KERNEL_TABLES + _MEMCPY_TABLES + ("CUPTI_ACTIVITY_KIND_RUNTIME",)):
        warnings.append("no CUDA activity tables: the capture collected no GPU trace (nsys profile -t cuda)")
    if not export and not capture and not db.has("StringIds"):
        raise UnsupportedFormat(f"{path}: SQLite file without nsys tables (no StringIds, no metadata); not an nsys export")
    mode = _graph_mode(capture, kernels, launches, graph_execs)
    if mode == "graph":
        warnings.append(
            "CUDA graphs were traced whole (--cuda-graph-trace=graph): graph work has no per-kernel rows, so its "
            "categories cannot be known; capture again with --cuda-graph-trace=node"
        )
    if gpus.height == 0 and kernels.height:
        gpus = conform(kernels.select(pl.col("device").unique().sort()), GPUS)
        warnings.append("the export has no GPU info (TARGET_INFO_GPU): GPU names and peak bandwidth are unknown")
    meta = TraceMeta(
        path=str(path),
        format="nsys-sqlite",
        producer="nsys",
        markers="nvtx",
        producer_version=export.get("EXPORT_PRODUCT_VERSION"),
        schema_version=export.get("EXPORT_SCHEMA_VERSION"),
        graph_trace_mode=mode,
        warnings=tuple(warnings),
        command=_command(capture),
        capture_start=capture_start,
    )
    return Trace(
        kernels=kernels,
        memops=memops,
        launches=launches,
        ranges=ranges,
        graph_execs=graph_execs.sort("start"),
        ops=empty(OPS),
        gpus=gpus,
        meta=meta,
    ).validate()
