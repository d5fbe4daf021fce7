"""Per-decode-step breakdown: where every nanosecond of a step's period goes, and which lever is worth pulling.

One pipeline of typed, immutable values (../shared/spec/CONTRACT.md, ``tracekit.breakdown/3``)::

    attribute(trace)  -> Attribution   which step / draft phase each GPU activity belongs to, and what it is
    partition(...)    -> StepTable     each analysed step's period split exactly, its gaps by cause
    time_base(...)    -> TimeBase      the step every saving is stated against (unprofiled when known)
    roofline(...)     -> TraceRoofline the bytes a step reads, the floor and the tok/s ceiling
    advise(facts)     -> Advice        every lever's predicted step, saving and verdict
    headline(...)     -> str           the one-line summary

:func:`breakdown` runs them (the stages are ``tracekit.analyses``) and returns a :class:`Breakdown`.

Typed results end to end: every block of the contract JSON is a frozen dataclass
(:class:`tracekit.contract.Block`): :class:`Source`, :class:`Gpu`, :class:`Steps`, ``TimeBase``,
:class:`PerStepMs`, :class:`Gaps` (its ``largest`` entries :class:`LargestGap`), :class:`KernelMsPerStep`,
:class:`TraceRoofline`, ``Advice`` (of ``Lever``) and :class:`CaptureSummary`; each is filled once, here, and
``Breakdown.to_dict()`` is ``tracekit.contract.to_dict``: the JSON is written in one place, from these types.
Code reads the blocks' attributes (``b.steps.count``); the blocks are also read-only mappings by JSON key
(``b.steps["count"]``: what the docs and scripts use), and a misspelt key raises ``KeyError``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, make_dataclass, replace
from pathlib import Path

import polars as pl

from tracekit.analyses.advice import (
    ALL_LEVERS,
    DEFAULT_REPLAY_GAP_US,
    GRAPHED_SHARE,
    MEMORY_BOUND,
    SMALL_SAVING,
    Advice,
    StepFacts,
    advise,
    gap_name,
    pct,
)
from tracekit.analyses.attribution import Attribution, attribute, devices_with_activity, pick_device
from tracekit.analyses.bytes import TP_EVIDENCE_SOURCES
from tracekit.analyses.partition import StepTable, early_gap_inputs, partition
from tracekit.analyses.roofline import RooflineBlock
from tracekit.analyses.timebase import TimeBase, host_bound, time_base
from tracekit.categories import (
    BREAKDOWN_SCHEMA,
    BUSY_CATEGORIES,
    COMPUTE_CATEGORIES,
    DEFAULT_DRAFT_RANGE,
    GAP_CATEGORIES,
    GAP_CAUSES,
    KERNEL_CATEGORIES,
    PRIORITY,
    STEP_CATEGORIES,
)
from tracekit.contract import Block, extension, internal
from tracekit.results.common import Gpu, Source
from tracekit.tokens import resolve_tokens_per_step, tok_s_unit
from tracekit.trace import Trace

SCHEMA = BREAKDOWN_SCHEMA  # "tracekit.breakdown/3" (tracekit.contract names it once)


# ───────────────────────── the contract's blocks ─────────────────────────

@dataclass(frozen=True)
class Steps(Block):
    """``steps``: how the steps were found, their traced period's statistics, their phase and what was excluded
    (``excluded_reasons``: keys of ``tracekit.categories.EXCLUSION_REASONS``)."""

    count: int
    excluded: int
    marker: str
    pattern: str | None
    mean_ms: float
    median_ms: float
    p10_ms: float
    p90_ms: float
    phase: str
    phases: dict[str, int]
    excluded_reasons: dict[str, int]


def _per_category(name: str, keys: tuple[str, ...], doc: str, bases: tuple = (Block,), more=()) -> type:
    """A frozen block with one ``float | None`` field per name of ``keys`` (the categories, named once in
    ``tracekit.categories``), plus ``more`` fields."""
    cls = make_dataclass(name, [(k, float | None) for k in keys] + list(more), bases=bases, frozen=True)
    cls.__module__, cls.__doc__ = __name__, doc  # (pickled by name: each is a global of this module)
    return cls


PerStepMs = _per_category(
    "PerStepMs", STEP_CATEGORIES,
    "``per_step_ms``: the exact partition of the traced step, one field per ``tracekit.categories.STEP_CATEGORIES`` "
    "(ms per step; compute categories null for whole-graph captures).")
KernelMsPerStep = _per_category(
    "KernelMsPerStep", KERNEL_CATEGORIES,
    "``kernel_ms_per_step``: plain kernel time per ``tracekit.categories.KERNEL_CATEGORIES`` (ms per step).")
GapCauses = _per_category(
    "GapCauses", GAP_CAUSES,
    "The gaps by cause, one field per ``tracekit.categories.GAP_CAUSES`` (ms per step): what the advice reads.")


@dataclass(frozen=True)
class HostActivity(Block):
    """``gaps.largest[].before``: what the host was doing during a gap (``kind``: api, op, sync, range, memcpy)."""

    kind: str
    name: str


@dataclass(frozen=True)
class LargestGap(Block):
    """One of ``gaps.largest``: a single gap, where in its step, its cause and what the host was doing."""

    step: int
    at_ms: float
    ms: float
    where: str
    cause: str
    before: HostActivity | None

    @classmethod
    def of(cls, gap: dict) -> LargestGap:
        """From a ``tracekit.analyses.partition`` gap row."""
        before = gap["before"]
        return cls(step=gap["step"], at_ms=gap["at_ms"], ms=gap["ms"], where=gap["where"], cause=gap["cause"],
                   before=HostActivity(**before) if before is not None else None)


Gaps = _per_category(
    "Gaps", (), "``gaps``: the gaps by cause (:class:`GapCauses`' fields, ms per step) and the ``largest`` single gaps.",
    bases=(GapCauses,), more=[("largest", tuple)])


@dataclass(frozen=True, kw_only=True)
class TraceRoofline(RooflineBlock):
    """``roofline``: the :class:`~tracekit.analyses.roofline.RooflineBlock` figures, then where ``tp`` came from
    (``tp_source``; ``tp_evidence``, the trace's evidence, written for a ``tp`` read from the trace or defaulted:
    ``tracekit.analyses.bytes.TP_EVIDENCE_SOURCES``), the recorded shapes' share of the steps' GEMM time
    (``shape_coverage``, written when shapes were weighed), why the figures were refused (``refused``: null when
    they hold, ``tracekit.analyses.roofline.physical_check``) and where ``tokens_per_step`` came from
    (``tracekit.tokens``)."""

    tp_source: str
    tp_evidence: str | None = extension(omit=lambda r: r.tp_source not in TP_EVIDENCE_SOURCES)
    shape_coverage: float | None = extension(omit=lambda r: r.shape_coverage is None)
    refused: str | None
    tokens_per_step_source: str | None


@dataclass(frozen=True)
class CaptureSummary(Block):
    """``manifest`` (an extension): what the capture beside the trace measured without a profiler."""

    workload: str | None
    mode: str | None
    unprofiled_step_ms: float | None
    tp: int | None


@dataclass(frozen=True)
class Breakdown(Block):
    """The result of :func:`breakdown`; ``to_dict()`` is the contract JSON (``tracekit.breakdown/3``), written by
    ``tracekit.contract.to_dict`` from the typed blocks below (in the JSON's order).

    Besides the contract's blocks (not in the JSON): ``per_step`` (one row per analysed step: the CSV output and
    the plots), ``top_kernels`` (name, category, count, total_ms, mean_us, per_step_ms), ``activities`` (the
    attributed GPU activity of the analysed steps, serialised per stream and clipped to each step's period;
    ``start0`` is the recorded start; None once shipped from a worker), ``facts`` (what the advice was computed
    from) and ``rank`` (the trace's rank, where it records one).
    """

    SCHEMA = BREAKDOWN_SCHEMA

    source: Source
    gpu: Gpu
    steps: Steps
    time_base: TimeBase
    per_step_ms: PerStepMs
    gaps: Gaps
    kernel_ms_per_step: KernelMsPerStep
    roofline: TraceRoofline
    advice: Advice
    headline: str
    warnings: tuple[str, ...]
    per_step: pl.DataFrame = internal()
    top_kernels: pl.DataFrame = internal()
    activities: pl.DataFrame | None = internal()
    facts: StepFacts = internal()
    rank: int | None = internal(default=None)
    manifest: CaptureSummary | None = extension(omit=lambda b: not b.manifest)  # what the capture measured

    @property
    def ranked_levers(self) -> tuple[str, ...]:
        """The levers worth pulling, largest saving first."""
        return self.advice.ranked

    @property
    def display_levers(self) -> tuple[str, ...]:
        """Every lever in display order: the ranked ones first, then the rest, memory bandwidth last — or first,
        when the step is memory-bound (at least ``MEMORY_BOUND`` of its floor: that is the verdict)."""
        rest = [k for k in ALL_LEVERS if k not in self.advice.ranked and k != "memory_bandwidth"]
        if (self.roofline.fraction_of_ceiling or 0) >= MEMORY_BOUND and self.facts.decode_advice:
            return ("memory_bandwidth", *self.advice.ranked, *rest)
        return (*self.advice.ranked, *rest, "memory_bandwidth")


def _quantiles(values: pl.Series) -> dict:
    ms = values.cast(pl.Float64) / 1e6
    return {
        "mean_ms": float(ms.mean()),
        "median_ms": float(ms.quantile(0.5, interpolation="linear")),
        "p10_ms": float(ms.quantile(0.1, interpolation="linear")),
        "p90_ms": float(ms.quantile(0.9, interpolation="linear")),
    }


def _first(*values):
    return next((v for v in values if v is not None), None)


def step_table(trace: Trace, *, step_range: str | None = None, draft_range: str | None = DEFAULT_DRAFT_RANGE,
               device: int | None = None, rules=None, phase: str = "decode", detect_structure: bool = True,
               consume: bool = False) -> StepTable:
    """Attribution then partition: the per-step table of ``trace`` (see ``tracekit.analyses.partition``;
    ``consume``: see :func:`breakdown`)."""
    gap_inputs = early_gap_inputs(trace)
    attr = attribute(trace, step_range=step_range, draft_range=draft_range, device=device, rules=rules,
                     detect_structure=detect_structure, consume=consume)
    return partition(attr, trace, phase=phase, gap_inputs=gap_inputs)


def headline(tb: TimeBase, per_step_ms: PerStepMs, gaps: GapCauses, advice: Advice, roofline: TraceRoofline,
             facts: StepFacts, host_is_bound: bool = False, phase_label: str | None = None) -> str:
    """One line: the step and its time base, where most of the traced step goes, the top lever (every saving an
    upper bound without an unprofiled time), the levers whose saving is unknown with the flag that resolves them,
    and the ceiling (or why there is none)."""
    phase, busy_ms, decode_advice = facts.phase, facts.busy_ms, facts.decode_advice
    if tb.unprofiled_step_ms is not None:
        parts = [f"step {tb.reference_step_ms:.3f} ms unprofiled ({tb.unprofiled_source}; traced "
                 f"{tb.traced_step_ms:.3f} ms)"]
    elif host_is_bound:
        parts = [f"traced step {tb.traced_step_ms:.3f} ms, no unprofiled time: savings are upper bounds (the real "
                 f"step lies between {busy_ms:.3f} ms of GPU work and {tb.traced_step_ms:.3f} ms)"]
    else:
        parts = [f"traced step {tb.traced_step_ms:.3f} ms, no unprofiled time: savings are upper bounds"]
    shares = {k: v for k, v in per_step_ms.items() if v and k not in GAP_CATEGORIES}
    shares.update({k: v for k in GAP_CAUSES if (v := gaps[k])})
    if tb.traced_step_ms and shares:
        top = sorted(shares, key=lambda k: -shares[k])[:2]
        parts.append(", ".join(f"{gap_name(facts, k)} {pct(shares[k] / tb.traced_step_ms)}" for k in top)
                     + " of the traced step")
    if phase in ("prefill", "training") or not decode_advice:
        parts.append(f"{phase_label or phase} steps: no decode advice")
        return "; ".join(parts)
    top, strong = None, False
    if advice.ranked:
        lever = advice[advice.ranked[0]]
        if lever.basis == "upper_bound":
            top = (f"{lever.name} → at most −{lever.max_saving_ms:.3f} ms "
                   f"({pct(lever.max_saving_fraction or 0)} of the traced step)")
        else:
            top = f"{lever.name} → ≈{lever.predicted_step_ms:.3f} ms (−{lever.max_saving_ms:.3f} ms)"
        strong = (lever.max_saving_fraction or 0) >= SMALL_SAVING
    # levers whose saving an input would make known: drafting always, memory bandwidth when no lever is strong
    unknown = []
    for k, v in advice.levers.items():
        if not v.unknown or (k == "memory_bandwidth" and (strong or facts.roofline_refused)):
            continue
        share = per_step_ms.get(k) if k in per_step_ms else None  # (levers named after a category: its share)
        if k == "drafting" and share:  # the draft phase's wall time, its launch gaps included (as its verdict)
            share = max(share, min(facts.draft_phase_ms, tb.traced_step_ms))
        what = f"{pct(share / tb.traced_step_ms)} of the traced step; " if share and tb.traced_step_ms else ""
        unknown.append(f"{k.replace('_', ' ')} ({what}pass {' or '.join(v.needs[:2])})")
    if top is not None and not strong:  # never "no lever" while a lever is unknown
        top = (f"the largest known lever saves less than {pct(SMALL_SAVING)} of the step ({top})" if unknown
               else f"no lever saves {pct(SMALL_SAVING)} of the step (the most: {top})")
    if top is not None:
        parts.append(top)
    if unknown:
        parts.append("unknown: " + ", ".join(unknown))
    if facts.roofline_refused:
        check = facts.roofline_refused.rpartition("; check ")[2] if "; check " in facts.roofline_refused else ""
        parts.append("no bandwidth ceiling: the roofline's bytes exceed what the GPU can read"
                     + (f" (check {check})" if check else ""))
    elif roofline.fraction_of_ceiling is not None and roofline.ceiling_tokens_per_s is not None:
        frac = roofline.fraction_of_ceiling
        bound = "memory-bound at " if frac >= MEMORY_BOUND else ""
        parts.append(f"{bound}{pct(frac)} of the bandwidth ceiling ({roofline.ceiling_tokens_per_s:,.0f} "
                     f"{tok_s_unit(roofline)})")
    return "; ".join(parts)


def breakdown(trace: Trace, *, step_range: str | None = None, draft_range: str | None = DEFAULT_DRAFT_RANGE,
              device: int | None = None, rules=None, weight_bytes: int | None = None, peak_bw: float | None = None,
              accept_len: float | None = None, tokens_per_step: float | None = None,
              device_profile: dict | None = None, measured_step_ms: float | None = None,
              measured_tok_s: float | None = None, phase: str = "decode", model: str | Path | None = None,
              tp: int | None = None, ep: int | None = None, context: int | None = None,
              consume: bool = False) -> Breakdown:
    """Per-step breakdown of ``trace`` (see the module docstring and ``docs/definitions.md``).

    ``consume=True``: the caller owns ``trace`` and will not read it again; the analysis may release the columns
    of it that it copies (``tracekit.analyses.attribution.attribute``), to keep the peak of a big trace low."""
    phase = phase or "decode"
    from tracekit.analyses.collectives import one_rank_evidence, split_one_rank, step_communication
    from tracekit.analyses.communication import collective_overheads
    from tracekit.gpus import lookup, resolve_peak_bw

    st = step_table(trace, step_range=step_range, draft_range=draft_range, device=device, rules=rules, phase=phase,
                    consume=consume)
    attr, table, acts = st.attribution, st.table, st.activities
    warnings = list(trace.meta.warnings) + list(st.warnings)
    man, man_warning = _manifest(trace, attr)
    if man_warning:
        warnings.append(man_warning)
    n = table.height
    steps = Steps(count=n, excluded=st.excluded, marker=attr.steps.marker, pattern=attr.steps.pattern,
                  **_quantiles(table["period"]), phase=st.phase, phases=dict(st.phases_found or {}),
                  excluded_reasons=dict(st.excluded_reasons))
    mean = lambda col: float(table[col].cast(pl.Float64).mean()) / 1e6  # noqa: E731
    # whole-graph captures: no per-kernel rows, the compute categories unknown
    unknown = set(COMPUTE_CATEGORIES) if attr.graph_mode else set()
    per_step_ms = PerStepMs(**{k: None if k in unknown else mean(f"x_{k}") for k in STEP_CATEGORIES})
    kernel_ms = KernelMsPerStep(**{k: None if k in unknown else mean(f"k_{k}") for k in KERNEL_CATEGORIES})
    causes = {k: mean(f"g_{k}") for k in GAP_CAUSES}
    largest = tuple(LargestGap.of(g) for g in st.largest)
    gaps = Gaps(**causes, largest=largest)
    top = (acts.select("name", "category", "dur", "kind").filter(pl.col("kind") != "graph_exec")  # (narrow first)
           .group_by("name", "category")
           .agg(count=pl.len(), total=pl.col("dur").sum())
           .with_columns(pl.col("name", "category").cast(pl.String))  # (enums sort by code, not by text)
           .with_columns(total_ms=pl.col("total") / 1e6, mean_us=pl.col("total") / pl.col("count") / 1e3,
                         per_step_ms=pl.col("total") / 1e6 / n)
           .drop("total").sort(["total_ms", "name"], descending=[True, False]))
    per_step = table.select(
        "step", start_ns="p_start", end_ns="p_end", period_ms=pl.col("period") / 1e6,
        **{k: pl.col(f"x_{k}") / 1e6 for k in STEP_CATEGORIES},
        **{k: pl.col(f"g_{k}") / 1e6 for k in GAP_CAUSES},
        n_kernels="n_kernels", phase="phase")
    if attr.graph_mode:
        per_step = per_step.with_columns(*[pl.lit(None, pl.Float64).alias(k) for k in COMPUTE_CATEGORIES])
    k_all = table["k_all"].sum()
    graph_share = float(table["k_graphed"].sum() / k_all) if k_all else 0.0
    busy_ms = sum(v for k in BUSY_CATEGORIES if (v := per_step_ms[k]) is not None)
    if attr.graph_mode:
        busy_ms = sum(mean(f"x_{k}") for k in PRIORITY)

    # ---- GPU and peak bandwidth
    gpu_name, trace_bw = None, None
    g = trace.gpus.filter(pl.col("device") == attr.device)
    if g.height:
        gpu_name, trace_bw = g["name"][0], g["peak_bw_gbps"][0]
    bw, bw_src = resolve_peak_bw(peak_bw, man.get("peak_bw_gbps"), trace_bw, gpu_name or man.get("gpu_name"))
    if bw is None:
        warnings.append("peak memory bandwidth unknown (GPU not in the trace or the table): pass --peak-bw GBPS")
    gpu = Gpu(device=attr.device, name=gpu_name, peak_bw_gbps=bw, peak_bw_source=bw_src)

    # ---- time base
    spec = man.get("spec") or {}
    acc = _first(accept_len, spec.get("accept_len"))
    tps = resolve_tokens_per_step(tokens_per_step, man, trace, attr.steps.windows.join(table.select("step"), on="step"))
    batch = tps.value
    tokens = (acc if acc else 1) * batch
    traced = steps.mean_ms
    tb = time_base(traced, measured_step_ms=measured_step_ms, measured_tok_s=measured_tok_s, tokens_per_step=tokens,
                   manifest_ms=man.get("unprofiled_step_ms"))
    upper = tb.unprofiled_step_ms is None  # every saving is then an upper bound on a profiled step
    if tb.profiler_inflation is not None and tb.profiler_inflation > 1.2:
        warnings.append(f"the traced steps ({traced:.3f} ms) are {tb.profiler_inflation:.1f}x the unprofiled step "
                        f"({tb.unprofiled_step_ms:.3f} ms, {tb.unprofiled_source}): every saving is stated against the "
                        "unprofiled step; shares of the traced step include the profiler's own overhead")

    # ---- the step's collectives, and the size of the communicator its all-reduces use (the roofline's TP)
    sc = step_communication(trace, acts, device=attr.device, n_steps=max(1, n),
                            gpu_name=gpu_name or man.get("gpu_name"), rules=rules, found=attr.comm_kernels)
    comm_rows, trace_tp, trace_tp_ev = sc.rows, sc.tp, sc.tp_evidence

    # ---- roofline
    # the speculative steps' forwards, once: the draft reads for --model without a manifest, the plain step
    fwds = counts = None
    speculative = getattr(attr.speculation, "speculative", None) is True
    if (attr.draft_detection != "not_detected" and kernel_ms.drafting) or speculative:
        from tracekit.analyses.drafting import draft_forward_counts, step_forwards

        fwds = step_forwards(acts, speculative=speculative)
        if not (man.get("spec") or {}).get("draft_tokens") and attr.draft_detection in ("ranges", "engine", "structure"):
            counts = draft_forward_counts(fwds)
    roof, rwarn = _roofline(trace, man, kernel_ms, tb.reference_step_ms, bw, tokens, batch, table, n, acts,
                            weight_bytes=weight_bytes, model=model, tp=tp, ep=ep, context=context,
                            draft_counts=counts, trace_tp=(trace_tp, trace_tp_ev), comm_rows=comm_rows,
                            tokens_per_step_source=tps.source, gpu_name=gpu_name or man.get("gpu_name"))
    warnings.extend(rwarn)
    # transfer against waiting for the other ranks, from this file alone (tracekit.analyses.collectives)
    comm_split = split_one_rank(sc.kernels, max(1, n), ranks=roof.tp if roof.tp_source != "default" else None,
                                one_rank=one_rank_evidence(trace, sc.kernels, roof.tp, roof.tp_source, ep))

    # ---- advice
    gap = DEFAULT_REPLAY_GAP_US
    if device_profile and isinstance(device_profile.get("graph_replay_gap_us"), (int, float)) \
            and device_profile["graph_replay_gap_us"] > 0:
        gap = float(device_profile["graph_replay_gap_us"])
    spec_gpu = lookup(gpu_name or man.get("gpu_name"))
    link = (f"{spec_gpu.link_bw_gbps:,.0f} GB/s per direction over {spec_gpu.link}"
            if spec_gpu and spec_gpu.link_bw_gbps else None)
    between = [x for x in largest if x.cause == "between_steps"]
    verify = None
    if fwds is not None:
        from tracekit.analyses.drafting import verify_costs

        verify = verify_costs(fwds, gpu_name or man.get("gpu_name"))
    facts = StepFacts(
        traced_ms=traced, reference_ms=tb.reference_step_ms, reference_source=tb.unprofiled_source,
        upper_bounds=upper, per_step_ms=per_step_ms, kernel_ms=kernel_ms,
        gaps=GapCauses(**causes), busy_ms=busy_ms, graph_kernel_share=graph_share,
        after_waits_ms=mean("g_after_waits"),
        launched_per_step=float(table["n_launched"].fill_null(0).mean()),
        graph_launches_per_step=float(table["n_graph_launches"].fill_null(0).mean()),
        kernels_per_step=float(table["n_kernels"].mean()),
        draft_phase_ms=float(table["draft_span"].mean()) / 1e6, draft_detection=attr.draft_detection,
        draft_evidence=attr.draft_evidence, speculation=attr.speculation,
        phase=st.phase, decode_advice=st.decode_advice, replay_gap_us=gap, accept_len=acc, tokens_per_step=float(batch),
        floor_ms=roof.floor_ms, gemm_achieved_bw_gbps=roof.gemm_achieved_bw_gbps, peak_bw_gbps=bw,
        kv_bytes_per_step=roof.kv_bytes_per_step, weight_bytes_per_step=roof.weight_bytes_per_step,
        weight_bytes_source=roof.weight_bytes_source, kv_bytes_source=roof.kv_bytes_source,
        attention_achieved_bw_gbps=roof.attention_achieved_bw_gbps,
        comm_overheads=collective_overheads(acts, n, graph_share >= GRAPHED_SHARE, gap),
        collectives=tuple(comm_rows), hidden_comm_ms=comm_split.hidden_ms, comm_split=comm_split, link=link,
        longest_between=between[0] if between else None, verify=verify, roofline_refused=roof.refused,
        phase_note=st.phase_note, tok_s_unit=tps.unit,
        longest_in_step=next((x for x in largest if x.cause != "between_steps"), None))
    advice = advise(facts)
    head = headline(tb, per_step_ms, gaps, advice, roof, facts,
                    host_is_bound=tb.unprofiled_step_ms is None and host_bound(per_step_ms, traced),
                    phase_label=st.phase_label)
    source = Source.of(trace.meta)
    manifest = CaptureSummary(**{f.name: man.get(f.name) for f in fields(CaptureSummary)}) if man else None
    return Breakdown(source=source, gpu=gpu, steps=steps, time_base=tb, per_step_ms=per_step_ms, gaps=gaps,
                     kernel_ms_per_step=kernel_ms, roofline=roof, advice=advice, headline=head,
                     warnings=tuple(warnings), per_step=per_step, top_kernels=top, activities=acts, facts=facts,
                     rank=trace.meta.rank, manifest=manifest)


def re_advise(b: Breakdown, facts: StepFacts) -> Breakdown:
    """``b`` with its advice and headline computed again from ``facts`` (what changes when several ranks are
    analysed together: the communication lever's transfer comes from matching the ranks, :mod:`tracekit.run.ranks`)."""
    advice = advise(facts)
    tb = b.time_base
    head = headline(tb, b.per_step_ms, b.gaps, advice, b.roofline, facts,
                    host_is_bound=tb.unprofiled_step_ms is None and host_bound(b.per_step_ms, tb.traced_step_ms))
    return replace(b, advice=advice, headline=head, facts=facts)


def _roofline(trace: Trace, man: dict, kernel_ms: KernelMsPerStep, reference_ms: float, bw: float | None,
              tokens: float, batch: float, table: pl.DataFrame, n: int, acts: pl.DataFrame | None, *, weight_bytes,
              model, tp, ep, context, draft_counts: tuple[int, int] | None = None,
              trace_tp: tuple[int | None, str] = (None, "not looked for"), comm_rows: Sequence[dict] = (),
              tokens_per_step_source: str | None = None, gpu_name: str | None = None) -> tuple[TraceRoofline, list[str]]:
    """The roofline block, filled once: the bytes per GPU from the one resolver (``tracekit.analyses.bytes``:
    --weight-bytes, --model or the model the trace's recorded command line names when it is in the local Hugging
    Face cache, the manifest, the trace's shapes or NVTX; TP and its source), the floor against the reference step,
    and the physical check (``tracekit.analyses.roofline.physical_check``). Returns (block, warnings); the block's
    ``refused`` names what makes the figures impossible and the inputs to check, None when they hold."""
    from tracekit.analyses.bytes import resolve_bytes, resolve_tp, tp_from_process_groups
    from tracekit.analyses.roofline import physical_check, trace_compute, with_compute
    from tracekit.model import parse_command

    warnings: list[str] = []
    args = parse_command(trace.meta.command) if trace.meta.command else None
    if model is None and weight_bytes is None and man.get("weight_bytes_per_step") is None and trace.meta.command:
        from tracekit.model import discover_model

        disc = discover_model(trace.meta.command)
        if disc.model_path is not None:
            model = str(disc.model_path)
            warnings.append(f"model bytes from {disc.note}")
    # tensor parallelism: flag > manifest > the recorded command line > the communicator of the step's
    # all-reduces > the process group they use > 1 (never the job's world size)
    pg = None
    if not trace_tp[0] and any(str(r.get("kind", "")).replace("_", "-") == "all-reduce" for r in comm_rows):
        pg = tp_from_process_groups(trace.meta.process_groups, _all_reduce_groups(trace))
    par = resolve_tp(flag=tp, manifest=man.get("tp"), command=args.tp if args else None, communicator=trace_tp,
                     process_group=pg, ep=ep)
    spec = man.get("spec") or {}
    k = int(spec.get("draft_tokens") or 0)
    # draft forwards per step: the manifest's count where it records one (SGLang-shaped spec decoding reads the
    # draft K times plus once more in the draft-extend forward), else K
    draft_forwards = int((man.get("draft_model") or {}).get("forwards_per_step") or k) if k else 0
    counted = ""
    if not k and draft_counts and draft_counts[0] > 0:  # no manifest: the draft forwards the step's structure shows
        draft_forwards, k = draft_counts[0], max(draft_counts[1], 1)
        counted = (f"draft model read {draft_forwards}x per step ({k} draft forwards before the verify"
                   f"{', 1 after it' if draft_forwards > k else ''}), counted from the trace's forwards")
    ctx = context if context is not None else man.get("context")
    shapes: dict = {}
    rb = resolve_bytes(parallel=par, weight_bytes=weight_bytes, model=model, batch=max(1, int(round(batch))),
                       context=ctx, draft_forwards=draft_forwards, verify_tokens=k + 1 if k else 1, manifest=man,
                       from_trace=lambda: _weight_bytes_from_trace(trace, table, n, acts, shapes))
    warnings.extend(rb.warnings)
    if counted and rb.draft_bytes_per_step:
        warnings.append(counted)
    if model is not None and rb.kv_bytes_per_step is None:
        warnings.append("KV-cache bytes unknown: pass --context N (tokens of KV cache each sequence reads per "
                        "step); the floor counts the weights only")
    if shapes.get("refused"):
        warnings.append(shapes["refused"])
    if rb.weight_bytes_per_step is None:
        warnings.append("weight bytes per step unknown: pass --model PATH or --weight-bytes N (or capture with "
                        "tracekit capture, whose manifest records them)")
    elif rb.weight_bytes_source in ("flag", "model") and not par.known:
        warnings.append(f"tensor parallelism unknown ({par.evidence}): the model's bytes are not divided (--tp 1 "
                        "assumed; pass --tp N)")
    block = rb.roofline(peak_bw_gbps=bw, reference_step_ms=reference_ms, tokens_per_step=tokens,
                        gemm_ms=kernel_ms.gemm, attention_ms=kernel_ms.attention)
    compute = trace_compute(rb.model, shapes, rb.weight_bytes_source, gpu_name=gpu_name, context=ctx, tp=par.tp,
                            ep=par.ep, tokens=batch * (k + 1) if tokens_per_step_source != "default" else None)
    block = with_compute(block, **compute, gemm_ms=kernel_ms.gemm, reference_step_ms=reference_ms)
    block, refusal = physical_check(block, bw, gemm_ms=kernel_ms.gemm, attention_ms=kernel_ms.attention,
                                    reference_step_ms=reference_ms, drafting_ms=kernel_ms.drafting,
                                    suspects=_suspects(rb, batch, tokens))
    if refusal:
        warnings.append(f"roofline refused: {refusal}")
    # the figures, then where tp came from (and the trace's evidence for it), the shapes' coverage, why the
    # roofline was refused, and where the tokens per step came from (tracekit.tokens)
    roof = TraceRoofline(**{f.name: getattr(block, f.name) for f in fields(RooflineBlock)}, tp_source=par.source,
                         tp_evidence=par.evidence, shape_coverage=shapes.get("coverage"), refused=refusal,
                         tokens_per_step_source=tokens_per_step_source)
    return roof, warnings


def _suspects(rb, batch: float, tokens: float) -> list[str]:
    """The inputs that decide the bytes per step, with their values: what a refused roofline asks to check."""
    out = [f"--tp ({rb.tp}, {rb.parallel.source})"]
    src = rb.weight_bytes_source
    out.append({"flag": "--weight-bytes (summed over all GPUs)", "model": "--model",
                "manifest": "the manifest's weight_bytes_per_step",
                "shapes": "the recorded shapes' weight bytes (pass --weight-bytes or --model)",
                "nvtx": "the NVTX module parameters (pass --weight-bytes or --model)"}.get(src, "--weight-bytes"))
    if src == "model" or rb.kv_bytes_per_step:
        out.append(f"--tokens-per-step ({batch:g})")
    if rb.kv_bytes_per_step:
        out.append("--context")
    return out


def _all_reduce_groups(trace: Trace) -> list[str]:
    """The process groups the trace's all-reduce kernels name (Kineto NCCL args)."""
    from tracekit.analyses.collectives import kind_of

    c = trace.collectives.filter(pl.col("pg_name").is_not_null())
    if c.height == 0:
        return []
    kinds = c.with_columns(kind=kind_of(pl.col("collective")).cast(pl.String))
    return sorted(kinds.filter(pl.col("kind").str.replace("_", "-") == "all-reduce")["pg_name"].unique().to_list())


def _manifest(trace: Trace, attr: Attribution) -> tuple[dict, str | None]:
    """The manifest beside the trace, when it applies to it (contract): one without ``trace_files`` applies only
    when its ``steps`` equals the number of step windows found."""
    man = trace.manifest or {}
    if not man or man.get("trace_files"):
        return man, None
    n = attr.steps.windows.height
    if man.get("steps") is not None and man["steps"] != n:
        return {}, (f"manifest.json beside the trace ignored: it describes {man['steps']} profiled steps, the trace "
                    f"holds {n} step windows (a manifest of another capture?)")
    return man, None


def _weight_bytes_from_trace(trace: Trace, table: pl.DataFrame, n_steps: int, acts: pl.DataFrame | None,
                             detail: dict):
    """Weight bytes from the trace itself: recorded op shapes (Kineto), when the ops they come from launched most
    of the steps' GEMM kernel time (``roofline.SHAPE_COVERAGE``), or SGLang layer-wise NVTX text. ``detail``
    receives the coverage and, when the shapes are refused, why."""
    from tracekit.analyses.roofline import (
        SHAPE_COVERAGE,
        shape_coverage,
        weight_bytes_from_nvtx,
        weight_bytes_from_shapes,
    )

    if trace.ops.height and trace.ops["input_dims"].is_not_null().any():
        # Only the ops of the analysed steps (warm-up or prefill ops would inflate the bytes).
        w = table.select("step", "pid", "tid", ws="w_start", we="w_end").sort("ws")
        # (only the ops with shapes are looked at: weight_bytes_from_shapes keeps no other, and an as-of join
        # answers each row on its own; not the millions of host ops of a Kineto trace)
        ops = (trace.ops.sort("start").filter(pl.col("input_dims").is_not_null())
               .join_asof(w, left_on="start", right_on="ws", by=["pid", "tid"], strategy="backward",
                          check_sortedness=False)
               .filter(pl.col("step").is_not_null() & (pl.col("start") <= pl.col("we")))
               .drop("ws", "we"))
        if ops.height:
            wb, d = weight_bytes_from_shapes(ops, n_steps=n_steps)
            detail.update(flops=d.get("flops_per_step"), weight_dtype=d.get("weight_dtype"))  # (the compute floor's)
            if wb:
                gemm = (acts.select("pid", "correlation", "dur", "kind", "category", "step").filter(
                    (pl.col("kind") == "kernel") & (pl.col("category") == "gemm") & pl.col("step").is_not_null())
                        .select("pid", "correlation", "dur")
                        if acts is not None else pl.DataFrame())
                cov = shape_coverage(gemm, trace.launches, d.get("intervals"))
                detail["coverage"] = cov
                if cov is not None and cov >= SHAPE_COVERAGE:
                    return int(wb), "shapes"
                detail["refused"] = (
                    f"weight bytes from recorded shapes ({wb:,} per step) not used: the ops they come from launched "
                    f"{'no' if cov is None else pct(cov)} of the steps' GEMM kernel time (at least "
                    f"{pct(SHAPE_COVERAGE)} needed: GEMMs replayed from CUDA graphs or launched by custom ops carry "
                    "no weight shapes); pass --weight-bytes or --model")
    if trace.ranges.height:
        wb = weight_bytes_from_nvtx(trace.ranges["name"])
        if wb:
            return int(wb), "nvtx"
    return None, None


__all__ = ["Breakdown", "Source", "Gpu", "Steps", "PerStepMs", "KernelMsPerStep", "GapCauses", "Gaps", "LargestGap",
           "HostActivity", "TraceRoofline", "CaptureSummary", "breakdown", "step_table", "headline", "re_advise",
           "devices_with_activity", "pick_device", "SCHEMA", "DEFAULT_DRAFT_RANGE"]
