"""The phase of each step: decode, prefill, mixed or unknown (contract ``steps.phase``, ``steps.phases``, ``--phase``).

A decode step produces a handful of tokens per sequence; a prefill step processes prompt tokens (hundreds per
sequence); a mixed step does both (chunked prefill batched with decodes). Evidence, strongest first; the first
source that says something decides, and ``evidence`` says which and what it saw:

1. **annotation**: a range that starts in the step (the step's own range included) and names the batch's mode:
   SGLang ``step[DECODE bs=16]`` / ``EXTEND`` / ``MIXED`` / ``TARGET_VERIFY`` and ``DRAFT_EXTEND`` (both decode:
   they verify or extend a handful of draft tokens per sequence), vLLM ``execute_context_N(..)_generation_M(..)``
   (N context requests, M generation requests: N > 0 is prefill, or mixed with M > 0), TensorRT-LLM
   ``N ctx reqs, M gen reqs``, tracekit capture's ``decode_step``.
2. **training**: backward or optimizer kernels in the step (or anywhere in the trace): phase ``training`` (never
   decode; the split is given, no decode advice).
3. **shapes**: the GEMM inputs recorded by the torch profiler (``Trace.ops``): tokens per sequence where the
   input is 3-D (``[batch, tokens, hidden]``), else rows (tokens of the whole batch). From
   :data:`PREFILL_MIN_TOKENS` per sequence (3-D) or :data:`PREFILL_MIN_ROWS` rows (2-D, batch unknown) it is
   prefill; at most :data:`DECODE_MAX_TOKENS` per sequence is decode, but only where the shapes cover the step's
   GEMMs (most of its GEMM time launched eagerly, not replayed from a graph whose inputs were not recorded: a
   prefill step's logits GEMM over the last token of each sequence alone would read as decode).
4. **work** (token-proportional work against the window's lightest steps): a step with a comparable number of
   GEMM launches (the same forward) whose GEMM kernel time is at least :data:`HEAVY_RATIO` times the lightest
   quarter's and, where both have collectives, whose collectives are at least :data:`HEAVY_COMM_RATIO` times as
   long (median kernel), or whose collectives are :data:`COMM_HEAVY_RATIO` times as long with
   :data:`COMM_HEAVY_GEMM_RATIO` times the GEMM time, is prefill (mixed when it also runs decode attention
   kernels): GEMMs and collectives grow with the tokens a step processes, a decode step's barely do.
5. **kernels**: a decode-only attention kernel in the step (:data:`DECODE_KERNELS`: paged decode, split-KV MLA
   decode, TensorRT-LLM generation kernels, recurrent-state updates).
6. **work** (graph pieces vs eager): in a window whose heavy (prefill) steps run their GEMMs eagerly, a light
   step that replays CUDA graphs for most of its kernel time is decode (serving engines capture graphs for
   decode-sized batches: vLLM's piecewise graphs up to a capture size, SGLang's decode graphs).
7. **speculation**: the step decodes speculatively (``tracekit.analyses.speculation``: draft work, the engine's verify
   spans or speculative frames, verify-sized shapes): a decode step, whatever sources 3-6 said (the caller adds it,
   :func:`with_speculation`; speculation is recognised without the phase, so neither waits for the other).
8. **manifest**: a tracekit capture (its manifest matched the trace) runs a decode loop (``step_phases`` in
   the manifest, one phase per step window, overrides).
9. **graph**: one CUDA-graph replay holds at least :data:`GRAPH_DECODE_SHARE` of the step's kernel time (serving
   engines capture full-forward graphs for decode batches only; piecewise prefill graphs are many replays).

A decode step runs attention: sources 3-9 say decode only for a step with attention kernels (a micro-benchmark of
a MoE layer over 16 tokens is not a decode step). No evidence: ``unknown``. All of it is vectorised over steps (no
loop over events).
"""

from __future__ import annotations

import polars as pl

from tracekit.categories import PHASES
from tracekit.intervals import by_pieces
from tracekit.trace import Trace

DECODE_MAX_TOKENS = 32  # tokens per sequence a decode step may process (spec verify: K+1)
PREFILL_MIN_TOKENS = 128  # tokens per sequence from which a step is prefill (3-D GEMM inputs, or bs known)
PREFILL_MIN_ROWS = 512  # rows of a 2-D GEMM input (batch unknown) from which a step is prefill
GRAPH_DECODE_SHARE = 0.8  # share of a step's kernel time in ONE graph replay that says decode
HEAVY_RATIO = 3.0  # GEMM time against the window's lightest steps from which a step processes many more tokens
HEAVY_COMM_RATIO = 2.0  # ... and its collectives (median duration), where both have some
# Collectives carry the tokens' activations (an all-reduce moves tokens x hidden): many times longer collectives
# with more GEMM time also say prompt tokens, where MoE GEMMs grow less than that (a decode batch of 16 already
# reads most experts: GEMM 2.6x, collectives 10-23x for 4096-token EXTEND steps in the lora_perf GB300 traces).
COMM_HEAVY_RATIO = 6.0  # (a decode batch growing 16x moves 16x the bytes, but small all-reduces are latency-bound:
COMM_HEAVY_GEMM_RATIO = 2.0  # ~3-4x; its GEMMs stay weight-bound: < 2x)
LIGHT_RATIO = 1.5  # GEMM time within this of the lightest steps': a light step
SAME_FORWARD = 2.0  # GEMM launches within this factor of the light steps': the same forward (layers)
SHAPES_EAGER_SHARE = 0.5  # eager share of a step's GEMM time from which its recorded shapes may say decode
GRAPHED_LIGHT_SHARE = 0.5  # graph-replayed share of a light step's kernel time that says decode beside eager heavy steps
LIGHT_MAJORITY = 0.5  # share of the complete steps that must be light for light steps beside prefill to be decode
# Attention kernels that only decode runs (a decode step's attention: one or a few query tokens per sequence
# against a paged KV cache), with where each name comes from.
DECODE_KERNELS = (
    r"BatchDecodeWithPagedKVCache"  # FlashInfer include/flashinfer/attention/decode.cuh
    r"|paged_attention_v[12]_kernel"  # vLLM csrc/attention/paged_attention_v{1,2}.cu (decode path)
    r"|paged_attention_ll4mi_QKV"  # vLLM csrc/rocm/attention.cu (trace:TraceLens sglang_decode)
    r"|flash_fwd_splitkv_mla"  # FlashMLA (decode-only MLA kernel: flash_fwd_splitkv_mla_kernel, ..._fp8_sparse)
    r"|ForGen($|[^a-z])"  # trtllm-gen FMHA generation kernels (fmhaSm100fKernel_...ForGen, lora_perf GB300 traces)
    r"|masked_multihead_attention|\bmmha_"  # TensorRT-LLM generation-phase attention
    r"|_fwd_(grouped_)?kernel_stage1"  # SGLang/LightLLM Triton decode attention (decode_attention.py)
    r"|packed_decode_kernel|causal_conv1d_update|selective_state_update|_selective_scan_update"  # recurrent-state
    # updates of linear-attention / SSM layers (vLLM fused_recurrent_gated_delta_rule_packed_decode_kernel in
    # trace:nvllm/..., causal_conv1d_update, mamba selective_state_update): one new token per sequence
)

# SGLang ForwardMode names (python/sglang/srt/model_executor/forward_batch_info.py) -> phase
_SGLANG_MODES = {"DECODE": "decode", "TARGET_VERIFY": "decode", "DRAFT_EXTEND": "decode", "DRAFT_EXTEND_V2": "decode",
                 "EXTEND": "prefill", "SPLIT_PREFILL": "prefill", "MIXED": "mixed"}
_SGLANG_RX = r"(?:^|[^A-Z_])(DRAFT_EXTEND_V2|DRAFT_EXTEND|TARGET_VERIFY|SPLIT_PREFILL|EXTEND|DECODE|MIXED)(?:[^A-Z_]|$)"
_VLLM_RX = r"context_(\d+)\([^)]*\)_generation_(\d+)\("
_TRTLLM_RX = r"(\d+) ctx reqs?, (\d+) gen reqs?"
_BS_RX = r"\bbs=(\d+)"
_GEN_RX = r"generation_(\d+)"  # vLLM's decode sequences, with or without the (..) detail
# Kernels that only a training step runs: backward passes, optimizers, losses' gradients.
# (A bare multi_tensor_apply_kernel is torch._foreach_*, which serving engines use too: only an optimizer
# functor in it counts.)
TRAINING_KERNELS = (r"(?i)backward|_bwd|bwd_|\bbwd|wgrad|dgrad|multi_tensor_apply\w*<.*?(adam|adagrad|sgd|lamb|lion"
                    r"|momentum)|adam\w*kernel|GammaBetaBackward|cudnn::bn_bw|\bbn_bw|FlashAttnBwd|fmha_cutlassB"
                    r"|fmha_bwd")
# Host ranges and framework ops that only a training step records (NVTX via emit_nvtx, Kineto cpu_op/annotation):
# autograd backward nodes and the engine's backward pass, aten backward ops, optimizer steps (torch.optim's profiler
# hook "Optimizer.step#AdamW.step"), FSDP's backward hooks (RegisterPostBackwardFunction is applied to forward
# outputs only while autograd records: trace:nsys-ai mfu_2gpu_*) and activation checkpointing, which exists only to
# recompute activations for a backward pass (_checkpoint_wrapped_module).
TRAINING_HOST = (r"Backward\d*\b|^autograd::engine::evaluate_function|^aten::\w+_backward|AccumulateGrad"
                 r"|^Optimizer\.(step|zero_grad)#|RegisterPostBackwardFunction|FSDP::(pre|post)_backward"
                 r"|_checkpoint_wrapped_module")
# GEMM ops whose activation is the input at this index (addmm's first input is the bias).
_ACT_INPUT = {"aten::addmm": 1, "aten::_addmm_activation": 1, "aten::baddbmm": 1, "aten::addbmm": 1,
              "aten::addmv": 1}

def name_matches(names: pl.Series, regex: str) -> pl.Series:
    """``names`` (kernel or op names: String, Categorical or Enum) that contain ``regex``, testing each distinct
    name once (ten million kernels, or two million Kineto host ops, have a few hundred names)."""
    if isinstance(names.dtype, pl.Enum):
        # an Enum's names are its categories, in code order: one lookup table, one gather by code
        table = pl.Series(names.dtype.categories).str.contains(regex).fill_null(False)
        if not table.any():  # (no name matches: no gather of ten million)
            return pl.repeat(False, names.len(), dtype=pl.Boolean, eager=True).alias(names.name)
        hit = table.gather(names.to_physical())
        return (hit.fill_null(False) if hit.null_count() else hit).alias(names.name)  # (no copy without nulls)
    # (a Categorical's candidates: every string of its categories, a few thousand, not a unique() of its rows:
    # two million Kineto ops, ten million kernels)
    uniq = names.dtype.categories.to_series() if names.dtype == pl.Categorical else names.unique()
    hit = uniq.filter(uniq.cast(pl.String).str.contains(regex).fill_null(False))
    return names.is_in(hit.implode()).fill_null(False)


def _kernel_matches(kernels: pl.DataFrame, regex: str) -> pl.Series:
    """:func:`name_matches` of ``kernels["name"]`` (a trace's kernels), from their name table (made once per trace,
    ``classify.frame_name_table``): each distinct name tested once, booleans gathered."""
    from tracekit.classify import frame_name_table

    pos, table = frame_name_table(kernels)
    hit = table["name"].str.contains(regex).fill_null(False)
    if not hit.any():  # (no name: no gather of ten million)
        return pl.repeat(False, pos.len(), dtype=pl.Boolean, eager=True).alias("name")
    return hit.gather(pos).fill_null(False).alias("name")


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
        # the batch: SGLang's bs=N, else the decode sequences vLLM / TensorRT-LLM name (generation_N, N gen reqs)
        bs=pl.coalesce(pl.col("name").str.extract(_BS_RX, 1).cast(pl.Int64),
                       pl.col("name").str.extract(_GEN_RX, 1).cast(pl.Int64), tgen),
    ).filter(pl.col("p").is_not_null())
    rng = rng.with_columns(bs=pl.when(pl.col("bs") > 0).then(pl.col("bs")))
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
    dims = pl.col("input_dims").cast(pl.String).str.json_decode(pl.List(pl.List(pl.Int64)))
    idx = pl.col("name").replace_strict(_ACT_INPUT, default=0, return_dtype=pl.Int64)
    # (rows and tokens of each distinct (op, shapes), joined to its rows: a decode loop repeats a few dozen)
    shapes = ops.select("name", "input_dims").unique().with_columns(act=dims.list.get(idx, null_on_oob=True)).filter(
        pl.col("act").list.len() >= 1)
    shapes = shapes.select(
        "name", "input_dims",
        rows=pl.when(pl.col("act").list.len() >= 2).then(pl.col("act").list.head(pl.col("act").list.len() - 1)
                                                         .list.eval(pl.element().product()).list.first())
        .otherwise(1),
        tokens=pl.when(pl.col("act").list.len() >= 3).then(pl.col("act").list.get(-2)),
    )
    ops = ops.join(shapes, on=["name", "input_dims"], how="inner", nulls_equal=True, maintain_order="left")
    return ops.group_by("step").agg(tokens=pl.col("tokens").max(), rows=pl.col("rows").max(),
                                    op=pl.col("name").first().cast(pl.String))


def _activities(trace: Trace, windows: pl.DataFrame) -> pl.DataFrame:
    """Kernels attributed to the window open on their launching thread at launch (the breakdown's rule):
    step, name, category (by name), correlation, graphed, dur."""
    from tracekit.classify import name_table

    work = trace.launches.filter(pl.col("kind").is_in(["kernel", "graph"])).select(
        "pid", "tid", "correlation", "start", graphed=pl.col("kind") == "graph")
    w = windows.select("pid", "tid", ws="start", we="end", step="step").sort("ws")
    work = work.sort("start").join_asof(w, left_on="start", right_on="ws", by=["pid", "tid"],
                                        check_sortedness=False).filter(
        pl.col("step").is_not_null() & (pl.col("we").is_null() | (pl.col("start") <= pl.col("we"))))
    pos, table = name_table(trace.kernels["name"])
    return trace.kernels.select("pid", "correlation", "name", dur=pl.col("end") - pl.col("start")).with_columns(
        category=table["category"].gather(pos).fill_null("other")).join(
        work.select("pid", "correlation", "step", "graphed"), on=["pid", "correlation"], how="inner")


def step_work(acts: pl.DataFrame, windows: pl.DataFrame) -> pl.DataFrame:
    """Per step window with kernels: what its own work says about the tokens it processes.

    ``acts``: step, name, category, graphed, correlation, dur (kernels); :func:`work_from_sums` when their
    :func:`step_sums` are made already (e.g. piece by piece). Columns: ``step``, ``complete`` (its
    window has an end), ``k_all`` (kernel time), ``g_ms`` / ``g_n`` (GEMM kernel time and launches),
    ``g_eager`` (GEMM time launched one by one), ``c_med`` (median collective kernel duration, null without
    any), ``graphed`` (kernel time replayed from graphs), ``one_replay`` (the largest single graph replay's
    kernel time), ``attention`` (any attention kernel), ``decode_kernel`` (the first decode-only attention kernel,
    :data:`DECODE_KERNELS`, or null), ``ratio`` (GEMM time / the lightest quarter's), ``heavy`` and ``light``
    (see the module docstring, source 4), ``c_ratio``.
    """
    return work_from_sums(step_sums(acts), windows)


def work_from_sums(per: pl.DataFrame, windows: pl.DataFrame) -> pl.DataFrame:
    """:func:`step_work` from the steps' :func:`step_sums`."""
    per = per.join(windows.select(pl.col("step").cast(pl.Int64), complete=pl.col("end").is_not_null()), on="step",
                   how="left")
    ref_pool = per.filter(pl.col("complete") & (pl.col("g_n") > 0))
    if ref_pool.height < 2:
        return per.with_columns(ratio=pl.lit(None, pl.Float64), c_ratio=pl.lit(None, pl.Float64),
                                heavy=pl.lit(False), light=pl.lit(False))
    ref_g = float(ref_pool["g_ms"].quantile(0.25, interpolation="lower"))
    light = ref_pool.filter(pl.col("g_ms") <= LIGHT_RATIO * ref_g)
    ref_n = float(light["g_n"].median())
    ref_c = light["c_med"].drop_nulls().median()
    per = per.with_columns(ratio=pl.col("g_ms") / ref_g if ref_g > 0 else pl.lit(None, pl.Float64),
                           c_ratio=pl.col("c_med") / ref_c if ref_c else pl.lit(None, pl.Float64))
    same_forward = (pl.col("g_n") >= ref_n / SAME_FORWARD) & (pl.col("g_n") <= ref_n * SAME_FORWARD)
    return per.with_columns(
        heavy=(same_forward & (
            ((pl.col("ratio") >= HEAVY_RATIO)
             & (pl.col("c_ratio").is_null() | (pl.col("c_ratio") >= HEAVY_COMM_RATIO)))
            | ((pl.col("ratio") >= COMM_HEAVY_GEMM_RATIO) & (pl.col("c_ratio") >= COMM_HEAVY_RATIO)))).fill_null(False),
        light=(pl.col("complete") & (pl.col("g_n") > 0) & (pl.col("ratio") <= LIGHT_RATIO)).fill_null(False))


def step_sums(acts: pl.DataFrame) -> pl.DataFrame:
    """:func:`step_work`'s sums per step of ``acts`` (kernels of whole steps)."""
    # (category compared as it is, Enum or text: a cast of ten million values to text costs more than the rest)
    cat = pl.col("category")
    gemm, comm = cat == "gemm", cat == "communication"
    graphed = pl.col("graphed").fill_null(False)
    dk = name_matches(acts["name"], DECODE_KERNELS)
    small = acts.select("step", "dur", "correlation", g=gemm, c=comm, a=cat == "attention", gr=graphed, dk=dk)
    small = small.with_columns(dk=pl.col("dk") & pl.col("a"))
    per = small.group_by("step").agg(
        k_all=pl.col("dur").sum(),
        g_ms=pl.col("dur").filter("g").sum(), g_n=pl.col("g").sum(),
        g_eager=pl.col("dur").filter(pl.col("g") & ~pl.col("gr")).sum(),
        c_med=pl.col("dur").filter("c").median(),
        graphed=pl.col("dur").filter("gr").sum(),
        attention=pl.col("a").any(),
    )
    # the first decode-only attention kernel of each step (few rows: filtered before grouping)
    first_dk = (acts.select("step", "name").filter(small["dk"]).group_by("step").agg(
        decode_kernel=pl.col("name").first()).with_columns(pl.col("decode_kernel").cast(pl.String)))
    per = per.join(first_dk, on="step", how="left")
    replays = (small.filter("gr").group_by("step", "correlation").agg(t=pl.col("dur").sum())
               .group_by("step").agg(one_replay=pl.col("t").max()))
    return per.join(replays, on="step", how="left").with_columns(pl.col("one_replay").fill_null(0))


def same_forward_as(heavy: pl.DataFrame) -> pl.Expr:
    """Steps whose GEMM launches are within :data:`SAME_FORWARD` of the ``heavy`` steps' (median): the same
    model's forward, fewer tokens."""
    n = float(heavy["g_n"].median())
    return (pl.col("g_n") >= n / SAME_FORWARD) & (pl.col("g_n") <= n * SAME_FORWARD)


def _shape_phases(trace: Trace, windows: pl.DataFrame, ann: pl.DataFrame, work: pl.DataFrame) -> pl.DataFrame:
    """The steps whose GEMM input shapes tell the phase (prefill from the tokens per sequence or rows; decode only
    where the shapes cover the step's GEMMs: most of its GEMM time launched eagerly): step, phase, evidence."""
    shapes = gemm_rows(trace, windows).join(ann.select("step", "bs"), on="step", how="left").join(
        work.select("step", "attention", eager=pl.col("g_eager") >= SHAPES_EAGER_SHARE * pl.col("g_ms")),
        on="step", how="left")
    per_seq = pl.coalesce(pl.col("tokens"), pl.col("rows") // pl.col("bs"))
    shapes = shapes.with_columns(
        phase=pl.when(per_seq >= PREFILL_MIN_TOKENS).then(pl.lit("prefill"))
        .when(per_seq.is_null() & (pl.col("rows") >= PREFILL_MIN_ROWS)).then(pl.lit("prefill"))
        .when((pl.coalesce(per_seq, pl.col("rows")) <= DECODE_MAX_TOKENS) & pl.col("eager").fill_null(False)
              & pl.col("attention").fill_null(False)).then(pl.lit("decode")),
        evidence=pl.when(pl.col("tokens").is_not_null())
        .then(pl.format("GEMM inputs of {} tokens per sequence ({})", pl.col("tokens"), pl.col("op")))
        .otherwise(pl.format("GEMM inputs of {} rows ({})", pl.col("rows"), pl.col("op"))),
    ).filter(pl.col("phase").is_not_null())
    return shapes


def _work_phases(work: pl.DataFrame) -> tuple[pl.DataFrame, ...]:
    """The phases the steps' work tells (:func:`work_from_sums`' frame), one frame each in the order they rank:
    heavy steps (prefill or mixed), decode-only attention kernels, graph replays beside eager prefill, light steps
    beside prefill, and one graph replay holding most of the kernel time."""
    # work: token-proportional GEMMs and collectives against the lightest steps
    comm_txt = pl.when(pl.col("c_ratio").is_not_null()).then(
        pl.format(", collectives {}x as long", pl.col("c_ratio").round(1))).otherwise(pl.lit(""))
    heavy = work.filter("heavy").with_columns(
        phase=pl.when(pl.col("decode_kernel").is_not_null()).then(pl.lit("mixed")).otherwise(pl.lit("prefill")),
        evidence=pl.format("token-proportional work: GEMM time {}x the lightest steps' over as many GEMM launches{}"
                           "{}", pl.col("ratio").round(1), comm_txt,
                           pl.when(pl.col("decode_kernel").is_not_null())
                           .then(pl.format(", beside decode attention ({})", pl.col("decode_kernel").str.slice(0, 50)))
                           .otherwise(pl.lit(": prompt tokens"))))
    kernels = work.filter(pl.col("decode_kernel").is_not_null() & ~pl.col("heavy")).select(
        "step", phase=pl.lit("decode"),
        evidence=pl.format("decode-only attention kernel {}", pl.col("decode_kernel").str.slice(0, 70)))
    eager_heavy = work.filter("heavy")
    graph_vs_eager = work.head(0).select("step", phase=pl.lit("decode"), evidence=pl.lit(""))
    if eager_heavy.height and float(eager_heavy["g_eager"].sum()) >= SHAPES_EAGER_SHARE * float(
            eager_heavy["g_ms"].sum()):
        r = float(eager_heavy["ratio"].median())
        graph_vs_eager = work.filter(pl.col("light") & pl.col("attention")
                                     & (pl.col("graphed") >= GRAPHED_LIGHT_SHARE * pl.col("k_all"))).select(
            "step", phase=pl.lit("decode"),
            evidence=pl.format("replays CUDA graphs for {}% of its kernel time where the {}x heavier prefill "
                               "step(s) run eager (engines capture graphs for decode batches)",
                               (100 * pl.col("graphed") / pl.col("k_all")).round(0).cast(pl.Int64),
                               pl.lit(round(r, 1))))
    # light beside prefill: in a window whose heavy steps are prefill, the steady light steps of the same forward
    # (the window's majority) process a handful of tokens each: the decode steps that follow a prompt
    prefill_heavy = work.filter(pl.col("heavy") & pl.col("decode_kernel").is_null())
    n_light = int(work["light"].sum())
    light_beside = work.head(0).select("step", phase=pl.lit("decode"), evidence=pl.lit(""))
    if prefill_heavy.height and n_light >= LIGHT_MAJORITY * int(work["complete"].fill_null(False).sum()):
        r = float(prefill_heavy["ratio"].median())
        light_beside = work.filter(pl.col("light") & pl.col("attention") & same_forward_as(prefill_heavy)).select(
            "step", phase=pl.lit("decode"),
            evidence=pl.lit(f"token-proportional work: the window's steady step, GEMM time 1/{r:.1f} of the "
                            f"prefill step(s)' over the same forward (a handful of tokens per sequence)"))
    # graph: the largest single graph replay's share of the step's kernel time
    graph = work.filter(pl.col("attention") & (pl.col("k_all") > 0)
                        & (pl.col("one_replay") >= GRAPH_DECODE_SHARE * pl.col("k_all"))).select(
        "step", phase=pl.lit("decode"),
        evidence=pl.format("one CUDA graph replay holds {}% of the kernel time",
                           (100 * pl.col("one_replay") / pl.col("k_all")).round(0).cast(pl.Int64)))
    return heavy, kernels, graph_vs_eager, light_beside, graph


def step_phases(trace: Trace, windows: pl.DataFrame, acts: pl.DataFrame | None = None) -> pl.DataFrame:
    """The phase of every step window.

    ``windows``: the steps (``Steps.windows``: step, pid, tid, start, end). ``acts``: the attributed GPU
    activity (the breakdown's activities frame: step, name, category, kind, graphed, correlation, dur); computed
    from the trace with the same attribution rule when not given. Returns one row per window: step, phase
    (decode|prefill|mixed|unknown), source (annotation|training|shapes|work|kernels|manifest|graph|null) and
    evidence (what was seen, one line).
    """
    steps = windows.select(pl.col("step").cast(pl.Int64))
    if acts is None:
        acts, kernels_of = _activities(trace, windows), None
    else:
        # (the columns read first, then one filter: filtering the wide frame copies every column; whole steps piece
        # by piece, intervals.step_chunks, so that the copy is never of ten million rows at once)
        keep = pl.col("step").is_not_null() & ((pl.col("kind") == "kernel") if "kind" in acts.columns else True)
        cat = pl.col("name_category") if "name_category" in acts.columns else pl.col("category")

        def kernels_of(a: pl.DataFrame) -> pl.DataFrame:
            return a.select(pl.col("step").cast(pl.Int64), "name", "correlation", pl.col("graphed").fill_null(False),
                            "dur", category=cat, _keep=keep).filter("_keep").drop("_keep")

    def piece(a: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
        """A piece's backward/optimizer kernels and its step sums (only these small frames are kept)."""
        k = kernels_of(a) if kernels_of is not None else a
        return k.filter(name_matches(k["name"], TRAINING_KERNELS)), step_sums(k)

    parts = by_pieces(piece, acts)
    ann = annotation_phases(trace, windows)
    # training: backward/optimizer kernels in the step, else anywhere in the trace
    bwd = pl.concat([b for b, _ in parts])
    per_bwd = bwd.group_by("step").agg(n=pl.len(), example=pl.col("name").first().cast(pl.String))
    trace_bwd = trace.kernels.filter(_kernel_matches(trace.kernels, TRAINING_KERNELS))
    work = work_from_sums(pl.concat([w for _, w in parts]), windows)
    shapes = _shape_phases(trace, windows, ann, work)
    heavy, kernels, graph_vs_eager, light_beside, graph = _work_phases(work)
    manifest = trace.manifest if isinstance(trace.manifest, dict) else None
    listed = _manifest_phases(manifest, steps) if manifest and isinstance(manifest.get("step_phases"), list) else None
    sources = [
        ann.select("step", "phase", "evidence", source=pl.lit("annotation")),
        *([listed] if listed is not None else []),
        per_bwd.select("step", phase=pl.lit("training"), source=pl.lit("training"),
                       evidence=pl.format("training step: {} backward/optimizer kernels (e.g. {})", pl.col("n"),
                                          pl.col("example").str.slice(0, 60))),
    ]
    if trace_bwd.height:
        ex = str(trace_bwd["name"][0])[:60]
        sources.append(steps.select("step", phase=pl.lit("training"), source=pl.lit("training"),
                                    evidence=pl.lit(f"training trace: {trace_bwd.height} backward/optimizer "
                                                    f"kernels (e.g. {ex})")))
    else:
        host = training_host(trace)
        if host is not None:
            sources.append(steps.select("step", phase=pl.lit("training"), source=pl.lit("training"),
                                        evidence=pl.lit(host)))
    sources += [shapes.select("step", "phase", "evidence", source=pl.lit("shapes")),
                heavy.select("step", "phase", "evidence", source=pl.lit("work")),
                kernels.with_columns(source=pl.lit("kernels")),
                graph_vs_eager.with_columns(source=pl.lit("work")),
                light_beside.with_columns(source=pl.lit("work"))]
    if manifest and listed is None:
        sources.append(_manifest_phases(manifest, steps))
    sources.append(graph.with_columns(source=pl.lit("graph")))
    why = no_llm_decode(trace, work)
    if why is not None:  # the last word, for steps nothing else speaks for: no decode step, phase still unknown
        sources.append(steps.select("step", phase=pl.lit("unknown"), source=pl.lit(NO_LLM), evidence=pl.lit(why)))
    ranked = pl.concat([s.select(pl.col("step").cast(pl.Int64), pl.col("phase").cast(pl.String),
                                 pl.col("source").cast(pl.String), pl.col("evidence").cast(pl.String),
                                 rank=pl.lit(i)) for i, s in enumerate(sources)])
    best = ranked.sort("rank", maintain_order=True).group_by("step").first().drop("rank")
    return steps.join(best, on="step", how="left").with_columns(
        phase=pl.col("phase").fill_null("unknown"),
        evidence=pl.col("evidence").fill_null(NO_EVIDENCE),
    ).select(list(PHASE_SCHEMA)).sort("step")


NO_EVIDENCE = "no annotation, GEMM shapes, token-proportional work, decode kernel, manifest or graph replay says"
NO_LLM = "no_llm"  # source of steps that show no LLM decode work (phase unknown, no decode advice)


def training_host(trace: Trace) -> str | None:
    """Training evidence from the host side (:data:`TRAINING_HOST`: autograd backward, optimizer, FSDP backward
    hooks, activation checkpointing in range or op names), in words; None without any. For traces whose window
    holds no backward kernel (a forward-only slice of a training step)."""
    # (the ops' names tested once per distinct name: Trace.ops.name is categorical)
    hits = pl.concat([f.filter(name_matches(f["name"], TRAINING_HOST))["name"].cast(pl.String)
                      for f in (trace.ranges, trace.ops)])
    if hits.len() == 0:
        return None
    # the plainest example: one that is not only a checkpoint wrapper's module name
    strong = hits.filter(~hits.str.contains(r"_checkpoint_wrapped_module"))
    ex = (strong if strong.len() else hits)[0].split(", op_id")[0][:70]
    return (f"training trace: {hits.len()} autograd-backward / optimizer / FSDP-backward / checkpointing host "
            f"ranges (e.g. {ex})")


def no_llm_decode(trace: Trace, work: pl.DataFrame) -> str | None:
    """Why the window's steps are no LLM decode steps, in words, or None when nothing says so.

    A decode step runs the model's attention (or its linear-attention / SSM update) and reads weights through GEMMs,
    and a serving loop reads its sampled tokens back to the host. Evidence: no step runs an attention kernel (with
    every kernel visible: not a whole-graph nsys capture), and either no step runs a GEMM either (no model forward at
    all: pipit's saxpy) or the trace holds no device-to-host copy (no token is ever read back: a layer
    micro-benchmark, a convolution network). Either alone is not enough: a decode trace may name its attention
    kernels in ways the taxonomy does not know, and a graph-captured loop may keep its tokens on the GPU."""
    if trace.meta.graph_trace_mode == "graph" or work.height == 0 or bool(work["attention"].any()):
        return None
    gemm = bool((work["g_n"] > 0).any())
    dtoh = trace.memops.filter(pl.col("copy_kind") == "DtoH").height
    if not gemm:
        return "no attention kernel and no GEMM in any step: no model forward"
    if dtoh:
        return None
    convs = trace.kernels.filter(name_matches(trace.kernels["name"], r"(?i)conv|fprop_implicit|fft2d|scudnn"))
    what = f"; {convs.height} convolution kernels" if convs.height else ""
    return f"no attention kernel in any step, no device-to-host copy in the trace: no token is read back{what}"


def _manifest_phases(manifest: dict, steps: pl.DataFrame) -> pl.DataFrame:
    """The manifest's word on each step: its ``step_phases`` list (one phase per step window, in order) where it
    records one, else a tracekit capture's decode loop for every step."""
    listed = manifest.get("step_phases")
    if isinstance(listed, list) and len(listed) == steps.height and all(p in PHASES for p in listed):
        return steps.sort("step").with_columns(phase=pl.Series(listed, dtype=pl.String), source=pl.lit("manifest"),
                                               evidence=pl.lit("manifest: the capture's own record of each step"))
    phase = manifest.get("phase") or "decode"  # tracekit capture runs decode loops
    if phase not in PHASES:
        return steps.head(0).with_columns(phase=pl.lit(None, pl.String), source=pl.lit("manifest"),
                                          evidence=pl.lit(None, pl.String))
    return steps.with_columns(phase=pl.lit(phase), source=pl.lit("manifest"),
                              evidence=pl.lit(f"manifest: a tracekit capture of a {phase} loop "
                                              f"({manifest.get('workload')})"))


def with_speculation(phases: pl.DataFrame, spec_steps: pl.Series, evidence: str) -> pl.DataFrame:
    """``phases`` with the speculative steps (``tracekit.analyses.speculation``: draft work, verify spans, speculative
    frames or shapes) made decode, source ``speculation``: a speculative step verifies a handful of drafted tokens per
    sequence, so it is a decode step whatever weaker evidence said (contract, Additions to /3). The engine's own
    annotation of the step and training evidence keep their word."""
    src = pl.col("source").fill_null("")
    hit = (pl.col("step").is_in(spec_steps.cast(pl.Int64).implode()) & (pl.col("phase") != "decode")
           & ~src.is_in(["annotation", "training"]))
    return phases.with_columns(
        phase=pl.when(hit).then(pl.lit("decode")).otherwise(pl.col("phase")),
        source=pl.when(hit).then(pl.lit("speculation")).otherwise(pl.col("source")),
        evidence=pl.when(hit).then(pl.lit(f"speculative decoding: {evidence}")).otherwise(pl.col("evidence")))


def phase_counts(phases: pl.DataFrame) -> dict[str, int]:
    """``steps.phases``: {phase: steps} in the order of :data:`PHASES`, phases with no step left out."""
    got = dict(phases.group_by("phase").len().iter_rows()) if phases.height else {}
    return {p: int(got[p]) for p in PHASES if got.get(p)}


def _said(counts: dict[str, int], training: bool = False) -> str:
    """The phases of a window in words: "prefill 6" / "decode 9, prefill 1" / "training 4"."""
    return ", ".join(f"{p} {n}" for p, n in counts.items())


def select_phase(phases: pl.DataFrame, wanted: str = "decode") -> tuple[pl.DataFrame, list[str]]:
    """Which steps ``--phase wanted`` analyses: per step, ``reason`` null (analysed) or ``"phase"``.

    ``unknown`` steps are analysed under ``decode`` (no evidence against; the caller warns). ``all`` keeps
    every step. When no step is decode (the default ``--phase decode`` on a training or prefill window), every
    step is kept and ``decode_advice`` is False: the split is still shown, without decode advice, and one warning
    says so. ``--phase prefill`` or ``mixed`` on a window without such steps is refused
    (:class:`~tracekit.errors.NoSteps`, naming the phases there). Returns ``(frame: step, phase, reason,
    decode_advice), warnings``.
    """
    from tracekit.errors import BadOptionValue, NoSteps

    if wanted not in ("decode", "prefill", "mixed", "training", "all"):
        raise BadOptionValue(f"--phase {wanted!r}: choose decode, prefill, mixed, training or all")
    warnings: list[str] = []
    p = pl.col("phase")
    keep = pl.lit(True) if wanted == "all" else (p == wanted) | ((p == "unknown") & (wanted == "decode"))
    no_llm = (pl.col("source") == NO_LLM).fill_null(False) if "source" in phases.columns else pl.lit(False)
    out = phases.select("step", "phase", keep=keep, no_llm=no_llm)
    counts = phase_counts(phases)
    training = "source" in phases.columns and bool((phases["source"] == "training").any())
    if wanted != "all" and out.height and not out["keep"].any():
        if wanted != "decode":
            other = [q for q in ("decode", "prefill", "mixed", "training") if counts.get(q)]
            hint = f"--phase {other[0]}" if len(other) == 1 else "--phase all"
            raise NoSteps(f"no {wanted} steps in this window (phases: {_said(counts, training)}); pass {hint}")
        # (said once, by the caller's verdict: tracekit.analyses.phase.no_decode_advice)
        out = out.with_columns(keep=pl.lit(True))
        advice = False
    else:
        kept = out.filter(pl.col("keep"))
        advice = bool((kept["phase"].is_in(["decode", "unknown"]) & ~kept["no_llm"]).any()) \
            if wanted in ("decode", "all") else False
        if wanted == "decode" and kept["phase"].eq("unknown").all() and not kept["no_llm"].all():
            warnings.append("the phase of the steps is unknown (no annotation, GEMM shapes, token-proportional work, "
                            "decode kernel, manifest or graph replay tells decode from prefill): analysed as decode "
                            "steps")
    n_out = int((~out["keep"]).sum())
    if n_out:
        left = {q: n for q, n in phase_counts(out.filter(~pl.col("keep"))).items()}
        warnings.append(f"{n_out} step(s) not in phase {wanted} excluded ({_said(left, training)}); --phase all "
                        "analyses every step")
    return out.select("step", "phase", reason=pl.when(~pl.col("keep")).then(pl.lit("phase")),
                      decode_advice=pl.lit(advice)), warnings


def no_decode_advice(phase: str, phases: dict[str, int], training: bool, no_llm: str | None = None) -> str:
    """Why decode advice does not apply to the analysed steps, once, right for the window: names what the steps
    are and points to ``--phase decode`` only when the window has decode steps. ``no_llm``: the evidence that the
    steps show no LLM decode work (:func:`no_llm_decode`)."""
    if no_llm:
        return f"no decode advice: these steps show no LLM decode work ({no_llm}); the split above still holds"
    what = phase
    if phases.get("decode"):
        return (f"{what} steps: decode advice does not apply (the split above still holds); the window also has "
                f"{phases['decode']} decode step(s): --phase decode analyses them")
    return f"{what} steps: decode advice does not apply (the split above still holds; the window has no decode step)"


def window_phase(phases: pl.Series) -> str:
    """``steps.phase`` of the analysed steps: their common phase; ``mixed`` when decode and prefill (or mixed)
    steps are analysed together; ``unknown`` steps do not change a known phase unless all are unknown."""
    known = set(phases.drop_nulls().unique().to_list()) - {"unknown"}
    if not known:
        return "unknown"
    if len(known) == 1:
        return known.pop()
    return "mixed"
