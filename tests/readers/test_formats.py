"""A trace format is one package and one line in the registry (``tracekit.readers.FORMATS``); nothing downstream
changes.

This module is such a package: its ``FORMAT`` reads the Chrome Trace Event Format's *JSON Array* form (a bare list of
events, what Chrome and many small tracers write; Kineto writes the object form and tracekit refused this one) with a minimal reader of its own
(the standard ``json`` module, the readers' shared polars helpers). Registered with one line, ``tracekit.load``,
``tracekit.info``, ``tracekit.kernels``, ``tracekit.breakdown`` and the command line read its files through it, its
head start included. The file is a real capture's events (``sample_traces/synthetic-eager-torch``, 16 decode steps
by its manifest) written in the array form; the figures are counted here from the JSON with plain Python.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner

import tracekit
from tracekit import readers
from tracekit.cli import cli
from tracekit.readers import Format
from tracekit.readers.common import api_kind, nesting_depth, strip_api_version
from tracekit.trace import GPUS, GRAPH_EXECS, KERNELS, LAUNCHES, MEMOPS, OPS, RANGES, Trace, TraceMeta, conform, empty

from conftest import DATA, ROOT, sample

# ───────────────────────── the format package (what a contributor writes) ─────────────────────────

HEAD_STARTS: list[str] = []  # the files this format's head start was entered for


def recognise(path: Path, head: bytes) -> bool:
    return head.lstrip()[:1] == b"["  # (registered before Kineto's, which claims any JSON and refuses this form)


def _ns(us: pl.Expr) -> pl.Expr:
    return (us * 1000).round(0).cast(pl.Int64)


def read_chrome_array(path: Path, *, kernel_dims: bool = True) -> Trace:
    wanted = ("kernel", "cuda_runtime", "cuda_driver", "user_annotation")
    events = [e for e in json.loads(Path(path).read_bytes()) if e.get("ph") == "X" and e.get("cat") in wanted]
    df = pl.DataFrame([{"cat": e["cat"], "name": e["name"], "pid": e["pid"], "tid": e["tid"], "ts": e["ts"],
                        "dur": e["dur"], "device": e.get("args", {}).get("device"),
                        "stream": e.get("args", {}).get("stream"),
                        "correlation": e.get("args", {}).get("correlation")} for e in events],
                      schema={"cat": pl.String, "name": pl.String, "pid": pl.Int64, "tid": pl.Int64,
                              "ts": pl.Float64, "dur": pl.Float64, "device": pl.Int32, "stream": pl.Int64,
                              "correlation": pl.Int64})
    df = df.with_columns(start=_ns(pl.col("ts")), end=_ns(pl.col("ts")) + _ns(pl.col("dur")))
    calls = df.filter(pl.col("cat").is_in(["cuda_runtime", "cuda_driver"]))
    launches = conform(calls.with_columns(name=strip_api_version(pl.col("name"))).with_columns(
        kind=api_kind(pl.col("name"))), LAUNCHES)
    # a kernel's pid is its launching process (the array form puts the GPU's in its own pid)
    kernels = conform(df.filter(pl.col("cat") == "kernel").drop("pid").join(
        calls.select("correlation", "pid"), on="correlation", how="left"), KERNELS).sort("start")
    rng = df.filter(pl.col("cat") == "user_annotation")
    ranges = conform(rng.with_columns(depth=nesting_depth(rng)), RANGES).sort("start")
    # device naming: the array form names no GPU; its devices are the kernels' ids
    gpus = conform(kernels.select(pl.col("device").unique().sort()), GPUS)
    meta = TraceMeta(path=str(path), format="chrome-array", producer="chrome-array", markers="annotation")
    return Trace(kernels=kernels, memops=empty(MEMOPS), launches=launches, ranges=ranges,
                 graph_execs=empty(GRAPH_EXECS), ops=empty(OPS), gpus=gpus, meta=meta).validate()


def head_start(path, *, kernel_dims: bool = True, own_process: bool = False):
    from contextlib import nullcontext

    HEAD_STARTS.append(Path(path).name)
    return nullcontext(False)


FORMAT = Format(name="chrome-array", what="a Chrome JSON array trace", recognise=recognise, load=read_chrome_array,
                head_start=head_start)

# ───────────────────────── the tests ─────────────────────────


@pytest.fixture(scope="module")
def array_trace(tmp_path_factory) -> tuple[Path, list[dict]]:
    """The synthetic-eager-torch capture's events, as a Chrome JSON array file."""
    events = json.load(gzip.open(sample("synthetic-eager-torch/trace.json.gz")))["traceEvents"]
    path = tmp_path_factory.mktemp("chrome") / "trace.json"
    path.write_text(json.dumps(events))
    return path, events


@pytest.fixture
def registered(monkeypatch):
    """This module's format registered: the one line a new format adds to tracekit.readers.FORMATS."""
    monkeypatch.setattr(readers, "FORMATS", (__name__, *readers.FORMATS))
    HEAD_STARTS.clear()


def test_a_registered_format_reads_its_files_through_the_facade(array_trace, registered):
    path, events = array_trace
    kernels = [e for e in events if e.get("ph") == "X" and e.get("cat") == "kernel"]
    copies = [e for e in events if e.get("ph") == "X" and e.get("cat") == "gpu_memcpy"]
    work_calls = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cuda_driver")
                  and e["name"].startswith(("cudaLaunch", "cuLaunch", "cudaMemcpy", "cudaMemset"))]
    steps = [e for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("decode_step ")]
    # one call per kernel and per copy; 16 steps: the manifest's profiled steps
    assert (len(kernels), len(copies), len(work_calls), len(steps)) == (3600, 32, 3632, 16)

    trace = tracekit.load(path)
    assert trace.meta.format == "chrome-array" and trace.meta.markers == "annotation"
    info = tracekit.info(trace).to_dict()  # (the typed result: its JSON, as `tracekit info --format json`)
    assert info["source"]["format"] == "chrome-array"
    # (this minimal reader keeps no copies: memops 0; their launching calls count as launches)
    assert info["counts"] == {"kernels": 3600, "memops": 0, "launches": 3632, "ranges": 16}
    k = tracekit.kernels(trace)
    assert sum(r["count"] for r in k["kernels"]) == 3600
    assert sum(r["total_ms"] for r in k["kernels"]) == pytest.approx(sum(round(e["dur"] * 1000) for e in kernels) / 1e6)
    b = tracekit.breakdown(trace, step_range=r"^decode_step ")
    assert b.steps["marker"] == "annotation" and b.steps["count"] == 15  # (16 ranges: the last has no next step)


def test_unregistered_the_file_is_refused(array_trace):
    """Without the registry line the Kineto format claims the JSON file and refuses it in one line (Kineto writes
    the object form, with ``traceEvents``)."""
    path, _ = array_trace
    assert readers.detect_format(path).name == "kineto-json"
    with pytest.raises(tracekit.TracekitError, match="the top level is a JSON array, not a Kineto trace object"):
        tracekit.load(path)
    r = CliRunner().invoke(cli, ["info", str(path)])
    assert r.exit_code == 2 and r.output.count("\n") == 1


def test_the_command_line_uses_the_registered_format_and_its_head_start(array_trace, registered):
    path, _ = array_trace
    r = CliRunner().invoke(cli, ["info", str(path), "--format", "json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["source"]["format"] == "chrome-array"
    assert HEAD_STARTS == ["trace.json"]
    r = CliRunner().invoke(cli, ["breakdown", str(path), "--step-range", "^decode_step ", "--format", "json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["source"]["format"] == "chrome-array" and out["steps"]["count"] == 15
    assert HEAD_STARTS == ["trace.json"] * 3  # (breakdown: the command's, before polars, and breakdown_file's)


def test_a_file_no_format_reads_names_every_registered_format(tmp_path, registered):
    junk = tmp_path / "notes.txt"
    junk.write_text("hello")
    with pytest.raises(tracekit.TracekitError) as e:
        tracekit.load(junk)
    assert str(e.value) == (f"{junk}: not a trace tracekit can read (expected a Chrome JSON array trace, an nsys "
                            "SQLite export, a Kineto .json/.json.gz, or an .nsys-rep with nsys on PATH)")


def test_each_shipped_format_names_the_traces_it_reads():
    """The registry's order and the format each file is read by (its ``Format.name`` is its traces'
    ``meta.format``): SQLite, a gzipped SQLite export, Kineto JSON and gzipped JSON."""
    assert readers.FORMATS == ("tracekit.readers.nsys", "tracekit.readers.kineto")
    for path, name in ((DATA / "nsys/pipit_saxpy_2022.2.sqlite", "nsys-sqlite"),
                       (sample("hf-small-graph/trace.sqlite.gz"), "nsys-sqlite"),
                       (DATA / "kineto/hta_triton_cuda_driver.json.gz", "kineto-json")):
        fmt = readers.detect_format(path)
        assert fmt.name == name == tracekit.load(path).meta.format, path
    with pytest.raises(tracekit.TracekitError, match="not a trace tracekit can read"):
        readers.detect_format(ROOT / "README.md")


def test_recognising_a_file_imports_no_reader():
    """The command line recognises files and starts head starts before polars is imported: the registry and every
    format's package import neither polars nor their reader."""
    code = ("import sys; from tracekit import readers; "
            f"fmts = readers.formats(); readers.detect_format(__import__('pathlib').Path(r'{DATA / 'nsys/pipit_saxpy_2022.2.sqlite'}')); "
            "print(len(fmts), sorted(m for m in sys.modules if m in ('polars', 'msgspec', 'pyarrow') "
            "or m.endswith(('.reader', '.columns', '.stream'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.stdout.split("\n")[0] == "2 []", out.stderr


# ───────────────────────── Format: the one home of a format's file names and profiler ─────────────────────────

def test_the_formats_name_their_files_and_profiler():
    nsys, kineto = readers.formats()
    assert (nsys.extension, nsys.compressed, nsys.suffixes[0], nsys.profiler) == (".sqlite", ".sqlite.gz",
                                                                                 ".nsys-rep", "nsys")
    assert (kineto.extension, kineto.compressed, kineto.profiler) == (".json", ".json.gz", "torch")
    assert readers.trace_suffixes() == (".sqlite", ".sqlite.gz", ".json", ".json.gz", ".nsys-rep")
    assert readers.of_profiler("torch") is kineto and readers.of_profiler("nsys") is nsys
    with pytest.raises(tracekit.errors.BadOptionValue, match="--profiler perf: use nsys or torch"):
        readers.of_profiler("perf")
    from tracekit.capture import nsys_export_cmd, trace_name

    assert (trace_name("nsys"), trace_name("nsys", "compressed"), trace_name("nsys", "report"),
            trace_name("torch", "compressed")) == ("trace.sqlite", "trace.sqlite.gz", "trace.nsys-rep", "trace.json.gz")
    assert nsys_export_cmd("nsys", Path("/o"))[-2:] == ["/o/trace.sqlite", "/o/trace.nsys-rep"]


def test_a_folder_lists_a_registered_formats_files(tmp_path, array_trace, registered, monkeypatch):
    """The command line's folder of traces asks the registry for the file names: a format registered with its
    extension has its files listed (and an .nsys-rep beside its export is the same trace, listed once)."""
    from tracekit.cli.output import expand_traces

    monkeypatch.setattr(sys.modules[__name__], "FORMAT", Format(**{**FORMAT.__dict__, "extension": ".carr"}))
    (tmp_path / "a.carr").write_bytes(array_trace[0].read_bytes())
    (tmp_path / "b.sqlite").write_bytes((DATA / "nsys/pipit_saxpy_2022.2.sqlite").read_bytes())
    (tmp_path / "b.nsys-rep").write_bytes(b"report")
    assert [p.name for p in expand_traces([tmp_path])] == ["a.carr", "b.sqlite"]
    assert ".carr" in readers.trace_suffixes()


def _constants_outside_readers(suffixes: tuple[str, ...]) -> list[str]:
    import ast

    hits = []
    for p in (ROOT / "tracekit").rglob("*.py"):
        if "readers" in p.relative_to(ROOT).parts:
            continue
        tree = ast.parse(p.read_text())
        docs = {id(n.body[0].value) for n in ast.walk(tree) if isinstance(n, (ast.Module, ast.FunctionDef,
                ast.ClassDef)) and n.body and isinstance(n.body[0], ast.Expr)}
        hits += [f"{p.relative_to(ROOT)}:{n.lineno} {n.value!r}" for n in ast.walk(tree)
                 if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs
                 and n.value.endswith(suffixes)]
    return hits


def test_suffixes_are_spelled_only_in_the_readers():
    """A new format touches readers/ only: no string outside it ends with a format's suffix (``.json`` aside: it
    names many files that are not traces, config.json, manifest.json), bar the servers' own file-name patterns."""
    suffixes = tuple(s for f in readers.formats() for s in (f.extension, f.compressed, *f.suffixes) if s != ".json")
    hits = [h for h in _constants_outside_readers(suffixes) if not h.startswith("tracekit/server/engines.py")]
    assert hits == []
    assert _constants_outside_readers((".md",)) != []  # the check sees constants (the renderers' formats)
