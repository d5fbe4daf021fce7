"""The nsys reader's SQL, polars-free, and its head start: the two big scans begun before polars is imported.

:mod:`tracekit.readers.nsys.reader` reads an export into frames; this module holds what it needs that polars does not:
the read-only view of the file (:class:`Export`: tables, columns, the ``mode=ro&immutable=1`` URI), the choice
of engine by file size, and the SELECTs of the two big tables (kernels, and the runtime calls that launch work
or synchronise). Importing it imports only the standard library.

:func:`head_start` runs those two SELECTs with connectorx on threads *before* the caller imports polars and the
analysis (~0.3 s of imports on one core, which then overlap the ~1 s scan instead of preceding it); the reader
takes the scanned Arrow tables (:func:`take`) when it gets to them, keyed by the exact SQL it builds, so a
head start that guessed wrong is only unused, never a different result. It runs only where the reader would
use connectorx first: an export of at least :data:`SMALL_FILE_BYTES` with connectorx installed and no
``TRACEKIT_SQLITE_ENGINES`` forcing another engine.
"""

from __future__ import annotations

import os
import sqlite3
import sys
import threading
import urllib.parse
from contextlib import contextmanager
from pathlib import Path

from tracekit.errors import UnreadableTrace, UnsupportedFormat

ENGINES = ("connectorx", "adbc", "sqlite3")
# Below this size plain sqlite3 rows are faster overall: importing pyarrow and the ADBC driver costs
# ~0.15 s of CPU, which the faster Arrow scan repays only from ~80k kernels (a ~16 MB export of a
# decode loop; benchmarks/startup.py, docs/performance.md).
SMALL_FILE_BYTES = 16 << 20

PID = "((({c}) >> 24) & 16777215)"  # globalTid / globalPid -> PID
TID = "(({c}) & 16777215)"

KERNEL_TABLES = (
    "CUPTI_ACTIVITY_KIND_KERNEL",
    "CUPTI_ACTIVITY_KIND_KERNEL_V3",
    "CUPTI_ACTIVITY_KIND_KERNEL_V2",
    "CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL",
)
RUNTIME_TABLE = "CUPTI_ACTIVITY_KIND_RUNTIME"
KERNEL_DIMS = ("gridX", "gridY", "gridZ", "blockX", "blockY", "blockZ")


def export_uri(path: Path) -> str:
    """The read-only, immutable ``file:`` URI every engine opens (nothing is written to or beside the file)."""
    return "file:" + urllib.parse.quote(str(Path(path).resolve())) + "?mode=ro&immutable=1"


def connectorx_uri(uri: str) -> str:
    """connectorx's connection string for an export URI (percent-encoded: the file is opened O_RDONLY)."""
    return "sqlite://" + urllib.parse.quote(uri, safe="")


class Export:
    """A read-only view of one export: its tables and their columns, through one stdlib ``sqlite3`` connection."""

    def __init__(self, path: Path):
        self.path = path
        self.uri = export_uri(path)
        try:
            # Shared with the reader's worker threads for schema questions (columns()), one at a time under _lock.
            self.con = sqlite3.connect(self.uri, uri=True, check_same_thread=False)
            rows = self.con.execute("SELECT name FROM sqlite_master WHERE type='table'").fetchall()
        except sqlite3.DatabaseError as e:
            raise UnreadableTrace(f"{path}: not a readable SQLite database ({e}); re-export it with `nsys export --type sqlite`")
        self.tables = {r[0] for r in rows}
        self._cols: dict[str, list[str]] = {}
        self._lock = threading.Lock()

    def has(self, table: str) -> bool:
        return table in self.tables

    def columns(self, table: str) -> list[str]:
        with self._lock:
            if table not in self._cols:
                try:
                    self._cols[table] = [r[1] for r in self.con.execute(f'PRAGMA table_info("{table}")')]
                except sqlite3.DatabaseError as e:
                    raise UnreadableTrace(f"{self.path}: table {table} is unreadable ({e}); the file may be truncated")
            return self._cols[table]

    def scalar_map(self, sql: str) -> dict:
        try:
            with self._lock:  # (the shared connection: one statement at a time, whichever thread asks)
                return {r[0]: r[1] for r in self.con.execute(sql)}
        except sqlite3.DatabaseError:
            return {}

    def close(self):
        self.con.close()


def is_small(path: Path) -> bool:
    """A small export (under ``small_bytes``): read with plain ``sqlite3`` rows."""
    try:
        return path.stat().st_size < SMALL_FILE_BYTES
    except OSError:
        return False


def kernels_query(db: Export, dims: bool = True) -> tuple[str, list[str], str] | None:
    """(sql, column names, table) of the kernel read (every column an integer), or None without a kernel table."""
    table = next((t for t in KERNEL_TABLES if db.has(t)), None)
    if table is None:
        return None
    cols = set(db.columns(table))
    need = {"start", "end", "deviceId", "streamId", "correlationId"}
    if not need <= cols:
        raise UnsupportedFormat(f"{db.path}: {table} lacks columns {sorted(need - cols)}; not an nsys kernel table")
    name_col = next((c for c in ("demangledName", "shortName", "mangledName") if c in cols), None)
    pid = PID.format(c="globalPid") if "globalPid" in cols else "0"
    sel = {
        "start": "start",
        "end": "end",
        "device": "deviceId",
        "stream": "streamId",
        "correlation": "correlationId",
        "pid": pid,
        "name_id": name_col,
        "graph_id": "graphId" if "graphId" in cols else None,
        "graph_node": "graphNodeId" if "graphNodeId" in cols else None,
    }
    # Absent columns are added as nulls afterwards, not selected as NULL: connectorx cannot type an all-NULL column.
    sel = {k: v for k, v in sel.items() if v is not None}
    for c in [c for c in KERNEL_DIMS if c in cols] if dims else []:
        sel[c] = c
    sql = "SELECT " + ", ".join(f"{expr} AS {alias}" for alias, expr in sel.items()) + f" FROM {table}"
    return sql, list(sel), table


LAUNCH_COLUMNS = ["start", "end", "pid", "tid", "correlation", "name_id"]


def launches_query(db: Export, api_ids) -> tuple[str, list[str], str] | None:
    """(sql, column names, table) of the runtime-call read (every column an integer): only the calls whose name id
    is in ``api_ids`` (those that put work on a GPU or synchronise with it); None when there is nothing to read."""
    table = RUNTIME_TABLE
    if not db.has(table):
        return None
    cols = set(db.columns(table))
    if not {"start", "end", "globalTid", "correlationId", "nameId"} <= cols:
        raise UnsupportedFormat(f"{db.path}: {table} lacks the columns nsys always writes; not an nsys export?")
    if not len(api_ids):
        return None
    # nsys 2022.2 writes every backtraced call twice: eventClass 0/1 (runtime/driver) and 67 (backtrace).
    conds = ["eventClass IN (0, 1)"] if "eventClass" in cols else []
    # Only calls that put work on a GPU or synchronise with it are read: the filter is pushed into SQL by name id
    # (a few dozen APIs), so the tens of millions of other runtime calls never leave SQLite.
    conds.append("nameId IN (" + ",".join(str(int(i)) for i in api_ids) + ")")
    where = " WHERE " + " AND ".join(conds)
    sql = (f"SELECT start, end, {PID.format(c='globalTid')}, {TID.format(c='globalTid')}, correlationId, nameId "
           f"FROM {table}{where}")
    return sql, list(LAUNCH_COLUMNS), table


def api_ids(rows) -> list[int]:
    """The string ids, in ``StringIds`` order (the first row of an id), of the API names that launch work or
    synchronise: :func:`tracekit.readers.api_names.launch_kind` not ``other``. What the reader's polars
    ``_api_table`` keeps, for the head start (the reader builds its own query; a mismatch only wastes the scan)."""
    from tracekit.readers.api_names import launch_kind, strip_version

    seen: set = set()
    out = []
    for i, value in rows:
        if i in seen:
            continue
        seen.add(i)
        if launch_kind(strip_version("<unknown api>" if value is None else value)) != "other":
            out.append(i)
    return out


# --- the head start --------------------------------------------------------------------------------------------

class _Scan:
    """One SELECT run by connectorx on its own thread; ``result()`` waits for its Arrow table (None if it failed)."""

    def __init__(self, conn: str, sql: str):
        self._table = None
        self._thread = threading.Thread(target=self._run, args=(conn, sql), name="tracekit-head-start", daemon=True)
        self._thread.start()

    def _run(self, conn: str, sql: str) -> None:
        try:
            import connectorx

            self._table = connectorx.read_sql(conn, sql, return_type="arrow")
        except Exception:  # noqa: BLE001 - the reader runs the query again and meets the error there
            self._table = None

    def result(self):
        self._thread.join()
        return self._table


_PENDING: dict[tuple[str, str], _Scan] = {}  # (export URI, SQL) -> its scan, until the reader takes it


def take(uri: str, sql: str):
    """The Arrow table of ``sql`` on the export at ``uri`` if a head start scanned it (waiting for it), else None."""
    scan = _PENDING.pop((uri, sql), None)
    return None if scan is None else scan.result()


def pending(uri: str) -> bool:
    """Whether a head start is scanning a table of the export at ``uri``."""
    return any(u == uri for u, _ in list(_PENDING))


def big_export(path: Path) -> bool:
    """A regular file at least ``SMALL_FILE_BYTES`` big that starts as an SQLite database does (never an error, and
    nothing read from anything but a regular file: a pipe given as an argument keeps its bytes)."""
    import stat

    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode) or st.st_size < SMALL_FILE_BYTES:
            return False
        with open(path, "rb") as f:
            return f.read(16) == b"SQLite format 3\x00"
    except (OSError, ValueError):
        return False


def big_kineto(path: Path) -> bool:
    """A regular file at least ``SMALL_FILE_BYTES`` big that starts as a JSON object does, or a ``.json.gz`` that
    starts as a gzip stream does (a Kineto trace, by its first bytes; never an error, nothing read from anything but
    a regular file)."""
    import stat

    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode) or st.st_size < SMALL_FILE_BYTES:
            return False
        with open(path, "rb") as f:
            head = f.read(64)
    except (OSError, ValueError):
        return False
    if head[:2] == b"\x1f\x8b":
        return path.name.lower().endswith(".json.gz")
    return head.lstrip()[:1] == b"{"


# Polars' allocator (jemalloc), as polars sets it, gives freed memory back to the system soon after it is freed, and
# each page given back is faulted in again at its next use (on this VM ~2-13 µs a page: the host's free page
# reporting makes a fresh page a host fault too). Three things keep a big trace's columns' memory for reuse:
# - ``oversize_threshold:0``: allocations of 8 MiB or more (every column of a million-row frame) stay in the arenas.
#   jemalloc otherwise puts them in an arena of their own that gives every freed one back at once;
# - ``narenas:1``: one arena for all threads, so that memory one of polars' threads frees is reused by the next
#   that allocates (each thread draws on an arena of its own otherwise: 8 on two cores). Small allocations still go
#   through each thread's cache, and big ones lock the arena only to take or give back a block;
# - for an nsys export, freed pages kept 5 s instead of polars' 0.5-1 s (``dirty_decay_ms``): its analysis frees
#   and allocates ten-million-row columns for seconds. A Kineto trace keeps polars' decay (its peak is the target).
# Measured (benchmarks/results/HISTORY.md, issue 25 sixth and eighth passes), whole commands: nsys 10M kernels
# 655-670k -> 585-620k page faults and 2.2-2.35 -> 2.0-2.13 GB peak; 1M 111-116k -> 88k faults, 480-500 -> 395 MB;
# Kineto 1 GB 166-172k -> 136-140k faults, 353-372 -> 309-316 MB peak. See keep_freed_memory.
REUSE_FREED = "oversize_threshold:0,narenas:1"
KEEP_FREED = REUSE_FREED + ",dirty_decay_ms:5000,muzzy_decay_ms:5000"


# (the trace files of a directory that big_export / big_kineto can recognise: of tracekit.cli.output's list, not the
# gzipped exports and reports, whose analysis reads a decompressed or exported copy)
_TRACE_SUFFIXES = (".sqlite", ".json", ".json.gz")


def _files_of(path: Path, most: int = 64) -> list[Path]:
    """``path``; for a directory (``breakdown DIR``: several ranks), up to ``most`` of its trace files instead."""
    try:
        if not path.is_dir():
            return [path]
        with os.scandir(path) as it:
            return [Path(e.path) for _, e in zip(range(most), (e for e in it if e.name.endswith(_TRACE_SUFFIXES)))]
    except (OSError, ValueError):
        return []


# glibc's mmap threshold for :func:`give_back_big_blocks` (its own starting value, which it otherwise raises as blocks
# are freed, up to 32 MiB).
BIG_BLOCK = 128 * 1024


def give_back_big_blocks() -> None:
    """From now on, in this process and the processes it starts, every block of :data:`BIG_BLOCK` bytes or more
    that the C library hands out is a mapping of its own, given back to the system the moment it is freed (glibc's
    ``M_MMAP_THRESHOLD``, fixed; ``MALLOC_MMAP_THRESHOLD_`` for the children). Not where the variable is set already
    (the user's value stands).

    The SQLite engines' Arrow batches (~0.5 MB a column each at ten million kernels) are such blocks. glibc would
    otherwise raise its threshold as they are freed and keep what a dropped column held in its arenas until the next
    ``malloc_trim``: when the breakdown releases the kernel columns it has copied (``attribute(consume=True)``), their
    pages would not be free for the frame it is making. Measured (10M-kernel export, docs/performance.md): peak
    2.0-2.1 -> 1.75-1.81 GB. The pages come back warm: on the shared VMs of the benchmarks a page faulted in beyond
    what the host keeps backed (0.75 to over 2.75 GiB, from minute to minute) costs ~4-6x one within."""
    import ctypes

    if not sys.platform.startswith("linux") or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return
    os.environ["MALLOC_MMAP_THRESHOLD_"] = str(BIG_BLOCK)
    try:
        ctypes.CDLL("libc.so.6").mallopt(-3, BIG_BLOCK)  # (M_MMAP_THRESHOLD)
    except (OSError, AttributeError):  # (not glibc)
        pass


def keep_freed_memory(args: list[str]) -> bool:
    """In the console script's own process, before polars is imported: when an argument is a big nsys export, polars'
    allocator reuses freed memory and keeps it 5 s (``KEEP_FREED``); a big Kineto trace: reuses it (``REUSE_FREED``,
    polars' decay). Not where polars is loaded already or ``_RJEM_MALLOC_CONF`` is set, nor for ``tracekit
    capture`` (the workload it profiles would inherit the setting). A directory counts by its trace files. Children
    inherit the setting: the Kineto reader's second process, the ``--engine process`` pool's workers (16 rank files
    of 1M kernels: 1.15 M -> 0.5 M page faults, 13.5 -> 12.4 s on one worker). For a big export, the C library also
    gives the engines' blocks back when they are freed (:func:`give_back_big_blocks`).
    Whether it set one."""
    if "polars" in sys.modules or "_RJEM_MALLOC_CONF" in os.environ:
        return False
    words = [a for a in args if not a.startswith("-")]
    if words[:1] == ["capture"]:  # (its children are the profiled workload: never a setting of ours in their env)
        return False
    paths = [f for a in words for f in _files_of(Path(a))]
    if any(big_export(p) for p in paths):
        os.environ["_RJEM_MALLOC_CONF"] = KEEP_FREED
        give_back_big_blocks()
    elif any(big_kineto(p) for p in paths):
        os.environ["_RJEM_MALLOC_CONF"] = REUSE_FREED
    else:
        return False
    return True


def _wanted(path: Path) -> bool:
    """Whether the reader would read this file with connectorx first (big export, connectorx there, no override)."""
    import importlib.util

    if os.environ.get("TRACEKIT_SQLITE_ENGINES", "").strip():
        return False
    try:
        with open(path, "rb") as f:
            if f.read(16) != b"SQLite format 3\x00":
                return False
    except OSError:
        return False
    if is_small(path):
        return False
    return all(importlib.util.find_spec(m) is not None for m in ("connectorx", "pyarrow"))


def _queries(path: Path, kernel_dims: bool) -> list[str]:
    db = Export(path)
    try:
        out = []
        k = kernels_query(db, kernel_dims)
        if k is not None:
            out.append(k[0])
        if db.has("StringIds") and db.has(RUNTIME_TABLE):
            rows = db.con.execute("SELECT id, value FROM StringIds").fetchall()
            q = launches_query(db, api_ids(rows))
            if q is not None:
                out.append(q[0])
        return out
    finally:
        db.close()


def _import_arrow(without_numpy: bool) -> None:
    """Import pyarrow (connectorx builds its tables with it); ``without_numpy``: as if numpy were not installed,
    when neither is imported yet. pyarrow supports that (its numpy conversions then raise), and nothing on the
    command line's read-and-analyse path converts to numpy: importing numpy is ~0.06-0.1 s of the ~0.15 s that
    ``import pyarrow`` costs, before the scans can start. For the command line only (its process is its own): a
    library caller may use pyarrow with numpy afterwards."""
    import sys

    if without_numpy and "numpy" not in sys.modules and "pyarrow" not in sys.modules:
        sys.modules["numpy"] = None  # (an import of numpy raises ImportError while this is here)
        try:
            import pyarrow  # noqa: F401
        finally:
            del sys.modules["numpy"]
    import pyarrow  # noqa: F401


@contextmanager
def head_start(path, *, kernel_dims: bool = True, arrow_without_numpy: bool = False):
    """Inside this block, the kernel and runtime SELECTs of the nsys export ``path`` are being scanned on threads
    (when the reader would use connectorx for them); :func:`tracekit.readers.nsys.reader.read_nsys` called inside takes
    their tables. Anything the reader has not taken is dropped on leaving. Any problem with the file: no head
    start (the reader reports it as before). ``arrow_without_numpy``: see :func:`_import_arrow` (the command
    line's own process only). The block gets whether its scans are running (started here or by a block around it)."""
    started: list[tuple[str, str]] = []
    scanning = False
    try:
        path = Path(path)
        uri = export_uri(path)
        if pending(uri):  # (started by a block around this one: the same scans, not looked up again)
            scanning = True
        elif _wanted(path):
            queries = _queries(path, kernel_dims)
            queries = [q for q in queries if (uri, q) not in _PENDING]
            if queries:
                import connectorx  # noqa: F401  (here, before the threads: each would otherwise wait on the import)

                _import_arrow(arrow_without_numpy)

                conn = connectorx_uri(uri)
                for q in queries:
                    _PENDING[(uri, q)] = _Scan(conn, q)
                    started.append((uri, q))
            scanning = pending(uri)  # (by this block, or by one around it)
    except Exception:  # noqa: BLE001 - no head start; the reader reads (and reports) as it always does
        pass
    try:
        yield scanning
    finally:
        for key in started:
            _PENDING.pop(key, None)


__all__ = ["Export", "ENGINES", "SMALL_FILE_BYTES", "head_start", "take", "kernels_query", "launches_query"]
