"""Read-only guarantee: no command modifies its input or writes anything beside it.

An nsys export and a Kineto trace, each copied into its own directory, go through every
command and format (info, kernels, breakdown in every format and with -o, --save, diff,
plot, export --perfetto, history); after each, the input's sha256 and mtime are unchanged
and the directory holds exactly what it held before (no -journal/-wal/-shm, no cache, no
sidecar). Outputs the user asks for go to a separate directory.
"""

from __future__ import annotations

import hashlib
import os
import shutil

import pytest

from tracekit.cli import cli

from _robust import assert_clean, run_cli
from conftest import DATA

TRACES = {
    "nsys": DATA / "nsys" / "nsysai_mfu_2gpu_before_2026.2.sqlite",
    "kineto": DATA / "kineto" / "hta_rocm_mi250.json.gz",
}


def _state(path):
    st = os.stat(path)
    return (hashlib.sha256(path.read_bytes()).hexdigest(), st.st_mtime_ns, st.st_size,
            sorted(os.listdir(path.parent)))


def _commands(trace, out):
    cmds = []
    for fmt in ("table", "md", "json"):
        cmds.append(["info", "--format", fmt, trace])
    for cmd in ("kernels", "breakdown"):
        for fmt in ("table", "md", "json", "csv"):
            cmds.append([cmd, "--format", fmt, trace])
            cmds.append([cmd, "--format", fmt, "-o", out / f"{cmd}.{fmt}", trace])
    for fmt in ("md", "json", "csv"):
        cmds.append(["stats", "--format", fmt, "-o", out / f"stats.{fmt}", trace])
    cmds.append(["export", trace, "--perfetto", out / "export.perfetto.json"])
    cmds.append(["info", "--device", "0", trace])
    cmds.append(["breakdown", "--save", out / "runs.db", trace])
    cmds.append(["history", out / "runs.db"])
    for name in ("diff", "plot", "export"):
        if name not in cli.commands:  # optional commands: tested where present
            continue
        if name == "diff":
            cmds += [["diff", trace, trace], ["diff", "--format", "json", trace, trace]]
        elif name == "plot":
            cmds += [["plot", trace, "-o", out / f"plot{ext}"] for ext in (".png", ".svg", ".html")]
        else:
            cmds.append(["export", trace, "--perfetto", out / "perfetto.json"])
    return cmds


@pytest.mark.parametrize("kind", sorted(TRACES))
@pytest.mark.slow
def test_no_command_modifies_or_writes_beside_the_input(tmp_path, kind):
    d = tmp_path / "input"
    d.mkdir()
    trace = d / TRACES[kind].name
    shutil.copyfile(TRACES[kind], trace)
    os.utime(trace, ns=(1_600_000_000_000_000_000, 1_600_000_000_000_000_000))  # a distinctive, old mtime
    out = tmp_path / "out"
    out.mkdir()
    before = _state(trace)
    for args in _commands(trace, out):
        res = run_cli(args, timeout=120)
        assert_clean(res, args)
        assert res.exit_code == 0, f"{args}: {res.stderr}"
        assert _state(trace) == before, f"{' '.join(map(str, args))} changed the input or wrote beside it"
    assert (out / "runs.db").exists() and (out / "breakdown.json").stat().st_size > 0


def test_refuses_to_overwrite_the_input_with_o(tmp_path):
    d = tmp_path / "input"
    d.mkdir()
    trace = d / TRACES["kineto"].name
    shutil.copyfile(TRACES["kineto"], trace)
    before = _state(trace)
    for args in (["export", trace, "--perfetto", trace], ["plot", trace, "-o", trace]):
        if args[0] not in cli.commands:
            continue
        res = run_cli(args)
        assert_clean(res, args)
        assert _state(trace) == before


def test_errors_write_nothing_beside_the_input(tmp_path):
    """Unreadable inputs (truncated SQLite, an .nsys-rep without nsys) leave their directory as it was."""
    d = tmp_path / "input"
    d.mkdir()
    broken = d / "broken.sqlite"
    broken.write_bytes(TRACES["nsys"].read_bytes()[:50_000])
    rep = d / "report.nsys-rep"
    rep.write_bytes(b"not really a report")
    env_path = os.environ.get("PATH", "")
    for trace in (broken, rep):
        before = _state(trace)
        for cmd in ("info", "kernels", "breakdown"):
            os.environ["PATH"] = str(tmp_path / "no-nsys-here")  # no nsys binary: the .nsys-rep is refused
            try:
                res = run_cli([cmd, trace])
            finally:
                os.environ["PATH"] = env_path
            assert_clean(res, [cmd, trace])
            assert res.exit_code == 2
            assert _state(trace) == before
