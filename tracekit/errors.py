"""What can go wrong for the user: one class per thing, all :class:`TracekitError`, each with its exit code.

The library and the API raise these; the command line maps them in one place (:mod:`tracekit.cli.app`: the
message on one line, ``tracekit: error: ...``, and the class's :attr:`~TracekitError.exit_code`). A caller of the
API tells a malformed trace from a missing model file by the class, never by the message:

>>> from tracekit.errors import ModelFilesMissing, ModelError, TracekitError
>>> issubclass(ModelFilesMissing, ModelError) and issubclass(ModelError, TracekitError)
True
>>> ModelFilesMissing.exit_code
2

The families (catch one to catch all its members): :class:`TraceError` (the trace file), :class:`ModelError`
(``--model``'s files), :class:`OptionError` (the flags and keyword arguments), :class:`InputFileError` (another file
the user gives: rules, GPU table, a saved result, a run history), :class:`ServerError` (an inference server or a
Dask scheduler), :class:`CaptureError` (``tracekit capture``). ``docs/contract.md`` lists them all
(:func:`markdown_table`).

Imports nothing (the command line's ``--help`` loads this module).
"""

from __future__ import annotations


class TracekitError(Exception):
    """Unusable input or arguments. The message says what is wrong and what to do."""

    #: the process's exit status for this error (the contract: 2 for unusable input or arguments)
    exit_code = 2


# ───────────────────────── the trace ─────────────────────────

class TraceError(TracekitError):
    """The trace file cannot be analysed."""


class UnreadableTrace(TraceError):
    """The trace cannot be read: no such file, a directory, damaged, truncated, values of the wrong type."""


class UnsupportedFormat(TraceError):
    """A file that is not a trace tracekit reads (not an nsys SQLite export, not a Kineto JSON)."""


class NoGpuActivity(TraceError):
    """The trace (or the chosen ``--device``) holds no kernels, memory operations or graph executions."""


class NoSteps(TraceError):
    """No decode steps could be found (or none is left to analyse)."""


# ───────────────────────── the model's files ─────────────────────────

class ModelError(TracekitError):
    """The model's files (``--model``) cannot give the bytes a step reads."""


class ModelFilesMissing(ModelError):
    """``--model`` names no folder or file, or a file the model needs is not there (config.json, a shard)."""


class BadModelConfig(ModelError):
    """config.json is not a model config tracekit can size (not JSON, a size missing, a model not modelled)."""


class BadModelFiles(ModelError):
    """A weights file or its index cannot be read (a damaged safetensors header, an index naming no file)."""


# ───────────────────────── the options ─────────────────────────

class OptionError(TracekitError):
    """A flag (or the API's keyword argument) is wrong."""


class BadOptionValue(OptionError):
    """One option's value is out of range or cannot be parsed (``--tp 0``, ``--phase nope``, a bad regex)."""


class ConflictingOptions(OptionError):
    """Options that do not go together, or one that needs another (``--draft-bytes`` without ``--draft-forwards``)."""


class MissingOption(OptionError):
    """A value the command needs was given by no option (``ceiling`` without weights or a GPU)."""


class UnknownGpu(BadOptionValue):
    """``--gpu`` names a GPU the table does not know (and no ``--peak-bw`` says its bandwidth)."""


# ───────────────────────── other files the user gives ─────────────────────────

class InputFileError(TracekitError):
    """A file the user gives besides the trace and the model cannot be used."""


class BadRulesFile(InputFileError):
    """A ``--rules`` TOML file is missing, unreadable or not a rules file."""


class BadGpuTable(InputFileError):
    """A GPU table (gpus.toml) cannot be read."""


class UnsupportedSchema(InputFileError):
    """A saved result or run history of a schema tracekit does not read (``diff`` of a ``/2`` result)."""


class UnreadableInput(InputFileError):
    """A JSON or SQLite input besides the trace cannot be read (a saved result, a device profile, a run history)."""


class CannotWrite(TracekitError):
    """The output cannot be written where asked (a folder that cannot be made, the input trace itself)."""


class ToolMissing(TracekitError):
    """A program or package the command needs is not installed (nsys, dask, the workload's torch)."""


# ───────────────────────── servers ─────────────────────────

class ServerError(TracekitError):
    """A server tracekit talks to (an SGLang/vLLM server, a Dask scheduler) cannot do what it needs."""


class ServerUnreachable(ServerError):
    """No server answers at the address, or it went away mid-capture."""


class ServerRefused(ServerError):
    """The server answered but refused (profiling already in progress, not enabled, a request refused)."""


class UnsupportedServer(ServerError):
    """The address answers HTTP but is not an SGLang or vLLM server, or does not report what tracekit needs."""


# ───────────────────────── capture ─────────────────────────

class CaptureError(TracekitError):
    """``tracekit capture`` could not capture a trace."""


class CaptureFailed(CaptureError):
    """The profiler or the workload failed, or wrote no trace (or a load produced no decode step)."""


def named() -> list[type[TracekitError]]:
    """Every error class, the base first, in the order of this module."""
    return [c for c in globals().values() if isinstance(c, type) and issubclass(c, TracekitError)]


__all__ = [c.__name__ for c in named()]


def markdown_table() -> str:
    """The table of ``docs/contract.md``: every error, its family, exit code and meaning."""
    rows = ["| error | family | exit | what went wrong |", "|---|---|---:|---|"]
    for c in named():
        family = "" if c is TracekitError else f"`{c.__mro__[1].__name__}`"
        rows.append(f"| `{c.__name__}` | {family} | {c.exit_code} | {' '.join(c.__doc__.split())} |")
    return "\n".join(rows)
