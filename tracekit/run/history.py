"""The run history: ``breakdown --save runs.db`` appends each result, ``tracekit history runs.db`` shows them.

The database (sqlite-utils) has one table, ``runs``, one row per analysed trace (a
multi-rank breakdown appends one row per rank). Columns:

* ``id`` (autoincrement), ``timestamp`` (UTC, ISO 8601, seconds), ``path`` (as given),
  ``trace_bytes``, ``format``, ``producer_version``, ``graph_trace_mode``;
* ``git_commit``, ``git_branch``, ``git_dirty``: the git state of the current directory
  when the run was saved (null outside a git checkout), so a regression can be bisected
  to a commit; ``label``: ``$TRACEKIT_RUN_LABEL`` when set;
* ``device``, ``gpu_name``, ``peak_bw_gbps``;
* ``step_count``, ``step_excluded``, ``step_marker``, ``step_pattern``, ``step_mean_ms``,
  ``step_median_ms``, ``step_p10_ms``, ``step_p90_ms`` (the *traced* steps);
* ``reference_step_ms`` and ``reference_source``: the step every saving is stated against — the unprofiled step
  (``"flag"``: ``--measured-step-ms`` / ``--measured-tok-s``; ``"manifest"``: the capture's) where known, else the
  traced mean (``"traced"``). Rows saved before these columns existed get them from their ``breakdown_json``
  when they are read (``time_base`` of a ``/2`` result; the traced mean of a ``/1`` one);
* one ``<key>_ms`` column per ``per_step_ms`` key (``gemm_ms``, ..., ``idle_ms``);
* the roofline: ``weight_bytes_per_step``, ``floor_ms``, ``ceiling_tokens_per_s``,
  ``fraction_of_ceiling``, ``gemm_achieved_bw_gbps``;
* ``breakdown_json``: the full breakdown JSON (``tracekit.results.breakdown.SCHEMA``; rows saved by an older
  tracekit hold ``/1`` or ``/2``: ``history`` keeps them, shows them as saved with a note, and compares each run
  only with the previous run of the same trace path saved under the same schema, since the definitions changed).

The database is the only file tracekit writes besides the outputs a user names; it is opened read-only by
``history``. ``history`` compares each run's *reference step* with the previous run of the same trace path, the
same schema and the same reference source (an unprofiled step is never compared with a traced one, nor a
flag's with a manifest's), and flags a regression when it is more than 5% slower — and, for traced steps, also
slower than that run's p90 (so the profiled step-to-step noise alone does not flag it).
"""

from __future__ import annotations

import datetime as _dt
import os
import sqlite3
import subprocess
from pathlib import Path

from tracekit.categories import STEP_CATEGORIES
from tracekit.contract import BREAKDOWN_SCHEMA, HISTORY_SCHEMA, to_json
from tracekit.errors import CannotWrite, UnreadableInput, UnsupportedSchema

SCHEMA = HISTORY_SCHEMA  # "tracekit.history/2" (tracekit.contract names it once)
PER_STEP_KEYS = list(STEP_CATEGORIES)
REGRESSION_REL = 0.05
FLOAT_COLS = (["peak_bw_gbps", "step_mean_ms", "step_median_ms", "step_p10_ms", "step_p90_ms", "reference_step_ms",
               "floor_ms", "ceiling_tokens_per_s", "fraction_of_ceiling", "gemm_achieved_bw_gbps"]
              + [f"{k}_ms" for k in PER_STEP_KEYS])
COLUMNS = {"id": int, "timestamp": str, "path": str, "trace_bytes": int, "format": str, "producer_version": str,
           "graph_trace_mode": str, "git_commit": str, "git_branch": str, "git_dirty": int, "label": str,
           "device": int, "gpu_name": str, "step_count": int, "step_excluded": int, "step_marker": str,
           "step_pattern": str, "reference_source": str, "weight_bytes_per_step": int, "breakdown_json": str,
           **{c: float for c in FLOAT_COLS}}




def _git(*args) -> str | None:
    try:
        r = subprocess.run(["git", *args], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def git_state() -> dict:
    commit = _git("rev-parse", "HEAD")
    if commit is None:
        return {"git_commit": None, "git_branch": None, "git_dirty": None}
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {"git_commit": commit, "git_branch": _git("rev-parse", "--abbrev-ref", "HEAD"),
            "git_dirty": None if status is None else int(bool(status))}


def _now() -> str:
    """UTC now, to the second; ``$SOURCE_DATE_EPOCH`` when set (the reproducible-builds convention: the docs'
    examples are generated with it)."""
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    when = (_dt.datetime.fromtimestamp(int(epoch), _dt.timezone.utc) if epoch and epoch.isdigit()
            else _dt.datetime.now(_dt.timezone.utc))
    return when.replace(microsecond=0).isoformat()


def run_row(b, *, timestamp: str | None = None, git: dict | None = None) -> dict:
    """The ``runs`` row for one Breakdown."""
    from tracekit.results.diff import reference_step

    d = b.to_dict()
    ref, ref_source = reference_step(d)
    st, roof, src, gpu = d["steps"], d["roofline"], d["source"], d["gpu"]
    try:
        size = os.path.getsize(src["path"])
    except OSError:
        size = None
    row = {
        "timestamp": timestamp or _now(),
        "path": src["path"], "trace_bytes": size, "format": src["format"],
        "producer_version": src["producer_version"], "graph_trace_mode": src["graph_trace_mode"],
        **(git if git is not None else git_state()), "label": os.environ.get("TRACEKIT_RUN_LABEL") or None,
        "device": gpu["device"], "gpu_name": gpu["name"], "peak_bw_gbps": gpu["peak_bw_gbps"],
        "step_count": st["count"], "step_excluded": st["excluded"], "step_marker": st["marker"],
        "step_pattern": st["pattern"],
        **{f"step_{k}": st[k] for k in ("mean_ms", "median_ms", "p10_ms", "p90_ms")},
        "reference_step_ms": ref, "reference_source": ref_source,
        **{f"{k}_ms": d["per_step_ms"].get(k) for k in PER_STEP_KEYS},
        "weight_bytes_per_step": roof.get("weight_bytes_per_step"), "floor_ms": roof.get("floor_ms"),
        "ceiling_tokens_per_s": roof.get("ceiling_tokens_per_s"),
        "fraction_of_ceiling": roof.get("fraction_of_ceiling"),
        "gemm_achieved_bw_gbps": roof.get("gemm_achieved_bw_gbps"),
    }
    row["breakdown_json"] = to_json(d)
    return row


def save_runs(path, results, *, timestamp: str | None = None, git: dict | None = None) -> list[int]:
    """Append one row per Breakdown in ``results`` to ``path``'s ``runs`` table; returns the new ids.

    ``timestamp`` and ``git`` (``git_commit``, ``git_branch``, ``git_dirty``) default to now (or
    ``$SOURCE_DATE_EPOCH``) and the git state of the current directory; give them to record a run reproducibly.
    """
    import sqlite_utils

    path = Path(path)
    git = git_state() if git is None else git
    rows = [run_row(b, timestamp=timestamp, git=git) for b in results]
    try:
        db = sqlite_utils.Database(path)
        table = db["runs"]
        if not table.exists():
            table.create(COLUMNS, pk="id")
        ids = []
        for row in rows:  # one row per trace (a handful), not per event
            ids.append(table.insert(row, alter=True).last_pk)
        db.conn.close()
    except sqlite3.DatabaseError as e:
        raise CannotWrite(f"{path}: cannot save the run there ({e}); pass --save a SQLite file (new or made by "
                            f"tracekit)")
    return ids


def load_runs(path, *, path_contains: str | None = None, last: int | None = None):
    """The ``runs`` table as a polars frame (oldest first), with ``schema``, ``reference_step_ms`` /
    ``reference_source`` for every row, and ``delta_ms``, ``delta_rel`` and ``regression`` against the previous run
    of the same trace path, schema and reference source."""
    import polars as pl

    path = Path(path)
    if not path.is_file():
        raise UnreadableInput(f"{path}: no such run history; create one with `tracekit breakdown TRACE --save {path}`")
    try:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        cur = conn.execute("select * from runs order by id")
        cols = [c[0] for c in cur.description]
        data = cur.fetchall()
        conn.close()
    except sqlite3.DatabaseError as e:
        raise UnsupportedSchema(f"{path}: not a tracekit run history ({e})")
    schema = {c: (pl.Float64 if c in FLOAT_COLS else pl.Int64 if COLUMNS.get(c) is int else pl.String)
              for c in cols}
    df = pl.DataFrame(data, schema=schema, orient="row")
    # the schema each run was saved under (its JSON's first key): a definition change is not a regression
    df = df.with_columns(schema=pl.col("breakdown_json").str.extract(r'"schema"\s*:\s*"(tracekit\.breakdown/\d+)"'))
    df = _with_reference(df)
    # each run against the previous run of the same trace, schema and reference source
    by = ("path", "schema", "reference_source")
    prev = pl.col("reference_step_ms").shift(1).over(*by)
    prev_p90 = pl.col("step_p90_ms").shift(1).over(*by)
    df = df.with_columns(
        prev_source=pl.col("reference_source").shift(1).over("path", "schema"),
        delta_ms=pl.col("reference_step_ms") - prev,
        delta_rel=(pl.col("reference_step_ms") - prev) / prev,
    ).with_columns(
        regression=((pl.col("delta_rel") > REGRESSION_REL)
                    & ((pl.col("reference_source") != "traced") | (pl.col("reference_step_ms") > prev_p90)))
        .fill_null(False))
    if path_contains:
        df = df.filter(pl.col("path").str.contains(path_contains, literal=True))
    if last:
        df = df.tail(last)
    return df


def _with_reference(df):
    """``reference_step_ms`` / ``reference_source`` for every row; rows saved before those columns existed take
    them from their JSON (a ``time_base`` of ``/2``; a ``/1`` result had none: its traced mean)."""
    import polars as pl

    for c, dtype in (("reference_step_ms", pl.Float64), ("reference_source", pl.String)):
        if c not in df.columns:
            df = df.with_columns(pl.lit(None, dtype).alias(c))
    js = pl.col("breakdown_json")
    unprofiled = js.str.json_path_match("$.time_base.unprofiled_step_ms").cast(pl.Float64)
    source = js.str.json_path_match("$.time_base.unprofiled_source")
    return df.with_columns(
        reference_step_ms=pl.coalesce("reference_step_ms", unprofiled, "step_mean_ms"),
        reference_source=pl.coalesce("reference_source",
                                     pl.when(unprofiled.is_not_null()).then(source.fill_null("flag")),
                                     pl.lit("traced")))


def history(path, *, path_contains: str | None = None, last: int | None = None) -> dict:
    """The ``tracekit.history/2`` dict: ``{"schema", "db", "breakdown_schema", "runs": [...], "regressions": [ids],
    "warnings"}`` (``breakdown_schema``: what ``--save`` writes now; runs of other schemas were saved by an older
    tracekit).

    Each run carries every column but ``breakdown_json``, plus its ``schema``, ``delta_ms`` / ``delta_rel`` (its
    reference step against the previous run of the same trace, schema and reference source; null when there is
    none) and ``regression``."""
    import polars as pl

    df = load_runs(path, path_contains=path_contains, last=last)
    current = BREAKDOWN_SCHEMA  # what --save writes now
    keep = [c for c in df.columns if c not in ("breakdown_json", "prev_source")]
    runs = df.select(keep).to_dicts()
    warnings = [] if runs else ["the history holds no runs" + (" matching the filter" if path_contains else "")]
    old = [r for r in runs if r["schema"] != current]
    for schema in dict.fromkeys(r["schema"] for r in old):
        ids = [r["id"] for r in old if r["schema"] == schema]
        listed = ", ".join(map(str, ids[:10])) + (f" and {len(ids) - 10} more" if len(ids) > 10 else "")
        warnings.append(f"run(s) {listed} were saved by an older tracekit (schema {schema or 'unknown'}): shown "
                        "as saved, under that version's definitions (e.g. the last step counted, savings against the "
                        "traced step); Δ compares each run only with the previous one of the same schema")
    switched = df.filter(pl.col("prev_source").is_not_null() & (pl.col("prev_source") != pl.col("reference_source")))
    if switched.height:
        ids = ", ".join(map(str, switched["id"].to_list()[:10]))
        warnings.append(f"run(s) {ids}: the reference step's source differs from the previous run of the same trace "
                        "(an unprofiled step is not compared with a traced one, nor a --measured-step-ms with a "
                        "manifest's): Δ compares runs of the same source only")
    return {"schema": SCHEMA, "db": str(path), "breakdown_schema": current, "runs": runs,
            "regressions": df.filter("regression")["id"].to_list(), "warnings": warnings}
