"""Drafting found by structure when a trace has no draft ranges (contract: Attribution, ``advice.drafting.detection``).

A decode step produces its tokens with ONE forward of the target model, ended by sampling (an argmax, a top-k, a
sampling kernel). A speculative step runs more token-producing forwards: K draft forwards (EAGLE/MTP/a small draft
model, eager or replayed from a CUDA graph: SGLang's draft graph holds all K of them and their top-k), the target's
verify forward over K+1 tokens, and, in SGLang, a draft-extend forward. So:

1. The step's GPU activity, in start order, is cut after every sampling kernel (:data:`SAMPLING_KERNELS`) into
   pieces; a piece with GEMM and attention kernels is a *forward*; a piece of sampling kernels alone (the rest of
   a multi-kernel top-k, split by its memsets) is the tail of the forward before it; other pieces (copies, tree
   building, acceptance glue) join the forward after them, and what follows the step's last forward is no
   forward's.
2. The *target* forward of a step is the one with the most GEMM time (an MTP layer has the target's own shapes,
   but one layer against the target's N: shapes alone cannot tell them apart, GEMM time per forward can).
3. A step with two or more forwards is speculative; every forward but the target's is drafting (graph-replayed or
   eager alike), and the speculative kernels of the taxonomy (tree building, verify sampling, bookkeeping:
   category ``drafting`` by name) count as well.

``detection`` (contract): ``ranges`` when draft ranges matched (the caller's; ranges win), ``structure`` when at
least :data:`MIN_SPEC_SHARE` of the steps have draft forwards, ``kernels`` when only speculative kernels were found,
``not_detected`` otherwise: then the verdict says *drafting not detected*, never *no drafting*.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from tracekit.analyses.phase import name_matches

# Kernels that turn logits into tokens. Sampling proper (greedy argmax, FlashInfer/torch sampling) always counts;
# a generic top-k or max (EAGLE's draft top-k, SGLang's fast_topk) counts only after an lm_head-sized GEMM (below),
# since MoE routers run a top-k in every layer. Softmax alone is not one (eager attention computes softmax too).
SAMPLING_KERNELS = r"ArgMaxOps|ArgMinOps|(?i:argmax)|SamplingFrom(Prob|Logits)|sampleMultinomial|TopPRenormProb"
TOPK_KERNELS = r"gatherTopK|(?i:topk|top_k)|RadixTopK|(sb|mb)topk::|\bMaxOps<"
MOE_ROUTING = r"(?i)routing|gating|moe|expert|_topk_forward|topk_sum_and_topk_idx|topk_softmax"
# A top-k samples tokens when the largest GEMM since the last attention kernel (the lm_head, after the last
# layer) is at least this many times the step's median GEMM: an lm_head reads vocab x hidden weights, several
# times a layer's GEMM; a MoE router's GEMM before its top-k is a small one (0.7-1.4x on the traces here).
LM_HEAD_RATIO = 2.0
MIN_SPEC_SHARE = 0.5  # share of steps with draft forwards from which drafting is found by structure

DETECTIONS = ("ranges", "structure", "kernels", "not_detected")
NOT_DETECTED_VERDICT = ("drafting not detected: no draft ranges, no recognisable draft forward or graph and no "
                        "speculative kernels (pass --draft-range REGEX if the trace marks the draft phase)")


@dataclass
class Drafting:
    """What :func:`detect_drafting` found."""

    detection: str  # ranges | structure | kernels | not_detected
    spec_steps: int  # steps with draft forwards (structure)
    steps: int  # steps looked at
    forwards_per_step: float | None  # median token-producing forwards per speculative step
    draft_forwards_per_step: float | None  # median draft forwards per speculative step
    warning: str | None  # one line naming the method (None for ranges)


def forwards(acts: pl.DataFrame) -> pl.DataFrame:
    """The forwards of every step (see the module docstring), one row per activity of ``acts``, in its order.

    ``acts``: the attributed activities (the breakdown's frame): ``step``, ``start``, ``name``, ``category``,
    ``kind`` (kernel|memop|graph_exec), ``dur``; in start order within each step. Returns ``step``, ``fwd`` (the
    forward the activity belongs to, numbered from 0 within its step; null: after the step's last forward),
    ``is_forward_piece`` and ``gemm_ns`` (the GEMM time of its forward), ``target`` (its forward is the step's
    target forward), ``n_fwd`` (forwards in its step).
    """
    names = acts["name"]
    strong = name_matches(names, SAMPLING_KERNELS)
    topk = name_matches(names, TOPK_KERNELS) & ~name_matches(names, MOE_ROUTING)
    order = None
    step = acts["step"].cast(pl.Int64)
    if not step.is_sorted():  # (steps one after the other in start order: the usual case, no sort)
        order = pl.DataFrame({"s": step}).with_row_index("i").sort("s", "i")["i"]  # (stable)
        acts, strong, topk, step = (x.gather(order) if isinstance(x, pl.Series) else x[order]
                                    for x in (acts, strong, topk, step))
    cat = acts["category"]  # (Enum or String: compared with text either way, no cast of every row)
    kernel = acts["kind"] == "kernel"
    df = pl.DataFrame({"step": step, "dur": acts["dur"], "strong": strong & kernel, "topk": topk & kernel,
                       "gemm": (cat == "gemm").cast(pl.Int64) * acts["dur"], "attn": cat == "attention"})
    new_step = pl.col("step") != pl.col("step").shift(1)
    # The largest GEMM since the last attention kernel of the step, at each row: a running max within groups
    # (group = attention kernels and step starts, numbered in order) as one cum_max of group * 2^40 + duration.
    big = 1 << 40
    df = df.with_columns(g=(pl.col("attn") | new_step.fill_null(True)).cast(pl.Int64).cum_sum())
    df = df.with_columns(tail=(pl.col("g") * big + pl.col("gemm").clip(0, big - 1)).cum_max() - pl.col("g") * big)
    med = (df.filter(pl.col("gemm") > 0).group_by("step").agg(med=pl.col("gemm").median()))
    df = df.join(med, on="step", how="left", maintain_order="left")
    df = df.with_columns(samp=pl.col("strong") | (pl.col("topk") & (pl.col("tail") >= LM_HEAD_RATIO * pl.col("med"))
                                                  .fill_null(False)))
    # pieces, numbered over the whole frame: a piece ends with its sampling kernel or its step
    # (a run of sampling kernels, e.g. the several kernels of one radix top-k, ends ONE piece: the cut comes after
    # its last kernel)
    cut = pl.col("samp").shift(1, fill_value=False) & ~pl.col("samp")
    df = df.with_columns(piece=(cut | new_step.fill_null(True)).cast(pl.Int64).cum_sum() - 1)
    pieces = df.group_by("piece", maintain_order=True).agg(step=pl.col("step").first(), g=pl.col("gemm").sum(),
                                                           a=pl.col("attn").any(), s=pl.col("samp").any())
    pieces = pieces.with_columns(is_fwd=(pl.col("g") > 0) & pl.col("a") & pl.col("s"))
    # forward number of each forward piece within its step; glue pieces join the next forward of their step
    pieces = pieces.with_columns(fwd_here=pl.when(pl.col("is_fwd")).then(
        pl.col("is_fwd").cast(pl.Int64).cum_sum().over("step") - 1))
    # a piece of sampling kernels alone (a multi-kernel top-k split by its memsets) is the tail of the forward
    # before it; other glue (copies, tree building) belongs to the forward after it
    tail = pl.col("s") & ~pl.col("is_fwd")
    pieces = pieces.with_columns(fwd=pl.when(tail).then(pl.col("fwd_here").forward_fill().over("step"))
                                 .otherwise(pl.col("fwd_here").backward_fill().over("step")))
    per_fwd = pieces.filter(pl.col("is_fwd")).group_by("step", "fwd").agg(gemm_ns=pl.col("g").sum())
    per_fwd = per_fwd.with_columns(
        target=(pl.col("gemm_ns") == pl.col("gemm_ns").max().over("step"))
        & (pl.col("fwd") == pl.col("fwd").filter(pl.col("gemm_ns") == pl.col("gemm_ns").max()).min().over("step")),
        n_fwd=pl.len().over("step"))
    pieces = pieces.join(per_fwd, on=["step", "fwd"], how="left", maintain_order="left")
    # back to rows: piece ids are 0..n-1 in order, so a gather
    out = pieces.select("step", "fwd", is_forward_piece="is_fwd", gemm_ns="gemm_ns", target="target",
                        n_fwd=pl.col("n_fwd").fill_null(0).cast(pl.Int64))[df["piece"]]
    if order is not None:
        out = out[order.arg_sort()]
    return out


def detect_drafting(acts: pl.DataFrame, *, ranges_found: bool = False,
                    phases: pl.DataFrame | None = None) -> tuple[pl.Series, Drafting]:
    """Which activities are drafting, and how that was found.

    ``acts``: as :func:`forwards` (the analysed steps' activities; ``category`` by name, so taxonomy drafting
    kernels are already ``drafting``). ``ranges_found``: draft ranges matched (then they decide, and this returns
    detection ``ranges`` with no structural drafting). ``phases`` (step, phase, from
    :func:`tracekit.analyses.phase.step_phases`): only decode and unknown steps are looked at (a training step's
    MoE top-k is no draft). Returns ``(draft, info)``: ``draft`` is one value per row
    of ``acts``: an id per draft forward (unique over the trace; activities of one draft forward share it, so
    its wall span can be measured like a draft range's), null for the rest; kernels that are drafting by name
    alone keep a null id (the caller's category already says drafting).
    """
    steps = int(acts["step"].n_unique()) if acts.height else 0
    none = pl.repeat(None, acts.height, dtype=pl.Int64, eager=True).alias("draft")
    if ranges_found:
        return none, Drafting("ranges", 0, steps, None, None, None)
    if acts.height == 0:
        return none, Drafting("not_detected", 0, 0, None, None, None)
    by_name = int((acts["category"] == "drafting").sum())
    ok = None
    if phases is not None:
        ok = phases.filter(pl.col("phase").is_in(["decode", "unknown"]))["step"].cast(pl.Int64).implode()
        step = acts["step"].cast(pl.Int64)
        steps = int(step.filter(step.is_in(ok)).n_unique())
    # Every forward ends with a sampling or top-k kernel, so a step runs two forwards only if it holds two of them:
    # when too few steps do (a plain decode trace), structure cannot be found and no forward is cut (at ten million
    # kernels, forwards() is a dozen passes over every row).
    names = acts["name"]
    samp = (name_matches(names, SAMPLING_KERNELS) | name_matches(names, TOPK_KERNELS)) & (acts["kind"] == "kernel")
    two = acts.select(pl.col("step").cast(pl.Int64)).filter(samp).group_by("step").len().filter(pl.col("len") >= 2)
    if ok is not None:
        two = two.filter(pl.col("step").is_in(ok))
    if not (steps and two.height >= MIN_SPEC_SHARE * steps):
        return none, _not_structure(by_name, steps, None)
    f = forwards(acts)
    if ok is not None:
        f = f.with_columns(n_fwd=pl.when(pl.col("step").is_in(ok)).then(pl.col("n_fwd")).otherwise(0))
    per_step = f.group_by("step").agg(n=pl.col("n_fwd").first())
    spec = per_step.filter(pl.col("n") >= 2)
    if steps and spec.height >= MIN_SPEC_SHARE * steps:
        is_draft = f["is_forward_piece"].is_not_null() & f["fwd"].is_not_null() & ~f["target"].fill_null(True) \
            & (f["n_fwd"] >= 2)
        key = f.select(pl.when(is_draft).then(pl.struct("step", "fwd")).alias("k"))["k"]
        ids = key.to_frame().select(pl.when(pl.col("k").is_not_null()).then(
            pl.col("k").rank("dense").cast(pl.Int64) - 1).alias("draft"))["draft"]
        n_fwd = float(spec["n"].median())
        info = Drafting("structure", spec.height, steps, n_fwd, n_fwd - 1, None)
        info.warning = (f"no draft ranges: drafting found by structure: {spec.height} of {steps} steps run "
                        f"{n_fwd:g} token-producing forwards, the target's (the most GEMM time) and "
                        f"{n_fwd - 1:g} draft forward{'s' if n_fwd != 2 else ''}; their GPU work (graph-replayed "
                        "or eager) counts as drafting")
        return ids, info
    return none, _not_structure(by_name, steps, float(per_step["n"].median()) if per_step.height else None)


def _not_structure(by_name: int, steps: int, forwards_per_step: float | None) -> Drafting:
    """No draft forwards found: drafting is the ``by_name`` speculative kernels, or not detected."""
    if by_name:
        return Drafting("kernels", 0, steps, None, None,
                        f"no draft ranges and no draft forwards found: drafting is only the {by_name} "
                        "speculative-decoding kernels named by the taxonomy (the draft forwards are not in it)")
    return Drafting("not_detected", 0, steps, forwards_per_step, None, NOT_DETECTED_VERDICT)


def step_forwards(acts: pl.DataFrame) -> pl.DataFrame:
    """The analysed steps' activities with their forward (:func:`forwards`, by name category): ``step``, ``start``,
    ``end``, ``dur``, ``fwd``, ``target``. Computed once per breakdown for :func:`draft_forward_counts` and
    :func:`verify_costs`. ``acts``: the analysed steps' activities with ``name_category`` (attribution adds it to
    speculative traces) or ``category`` by name."""
    cat = "name_category" if "name_category" in acts.columns else "category"
    a = acts.filter(pl.col("step").is_not_null()).select("step", "start", "end", "dur", "name", "kind",
                                                         category=pl.col(cat).cast(pl.String))
    if a.height == 0:
        return a.select("step", "start", "end", "dur", fwd=pl.lit(None, pl.Int64), target=pl.lit(None, pl.Boolean))
    return a.select("step", "start", "end", "dur").hstack(forwards(a).select("fwd", "target"))


def draft_forward_counts(x: pl.DataFrame) -> tuple[int, int] | None:
    """How many times a speculative step reads the draft model: ``(draft_forwards, before_target)`` — every
    forward that is not the target's (SGLang: K draft forwards and the draft-extend forward after the verify), and
    those before the target's (K, the draft tokens). Medians over the steps that have a target forward; None when
    none has. ``x``: :func:`step_forwards`.
    """
    f = x.select("step", "fwd", "target").filter(pl.col("fwd").is_not_null()).unique()
    t = f.filter(pl.col("target").fill_null(False)).select("step", t_fwd="fwd")
    if t.height == 0:
        return None
    per = (f.filter(~pl.col("target").fill_null(False)).join(t, on="step", how="right")
           .group_by("step").agg(n=pl.col("fwd").count(), before=(pl.col("fwd") < pl.col("t_fwd")).sum()))
    return int(per["n"].median()), int(per["before"].median())


def verify_costs(x: pl.DataFrame) -> tuple[float | None, float | None, float | None]:
    """What the step without speculation would keep of a speculative step, from its forwards
    (``x``: :func:`step_forwards`): ``(verify_ms, verify_busy_ms, token_factor)``.

    ``verify_ms``: the mean wall span of each step's target (verify) forward on the GPU timeline, its sampling
    included; ``verify_busy_ms``: the GPU time of its work (the part that scales with tokens: the launch gaps of an
    eager forward do not). ``token_factor``: how much more a forward over K+1 tokens costs than over one, measured
    on the draft model itself when the step holds both (SGLang's draft-extend forward runs K+1 tokens after the
    verify, its draft graph one token per forward): GPU time of the draft forward after the target's / the mean of
    those before it; None when the step has no such pair.
    """
    tgt = x.filter(pl.col("target").fill_null(False))
    if tgt.height == 0:
        return None, None, None
    per = tgt.group_by("step").agg(span=pl.col("end").max() - pl.col("start").min(), busy=pl.col("dur").sum(),
                                   t_fwd=pl.col("fwd").first())
    verify_ms = float(per["span"].mean()) / 1e6
    verify_busy_ms = min(float(per["busy"].mean()) / 1e6, verify_ms)
    d = (x.filter(~pl.col("target").fill_null(True) & pl.col("fwd").is_not_null())
         .join(per.select("step", "t_fwd"), on="step").group_by("step", "fwd")
         .agg(busy=pl.col("dur").sum(), after=(pl.col("fwd") > pl.col("t_fwd")).first()))
    ratio = (d.group_by("step").agg(pre=pl.col("busy").filter(~pl.col("after")).mean(),
                                    post=pl.col("busy").filter(pl.col("after")).mean())
             .filter(pl.col("pre").is_not_null() & pl.col("post").is_not_null() & (pl.col("pre") > 0))
             .select(r=pl.col("post") / pl.col("pre"))["r"])
    factor = float(ratio.median()) if ratio.len() else None
    if factor is not None:
        factor = min(max(factor, 1.0), 2.0)  # (a K+1-token forward costs at least one token's, and not 2x here)
    return verify_ms, verify_busy_ms, factor
