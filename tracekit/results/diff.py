"""Two breakdowns side by side: what changed between a base and a new run (schema ``tracekit.diff/3``).

``diff(base, new)`` takes two :class:`~tracekit.results.breakdown.Breakdown` results and
returns a :class:`Diff` whose ``to_dict()`` is the contract JSON::

    {"schema": "tracekit.diff/3", "base": <breakdown>, "new": <breakdown>, "delta": {...}}

(the embedded breakdowns are of ``tracekit.results.breakdown.SCHEMA``). ``delta`` holds, for every number
compared, ``{"base", "new", "abs", "rel"}`` where ``abs = new - base`` (ms unless the key says otherwise) and
``rel = abs / base`` (``null`` when either side is ``null`` or ``base`` is 0):

* ``reference_step_ms``: the two *reference* steps, what every saving is stated against and what the headline
  compares: each side's unprofiled step (its flag, else its manifest) where it has one, else its traced step.
  Besides the four numbers: ``base_source`` / ``new_source`` (``"flag"``, ``"manifest"`` or ``"traced"``) and
  ``basis``: ``"unprofiled"`` (both sides unprofiled), ``"traced"`` (neither has an unprofiled time) or
  ``"mixed"`` — an unprofiled step against a traced one, which is not a change: ``abs`` and ``rel`` are null.
* ``steps``: the *traced* steps' ``mean_ms``, ``median_ms``, ``p10_ms``, ``p90_ms``, ``spread_ms`` (p90 − p10, the
  step-to-step noise of each side) and ``count``; plus ``within_noise``: true when the traced mean moved by less
  than the larger of the two p10–p90 half-spreads, i.e. the change may be noise.
* ``time_base``: ``reference_step_ms`` (the same object as above), ``unprofiled_step_ms`` and ``traced_step_ms``
  (each compared only with its own kind).
* ``per_step_ms``, ``gaps`` (by cause) and ``kernel_ms_per_step``: every key of the breakdown's blocks (shares of
  the traced step).
* ``roofline``: ``floor_ms``, ``fraction_of_ceiling``, ``ceiling_tokens_per_s``,
  ``gemm_achieved_bw_gbps``.
* ``largest_change``: the ``per_step_ms`` key with the largest absolute change (ties: the
  first in ``per_step_ms`` order), or null.
* ``advice_changed``: one entry per lever (every lever of ``tracekit.categories.LEVERS``) whose ``applicable``
  flipped or whose verdict text changed: ``{"lever", "applicable": {"base", "new"}, "applicable_flipped": bool,
  "verdict": {"base", "new"}, "max_saving_ms": {"base", "new", "abs", "rel"}}``.
* ``warnings``: why the comparison may mislead (different GPUs, step markers, graph modes, time bases).

A side may also be a breakdown saved earlier (``breakdown --format json``): :func:`read_saved` reads one of the
current schema; an older one (``/1``, ``/2``) is refused with the reason (its blocks and definitions are not
this version's: analyse the trace again).

:func:`diff` is pure: no files, no printing. Its result is typed end to end (:class:`Diff`, :class:`Delta`,
:class:`Change`, ... are :class:`tracekit.contract.Block`: frozen, read by attribute or by JSON key, written by the
one serialiser); the renderers (``tracekit/report/diff.py``) show only numbers from its JSON.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, fields
from pathlib import Path

from tracekit.categories import GAP_CAUSES, LEVERS
from tracekit.contract import BREAKDOWN_SCHEMA, DIFF_SCHEMA, Block
from tracekit.errors import TracekitError

SCHEMA = DIFF_SCHEMA  # "tracekit.diff/3" (tracekit.contract names it once)


@dataclass(frozen=True)
class Change(Block):
    """Two numbers compared: ``abs = new - base``, ``rel = abs / base`` (null when either side is null or base 0)."""

    base: float | int | None
    new: float | int | None
    abs: float | int | None
    rel: float | None


def change(base, new) -> Change:
    """The :class:`Change` of two numbers (either may be None).

    >>> change(23.5, 3.7)["abs"], round(change(23.5, 3.7).rel, 3)
    (-19.8, -0.843)
    >>> change(0.0, 1.0).rel is None, change(None, 1.0).abs is None
    (True, True)
    """
    if base is None or new is None:
        return Change(base, new, None, None)
    a = new - base
    if isinstance(a, float):
        a = round(a, 12)  # stable text: 3.7 - 23.5 prints as -19.8, not -19.799999999999997
    return Change(base, new, a, (a / base) if base else None)


@dataclass(frozen=True)
class ReferenceChange(Change):
    """``delta.reference_step_ms``: the two reference steps, each side's source (flag, manifest or traced) and the
    ``basis`` (unprofiled, traced or mixed: then ``abs``/``rel`` are null)."""

    base_source: str
    new_source: str
    basis: str


@dataclass(frozen=True)
class StepsDelta(Block):
    """``delta.steps``: the traced steps' statistics, their p10-p90 spread and count, and whether the traced mean
    moved by less than the step-to-step noise (``within_noise``)."""

    mean_ms: Change
    median_ms: Change
    p10_ms: Change
    p90_ms: Change
    spread_ms: Change
    count: Change
    within_noise: bool | None


@dataclass(frozen=True)
class TimeBaseDelta(Block):
    """``delta.time_base``: the reference steps (as ``delta.reference_step_ms``), then the unprofiled and the traced
    steps, each compared only with its own kind."""

    reference_step_ms: ReferenceChange
    unprofiled_step_ms: Change
    traced_step_ms: Change


@dataclass(frozen=True)
class RooflineDelta(Block):
    """``delta.roofline``: the roofline figures compared."""

    floor_ms: Change
    fraction_of_ceiling: Change
    ceiling_tokens_per_s: Change
    gemm_achieved_bw_gbps: Change


@dataclass(frozen=True)
class BaseNew(Block):
    """A value of each side, not a number to subtract (a flag, a verdict)."""

    base: object
    new: object


@dataclass(frozen=True)
class AdviceChange(Block):
    """One of ``delta.advice_changed``: a lever whose ``applicable`` flipped or whose verdict changed."""

    lever: str
    applicable: BaseNew
    applicable_flipped: bool
    verdict: BaseNew
    max_saving_ms: Change


@dataclass(frozen=True)
class Delta(Block):
    """``delta``: every comparison of :func:`diff` (see the module docstring). ``per_step_ms`` and
    ``kernel_ms_per_step`` map each key of either side's block to its :class:`Change`; ``gaps`` each gap cause."""

    reference_step_ms: ReferenceChange
    steps: StepsDelta
    time_base: TimeBaseDelta
    per_step_ms: dict[str, Change]
    gaps: dict[str, Change]
    kernel_ms_per_step: dict[str, Change]
    roofline: RooflineDelta
    largest_change: str | None
    advice_changed: tuple[AdviceChange, ...]
    warnings: tuple[str, ...]


@dataclass(frozen=True)
class Diff(Block):
    """The result of :func:`diff`; ``to_dict()`` is the contract JSON (``tracekit.diff/3``). ``base``/``new`` are
    Breakdowns (or :class:`SavedBreakdown`)."""

    SCHEMA = DIFF_SCHEMA

    base: object
    new: object
    delta: Delta


STEP_KEYS = tuple(f.name for f in fields(StepsDelta))[:4]  # the quantiles of steps
ROOFLINE_KEYS = tuple(f.name for f in fields(RooflineDelta))


_SAVED = re.compile(rb'^\s*\{\s*"schema"\s*:\s*"tracekit\.breakdown/(\d+)"')


@dataclass(frozen=True)
class SavedBreakdown:
    """A breakdown saved as JSON (``breakdown --format json``), usable as a side of :func:`diff`."""

    data: dict

    def to_dict(self) -> dict:
        return self.data


def read_saved(path) -> SavedBreakdown | None:
    """The saved breakdown in ``path``, or None when ``path`` is not one (a trace: analyse it). Only the
    first bytes are read to tell (a Kineto trace can be gigabytes). A ``/1`` result is a
    :class:`TracekitError` with the reason; so is an older schema's (``/1``, ``/2``), and a saved multi-rank
    result."""
    path = Path(path)
    if not path.name.lower().endswith(".json") or not path.is_file():
        return None
    with open(path, "rb") as f:
        m = _SAVED.match(f.read(4096))
    if m is None:
        return None
    version = m.group(1).decode()
    if f"tracekit.breakdown/{version}" != BREAKDOWN_SCHEMA:
        raise TracekitError(f"{path}: a saved tracekit.breakdown/{version} result; diff compares "
                            f"{BREAKDOWN_SCHEMA} breakdowns (reference steps, this version's definitions), "
                            "which it cannot be converted to: run tracekit diff on the trace files again")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise TracekitError(f"{path}: unreadable saved breakdown ({e})") from None
    if not isinstance(data, dict) or "ranks" in data or not isinstance(data.get("steps"), dict):
        raise TracekitError(f"{path}: not a single-trace {BREAKDOWN_SCHEMA} result (a multi-rank result? diff one "
                            "rank's trace file)")
    return SavedBreakdown(data)


def _spread(st: dict):
    if st.get("p90_ms") is None or st.get("p10_ms") is None:
        return None
    return st["p90_ms"] - st["p10_ms"]


def reference_step(b: dict) -> tuple[float | None, str]:
    """A breakdown dict's reference step and its source: ``(ms, "flag" | "manifest")`` when it has an unprofiled
    step, else ``(traced ms, "traced")``.

    >>> reference_step({"time_base": {"unprofiled_step_ms": 2.8, "unprofiled_source": "manifest",
    ...                               "traced_step_ms": 6.1}})
    (2.8, 'manifest')
    """
    tb = b.get("time_base") or {}
    if tb.get("unprofiled_step_ms") is not None:
        return tb["unprofiled_step_ms"], tb.get("unprofiled_source") or "flag"
    return tb.get("traced_step_ms", (b.get("steps") or {}).get("mean_ms")), "traced"


def reference_change(b: dict, n: dict) -> ReferenceChange:
    """``delta.reference_step_ms``: :func:`change` of the two reference steps, with each side's source and the
    ``basis``; an unprofiled step against a traced one is not a change (``abs``/``rel`` null, basis ``mixed``)."""
    (bv, bs), (nv, ns) = reference_step(b), reference_step(n)
    kinds = {"traced" if s == "traced" else "unprofiled" for s in (bs, ns)}
    basis = kinds.pop() if len(kinds) == 1 else "mixed"
    c = change(bv, nv) if basis != "mixed" else Change(bv, nv, None, None)
    return ReferenceChange(c.base, c.new, c.abs, c.rel, base_source=bs, new_source=ns, basis=basis)


def diff(base, new) -> Diff:
    """Compare two breakdowns (``base`` first). See the module docstring for the keys."""
    b, n = base.to_dict(), new.to_dict()
    bs, ns = b["steps"], n["steps"]
    quantiles = {k: change(bs.get(k), ns.get(k)) for k in STEP_KEYS}
    spread = change(_spread(bs), _spread(ns))
    mean_abs = quantiles["mean_ms"].abs
    halves = [s / 2 for s in (spread.base, spread.new) if s is not None]
    steps = StepsDelta(**quantiles, spread_ms=spread, count=change(bs.get("count"), ns.get("count")),
                       within_noise=None if mean_abs is None or not halves else abs(mean_abs) < max(halves))

    per_step = {k: change(b["per_step_ms"].get(k), n["per_step_ms"].get(k))
                for k in dict.fromkeys([*b["per_step_ms"], *n["per_step_ms"]])}
    kernel = {k: change(b["kernel_ms_per_step"].get(k), n["kernel_ms_per_step"].get(k))
              for k in dict.fromkeys([*b["kernel_ms_per_step"], *n["kernel_ms_per_step"]])}
    roof = RooflineDelta(**{k: change(b["roofline"].get(k), n["roofline"].get(k)) for k in ROOFLINE_KEYS})
    ref = reference_change(b, n)
    tb = TimeBaseDelta(ref, **{k: change(b["time_base"].get(k), n["time_base"].get(k))
                               for k in ("unprofiled_step_ms", "traced_step_ms")})
    gaps = {k: change(b["gaps"].get(k), n["gaps"].get(k)) for k in GAP_CAUSES}

    largest = None
    for k, v in per_step.items():
        if v.abs is not None and v.abs != 0 and (largest is None or abs(v.abs) > abs(per_step[largest].abs)):
            largest = k

    changed = []
    for lever in LEVERS:
        ba, na = b["advice"].get(lever), n["advice"].get(lever)
        if ba is None or na is None:
            continue
        flipped = bool(ba["applicable"]) != bool(na["applicable"])
        if flipped or ba["verdict"] != na["verdict"]:
            changed.append(AdviceChange(
                lever=lever, applicable=BaseNew(ba["applicable"], na["applicable"]), applicable_flipped=flipped,
                verdict=BaseNew(ba["verdict"], na["verdict"]),
                max_saving_ms=change(ba.get("max_saving_ms"), na.get("max_saving_ms"))))

    warnings = []
    if (b["gpu"]["name"] or None) != (n["gpu"]["name"] or None):
        warnings.append(f"different GPUs: base {b['gpu']['name'] or 'unknown'}, new {n['gpu']['name'] or 'unknown'}")
    if b["gpu"]["device"] != n["gpu"]["device"]:
        warnings.append(f"different devices analysed: base GPU {b['gpu']['device']}, new GPU {n['gpu']['device']} "
                        "(pass --device N to compare the same one)")
    if bs["marker"] != ns["marker"] or bs["pattern"] != ns["pattern"]:
        desc = lambda s: s["marker"] + (f" {s['pattern']!r}" if s["pattern"] else "")  # noqa: E731
        warnings.append(f"steps found differently: base {desc(bs)}, new {desc(ns)}")
    if b["source"]["graph_trace_mode"] == "graph" or n["source"]["graph_trace_mode"] == "graph":
        warnings.append("a trace has whole-graph CUDA graph records: its compute categories are null "
                        "(capture again with --cuda-graph-trace=node)")
    if steps.within_noise:
        warnings.append("the traced mean step moved by less than half the p10–p90 spread: the change may be noise")

    if ref.basis == "mixed":
        missing = "base" if ref.base_source == "traced" else "new"
        warnings.append(f"only one side has an unprofiled step: an unprofiled and a traced step are not compared "
                        f"(pass --{missing}-measured-step-ms X, the {missing.upper()} step measured without a profiler)")
    delta = Delta(reference_step_ms=ref, steps=steps, time_base=tb, per_step_ms=per_step, gaps=gaps,
                  kernel_ms_per_step=kernel, roofline=roof, largest_change=largest, advice_changed=tuple(changed),
                  warnings=tuple(warnings))
    return Diff(base=base, new=new, delta=delta)
