"""Per-decode-step breakdown: where every nanosecond of a step's period goes, and which lever is worth pulling.

One pipeline of typed, immutable values (../shared/spec/CONTRACT.md, ``tracekit.breakdown/2``)::

    attribute(trace)  -> Attribution   which step / draft phase each GPU activity belongs to, and what it is
    partition(...)    -> StepTable     each analysed step's period split exactly, its gaps by cause
    time_base(...)    -> TimeBase      the step every saving is stated against (unprofiled when known)
    roofline(...)                      the bytes a step reads, the floor and the tok/s ceiling
    advise(facts)     -> Advice        every lever's predicted step, saving and verdict
    headline(...)     -> str           the one-line summary

:func:`breakdown` runs them and returns a :class:`Breakdown`, whose ``to_dict()`` is the contract JSON.
"""

from __future__ import annotations

from dataclasses import dataclass

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
    pct,
)
from tracekit.analyses.attribution import Attribution, attribute, devices_with_activity, pick_device
from tracekit.analyses.partition import StepTable, partition
from tracekit.analyses.timebase import TimeBase, host_bound, time_base
from tracekit.categories import (
    BUSY_CATEGORIES,
    COMPUTE_CATEGORIES,
    DEFAULT_DRAFT_RANGE,
    GAP_CAUSES,
    KERNEL_CATEGORIES,
    PRIORITY,
    STEP_CATEGORIES,
)
from tracekit.tokens import resolve_tokens_per_step, tok_s_unit
from tracekit.trace import Trace

SCHEMA = "tracekit.breakdown/2"
LEVER_NAMES = {"cuda_graphs": "CUDA graphs", "communication": "a free all-reduce", "drafting": "no drafting",
               "host_stalls": "no host stalls"}


@dataclass(frozen=True)
class Breakdown:
    """The result of :func:`breakdown`; ``to_dict()`` is the contract JSON (``tracekit.breakdown/2``).

    Besides the contract's blocks: ``per_step`` (one row per analysed step: the CSV output and the plots),
    ``top_kernels`` (name, category, count, total_ms, mean_us, per_step_ms), ``activities`` (the attributed GPU
    activity of the analysed steps, serialised per stream and clipped to each step's period; ``start0`` is the
    recorded start) and ``facts`` (what the advice was computed from).
    """

    source: dict
    gpu: dict
    steps: dict
    time_base: TimeBase
    per_step_ms: dict
    gaps: dict
    kernel_ms_per_step: dict
    roofline: dict
    advice: Advice
    headline: str
    warnings: tuple[str, ...]
    per_step: pl.DataFrame
    top_kernels: pl.DataFrame
    activities: pl.DataFrame | None
    facts: StepFacts
    rank: int | None = None
    manifest: dict | None = None  # extension: what the capture measured without a profiler

    @property
    def ranked_levers(self) -> tuple[str, ...]:
        """The levers worth pulling, largest saving first."""
        return self.advice.ranked

    @property
    def display_levers(self) -> tuple[str, ...]:
        """Every lever in display order: the ranked ones first, then the rest, memory bandwidth last — or first,
        when the step is memory-bound (at least ``MEMORY_BOUND`` of its floor: that is the verdict)."""
        rest = [k for k in ALL_LEVERS if k not in self.advice.ranked and k != "memory_bandwidth"]
        if (self.roofline.get("fraction_of_ceiling") or 0) >= MEMORY_BOUND and self.facts.decode_advice:
            return ("memory_bandwidth", *self.advice.ranked, *rest)
        return (*self.advice.ranked, *rest, "memory_bandwidth")

    def to_dict(self) -> dict:
        out = {
            "schema": SCHEMA,
            "source": self.source,
            "gpu": self.gpu,
            "steps": self.steps,
            "time_base": self.time_base.to_dict(),
            "per_step_ms": self.per_step_ms,
            "gaps": self.gaps,
            "kernel_ms_per_step": self.kernel_ms_per_step,
            "roofline": self.roofline,
            "advice": self.advice.to_dict(),
            "headline": self.headline,
            "warnings": list(self.warnings),
        }
        if self.manifest:
            out["manifest"] = self.manifest
        return out


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
               device: int | None = None, rules=None, phase: str = "decode", detect_structure: bool = True
               ) -> StepTable:
    """Attribution then partition: the per-step table of ``trace`` (see ``tracekit.analyses.partition``)."""
    attr = attribute(trace, step_range=step_range, draft_range=draft_range, device=device, rules=rules,
                     detect_structure=detect_structure)
    return partition(attr, trace, phase=phase)


def headline(tb: TimeBase, per_step_ms: dict, gaps: dict, advice: Advice, roofline: dict, phase: str,
             busy_ms: float, upper_bounds: bool, decode_advice: bool = True) -> str:
    """One line: the step and its time base, where most of the traced step goes, the top lever, the ceiling."""
    if tb.unprofiled_step_ms is not None:
        parts = [f"step {tb.reference_step_ms:.3f} ms unprofiled ({tb.unprofiled_source}; traced "
                 f"{tb.traced_step_ms:.3f} ms)"]
    elif upper_bounds:
        parts = [f"traced step {tb.traced_step_ms:.3f} ms, no unprofiled time: savings are upper bounds (the real "
                 f"step lies between {busy_ms:.3f} ms of GPU work and {tb.traced_step_ms:.3f} ms)"]
    else:
        parts = [f"step {tb.traced_step_ms:.3f} ms (traced; no unprofiled time)"]
    shares = {k: v for k, v in per_step_ms.items() if v and k not in ("launch_gaps", "idle")}
    shares.update({k: v for k, v in gaps.items() if k in GAP_CAUSES and v})
    if tb.traced_step_ms and shares:
        top = sorted(shares, key=lambda k: -shares[k])[:2]
        parts.append(", ".join(f"{k.replace('_', ' ')} {pct(shares[k] / tb.traced_step_ms)}" for k in top)
                     + " of the traced step")
    if phase == "prefill" or not decode_advice:
        parts.append(f"{phase} steps: no decode advice")
    elif advice.ranked:
        k = advice.ranked[0]
        lever = advice[k]
        bound = " at most" if upper_bounds else ""
        top = f"{LEVER_NAMES[k]} →{bound} ≈{lever.predicted_step_ms:.3f} ms (−{lever.max_saving_ms:.3f} ms)"
        if (lever.max_saving_fraction or 0) < SMALL_SAVING:
            top = f"no lever saves {pct(SMALL_SAVING)} of the step (the most: {top})"
        parts.append(top)
    if (decode_advice and phase != "prefill" and roofline.get("fraction_of_ceiling") is not None
            and roofline.get("ceiling_tokens_per_s") is not None):  # a decode figure: not for prefill/training
        frac = roofline["fraction_of_ceiling"]
        bound = "memory-bound at " if frac >= MEMORY_BOUND else ""
        parts.append(f"{bound}{pct(frac)} of the bandwidth ceiling ({roofline['ceiling_tokens_per_s']:,.0f} "
                     f"{tok_s_unit(roofline)})")
    return "; ".join(parts)


def breakdown(trace: Trace, *, step_range: str | None = None, draft_range: str | None = DEFAULT_DRAFT_RANGE,
              device: int | None = None, rules=None, weight_bytes: int | None = None, peak_bw: float | None = None,
              accept_len: float | None = None, tokens_per_step: float | None = None,
              device_profile: dict | None = None, measured_step_ms: float | None = None,
              measured_tok_s: float | None = None, phase: str | None = "decode", model: str | None = None,
              tp: int | None = None, ep: int | None = None, context: int | None = None) -> Breakdown:
    """Per-step breakdown of ``trace`` (see the module docstring and ``docs/definitions.md``)."""
    phase = phase or "decode"
    from tracekit.analyses.collectives import hidden_communication, step_collectives
    from tracekit.analyses.communication import collective_overheads
    from tracekit.gpus import lookup, resolve_peak_bw

    st = step_table(trace, step_range=step_range, draft_range=draft_range, device=device, rules=rules, phase=phase)
    attr, table, acts = st.attribution, st.table, st.activities
    warnings = list(trace.meta.warnings) + list(st.warnings)
    man, man_warning = _manifest(trace, attr)
    if man_warning:
        warnings.append(man_warning)
    n = table.height
    steps = {"count": n, "excluded": st.excluded, "marker": attr.steps.marker, "pattern": attr.steps.pattern,
             **_quantiles(table["period"]), "phase": st.phase, "phases": st.phases_found or {},
             "excluded_reasons": st.excluded_reasons}
    mean = lambda col: float(table[col].cast(pl.Float64).mean()) / 1e6  # noqa: E731
    per_step_ms = {k: mean(f"x_{k}") for k in STEP_CATEGORIES}
    kernel_ms = {k: mean(f"k_{k}") for k in KERNEL_CATEGORIES}
    gaps = {k: mean(f"g_{k}") for k in GAP_CAUSES}
    if attr.graph_mode:
        for k in COMPUTE_CATEGORIES:
            per_step_ms[k] = None
            kernel_ms[k] = None
    gaps["largest"] = list(st.largest)
    top = (acts.filter(pl.col("kind") != "graph_exec").group_by("name", "category")
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
    busy_ms = sum(v for k, v in per_step_ms.items() if k in BUSY_CATEGORIES and v is not None)
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
    gpu = {"device": attr.device, "name": gpu_name, "peak_bw_gbps": bw, "peak_bw_source": bw_src}

    # ---- time base
    spec = man.get("spec") or {}
    acc = _first(accept_len, spec.get("accept_len"))
    tps = resolve_tokens_per_step(tokens_per_step, man, trace, attr.steps.windows.join(table.select("step"), on="step"))
    batch = tps.value
    tokens = (acc if acc else 1) * batch
    traced = steps["mean_ms"]
    tb = time_base(traced, measured_step_ms=measured_step_ms, measured_tok_s=measured_tok_s, tokens_per_step=tokens,
                   manifest_ms=man.get("unprofiled_step_ms"))
    upper = tb.unprofiled_step_ms is None and host_bound(per_step_ms, traced)
    if tb.profiler_inflation is not None and tb.profiler_inflation > 1.2:
        warnings.append(f"the traced steps ({traced:.3f} ms) are {tb.profiler_inflation:.1f}x the unprofiled step "
                        f"({tb.unprofiled_step_ms:.3f} ms, {tb.unprofiled_source}): every saving is stated against the "
                        "unprofiled step; shares of the traced step include the profiler's own overhead")

    # ---- the step's collectives, and the size of the communicator its all-reduces use (the roofline's TP)
    comm_rows, trace_tp, trace_tp_ev = step_collectives(trace, acts, device=attr.device, n_steps=max(1, n),
                                                        gpu_name=gpu_name or man.get("gpu_name"), rules=rules)

    # ---- roofline
    # the speculative steps' forwards, once: the draft reads for --model without a manifest, the plain step
    fwds = counts = None
    if attr.draft_detection != "not_detected" and kernel_ms.get("drafting"):
        from tracekit.analyses.drafting import draft_forward_counts, step_forwards

        fwds = step_forwards(acts)
        if not (man.get("spec") or {}).get("draft_tokens") and attr.draft_detection in ("ranges", "structure"):
            counts = draft_forward_counts(fwds)
    roof, rwarn = _roofline(trace, man, kernel_ms, tb.reference_step_ms, bw, tokens, batch, table, n,
                            weight_bytes=weight_bytes, model=model, tp=tp, ep=ep, context=context,
                            draft_counts=counts, trace_tp=(trace_tp, trace_tp_ev))
    warnings.extend(rwarn)
    roof["tokens_per_step_source"] = tps.source  # (tracekit.tokens: flag > manifest > annotation > default)

    # ---- advice
    gap = DEFAULT_REPLAY_GAP_US
    if device_profile and isinstance(device_profile.get("graph_replay_gap_us"), (int, float)) \
            and device_profile["graph_replay_gap_us"] > 0:
        gap = float(device_profile["graph_replay_gap_us"])
    spec_gpu = lookup(gpu_name or man.get("gpu_name"))
    link = (f"{spec_gpu.link_bw_gbps:,.0f} GB/s per direction over {spec_gpu.link}"
            if spec_gpu and spec_gpu.link_bw_gbps else None)
    between = [x for x in st.largest if x["cause"] == "between_steps"]
    verify_ms = verify_busy_ms = token_factor = None
    if fwds is not None:
        from tracekit.analyses.drafting import verify_costs

        verify_ms, verify_busy_ms, token_factor = verify_costs(fwds)
    facts = StepFacts(
        traced_ms=traced, reference_ms=tb.reference_step_ms, reference_source=tb.unprofiled_source,
        upper_bounds=upper, per_step_ms=per_step_ms, kernel_ms=kernel_ms,
        gaps={k: gaps[k] for k in GAP_CAUSES}, busy_ms=busy_ms, graph_kernel_share=graph_share,
        launched_per_step=float(table["n_launched"].fill_null(0).mean()),
        graph_launches_per_step=float(table["n_graph_launches"].fill_null(0).mean()),
        kernels_per_step=float(table["n_kernels"].mean()),
        draft_phase_ms=float(table["draft_span"].mean()) / 1e6, draft_detection=attr.draft_detection,
        phase=st.phase, decode_advice=st.decode_advice, replay_gap_us=gap, accept_len=acc, tokens_per_step=float(batch),
        floor_ms=roof["floor_ms"], gemm_achieved_bw_gbps=roof["gemm_achieved_bw_gbps"], peak_bw_gbps=bw,
        kv_bytes_per_step=roof["kv_bytes_per_step"], weight_bytes_per_step=roof["weight_bytes_per_step"],
        weight_bytes_source=roof["weight_bytes_source"], kv_bytes_source=roof["kv_bytes_source"],
        attention_achieved_bw_gbps=roof["attention_achieved_bw_gbps"],
        comm_overheads=collective_overheads(acts, n, graph_share >= GRAPHED_SHARE, gap),
        collectives=tuple(comm_rows), hidden_comm_ms=hidden_communication(acts), link=link,
        longest_between=between[0] if between else None, verify_ms=verify_ms, verify_busy_ms=verify_busy_ms,
        token_factor=token_factor, phase_note=st.phase_note, tok_s_unit=tps.unit,
        longest_in_step=next((x for x in st.largest if x["cause"] != "between_steps"), None))
    advice = advise(facts)
    head = headline(tb, per_step_ms, gaps, advice, roof, st.phase_label, busy_ms, upper, st.decode_advice)
    source = {"path": trace.meta.path, "format": trace.meta.format, "producer_version": trace.meta.producer_version,
              "graph_trace_mode": trace.meta.graph_trace_mode}
    manifest = {k: man.get(k) for k in ("workload", "mode", "unprofiled_step_ms", "tp")} if man else None
    return Breakdown(source=source, gpu=gpu, steps=steps, time_base=tb, per_step_ms=per_step_ms, gaps=gaps,
                     kernel_ms_per_step=kernel_ms, roofline=roof, advice=advice, headline=head,
                     warnings=tuple(warnings), per_step=per_step, top_kernels=top, activities=acts, facts=facts,
                     rank=trace.meta.rank, manifest=manifest)


def _roofline(trace: Trace, man: dict, kernel_ms: dict, reference_ms: float, bw: float | None, tokens: float,
              batch: float, table: pl.DataFrame, n: int, *, weight_bytes, model, tp, ep, context,
              draft_counts: tuple[int, int] | None = None,
              trace_tp: tuple[int | None, str] = (None, "not looked for")) -> tuple[dict, list[str]]:
    """The roofline block: per-GPU bytes from (first found) --weight-bytes, --model (or the model the trace's
    recorded command line names, when it is in the local Hugging Face cache), the manifest, the trace's shapes or
    NVTX; the KV cache from the model and the context; the floor against the reference step."""
    from tracekit.analyses.roofline import step_roofline, weight_bytes_per_gpu

    warnings: list[str] = []
    disc = None
    if model is None and weight_bytes is None and man.get("weight_bytes_per_step") is None and trace.meta.command:
        from tracekit.model import discover_model

        disc = discover_model(trace.meta.command)
        if disc.model_path is not None:
            model = str(disc.model_path)
            warnings.append(f"model bytes from {disc.note}")
    # tensor parallelism: flag > manifest > the recorded command line > the size of the communicator the trace's
    # all-reduces use (never the job's world size) > 1 with a warning where it matters
    tp_src = "flag" if tp is not None else None
    if tp is None and man.get("tp"):
        tp, tp_src = int(man["tp"]), "manifest"
    if tp is None and disc is not None and disc.args.tp:
        tp, tp_src = int(disc.args.tp), "command line"
    if tp is None and trace_tp[0]:
        tp, tp_src = int(trace_tp[0]), "trace"
    tp_known = tp is not None
    tp = int(tp or 1)
    ep = int(ep or 1)
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
    kv = kv_src = draft = None
    wb = wb_src = None
    if weight_bytes is not None:
        wb, wb_src = weight_bytes_per_gpu(weight_bytes, tp), "flag"
    if model is not None:
        from tracekit.model import load_model, step_bytes

        sb = step_bytes(load_model(model), tp=tp, ep=ep, batch=max(1, int(round(batch))), context=ctx,
                        draft_forwards=draft_forwards,
                        verify_tokens=k + 1 if k else 1)
        warnings.extend(sb.warnings)
        draft = sb.draft_bytes_per_step or None
        if counted and draft:
            warnings.append(counted)
        if wb is None:
            wb, wb_src = sb.weight_bytes_per_step, "model"
        else:  # the flag replaces only the target's weights; the MTP draft still comes from the model
            wb += sb.draft_bytes_per_step
        kv, kv_src = sb.kv_bytes_per_step, (sb.kv_bytes_source if sb.kv_bytes_per_step is not None else None)
        if kv is None:
            warnings.append("KV-cache bytes unknown: pass --context N (tokens of KV cache each sequence reads per "
                            "step); the floor counts the weights only")
    if wb is None and man.get("weight_bytes_per_step") is not None:
        wb, wb_src = int(man["weight_bytes_per_step"]), "manifest"
    if kv is None and man.get("kv_bytes_per_step") is not None:
        kv, kv_src = int(man["kv_bytes_per_step"]), "manifest"
    if wb is None:
        wb, wb_src = _weight_bytes_from_trace(trace, table, n)
    if wb is None:
        warnings.append("weight bytes per step unknown: pass --model PATH or --weight-bytes N (or capture with "
                        "tracekit capture, whose manifest records them)")
    elif wb_src in ("flag", "model") and not tp_known:
        warnings.append(f"tensor parallelism unknown ({trace_tp[1]}): the model's bytes are not divided (--tp 1 "
                        "assumed; pass --tp N)")
    r = step_roofline(weight_bytes_per_step=wb, peak_bw_gbps=bw, reference_step_ms=reference_ms,
                      tokens_per_step=tokens, tp=tp, weight_bytes_source=wb_src if wb else None,
                      kv_bytes_per_step=kv, kv_bytes_source=kv_src, draft_bytes_per_step=draft,
                      gemm_ms=kernel_ms.get("gemm"), attention_ms=kernel_ms.get("attention")).to_dict()
    # extensions: where tp came from ("default" = 1, nothing said otherwise), and the trace's evidence
    r["tp_source"] = tp_src or "default"
    if tp_src == "trace" or not tp_known:
        r["tp_evidence"] = trace_tp[1]
    return r, warnings


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


def _weight_bytes_from_trace(trace: Trace, table: pl.DataFrame, n_steps: int):
    """Weight bytes from the trace itself: recorded op shapes (Kineto) or SGLang layer-wise NVTX text."""
    from tracekit.analyses.roofline import weight_bytes_from_nvtx, weight_bytes_from_shapes

    if trace.ops.height and trace.ops["input_dims"].is_not_null().any():
        # Only the ops of the analysed steps (warm-up or prefill ops would inflate the bytes).
        w = table.select("step", "pid", "tid", ws="w_start", we="w_end").sort("ws")
        ops = (trace.ops.sort("start")
               .join_asof(w, left_on="start", right_on="ws", by=["pid", "tid"], strategy="backward",
                          check_sortedness=False)
               .filter(pl.col("step").is_not_null() & (pl.col("start") <= pl.col("we")))
               .drop("ws", "we"))
        if ops.height:
            wb, _detail = weight_bytes_from_shapes(ops, n_steps=n_steps)
            if wb:
                return int(wb), "shapes"
    if trace.ranges.height:
        wb = weight_bytes_from_nvtx(trace.ranges["name"])
        if wb:
            return int(wb), "nvtx"
    return None, None


__all__ = ["Breakdown", "breakdown", "step_table", "headline", "devices_with_activity", "pick_device", "SCHEMA",
           "DEFAULT_DRAFT_RANGE"]
