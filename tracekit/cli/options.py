"""Shared option decorators and parameter types: every command spells a flag the same way.

* :func:`output_options`: ``--format``, ``-o/--output``, ``--color/--no-color``.
* :data:`trace_arguments`: ``TRACE...`` (files, or directories of rank files).
* :func:`analysis_options`: every option of the analysis commands, handed to the command as ONE frozen
  :class:`tracekit.options.AnalysisOptions` (parameter ``opts``), so no command passes a dozen values by
  position and a new option is added in one place.
* :data:`BYTES` / :data:`COUNT`: amounts such as ``27e9``, ``27GB``, ``25.1GiB`` (bytes) or ``27B``
  (a count), parsed by :func:`tracekit.options.parse_amount` (shared with ``ceiling``).

Imports click and the standard library only.
"""

from __future__ import annotations

import functools
from dataclasses import fields
from pathlib import Path

import click

from tracekit.categories import PHASE_CHOICES
from tracekit.errors import TracekitError
from tracekit.options import DEFAULT_DRAFT_RANGE, AnalysisOptions, parse_amount

FORMATS = ("table", "md", "json", "csv")


class Amount(click.ParamType):
    """A non-negative amount with an optional unit: bytes (``27e9``, ``27GB``, ``25.1GiB``) or a count (``27B``)."""

    def __init__(self, kind: str = "bytes"):
        self.kind = kind
        self.name = "N"

    def convert(self, value, param, ctx):
        try:
            return parse_amount(value, self.kind)
        except TracekitError as e:
            self.fail(str(e), param, ctx)


BYTES = Amount("bytes")
COUNT = Amount("count")
POSITIVE = click.FloatRange(min=0, min_open=True)


def format_option(choices=FORMATS):
    return click.option("--format", "fmt", type=click.Choice(choices), default="table", show_default=True,
                        help="Output format.")


def output_options(choices=FORMATS):
    """``--format`` (one of ``choices``), ``-o/--output FILE`` and ``--color/--no-color``."""
    def deco(fn):
        for opt in reversed([
            format_option(choices),
            click.option("-o", "--output", type=click.Path(dir_okay=False, writable=True, path_type=Path),
                         help="Write there instead of stdout."),
            click.option("--color/--no-color", default=None, help="Colour in the table (default: auto; NO_COLOR)."),
        ]):
            fn = opt(fn)
        return fn
    return deco


trace_arguments = click.argument("traces", nargs=-1, required=True,
                                 type=click.Path(exists=False, path_type=Path), metavar="TRACE...")


def device_option(help_text: str):
    return click.option("--device", type=int, default=None, help=help_text)



_INT_1 = click.IntRange(min=1)
_FILE = click.Path(exists=True, dir_okay=False, path_type=Path)

# The analysis options in --help order: (AnalysisOptions field, type, metavar, help); the flag is the field's name
# with dashes, every default None (not given) but --draft-range's.
_ANALYSIS_TABLE = [
    ("device", int, None, "GPU to analyse (default: the busiest)."),
    ("step_range", str, "REGEX", "Range names (NVTX / torch annotations) that mark a decode step (Python re.search)."),
    ("draft_range", str, "REGEX", "Range names whose GPU work is drafting; 'none' turns drafting detection off "
                                  "(no ranges, no structure, no speculative kernels)."),
    ("phase", click.Choice(PHASE_CHOICES), None, "Which steps to analyse by their detected phase [default: decode]."),
    ("weight_bytes", BYTES, "N", "Weight bytes one step reads, summed over all GPUs: 27e9, 27GB, 25.1GiB, 512MiB "
                                 "(default: --model, manifest, else the trace)."),
    ("model", click.Path(exists=True, path_type=Path), "PATH",
     "Model directory, HF cache snapshot or config.json: weight and KV bytes from its tensors."),
    ("tp", _INT_1, "N", "GPUs the weights are split over (default: manifest, else the trace's all-reduce group)."),
    ("ep", _INT_1, "N", "Expert-parallel GPUs (experts split over EP instead of TP; default 1)."),
    ("context", click.IntRange(min=0), "N",
     "Tokens of KV cache each sequence reads per step (default: from the trace where visible)."),
    ("peak_bw", POSITIVE, "GBPS", "Peak memory bandwidth in GB/s (default: manifest > trace > GPU table)."),
    ("accept_len", POSITIVE, "X", "Mean tokens emitted per speculative step per sequence, the bonus token included."),
    ("tokens_per_step", POSITIVE, "N",
     "Tokens a step produces without speculation (batch size; default 1 or the manifest's)."),
    ("measured_step_ms", POSITIVE, "X",
     "Step time measured without a profiler (default: the manifest's); savings are stated against it."),
    ("measured_tok_s", POSITIVE, "X", "Whole-batch tokens/s measured without a profiler (instead of --measured-step-ms)."),
    ("rules", _FILE, None, "Extra kernel-classification rules (TOML), tried before the shipped ones."),
    ("device_profile", _FILE, None,
     "Device profile JSON from `tracekit capture --workload synthetic` (graph replay cost)."),
]


def _option(field: str, type_, metavar: str | None, help_text: str):
    default = DEFAULT_DRAFT_RANGE if field == "draft_range" else None
    return click.option(f"--{field.replace('_', '-')}", field, type=type_, default=default, metavar=metavar,
                        show_default=default is not None, help=help_text)


_ANALYSIS = [(row[0], _option(*row)) for row in _ANALYSIS_TABLE]
_ENGINE = ("engine", _option("engine", str, "process|dask|dask=ADDRESS",
                             "Where the per-file stage of several files runs: a local process pool, a local Dask "
                             "cluster, or the Dask scheduler at ADDRESS (tcp://HOST:PORT) [default: process]."))
rules_option = dict(_ANALYSIS)["rules"]
FIELDS = {f.name for f in fields(AnalysisOptions)}
assert {name for name, _ in _ANALYSIS} | {_ENGINE[0]} == FIELDS, "every AnalysisOptions field has its option"


def analysis_options(fn=None, *, engine: bool = False, measured: bool = True):
    """Add the analysis options to a command and pass them as one ``opts: AnalysisOptions``.

    ``engine``: add ``--engine`` (breakdown of several files: where they run, :mod:`tracekit.engines`). ``measured=False`` leaves out ``--measured-step-ms`` /
    ``--measured-tok-s`` (``diff`` has a pair per side instead). Inconsistent values (both measured
    flags) are a one-line usage error, exit 2.
    """
    def deco(f):
        @functools.wraps(f)
        def wrapper(*args, **kwargs):
            values = {name: kwargs.pop(name) for name in list(kwargs) if name in FIELDS}
            try:
                kwargs["opts"] = AnalysisOptions(**values)
            except TracekitError as e:
                raise click.UsageError(str(e), ctx=click.get_current_context(silent=True)) from None
            return f(*args, **kwargs)

        opts = [o for name, o in _ANALYSIS if measured or not name.startswith("measured_")]
        for opt in reversed(opts + ([_ENGINE[1]] if engine else [])):
            wrapper = opt(wrapper)
        return wrapper

    return deco if fn is None else deco(fn)


__all__ = ["Amount", "BYTES", "COUNT", "POSITIVE", "FORMATS", "output_options", "format_option",
           "trace_arguments", "device_option", "rules_option", "analysis_options"]
