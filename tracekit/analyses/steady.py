"""Steady state: which steps are excluded, and why (contract ``steps.excluded_reasons``).

Reasons, in the order they are decided (a step gets the first that applies):

* ``"no GPU work"`` and ``"cut by capture window"``: decided by the caller (windows without activity on the
  analysed GPU; windows without an end);
* ``"phase"``: not selected by ``--phase`` (:func:`tracekit.analyses.phase.select_phase`);
* ``"last step (no following step)"``: the last step with GPU work, when there are at least 3: its period ends
  at its own last activity, so it lacks the host time every other step carries to the next one;
* ``"warm-up/transition"``: a step whose sequence is not the steady one. Decided by sequence, never by duration.

**Signature.** A step's signature is the hash of its GPU activities in order (per stream, in start order; each
kernel by name, marked graph-replayed or launched; copies by name): two steps with the same signature ran the
same kernels in the same order. The *steady* signature is the most common one.

**Per phase.** The steady step is found among the steps of each phase (``steps`` may carry a ``phase`` column):
a window of prefill steps then decode steps has a steady prefill step and a steady decode step, and ``--phase all``
analyses both kinds instead of calling the minority a transition.

**Rule.** A step with the steady signature is steady. A step with another signature is kept when it has the
steady step's *composition*: its activities counted by (category, graph-replayed or not, kind), compared with the
median count over the candidate steps (zeros included), overlap at least :data:`MIN_COMPOSITION_OVERLAP`:
``sum(min(count, median)) / max(sum(count), sum(median))``. So a speculative step that accepted a different number
of tokens (a few more or fewer bookkeeping kernels), a ragged batch (other GEMM tile kernels, another CUDA graph
of the same forward) or the first decode step after a prefill stay; a warm-up step (eager work where the steady
steps replay a graph, one-time autotuning or capture launches), a step that merged two steps, or half a step do
not. docs/definitions.md ("Steady state") says the same for users.
"""

from __future__ import annotations

import polars as pl

from tracekit.categories import EXCLUSION_REASONS as REASONS
from tracekit.categories import LAST_STEP
from tracekit.categories import WARM_UP as TRANSITION
from tracekit.intervals import by_pieces

MIN_STEPS_FOR_LAST = 3  # the last of at least this many steps is excluded
MIN_COMPOSITION_OVERLAP = 0.75  # composition overlap with the steady step below which a step is a transition


def _code(df: pl.DataFrame, col: str) -> pl.Expr:
    """A text column of ``df`` as numbers for hashing: the codes of an Enum/Categorical (one code per text; cheap
    at ten million rows), else the hash of the text."""
    if isinstance(df.schema[col], (pl.Enum, pl.Categorical)):
        return pl.col(col).to_physical().cast(pl.UInt64)
    return pl.col(col).cast(pl.String).hash(41)


# The columns :func:`step_signatures` reads.
SIGNATURE_COLUMNS = ("step", "start", "name", "kind", "graphed", "stream")


def step_signatures(acts: pl.DataFrame) -> pl.DataFrame:
    """Per step of ``acts`` (the attributed activities: step, start, name, kind, graphed, stream): ``step``,
    ``sig`` (UInt64 hash of its sequence: per stream in start order, each activity by name, graph-replayed or
    not, and kind), ``n`` (activities). Whole steps at a time (``intervals.step_chunks``), when they are runs."""
    return pl.concat(by_pieces(_signatures, acts))


def _signatures(acts: pl.DataFrame) -> pl.DataFrame:
    graphed = pl.col("graphed").fill_null(False)
    if all(isinstance(acts.schema[c], (pl.Enum, pl.Categorical)) for c in ("name", "kind")):
        # (the activities frame: name and kind are codes, packed with the graphed flag into one number per token,
        # distinct for distinct tokens; hashing a struct of the three cost 3x as much at ten million rows)
        tok = (_code(acts, "name") * 8 + graphed.cast(pl.UInt64) * 4 + _code(acts, "kind")).hash(23)
    else:
        tok = pl.struct(_code(acts, "name"), graphed, _code(acts, "kind")).hash(23)
    df = acts.select(pl.col("step").cast(pl.Int64), "start", pl.col("stream").fill_null(-1), tok=tok)
    if df["step"].null_count():
        df = df.filter(pl.col("step").is_not_null())
    # (no nulls here: one value when its min is its max, without hashing ten million; reduced in a query, which reads
    # a column of one value kept as that value without making its rows)
    lo, hi = df.select(pl.col("stream").min(), pl.col("stream").max().alias("hi")).row(0)
    if df["start"].is_sorted() and df.height and lo == hi:
        # One stream, in start order (the usual trace): each step's rows are its sequence as they stand, hashed
        # where they are grouped (the same lists as below, without the per-stream lists and their explode).
        if df["step"].is_sorted():
            df = df.with_columns(pl.col("step").set_sorted())  # (grouped by slices, no hashing)
        return (df.lazy().group_by("step", maintain_order=True)
                .agg(toks=pl.struct("stream", "tok").hash(29), n=pl.len())
                .select("step", sig=pl.col("toks").hash(31), n=pl.col("n").cast(pl.Int64)).collect())
    if df["start"].is_sorted():
        # In start order already (the activities frame): each (step, stream)'s rows in order as they stand, then
        # the few (step, stream) groups sorted; the same lists as the full sort below, twice as fast at 10M rows.
        per = (df.select("step", "stream", h=pl.struct("stream", "tok").hash(29))
               .group_by("step", "stream", maintain_order=True).agg("h").sort("step", "stream"))
        seqs = per.explode("h").group_by("step", maintain_order=True).agg(toks="h", n=pl.len())
    else:
        seqs = (df.sort("step", "stream", "start", maintain_order=True)
                .group_by("step", maintain_order=True).agg(toks=pl.struct("stream", "tok").hash(29), n=pl.len()))
    return seqs.select("step", sig=pl.col("toks").hash(31), n=pl.col("n").cast(pl.Int64))


def composition_overlap(acts: pl.DataFrame, candidates: pl.Series) -> pl.DataFrame:
    """Per step of ``acts``: ``overlap`` of its composition with the median composition of the ``candidates``
    steps (see the module docstring)."""
    return _overlap(pl.concat(by_pieces(_counts, acts)), candidates)


def _overlap(comp: pl.DataFrame, candidates: pl.Series) -> pl.DataFrame:
    """:func:`composition_overlap` from the steps' compositions (:func:`_counts`: step, tok, c)."""
    cand = comp.filter(pl.col("step").is_in(candidates.implode()))
    n_c = candidates.len()
    med = cand.group_by("tok").agg(c=pl.col("c"), k=pl.len()).select(
        "tok", med=pl.concat_list("c", pl.lit(0, pl.UInt32).repeat_by(n_c - pl.col("k"))).list.median())
    total_med = float(med["med"].sum())
    both = comp.join(med, on="tok", how="left").with_columns(pl.col("med").fill_null(0.0))
    return both.group_by("step").agg(
        overlap=pl.min_horizontal("c", "med").sum() / pl.max_horizontal(pl.col("c").sum(), pl.lit(total_med)))


_KEY_BITS = 8  # (category code, graphed, kind code) packed below the step in one Int64: 8 bits hold them


def _counts(acts: pl.DataFrame) -> pl.DataFrame:
    """Per step of ``acts``: its activities counted by (category, graph-replayed or not, kind): ``step``, ``tok``
    (one number per combination), ``c``."""
    graphed = pl.col("graphed").fill_null(False)
    enums = [acts.schema[c] for c in ("category", "kind")]
    if all(isinstance(d, pl.Enum) for d in enums) and len(enums[0].categories) * 2 * len(enums[1].categories) <= (
            1 << _KEY_BITS):
        # (the activities frame: both enums. Step and combination packed in one Int64 and counted, one key to hash
        # instead of four: 10M activities 0.24 -> 0.1 s; the combination's number is its token)
        n_kind = len(enums[1].categories)
        tok = (pl.col("category").to_physical().cast(pl.Int64) * 2 + graphed.cast(pl.Int64)) * n_kind + pl.col(
            "kind").to_physical().cast(pl.Int64)
        key = acts.select(key=(pl.col("step").cast(pl.Int64) * (1 << _KEY_BITS) + tok))["key"]
        if key.null_count():
            key = key.drop_nulls()
        counts = key.value_counts(name="c")
        return counts.select(step=pl.col("key") // (1 << _KEY_BITS), tok=pl.col("key") % (1 << _KEY_BITS), c="c")
    comp = acts.select(pl.col("step").cast(pl.Int64), "category", graphed, "kind")
    if comp["step"].null_count():
        comp = comp.filter(pl.col("step").is_not_null())
    return comp.group_by("step", "category", "graphed", "kind").agg(c=pl.len()).select(
        "step", tok=pl.struct("category", "graphed", "kind").hash(37), c="c")


def steady_exclusions(acts: pl.DataFrame, steps: pl.DataFrame, signatures: pl.DataFrame | None = None) -> pl.DataFrame:
    """The exclusion reason of every step (null: analysed).

    ``steps``: every step window in time order, columns ``step`` and ``reason`` (the caller's: "no GPU work",
    "cut by capture window", "phase", or null) and optionally ``phase`` (the steady step is found per phase). ``acts``: the attributed activities (see
    :func:`step_signatures`; category by name). Returns ``step``, ``reason``, ``sig`` (null without activity),
    ``overlap`` (composition overlap with the steady step; null where not compared). ``signatures``:
    :func:`step_signatures` of ``acts``, made beforehand (else here).
    """
    if signatures is None:  # (signatures and compositions in one pass over the pieces of whole steps)
        pieces = by_pieces(lambda p: (_signatures(p), _counts(p)), acts)
        sigs = pl.concat([p[0] for p in pieces])
    else:
        pieces = by_pieces(lambda p: (None, _counts(p)), acts)
        sigs = signatures
    comps = pl.concat([p[1] for p in pieces])  # step, tok (one number per (category, graphed, kind)), c
    del pieces
    phase = pl.col("phase").cast(pl.String).fill_null("unknown") if "phase" in steps.columns else pl.lit("unknown")
    out = steps.select(pl.col("step").cast(pl.Int64), pl.col("reason").cast(pl.String), _ph=phase).with_row_index("_i")
    out = out.join(sigs, on="step", how="left", maintain_order="left")
    # last step: the last one with GPU work that the capture did not cut, of at least MIN_STEPS_FOR_LAST
    worked = out.filter(pl.col("reason").is_null() | (pl.col("reason") == "phase"))
    if worked.height >= MIN_STEPS_FOR_LAST:
        last = int(worked["_i"].max())
        out = out.with_columns(reason=pl.when((pl.col("_i") == last) & pl.col("reason").is_null())
                               .then(pl.lit(LAST_STEP)).otherwise(pl.col("reason")))
    # The steady step of each phase: a window of prefill steps then decode steps (--phase all) has one of each;
    # an unknown step is compared with the unknown ones, or the decode ones where it is alone.
    groups = out.filter(pl.col("reason").is_null() & pl.col("sig").is_not_null()).group_by("_ph").len()
    alone = set(groups.filter(pl.col("len") < 2)["_ph"].to_list())
    if "unknown" in alone and "decode" in groups["_ph"].to_list():
        out = out.with_columns(_ph=pl.when(pl.col("_ph") == "unknown").then(pl.lit("decode")).otherwise("_ph"))
    parts = []
    phases = out["_ph"].unique(maintain_order=True).to_list()
    for ph in phases:  # the window's phases (a handful), not events
        part = out.filter(pl.col("_ph") == ph)
        cand = part.filter(pl.col("reason").is_null() & pl.col("sig").is_not_null())
        if cand.height < 2:
            parts.append(part.with_columns(overlap=pl.lit(None, pl.Float64)))
            continue
        steady_sig = cand["sig"].mode().sort()[0]
        # the last step's sequence is a steady one too: it joins the median composition
        ref = part.filter((pl.col("reason").is_null() | (pl.col("reason") == LAST_STEP)) & pl.col("sig").is_not_null())
        mine = comps if len(phases) == 1 else comps.filter(pl.col("step").is_in(part["step"].implode()))
        ov = _overlap(mine, ref["step"])
        part = part.join(ov, on="step", how="left", maintain_order="left").with_columns(
            overlap=pl.when(pl.col("reason").is_null()).then(pl.col("overlap")))
        parts.append(part.with_columns(reason=pl.when(
            pl.col("reason").is_null() & (pl.col("sig") != steady_sig)
            & (pl.col("overlap") < MIN_COMPOSITION_OVERLAP)).then(pl.lit(TRANSITION)).otherwise(pl.col("reason"))))
    out = pl.concat(parts).sort("_i") if parts else out.with_columns(overlap=pl.lit(None, pl.Float64))
    return out.select("step", "reason", "sig", "overlap")


def reason_counts(excl: pl.DataFrame) -> dict[str, int]:
    """``steps.excluded_reasons``: {reason: count} in the contract's order, reasons with no step left out."""
    counts = dict(excl.filter(pl.col("reason").is_not_null()).group_by("reason").len().iter_rows())
    return {r: int(counts[r]) for r in REASONS if counts.get(r)}
