"""Drafting found by structure when a trace has no draft ranges (contract: Attribution, ``advice.drafting``).

A decode step produces its tokens with ONE forward of the target model, ended by sampling (an argmax, a top-k, a
sampling kernel). A speculative step runs more token-producing forwards: K draft forwards (EAGLE/MTP/a small draft
model, eager or replayed from a CUDA graph: SGLang's draft graph holds all K of them and their top-k), the target's
verify forward over K+1 tokens, and, in SGLang, a draft-extend forward. So:

1. A forward is a run of layers, whether or not it samples (contract, "Forwards and re-costs by structure"). The
   step's GPU activity, in start order, is cut after every sampling kernel (:data:`SAMPLING_KERNELS`), and where
   one forward's layers run into the next without sampling between them (SGLang's draft-extend fills the draft's
   KV cache and samples nothing): the run of kernels between two attention kernels recurs layer after layer inside
   a forward, so one that occurs once in its step, without sampling, holds the end of one forward and the start of
   the next (:func:`_layer_cuts`). A piece with GEMM and attention kernels ended by either cut, or by the step's
   end (SGLang's draft-extend that samples nothing runs last), is a *forward*; a
   piece of sampling kernels alone (the rest of a multi-kernel top-k, split by its memsets) is the tail of the
   forward before it; other pieces (copies, tree building, acceptance glue) join the forward after them, and what
   follows the step's last forward is no forward's.
2. The *target* forward of a step is the one with the most GEMM time (an MTP layer has the target's own shapes,
   but one layer against the target's N: shapes alone cannot tell them apart, GEMM time per forward can).
3. A step is speculative only on *positive evidence of a draft model distinct from the target* (contract,
   "Drafting by structure needs positive evidence"): besides the target forward it runs at least
   :data:`MIN_DRAFT_FORWARDS` forwards of one smaller model — each with at most 1/:data:`TARGET_RATIO` of the
   target forward's layers (attention kernels) and of its layers' GEMMs (one lm_head each aside), their GEMM counts
   within :data:`DRAFT_SPREAD` of each other (one model run again), and all of them together no more layers than
   the target forward or no more than :data:`MAX_DRAFT_FORWARDS` of them (an engine's K) — or at least
   :data:`REPEAT_FORWARDS` forwards of one model with the same layers and GEMMs each, each with less GEMM time than
   the heaviest forward, which is another model (a draft as deep as its target but narrower). A cut that is
   no draft model fails it: an MoE router's or an adapter's top-k taken for sampling cuts the target into
   one-layer pieces (dozens a step, together far more layers than the "target"), a piecewise graph's pieces or a
   second stream's kernels are no forward of their own, and sampling kernels alone are no forward at all.
4. In the speculative steps every forward but the target's is drafting (graph-replayed or eager alike), and the
   speculative kernels of the taxonomy (tree building, verify sampling, bookkeeping: category ``drafting`` by
   name) count as well.

``detection`` (contract): ``ranges`` when draft ranges matched (the caller's; ranges win), ``structure`` when at
least :data:`MIN_SPEC_SHARE` of the steps show a draft model, ``kernels`` when only speculative kernels were found,
``not_detected`` otherwise: then the verdict says *drafting not detected*, never *no drafting*. ``evidence`` lists
the facts the detection rests on (or what was looked for and not found). ``--draft-range none`` turns detection
off (:func:`is_off`): ``not_detected`` with evidence saying so.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import polars as pl

from tracekit.analyses.phase import name_matches

# Kernels that turn logits into tokens. Sampling proper (greedy argmax, FlashInfer/torch sampling) always counts;
# a generic top-k or max (EAGLE's draft top-k, SGLang's fast_topk) counts only after an lm_head-sized GEMM (below),
# since MoE routers run a top-k in every layer. Softmax alone is not one (eager attention computes softmax too).
SAMPLING_KERNELS = r"ArgMaxOps|ArgMinOps|(?i:argmax)|SamplingFrom(Prob|Logits)|sampleMultinomial|TopPRenormProb"
TOPK_KERNELS = r"gatherTopK|(?i:topk|top_k)|RadixTopK|(sb|mb)topk::|\bMaxOps<"
MOE_ROUTING = r"(?i)routing|gating|moe|expert|_topk_forward|topk_sum_and_topk_idx|topk_softmax"
# Adapter GEMMs (LoRA shrink/expand: SGLang's _sgemm_lora_a/_b, punica's sgmv/bgmv): tiny, several per layer; left
# out of the step's median GEMM, which they would pull down until a layer's o_proj looks like an lm_head.
ADAPTER_GEMMS = r"(?i)lora|sgmv|bgmv|punica"
# A top-k samples tokens when the largest GEMM since the last attention kernel (the lm_head, after the last
# layer) is at least this many times the step's median GEMM: an lm_head reads vocab x hidden weights, several
# times a layer's GEMM; a MoE router's GEMM before its top-k is a small one (0.7-1.4x on the traces here).
LM_HEAD_RATIO = 2.0
MIN_SPEC_SHARE = 0.5  # share of steps showing a draft model from which drafting is found by structure
# Positive evidence of a draft model (module docstring, 3.): a draft forward has at most 1/TARGET_RATIO of the
# target forward's attention kernels and GEMMs (an MTP/EAGLE layer: 1 of 24-61; HF's 2-layer draft: 2 of 24);
# the draft model runs at least MIN_DRAFT_FORWARDS times a step, its forwards' GEMM counts within DRAFT_SPREAD of
# each other (the (K+1)-token draft-extend may split a GEMM differently: a split-K reduce more or less). One draft
# forward a step is the engines' K = 1, the usual MTP setting (SGLang --speculative-num-steps 1: its draft graph runs
# num_steps - 1 = 0 forwards, the draft-extend after the verify is the one; vLLM num_speculative_tokens 1: one
# proposer forward); the other conditions (a model of at most 1/TARGET_RATIO of the target's layers and GEMMs,
# ending in sampling, in at least MIN_SPEC_SHARE of the steps) carry the evidence.
#
# Each model's forward has one lm_head GEMM whatever its depth, so the GEMM ratio is taken over the layers' GEMMs (a
# 4-layer draft of an 8-layer target: 17 GEMMs against 33, half the layers). Together the draft forwards hold no
# more layers than the target forward, or there are at most MAX_DRAFT_FORWARDS of them: the engines' K (SGLang's
# num_steps, vLLM's num_speculative_tokens, an MTP module per token) is a handful, where a MoE router's top-k taken
# for sampling cuts a 27-61-layer target into one piece a layer. A draft model may also be as deep as the target
# and narrower (a random zoo shape: 3 draft layers of a 3-layer target): at least REPEAT_FORWARDS forwards a step
# of one model -- the same layers and GEMMs each, each with less GEMM time than the heaviest forward -- beside one
# forward of another is a draft model run K times and a target verifying once.
TARGET_RATIO = 2
HOST_READ = r"Device-to-Host|DtoH"  # a device-to-host copy: the host reads device data (nsys and Kineto names)
MIN_DRAFT_FORWARDS = 1
DRAFT_SPREAD = 1.5
MAX_DRAFT_FORWARDS = 10
REPEAT_FORWARDS = 2

DETECTIONS = ("ranges", "engine", "structure", "kernels", "not_detected")
OFF = "none"  # --draft-range none: no draft ranges, no structure, no speculative kernels
OFF_EVIDENCE = "drafting detection turned off by --draft-range none"
NOT_DETECTED_VERDICT = ("drafting not detected: no draft ranges, no recognisable draft graph and no speculative "
                        "kernels (pass --draft-range REGEX if the trace marks them)")
SPEC_KERNELS_ABSENT = "no speculative-decoding kernels by name (tree building, verify sampling, draft bookkeeping)"


def is_off(draft_range: str | None) -> bool:
    """``--draft-range none``: drafting detection turned off (no ranges, no structure, no speculative kernels).

    >>> is_off("none"), is_off("None"), is_off(r"(?i)\bdraft"), is_off(None)
    (True, True, False, False)
    """
    return isinstance(draft_range, str) and draft_range.strip().lower() == OFF


@dataclass(frozen=True)
class Drafting:
    """What :func:`detect_drafting` found."""

    detection: str  # ranges | structure | kernels | not_detected
    spec_steps: int  # steps showing a draft model (structure)
    steps: int  # steps looked at
    forwards_per_step: float | None  # median token-producing forwards per speculative step
    draft_forwards_per_step: float | None  # median draft forwards per speculative step
    warning: str | None  # one line naming the method (None for ranges)
    evidence: tuple[str, ...] = ()  # the facts the detection rests on, or what was looked for and not found
    # most steps hold one token-producing forward at most (fewer than two sampling / top-k kernels): with other
    # evidence of speculation, the proposals come without a draft model (n-gram)
    single_forward: bool = False


def _forward_parts(acts: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """:func:`forwards`' rows, and one row per forward: ``step``, ``fwd``, ``gemm_ns``, ``n_gemm``, ``n_attn``
    (GEMM time, GEMM and attention kernels of its forward pieces), ``target``, ``n_fwd``."""
    names = acts["name"]
    strong = name_matches(names, SAMPLING_KERNELS)
    topk = name_matches(names, TOPK_KERNELS) & ~name_matches(names, MOE_ROUTING)
    adapter = name_matches(names, ADAPTER_GEMMS)
    order = None
    step = acts["step"].cast(pl.Int64)
    if not step.is_sorted():  # (steps one after the other in start order: the usual case, no sort)
        order = pl.DataFrame({"s": step}).with_row_index("i").sort("s", "i")["i"]  # (stable)
        acts, strong, topk, adapter, step = (x.gather(order) if isinstance(x, pl.Series) else x[order]
                                             for x in (acts, strong, topk, adapter, step))
    cat = acts["category"]  # (Enum or String: compared with text either way, no cast of every row)
    kernel = acts["kind"] == "kernel"
    is_gemm = (cat == "gemm") & kernel
    read = (acts["kind"] == "memop") & name_matches(acts["name"], HOST_READ)
    df = pl.DataFrame({"step": step, "dur": acts["dur"], "strong": strong & kernel, "topk": topk & kernel,
                       "gemm": is_gemm.cast(pl.Int64) * acts["dur"], "is_gemm": is_gemm,
                       "attn": (cat == "attention") & kernel, "adapter": adapter, "read": read})
    new_step = pl.col("step") != pl.col("step").shift(1)
    # The largest GEMM since the last attention kernel of the step, at each row: a running max within groups
    # (group = attention kernels and step starts, numbered in order) as one cum_max of group * 2^40 + duration.
    big = 1 << 40
    df = df.with_columns(g=(pl.col("attn") | new_step.fill_null(True)).cast(pl.Int64).cum_sum())
    df = df.with_columns(tail=(pl.col("g") * big + pl.col("gemm").clip(0, big - 1)).cum_max() - pl.col("g") * big)
    med = (df.filter((pl.col("gemm") > 0) & ~pl.col("adapter")).group_by("step").agg(med=pl.col("gemm").median()))
    df = df.join(med, on="step", how="left", maintain_order="left")
    df = df.with_columns(samp=pl.col("strong") | (pl.col("topk") & (pl.col("tail") >= LM_HEAD_RATIO * pl.col("med"))
                                                  .fill_null(False)))
    # pieces, numbered over the whole frame: a piece ends with its sampling kernel or its step
    # (a run of sampling kernels, e.g. the several kernels of one radix top-k, ends ONE piece: the cut comes after
    # its last kernel)
    cut = pl.col("samp").shift(1, fill_value=False) & ~pl.col("samp")
    # a forward is a run of layers, whether or not it samples: where one forward's layers run into the next without
    # a sampling kernel between them (SGLang's draft-extend fills the draft's KV cache and samples nothing), the
    # segment between their attention kernels is no layer of either (_layer_cuts)
    start = acts["start"].cast(pl.Int64)
    end = acts["end"].cast(pl.Int64) if "end" in acts.columns else start + acts["dur"].cast(pl.Int64)
    df = df.with_columns(layer_cut=_layer_cuts(df.select("step", "g", "attn", "samp").with_columns(
        kernel=kernel, code=_name_codes(acts["name"]), start=start, end=end)))
    df = df.with_columns(piece=(cut | pl.col("layer_cut") | new_step.fill_null(True)).cast(pl.Int64).cum_sum() - 1)
    pieces = df.group_by("piece", maintain_order=True).agg(
        step=pl.col("step").first(), g=pl.col("gemm").sum(), ng=pl.col("is_gemm").sum(), na=pl.col("attn").sum(),
        s=pl.col("samp").any(), lc=pl.col("layer_cut").first())
    # (a piece ended by a layer cut is a forward as one ended by sampling is)
    layer_end = pl.col("lc").shift(-1).fill_null(False) & (pl.col("step").shift(-1) == pl.col("step")).fill_null(False)
    # ... and so is a run of layers that the step's end ends: SGLang's draft-extend when it samples nothing runs
    # last in the step, after the verify forward's sampling (a plain decode step never gets here: it holds one
    # sampling kernel)
    pieces = pieces.with_columns(step_end=(pl.col("step").shift(-1) != pl.col("step")).fill_null(True))
    pieces = pieces.with_columns(
        is_fwd=(pl.col("g") > 0) & (pl.col("na") > 0) & (pl.col("s") | layer_end | pl.col("step_end")))
    # forward number of each forward piece within its step; glue pieces join the next forward of their step
    pieces = pieces.with_columns(fwd_here=pl.when(pl.col("is_fwd")).then(
        pl.col("is_fwd").cast(pl.Int64).cum_sum().over("step") - 1))
    # a piece of sampling kernels alone (a multi-kernel top-k split by its memsets) is the tail of the forward
    # before it; other glue (copies, tree building) belongs to the forward after it
    tail = pl.col("s") & ~pl.col("is_fwd")
    pieces = pieces.with_columns(fwd=pl.when(tail).then(pl.col("fwd_here").forward_fill().over("step"))
                                 .otherwise(pl.col("fwd_here").backward_fill().over("step")))
    per_fwd = pieces.filter(pl.col("is_fwd")).group_by("step", "fwd", maintain_order=True).agg(
        gemm_ns=pl.col("g").sum(), n_gemm=pl.col("ng").sum(), n_attn=pl.col("na").sum(),
        trailing=(pl.col("step_end") & ~pl.col("s")).any())
    per_fwd = per_fwd.with_columns(
        target=(pl.col("gemm_ns") == pl.col("gemm_ns").max().over("step"))
        & (pl.col("fwd") == pl.col("fwd").filter(pl.col("gemm_ns") == pl.col("gemm_ns").max()).min().over("step")),
        n_fwd=pl.len().over("step"))
    pieces = pieces.join(per_fwd.select("step", "fwd", "gemm_ns", "target", "n_fwd"), on=["step", "fwd"],
                         how="left", maintain_order="left")
    # back to rows: piece ids are 0..n-1 in order, so a gather
    out = pieces.select("step", "fwd", is_forward_piece="is_fwd", gemm_ns="gemm_ns", target="target",
                        n_fwd=pl.col("n_fwd").fill_null(0).cast(pl.Int64))[df["piece"]]
    out = _acceptance_tail(out, df, per_fwd)
    if order is not None:
        out = out[order.arg_sort()]
    return out, per_fwd


def _name_codes(names: pl.Series) -> pl.Series:
    """A small integer per distinct name (an Enum's or Categorical's code, else a hash), to compare kernel
    sequences."""
    if isinstance(names.dtype, (pl.Enum, pl.Categorical)):
        return names.to_physical().cast(pl.Int64)
    return (names.cast(pl.String).hash() % 1_000_003).cast(pl.Int64)


def _layer_cuts(d: pl.DataFrame) -> pl.Series:
    """Where one forward's layers run into the next forward's without a sampling kernel between them: True at the
    first activity of the later forward.

    ``d``: one row per activity in start order within each step: ``step``, ``g`` (a group that starts at each
    attention kernel and at each step's start), ``attn``, ``samp``, ``kernel``, ``code`` (:func:`_name_codes`),
    ``start``, ``end``. A layer is the run of kernels from one attention kernel to the next; within one forward the
    same run recurs layer after layer (a hybrid model's several layer kinds each recur), so a run between two
    attention kernels whose kernel sequence occurs once in its step, with no sampling in it, and whose two attention
    kernels differ (forwards over different tokens: SGLang's draft-extend over K+1 then a one-token draft forward)
    is no layer: it holds the end of one forward and the start of the next. A layer kind that occurs once in a
    forward with the same attention kernel (the dense layers before a MoE model's expert layers) is no cut. The cut is placed before the activity after the run's longest
    GPU idle gap (the launch of the next forward, eager or a new graph); activities around it are glue either
    way."""
    x = d.with_row_index("i").with_columns(
        pos=pl.int_range(pl.len()).over("g"),
        gap=(pl.col("start") - pl.col("end").cum_max().shift(1).over("step")).fill_null(0))
    k = pl.col("kernel") & (pl.col("pos") > 0)
    # an order-sensitive signature of the run's kernels (memory operations left out: allocator memsets come and go)
    rank = pl.col("kernel").cast(pl.Int64).cum_sum().over("g")
    x = x.with_columns(w=pl.when(k).then(pl.col("code") * ((rank * 2654435761) % 1_000_003 + 1)).otherwise(0))
    seg = x.group_by("g", maintain_order=True).agg(
        step=pl.col("step").first(), opens=pl.col("attn").first(), samp=pl.col("samp").any(), a=pl.col("code").first(),
        n=k.sum(), sig=pl.col("w").sum(), sig2=pl.col("code").filter(k).sum(),
        cut_i=pl.col("i").filter(pl.col("pos") > 0).sort_by(pl.col("gap").filter(pl.col("pos") > 0)).last())
    # ... and the attention kernels on its two sides differ: the two forwards run over different tokens (a kernel's
    # name changes with the tokens it runs over), where a layer kind that occurs once in a forward (the dense layers
    # before a MoE model's first expert layer) keeps its attention kernel
    seg = seg.with_columns(closed=pl.col("opens").shift(-1).fill_null(False)
                           & (pl.col("step").shift(-1) == pl.col("step")).fill_null(False)
                           & (pl.col("a").shift(-1) != pl.col("a")).fill_null(False))
    # (the run's signature holds its two attention kernels: a hybrid's linear-to-full transition recurs as one)
    seg = seg.with_columns(a_next=pl.col("a").shift(-1).fill_null(-1))
    seg = seg.with_columns(seen=pl.len().over("step", "n", "sig", "sig2", "a", "a_next"))
    hit = seg.filter(pl.col("opens") & pl.col("closed") & ~pl.col("samp") & (pl.col("n") > 0)
                     & (pl.col("seen") == 1))["cut_i"]
    out = pl.repeat(False, d.height, dtype=pl.Boolean, eager=True).alias("layer_cut")
    if hit.len():
        out = out.scatter(hit.cast(pl.Int64), True)
    return out


def _acceptance_tail(out: pl.DataFrame, df: pl.DataFrame, per_fwd: pl.DataFrame) -> pl.DataFrame:
    """``out`` with the target forward's acceptance taken out of the forward after it: every engine reads what was
    accepted to the host before its draft model runs again (SGLang's accept, with its state restores, then the
    draft-extend; vLLM's rejection sampling and token read, then the proposer). The rows of a forward after the target
    forward, up to its last host read before its first GEMM or attention kernel, are no forward's (``fwd`` null):
    acceptance, neither draft work nor the verify forward's."""
    if not bool(df["read"].any()):
        return out
    t = per_fwd.filter(pl.col("target")).select("step", t_fwd="fwd")
    rows = out.select("step", "fwd").hstack(df.select("read", compute=pl.col("is_gemm") | pl.col("attn"))) \
        .with_row_index("i").join(t, on="step", how="left", maintain_order="left")
    after = rows.filter(pl.col("fwd") > pl.col("t_fwd"))
    if after.height == 0:
        return out
    first = after.group_by("step", "fwd").agg(first=pl.col("i").filter("compute").min())
    cut = (after.join(first, on=["step", "fwd"]).filter(pl.col("read") & (pl.col("i") < pl.col("first")))
           .group_by("step", "fwd").agg(last_read=pl.col("i").max()))
    if cut.height == 0:
        return out
    hit = rows.join(cut, on=["step", "fwd"], how="left", maintain_order="left")
    mask = (hit["i"] <= hit["last_read"]).fill_null(False)
    return out.with_columns(fwd=pl.when(mask).then(None).otherwise(pl.col("fwd")),
                            is_forward_piece=pl.when(mask).then(False).otherwise(pl.col("is_forward_piece")))


def forwards(acts: pl.DataFrame) -> pl.DataFrame:
    """The forwards of every step (see the module docstring), one row per activity of ``acts``, in its order.

    ``acts``: the attributed activities (the breakdown's frame): ``step``, ``start``, ``name``, ``category``,
    ``kind`` (kernel|memop|graph_exec), ``dur``; in start order within each step. Returns ``step``, ``fwd`` (the
    forward the activity belongs to, numbered from 0 within its step; null: after the step's last forward),
    ``is_forward_piece`` and ``gemm_ns`` (the GEMM time of its forward), ``target`` (its forward is the step's
    target forward), ``n_fwd`` (forwards in its step).
    """
    return _forward_parts(acts)[0]


def draft_model_steps(per_fwd: pl.DataFrame) -> pl.DataFrame:
    """Per step with two or more forwards (``per_fwd``: :func:`_forward_parts`' table), the shape of the forwards
    besides the target's and whether they show a draft model (module docstring, 3.): ``step``, ``n_draft``,
    ``before`` (those before the target forward), ``d_attn`` / ``d_gemm`` (the largest draft forward's attention
    kernels and GEMMs), ``d_attn_sum``, ``d_gemm_min``, ``t_attn`` / ``t_gemm`` (the target forward's), ``spec``."""
    t = per_fwd.filter(pl.col("target")).select("step", t_fwd="fwd", t_attn="n_attn", t_gemm="n_gemm",
                                                 t_ns="gemm_ns")
    # The forward the step's end ends, sampling nothing, computes no logits (SGLang's draft-extend that samples
    # nothing: 12 GEMMs where its draft forwards have 13): its GEMMs are compared as if it had the lm_head too
    d = per_fwd.filter(~pl.col("target")).join(t, on="step")
    if "trailing" in d.columns:
        d = d.with_columns(n_gemm=pl.col("n_gemm") + pl.col("trailing").cast(pl.UInt32))
    # Two draft forwards with no sampling kernel and no layer cut between them are one piece: the one forward of a
    # step that may end without sampling is SGLang's draft-extend, and when the draft forward after it runs over as
    # many tokens, no layer cut tells them apart. So one piece a step whose layers and GEMMs are both exactly twice
    # the step's smallest draft forward's is two forwards of that model (never more: a target cut into pieces by a
    # second stream's sampling gives pieces of any multiple).
    a0, g0 = pl.col("n_attn").min().over("step"), pl.col("n_gemm").min().over("step")
    double = (a0 > 0) & (pl.col("n_attn") == 2 * a0) & (pl.col("n_gemm") == 2 * g0)
    d = d.with_columns(m=pl.when(double & (double.sum().over("step") == 1)).then(2).otherwise(1).cast(pl.UInt32))
    d = d.with_columns(u_attn=pl.col("n_attn") // pl.col("m"), u_gemm=pl.col("n_gemm") // pl.col("m"),
                       u_ns=pl.col("gemm_ns") // pl.col("m"))
    per = d.group_by("step").agg(
        n_draft=pl.col("m").sum(), before=pl.col("m").filter(pl.col("fwd") < pl.col("t_fwd")).sum(),
        d_attn=pl.col("u_attn").max(), d_attn_min=pl.col("u_attn").min(), d_attn_sum=pl.col("n_attn").sum(),
        d_gemm=pl.col("u_gemm").max(), d_gemm_min=pl.col("u_gemm").min(), d_ns=pl.col("u_ns").max(),
        t_attn=pl.col("t_attn").first(), t_gemm=pl.col("t_gemm").first(), t_ns=pl.col("t_ns").first())
    # a smaller model: at most 1/TARGET_RATIO of the target forward's layers and of its layers' GEMMs (one lm_head
    # each aside), all of them together no more layers than the target or no more forwards than an engine's K
    smaller = ((pl.col("t_attn") >= TARGET_RATIO * pl.col("d_attn"))
               & (pl.col("t_gemm") - 1 >= TARGET_RATIO * (pl.col("d_gemm") - 1))
               & ((pl.col("d_attn_sum") <= pl.col("t_attn")) | (pl.col("n_draft") <= MAX_DRAFT_FORWARDS)))
    # ... or one other model run again and again: the same layers and GEMMs each forward, each lighter than the
    # heaviest, which is another model (other layers or GEMMs)
    repeated = ((pl.col("n_draft") >= REPEAT_FORWARDS) & (pl.col("n_draft") <= MAX_DRAFT_FORWARDS)
                & (pl.col("d_attn") == pl.col("d_attn_min")) & (pl.col("d_gemm") == pl.col("d_gemm_min"))
                & (pl.col("d_ns") < pl.col("t_ns"))
                & ((pl.col("d_attn") != pl.col("t_attn")) | (pl.col("d_gemm") != pl.col("t_gemm"))))
    return per.with_columns(spec=(pl.col("n_draft") >= MIN_DRAFT_FORWARDS)
                            & (smaller | repeated)
                            & (pl.col("d_gemm") <= DRAFT_SPREAD * pl.col("d_gemm_min"))).sort("step")


def _n(x: float, one: str, many: str | None = None) -> str:
    """``3 forwards``, ``1 forward``.

    >>> _n(3, "forward"), _n(1.0, "layer"), _n(2.5, "GEMM")
    ('3 forwards', '1 layer', '2.5 GEMMs')
    """
    return f"{x:g} {one if x == 1 else (many or one + 's')}"


def spec_kernel_evidence(acts: pl.DataFrame, limit: int = 3) -> str | None:
    """The speculative-decoding kernels by name in ``acts`` (category ``drafting`` by name), the most frequent
    first with their counts, e.g. ``"speculative-decoding kernels by name: build_tree_efficient x16"``."""
    k = acts.filter((pl.col("category") == "drafting") & (pl.col("kind") == "kernel"))
    if k.height == 0:
        return None
    top = (k.group_by(pl.col("name").cast(pl.String)).len().sort(["len", "name"], descending=[True, False]))
    names = ", ".join(f"{n[:60]} x{c}" for n, c in top.head(limit).iter_rows())
    more = f" and {top.height - limit} more" if top.height > limit else ""
    return f"speculative-decoding kernels by name: {names}{more} ({k.height} kernels in the analysed steps)"


def detect_drafting(acts: pl.DataFrame, *, ranges_found: bool = False,
                    phases: pl.DataFrame | None = None) -> tuple[pl.Series, Drafting]:
    # (``phases``: step, phase, source. Speculation never waits for the phase (contract, Additions to /3): every step
    # is looked at but training steps (a training step's MoE top-k is no draft) and steps the engine's own annotation
    # calls prefill or mixed; a speculative step is then made decode by the caller.)
    """Which activities are drafting, and how that was found.

    ``acts``: as :func:`forwards` (the analysed steps' activities; ``category`` by name, so taxonomy drafting
    kernels are already ``drafting``). ``ranges_found``: draft ranges matched (then they decide, and this returns
    detection ``ranges`` with no structural drafting). ``phases`` (step, phase, from
    :func:`tracekit.analyses.phase.step_phases`): every step is looked at but training steps and those an engine
    annotation calls prefill or mixed. Returns ``(draft, info)``: ``draft`` is one value per row
    of ``acts``: an id per draft forward (unique over the trace; activities of one draft forward share it, so
    its wall span can be measured like a draft range's), null for the rest; kernels that are drafting by name
    alone keep a null id (the caller's category already says drafting).
    """
    steps = int(acts["step"].n_unique()) if acts.height else 0
    none = pl.repeat(None, acts.height, dtype=pl.Int64, eager=True).alias("draft")
    if ranges_found:
        return none, Drafting("ranges", 0, steps, None, None, None)
    if acts.height == 0:
        return none, Drafting("not_detected", 0, 0, None, None, NOT_DETECTED_VERDICT,
                              ("no GPU activity in the analysed steps",))
    ok = None
    if phases is not None:
        src = pl.col("source").fill_null("") if "source" in phases.columns else pl.lit("")
        out = (pl.col("phase") == "training") | ((src == "annotation") & pl.col("phase").is_in(["prefill", "mixed"]))
        ok = phases.filter(~out)["step"].cast(pl.Int64).implode()
        # (the distinct steps first, then membership: a few thousand values, not ten million; null is in no list)
        steps = int(acts["step"].cast(pl.Int64).unique().is_in(ok).sum())
    # Every forward ends with a sampling or top-k kernel, so a step runs two forwards only if it holds two of them:
    # when too few steps do (a plain decode trace), structure cannot be found and no forward is cut (at ten million
    # kernels, forwards() is a dozen passes over every row).
    names = acts["name"]
    samp = (name_matches(names, SAMPLING_KERNELS) | name_matches(names, TOPK_KERNELS)) & (acts["kind"] == "kernel")
    two = acts.select(pl.col("step").cast(pl.Int64)).filter(samp).group_by("step").len().filter(pl.col("len") >= 2)
    if ok is not None:
        two = two.filter(pl.col("step").is_in(ok))
    if not steps:
        return none, _not_structure(acts, steps, None, (
            "no step to look at (every step is a training step or one the engine annotates as prefill)",))
    if two.height < MIN_SPEC_SHARE * steps:
        return none, replace(_not_structure(acts, steps, None, (
            f"no second token-producing forward: {two.height} of {steps} steps hold two or more sampling or "
            "top-k kernels",)), single_forward=True)
    rows, per_fwd = _forward_parts(acts)
    if ok is not None:
        per_fwd = per_fwd.filter(pl.col("step").is_in(ok))
    per = draft_model_steps(per_fwd)
    spec = per.filter(pl.col("spec"))
    if steps and spec.height >= MIN_SPEC_SHARE * steps:
        in_spec = rows["step"].is_in(spec["step"].implode())
        is_draft = rows["fwd"].is_not_null() & ~rows["target"].fill_null(True) & in_spec
        key = rows.select(pl.when(is_draft).then(pl.struct("step", "fwd")).alias("k"))["k"]
        ids = key.to_frame().select(pl.when(pl.col("k").is_not_null()).then(
            pl.col("k").rank("dense").cast(pl.Int64) - 1).alias("draft"))["draft"]
        med = {c: float(spec[c].median()) for c in ("n_draft", "before", "d_attn", "d_gemm", "t_attn", "t_gemm")}
        k, after = med["n_draft"], med["n_draft"] - med["before"]
        evidence = (
            f"{spec.height} of {steps} steps run {_n(k, 'draft forward')} besides the target forward: "
            f"{med['before']:g} before it" + (f" and {after:g} after it" if after else ""),
            f"the draft forwards are a smaller model: {_n(med['d_attn'], 'layer')} and {_n(med['d_gemm'], 'GEMM')} "
            f"a forward against the target forward's {_n(med['t_attn'], 'layer')} and {_n(med['t_gemm'], 'GEMM')} "
            "(layers counted by attention kernels; a forward is a run of layers, ended by a sampling or top-k kernel "
            "or by the next forward's layers)",
        )
        n_fwd = k + 1
        warning = (f"no draft ranges: drafting found by structure: {spec.height} of {steps} steps run {n_fwd:g} "
                   f"token-producing forwards, the target's ({_n(med['t_attn'], 'layer')}, the most GEMM time) and "
                   f"{_n(k, 'draft forward')} of a {med['d_attn']:g}-layer model; their GPU work (graph-replayed "
                   "or eager) counts as drafting")
        return ids, Drafting("structure", spec.height, steps, n_fwd, k, warning, evidence)
    multi = per.height
    if not multi:
        return none, _not_structure(acts, steps, 1.0, (
            f"no second token-producing forward: {two.height} of {steps} steps hold two or more sampling or "
            "top-k kernels, but no second one ends a forward (a top-k after a small GEMM is an MoE router's, not "
            "sampling)",))
    med = {c: float(per[c].median()) for c in ("n_draft", "d_attn", "d_attn_sum", "d_gemm", "t_attn", "t_gemm")}
    why = (f"no draft model: {multi} of {steps} steps run two or more token-producing forwards, but "
           f"{'none shows' if spec.height == 0 else f'only {spec.height} show'} a model distinct from the target: "
           f"besides the heaviest forward ({_n(med['t_attn'], 'layer')}, {_n(med['t_gemm'], 'GEMM')}) they run "
           f"{_n(med['n_draft'], 'forward')} of up to {_n(med['d_attn'], 'layer')} ({med['d_attn_sum']:g} in all) "
           f"and {_n(med['d_gemm'], 'GEMM')} (a draft model runs at least {_n(MIN_DRAFT_FORWARDS, 'forward')} a step, "
           f"each at most 1/{TARGET_RATIO} of the target's layers and GEMMs, all together no more layers than the "
           f"target or at most {MAX_DRAFT_FORWARDS} forwards; or at least {REPEAT_FORWARDS} forwards of one model "
           "other than the heaviest, each lighter)")
    return none, _not_structure(acts, steps, med["n_draft"] + 1, (why,))


def _not_structure(acts: pl.DataFrame, steps: int, forwards_per_step: float | None,
                   why: tuple[str, ...]) -> Drafting:
    """No draft model found: drafting is the speculative kernels named by the taxonomy, or not detected."""
    by_name = spec_kernel_evidence(acts)
    if by_name:
        n = int(((acts["category"] == "drafting") & (acts["kind"] == "kernel")).sum())
        return Drafting("kernels", 0, steps, None, None,
                        f"no draft ranges and no draft forwards found: drafting is only the {n} "
                        "speculative-decoding kernels named by the taxonomy (the draft forwards are not in it)",
                        (by_name, *why))
    return Drafting("not_detected", 0, steps, forwards_per_step, None, NOT_DETECTED_VERDICT,
                    (*why, SPEC_KERNELS_ABSENT))


# The gap between consecutive kernels of one CUDA graph replayed WITHOUT a profiler (H200). Nsight's and the torch
# profiler's per-node tracing inflate it to ~0.63 us; the unprofiled phase timings of the six spec-*-graph captures
# (CUDA events around the draft, verify and draft-extend graphs, against the traced kernels of the same graphs)
# give 0.32-0.41 us (median 0.37): the plain step without an unprofiled time re-costs the verify graph's gaps at it.
UNPROFILED_NODE_GAP_US = 0.37
# Per GPU the figure is the GPU table's graph_node_gap_us (tracekit/data/gpus.toml: the H200's is this one; the
# H100's, 0.29 us, the median of the zoo's six graph-replayed verify forwards, 0.21-0.37 us); this is the fallback.


def node_gap_us(gpu_name: str | None) -> float:
    """The unprofiled gap between two nodes of one graph replay on ``gpu_name``: the GPU table's ``graph_node_gap_us``
    (``tracekit.gpus``, beside the CUDA-graph what-if's ``graph_node_us``), else ``UNPROFILED_NODE_GAP_US``.

    >>> node_gap_us("NVIDIA H100 80GB HBM3"), node_gap_us("NVIDIA H200"), node_gap_us(None)
    (0.29, 0.37, 0.37)
    """
    from tracekit.gpus import graph_node_gap_us

    return graph_node_gap_us(gpu_name) or UNPROFILED_NODE_GAP_US


@dataclass(frozen=True)
class VerifyCost:
    """The target (verify) forward of the speculative steps (means per step, traced): what the step without
    speculation keeps of a speculative step (:func:`verify_costs`)."""

    verify_ms: float  # wall span on the GPU timeline, its sampling included
    busy_ms: float  # GPU time of its work: the part that scales with tokens (launch gaps do not)
    token_factor: float | None  # a (K+1)-token forward over a 1-token one, the draft model's own; None: no pair
    graph_nodes: float  # its kernels replayed from a graph right after another node of the same graph launch
    graph_gap_ms: float  # the traced gaps before those nodes (inflated by per-node tracing)
    # the verify forward's GPU time that a forward over one token per sequence would not spend, re-costed kernel by
    # kernel with the draft model's own forwards over few and many tokens (:func:`verify_costs`); 0: nothing to
    # re-cost by
    recost_ms: float = 0.0
    recost_kernels: int = 0  # roles re-costed (attention shared / not shared with the draft, GEMMs, other by name)
    recost_how: tuple[str, ...] = ()  # one phrase per re-costed role (:class:`Recost`)
    graphed_share: float = 0.0  # share of its GPU time replayed from CUDA graphs
    node_gap_us: float = UNPROFILED_NODE_GAP_US  # a graph node's unprofiled gap on this GPU (node_gap_us)
    # the fastest turnaround from a host read (a device-to-host copy) to the next GPU work in a step, traced: what a
    # plain step pays for reading its tokens and launching the next one (None: no read in the steps)
    host_turnaround_ms: float | None = None

    @property
    def unprofiled_graph_gap_ms(self) -> float:
        """The same nodes' gaps in an unprofiled replay (:attr:`node_gap_us` each)."""
        return self.graph_nodes * self.node_gap_us / 1e3


def step_forwards(acts: pl.DataFrame, speculative: bool = False) -> pl.DataFrame:
    """The analysed steps' activities with their forward (:func:`forwards`, by name category): ``step``, ``start``,
    ``end``, ``dur``, ``graphed``, ``launch``, ``name``, ``category``, ``fwd``, ``target``; ``target`` is set only in
    the steps that show a draft model (:func:`draft_model_steps`: null elsewhere, where the heaviest forward may be a
    piece of one) — and, with ``speculative`` (the steps verify drafted tokens by other evidence:
    ``tracekit.analyses.speculation``), in every step: without a draft model (n-gram proposals) a step's one
    token-producing forward is the target's verify forward. Computed once per breakdown for
    :func:`draft_forward_counts` and :func:`verify_costs`. ``acts``:
    the analysed steps' activities with ``name_category`` (attribution adds it to speculative traces) or ``category``
    by name."""
    cat = "name_category" if "name_category" in acts.columns else "category"
    extra = [pl.col(c) if c in acts.columns else pl.lit(None, t).alias(c)
             for c, t in (("graphed", pl.Boolean), ("launch", pl.Int64))]
    a = acts.select("step", "start", "end", "dur", "name", "kind", *extra, category=pl.col(cat)).filter(
        pl.col("step").is_not_null()).with_columns(pl.col("category").cast(pl.String))  # (narrow first)
    keep = ("step", "start", "end", "dur", "graphed", "launch", "name", "category", "kind")
    if a.height == 0:
        return a.select(*keep, fwd=pl.lit(None, pl.Int64), target=pl.lit(None, pl.Boolean))
    rows, per_fwd = _forward_parts(a)
    spec = draft_model_steps(per_fwd).filter(pl.col("spec"))["step"].implode()
    marked = pl.lit(True) if speculative else pl.col("step").is_in(spec)
    return a.select(*keep).hstack(rows.select("fwd", target=pl.when(marked).then(pl.col("target"))))


def draft_forward_counts(x: pl.DataFrame) -> tuple[int, int] | None:
    """How many times a speculative step reads the draft model: ``(draft_forwards, before_target)`` — every
    forward that is not the target's (SGLang: its K - 1 draft forwards and the draft-extend forward after the verify;
    vLLM: K proposer forwards; K draft tokens either way), and those before the target's. Medians over the steps
    that have a target forward; None when none has. ``x``: :func:`step_forwards`.
    """
    f = x.select("step", "fwd", "target").filter(pl.col("fwd").is_not_null()).unique()
    t = f.filter(pl.col("target").fill_null(False)).select("step", t_fwd="fwd")
    if t.height == 0:
        return None
    per = (f.filter(~pl.col("target").fill_null(False)).join(t, on="step", how="right")
           .group_by("step").agg(n=pl.col("fwd").count(), before=(pl.col("fwd") < pl.col("t_fwd")).sum()))
    return int(per["n"].median()), int(per["before"].median())


# Kernels are matched across token counts by their ROLE, never by name alone (contract, "Forwards and re-costs by
# structure"): a kernel's name changes with the tokens it runs over (cuDNN SDPA runs an sm90 wgmma kernel at K+1
# queries and an sm80 wmma kernel plus a reduction at one; FlashInfer decode against prefill/append kernels;
# FlashAttention's split and combine; cuBLAS tiles that change with the rows).
TOKEN_RATIO_CLIP = 8.0  # (a ratio is clipped to [1, this]: growth with tokens, never a shrink)


def kernel_roles(x: pl.DataFrame) -> pl.DataFrame:
    """``x`` (:func:`step_forwards`' rows) without its memory operations, in start order within each step, with
    each kernel's role in its layer: ``role`` = ``attention`` (an attention kernel, and the kernels after it up to
    the next GEMM of its forward: a split attention's combine or reduction, which runs at one query and not at
    several), ``gemm``, or ``other`` (norms, activations, rotary, sampling); ``layer_start`` marks the first kernel
    of each run of attention-role kernels (one layer's attention: layers are counted by these)."""
    k = x.filter((pl.col("kind") == "kernel") & pl.col("fwd").is_not_null()).sort("step", "start",
                                                                                   maintain_order=True)
    cat = pl.col("category")
    fwd_change = ((pl.col("step") != pl.col("step").shift(1)) | (pl.col("fwd") != pl.col("fwd").shift(1))).fill_null(
        True)
    k = k.with_columns(grp=((cat == "attention") | (cat == "gemm") | fwd_change).cast(pl.Int64).cum_sum())
    k = k.with_columns(role=pl.when(cat == "gemm").then(pl.lit("gemm"))
                       .when(cat.first().over("grp") == "attention").then(pl.lit("attention"))
                       .otherwise(pl.lit("other")))
    prev = pl.col("role").shift(1)
    return k.with_columns(layer_start=(pl.col("role") == "attention")
                          & ((prev != "attention") | fwd_change).fill_null(True))


@dataclass(frozen=True)
class Recost:
    """The verify forward's GPU time (ms per step) that a forward over one token per sequence would not spend, by
    role (:func:`recost_by_role`)."""

    attention_ms: float = 0.0
    gemm_ms: float = 0.0
    other_ms: float = 0.0
    how: tuple[str, ...] = ()  # one phrase per re-costed role: from what
    roles: int = 0  # roles re-costed

    @property
    def ms(self) -> float:
        return self.attention_ms + self.gemm_ms + self.other_ms


def recost_by_role(x: pl.DataFrame) -> Recost:
    """The verify forward re-costed at one token per sequence, attention by attention, GEMM by GEMM, kernel by
    kernel, from the draft model's own forwards (``x``: :func:`step_forwards`; means per step over the steps with a
    target forward). The draft forwards of a step are ranked by their attention time per layer (:func:`kernel_roles`):
    the one with the most ran over the most tokens (SGLang's draft-extend over K+1, vLLM's first proposer forward,
    a tree level over k rows), the one with the least over one token.

    - **Attention**, layer by layer. A verify layer whose attention kernels the draft's many-token forward runs too
      (the draft shares the target's layer shape: EAGLE, MTP) keeps the draft's own few/many ratio of attention time
      per layer. A verify layer the draft does not share (another model's heads, a hybrid target's linear attention)
      costs at most what the draft's one-token forward spends on a layer's attention (at decode sizes a one-query
      attention is latency-bound: its time barely moves with the heads), never more than it spent.
    - **GEMMs**: the verify forward's GEMM time by the draft's GEMM ratio, many-token against one-token forward (at
      decode sizes GEMMs read weights whatever the rows: near 1, and so measured, not assumed).
    - **Other kernels** (norms, activations, rotary): by name, each by its own ratio between the same two forwards.
    """
    k = kernel_roles(x)
    tgt_mask = pl.col("target").fill_null(False)
    steps = k.filter(tgt_mask)["step"].n_unique()
    d = k.filter(~pl.col("target").fill_null(True))
    if steps == 0 or d.height == 0:
        return Recost()
    per = d.group_by("step", "fwd").agg(
        layers=pl.col("layer_start").sum(), attn=pl.col("dur").filter(pl.col("role") == "attention").sum(),
        gemm=pl.col("dur").filter(pl.col("role") == "gemm").sum()).filter(pl.col("layers") > 0)
    per = per.with_columns(pl_ns=pl.col("attn") / pl.col("layers"))
    if per.height == 0:
        return Recost()
    ends = per.group_by("step").agg(
        lo=pl.col("fwd").sort_by(["pl_ns", "fwd"]).first(),
        hi=pl.col("fwd").sort_by(["pl_ns", "fwd"], descending=[False, True]).last(),
        lo_ns=pl.col("pl_ns").min(), hi_ns=pl.col("pl_ns").max(), n=pl.len(),
        lo_g=pl.col("gemm").sort_by(["pl_ns", "fwd"]).first(),
        hi_g=pl.col("gemm").sort_by(["pl_ns", "fwd"], descending=[False, True]).last())
    one_layer_ns = float(ends["lo_ns"].median())  # the draft's one-token attention, per layer
    pair = ends.filter((pl.col("n") >= 2) & (pl.col("lo_ns") > 0))
    how: list[str] = []
    # attention, layer by layer
    t = k.filter(tgt_mask).with_columns(layer=pl.col("layer_start").cum_sum())
    lay = t.filter(pl.col("role") == "attention").group_by("step", "layer").agg(
        ns=pl.col("dur").sum(), names=pl.col("name").filter(pl.col("category") == "attention").cast(pl.String))
    attn_ns = 0.0
    if lay.height:
        hi_names = d.join(pair.select("step", fwd="hi"), on=["step", "fwd"]).filter(
            pl.col("category") == "attention")["name"].cast(pl.String).unique().implode()
        ratio = float(pair.select(r=pl.col("lo_ns") / pl.col("hi_ns"))["r"].median()) if pair.height else 1.0
        ratio = min(max(ratio, 1 / TOKEN_RATIO_CLIP), 1.0)
        lay = lay.with_columns(shared=pl.col("names").list.eval(pl.element().is_in(hi_names)).list.any())
        shared = lay.filter(pl.col("shared"))
        other = lay.filter(~pl.col("shared"))
        if shared.height and ratio < 1.0:
            attn_ns += float(shared["ns"].sum()) * (1 - ratio)
            how.append(f"{shared.height / steps:g} attention layers by the draft's own ratio of one-token to "
                       f"many-token attention per layer ({ratio:.2f})")
        if other.height:
            cut = float(other.select((pl.col("ns") - one_layer_ns).clip(0))["ns"].sum())
            if cut > 0:
                attn_ns += cut
                how.append(f"{other.height / steps:g} attention layers the draft does not share at most the draft's "
                           f"one-token attention layer ({one_layer_ns / 1e3:.1f} µs)")
    # GEMMs: one ratio for all GEMM time (tiles change with the rows: names differ)
    gemm_ns = 0.0
    g = pair.filter(pl.col("lo_g") > 0).select(r=pl.col("hi_g") / pl.col("lo_g"))["r"]
    if g.len():
        g_ratio = min(max(float(g.median()), 1.0), TOKEN_RATIO_CLIP)
        if g_ratio > 1.0:
            gemm_ns = float(t.filter(pl.col("role") == "gemm")["dur"].sum()) * (1 - 1 / g_ratio)
            how.append(f"GEMMs by the draft's GEMM ratio ({g_ratio:.2f})")
    # other kernels: by name, each by its own ratio between the same two forwards
    other_ns = 0.0
    if pair.height:
        sides = d.filter(pl.col("role") == "other").join(
            pair.select("step", "lo", "hi"), on="step").with_columns(
            side=pl.when(pl.col("fwd") == pl.col("lo")).then(pl.lit("lo"))
            .when(pl.col("fwd") == pl.col("hi")).then(pl.lit("hi"))).filter(pl.col("side").is_not_null())
        m = (sides.with_columns(pl.col("name").cast(pl.String)).group_by("step", "name", "side")
             .agg(m=pl.col("dur").mean()))
        if m.height:
            m = m.pivot(on="side", index=["step", "name"], values="m")
            if {"lo", "hi"} <= set(m.columns):
                r = m.filter((pl.col("lo") > 0) & pl.col("hi").is_not_null()).group_by("name").agg(
                    r=(pl.col("hi") / pl.col("lo")).median().clip(1.0, TOKEN_RATIO_CLIP))
                o = t.filter(pl.col("role") == "other").with_columns(pl.col("name").cast(pl.String)).join(
                    r, on="name", how="inner")
                other_ns = float((o["dur"] * (1 - 1 / o["r"])).sum())
                if other_ns > 0:
                    how.append(f"{r.height} other kernels by name")
    per_step = 1e6 * steps
    return Recost(attention_ms=attn_ns / per_step, gemm_ms=gemm_ns / per_step, other_ms=other_ns / per_step,
                  how=tuple(how), roles=len(how))


def host_turnaround(x: pl.DataFrame) -> float | None:
    """The fastest host turnaround of the steps, ms: per step, the least time from the end of a device-to-host copy
    (a host read of device data) to the start of the next GPU activity; the median over the steps. A plain decode
    step reads its tokens once and launches the next step: this is what that costs on this host, without the
    speculative bookkeeping a step's other host time holds. ``x``: :func:`step_forwards`' rows (start order within
    each step); None when no step reads."""
    a = x.select("step", "start", "end", "kind", "name").sort("start")
    if a.height == 0:
        return None
    a = a.with_columns(nxt=pl.col("start").shift(-1), last=pl.col("end").cum_max())
    reads = a.filter((pl.col("kind") == "memop") & pl.col("name").cast(pl.String).str.contains(HOST_READ)
                     & pl.col("nxt").is_not_null())
    if reads.height == 0:
        return None
    per = reads.group_by("step").agg(t=(pl.col("nxt") - pl.col("last")).clip(0).min())
    return float(per["t"].median()) / 1e6


def verify_costs(x: pl.DataFrame, gpu_name: str | None = None) -> VerifyCost | None:
    """What the step without speculation would keep of a speculative step, from its forwards
    (``x``: :func:`step_forwards`); None when no step has a target forward.

    ``recost_ms``: the verify forward re-costed at one token per sequence, kernel by kernel, with the draft
    model's own forwards over few and many tokens (:func:`token_ratios`: SGLang's draft-extend over K+1 tokens against
    its one-token draft forwards, vLLM's first proposer forward against its one-token ones): each verify kernel whose
    name the draft's forwards share is divided by that name's ratio, the GEMM time by the draft's GEMM ratio (at
    decode sizes GEMMs read weights, whatever the rows: the ratio stays near 1, and so it is measured, not assumed).
    ``token_factor``: the draft's whole (K+1)- against 1-token forward, kept for the evidence.
    ``graph_nodes`` / ``graph_gap_ms``: the verify forward's graph-replayed kernels that follow another node of
    the same graph launch, and the traced gaps before them (the GPU idle from the work before, in start order).
    """
    tgt = x.filter(pl.col("target").fill_null(False))
    if tgt.height == 0:
        return None
    tgt = tgt.sort("step", "start", maintain_order=True)
    first = pl.col("step") != pl.col("step").shift(1)
    tgt = tgt.with_columns(
        gap=pl.when(first.fill_null(True)).then(0).otherwise(
            (pl.col("start") - pl.col("end").cum_max().shift(1)).clip(0)),
        node=(pl.col("graphed").fill_null(False) & (pl.col("launch") == pl.col("launch").shift(1))
              & ~first).fill_null(False))
    per = tgt.group_by("step").agg(span=pl.col("end").max() - pl.col("start").min(), busy=pl.col("dur").sum(),
                                   t_fwd=pl.col("fwd").first(), nodes=pl.col("node").sum(),
                                   node_gap=pl.col("gap").filter(pl.col("node")).sum(),
                                   graphed=pl.col("dur").filter(pl.col("graphed").fill_null(False)).sum())
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
        factor = min(max(factor, 1.0), 2.0)
    # role by role: the verify forward's GPU time over K+1 tokens that one token per sequence would not spend
    rc = recost_by_role(x)
    return VerifyCost(verify_ms=verify_ms, busy_ms=verify_busy_ms, token_factor=factor,
                      graph_nodes=float(per["nodes"].mean()), graph_gap_ms=float(per["node_gap"].mean()) / 1e6,
                      recost_ms=min(rc.ms, verify_busy_ms), recost_kernels=rc.roles, recost_how=rc.how,
                      graphed_share=float(per["graphed"].sum() / per["busy"].sum()) if per["busy"].sum() else 0.0,
                      node_gap_us=node_gap_us(gpu_name), host_turnaround_ms=host_turnaround(x))


# A verify forward replayed from CUDA graphs for at least this share of its GPU time is costed as graph work (its
# GPU time, the node gaps at their unprofiled size); below it, as eager work (its span, launch gaps included).
GRAPHED_VERIFY_SHARE = 0.5


def plain_step(v: VerifyCost | None, *, traced_ms: float, reference_ms: float, unprofiled: bool,
               between_ms: float, draft_phase_ms: float) -> tuple[float, str, bool]:
    """The predicted unprofiled step without speculation: ``(ms, basis, upper_bound)``.

    Without speculation a step is one target forward over one token per sequence, then the host's read of the
    sampled tokens and its work until the next launch (the spec step's host time between steps). The target forward
    is the verify forward re-costed at one token (:class:`VerifyCost`: ``recost_ms``). A graph-replayed verify
    forward keeps its GPU time less the re-costed part plus its nodes' gaps at their unprofiled size (the GPU work of a
    graph replay barely changes under a profiler; ``UNPROFILED_NODE_GAP_US``); an eager one keeps its span (its launch
    gaps are host time). Host time and eager spans are scaled to the unprofiled step (``reference_ms / traced_ms``)
    where an unprofiled time is known; without one they stay as traced, and the plain step is an upper bound. Without
    a verify forward: the step less its draft phase (an upper bound: the verify still runs K+1 tokens)."""
    scale = reference_ms / traced_ms if unprofiled and traced_ms else 1.0
    if v is None:
        return ((traced_ms - draft_phase_ms) * scale,
                "the step without its draft phase, the verify forward kept at K+1 tokens: an upper bound", True)
    how = (f"re-costed at one token by role, from the draft model's own forwards over one and over many tokens "
           f"({v.recost_ms:.3f} ms of it: {'; '.join(v.recost_how)})" if v.recost_kernels else
           "kept at K+1 tokens (no two draft forwards over different tokens to re-cost it by)")
    # the host: one read of the tokens and the next launch (the steps' fastest read-to-work turnaround), not the
    # speculative bookkeeping the spec step's host time between steps also holds
    turn = min(v.host_turnaround_ms, between_ms) if v.host_turnaround_ms is not None else between_ms
    host = turn * scale
    if v.graphed_share >= GRAPHED_VERIFY_SHARE:
        gpu = v.busy_ms - v.recost_ms + v.unprofiled_graph_gap_ms
        basis = (f"the verify forward's {v.busy_ms:.3f} ms of GPU work {how}, its {v.graph_nodes:.0f} graph nodes' "
                 f"gaps at {v.node_gap_us:g} µs each, plus {host:.3f} ms of host time for one read of the tokens and "
                 "the next launch (the steps' fastest read-to-work turnaround"
                 + (")" if unprofiled else ", as traced)"))
        return gpu + host, basis, not unprofiled or not v.recost_kernels
    plain = (v.verify_ms - v.recost_ms + turn) * scale
    basis = (f"the eager verify forward's {v.verify_ms:.3f} ms span {how}, plus one host read-to-work turnaround"
             + (", scaled to the unprofiled step" if unprofiled else
                " as traced (no unprofiled time: the profiler's host overhead stays in them)"))
    return plain, basis, not unprofiled or not v.recost_kernels
