"""Advice: which lever (CUDA graphs, faster collectives, host work, drafting, fewer bytes) is worth pulling.

:func:`advise` is pure: it takes the facts a breakdown measured (:class:`StepFacts`) and returns an
immutable :class:`~tracekit.analyses.verdicts.Advice`. Each lever has ``predicted_step_ms`` (the step with that
lever pulled as far as it goes, an UNPROFILED time), ``max_saving_ms`` = ``reference_step_ms`` - predicted,
``max_saving_fraction`` and a verdict. The reference is the time base (``tracekit.analyses.resolve.time_base``):
the unprofiled step when known (flag, then manifest), else the traced step.

A verdict is data before it is prose (``tracekit.analyses.verdicts``). Each lever is a typed value: its saving,
the *bound* and *basis* of that saving (every saving without an unprofiled time is an upper bound; ``unknown``
when an input is missing, with ``needs`` naming the flag that resolves it), the inputs it ``assumed``, the name
the headline gives it (``tracekit.categories`` LEVER_NAMES: what pulling it removes) and its *reading*: the facts
its sentence states, from which the sentence is rendered. What the reports show first is decided here, once:
``ranked`` (the levers worth pulling, largest saving first), ``order`` (every lever as a report lists them),
``bound_by`` (whether the step is bound at its memory floor: :func:`floor_of`) and the ``headline``. The self-check
(``verdicts.check``) tests each lever's fields and never withholds one.

CUDA-graph model. In an eager step the GPU waits for the host between kernels; replayed from a graph, the same
kernels run back to back with a small fixed cost each, while host stalls inside the step (a synchronisation,
a blocking copy, CPU work) stay where the code puts them::

    predicted = busy + n_launches x replay_gap + host_stalls + after_waits

``busy`` is the step's GPU-busy time (the union of its activity), ``n_launches`` the work it launched one by
one, ``replay_gap`` the per-node cost of graph replay on this GPU (``--device-profile`` key
``graph_replay_gap_us``, else the H200 calibration below). ``after_waits`` is the part of the launch overhead
from the return of a host wait (a synchronisation, a device-to-host or pageable copy) to the next launch call
(``tracekit.analyses.gaps.after_waits``): a graph cannot span a host wait, so the host work after one (CPU
sampling, a grammar mask, scheduling: Python a trace without ranges cannot name) runs with graphs too; only the
launch call after it becomes a graph launch (its cost is in the replay gap). Host work between steps is not
modelled (the ``host_work`` lever reports it). In steps that already replay graphs, the in-step gaps the gap
table calls launch overhead are the host's work before each graph launch (e.g. SGLang's
``normal_decode_set_metadata`` before ``replay()``): graphs cannot remove them, and the verdicts say so.
docs/validation.md records predicted versus measured step times on the H200.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tracekit.analyses.timebase import host_bound
from tracekit.analyses.verdicts import (
    BASES,
    EPS_MS,
    LEVER_EXTENSIONS,
    PEAK_TOLERANCE,
    Advice,
    CommCost,
    DraftCost,
    Floor,
    FloorReading,
    GapNote,
    GraphsInUse,
    GraphsPredicted,
    Headline,
    HostWait,
    Lever,
    Reading,
    Reference,
    Statement,
    TopLever,
    check,
    pct,
    saving_text,
)
from tracekit.categories import GAP_CATEGORIES, GAP_CAUSES, HOST_WORK_NAMES, LEVER_NAMES, LEVERS

if TYPE_CHECKING:  # pragma: no cover
    from tracekit.analyses.drafting import VerifyCost

# Per-node cost of graph replay (µs) when no device profile is given. Calibrated on the H200 with
# sample_traces/synthetic-eager (busy 0.912 ms, 227 launches per step) against the unprofiled
# graph-replay step of the same loop (1.0438 ms): (1.0438 - 0.912) / 227 = 0.58 µs.
DEFAULT_REPLAY_GAP_US = 0.58
GRAPHED_SHARE = 0.8  # contract: not applicable when >= 80% of kernel time is graph replay
SMALL_SAVING = 0.05  # a lever that saves less than this share of the step "would save little"
NAMED_PART = 0.05  # a part of a gap under this share of the traced step is not named in a verdict
MEMORY_BOUND = 0.7  # fraction of the bandwidth floor from which a step is called memory-bound
# Levers in display order (the contract's advice keys).
ALL_LEVERS = LEVERS


@dataclass(frozen=True)
class StepFacts:
    """What the levers need, measured by the breakdown (all ms per step, means over the analysed steps)."""

    traced_ms: float  # steps.mean_ms: the traced step
    reference_ms: float  # time_base.reference_step_ms
    reference_source: str | None  # "flag" | "manifest" | None (= the traced step)
    upper_bounds: bool  # no unprofiled time: every saving is an upper bound on a profiled step
    per_step_ms: Mapping  # the exact partition of the traced step (the breakdown's PerStepMs block)
    kernel_ms: Mapping  # plain kernel sums per category (its KernelMsPerStep block)
    gaps: Mapping  # launch_overhead, host_stalls, graph_bubbles, between_steps (its GapCauses block)
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
    longest_between: Mapping | None = None  # the largest between-steps gap (gaps.largest entry)
    longest_in_step: Mapping | None = None  # the largest gap inside a step (gaps.largest entry)
    verify: VerifyCost | None = None  # speculative steps: the target (verify) forward (tracekit.analyses.drafting)
    draft_evidence: tuple = ()  # advice.drafting.evidence: what the detection rests on
    speculation: object | None = None  # tracekit.analyses.speculation.Speculation: speculative, draft_model, verify_tokens
    # the roofline's larger floor (compute when the step's FLOPs at peak FLOP/s take longer than reading its bytes)
    floor_kind: str = "memory"
    memory_floor_ms: float | None = None  # the bytes at peak bandwidth (floor_ms is the larger of the two floors)
    peak_tflops: float | None = None
    gemm_achieved_tflops: float | None = None
    comm_split: object | None = None  # collectives.CommSplit: transfer against waiting, per kind (communication lever)
    roofline_refused: str | None = None  # why the roofline's figures are physically impossible (the inputs to check)
    roofline_check: tuple[str, ...] = ()  # the inputs a refused roofline asks to check (--tp (1, default), ...)
    phase_note: str | None = None  # why decode advice does not apply, right for the window (partition.phase_note)
    phase_label: str | None = None  # the analysed steps' phase as the headline names it (partition.phase_label)
    tok_s_unit: str = "tok/s"  # what a tok/s figure counts: the whole batch or one sequence (tracekit.tokens)
    after_waits_ms: float = 0.0  # the launch overhead after a host wait's return (tracekit.analyses.gaps.after_waits)
    fraction_of_ceiling: float | None = None  # roofline.fraction_of_ceiling (None when refused)
    ceiling_tokens_per_s: float | None = None  # roofline.ceiling_tokens_per_s
    ceiling_unit: str = "tok/s"  # the words of the ceiling's tok/s


def _reference(f: StepFacts) -> Reference:
    return Reference(f.reference_ms, f.reference_source, f.traced_ms)


def _lever(f: StepFacts, applicable: bool, predicted: float | None, reading: Reading, *, key: str,
           basis: str = "estimated", name: str | None = None, assumed: tuple = (), needs: tuple = (),
           signed: bool = False, **extra) -> Lever:
    """A lever from its numbers and its reading: the saving is ``reference - predicted`` (floored at 0 unless
    ``signed``); its basis is ``upper_bound`` whenever no unprofiled time is known, ``unknown`` when it cannot be
    computed, ``none`` when the lever does not apply and saves nothing."""
    ref = f.reference_ms
    saving = None if predicted is None else ref - predicted
    if saving is not None and not signed:
        saving = max(0.0, saving)
    if saving is None:
        basis = "unknown" if needs else "none"
    elif not applicable and saving <= EPS_MS:
        basis = "none" if basis != "measured" else basis
    elif f.upper_bounds and basis != "none":
        basis = "upper_bound"
    return Lever(applicable=bool(applicable), predicted_step_ms=predicted, max_saving_ms=saving,
                 max_saving_fraction=None if saving is None or ref <= 0 else saving / ref, extra=extra,
                 basis=basis, assumed=tuple(assumed), needs=tuple(needs), reading=reading, reference=_reference(f),
                 name=name or LEVER_NAMES[key])


def _graphed(f: StepFacts) -> bool:
    return f.graph_kernel_share >= GRAPHED_SHARE


def gap_name(f: StepFacts, cause: str) -> str:
    """A gap cause in words: in steps that replay CUDA graphs the gaps before launched work are host work before
    the graph launch (e.g. SGLang's metadata update before replay()), not launch overhead graphs would remove."""
    if cause == "launch_overhead" and _graphed(f):
        return "host work before graph launches"
    return cause.replace("_", " ")


def _before(gap: Mapping | None) -> tuple[str, str] | None:
    before = gap.get("before") if gap else None
    return (before["kind"], before["name"]) if before else None


def _gap_note(f: StepFacts, gap: Mapping | None) -> GapNote | None:
    """The largest gap inside a step, as a verdict names it."""
    if not gap:
        return None
    return GapNote(ms=gap["ms"], cause=gap_name(f, gap["cause"]), where=gap["where"], before=_before(gap))


def cuda_graphs_lever(f: StepFacts) -> Lever:
    g = f.gaps
    if _graphed(f):
        reading = GraphsInUse(graph_share=f.graph_kernel_share, launch_overhead_ms=g["launch_overhead"],
                              after_waits_ms=f.after_waits_ms if f.after_waits_ms >= NAMED_PART * f.traced_ms else None,
                              host_stalls_ms=g["host_stalls"], graph_bubbles_ms=g["graph_bubbles"],
                              between_steps_ms=g["between_steps"], longest=_gap_note(f, f.longest_in_step))
        return _lever(f, False, f.reference_ms, reading, key="cuda_graphs", basis="none")
    n = f.launched_per_step
    stalls = g["host_stalls"]
    kept = f.after_waits_ms
    predicted = f.busy_ms + n * f.replay_gap_us / 1000.0 + stalls + kept
    predicted = min(predicted, f.reference_ms) if f.reference_source else min(predicted, f.traced_ms)
    saving = f.reference_ms - predicted
    little = bool(f.reference_ms) and saving / f.reference_ms < SMALL_SAVING
    reading = GraphsPredicted(
        predicted_ms=predicted, launched=n, replay_gap_us=f.replay_gap_us, host_stalls_ms=stalls, after_waits_ms=kept,
        eager_share=1 - f.graph_kernel_share if f.graph_kernel_share > 0.01 else None, little=little,
        gpu_busy=stalls + kept <= 0.5 * max(predicted - f.busy_ms, 0.0))
    return _lever(f, True, predicted, reading, key="cuda_graphs",
                  assumed=(f"{f.replay_gap_us:.2f} µs per replayed graph node",))


def host_work_lever(f: StepFacts) -> Lever:
    """Host work the GPU waits for: stalls inside the step (``gaps.host_stalls``) plus the host time between steps
    (``gaps.between_steps``). Traced figures; with an unprofiled step they are scaled to it (the host time shrinks
    with the profiler's overhead as the step does) and capped at what that step leaves besides its GPU work."""
    g = f.gaps
    hs, bs = g["host_stalls"], g["between_steps"]
    traced = hs + bs
    # named by what it removes: a part under 5% of the lever's time (or under EPS) does not name it
    big = max(EPS_MS, 0.05 * traced)
    which = "both" if hs >= big and bs >= big else ("host_stalls" if hs >= bs else "between_steps")
    name = HOST_WORK_NAMES[which]
    if traced <= EPS_MS:
        return _lever(f, False, f.reference_ms, Statement(
            "the GPU never waits for host work in or between steps (no host stalls, nothing between steps)"),
                      key="host_work", name=name, basis="measured")
    saving, assumed, room = traced, (), None
    # With an unprofiled step: the traced host time scaled to it, and no more than what that step leaves besides
    # its GPU work, the bubbles of its graphs and the bare cost of its launches (the rest is profiler overhead).
    if f.reference_source and f.traced_ms:
        room = max(0.0, f.reference_ms - f.busy_ms - g["graph_bubbles"]
                   - f.launched_per_step * f.replay_gap_us / 1000.0)
        scale = min(1.0, f.reference_ms / f.traced_ms)
        saving = min(traced * scale, room)
        assumed = (f"host time scaled to the unprofiled step (x{scale:.2f})",)
    reading = HostWait(host_stalls_ms=hs, between_steps_ms=bs, which=which, longest_before=_before(f.longest_between),
                       room_ms=room, removable_ms=saving)
    return _lever(f, saving > EPS_MS, max(f.busy_ms, f.reference_ms - saving), reading, key="host_work", name=name,
                  basis="estimated" if f.reference_source else "upper_bound", assumed=assumed)


def _comm_measures(f: StepFacts) -> dict:
    """What the JSON reports of the step's communication whatever the advice: hidden time, transfer and wait,
    the kinds and the collectives."""
    split = f.comm_split
    measures = {"hidden_communication_ms": f.hidden_comm_ms}
    if split is not None:
        measures.update(split.to_json())
    else:
        measures.update(transfer_ms=None, wait_ms=None, split_basis="none", by_kind=[])
    measures["collectives"] = [dict(r) for r in f.collectives]
    return measures


def _kinds(split) -> str:
    """'all-gather/reduce-scatter': the collective kinds that hold most of the saving (NCCL's names)."""
    kinds = split.kinds_that_matter() if split is not None and split.by_kind else []
    return "/".join(kinds) if kinds else "collectives"


def communication_lever(f: StepFacts) -> Lever:
    """Faster collectives: what the exposed part of their *transfer* costs per step (contract: waiting for other
    ranks is excluded; without a split, the exposed communication, an upper bound that includes waiting)."""
    from tracekit.analyses.collectives import collectives_verdict

    exposed = f.per_step_ms.get("communication")
    kernel = f.kernel_ms.get("communication")
    split = f.comm_split
    if exposed is None:
        return _lever(f, False, None, Statement("communication cannot be measured: graph work has no per-kernel rows"),
                      key="communication", **_comm_measures(f))
    if not kernel:
        return _lever(f, False, f.reference_ms, Statement("no communication kernels in the step: faster collectives "
                                                          "cannot help"), key="communication", basis="measured",
                      **_comm_measures(f))
    # only compute on another stream hides communication (same-stream overlap is serialised away)
    hidden = f.hidden_comm_ms if f.hidden_comm_ms is not None else max(0.0, kernel - exposed)
    what = _kinds(split)
    lever_name = f"faster {what}"
    counts = tuple((r["count_per_step"], r["kind"]) for r in split.by_kind) if split is not None and split.by_kind \
        else ()
    measured = split is not None and split.basis != "none" and split.exposed_transfer_ms is not None
    if measured:
        saving, basis = min(split.exposed_transfer_ms, exposed), "estimated"
    else:
        saving, basis = exposed, "upper_bound"
    cost = f.comm_overheads
    total = saving + cost["staging_ms"] + cost["node_ms"] if cost else None
    reading = CommCost(
        kinds=what, counts=counts, split=split.basis if measured else "none", ranks=split.ranks if split else None,
        how=split.how if split is not None else None, kernel_ms=split.kernel_ms if split is not None else None,
        transfer_ms=split.transfer_ms if measured else None, wait_ms=split.wait_ms if measured else None,
        exposed_ms=exposed, hidden_ms=hidden, staging_ms=cost["staging_ms"] if cost else 0.0,
        node_ms=cost["node_ms"] if cost else 0.0, nodes_per_step=cost["nodes_per_step"] if cost else 0.0,
        cost_ms=total,
        # the largest collective: latency-bound (one-shot / custom all-reduce, fewer calls) or its bus bandwidth
        collectives_note=collectives_verdict(list(f.collectives)))
    extra = _comm_measures(f)
    extra["hidden_communication_ms"] = hidden
    extra["lever_name"] = lever_name
    if cost:
        # extension keys: the collectives' cost with their staging copies and graph nodes
        extra.update(staging_ms=cost["staging_ms"], graph_node_ms=cost["node_ms"], implementation_cost_ms=total,
                     free_allreduce_step_ms=max(0.0, f.reference_ms - total))
    return _lever(f, True, max(0.0, f.reference_ms - saving), reading, key="communication", name=lever_name,
                  basis=basis, **extra)


# ───────────────────────── drafting ─────────────────────────

@dataclass(frozen=True)
class DraftingInputs:
    """Everything the drafting lever receives (from the drafting analysis, ``tracekit.analyses.drafting``, and the
    breakdown): the draft work's exclusive time (``draft_ms``: ``per_step_ms.drafting``; None for whole-graph
    captures), the draft phases' wall time, how drafting was found and on what evidence, the verify forward's
    cost, the accept length, the batch, the host time between steps, and the words of a tok/s figure."""

    draft_ms: float | None
    phase_ms: float
    detection: str
    evidence: tuple[str, ...]
    verify: VerifyCost | None
    accept_len: float | None
    batch: float
    between_steps_ms: float
    tok_s_unit: str


def drafting_keys(f: StepFacts) -> dict:
    """``advice.drafting``'s detection, its evidence and what speculation was recognised (contract, Additions to
    /3): ``speculative``, ``draft_model``, ``verify_tokens`` (null where nothing says)."""
    sp = f.speculation
    evidence = list(f.draft_evidence)
    keys = {"speculative": None, "draft_model": None, "verify_tokens": None}
    if sp is not None:
        evidence += [e for e in sp.evidence if e not in evidence]
        keys = sp.to_fields()
    return {"detection": f.draft_detection, "evidence": evidence, **keys}


def drafting_inputs(f: StepFacts) -> DraftingInputs:
    """The drafting lever's inputs, gathered in one place from the measured facts."""
    return DraftingInputs(draft_ms=f.per_step_ms.get("drafting"), phase_ms=f.draft_phase_ms,
                          detection=f.draft_detection, evidence=tuple(f.draft_evidence), verify=f.verify,
                          accept_len=f.accept_len, batch=f.tokens_per_step,
                          between_steps_ms=f.gaps.get("between_steps", 0.0), tok_s_unit=f.tok_s_unit)


def drafting_lever(f: StepFacts) -> Lever:
    """What speculative decoding costs per step and, with an accept length, tokens/s with and without it.
    Without an accept length the saving is unknown (``max_saving_ms`` null, extension key ``missing_flag``
    naming the flag that resolves it)."""
    from tracekit.analyses.drafting import NOT_DETECTED_VERDICT, OFF_EVIDENCE

    d = drafting_inputs(f)
    draft = d.draft_ms
    det = drafting_keys(f)
    if draft is None:
        return _lever(f, False, None, Statement("drafting cannot be measured: graph work has no per-kernel rows"),
                      key="drafting", **det)
    if OFF_EVIDENCE in d.evidence:
        return _lever(f, False, None, Statement(f"drafting not detected: {OFF_EVIDENCE}"), key="drafting", **det)
    if d.detection == "not_detected" or draft <= 0:
        if det.get("speculative") is True:
            return _speculative_undrafted(f, d, det)
        return _lever(f, False, None, Statement(NOT_DETECTED_VERDICT), key="drafting", **det)
    # The draft phase costs its wall time on the GPU timeline, launch gaps between its kernels included.
    phase = max(draft, min(d.phase_ms, f.traced_ms))
    how = {"ranges": "draft ranges", "engine": "the engine's own records", "structure": "the step's structure",
           "kernels": "speculative kernels"}[d.detection]
    plain, plain_basis = _plain_step(f, d, phase)
    acc = d.accept_len
    ref = _reference(f)
    if acc:
        spec_tps = acc * d.batch / f.reference_ms * 1000
        plain_tps = d.batch / plain * 1000 if plain > 0 else None
        saving = f.reference_ms - acc * plain
        basis = "upper_bound" if f.upper_bounds else "estimated"
        reading = DraftCost(phase_ms=phase, draft_ms=draft, how=how, plain_ms=plain, plain_basis=plain_basis,
                            accept_len=acc, spec_tok_s=spec_tps, plain_tok_s=plain_tps, unit=d.tok_s_unit)
        return Lever(applicable=True, predicted_step_ms=plain, max_saving_ms=saving,
                     max_saving_fraction=saving / f.reference_ms if f.reference_ms else None, extra=det, basis=basis,
                     assumed=(f"accept length {acc:g}",), reading=reading, reference=ref, name=LEVER_NAMES["drafting"])
    reading = DraftCost(phase_ms=phase, draft_ms=draft, how=how, plain_ms=plain, plain_basis=plain_basis,
                        unit=d.tok_s_unit)
    return Lever(applicable=True, predicted_step_ms=plain, max_saving_ms=None, max_saving_fraction=None,
                 extra={**det, "missing_flag": "--accept-len"}, basis="unknown", needs=("--accept-len",),
                 reading=reading, reference=ref, name=LEVER_NAMES["drafting"])


def _speculative_undrafted(f: StepFacts, d: DraftingInputs, det: dict) -> Lever:
    """Speculation recognised, its drafting time not measured (contract, "One story": ``speculative: true`` never
    renders "not detected"): the verdict says which is missing, and the plain step is still predicted from the verify
    forward where the steps show one (``predicted_step_ms``; the saving needs the drafting time and an accept
    length, so it stays null)."""
    if det.get("draft_model") is False:
        missing = ("the proposals come without a draft model (n-gram / prompt lookup from the host), so there is no "
                   "draft forward to time: drafting is the upload of the host's proposals")
    else:
        missing = ("its drafting time is not measured: no draft ranges (--draft-range REGEX), no draft forwards "
                   "of a smaller model between the verify forwards, and no speculative kernels by name")
    text = f"speculative decoding recognised, but {missing}"
    plain = None
    if d.verify is not None:
        plain, basis = _plain_step(f, d, 0.0)
        text += f"; without speculation a step would take ≈{plain:.3f} ms ({basis})"
    return Lever(applicable=False, predicted_step_ms=plain, max_saving_ms=None, max_saving_fraction=None,
                 extra=det, basis="none", reading=Statement(text), reference=_reference(f),
                 name=LEVER_NAMES["drafting"])


def _plain_step(f: StepFacts, d: DraftingInputs, phase: float) -> tuple[float, str]:
    """The predicted step without speculation and its basis, a phrase for the verdict
    (``tracekit.analyses.drafting.plain_step``: the verify forward re-costed at one token, kernel by kernel)."""
    from tracekit.analyses.drafting import plain_step

    ms, basis, _ = plain_step(d.verify, traced_ms=f.traced_ms, reference_ms=f.reference_ms,
                              unprofiled=bool(f.reference_source), between_ms=d.between_steps_ms,
                              draft_phase_ms=phase)
    return ms, basis


# ───────────────────────── the floor ─────────────────────────

def floor_of(f: StepFacts) -> Floor | None:
    """The floor the step is compared with, and whether it is bound there — decided here, once, for the memory
    lever, the order of the verdicts and the headline: the larger of the memory floor (the bytes a step reads at
    peak bandwidth) and the compute floor (its FLOPs at peak FLOP/s, where the roofline knows them: ``floor_kind``),
    bound when the step is at ``MEMORY_BOUND`` of it or more (and its kernels are seen one by one). None without a
    floor (inputs missing, or the roofline refused)."""
    if f.roofline_refused or f.floor_ms is None:
        return None
    frac = f.floor_ms / f.reference_ms if f.reference_ms else 0
    bound = (frac >= MEMORY_BOUND and f.per_step_ms.get("gemm") is not None and f.decode_advice
             and f.phase not in ("prefill", "training"))
    return Floor(kind=f.floor_kind, ms=f.floor_ms, bound=bound)


def memory_lever(f: StepFacts, floor: Floor | None = None) -> Lever:
    floor = floor if floor is not None else floor_of(f)
    if f.roofline_refused:
        return _lever(f, False, None, Statement(f"no memory-bandwidth verdict: the roofline inputs are wrong: "
                                                f"{f.roofline_refused}"), key="memory_bandwidth",
                      needs=("--tp", "--model", "--weight-bytes", "--tokens-per-step"))
    if floor is None:
        needs = ("--model", "--weight-bytes") if f.weight_bytes_per_step is None else ("--peak-bw",)
        return _lever(f, False, None, Statement(
            "weight bytes or peak bandwidth unknown: pass --model PATH (or --weight-bytes N) and --peak-bw to "
            "compare the step with the memory-bandwidth floor"), key="memory_bandwidth", needs=needs)
    kv = f.kv_bytes_per_step
    peak = f.peak_bw_gbps
    assumed = tuple(x for x in (f"weights from {f.weight_bytes_source}" if f.weight_bytes_source else "",
                                f"KV cache from {f.kv_bytes_source}" if kv and f.kv_bytes_source else "",
                                f"peak {peak:,.0f} GB/s" if peak else "") if x)
    rest = sorted(((k, v) for k, v in {**f.gaps, **{k: v for k, v in f.per_step_ms.items()
                                                    if k not in ("gemm", *GAP_CATEGORIES)}}.items() if v),
                  key=lambda kv_: -kv_[1])[:2]
    reading = FloorReading(
        floor=floor, weight_bytes=f.weight_bytes_per_step or 0, weight_source=f.weight_bytes_source, kv_bytes=kv,
        kv_source=f.kv_bytes_source, peak_gbps=peak, gemm_gbps=f.gemm_achieved_bw_gbps,
        attention_gbps=f.attention_achieved_bw_gbps if kv else None,
        main="weights" if not kv or kv < (f.weight_bytes_per_step or 0) else "the KV cache",
        memory_floor_ms=f.memory_floor_ms, peak_tflops=f.peak_tflops, gemm_tflops=f.gemm_achieved_tflops,
        rest=tuple((gap_name(f, k), v) for k, v in rest))
    return _lever(f, True, floor.ms, reading, key="memory_bandwidth", assumed=assumed)


# ───────────────────────── the advice ─────────────────────────

def not_decode(f: StepFacts) -> Advice:
    why = f.phase_note or (f"{f.phase} steps: decode advice does not apply (the split above still holds)")
    extra = {"drafting": drafting_keys(f),
             "communication": _comm_measures(f)}
    levers = {k: Lever(False, None, None, None, extra=extra.get(k, {}), reading=Statement(why),
                       reference=_reference(f), name=LEVER_NAMES[k]) for k in ALL_LEVERS}
    return Advice(levers=levers, ranked=(), order=_order(levers, (), None), headline=headline(f, levers, (), None))


def _order(levers: Mapping[str, Lever], ranked: tuple[str, ...], floor: Floor | None) -> tuple[str, ...]:
    """Every lever in the order a report lists them: the ranked ones first, then the rest, memory bandwidth last —
    or first, when the step is bound at its floor (that is the verdict)."""
    rest = [k for k in ALL_LEVERS if k not in ranked and k != "memory_bandwidth"]
    if floor is not None and floor.bound:
        return ("memory_bandwidth", *ranked, *rest)
    return (*ranked, *rest, "memory_bandwidth")


def advise(f: StepFacts) -> Advice:
    """Every lever for the measured facts ``f``, each checked on its fields (``verdicts.check``: what it finds is
    in ``problems``, the lever is never withheld); ``ranked`` = the applicable levers with a positive saving,
    largest first (memory bandwidth is context, never ranked; a negative drafting saving means speculation pays);
    ``order``, ``bound_by`` and ``headline``: what every report shows first, decided here."""
    if not f.decode_advice or f.phase in ("prefill", "training"):
        return not_decode(f)
    floor = floor_of(f)
    levers = {
        "cuda_graphs": cuda_graphs_lever(f),
        "communication": communication_lever(f),
        "host_work": host_work_lever(f),
        "drafting": drafting_lever(f),
        "memory_bandwidth": memory_lever(f, floor),
    }
    problems = tuple(f"advice.{k}: {p}" for k, v in levers.items() for p in check(v, f.peak_bw_gbps))
    ranked = tuple(sorted((k for k, v in levers.items() if v.applicable and (v.max_saving_ms or 0) > 0
                           and k != "memory_bandwidth"), key=lambda k: -(levers[k].max_saving_ms or 0)))
    bound_by = floor.kind if floor is not None and floor.bound else None
    return Advice(levers=levers, ranked=ranked, order=_order(levers, ranked, floor), bound_by=bound_by,
                  headline=headline(f, levers, ranked, bound_by), problems=problems)


def headline(f: StepFacts, levers: Mapping[str, Lever], ranked: tuple[str, ...], bound_by: str | None) -> Headline:
    """The one-line summary, as data: the step and its time base, where most of the traced step goes, the top lever
    (every saving an upper bound without an unprofiled time), the levers whose saving is unknown with the flag that
    resolves them, and the ceiling (or why there is none)."""
    traced = f.traced_ms
    shares = {k: v for k, v in f.per_step_ms.items() if v and k not in GAP_CATEGORIES}
    shares.update({k: v for k in GAP_CAUSES if (v := f.gaps[k])})
    parts = ()
    if traced and shares:
        parts = tuple((gap_name(f, k), shares[k] / traced) for k in sorted(shares, key=lambda k: -shares[k])[:2])
    unprofiled = f.reference_ms if f.reference_source else None
    base = dict(traced_ms=traced, unprofiled_ms=unprofiled, unprofiled_source=f.reference_source,
                host_bound=unprofiled is None and host_bound(f.per_step_ms, traced), busy_ms=f.busy_ms, parts=parts,
                small=SMALL_SAVING)
    if f.phase in ("prefill", "training") or not f.decode_advice:
        return Headline(**base, no_advice=f.phase_label or f.phase)
    top, strong = None, False
    if ranked:
        lever = levers[ranked[0]]
        # (the step with the lever pulled, in the unit of the step it is stated against: drafting's
        # predicted_step_ms is one plain step of one token a sequence, its saving is per step's worth of tokens)
        predicted, per = lever.predicted_step_ms, None
        if ranked[0] == "drafting" and lever.max_saving_ms is not None:
            predicted = f.reference_ms - lever.max_saving_ms
            acc = getattr(lever.reading, "accept_len", None)
            per = f"for the same {acc:.2f} tokens a sequence" if acc else "for the same tokens"
        top = TopLever(name=lever.name, saving_ms=lever.max_saving_ms, fraction=lever.max_saving_fraction or 0,
                       bound=lever.bound, predicted_ms=predicted, per=per)
        strong = (lever.max_saving_fraction or 0) >= SMALL_SAVING
    # levers whose saving an input would make known: drafting always, memory bandwidth when no lever is strong
    unknown = []
    for k, v in levers.items():
        if not v.unknown or (k == "memory_bandwidth" and (strong or f.roofline_refused)):
            continue
        share = f.per_step_ms.get(k) if k in f.per_step_ms else None  # (levers named after a category: its share)
        if k == "drafting" and share:  # the draft phase's wall time, its launch gaps included (as its verdict)
            share = max(share, min(f.draft_phase_ms, traced))
        unknown.append((k.replace("_", " "), share / traced if share and traced else None, v.needs))
    ceiling = None
    if f.fraction_of_ceiling is not None and f.ceiling_tokens_per_s is not None:
        ceiling = (f.fraction_of_ceiling, f.ceiling_tokens_per_s, f.ceiling_unit)
    return Headline(**base, top=top, strong=strong, unknown=tuple(unknown),
                    refused=", ".join(f.roofline_check) if f.roofline_refused else None, ceiling=ceiling,
                    bound_by=bound_by, ceiling_kind=f.floor_kind)


__all__ = ["advise", "check", "floor_of", "drafting_inputs", "Advice", "Lever", "StepFacts", "DraftingInputs",
           "DEFAULT_REPLAY_GAP_US", "GRAPHED_SHARE", "MEMORY_BOUND", "SMALL_SAVING", "ALL_LEVERS", "BASES",
           "LEVER_EXTENSIONS", "PEAK_TOLERANCE", "pct", "saving_text", "gap_name", "headline", "host_bound",
           "cuda_graphs_lever", "host_work_lever", "communication_lever", "drafting_lever", "memory_lever"]
