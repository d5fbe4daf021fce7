"""Verdicts as data: every lever of ``advice`` and the headline are typed values; their sentences are rendered from
their fields, here, once.

A :class:`Lever` carries its numbers (``predicted_step_ms``, ``max_saving_ms`` and its fraction), how sure the
saving is (``bound``: ``exact`` | ``upper_bound`` | ``unknown``, the contract's; ``basis``: :data:`BASES`, why), what
it assumed (``assumed``), the flags that would resolve an unknown saving (``needs``), the time it is stated against
(:class:`Reference`) and a *reading*: the lever's own typed facts (:class:`GraphsInUse`, :class:`GraphsPredicted`,
:class:`HostWait`, :class:`CommCost`, :class:`DraftCost`, :class:`FloorReading`, or a :class:`Statement` that has no
number of its own). ``Lever.verdict`` — the JSON's verdict string, which the table and the markdown print — is
``reading.sentence(lever)``, rendered when the lever is made; the saving clause of every sentence comes from one
function (:func:`saving_text`) fed by the lever's ``max_saving_ms`` and ``bound``, so an upper bound is worded as one
("at most ...") by construction. :class:`Headline` is the one-line summary, as data: its ``text`` is what every
format starts with.

:func:`check` tests a lever's FIELDS, never its wording: ``bound`` agrees with the saving and the time base (no
unprofiled time: an upper bound), the saving is no larger than the step it is stated against, and no bandwidth the
reading states (:meth:`Reading.bandwidths`) is above the GPU's peak. It never withholds a verdict: what it finds
is reported (``tracekit.analyses.advice.advise`` turns it into a warning), and the tests require it to find nothing
on every shipped and shared trace.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from tracekit.analyses.resolve import PEAK_TOLERANCE, above_peak
from tracekit.categories import LEVERS
from tracekit.contract import Block, flattened, internal

Bound = Literal["exact", "upper_bound", "unknown"]
BOUNDS: tuple[str, ...] = ("exact", "upper_bound", "unknown")
# The basis of a lever's max_saving_ms (finer than its bound): measured | estimated (exact), upper_bound, unknown
# (an input is missing: ``needs`` names it), none (the lever does not apply).
BASES = ("measured", "estimated", "upper_bound", "unknown", "none")
EPS_MS = 0.0005  # savings below this (0.5 µs) are none
# The extension keys a lever may carry beside the contract's (``Lever.extra``), in the order they are written:
# drafting's detection and its evidence (and the flag its unknown saving needs); communication's measures
# (hidden time, transfer and wait, the kinds and the collectives), its name and the collectives' implementation cost.
LEVER_EXTENSIONS = ("detection", "evidence", "speculative", "draft_model", "verify_tokens", "missing_flag", "hidden_communication_ms", "transfer_ms", "wait_ms",
                    "split_basis", "by_kind", "collectives", "lever_name", "staging_ms", "graph_node_ms",
                    "implementation_cost_ms", "free_allreduce_step_ms")


def pct(x: float) -> str:
    """A share as text: one decimal below 10%.

    >>> pct(0.0512), pct(0.51)
    ('5.1%', '51%')
    """
    v = 100 * x
    return f"{v:.1f}%" if abs(v) < 10 else f"{v:.0f}%"


@dataclass(frozen=True)
class Reference:
    """The step a saving is stated against: ``ms`` (``time_base.reference_step_ms``), its ``source`` ("flag" |
    "manifest": unprofiled; None: the traced step) and the traced step."""

    ms: float
    source: str | None
    traced_ms: float

    @property
    def unprofiled(self) -> bool:
        return self.source is not None

    def named(self) -> str:
        """How a verdict names it: '36.670 ms (unprofiled, manifest)' or '5.047 ms (traced)'."""
        if self.source:
            return f"{self.ms:.3f} ms (unprofiled, {self.source})"
        return f"{self.ms:.3f} ms (traced)"


def saving_text(ref: Reference, ms: float, bound: str) -> str:
    """A saving as a verdict states it: "at most 0.804 ms" for an upper bound, "≈0.804 ms" otherwise, with its
    share of the reference step.

    >>> saving_text(Reference(5.0, None, 5.0), 0.8, "upper_bound")
    'at most 0.800 ms per step (16% of the 5.000 ms traced step)'
    >>> saving_text(Reference(2.71, "manifest", 6.0), 0.561, "exact")
    '≈0.561 ms per step (21% of the 2.710 ms unprofiled step, manifest)'
    """
    amount = f"at most {ms:.3f} ms" if bound == "upper_bound" else f"≈{ms:.3f} ms"
    of = (f"the {ref.ms:.3f} ms unprofiled step, {ref.source}" if ref.source else f"the {ref.ms:.3f} ms traced step")
    share = f"{pct(ms / ref.ms)} of {of}" if ref.ms else of
    return f"{amount} per step ({share})"


def bound_of(saving: float | None, basis: str) -> str:
    """A saving's ``bound`` from its basis: unknown without a saving, an upper bound as its basis says, else exact."""
    if saving is None:
        return "unknown"
    return "upper_bound" if basis == "upper_bound" else "exact"


# ───────────────────────── readings: what each lever's sentence says, as data ─────────────────────────

class Reading:
    """A lever's own facts; :meth:`sentence` renders its verdict from them and the lever's common fields."""

    def sentence(self, lever: Lever) -> str:  # pragma: no cover - every reading has its own
        raise NotImplementedError

    def bandwidths(self) -> dict[str, float]:
        """The memory bandwidths (GB/s) the sentence states, by what they are (the self-check's input)."""
        return {}


@dataclass(frozen=True)
class Statement(Reading):
    """A verdict without numbers of its own (the lever does not apply, cannot be measured, an input is missing)."""

    text: str

    def sentence(self, lever: Lever) -> str:
        return self.text


@dataclass(frozen=True)
class Action(Reading):
    """A lever stated as what pulling it would do: "``action`` would save ≈X ms per step (...): ``detail``" when it
    saves something (``could save at most`` for an upper bound), else the detail alone. The base of the readings
    whose verdict names the action (:meth:`detail` renders the rest from their fields)."""

    def action(self, lever: Lever) -> str | None:
        return None

    def detail(self, lever: Lever) -> str:  # pragma: no cover - every reading has its own
        raise NotImplementedError

    def sentence(self, lever: Lever) -> str:
        detail = self.detail(lever)
        action = self.action(lever)
        s = lever.max_saving_ms
        if action and s is not None and s > EPS_MS and lever.applicable:
            verb = "could save" if lever.bound == "upper_bound" else "would save"
            return f"{action} {verb} {saving_text(lever.reference, s, lever.bound)}" + (f": {detail}" if detail else "")
        return detail


@dataclass(frozen=True)
class GapNote:
    """One named gap a verdict points at: its length, cause (in the gap table's words), where (eager | graph) and
    what the host was in (``before``: kind, name; None when nothing was recorded)."""

    ms: float
    cause: str
    where: str
    before: tuple[str, str] | None

    def clause(self) -> str:
        """'; the longest gap inside a step, 0.574 ms (...), comes before graph work, while the host was in ...'."""
        what = f", while the host was in {self.before[0]} {self.before[1]!r}" if self.before else ""
        return (f"; the longest gap inside a step, {self.ms:.3f} ms ({self.cause}), comes before {self.where} "
                f"work{what}")


@dataclass(frozen=True)
class GraphsInUse(Reading):
    """The steps already replay CUDA graphs: the GPU-idle time that remains, by cause (ms per traced step)."""

    graph_share: float
    launch_overhead_ms: float
    after_waits_ms: float | None  # the part after host waits' returns, where it is worth naming
    host_stalls_ms: float
    graph_bubbles_ms: float
    between_steps_ms: float
    longest: GapNote | None = None

    def sentence(self, lever: Lever) -> str:
        after = (f"; {self.after_waits_ms:.3f} ms of it follows a host wait's return: CPU work after a "
                 "synchronisation or a device-to-host read, such as sampling, which only overlapping it with the "
                 "GPU's work removes" if self.after_waits_ms is not None else "")
        return (f"steps already replay CUDA graphs ({pct(self.graph_share)} of kernel time); the traced "
                f"step's GPU-idle time is {self.launch_overhead_ms:.3f} ms of host work before the graph launches "
                "(the host preparing each replay and the launch call itself, which a profiler slows: graphs are "
                f"already in use and cannot remove it{after}), {self.host_stalls_ms:.3f} ms of host "
                f"stalls, {self.graph_bubbles_ms:.3f} ms of graph bubbles and {self.between_steps_ms:.3f} ms between "
                "steps" + (self.longest.clause() if self.longest else ""))


@dataclass(frozen=True)
class GraphsPredicted(Action):
    """The step with its eager launches captured in CUDA graphs: ``predicted_ms`` = GPU-busy time + ``launched``
    launches x ``replay_gap_us`` + host stalls + the launch overhead after host waits (which graphs keep).
    ``eager_share``: the eager part of the kernel time where the step is partly graphed; ``little``: the saving is
    under ``SMALL_SAVING`` of the step; ``gpu_busy``: what graphs keep is mostly not host work."""

    predicted_ms: float
    launched: float
    replay_gap_us: float
    host_stalls_ms: float
    after_waits_ms: float
    eager_share: float | None
    little: bool
    gpu_busy: bool

    def action(self, lever: Lever) -> str | None:
        if self.little:
            return None
        part = f" for its eager part ({pct(self.eager_share)} of kernel time)" if self.eager_share is not None else ""
        return f"CUDA graphs{part}"

    def detail(self, lever: Lever) -> str:
        ref, upper = lever.reference, lever.bound == "upper_bound"
        stalls, kept = self.host_stalls_ms, self.after_waits_ms
        if self.little:
            saving = lever.max_saving_ms or 0.0
            return (f"CUDA graphs would save little: the step takes {ref.named()} against ≈{self.predicted_ms:.3f} ms "
                    f"with graphs (a saving of {'at most' if upper else '≈'}{' ' if upper else ''}{saving:.3f} ms); "
                    + ("the GPU is already kept busy" if self.gpu_busy
                       else f"the host work inside the step stays with graphs ({stalls:.3f} ms of host stalls, "
                       f"{kept:.3f} ms after synchronisations)"))
        stays = f"; {stalls:.3f} ms of host stalls inside the step stay (see host work)" if stalls > EPS_MS else ""
        if kept > EPS_MS:
            stays += (f"; {kept:.3f} ms of host time after synchronisations (from a sync's or a device-to-host read's "
                      "return to the next launch) stay: a graph cannot span a host wait")
        bound = "" if ref.unprofiled else " (an upper bound: the traced step includes the profiler's own overhead)"
        return (f"the step would take about {self.predicted_ms:.3f} ms with graphs{bound}: {self.launched:.0f} "
                f"launches issued one by one become ≈{self.replay_gap_us:.2f} µs graph nodes{stays}; host work between "
                "steps is not modelled")


@dataclass(frozen=True)
class HostWait(Action):
    """Host work the GPU waits for in the traced step: ``host_stalls_ms`` inside the step, ``between_steps_ms``
    between steps (``which``: the one that matters, or both), what the host was in during the longest gap between
    steps; with an unprofiled step, ``room_ms`` = what it leaves besides its GPU work, graph bubbles and launches."""

    host_stalls_ms: float
    between_steps_ms: float
    which: str  # "host_stalls" | "between_steps" | "both"
    longest_before: tuple[str, str] | None
    room_ms: float | None  # None: no unprofiled time
    removable_ms: float  # the host time that would go: traced, or scaled to the unprofiled step and capped at room

    def action(self, lever: Lever) -> str | None:
        return {"both": "removing the host stalls and the host work between steps",
                "host_stalls": "removing the host stalls inside the step",
                "between_steps": "removing the host work between steps"}[self.which]

    def detail(self, lever: Lever) -> str:
        hs, bs = self.host_stalls_ms, self.between_steps_ms
        where = []
        if hs > EPS_MS:
            where.append(f"{hs:.3f} ms of host stalls inside the step (synchronisations, blocking copies, CPU work)")
        if bs > EPS_MS:
            what = ""
            if self.longest_before:
                what = f" (the longest while the host was in {self.longest_before[0]} {self.longest_before[1]!r})"
            where.append(f"{bs:.3f} ms of host work between steps{what}")
        detail = (f"in the traced step the GPU waits for {' and '.join(where)}; move it off the critical path (overlap "
                  "it with GPU work, make it asynchronous)")
        saving = self.removable_ms
        if self.room_ms is not None and saving <= EPS_MS:
            detail += ("; the unprofiled step leaves no time besides its GPU work, graph bubbles and launches: all of "
                       "it is the profiler's own overhead")
        elif self.room_ms is not None and saving < hs + bs - EPS_MS:
            detail += (f"; on the unprofiled step that is at most {saving:.3f} ms (it leaves {self.room_ms:.3f} ms "
                       "besides its GPU work): the rest is the profiler's own overhead")
        return detail


@dataclass(frozen=True)
class CommCost(Action):
    """The step's communication: its kernel time split into transfer and waiting for other ranks where it can be
    (``split``: ``cross-rank`` | ``fastest-instances`` | ``none``, over ``ranks`` ranks, ``how`` it was found), the
    exposed part, what other streams hide, the kinds per step, the implementation's own cost (staging copies,
    graph nodes) and what the collectives table says of the largest (``collectives_note``: latency-bound, bus
    bandwidth). ``kinds``: the kinds that hold most of the saving ("all-gather/reduce-scatter")."""

    kinds: str
    counts: tuple[tuple[float, str], ...]
    split: str
    ranks: int | None
    how: str | None
    kernel_ms: float | None
    transfer_ms: float | None
    wait_ms: float | None
    exposed_ms: float
    hidden_ms: float
    staging_ms: float = 0.0
    node_ms: float = 0.0
    nodes_per_step: float = 0.0
    cost_ms: float | None = None  # the lever's saving with the staging copies and graph nodes
    collectives_note: str | None = None

    def action(self, lever: Lever) -> str | None:
        return f"faster {self.kinds}"

    def detail(self, lever: Lever) -> str:
        counts = (" (" + ", ".join(f"{c:.3g} {k}" for c, k in self.counts) + " per step)") if self.counts else ""
        hid = f"; {self.hidden_ms:.3f} ms more overlaps compute on other streams" if self.hidden_ms > 0.0005 else ""
        if self.split != "none":
            if self.ranks == 1:
                verdict = (f"{self.kernel_ms:.3f} ms of communication kernels per step{counts}, all of it transfer "
                           f"({self.how}); the saving is the exposed part of the transfer{hid}")
            else:
                where = self.how if self.how else "measured across the ranks"
                verdict = (f"{self.kernel_ms:.3f} ms of communication kernels per step{counts}: ≈{self.transfer_ms:.3f} "
                           f"ms transfer and ≈{self.wait_ms:.3f} ms waiting for other ranks ({where}); the saving is the "
                           f"exposed part of the transfer{hid}")
            if self.ranks != 1 and (self.wait_ms or 0) > 0.0005:
                verdict += ("; the wait goes only by evening out the ranks' work and launch times, not by faster "
                            "collectives")
                if self.split == "fastest-instances":
                    verdict += " (analyse every rank's file together for the measured split)"
        else:
            why = f" ({self.how})" if self.how else ""
            verdict = (f"exposed communication is {self.exposed_ms:.3f} ms per step{counts}{hid}: an upper bound that "
                       f"includes waiting for other ranks{why}")
        if self.staging_ms > 0 or self.node_ms > 0:
            parts = [f"its staging copies ({self.staging_ms:.3f} ms)"] if self.staging_ms > 0 else []
            if self.node_ms > 0:
                parts.append(f"{self.nodes_per_step:.0f} graph nodes ({self.node_ms:.3f} ms)")
            verdict += f"; counting {' and '.join(parts)}, the {self.kinds} costs {self.cost_ms:.3f} ms per step"
        if self.collectives_note:
            verdict += "; " + self.collectives_note
        return verdict


@dataclass(frozen=True)
class DraftCost(Reading):
    """What speculative decoding costs per step: the draft phase's wall time (``phase_ms``; ``draft_ms`` of it GPU
    work) found from ``how``; the predicted plain step (``plain_ms``, ``plain_basis``: how it was predicted); with an
    accept length, tokens/s with and without speculation (``unit``: what they count)."""

    phase_ms: float
    draft_ms: float
    how: str
    plain_ms: float
    plain_basis: str
    accept_len: float | None = None
    spec_tok_s: float | None = None
    plain_tok_s: float | None = None
    unit: str = "tok/s"

    def sentence(self, lever: Lever) -> str:
        ref = lever.reference
        verdict = (f"the draft phase takes {self.phase_ms:.3f} ms of the traced step "
                   f"({pct(self.phase_ms / ref.traced_ms)}; found from {self.how})")
        if self.phase_ms > self.draft_ms * 1.05:
            verdict += f", {self.draft_ms:.3f} ms of it GPU work"
        plain = self.plain_ms
        if self.accept_len:
            if self.plain_tok_s:
                pays = "pays off" if self.spec_tok_s > self.plain_tok_s else "does not pay off"
                verdict += (f"; with {self.accept_len:.2f} tokens accepted per step speculation gives "
                            f"{self.spec_tok_s:.1f} {self.unit} against ≈{self.plain_tok_s:.1f} without it "
                            f"(≈{plain:.3f} ms per plain step: {self.plain_basis}): it {pays} (break-even at "
                            f"{ref.ms / plain:.2f} accepted tokens per step)")
            s = lever.max_saving_ms
            if s is not None and s > EPS_MS:
                verdict += (f"; dropping speculation {'could' if lever.bound == 'upper_bound' else 'would'} save "
                            + saving_text(ref, s, lever.bound) + " of tokens")
            return verdict
        return verdict + (f"; without speculation a step would take ≈{plain:.3f} ms ({self.plain_basis}); saving "
                          "unknown: pass --accept-len X (mean tokens accepted per step, the bonus token included) to "
                          "compare tokens/s with and without speculation")


@dataclass(frozen=True)
class Floor:
    """The floor a step cannot go below, as the roofline found it: ``kind`` (``memory``: the bytes it reads over
    the peak bandwidth; a compute floor — FLOPs over peak FLOP/s — plugs in as another kind), ``ms``, and whether
    the step is ``bound`` there (at least ``MEMORY_BOUND`` of it: decided once, by ``advise``)."""

    kind: str
    ms: float
    bound: bool


@dataclass(frozen=True)
class FloorReading(Reading):
    """The step against its floor (:class:`Floor`): the byte streams it reads per GPU (weights, KV cache, with their
    sources), the peak and the bandwidths the kernels reach (GB/s); ``main``: the larger stream; ``rest``: the
    largest other parts of the traced step (name, ms)."""

    floor: Floor
    weight_bytes: int
    weight_source: str | None
    kv_bytes: int | None
    kv_source: str | None
    peak_gbps: float | None
    gemm_gbps: float | None
    attention_gbps: float | None
    main: str
    rest: tuple[tuple[str, float], ...] = ()
    # a compute floor (floor.kind "compute"): the memory floor beside it, the peak and the GEMMs' TFLOP/s
    memory_floor_ms: float | None = None
    peak_tflops: float | None = None
    gemm_tflops: float | None = None

    def bandwidths(self) -> dict[str, float]:
        return {k: v for k, v in (("gemm", self.gemm_gbps), ("attention", self.attention_gbps)) if v is not None}

    def sentence(self, lever: Lever) -> str:
        def src(s: str | None) -> str:
            return f" ({s})" if s else ""

        ref, floor, peak = lever.reference, self.floor.ms, self.peak_gbps
        kv = self.kv_bytes
        frac = floor / ref.ms if ref.ms else 0
        streams = (f"{self.weight_bytes / 1e9:.2f} GB of weights{src(self.weight_source)}"
                   + (f" and {kv / 1e9:.2f} GB of KV cache{src(self.kv_source)}" if kv else "") + " per GPU")
        near = []
        if self.gemm_gbps and peak:
            near.append(f"the gemm kernels read at {pct(self.gemm_gbps / peak)} of peak")
        if kv and self.attention_gbps and peak:
            near.append(f"attention reads the KV cache at {pct(self.attention_gbps / peak)} of peak")
        near_txt = f" ({'; '.join(near)})" if near else ""
        saving = saving_text(ref, lever.max_saving_ms or 0.0, lever.bound)
        if self.floor.kind == "compute":
            flops = (f"at {self.peak_tflops:,.0f} TFLOP/s peak" if self.peak_tflops else "at peak FLOP/s")
            reach = (f" (the gemm kernels reach {self.gemm_tflops:,.0f} TFLOP/s)" if self.gemm_tflops else "")
            mem = (f", more than the {self.memory_floor_ms:.3f} ms that reading {streams} takes"
                   if self.memory_floor_ms is not None else "")
            head = (f"the step's FLOPs take {floor:.3f} ms {flops}{mem}; at {ref.named()} it is at {pct(frac)} of that "
                    f"floor{reach}")
            if self.floor.bound:
                return (f"{head}: compute-bound, with {saving} not spent computing; fewer bytes cannot help much — "
                        "fewer FLOPs per token can (a smaller model, lower precision with faster tensor cores), or "
                        "fewer tokens per step")
            return f"{head}: {saving} are not spent computing" + (
                "; the largest other parts of the traced step: " + ", ".join(f"{k} {v:.3f} ms" for k, v in self.rest)
                if self.rest else "")
        if self.floor.bound:
            return (f"the step reads {streams}; at {ref.named()} it is at {pct(frac)} of the {floor:.3f} ms floor that "
                    f"reading them at peak bandwidth takes{near_txt}: {self.floor.kind}-bound (mostly {self.main}), "
                    f"with {saving} not spent reading memory; CUDA graphs or NCCL changes cannot help much — fewer bytes "
                    "can (quantization, a smaller KV cache, batching, better acceptance)")
        verdict = (f"the step takes {ref.named()} against a floor of {floor:.3f} ms for reading {streams} "
                   f"({pct(frac)} of it): {saving} are not spent reading memory")
        if self.rest:
            verdict += "; the largest other parts of the traced step: " + ", ".join(
                f"{k} {v:.3f} ms" for k, v in self.rest)
        return verdict + near_txt


# ───────────────────────── the lever ─────────────────────────

@dataclass(frozen=True)
class Lever(Block):
    """One lever of ``advice`` (a :class:`tracekit.contract.Block`: ``to_dict()`` is its JSON): its numbers, how sure
    its saving is (``bound``, :data:`BOUNDS`: from the saving and its basis, not given), the ``verdict`` rendered
    from its fields (not given: ``reading.sentence(self)``), its extension keys (``extra``: each one of
    :data:`LEVER_EXTENSIONS`, written after ``verdict``), ``basis`` (:data:`BASES`), ``assumed`` (the inputs its
    saving rests on) and ``needs`` (the flags that would make an unknown saving known). Not in the JSON:
    ``reading``, ``reference`` (the step it is stated against) and ``name`` (how the headline calls pulling it)."""

    applicable: bool
    predicted_step_ms: float | None
    max_saving_ms: float | None
    max_saving_fraction: float | None
    bound: str = field(init=False, default="unknown")
    verdict: str = field(init=False, default="")
    extra: dict = flattened(LEVER_EXTENSIONS, default_factory=dict)
    basis: str = "none"
    assumed: tuple[str, ...] = ()
    needs: tuple[str, ...] = ()
    reading: Reading = internal(default=Statement(""), repr=False)
    reference: Reference = internal(default=Reference(0.0, None, 0.0), repr=False)
    name: str = internal(default="")

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "bound", bound_of(self.max_saving_ms, self.basis))
        object.__setattr__(self, "verdict", self.reading.sentence(self))

    @property
    def unknown(self) -> bool:
        """A saving that an input the user can give would make known."""
        return self.basis == "unknown" and bool(self.needs)


def check(lever: Lever, peak_gbps: float | None = None) -> list[str]:
    """What is wrong with ``lever``'s fields (empty when nothing is): its ``bound`` disagrees with its saving or
    with the time base (without an unprofiled time every saving is an upper bound), its saving exceeds the step it
    is stated against, or its reading states a bandwidth above ``peak_gbps`` x ``PEAK_TOLERANCE``. Tests fields,
    never wording.

    >>> ref = Reference(5.0, None, 5.0)
    >>> check(Lever(True, 4.0, 1.0, 0.2, basis="estimated", reference=ref))
    ['its saving (1.000 ms) is stated against the traced step but is not an upper bound']
    >>> check(Lever(True, 4.0, 1.0, 0.2, basis="upper_bound", reference=ref))
    []
    """
    problems = []
    s, ref = lever.max_saving_ms, lever.reference
    if lever.bound != bound_of(s, lever.basis):
        problems.append(f"its bound ({lever.bound}) disagrees with its saving ({s}) and basis ({lever.basis})")
    if s is not None and s > EPS_MS and not ref.unprofiled and lever.bound != "upper_bound":
        problems.append(f"its saving ({s:.3f} ms) is stated against the traced step but is not an upper bound")
    if s is not None and s > ref.ms * (1 + 1e-9) + EPS_MS:
        problems.append(f"its saving ({s:.3f} ms) exceeds the {ref.ms:.3f} ms step")
    if peak_gbps:
        for what, gbps in lever.reading.bandwidths().items():
            if above_peak(gbps, peak_gbps):
                problems.append(f"it states {what} reading at {gbps:,.0f} GB/s, above the GPU's {peak_gbps:,.0f} GB/s "
                                "peak")
    return problems


# ───────────────────────── the advice and its headline ─────────────────────────

@dataclass(frozen=True)
class Advice(Block):
    """Every lever (the contract's ``advice`` object: one key per lever of :data:`LEVERS`, in that order). Not in
    the JSON, decided once by ``tracekit.analyses.advice.advise``: ``ranked`` (the levers worth pulling, largest
    saving first), ``order`` (every lever in the order a report lists them), ``bound_by`` (the floor the step is
    bound at, ``memory``, or None), ``headline`` and ``problems`` (what :func:`check` found, by lever)."""

    levers: dict[str, Lever] = flattened(LEVERS, complete=True)
    ranked: tuple[str, ...] = internal(default=())
    order: tuple[str, ...] = internal(default=LEVERS)
    bound_by: str | None = internal(default=None)
    headline: Headline | None = internal(default=None)
    problems: tuple[str, ...] = internal(default=())

    @property
    def memory_bound(self) -> bool:
        return self.bound_by == "memory"


@dataclass(frozen=True)
class TopLever:
    """The headline's lever: its name, saving (ms and share of the reference step), bound and what the step would
    take with it pulled (``predicted_ms`` = the reference step − the saving, so that the two numbers the headline
    states subtract; ``per``: what that time is for when it is not one step, e.g. the same tokens without
    speculation)."""

    name: str
    saving_ms: float
    fraction: float
    bound: str
    predicted_ms: float | None
    per: str | None = None


@dataclass(frozen=True)
class Headline:
    """The one-line summary as data (:attr:`text` renders it): the step and its time base, the two largest parts of
    the traced step, the top lever (``strong``: it saves at least ``SMALL_SAVING`` of the step), the levers whose
    saving an input would make known (``unknown``: words, share of the traced step, flags), and the ceiling (its
    fraction, tok/s and their unit, and whether the step is bound there) or why there is none (``refused``: the
    inputs to check, or "" when the roofline names none)."""

    traced_ms: float
    unprofiled_ms: float | None
    unprofiled_source: str | None
    host_bound: bool
    busy_ms: float
    parts: tuple[tuple[str, float], ...]
    no_advice: str | None = None  # the phase whose steps get no decode advice
    top: TopLever | None = None
    strong: bool = False
    small: float = 0.05
    unknown: tuple[tuple[str, float | None, tuple[str, ...]], ...] = ()
    refused: str | None = None
    ceiling: tuple[float, float, str] | None = None  # (fraction, tok/s, unit)
    bound_by: str | None = None
    ceiling_kind: str = "memory"  # which floor the ceiling is: the bytes at peak bandwidth, or the FLOPs at peak

    @property
    def text(self) -> str:
        if self.unprofiled_ms is not None:
            parts = [f"step {self.unprofiled_ms:.3f} ms unprofiled ({self.unprofiled_source}; traced "
                     f"{self.traced_ms:.3f} ms)"]
        elif self.host_bound:
            parts = [f"traced step {self.traced_ms:.3f} ms, no unprofiled time: savings are upper bounds (the real "
                     f"step lies between {self.busy_ms:.3f} ms of GPU work and {self.traced_ms:.3f} ms)"]
        else:
            parts = [f"traced step {self.traced_ms:.3f} ms, no unprofiled time: savings are upper bounds"]
        if self.parts:
            parts.append(", ".join(f"{name} {pct(share)}" for name, share in self.parts) + " of the traced step")
        if self.no_advice is not None:
            parts.append(f"{self.no_advice} steps: no decode advice")
            return "; ".join(parts)
        top = None
        if self.top is not None:
            t = self.top
            if t.bound == "upper_bound":
                top = f"{t.name} → at most −{t.saving_ms:.3f} ms ({pct(t.fraction)} of the traced step)"
            else:
                per = f" {t.per}" if t.per else ""
                top = f"{t.name} → ≈{t.predicted_ms:.3f} ms{per} (−{t.saving_ms:.3f} ms)"
            if not self.strong:  # never "no lever" while a lever is unknown
                top = (f"the largest known lever saves less than {pct(self.small)} of the step ({top})" if self.unknown
                       else f"no lever saves {pct(self.small)} of the step (the most: {top})")
            parts.append(top)
        if self.unknown:
            parts.append("unknown: " + ", ".join(
                f"{words} ({f'{pct(share)} of the traced step; ' if share else ''}pass {' or '.join(flags[:2])})"
                for words, share, flags in self.unknown))
        if self.refused is not None:
            parts.append("no bandwidth ceiling: the roofline's bytes exceed what the GPU can read"
                         + (f" (check {self.refused})" if self.refused else ""))
        elif self.ceiling is not None:
            frac, tok_s, unit = self.ceiling
            bound = f"{self.bound_by}-bound at " if self.bound_by else ""
            kind = "compute" if self.ceiling_kind == "compute" else "bandwidth"
            parts.append(f"{bound}{pct(frac)} of the {kind} ceiling ({tok_s:,.0f} {unit})")
        return "; ".join(parts)


__all__ = ["Lever", "Advice", "Headline", "TopLever", "Reference", "Reading", "Statement", "Action", "GapNote",
           "GraphsInUse", "GraphsPredicted", "HostWait", "CommCost", "DraftCost", "Floor", "FloorReading", "check",
           "saving_text", "bound_of", "pct", "BOUNDS", "BASES", "EPS_MS", "PEAK_TOLERANCE", "LEVER_EXTENSIONS"]
