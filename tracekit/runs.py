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
  ``step_median_ms``, ``step_p10_ms``, ``step_p90_ms``;
* one ``<key>_ms`` column per ``per_step_ms`` key (``gemm_ms``, ..., ``idle_ms``);
* the roofline: ``weight_bytes_per_step``, ``floor_ms``, ``ceiling_tokens_per_s``,
  ``fraction_of_ceiling``, ``gemm_achieved_bw_gbps``;
* ``breakdown_json``: the full breakdown JSON (``tracekit.breakdown/3``; rows saved by an older tracekit hold
  ``/1``: ``history`` keeps them, shows them as saved with a note, and compares each run only with the
  previous run of the same trace path saved under the same schema, since the definitions changed).

The database is the only file tracekit writes besides the outputs a user names; it is
opened read-only by ``history``. ``history`` flags a run as a regression when its mean
step is more than 5% slower than the previous run of the same trace path *and* slower
than that run's p90 (so step-to-step noise alone does not flag it).
"""

from __future__ import annotations

import datetime as _dt
import os
import sqlite3
import subprocess
from pathlib import Path

from tracekit.categories import BREAKDOWN_SCHEMA, STEP_CATEGORIES  # BREAKDOWN_SCHEMA: what --save writes
from tracekit.errors import TracekitError

SCHEMA = "tracekit.history/1"
PER_STEP_KEYS = list(STEP_CATEGORIES)
REGRESSION_REL = 0.05
FLOAT_COLS = (["peak_bw_gbps", "step_mean_ms", "step_median_ms", "step_p10_ms", "step_p90_ms", "floor_ms",
               "ceiling_tokens_per_s", "fraction_of_ceiling", "gemm_achieved_bw_gbps"]
              + [f"{k}_ms" for k in PER_STEP_KEYS])
COLUMNS = {"id": int, "timestamp": str, "path": str, "trace_bytes": int, "format": str, "producer_version": str,
           "graph_trace_mode": str, "git_commit": str, "git_branch": str, "git_dirty": int, "label": str,
           "device": int, "gpu_name": str, "step_count": int, "step_excluded": int, "step_marker": str,
           "step_pattern": str, "weight_bytes_per_step": int, "breakdown_json": str,
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
    d = b.to_dict()
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
        **{f"{k}_ms": d["per_step_ms"].get(k) for k in PER_STEP_KEYS},
        "weight_bytes_per_step": roof.get("weight_bytes_per_step"), "floor_ms": roof.get("floor_ms"),
        "ceiling_tokens_per_s": roof.get("ceiling_tokens_per_s"),
        "fraction_of_ceiling": roof.get("fraction_of_ceiling"),
        "gemm_achieved_bw_gbps": roof.get("gemm_achieved_bw_gbps"),
    }
    from tracekit.report import to_json

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
        raise TracekitError(f"{path}: cannot save the run there ({e}); pass --save a SQLite file (new or made by "
                            f"tracekit)")
    return ids


def load_runs(path, *, path_contains: str | None = None, last: int | None = None):
    """The ``runs`` table as a polars frame (oldest first), with ``delta_mean_ms``, ``delta_rel`` and
    ``regression`` against the previous run of the same trace path."""
    import polars as pl

    path = Path(path)
    if not path.is_file():
        raise TracekitError(f"{path}: no such run history; create one with `tracekit breakdown TRACE --save {path}`")
    try:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        cur = conn.execute("select * from runs order by id")
        cols = [c[0] for c in cur.description]
        data = cur.fetchall()
        conn.close()
    except sqlite3.DatabaseError as e:
        raise TracekitError(f"{path}: not a tracekit run history ({e})")
    schema = {c: (pl.Float64 if c in FLOAT_COLS else pl.Int64 if COLUMNS.get(c) is int else pl.String)
              for c in cols}
    df = pl.DataFrame(data, schema=schema, orient="row")
    # the schema each run was saved under (its JSON's first key): a definition change is not a regression
    df = df.with_columns(schema=pl.col("breakdown_json").str.extract(r'"schema"\s*:\s*"(tracekit\.breakdown/\d+)"'))
    prev_mean = pl.col("step_mean_ms").shift(1).over("path", "schema")
    prev_p90 = pl.col("step_p90_ms").shift(1).over("path", "schema")
    df = df.with_columns(
        delta_mean_ms=pl.col("step_mean_ms") - prev_mean,
        delta_rel=(pl.col("step_mean_ms") - prev_mean) / prev_mean,
    ).with_columns(
        regression=((pl.col("delta_rel") > REGRESSION_REL) & (pl.col("step_mean_ms") > prev_p90)).fill_null(False))
    if path_contains:
        df = df.filter(pl.col("path").str.contains(path_contains, literal=True))
    if last:
        df = df.tail(last)
    return df


def history(path, *, path_contains: str | None = None, last: int | None = None) -> dict:
    """The ``tracekit.history/1`` dict: ``{"schema", "db", "runs": [...], "regressions": [ids], "warnings"}``."""
    df = load_runs(path, path_contains=path_contains, last=last)
    keep = [c for c in df.columns if c != "breakdown_json"]
    runs = df.select(keep).to_dicts()
    warnings = [] if runs else ["the history holds no runs" + (" matching the filter" if path_contains else "")]
    old = [r["id"] for r in runs if r["schema"] != BREAKDOWN_SCHEMA]
    if old:
        ids = ", ".join(map(str, old[:10])) + (f" and {len(old) - 10} more" if len(old) > 10 else "")
        warnings.append(f"run(s) {ids} were saved by an older tracekit (schema "
                        f"{next(r['schema'] for r in runs if r['schema'] != BREAKDOWN_SCHEMA) or 'unknown'}): shown "
                        "as saved, under that version's definitions (e.g. the last step counted, savings against the "
                        "traced step); Δ compares each run only with the previous one of the same schema")
    return {"schema": SCHEMA, "db": str(path), "runs": runs,
            "regressions": df.filter("regression")["id"].to_list(), "warnings": warnings}
