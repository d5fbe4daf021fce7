"""The phase of each step: decode, prefill, mixed or unknown (contract ``steps.phase``, ``--phase``).

A decode step produces a handful of tokens per sequence; a prefill step processes prompt tokens (hundreds per
sequence); a mixed step does both (chunked prefill batched with decodes). Evidence, strongest first; the first
source that says something decides, and ``evidence`` says which and what it saw:

1. **annotation**: a range that starts in the step (the step's own range included) and names the batch's mode:
   SGLang ``step[DECODE bs=16]`` / ``EXTEND`` / ``MIXED`` / ``TARGET_VERIFY`` and ``DRAFT_EXTEND`` (both decode:
   they verify or extend a handful of draft tokens per sequence), vLLM ``execute_context_N(..)_generation_M(..)``
   (N context requests, M generation requests: N > 0 is prefill, or mixed with M > 0), TensorRT-LLM
   ``N ctx reqs, M gen reqs``, tracekit capture's ``decode_step``.
2. **training**: backward or optimizer kernels in the step (or anywhere in the trace): a training step processes
   whole sequences, so it is ``prefill`` here (never decode) and the evidence says "training".
3. **shapes**: the GEMM inputs recorded by the torch profiler (``Trace.ops``): tokens per sequence where the
   input is 3-D (``[batch, tokens, hidden]``), else rows (tokens of the whole batch). At most
   :data:`DECODE_MAX_TOKENS` per sequence is decode; from :data:`PREFILL_MIN_TOKENS` per sequence (3-D) or
   :data:`PREFILL_MIN_ROWS` rows (2-D, batch unknown) it is prefill; in between the shapes say nothing.
4. **manifest**: a tracekit capture (its manifest matched the trace) runs a decode loop.
5. **graph**: one CUDA-graph replay holds at least :data:`GRAPH_DECODE_SHARE` of the step's kernel time (serving
   engines capture full-forward graphs for decode batches only; piecewise prefill graphs are many replays).

No evidence: ``unknown``. All of it is vectorised over steps (no loop over events).
"""

from __future__ import annotations

import polars as pl

from tracekit.categories import PHASES
from tracekit.trace import Trace

DECODE_MAX_TOKENS = 32  # tokens per sequence a decode step may process (spec verify: K+1)
PREFILL_MIN_TOKENS = 128  # tokens per sequence from which a step is prefill (3-D GEMM inputs, or bs known)
PREFILL_MIN_ROWS = 512  # rows of a 2-D GEMM input (batch unknown) from which a step is prefill
GRAPH_DECODE_SHARE = 0.8  # share of a step's kernel time in ONE graph replay that says decode

# SGLang ForwardMode names (python/sglang/srt/model_executor/forward_batch_info.py) -> phase
_SGLANG_MODES = {"DECODE": "decode", "TARGET_VERIFY": "decode", "DRAFT_EXTEND": "decode", "DRAFT_EXTEND_V2": "decode",
                 "EXTEND": "prefill", "SPLIT_PREFILL": "prefill", "MIXED": "mixed"}
_SGLANG_RX = r"(?:^|[^A-Z_])(DRAFT_EXTEND_V2|DRAFT_EXTEND|TARGET_VERIFY|SPLIT_PREFILL|EXTEND|DECODE|MIXED)(?:[^A-Z_]|$)"
_VLLM_RX = r"context_(\d+)\([^)]*\)_generation_(\d+)\("
_TRTLLM_RX = r"(\d+) ctx reqs?, (\d+) gen reqs?"
_BS_RX = r"\bbs=(\d+)"
# Kernels that only a training step runs: backward passes, optimizers, losses' gradients.
# (A bare multi_tensor_apply_kernel is torch._foreach_*, which serving engines use too: only an optimizer
# functor in it counts.)
TRAINING_KERNELS = (r"(?i)backward|_bwd|bwd_|\bbwd|wgrad|dgrad|multi_tensor_apply\w*<.*?(adam|adagrad|sgd|lamb|lion"
                    r"|momentum)|adam\w*kernel|GammaBetaBackward|cudnn::bn_bw|\bbn_bw|FlashAttnBwd|fmha_cutlassB"
                    r"|fmha_bwd")
# GEMM ops whose activation is the input at this index (addmm's first input is the bias).
_ACT_INPUT = {"aten::addmm": 1, "aten::_addmm_activation": 1, "aten::baddbmm": 1, "aten::addbmm": 1,
              "aten::addmv": 1}

def name_matches(names: pl.Series, regex: str) -> pl.Series:
    """``names`` (kernel names: String, Categorical or Enum) that contain ``regex``, testing each distinct name
    once (ten million kernels have a few hundred names)."""
    if isinstance(names.dtype, pl.Enum):
        # an Enum's names are its categories, in code order: one lookup table, one gather by code
        table = pl.Series(names.dtype.categories).str.contains(regex).fill_null(False)
        return table.gather(names.to_physical()).fill_null(False).alias(names.name)
    uniq = names.unique()
    hit = uniq.filter(uniq.cast(pl.String).str.contains(regex).fill_null(False))
    return names.is_in(hit.implode()).fill_null(False)


PHASE_SCHEMA = {"step": pl.Int64, "phase": pl.String, "source": pl.String, "evidence": pl.String}


def _in_windows(events: pl.DataFrame, windows: pl.DataFrame) -> pl.DataFrame:
    """``events`` (start, pid, ...) with the ``step`` whose window (same pid, start..end; null end = open)
    holds the event's start; events in no window are dropped. Windows of one pid do not overlap."""
    if events.height == 0 or windows.height == 0:
        return events.with_columns(step=pl.lit(None, pl.Int64)).head(0)
    w = windows.select("pid", ws="start", we="end", step="step").sort("ws")
    out = events.sort("start").join_asof(w, left_on="start", right_on="ws", by="pid", strategy="backward",
                                         check_sortedness=False)
    return out.filter(pl.col("step").is_not_null() & (pl.col("we").is_null() | (pl.col("start") <= pl.col("we"))))


def annotation_phases(trace: Trace, windows: pl.DataFrame) -> pl.DataFrame:
    """Per step with an annotation naming its mode: step, phase, evidence (the first such range's name)."""
    rng = _in_windows(trace.ranges.select("start", "pid", "name"), windows)
    sg = pl.col("name").str.extract(_SGLANG_RX, 1)
    ctx = pl.col("name").str.extract(_VLLM_RX, 1).cast(pl.Int64)
    gen = pl.col("name").str.extract(_VLLM_RX, 2).cast(pl.Int64)
    tctx = pl.col("name").str.extract(_TRTLLM_RX, 1).cast(pl.Int64)
    tgen = pl.col("name").str.extract(_TRTLLM_RX, 2).cast(pl.Int64)

    def counts(c, g):
        return (pl.when((c > 0) & (g > 0)).then(pl.lit("mixed")).when(c > 0).then(pl.lit("prefill"))
                .when(g > 0).then(pl.lit("decode")))

    rng = rng.with_columns(
        p=pl.coalesce(sg.replace_strict(_SGLANG_MODES, default=None, return_dtype=pl.String),
                      counts(ctx, gen), counts(tctx, tgen),
                      pl.when(pl.col("name").str.contains(r"^decode_step\b")).then(pl.lit("decode"))),
        bs=pl.col("name").str.extract(_BS_RX, 1).cast(pl.Int64),
    ).filter(pl.col("p").is_not_null())
    return rng.group_by("step").agg(
        phase=pl.when(pl.col("p").n_unique() > 1).then(pl.lit("mixed")).otherwise(pl.col("p").first()),
        evidence=pl.format("annotation '{}'", pl.col("name").first().str.slice(0, 80)),
        bs=pl.col("bs").max(),
    )


def gemm_rows(trace: Trace, windows: pl.DataFrame) -> pl.DataFrame:
    """Per step with recorded GEMM shapes: step, tokens (max tokens per sequence over its 3-D linear inputs, null
    without any), rows (max rows of its GEMM activations), op (the op that gave them)."""
    ops = trace.ops.filter(pl.col("input_dims").is_not_null())
    if ops.height == 0:
        return pl.DataFrame(schema={"step": pl.Int64, "tokens": pl.Int64, "rows": pl.Int64, "op": pl.String})
    ops = _in_windows(ops.select("start", "pid", "name", "input_dims"), windows)
    # aten::linear when the step has it (the weight GEMM as the model wrote it); otherwise the mm-like ops.
    ops = ops.with_columns(linear=(pl.col("name") == "aten::linear").any().over("step")).filter(
        (pl.col("name") == "aten::linear") | ~pl.col("linear"))
    dims = pl.col("input_dims").str.json_decode(pl.List(pl.List(pl.Int64)))
    idx = pl.col("name").replace_strict(_ACT_INPUT, default=0, return_dtype=pl.Int64)
    ops = ops.with_columns(act=dims.list.get(idx, null_on_oob=True)).filter(pl.col("act").list.len() >= 1)
    ops = ops.with_columns(
        rows=pl.when(pl.col("act").list.len() >= 2).then(pl.col("act").list.head(pl.col("act").list.len() - 1)
                                                         .list.eval(pl.element().product()).list.first())
        .otherwise(1),
        tokens=pl.when(pl.col("act").list.len() >= 3).then(pl.col("act").list.get(-2)),
    )
    return ops.group_by("step").agg(tokens=pl.col("tokens").max(), rows=pl.col("rows").max(),
                                    op=pl.col("name").first())


def _activities(trace: Trace, windows: pl.DataFrame) -> pl.DataFrame:
    """Kernels attributed to the window open on their launching thread at launch (the breakdown's rule):
    step, name, correlation, graphed, dur."""
    work = trace.launches.filter(pl.col("kind").is_in(["kernel", "graph"])).select(
        "pid", "tid", "correlation", "start", graphed=pl.col("kind") == "graph")
    w = windows.select("pid", "tid", ws="start", we="end", step="step").sort("ws")
    work = work.sort("start").join_asof(w, left_on="start", right_on="ws", by=["pid", "tid"],
                                        check_sortedness=False).filter(
        pl.col("step").is_not_null() & (pl.col("we").is_null() | (pl.col("start") <= pl.col("we"))))
    return trace.kernels.select("pid", "correlation", "name", dur=pl.col("end") - pl.col("start")).join(
        work.select("pid", "correlation", "step", "graphed"), on=["pid", "correlation"], how="inner")


def step_phases(trace: Trace, windows: pl.DataFrame, acts: pl.DataFrame | None = None) -> pl.DataFrame:
    """The phase of every step window.

    ``windows``: the steps (``Steps.windows``: step, pid, tid, start, end). ``acts``: the attributed GPU
    activity (the breakdown's activities frame: step, name, kind, graphed, correlation, dur); computed from the
    trace with the same attribution rule when not given. Returns one row per window: step, phase
    (decode|prefill|mixed|unknown), source (annotation|training|shapes|manifest|graph|null) and evidence (what
    was seen, one line).
    """
    steps = windows.select(pl.col("step").cast(pl.Int64))
    if acts is None:
        acts = _activities(trace, windows)
    else:
        # (the five columns first, then one filter: filtering the wide frame copies every column)
        keep = pl.col("step").is_not_null() & ((pl.col("kind") == "kernel") if "kind" in acts.columns else True)
        acts = acts.select(pl.col("step").cast(pl.Int64), "name", "correlation", pl.col("graphed").fill_null(False),
                           "dur", _keep=keep).filter("_keep").drop("_keep")
    ann = annotation_phases(trace, windows)
    # training: backward/optimizer kernels in the step, else anywhere in the trace
    bwd = acts.filter(name_matches(acts["name"], TRAINING_KERNELS))
    per_bwd = bwd.group_by("step").agg(n=pl.len(), example=pl.col("name").first().cast(pl.String))
    trace_bwd = trace.kernels.filter(name_matches(trace.kernels["name"], TRAINING_KERNELS))
    # shapes
    shapes = gemm_rows(trace, windows).join(ann.select("step", "bs"), on="step", how="left")
    per_seq = pl.coalesce(pl.col("tokens"), pl.col("rows") // pl.col("bs"))
    shapes = shapes.with_columns(
        phase=pl.when(pl.coalesce(per_seq, pl.col("rows")) <= DECODE_MAX_TOKENS).then(pl.lit("decode"))
        .when(per_seq >= PREFILL_MIN_TOKENS).then(pl.lit("prefill"))
        .when(per_seq.is_null() & (pl.col("rows") >= PREFILL_MIN_ROWS)).then(pl.lit("prefill")),
        evidence=pl.when(pl.col("tokens").is_not_null())
        .then(pl.format("GEMM inputs of {} tokens per sequence ({})", pl.col("tokens"), pl.col("op")))
        .otherwise(pl.format("GEMM inputs of {} rows ({})", pl.col("rows"), pl.col("op"))),
    ).filter(pl.col("phase").is_not_null())
    # graph: the largest single graph replay's share of the step's kernel time
    total = acts.group_by("step").agg(all=pl.col("dur").sum())
    replays = (acts.filter(pl.col("graphed")).group_by("step", "correlation").agg(t=pl.col("dur").sum())
               .group_by("step").agg(t=pl.col("t").max()))
    graph = total.join(replays, on="step", how="inner").with_columns(share=pl.col("t") / pl.col("all")).filter(
        pl.col("share") >= GRAPH_DECODE_SHARE).with_columns(
        phase=pl.lit("decode"),
        evidence=pl.format("one CUDA graph replay holds {}% of the kernel time",
                           (pl.col("share") * 100).round(0).cast(pl.Int64)))
    manifest = trace.manifest if isinstance(trace.manifest, dict) else None
    man_phase = None
    if manifest:
        man_phase = manifest.get("phase") or "decode"  # tracekit capture runs decode loops
    sources = [
        ann.select("step", "phase", "evidence", source=pl.lit("annotation")),
        per_bwd.select("step", phase=pl.lit("prefill"), source=pl.lit("training"),
                       evidence=pl.format("training step: {} backward/optimizer kernels (e.g. {})", pl.col("n"),
                                          pl.col("example").str.slice(0, 60))),
    ]
    if trace_bwd.height:
        ex = str(trace_bwd["name"][0])[:60]
        sources.append(steps.select("step", phase=pl.lit("prefill"), source=pl.lit("training"),
                                    evidence=pl.lit(f"training trace: {trace_bwd.height} backward/optimizer "
                                                    f"kernels (e.g. {ex})")))
    sources.append(shapes.select("step", "phase", "evidence", source=pl.lit("shapes")))
    if man_phase in PHASES:
        sources.append(steps.select("step", phase=pl.lit(man_phase), source=pl.lit("manifest"),
                                    evidence=pl.lit(f"manifest: a tracekit capture of a {man_phase} loop "
                                                    f"({manifest.get('workload')})")))
    sources.append(graph.select("step", "phase", "evidence", source=pl.lit("graph")))
    ranked = pl.concat([s.select(pl.col("step").cast(pl.Int64), pl.col("phase").cast(pl.String),
                                 pl.col("source").cast(pl.String), pl.col("evidence").cast(pl.String),
                                 rank=pl.lit(i)) for i, s in enumerate(sources)])
    best = ranked.sort("rank", maintain_order=True).group_by("step").first().drop("rank")
    return steps.join(best, on="step", how="left").with_columns(
        phase=pl.col("phase").fill_null("unknown"),
        evidence=pl.col("evidence").fill_null("no annotation, GEMM shapes, manifest or graph replay says"),
    ).select(list(PHASE_SCHEMA)).sort("step")


def select_phase(phases: pl.DataFrame, wanted: str = "decode") -> tuple[pl.DataFrame, list[str]]:
    """Which steps ``--phase wanted`` analyses: per step, ``reason`` null (analysed) or ``"phase"``.

    ``unknown`` steps are analysed under ``decode`` (no evidence against; the caller warns). ``all`` keeps
    every step. When no step has the wanted phase, every step is kept and ``decode_advice`` is False: the split
    is still shown, but decode advice is not applicable (contract: a window with no decode steps gets the
    split, not a decode verdict). Returns ``(frame: step, phase, reason, decode_advice), warnings``.
    """
    if wanted not in ("decode", "prefill", "mixed", "all"):
        from tracekit.errors import TracekitError

        raise TracekitError(f"--phase {wanted!r}: choose decode, prefill, mixed or all")
    warnings: list[str] = []
    p = pl.col("phase")
    keep = pl.lit(True) if wanted == "all" else (p == wanted) | ((p == "unknown") & (wanted == "decode"))
    out = phases.select("step", "phase", keep=keep)
    if wanted != "all" and out.height and not out["keep"].any():
        have = ", ".join(f"{k} {v}" for k, v in phases.group_by("phase").len().sort("phase").iter_rows())
        warnings.append(f"no {wanted} steps in this trace (phases: {have}): the split of every step is shown, "
                        f"without {wanted} advice; pass --phase all to analyse them as such")
        out = out.with_columns(keep=pl.lit(True))
        advice = False
    else:
        advice = bool(out.filter(pl.col("keep"))["phase"].is_in(["decode", "unknown"]).any()) \
            if wanted in ("decode", "all") else False
        if wanted == "decode" and out.filter(pl.col("keep"))["phase"].eq("unknown").all():
            warnings.append("the phase of the steps is unknown (no annotation, GEMM shapes, manifest or graph "
                            "replay tells decode from prefill): analysed as decode steps")
    n_out = int((~out["keep"]).sum())
    if n_out:
        warnings.append(f"{n_out} step(s) not in phase {wanted}: excluded (--phase all analyses every step)")
    return out.select("step", "phase", reason=pl.when(~pl.col("keep")).then(pl.lit("phase")),
                      decode_advice=pl.lit(advice)), warnings


def window_phase(phases: pl.Series) -> str:
    """``steps.phase`` of the analysed steps: their common phase; ``mixed`` when decode and prefill (or mixed)
    steps are analysed together; ``unknown`` steps do not change a known phase unless all are unknown."""
    known = set(phases.drop_nulls().unique().to_list()) - {"unknown"}
    if not known:
        return "unknown"
    if len(known) == 1:
        return known.pop()
    return "mixed"
