"""Speculative decoding as the engines run and record it (contract, Additions to ``/3``: ``advice.drafting``'s
``speculative``, ``draft_model``, ``verify_tokens``, detection ``engine``).

Every engine's speculative step shares one structure: a *target forward that verifies several tokens per sequence*
(K+1: the last accepted token and K proposals), then a host read of what was accepted; with a draft model, the
draft's forwards (one-token chains, k-row tree levels, a (K+1)-token extend) run between target forwards; without one
(n-gram / prompt lookup) the proposals come from the host. Each rule here rests on that structure or on what the
engines themselves write, never on a size that held in one capture. Evidence, each source on its own (none waits
for the step's phase, and a speculative step is a decode step whatever else is unknown:
``tracekit.analyses.phase``):

1. **engine spans** (the engines' ``record_function`` / NVTX step spans; ``../reference/engine-profiling-apis.md``):
   SGLang ``step[MODE bs=N ...]`` with ``MODE`` ``TARGET_VERIFY`` / ``VERIFY`` (speculative), ``DRAFT`` /
   ``DRAFT_EXTEND`` / ``DRAFT_EXTEND_V2`` (a draft model); a trace whose SGLang spans are all ``DECODE`` (and
   ``EXTEND``/``MIXED``) decodes without speculation. vLLM ``execute_context_N(Tc)_generation_M(Tg)``: Tg > M is
   speculative with Tg/M tokens verified per sequence, Tg == M plain decode.
2. **engine frames** (``with_stack``: Python functions in ``Trace.ops``, ``path/file.py(line): function``): SGLang's
   speculative workers (``speculative/eagle_worker.py``: ``draft``, ``verify``,
   ``forward_draft_extend_after_decode``; ``standalone_worker``, ``multi_layer_eagle_worker``, ``ngram_worker``),
   vLLM's proposers (``spec_decode/eagle.py`` ``propose``, ``spec_decode/ngram_proposer.py``,
   ``sample/rejection_sampler.py``). N-gram frames say: no draft model.
3. **kernels by name**: the taxonomy's speculative kernels (tree building, tree verification, vLLM's
   ``rejection_*_sample_kernel``; category ``drafting`` by name).
4. **structure**: forwards of a distinct draft model between target forwards (``tracekit.analyses.drafting``).
5. **shapes** (the torch profiler's ``record_shapes``): the target's linear inputs over S tokens per sequence
   (``[batch, S, hidden]``, or rows ÷ the engine's batch), 2 ≤ S ≤ ``phase.DECODE_MAX_TOKENS``: S tokens verified;
   S = 1 in every step: plain decode.
6. **manifest**: a tracekit capture records its ``spec`` settings (``draft_tokens``) or none.

:func:`engine_draft_windows` gives the host windows whose launches are draft work by the engines' own records
(SGLang's eager draft forwards run through ``ModelRunner.forward`` as ``step[DECODE ...]`` inside an iteration that
verifies; the draft-model frames), beside the draft ranges ``--draft-range`` matches.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl

from tracekit.analyses.phase import DECODE_MAX_TOKENS, _in_windows, name_matches
from tracekit.trace import Trace

# SGLang ForwardMode names in step spans (python/sglang/srt/model_executor/forward_batch_info.py; span text from
# utils/profile_utils.py build_step_span_name): which say "speculative", which "a draft model".
_SG_MODE = r"^step\[(\w+)"
SG_VERIFY = ("TARGET_VERIFY", "VERIFY")
SG_DRAFT = ("DRAFT", "DRAFT_EXTEND", "DRAFT_EXTEND_V2")
SG_PLAIN = ("DECODE",)
_VLLM = r"generation_(\d+)\((\d+)\)"  # vLLM Worker.annotate_profile: execute_context_N(Tc)_generation_M(Tg)
# Python frames of the engines' speculative workers (torch.profiler with_stack: "path/file.py(line): function").
# sgl-project/sglang python/sglang/srt/speculative/: eagle_worker.py (EAGLEWorker.draft, verify,
# forward_draft_extend_after_decode, draft_forward), eagle_worker_v2.py, standalone_worker.py,
# multi_layer_eagle_worker*.py, ngram_worker.py; vllm-project/vllm vllm/v1/spec_decode/ (eagle.py EagleProposer.propose,
# draft_model.py, medusa.py, ngram_proposer.py NgramProposer.propose, suffix_decoding.py) and
# vllm/v1/sample/rejection_sampler.py.
# (Only the workers' and proposers' own modules: a server without speculation runs speculative/spec_info.py's mode
# checks, is_none / is_speculative, in every step: trace:lora_perf_lora_profile/.../bs16-TP-0.)
_SG_WORKERS = r"(eagle_worker(_v2)?|standalone_worker(_v2)?|multi_layer_eagle_worker\w*|ngram_worker|eagle_draft\w*)"
_VL_PROPOSERS = r"(eagle|ngram_proposer|draft_model|medusa|suffix_decoding|mtp\w*|llm_base_proposer)"
SPEC_FRAMES = (rf"(^|/)speculative/{_SG_WORKERS}\.py\(\d+\): \w+$|(^|/)spec_decode/{_VL_PROPOSERS}\.py\(\d+\): \w+$"
               r"|(^|/)rejection_sampler\.py\(\d+\): \w+$")
DRAFT_FRAMES = (r"(^|/)speculative/(eagle_worker(_v2)?|standalone_worker(_v2)?|multi_layer_eagle_worker\w*|eagle_draft\w*)"
                r"\.py\(\d+\): (draft|draft_forward|forward_draft_extend|forward_draft_extend_after_decode"
                r"|_draft_extend_for_decode|_draft_extend_for_prefill)$"
                r"|(^|/)spec_decode/(eagle|draft_model|medusa|mtp\w*)\.py\(\d+\): (propose|propose_draft_token_ids)$")
NGRAM_FRAMES = r"(^|/)(speculative/ngram\w*|spec_decode/(ngram_proposer|suffix_decoding))\.py\(\d+\): \w+$"


@dataclass(frozen=True)
class Speculation:
    """Whether the analysed steps decode speculatively, and what says so."""

    speculative: bool | None  # True: the steps verify drafted tokens; False: plain decode; None: no evidence
    draft_model: bool | None  # False: proposals without a draft model (n-gram); None: unknown
    verify_tokens: int | None  # tokens per sequence the verify forward processes (K+1)
    source: str | None  # the strongest source: engine | kernels | structure | shapes | manifest | ranges
    evidence: tuple[str, ...] = ()
    steps: tuple[int, ...] = ()  # the step windows found speculative (engine spans, frames or shapes)

    def to_fields(self) -> dict:
        """The contract's keys of ``advice.drafting``."""
        return {"speculative": self.speculative, "draft_model": self.draft_model,
                "verify_tokens": self.verify_tokens}


OFF = Speculation(None, None, None, None)  # --draft-range none (drafting's own evidence line says so)


def _placed(events: pl.DataFrame, windows: pl.DataFrame) -> pl.DataFrame:
    """``events`` (start, end, pid, ...) with the ``step`` whose window holds the event's middle: an inferred step
    window begins at its first launch, after the Python that opened the engine's span around it."""
    mid = pl.col("start") + (pl.col("end").fill_null(pl.col("start")) - pl.col("start")) // 2
    out = _in_windows(events.with_columns(_start=pl.col("start"), start=mid), windows)
    return out.with_columns(start=pl.col("_start")).drop("_start")


def _names(frame: pl.DataFrame, regex: str) -> pl.DataFrame:
    """Rows of ``frame`` whose ``name`` matches ``regex`` (each distinct name tested once)."""
    if frame.height == 0:
        return frame
    return frame.filter(name_matches(frame["name"], regex))


def engine_spans(trace: Trace, windows: pl.DataFrame) -> pl.DataFrame:
    """Per step window, what the engines' step spans in it say: ``step``, ``verify`` / ``draft`` / ``plain``
    (SGLang span modes seen), ``gen`` / ``gen_tokens`` (vLLM's decode requests and their tokens), ``bs`` (SGLang's
    batch), ``example``."""
    rng = trace.ranges
    if rng.height == 0:
        return pl.DataFrame(schema={"step": pl.Int64, "verify": pl.Boolean, "draft": pl.Boolean, "plain": pl.Boolean,
                                    "gen": pl.Int64, "gen_tokens": pl.Int64, "bs": pl.Int64, "example": pl.String})
    r = _names(rng.select("start", "end", "pid", "name"), r"^step\[\w+|generation_\d+\(\d+\)")
    r = _placed(r, windows).with_columns(mode=pl.col("name").str.extract(_SG_MODE, 1),
                                             gen=pl.col("name").str.extract(_VLLM, 1).cast(pl.Int64),
                                             gen_tokens=pl.col("name").str.extract(_VLLM, 2).cast(pl.Int64))
    return r.group_by("step").agg(
        verify=pl.col("mode").is_in(SG_VERIFY).any(), draft=pl.col("mode").is_in(SG_DRAFT).any(),
        plain=pl.col("mode").is_in(SG_PLAIN).any(), gen=pl.col("gen").max(), gen_tokens=pl.col("gen_tokens").max(),
        bs=pl.col("name").str.extract(r"\bbs=(\d+)", 1).cast(pl.Int64).max(),
        example=pl.col("name").filter(pl.col("mode").is_in(SG_VERIFY + SG_DRAFT) | (pl.col("gen_tokens") > pl.col("gen")))
        .min().fill_null(pl.col("name").min()).cast(pl.String)).sort("step")  # (the examples cited: the first step's)


def engine_frames(trace: Trace, windows: pl.DataFrame) -> pl.DataFrame:
    """Per step window, the engines' speculative Python frames in it: ``step``, ``spec`` / ``draft`` / ``ngram``
    (how many), ``example`` (one draft-model frame, else one speculative frame)."""
    ops = trace.ops
    empty = pl.DataFrame(schema={"step": pl.Int64, "spec": pl.UInt32, "draft": pl.UInt32, "ngram": pl.UInt32,
                                 "example": pl.String})
    if ops.height == 0:
        return empty
    f = _names(ops.select("start", "end", "pid", "name"), SPEC_FRAMES)
    if f.height == 0:
        return empty
    f = f.with_columns(pl.col("name").cast(pl.String))
    f = _placed(f, windows).with_columns(draft=pl.col("name").str.contains(DRAFT_FRAMES),
                                             ngram=pl.col("name").str.contains(NGRAM_FRAMES))
    return f.group_by("step").agg(spec=pl.len(), draft=pl.col("draft").sum(), ngram=pl.col("ngram").sum(),
                                  example=pl.col("name").filter("draft").min().fill_null(pl.col("name").min())
                                  ).sort("step")


def engine_draft_windows(trace: Trace, windows: pl.DataFrame) -> tuple[pl.DataFrame, str | None]:
    """Host windows whose launches are draft work by the engines' own records: SGLang's eager draft forwards
    (``step[DECODE ...]`` spans in a step window that also holds a verify span: EAGLE v1 runs its draft forwards through
    ``ModelRunner.forward`` when not graphed) and the draft-model frames (:data:`DRAFT_FRAMES`). Returns
    ``(pid, tid, start, end)`` rows and a line of evidence (None when there are none). The engines' ``step[DRAFT...]``
    spans are draft ranges by the default ``--draft-range`` already."""
    cols = ["pid", "tid", "start", "end"]
    parts, said = [], []
    rng = trace.ranges
    if rng.height:
        sg = _names(rng.select(*cols, "name"), r"^step\[\w+")
        if sg.height:
            sg = sg.with_columns(mode=pl.col("name").str.extract(_SG_MODE, 1))
            steps = _placed(sg.select("start", "pid", "mode", "tid", "end", "name"), windows)
            verifying = steps.filter(pl.col("mode").is_in(SG_VERIFY))["step"].unique().implode()
            eager_draft = steps.filter(pl.col("mode").is_in(SG_PLAIN) & pl.col("step").is_in(verifying))
            if eager_draft.height:
                parts.append(eager_draft.select(cols))
                said.append(f"SGLang's step[DECODE ...] spans inside iterations that verify: {eager_draft.height} eager "
                            f"draft forwards (EAGLE v1 runs them through ModelRunner.forward)")
    ops = trace.ops
    if ops.height:
        fr = _names(ops.select(*cols, "name"), SPEC_FRAMES)
        if fr.height:
            fr = fr.with_columns(pl.col("name").cast(pl.String)).filter(pl.col("name").str.contains(DRAFT_FRAMES))
            if fr.height:
                top = fr.group_by("name").len().sort(["len", "name"], descending=[True, False])
                ex = ", ".join(f"{n.rsplit('/', 1)[-1][:60]} x{c}" for n, c in top.head(3).iter_rows())
                parts.append(fr.select(cols))
                said.append(f"the engine's draft frames (with_stack): {ex}")
    if not parts:
        return pl.DataFrame(schema={c: pl.Int64 for c in cols}), None
    return pl.concat(parts).filter(pl.col("end").is_not_null()).sort("start"), "; ".join(said)


def shape_tokens(trace: Trace, windows: pl.DataFrame, bs: pl.DataFrame | None = None) -> pl.DataFrame:
    """Per step with recorded linear-layer shapes, the tokens per sequence of its widest decode-sized input:
    ``step``, ``tokens`` (3-D ``[batch, S, hidden]`` inputs: S; 2-D rows ÷ the engine's batch ``bs`` where an
    annotation names it), ``ones`` (every such input has one token per sequence)."""
    from tracekit.analyses.phase import gemm_rows

    g = gemm_rows(trace, windows)
    if g.height == 0:
        return pl.DataFrame(schema={"step": pl.Int64, "tokens": pl.Int64})
    if bs is not None and bs.height:
        g = g.join(bs.select("step", "bs"), on="step", how="left")
        per_seq = pl.coalesce(pl.col("tokens"), pl.col("rows") // pl.col("bs"))
    else:
        per_seq = pl.col("tokens")
    return g.select("step", tokens=per_seq).filter(pl.col("tokens").is_not_null())


def _count(x: float, one: str) -> str:
    return f"{x:g} {one}{'' if x == 1 else 's'}"


def decide(trace: Trace, windows: pl.DataFrame, *, spans: pl.DataFrame | None = None,
           frames: pl.DataFrame | None = None, tokens: pl.DataFrame | None = None,
           structure=None, spec_kernels: str | None = None,
           draft_found: str | None = None, draft_gemm: bool = True, rows: pl.DataFrame | None = None,
           analysed: pl.Series | None = None) -> Speculation:
    """What the evidence says of the analysed steps (``analysed``: their ids; default every window).

    ``structure``: what ``tracekit.analyses.drafting.detect_drafting`` found (a ``Drafting``), or None; ``spec_kernels``: the speculative kernels' evidence line (or None);
    ``draft_found``: how draft work was found where it was (draft ranges, engine spans, frames), else None;
    ``draft_gemm``: that draft work holds GEMM kernels (a draft model's forwards; without any, the draft ranges hold
    only the upload of host proposals: no draft model).
    """
    ids = (analysed if analysed is not None else windows["step"]).cast(pl.Int64)
    n = max(1, ids.n_unique())
    r = _Reading()

    def mine(f: pl.DataFrame | None) -> pl.DataFrame:
        return f.filter(pl.col("step").is_in(ids.implode())) if f is not None and f.height else pl.DataFrame()

    s = mine(spans)
    _from_spans(r, s, n)
    _from_frames(r, mine(frames), n)
    if spec_kernels:
        if r.spec is None:
            r.spec, r.source = True, "kernels"
        r.ev.append(spec_kernels)
    if structure is not None and structure.detection == "structure":
        if r.spec is not True:
            r.spec, r.source = True, r.source or "structure"
        r.draft = True  # (its evidence is the drafting detection's own)
    if draft_found:
        if r.spec is None:
            r.spec = True
            r.source = r.source or "ranges"
        if r.draft is None:
            r.draft = draft_gemm
            if not draft_gemm:
                r.ev.append("the draft work holds no GEMM kernel: the proposals come without a draft model")
    if r.verify is None and s.height and rows is not None and rows.height:
        _from_rows(r, s, rows, n)
    _from_shapes(r, mine(tokens))
    man = trace.manifest if isinstance(trace.manifest, dict) else None
    if man is not None and "spec" in man:
        _from_manifest(r, man)
    if r.spec is True and r.draft is None and structure is not None and structure.single_forward:
        r.draft = False
        r.ev.append("one token-producing forward per step: the proposals come without a draft model")
    if r.spec is False:
        r.draft = r.verify = None
    # a quantity the trace cannot show is null with the reason, never a guess (contract, "One story")
    if r.spec is None:
        r.ev.append(NO_SPEC_EVIDENCE)
    elif r.spec is True and r.verify is None:
        r.ev.append(NO_VERIFY_TOKENS)
    return Speculation(r.spec, r.draft, r.verify, r.source, tuple(r.ev), tuple(sorted(r.spec_steps)))


@dataclass
class _Reading:
    """:func:`decide`'s reading as each source adds to it: speculative, a draft model, tokens verified per
    sequence, the first source that said speculative or not, the evidence lines, the speculative steps."""

    spec: bool | None = None
    draft: bool | None = None
    verify: int | None = None
    source: str | None = None
    ev: list[str] = field(default_factory=list)
    spec_steps: set[int] = field(default_factory=set)


def _from_spans(r: _Reading, s: pl.DataFrame, n: int) -> None:
    """The engine's step spans (``engine_spans``): SGLang's verify/draft spans, vLLM's generation tokens per
    request."""
    if not s.height:
        return
    sg_v = s.filter(pl.col("verify"))
    vl = s.filter(pl.col("gen").is_not_null() & (pl.col("gen") > 0))
    vl_spec = vl.filter(pl.col("gen_tokens") > pl.col("gen"))
    if sg_v.height:
        r.spec, r.source = True, "engine"
        r.spec_steps |= set(sg_v["step"].to_list())
        r.ev.append(f"the engine's spans: {sg_v.height} of {n} steps verify ({sg_v['example'][0][:60]!r})")
        if s.filter(pl.col("draft")).height:
            r.draft = True
    elif vl_spec.height:
        r.spec, r.source = True, "engine"
        r.spec_steps |= set(vl_spec["step"].to_list())
        per = (vl_spec["gen_tokens"] / vl_spec["gen"]).median()
        r.verify = int(round(per)) if per and per >= 2 else None
        r.ev.append(f"the engine's spans: {vl_spec.height} of {n} steps verify {per:g} tokens per sequence "
                    f"({vl_spec['example'][0][:60]!r}: generation tokens / requests)")
    elif vl.height >= 0.5 * n:
        r.spec, r.source = False, "engine"
        r.ev.append(f"the engine's spans: {vl.height} of {n} steps decode one token per sequence "
                    f"({vl['example'][0][:60]!r})")
    elif s.filter(pl.col("plain")).height >= 0.5 * n and not s.filter(pl.col("draft")).height:
        r.spec, r.source = False, "engine"
        r.ev.append(f"the engine's spans: only plain decode forwards (step[DECODE ...]) in {n} steps, no verify")


def _from_frames(r: _Reading, fr: pl.DataFrame, n: int) -> None:
    """The engine's speculative Python frames (``engine_frames``): a draft model's, or n-gram proposals'."""
    if not fr.height:
        return
    ng = int(fr["ngram"].sum())
    dr = int(fr["draft"].sum())
    if r.spec is not True:
        r.spec, r.source = True, "engine"
    r.spec_steps |= set(fr["step"].to_list())
    r.ev.append(f"the engine's speculative frames in {fr.height} of {n} steps (e.g. "
                f"{fr['example'][0].rsplit('/', 1)[-1][:60]})")
    if dr and r.draft is None:
        r.draft = True
    elif ng and not dr and r.draft is None:
        r.draft = False
        r.ev.append("n-gram proposals (the engine's n-gram frames): no draft model")


def _from_rows(r: _Reading, s: pl.DataFrame, rows: pl.DataFrame, n: int) -> None:
    """The engine's batch (bs=N) against the widest forward's rows: tokens verified per sequence."""
    b = (s.select("step", "bs").join(rows, on="step").filter((pl.col("bs") > 0) & (pl.col("rows") % pl.col("bs")
                                                                                      == 0))
         .with_columns(per=pl.col("rows") // pl.col("bs")).filter(pl.col("per") <= DECODE_MAX_TOKENS)
         .group_by("step").agg(pl.col("per").max(), pl.col("bs").first()))
    if r.spec is True and b.height >= 0.5 * n and b["per"].median() >= 2:
        r.verify = int(b["per"].median())
        r.ev.append(f"{r.verify} tokens verified per sequence: the widest decode-sized forward's row normalisations "
                    f"run {r.verify * int(b['bs'].median())} rows for the engine's batch of {int(b['bs'].median())}")


def _from_shapes(r: _Reading, t: pl.DataFrame) -> None:
    """The recorded shapes' tokens per sequence (``shape_tokens``)."""
    if not t.height:
        return
    wide = t.filter((pl.col("tokens") >= 2) & (pl.col("tokens") <= DECODE_MAX_TOKENS))
    if wide.height >= 0.5 * t.height:
        s_tok = int(wide["tokens"].median())
        if r.verify is None:
            r.verify = s_tok
        if r.spec is None:
            r.spec, r.source = True, "shapes"
            r.spec_steps |= set(wide["step"].to_list())
        r.ev.append(f"recorded shapes: the widest linear inputs carry {s_tok} tokens per sequence in {wide.height} "
                    f"of {t.height} steps (a verify forward over {s_tok} tokens)")
    elif r.spec is None and t.filter(pl.col("tokens") == 1).height == t.height:
        r.spec, r.source = False, "shapes"
        r.ev.append(f"recorded shapes: one token per sequence in every linear input of {t.height} steps")


def _from_manifest(r: _Reading, man: dict) -> None:
    """A tracekit capture's manifest: its draft tokens, verify tokens and draft model."""
    k = (man.get("spec") or {}).get("draft_tokens") if isinstance(man.get("spec"), dict) else None
    dm = man.get("draft_model")
    if isinstance(k, int) and k > 0:
        mv = (dm or {}).get("verify_tokens") if isinstance(dm, dict) else None
        mv = int(mv) if isinstance(mv, int) and mv > 1 else k + 1
        if r.spec is None:
            r.spec, r.source = True, "manifest"
        if r.verify is None:
            r.verify = mv
        if r.draft is None and isinstance(dm, dict) and isinstance(dm.get("present"), bool):
            r.draft = dm["present"]
        r.ev.append(f"manifest: speculative decoding with {k} draft tokens per step"
                    + (f" ({dm.get('kind')})" if isinstance(dm, dict) and dm.get("kind") else ""))
    elif man.get("spec") is None and r.spec is None:
        r.spec, r.source = False, "manifest"
        r.ev.append(f"manifest: a tracekit capture without speculation ({man.get('workload')})")


NO_SPEC_EVIDENCE = ("speculative unknown (null): no engine span, frame or speculative kernel, no recorded shapes, no "
                    "manifest and no draft model's forwards say how many tokens a step verifies; one forward a step "
                    "over one token or over K+1 n-gram proposals look alike without them")
NO_VERIFY_TOKENS = ("verify tokens unknown (null): no recorded shapes, engine spans or manifest say how many tokens "
                    "per sequence the verify forward processes")


HOST_UPLOAD = r"Host-to-Device|HtoD"


def proposal_uploads(acts: pl.DataFrame) -> pl.Series:
    """For proposals without a draft model (n-gram / prompt lookup: the proposer runs on the host), the GPU work they
    cost: the host-to-device copies of each step before its first GEMM kernel (the verify forward's). One id per
    copy (null for every other activity), as draft ids. ``acts``: the attributed activities."""
    a = acts.select("step", "start", "kind", "category", "name").with_row_index("_i")
    first = (a.filter(pl.col("step").is_not_null() & (pl.col("kind") == "kernel") & (pl.col("category") == "gemm"))
             .group_by("step").agg(g0=pl.col("start").min()))
    cp = a.filter((pl.col("kind") == "memop") & pl.col("step").is_not_null())
    cp = cp.filter(name_matches(cp["name"], HOST_UPLOAD)).join(first, on="step").filter(pl.col("start") < pl.col("g0"))
    ids = pl.repeat(None, acts.height, dtype=pl.Int64, eager=True)
    if cp.height == 0:
        return ids.alias("draft")
    return ids.scatter(cp["_i"], pl.arange(0, cp.height, eager=True).cast(pl.Int64)).alias("draft")


# Row normalisations launch one block per token row (PyTorch's layer/RMS norm, FlashInfer's RMSNormKernel, vLLM's
# rms_norm_kernel): their grid counts the rows a forward processes.
ROW_NORMS = r"(?i)layer_?norm|rms_?norm"


def norm_rows(trace: Trace, windows: pl.DataFrame) -> pl.DataFrame:
    """Per step window, the rows its row-normalisation kernels process (their launch grid's x), one row per distinct
    count: ``step``, ``rows``. The widest decode-sized count is the verify forward's tokens in a speculative step
    (a per-head norm of a linear-attention layer runs many more rows)."""
    k = trace.kernels.select("pid", "correlation", "name", "grid")
    k = k.filter(name_matches(k["name"], ROW_NORMS) & pl.col("grid").is_not_null())
    if k.height == 0:
        return pl.DataFrame(schema={"step": pl.Int64, "rows": pl.Int64})
    k = k.select("pid", "correlation", rows=pl.col("grid").str.split(",").list.first().cast(pl.Int64, strict=False))
    work = trace.launches.filter(pl.col("kind").is_in(["kernel", "graph"])).select("pid", "tid", "correlation",
                                                                                     "start")
    hit = k.join(work, on=["pid", "correlation"], how="inner")
    w = windows.select("pid", "tid", ws="start", we="end", step="step").sort("ws")
    hit = hit.sort("start").join_asof(w, left_on="start", right_on="ws", by=["pid", "tid"],
                                      check_sortedness=False).filter(
        pl.col("step").is_not_null() & (pl.col("we").is_null() | (pl.col("start") <= pl.col("we"))))
    return hit.select("step", "rows").unique()
