"""Every option of the analysis commands, declared ONCE; the command line, the options objects and the Python
API's signatures are derived from that declaration.

One declaration per option
--------------------------
An :class:`Option` holds everything about one user-facing input: its name (the Python keyword and the field of
the options object; the flag is the name with dashes), its type as the API shows it, its default, its help text,
its *kind* (how a value is checked, and how the command line parses text into it), and the contract JSON key it
feeds. :data:`OPTIONS` lists every one, in ``--help`` order, and says which analyses take it. From that list:

* :class:`AnalysisOptions` (``breakdown``, ``diff``, ``plot``, ``export`` and the per-rank workers) and
  :class:`CeilingOptions` (``ceiling``) are frozen dataclasses *generated* from the options they take. Building
  one checks every value, once (:meth:`Option.check`: the one validator; the command line's click types only
  parse text), so the command line and the Python API refuse the same values with the same words.
* ``tracekit.cli.options`` makes the click options from the same records (:func:`tracekit.cli.options.click_option`).
* ``tracekit.breakdown`` and ``tracekit.ceiling`` get their explicit keyword signature from it
  (:func:`api_signature`: ``help()``, ``inspect.signature`` and IDEs that read ``__signature__`` show every keyword
  with its type and default); their body builds the options object and hands it on (``tracekit.run.pipeline.breakdown``
  takes the object; ``tracekit.results.ceiling.ceiling`` takes :meth:`analysis_kwargs`).

``tests/cli/test_options.py`` fails when the command line, the options objects, the API signatures and the analyses'
*use* of each option (the inputs ``tracekit.run.pipeline.breakdown`` reads, ``tracekit.results.ceiling.ceiling``'s
keyword parameters) disagree on a name, a default or a type. So adding an option is one ``Option(...)`` here plus
its use: the analysis that reads it. sqlite-utils is the model: every command is a thin call of a documented
function with the same parameter names.

A script builds an options object directly (text amounts parse as on the command line)::

    opts = AnalysisOptions(step_range=r"^decode_step \\d+$", weight_bytes="27GB")
    result = tracekit.breakdown_file("run.sqlite", opts)

Every breakdown option defaults to "not given" (``None``) unless it has a real default (``--draft-range``,
``--phase``), so the precedence of the contract applies: flag > manifest beside the trace > the trace itself >
shipped tables. Importing this module imports neither polars nor click.

>>> AnalysisOptions(weight_bytes=parse_amount("25.1GiB")).weight_bytes
26950919782
>>> AnalysisOptions(weight_bytes="27GB").weight_bytes
27000000000
>>> AnalysisOptions(measured_step_ms=20.0, measured_tok_s=48.0)
Traceback (most recent call last):
...
tracekit.errors.ConflictingOptions: give --measured-step-ms or --measured-tok-s, not both
>>> AnalysisOptions(tp=0)
Traceback (most recent call last):
...
tracekit.errors.BadOptionValue: --tp must be a whole number >= 1, got 0
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import re
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Literal

from tracekit.categories import DEFAULT_DRAFT_RANGE, PHASE_CHOICES
from tracekit.errors import (
    BadOptionValue,
    ConflictingOptions,
    MissingOption,
    ModelFilesMissing,
    UnreadableInput,
)
from tracekit.model.units import DTYPES  # the dtypes of --params / --dtype / --kv-dtype

Phase = Literal["decode", "prefill", "mixed", "training", "all"]
AmountKind = Literal["bytes", "count"]

# Decimal (SI) multipliers of a count; a bare B is a billion for --params (bytes: tracekit.model.units).
_DECIMAL = {"k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}
_COUNT = {"": 1, **_DECIMAL, "b": 1e9}
_AMOUNT = re.compile(r"\s*((?:\d+\.?\d*|\.\d+)(?:e[+-]?\d+)?)\s*([a-z]*)\s*", re.IGNORECASE)


def parse_amount(text: str | float | int, kind: AmountKind = "bytes") -> float:
    """A non-negative amount with an optional unit suffix (the caller decides whether 0 is allowed).

    ``kind="bytes"``: :func:`tracekit.model.units.parse_bytes`, the one byte parser (``27e9``, ``27GB``
    (GB = 1e9), ``25.1GiB`` (GiB = 2**30), also KB, MB, TB, KiB, MiB, TiB; a bare ``B`` is refused as
    ambiguous). ``kind="count"`` (a number of parameters): ``27e9``, ``27B`` (billion), ``8.03G``, ``70M``.
    Raises :class:`TracekitError` with an example when the text is not such an amount.

    >>> parse_amount("27GB"), parse_amount("25.1GiB"), parse_amount("27e9"), parse_amount("27B", "count")
    (27000000000.0, 26950919782.0, 27000000000.0, 27000000000.0)
    """
    if kind == "bytes":
        from tracekit.model.units import parse_bytes

        return float(parse_bytes(text))
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value, unit = float(text), ""
    else:
        m = _AMOUNT.fullmatch(str(text))
        value, unit = (float(m.group(1)), m.group(2).lower()) if m else (math.nan, "?")
    if unit not in _COUNT or not math.isfinite(value) or value < 0:
        raise BadOptionValue(f"{str(text)!r} is not a number (e.g. 27e9, 27B, 8.03G, 70M)")
    return value * _COUNT[unit]


# Where the per-file stage of several files runs (``tracekit.run.engines``).
ENGINES = ("process", "dask")


def parse_engine(spec: str | None) -> tuple[str, str | None]:
    """``'process'``, ``'dask'`` or ``'dask=ADDRESS'`` -> (engine, address)."""
    spec = (spec or "process").strip()
    name, _, address = spec.partition("=")
    name = name.strip().lower()
    if name not in ENGINES:
        raise BadOptionValue(f"--engine {spec!r}: unknown engine; use process, dask or dask=SCHEDULER_ADDRESS")
    if name == "process" and address:
        raise ConflictingOptions("--engine process takes no address; use --engine dask=SCHEDULER_ADDRESS for a cluster")
    return name, (address.strip() or None)


# ───────────────────────────── the declaration ─────────────────────────────

# How a value is checked (and, on the command line, how text becomes one: tracekit.cli.options.CLICK_TYPES):
KINDS = {
    "text": "a string",
    "regex": "a Python regular expression (re.search over range names)",
    "index": "a whole number >= 0",
    "count": "a whole number >= 1",
    "count0": "a whole number >= 0",
    "positive": "a number > 0",
    "number0": "a number >= 0",
    "bytes": "a byte amount > 0 (27e9, 27GB, 25.1GiB)",
    "bytes0": "a byte amount >= 0 (27e9, 27GB, 25.1GiB)",
    "params": "a parameter count > 0 (27e9, 27B, 8.03G)",
    "choice": "one of the choices",
    "file": "an existing file",
    "model": "an existing model directory, Hugging Face snapshot or config.json",
    "flag": "true or false",
    "engine": "process, dask or dask=ADDRESS",
}


@dataclass(frozen=True)
class Option:
    """One user-facing input of the analysis commands (see the module docstring).

    ``name``: the Python keyword and options-object field; the flag is ``--`` + the name with dashes unless
    ``flags`` spells it (aliases, or a ``--on/--off`` pair for a ``flag``). ``annotation``: the type as the API
    shows it. ``default``: ``None`` = not given (the manifest, the trace or the shipped tables decide).
    ``used_by``: ``"breakdown"`` (``tracekit.breakdown`` and everything that runs it: diff, plot, export),
    ``"ceiling"``, ``"files"`` (how several files run; an options-object field and a ``breakdown`` flag, never
    an analysis keyword). ``contract``: the JSON keys it feeds (``ceiling:`` keys are ``tracekit.ceiling/1``'s,
    the others ``tracekit.breakdown``'s). ``ceiling_help``: the help text where ``ceiling``'s meaning is narrower
    (no trace, no manifest).
    """

    name: str
    annotation: str
    kind: str
    help: str
    default: object = None
    metavar: str | None = None
    used_by: tuple[str, ...] = ("breakdown",)
    contract: tuple[str, ...] = ()
    flags: tuple[str, ...] = ()
    choices: tuple[str, ...] = ()
    ceiling_help: str | None = None

    @property
    def flag(self) -> str:
        """The flag as errors name it (``--measured-step-ms``)."""
        return self.flags[0].split("/")[0] if self.flags else f"--{self.name.replace('_', '-')}"

    def check(self, value):
        """``value`` checked against this option's kind and normalised (text amounts parsed, paths as ``Path``,
        ``--draft-range ''`` as None); a :class:`TracekitError` naming the flag otherwise. None passes: not given."""
        if value is None:
            return None
        k, flag = self.kind, self.flag

        def bad(what: str):
            return BadOptionValue(f"{flag} must be {what}, got {value!r}")

        if k in ("text", "regex", "engine"):
            if not isinstance(value, str):
                raise bad("text")
            if k == "regex" and value == "":
                return None  # --draft-range '': drafting by range off
            if k == "engine":
                parse_engine(value)
            return value
        if k in ("index", "count", "count0"):
            low = 1 if k == "count" else 0
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise bad(f"a whole number >= {low}")
            return value
        if k in ("positive", "number0"):
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            if not ok or value < 0 or (k == "positive" and value == 0):
                raise bad("a positive number" if k == "positive" else "a number >= 0")
            return value
        if k in ("bytes", "bytes0", "params"):
            amount = parse_amount(value, "count" if k == "params" else "bytes")
            if amount == 0 and k != "bytes0":
                raise bad("a positive amount")
            return int(round(amount)) if k != "params" else amount
        if k == "choice":
            if value not in self.choices:
                raise BadOptionValue(f"{flag} {value!r}: use one of {', '.join(self.choices)}")
            return value
        if k in ("file", "model"):
            if isinstance(value, dict) and "dict" in self.annotation:
                return value  # (a device profile's JSON object, already read)
            if not isinstance(value, (str, Path)):
                raise bad("a path")
            p = Path(value).expanduser()
            if k == "model" and not p.exists():  # (load_model's words: the check it would make later)
                raise ModelFilesMissing(f"{flag} {value} does not exist (give a model directory, a Hugging Face snapshot "
                                    "or a config.json)")
            if k == "file" and not p.is_file():
                raise BadOptionValue(f"{flag} {value}: no such file")
            return p
        if k == "flag":
            if not isinstance(value, bool):
                raise bad("true or false")
            return value
        raise AssertionError(f"option {self.name}: unknown kind {k!r}")  # a declaration error, not a user's


_BREAKDOWN_AND_CEILING = ("breakdown", "ceiling")

# Every analysis option, in --help order. Add one here, then use it (the analysis keyword of the same name).
OPTIONS: tuple[Option, ...] = (
    # ceiling's GPU (breakdown reads it from the trace)
    Option("gpu", "str | None", "text", "GPU name as a trace or nvidia-smi shows it, e.g. 'RTX A6000', 'NVIDIA H200'.",
           metavar="NAME", used_by=("ceiling",), contract=("ceiling:gpu.name",)),
    Option("device", "int | None", "index", "GPU to analyse (default: the busiest).", contract=("gpu.device",)),
    Option("step_range", "str | None", "regex",
           "Range names (NVTX / torch annotations) that mark a decode step (Python re.search).", metavar="REGEX",
           contract=("steps.pattern",)),
    Option("draft_range", "str | None", "regex",
           "Range names whose GPU work is drafting; 'none' turns drafting detection off (no ranges, no structure, no "
           "speculative kernels).", default=DEFAULT_DRAFT_RANGE,
           metavar="REGEX", contract=("advice.drafting.detection",)),
    Option("phase", "Phase", "choice", "Which steps to analyse by their detected phase.", default="decode",
           choices=PHASE_CHOICES, contract=("steps.phase",)),
    Option("weight_bytes", "int | None", "bytes",
           "Weight bytes one step reads, summed over all GPUs: 27e9, 27GB, 25.1GiB, 512MiB "
           "(default: --model, manifest, else the trace).", metavar="N", used_by=_BREAKDOWN_AND_CEILING,
           contract=("roofline.weight_bytes_per_step", "ceiling:bytes_per_step_per_gpu"),
           ceiling_help="Weight bytes a step reads (whole model, all GPUs): 27e9, 13.5GB, 25.1GiB."),
    Option("params", "float | None", "params", "Parameter count read per step (with --dtype): 27e9, 27B.",
           metavar="N", used_by=("ceiling",), contract=("ceiling:bytes_per_step_per_gpu",)),
    Option("dtype", "str | None", "choice",
           "Weight dtype for --params (default bf16) or a bare config.json (default: its own).",
           choices=DTYPES, used_by=("ceiling",)),
    Option("model", "str | Path | None", "model",
           "Model directory, HF cache snapshot or config.json: weight and KV bytes from its tensors.",
           metavar="PATH", used_by=_BREAKDOWN_AND_CEILING, flags=("--model", "--model-config"),
           contract=("roofline.weight_bytes_source", "roofline.kv_bytes_per_step", "ceiling:bytes_per_step_per_gpu"),
           ceiling_help="Model folder / HF snapshot (config.json + safetensors headers) or a config.json."),
    Option("tp", "int | None", "count",
           "GPUs the weights are split over (default: manifest, else the trace's all-reduce group).", metavar="N",
           used_by=_BREAKDOWN_AND_CEILING, contract=("roofline.tp", "ceiling:roofline.tp"),
           ceiling_help="Tensor-parallel GPUs the weights are split over (default: 1)."),
    Option("ep", "int | None", "count", "Expert-parallel GPUs (experts split over EP instead of TP; default 1).",
           metavar="N", used_by=_BREAKDOWN_AND_CEILING, contract=("roofline.weight_bytes_per_step",),
           ceiling_help="Expert-parallel GPUs the experts are split over (with --model; default 1)."),
    Option("context", "int | None", "count0",
           "Tokens of KV cache each sequence reads per step (default: from the trace where visible).", metavar="N",
           used_by=_BREAKDOWN_AND_CEILING, contract=("roofline.kv_bytes_per_step", "ceiling:bytes_per_step_per_gpu"),
           ceiling_help="Context length whose KV cache each step reads (default: none, no KV term)."),
    Option("peak_bw", "float | None", "positive", "Peak memory bandwidth in GB/s (default: manifest > trace > GPU table).",
           metavar="GBPS", used_by=_BREAKDOWN_AND_CEILING, contract=("gpu.peak_bw_gbps", "ceiling:gpu.peak_bw_gbps"),
           ceiling_help="Peak memory bandwidth, GB/s; overrides the GPU table."),
    Option("peak_tflops", "float | None", "positive",
           "Dense peak TFLOP/s for the weights' dtype (default: the GPU table).", metavar="TFLOPS",
           used_by=("ceiling",), contract=("ceiling:peak_tflops", "ceiling:compute_floor_ms")),
    Option("accept_len", "float | None", "positive",
           "Mean tokens emitted per speculative step per sequence, the bonus token included.", metavar="X",
           used_by=_BREAKDOWN_AND_CEILING, contract=("roofline.tokens_per_step", "ceiling:tokens_per_step")),
    Option("tokens_per_step", "float | None", "positive",
           "Tokens a step produces without speculation (batch size; default 1 or the manifest's).", metavar="N",
           contract=("roofline.tokens_per_step",)),
    # ceiling's speculative-decoding and batch inputs (breakdown reads them from the trace and the manifest)
    Option("draft_bytes", "int | None", "bytes0", "Draft model weight bytes (speculative decoding).", metavar="N",
           used_by=("ceiling",), contract=("ceiling:bytes_per_step_per_gpu",)),
    Option("draft_forwards", "float | None", "number0",
           "Draft forward passes per step (a --model's MTP layers when no --draft-bytes).", metavar="K",
           used_by=("ceiling",), contract=("ceiling:bytes_per_step_per_gpu",)),
    Option("draft_sharded", "bool", "flag",
           "Whether the draft model is split over --tp (--draft-replicated: each GPU reads all of it).",
           default=True, used_by=("ceiling",), flags=("--draft-sharded/--draft-replicated",)),
    Option("batch", "int | None", "count", "Sequences decoded per step (default: 1).", metavar="N",
           used_by=("ceiling",), contract=("ceiling:tokens_per_step",)),
    Option("kv_bytes_per_token", "int | None", "bytes",
           "KV cache bytes per token, whole model (all layers, K and V).", metavar="N", used_by=("ceiling",),
           contract=("ceiling:bytes_per_step_per_gpu",)),
    Option("kv_dtype", "str | None", "choice", "KV cache dtype with --model (default: the model's dtype).",
           choices=DTYPES, used_by=("ceiling",)),
    Option("measured_step_ms", "float | None", "positive",
           "Step time measured without a profiler (default: the manifest's); savings are stated against it.",
           metavar="X", contract=("time_base.unprofiled_step_ms",)),
    Option("measured_tok_s", "float | None", "positive",
           "Whole-batch tokens/s measured without a profiler (instead of --measured-step-ms).", metavar="X",
           used_by=_BREAKDOWN_AND_CEILING, contract=("time_base.unprofiled_step_ms", "ceiling:measured_tokens_per_s"),
           ceiling_help="Your measured tokens/s, to compare with the ceiling."),
    Option("rules", "str | Path | None", "file", "Extra kernel-classification rules (TOML), tried before the shipped ones.",
           contract=("kernel_ms_per_step",)),
    Option("device_profile", "str | Path | dict | None", "file",
           "Device profile JSON from `tracekit capture --workload synthetic` (graph replay cost).",
           contract=("advice.cuda_graphs.predicted_step_ms",)),
    Option("engine", "str | None", "engine",
           "Where the per-file stage of several files runs: a local process pool, a local Dask cluster, or the Dask "
           "scheduler at ADDRESS (tcp://HOST:PORT) [default: process].", metavar="process|dask|dask=ADDRESS",
           used_by=("files",)),
    Option("all_devices", "bool", "flag",
           "Analyse every GPU of the trace (one nsys report of several ranks) and add a cross-rank table.",
           default=False, used_by=("files",)),
)
# The options of how the ranks of one trace run that the Python API takes besides its analysis' own
# (``tracekit.breakdown(trace, all_devices=True)``: every GPU of the trace as a rank).
API_ALSO: dict[str, tuple[str, ...]] = {"breakdown": ("all_devices",), "ceiling": ()}
OPTION: dict[str, Option] = {o.name: o for o in OPTIONS}


def options_of(analysis: str) -> tuple[Option, ...]:
    """The options ``analysis`` (``"breakdown"``, ``"ceiling"``, ``"files"``) takes, in declaration order."""
    return tuple(o for o in OPTIONS if analysis in o.used_by)


# ───────────────────────────── the options objects, generated ─────────────────────────────

class _Options:
    """What every generated options class does: check each value once, say which were given, hand the analysis
    its keywords."""

    ANALYSIS: str = ""  # the analysis whose keywords analysis_kwargs() returns

    def __post_init__(self):
        for f in fields(self):
            value = f.metadata["option"].check(getattr(self, f.name))
            object.__setattr__(self, f.name, value)
        self._check_together()

    def _check_together(self) -> None:
        """Rules between options (not of one value)."""

    def given(self) -> dict:
        """The fields that differ from their defaults (what a user actually passed)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) != f.default}

    def analysis_kwargs(self) -> dict:
        """The keyword arguments of the analysis (``tracekit.analyses.<ANALYSIS>.<ANALYSIS>``): every option it
        takes, by name; a device-profile path is read here (its JSON object)."""
        values = {o.name: getattr(self, o.name) for o in options_of(self.ANALYSIS)}
        if "device_profile" in values and not isinstance(values["device_profile"], (dict, type(None))):
            values["device_profile"] = read_json_object(values["device_profile"], "device profile")
        return values


class _AnalysisChecks(_Options):
    ANALYSIS = "breakdown"

    def _check_together(self) -> None:
        if self.measured_step_ms is not None and self.measured_tok_s is not None:
            raise ConflictingOptions("give --measured-step-ms or --measured-tok-s, not both")
        if getattr(self, "all_devices", False) and self.device is not None:
            raise ConflictingOptions("--all-devices analyses every GPU: give no --device")


class _CeilingChecks(_Options):
    ANALYSIS = "ceiling"

    def _check_together(self) -> None:
        if not self.gpu and self.peak_bw is None:
            raise MissingOption("give --gpu NAME or --peak-bw GBPS")
        if self.draft_bytes and not self.draft_forwards:
            raise ConflictingOptions("--draft-bytes needs --draft-forwards K (draft forward passes per step)")
        if (self.params is not None and (self.weight_bytes is not None or self.model is not None)) or \
                (self.weight_bytes is None and self.params is None and self.model is None):
            raise MissingOption("give exactly one of --weight-bytes N, --params N (with --dtype) or --model PATH "
                                "(--weight-bytes may go with --model: it replaces the weights term)")

    def analysis_kwargs(self) -> dict:
        """The given values only: what "not given" means without a trace (one GPU, one sequence, no KV term) is
        ``tracekit.results.ceiling.ceiling``'s to say."""
        return {k: v for k, v in super().analysis_kwargs().items() if v is not None}


def _options_class(name: str, options: tuple[Option, ...], base: type, doc: str) -> type:
    """A frozen, keyword-only dataclass with one field per option (type, default and the Option as metadata)."""
    cls = dataclasses.make_dataclass(
        name, [(o.name, o.annotation, dataclasses.field(default=o.default, metadata={"option": o})) for o in options],
        bases=(base,), frozen=True, kw_only=True)
    cls.__module__, cls.__qualname__, cls.__doc__ = __name__, name, doc
    return cls


AnalysisOptions = _options_class(
    "AnalysisOptions", tuple(o for o in OPTIONS if {"breakdown", "files"} & set(o.used_by)), _AnalysisChecks,
    """Every option of the analysis commands (``breakdown``, ``diff``, ``plot``, ``export``), generated from
    :data:`OPTIONS` (one field per option that ``breakdown`` or ``files`` uses).

    Build it with names (keyword-only); building checks every value. ``None`` means "not given": the manifest,
    the trace or the shipped tables decide. ``weight_bytes`` is summed over all GPUs (``tp`` divides it) and may
    be given as text (``"27GB"``); ``device_profile`` is the path of a ``tracekit capture --workload synthetic``
    device profile (or its JSON object). ``draft_range="none"`` turns drafting detection off
    (``tracekit.analyses.drafting.is_off``). ``engine`` says where several files run, never what is computed.""")

CeilingOptions = _options_class(
    "CeilingOptions", options_of("ceiling"), _CeilingChecks,
    """Every option of ``tracekit ceiling``, generated from :data:`OPTIONS` (the options ``ceiling`` uses; those it
    shares with ``breakdown`` are the same declarations). Building it checks every value and the rules between
    them (one weights source; a GPU or a bandwidth).""")


# ───────────────────────────── the Python API's signatures ─────────────────────────────

def api_signature(fn, analysis: str) -> inspect.Signature:
    """``fn``'s signature with its ``**options`` replaced by one keyword-only parameter per option of
    ``analysis`` (type and default from :data:`OPTIONS`), then those of :data:`API_ALSO`. The facade functions of
    ``tracekit`` carry it as ``__signature__``: ``help(tracekit.breakdown)`` lists every keyword."""
    sig = inspect.signature(fn)
    head = [p for p in sig.parameters.values() if p.kind not in (p.VAR_KEYWORD, p.KEYWORD_ONLY)]
    kw = [inspect.Parameter(o.name, inspect.Parameter.KEYWORD_ONLY, default=o.default, annotation=o.annotation)
          for o in (*options_of(analysis), *(OPTION[n] for n in API_ALSO.get(analysis, ())))]
    return sig.replace(parameters=head + kw)


def bind_options(fn, options_class: type, *args, **kwargs):
    """The options object of a call ``fn(*args, **kwargs)`` of a facade whose ``__signature__`` is
    :func:`api_signature`'s: an unknown keyword is a ``TypeError``, as for any function."""
    fn.__signature__.bind(*args, **kwargs)
    return options_class(**kwargs)


def read_json_object(path: Path | None, what: str) -> dict | None:
    """The JSON object in ``path`` (None for no path); a :class:`TracekitError` naming ``what`` otherwise."""
    if path is None:
        return None
    import json

    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise UnreadableInput(f"{path}: unreadable {what} ({e})") from None
    if not isinstance(data, dict):
        raise UnreadableInput(f"{path}: {what} must be a JSON object")
    return data


__all__ = ["Option", "OPTIONS", "OPTION", "KINDS", "DTYPES", "options_of", "AnalysisOptions", "CeilingOptions",
           "api_signature", "bind_options", "API_ALSO", "DEFAULT_DRAFT_RANGE", "Phase", "parse_amount", "ENGINES", "parse_engine",
           "read_json_object"]
