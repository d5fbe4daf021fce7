"""AnalysisOptions: one frozen value for the analysis commands' options, and the one byte-amount parser."""

from __future__ import annotations

import dataclasses

import pytest
from click.testing import CliRunner

from tracekit.cli import cli
from tracekit.errors import TracekitError
from tracekit.options import DEFAULT_DRAFT_RANGE, AnalysisOptions, parse_amount


@pytest.mark.parametrize("text,kind,value", [
    ("27e9", "bytes", 27e9), ("27GB", "bytes", 27e9), ("27 gb", "bytes", 27e9), ("25.1GiB", "bytes", 25.1 * 2**30),
    ("512MiB", "bytes", 512 * 2**20), ("1.5TB", "bytes", 1.5e12), ("300MB", "bytes", 3e8), ("4096", "bytes", 4096),
    ("27B", "count", 27e9), ("8.03G", "count", 8.03e9), ("70M", "count", 70e6), (".5e3", "count", 500),
])
def test_parse_amount(text, kind, value):
    # (bytes are whole: 25.1GiB rounds to the nearest byte)
    assert parse_amount(text, kind) == pytest.approx(round(value) if kind == "bytes" else value, rel=1e-15)


@pytest.mark.parametrize("text,kind", [("27B", "bytes"), ("lots", "bytes"), ("27GiB", "count"), ("1e999", "bytes"),
                                       ("-5GB", "bytes"), ("", "bytes")])
def test_parse_amount_refuses_with_an_example(text, kind):
    # (a bare B of bytes is ambiguous: the message says how to write 10^9 bytes)
    with pytest.raises(TracekitError, match=r"e\.g\. 27e9, |ambiguous|too large"):
        parse_amount(text, kind)


def test_options_are_frozen_and_validated():
    o = AnalysisOptions(weight_bytes=parse_amount("25.1GiB"), draft_range="")
    assert o.weight_bytes == round(25.1 * 2**30) and isinstance(o.weight_bytes, int)
    assert o.draft_range is None  # --draft-range '' switches drafting by range off
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.device = 1  # type: ignore[misc]
    assert AnalysisOptions().draft_range == DEFAULT_DRAFT_RANGE and AnalysisOptions().given() == {}
    for bad in (dict(measured_step_ms=20.0, measured_tok_s=48.0), dict(peak_bw=-1.0), dict(tp=0), dict(phase="x"),
                dict(engine="ray"), dict(engine="process=tcp://h:1")):
        with pytest.raises(TracekitError):
            AnalysisOptions(**bad)


def test_breakdown_kwargs_never_drop_a_given_option_silently():
    def analysis(trace, *, step_range=None, draft_range=None, device=None, measured_step_ms=None):
        pass

    o = AnalysisOptions(step_range="^s$", measured_step_ms=20.0)
    assert o.breakdown_kwargs(analysis) == {"step_range": "^s$", "draft_range": DEFAULT_DRAFT_RANGE, "device": None,
                                            "measured_step_ms": 20.0}
    with pytest.raises(TracekitError, match="--model: not supported"):
        AnalysisOptions(model="m").breakdown_kwargs(analysis)
    # --engine says where several files run, not what to compute: never an analysis argument
    assert "engine" not in AnalysisOptions(engine="dask=tcp://h:8786").breakdown_kwargs(analysis)


def test_every_options_field_is_a_flag_of_breakdown():
    text = CliRunner().invoke(cli, ["breakdown", "--help"], terminal_width=200).output
    for f in dataclasses.fields(AnalysisOptions):
        assert f"--{f.name.replace('_', '-')}" in text, f.name
    diff = CliRunner().invoke(cli, ["diff", "--help"], terminal_width=200).output
    assert "--base-measured-step-ms" in diff and "--new-measured-step-ms" in diff and "--measured-tok-s" not in diff
