"""What ``tracekit stats`` reads from an nsys export beyond the :class:`~tracekit.trace.Trace`: every CUDA API call
(the Trace keeps only the calls that launch work or synchronise) and the NVTX ranges as ``nsys stats`` names them.

Both mirror the report scripts of ``nsys stats`` (``cuda_api_sum``, ``nvtx_sum``), so their sums equal nsys':

* **API calls** (``cuda_api_sum``): every row of ``CUPTI_ACTIVITY_KIND_RUNTIME``, grouped by its name id; the name
  shown loses a trailing ``_vNNNN`` (nsys strips the last six characters when they start with ``_v``: so
  ``cudaLaunchKernel_v7000`` is ``cudaLaunchKernel`` while ``cudaLaunchKernelExC_v11060`` stays whole, as nsys prints
  it). One difference, on purpose: nsys 2022.2 writes each backtraced call twice (``eventClass`` 67, an unversioned
  copy, see ../shared/reference/nsys-sqlite.md §6.2); the copy is not counted.
* **NVTX ranges** (``nvtx_sum``): push/pop and start/end ranges (event types 59, 60 and the ``.nvtxt`` imports 70,
  71); a range's name is its registered string or its text, after ``<domain>:`` when its domain was created with a
  name (``NvtxDomainCreate`` rows of the same process); a range with no end lasts to the last NVTX timestamp of the
  export; the style is ``PushPop`` or ``StartEnd``.

Read-only as the reader (the same ``_Db``: ``mode=ro&immutable=1``); a missing table means no such events.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from tracekit.readers.nsys.reader import _Db, _resolve, _strings
from tracekit.readers.nsys.scan import RUNTIME_TABLE

# nsys stats' own event type ids (its report scripts name them so: EVENT_TYPE_NVTX_*)
_PUSHPOP, _STARTEND, _NVTXT_PUSHPOP, _NVTXT_STARTEND, _DOMAIN_CREATE = 59, 60, 70, 71, 75
_BACKTRACE_COPY = 67  # nsys 2022.2's duplicate of a backtraced runtime call
_PROCESS_BITS = 0x0000FFFFFF000000  # globalTid's process id bits (nvtx_sum joins domains on them)


def export_file(path: str | Path) -> Path:
    """The SQLite file of a trace path: the export itself, or a gzipped export's decompressed copy in the cache
    (made once by the read: :func:`tracekit.readers.nsys.sqlitegz.decompress_to_cache`)."""
    from tracekit.readers.nsys import GZIP_MAGIC

    path = Path(path)
    with open(path, "rb") as f:
        head = f.read(2)
    if head == GZIP_MAGIC:
        from tracekit.readers.nsys.sqlitegz import decompress_to_cache

        return decompress_to_cache(path)
    return path


def api_calls(path: str | Path) -> pl.DataFrame:
    """Every CUDA runtime / driver API call of the export: ``name`` (as ``cuda_api_sum`` shows it: see the module
    docstring), ``name_id`` (what nsys groups by) and ``dur`` (ns)."""
    db = _Db(export_file(path))
    try:
        if not db.has(RUNTIME_TABLE):
            return pl.DataFrame(schema={"name_id": pl.Int64, "dur": pl.Int64, "name": pl.String})
        cols = set(db.columns(RUNTIME_TABLE))
        where = f" WHERE eventClass != {_BACKTRACE_COPY}" if "eventClass" in cols else ""
        calls = db.frame(f"SELECT nameId, end - start FROM {RUNTIME_TABLE}{where}",
                         {"name_id": pl.Int64, "dur": pl.Int64}, RUNTIME_TABLE)
        strings = _strings(db)
    finally:
        db.close()
    names = strings.filter(pl.col("id").is_in(calls["name_id"].unique().implode())).select(
        name_id="id", name=pl.when(pl.col("value").str.slice(-6, 2) == "_v")
        .then(pl.col("value").str.slice(0, pl.col("value").str.len_chars() - 6)).otherwise(pl.col("value")))
    return calls.join(names, on="name_id", how="left").with_columns(pl.col("name").fill_null("<unknown api>"))


def nvtx_ranges(path: str | Path) -> pl.DataFrame:
    """The NVTX ranges of the export as ``nvtx_sum`` counts them: ``name`` (``domain:text`` or ``text``), ``style``
    (``PushPop`` | ``StartEnd``) and ``dur`` (ns)."""
    schema = {"name": pl.String, "style": pl.String, "dur": pl.Int64}
    db = _Db(export_file(path))
    try:
        if not db.has("NVTX_EVENTS"):
            return pl.DataFrame(schema=schema)
        cols = set(db.columns("NVTX_EVENTS"))
        text_id = "textId" if "textId" in cols else "NULL"
        domain = "domainId" if "domainId" in cols else "0"
        types = ", ".join(map(str, (_PUSHPOP, _STARTEND, _NVTXT_PUSHPOP, _NVTXT_STARTEND, _DOMAIN_CREATE)))
        ev = db.frame(f"SELECT start, end, eventType, text, {text_id}, {domain}, globalTid & {_PROCESS_BITS} "
                      f"FROM NVTX_EVENTS WHERE eventType IN ({types})",
                      {"start": pl.Int64, "end": pl.Int64, "type": pl.Int64, "text": pl.String, "text_id": pl.Int64,
                       "domain_id": pl.Int64, "proc": pl.Int64}, "NVTX_EVENTS")
        last = db.frame("SELECT max(max(start), max(end)) FROM NVTX_EVENTS", {"m": pl.Int64}, "NVTX_EVENTS")["m"][0]
        strings = _strings(db)
    finally:
        db.close()
    ev = _resolve(ev, strings, "text_id", "registered")
    # a domain's name: its first NvtxDomainCreate row in the process (nsys: min(start) per domain and thread)
    domains = (ev.filter(pl.col("type") == _DOMAIN_CREATE).sort("start")
               .group_by("domain_id", "proc", maintain_order=True)
               .agg(domain=pl.coalesce("registered", "text").first()))
    rng = ev.filter(pl.col("type") != _DOMAIN_CREATE).join(domains, on=["domain_id", "proc"], how="left")
    text = pl.coalesce("registered", "text")
    return rng.select(
        name=pl.when(pl.col("domain").is_not_null()).then(pl.col("domain") + ":" + text).otherwise(text).fill_null(""),
        style=pl.when(pl.col("type").is_in([_PUSHPOP, _NVTXT_PUSHPOP])).then(pl.lit("PushPop"))
        .otherwise(pl.lit("StartEnd")),
        dur=pl.col("end").fill_null(pl.lit(last, pl.Int64)) - pl.col("start"))


def runtime_calls(path: str | Path) -> pl.DataFrame:
    """Every CUDA runtime / driver API call of the export with its thread and correlation (what ``export
    --perfetto`` draws on the host threads): ``start``, ``end``, ``pid``, ``tid``, ``correlation``, ``name`` (the
    versioned name, as the export stores it). nsys 2022.2's backtrace copies are left out (as in :func:`api_calls`)."""
    from tracekit.readers.nsys.scan import PID, TID

    schema = {"start": pl.Int64, "end": pl.Int64, "pid": pl.Int64, "tid": pl.Int64, "correlation": pl.Int64,
              "name_id": pl.Int64}
    db = _Db(export_file(path))
    try:
        if not db.has(RUNTIME_TABLE):
            return pl.DataFrame(schema=schema).drop("name_id").with_columns(name=pl.lit(None, pl.String))
        cols = set(db.columns(RUNTIME_TABLE))
        where = f" WHERE eventClass != {_BACKTRACE_COPY}" if "eventClass" in cols else ""
        calls = db.frame(f"SELECT start, end, {PID.format(c='globalTid')}, {TID.format(c='globalTid')}, correlationId, "
                         f"nameId FROM {RUNTIME_TABLE}{where}", schema, RUNTIME_TABLE)
        strings = _strings(db)
    finally:
        db.close()
    return _resolve(calls, strings, "name_id", "name").with_columns(pl.col("name").fill_null("<unknown api>"))
