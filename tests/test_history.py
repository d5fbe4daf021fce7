"""Run history: breakdown --save appends rows (sqlite-utils), tracekit history shows them and flags regressions."""

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
from tracekit.runs import PER_STEP_KEYS, history, save_runs

from conftest import DATA, shared

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
    assert json.loads(row["breakdown_json"]) == d
    assert row["timestamp"].endswith("+00:00")
    # Nothing written beside the input trace, only the db in tmp_path.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs.db"]


def test_history_flags_a_regression(tmp_path):
    db = tmp_path / "runs.db"
    fast = tracekit.breakdown(tracekit.load(SAXPY), step_range="^saxpy$")
    save_runs(db, [fast], timestamp="2026-01-01T00:00:00+00:00")
    save_runs(db, [fast], timestamp="2026-01-02T00:00:00+00:00")
    slow = tracekit.breakdown(tracekit.load(SAXPY), step_range="^saxpy$")
    slow = dataclasses.replace(slow, steps={**slow.steps, "mean_ms": slow.steps["mean_ms"] * 1.5})  # beyond +5% and above the p90
    save_runs(db, [slow], timestamp="2026-01-03T00:00:00+00:00")
    h = history(db)
    assert h["schema"] == "tracekit.history/1"
    assert [r["id"] for r in h["runs"]] == [1, 2, 3]
    assert h["runs"][1]["delta_mean_ms"] == 0 and not h["runs"][1]["regression"]
    assert h["runs"][2]["delta_rel"] == pytest.approx(0.5)
    assert h["regressions"] == [3]
    text = history_md(h)
    assert "**+50% REGRESSION**" in text
    assert history_md(history(db)) == text  # stable
    r = CliRunner().invoke(cli, ["history", str(db), "--format", "json", "--last", "2"])
    assert r.exit_code == 0, r.output
    assert [x["id"] for x in json.loads(r.output)["runs"]] == [2, 3]


def test_history_separates_traces_and_renders_every_format(tmp_path):
    db = tmp_path / "runs.db"
    save_runs(db, [tracekit.breakdown(tracekit.load(MFU)), tracekit.breakdown(tracekit.load(shared(SGLANG)))])
    h = history(db)
    assert [r["delta_mean_ms"] for r in h["runs"]] == [None, None]  # different paths: no comparison
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
    # a /2 run of the same trace appended to the old history
    r = CliRunner().invoke(cli, ["breakdown", str(SAXPY), "--step-range", "^saxpy$", "--save", str(db),
                                 "--format", "json"])
    assert r.exit_code == 0, r.output
    now = json.loads(r.output)
    h = history(db)
    old, new = h["runs"]
    v1 = json.loads(sqlite3.connect(V1_DB).execute("select breakdown_json from runs").fetchone()[0])
    assert v1["schema"] == "tracekit.breakdown/1" and old["schema"] == "tracekit.breakdown/1"
    assert new["schema"] == BREAKDOWN_SCHEMA
    # kept as saved: /1 counted the last of 5 saxpy steps, /2 excludes it (no following step)
    assert old["step_count"] == v1["steps"]["count"] == 5 and old["step_mean_ms"] == v1["steps"]["mean_ms"]
    assert new["step_count"] == now["steps"]["count"] == 4
    # a definition change is not a regression: runs of different schemas are not compared
    assert new["delta_mean_ms"] is None and not new["regression"] and h["regressions"] == []
    assert any(w.startswith("run(s) 1 were saved by an older tracekit (schema tracekit.breakdown/1)")
               for w in h["warnings"])
    text = history_md(h)
    assert "| 1 (/1) |" in text and "| 2 |" in text and "older tracekit" in text
    r = CliRunner().invoke(cli, ["history", str(db)])
    assert r.exit_code == 0 and "1 (/1)" in r.output
