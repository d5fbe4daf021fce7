"""Shared option decorators and parameter types: every command spells a flag the same way.

* :func:`output_options`: ``--format``, ``-o/--output``, ``--color/--no-color``.
* :data:`trace_arguments`: ``TRACE...`` (files, or directories of rank files).
* :func:`click_option`: the click option of one declared :class:`tracekit.options.Option` — flag, default, help
  and metavar from the declaration; its click type only *parses* text (:data:`CLICK_TYPES`), the options object
  checks the value (one validator, shared with the Python API).
* :func:`analysis_options` / :func:`ceiling_options`: every declared option of ``breakdown`` / ``ceiling``, handed
  to the command as ONE frozen options object (parameter ``opts``); an invalid value or combination is a
  one-line usage error (exit 2).
* :data:`BYTES` / :data:`COUNT`: amounts such as ``27e9``, ``27GB``, ``25.1GiB`` (bytes) or ``27B``
  (a count), parsed by :func:`tracekit.options.parse_amount`.

No option of an analysis is written here: they are declared once in :data:`tracekit.options.OPTIONS`.
Imports click and the standard library only.
"""

from __future__ import annotations

import functools
from pathlib import Path

import click

from tracekit.errors import TracekitError
from tracekit.options import OPTION, AnalysisOptions, CeilingOptions, Option, options_of, parse_amount

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
_PATH = click.Path(path_type=Path)

# Option kind (tracekit.options.KINDS) -> the click type that turns text into a value (checked afterwards).
CLICK_TYPES = {
    "text": click.STRING, "regex": click.STRING, "engine": click.STRING,
    "index": click.INT, "count": click.INT, "count0": click.INT,
    "positive": click.FLOAT, "number0": click.FLOAT,
    "bytes": BYTES, "bytes0": BYTES, "params": COUNT,
    "file": _PATH, "model": _PATH,
}


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


def click_option(o: Option, *, name: str | None = None, flags: tuple[str, ...] | None = None,
                 help: str | None = None):
    """The click option of the declared option ``o``. ``name``/``flags``/``help`` rename it for a variant
    (``diff``'s ``--base-measured-step-ms``; ``kernels``' ``--device``, which restricts instead of picking)."""
    decls = flags or o.flags or (f"--{o.name.replace('_', '-')}",)
    kw = dict(default=o.default, help=help or o.help, show_default=o.default is not None and o.kind != "flag")
    if o.kind == "flag":
        return click.option(*decls, name or o.name, is_flag=True, **kw)
    type_ = click.Choice(o.choices) if o.kind == "choice" else CLICK_TYPES[o.kind]
    return click.option(*decls, name or o.name, type=type_, metavar=o.metavar, **kw)


def device_option(help_text: str):
    return click_option(OPTION["device"], help=help_text)


rules_option = click_option(OPTION["rules"])


def _usage_error(e: TracekitError):
    return click.UsageError(str(e), ctx=click.get_current_context(silent=True))


def _options_decorator(options: tuple[Option, ...], cls: type, help_for=lambda o: o.help):
    """Add ``options`` to a command and pass their values as one ``opts`` of ``cls`` (checked: usage error)."""
    names = {o.name for o in options}

    def deco(f):
        @functools.wraps(f)
        def wrapper(*args, **kwargs):
            values = {name: kwargs.pop(name) for name in list(kwargs) if name in names}
            try:
                kwargs["opts"] = cls(**values)
            except TracekitError as e:
                raise _usage_error(e) from None
            return f(*args, **kwargs)

        for o in reversed(options):
            wrapper = click_option(o, help=help_for(o))(wrapper)
        return wrapper

    return deco


def analysis_options(fn=None, *, engine: bool = False, measured: bool = True):
    """Add the analysis options (:func:`tracekit.options.options_of` ``"breakdown"``) to a command and pass them as
    one ``opts: AnalysisOptions``.

    ``engine``: add ``--engine`` (breakdown of several files: where they run, :mod:`tracekit.run.engines`).
    ``measured=False`` leaves out ``--measured-step-ms`` / ``--measured-tok-s`` (``diff`` has a measured step per
    side instead: :func:`side_option`). Inconsistent values (both measured flags) are a one-line usage error, exit 2.
    """
    options = tuple(o for o in options_of("breakdown") if measured or not o.name.startswith("measured_"))
    deco = _options_decorator(options + (options_of("files") if engine else ()), AnalysisOptions)
    return deco if fn is None else deco(fn)


def ceiling_options(fn):
    """Add ``ceiling``'s declared options (shared ones with ``ceiling``'s narrower help) as ``opts: CeilingOptions``."""
    return _options_decorator(options_of("ceiling"), CeilingOptions, lambda o: o.ceiling_help or o.help)(fn)


def side_option(name: str, side: str):
    """The declared option ``name`` for one side of ``diff`` (``--base-measured-step-ms``): same type and check."""
    o = OPTION[name]
    flag = f"--{side}-{name.replace('_', '-')}"
    return click_option(o, name=f"{side}_{name}", flags=(flag,),
                        help=f"{side.upper()}'s {o.help[0].lower()}{o.help[1:]}".replace("the manifest's",
                                                                                         "its manifest's"))


def side_options(opts: AnalysisOptions, side: str, **changes) -> AnalysisOptions:
    """``opts`` with one side's values (``side_options(opts, "base", measured_step_ms=20.0)``), checked as the
    declaration says; a usage error naming the side's flag otherwise."""
    import dataclasses

    try:
        return dataclasses.replace(opts, **changes)
    except TracekitError as e:
        msg = str(e)
        for name in changes:
            msg = msg.replace(OPTION[name].flag, f"--{side}-{OPTION[name].flag[2:]}")
        raise _usage_error(TracekitError(msg)) from None


__all__ = ["Amount", "BYTES", "COUNT", "FORMATS", "CLICK_TYPES", "output_options", "format_option",
           "trace_arguments", "click_option", "device_option", "rules_option", "analysis_options", "ceiling_options",
           "side_option", "side_options"]
