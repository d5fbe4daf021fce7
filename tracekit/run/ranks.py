"""Several ranks analysed together: the per-rank breakdowns plus one cross-rank verdict (the contract's
``cross_rank`` object).

Each rank is analysed on its own (in a process pool or on a Dask cluster, :mod:`tracekit.run.engines`); what
travels back is a :class:`RankResult`: the rank's typed :class:`~tracekit.results.breakdown.Breakdown` (without its
per-activity frame) and its :class:`CommSummary` (one row per communication kernel). :func:`cross_rank` then
matches the ranks' collectives and splits their time; its :class:`CrossRank` is a
:class:`tracekit.contract.Block` whose JSON is the contract's ``cross_rank`` object.

Definitions (../shared/spec/CONTRACT.md, ``cross_rank``):

* **Matching.** Collectives are matched across ranks by their order per communicator: the Kineto NCCL args'
  process group where recorded, else the kernel (its name, and which of the rank's streams carries it) — never
  by timestamps. When a rank's capture starts or ends a few collectives off the others', the offset in the
  order is found from the collective *ends* (which the ranks share: a collective ends once the last rank's data
  is in): the order offset, within ±8, whose end differences spread least.
* **Clocks.** Files whose matched collective ends differ by more than 5 µs (median) come from clocks that
  differ (never the devices of one report; GPUs of one host share the host's clock: the four GB300 files agree
  within 0.2 µs); each such
  rank's times are shifted by that median, and ``clock_offset_ms_by_rank`` says by how much (null when no
  rank needed it).
* **Arrival** at a collective = its kernel's start on that rank, after the activity before it on its stream
  has ended (the contract serialises each stream: a programmatic-dependent-launch kernel that starts early has
  not arrived). A rank's **wait** = from its arrival to the last rank's arrival; the **transfer** = the
  collective's duration on the last-arriving rank (arrival to end). Per rank, its communication kernel time ≈
  its wait + the transfer.
* Per-step figures are means over the first rank's analysed steps, of the collectives inside analysed steps of
  every rank; ``skew_ms`` = mean per step of the largest wait (the most-waiting rank's total wait in the step).
* ``pacing_rank`` = the rank that arrives last at the most collectives, and only when it does so at least
  :data:`PACE_MARGIN` (10 percentage points) more often than any other rank; otherwise null, and the verdict names
  the ranks that share the pace (those within the margin of the most frequent), per collective kind where the
  kinds have different last-arriving ranks. ``slowest_rank`` = the rank with the longest mean step.
* Each rank's ``advice.communication`` is computed again from the match (``split_basis: "cross-rank"``): its
  transfer is the matched collectives' transfer, its wait its own wait above, and what faster collectives could
  save on it = the exposed part of that transfer (each collective's transfer x the exposed share of the rank's
  kernel). Collectives of a rank left unmatched keep that rank's own estimate (``fastest-instances``). The
  others' waits are the late rank's lateness, which no faster collective removes.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from pathlib import Path

import polars as pl

from tracekit.analyses.collectives import NCCL_KIND, CommSplit, CommSummary, collective_rows, comm_summary, row_dicts
from tracekit.categories import STEP_CATEGORIES, UNATTRIBUTED
from tracekit.contract import BREAKDOWN_SCHEMA, INFO_SCHEMA, KERNELS_SCHEMA, Block, internal, tagged, to_dict
from tracekit.results.breakdown import Breakdown
from tracekit.run.pipeline import re_advise

COLUMNS = ["rank", "path", "device", "steps", "mean_ms", "p90_ms",
           *[k for k in STEP_CATEGORIES if k != UNATTRIBUTED], "comm_kernel_ms", "comm_transfer_ms", "comm_wait_ms"]
MAX_ORDER_SHIFT = 8  # collectives a rank's capture may start early or late against the first rank's
CLOCK_TOLERANCE_NS = 5_000  # matched collective ends of one host's GPUs agree within this (median)
MATCH_TOLERANCE_NS = 5_000  # spread (median absolute deviation) of end differences of a right match
VALID_TOLERANCE_NS = 20_000  # beyond this spread the ends do not line up: no trustworthy match
MIN_SHIFT_MATCHES = 4  # an order offset is judged from at least this many matched collectives
PACE_MARGIN = 0.10  # contract: a pacing rank arrives last this much more often than any other rank


@dataclass(frozen=True)
class RankResult:
    """What the per-file stage sends back: the rank's :class:`~tracekit.results.breakdown.Breakdown` (its
    ``activities`` dropped, its facts' communication kernels too: they are in ``comm``; ``facts`` are kept, to
    compute the advice again with the cross-rank transfer) and its communication."""

    breakdown: Breakdown
    comm: CommSummary

    def to_dict(self) -> dict:
        return to_dict(self.breakdown)


def rank_result(b: Breakdown, trace=None, *, rules=None) -> RankResult:
    """A :class:`RankResult` from a Breakdown (and its trace, for sizes and communicators)."""
    comm = comm_summary(b, trace, rules=rules)
    facts = b.facts
    if facts.comm_split is not None:
        facts = replace(facts, comm_split=replace(facts.comm_split, kernels=None))
    return RankResult(replace(b, activities=None, facts=facts), comm)


def analyse_rank(path, opts: dict) -> RankResult:
    """The per-file stage: load ``path``, break it down with ``opts`` (``tracekit.breakdown``'s keyword arguments,
    checked as it checks them), summarise its communication. Module-level, so process pools and Dask workers can
    call it by reference."""
    from tracekit.options import AnalysisOptions
    from tracekit.readers import load
    from tracekit.run.pipeline import breakdown

    trace = load(Path(path), kernel_dims=False)
    # (the trace is this stage's alone, and what rank_result reads of it after the breakdown, the kernels' names and
    # the communicators, is not what the breakdown releases of it)
    b = breakdown(trace, AnalysisOptions(**opts), consume=True)
    return rank_result(b, trace, rules=opts.get("rules"))


def analyse_devices(trace, options) -> tuple[list[RankResult], list[str]]:
    """Every GPU of one trace (an nsys report of several ranks: ``breakdown --all-devices``), each as a rank: its
    :class:`RankResult` and its label (``gpu0``, ...). ``options``: an :class:`~tracekit.options.AnalysisOptions`."""
    from tracekit.analyses.attribution import devices_with_activity, require_gpu_activity
    from tracekit.run.pipeline import breakdown

    require_gpu_activity(trace)  # (as for one GPU: a user error, exit 2, not an empty comparison)
    devs = devices_with_activity(trace)
    results = [rank_result(breakdown(trace, replace(options, all_devices=False, device=d)), trace,
                           rules=options.rules) for d in devs]
    return results, [f"gpu{d}" for d in devs]


def analyse_files(files, options=None, *, engine: str | None = None, workers: int | None = None,
                  fmt: str | None = None, stage=analyse_rank) -> list[RankResult]:
    """Every file's :class:`RankResult`, in the order of ``files``: what ``tracekit breakdown FILES`` runs before
    :func:`cross_rank`. ``options``: an :class:`~tracekit.options.AnalysisOptions` (its ``engine`` is where the
    files run unless ``engine`` is given) or breakdown keyword arguments; ``stage``: the per-file function (a
    module-level function taking ``(path, kwargs)``)."""
    from tracekit.options import AnalysisOptions
    from tracekit.run.engines import map_files

    if options is None or isinstance(options, AnalysisOptions):
        options = options or AnalysisOptions()
        engine = engine or options.engine
        kwargs = options.analysis_kwargs()  # (a device profile is read here, once)
    else:
        kwargs = dict(options)
    return map_files(stage, files, kwargs, engine=engine, workers=workers, fmt=fmt)


@dataclass
class CrossRank(Block):
    """The contract's ``cross_rank`` object (a :class:`tracekit.contract.Block`: ``to_dict()`` writes exactly the
    contract's keys); lists are in rank order (``rank_ids``). Filled as :func:`cross_rank` finds its figures.

    The extension figures beside it (``cross_rank_detail``, :meth:`detail`) are the fields tagged ``detail``; the
    ranks' breakdowns (each with its advice computed again from the match) and labels are what the report shows
    beside it."""

    ranks: int
    slowest_rank: int | None
    pacing_rank: int | None
    step_ms_by_rank: list[float]
    skew_ms: float | None
    wait_ms_by_rank: list[float | None]
    transfer_ms: float | None
    exposed_communication_ms_by_rank: list[float | None]
    clock_offset_ms_by_rank: list[float] | None
    collectives: list[dict]
    verdict: str
    # extensions (cross_rank_detail)
    rank_ids: list[int] = internal(tag="detail", default_factory=list)
    last_arrival_share_by_rank: list[float] | None = internal(tag="detail", default=None)
    comm_kernel_ms_by_rank: list[float] = internal(tag="detail", default_factory=list)
    hidden_communication_ms_by_rank: list[float] = internal(tag="detail", default_factory=list)
    matched_per_step: float | None = internal(tag="detail", default=None)
    steps: int | None = internal(tag="detail", default=None)
    communicator_size: int | None = internal(tag="detail", default=None)
    communicator_evidence: str | None = internal(tag="detail", default=None)
    last_arrival_share_by_kind: dict | None = internal(tag="detail", default=None)  # {kind: [share per rank]}
    # the exposed transfer on ``saving_rank``: the one rank the report's levers are stated on (``saving_rank_is``:
    # ``pacing``, the pacing rank; ``least_wait``, without one the rank that waits least for the others, i.e. the
    # one they wait for most; ``longest_step``, without matched collectives the slowest rank)
    faster_collectives_saving_ms: float | None = internal(tag="detail", default=None)
    saving_rank: int | None = internal(tag="detail", default=None)
    saving_rank_is: str | None = internal(tag="detail", default=None)
    warnings: list[str] = internal(tag="detail", default_factory=list)
    # not serialised: what the multi-rank report shows beside it
    rank_breakdowns: list[Breakdown] = internal(default_factory=list, repr=False)
    labels: list[str] = internal(default_factory=list, repr=False)

    def detail(self) -> dict:
        """The extension figures beside it (``cross_rank_detail`` in the report)."""
        return {k: to_dict(getattr(self, k)) for k in DETAIL_KEYS}

    def report(self) -> dict:
        """The multi-file result: every rank's breakdown, the per-rank table and the ``cross_rank`` object."""
        wait = self.wait_ms_by_rank
        table = []
        for i, b in enumerate(self.rank_breakdowns):
            ps, st = b["per_step_ms"], b["steps"]
            table.append([self.labels[i], b["source"]["path"], b["gpu"]["device"], st["count"], st["mean_ms"],
                          st["p90_ms"], *[ps[k] for k in STEP_CATEGORIES if k != UNATTRIBUTED],
                          b["kernel_ms_per_step"]["communication"], self.transfer_ms, wait[i]])
        return {"schema": BREAKDOWN_SCHEMA, "ranks": [to_dict(b) for b in self.rank_breakdowns], "columns": COLUMNS,
                "table": table, "cross_rank": self.to_dict(), "cross_rank_detail": self.detail(),
                "levers": [to_dict(x) for x in self.levers()], "headline": self.verdict,
                "warnings": list(self.warnings)}

    def levers(self) -> list[RankSetLever]:
        """The rank set's levers besides communication (which the cross-rank verdict answers): each as the verdict
        of ``saving_rank`` (the rank the others wait for; the slowest where no collective was matched), with every
        rank's saving (``report()["levers"]``: what the table and markdown show under the cross-rank verdict)."""
        bds = self.rank_breakdowns
        rank = self.saving_rank if self.saving_rank is not None else self.slowest_rank
        if not bds or rank is None:
            return []
        i = self.rank_ids.index(rank)
        adv = bds[i].advice
        out = []
        for key in adv.order:
            if key == "communication":
                continue
            lever = adv[key]
            out.append(RankSetLever(lever=key, rank=self.labels[i], verdict=lever.verdict, bound=lever.bound,
                                    max_saving_ms_by_rank=[b.advice[key].max_saving_ms for b in bds],
                                    applicable_by_rank=[bool(b.advice[key].applicable) for b in bds]))
        return out


@dataclass(frozen=True)
class RankSetLever(Block):
    """One lever of a rank set (an extension of the several-files result): the verdict of rank ``rank``
    (``CrossRank.saving_rank``: the rank the others wait for), its bound, and every rank's saving and applicability,
    in rank order."""

    lever: str
    rank: str
    verdict: str
    bound: str
    max_saving_ms_by_rank: list[float | None]
    applicable_by_rank: list[bool]


# the contract's cross_rank keys, and the extensions reported beside them (``cross_rank_detail``)
CONTRACT_KEYS = tuple(f.name for f in fields(CrossRank) if f.metadata.get("contract") is None)
DETAIL_KEYS = tagged(CrossRank, "detail")


def _as_result(r) -> RankResult:
    if isinstance(r, RankResult):
        return r
    return rank_result(r)  # a Breakdown without its trace: sizes and communicators unknown


def _order(results: list[RankResult], labels) -> tuple[list[RankResult], list[int], list[str]]:
    """Results in rank order (by the traces' rank where every file records a distinct one, else as given)."""
    ids = [r.comm.rank for r in results]
    if all(i is not None for i in ids) and len(set(ids)) == len(ids) and labels is None:
        order = sorted(range(len(results)), key=lambda i: ids[i])
        return [results[i] for i in order], [ids[i] for i in order], [str(ids[i]) for i in order]
    return results, list(range(len(results))), list(labels) if labels else [str(i) for i in range(len(results))]


def _long(summaries: list[CommSummary]) -> pl.DataFrame:
    """Every rank's communication kernels, one frame, with the matching ``key`` and ``seq`` (order per key)."""
    frames = [s.kernels.with_columns(pl.col("name", "impl", "kind", "group").cast(pl.String), rank=pl.lit(i, pl.Int32))
              for i, s in enumerate(summaries)]  # per rank, not per event
    frames = [f.rename({"transfer": "t_est"}) if "transfer" in f.columns
              else f.with_columns(t_est=pl.lit(None, pl.Int64)) for f in frames]
    df = pl.concat(frames, how="vertical_relaxed")
    if df.height == 0:
        return df.with_columns(key=pl.lit(None, pl.String), seq=pl.lit(None, pl.Int64))
    # streams carrying a kernel, numbered by their first such kernel (stream ids differ between ranks)
    so = (df.group_by("rank", "name", "stream").agg(first=pl.col("start").min())
          .with_columns(so=pl.col("first").rank("ordinal").over("rank", "name").cast(pl.Int64) - 1))
    df = df.join(so.select("rank", "name", "stream", "so"), on=["rank", "name", "stream"], how="left")
    key = (pl.when(pl.col("group").is_not_null()).then(pl.lit("pg:") + pl.col("group"))
           .otherwise(pl.lit("k:") + pl.col("name") + pl.lit("#") + pl.col("so").cast(pl.String)))
    return (df.with_columns(key=key).sort("rank", "key", "start")
            .with_columns(seq=pl.int_range(pl.len(), dtype=pl.Int64).over("rank", "key")).drop("so"))


def _mad(e: pl.Expr) -> pl.Expr:
    return (e - e.median()).abs().median()


def _align_order(df: pl.DataFrame, warnings: list[str], labels: list[str]) -> pl.DataFrame:
    """Shift each (rank, key)'s ``seq`` onto the first rank's numbering where its capture starts off it."""
    ref = df.filter(pl.col("rank") == 0).select("key", "seq", ref_end="end")
    stat = (df.join(ref, on=["key", "seq"], how="left")
            .group_by("rank", "key").agg(n=pl.len(), spread=_mad(pl.col("end") - pl.col("ref_end")))
            .join(ref.group_by("key").agg(n_ref=pl.len()), on="key", how="left"))
    bad = stat.filter((pl.col("rank") != 0) & ((pl.col("n") != pl.col("n_ref")) | pl.col("spread").is_null()
                                                | (pl.col("spread") > MATCH_TOLERANCE_NS)))
    if bad.height == 0:
        return df
    shifts = pl.DataFrame({"shift": list(range(-MAX_ORDER_SHIFT, MAX_ORDER_SHIFT + 1))}, schema={"shift": pl.Int64})
    cand = (df.join(bad.select("rank", "key"), on=["rank", "key"], how="semi").join(shifts, how="cross")
            .with_columns(seq_ref=pl.col("seq") + pl.col("shift"))
            .join(ref.rename({"seq": "seq_ref"}), on=["key", "seq_ref"], how="inner")
            .group_by("rank", "key", "shift").agg(m=pl.len(), spread=_mad(pl.col("end") - pl.col("ref_end"))))
    best = (cand.filter((pl.col("m") >= 0.5 * pl.col("m").max().over("rank", "key"))
                        & (pl.col("m") >= MIN_SHIFT_MATCHES))
            .sort("rank", "key", "spread", pl.col("shift").abs()).group_by("rank", "key", maintain_order=True).first())
    moved = best.filter(pl.col("shift") != 0)
    for r in moved.head(5).iter_rows(named=True):  # (a few lines of warning, not a loop over events)
        key = r["key"]
        what = f"process group {key[3:]!r}" if key.startswith("pg:") else key[2:].rsplit("#", 1)[0][:60]
        warnings.append(f"rank {labels[r['rank']]}: its capture starts {abs(r['shift'])} collective(s) "
                        f"{'later' if r['shift'] > 0 else 'earlier'} than that of rank {labels[0]} on {what}; "
                        "matched by order after that offset")
    return (df.join(best.select("rank", "key", "shift"), on=["rank", "key"], how="left")
            .with_columns(seq=pl.col("seq") + pl.col("shift").fill_null(0)).drop("shift"))


def _comm_warnings(sums: list[CommSummary], exposed: list, labels: list, warnings: list[str]) -> None:
    """Warn of exposed communication below the serialised time compute does not hide (same-stream overlap
    counted as hidden) and of ranks with different numbers of analysed steps."""
    for i, s in enumerate(sums):
        # the contract serialises each stream: exposed communication can then not be below the serialised
        # communication time that compute on other streams does not hide
        want = s.serial_ms - s.hidden_ms
        if exposed[i] is not None and exposed[i] < 0.9 * want - 0.01:
            warnings.append(f"rank {labels[i]}: exposed communication {exposed[i]:.3f} ms per step is below its "
                            f"communication kernel time not hidden by other streams ({want:.3f} ms): same-stream "
                            "overlap (programmatic dependent launch) is being counted as hidden")
    if len({s.steps for s in sums}) > 1:
        warnings.append("ranks have different numbers of analysed steps (" + ", ".join(str(s.steps) for s in sums)
                        + "): only collectives inside analysed steps of every rank are compared")


def _align_clocks(df: pl.DataFrame, sums: list[CommSummary], out: CrossRank, warnings: list[str],
                  labels: list) -> pl.DataFrame | None:
    """``df`` with each file's clock moved onto rank 0's by the median offset of matched collective ends (the
    offsets in ``out``); None when the matched ends do not line up (not one capture: no wait or transfer)."""
    # a right match has collective ends that line up on every rank; otherwise the files are not one capture
    # (or too few collectives were recorded to match them): no wait or transfer rather than wrong ones
    ref = df.filter(pl.col("rank") == 0).select("key", "seq", ref_end="end")
    spread = (df.join(ref, on=["key", "seq"], how="inner").filter(pl.col("rank") != 0).group_by("rank")
              .agg(s=_mad(pl.col("end") - pl.col("ref_end"))))
    if spread.height and (spread["s"].max() or 0) > VALID_TOLERANCE_NS:
        worst = spread.sort("s", descending=True).row(0, named=True)
        warnings.append(f"the ends of matched collectives do not line up (rank {labels[worst['rank']]}: they spread "
                        f"{worst['s'] / 1e6:.3f} ms around rank {labels[0]}): the files are not one capture, or record "
                        "too few collectives to match; wait, transfer and skew are left out")
        return None
    off = (df.join(ref, on=["key", "seq"], how="inner").group_by("rank")
           .agg(offset=(pl.col("end") - pl.col("ref_end")).median()).sort("rank"))
    # only ranks whose clock differs are moved (ranks on rank 0's host share its clock: their small median end
    # differences are how the collective ends, not a clock offset)
    one_file = len({s.path for s in sums}) == 1  # devices of one report: one clock by construction
    offsets = {r: (v if abs(v or 0) > CLOCK_TOLERANCE_NS and not one_file else 0.0)
               for r, v in zip(off["rank"].to_list(), off["offset"].to_list())}
    if any(offsets.values()):
        out.clock_offset_ms_by_rank = [(offsets.get(i) or 0.0) / 1e6 for i in range(len(sums))]
        shift = pl.col("rank").replace_strict(offsets, default=0, return_dtype=pl.Float64).round(0).cast(pl.Int64)
        df = df.with_columns(start=pl.col("start") - shift, end=pl.col("end") - shift,
                             arrival=pl.col("arrival") - shift)
        worst = max(offsets, key=lambda r: abs(offsets[r] or 0))
        warnings.append(f"clocks differ between the files (rank {labels[worst]}: {offsets[worst] / 1e6:+.3f} ms "
                        f"against rank {labels[0]}, the median difference of matched collective ends): aligned on collective "
                        "ends")
    return df


def _waits(out: CrossRank, m: pl.DataFrame, counted: pl.DataFrame, n_steps: int) -> tuple[pl.DataFrame, list, list]:
    """Each rank's wait for the last arrival per step, last-arrival shares (by rank and kind), the transfer and the
    skew, set on ``out``; returns the matched kernels with their wait, the waits and the last-arrival counts."""
    m = m.join(counted.select("key", "seq", "last", "transfer", "ref_step"), on=["key", "seq"], how="left")
    m = m.with_columns(wait=pl.col("last") - pl.col("arrival"), is_last=pl.col("arrival") == pl.col("last"))
    per_rank = (m.group_by("rank").agg(wait=pl.col("wait").sum(), lasts=pl.col("is_last").sum(), n=pl.len())
                .sort("rank"))
    waits = [w / 1e6 / n_steps for w in per_rank["wait"].to_list()]
    lasts = per_rank["lasts"].to_list()
    out.wait_ms_by_rank = waits
    out.last_arrival_share_by_rank = [c / counted.height for c in lasts]
    by_kind = (m.group_by("kind", "rank").agg(lasts=pl.col("is_last").sum(), n=pl.len()).sort("kind", "rank"))
    out.last_arrival_share_by_kind = {
        NCCL_KIND.get(kind, kind): [float(x) for x in (g["lasts"] / g["n"]).to_list()]
        for (kind,), g in by_kind.group_by("kind", maintain_order=True)}  # (a few kinds)
    out.transfer_ms = float(counted["transfer"].sum()) / 1e6 / n_steps
    by_step = m.group_by("ref_step", "rank").agg(w=pl.col("wait").sum()).group_by("ref_step").agg(pl.col("w").max())
    out.skew_ms = float(by_step["w"].sum()) / 1e6 / n_steps
    out.matched_per_step = counted.height / n_steps
    return m, waits, lasts


def cross_rank(results, labels=None) -> CrossRank:
    """The cross-rank verdict of several ranks' results (:class:`RankResult`, or Breakdowns: then without sizes)."""
    res = [_as_result(r) for r in results]
    res, ids, labels = _order(res, labels)
    sums = [r.comm for r in res]
    bds = [r.breakdown for r in res]
    n_ranks = len(res)
    warnings: list[str] = []
    step_ms = [s.step_ms for s in sums]  # (each rank's steps.mean_ms and exposed communication: comm_summary)
    exposed = [s.exposed_ms for s in sums]
    slowest = max(range(n_ranks), key=lambda i: step_ms[i]) if n_ranks else None
    tp = next((s.tp for s in sums if s.tp), None)
    tp_ev = next((s.tp_evidence for s in sums if s.tp), sums[0].tp_evidence if sums else None)
    out = CrossRank(
        ranks=n_ranks, slowest_rank=ids[slowest] if slowest is not None else None, pacing_rank=None,
        saving_rank=ids[slowest] if slowest is not None else None, saving_rank_is="longest_step",
        step_ms_by_rank=step_ms, skew_ms=None, wait_ms_by_rank=[None] * n_ranks, transfer_ms=None,
        exposed_communication_ms_by_rank=exposed, clock_offset_ms_by_rank=None, collectives=[], verdict="",
        rank_ids=ids, comm_kernel_ms_by_rank=[s.serial_ms for s in sums],
        hidden_communication_ms_by_rank=[s.hidden_ms for s in sums], steps=min((s.steps for s in sums), default=0),
        communicator_size=tp, communicator_evidence=tp_ev, warnings=warnings, rank_breakdowns=bds, labels=labels)
    _comm_warnings(sums, exposed, labels, warnings)
    df = _long(sums)
    if n_ranks < 2 or df.filter(pl.col("step").is_not_null()).height == 0:
        out.skew_ms, out.transfer_ms = (0.0, 0.0) if df.height == 0 else (None, None)
        out.wait_ms_by_rank = [0.0 if df.height == 0 else None] * n_ranks
        out.verdict = _verdict(out, labels, None)
        return out
    df = _align_order(df, warnings, labels)
    df = _align_clocks(df, sums, out, warnings, labels)
    if df is None:
        out.collectives = _single_rows(sums[0])
        out.verdict = _verdict(out, labels, None)
        return out
    groups = (df.group_by("key", "seq").agg(
        n=pl.len(), in_steps=pl.col("step").is_not_null().all(), last=pl.col("arrival").max(),
        transfer=(pl.col("end") - pl.col("arrival")).sort_by("arrival").last(),
        ref_step=pl.col("step").sort_by("rank").first()))
    full = groups.filter(pl.col("n") == n_ranks)
    counted = full.filter(pl.col("in_steps"))
    in_any = df.filter(pl.col("step").is_not_null()).height
    m = df.join(counted.select("key", "seq"), on=["key", "seq"], how="semi")
    if in_any > m.height:
        warnings.append(f"{in_any - m.height} of {in_any} communication kernels in the analysed steps could not be "
                        "matched on every rank (different collective counts per communicator, or steps analysed on "
                        "some ranks only): left out of wait and transfer")
    if counted.height == 0:
        out.collectives = _single_rows(sums[0])
        out.verdict = _verdict(out, labels, None)
        return out
    # means over the first rank's analysed steps (steps without a collective count as 0)
    n_steps = max(sums[0].steps, counted["ref_step"].n_unique(), 1)
    m, waits, lasts = _waits(out, m, counted, n_steps)
    shares = out.last_arrival_share_by_rank
    lead = max(range(n_ranks), key=lambda i: (lasts[i], -waits[i]))
    runner_up = max((shares[i] for i in range(n_ranks) if i != lead), default=0.0)
    pace = lead if shares[lead] - runner_up >= PACE_MARGIN - 1e-12 else None
    out.pacing_rank = ids[pace] if pace is not None else None
    out.collectives = _cross_rows(m, n_steps, n_ranks, sums[pace if pace is not None else 0])
    # each rank's advice.communication, computed again with the matched transfer
    splits = _cross_splits(df, m, sums, n_steps, n_ranks)
    readvised = set()
    for i, split in enumerate(splits):
        facts = getattr(bds[i], "facts", None)
        if split is not None and facts is not None:
            bds[i] = re_advise(bds[i], replace(facts, comm_split=split))
            readvised.add(i)
    out.rank_breakdowns = bds
    # one rank the report's levers are on: the pacing rank, else the one that waits least (the others wait for it
    # most), never the slowest step (in lockstep ranks the longest step is the one that waits most)
    who = pace if pace is not None else min(range(n_ranks), key=lambda i: (waits[i], i))
    out.saving_rank, out.saving_rank_is = ids[who], ("pacing" if pace is not None else "least_wait")
    if splits[who] is not None:
        # the re-advised lever's saving (its split is the cross-rank one), else this rank's own bound
        out.faster_collectives_saving_ms = bds[who].advice["communication"].max_saving_ms if who in readvised else (
            min(exposed[who], splits[who].exposed_transfer_ms) if exposed[who] is not None else
            splits[who].exposed_transfer_ms)
    out.verdict = _verdict(out, labels, pace, splits[who])
    return out


def _cross_splits(df: pl.DataFrame, m: pl.DataFrame, sums: list[CommSummary], n_steps: int,
                  n_ranks: int) -> list[CommSplit | None]:
    """Each rank's transfer and wait from the match (:class:`CommSplit`, basis ``cross-rank``): per matched
    collective the transfer on the last-arriving rank and this rank's own wait; its exposed transfer = the transfer
    x the exposed share of this rank's kernel. The rank's kernels in analysed steps that were not matched keep its
    own single-file estimate (``t_est``)."""
    ms = lambda e: float(e or 0) / 1e6 / n_steps  # noqa: E731
    mine = df.filter(pl.col("step").is_not_null()).with_columns(
        dur=(pl.col("end") - pl.col("arrival")).clip(lower_bound=0), raw=pl.col("end") - pl.col("start"),
        exposed=pl.col("exposed").fill_null(0))
    matched = m.select("rank", "key", "seq", x_transfer="transfer", x_wait="wait")
    k = mine.join(matched, on=["rank", "key", "seq"], how="left")
    t = pl.coalesce(pl.min_horizontal("x_transfer", "dur"), "t_est", "dur")
    k = k.with_columns(tr=t, wt=pl.when(pl.col("x_wait").is_not_null()).then("x_wait").otherwise(pl.col("dur") - t))
    k = k.with_columns(ex_t=pl.col("tr") * (pl.col("exposed") / pl.col("dur")).fill_nan(0).clip(0, 1),
                       unmatched=pl.col("x_transfer").is_null())
    per_kind = (k.group_by("rank", "kind").agg(count=pl.len(), raw=pl.col("raw").sum(), exp=pl.col("exposed").sum(),
                                               tr=pl.col("tr").sum(), wt=pl.col("wt").sum(), ex_t=pl.col("ex_t").sum())
                .sort("rank", "raw", "kind", descending=[False, True, False]))
    per_rank = k.group_by("rank").agg(dur=pl.col("dur").sum(), exp=pl.col("exposed").sum(), tr=pl.col("tr").sum(),
                                      wt=pl.col("wt").sum(), ex_t=pl.col("ex_t").sum(), hid=pl.col("hidden").sum(),
                                      unmatched=(pl.col("dur") * pl.col("unmatched")).sum())
    out: list[CommSplit | None] = [None] * len(sums)
    for r in per_rank.iter_rows(named=True):  # one row per rank
        i = r["rank"]
        rows = tuple({"kind": NCCL_KIND.get(x["kind"], x["kind"]), "count_per_step": x["count"] / n_steps,
                      "kernel_ms": ms(x["raw"]), "exposed_ms": ms(x["exp"]), "transfer_ms": ms(x["tr"]),
                      "wait_ms": ms(x["wt"]), "exposed_transfer_ms": ms(x["ex_t"])}
                     for x in per_kind.filter(pl.col("rank") == i).iter_rows(named=True))
        how = f"measured across the {n_ranks} ranks"
        if r["dur"] and r["unmatched"] / r["dur"] > 0.005:
            how += (f"; {100 * r['unmatched'] / r['dur']:.0f}% of this rank's communication time could not be matched "
                    "and keeps its own estimate")
        out[i] = CommSplit(basis="cross-rank", kernel_ms=ms(r["dur"]), transfer_ms=ms(r["tr"]), wait_ms=ms(r["wt"]),
                           exposed_ms=ms(r["exp"]), exposed_transfer_ms=ms(r["ex_t"]), hidden_ms=ms(r["hid"]),
                           by_kind=rows, how=how, ranks=n_ranks)
    return out


def _single_rows(s: CommSummary) -> list[dict]:
    """The first rank's own collectives table (kernel times, waiting included) where ranks cannot be matched."""
    from tracekit.analyses.collectives import collective_table

    rows = collective_table(s)
    for r in rows:
        r.update(transfer_ms=None, skew_ms=None, ms_per_step_is="kernel time of rank 0 alone (waiting included)")
    return rows


def _cross_rows(m: pl.DataFrame, n_steps: int, n_ranks: int, pace: CommSummary) -> list[dict]:
    """The collectives table across ranks: per (kind, implementation), bandwidth from the transfer (not from
    kernel times, which include waiting), kernel time as the mean over ranks, and the skew at each."""
    per_call = m.group_by("key", "seq").agg(
        kind=pl.col("kind").first(), impl=pl.col("impl").first(), name=pl.col("name").first(),
        bytes=pl.col("bytes").sort_by("rank").first(), group_size=pl.col("group_size").drop_nulls().first(),
        transfer=pl.col("transfer").first(), mean_dur=(pl.col("end") - pl.col("start")).mean().round(0).cast(pl.Int64))
    calls = per_call.with_columns(start=pl.lit(0, pl.Int64), end=pl.col("mean_dur"))
    rows = collective_rows(calls, n_steps, "transfer", "transfer")
    skew = (m.group_by("kind", "impl", "ref_step", "rank").agg(w=pl.col("wait").sum())
            .group_by("kind", "impl", "ref_step").agg(pl.col("w").max())
            .group_by("kind", "impl").agg(skew_ms=pl.col("w").sum() / 1e6 / n_steps))
    rows = rows.join(skew, on=["kind", "impl"], how="left")
    dicts = row_dicts(rows, n_steps, pace.link, pace.link_gbps)
    for d, r in zip(dicts, rows.iter_rows(named=True)):
        d["transfer_ms"] = r["time_ns"] / 1e6 / n_steps
        d["skew_ms"] = r["skew_ms"]
        d["ms_per_step_is"] = f"mean over the {n_ranks} ranks of their kernel time (wait + transfer)"
    return dicts


def _ranks_text(labels: list[str]) -> str:
    """'ranks 0, 1 and 3'."""
    if len(labels) == 1:
        return f"rank {labels[0]}"
    return "ranks " + ", ".join(labels[:-1]) + f" and {labels[-1]}"


def _pace_text(cr: CrossRank, lab: dict, pace: int | None) -> str:
    """Who sets the pace: the pacing rank with its margin, or the ranks that share the pace (per collective kind
    where the kinds have different last-arriving ranks)."""
    shares = cr.last_arrival_share_by_rank
    n = cr.ranks
    per = f"of the {cr.matched_per_step:.3g} collective(s) per step"
    if pace is not None:
        rest = [(shares[i], i) for i in range(n) if i != pace]
        nxt = min(rest, key=lambda x: (-x[0], x[1])) if rest else None
        after = f" (next: rank {lab[cr.rank_ids[nxt[1]]]} at {100 * nxt[0]:.0f}%)" if nxt else ""
        return (f"rank {lab[cr.pacing_rank]} sets the pace: it arrives last at {100 * shares[pace]:.0f}% {per}{after}, "
                "and the others wait for it")
    top = max(shares)
    sharing = [i for i in range(n) if shares[i] >= top - PACE_MARGIN]
    names = _ranks_text([lab[cr.rank_ids[i]] for i in sharing])
    vals = ", ".join(f"{100 * shares[i]:.0f}%" for i in sharing)
    others = [i for i in range(n) if i not in sharing]
    txt = (f"no single rank sets the pace: {names} arrive last about equally often ({vals} {per}"
           + ("; " + ", ".join(f"rank {lab[cr.rank_ids[i]]} {100 * shares[i]:.0f}%" for i in others) if others else "")
           + ")")
    by_kind = cr.last_arrival_share_by_kind or {}
    leaders = {kind: max(range(n), key=lambda i: v[i]) for kind, v in by_kind.items() if v}
    if len(set(leaders.values())) > 1:
        txt += "; by kind, " + ", ".join(
            f"rank {lab[cr.rank_ids[i]]} is last at {100 * by_kind[kind][i]:.0f}% of the {kind}s"
            for kind, i in sorted(leaders.items(), key=lambda kv: -by_kind[kv[0]][kv[1]]))
    return txt


def _verdict(cr: CrossRank, labels: list[str], pace: int | None, split: CommSplit | None = None) -> str:
    n = cr.ranks
    lab = {rid: labels[i] for i, rid in enumerate(cr.rank_ids)}
    steps = cr.step_ms_by_rank
    fast, slow = min(steps), max(steps)
    slow_txt = f"rank {lab[cr.slowest_rank]} has the longest step ({slow:.3f} ms; fastest {fast:.3f} ms)"
    if cr.last_arrival_share_by_rank is None:
        if cr.transfer_ms is None and cr.skew_ms is None and n > 1:
            return (f"{n} ranks: {slow_txt}; their collectives could not be matched across ranks, so skew and "
                    "transfer are unknown (see warnings)")
        return f"{n} ranks: {slow_txt}; no collectives in the analysed steps, so no rank waits for another"
    waits = cr.wait_ms_by_rank
    most = max(range(n), key=lambda i: waits[i] or 0)
    txt = (f"{_pace_text(cr, lab, pace)} — skew {cr.skew_ms:.3f} ms per step (rank {labels[most]} waits "
           f"{waits[most]:.3f} ms) against {cr.transfer_ms:.3f} ms of transfer")
    worst = max(cr.collectives, key=lambda r: r.get("skew_ms") or 0, default=None)
    if worst and cr.skew_ms and (worst.get("skew_ms") or 0) > 0.5 * cr.skew_ms and len(cr.collectives) > 1:
        txt += (f" (most of the skew at the {worst['count_per_step']:.0f} {worst['kind'].replace('_', '-')} "
                f"({worst['implementation']}) per step: {worst['skew_ms']:.3f} ms)")
    who = lab[cr.saving_rank] if cr.saving_rank is not None else None
    kinds = "/".join(split.kinds_that_matter()) if split is not None and split.by_kind else "collectives"
    save = cr.faster_collectives_saving_ms
    i = cr.rank_ids.index(cr.saving_rank) if cr.saving_rank is not None else None
    step_w = steps[i] if i is not None else None
    whose = {"pacing": "", "least_wait": "the rank that waits least; "}.get(cr.saving_rank_is, "the longest step; ")
    if save is not None and who is not None:
        txt += (f"; faster {kinds} could save at most {save:.3f} ms per step on rank {who} ({whose}"
                f"{100 * save / step_w if step_w else 0:.0f}% of its {step_w:.3f} ms step: the exposed transfer)")
    elif who is not None:
        txt += f"; faster {kinds} could save at most the transfer on rank {who} ({whose}its exposed share is unknown)"
    txt += "; the skew goes only by evening out work or launch times across ranks"
    top = cr.collectives[0] if cr.collectives else None
    if top and top["latency_bound"]:
        txt += (f". The {top['kind'].replace('_', '-')} ({top['implementation']}) is latency-bound: fewer, fused "
                "calls help more than bandwidth")
    return txt


INFO_COLUMNS = ["rank", "path", "producer_version", "kernels", "memops", "launches", "ranges"]
KERNEL_COLUMNS = ["rank", "path", "kernel_ms", "gemm_ms", "attention_ms", "communication_ms", "other_ms",
                  "unmatched_share"]


def info_ranks(results: list[dict]) -> dict:
    """Several files given to `tracekit info`: each file's result plus a cross-rank table of counts."""
    table = [[str(r["source"].get("rank", i)), r["source"]["path"], r["source"]["producer_version"] or "",
              *[r["counts"][k] for k in ("kernels", "memops", "launches", "ranges")]] for i, r in enumerate(results)]
    return {"schema": INFO_SCHEMA, "ranks": results, "columns": INFO_COLUMNS, "table": table}


def kernels_ranks(results: list[dict], paths) -> dict:
    """Several files given to `tracekit kernels`: each file's result plus kernel time per category per rank."""
    table = []
    for i, (r, path) in enumerate(zip(results, paths)):
        ks = r["kernels"]
        by = {}
        for k in ks:
            by[k["category"]] = by.get(k["category"], 0.0) + k["total_ms"]
        total = sum(by.values())
        unmatched = sum(k["total_ms"] for k in ks if k["rule"] is None)
        table.append([str(i), str(path), total, by.get("gemm", 0.0), by.get("attention", 0.0),
                      by.get("communication", 0.0), by.get("other", 0.0), unmatched / total if total else 0.0])
    return {"schema": KERNELS_SCHEMA, "ranks": results, "columns": KERNEL_COLUMNS, "table": table}
