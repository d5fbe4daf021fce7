"""Advice: which lever (CUDA graphs, faster collectives, host work, drafting, fewer bytes) is worth pulling.

:func:`advise` is pure: it takes the facts a breakdown measured (:class:`StepFacts`) and returns an
immutable :class:`Advice`. Each lever has ``predicted_step_ms`` (the step with that lever pulled as far as it
goes, an UNPROFILED time), ``max_saving_ms`` = ``reference_step_ms`` - predicted, ``max_saving_fraction`` and a
verdict sentence. The reference is the time base (``tracekit.analyses.timebase``): the unprofiled step when
known (flag, then manifest), else the traced step.

A verdict is data before it is prose. Each :class:`Lever` carries its saving, the *basis* of that saving
(:data:`BASES`: ``measured``, ``estimated``, ``upper_bound`` — every saving without an unprofiled time —,
``unknown`` when an input is missing, with ``needs`` naming the flag that resolves it, ``none`` when the lever
does not apply), the inputs it ``assumed``, and the name the headline gives it (``tracekit.categories``
LEVER_NAMES: what pulling it removes). The sentence's saving clause is rendered from those fields by one function
(:func:`saving_text`: "at most 0.804 ms" for an upper bound, "≈0.804 ms" otherwise), and :func:`check` refuses a
lever whose sentence states an unhedged upper bound or a bandwidth above the GPU's peak before it is printed.

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

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from tracekit.categories import GAP_CATEGORIES, GAP_CAUSES, HOST_WORK_NAMES, LEVER_NAMES, LEVERS
from tracekit.contract import Block, flattened, internal
from tracekit.tokens import tok_s_unit

if TYPE_CHECKING:  # pragma: no cover
    from tracekit.analyses.drafting import VerifyCost
    from tracekit.analyses.timebase import TimeBase

# Per-node cost of graph replay (µs) when no device profile is given. Calibrated on the H200 with
# sample_traces/synthetic-eager (busy 0.912 ms, 227 launches per step) against the unprofiled
# graph-replay step of the same loop (1.0438 ms): (1.0438 - 0.912) / 227 = 0.58 µs.
DEFAULT_REPLAY_GAP_US = 0.58
GRAPHED_SHARE = 0.8  # contract: not applicable when >= 80% of kernel time is graph replay
SMALL_SAVING = 0.05  # a lever that saves less than this share of the step "would save little"
NAMED_PART = 0.05  # a part of a gap under this share of the traced step is not named in a verdict
MEMORY_BOUND = 0.7  # fraction of the bandwidth floor from which a step is called memory-bound
PEAK_TOLERANCE = 1.05  # a bandwidth above this x the peak is impossible (tracekit.analyses.roofline)
# Levers in display order (the contract's advice keys).
ALL_LEVERS = LEVERS
# The basis of a lever's max_saving_ms.
BASES = ("measured", "estimated", "upper_bound", "unknown", "none")
EPS_MS = 0.0005  # savings below this (0.5 µs) are none
# The extension keys a lever may carry beside the contract's (``Lever.extra``), in the order they are written:
# drafting's detection and its evidence (and the flag its unknown saving needs); communication's measures
# (hidden time, transfer and wait, the kinds and the collectives), its name and the collectives' implementation cost.
LEVER_EXTENSIONS = ("detection", "evidence", "missing_flag", "hidden_communication_ms", "transfer_ms", "wait_ms",
                    "split_basis", "by_kind", "collectives", "lever_name", "staging_ms", "graph_node_ms",
                    "implementation_cost_ms", "free_allreduce_step_ms")


@dataclass(frozen=True)
class Lever(Block):
    """One lever of ``advice`` (a :class:`tracekit.contract.Block`: ``to_dict()`` is its JSON); ``extra`` holds
    its extension keys (each one of :data:`LEVER_EXTENSIONS`, written after ``verdict``; e.g. ``detection``).

    ``name``: how the headline calls pulling it (not in the JSON); ``basis`` (:data:`BASES`) of ``max_saving_ms``;
    ``assumed``: the inputs the saving rests on; ``needs``: the flags that would make an unknown saving known."""

    applicable: bool
    predicted_step_ms: float | None
    max_saving_ms: float | None
    max_saving_fraction: float | None
    verdict: str
    extra: dict = flattened(LEVER_EXTENSIONS, default_factory=dict)
    name: str = internal(default="")
    basis: str = "none"
    assumed: tuple[str, ...] = ()
    needs: tuple[str, ...] = ()

    @property
    def unknown(self) -> bool:
        """A saving that an input the user can give would make known."""
        return self.basis == "unknown" and bool(self.needs)


@dataclass(frozen=True)
class Advice(Block):
    """Every lever (the contract's ``advice`` object: one key per lever of :data:`LEVERS`, in that order), and
    those worth pulling ranked by the time they would save (largest first; not in the JSON)."""

    levers: dict[str, Lever] = flattened(LEVERS, complete=True)
    ranked: tuple[str, ...] = internal(default=())


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
    longest_between: dict | None = None  # the largest between-steps gap (gaps.largest entry)
    longest_in_step: dict | None = None  # the largest gap inside a step (gaps.largest entry)
    verify: VerifyCost | None = None  # speculative steps: the target (verify) forward (tracekit.analyses.drafting)
    draft_evidence: tuple = ()  # advice.drafting.evidence: what the detection rests on
    comm_split: object | None = None  # collectives.CommSplit: transfer against waiting, per kind (communication lever)
    roofline_refused: str | None = None  # why the roofline's figures are physically impossible (the inputs to check)
    phase_note: str | None = None  # why decode advice does not apply, right for the window (partition.phase_note)
    tok_s_unit: str = "tok/s"  # what a tok/s figure counts: the whole batch or one sequence (tracekit.tokens)
    after_waits_ms: float = 0.0  # the launch overhead after a host wait's return (tracekit.analyses.gaps.after_waits)


def pct(x: float) -> str:
    """A share as text: one decimal below 10%.

    >>> pct(0.0512), pct(0.51)
    ('5.1%', '51%')
    """
    v = 100 * x
    return f"{v:.1f}%" if abs(v) < 10 else f"{v:.0f}%"


def _base(f: StepFacts) -> str:
    """How the reference step is named in a verdict."""
    if f.reference_source:
        return f"{f.reference_ms:.3f} ms (unprofiled, {f.reference_source})"
    return f"{f.reference_ms:.3f} ms (traced)"


def saving_text(f: StepFacts, ms: float, basis: str) -> str:
    """A saving as a verdict states it: "at most 0.804 ms" when it is an upper bound (no unprofiled time, or the
    lever's own basis), "≈0.804 ms" otherwise, with its share of the reference step.

    >>> f = StepFacts(5.0, 5.0, None, True, {}, {}, {}, 4.0, 0.0, 0.0, 0.0, 0.0, 0.0, "not_detected", "decode")
    >>> saving_text(f, 0.8, "upper_bound")
    'at most 0.800 ms per step (16% of the 5.000 ms traced step)'
    """
    amount = f"at most {ms:.3f} ms" if basis == "upper_bound" else f"≈{ms:.3f} ms"
    of = (f"the {f.reference_ms:.3f} ms unprofiled step, {f.reference_source}" if f.reference_source
          else f"the {f.reference_ms:.3f} ms traced step")
    share = f"{pct(ms / f.reference_ms)} of {of}" if f.reference_ms else of
    return f"{amount} per step ({share})"


def _lever(f: StepFacts, applicable: bool, predicted: float | None, detail: str, *, key: str,
           action: str | None = None, basis: str = "estimated", name: str | None = None, assumed: tuple = (),
           needs: tuple = (), signed: bool = False, **extra) -> Lever:
    """A lever from its numbers: the saving is ``reference - predicted`` (floored at 0 unless ``signed``); its
    basis is ``upper_bound`` whenever no unprofiled time is known, ``unknown`` when it cannot be computed. With
    ``action`` ("CUDA graphs") and a positive saving the verdict starts with the rendered saving clause
    ("CUDA graphs could save at most ..."), then ``detail``."""
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
    verdict = detail
    if action and saving is not None and saving > EPS_MS and applicable:
        verb = "could save" if basis == "upper_bound" else "would save"
        verdict = f"{action} {verb} {saving_text(f, saving, basis)}" + (f": {detail}" if detail else "")
    return Lever(applicable=bool(applicable), predicted_step_ms=predicted, max_saving_ms=saving,
                 max_saving_fraction=None if saving is None or ref <= 0 else saving / ref, verdict=verdict,
                 extra=extra, name=name or LEVER_NAMES[key], basis=basis, assumed=tuple(assumed),
                 needs=tuple(needs))


def _graphed(f: StepFacts) -> bool:
    return f.graph_kernel_share >= GRAPHED_SHARE


def gap_name(f: StepFacts, cause: str) -> str:
    """A gap cause in words: in steps that replay CUDA graphs the gaps before launched work are host work before
    the graph launch (e.g. SGLang's metadata update before replay()), not launch overhead graphs would remove."""
    if cause == "launch_overhead" and _graphed(f):
        return "host work before graph launches"
    return cause.replace("_", " ")


def _longest(f: StepFacts, gap: dict | None) -> str:
    """'; the longest inside a step, 0.574 ms (...), comes before graph work, while the host was in op 'replay'' or ''."""
    if not gap:
        return ""
    before = gap.get("before")
    what = f", while the host was in {before['kind']} {before['name']!r}" if before else ""
    return (f"; the longest gap inside a step, {gap['ms']:.3f} ms ({gap_name(f, gap['cause'])}), comes before "
            f"{gap['where']} work{what}")


def cuda_graphs_lever(f: StepFacts) -> Lever:
    g = f.gaps
    if _graphed(f):
        detail = (f"steps already replay CUDA graphs ({pct(f.graph_kernel_share)} of kernel time); the traced "
                  f"step's GPU-idle time is {g['launch_overhead']:.3f} ms of host work before the graph launches "
                  "(the host preparing each replay and the launch call itself, which a profiler slows: graphs are "
                  "already in use and cannot remove it" + (
                      f"; {f.after_waits_ms:.3f} ms of it follows a host wait's return: CPU work after a "
                      "synchronisation or a device-to-host read, such as sampling, which only overlapping it with the "
                      "GPU's work removes" if f.after_waits_ms >= NAMED_PART * f.traced_ms else "")
                  + f"), {g['host_stalls']:.3f} ms of host "
                  f"stalls, {g['graph_bubbles']:.3f} ms of graph bubbles and {g['between_steps']:.3f} ms between "
                  "steps" + _longest(f, f.longest_in_step))
        return _lever(f, False, f.reference_ms, detail, key="cuda_graphs", basis="none")
    n = f.launched_per_step
    stalls = g["host_stalls"]
    kept = f.after_waits_ms
    predicted = f.busy_ms + n * f.replay_gap_us / 1000.0 + stalls + kept
    predicted = min(predicted, f.reference_ms) if f.reference_source else min(predicted, f.traced_ms)
    saving = f.reference_ms - predicted
    assumed = (f"{f.replay_gap_us:.2f} µs per replayed graph node",)
    part = f" for its eager part ({pct(1 - f.graph_kernel_share)} of kernel time)" if f.graph_kernel_share > 0.01 else ""
    if f.reference_ms and saving / f.reference_ms < SMALL_SAVING:
        return _lever(f, True, predicted,
                      f"CUDA graphs would save little: the step takes {_base(f)} against ≈{predicted:.3f} ms with "
                      f"graphs (a saving of {'at most' if f.upper_bounds else '≈'}"
                      f"{' ' if f.upper_bounds else ''}{saving:.3f} ms); " + (
                          "the GPU is already kept busy" if stalls + kept <= 0.5 * max(predicted - f.busy_ms, 0.0)
                          else f"the host work inside the step stays with graphs ({stalls:.3f} ms of host stalls, "
                          f"{kept:.3f} ms after synchronisations)"),
                      key="cuda_graphs", assumed=assumed)
    stays = f"; {stalls:.3f} ms of host stalls inside the step stay (see host work)" if stalls > EPS_MS else ""
    if kept > EPS_MS:
        stays += (f"; {kept:.3f} ms of host time after synchronisations (from a sync's or a device-to-host read's "
                  "return to the next launch) stay: a graph cannot span a host wait")
    bound = "" if f.reference_source else " (an upper bound: the traced step includes the profiler's own overhead)"
    detail = (f"the step would take about {predicted:.3f} ms with graphs{bound}: {n:.0f} launches issued one by "
              f"one become ≈{f.replay_gap_us:.2f} µs graph nodes{stays}; host work between steps is not modelled")
    return _lever(f, True, predicted, detail, key="cuda_graphs", action=f"CUDA graphs{part}", assumed=assumed)


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
        return _lever(f, False, f.reference_ms, "the GPU never waits for host work in or between steps (no host "
                      "stalls, nothing between steps)", key="host_work", name=name, basis="measured")
    saving, assumed = traced, ()
    # With an unprofiled step: the traced host time scaled to it, and no more than what that step leaves besides
    # its GPU work, the bubbles of its graphs and the bare cost of its launches (the rest is profiler overhead).
    room = f.reference_ms - f.busy_ms - g["graph_bubbles"] - f.launched_per_step * f.replay_gap_us / 1000.0
    if f.reference_source and f.traced_ms:
        scale = min(1.0, f.reference_ms / f.traced_ms)
        saving = min(traced * scale, max(0.0, room))
        assumed = (f"host time scaled to the unprofiled step (x{scale:.2f})",)
    where = []
    if hs > EPS_MS:
        where.append(f"{hs:.3f} ms of host stalls inside the step (synchronisations, blocking copies, CPU work)")
    if bs > EPS_MS:
        b = f.longest_between
        what = ""
        if b and b.get("before"):
            what = f" (the longest while the host was in {b['before']['kind']} {b['before']['name']!r})"
        where.append(f"{bs:.3f} ms of host work between steps{what}")
    detail = (f"in the traced step the GPU waits for {' and '.join(where)}; move it off the critical path (overlap "
              "it with GPU work, make it asynchronous)")
    if f.reference_source and saving <= EPS_MS:
        detail += ("; the unprofiled step leaves no time besides its GPU work, graph bubbles and launches: all of it "
                   "is the profiler's own overhead")
    elif f.reference_source and saving < traced - EPS_MS:
        detail += (f"; on the unprofiled step that is at most {saving:.3f} ms (it leaves {max(0.0, room):.3f} ms "
                   "besides its GPU work): the rest is the profiler's own overhead")
    action = {"both": "removing the host stalls and the host work between steps",
              "host_stalls": "removing the host stalls inside the step",
              "between_steps": "removing the host work between steps"}[which]
    return _lever(f, saving > EPS_MS, max(f.busy_ms, f.reference_ms - saving), detail, key="host_work", name=name,
                  action=action, basis="estimated" if f.reference_source else "upper_bound", assumed=assumed)


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
    exposed = f.per_step_ms.get("communication")
    kernel = f.kernel_ms.get("communication")
    split = f.comm_split
    if exposed is None:
        return _lever(f, False, None, "communication cannot be measured: graph work has no per-kernel rows",
                      key="communication", **_comm_measures(f))
    if not kernel:
        return _lever(f, False, f.reference_ms, "no communication kernels in the step: faster collectives cannot "
                                                "help", key="communication", basis="measured", **_comm_measures(f))
    # only compute on another stream hides communication (same-stream overlap is serialised away)
    hidden = f.hidden_comm_ms if f.hidden_comm_ms is not None else max(0.0, kernel - exposed)
    what = _kinds(split)
    lever_name = f"faster {what}"
    counts = ""
    if split is not None and split.by_kind:
        counts = " (" + ", ".join(f"{r['count_per_step']:.3g} {r['kind']}" for r in split.by_kind) + " per step)"
    hid = f"; {hidden:.3f} ms more overlaps compute on other streams" if hidden > 0.0005 else ""
    if split is not None and split.basis != "none" and split.exposed_transfer_ms is not None:
        saving = min(split.exposed_transfer_ms, exposed)
        basis = "estimated"
        if split.ranks == 1:
            verdict = (f"{split.kernel_ms:.3f} ms of communication kernels per step{counts}, all of it transfer "
                       f"({split.how}); the saving is the exposed part of the transfer{hid}")
        else:
            where = split.how if split.how else "measured across the ranks"
            verdict = (f"{split.kernel_ms:.3f} ms of communication kernels per step{counts}: ≈{split.transfer_ms:.3f} "
                       f"ms transfer and ≈{split.wait_ms:.3f} ms waiting for other ranks ({where}); the saving is the "
                       f"exposed part of the transfer{hid}")
        if split.ranks != 1 and (split.wait_ms or 0) > 0.0005:
            verdict += ("; the wait goes only by evening out the ranks' work and launch times, not by faster "
                        "collectives")
            if split.basis == "fastest-instances":
                verdict += " (analyse every rank's file together for the measured split)"
    else:
        saving = exposed
        basis = "upper_bound"
        why = f" ({split.how})" if split is not None and split.how else ""
        verdict = (f"exposed communication is {exposed:.3f} ms per step{counts}{hid}: an upper bound that includes "
                   f"waiting for other ranks{why}")
    cost = f.comm_overheads
    if cost and (cost["staging_ms"] > 0 or cost["node_ms"] > 0):
        parts = [f"its staging copies ({cost['staging_ms']:.3f} ms)"] if cost["staging_ms"] > 0 else []
        if cost["node_ms"] > 0:
            parts.append(f"{cost['nodes_per_step']:.0f} graph nodes ({cost['node_ms']:.3f} ms)")
        verdict += (f"; counting {' and '.join(parts)}, the {what} costs "
                    f"{saving + cost['staging_ms'] + cost['node_ms']:.3f} ms per step")
    from tracekit.analyses.collectives import collectives_verdict

    about = collectives_verdict(list(f.collectives))
    if about:
        # the largest collective: latency-bound (one-shot / custom all-reduce, fewer calls) or its bus bandwidth
        verdict += "; " + about
    extra = _comm_measures(f)
    extra["hidden_communication_ms"] = hidden
    extra["lever_name"] = lever_name
    if cost:
        # extension keys: the collectives' cost with their staging copies and graph nodes
        total = saving + cost["staging_ms"] + cost["node_ms"]
        extra.update(staging_ms=cost["staging_ms"], graph_node_ms=cost["node_ms"], implementation_cost_ms=total,
                     free_allreduce_step_ms=max(0.0, f.reference_ms - total))
    return _lever(f, True, max(0.0, f.reference_ms - saving), verdict, key="communication", action=lever_name,
                  name=lever_name, basis=basis, **extra)


def drafting_lever(f: StepFacts) -> Lever:
    """What speculative decoding costs per step and, with an accept length, tokens/s with and without it.
    Without an accept length the saving is unknown (``max_saving_ms`` null, extension key ``missing_flag``
    naming the flag that resolves it)."""
    from tracekit.analyses.drafting import NOT_DETECTED_VERDICT, OFF_EVIDENCE

    draft = f.per_step_ms.get("drafting")
    det = {"detection": f.draft_detection, "evidence": list(f.draft_evidence)}
    if draft is None:
        return _lever(f, False, None, "drafting cannot be measured: graph work has no per-kernel rows",
                      key="drafting", **det)
    if OFF_EVIDENCE in f.draft_evidence:
        return _lever(f, False, None, f"drafting not detected: {OFF_EVIDENCE}", key="drafting", **det)
    if f.draft_detection == "not_detected" or draft <= 0:
        return _lever(f, False, None, NOT_DETECTED_VERDICT, key="drafting", **det)
    # The draft phase costs its wall time on the GPU timeline, launch gaps between its kernels included.
    phase = max(draft, min(f.draft_phase_ms, f.traced_ms))
    how = {"ranges": "draft ranges", "structure": "the step's structure", "kernels": "speculative kernels"}[
        f.draft_detection]
    verdict = (f"the draft phase takes {phase:.3f} ms of the traced step ({pct(phase / f.traced_ms)}; found from "
               f"{how})")
    if phase > draft * 1.05:
        verdict += f", {draft:.3f} ms of it GPU work"
    plain, basis = _plain_step(f, phase)
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
        hedge = "upper_bound" if f.upper_bounds else "estimated"
        if saving > EPS_MS:
            verdict += f"; dropping speculation {'could' if f.upper_bounds else 'would'} save " + saving_text(
                f, saving, hedge) + " of tokens"
        return Lever(applicable=True, predicted_step_ms=plain, max_saving_ms=saving,
                     max_saving_fraction=saving / f.reference_ms if f.reference_ms else None, verdict=verdict,
                     extra=det, name=LEVER_NAMES["drafting"], basis=hedge, assumed=(f"accept length {acc:g}",))
    verdict += (f"; without speculation a step would take ≈{plain:.3f} ms ({basis}); saving unknown: pass "
                "--accept-len X (mean tokens accepted per step, the bonus token included) to compare tokens/s with "
                "and without speculation")
    return Lever(applicable=True, predicted_step_ms=plain, max_saving_ms=None, max_saving_fraction=None,
                 verdict=verdict, extra={**det, "missing_flag": "--accept-len"}, name=LEVER_NAMES["drafting"],
                 basis="unknown", needs=("--accept-len",))


def _plain_step(f: StepFacts, phase: float) -> tuple[float, str]:
    """The predicted step without speculation and its basis (a phrase for the verdict).

    Without speculation a step is one target forward over one token per sequence, plus the host time between
    steps: the verify forward with its GPU work re-costed at one token (by the draft model's own (K+1)- against
    1-token forward where the step has both) — its launch gaps stay as they are. With an unprofiled step (flag or
    manifest) that traced figure is scaled to it; without one, the gaps the profiler's per-node tracing adds inside
    the verify forward's CUDA graphs are taken out (re-costed at the unprofiled per-node gap) and the host gaps stay
    as traced (the profiler's host overhead stays in them). Without a verify forward (no draft model visible in the
    steps): the step without its draft phase, an upper bound."""
    from tracekit.analyses.drafting import UNPROFILED_NODE_GAP_US

    scale = f.reference_ms / f.traced_ms if f.traced_ms else 1.0
    v = f.verify
    if not v:
        return ((f.traced_ms - phase) * scale,
                "the step without its draft phase, verify forward kept at K+1 tokens: an upper bound")
    factor = v.token_factor or 1.0
    recost = v.busy_ms * (1 - 1 / factor)
    between = f.gaps.get("between_steps", 0.0)
    basis = (f"the verify forward ({v.verify_ms:.3f} ms traced, {v.busy_ms:.3f} ms of it GPU work) with its GPU work "
             f"re-costed at one token (÷{factor:.2f}, the draft model's own (K+1)- against 1-token forward)"
             if v.token_factor else f"the verify forward ({v.verify_ms:.3f} ms traced) kept at K+1 tokens")
    basis += ", plus the host time between steps"
    upper = ("; an upper bound: no draft forward over K+1 tokens to re-cost the verify forward by"
             if not v.token_factor else "")
    if f.reference_source:
        return (v.verify_ms - recost + between) * scale, f"{basis}, scaled to the unprofiled step{upper}"
    fix = max(0.0, v.graph_gap_ms - v.unprofiled_graph_gap_ms)
    if fix > 0:
        basis += (f"; its {v.graph_nodes:.0f} graph nodes' gaps at {UNPROFILED_NODE_GAP_US:g} µs each unprofiled "
                  f"instead of the traced {1e3 * v.graph_gap_ms / v.graph_nodes:.2f} µs")
    return (v.verify_ms - recost - fix + between,
            f"{basis}; host gaps and the time between steps as traced (no unprofiled time: the profiler's host "
            f"overhead stays in them){upper}")


def memory_lever(f: StepFacts) -> Lever:
    floor = f.floor_ms
    if f.roofline_refused:
        return _lever(f, False, None, f"no memory-bandwidth verdict: the roofline inputs are wrong: "
                      f"{f.roofline_refused}", key="memory_bandwidth",
                      needs=("--tp", "--model", "--weight-bytes", "--tokens-per-step"))
    if floor is None:
        needs = ("--model", "--weight-bytes") if f.weight_bytes_per_step is None else ("--peak-bw",)
        return _lever(f, False, None, "weight bytes or peak bandwidth unknown: pass --model PATH (or --weight-bytes "
                                      "N) and --peak-bw to compare the step with the memory-bandwidth floor",
                      key="memory_bandwidth", needs=needs)
    ref = f.reference_ms
    frac = floor / ref if ref else 0
    gemm = f.per_step_ms.get("gemm")
    peak = f.peak_bw_gbps
    kv = f.kv_bytes_per_step

    def src(s: str | None) -> str:
        return f" ({s})" if s else ""

    streams = (f"{(f.weight_bytes_per_step or 0) / 1e9:.2f} GB of weights{src(f.weight_bytes_source)}"
               + (f" and {kv / 1e9:.2f} GB of KV cache{src(f.kv_bytes_source)}" if kv else "") + " per GPU")
    assumed = tuple(x for x in (f"weights from {f.weight_bytes_source}" if f.weight_bytes_source else "",
                                f"KV cache from {f.kv_bytes_source}" if kv and f.kv_bytes_source else "",
                                f"peak {peak:,.0f} GB/s" if peak else "") if x)
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
        rest_ms = ref - floor
        amount = f"at most {rest_ms:.3f} ms" if f.upper_bounds else f"{rest_ms:.3f} ms"
        verdict = (f"the step takes {_base(f)} against a floor of {floor:.3f} ms for reading {streams} ({pct(frac)} "
                   f"of it): {amount} per step are not spent reading memory")
        rest = sorted(((k, v) for k, v in {**f.gaps, **{k: v for k, v in f.per_step_ms.items()
                                                        if k not in ("gemm", *GAP_CATEGORIES)}}.items() if v),
                      key=lambda kv_: -kv_[1])[:2]
        if rest:
            verdict += "; the largest other parts of the traced step: " + ", ".join(
                f"{gap_name(f, k)} {v:.3f} ms" for k, v in rest)
        verdict += near_txt
    return _lever(f, True, floor, verdict, key="memory_bandwidth", assumed=assumed)


def not_decode(f: StepFacts) -> Advice:
    why = f.phase_note or (f"{f.phase} steps: decode advice does not apply (the split above still holds)")
    extra = {"drafting": {"detection": f.draft_detection, "evidence": list(f.draft_evidence)},
             "communication": _comm_measures(f)}
    levers = {k: Lever(False, None, None, None, why, extra.get(k, {}), name=LEVER_NAMES[k]) for k in ALL_LEVERS}
    return Advice(levers=levers, ranked=())


_GBPS = re.compile(r"(\d[\d,]*(?:\.\d+)?) GB/s")
_OF_PEAK = re.compile(r"(\d+(?:\.\d+)?)% of peak")
_HEDGE = ("at most", "≤")


def check(lever: Lever, f: StepFacts) -> list[str]:
    """What makes ``lever`` unfit to print (empty when it holds): an upper-bound saving stated without "at most"
    or "≤"; a memory bandwidth above the GPU's peak (x ``PEAK_TOLERANCE``) or above 100% of it, in its verdict; a
    saving larger than the reference step."""
    problems = []
    s = lever.max_saving_ms
    if lever.basis == "upper_bound" and s is not None and s > EPS_MS and not any(h in lever.verdict for h in _HEDGE):
        problems.append(f"its saving ({s:.3f} ms) is an upper bound but the verdict does not say so")
    if s is not None and s > f.reference_ms * (1 + 1e-9) + EPS_MS:
        problems.append(f"its saving ({s:.3f} ms) exceeds the {f.reference_ms:.3f} ms step")
    peak = f.peak_bw_gbps
    if peak:
        for m in _GBPS.finditer(lever.verdict):
            ctx = lever.verdict[max(0, m.start() - 40):m.end() + 40]
            if float(m.group(1).replace(",", "")) > PEAK_TOLERANCE * peak and "bus bandwidth" not in ctx:
                problems.append(f"it states {m.group(0)}, above the GPU's {peak:,.0f} GB/s peak")
    for m in _OF_PEAK.finditer(lever.verdict):
        if float(m.group(1)) > 100 * PEAK_TOLERANCE:
            problems.append(f"it states {m.group(0)}")
    return problems


def _refuse(lever: Lever, problems: list[str]) -> Lever:
    return replace(lever, applicable=False, max_saving_ms=None, max_saving_fraction=None, basis="unknown",
                   verdict=f"verdict withheld ({'; '.join(problems)}): {lever.name} not assessed")


def advise(f: StepFacts) -> Advice:
    """Every lever for the measured facts ``f``, each checked (:func:`check`) before it is returned; ``ranked`` =
    the applicable levers with a positive saving, largest first (memory bandwidth is context, never ranked; a
    negative drafting saving means speculation pays)."""
    if not f.decode_advice or f.phase == "prefill":
        return not_decode(f)
    levers = {
        "cuda_graphs": cuda_graphs_lever(f),
        "communication": communication_lever(f),
        "host_work": host_work_lever(f),
        "drafting": drafting_lever(f),
        "memory_bandwidth": memory_lever(f),
    }
    levers = {k: (_refuse(v, p) if (p := check(v, f)) else v) for k, v in levers.items()}
    ranked = tuple(sorted((k for k, v in levers.items() if v.applicable and (v.max_saving_ms or 0) > 0
                           and k != "memory_bandwidth"), key=lambda k: -(levers[k].max_saving_ms or 0)))
    return Advice(levers=levers, ranked=ranked)


def headline(tb: TimeBase, per_step_ms: Mapping, gaps: Mapping, advice: Advice, roofline,
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
    if phase == "prefill" or not decode_advice:
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


__all__ = ["advise", "check", "Advice", "Lever", "StepFacts", "DEFAULT_REPLAY_GAP_US", "GRAPHED_SHARE", "ALL_LEVERS",
           "BASES", "LEVER_EXTENSIONS", "pct", "saving_text", "gap_name", "headline"]
