"""Partition: each analysed step's period, split exactly into categories and its gaps by cause.

The second half of a breakdown (the first is ``tracekit.analyses.attribution``). Definitions
(../shared/spec/CONTRACT.md, ``tracekit.breakdown/2``):

* A step's period runs from its first GPU activity's start to the next step's first; the last step ends at
  the later of its last activity's end and its range's end.
* Steps are excluded, with a reason, when they are cut by the capture window, launched no GPU work, are the
  last of >= 3 steps (no following step, so no trailing host time), are a warm-up or transition step (their
  kernel sequence differs from the steady one), or are not of the selected phase.
* Activities of one stream are serialised: each starts at the later of its own start and the previous
  activity's end on that stream (a programmatic-dependent-launch kernel starts early but waits for its
  predecessor), so same-stream overlap is neither a gap nor hidden communication.
* ``per_step_ms`` partitions the period exactly: each instant goes to the first active category of
  ``PRIORITY``; the GPU-idle rest is ``launch_gaps`` (between the step's first and last activity) and
  ``idle`` (after its last activity); ``tracekit.analyses.gaps`` splits both by cause.

Computed with cumulative unions: exclusive(c) = |U(categories <= c)| - |U(categories < c)|, each union a
sorted sweep (``tracekit.intervals``). No Python loop touches events.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import polars as pl

from tracekit.analyses.attribution import THREADS_FROM_ROWS, Attribution, in_steps_of
from tracekit.analyses.gaps import (
    LARGEST,
    after_waits,
    blocking_copies,
    host_waits,
    name_gaps,
    stall_segments,
    stalled_part,
    waits_before,
)
from tracekit.categories import CUT_BY_WINDOW as CUT
from tracekit.categories import KERNEL_CATEGORIES, LAST_STEP, PRIORITY, UNATTRIBUTED
from tracekit.categories import NO_GPU_WORK as NO_WORK
from tracekit.categories import NOT_SELECTED_PHASE as PHASE
from tracekit.categories import WARM_UP as WARMUP
from tracekit.errors import NoSteps
from tracekit.intervals import by_pieces, cumulative_union_lengths, keep_rows
from tracekit.parallel import started
from tracekit.trace import Trace


@dataclass(frozen=True)
class StepTable:
    """The partition of the analysed steps of one device.

    ``table``: one row per analysed step, in time order: ``step`` (window id), ``p_start``/``p_end``/``period``
    (ns), ``x_<category>`` for every busy category and ``x_launch_gaps``/``x_idle`` (the exact partition, ns),
    ``g_launch_overhead``/``g_host_stalls``/``g_graph_bubbles``/``g_between_steps`` (the gaps by cause, ns),
    ``g_after_waits`` (the part of the launch overhead after a host wait's return, ns: ``gaps.after_waits``),
    ``k_<category>`` (plain kernel time per category, unclipped durations), ``k_graphed``/``k_all`` (kernel
    time replayed from graphs / all), ``n_kernels``, ``n_launched`` (work launched one by one),
    ``n_graph_launches``, ``draft_span`` (wall time of the draft phases on the GPU timeline), ``phase``, and the
    step window's ``pid``, ``tid``, ``w_start``, ``w_end``.

    ``activities``: the attributed activities of the analysed steps (``Attribution.activities``' columns),
    ``start``/``end`` serialised per stream and clipped to the step's period, ``start0`` the recorded start.
    ``largest``: the longest single gaps (contract ``gaps.largest``, plus ``cause``). ``periods``: every step
    window with GPU work, analysed or not, in time order: ``step``, ``p_start``, ``p_end``, ``period`` (ns),
    ``phase`` and ``reason`` (why it is excluded; null = analysed).
    """

    attribution: Attribution
    table: pl.DataFrame
    periods: pl.DataFrame
    activities: pl.DataFrame
    largest: tuple[dict, ...]
    excluded_reasons: dict[str, int]
    phase: str
    decode_advice: bool  # the analysed steps include decode (or unknown) steps: decode advice applies
    warnings: tuple[str, ...]
    # steps.phases: every step window with GPU work on the device, by phase, before --phase selects
    phases_found: dict[str, int] | None = None
    # why decode advice does not apply, once, right for the window (None where it applies)
    phase_note: str | None = None
    # every kernel counted: the device's kernel time in the analysed steps and outside them, by reason (:func:`coverage`)
    coverage: dict | None = None

    @property
    def device(self) -> int:
        return self.attribution.device

    @property
    def count(self) -> int:
        return self.table.height

    @property
    def phase_label(self) -> str:
        """The analysed steps' phase in words: ``non-decode`` for steps that show no LLM decode work (phase
        unknown), else the phase."""
        note = self.phase_note or ""
        if note.startswith("no decode advice: these steps show no LLM decode work"):
            return "non-decode"
        return self.phase

    @property
    def excluded(self) -> int:
        return sum(self.excluded_reasons.values())


def _per_step_slots(n: int, steps: pl.Series, values: pl.Series, at: pl.Series) -> pl.Series:
    """``values`` (one per ``steps`` id) looked up for each id in ``at``: a scatter then a gather, no join."""
    slots = pl.Series([None], dtype=values.dtype).extend_constant(None, max(n - 1, 0))
    return slots.scatter(steps, values).gather(at.cast(pl.UInt32))


def rows_of_steps(df: pl.DataFrame, steps: pl.Series, present: pl.Series) -> pl.DataFrame:
    """The rows of ``df`` whose ``step`` is one of ``steps`` (distinct, each with rows in ``df``; ``present``: every
    step ``df`` has rows of). When ``df``'s steps are in order and no other present step lies between the least and
    the greatest of ``steps`` (the analysed steps: every step but the warm-up and the last), those rows are one run,
    found by two binary searches; else :func:`keep_rows` of a membership test of every row (ten million rows: a
    hash probe each).

    >>> df = pl.DataFrame({"step": [1, 1, 2, 3, 3, 4]})
    >>> rows_of_steps(df, pl.Series([2, 3]), pl.Series([1, 2, 3, 4]))["step"].to_list()
    [2, 3, 3]
    >>> rows_of_steps(df, pl.Series([1, 3]), pl.Series([1, 2, 3, 4]))["step"].to_list()
    [1, 1, 3, 3]
    """
    s = df["step"]
    if steps.len() and s.null_count() == 0 and s.is_sorted() and bool(steps.is_in(present.implode()).all()):
        lo, hi = steps.min(), steps.max()
        if present.filter((present >= lo) & (present <= hi)).len() == steps.len():
            first = int(s.search_sorted(lo, side="left"))
            return df.slice(first, int(s.search_sorted(hi, side="right")) - first)
    return keep_rows(df, s.is_in(steps.implode()))


def serialise(acts: pl.DataFrame) -> pl.DataFrame:
    """Each activity starts at the later of its start and the previous activity's end on its stream (rows in
    start order); an activity wholly inside its predecessor becomes zero-length there.

    >>> a = pl.DataFrame({"stream": [7, 7, 8], "start": [0, 5, 6], "end": [10, 12, 9]})
    >>> serialise(a).rows()
    [(7, 0, 10), (7, 10, 12), (8, 6, 9)]
    """
    prev = pl.col("end").cum_max().shift(1)
    # (several streams, null counting as one: n_unique() > 1, without hashing every row; reduced in a query, which
    # reads a column of one value kept as that value (attribution's merge) without making its rows)
    nulls, lo, hi = acts.select(pl.col("stream").null_count(), pl.col("stream").min().alias("lo"),
                                pl.col("stream").max().alias("hi")).row(0)
    if 0 < nulls < acts.height or (nulls == 0 and acts.height and lo != hi):
        prev = prev.over("stream")
    elif _already_serial(acts):
        return acts  # (one stream, no overlap: nothing moves, and ten million rows need no new columns)
    start = pl.max_horizontal("start", prev.fill_null(pl.col("start")))
    return acts.with_columns(start=start).with_columns(end=pl.max_horizontal("end", "start"))


def _already_serial(acts: pl.DataFrame) -> bool:
    """Rows (start order) that :func:`serialise` leaves as they are on one stream: each starts at or after the
    previous one's end and none ends before it starts (then the ends never decrease, so the previous end is the
    running maximum). Two comparisons of slices: bitmasks, no column of ten million values."""
    n = acts.height
    s, e = acts["start"], acts["end"]
    if s.null_count() or e.null_count():
        return False
    return bool((e >= s).all()) and (n < 2 or bool((s.slice(1) >= e.slice(0, n - 1)).all()))


def periods(attr: Attribution, in_steps: pl.DataFrame, path: str = "trace"
            ) -> tuple[pl.DataFrame, Counter, list[str]]:
    """Every step window with GPU work and its period (``p_start``, ``p_end``), in time order; the reasons the
    other windows are excluded."""
    windows = attr.steps.windows
    per = in_steps.group_by("step").agg(
        first=pl.col("start").min(), last=pl.col("end").max(), n_acts=pl.len(),
        n_kernels=(pl.col("kind") == "kernel").sum(), first_launch=pl.col("launch").first(),
        first_graphed=pl.col("graphed").first())
    allw = windows.join(per, on="step", how="left")
    reasons: Counter = Counter()
    warnings: list[str] = []
    cut = allw.filter(pl.col("end").is_null())
    empty = allw.filter(pl.col("end").is_not_null() & pl.col("first").is_null())
    lost = pl.Series("s", list(attr.lost_steps), dtype=pl.Int64)
    lost_steps = allw.filter(pl.col("end").is_not_null() & pl.col("first").is_not_null()
                             & pl.col("step").is_in(lost.implode()))
    good = allw.filter(pl.col("end").is_not_null() & pl.col("first").is_not_null()
                       & ~pl.col("step").is_in(lost.implode())).sort("first")
    if cut.height:
        reasons[CUT] += cut.height
        warnings.append(f"{cut.height} step range(s) cut off by the capture window: excluded")
    if empty.height:
        reasons[NO_WORK] += empty.height
        warnings.append(f"{empty.height} step range(s) launched no GPU work on device {attr.device}: excluded")
    if lost_steps.height:
        reasons[NO_WORK] += lost_steps.height
        warnings.append(f"{lost_steps.height} step(s) launched CUDA graphs whose kernels were not recorded "
                        "(profiler activity buffer overflow?): excluded, their GPU time cannot be known")
    if good.height == 0 and lost_steps.height:
        raise NoSteps(f"{path}: every step launched CUDA graphs whose kernels were not recorded (the profiler's activity "
                      "buffer likely overflowed); profile fewer steps or enlarge the buffer")
    if good.height == 0:
        raise NoSteps(f"{path}: {windows.height} step range(s) found but none launched GPU work on device "
                      f"{attr.device}; try --device or --step-range")
    good = good.with_columns(p_start=pl.col("first"),
                             p_end=pl.col("first").shift(-1).fill_null(pl.max_horizontal("last", "end")))
    return good, reasons, warnings


def early_gap_inputs(trace: Trace):
    """:func:`_gap_inputs` begun now on a thread of its own, for a :func:`partition` of ``trace`` to come (a function
    that waits for them), when the trace is big and its launches are in start order as they stand (the launches an
    attribution of it analyses, ``Attribution.launches``); else None. What the gaps look up on the host side needs no
    GPU activity: made beside the attribution, it fills the moments when one core waits."""
    launches = trace.launches
    if trace.kernels.height + launches.height < THREADS_FROM_ROWS or not launches["start"].is_sorted():
        return None
    return started(lambda: _gap_inputs(trace, launches))


def partition(attr: Attribution, trace: Trace, *, exclude: pl.DataFrame | None = None,
              phases: pl.DataFrame | None = None, phase: str = "decode", gap_inputs=None) -> StepTable:
    """The partition of ``attr``'s steps.

    ``exclude``: optional frame ``step``, ``reason`` (e.g. warm-up/transition steps found from their kernel
    sequences); ``phases``: optional frame ``step``, ``phase`` (decode | prefill | mixed | unknown); ``phase``:
    which phase to analyse (``all`` = every step). ``gap_inputs``: :func:`early_gap_inputs` of ``trace`` begun
    before the attribution (None: begun here). Raises :class:`~tracekit.errors.NoSteps` when nothing is left to
    analyse, saying why.
    """
    acts = attr.activities
    big = acts.height + trace.launches.height >= THREADS_FROM_ROWS
    # (what the gaps look up on the host side needs no activity: found beside the exclusions below)
    gap_inputs_wait = gap_inputs if gap_inputs is not None and attr.launches is trace.launches else started(
        lambda: _gap_inputs(trace, attr.launches), threads=big)
    acts, n_claimed = claim_by_gpu_start(acts, attr.steps.windows, attr.lost_steps)
    in_steps = in_steps_of(acts)
    good, reasons, warnings = periods(attr, in_steps, trace.meta.path)
    sel = _select_steps(attr, trace, in_steps, good, reasons, warnings, exclude=exclude,
                        phases=phases if phases is not None else attr.phases, phase=phase)
    good, analysed = sel.good, sel.analysed
    a, spill = _analysed_rows(acts, in_steps, good, analysed, sel.present, attr.steps.windows.height)
    gap_inputs = gap_inputs_wait()

    def piece(p: pl.DataFrame):
        """The unions, kernel sums and gaps of whole steps."""
        # (a category's physical code is its priority: the union's level)
        level = pl.col("category").to_physical()
        u = cumulative_union_lengths(p.select("step", "start", "end", prio=level), "step", "prio", len(PRIORITY),
                                     presorted=True, tiled=True)
        if "_spill" in p.columns:  # (the kernel sums are the step's own work; its last activity may be another's)
            own = _kernel_sums(p.filter(~pl.col("_spill")))
            ends = p.group_by("step").agg(a_last=pl.col("end").max())
            return u, own.drop("a_last").join(ends, on="step", how="left"), _holes_piece(p, gap_inputs)
        return u, _kernel_sums(p), _holes_piece(p, gap_inputs)

    # Whole steps, piece by piece (intervals.by_pieces), two pieces per CPU at a time on big traces: each piece's
    # columns are small and reused by the next, where ten million rows at once faulted in ~1.5 GB of fresh memory.
    pieces = by_pieces(piece, a, threads=big)
    hole_sums, largest_holes = _gaps(pieces, gap_inputs, attr.launches)
    if spill is not None:
        a = a.filter(~pl.col("_spill")).drop("_spill")
    table = _split_table(analysed, pl.concat([p[0] for p in pieces]), pl.concat([p[1] for p in pieces]),
                         hole_sums, a, attr.steps.windows)
    # The idle after each analysed step ends with the first launch of the next step with GPU work.
    nxt = good.select("step", next_launch=pl.col("first_launch").shift(-1),
                      next_graphed=pl.col("first_graphed").shift(-1))
    skip = attr.steps.windows.select("pid", "tid", "start") if attr.steps.marker != "inferred" else None
    largest = _largest(largest_holes, table.join(nxt, on="step", how="left"), trace, attr.launches, skip)
    periods_frame = good.select("step", "p_start", "p_end", period=pl.col("p_end") - pl.col("p_start"),
                                phase="phase", reason="reason")
    cov = coverage(acts, good, attr.steps.windows, attr.lost_steps, n_claimed)
    return StepTable(attribution=attr, table=table, periods=periods_frame, activities=a.drop("_ps", strict=False),
                     largest=tuple(largest), excluded_reasons=_ordered(reasons), phase=sel.step_phase,
                     decode_advice=sel.decode_advice, warnings=attr.warnings + tuple(warnings),
                     phases_found=sel.phases_found, phase_note=sel.phase_note, coverage=cov)


@dataclass(frozen=True)
class _Selected:
    """The steps left to analyse (``analysed``), the periods with their exclusion reasons and phases (``good``),
    the steps with GPU work (``present``), and the phase's reading of them."""

    good: pl.DataFrame
    analysed: pl.DataFrame
    present: pl.DataFrame
    phases_found: dict
    step_phase: str
    decode_advice: bool
    phase_note: str | None


def _select_steps(attr: Attribution, trace: Trace, in_steps: pl.DataFrame, good: pl.DataFrame, reasons,
                  warnings: list[str], *, exclude: pl.DataFrame | None, phases: pl.DataFrame,
                  phase: str) -> _Selected:
    """The exclusions among the steps with GPU work (their periods stay as computed): the phase, then the last step
    and warm-up/transition steps by their kernel sequences (``tracekit.analyses.steady``). Counts each reason in
    ``reasons``, adds to ``warnings``; raises :class:`~tracekit.errors.NoSteps` when no step is left."""
    from tracekit.analyses.phase import NO_LLM, no_decode_advice, phase_counts, select_phase, window_phase
    from tracekit.analyses.steady import steady_exclusions

    present = in_steps.select("step").unique()  # (the steps with GPU work)
    with_work = attr.steps.windows.select("step").join(present, on="step", how="semi")
    found = phases.join(with_work, on="step", how="semi")
    phases_found = phase_counts(found)
    training = "source" in found.columns and bool((found["source"] == "training").any())
    try:
        sel, phase_warnings = select_phase(phases, wanted=phase)
    except NoSteps as e:
        raise NoSteps(f"{trace.meta.path}: {e}") from None
    prior = good.select("step").join(sel.select("step", "phase", "reason", "decode_advice"), on="step", how="left",
                                     maintain_order="left").with_columns(pl.col("phase").fill_null("unknown"))
    if exclude is not None and exclude.height:
        prior = prior.join(exclude.select("step", r2="reason"), on="step", how="left", maintain_order="left"
                           ).with_columns(reason=pl.coalesce("reason", "r2")).drop("r2")
    excl = steady_exclusions(in_steps, prior.select("step", "reason", "phase"),
                             signatures=attr.signatures() if attr.signatures is not None else None)
    good = good.join(excl.select("step", "reason"), on="step", how="left", maintain_order="left").join(
        prior.select("step", "phase"), on="step", how="left", maintain_order="left")
    for r, c in good.filter(pl.col("reason").is_not_null()).group_by("reason").len().iter_rows():
        reasons[r] += c
    analysed = good.filter(pl.col("reason").is_null())
    if analysed.height == 0:
        why = ", ".join(f"{k}: {v}" for k, v in sorted(reasons.items()))
        hint = " (pass --phase all to analyse them)" if reasons.get(PHASE) else ""
        raise NoSteps(f"{trace.meta.path}: no step left to analyse on device {attr.device} ({why}){hint}")
    warnings.extend(phase_warnings)
    if reasons.get(LAST_STEP):
        warnings.append("the last step has no following step (no trailing host time): excluded")
    if reasons.get(WARMUP):
        warnings.append(f"{reasons[WARMUP]} warm-up/transition step(s) (kernel sequence unlike the steady one): "
                        "excluded")
    step_phase = window_phase(analysed["phase"])
    decode_advice = bool(sel["decode_advice"].any()) if sel.height else True
    no_llm = found.filter(pl.col("source") == NO_LLM)["evidence"] if "source" in found.columns else None
    phase_note = None if decode_advice and step_phase not in ("prefill", "training") else no_decode_advice(
        step_phase, phases_found, training, no_llm[0] if no_llm is not None and no_llm.len() and
        step_phase == "unknown" else None)
    return _Selected(good, analysed, present, phases_found, step_phase, decode_advice, phase_note)


def _analysed_rows(acts: pl.DataFrame, in_steps: pl.DataFrame, good: pl.DataFrame, analysed: pl.DataFrame,
                   present: pl.DataFrame, n_windows: int) -> tuple[pl.DataFrame, pl.DataFrame | None]:
    """The analysed steps' activities: serialised per stream, clipped to their step's period, with the pieces of
    other steps' work that run in an analysed period (``_spill``), grouped by step in start order. Returns (rows,
    the spilled rows or None)."""
    a = rows_of_steps(in_steps, analysed["step"], present["step"])
    a = serialise(a.with_columns(start0="start"))

    def per_row(col: str) -> pl.Series:
        return _per_step_slots(n_windows, analysed["step"], analysed[col], a["step"])

    # Clipped to the period: a serialised activity starts at or after its step's first start, so only an end past
    # the period's end needs it (an activity overlapping the next step's first). Where no step has one (the usual
    # case, checked per step), nothing is clipped and no per-row period columns are made (ten million rows: two
    # gathers and two copies, ~0.3 GB); a step's first activity then starts at its period's start (``start0``).
    last = a.group_by("step").agg(pl.col("end").max()).join(analysed.select("step", "p_end"), on="step")
    if not bool((last["end"] <= last["p_end"]).all()):
        p_start, p_end = per_row("p_start"), per_row("p_end")
        a = a.with_columns(start=pl.col("start").clip(p_start, p_end), end=pl.col("end").clip(p_start, p_end),
                           _ps=p_start)
        del p_start, p_end
    # GPU work of other steps (or of none) that runs in an analysed step's period (several streams, a GPU running
    # behind the host): pieces of it, clipped to the period, join the step's union and gaps (never its kernel sums),
    # so that the step's gaps are only time the GPU ran nothing (contract, "Every kernel is counted").
    spill = _spill(acts, good, analysed["step"], a.columns)
    if spill is not None:
        if "_ps" not in a.columns:
            a = a.with_columns(_ps=per_row("p_start"))
        a = pl.concat([a.with_columns(_spill=pl.lit(False)), spill.select(*a.columns, "_spill")],
                      how="vertical_relaxed")
    # Rows grouped by step, each in start order: true already in the usual case (one launching thread);
    # serialisation over several streams or a late activity of a step (clipped to its period's end) needs a sort.
    if not (a["step"].is_sorted() and a["start"].is_sorted()):
        if "_ps" not in a.columns:
            a = a.with_columns(_ps=per_row("p_start"))
        a = a.sort(["_ps", "start"], maintain_order=True)
    return a, spill


def _split_table(analysed: pl.DataFrame, u: pl.DataFrame, s: pl.DataFrame, hole_sums: pl.DataFrame,
                 a: pl.DataFrame, windows: pl.DataFrame) -> pl.DataFrame:
    """The per-step table (:class:`StepTable`'s ``table``) from the unions by priority ``u``, the kernel sums
    ``s``, the gaps by cause and the analysed rows ``a`` (without spill)."""
    table = analysed.select("step", "p_start", "p_end", "n_kernels", "phase", "first_launch", "first_graphed",
                            period=pl.col("p_end") - pl.col("p_start")).join(u, on="step", how="left")
    prev = pl.lit(0, pl.Int64)
    for i, cat in enumerate(PRIORITY):
        table = table.with_columns(pl.col(f"u{i}").fill_null(0)).with_columns((pl.col(f"u{i}") - prev).alias(f"x_{cat}"))
        prev = pl.col(f"u{i}")
    busy = f"u{len(PRIORITY) - 1}"
    table = table.join(s, on="step", how="left").with_columns(
        x_launch_gaps=(pl.col("a_last") - pl.col("p_start")) - pl.col(busy),
        x_idle=pl.col("p_end") - pl.col("a_last"))
    table = table.join(hole_sums, on="step", how="left").with_columns(
        pl.col("g_host_stalls", "g_graph_bubbles", "g_after_waits").fill_null(0))
    table = table.with_columns(
        g_launch_overhead=(pl.col("x_launch_gaps") - pl.col("g_host_stalls") - pl.col("g_graph_bubbles"))
        .clip(lower_bound=0),
        g_between_steps=pl.col("x_idle"))
    # Wall time of the draft phases on the GPU timeline: first to last activity of each draft range
    # (gaps between its kernels included), summed per step.
    drafts = a.filter(pl.col("draft").is_not_null())
    if drafts.height:
        dspan = (drafts.group_by("step", "draft").agg(span=pl.col("end").max() - pl.col("start").min())
                 .group_by("step").agg(draft_span=pl.col("span").sum()))
        table = table.join(dspan, on="step", how="left")
    else:
        table = table.with_columns(draft_span=pl.lit(None, pl.Int64))
    table = table.with_columns(pl.col("draft_span").fill_null(0))
    table = table.drop([f"u{i}" for i in range(len(PRIORITY))]).sort("p_start")
    return table.join(windows.select("step", "pid", "tid", w_start="start", w_end="end"), on="step", how="left")


# ------------------------------------------------------------------------------------------------------------
# Every kernel is counted (contract, Additions to /3 (2)): an activity belongs to the step whose window its launch is
# in; one launched in no window (another thread, or no launch recorded) to the step whose period its GPU start is in;
# the rest is outside the steps, each part with its reason.

BEFORE_FIRST = "before the first step"
AFTER_LAST = "after the last step"


def _bounded_periods(in_steps: pl.DataFrame, windows: pl.DataFrame, lost: tuple[int, ...]) -> pl.DataFrame:
    """The step windows with GPU work and an end (not cut by the capture, no lost graph work) in time order, with
    ``first`` (their first activity's start) and ``upper`` (where the last one's period ends: the later of its last
    activity's end and its window's end), as :func:`periods` makes them."""
    per = in_steps.group_by("step").agg(first=pl.col("start").min(), last=pl.col("end").max())
    w = (windows.select("step", "end").join(per, on="step", how="inner")
         .filter(pl.col("end").is_not_null() & ~pl.col("step").is_in(pl.Series(list(lost), dtype=pl.Int64).implode()))
         .sort("first"))
    return w.with_columns(upper=pl.max_horizontal("last", "end").last())


def claim_by_gpu_start(acts: pl.DataFrame, windows: pl.DataFrame, lost: tuple[int, ...]) -> tuple[pl.DataFrame, int]:
    """``acts`` with every activity in no step window (launched by a thread that holds no window, or with no launch
    recorded) given the step whose period holds its GPU start: from one step's first activity to the next's, the
    last to its end (:func:`periods`). Returns (activities, how many were claimed so). Those before the first
    step's period or after the last one's stay in no step (``coverage``: before the first step, after the last).
    Two binary searches for the free rows alone; none when every activity is in a step (the usual trace).

    >>> a = pl.DataFrame({"start": [0, 5, 12, 20, 31, 45], "end": [4, 9, 15, 25, 33, 50],
    ...                   "step": [None, 0, None, 1, None, None]}, schema_overrides={"step": pl.Int64})
    >>> w = pl.DataFrame({"step": [0, 1], "end": [18, 40]})
    >>> out, n = claim_by_gpu_start(a, w, ())
    >>> out["step"].to_list(), n
    ([None, 0, 0, 1, 1, None], 2)
    """
    step = acts["step"]
    free = step.is_null()
    if not bool(free.any()) or step.null_count() == step.len():
        return acts, 0
    w = _bounded_periods(in_steps_of(acts), windows, lost)
    if w.height == 0:
        return acts, 0
    rows = free.arg_true()
    at = acts["start"].gather(rows)
    i = w["first"].search_sorted(at, side="right").cast(pl.Int64) - 1
    ok = (i >= 0) & (at < w["upper"][0])
    if not bool(ok.any()):
        return acts, 0
    ids = w["step"].gather(i.filter(ok))
    return acts.with_columns(step=step.scatter(rows.filter(ok), ids)), int(ok.sum())


def coverage(acts: pl.DataFrame, good: pl.DataFrame, windows: pl.DataFrame, lost: tuple[int, ...],
             claimed: int = 0) -> dict:
    """``coverage`` (contract): the kernel, memcpy and memset time of the device (ms, whole trace) in the analysed
    steps and outside them, by reason: before the first step, the excluded steps by their reason (``steps.
    excluded_reasons``' keys), after the last step. ``good``: :func:`periods`' frame with ``reason`` (null =
    analysed); ``claimed``: activities given a step by their GPU start (:func:`claim_by_gpu_start`)."""
    work = acts.lazy().filter(pl.col("kind") != "graph_exec")
    per = work.filter(pl.col("step").is_not_null()).group_by("step").agg(ns=pl.col("dur").sum()).collect()
    first = good["p_start"].min() if good.height else None
    free = work.filter(pl.col("step").is_null()).select(
        before=pl.col("dur").filter(pl.col("start") < first).sum() if first is not None else pl.lit(0, pl.Int64),
        after=pl.col("dur").filter(pl.col("start") >= first).sum() if first is not None else pl.col("dur").sum(),
    ).collect()
    why = pl.concat([
        good.select("step", reason=pl.col("reason").cast(pl.String)),
        windows.filter(pl.col("end").is_null()).select("step", reason=pl.lit(CUT)),
        pl.DataFrame({"step": list(lost), "reason": [NO_WORK] * len(lost)}, schema={"step": pl.Int64,
                                                                                     "reason": pl.String}),
    ], how="vertical_relaxed").unique("step", keep="first", maintain_order=True)
    per = per.join(why, on="step", how="left").with_columns(
        # (a window with work that periods() did not keep: no GPU work on this device by its rule)
        reason=pl.when(pl.col("step").is_in(good["step"].implode()) | pl.col("reason").is_not_null())
        .then(pl.col("reason")).otherwise(pl.lit(NO_WORK)))
    in_ns = int(per.filter(pl.col("reason").is_null())["ns"].sum())
    out: dict[str, float] = {}
    before, after = int(free["before"][0] or 0), int(free["after"][0] or 0)
    if before:
        out[BEFORE_FIRST] = before / 1e6
    from tracekit.analyses.steady import REASONS

    by = dict(per.filter(pl.col("reason").is_not_null()).group_by("reason").agg(pl.col("ns").sum()).iter_rows())
    for r in (*REASONS, *sorted(set(by) - set(REASONS))):  # (the contract's order of the reasons)
        if by.get(r):
            out[r] = by[r] / 1e6
    if after:
        out[AFTER_LAST] = after / 1e6
    total = int(work.select(pl.col("dur").sum()).collect().item() or 0)
    outside = sum(out.values())
    return {"kernel_ms_total": total / 1e6, "kernel_ms_in_steps": in_ns / 1e6, "kernel_ms_outside_steps": outside,
            "outside_by_reason": out, "claimed_by_gpu_start": claimed}


def _spill(acts: pl.DataFrame, good: pl.DataFrame, analysed: pl.Series, columns: list[str]) -> pl.DataFrame | None:
    """Pieces of GPU work that runs in an analysed step's period but is not that step's: work of an earlier step
    still running (several streams, a GPU behind the host) or of no step. One row per (activity, period) it
    overlaps, clipped to the period, with the step's id, ``dur`` 0 and ``_spill`` true; ``columns``: the analysed
    rows' columns. None when there is none: a step's work that ends by its period's end runs in no other period
    (the usual trace, checked per step from ``good``'s last activity end, without a look at the rows)."""
    spilling = good.filter(pl.col("last") > pl.col("p_end"))["step"]
    lo_all, hi_all = good["p_start"].min(), good["p_end"].max()
    free = acts["step"].is_null()
    late = acts["step"].is_in(spilling.implode()) if spilling.len() else None
    if late is None and not bool(free.any()):
        return None
    pick = free & (acts["end"] > lo_all) & (acts["start"] < hi_all)
    if late is not None:
        pick = pick | late.fill_null(False)
    rows = keep_rows(acts, pick)
    if rows.height == 0:
        return None
    per = good.sort("p_start").select("step", "p_start", "p_end")
    starts = per["p_start"]
    j0 = (starts.search_sorted(rows["start"], side="right").cast(pl.Int64) - 1).clip(lower_bound=0)
    j1 = starts.search_sorted(rows["end"], side="left").cast(pl.Int64) - 1
    ok = per.with_row_index("_j").filter(pl.col("step").is_in(analysed.implode()))
    pieces = (rows.with_columns(_j=pl.int_ranges(pl.lit(j0), pl.lit(j1) + 1, dtype=pl.Int64), _own=pl.col("step"))
              .explode("_j").drop_nulls("_j")
              .join(ok.select(pl.col("_j").cast(pl.Int64), _step="step", _p0="p_start", _p1="p_end"), on="_j",
                    how="inner")
              .filter(pl.col("_own").is_null() | (pl.col("_own") != pl.col("_step")))
              .with_columns(start=pl.max_horizontal("start", "_p0"), end=pl.min_horizontal("end", "_p1"))
              .filter(pl.col("end") > pl.col("start"))
              .with_columns(step=pl.col("_step"), start0=pl.col("start"), dur=pl.lit(0, pl.Int64),
                            _ps=pl.col("_p0"), _spill=pl.lit(True)))
    if pieces.height == 0:
        return None
    keep = [c for c in columns if c in pieces.columns]
    return pieces.select(*keep, *(["_ps"] if "_ps" not in keep else []), "_spill").with_columns(
        pl.col("step").cast(acts["step"].dtype), pl.col("dur").cast(acts["dur"].dtype))


def _kernel_sums(a: pl.DataFrame) -> pl.DataFrame:
    """Per step of ``a``: kernel time by category (``k_*``, unclipped durations), replayed from graphs and in all,
    the graph launches and the work launched one by one, and the end of its last activity."""
    not_memop = pl.col("kind") != "memop"
    graphed = pl.col("graphed").fill_null(False)
    corr = a["correlation"]
    if not bool(a["graphed"].any()) and corr.null_count() == 0 and (
            a.height < 2 or bool((corr.slice(1) > corr.slice(0, a.height - 1)).all())):
        # Nothing replayed from a graph, and every activity's launch later than the one before (work launched one by
        # one, run in launch order: the usual eager trace): every row its own launch, so counted without hashing ten
        # million correlation ids.
        launches = {"n_graph_launches": pl.lit(0, pl.UInt32), "n_launched": pl.len()}
    else:
        launches = {"n_graph_launches": pl.col("correlation").filter(pl.col("graphed")).n_unique(),
                    "n_launched": pl.col("correlation").filter(~graphed).n_unique()}
    return a.group_by("step").agg(
        *[pl.col("dur").filter(pl.col("category") == c).sum().alias(f"k_{c}")
          for c in (*KERNEL_CATEGORIES, UNATTRIBUTED)],
        k_graphed=pl.col("dur").filter(graphed & not_memop).sum(),
        k_all=pl.col("dur").filter(not_memop).sum(),
        **launches,
        a_last=pl.col("end").max(),
    )


def _ordered(reasons: Counter) -> dict[str, int]:
    """``steps.excluded_reasons`` in the contract's order."""
    from tracekit.analyses.steady import REASONS

    return {r: int(reasons[r]) for r in (*REASONS, *sorted(set(reasons) - set(REASONS))) if reasons.get(r)}


def _gap_inputs(trace: Trace, launches: pl.DataFrame) -> dict:
    """What every piece of the gap analysis looks up: the host's stall segments and their union (any thread), its
    waits, and the launch calls that follow a wait (``gaps.waits_before``)."""
    from tracekit.intervals import merge

    copies = blocking_copies(trace, launches)  # (once: the stalls and the waits both hold them)
    segments = stall_segments(trace, launches, copies)
    union = (merge(segments.select("start", "end").with_columns(_g=pl.lit(0)), ["_g"]).collect().drop("_g")
             if segments.height else segments.select("start", "end"))
    waits = host_waits(trace, launches, copies)
    return {"segments": segments, "union": union, "waits": waits, "ends": waits_before(launches, waits)}


def _gaps(pieces: list, inputs: dict, launches: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The gaps between a step's first and last activity, from the pieces' :func:`_holes_piece` (the third item of
    each): per-step sums of host stalls, graph bubbles and after-wait time, and the longest single gaps. The
    stalled and after-wait parts are looked up once, for the few gaps that can have some."""
    segments, waits, ends = inputs["segments"], inputs["waits"], inputs["ends"]
    offsets, at = [], 0
    for p in pieces:  # (gap numbers: each piece's from the gaps before it)
        offsets.append(at)
        at += p[2][0]

    def joined(i: int) -> pl.DataFrame:
        return pl.concat([p[2][i].with_columns(pl.col("_i") + o) if "_i" in p[2][i].columns else p[2][i]
                          for p, o in zip(pieces, offsets)])

    bubbles, maybe, follow, cand = (joined(i) for i in range(1, 5))
    # the stalled part of the gaps a stall segment overlaps (the rest: 0)
    stalls = maybe.select("_i", "step", stall=stalled_part(maybe.select("h0", "h1", "launch"), launches,
                                                           segments).cast(pl.Int64))
    # the launch overhead after a host wait's return (the host work a CUDA graph cannot remove; advice.cuda_graphs)
    # (a graph bubble's launch is the replay's, which may follow a wait: no launch, so no after-wait time); summed
    # over the few gaps that have some, as the stalls are
    after = after_waits(follow.select("h0", "h1", "launch"), launches, waits, segments, ends=ends)
    afters = follow.select("step", after=after).filter(pl.col("after") > 0)
    sums = (bubbles.join(stalls.group_by("step").agg(g_host_stalls=pl.col("stall").sum()), on="step", how="left")
            .join(afters.group_by("step").agg(g_after_waits=pl.col("after").sum()), on="step", how="left")
            .select("step", pl.col("g_host_stalls").fill_null(0), "g_graph_bubbles",
                    pl.col("g_after_waits").fill_null(0)))
    # (each piece kept its gaps at least as long as its LARGEST-th longest: the same threshold over them keeps
    # exactly the gaps the whole would have, in time order)
    if cand.height > 4 * LARGEST:
        cand = cand.filter(pl.col("ms") >= cand["ms"].top_k(LARGEST).min())
    stall = cand.select("_i").join(stalls.select("_i", "stall"), on="_i", how="left",
                                   maintain_order="left")["stall"].fill_null(0)
    cand = cand.select("step", "h0", "h1", "launch", "graphed", "bubble").with_columns(stall=stall).with_columns(
        ms=pl.col("h1") - pl.col("h0"))
    # (eager gaps before graph bubbles, each in time order: the order the ties of the sort below have always had)
    top = cand.sort("bubble", maintain_order=True).sort("ms", descending=True).head(LARGEST)
    return sums, top


def _holes_piece(a: pl.DataFrame, inputs: dict) -> tuple[int, pl.DataFrame, pl.DataFrame, pl.DataFrame,
                                                          pl.DataFrame]:
    """The gaps of whole steps (``a`` grouped by step, each in start order), one lazy query for every gap's
    columns, of which only these are kept: their number; the per-step graph bubbles; the gaps a stall segment
    overlaps; the gaps whose launch follows a host wait; the candidates for the longest gaps (each gap numbered
    ``_i`` from 0). ``inputs``: :func:`_gap_inputs`."""
    union, ends = inputs["union"], inputs["ends"]
    first = pl.col("step") != pl.col("step").shift(1)
    runmax = pl.col("end").cum_max()  # (periods tile the timeline: a running maximum across steps is right)
    graphed = pl.col("graphed").fill_null(False)
    # (a step's period starts at its first activity's recorded start, ``_ps`` where the rows had to be clipped or
    # sorted; else that is the step's first row's ``start0``)
    ps = "_ps" if "_ps" in a.columns else "start0"
    any_graphed = bool(a["graphed"].any())
    f = a.lazy().select("step", "start", "end", "launch", *(["graphed"] if any_graphed else []), _ps=ps).with_columns(
        h0=pl.when(first.fill_null(True)).then(pl.col("_ps")).otherwise(runmax.shift(1)))
    if any_graphed:
        # the work before the gap: the activity holding the running maximum (none for a step's first gap), and its
        # launch
        f = f.with_row_index("_r").with_columns(
            holder=pl.when(pl.col("end") >= runmax).then(pl.col("_r")).forward_fill())
        f = f.with_columns(prev_row=pl.when(~first.fill_null(True)).then(pl.col("holder").shift(1)))
        f = f.with_columns(prev_launch=pl.col("launch").gather(pl.col("prev_row").fill_null(0)))
        # a graph bubble: graph-replayed work after the gap, from the same graph launch as the work before it
        bubble = (graphed & pl.col("launch").is_not_null() & pl.col("prev_row").is_not_null()
                  & (pl.col("launch") == pl.col("prev_launch"))).fill_null(False)
        g = f.filter(pl.col("start") > pl.col("h0")).select(
            "step", "h0", h1="start", launch="launch", graphed=graphed, bubble=bubble,
            ms=pl.col("start") - pl.col("h0")).collect()
    else:
        # Nothing replayed from a graph in these steps: no bubble, nothing to look up, and only the gaps' own columns
        # made (the flags and lengths are added to the few rows kept below; every gap of ten million activities is
        # most of them).
        g = f.filter(pl.col("start") > pl.col("h0")).select("step", "h0", h1="start", launch="launch").collect()
    rows = pl.int_range(0, g.height, dtype=pl.UInt32, eager=True)
    ms = g["ms"] if any_graphed else (g["h1"] - g["h0"]).alias("ms")

    def full(df: pl.DataFrame) -> pl.DataFrame:  # (the columns of a graph-replaying piece's gaps, in their order)
        if any_graphed:
            return df
        return df.select("step", "h0", "h1", "launch", pl.lit(False).alias("graphed"), pl.lit(False).alias("bubble"),
                         (pl.col("h1") - pl.col("h0")).alias("ms"), *[c for c in df.columns if c.startswith("_")])

    # A gap can be stalled only where some stall segment (of any thread) overlaps it: the rest (at ten million
    # launches, nearly every gap) is 0 without the per-thread lookups. Graph bubbles are never stalls.
    if union.height and g.height:  # (the union's intervals within the piece's time: the rest overlaps none of it)
        lo = int(union["end"].search_sorted(g["h0"].min(), side="right"))
        union = union.slice(lo, max(0, int(union["start"].search_sorted(g["h1"].max(), side="left")) - lo))
    maybe = _overlaps_any(g, union)
    if any_graphed:
        maybe = maybe & ~g["bubble"]
    maybe = g.filter(maybe).select("step", "h0", "h1", "launch", _i=rows.filter(maybe))
    # the gaps whose launch (not a graph bubble's) follows a host wait
    launch = (g.select(pl.when(~pl.col("bubble")).then(pl.col("launch")).cast(pl.UInt32))["launch"] if any_graphed
              else g["launch"].cast(pl.UInt32))
    follow = g.select("step", "h0", "h1", launch=launch, _i=rows).filter(_follows(launch, ends)) if ends.height \
        else g.select("step", "h0", "h1", launch=launch, _i=rows).clear()
    if any_graphed:
        bubbles = g.lazy().select("step", "ms", "bubble")
        if g["step"].is_sorted():
            bubbles = bubbles.with_columns(pl.col("step").set_sorted())  # (grouped by slices)
        bubbles = bubbles.group_by("step").agg(g_graph_bubbles=pl.col("ms").filter(pl.col("bubble")).sum()).collect()
    else:  # (every step with a gap: none of them a bubble; steps in order, the usual case: no hashing)
        step = g["step"]
        step = step.set_sorted().unique() if step.null_count() == 0 and step.is_sorted() else step.unique(
            maintain_order=True)
        bubbles = step.to_frame().with_columns(g_graph_bubbles=pl.lit(0, pl.Int64))
    # only gaps at least as long as the LARGEST-th longest can be in the top: those (all of them when few)
    pick = ms >= ms.top_k(LARGEST).min() if g.height > 4 * LARGEST else pl.repeat(True, g.height, eager=True)
    cand = full(g.filter(pick).with_columns(_i=rows.filter(pick)))
    return g.height, bubbles, maybe, follow, cand


def _follows(launch: pl.Series, ends: pl.DataFrame) -> pl.Series:
    """Whether each of ``launch`` (launch rows, one per gap) is one of ``ends["launch"]`` (the few launches that
    follow a host wait). Gaps in time order of one launching thread have their launches in order: then the rows
    that match are found by two binary searches per end (no hash probe of every gap); else a membership test.

    >>> _follows(pl.Series([1, 3, 3, 7], dtype=pl.UInt32), pl.DataFrame({"launch": [3, 9]})).to_list()
    [False, True, True, False]
    """
    ends_ = ends["launch"].cast(pl.UInt32)
    if launch.null_count() or not launch.is_sorted():
        return launch.is_in(ends_.implode())
    e = ends_.drop_nulls().unique().sort()
    lo = launch.search_sorted(e, side="left")
    hi = launch.search_sorted(e, side="right")
    hit = pl.DataFrame({"lo": lo, "hi": hi}).filter(pl.col("lo") < pl.col("hi"))
    out = pl.repeat(False, launch.len(), dtype=pl.Boolean, eager=True)
    if hit.height:
        out = out.scatter(hit.select(i=pl.int_ranges("lo", "hi", dtype=pl.UInt32)).explode("i")["i"], True)
    return out


def _overlaps_any(holes: pl.DataFrame, segments: pl.DataFrame) -> pl.Series:
    """For each hole (``h0``, ``h1``), whether any of ``segments`` (``start``, ``end``; any thread) overlaps it:
    the segments' union as disjoint sorted intervals, then one binary search per hole.

    >>> _overlaps_any(pl.DataFrame({"h0": [0, 10, 30], "h1": [5, 20, 40]}),
    ...               pl.DataFrame({"start": [18, 2, 40], "end": [25, 3, 50]})).to_list()
    [True, True, False]
    """
    if segments.height == 0 or holes.height == 0:
        return pl.repeat(False, holes.height, eager=True)
    from tracekit.intervals import merge

    u = segments.select("start", "end")
    if not _disjoint(u):  # (the caller's union already, when it comes piece after piece)
        u = merge(u.with_columns(_g=pl.lit(0)), ["_g"]).collect()
    h0, h1 = holes["h0"], holes["h1"]
    if h0.null_count() == 0 and h1.null_count() == 0 and h0.is_sorted() and h1.is_sorted():
        # Holes in time order (a step's gaps, steps one after the other): the holes each union interval overlaps
        # are one run, [first hole ending after it starts, first hole starting at or after its end): two searches
        # per union interval, not one per hole, and the runs' rows (few: the union is disjoint) marked.
        lo = h1.search_sorted(u["start"], side="right")
        hi = h0.search_sorted(u["end"], side="left")
        rows = pl.DataFrame({"lo": lo, "hi": hi}).select(i=pl.int_ranges("lo", "hi", dtype=pl.UInt32)).explode("i")
        return pl.repeat(False, holes.height, dtype=pl.Boolean, eager=True).scatter(
            rows["i"].drop_nulls(), True).alias("overlaps")
    # the last union interval that starts before the hole ends; it overlaps when it ends after the hole starts
    i = u["start"].search_sorted(holes["h1"], side="left").cast(pl.Int64) - 1
    end = u["end"].gather(i.clip(lower_bound=0))
    return ((i >= 0) & (end > holes["h0"])).fill_null(False)


def _disjoint(iv: pl.DataFrame) -> bool:
    """Intervals (``start``, ``end``) sorted and disjoint, as ``intervals.merge`` leaves them (none touching)."""
    st, en = iv["start"], iv["end"]
    if st.null_count() or en.null_count() or not st.is_sorted():
        return False
    return iv.height < 2 or bool((st.slice(1) > en.slice(0, iv.height - 1)).all() and (en >= st).all())


# A gap shorter than this is not one of gaps.largest: below the table's precision (0.001 ms) it prints as 0.000, and
# a hole of a few nanoseconds between back-to-back kernels is the rounding of microsecond timestamps (Kineto).
MIN_LARGEST_NS = 1_000


def _largest(holes: pl.DataFrame, table: pl.DataFrame, trace: Trace, launches: pl.DataFrame,
             skip: pl.DataFrame | None = None) -> list[dict]:
    """gaps.largest: the longest single gaps (of at least ``MIN_LARGEST_NS``), in-step or between steps, named by what
    the host was doing."""
    idle = table.filter(pl.col("x_idle") > 0).select(
        "step", h0=pl.col("p_end") - pl.col("x_idle"), h1="p_end", launch="next_launch",
        graphed=pl.col("next_graphed").fill_null(False), bubble=pl.lit(False), stall=pl.lit(0, pl.Int64),
        ms=pl.col("x_idle"), cause=pl.lit("between_steps"))
    h = holes.with_columns(cause=pl.when(pl.col("bubble")).then(pl.lit("graph_bubbles"))
                           .when(2 * pl.col("stall") >= pl.col("ms")).then(pl.lit("host_stalls"))
                           .otherwise(pl.lit("launch_overhead")))
    cols = ["step", "h0", "h1", "launch", "graphed", "ms", "cause"]
    top = (pl.concat([h.select(cols), idle.select(cols)], how="vertical_relaxed")
           .filter(pl.col("ms") >= MIN_LARGEST_NS)
           .sort(["ms", "step"], descending=[True, False]).head(LARGEST))
    if top.height == 0:
        return []
    top = top.join(table.select("step", "p_start"), on="step", how="left")
    call = launches.select("pid", "tid")[top["launch"].fill_null(0)]
    top = top.hstack(call).with_columns(pid=pl.when(pl.col("launch").is_not_null()).then(pl.col("pid")))
    names = name_gaps(top.select("h0", "h1", "pid", "tid", "launch"), trace, launches, skip=skip)
    return [{"step": int(r["step"]), "at_ms": (r["h0"] - r["p_start"]) / 1e6, "ms": r["ms"] / 1e6,
             "where": "graph" if r["graphed"] else "eager", "cause": r["cause"], "before": n}
            for r, n in zip(top.iter_rows(named=True), names)]


__all__ = ["StepTable", "partition", "serialise", "keep_rows", "periods", "LAST_STEP", "WARMUP", "NO_WORK", "CUT", "PHASE"]
