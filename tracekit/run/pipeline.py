"""The breakdown pipeline, in one place: read -> steps -> attribution -> analyses -> result.

Every stage is a function of ``tracekit.analyses`` (pure: typed values in, typed values out); this module runs
them in order and fills the result's typed blocks (``tracekit.results.breakdown``), nothing else::

    breakdown_file(path)  read the file (tracekit.readers), then breakdown()
    step_table(trace)     steps -> attribution -> partition: each analysed step's period split exactly (StepTable)
    breakdown(trace)      the time base, the GPU, the collectives, the roofline (the inputs each from its one
                          resolver), the advice (every lever as data, its headline) -> Breakdown
    re_advise(b, facts)   the advice again from changed facts (several ranks: the cross-rank transfer)

``tracekit.breakdown`` (the facade), ``tracekit breakdown`` and every rank of a rank set (``tracekit.run.ranks``)
run it. Importing this module imports neither polars nor the readers (the facade imports it for
:func:`breakdown_file`, whose read starts before the ~0.3 s of analysis imports: each stage is imported where it
runs).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tracekit.categories import DEFAULT_DRAFT_RANGE
from tracekit.options import AnalysisOptions

if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Sequence

    import polars as pl

    from tracekit.analyses.advice import StepFacts
    from tracekit.analyses.attribution import Attribution
    from tracekit.analyses.partition import StepTable
    from tracekit.analyses.resolve import StepTokens
    from tracekit.results.breakdown import Breakdown, Gaps, Gpu, KernelMsPerStep, PerStepMs, Steps, TraceRoofline
    from tracekit.trace import Trace


# ───────────────────────── read ─────────────────────────

def breakdown_file(path: str | Path, options: AnalysisOptions | None = None, *, own_process: bool = False
                   ) -> Breakdown:
    """:func:`tracekit.breakdown` of the trace file ``path`` with :class:`~tracekit.options.AnalysisOptions`
    (what ``tracekit breakdown`` runs per file, also in its worker processes: picklable by name).

    ``own_process``: the caller's process is the command line's own, about to exit: after the read, every object
    the interpreter holds (the imported modules, ~50k) is frozen out of the cyclic garbage collector
    (``gc.freeze``), whose full collections during the analysis walked them all for nothing (~0.02-0.03 s). Never
    for a library caller: frozen objects are not collected again.

    >>> breakdown_file("tests/data/nsys/pipit_saxpy_2022.2.sqlite", AnalysisOptions(step_range="^saxpy$")).steps.count
    4
    """
    from tracekit.readers import head_start

    # A big nsys export's two big scans start first, and the ~0.3 s of imports below (polars, the analysis) run
    # while they read (the format's head start: tracekit.readers.nsys.scan).
    with head_start(path, kernel_dims=False) as scanning:
        from tracekit.readers import load

        _import_stages()
        if scanning:
            _warm()
        trace = load(path, kernel_dims=False)
    if own_process:
        import gc

        gc.freeze()
    # (the trace is this function's alone: the analysis may give back its kernel columns as it copies them)
    return breakdown(trace, options, consume=True)


def _warm() -> None:
    """Load what every breakdown loads before it looks at the trace, none of it from the trace: the shipped kernel
    rules (~0.02 s: the TOML and its patterns), the GPU table and the model modules the roofline imports. Called
    while a head start's scans read (the main thread would only wait for them), so that the analysis after the read
    finds them loaded (~0.03 s off the end of a 1M-kernel command on a quiet machine)."""
    import tracekit.model.discover  # noqa: F401  (tracekit.model imports each name when first asked for)
    import tracekit.model.step  # noqa: F401
    from tracekit.classify import load_rules
    from tracekit.gpus import lookup

    load_rules()
    lookup("NVIDIA")  # (the table is parsed once per process; any name loads it)


def _import_stages() -> None:
    """Import the stages (polars, the analyses, the result blocks): ~0.3 s that a big file's head start overlaps
    with its read."""
    import tracekit.analyses.advice  # noqa: F401
    import tracekit.analyses.attribution  # noqa: F401
    import tracekit.analyses.partition  # noqa: F401
    import tracekit.results.breakdown  # noqa: F401


# ───────────────────────── steps, attribution, partition ─────────────────────────

def step_table(trace: Trace, *, step_range: str | None = None, draft_range: str | None = DEFAULT_DRAFT_RANGE,
               device: int | None = None, rules=None, phase: str = "decode", detect_structure: bool = True,
               consume: bool = False) -> StepTable:
    """Attribution then partition: the per-step table of ``trace`` (see ``tracekit.analyses.partition``;
    ``consume``: see :func:`breakdown`)."""
    from tracekit.analyses.attribution import attribute
    from tracekit.analyses.partition import early_gap_inputs, partition

    gap_inputs = early_gap_inputs(trace)
    attr = attribute(trace, step_range=step_range, draft_range=draft_range, device=device, rules=rules,
                     detect_structure=detect_structure, consume=consume)
    return partition(attr, trace, phase=phase, gap_inputs=gap_inputs)


# ───────────────────────── the analyses, the result ─────────────────────────

def breakdown(trace: Trace, options: AnalysisOptions | None = None, *, consume: bool = False) -> Breakdown:
    """Per-step breakdown of ``trace`` with ``options`` (:class:`~tracekit.options.AnalysisOptions`; see the module
    docstring and ``docs/definitions.md``). The pipeline's steps, one call each: every input from its one resolver
    (``tracekit.analyses.resolve``), every figure from its analysis.

    ``consume=True``: the caller owns ``trace`` and will not read it again; the analysis may release the columns
    of it that it copies (``tracekit.analyses.attribution.attribute``), to keep the peak of a big trace low."""
    from tracekit.analyses.advice import advise
    from tracekit.analyses.collectives import step_communication
    from tracekit.results.breakdown import Breakdown, CaptureSummary, Coverage, Source

    o = _inputs(options)
    st = step_table(trace, step_range=o.step_range, draft_range=o.draft_range, device=o.device, rules=o.rules,
                    phase=o.phase, consume=consume)
    man, warnings = _manifest(trace, st)
    m = measure(st)
    gpu = _gpu(trace, st.attribution, man, o.peak_bw, warnings)
    tb, tokens, acc = _time_base(trace, st, man, o, m.steps.mean_ms, warnings)
    sc = step_communication(trace, st.activities, device=gpu.device, n_steps=max(1, m.n), gpu_name=gpu.lookup_name,
                            rules=o.rules, found=st.attribution.comm_kernels)
    fwds, counts = _forwards(st, m.kernel_ms, man)
    roof, roof_check, rwarn = _roofline(trace, man, m.kernel_ms, tb.reference_step_ms, gpu.peak_bw_gbps, tokens,
                                        st.table, m.n, st.activities, weight_bytes=o.weight_bytes, model=o.model,
                                        tp=o.tp, ep=o.ep, context=o.context, draft_counts=counts,
                                        trace_tp=(sc.tp, sc.tp_evidence), comm_rows=sc.rows, gpu_name=gpu.lookup_name,
                                        accept=acc)
    warnings.extend(rwarn)
    comm_split, comm_rows = _transfer_and_waits(trace, sc, roof, m.n, o.ep, gpu.lookup_name)
    facts = _facts(st, m, gpu, tb, tokens, acc, roof, roof_check, comm_split, comm_rows, fwds, o.device_profile)
    advice = advise(facts)
    warnings.extend(f"internal check: {p}" for p in advice.problems)
    return Breakdown(source=Source.of(trace.meta), gpu=gpu.block, steps=m.steps, time_base=tb,
                     per_step_ms=m.per_step_ms, gaps=m.gaps, kernel_ms_per_step=m.kernel_ms, roofline=roof,
                     advice=advice, headline=advice.headline.text, warnings=tuple(warnings), per_step=m.per_step,
                     top_kernels=top_kernels(st.activities, m.n), activities=st.activities, facts=facts,
                     rank=trace.meta.rank, coverage=Coverage(**st.coverage) if st.coverage else None,
                     manifest=CaptureSummary.of(man) if man else None)


# ───────────────────────── the pipeline's steps ─────────────────────────

def _inputs(options: AnalysisOptions | None):
    """The analysis' inputs from ``options``, by name (``AnalysisOptions.analysis_kwargs``: a device-profile path
    is read here; no --phase means decode)."""
    from types import SimpleNamespace

    o = SimpleNamespace(**(options or AnalysisOptions()).analysis_kwargs())
    o.phase = o.phase or "decode"
    return o


@dataclass(frozen=True)
class Measured:
    """The step table's figures as the result's blocks: means over the analysed steps (ms)."""

    n: int
    steps: Steps
    per_step_ms: PerStepMs
    kernel_ms: KernelMsPerStep
    causes: dict
    gaps: Gaps
    largest: tuple
    per_step: pl.DataFrame
    graph_share: float
    busy_ms: float


def _mean_ms(table: pl.DataFrame, col: str) -> float:
    """The mean of ``col`` (ns) over the analysed steps, in ms."""
    import polars as pl

    return float(table[col].cast(pl.Float64).mean()) / 1e6


def measure(st: StepTable) -> Measured:
    """The per-step means of ``st`` (the exclusive split, the kernel time by category, the gaps by cause), the
    per-step table and the steps' quantiles. A whole-graph capture has no per-kernel rows: its compute categories
    are unknown (None)."""
    import polars as pl

    from tracekit.categories import (
        BUSY_CATEGORIES,
        COMPUTE_CATEGORIES,
        GAP_CAUSES,
        KERNEL_CATEGORIES,
        PRIORITY,
        STEP_CATEGORIES,
    )
    from tracekit.results.breakdown import Gaps, KernelMsPerStep, LargestGap, PerStepMs, Steps

    attr, table = st.attribution, st.table
    n = table.height
    steps = Steps(count=n, excluded=st.excluded, marker=attr.steps.marker, pattern=attr.steps.pattern,
                  **_quantiles(table["period"]), phase=st.phase, phases=dict(st.phases_found or {}),
                  excluded_reasons=dict(st.excluded_reasons))
    mean = lambda col: _mean_ms(table, col)  # noqa: E731
    unknown = set(COMPUTE_CATEGORIES) if attr.graph_mode else set()
    per_step_ms = PerStepMs(**{k: None if k in unknown else mean(f"x_{k}") for k in STEP_CATEGORIES})
    kernel_ms = KernelMsPerStep(**{k: None if k in unknown else mean(f"k_{k}") for k in KERNEL_CATEGORIES})
    causes = {k: mean(f"g_{k}") for k in GAP_CAUSES}
    largest = tuple(LargestGap.of(g) for g in st.largest)
    per_step = table.select(
        "step", start_ns="p_start", end_ns="p_end", period_ms=pl.col("period") / 1e6,
        **{k: pl.col(f"x_{k}") / 1e6 for k in STEP_CATEGORIES},
        **{k: pl.col(f"g_{k}") / 1e6 for k in GAP_CAUSES},
        n_kernels="n_kernels", phase="phase")
    if attr.graph_mode:
        per_step = per_step.with_columns(*[pl.lit(None, pl.Float64).alias(k) for k in COMPUTE_CATEGORIES])
    k_all = table["k_all"].sum()
    busy_ms = (sum(mean(f"x_{k}") for k in PRIORITY) if attr.graph_mode else
               sum(v for k in BUSY_CATEGORIES if (v := per_step_ms[k]) is not None))
    return Measured(n=n, steps=steps, per_step_ms=per_step_ms, kernel_ms=kernel_ms, causes=causes,
                    gaps=Gaps(**causes, largest=largest), largest=largest, per_step=per_step,
                    graph_share=float(table["k_graphed"].sum() / k_all) if k_all else 0.0, busy_ms=busy_ms)


def top_kernels(acts: pl.DataFrame, n: int) -> pl.DataFrame:
    """The kernels by total time (graph executions aside): count, total and mean, per step over ``n`` steps."""
    import polars as pl

    return (acts.select("name", "category", "dur", "kind").filter(pl.col("kind") != "graph_exec")  # (narrow first)
            .group_by("name", "category")
            .agg(count=pl.len(), total=pl.col("dur").sum())
            .with_columns(pl.col("name", "category").cast(pl.String))  # (enums sort by code, not by text)
            .with_columns(total_ms=pl.col("total") / 1e6, mean_us=pl.col("total") / pl.col("count") / 1e3,
                          per_step_ms=pl.col("total") / 1e6 / n)
            .drop("total").sort(["total_ms", "name"], descending=[True, False]))


@dataclass(frozen=True)
class _Gpu:
    block: Gpu
    lookup_name: str | None  # the trace's GPU name, else the manifest's: what the GPU table is asked for

    @property
    def device(self) -> int:
        return self.block.device

    @property
    def peak_bw_gbps(self) -> float | None:
        return self.block.peak_bw_gbps


def _gpu(trace: Trace, attr: Attribution, man: dict, peak_bw: float | None, warnings: list[str]) -> _Gpu:
    """The analysed GPU and its peak bandwidth (``resolve.trace_gpu``, ``resolve.peak_bandwidth``)."""
    from tracekit.analyses import resolve
    from tracekit.results.breakdown import Gpu

    found = resolve.trace_gpu(trace.gpus, attr.device, lambda: _devices(trace)).value
    bw = resolve.peak_bandwidth(flag=peak_bw, manifest=man.get("peak_bw_gbps"), trace=found.peak_bw_gbps,
                                name=found.name or man.get("gpu_name"))
    warnings.extend(bw.warnings)
    return _Gpu(Gpu(device=attr.device, name=found.name, peak_bw_gbps=bw.value, peak_bw_source=bw.source),
                found.name or man.get("gpu_name"))


def _time_base(trace: Trace, st: StepTable, man: dict, o, traced_ms: float, warnings: list[str]):
    """The accept length, the tokens per step and the time base, each from its resolver: (time base, tokens,
    the accept length's resolution)."""
    from tracekit.analyses import resolve

    attr = st.attribution
    acc = resolve.accept_length(flag=o.accept_len, manifest=man)
    tokens = resolve.tokens_per_step(
        flag=o.tokens_per_step, manifest=man, accept_len=acc.value,
        annotated=lambda: resolve.annotated_batch(trace, attr.steps.windows.join(st.table.select("step"), on="step")))
    tbr = resolve.time_base(traced_ms, measured_step_ms=o.measured_step_ms, measured_tok_s=o.measured_tok_s,
                            tokens=tokens.value, manifest_ms=man.get("unprofiled_step_ms"))
    warnings.extend(tbr.warnings)
    return tbr.value, tokens, acc


def _forwards(st: StepTable, kernel_ms: KernelMsPerStep, man: dict):
    """The speculative steps' forwards, once (``tracekit.analyses.drafting.step_forwards``), and the draft forward
    counts the structure shows where no manifest records K: (forwards or None, counts or None)."""
    attr = st.attribution
    speculative = getattr(attr.speculation, "speculative", None) is True
    if not ((attr.draft_detection != "not_detected" and kernel_ms.drafting) or speculative):
        return None, None
    from tracekit.analyses.drafting import draft_forward_counts, step_forwards

    fwds = step_forwards(st.activities, speculative=speculative)
    if not (man.get("spec") or {}).get("draft_tokens") and attr.draft_detection in ("ranges", "engine", "structure"):
        return fwds, draft_forward_counts(fwds)
    return fwds, None


def _transfer_and_waits(trace: Trace, sc, roof: TraceRoofline, n: int, ep: int | None, gpu_name: str | None):
    """Transfer against waiting for the other ranks, from this file alone (``collectives.split_one_rank``), and
    the collectives table again with each call's transfer estimated (latency-bound is judged from it, one rule for
    one rank and a rank set)."""
    from tracekit.analyses.collectives import collectives_of, one_rank_evidence, split_one_rank

    split = split_one_rank(sc.kernels, max(1, n), ranks=roof.tp if roof.tp_source != "default" else None,
                           one_rank=one_rank_evidence(trace, sc.kernels, roof.tp, roof.tp_source, ep))
    rows = collectives_of(split.kernels, n, gpu_name) if sc.rows else sc.rows
    return split, rows


def _facts(st: StepTable, m: Measured, gpu: _Gpu, tb, tokens: StepTokens, acc, roof: TraceRoofline,
           roof_check: tuple[str, ...], comm_split, comm_rows, fwds, device_profile: dict | None) -> StepFacts:
    """What the levers need (``tracekit.analyses.advice.StepFacts``), from the step table and the blocks."""
    from tracekit.analyses.advice import DEFAULT_REPLAY_GAP_US, GRAPHED_SHARE, StepFacts
    from tracekit.analyses.communication import collective_overheads
    from tracekit.gpus import graph_node_us, lookup
    from tracekit.results.breakdown import GapCauses

    attr, table, name = st.attribution, st.table, gpu.lookup_name
    gap = graph_node_us(name) or DEFAULT_REPLAY_GAP_US  # the GPU table's, measured
    if device_profile and isinstance(device_profile.get("graph_replay_gap_us"), (int, float)) \
            and device_profile["graph_replay_gap_us"] > 0:
        gap = float(device_profile["graph_replay_gap_us"])
    spec_gpu = lookup(name)
    link = (f"{spec_gpu.link_bw_gbps:,.0f} GB/s per direction over {spec_gpu.link}"
            if spec_gpu and spec_gpu.link_bw_gbps else None)
    between = [x for x in m.largest if x.cause == "between_steps"]
    verify = None
    if fwds is not None:
        from tracekit.analyses.drafting import verify_costs

        verify = verify_costs(fwds, name)
    return StepFacts(
        traced_ms=m.steps.mean_ms, reference_ms=tb.reference_step_ms, reference_source=tb.unprofiled_source,
        upper_bounds=tb.unprofiled_step_ms is None,  # every saving is then an upper bound on a profiled step
        per_step_ms=m.per_step_ms, kernel_ms=m.kernel_ms,
        gaps=GapCauses(**m.causes), busy_ms=m.busy_ms, graph_kernel_share=m.graph_share,
        after_waits_ms=_mean_ms(table, "g_after_waits"),
        launched_per_step=float(table["n_launched"].fill_null(0).mean()),
        graph_launches_per_step=float(table["n_graph_launches"].fill_null(0).mean()),
        kernels_per_step=float(table["n_kernels"].mean()),
        draft_phase_ms=float(table["draft_span"].mean()) / 1e6, draft_detection=attr.draft_detection,
        draft_evidence=attr.draft_evidence, speculation=attr.speculation,
        phase=st.phase, decode_advice=st.decode_advice, replay_gap_us=gap, accept_len=acc.value,
        tokens_per_step=float(tokens.batch),
        floor_ms=roof.floor_ms, gemm_achieved_bw_gbps=roof.gemm_achieved_bw_gbps, peak_bw_gbps=gpu.peak_bw_gbps,
        floor_kind="compute" if getattr(roof, "bound", None) == "compute" else "memory",
        memory_floor_ms=getattr(roof, "memory_floor_ms", None), peak_tflops=getattr(roof, "peak_tflops", None),
        gemm_achieved_tflops=getattr(roof, "gemm_achieved_tflops", None),
        kv_bytes_per_step=roof.kv_bytes_per_step, weight_bytes_per_step=roof.weight_bytes_per_step,
        weight_bytes_source=roof.weight_bytes_source, kv_bytes_source=roof.kv_bytes_source,
        attention_achieved_bw_gbps=roof.attention_achieved_bw_gbps,
        comm_overheads=collective_overheads(st.activities, m.n, m.graph_share >= GRAPHED_SHARE, gap),
        collectives=tuple(comm_rows), hidden_comm_ms=comm_split.hidden_ms, comm_split=comm_split, link=link,
        longest_between=between[0] if between else None, verify=verify, roofline_refused=roof.refused,
        roofline_check=roof_check, phase_note=st.phase_note, phase_label=st.phase_label,
        tok_s_unit=tokens.unit, fraction_of_ceiling=roof.fraction_of_ceiling,
        ceiling_tokens_per_s=roof.ceiling_tokens_per_s, ceiling_unit=tokens.unit,
        longest_in_step=next((x for x in m.largest if x.cause != "between_steps"), None))


def re_advise(b: Breakdown, facts: StepFacts) -> Breakdown:
    """``b`` with its advice and headline computed again from ``facts`` (what changes when several ranks are
    analysed together: the communication lever's transfer comes from matching the ranks, :mod:`tracekit.run.ranks`)."""
    from dataclasses import replace

    from tracekit.analyses.advice import advise

    advice = advise(facts)
    return replace(b, advice=advice, headline=advice.headline.text, facts=facts)


def _roofline(trace: Trace, man: dict, kernel_ms: KernelMsPerStep, reference_ms: float, bw: float | None,
              tokens: StepTokens, table: pl.DataFrame, n: int, acts: pl.DataFrame | None, *, weight_bytes,
              model, tp, ep, context, draft_counts: tuple[int, int] | None = None,
              trace_tp: tuple[int | None, str] = (None, "not looked for"), comm_rows: Sequence[dict] = (),
              gpu_name: str | None = None, accept=None) -> tuple[TraceRoofline, tuple[str, ...], list[str]]:
    """The roofline block, filled once: the bytes per GPU from the one resolver (``tracekit.analyses.bytes``:
    --weight-bytes, --model or the model the trace's recorded command line names when it is in the local Hugging
    Face cache, the manifest, the trace's shapes or NVTX; TP and its source), the floor against the reference step,
    and the physical check (``tracekit.analyses.roofline.physical_check``). Returns (block, the inputs to check when
    it is refused, warnings); the block's ``refused`` names what makes the figures impossible and the inputs to check,
    None when they hold."""
    from dataclasses import fields

    from tracekit.analyses import resolve
    from tracekit.analyses.bytes import resolve_bytes, tp_from_process_groups
    from tracekit.analyses.roofline import RooflineBlock, physical_check, trace_compute, with_compute
    from tracekit.model import parse_command
    from tracekit.results.breakdown import TraceRoofline

    warnings: list[str] = []
    args = parse_command(trace.meta.command) if trace.meta.command else None
    # tensor parallelism: flag > manifest > the recorded command line > the communicator of the step's
    # all-reduces > the process group they use > 1 (never the job's world size)
    pg = None
    if not trace_tp[0] and any(str(r.get("kind", "")).replace("_", "-") == "all-reduce" for r in comm_rows):
        pg = tp_from_process_groups(trace.meta.process_groups, _all_reduce_groups(trace))
    par = resolve.resolve_tp(flag=tp, manifest=man.get("tp"), command=args.tp if args else None, communicator=trace_tp,
                     process_group=pg, ep=ep)
    spec = man.get("spec") or {}
    k = int(spec.get("draft_tokens") or 0)
    # draft forwards per step: the manifest's count where it records one, else K
    draft_forwards = int((man.get("draft_model") or {}).get("forwards_per_step") or k) if k else 0
    counted = ""
    if not k and draft_counts and draft_counts[0] > 0:  # no manifest: the draft forwards the step's structure shows
        # each draft-model forward proposes one token per sequence in the engines: SGLang's num_steps - 1 draft
        # forwards and the draft-extend whose top-k is the next round's first draft token, vLLM's K proposer forwards
        draft_forwards, before = draft_counts
        k = draft_forwards
        counted = (f"draft model read {draft_forwards}x per step ({before} before the verify, "
                   f"{draft_forwards - before} after it: K = {k} draft tokens, one a draft forward as the engines "
                   "run them), counted from the trace's forwards")
    shapes: dict = {}
    rb = resolve_bytes(parallel=par, weight_bytes=weight_bytes, model=model, batch=max(1, int(round(tokens.batch))),
                       context=resolve.context_tokens(flag=context, manifest=man).value, draft_forwards=draft_forwards,
                       verify_tokens=k + 1 if k else 1, manifest=man, draft_note=counted,
                       discover=(lambda: _discover(trace.meta.command)) if trace.meta.command else None,
                       from_trace=lambda: _weight_bytes_from_trace(trace, table, n, acts, shapes))
    warnings.extend(rb.warnings)
    block = rb.roofline(peak_bw_gbps=bw, reference_step_ms=reference_ms, tokens_per_step=tokens.value,
                        gemm_ms=kernel_ms.gemm, attention_ms=kernel_ms.attention)
    compute = trace_compute(rb.model, shapes, rb.weight_bytes_source, gpu_name=gpu_name,
                            context=resolve.context_tokens(flag=context, manifest=man).value, tp=par.tp, ep=par.ep,
                            tokens=tokens.batch * (k + 1) if tokens.source != "default" else None)
    block = with_compute(block, **compute, gemm_ms=kernel_ms.gemm, reference_step_ms=reference_ms)
    suspects = _suspects(rb, tokens.batch, tokens.value)
    block, refusal = physical_check(block, bw, gemm_ms=kernel_ms.gemm, attention_ms=kernel_ms.attention,
                                    reference_step_ms=reference_ms, drafting_ms=kernel_ms.drafting, suspects=suspects)
    if refusal:
        warnings.append(f"roofline refused: {refusal}")
    # the figures, then where tp came from (and the trace's evidence for it), the shapes' coverage, why the
    # roofline was refused, and where the tokens per step came from (tracekit.analyses.resolve)
    roof = TraceRoofline(**{f.name: getattr(block, f.name) for f in fields(RooflineBlock)}, tp_source=par.source,
                         tp_evidence=par.evidence, shape_coverage=shapes.get("coverage"), refused=refusal,
                         tokens_per_step_source=tokens.source, tokens_per_s_unit=tokens.unit)
    if accept is not None and accept.value is not None:  # (the accept length, and its source: diff compares per
        # token with it)
        from dataclasses import replace

        roof = replace(roof, accept_len=float(accept.value), accept_len_source=accept.source)
    return roof, tuple(suspects) if refusal else (), warnings


def _devices(trace: Trace) -> list[int]:
    """The devices the trace's kernels and memory operations run on (their ``device`` columns stay when the
    attribution releases the others)."""
    return sorted(set(trace.kernels["device"].unique().to_list()) | set(trace.memops["device"].unique().to_list()))


def _discover(command) -> tuple[str | None, str]:
    """The model the trace's recorded command line names, where it is on this machine (``tracekit.model``)."""
    from tracekit.model import discover_model

    disc = discover_model(command)
    return disc.model_path, disc.note


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
    import polars as pl

    from tracekit.analyses.collectives import kind_of

    c = trace.collectives.filter(pl.col("pg_name").is_not_null())
    if c.height == 0:
        return []
    kinds = c.with_columns(kind=kind_of(pl.col("collective")).cast(pl.String))
    return sorted(kinds.filter(pl.col("kind").str.replace("_", "-") == "all-reduce")["pg_name"].unique().to_list())


def _manifest(trace: Trace, st: StepTable) -> tuple[dict, list[str]]:
    """The manifest beside the trace, when it applies to it (contract): one without ``trace_files`` applies only
    when its ``steps`` equals the number of step windows found; and the warnings so far (the read's, the step
    table's, the manifest's)."""
    man = trace.manifest or {}
    warnings = list(trace.meta.warnings) + list(st.warnings)
    if not man or man.get("trace_files"):
        return man, warnings
    n = st.attribution.steps.windows.height
    if man.get("steps") is not None and man["steps"] != n:
        return {}, [*warnings, f"manifest.json beside the trace ignored: it describes {man['steps']} profiled steps, "
                    f"the trace holds {n} step windows (a manifest of another capture?)"]
    return man, warnings


def _weight_bytes_from_trace(trace: Trace, table: pl.DataFrame, n_steps: int, acts: pl.DataFrame | None,
                             detail: dict) -> tuple[int | None, str | None, tuple[str, ...]]:
    """Weight bytes from the trace itself: recorded op shapes (Kineto), when the ops they come from launched most
    of the steps' GEMM kernel time (``roofline.SHAPE_COVERAGE``), or SGLang layer-wise NVTX text; (bytes, source,
    warnings: why the shapes were refused). ``detail`` receives the coverage."""
    import polars as pl

    from tracekit.analyses.advice import pct
    from tracekit.analyses.roofline import (
        SHAPE_COVERAGE,
        shape_coverage,
        weight_bytes_from_nvtx,
        weight_bytes_from_shapes,
    )

    refused: tuple[str, ...] = ()
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
                    return int(wb), "shapes", ()
                refused = (
                    f"weight bytes from recorded shapes ({wb:,} per step) not used: the ops they come from launched "
                    f"{'no' if cov is None else pct(cov)} of the steps' GEMM kernel time (at least "
                    f"{pct(SHAPE_COVERAGE)} needed: GEMMs replayed from CUDA graphs or launched by custom ops carry "
                    "no weight shapes); pass --weight-bytes or --model"),
    if trace.ranges.height:
        wb = weight_bytes_from_nvtx(trace.ranges["name"])
        if wb:
            return int(wb), "nvtx", refused
    return None, None, refused


def _quantiles(values: pl.Series) -> dict:
    import polars as pl

    ms = values.cast(pl.Float64) / 1e6
    return {
        "mean_ms": float(ms.mean()),
        "median_ms": float(ms.quantile(0.5, interpolation="linear")),
        "p10_ms": float(ms.quantile(0.1, interpolation="linear")),
        "p90_ms": float(ms.quantile(0.9, interpolation="linear")),
    }


__all__ = ["breakdown_file", "breakdown", "step_table", "re_advise"]
