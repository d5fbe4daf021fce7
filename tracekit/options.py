"""The options of the analysis commands, as one frozen value, and the one parser of byte amounts.

:class:`AnalysisOptions` is what ``breakdown``, ``diff``, ``plot`` and ``export`` (and the per-rank
workers of a multi-file breakdown) pass around instead of a dozen positional parameters. The command
line builds it with one shared decorator (``tracekit.cli.options.analysis_options``); a script builds it
directly::

    opts = AnalysisOptions(step_range=r"^decode_step \\d+$", weight_bytes=parse_amount("27GB"))
    result = tracekit.breakdown(tracekit.load("run.sqlite"), **opts.breakdown_kwargs())

Every field defaults to "not given" (``None``), so the precedence of the contract applies: flag >
manifest beside the trace > the trace itself > shipped tables. Importing this module imports neither
polars nor click.

>>> AnalysisOptions(weight_bytes=parse_amount("25.1GiB")).weight_bytes
26950919782
>>> AnalysisOptions(measured_step_ms=20.0, measured_tok_s=48.0)
Traceback (most recent call last):
...
tracekit.errors.TracekitError: give --measured-step-ms or --measured-tok-s, not both
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Literal

from tracekit.categories import DEFAULT_DRAFT_RANGE, PHASE_CHOICES
from tracekit.errors import TracekitError

Phase = Literal["decode", "prefill", "mixed", "all"]
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
        raise TracekitError(f"{str(text)!r} is not a number (e.g. 27e9, 27B, 8.03G, 70M)")
    return value * _COUNT[unit]


# Fields that say where or how to run, not what to compute: never passed to the analysis.
NOT_ANALYSIS = ("engine",)


@dataclass(frozen=True)
class AnalysisOptions:
    """Every option of the analysis commands (``breakdown``, ``diff``, ``plot``, ``export``).

    Fields are keyword-only in spirit: build it with names. ``None`` means "not given": the manifest,
    the trace or the shipped tables decide. ``weight_bytes`` is summed over all GPUs (``tp`` divides it);
    ``device_profile`` is the path of a ``tracekit capture --workload synthetic`` device profile.
    ``draft_range="none"`` turns drafting detection off (``tracekit.analyses.drafting.is_off``).
    """

    device: int | None = None
    step_range: str | None = None
    draft_range: str | None = DEFAULT_DRAFT_RANGE
    weight_bytes: int | None = None
    peak_bw: float | None = None
    accept_len: float | None = None
    tokens_per_step: float | None = None
    rules: Path | None = None
    device_profile: Path | None = None
    measured_step_ms: float | None = None
    measured_tok_s: float | None = None
    phase: Phase | None = None
    model: Path | None = None
    tp: int | None = None
    ep: int | None = None
    context: int | None = None
    engine: str | None = None

    def __post_init__(self):
        if self.measured_step_ms is not None and self.measured_tok_s is not None:
            raise TracekitError("give --measured-step-ms or --measured-tok-s, not both")
        if self.phase is not None and self.phase not in PHASE_CHOICES:
            raise TracekitError(f"--phase {self.phase!r}: use one of {', '.join(PHASE_CHOICES)}")
        for name in ("weight_bytes", "peak_bw", "accept_len", "tokens_per_step", "measured_step_ms",
                     "measured_tok_s", "tp", "ep"):
            v = getattr(self, name)
            if v is not None and not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise TracekitError(f"--{name.replace('_', '-')} must be a positive number, got {v!r}")
        if self.context is not None and self.context < 0:
            raise TracekitError(f"--context must be >= 0, got {self.context}")
        if self.weight_bytes is not None and not isinstance(self.weight_bytes, int):
            object.__setattr__(self, "weight_bytes", int(round(self.weight_bytes)))
        if self.draft_range == "":
            object.__setattr__(self, "draft_range", None)
        if self.engine is not None:
            from tracekit.engines import parse_engine

            parse_engine(self.engine)

    def given(self) -> dict:
        """The fields that differ from their defaults (what a user actually passed)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) != f.default}

    def breakdown_kwargs(self, fn=None) -> dict:
        """Keyword arguments for ``fn`` (default: :func:`tracekit.analyses.breakdown.breakdown`).

        Options ``fn`` does not take yet are left out while they hold their default; given, they raise
        :class:`TracekitError` (never silently ignored). ``device_profile`` is read here (a JSON file).
        """
        import inspect

        if fn is None:
            from tracekit.analyses.breakdown import breakdown as fn
        accepted = set(inspect.signature(fn).parameters)
        values = asdict(self)
        if "device_profile" in accepted:
            values["device_profile"] = read_json_object(self.device_profile, "device profile")
        unsupported = [k for k in self.given() if k not in accepted and k not in NOT_ANALYSIS]
        if unsupported:
            flags = ", ".join(f"--{k.replace('_', '-')}" for k in unsupported)
            raise TracekitError(f"{flags}: not supported by this version's breakdown yet; leave it out")
        return {k: v for k, v in values.items() if k in accepted}


def read_json_object(path: Path | None, what: str) -> dict | None:
    """The JSON object in ``path`` (None for no path); a :class:`TracekitError` naming ``what`` otherwise."""
    if path is None:
        return None
    import json

    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise TracekitError(f"{path}: unreadable {what} ({e})") from None
    if not isinstance(data, dict):
        raise TracekitError(f"{path}: {what} must be a JSON object")
    return data


__all__ = ["AnalysisOptions", "DEFAULT_DRAFT_RANGE", "Phase", "parse_amount", "read_json_object"]
