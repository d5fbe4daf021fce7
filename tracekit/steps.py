"""Decode-step segmentation: which host ranges are the decode steps.

Three ways, tried in this order (``Steps.marker`` says which was used):

1. ``--step-range REGEX``: every range whose name matches (Python ``re.search``); refused when the ranges do not
   enclose the launches of most of the kernel time in their span (:func:`range_coverage`: a range around one
   collective repeats once per step but holds none of it). :func:`step_candidates` ranks the range patterns that
   do launch work by how much of the kernel time they enclose (``tracekit info``).
2. Auto-detection: names that differ only in numbers are one *pattern*
   (``decode_step 12`` -> ``decode_step #``). Known step patterns of tracekit capture,
   SGLang, vLLM, TensorRT-LLM and the torch profiler are preferred; otherwise the
   outermost repeating pattern whose ranges launch GPU work.
3. Inference from structure when there are no usable ranges: the launch sequence's period (a step ends with the
   host read of its sampled tokens), else one step per replay of the heaviest CUDA graph. ``marker =
   "inferred"`` and a warning say so. The part before the first read is a whole step when it begins as a step
   begins (a complete prefill step at the start of a window), else cut by the capture window.

A step here is a host-side window on one thread (pid, tid, start, end); the GPU period
of each step is computed in ``run/pipeline.py`` from the work launched inside it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import polars as pl

from tracekit.trace import Trace

# Known per-step range patterns (after digits -> '#'), most specific first.
KNOWN_STEP_PATTERNS: list[tuple[str, str]] = [
    (r"^decode_step #$", "tracekit capture"),
    (r"^step\[DECODE", "SGLang torch profiler"),
    (r"^scheduler\.run_batch$", "SGLang NVTX scheduler spans"),
    (r"^execute_", "vLLM Worker.annotate_profile"),
    (r"_forward_step #", "TensorRT-LLM py_executor"),
    (r"^ProfilerStep#", "torch profiler step"),
]
# With ``every_phase``: SGLang's step ranges of every forward mode (``step[EXTEND ...]``, ``step[MIXED ...]``,
# ``step[TARGET_VERIFY ...]``, ...), whose phase tracekit.analyses.phase then tells; the other known patterns
# already cover every phase (vLLM's execute_context_N_generation_M).
EVERY_PHASE_PATTERNS: dict[str, str] = {r"^step\[DECODE": r"^step\["}
# SGLang's span modes that cover part of a speculative iteration (contract, "The engines' own records"): one
# ``step[...]`` span per forward (EAGLE v1: ``TARGET_VERIFY`` around the verify forward only, eager draft forwards as
# ``DECODE``, ``DRAFT_EXTEND``; newer builds ``DRAFT``, ``VERIFY``, ``DRAFT_EXTEND_V2``). Where a trace has them, the
# spans are no steps: a decode step is a whole scheduler iteration (draft, verify and draft-extend together), so the
# steps come from the launch sequence (a step ends with the host read of what was accepted) and the spans are
# evidence of speculation (tracekit.analyses.speculation), never a step each.
SGLANG_SUB_ITERATION = r"^step\[(TARGET_VERIFY|VERIFY|DRAFT|DRAFT_EXTEND|DRAFT_EXTEND_V2)(\s|\]|$)"
SGLANG_VERIFY = r"^step\[(TARGET_VERIFY|VERIFY)(\s|\]|$)"

_SPECIAL = set(".^$*+?{}[]\\|()")


def name_pattern(expr: pl.Expr) -> pl.Expr:
    """Range name -> pattern: every run of digits becomes '#'."""
    return expr.str.replace_all(r"\d+", "#")


def pattern_regex(pattern: str) -> str:
    """``decode_step #`` -> ``^decode_step \\d+$`` (the regex that selects the pattern's names)."""
    out = []
    for ch in pattern:
        if ch == "#":
            out.append(r"\d+")
        elif ch in _SPECIAL:
            out.append("\\" + ch)
        else:
            out.append(ch)
    return "^" + "".join(out) + "$"


def name_regex(name: str, limit: int = 200) -> str:
    """The regex that selects ``name`` and the names that differ from it only in numbers.

    Built from a name, not from its pattern: a literal '#' in a name (``ProfilerStep#12``)
    must stay a '#', not become ``\\d+``. Names longer than ``limit`` (patterns are built
    from their first ``limit`` characters) match by prefix.
    """
    out = []
    for i, piece in enumerate(re.split(r"(\d+)", name[:limit])):
        if i % 2:  # a run of digits (the split's captured group)
            out.append(r"\d+")
        else:
            out.append("".join("\\" + ch if ch in _SPECIAL else ch for ch in piece))
    return "^" + "".join(out) + ("$" if len(name) <= limit else "")


def range_patterns(ranges: pl.DataFrame, top: int | None = 10) -> pl.DataFrame:
    """Most frequent range-name patterns: columns pattern, regex, count, min_depth.

    NCCL-domain ranges are left out (they are the library's, not the application's).
    """
    if ranges.height == 0:
        return pl.DataFrame(schema={"pattern": pl.String, "regex": pl.String, "count": pl.Int64,
                                    "min_depth": pl.Int32})
    rng = ranges.filter(pl.col("domain").is_null() | (pl.col("domain") != "NCCL"))
    df = (
        rng.with_columns(pattern=name_pattern(pl.col("name").str.slice(0, 200)))
        .group_by("pattern")
        .agg(count=pl.len().cast(pl.Int64), min_depth=pl.col("depth").min(), example=pl.col("name").min())
        .sort(["count", "pattern"], descending=[True, False])
    )
    if top is not None:
        df = df.head(top)
    return df.with_columns(
        regex=pl.col("example").map_elements(name_regex, return_dtype=pl.String)
    ).select("pattern", "regex", "count", "min_depth")


@dataclass
class Steps:
    """Host-side step windows: frame with step, pid, tid, start, end (end null = cut off)."""

    windows: pl.DataFrame
    marker: str  # "nvtx" | "annotation" | "inferred"
    pattern: str | None
    warnings: list[str] = field(default_factory=list)
    period: Period | None = None  # inferred steps: the period found (None for ranges)


def _regex_match(names: pl.Series, regex: str) -> pl.Series:
    """Python ``re.search`` semantics, evaluated once per distinct name."""
    try:
        rx = re.compile(regex)
    except re.error as e:
        from tracekit.errors import BadOptionValue

        raise BadOptionValue(f"invalid regular expression {regex!r}: {e}")
    uniq = names.unique()
    hits = pl.DataFrame({"name": uniq, "hit": [bool(rx.search(n)) if n is not None else False for n in uniq]})
    return pl.DataFrame({"name": names}).join(hits, on="name", how="left", maintain_order="left")["hit"]


def select_ranges(ranges: pl.DataFrame, regex: str) -> pl.DataFrame:
    if ranges.height == 0:
        return ranges
    return ranges.filter(_regex_match(ranges["name"], regex))


def _marker_kind(trace: Trace) -> str:
    return trace.meta.markers  # (the reader's word: nvtx, annotation)


def _windows(rng: pl.DataFrame) -> pl.DataFrame:
    return rng.sort("start").with_row_index("step").select(
        pl.col("step").cast(pl.Int64), "pid", "tid", "start", "end", "name"
    )


def _launching(ranges: pl.DataFrame, launches: pl.DataFrame) -> pl.DataFrame:
    """Ranges that enclose at least one work launch on their thread: adds column n_launches."""
    work = launches.filter(pl.col("kind").is_in(["kernel", "graph", "memcpy", "memset"]))
    if ranges.height == 0 or work.height == 0:
        return ranges.with_columns(n_launches=pl.lit(0, pl.Int64))
    r = ranges.with_row_index("_r").sort("start")
    # Only outermost-of-pattern matters here; count launches by an asof join per thread.
    hit = (
        work.select("pid", "tid", "start").sort("start")
        .join_asof(r.select("pid", "tid", "start", "end", "_r").rename({"start": "rs"}),
                   left_on="start", right_on="rs", by=["pid", "tid"], strategy="backward", check_sortedness=False)
        .filter(pl.col("end").is_null() | (pl.col("start") <= pl.col("end")))
        .group_by("_r").agg(n_launches=pl.len().cast(pl.Int64))
    )
    return r.join(hit, on="_r", how="left").with_columns(pl.col("n_launches").fill_null(0)).drop("_r")


# ------------------------------------------------------------------------------------------------------------
# Which ranges hold the GPU work: a step range encloses the launches of its step's work (contract "Steps and
# phases of real windows"). A range that holds a collective's launch and nothing else (``nccl:_all_gather_base``)
# repeats as often as steps do, but its "steps" would hold almost none of the GPU time.

# Range names of framework ops as torch.autograd.profiler.emit_nvtx writes them (never step candidates).
OP_RANGE = r"^(aten|prim|c10d|_c10d_functional)::|^[\w.]+::\w+, (seq|op_id|sizes) = "
# The annotations torch's process groups write around one collective ("nccl:_all_gather_base", "gloo:all_reduce"):
# a range that holds one collective's launch, never a step (however well its few ranges tile their own span).
COLLECTIVE_RANGE = r"^(nccl|gloo|mpi|ucc|xccl):[\w.]+$"
# A --step-range whose ranges enclose the launches of less than this share of the kernel time in their span is refused.
MIN_STEP_RANGE_SHARE = 0.5
_T_BITS = 52  # launch times relative to the trace's first, within one thread rank (2^52 ns = 52 days)


def launch_gpu_time(trace: Trace, device: int | None = None) -> pl.DataFrame:
    """The kernels of ``trace`` (on ``device``, all GPUs when None) with their launch call: ``pid``, ``tid``,
    ``start`` (of the launch call), ``t`` (the kernel's duration, ns); one row per kernel (kernels whose launch was
    not recorded are left out). Copies are not counted: a loop may upload its inputs outside the range that holds
    its compute (pipit's saxpy: two host-to-device copies before each `saxpy` range), and what a step range must
    hold is its step's compute. Keyed lookups, no hash join (``tracekit.lookup``)."""
    from tracekit.lookup import row_lookup

    work = trace.launches
    valid = work["kind"].is_in(["kernel", "graph", "memcpy", "memset"])
    parts = []
    for f in (trace.kernels,):
        if f.height == 0:
            continue
        if device is not None and not (f["device"].null_count() == 0 and f["device"].min() == f["device"].max()
                                       == device):
            f = f.filter(pl.col("device") == device)
        row = row_lookup(f.select("pid", "correlation"), work.select("pid", "correlation"), valid=valid)
        ok = row.is_not_null()
        at = row.filter(ok)
        parts.append(pl.DataFrame({"pid": work["pid"].gather(at), "tid": work["tid"].gather(at),
                                   "start": work["start"].gather(at),
                                   "t": (f["end"] - f["start"]).filter(ok)}))
    if not parts:
        return pl.DataFrame(schema={"pid": pl.Int64, "tid": pl.Int64, "start": pl.Int64, "t": pl.Int64})
    return pl.concat(parts)


@dataclass(frozen=True)
class _Keyed:
    """GPU work by launch time within each thread (or process) ``by``: ``keys`` (group -> rank ``_g``), ``k``
    (sorted rank << 52 | launch time - ``t0``), ``cum`` (running GPU time along ``k``, one longer)."""

    by: tuple[str, ...]
    keys: pl.DataFrame
    k: pl.Series
    cum: pl.Series
    t0: int

    @staticmethod
    def of(lt: pl.DataFrame, by: tuple[str, ...], t0: int) -> _Keyed:
        if all(lt[c].null_count() == 0 and lt[c].min() == lt[c].max() for c in by):
            # one launching thread (the usual trace): no unique, no join
            keys = lt.head(1).select(list(by)).with_row_index("_g")
            lk = lt.select(k=pl.col("start") - t0, t="t")
        else:
            keys = lt.select(list(by)).unique().sort(list(by)).with_row_index("_g")
            lk = lt.join(keys, on=list(by), how="left").select(
                k=pl.col("_g").cast(pl.Int64) * (1 << _T_BITS) + (pl.col("start") - t0), t="t")
        if not lk["k"].is_sorted():
            lk = lk.sort("k")
        return _Keyed(by, keys, lk["k"], pl.concat([pl.Series([0], dtype=pl.Int64), lk["t"].cast(pl.Int64).cum_sum()]),
                      t0)

    def inside(self, ranges: pl.DataFrame) -> int:
        """GPU time launched inside ``ranges`` (merged per group) by the same group."""
        from tracekit.intervals import merge

        m = merge(ranges, list(self.by)).collect().join(self.keys, on=list(self.by), how="inner")
        if m.height == 0:
            return 0
        base = pl.col("_g").cast(pl.Int64) * (1 << _T_BITS)
        b = m.select(lo=base + pl.col("start") - self.t0, hi=base + pl.col("end") - self.t0)
        lo = self.k.search_sorted(b["lo"], side="left")
        hi = self.k.search_sorted(b["hi"], side="right")
        return int((self.cum.gather(hi) - self.cum.gather(lo)).sum())


class _Coverage:
    """Which share of the GPU work ranges enclose the launches of (see :func:`range_coverage`), with the sorted
    work computed once for every pattern a caller asks about."""

    def __init__(self, lt: pl.DataFrame, t0: int):
        # in launch order once: the per-thread keys of one launching thread are then in order too (no second sort)
        self.lt = lt if lt["start"].is_sorted() else lt.sort("start")
        self.t0 = t0
        self._keyed: dict[tuple[str, ...], _Keyed] = {}
        self.starts = self.lt["start"]
        self.cum = pl.concat([pl.Series([0], dtype=pl.Int64), self.lt["t"].cast(pl.Int64).cum_sum()])
        self.total = int(self.cum[-1])

    def keyed(self, by: tuple[str, ...]) -> _Keyed:
        if by not in self._keyed:
            self._keyed[by] = _Keyed.of(self.lt, by, self.t0)
        return self._keyed[by]

    def span(self, ranges: pl.DataFrame) -> int:
        """GPU time launched (any thread) between the first range's start and the last range's end."""
        lo = self.starts.search_sorted(ranges["start"].min(), side="left")
        hi = self.starts.search_sorted(ranges["end"].max(), side="right")
        return int(self.cum[hi] - self.cum[lo])

    def of(self, ranges: pl.DataFrame) -> tuple[float, int, int]:
        rng = ranges.filter(pl.col("end").is_not_null())
        if rng.height == 0 or self.total == 0:
            return 0.0, 0, 0
        span = self.span(rng)
        if span == 0:
            return 0.0, 0, 0
        inside = self.keyed(("pid", "tid")).inside(rng)
        if inside < MIN_STEP_RANGE_SHARE * span:  # ranges on another thread: the breakdown's per-process rule
            inside = max(inside, self.keyed(("pid",)).inside(rng))
        return inside / span, inside, span


def _coverage(trace: Trace, device: int | None) -> _Coverage | None:
    lt = launch_gpu_time(trace, device)
    if lt.height == 0:
        return None
    t0 = min(int(lt["start"].min()), int(trace.ranges["start"].min()) if trace.ranges.height else 0)
    return _Coverage(lt, t0)


def range_coverage(trace: Trace, ranges: pl.DataFrame, device: int | None = None) -> tuple[float, int, int]:
    """``(share, enclosed_ns, span_ns)``: the share of the GPU work launched within the span of ``ranges`` whose
    launch they enclose, on the launching thread, or in the launching process where that encloses more (the
    breakdown attributes by process when the step ranges live on another thread)."""
    cov = _coverage(trace, device)
    return cov.of(ranges) if cov is not None else (0.0, 0, 0)


def step_candidates(trace: Trace, top: int | None = 10, device: int | None = None) -> pl.DataFrame:
    """Range-name patterns that could be steps: those whose ranges enclose the launches of most of the GPU work in
    their span (``MIN_STEP_RANGE_SHARE``, the test a ``--step-range`` is held to), ranked by the share of all the
    GPU time they enclose (how well they tile the GPU timeline), then by count; never a framework op's range
    (``OP_RANGE``) or a collective's annotation (``COLLECTIVE_RANGE``). Columns: pattern, regex, count, min_depth,
    gpu_share."""
    pats = range_patterns(trace.ranges, top=None)
    schema = {"pattern": pl.String, "regex": pl.String, "count": pl.Int64, "min_depth": pl.Int32,
              "gpu_share": pl.Float64}
    cov = _coverage(trace, device) if pats.height else None
    if cov is None or cov.total == 0:
        return pl.DataFrame(schema=schema)
    rng = trace.ranges.filter(pl.col("domain").is_null() | (pl.col("domain") != "NCCL")).with_columns(
        pattern=name_pattern(pl.col("name").str.slice(0, 200)))
    # framework-op ranges (torch.autograd.profiler.emit_nvtx: "aten::linear, op_id = 12") hold one op, and a
    # collective's annotation one collective: not a step
    pats = pats.filter(~pl.col("pattern").str.contains(OP_RANGE) & ~pl.col("pattern").str.contains(COLLECTIVE_RANGE))
    shares = []
    # the most frequent patterns and the known step patterns (a few dozen at most), not events
    known = pats.filter(pl.any_horizontal([pl.col("pattern").str.contains(rx) for rx, _ in KNOWN_STEP_PATTERNS]))
    looked = pl.concat([pats.head(max(top or 0, 20)), known]).unique("pattern", maintain_order=True)
    for pattern in looked["pattern"].to_list():
        share, inside, _ = cov.of(rng.filter(pl.col("pattern") == pattern))
        # a candidate passes the test --step-range is held to (its ranges enclose the launches of most of the
        # GPU work in their span): info never offers a range breakdown would refuse
        shares.append(inside / cov.total if share >= MIN_STEP_RANGE_SHARE else 0.0)
    out = looked.with_columns(gpu_share=pl.Series(shares, dtype=pl.Float64)).filter(pl.col("gpu_share") > 0)
    out = out.sort(["gpu_share", "count", "pattern"], descending=[True, True, False]).select(list(schema))
    return out.head(top) if top is not None else out


def _refuse_poor_step_range(trace: Trace, rng: pl.DataFrame, regex: str, device: int | None) -> None:
    """Raise when the ranges of ``--step-range`` do not enclose the launches of most of the kernel time in their span
    (a range around one collective, say): its "steps" would be idle GPU time."""
    share, inside, span = range_coverage(trace, rng, device)
    if span == 0 or share >= MIN_STEP_RANGE_SHARE:
        return
    from tracekit.errors import BadOptionValue

    cands = step_candidates(trace, top=3, device=device)
    better = ", ".join(f"{r!r} ({c} ranges, {100 * g:.0f}% of the GPU time)"
                       for r, c, g in zip(cands["regex"], cands["count"], cands["gpu_share"])) or "none"
    raise BadOptionValue(
        f"--step-range {regex!r}: its {rng.height} range(s) enclose the launches of only {100 * share:.1f}% of the "
        f"kernel time in their span ({inside / 1e6:.3f} of {span / 1e6:.3f} ms); a step range must hold its step's "
        f"launches. Step candidates: {better}")


def auto_pattern(trace: Trace, every_phase: bool = False) -> tuple[str, str] | None:
    """(pattern, why) of the step ranges, or None when no range pattern looks like steps.

    With ``every_phase``, a known pattern that has one range-name pattern per forward mode (SGLang) is returned
    as the regex of all of them (``^step\\[``): see :data:`EVERY_PHASE_PATTERNS`.
    """
    pats = range_patterns(trace.ranges, top=None)
    if pats.height == 0:
        return None
    if per_forward_spans(pats):
        # (SGLang's per-forward spans of a speculative loop: never steps, neither as a known nor as a generic pattern)
        pats = pats.filter(~pl.col("pattern").str.contains(r"^step\["))
        if pats.height == 0:
            return None
    for rx, why in KNOWN_STEP_PATTERNS:
        hit = pats.filter(pl.col("pattern").str.contains(rx))
        if hit.height:
            wide = EVERY_PHASE_PATTERNS.get(rx) if every_phase else None
            if wide is not None and pats.filter(pl.col("pattern").str.contains(wide)).height > 1:
                return wide, why
            return hit["pattern"][0], why
    # Generic: outermost repeating pattern (>= 3 ranges) whose ranges hold most of the GPU work launches
    # (op-level ranges such as aten::* from emit_nvtx each hold a launch or two, so they never qualify).
    cands = pats.filter((pl.col("count") >= 3) & ~pl.col("pattern").str.contains(r"^(aten|c10d|nccl|cuda)\w*[:.]"))
    cands = cands.sort(["min_depth", "count"], descending=[False, True])
    work = trace.launches.filter(pl.col("kind").is_in(["kernel", "graph", "memcpy", "memset"])).height
    for pattern in cands["pattern"].head(20):
        rng = trace.ranges.filter(name_pattern(pl.col("name").str.slice(0, 200)) == pattern)
        lr = _launching(rng, trace.launches)
        if work and lr["n_launches"].sum() >= 0.5 * work and (lr["n_launches"] > 0).mean() >= 0.8:
            return pattern, "outermost repeating range that holds most GPU work launches"
    return None


def per_forward_spans(pats: pl.DataFrame) -> bool:
    """Whether the range patterns (:func:`range_patterns`) hold SGLang's per-forward spans of a speculative loop
    (:data:`SGLANG_SUB_ITERATION`): then ``step[...]`` spans are forwards, not scheduler iterations."""
    return bool(pats["pattern"].str.contains(SGLANG_SUB_ITERATION).any()) if pats.height else False


def verify_tiled_steps(trace: Trace) -> Steps | None:
    """Steps tiled by SGLang's verify spans, where the launch sequence gives no period: one step per verify span,
    from the first SGLang span after the previous verify (its draft forwards, eager) or the verify itself (draft graph
    replays have no span) to the same point of the next iteration; the last one open (cut by the capture window)."""
    spans = trace.ranges.filter(pl.col("name").str.contains(r"^step\[")).sort("start")
    if spans.height == 0:
        return None
    spans = spans.with_columns(verify=pl.col("name").str.contains(SGLANG_VERIFY))
    # an iteration begins at the first span after a verify span (or at the first span of the window)
    begins = spans.with_columns(
        it=pl.col("verify").shift(1, fill_value=True).cast(pl.Int64).cum_sum().over("pid", "tid"))
    firsts = begins.group_by("pid", "tid", "it").agg(start=pl.col("start").min(), v=pl.col("verify").any())
    firsts = firsts.filter("v").sort("start")
    if firsts.height < 2:
        return None
    windows = firsts.with_columns(end=(pl.col("start").shift(-1).over("pid", "tid") - 1)).select(
        "pid", "tid", "start", "end", name=pl.lit("SGLang iteration (verify spans)"))
    return Steps(_windows(windows), _marker_kind(trace), None,
                 ["SGLang's step spans cover single forwards of a speculative loop, and the launch sequence gave no "
                  "period: one step per verify span (the draft forwards before it, the draft-extend after it)"])


def iteration_windows(windows: pl.DataFrame, launches: pl.DataFrame | None = None) -> pl.DataFrame:
    """Step windows that run from one iteration's start to the next's (contract, "Every kernel is counted").

    An engine's span can cover part of a scheduler iteration only: vLLM V1's ``execute_context_N(Tc)_generation_M(Tg)``
    (``Worker.annotate_profile`` around ``execute_model``) closes after the target's forward, and sampling, rejection
    and the proposer's draft forwards (``GPUModelRunner.sample_tokens``, ``propose_draft_token_ids``) are launched
    after it, before the next span. The step is the whole iteration: each window's end becomes the next window's
    start on the same thread (minus 1 ns: windows never overlap); the last window of a thread keeps its end (nothing
    says where its iteration ends: what runs after it is "after the last step"), and a window with no end (cut by
    the capture) keeps none. Windows that already tile their thread (inferred steps, ``ProfilerStep#``) are
    unchanged but for the nanosecond between a window's end and the next start.

    With ``launches`` (the trace's): a range that launches no GPU work on its own thread is no iteration's start (a
    marker inside an iteration, an ``MPI_Send`` a ``--step-range`` also matched): it keeps its own span (a step
    with no GPU work) and does not end the iteration before it, whose window runs on to the next range that
    launches work. Where no range launches work on its own thread (the ranges are on another thread than the
    launches), every range starts an iteration.

    >>> w = pl.DataFrame({"step": [0, 1, 2], "pid": [1, 1, 1], "tid": [7, 7, 7], "start": [0, 100, 200],
    ...                   "end": [40, 150, 260], "name": ["s", "s", "s"]})
    >>> iteration_windows(w)["end"].to_list()
    [99, 199, 260]
    """
    if windows.height < 2:
        return windows
    starts = pl.lit(True)
    if launches is not None:
        held = _holds_work(windows, launches)
        if bool(held["starts"].any()):
            windows = windows.join(held, on="step", how="left", maintain_order="left")
            starts = pl.col("starts").fill_null(False)
    # the next iteration's start on the same thread: the next window that starts one
    nxt = (pl.when(starts).then(pl.col("start")).shift(-1).backward_fill()
           .over("pid", "tid", order_by="start"))
    return windows.with_columns(
        end=pl.when(starts & pl.col("end").is_not_null() & nxt.is_not_null()).then(nxt - 1).otherwise(pl.col("end"))
    ).drop("starts", strict=False)


def _holds_work(windows: pl.DataFrame, launches: pl.DataFrame) -> pl.DataFrame:
    """``step``, ``starts``: whether each window holds a work launch (kernel, graph, memcpy, memset) on its thread.
    Where one thread made every call and holds every window, its calls in time order (the usual trace): two binary
    searches per window over the calls and a running count of the work calls among them; else one as-of join
    (:func:`_launching`)."""
    from tracekit.intervals import one_thread

    one = one_thread(launches) if launches.height else None
    w = windows.select("step", "pid", "tid", "start", "end")
    if (one is not None and w["pid"].n_unique() == 1 and w["tid"].n_unique() == 1
            and (w["pid"][0], w["tid"][0]) == tuple(one) and launches["start"].is_sorted()):
        work = launches["kind"].is_in(["kernel", "graph", "memcpy", "memset"]).cast(pl.Int64)
        cum = pl.concat([pl.Series([0], dtype=pl.Int64), work.cum_sum()])
        lo = launches["start"].search_sorted(w["start"], side="left")
        end = w["end"].fill_null(launches["start"].max() if launches.height else 0)
        hi = launches["start"].search_sorted(end, side="right")
        return pl.DataFrame({"step": w["step"], "starts": (cum.gather(hi) - cum.gather(lo)) > 0})
    return _launching(w, launches).select("step", starts=pl.col("n_launches") > 0)


def _whole_iterations(found: Steps | None, trace: Trace) -> Steps | None:
    """``found`` with its windows made whole iterations (:func:`iteration_windows`)."""
    if found is None or found.windows.height < 2:
        return found
    # (inferred windows each begin with a work launch: every one starts an iteration, nothing to look up)
    found.windows = iteration_windows(found.windows, trace.launches if found.marker != "inferred" else None)
    return found


def find_steps(trace: Trace, *, step_range: str | None = None, device: int | None = None,
               every_phase: bool = False) -> Steps | None:
    """Step windows of ``trace`` (None when none can be found), each a whole scheduler iteration: from its start
    to the next iteration's start (:func:`iteration_windows`), whatever span the engine draws around part of it.
    See :func:`find_step_spans` for how the iterations' starts are found."""
    return _whole_iterations(find_step_spans(trace, step_range=step_range, device=device, every_phase=every_phase),
                             trace)


def find_step_spans(trace: Trace, *, step_range: str | None = None, device: int | None = None,
                    every_phase: bool = False) -> Steps | None:
    """Step windows of ``trace`` (None when none can be found).

    ``every_phase``: take the known step ranges of every forward mode (SGLang ``step[EXTEND ...]`` beside
    ``step[DECODE ...]``), for a caller that tells their phase (``tracekit.analyses.phase``) and excludes the
    unselected ones with the reason "phase". Off, only SGLang's decode steps are taken (the behaviour before
    phases existed).
    """
    warnings: list[str] = []
    if step_range is not None:
        rng = select_ranges(trace.ranges, step_range)
        if rng.height == 0:
            return None
        _refuse_poor_step_range(trace, rng, step_range, device)
        return Steps(_windows(rng), _marker_kind(trace), step_range, warnings)
    found = auto_pattern(trace, every_phase=every_phase)
    if found is not None:
        pattern, why = found
        pats = name_pattern(pl.col("name").str.slice(0, 200))
        if pattern in EVERY_PHASE_PATTERNS.values():
            rng = trace.ranges.filter(pats.str.contains(pattern) & (pl.col("domain").is_null()
                                                                     | (pl.col("domain") != "NCCL")))
        else:
            rng = trace.ranges.filter(pats == pattern)
        # Keep the outermost occurrences only (a pattern can nest in itself, e.g. recursion).
        rng = rng.filter(pl.col("depth") == rng["depth"].min()) if rng.height else rng
        return Steps(_windows(rng), _marker_kind(trace), pattern, warnings)
    inferred = infer_steps(trace, device=device)
    if inferred is None and per_forward_spans(range_patterns(trace.ranges, top=None)):
        return verify_tiled_steps(trace)
    return inferred


# ------------------------------------------------------------------------------------------------------------
# Inference from the launch sequence's own period (no markers). Contract, "Inferred steps": a step is the
# smallest repeating unit of the launch sequence (kernel names and graph launches) that contains a host read
# of device data (a synchronisation or a device-to-host copy); a step starts at the first launch after that
# read. docs/definitions.md ("Inferred steps") explains the method; the numbers below are its knobs.

# Synchronising calls that make the GPU wait, not the host: never a read.
_NOT_READS = ("cudaStreamWaitEvent", "cuStreamWaitEvent", "hipStreamWaitEvent")
_SEQ_KINDS = ("kernel", "graph", "memcpy", "memset", "sync")
_KIND_CODE = {"kernel": 1, "graph": 2, "memcpy": 3, "memset": 4, "sync": 5}
# Periods tried, in read-delimited segments per step (a step with more host reads than this is not found).
MAX_PERIOD_SEGMENTS = 64
# A period is accepted when at least this share of segments equals the segment one period later.
MIN_AGREEMENT = 0.5
# The smallest period whose agreement is within this much of the best one wins: multiples of the period agree
# as well, and a longer one can agree better only because it swallows a periodic disturbance (a read every 16
# steps, the capture's own synchronisations), which does not make it the step.
PERIOD_SLACK = 0.2
# Launches before a read that identify it within a period (the first width that tells the reads apart).
CONTEXT_WIDTHS = (1, 2, 4, 8, 16, 32, 64)


@dataclass
class Period:
    """What :func:`find_period` found: per step, in the steady state (medians over complete steps)."""

    segments: int  # host-read-delimited segments per step (the period, in segments)
    launches: float  # work launches (kernels, graph launches, copies, memsets) per step
    graph_launches: float
    reads: float  # host reads per step
    agreement: float  # share of segments equal to the segment one period later
    complete: int  # complete steps found
    anchor: str  # which read starts a step, in words
    # Stretches with a period of their own (prefill steps, then decode steps, say), in time order: each
    # {"steps", "segments", "launches", "graph_launches", "reads"} (complete steps; medians per step).
    regimes: list[dict] = field(default_factory=list)
    # Why the part before the first closing read is a whole step or cut by the capture, in words (see _whole).
    lead: str | None = None
    # Set when that part is a whole step unlike the usual one (its launches, why): the warning says so.
    lead_note: str | None = None

    def describe(self) -> str:
        """The period in words, for the warning."""
        parts = []
        for r in self.regimes or [dict(steps=self.complete, segments=self.segments, launches=self.launches,
                                       graph_launches=self.graph_launches, reads=self.reads)]:
            g = f" ({r['graph_launches']:g} graph launches)" if r["graph_launches"] else ""
            parts.append(f"{r['steps']} complete step{'s' if r['steps'] != 1 else ''} of {r['launches']:g} "
                         f"launches{g} and {r['reads']:g} host read{'s' if r['reads'] != 1 else ''} each")
        return "; then ".join(parts)


def _main_thread(trace: Trace, device: int | None, first: pl.Series | None = None) -> tuple[int, int] | None:
    """The (pid, tid) that launches the most kernels and graphs (on ``device``). ``first``: :func:`_first_kernels`
    of the trace, when the caller has it."""
    launches = trace.launches
    mask = launches["kind"].is_in(["kernel", "graph"])
    if device is not None:
        # The launches with a kernel on ``device``: a keyed lookup of each launch's first kernel (every kernel of one
        # launch runs on one device), not a semi-join against the unique keys of every kernel (a hash of ten million
        # keys: 0.6 s of CPU at 1M kernels, most of the inferred steps' cost; issue 49).
        kernels = trace.kernels
        first = _first_kernels(trace) if first is None else first
        dev = kernels["device"]
        if dev.null_count() == 0 and dev.min() == device == dev.max():  # (one device: the sorted flag answers at once)
            mask = mask & first.is_not_null()
        elif kernels.height:
            mask = mask & (dev.gather(first) == device).fill_null(False)
        else:
            mask = mask & first.is_not_null()
    work = launches.select("pid", "tid").filter(mask)
    if work.height == 0:
        return None
    top = work.group_by("pid", "tid").agg(n=pl.len()).sort(["n", "pid", "tid"], descending=[True, False, False]).row(0)
    return top[0], top[1]


def _first_kernels(trace: Trace) -> pl.Series:
    """For each launch of ``trace``, the row of its first kernel in ``trace.kernels`` (null: none); a keyed lookup
    (tracekit.lookup), no hash join of ten million kernels."""
    from tracekit.lookup import row_lookup

    return row_lookup(trace.launches.select("pid", "correlation"), trace.kernels.select("pid", "correlation"))


def launch_sequence(trace: Trace, pid: int, tid: int, first: pl.Series | None = None) -> pl.DataFrame:
    """The launches of one host thread in start order, each with a token saying what it launched.

    Columns: ``start``, ``end`` (host API call, ns), ``correlation``, ``kind`` (kernel | graph | memcpy |
    memset | sync), ``token`` (UInt64; equal tokens = the same kernel name, the same CUDA graph (its kernel
    count, first and last kernel, copies), the same copy direction, the same synchronising call), ``read``
    (a host read of device data: a call that blocks the host on the GPU (``cudaStreamWaitEvent`` does not)
    or a device-to-host copy), ``dtoh`` (a device-to-host copy), ``tid``. Other API calls are left out.
    The reads of the process's other threads are merged in when this thread has fewer than two of its own
    (a serving engine may read the tokens on a scheduler thread). ``first``: :func:`_first_kernels` of the trace,
    when the caller has it.

    Every pass over all the launches is narrow (issue 49): the graph launches' and copies' own columns (kernel count,
    last kernel, copy kind) are joined to those few rows alone, and a kernel launch's token (it depends on its first
    kernel's name alone) is gathered from a table of one token per kernel name.
    """
    launches, kernels = trace.launches, trace.kernels
    first = _first_kernels(trace) if first is None else first
    kind = launches["kind"]
    in_pid = (launches["pid"] == pid) & kind.is_in(list(_SEQ_KINDS))
    is_copy = in_pid & (kind == "memcpy")
    m = (trace.memops.filter(pl.col("pid") == pid).join(launches.filter(is_copy).select("correlation"),
                                                          on="correlation", how="semi")
         .group_by("correlation").agg(n_m=pl.len(), copy_kind=pl.col("copy_kind").first()))
    dtoh = is_copy & launches["correlation"].is_in(m.filter(pl.col("copy_kind") == "DtoH")["correlation"].implode())
    read = ((in_pid & (kind == "sync") & ~launches["name"].is_in(list(_NOT_READS))) | dtoh).alias("read")
    mine = in_pid & (launches["tid"] == tid)
    cols = launches.select("start", "end", "tid", "correlation", "kind", api=pl.col("name"), first=first,
                           dtoh=dtoh, read=read)
    if int((mine & read).sum()) >= 2:
        own = cols.filter(mine)  # (one pass, one copy of the thread's rows)
    else:  # reads on another thread of the process (a scheduler thread, say)
        seq = cols.filter(in_pid)
        own = seq.filter(pl.col("tid") == tid)
        own = pl.concat([own.filter(~pl.col("read")), seq.filter(pl.col("read"))])
        own = own.filter((pl.col("tid") == tid) | pl.col("read"))
    if not own["start"].is_sorted():
        own = own.sort("start", maintain_order=True)
    codes = kernels["name"].to_physical()
    own = own.with_columns(first_k=codes.gather(own["first"]).cast(pl.Int64) if kernels.height
                           else pl.lit(None, pl.Int64)).drop("first")
    is_graph, is_copy, is_sync = (pl.col("kind") == "graph"), (pl.col("kind") == "memcpy"), (pl.col("kind") == "sync")
    kind_code = pl.lit(0, pl.Int8)
    for k, c in _KIND_CODE.items():
        kind_code = pl.when(pl.col("kind") == k).then(pl.lit(c, pl.Int8)).otherwise(kind_code)

    def token(a: pl.Expr, b: pl.Expr, n: pl.Expr, m: pl.Expr, c: pl.Expr) -> pl.Expr:
        return pl.struct(kind=kind_code, a=a, b=b, n=n, m=m, c=c).hash(7)

    none = (pl.lit(None, pl.Int64), pl.lit(None, pl.UInt32), pl.lit(None, pl.UInt32), pl.lit(None, pl.String))
    # A kernel launch's token, by its first kernel's name code: one struct hash per code, gathered.
    top = own["first_k"].max()
    plain = (own["kind"] == "kernel") & own["first_k"].is_not_null()
    if top is not None and int(top) < 4 * own.height + (1 << 20):
        table = pl.select(i=pl.int_range(0, int(top) + 1, dtype=pl.Int64)).select(tok=pl.struct(
            kind=pl.lit(_KIND_CODE["kernel"], pl.Int8), a="i", b=none[0], n=none[1], m=none[2], c=none[3]).hash(7))
        tok = table["tok"].gather(own["first_k"].fill_null(0))
        at = (~plain).arg_true()
    else:
        tok = own.select(token(pl.when(is_sync).then(pl.col("api").to_physical().cast(pl.Int64))
                               .otherwise(pl.col("first_k")), *none))["kind"]
        at = own.select(is_graph | is_copy).to_series().arg_true()
    if at.len():
        # the graph launches' kernel count, first and last kernel, and the copies' count and kind: on those rows alone
        rest = own[at].with_columns(i=at)
        graphs = rest.filter(is_graph).select("correlation")
        gk = (kernels.filter(pl.col("pid") == pid).join(graphs, on="correlation", how="semi")
              .select("correlation", "start", code=pl.col("name").to_physical().cast(pl.Int64))
              .group_by("correlation").agg(n_k=pl.len(), g_first=pl.col("code").sort_by("start").first(),
                                           last_k=pl.col("code").sort_by("start").last()))
        rest = (rest.join(gk, on="correlation", how="left", maintain_order="left")
                .join(m, on="correlation", how="left", maintain_order="left"))
        a = pl.when(is_sync).then(pl.col("api").to_physical().cast(pl.Int64)).otherwise(
            pl.coalesce("g_first", "first_k"))
        rest_tok = rest.select(token(a, pl.col("last_k"), pl.col("n_k"), pl.col("n_m"),
                                     pl.when(is_copy).then(pl.col("copy_kind"))))["kind"]
        tok = tok.scatter(rest["i"], rest_tok)
    return own.select("start", "end", "tid", "correlation", pl.col("kind").cast(pl.String), token=tok,
                      read="read", dtoh="dtoh")


def _segments(seq: pl.DataFrame) -> pl.DataFrame:
    """The sequence cut after each run of reads: one row per segment (its work launches, then its reads).

    Columns: seg, first_start (first work launch), read_end (end of its last read; null: no read, the
    trailing part), n_work, n_graph, n_reads, dtoh, h (hash of its token list, in order), work (its work
    tokens, in order).
    """
    prev_read = pl.col("read").shift(1, fill_value=False)
    # (a running count: flagged sorted, the group-by below works on slices instead of hashing every launch)
    seq = seq.with_columns(seg=(~pl.col("read") & prev_read).cum_sum().cast(pl.Int64).set_sorted())
    segs = seq.group_by("seg", maintain_order=True).agg(
        first_start=pl.col("start").filter(~pl.col("read")).first(),
        read_end=pl.col("end").filter(pl.col("read")).max(),
        n_work=(~pl.col("read")).sum(),
        n_graph=(pl.col("kind") == "graph").sum(),
        n_reads=pl.col("read").sum(),
        dtoh=pl.col("dtoh").any(),
        toks=pl.col("token"),
        work=pl.col("token").filter(~pl.col("read")),
        rtoks=pl.col("token").filter(pl.col("read")),
    )
    return segs.with_columns(h=pl.col("toks").hash(11)).drop("toks")


def _agreement(h: pl.Series, p: int) -> float:
    if h.len() <= p:
        return 0.0
    return float((h.slice(0, h.len() - p) == h.slice(p)).mean())


def _closing(segs: pl.DataFrame, lead_after_read: bool) -> tuple[pl.Series, Period] | None:
    """Which segments of ``segs`` (a contiguous run of :func:`_segments` rows) end with the read that closes a
    step, and the period found; None when the run has no period."""
    closed = segs.filter(pl.col("read_end").is_not_null() & (pl.col("n_work") > 0))
    # The first segment may be cut by the capture start: the period is measured on the ones after it.
    inner = closed.filter(pl.col("seg") > segs["seg"][0]) if closed.height > 2 and not lead_after_read else closed
    h = inner["h"]
    m = h.len()
    scores = {p: _agreement(h, p) for p in range(1, min(MAX_PERIOD_SEGMENTS, m // 2) + 1)}
    if not scores or max(scores.values()) < MIN_AGREEMENT:
        return None
    best = max(scores.values())
    p = min(q for q, v in scores.items() if v >= max(best - PERIOD_SLACK, MIN_AGREEMENT))
    # Which read of the period closes a step: a device-to-host copy's (the token read), then the one followed
    # by the longest host time (the host's own work between steps: sampling, scheduling).
    inner = inner.with_columns(phase=pl.int_range(pl.len()) % p,
                               after=pl.col("first_start").shift(-1) - pl.col("read_end"))
    # Among equally likely reads, the capture's own start breaks the tie: profilers start between steps (SGLang's
    # /start_profile, cudaProfilerStart before a step), so the read whose first occurrence closes a whole period
    # of launches from the capture's start is the step's last.
    period_work = int(inner["n_work"].head(p).sum()) if m >= p else -1
    head_work = segs.select("seg", head=pl.col("n_work").cum_sum())
    starts_whole = inner.head(p).join(head_work, on="seg", how="left").select(
        phase=pl.int_range(pl.len()), whole=pl.col("head") == period_work)
    by_phase = (inner.group_by("phase").agg(dtoh=pl.col("dtoh").mean(), after=pl.col("after").median())
                .join(starts_whole, on="phase", how="left")
                .with_columns(pl.col("after").fill_null(0), pl.col("whole").fill_null(False))
                .sort(["dtoh", "whole", "after", "phase"], descending=[True, True, True, False]))
    anchor_phase = int(by_phase["phase"][0])
    how = ("the device-to-host copy" if float(by_phase["dtoh"][0]) >= 0.5
           else "the host read followed by the longest host time")
    # The anchor read is recognised by its context: the launches just before it and the first call of its read
    # run (a run may end with a stray synchronisation, e.g. the one that stops the capture). The shortest
    # context that occurs at no other read of the period is used.
    close = None
    for w in CONTEXT_WIDTHS:
        key = pl.concat_list(pl.col("work").list.tail(w), pl.col("rtoks").list.head(1)).hash(13)
        keyed = inner.select("phase", key=key)
        anchor_key = keyed.filter(pl.col("phase") == anchor_phase)["key"].mode().sort()[0]
        if keyed.filter((pl.col("phase") != anchor_phase) & (pl.col("key") == anchor_key)).height <= 0.05 * m:
            close = segs.select(c=(key == anchor_key) & pl.col("read_end").is_not_null() & (pl.col("n_work") > 0))["c"]
            break
    if close is None:  # no context tells the anchor apart: every p-th read from the first anchor-phase one
        first = int(inner["seg"][anchor_phase])
        idx = segs.select(i=pl.int_range(pl.len()), seg="seg")
        first_i = int(idx.filter(pl.col("seg") == first)["i"][0])
        close = idx.select(c=(pl.col("i") >= first_i) & ((pl.col("i") - first_i) % p == 0))["c"] & \
            segs["read_end"].is_not_null()
        how = f"every {p}th host read"
    per = Period(segments=p, launches=0.0, graph_launches=0.0, reads=0.0, agreement=scores[p], complete=0,
                 anchor=how)
    return close, per


def _step_ids(close: pl.Series) -> pl.Series:
    """Step number of each segment: a step ends with a closing segment, the next begins after it."""
    return close.shift(1, fill_value=False).cum_sum().cast(pl.Int64)


# Launches at the head of a step that identify its start (the shortest that occurs once in the usual step).
HEAD_WIDTHS = (1, 2, 3, 4, 6, 8)


def _whole(steps: pl.DataFrame, segs: pl.DataFrame, capture: str | None = None
           ) -> tuple[pl.Series, str | None, bool]:
    """Complete steps, and why the part before the first closing read (the *lead*) is whole or cut.

    Returns ``(complete, why, other)``: ``other`` is True when the lead is a whole step unlike the usual one (rules
    3 and 4). Every step after the lead that a closing read closes is complete. The lead, in this order of evidence
    (the first that applies decides; docs/definitions.md, "Inferred steps"):

    1. it is made of the same segments as the usual step: whole;
    2. its launches are a proper suffix of a complete step's (:func:`_is_suffix`): the capture began inside that
       kind of step, so it is cut;
    3. ``capture`` (:func:`capture_evidence`): the trace records its capture's start on the launching thread
       before the lead's first launch, with nothing recorded in between, so the capture did not cut it: whole,
       whatever its kind (a prefill step before decode steps);
    4. it begins with the launches a step begins with (:func:`_starts_a_step`): whole;
    5. otherwise cut (nothing says the capture did not cut it).
    """
    h = steps.select(pl.col("hs").hash(17))["hs"]
    complete = (steps["closed"] & (steps["i"] > 0)).alias("complete")
    if steps.height == 0 or not bool(steps["closed"][0]):
        return complete, None, False
    usual = h.filter(steps["closed"] & (steps["i"] > 0)).mode()
    other = False
    if bool((h.is_in(usual.implode()) & (steps["i"] == 0)).any()):
        lead, why = True, "its launches are the usual step's"
    elif _is_suffix(steps, segs):
        lead, why = False, "its launches are the end of a complete step's: the capture began inside that step"
    elif capture is not None:
        lead, why, other = True, capture, True
    elif _starts_a_step(steps.with_columns(h=h), segs):
        lead, why, other = True, "it begins with the launches a step begins with", True
    else:
        lead, why = False, "nothing in the trace says the capture did not cut it"
    first = "the first step is whole: " if lead else "the part before the first step is cut by the capture window: "
    return (complete | ((steps["i"] == 0) & lead)).alias("complete"), first + why, other


def _is_suffix(steps: pl.DataFrame, segs: pl.DataFrame) -> bool:
    """Whether the lead's work launches, in order, are the last launches of some complete step with more launches
    (a proper suffix): what the capture leaves of a step it began inside. One join of the lead's launches, by
    their position from the end, with every complete step's last launches (no loop over steps)."""
    pool = steps.filter(pl.col("closed") & (pl.col("i") > 0)).select("sid")
    if pool.height == 0:
        return False
    toks = segs.select("sid", "work").explode("work").drop_nulls("work").with_columns(
        back=pl.int_range(pl.len()).reverse().over("sid"), m=pl.len().over("sid"))
    lead = toks.filter(pl.col("sid") == int(steps["sid"][0])).select("back", lw="work")
    n = lead.height
    if n == 0:
        return False
    tails = toks.join(pool, on="sid", how="semi").filter((pl.col("back") < n) & (pl.col("m") > n))
    hits = tails.join(lead, on="back", how="inner").group_by("sid").agg(same=(pl.col("work") == pl.col("lw")).sum())
    return bool((hits["same"] == n).any())


def capture_evidence(trace: Trace, pid: int, tid: int, seq: pl.DataFrame) -> str | None:
    """Why the capture did not cut the launching thread's first recorded work, in words, or None without evidence.

    The trace records its capture's start (``TraceMeta.capture_start``) before the thread's first launch, and
    nothing of the thread (no launch, no host read) is recorded in between: on the launching thread itself
    (nsys ``cuProfilerStart``/``cudaProfilerStart``, torch.profiler's ``start_trace`` frame), the thread started
    the capture and then began that work; where the trace does not name the thread (the Kineto profiler span
    alone), the framework op that launched the first work must be recorded, and so began after the start (the
    profiler records no op that was open when it started)."""
    cs = trace.meta.capture_start
    if cs is None or seq.height == 0 or bool(seq["read"][0]):
        return None
    first = int(seq["start"][0])
    if cs.ns > first:
        return None
    ahead = f"{cs.call} {(first - cs.ns) / 1e6:.3f} ms before its first launch, nothing recorded in between"
    if cs.tid is not None:
        if (cs.pid, cs.tid) != (pid, tid):
            return None
        return f"the capture started on the launching thread ({ahead})"
    op = trace.ops.filter((pl.col("pid") == pid) & (pl.col("tid") == tid) & (pl.col("start") >= cs.ns)
                          & (pl.col("start") <= first) & (pl.col("end") >= first))
    if op.height == 0:
        return None
    return f"the capture started ({ahead}) and the op that launched it ({op['name'][0]}) was recorded whole"


def _starts_a_step(steps: pl.DataFrame, segs: pl.DataFrame) -> bool:
    """Whether the first part of the sequence (before its first closing read) begins with the launches a step
    begins with: the first w launches of the usual complete step of its regime, for the shortest w whose launches
    occur only at that step's start (a part cut by the capture's start begins mid-step, with launches that either
    differ or recur inside a step)."""
    if steps.height < 2 or not bool(steps["closed"][0]):
        return False
    regime = steps["regime"][0]
    pool = steps.filter(pl.col("closed") & (pl.col("i") > 0))
    same = pool.filter(pl.col("regime") == regime)
    pool = same if same.height else pool
    if pool.height == 0:
        return False
    usual_h = pool["h"].mode().sort()[0]
    usual_sid = int(pool.filter(pl.col("h") == usual_h)["sid"][0])
    tokens = segs.filter(pl.col("sid") == usual_sid)["work"].explode().drop_nulls()
    lead = segs.filter(pl.col("sid") == int(steps["sid"][0]))["work"].explode().drop_nulls()
    for w in HEAD_WIDTHS:  # a handful of widths, each one vector comparison over ONE step's launches
        if tokens.len() < w or lead.len() < w:
            return False
        hits = pl.DataFrame({"t": tokens}).select(
            pl.all_horizontal([pl.col("t").shift(-k) == tokens[k] for k in range(w)]).fill_null(False))
        if int(hits.to_series().sum()) == 1:
            return lead.head(w).to_list() == tokens.head(w).to_list()
    return False


def find_period(seq: pl.DataFrame, capture: str | None = None) -> tuple[pl.DataFrame, Period] | None:
    """The steps of a launch sequence (:func:`launch_sequence`) from its period, or None when it has none.

    Returns ``(steps, period)``: ``steps`` has one row per step in time order with ``start`` (its first
    work launch), ``end`` (the end of the read that closes it; null for a part cut off by the capture),
    ``complete``, ``n_work``, ``n_graph`` and ``n_reads`` (read runs).

    Method (no Python loop over launches): the sequence is cut after every run of host reads into segments,
    each hashed from its tokens in order; the period p is the smallest number of segments such that most
    segments equal the one p later. Of the p reads of a period, the one that closes a step is the
    device-to-host copy (the token read) when there is one, else the read followed by the longest host time;
    it is recognised everywhere by the launches just before it (the shortest context that occurs once per
    period), so a step whose launches vary elsewhere (a speculative step accepting more tokens, a ragged
    batch) is still cut at the same read. A stretch the period does not explain (another regime: prefill
    steps before decode steps, say) is searched again for its own period.
    """
    if seq.height == 0 or seq["read"].sum() < 2:
        return None
    segs = _segments(seq)
    top = _closing(segs, lead_after_read=False)
    if top is None:
        return None
    close, period = top
    segs = segs.with_columns(close=close, sub=pl.lit(0, pl.Int64), regime=pl.lit(0, pl.Int64))
    segs = segs.with_columns(top=_step_ids(segs["close"]))
    # Stretches the period does not explain: parts not closed by the anchor read, or steps of many periods.
    spans = segs.group_by("top", maintain_order=True).agg(
        n=(pl.col("n_work") > 0).sum(), closed=pl.col("close").any())
    odd = spans.filter((pl.col("n") >= 3) & (~pl.col("closed") | (pl.col("n") >= 2 * period.segments)))
    for t in odd["top"].to_list():  # a loop over regimes (a handful), not over launches
        part = segs.filter(pl.col("top") == t)
        sub = _closing(part, lead_after_read=t > 0)
        if sub is None:
            continue
        sub_close = sub[0] | part["close"]  # the top level's closing read still closes
        if int(sub_close.sum()) < 2:
            continue
        upd = part.select("seg").with_columns(sub2=_step_ids(sub_close), close2=sub_close,
                                              regime2=pl.lit(int(t) + 1, pl.Int64))
        segs = (segs.join(upd, on="seg", how="left", maintain_order="left")
                .with_columns(sub=pl.coalesce("sub2", "sub"), close=pl.coalesce("close2", "close"),
                              regime=pl.coalesce("regime2", "regime"))
                .drop("sub2", "close2", "regime2"))
    segs = segs.with_columns(sid=pl.struct("top", "sub").rank("dense").cast(pl.Int64))
    steps = segs.group_by("sid", maintain_order=True).agg(
        start=pl.col("first_start").drop_nulls().first(),
        end=pl.col("read_end").filter(pl.col("close")).last(),
        closed=pl.col("close").any(),
        n_work=pl.col("n_work").sum(), n_graph=pl.col("n_graph").sum(), n_reads=(pl.col("n_reads") > 0).sum(),
        hs=pl.col("h").filter(pl.col("n_work") > 0), regime=pl.col("regime").first(),
    ).filter(pl.col("n_work") > 0).with_columns(i=pl.int_range(pl.len()))
    # the capture's start is evidence about the lead only when the lead's first launch opens the sequence
    lead_first = steps.height and seq.height and steps["start"][0] == seq["start"][0]
    complete, lead, other = _whole(steps, segs.select("sid", "work"), capture if lead_first else None)
    steps = steps.with_columns(complete)
    steps = steps.with_columns(end=pl.when(pl.col("complete")).then(pl.col("end")))
    good = steps.filter(pl.col("complete"))
    if good.height < 2:
        return None
    period.launches = float(good["n_work"].median())
    period.graph_launches = float(good["n_graph"].median())
    period.reads = float(good["n_reads"].median())
    period.complete = good.height
    period.lead = lead
    if other:  # a whole first step unlike the others (a prefill step before decode steps): said in the warning
        n0, g0 = int(steps["n_work"][0]), int(steps["n_graph"][0])
        graphs = f" ({g0} graph launch{'es' if g0 != 1 else ''})" if g0 else ""
        period.lead_note = f"the first step, of {n0} launches{graphs}, is whole: " + lead.split(": ", 1)[1]
    regimes = good.group_by("regime").agg(
        first=pl.col("start").min(), steps=pl.len(), launches=pl.col("n_work").median(),
        graph_launches=pl.col("n_graph").median(), reads=pl.col("n_reads").median()).sort("first")
    if regimes.height > 1:
        period.regimes = regimes.drop("regime", "first").to_dicts()
    return steps.select("start", "end", "complete", "n_work", "n_graph", "n_reads"), period


def _graph_anchor_steps(trace: Trace, thread: pl.DataFrame, pid: int) -> tuple[pl.Series, str] | None:
    """Fallback without host reads: one step per replay of the CUDA graph with the most GPU time."""
    graphs = thread.filter(pl.col("kind") == "graph")
    if graphs.height < 2:
        return None
    k = (trace.kernels.filter(pl.col("pid") == pid).group_by("correlation")
         .agg(n=pl.len(), t=(pl.col("end") - pl.col("start")).sum()))
    g = graphs.join(k, on="correlation", how="left").with_columns(pl.col("n").fill_null(0), pl.col("t").fill_null(0))
    sig = g.group_by("n").agg(total=pl.col("t").sum(), count=pl.len()).sort(["total", "n"], descending=True)
    if not (sig.height and sig["count"][0] >= 2 and sig["total"][0] > 0):
        return None
    starts = g.filter(pl.col("n") == sig["n"][0])["start"].sort()
    return starts, (f"no host read of device data found: one step per replay of the CUDA graph of {sig['n'][0]} "
                    f"kernels ({sig['count'][0]} replays)")


def infer_steps(trace: Trace, device: int | None = None) -> Steps | None:
    """Steps from the launch sequence's period (see :func:`find_period`); None when there is none.

    The windows are on the thread that launches the most work on ``device``: a complete step runs from its
    first work launch to the end of the read that closes it; the parts before the first and after the last
    closing read are windows with a null end (cut by the capture window) unless the first is a whole step.
    Without any host read the steps are one per replay of the heaviest CUDA graph (a decode step replays the
    target's graph once), with a warning that says so.
    """
    first = _first_kernels(trace)  # (one lookup of every launch's first kernel, for both below)
    main = _main_thread(trace, device, first)
    if main is None:
        return None
    pid, tid = main
    seq = launch_sequence(trace, pid, tid, first)
    found = find_period(seq, capture_evidence(trace, pid, tid, seq))
    if found is not None:
        steps, per = found
        windows = steps.select("start", "end").with_columns(
            pid=pl.lit(pid, pl.Int64), tid=pl.lit(tid, pl.Int64), name=pl.lit("inferred step"))
        lead = f"; {per.lead_note}" if per.lead_note else ""
        msg = (f"no step markers found: steps inferred from the period of the launch sequence ({per.describe()}; "
               f"a step starts after {per.anchor}{lead}); pass --step-range to use a range instead")
        out = Steps(_windows(windows), "inferred", None, [msg])
        out.period = per
        return out
    thread = seq.filter(pl.col("tid") == tid)
    fb = _graph_anchor_steps(trace, thread, pid)
    if fb is None:
        return None
    starts, how = fb
    last_end = thread["end"].max()
    ends = pl.concat([starts.slice(1) - 1, pl.Series([last_end], dtype=pl.Int64)])
    windows = pl.DataFrame({"start": starts, "end": ends}).with_columns(
        pid=pl.lit(pid, pl.Int64), tid=pl.lit(tid, pl.Int64), name=pl.lit("inferred step"))
    return Steps(_windows(windows), "inferred", None,
                 [f"no step markers found: steps inferred from structure, {how}; pass --step-range to use a range "
                  "instead"])
