"""Drafting by structure only on positive evidence (issue 23 item 1; contract, "Changes from /2": "Drafting by
structure needs positive evidence"; ``advice.drafting.evidence``; ``--draft-range none``).

The truths: the marked captures' own ranges (`draft`, `verify`, `draft_extend`) and kernel names counted by hand with
sqlite3 (GEMMs and attention kernels launched inside each range), the manifests (K, draft-extend forwards, layers,
the measured plain step), FACTS.toml (which shared traces are speculative: none), and synthetic steps whose
structure is known by construction (``tests/factory.py``): the LoRA-on-MoE decode step that a field trace got
"drafting 87%, 47 draft forwards" for, reproduced from the kernels such a step runs.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re

import polars as pl
import pytest
import tomllib
from click.testing import CliRunner

import tracekit
from tracekit.analyses.attribution import attribute
from tracekit.analyses.drafting import OFF_EVIDENCE, detect_drafting, forwards
from tracekit.cli import cli
from tracekit.errors import TracekitError
from tracekit.run.pipeline import step_table

from conftest import SAMPLES, sample_sqlite, sample_trace, shared_dir, sql_rows
from factory import make_trace

# ------------------------------------------------------------------------------------------- hand counts (SQL)

# GEMMs and attention kernels by their names in these captures (cuBLAS nvjet kernels and their split-K reduce;
# cuDNN's flash SDPA), counted per range the launching call sat in: graph launches carry their kernels'
# correlation id, so graph-replayed kernels count in the range of their cudaGraphLaunch.
PER_RANGE = """
SELECT coalesce(n.text, s.value) AS rng,
       sum(kn.value LIKE 'nvjet%' OR kn.value = 'splitKreduce_kernel') AS gemm,
       sum(kn.value LIKE '%sdpa%flash%') AS attn
FROM NVTX_EVENTS n LEFT JOIN StringIds s ON s.id = n.textId
JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.globalTid = n.globalTid AND r.start BETWEEN n.start AND n.end
JOIN CUPTI_ACTIVITY_KIND_KERNEL k ON k.correlationId = r.correlationId
JOIN StringIds kn ON kn.id = k.shortName
WHERE coalesce(n.text, s.value) IN ('draft', 'verify', 'draft_extend')
GROUP BY rng"""
STEPS = """SELECT count(*) FROM NVTX_EVENTS n LEFT JOIN StringIds s ON s.id = n.textId
           WHERE coalesce(n.text, s.value) LIKE 'decode_step %'"""


def hand_counts(marked: str) -> dict:
    """Per step of the marked capture ``marked``: GEMMs and attention kernels of one draft forward (the `draft`
    range holds the manifest's K of them), of the draft-extend forward and of the verify (target) forward."""
    db = sample_sqlite(marked)
    man = manifest(marked)
    k = man["spec"]["draft_tokens"]
    (steps,), = sql_rows(db, STEPS)
    r = {name: (g / steps, a / steps) for name, g, a in sql_rows(db, PER_RANGE)}
    return dict(steps=steps, k=k, extend=man["draft_model"]["forwards"]["draft_extend"],
                draft_gemm=r["draft"][0] / k, draft_attn=r["draft"][1] / k,
                extend_gemm=r["draft_extend"][0], extend_attn=r["draft_extend"][1],
                target_gemm=r["verify"][0], target_attn=r["verify"][1],
                layers=man["model"]["layers"])


def manifest(name: str) -> dict:
    return json.loads((SAMPLES / name / "manifest.json").read_text())


EVIDENCE_RUN = re.compile(r"^(\d+) of (\d+) steps run (\d+) draft forwards? besides the target forward: (\d+) before "
                          r"it(?: and (\d+) after it)?$")
EVIDENCE_MODEL = re.compile(r"smaller model: (\d+) layers? and (\d+) GEMMs? a forward against the target forward's "
                            r"(\d+) layers? and (\d+) GEMMs?")


def parse_structure(evidence) -> dict:
    run, model = EVIDENCE_RUN.match(evidence[0]), EVIDENCE_MODEL.search(evidence[1])
    assert run and model, evidence
    spec, steps, n, before, after = (int(x or 0) for x in run.groups())
    d_attn, d_gemm, t_attn, t_gemm = (int(x) for x in model.groups())
    return dict(spec=spec, steps=steps, n=n, before=before, after=after, d_attn=d_attn, d_gemm=d_gemm,
                t_attn=t_attn, t_gemm=t_gemm)


@pytest.mark.parametrize("marked", ["spec-small-graph", "spec-large-graph", "spec-small-eager", "spec-large-eager"])
def test_structure_evidence_is_the_hand_count(marked):
    """The marked capture with its draft ranges ignored (draft_range=None): found by structure, and the evidence's
    figures are the kernels its own ranges hold, counted with SQL, and the manifest's K and layers."""
    h = hand_counts(marked)
    assert h["draft_gemm"] == h["extend_gemm"] and h["draft_attn"] == h["extend_attn"] == 1  # one MTP layer
    assert h["target_attn"] == h["layers"]  # one attention kernel per target layer
    a = attribute(tracekit.load(sample_trace(marked), kernel_dims=False), draft_range=None)
    assert a.draft_detection == "structure"
    e = parse_structure(a.draft_evidence)
    assert (e["spec"], e["steps"]) == (h["steps"], h["steps"])
    assert (e["n"], e["before"], e["after"]) == (h["k"] + h["extend"], h["k"], h["extend"])
    assert (e["d_attn"], e["d_gemm"]) == (h["draft_attn"], h["draft_gemm"])
    assert (e["t_attn"], e["t_gemm"]) == (h["target_attn"], h["target_gemm"])


@pytest.mark.parametrize("bare,marked", [("spec-small-graph-nomark", "spec-small-graph"),
                                         ("spec-small-eager-nomark", "spec-small-eager"),
                                         ("spec-small-graph-torch-nomark", "spec-small-graph"),
                                         ("spec-small-eager-torch-nomark", "spec-small-eager"),
                                         ("spec-large-graph-nomark", "spec-large-graph")])
def test_unmarked_capture_evidence_is_its_twins_hand_count(bare, marked):
    """The unmarked captures (no range of ours) through breakdown: `structure`, with the forwards per step the
    marked twin's ranges hold (same workload, separate run) and the manifest's step count."""
    h = hand_counts(marked)
    d = tracekit.breakdown(tracekit.load(sample_trace(bare))).advice["drafting"]
    assert d["detection"] == "structure" and "found from the step's structure" in d["verdict"]
    e = parse_structure(d["evidence"])
    assert e["spec"] == e["steps"] == manifest(bare)["steps"]
    assert (e["n"], e["before"], e["after"]) == (h["k"] + h["extend"], h["k"], h["extend"])
    assert (e["d_attn"], e["d_gemm"], e["t_attn"], e["t_gemm"]) == (
        h["draft_attn"], h["draft_gemm"], h["target_attn"], h["target_gemm"])


@pytest.mark.parametrize("name", ["spec-small-graph", "hf-small-spec"])
def test_range_evidence_names_the_ranges_and_their_counts(name):
    """Detection from ranges: the evidence names the matching ranges with their counts (SQL) and the GPU work
    launched inside them."""
    db = sample_sqlite(name)
    counts = dict(sql_rows(db, """SELECT coalesce(n.text, s.value), count(*) FROM NVTX_EVENTS n
                                  LEFT JOIN StringIds s ON s.id = n.textId
                                  WHERE coalesce(n.text, s.value) IN ('draft', 'draft_extend') GROUP BY 1"""))
    d = tracekit.breakdown(tracekit.load(sample_trace(name))).advice["drafting"]
    assert d["detection"] == "ranges" and d["evidence"][0].startswith("draft ranges matching")
    # then what says the steps are speculative (the capture's manifest here), never a second detection line
    assert all(e.startswith("manifest: speculative decoding") for e in d["evidence"][1:])
    assert d["speculative"] is True and d["draft_model"] is True and d["verify_tokens"] == 4
    for rng, n in counts.items():
        assert f"'{rng}' x{n}" in d["evidence"][0]
    assert "--draft-range '(?i)\\bdraft'" in d["evidence"][0]


# ---------------------------------------------------------------------------------------- synthetic steps

GEMM, ATTN = "nvjet_tst_64x8_64x16_4x1_v_bz_TNT", "flash_fwd_splitkv_kernel"
ARGMAX = ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::ArgMaxOps<float>, "
          "unsigned int, long, 4> >(at::native::ReduceOp<float, at::native::ArgMaxOps<float>, unsigned int, long, 4>)")
TOPK = "void at::native::sbtopk::gatherTopK<float, unsigned int, 2, false>(at::cuda::detail::TensorInfo<float const>)"
ALLREDUCE = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
LORA_A, LORA_B = "_sgemm_lora_a_kernel", "_sgemm_lora_b_kernel"  # SGLang's triton LoRA shrink / expand
LAYERS, STEPS_N = 48, 6


def lora_moe_step(o_proj_us: float) -> list[tuple]:
    """One TP decode step of a 48-layer MoE model with a LoRA adapter (Qwen3-30B-A3B has 48 layers), no
    speculation: per layer qkv (+ LoRA shrink/expand), attention, o_proj (+ LoRA), all-reduce, the router GEMM and
    its top-k (torch.topk), the experts, all-reduce; then the lm_head and the argmax. (name, µs)"""
    out = []
    for _ in range(LAYERS):
        out += [(GEMM, 4), (LORA_A, .5), (LORA_B, .5), (ATTN, 5), (GEMM, o_proj_us), (LORA_A, .5), (LORA_B, .5),
                (ALLREDUCE, 6), (GEMM, 1), (TOPK, 1), ("fused_moe_kernel", 8), (ALLREDUCE, 6)]
    return out + [(GEMM, 30), (ARGMAX, 2)]


def one_forward(layers: int, lm_head_us: float = 30) -> list[tuple]:
    """A dense forward: per layer qkv, attention, o_proj, up, down; then the lm_head and the argmax."""
    return [k for _ in range(layers) for k in ((GEMM, 4), (ATTN, 5), (GEMM, 4), (GEMM, 6), (GEMM, 6))] + [
        (GEMM, lm_head_us), (ARGMAX, 2)]


def build(step: list[tuple], n_steps: int = STEPS_N, second_stream: dict | None = None):
    """``n_steps`` `decode_step i` ranges, each running ``step`` back to back on one stream (1 µs apart).
    ``second_stream``: {index in the step: (name, µs)}: a kernel on stream 8 starting with that kernel."""
    kernels, ranges, t = [], [], 0.0
    for s in range(n_steps):
        t0 = t
        for i, (name, us) in enumerate(step):
            if second_stream and i in second_stream:
                n2, us2 = second_stream[i]
                kernels.append((n2, t + 1, t + 1 + us2, t, 8))
            kernels.append((name, t + 1, t + 1 + us, t))
            t += us + 1
        t += 20
        ranges.append((f"decode_step {s}", t0, t - 10))
    return make_trace(kernels=kernels, ranges=ranges)


def detect(trace):
    st = step_table(trace, step_range=r"^decode_step", detect_structure=False, draft_range=None, phase="all")
    acts = st.attribution.activities.filter(pl.col("step").is_not_null())
    return acts, *detect_drafting(acts)


@pytest.mark.parametrize("o_proj_us", [4, 20])
def test_lora_on_moe_decode_is_not_drafting(o_proj_us):
    """The field failure, rebuilt: LoRA shrink/expand GEMMs (half a microsecond each, eight a layer) pulled the
    step's median GEMM down until an o_proj looked like an lm_head, so every layer's router top-k ended a
    "forward": 48 one-layer forwards a step, 47 called drafting. Now the adapters stay out of the median (4 µs
    o_proj: no cut at all) and, where a layer's GEMM is large enough to pass anyway (20 µs), one-layer pieces are
    no draft model (the "target" is one layer too)."""
    acts, ids, info = detect(build(lora_moe_step(o_proj_us)))
    n_fwd = forwards(acts).group_by("step").agg(pl.col("n_fwd").first())["n_fwd"].unique().to_list()
    assert n_fwd == ([1] if o_proj_us == 4 else [LAYERS])  # by construction: one cut per layer's top-k
    assert info.detection == "not_detected" and ids.null_count() == ids.len()
    assert info.evidence[0].startswith("no second token-producing forward" if o_proj_us == 4 else "no draft model")
    if o_proj_us == 20:
        assert f"they run {LAYERS - 1} forwards of up to 1 layer ({LAYERS - 1} in all)" in info.evidence[0]
    # the breakdown: no drafting; the all-reduces (alone on the GPU, nothing overlaps them) stay communication
    b = tracekit.breakdown(build(lora_moe_step(o_proj_us)), step_range=r"^decode_step")
    assert b.per_step_ms["drafting"] == 0 and b.advice["drafting"]["detection"] == "not_detected"
    assert b.per_step_ms["communication"] == pytest.approx(2 * LAYERS * 6 / 1000)
    assert b.advice["drafting"]["verdict"].startswith("drafting not detected")


def test_mtp_shaped_step_is_drafting_with_its_evidence():
    """SGLang's EAGLE/MTP shape: 3 one-layer draft forwards, the 16-layer target's verify, the draft-extend."""
    draft = one_forward(1)
    acts, ids, info = detect(build(3 * draft + one_forward(16) + draft))
    assert info.detection == "structure" and info.spec_steps == STEPS_N
    e = parse_structure(info.evidence)
    assert (e["n"], e["before"], e["after"]) == (4, 3, 1)
    assert (e["d_attn"], e["d_gemm"], e["t_attn"], e["t_gemm"]) == (1, 5, 16, 65)  # 4 GEMMs a layer + lm_head
    # every draft forward's kernels (6 GEMMs/attention + argmax = 7 kernels each, 4 a step) carry a draft id
    assert acts.with_columns(d=ids).filter(pl.col("d").is_not_null()).height == STEPS_N * 4 * len(draft)


@pytest.mark.parametrize("order", ["draft-extend after the verify", "draft before the verify"])
def test_one_draft_forward_a_step_is_k1_mtp(order):
    """K = 1, the usual MTP setting: SGLang --speculative-num-steps 1 runs no forward in its draft graph (num_steps - 1
    = 0) and one draft-extend forward after the verify; vLLM num_speculative_tokens 1 runs one proposer forward. One
    one-layer forward a step beside a 16-layer target is a draft model, and the step proposes K = 1 token."""
    draft = one_forward(1)
    step = one_forward(16) + draft if order.startswith("draft-extend") else draft + one_forward(16)
    acts, ids, info = detect(build(step))
    assert info.detection == "structure" and info.spec_steps == STEPS_N
    e = parse_structure(info.evidence)
    assert (e["n"], e["before"] + e["after"]) == (1, 1)
    assert e["before"] == (0 if order.startswith("draft-extend") else 1)
    assert acts.with_columns(d=ids).filter(pl.col("d").is_not_null()).height == STEPS_N * len(draft)


# the attention kernel a cuDNN SDPA runs over several queries (its one-query kernel, ATTN here, is another)
ATTN_WIDE = "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x128_4x1x1"


def layers(n: int, attn: str = ATTN, mlp: tuple = ((GEMM, 6), (GEMM, 6))) -> list[tuple]:
    """``n`` layers: qkv, attention, o_proj, then ``mlp``."""
    return [k for _ in range(n) for k in ((GEMM, 4), (attn, 5), (GEMM, 4), *mlp)]


def test_a_draft_extend_that_samples_nothing_is_a_forward_of_its_own():
    """SGLang-shaped EAGLE whose draft-extend fills the draft's KV cache without sampling (the validation set's
    ``spec_*`` loops): the extend over K+1 tokens (one layer, no lm_head, no sampling) runs straight into the next
    one-token draft forward. A forward is a run of layers: the run between the extend's attention and the draft's
    occurs once a step and its two attention kernels differ (K+1 queries against one), so it ends the extend. By
    construction: 3 one-layer draft forwards and the extend = 4 draft forwards, all before the 16-layer verify."""
    extend = layers(1, ATTN_WIDE)
    draft = layers(1) + [(GEMM, 30), (ARGMAX, 2)]
    verify = layers(16, ATTN_WIDE) + [(GEMM, 30), (ARGMAX, 2)]
    acts, ids, info = detect(build(extend + 3 * draft + verify))
    assert info.detection == "structure" and info.spec_steps == STEPS_N
    e = parse_structure(info.evidence)
    assert (e["n"], e["before"], e["after"]) == (4, 4, 0)
    assert (e["d_attn"], e["t_attn"]) == (1, 16)
    assert acts.with_columns(d=ids).filter(pl.col("d").is_not_null()).height == STEPS_N * (len(extend) + 3 * len(draft))


def test_a_layer_kind_that_occurs_once_is_no_forward_boundary():
    """A MoE model whose first layers are dense (DeepSeek-V3: 3 of 61; GLM-4.5, Kimi K2: 1-3): the run from the last
    dense layer's attention to the first expert layer's occurs once a forward, but both attention kernels are the
    same (the same tokens): no cut, one forward, no draft model. (The router's top-k after a small GEMM makes two or
    more top-k kernels a step, so the forwards are looked at.)"""
    moe = ((GEMM, 1), (TOPK, 1), ("fused_moe_kernel", 8))
    step = layers(3) + layers(13, mlp=moe) + [(GEMM, 30), (ARGMAX, 2)]
    acts, ids, info = detect(build(step))
    n_fwd = forwards(acts).group_by("step").agg(pl.col("n_fwd").first())["n_fwd"].unique().to_list()
    assert n_fwd == [1]
    assert info.detection == "not_detected" and ids.null_count() == ids.len()


@pytest.mark.parametrize("case,step,second", [
    ("the 'drafts' are as large as the target", 3 * one_forward(8) + one_forward(8, lm_head_us=40), None),
    ("a second stream's sampling cuts the target forward twice",
     one_forward(16), {10: (ARGMAX, 1), 40: (ARGMAX, 1)}),
])
def test_no_draft_model_no_drafting(case, step, second):
    _, ids, info = detect(build(step, second_stream=second))
    assert info.detection == "not_detected", case
    assert info.evidence[0].startswith("no draft model"), info.evidence


def test_speculative_kernels_alone_are_kernels_detection_with_their_names():
    step = one_forward(16)
    acts, ids, info = detect(build(step[:-1] + [("build_tree_efficient", 2)] + step[-1:]))
    assert info.detection == "kernels"
    assert info.evidence[0].startswith("speculative-decoding kernels by name: build_tree_efficient x6")


# ----------------------------------------------------------------------------------------- --draft-range none

@pytest.mark.parametrize("name", ["spec-small-graph", "spec-small-graph-nomark"])
def test_draft_range_none_turns_detection_off(name):
    """Ranges (spec-small-graph) and structure (its unmarked twin) both off: `not_detected`, the evidence says why,
    no drafting time; the kernel time is moved to the other categories, not lost."""
    t = tracekit.load(sample_trace(name))
    on, off = tracekit.breakdown(t), tracekit.breakdown(t, draft_range="none")
    d = off.advice["drafting"].to_dict()
    assert on.advice["drafting"]["detection"] in ("ranges", "structure")
    assert d["detection"] == "not_detected" and d["evidence"] == [OFF_EVIDENCE] and not d["applicable"]
    assert (d["speculative"], d["draft_model"], d["verify_tokens"]) == (None, None, None)
    assert d["verdict"] == f"drafting not detected: {OFF_EVIDENCE}"
    assert off.per_step_ms["drafting"] == off.kernel_ms_per_step["drafting"] == 0
    assert sum(off.kernel_ms_per_step.values()) == pytest.approx(sum(on.kernel_ms_per_step.values()), rel=1e-12)
    # the command line and AnalysisOptions say the same
    r = CliRunner().invoke(cli, ["breakdown", "--format", "json", "--draft-range", "none", str(sample_trace(name))])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["advice"]["drafting"] == d
    opts = tracekit.AnalysisOptions(draft_range="none")
    assert tracekit.breakdown(t, **opts.analysis_kwargs()).advice["drafting"].to_dict() == d


def test_draft_range_none_leaves_speculative_kernels_as_other():
    step = one_forward(16)
    trace = build(step[:-1] + [("build_tree_efficient", 2)] + step[-1:])
    on = tracekit.breakdown(trace, step_range=r"^decode_step")
    off = tracekit.breakdown(trace, step_range=r"^decode_step", draft_range="none")
    assert on.advice["drafting"]["detection"] == "kernels" and on.kernel_ms_per_step["drafting"] == pytest.approx(
        0.002)  # one 2 µs kernel a step
    assert off.kernel_ms_per_step["drafting"] == 0
    assert off.kernel_ms_per_step["other"] == pytest.approx(on.kernel_ms_per_step["other"] + 0.002)


# ------------------------------------------------------------------------- the lever: unknown, plain step

def without_manifest(t):
    return dataclasses.replace(t, manifest=None)


def test_saving_unknown_without_accept_len_names_the_flag():
    t = without_manifest(tracekit.load(sample_trace("spec-small-graph-nomark")))
    d = tracekit.breakdown(t).advice["drafting"].to_dict()
    assert d["applicable"] and d["predicted_step_ms"] > 0
    assert d["max_saving_ms"] is None and d["max_saving_fraction"] is None
    assert d["missing_flag"] == "--accept-len" and "saving unknown: pass --accept-len X" in d["verdict"]
    b = tracekit.breakdown(t, accept_len=1.5)
    d2 = b.advice["drafting"].to_dict()
    assert "missing_flag" not in d2
    assert d2["max_saving_ms"] == pytest.approx(b.time_base.reference_step_ms - 1.5 * d2["predicted_step_ms"])


GRAPH_NSYS = ["spec-small-graph", "spec-small-graph-nomark", "spec-large-graph", "spec-large-graph-nomark"]


@pytest.mark.parametrize("name", GRAPH_NSYS)
def test_plain_step_without_manifest_takes_out_node_tracing(name):
    """No manifest (a field trace): the plain step is stated on the traced step, but the gaps that per-node tracing
    adds inside the verify graph (~0.63 µs a node against ~0.37 unprofiled) are taken out: within 12% of the
    plain step the capture measured (the rest is the profiler's host overhead between steps, which no trace
    shows), where the traced figure was 3-22% high. Basis named in the verdict."""
    t = without_manifest(tracekit.load(sample_trace(name)))
    b = tracekit.breakdown(t)
    d, v = b.advice["drafting"], b.facts.verify
    measured = manifest(name)["unprofiled_plain_step_ms"]
    assert b.time_base.unprofiled_step_ms is None
    traced = v.verify_ms - v.busy_ms * (1 - 1 / v.token_factor) + b.gaps["between_steps"]  # before this change
    assert abs(d["predicted_step_ms"] / measured - 1) <= 0.12
    assert abs(d["predicted_step_ms"] - measured) < abs(traced - measured)
    assert "graph nodes' gaps at 0.37 µs each" in d["verdict"]  # (the H200's unprofiled node gap)
    assert "as traced" in d["verdict"]


def test_eager_spec_manifests_time_their_phases_and_step_alike():
    """Every eager spec capture's manifest is self-consistent: the same process's per-phase timings of 40 more spec
    steps sum to its spec step within 15%. The spec-small-eager-torch capture of 2026-12-03 failed this (0.61: its
    spec step was timed at another host speed than its phases and plain step; its plain step came out +84%, a strict
    xfail); it was captured again on 2026-12-04 (sample_traces/README.md) and now holds like the others."""
    def phase_share(name):
        m = manifest(name)
        return sum(m["unprofiled_phases_ms"].values()) / m["unprofiled_step_ms"]

    eager = ["spec-small-eager", "spec-small-eager-nomark", "spec-small-eager-torch", "spec-small-eager-torch-nomark",
             "spec-large-eager"]
    assert all(abs(phase_share(n) - 1) <= 0.15 for n in eager), [phase_share(n) for n in eager]


# --------------------------------------------------------------------------- no drafting where there is none

def _facts():
    root = shared_dir()
    return root, tomllib.loads((root / "FACTS.toml").read_text())


@pytest.mark.slow
def test_no_shared_trace_gets_drafting():
    """FACTS.toml: none of the shared real traces is speculative; none may get drafting (ranges, structure or
    kernels), whatever its workload. Traces tracekit cannot attribute (no steps, no GPU work) are refused."""
    root, facts = _facts()
    seen = 0
    for rel, f in facts.items():
        assert f.get("speculative") in (False, None), rel
        try:
            a = attribute(tracekit.load(root / rel, kernel_dims=False))
        except TracekitError:
            continue
        seen += 1
        assert a.draft_detection == "not_detected", (rel, a.draft_evidence)
        assert a.draft_evidence and not any("no drafting" in e for e in a.draft_evidence)
        assert (a.activities["category"] == "drafting").sum() == 0, rel
    assert seen >= 20


@pytest.mark.parametrize("name", sorted(p.name for p in SAMPLES.iterdir() if p.is_dir() and (p / "manifest.json")
                                        .is_file() and not (json.loads((p / "manifest.json").read_text())
                                                            .get("spec"))))
@pytest.mark.slow
def test_no_plain_sample_gets_drafting(name):
    a = attribute(tracekit.load(sample_trace(name), kernel_dims=False))
    assert a.draft_detection == "not_detected", a.draft_evidence


# ------------------------------------------ the H200 LoRA and MoE captures (issue 23; sample_traces/README.md)

LORA_CAPTURES = ["lora-small-eager", "lora-small-graph-nomark"]
MOE_CAPTURES = ["moe-small-eager-nomark", "moe-small-graph-nomark", "moe-small-graph-triton-nomark"]


@pytest.mark.parametrize("name", LORA_CAPTURES)
def test_lora_capture_is_not_drafting(name):
    """A LoRA-like adapter decode loop, no speculation: no drafting, adapters never a draft forward."""
    d = tracekit.breakdown(tracekit.load(sample_trace(name))).advice["drafting"]
    assert not manifest(name).get("spec") and manifest(name)["speculative"] is False
    assert d["detection"] == "not_detected", d["evidence"]


@pytest.mark.parametrize("name", MOE_CAPTURES)
def test_moe_capture_is_not_drafting(name):
    """An MoE decode loop (a router top-k every layer), no speculation: no drafting."""
    d = tracekit.breakdown(tracekit.load(sample_trace(name))).advice["drafting"]
    assert not manifest(name).get("spec") and manifest(name)["speculative"] is False
    assert d["detection"] == "not_detected", d["evidence"]


# --------------------------------------------------------------------- docs/validation.md, "Drafting on evidence"

SPEC_CAPTURES = ["spec-small-graph", "spec-small-graph-nomark", "spec-small-graph-torch", "spec-small-graph-torch-nomark",
                 "spec-large-graph", "spec-large-graph-nomark", "spec-small-eager", "spec-small-eager-nomark",
                 "spec-small-eager-torch", "spec-small-eager-torch-nomark", "spec-large-eager"]


@functools.cache
def plain_rows() -> list[dict]:
    """Per SGLang-shaped spec capture: the measured plain step (manifest) against the predicted one with the
    manifest (unprofiled step known) and without it (a field trace), before and after the node-gap re-costing."""
    rows = []
    for name in SPEC_CAPTURES:
        m = manifest(name)
        t = tracekit.load(sample_trace(name))
        with_m = tracekit.breakdown(t).advice["drafting"]["predicted_step_ms"]
        b = tracekit.breakdown(without_manifest(t))
        v, measured = b.facts.verify, m["unprofiled_plain_step_ms"]
        before = v.verify_ms - v.busy_ms * (1 - 1 / (v.token_factor or 1.0)) + b.gaps["between_steps"]
        now = b.advice["drafting"]["predicted_step_ms"]
        rows.append(dict(name=name, mode=m["mode"], profiler=m["profiler"], measured=measured, with_manifest=with_m,
                         with_error=100 * (with_m / measured - 1), before=before,
                         before_error=100 * (before / measured - 1), now=now, now_error=100 * (now / measured - 1),
                         nodes=v.graph_nodes, traced_gap_us=1e3 * v.graph_gap_ms / v.graph_nodes if v.graph_nodes
                         else None, detection=b.advice["drafting"]["detection"]))
    return rows


def _short(evidence: list[str] | tuple[str, ...]) -> str:
    """The evidence line that decided (the range one, the structure one, or why not), for a table cell."""
    lines = [e for e in evidence if not e.startswith(("no range matches", "no --draft-range"))] or list(evidence)
    return lines[0]


@functools.cache
def sample_detection_rows() -> list[dict]:
    rows = []
    for d in sorted(p for p in SAMPLES.iterdir() if p.is_dir() and (p / "manifest.json").is_file()):
        a = attribute(tracekit.load(sample_trace(d.name), kernel_dims=False))
        rows.append(dict(name=d.name, speculative=bool(manifest(d.name).get("spec")), detection=a.draft_detection,
                         evidence=_short(a.draft_evidence)))
    return rows


@functools.cache
def shared_detection_rows() -> list[dict]:
    root, facts = _facts()
    rows = []
    for rel, f in facts.items():
        try:
            a = attribute(tracekit.load(root / rel, kernel_dims=False))
            det, ev = a.draft_detection, _short(a.draft_evidence)
        except TracekitError as e:
            det, ev = "refused (exit 2)", str(e).split(": ", 1)[-1].split(";")[0]
        rows.append(dict(rel=rel, workload=f.get("workload"), speculative=f.get("speculative"), detection=det,
                         evidence=ev))
    return rows


def field_failure_rows() -> list[dict]:
    """The LoRA-on-MoE step rebuilt (both variants): forwards per step, detection and the evidence now."""
    rows = []
    for o in (4, 20):
        acts, _, info = detect(build(lora_moe_step(o)))
        n = forwards(acts).group_by("step").agg(pl.col("n_fwd").first())["n_fwd"].max()
        rows.append(dict(o_proj_us=o, forwards=n, detection=info.detection, evidence=info.evidence[0]))
    return rows


def test_unprofiled_node_gap_is_the_captures_median():
    """UNPROFILED_NODE_GAP_US is measured, not fitted to the plain step: per graph (draft, verify, draft-extend) of
    the six graph captures, (its unprofiled CUDA-event time in the manifest - its traced kernels' GPU time) / its
    kernels, against the ~0.63 µs per node the traces show."""
    import statistics

    from tracekit.analyses.drafting import UNPROFILED_NODE_GAP_US

    unprofiled, traced = [], []
    for name in [n for n in SPEC_CAPTURES if "graph" in n]:
        m = manifest(name)
        acts = step_table(tracekit.load(sample_trace(name), kernel_dims=False)).activities
        g = (acts.filter(pl.col("graphed").fill_null(False) & (pl.col("kind") != "graph_exec"))
             .group_by("step", "launch").agg(span=pl.col("end").max() - pl.col("start").min(),
                                             busy=pl.col("dur").sum(), n=pl.len(), t0=pl.col("start").min())
             .sort("step", "t0").with_columns(k=pl.int_range(pl.len()).over("step")))
        per = g.group_by("k").agg(pl.col("span", "busy", "n").mean()).sort("k")
        assert per.height == m["graphs"]["per_step"] == 3  # draft, verify, draft-extend
        for (_, span, busy, n), ms in zip(per.rows(), (m["unprofiled_draft_ms"], m["unprofiled_phases_ms"]["verify"],
                                                         m["unprofiled_draft_extend_ms"])):
            unprofiled.append((ms * 1e6 - busy) / n / 1e3)
            traced.append((span - busy) / n / 1e3)
    assert len(unprofiled) == 18 and 0.3 <= min(unprofiled) and max(unprofiled) <= 0.45
    assert statistics.median(unprofiled) == pytest.approx(UNPROFILED_NODE_GAP_US, abs=0.01)
    assert 0.6 <= min(traced) and max(traced) <= 0.67
