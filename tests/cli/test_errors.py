"""tracekit.errors: a named class for each thing that goes wrong for the user, raised by the API, mapped to one line
and the class's exit code in one place (tracekit.cli.app); few bare ``TracekitError`` raises left."""

from __future__ import annotations

import ast
import os

import pytest
from click.testing import CliRunner

import tracekit
from tracekit import errors
from tracekit.cli import cli
from tracekit.errors import (
    BadModelConfig,
    BadOptionValue,
    BadRulesFile,
    ConflictingOptions,
    MissingOption,
    ModelError,
    ModelFilesMissing,
    NoGpuActivity,
    NoSteps,
    OptionError,
    TraceError,
    TracekitError,
    UnknownGpu,
    UnreadableTrace,
    UnsupportedFormat,
    UnsupportedSchema,
)
from tracekit.results.diff import read_saved

from conftest import ROOT

MOCK = ROOT / "tests" / "data" / "nsys" / "nsysai_mock_2026.1.sqlite"
CONFIGS = ROOT / "tests" / "data" / "configs"
BARE_RAISES_MAX = 30  # issue 50: the rest named


def test_every_error_is_a_tracekit_error_with_its_exit_code():
    named = errors.named()
    assert named[0] is TracekitError and len(named) >= 20
    assert all(issubclass(c, TracekitError) and c.exit_code == 2 and c.__doc__ for c in named)
    assert {c.__name__ for c in named} <= set(errors.__all__)
    # a family catches its members; members of one family are not another's
    assert issubclass(ModelFilesMissing, ModelError) and not issubclass(ModelFilesMissing, TraceError)
    assert issubclass(UnknownGpu, OptionError) and not issubclass(UnreadableTrace, OptionError)
    # the contract lists every one (docs/contract.md's cog block: cog --check keeps it current)
    contract = (ROOT / "docs" / "contract.md").read_text()
    assert all(f"| `{c.__name__}` |" in contract for c in named)


def bare_raises(source: str) -> list[int]:
    """The lines of ``source`` that raise (or return, to raise) a plain ``TracekitError(...)``."""
    out = []
    for node in ast.walk(ast.parse(source)):
        call = node.value if isinstance(node, ast.Return) else node.exc if isinstance(node, ast.Raise) else None
        if isinstance(call, ast.Call) and getattr(call.func, "id", None) == "TracekitError":
            out.append(node.lineno)
    return out


def test_few_bare_tracekit_errors_are_left():
    bare = {str(p.relative_to(ROOT)): n for p in (ROOT / "tracekit").rglob("*.py") if (n := bare_raises(p.read_text()))}
    assert sum(map(len, bare.values())) <= BARE_RAISES_MAX, bare
    assert bare_raises("def f(e):\n    raise TracekitError('x')\n\ndef g():\n    return TracekitError(e)\n") == [2, 5]
    assert bare_raises("raise NoSteps('x')\nraise TracekitError\n") == []


@pytest.mark.parametrize("call, cls", [
    (lambda: tracekit.load("/nonexistent/trace.sqlite"), UnreadableTrace),
    (lambda: tracekit.load(ROOT / "tests" / "data"), UnreadableTrace),
    (lambda: tracekit.load(ROOT / "README.md"), UnsupportedFormat),
    (lambda: tracekit.breakdown(tracekit.load(MOCK), step_range=".", device=7), NoGpuActivity),
    (lambda: tracekit.breakdown(tracekit.load(MOCK), step_range="no such range"), NoSteps),
    (lambda: tracekit.breakdown(tracekit.load(MOCK), phase="nope"), BadOptionValue),
    (lambda: tracekit.breakdown(MOCK, measured_step_ms=3.0, measured_tok_s=5.0), ConflictingOptions),
    (lambda: tracekit.breakdown(MOCK, model="/nonexistent"), ModelFilesMissing),
    (lambda: tracekit.breakdown(tracekit.load(MOCK), step_range=".", rules=ROOT / "README.md"), BadRulesFile),
    (lambda: tracekit.ceiling(gpu="H200"), MissingOption),
    (lambda: tracekit.ceiling(gpu="NoSuchGPU", params=8e9), UnknownGpu),
    (lambda: tracekit.ceiling(gpu="H200", params=8e9, draft_bytes=1e9), ConflictingOptions),
    (lambda: tracekit.ceiling(gpu="H200", model=CONFIGS / "README.md"), BadModelConfig),
    (lambda: read_saved(ROOT / "tests" / "data" / "saved" / "saxpy_breakdown_v1.json"), UnsupportedSchema),
])
def test_the_api_raises_the_named_error(call, cls):
    with pytest.raises(cls) as e:
        call()
    assert type(e.value) is cls, type(e.value)


def test_the_command_line_maps_the_class_to_its_exit_code_and_one_line(monkeypatch):
    r = CliRunner().invoke(cli, ["breakdown", "/nonexistent/trace.sqlite"])
    assert (r.exit_code, r.output) == (2, "tracekit: error: /nonexistent/trace.sqlite: no such file\n")
    monkeypatch.setattr(UnreadableTrace, "exit_code", 7)  # the code is the class's, not a constant of the CLI
    r = CliRunner().invoke(cli, ["breakdown", "/nonexistent/trace.sqlite"], env={**os.environ, "COLUMNS": "100"})
    assert r.exit_code == 7
    r = CliRunner().invoke(cli, ["breakdown", str(ROOT / "README.md")])
    assert r.exit_code == 2 and r.output.startswith("tracekit: error: ") and r.output.count("\n") == 1
