"""Run history: breakdown --save appends rows (sqlite-utils), tracekit history shows them and flags regressions on
reference steps of the same source."""

from __future__ import annotations

import dataclasses
import json
import sqlite3

import pytest
from click.testing import CliRunner

import tracekit
from tracekit.categories import BREAKDOWN_SCHEMA
from tracekit.cli import cli
from tracekit.report.history import history_md
from tracekit.run.history import PER_STEP_KEYS, history, save_runs

from conftest import DATA, sample, shared

EAGER = "hf-small-eager/trace.sqlite"

MFU = DATA / "nsys" / "nsysai_mfu_2gpu_before_2026.2.sqlite"
SAXPY = DATA / "nsys" / "pipit_saxpy_2022.2.sqlite"
SGLANG = "TraceLens/tests/traces/inference/sglang_decode/sglang_Qwen3-8B_decode.json.gz"


def test_breakdown_save_appends_rows_with_the_json_numbers(tmp_path):
    db = tmp_path / "runs.db"
    runner = CliRunner()
    for _ in range(2):
        r = runner.invoke(cli, ["breakdown", str(MFU), "--save", str(db), "--format", "json"])
        assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    con = sqlite3.connect(db)
    con.row_factory = sqlite3.Row
    rows = con.execute("select * from runs order by id").fetchall()
    assert [row["id"] for row in rows] == [1, 2]
    row = rows[-1]
    assert row["path"] == str(MFU) and row["format"] == "nsys-sqlite"
    assert row["step_count"] == d["steps"]["count"] == 15  # inferred: one 163-launch DiT block per host read; the last excluded
    for k in ("mean_ms", "median_ms", "p10_ms", "p90_ms"):
        assert row[f"step_{k}"] == d["steps"][k]
    for k in PER_STEP_KEYS:
        assert row[f"{k}_ms"] == d["per_step_ms"][k]
    # no unprofiled time for this trace: its reference step is the traced mean, and the row says so
    assert (row["reference_step_ms"], row["reference_source"]) == (d["steps"]["mean_ms"], "traced")
    assert json.loads(row["breakdown_json"]) == d
    assert row["timestamp"].endswith("+00:00")
    # Nothing written beside the input trace, only the db in tmp_path.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs.db"]


def slower(b, factor: float):
    """``b`` with its traced steps (and the traced reference) ``factor`` times longer."""
    tb = dataclasses.replace(b.time_base, traced_step_ms=b.time_base.traced_step_ms * factor,
                             reference_step_ms=b.time_base.reference_step_ms * factor)
    return dataclasses.replace(b, steps={**b.steps, "mean_ms": b.steps["mean_ms"] * factor}, time_base=tb)


def test_history_flags_a_regression(tmp_path):
    db = tmp_path / "runs.db"
    fast = tracekit.breakdown(tracekit.load(SAXPY), step_range="^saxpy$")
    save_runs(db, [fast], timestamp="2026-01-01T00:00:00+00:00")
    save_runs(db, [fast], timestamp="2026-01-02T00:00:00+00:00")
    save_runs(db, [slower(fast, 1.5)], timestamp="2026-01-03T00:00:00+00:00")  # beyond +5% and above the p90
    h = history(db)
    assert h["schema"] == "tracekit.history/2"
    assert [r["id"] for r in h["runs"]] == [1, 2, 3]
    assert h["runs"][1]["delta_ms"] == 0 and not h["runs"][1]["regression"]
    assert h["runs"][2]["delta_rel"] == pytest.approx(0.5) and h["runs"][2]["reference_source"] == "traced"
    assert h["regressions"] == [3]
    text = history_md(h)
    assert "**+50% REGRESSION**" in text
    assert history_md(history(db)) == text  # stable
    r = CliRunner().invoke(cli, ["history", str(db), "--format", "json", "--last", "2"])
    assert r.exit_code == 0, r.output
    assert [x["id"] for x in json.loads(r.output)["runs"]] == [2, 3]


def test_history_stores_and_compares_reference_steps(tmp_path):
    """The bundled eager capture has a manifest: its unprofiled step is the stored and compared reference. A
    slower unprofiled step is a regression although the traced steps are the same; a traced or flag-given
    reference of the same trace is never compared with it."""
    path = sample(EAGER)
    unprofiled = json.loads((path.parent / "manifest.json").read_text())["unprofiled_step_ms"]
    trace = tracekit.load(path)
    b = tracekit.breakdown(trace)
    db = tmp_path / "runs.db"
    save_runs(db, [b, b])
    slow_trace = dataclasses.replace(trace, manifest={**trace.manifest, "unprofiled_step_ms": unprofiled * 1.1})
    save_runs(db, [tracekit.breakdown(slow_trace)])                                   # 3: +10% unprofiled
    save_runs(db, [tracekit.breakdown(dataclasses.replace(trace, manifest=None))])    # 4: traced only
    save_runs(db, [tracekit.breakdown(trace, measured_step_ms=unprofiled * 2)])      # 5: a flag's
    con = sqlite3.connect(db)
    stored = con.execute("select reference_step_ms, reference_source, step_mean_ms from runs order by id").fetchall()
    con.close()
    assert [r[:2] for r in stored] == [(unprofiled, "manifest"), (unprofiled, "manifest"),
                                       (pytest.approx(unprofiled * 1.1), "manifest"), (stored[3][2], "traced"),
                                       (unprofiled * 2, "flag")]
    assert stored[2][2] == stored[0][2]  # the traced steps did not move
    h = history(db)
    runs = {r["id"]: r for r in h["runs"]}
    assert runs[2]["delta_ms"] == 0 and runs[3]["delta_rel"] == pytest.approx(0.1)
    assert h["regressions"] == [3]  # an unprofiled step needs no p90 guard: it carries no profiler noise
    assert runs[4]["delta_ms"] is None and runs[5]["delta_ms"] is None  # other sources: not compared
    assert any(w.startswith("run(s) 4, 5: the reference step's source differs") for w in h["warnings"])
    text = history_md(h)
    assert f"| {unprofiled:.3f} m |" in text and f"| {unprofiled * 2:,.3f} f |" in text
    assert "t = traced (no unprofiled time)" in text


def test_history_table_fits_80_columns(tmp_path):
    import io

    from rich.console import Console

    from tracekit.report.history import render_history

    db = tmp_path / "runs.db"
    fast = tracekit.breakdown(tracekit.load(MFU))
    save_runs(db, [fast, slower(fast, 1.5)])
    buf = io.StringIO()
    render_history(history(db), Console(file=buf, width=80, color_system=None))
    lines = buf.getvalue().splitlines()
    assert max(map(len, lines)) <= 80 and "…" not in buf.getvalue()
    assert any("+50% REGRESSION" in line for line in lines)


def test_history_separates_traces_and_renders_every_format(tmp_path):
    db = tmp_path / "runs.db"
    save_runs(db, [tracekit.breakdown(tracekit.load(MFU)), tracekit.breakdown(tracekit.load(shared(SGLANG)))])
    h = history(db)
    assert [r["delta_ms"] for r in h["runs"]] == [None, None]  # different paths: no comparison
    assert h["runs"][1]["gemm_ms"] == pytest.approx(5.782, abs=5e-4)
    runner = CliRunner()
    for fmt in ("table", "md", "json"):
        r = runner.invoke(cli, ["history", str(db), "--format", fmt])
        assert r.exit_code == 0, r.output
    r = runner.invoke(cli, ["history", str(db), "--path-contains", "sglang", "--format", "json"])
    assert [x["format"] for x in json.loads(r.output)["runs"]] == ["kineto-json"]


def test_history_errors(tmp_path):
    r = CliRunner().invoke(cli, ["history", str(tmp_path / "none.db")])
    assert r.exit_code == 2 and r.output.startswith("tracekit: error: ") and "--save" in r.output
    assert not (tmp_path / "none.db").exists()  # reading never creates the db
    bad = tmp_path / "bad.db"
    bad.write_text("not sqlite")
    r = CliRunner().invoke(cli, ["history", str(bad)])
    assert r.exit_code == 2 and r.output.count("\n") == 1


def test_history_md_escapes_paths(tmp_path):
    db = tmp_path / "runs.db"
    b = tracekit.breakdown(tracekit.load(SAXPY), step_range="^saxpy$")
    b = dataclasses.replace(b, source={**b.source, "path": "/x/<img src=x onerror=alert(1)>|*.sqlite"})
    save_runs(db, [b])
    text = history_md(history(db))
    assert "<img" not in text and "&lt;img src=x onerror=alert(1)&gt;\\|\\*.sqlite" in text


V1_DB = DATA / "saved" / "runs_v1.db"  # saved by tracekit before breakdown/2 (tests/data/saved/README.md)


def test_history_keeps_rows_saved_as_v1_with_a_note(tmp_path):
    db = tmp_path / "runs.db"
    db.write_bytes(V1_DB.read_bytes())
    # a run of the current schema, of the same trace, appended to the old history
    r = CliRunner().invoke(cli, ["breakdown", str(SAXPY), "--step-range", "^saxpy$", "--save", str(db),
                                 "--format", "json"])
    assert r.exit_code == 0, r.output
    now = json.loads(r.output)
    h = history(db)
    old, new = h["runs"]
    v1 = json.loads(sqlite3.connect(V1_DB).execute("select breakdown_json from runs").fetchone()[0])
    assert v1["schema"] == "tracekit.breakdown/1" and old["schema"] == "tracekit.breakdown/1"
    assert new["schema"] == h["breakdown_schema"] == BREAKDOWN_SCHEMA
    # kept as saved: /1 counted the last of 5 saxpy steps, /2 excludes it (no following step)
    assert old["step_count"] == v1["steps"]["count"] == 5 and old["step_mean_ms"] == v1["steps"]["mean_ms"]
    assert new["step_count"] == now["steps"]["count"] == 4
    # a definition change is not a regression: runs of different schemas are not compared
    assert new["delta_ms"] is None and not new["regression"] and h["regressions"] == []
    assert (old["reference_step_ms"], old["reference_source"]) == (v1["steps"]["mean_ms"], "traced")  # /1: no time base
    assert any(w.startswith("run(s) 1 were saved by an older tracekit (schema tracekit.breakdown/1)")
               for w in h["warnings"])
    text = history_md(h)
    assert "| 1 (/1) |" in text and "| 2 |" in text and "older tracekit" in text
    r = CliRunner().invoke(cli, ["history", str(db)])
    assert r.exit_code == 0 and "1 (/1)" in r.output
