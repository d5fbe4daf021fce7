"""`.nsys-rep` input: converted with the user's nsys into a cache dir, never beside the report; a clear error
without nsys. A stand-in `nsys` script (it copies a real export) plays the converter."""

from __future__ import annotations

import json
import os
import stat

from click.testing import CliRunner

from tracekit.cli import cli

from conftest import DATA

REAL = DATA / "nsys" / "nsysai_mock_2026.1.sqlite"


def fake_nsys(tmp_path):
    script = tmp_path / "bin" / "nsys"
    script.parent.mkdir()
    # nsys export --type sqlite --force-overwrite true -o OUT REPORT
    script.write_text(f"#!/bin/sh\nwhile [ $# -gt 2 ]; do [ \"$1\" = -o ] && out=$2; shift; done\n"
                      f"cp '{REAL}' \"$out\"\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


def test_nsys_rep_is_exported_to_the_cache_not_beside(tmp_path, monkeypatch):
    report_dir = tmp_path / "reports"
    report_dir.mkdir()
    rep = report_dir / "run.nsys-rep"
    rep.write_bytes(b"not really a report; the stand-in nsys ignores it")
    monkeypatch.setenv("NSYS", str(fake_nsys(tmp_path)))
    monkeypatch.setenv("TRACEKIT_CACHE", str(tmp_path / "cache"))
    r = CliRunner().invoke(cli, ["info", str(rep), "--format", "json"])
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["counts"]["kernels"] == 2  # the real export's two kernels
    assert sorted(os.listdir(report_dir)) == ["run.nsys-rep"]  # nothing written beside the report
    assert len(list((tmp_path / "cache").glob("*.sqlite"))) == 1
    r = CliRunner().invoke(cli, ["info", str(rep), "--format", "json"])  # second time: from the cache
    assert r.exit_code == 0 and len(list((tmp_path / "cache").glob("*.sqlite"))) == 1


def test_nsys_rep_without_nsys_says_what_to_run(tmp_path, monkeypatch):
    rep = tmp_path / "run.nsys-rep"
    rep.write_bytes(b"x")
    monkeypatch.delenv("NSYS", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no nsys anywhere
    r = CliRunner().invoke(cli, ["breakdown", str(rep)])
    assert r.exit_code == 2
    line = r.stderr.strip()
    assert line.startswith("tracekit: error: ") and "nsys export --type sqlite" in line and "\n" not in line
