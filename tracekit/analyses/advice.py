"""Advice: which lever (CUDA graphs, host work, all-reduce, drafting, fewer bytes) is worth pulling.

:func:`advise` is pure: it takes the facts a breakdown measured (:class:`StepFacts`) and returns an
immutable :class:`Advice`. Each lever has ``predicted_step_ms`` (the step with that lever pulled as far as it
goes, an UNPROFILED time), ``max_saving_ms`` = ``reference_step_ms`` - predicted, ``max_saving_fraction`` and a
verdict sentence. The reference is the time base (``tracekit.analyses.timebase``): the unprofiled step when
known (flag, then manifest), else the traced step - then every saving is an upper bound on a profiled step, and
the verdicts say so.

CUDA-graph model. In an eager step the GPU waits for the host between kernels; replayed from a graph, the same
kernels run back to back with a small fixed cost each, while host stalls inside the step (a synchronisation,
a blocking copy, CPU work) stay where the code puts them::

    predicted = busy + n_launches x replay_gap + host_stalls

``busy`` is the step's GPU-busy time (the union of its activity), ``n_launches`` the work it launched one by
one, ``replay_gap`` the per-node cost of graph replay on this GPU (``--device-profile`` key
``graph_replay_gap_us``, else the H200 calibration below). Host work between steps is not modelled (assumed to
shrink to the replay; a server's scheduler keeps its own, reported under ``host_stalls``).
docs/validation.md records predicted versus measured step times on the H200.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tracekit.categories import LEVERS

# Per-node cost of graph replay (µs) when no device profile is given. Calibrated on the H200 with
# sample_traces/synthetic-eager (busy 0.912 ms, 227 launches per step) against the unprofiled
# graph-replay step of the same loop (1.0438 ms): (1.0438 - 0.912) / 227 = 0.58 µs.
DEFAULT_REPLAY_GAP_US = 0.58
GRAPHED_SHARE = 0.8  # contract: not applicable when >= 80% of kernel time is graph replay
SMALL_SAVING = 0.05  # a lever that saves less than this share of the step "would save little"
MEMORY_BOUND = 0.7  # fraction of the bandwidth floor from which a step is called memory-bound
# Levers in display order: the contract's four, then host stalls (an extension key).
ALL_LEVERS = (*LEVERS, "host_stalls")


@dataclass(frozen=True)
class Lever:
    """One lever of ``advice``; ``extra`` holds extension keys (e.g. ``detection``)."""

    applicable: bool
    predicted_step_ms: float | None
    max_saving_ms: float | None
    max_saving_fraction: float | None
    verdict: str
    extra: dict = field(default_factory=dict)

    def __getitem__(self, key: str):
        return self.to_dict()[key]

    def to_dict(self) -> dict:
        return {"applicable": self.applicable, "predicted_step_ms": self.predicted_step_ms,
                "max_saving_ms": self.max_saving_ms, "max_saving_fraction": self.max_saving_fraction,
                "verdict": self.verdict, **self.extra}


@dataclass(frozen=True)
class Advice:
    """Every lever, and those worth pulling ranked by the time they would save (largest first)."""

    levers: dict[str, Lever]
    ranked: tuple[str, ...]

    def __getitem__(self, key: str) -> Lever:
        return self.levers[key]

    def to_dict(self) -> dict:
        return {k: v.to_dict() for k, v in self.levers.items()}


@dataclass(frozen=True)
class StepFacts:
    """What the levers need, measured by the breakdown (all ms per step, means over the analysed steps)."""

    traced_ms: float  # steps.mean_ms: the traced step
    reference_ms: float  # time_base.reference_step_ms
    reference_source: str | None  # "flag" | "manifest" | None (= the traced step)
    upper_bounds: bool  # no unprofiled time and a host-bound step
    per_step_ms: dict  # the exact partition of the traced step
    kernel_ms: dict  # plain kernel sums per category
    gaps: dict  # launch_overhead, host_stalls, graph_bubbles, between_steps
    busy_ms: float  # GPU-busy time (union of the step's activity)
    graph_kernel_share: float
    launched_per_step: float  # work launched one by one (not from a graph)
    graph_launches_per_step: float
    kernels_per_step: float
    draft_phase_ms: float  # wall time of the draft phases on the GPU timeline
    draft_detection: str
    phase: str  # decode | prefill | mixed | unknown
    decode_advice: bool = True  # False: no decode step analysed (the split only)
    replay_gap_us: float = DEFAULT_REPLAY_GAP_US
    accept_len: float | None = None
    tokens_per_step: float = 1.0  # batch
    floor_ms: float | None = None
    gemm_achieved_bw_gbps: float | None = None
    peak_bw_gbps: float | None = None
    kv_bytes_per_step: int | None = None
    weight_bytes_per_step: int | None = None
    weight_bytes_source: str | None = None  # roofline.weight_bytes_source
    kv_bytes_source: str | None = None  # roofline.kv_bytes_source
    attention_achieved_bw_gbps: float | None = None
    comm_overheads: dict | None = None  # staging copies and graph nodes of collectives
    collectives: tuple = ()  # the step's collectives per (kind, implementation) (collectives.collective_table rows)
    hidden_comm_ms: float | None = None  # communication overlapped by compute on OTHER streams (collectives.py)
    link: str | None = None  # "NVLink 4: 450 GB/s per direction" (the GPU table's link)
    longest_between: dict | None = None  # the largest between-steps gap (gaps.largest entry)
    longest_in_step: dict | None = None  # the largest gap inside a step (gaps.largest entry)
    verify_ms: float | None = None  # speculative steps: wall span of the target (verify) forward, traced
    verify_busy_ms: float | None = None  # its GPU work (what scales with tokens; its launch gaps do not)
    token_factor: float | None = None  # cost of a K+1-token forward over a 1-token one (the draft's own)
    phase_note: str | None = None  # why decode advice does not apply, right for the window (partition.phase_note)
    tok_s_unit: str = "tok/s"  # what a tok/s figure counts: the whole batch or one sequence (tracekit.tokens)


def pct(x: float) -> str:
    """A share as text: one decimal below 10%.

    >>> pct(0.0512), pct(0.51)
    ('5.1%', '51%')
    """
    v = 100 * x
    return f"{v:.1f}%" if abs(v) < 10 else f"{v:.0f}%"


def _lever(f: StepFacts, applicable: bool, predicted: float | None, verdict: str, **extra) -> Lever:
    ref = f.reference_ms
    saving = None if predicted is None else ref - predicted
    if saving is not None and not extra.pop("signed", False):
        saving = max(0.0, saving)
    return Lever(applicable=bool(applicable), predicted_step_ms=predicted, max_saving_ms=saving,
                 max_saving_fraction=None if saving is None or ref <= 0 else saving / ref, verdict=verdict,
                 extra=extra)


def _base(f: StepFacts) -> str:
    """How the reference step is named in a verdict."""
    if f.reference_source:
        return f"{f.reference_ms:.3f} ms (unprofiled, {f.reference_source})"
    return f"{f.reference_ms:.3f} ms (traced)"


def _bound(f: StepFacts) -> str:
    return " (an upper bound: the traced step includes the profiler's overhead)" if f.upper_bounds else ""


def _longest(gap: dict | None) -> str:
    """'; the longest inside a step, 0.574 ms before graph work, while the host was in op 'replay'' or ''."""
    if not gap:
        return ""
    before = gap.get("before")
    what = f", while the host was in {before['kind']} {before['name']!r}" if before else ""
    return (f"; the longest gap inside a step, {gap['ms']:.3f} ms ({gap['cause'].replace('_', ' ')}), comes before "
            f"{gap['where']} work{what}")


def cuda_graphs_lever(f: StepFacts) -> Lever:
    g = f.gaps
    if f.graph_kernel_share >= GRAPHED_SHARE:
        return _lever(f, False, f.reference_ms,
                      f"steps already replay CUDA graphs ({pct(f.graph_kernel_share)} of kernel time); the traced "
                      f"step's GPU-idle time is {g['launch_overhead']:.3f} ms of launch overhead, "
                      f"{g['host_stalls']:.3f} ms of host stalls, {g['graph_bubbles']:.3f} ms of graph bubbles and "
                      f"{g['between_steps']:.3f} ms between steps" + _longest(f.longest_in_step))
    n = f.launched_per_step
    stalls = g["host_stalls"]
    predicted = f.busy_ms + n * f.replay_gap_us / 1000.0 + stalls
    predicted = min(predicted, f.reference_ms) if f.reference_source else min(predicted, f.traced_ms)
    saving = f.reference_ms - predicted
    part = f" for its eager part ({pct(1 - f.graph_kernel_share)} of kernel time)" if f.graph_kernel_share > 0.01 else ""
    if f.reference_ms and saving / f.reference_ms < SMALL_SAVING:
        return _lever(f, True, predicted,
                      f"CUDA graphs would save little: the step takes {_base(f)} against ≈{predicted:.3f} ms with "
                      f"graphs; the GPU is already kept busy")
    stays = f"; {stalls:.3f} ms of host stalls inside the step stay (see host stalls)" if stalls > 0.0005 else ""
    verdict = (f"CUDA graphs{part} would cut the step from {_base(f)} to about {predicted:.3f} ms "
               f"(−{saving:.3f} ms, {pct(saving / f.reference_ms)}){_bound(f)}: {n:.0f} launches issued one by "
               f"one become ≈{f.replay_gap_us:.2f} µs graph nodes{stays}; host work between steps is not modelled")
    return _lever(f, True, predicted, verdict)


def host_stalls_lever(f: StepFacts) -> Lever:
    """Host work the GPU waits for: stalls inside the step plus the host time between steps. These are traced
    figures; with an unprofiled step they are capped at what that step leaves besides its GPU work."""
    g = f.gaps
    traced = g["host_stalls"] + g["between_steps"]
    if traced <= 0.0005:
        return _lever(f, False, f.reference_ms, "no host stalls: the GPU never waits for host work in or between "
                                                "steps")
    # With an unprofiled step, what it leaves besides its GPU work, the bubbles of its graphs and the bare cost of
    # its launches bounds the host time in it (the rest of the traced figure is the profiler's own overhead).
    room = f.reference_ms - f.busy_ms - g["graph_bubbles"] - f.launched_per_step * f.replay_gap_us / 1000.0
    saving = min(traced, max(0.0, room)) if f.reference_source else traced
    where = []
    if g["host_stalls"] > 0.0005:
        where.append(f"{g['host_stalls']:.3f} ms inside the step (synchronisations, blocking copies, CPU work)")
    if g["between_steps"] > 0.0005:
        b = f.longest_between
        what = ""
        if b and b.get("before"):
            what = f" (the longest while the host was in {b['before']['kind']} {b['before']['name']!r})"
        where.append(f"{g['between_steps']:.3f} ms between steps{what}")
    verdict = (f"in the traced step the GPU waits for host work {' and '.join(where)}: moving it off the critical "
               f"path (overlap it with GPU work, make it asynchronous) could save up to {saving:.3f} ms "
               f"({pct(saving / f.reference_ms) if f.reference_ms else '—'} of {_base(f)})")
    if f.reference_source and saving < traced - 0.0005:
        verdict += (f"; the unprofiled step leaves at most {max(0.0, room):.3f} ms besides its GPU work: the rest is the "
                    "profiler's own overhead")
    return _lever(f, saving > 0.0005, max(f.busy_ms, f.reference_ms - saving), verdict + _bound(f))


def _comm_measures(f: StepFacts) -> dict:
    """What the JSON reports of the step's communication whatever the advice: hidden time and the collectives."""
    return {"hidden_communication_ms": f.hidden_comm_ms, "collectives": [dict(r) for r in f.collectives]}


def communication_lever(f: StepFacts) -> Lever:
    exposed = f.per_step_ms.get("communication")
    kernel = f.kernel_ms.get("communication")
    if exposed is None:
        return _lever(f, False, None, "communication cannot be measured: graph work has no per-kernel rows",
                      **_comm_measures(f))
    if not kernel:
        return _lever(f, False, f.reference_ms, "no communication kernels in the step: an all-reduce change cannot "
                                                "help", **_comm_measures(f))
    # only compute on another stream hides communication (same-stream overlap is serialised away)
    hidden = f.hidden_comm_ms if f.hidden_comm_ms is not None else max(0.0, kernel - exposed)
    verdict = (f"exposed communication is {exposed:.3f} ms per step ({pct(exposed / f.reference_ms)} of "
               f"{_base(f)}; {hidden:.3f} ms more overlaps compute on other streams): the most a faster all-reduce "
               "could save")
    cost = f.comm_overheads
    if cost and (cost["staging_ms"] > 0 or cost["node_ms"] > 0):
        parts = [f"its staging copies ({cost['staging_ms']:.3f} ms)"] if cost["staging_ms"] > 0 else []
        if cost["node_ms"] > 0:
            parts.append(f"{cost['nodes_per_step']:.0f} graph nodes ({cost['node_ms']:.3f} ms)")
        verdict += (f"; counting {' and '.join(parts)}, the all-reduce costs "
                    f"{exposed + cost['staging_ms'] + cost['node_ms']:.3f} ms per step")
    from tracekit.analyses.collectives import collectives_verdict

    about = collectives_verdict(list(f.collectives))
    if about:
        # the largest collective: latency-bound (one-shot / custom all-reduce, fewer calls) or its bus bandwidth
        verdict += "; " + about
    extra = _comm_measures(f)
    extra["hidden_communication_ms"] = hidden
    if cost:
        # extension keys (the contract's max_saving_ms stays the exposed kernel time)
        total = exposed + cost["staging_ms"] + cost["node_ms"]
        extra.update(staging_ms=cost["staging_ms"], graph_node_ms=cost["node_ms"], implementation_cost_ms=total,
                     free_allreduce_step_ms=max(0.0, f.reference_ms - total))
    return _lever(f, True, max(0.0, f.reference_ms - exposed), verdict, **extra)


def drafting_lever(f: StepFacts) -> Lever:
    draft = f.per_step_ms.get("drafting")
    det = {"detection": f.draft_detection}
    if draft is None:
        return _lever(f, False, None, "drafting cannot be measured: graph work has no per-kernel rows", **det)
    if f.draft_detection == "not_detected" or draft <= 0:
        return _lever(f, False, None, "drafting not detected: no draft ranges, no recognisable draft graph and no "
                                      "speculative kernels (pass --draft-range REGEX if the trace marks them)", **det)
    # The draft phase costs its wall time on the GPU timeline, launch gaps between its kernels included.
    phase = max(draft, min(f.draft_phase_ms, f.traced_ms))
    scale = f.reference_ms / f.traced_ms if f.traced_ms else 1.0
    how = {"ranges": "draft ranges", "structure": "the step's structure", "kernels": "speculative kernels"}[
        f.draft_detection]
    verdict = (f"the draft phase takes {phase:.3f} ms of the traced step ({pct(phase / f.traced_ms)}; found from "
               f"{how})")
    if phase > draft * 1.05:
        verdict += f", {draft:.3f} ms of it GPU work"
    # Without speculation a step is one target forward over one token per sequence, plus the host time between
    # steps: the verify forward's GPU work re-costed at one token (by the draft model's own K+1- against 1-token
    # forward where the step has both) — its launch gaps stay as they are — on the reference's time base.
    if f.verify_ms:
        factor = f.token_factor or 1.0
        busy = f.verify_busy_ms if f.verify_busy_ms is not None else f.verify_ms
        plain = (f.verify_ms - busy * (1 - 1 / factor) + f.gaps.get("between_steps", 0.0)) * scale
        basis = (f"the verify forward ({f.verify_ms:.3f} ms traced, {busy:.3f} ms of it GPU work) with its GPU work "
                 f"re-costed at one token (÷{factor:.2f}, the draft model's own K+1- against 1-token forward)"
                 if f.token_factor else
                 f"the verify forward ({f.verify_ms:.3f} ms traced) kept at K+1 tokens: an upper bound")
    else:
        plain = (f.traced_ms - phase) * scale
        basis = "the step without its draft phase, verify forward kept at K+1 tokens: an upper bound"
    acc = f.accept_len
    if acc:
        spec_tps = acc * f.tokens_per_step / f.reference_ms * 1000
        plain_tps = f.tokens_per_step / plain * 1000 if plain > 0 else None
        saving = f.reference_ms - acc * plain
        if plain_tps:
            pays = "pays off" if spec_tps > plain_tps else "does not pay off"
            verdict += (f"; with {acc:.2f} tokens accepted per step speculation gives {spec_tps:.1f} {f.tok_s_unit} "
                        f"against ≈{plain_tps:.1f} without it (≈{plain:.3f} ms per plain step: {basis}): "
                        f"it {pays} (break-even at {f.reference_ms / plain:.2f} accepted tokens per step)")
        return Lever(applicable=True, predicted_step_ms=plain, max_saving_ms=saving,
                     max_saving_fraction=saving / f.reference_ms if f.reference_ms else None, verdict=verdict,
                     extra=det)
    verdict += (f"; without speculation a step would take ≈{plain:.3f} ms ({basis}); pass --accept-len to compare "
                "tokens/s with and without speculation")
    return Lever(applicable=True, predicted_step_ms=plain, max_saving_ms=None, max_saving_fraction=None,
                 verdict=verdict, extra=det)


def memory_lever(f: StepFacts) -> Lever:
    floor = f.floor_ms
    if floor is None:
        return _lever(f, False, None, "weight bytes or peak bandwidth unknown: pass --model PATH (or --weight-bytes "
                                      "N) and --peak-bw to compare the step with the memory-bandwidth floor")
    ref = f.reference_ms
    frac = floor / ref if ref else 0
    gemm = f.per_step_ms.get("gemm")
    peak = f.peak_bw_gbps
    kv = f.kv_bytes_per_step
    def src(s: str | None) -> str:
        return f" ({s})" if s else ""

    streams = (f"{(f.weight_bytes_per_step or 0) / 1e9:.2f} GB of weights{src(f.weight_bytes_source)}"
               + (f" and {kv / 1e9:.2f} GB of KV cache{src(f.kv_bytes_source)}" if kv else "") + " per GPU")
    near = []
    if f.gemm_achieved_bw_gbps and peak:
        near.append(f"the gemm kernels read at {pct(f.gemm_achieved_bw_gbps / peak)} of peak")
    if kv and f.attention_achieved_bw_gbps and peak:
        near.append(f"attention reads the KV cache at {pct(f.attention_achieved_bw_gbps / peak)} of peak")
    near_txt = f" ({'; '.join(near)})" if near else ""
    if frac >= MEMORY_BOUND and gemm is not None:
        main = "weights" if not kv or kv < (f.weight_bytes_per_step or 0) else "the KV cache"
        verdict = (f"the step reads {streams}; at {_base(f)} it is at {pct(frac)} of the {floor:.3f} ms floor that "
                   f"reading them at peak bandwidth takes{near_txt}: memory-bound (mostly {main}); CUDA graphs or NCCL "
                   "changes cannot help much — fewer bytes can (quantization, a smaller KV cache, batching, better "
                   "acceptance)")
    else:
        verdict = (f"the step takes {_base(f)} against a floor of {floor:.3f} ms for reading {streams} ({pct(frac)} "
                   f"of it): {ref - floor:.3f} ms per step are not spent reading memory")
        rest = sorted(((k, v) for k, v in {**f.gaps, **{k: v for k, v in f.per_step_ms.items()
                                                        if k not in ("gemm", "launch_gaps", "idle")}}.items() if v),
                      key=lambda kv_: -kv_[1])[:2]
        if rest:
            verdict += "; the largest other parts of the traced step: " + ", ".join(
                f"{k.replace('_', ' ')} {v:.3f} ms" for k, v in rest)
        verdict += near_txt
    return _lever(f, True, floor, verdict)


def not_decode(f: StepFacts) -> Advice:
    why = f.phase_note or (f"{f.phase} steps: decode advice does not apply (the split above still holds)")
    extra = {"drafting": {"detection": f.draft_detection}, "communication": _comm_measures(f)}
    levers = {k: Lever(False, None, None, None, why, extra.get(k, {})) for k in ALL_LEVERS}
    return Advice(levers=levers, ranked=())


def advise(f: StepFacts) -> Advice:
    """Every lever for the measured facts ``f``; ``ranked`` = the applicable levers with a positive saving, largest
    first (memory bandwidth is context, never ranked; a negative drafting saving means speculation pays)."""
    if not f.decode_advice or f.phase == "prefill":
        return not_decode(f)
    levers = {
        "cuda_graphs": cuda_graphs_lever(f),
        "communication": communication_lever(f),
        "drafting": drafting_lever(f),
        "memory_bandwidth": memory_lever(f),
        "host_stalls": host_stalls_lever(f),
    }
    ranked = tuple(sorted((k for k, v in levers.items() if v.applicable and (v.max_saving_ms or 0) > 0
                           and k != "memory_bandwidth"), key=lambda k: -(levers[k].max_saving_ms or 0)))
    return Advice(levers=levers, ranked=ranked)


__all__ = ["advise", "Advice", "Lever", "StepFacts", "DEFAULT_REPLAY_GAP_US", "GRAPHED_SHARE", "ALL_LEVERS", "pct"]
