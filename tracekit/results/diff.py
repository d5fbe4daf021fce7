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

Beside ``delta``:

* ``kernels``: every kernel of either side, one row per kernel name and category (the category a kernel's
  context gives it: the same GEMM inside a draft range is ``drafting``), ``{"name", "category",
  "base_ms_per_step", "new_ms_per_step", "delta_ms_per_step"}`` (0 where a side lacks it), largest
  ``|delta_ms_per_step|`` first; the deltas add up to ``delta.kernel_total_ms_per_step.abs`` (the change of
  the sum of ``kernel_ms_per_step``). ``kernel_categories``: the same per category, largest change first.
  Null for a saved breakdown (it keeps no per-kernel table), with a warning.
* ``per_token`` (when the two sides emit different tokens per step — accept length x batch — or a speculative
  side has no accept length): the compared steps per token and tok/s on both sides (:class:`PerToken`,
  :func:`per_token`); the headline and the gate then compare per token, and a side without an accept length gets
  no per-step verdict.
* ``cross_rank`` (when a side is a rank set): the sets' cross-rank figures compared (:class:`CrossRankDelta`).
* ``gate`` (with ``fail_on_regression``): the CI verdict, pass / fail / inconclusive (:class:`Gate`,
  :func:`gate`).

A side is one trace's breakdown, a breakdown saved earlier (``breakdown --format json``: :func:`read_saved`
reads one of the current schema; an older one (``/1``, ``/2``) is refused with the reason: its blocks and
definitions are not this version's, analyse the trace again), or a **rank set** (several rank files analysed
together: ``tracekit.run.ranks.CrossRank``): its JSON side is the rank set's whole report, and what ``delta``
compares is the set as one (:func:`as_side`): its steps and reference step are its slowest rank's (collectives
make every rank wait for it), ``per_step_ms``, ``gaps``, ``kernel_ms_per_step`` and the kernels are means over
its ranks (per GPU, so sets of different sizes compare), levers and roofline the slowest rank's.

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
from tracekit.contract import BREAKDOWN_SCHEMA, DIFF_SCHEMA, Block, extension, to_dict
from tracekit.errors import BadOptionValue, UnreadableInput, UnsupportedSchema

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
    ``kernel_ms_per_step`` map each key of either side's block to its :class:`Change`; ``gaps`` each gap cause;
    ``kernel_total_ms_per_step`` is the sum of ``kernel_ms_per_step`` compared (what the ``kernels`` deltas add up
    to)."""

    reference_step_ms: ReferenceChange
    steps: StepsDelta
    time_base: TimeBaseDelta
    per_step_ms: dict[str, Change]
    gaps: dict[str, Change]
    kernel_ms_per_step: dict[str, Change]
    kernel_total_ms_per_step: Change
    roofline: RooflineDelta
    largest_change: str | None
    advice_changed: tuple[AdviceChange, ...]
    warnings: tuple[str, ...]


@dataclass(frozen=True)
class KernelChange(Block):
    """One of ``kernels``: a kernel name (with the category its context gives it) in ms per step on each side
    (0 where that side has no such kernel) and the change."""

    name: str
    category: str
    base_ms_per_step: float
    new_ms_per_step: float
    delta_ms_per_step: float


@dataclass(frozen=True)
class CategoryChange(Block):
    """One of ``kernel_categories``: a ``kernel_ms_per_step`` category on each side and the change (null where a
    side's category is null: a whole-graph capture's compute categories)."""

    category: str
    base_ms_per_step: float | None
    new_ms_per_step: float | None
    delta_ms_per_step: float | None


@dataclass(frozen=True)
class CrossRankDelta(Block):
    """``cross_rank`` of a diff where a side is a rank set: the contract's ``cross_rank`` figures of the two sets
    compared. ``step_ms`` = the set's step (its slowest rank's mean step); ``max_wait_ms`` = the longest rank's
    wait per step; ``mean_exposed_communication_ms`` = exposed communication per step, mean over ranks. A single
    trace counts as a set of one rank whose cross-rank figures are unknown (null)."""

    ranks: Change
    step_ms: Change
    skew_ms: Change
    transfer_ms: Change
    max_wait_ms: Change
    mean_exposed_communication_ms: Change
    slowest_rank: BaseNew
    pacing_rank: BaseNew
    step_ms_by_rank: BaseNew
    wait_ms_by_rank: BaseNew


@dataclass(frozen=True)
class PerToken(Block):
    """``per_token`` (when the two sides emit different tokens per step — accept length x batch — or a speculative
    side's accept length is unknown): the compared steps per token (:func:`per_token`).

    The contract's keys: ``base_ms_per_token`` / ``new_ms_per_token`` (the step over the tokens it emits, whole
    batch), ``base_tok_s`` / ``new_tok_s`` (1000 x tokens per step / step ms), ``change_pct`` (NEW's ms per token
    against BASE's: > 0 is slower) and ``source`` (each side's accept length: ``flag``, ``manifest``, ``plain``
    — no speculation, one token per sequence — or ``missing``: speculative without one; then that side's figures
    and ``change_pct`` are null). Extensions: ``basis`` (the steps divided: ``unprofiled`` or ``traced``),
    ``step_ms``, ``tokens_per_step``, ``accept_len`` and ``batch`` of each side, ``missing`` (the sides without an
    accept length) and ``tok_s_unit`` (what a tok/s figure counts)."""

    base_ms_per_token: float | None
    new_ms_per_token: float | None
    base_tok_s: float | None
    new_tok_s: float | None
    change_pct: float | None
    source: BaseNew
    basis: str
    step_ms: BaseNew
    tokens_per_step: BaseNew
    accept_len: BaseNew
    batch: BaseNew
    missing: tuple[str, ...]
    tok_s_unit: str


@dataclass(frozen=True)
class Gate(Block):
    """``gate`` (``--fail-on-regression PCT``): how the CI verdict was decided (:func:`gate`).

    The contract's keys: ``threshold_pct``, ``change_pct`` (NEW's reference step against BASE's, in %),
    ``ci_pct`` (the interval the noise allows for that change, in %; null when no side has enough steps to tell),
    ``noise_basis`` (how that interval was found, in words), ``failed`` and ``verdict`` (``pass``, ``fail``: exit
    3, ``inconclusive``: exit 4). Extensions: ``reason`` (the verdict in one line), ``basis`` (which steps were
    compared: ``unprofiled`` or ``traced``), ``statistic`` (``median`` or ``mean`` of the steps), ``method``
    (``unprofiled-bootstrap``: the manifests' unprofiled steps; ``bootstrap``, ``normal``: the traced steps';
    ``none``), ``compares`` (``step``, or ``token`` when the two sides emit different tokens per step: every
    percentage is then per token), ``traced_change_pct`` and ``traced_ci_pct`` (the traced steps' own change and
    interval), ``steps`` (the steps each side contributed to the noise), ``resamples``, ``seed`` and
    ``confidence``."""

    threshold_pct: float
    change_pct: float | None
    ci_pct: tuple[float, float] | None
    noise_basis: str
    failed: bool
    verdict: str
    reason: str
    basis: str
    statistic: str
    method: str
    compares: str
    traced_change_pct: float | None
    traced_ci_pct: tuple[float, float] | None
    steps: BaseNew
    resamples: int | None
    seed: int | None
    confidence: float


@dataclass(frozen=True)
class Diff(Block):
    """The result of :func:`diff`; ``to_dict()`` is the contract JSON (``tracekit.diff/3``). ``base``/``new`` are
    Breakdowns, :class:`SavedBreakdown` or a rank set's report (a dict); ``cross_rank`` is written when a side is a
    rank set, ``gate`` when a threshold was given."""

    SCHEMA = DIFF_SCHEMA

    base: object
    new: object
    delta: Delta
    kernels: tuple[KernelChange, ...] | None
    kernel_categories: tuple[CategoryChange, ...]
    per_token: PerToken | None = extension(omit=lambda d: d.per_token is None)
    cross_rank: CrossRankDelta | None = extension(omit=lambda d: d.cross_rank is None)
    gate: Gate | None = extension(omit=lambda d: d.gate is None)

    @property
    def failed(self) -> bool:
        """True when a gate was asked for and failed (the command's exit 3)."""
        return self.gate is not None and self.gate.failed

    @property
    def exit_code(self) -> int:
        """The command's exit code: 0 without a gate or when it passed, 3 when it failed, 4 when inconclusive."""
        if self.gate is None:
            return 0
        return {"fail": EXIT_GATE_FAILED, "inconclusive": EXIT_GATE_INCONCLUSIVE}.get(self.gate.verdict, 0)


EXIT_GATE_FAILED = 3  # the contract's exit code of a failed gate
EXIT_GATE_INCONCLUSIVE = 4  # ... and of a gate that cannot tell


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
        raise UnsupportedSchema(f"{path}: a saved tracekit.breakdown/{version} result; diff compares "
                            f"{BREAKDOWN_SCHEMA} breakdowns (reference steps, this version's definitions), "
                            "which it cannot be converted to: run tracekit diff on the trace files again")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise UnreadableInput(f"{path}: unreadable saved breakdown ({e})") from None
    if not isinstance(data, dict) or "ranks" in data or not isinstance(data.get("steps"), dict):
        raise UnsupportedSchema(f"{path}: not a single-trace {BREAKDOWN_SCHEMA} result (a saved multi-rank result? diff "
                            "the rank directory itself, or one rank's trace file)")
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


# ───────────────────────── per token ─────────────────────────

@dataclass(frozen=True)
class SideTokens:
    """The tokens one side's step emits (:func:`side_tokens`): ``tokens`` = accept length x batch (None when a
    speculative side has no accept length), ``accept_len`` (1 for a plain step), ``batch``, ``source`` (``flag``,
    ``manifest``, ``plain`` or ``missing``), ``speculative`` (the breakdown's ``advice.drafting.speculative``) and
    ``ignored`` (an accept length given for a side whose steps are plain decode: not applied)."""

    tokens: float | None
    accept_len: float | None
    batch: float | None
    source: str
    speculative: bool | None
    ignored: float | None = None
    batch_source: str | None = None


def side_tokens(view: dict) -> SideTokens:
    """The tokens a breakdown's step emits, from its ``roofline`` (``tokens_per_step`` = accept length x batch,
    ``accept_len`` and its source) and ``advice.drafting.speculative``. A plain step (``speculative`` false)
    emits its batch whatever accept length was given (``--accept-len`` given to ``diff`` applies to both sides;
    on a plain side it is ignored). A speculative step without an accept length emits an unknown number.

    >>> side_tokens({"roofline": {"tokens_per_step": 4.8, "accept_len": 1.2, "accept_len_source": "manifest"},
    ...              "advice": {"drafting": {"speculative": True}}}).tokens
    4.8
    >>> t = side_tokens({"roofline": {"tokens_per_step": 3.0, "accept_len": 3.0, "accept_len_source": "flag"},
    ...                  "advice": {"drafting": {"speculative": False}}})
    >>> t.tokens, t.source, t.ignored
    (1.0, 'plain', 3.0)
    >>> t = side_tokens({"roofline": {"tokens_per_step": 4.0, "accept_len": None},
    ...                  "advice": {"drafting": {"speculative": True}}})
    >>> t.tokens, t.batch, t.source
    (None, 4.0, 'missing')
    """
    roof = view.get("roofline") or {}
    spec = ((view.get("advice") or {}).get("drafting") or {}).get("speculative")
    tps = roof.get("tokens_per_step")
    acc = roof.get("accept_len")
    batch = (tps / acc if acc else tps) if tps is not None else None
    bsrc = roof.get("tokens_per_step_source")
    if spec is False and acc is not None:
        return SideTokens(batch, 1.0, batch, "plain", False, ignored=acc, batch_source=bsrc)
    if acc is not None:
        return SideTokens(tps, acc, batch, roof.get("accept_len_source") or "flag", spec, batch_source=bsrc)
    if spec:
        return SideTokens(None, None, batch, "missing", True, batch_source=bsrc)
    return SideTokens(tps, 1.0, batch, "plain", spec, batch_source=bsrc)


def _unknown_batch(bt: SideTokens, nt: SideTokens) -> str | None:
    """The side whose batch is unknown (``default``: 1 assumed) while the other's is known and differs — then the
    tokens per step of the two are not known to differ, and steps compare as they are — else None."""
    import math

    if bt.batch is None or nt.batch is None or math.isclose(bt.batch, nt.batch, rel_tol=1e-9):
        return None
    if bt.batch_source == "default" and nt.batch_source != "default":
        return "base"
    if nt.batch_source == "default" and bt.batch_source != "default":
        return "new"
    return None


def per_token(b: dict, n: dict, ref: ReferenceChange | None = None) -> PerToken | None:
    """``per_token`` of two breakdown dicts, or None when both emit the same known tokens per step (then steps
    compare as they are). The steps divided are the reference steps where both are unprofiled, else the traced
    mean steps (the kind both have)."""
    import math

    ref = ref if ref is not None else reference_change(b, n)
    bt, nt = side_tokens(b), side_tokens(n)
    if bt.tokens is not None and nt.tokens is not None and math.isclose(bt.tokens, nt.tokens, rel_tol=1e-9):
        return None
    if _unknown_batch(bt, nt) is not None and not (bt.source == "missing" or nt.source == "missing"):
        return None  # (a batch unknown on one side only: not known to differ; a warning says so)
    if ref.basis == "unprofiled":
        basis, steps = "unprofiled", (ref.base, ref.new)
    else:
        basis = "traced"
        steps = tuple((v.get("time_base") or {}).get("traced_step_ms", v["steps"].get("mean_ms")) for v in (b, n))
    ms = [st / t.tokens if st and t.tokens else None for st, t in zip(steps, (bt, nt))]
    tok_s = [1000.0 / m if m else None for m in ms]
    chg = 100.0 * (ms[1] / ms[0] - 1.0) if ms[0] and ms[1] is not None else None
    from tracekit.tokens import tok_s_unit

    units = {tok_s_unit(v.get("roofline") or {}) for v in (b, n)}
    return PerToken(base_ms_per_token=ms[0], new_ms_per_token=ms[1], base_tok_s=tok_s[0], new_tok_s=tok_s[1],
                    change_pct=chg, source=BaseNew(bt.source, nt.source), basis=basis, step_ms=BaseNew(*steps),
                    tokens_per_step=BaseNew(bt.tokens, nt.tokens), accept_len=BaseNew(bt.accept_len, nt.accept_len),
                    batch=BaseNew(bt.batch, nt.batch),
                    missing=tuple(side for side, t in (("base", bt), ("new", nt)) if t.source == "missing"),
                    tok_s_unit=units.pop() if len(units) == 1 else
                    f"tok/s for each side's whole batch ({bt.batch or 1:g} and {nt.batch or 1:g})")


def _token_warnings(b: dict, n: dict) -> list[str]:
    """An accept length given for a side whose steps are plain decode (not applied there)."""
    out = []
    unknown = _unknown_batch(side_tokens(b), side_tokens(n))
    if unknown is not None:
        other = "new" if unknown == "base" else "base"
        t = side_tokens(b if other == "base" else n)
        out.append(f"{other.upper()}'s steps decode a batch of {t.batch:g} ({t.batch_source}), {unknown.upper()}'s "
                   "batch is unknown: the tokens per step are not known to differ, so the steps are compared as they "
                   "are")
    for side, v in (("BASE", b), ("NEW", n)):
        t = side_tokens(v)
        if t.ignored is not None:
            out.append(f"{side}'s steps are plain decode (no speculation found): the accept length {t.ignored:g} "
                       f"({(v.get('roofline') or {}).get('accept_len_source') or 'flag'}) is not applied to it "
                       "(one token per sequence a step)")
    return out




# ───────────────────────── the sides ─────────────────────────

@dataclass(frozen=True)
class Side:
    """One side of a diff as :func:`diff` reads it (:func:`as_side`): ``result`` is what the JSON embeds,
    ``view`` the breakdown-shaped dict the deltas compare, ``periods_ms`` the traced steps' periods (None for a
    saved breakdown), ``kernels`` ms per step per (kernel name, category) (None for a saved breakdown),
    ``cross_rank`` the rank set's contract ``cross_rank`` object (None for one trace) and ``ranks`` its size."""

    result: object
    view: dict
    periods_ms: tuple[float, ...] | None
    kernels: dict[tuple[str, str], float] | None
    cross_rank: dict | None = None
    ranks: int = 1


def _kernel_table(b) -> dict[tuple[str, str], float] | None:
    top = getattr(b, "top_kernels", None)
    if top is None:
        return None
    return {(name, cat): ms for name, cat, ms in top.select("name", "category", "per_step_ms").iter_rows()}


def _periods(b) -> tuple[float, ...] | None:
    ps = getattr(b, "per_step", None)
    return None if ps is None else tuple(float(x) for x in ps["period_ms"].to_list())


def _mean_numbers(blocks: list[dict]) -> dict:
    """Per key, the mean over ``blocks`` of a number (null when any block's is null); other values (a list) are
    the first block's."""
    out = {}
    for k in dict.fromkeys(k for blk in blocks for k in blk):
        vals = [blk.get(k) for blk in blocks]
        if all(v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)) for v in vals):
            out[k] = None if any(v is None for v in vals) else sum(vals) / len(vals)
        else:
            out[k] = vals[0]
    return out


def as_side(x, label: str | None = None) -> Side:
    """The :class:`Side` of a Breakdown, a :class:`SavedBreakdown`, a rank set (an object with
    ``rank_breakdowns`` and ``report()``: ``tracekit.run.ranks.CrossRank``) or a :class:`Side` (as it is).

    A rank set is compared as one: its view's ``steps``, ``time_base``, ``gpu``, ``roofline`` and ``advice`` are
    its slowest rank's (the longest mean step: collectives make every rank wait for it), ``per_step_ms``,
    ``gaps`` and ``kernel_ms_per_step`` the means over its ranks, and its kernels too (ms per step per GPU);
    ``label`` names it (its directory) in ``source.path``."""
    if isinstance(x, Side):
        return x
    from tracekit.results.rankset import RankSet

    if isinstance(x, RankSet):
        x = x.cross_rank
    if isinstance(x, SavedBreakdown):
        return Side(result=x, view=x.data, periods_ms=None, kernels=None)
    if hasattr(x, "rank_breakdowns") and hasattr(x, "report"):
        bds = list(x.rank_breakdowns)
        if not bds:
            raise BadOptionValue("a rank set without ranks cannot be compared")
        dicts = [to_dict(b) for b in bds]
        slow = max(range(len(dicts)), key=lambda i: dicts[i]["steps"]["mean_ms"])
        view = dict(dicts[slow])
        view["per_step_ms"] = _mean_numbers([d["per_step_ms"] for d in dicts])
        view["gaps"] = _mean_numbers([d["gaps"] for d in dicts])
        view["kernel_ms_per_step"] = _mean_numbers([d["kernel_ms_per_step"] for d in dicts])
        view["source"] = {**view["source"], "path": label or f"{len(dicts)} rank files"}
        kernels: dict[tuple[str, str], float] | None = {}
        for b in bds:
            t = _kernel_table(b)
            if t is None:
                kernels = None
                break
            for k, ms in t.items():
                kernels[k] = kernels.get(k, 0.0) + ms / len(bds)
        return Side(result=x.report(), view=view, periods_ms=_periods(bds[slow]), kernels=kernels,
                    cross_rank=to_dict(x), ranks=len(bds))
    return Side(result=x, view=to_dict(x), periods_ms=_periods(x), kernels=_kernel_table(x))


# ───────────────────────── kernels and ranks ─────────────────────────

def _total(block: dict) -> float | None:
    vals = [v for v in block.values() if v is not None]
    return sum(vals) if vals else None


def kernel_changes(b: Side, n: Side) -> tuple[KernelChange, ...] | None:
    """Every kernel (name, category) of either side in ms per step, largest ``|delta|`` first (then by name);
    None when a side keeps no per-kernel times (a saved breakdown)."""
    if b.kernels is None or n.kernels is None:
        return None
    rows = []
    for key in dict.fromkeys([*b.kernels, *n.kernels]):  # (one entry per kernel name, not per event)
        bv, nv = b.kernels.get(key, 0.0), n.kernels.get(key, 0.0)
        rows.append(KernelChange(name=key[0], category=key[1], base_ms_per_step=bv, new_ms_per_step=nv,
                                 delta_ms_per_step=nv - bv))
    return tuple(sorted(rows, key=lambda r: (-abs(r.delta_ms_per_step), r.name, r.category)))


def category_changes(kernel: dict[str, Change]) -> tuple[CategoryChange, ...]:
    """``delta.kernel_ms_per_step`` as a list, largest ``|change|`` first (unknown changes last)."""
    rows = [CategoryChange(category=k, base_ms_per_step=c.base, new_ms_per_step=c.new, delta_ms_per_step=c.abs)
            for k, c in kernel.items()]
    return tuple(sorted(rows, key=lambda r: (r.delta_ms_per_step is None, -abs(r.delta_ms_per_step or 0))))


def cross_rank_delta(b: Side, n: Side) -> CrossRankDelta:
    """The two sets' cross-rank figures compared (a single trace: a set of one whose cross-rank figures are
    unknown)."""
    def fig(s: Side, key: str):
        cr = s.cross_rank
        if cr is None:
            return None
        if key == "max_wait_ms":
            w = [x for x in cr["wait_ms_by_rank"] if x is not None]
            return max(w) if w else None
        if key == "mean_exposed_communication_ms":
            e = cr["exposed_communication_ms_by_rank"]
            return None if not e or any(x is None for x in e) else sum(e) / len(e)
        return cr[key]

    pick = {k: change(fig(b, k), fig(n, k))
            for k in ("skew_ms", "transfer_ms", "max_wait_ms", "mean_exposed_communication_ms")}
    return CrossRankDelta(
        ranks=change(b.ranks, n.ranks), step_ms=change(b.view["steps"]["mean_ms"], n.view["steps"]["mean_ms"]),
        **pick, slowest_rank=BaseNew(fig(b, "slowest_rank"), fig(n, "slowest_rank")),
        pacing_rank=BaseNew(fig(b, "pacing_rank"), fig(n, "pacing_rank")),
        step_ms_by_rank=BaseNew(fig(b, "step_ms_by_rank"), fig(n, "step_ms_by_rank")),
        wait_ms_by_rank=BaseNew(fig(b, "wait_ms_by_rank"), fig(n, "wait_ms_by_rank")))


# ───────────────────────── the gate ─────────────────────────

GATE_RESAMPLES = 4000  # bootstrap resamples (the interval's ends move by < 0.2 points between seeds at this count)
GATE_SEED = 0  # a fixed seed: the same two traces give the same verdict
GATE_CONFIDENCE = 0.95
MIN_GATE_STEPS = 3  # fewer steps on a side: no noise estimate (the threshold alone decides)
_Z = {0.90: 1.6449, 0.95: 1.9600, 0.99: 2.5758}
_P10_P90_SIGMAS = 2.5631  # a normal distribution's p90 - p10, in standard deviations


def parse_threshold(text) -> float:
    """``--fail-on-regression``'s value in percent: ``3%``, ``3`` or ``0.5%``.

    >>> parse_threshold("3%"), parse_threshold(" 2.5 "), parse_threshold(0)
    (3.0, 2.5, 0.0)
    >>> parse_threshold("-1%")
    Traceback (most recent call last):
    ...
    tracekit.errors.BadOptionValue: --fail-on-regression -1%: a percentage >= 0, e.g. 3%
    """
    s = str(text).strip()
    try:
        v = float(s[:-1] if s.endswith("%") else s)
    except ValueError:
        v = float("nan")
    if not v >= 0 or v == float("inf"):
        raise BadOptionValue(f"--fail-on-regression {text}: a percentage >= 0, e.g. 3%")
    return v


def bootstrap_ratio(base, new, statistic: str = "median", *, resamples: int = GATE_RESAMPLES,
                    seed: int = GATE_SEED, confidence: float = GATE_CONFIDENCE) -> tuple[float, float]:
    """The percentile bootstrap interval of ``statistic(new) / statistic(base)`` over the two samples (each side
    resampled with replacement, ``resamples`` times, from a generator seeded with ``seed``: deterministic).

    >>> lo, hi = bootstrap_ratio([10.0, 10.2, 9.9, 10.1, 10.0], [11.0, 11.1, 10.9, 11.2, 11.0])
    >>> 1.07 < lo < 1.10 < hi < 1.13
    True
    """
    import numpy as np

    f = np.median if statistic == "median" else np.mean
    b, n = np.asarray(base, dtype=float), np.asarray(new, dtype=float)
    rng = np.random.default_rng(seed)
    out = np.empty(resamples)
    chunk = max(1, 4_000_000 // max(b.size, n.size))  # (resamples per batch: bounded memory for long traces)
    for s in range(0, resamples, chunk):
        k = min(chunk, resamples - s)
        rb = f(b[rng.integers(0, b.size, size=(k, b.size))], axis=1)
        rn = f(n[rng.integers(0, n.size, size=(k, n.size))], axis=1)
        out[s:s + k] = rn / rb
    alpha = 1 - confidence
    lo, hi = np.quantile(out, [alpha / 2, 1 - alpha / 2])
    return float(lo), float(hi)


def _normal_ratio(bs: dict, ns: dict, statistic: str, confidence: float) -> tuple[float, float] | None:
    """The interval of the ratio of two sides' traced-step statistics from their p10-p90 spread and count
    (normal steps: sd = (p90 - p10) / 2.563; the median's standard error 1.2533 x the mean's), on the log scale."""
    import math

    parts = []
    for st in (bs, ns):
        sd, cnt, m = _spread(st), st.get("count"), st.get(f"{statistic}_ms")
        if sd is None or not cnt or not m:
            return None
        parts.append((sd / _P10_P90_SIGMAS) * (1.2533 if statistic == "median" else 1.0) / math.sqrt(cnt) / m)
    r = ns[f"{statistic}_ms"] / bs[f"{statistic}_ms"]
    z = _Z.get(round(confidence, 2), 1.96)
    w = z * math.sqrt(parts[0] ** 2 + parts[1] ** 2)
    return r * math.exp(-w), r * math.exp(w)


def _pct(ratio: float) -> float:
    return 100.0 * (ratio - 1.0)


def _signed_pct(x: float) -> str:
    """``+1.8%``, ``-4.6%``, ``±0.0%`` (not ``-0.0%``)."""
    return "±0.0%" if abs(x) < 0.05 else f"{x:+,.1f}%"


def _unprofiled_periods(s: Side) -> tuple[float, ...] | None:
    """The steps a side's manifest timed without a profiler (``manifest.unprofiled_periods_ms``), when its reference
    step is the manifest's (a ``--measured-step-ms`` flag is one number: no spread)."""
    v = s.view
    if (v.get("time_base") or {}).get("unprofiled_source") != "manifest":
        return None
    periods = (v.get("manifest") or {}).get("unprofiled_periods_ms")
    return tuple(periods) if periods else None


def _intervals(b: Side, n: Side, basis: str, statistic: str, ratio: float | None, traced_ratio: float | None,
               counts: tuple[int, int], *, resamples: int, seed: int, confidence: float):
    """:func:`gate`'s noise: the interval of the compared ratio and of the traced ratio, the method that gave
    them (``unprofiled-bootstrap``, ``bootstrap``, ``normal`` or ``none``) and the step counts it rests on."""
    bs, ns = b.view["steps"], n.view["steps"]
    interval, traced_interval, method = None, None, "none"
    ub, un = (_unprofiled_periods(b), _unprofiled_periods(n)) if basis == "unprofiled" else (None, None)
    if ub and un and ratio is not None:
        counts = (len(ub), len(un))
        if min(counts) >= MIN_GATE_STEPS:
            lo, hi = bootstrap_ratio(ub, un, "median", resamples=resamples, seed=seed, confidence=confidence)
            if traced_ratio is not None:
                lo, hi = min(lo, traced_ratio), max(hi, traced_ratio)
            interval, method = (lo, hi), "unprofiled-bootstrap"
        if traced_ratio is not None and b.periods_ms and n.periods_ms and min(len(b.periods_ms),
                                                                              len(n.periods_ms)) >= MIN_GATE_STEPS:
            traced_interval = bootstrap_ratio(b.periods_ms, n.periods_ms, statistic, resamples=resamples, seed=seed,
                                              confidence=confidence)
    elif traced_ratio is not None and min(counts) >= MIN_GATE_STEPS:
        if b.periods_ms is not None and n.periods_ms is not None:
            traced_interval = bootstrap_ratio(b.periods_ms, n.periods_ms, statistic, resamples=resamples, seed=seed,
                                              confidence=confidence)
            method = "bootstrap"
        else:
            traced_interval = _normal_ratio(bs if b.periods_ms is None else _stats(b.periods_ms),
                                            ns if n.periods_ms is None else _stats(n.periods_ms), statistic,
                                            confidence)
            method = "normal" if traced_interval is not None else "none"
        interval = traced_interval
        if interval is not None and basis == "unprofiled" and ratio is not None:
            scale = ratio / traced_ratio
            interval = (min(interval[0] * scale, interval[0]), max(interval[1] * scale, interval[1]))
    return interval, traced_interval, method, counts


def _noise_basis(method: str, basis: str, statistic: str, counts: tuple[int, int], conf: str, resamples: int,
                 seed: int, pt) -> str:
    """The ``noise_basis`` sentence: how the interval was had (``method``), and the per-token scaling when ``pt``
    (a :func:`per_token` with both tokens per step known) is given."""
    steps = f"{counts[0]} BASE and {counts[1]} NEW steps"
    if method == "unprofiled-bootstrap":
        noise = (f"bootstrap of the ratio of the medians of the steps each manifest timed without a profiler "
                 f"(unprofiled.periods_ms: {steps}, {resamples} resamples, seed {seed}, {conf} percentile interval), "
                 "widened to cover the traced steps' own change (the other clock of the same two runs)")
    elif method == "bootstrap":
        noise = (f"bootstrap of the ratio of the traced steps' {statistic}s ({steps}, {resamples} resamples, seed "
                 f"{seed}, {conf} percentile interval)")
    elif method == "normal":
        noise = (f"normal approximation of the ratio of the traced steps' {statistic}s from each side's p10-p90 "
                 f"spread and step count ({steps}; a saved breakdown keeps no per-step times), {conf} interval")
    else:
        noise = f"none: fewer than {MIN_GATE_STEPS} steps on a side ({steps}); no noise estimate"
    if method in ("bootstrap", "normal") and basis == "unprofiled":
        noise += (", scaled to the unprofiled reference steps and widened to cover the traced steps' own change "
                  "(no manifest holds its unprofiled steps: the noise of an unprofiled step is its run's traced-step "
                  "noise)")
    if pt is not None:
        noise += (f"; per token: every ratio x BASE's {pt.tokens_per_step.base:g} / NEW's {pt.tokens_per_step.new:g} "
                  "tokens per step (accept lengths taken as exact)")
    return noise


def gate(base, new, threshold_pct: float, *, resamples: int = GATE_RESAMPLES, seed: int = GATE_SEED,
         confidence: float = GATE_CONFIDENCE) -> Gate:
    """The CI verdict, one of three (``verdict``): ``fail`` when NEW's reference step is slower than BASE's by
    more than ``threshold_pct`` **and** beyond the noise of the two sides' steps; ``inconclusive`` when it is slower
    by more than the threshold but the interval includes no change, when a side has too few steps for a noise
    estimate, or when nothing comparable is known (a speculative side without an accept length); else ``pass``.
    ``base``/``new``: anything :func:`as_side` takes.

    * **What is compared** (``change_pct``): the reference steps, unprofiled where both sides have one (basis
      ``unprofiled``); else the traced mean steps (basis ``traced``; also when one side is unprofiled and the
      other traced: the traced steps are the kind both have). When the two sides emit different tokens per step
      (:func:`per_token`), the steps per token (``compares`` ``token``): every ratio times BASE's tokens per step
      over NEW's (the accept lengths taken as exact).
    * **The noise** (``ci_pct``). Where both reference steps are their manifests' and both manifests hold the steps
      they timed without a profiler (``unprofiled.periods_ms``, at least :data:`MIN_GATE_STEPS` each): a
      percentile bootstrap (``resamples``, ``seed``) of the ratio of those steps' medians (``method``
      ``unprofiled-bootstrap``), widened to cover the traced steps' own change (the medians of the same runs'
      traced steps: where the two clocks of one pair of runs disagree in direction, the change is not one the
      trace confirms). Otherwise from the traced steps: a bootstrap of the ratio of their medians (unprofiled
      basis) or means (traced basis); an unprofiled step's noise is then its run's traced-step interval scaled by
      (reference ratio / traced ratio) and widened to cover the traced interval itself (``bootstrap``). A saved
      breakdown keeps no per-step times: a normal approximation from its p10-p90 spread and count (``normal``).
      With fewer than :data:`MIN_GATE_STEPS` steps on a side there is no estimate (``ci_pct`` null).
    * ``failed`` = (``verdict`` == ``fail``).
    """
    b, n = as_side(base), as_side(new)
    bs, ns = b.view["steps"], n.view["steps"]
    ref = reference_change(b.view, n.view)
    basis = "unprofiled" if ref.basis == "unprofiled" else "traced"
    statistic = "median" if basis == "unprofiled" else "mean"
    pt = per_token(b.view, n.view, ref)
    factor = 1.0
    if pt is not None and not pt.missing:
        factor = pt.tokens_per_step.base / pt.tokens_per_step.new

    def traced(s: Side) -> float | None:
        if s.periods_ms:
            import statistics

            return (statistics.median if statistic == "median" else statistics.fmean)(s.periods_ms)
        return s.view["steps"].get(f"{statistic}_ms")

    tb, tn = traced(b), traced(n)
    traced_ratio = tn / tb if tb and tn is not None else None
    if basis == "unprofiled":
        shown = (ref.base, ref.new)
        ratio = ref.new / ref.base if ref.base else None
    else:
        shown = (bs.get("mean_ms"), ns.get("mean_ms"))
        ratio = traced_ratio
    counts = (len(b.periods_ms) if b.periods_ms is not None else bs.get("count") or 0,
              len(n.periods_ms) if n.periods_ms is not None else ns.get("count") or 0)

    interval, traced_interval, method, counts = _intervals(b, n, basis, statistic, ratio, traced_ratio, counts,
                                                           resamples=resamples, seed=seed, confidence=confidence)
    # per token: every ratio times BASE's tokens per step over NEW's
    scaled = lambda iv: (_pct(iv[0] * factor), _pct(iv[1] * factor)) if iv is not None else None  # noqa: E731
    ci, traced_ci = scaled(interval), scaled(traced_interval)
    missing = pt.missing if pt is not None else ()
    change_pct = _pct(ratio * factor) if ratio is not None and not missing else None
    traced_pct = _pct(traced_ratio * factor) if traced_ratio is not None and not missing else None
    if change_pct is None:
        verdict = "inconclusive"
    elif change_pct <= threshold_pct:
        verdict = "pass"
    elif ci is not None and ci[0] > 0:
        verdict = "fail"
    else:
        verdict = "inconclusive"

    conf = f"{100 * confidence:g}%"
    noise = _noise_basis(method, basis, statistic, counts, conf, resamples, seed, pt if not missing else None)
    reason = _gate_reason(ref.basis, basis, statistic, shown, change_pct, threshold_pct, ci, traced_pct, verdict,
                          conf, pt)
    sampled = method in ("bootstrap", "unprofiled-bootstrap")
    return Gate(threshold_pct=float(threshold_pct), change_pct=change_pct, ci_pct=ci, noise_basis=noise,
                failed=verdict == "fail", verdict=verdict, reason=reason, basis=basis, statistic=statistic,
                method=method, compares="token" if pt is not None else "step", traced_change_pct=traced_pct,
                traced_ci_pct=traced_ci, steps=BaseNew(counts[0], counts[1]), resamples=resamples if sampled else None,
                seed=seed if sampled else None, confidence=confidence)


def _stats(periods) -> dict:
    """The statistics :func:`_normal_ratio` reads, of a side whose periods are known."""
    import statistics

    xs = sorted(periods)
    q = statistics.quantiles(xs, n=10, method="inclusive") if len(xs) > 1 else [xs[0]] * 9
    return {"count": len(xs), "mean_ms": statistics.fmean(xs), "median_ms": statistics.median(xs),
            "p10_ms": q[0], "p90_ms": q[-1]}


def _gate_reason(ref_basis: str, basis: str, statistic: str, shown, change_pct, threshold: float, ci, traced_pct,
                 verdict: str, conf: str, pt: PerToken | None = None) -> str:
    """The gate's verdict in one line."""
    what = "unprofiled step" if basis == "unprofiled" else "traced mean step"
    pre = ("the reference steps are of different kinds (one unprofiled, one traced): the traced steps compared; "
           if ref_basis == "mixed" else "")
    ms = f"{shown[0]:.3f} → {shown[1]:.3f} ms" if None not in shown else "—"
    if pt is not None:
        if pt.missing:
            who = " and ".join(s.upper() for s in pt.missing)
            flags = " / ".join(f"--{s}-accept-len X" for s in pt.missing)
            return (f"{who} {'is' if len(pt.missing) == 1 else 'are'} speculative without an accept length: the "
                    f"tokens a step emits are unknown, so steps are not compared ({what}s {ms}); pass {flags} "
                    "(tokens emitted per step per sequence, the bonus token included)")
        what = f"{what} per token"
        tps = f"{pt.tokens_per_step.base:g} → {pt.tokens_per_step.new:g} tokens a step"
        ms = (f"{pt.base_ms_per_token:.3f} → {pt.new_ms_per_token:.3f} ms per token, {tps}"
              if pt.base_ms_per_token is not None and pt.new_ms_per_token is not None else tps)
    if change_pct is None:
        return pre + f"no {what} to compare: the gate cannot tell"
    thr = f"{threshold:g}%"
    band = f"{conf} interval {_signed_pct(ci[0])} to {_signed_pct(ci[1])}" if ci is not None else None
    if verdict == "fail":
        return pre + (f"NEW's {what} is {change_pct:,.1f}% slower than BASE's ({ms}): above the {thr} threshold, "
                      f"beyond the step noise ({band})")
    if change_pct <= 0:
        return pre + f"NEW's {what} is not slower than BASE's ({ms}, {_signed_pct(change_pct)})"
    if change_pct <= threshold:
        return pre + f"NEW's {what} is {change_pct:,.1f}% slower than BASE's ({ms}): within the {thr} threshold"
    if band is None:
        return pre + (f"NEW's {what} is {change_pct:,.1f}% slower than BASE's ({ms}): above the {thr} threshold, but "
                      "too few steps on a side to tell it from noise")
    traced = ""
    if basis == "unprofiled" and traced_pct is not None:
        traced = f"; the traced steps' {statistic} changed {_signed_pct(traced_pct)}"
    return pre + (f"NEW's {what} is {change_pct:,.1f}% slower than BASE's ({ms}): above the {thr} threshold but "
                  f"not beyond the step noise ({band} includes no change{traced})")


# ───────────────────────── the diff ─────────────────────────

def diff(base, new, *, fail_on_regression: float | None = None, labels: tuple[str | None, str | None] = (None, None),
         warnings=()) -> Diff:
    """Compare two breakdowns (``base`` first; each anything :func:`as_side` takes: a Breakdown, a saved breakdown,
    a rank set). ``fail_on_regression``: the gate's threshold in percent (:func:`gate`); ``labels``: the rank
    sets' names (their directories); ``warnings``: the caller's own (e.g. how the devices were paired), listed
    first. See the module docstring for the keys."""
    bside, nside = as_side(base, labels[0]), as_side(new, labels[1])
    b, n = bside.view, nside.view
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

    sets = bside.cross_rank is not None or nside.cross_rank is not None
    warnings = list(warnings)
    if (b["gpu"]["name"] or None) != (n["gpu"]["name"] or None):
        warnings.append(f"different GPUs: base {b['gpu']['name'] or 'unknown'}, new {n['gpu']['name'] or 'unknown'}")
    if b["gpu"]["device"] != n["gpu"]["device"] and not sets:
        warnings.append(f"different devices analysed: base GPU {b['gpu']['device']}, new GPU {n['gpu']['device']} "
                        "(pass --device N, or --base-device / --new-device, to pick them)")
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
    pt = per_token(b, n, ref)
    warnings.extend(_token_warnings(b, n))
    if pt is not None and pt.missing:
        warnings.append(" and ".join(x.upper() for x in pt.missing) + " is speculative without an accept length: "
                        "its steps emit an unknown number of tokens, so no per-step verdict is given (pass "
                        + " / ".join(f"--{x}-accept-len X" for x in pt.missing) + ")")
    kernels = kernel_changes(bside, nside)
    if kernels is None:
        which = " and ".join(s for s, x in (("BASE", bside), ("NEW", nside)) if x.kernels is None)
        warnings.append(f"{which}: a saved breakdown keeps no per-kernel times, so `kernels` is null (diff the "
                        "trace files for the kernels that moved)")
    if sets and bside.ranks != nside.ranks:
        warnings.append(f"BASE has {bside.ranks} rank(s), NEW {nside.ranks}: per-step figures and kernels are per GPU "
                        "(means over each set's ranks), steps the slowest rank's")
    delta = Delta(reference_step_ms=ref, steps=steps, time_base=tb, per_step_ms=per_step, gaps=gaps,
                  kernel_ms_per_step=kernel,
                  kernel_total_ms_per_step=change(_total(b["kernel_ms_per_step"]), _total(n["kernel_ms_per_step"])),
                  roofline=roof, largest_change=largest, advice_changed=tuple(changed), warnings=tuple(warnings))
    g = gate(bside, nside, fail_on_regression) if fail_on_regression is not None else None
    return Diff(base=bside.result, new=nside.result, delta=delta, kernels=kernels,
                kernel_categories=category_changes(kernel), per_token=pt, cross_rank=cross_rank_delta(bside, nside) if sets else None,
                gate=g)
