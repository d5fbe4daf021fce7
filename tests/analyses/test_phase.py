"""Phase per step (contract steps.phase, --phase) on real traces; shapes checked against the raw JSON."""

from __future__ import annotations

import gzip
import json
import re

import polars as pl
import pytest

import tracekit
from tracekit.analyses.phase import (
    gemm_rows,
    no_decode_advice,
    phase_counts,
    select_phase,
    step_phases,
    window_phase,
)
from tracekit.steps import find_steps

from conftest import SAMPLES, shared

B200 = "TraceLens/tests/traces/b200/eager_trace.json.gz"
GB300 = ("lora_perf_lora_profile/runs/Qwen3-30B-A3B-Instruct-2507-BF16-expert_shared-20260609-133913/"
         "current_base_lora/profile/base/bs16-TP-{}.trace.json.gz")
DECODE_TRACES = ["TraceLens/tests/traces/inference/sglang_decode/sglang_Qwen3-8B_decode.json.gz",
                 "TraceLens/tests/traces/inference/vllm_decode_full/graph_execution.json.gz",
                 "nvllm/benchmarks/nvllm/traces/cute_paged_attn/2026-04-13-nsys/"
                 "rank0.1776116491109655086.pt.trace.json.gz",
                 GB300.format(0), GB300.format(3)]
TRAINING = ["HolisticTraceAnalysis/tests/data/nccl_parser_config/nccl_data.json.gz",
            "HolisticTraceAnalysis/tests/data/df_index_resolver/df_index_resolver.json.gz",
            "HolisticTraceAnalysis/tests/data/negative_queue_length_values_check/rank0.json.gz",
            "HolisticTraceAnalysis/tests/data/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
            "HolisticTraceAnalysis/tests/data/trace_diff/control/control.json.gz",
            "HolisticTraceAnalysis/tests/data/trace_diff/test/test.json.gz",
            "HolisticTraceAnalysis/tests/data/timeline_analysis/sampled_rank-0.json.gz",
            "kineto/tb_plugin/samples/resnet50_num_workers_0/worker0.pt.trace.json.gz",
            "profile-data/train.json"]


def _phases(path, **kw):
    t = tracekit.load(path)
    s = find_steps(t, **kw)
    return t, s, step_phases(t, s.windows)


def test_b200_context_step_is_prefill():
    """vLLM on a B200: the one step `execute_context_1(888)_generation_0(0)` is an 888-token prefill: the
    annotation says so, and so do its GEMM inputs (888 rows, counted from the JSON's Input Dims)."""
    path = shared(B200)
    events = json.load(gzip.open(path))["traceEvents"]
    rows = [e["args"]["Input Dims"][0][0] for e in events if e.get("name") == "aten::linear"
            and e.get("args", {}).get("Input Dims")]
    assert max(rows) == 888
    t, s, ph = _phases(path)
    assert ph["phase"].to_list() == ["prefill"] and ph["source"][0] == "annotation"
    assert "execute_context_1(888" in ph["evidence"][0]
    g = gemm_rows(t, s.windows)
    assert g["rows"].to_list() == [888] and g["tokens"].to_list() == [None]
    sel, warnings = select_phase(ph)
    assert sel["reason"].to_list() == [None] and not sel["decode_advice"][0]  # the split, no decode verdict
    assert not warnings  # said once, by the verdict (no_decode_advice), not also as a warning
    note = no_decode_advice("prefill", phase_counts(ph), training=False)
    assert "no decode step" in note and "--phase decode" not in note  # nothing to point to
    assert window_phase(ph["phase"]) == "prefill"


@pytest.mark.parametrize("rel", TRAINING, ids=[r.split("/")[-1] for r in TRAINING])
@pytest.mark.slow
def test_training_traces_are_not_decode(rel):
    path = shared(rel)
    t, s, ph = _phases(path)
    assert set(ph["phase"]) == {"training"} and set(ph["source"]) == {"training"}
    names = t.kernels["name"].cast(pl.String)
    assert names.str.contains(r"(?i)backward|bwd|wgrad|Adam").sum() > 0  # plain evidence, independent of the rule
    sel, warnings = select_phase(ph)
    assert not sel["decode_advice"].any()


@pytest.mark.parametrize("rel", DECODE_TRACES, ids=[r.split("/")[-1] for r in DECODE_TRACES])
@pytest.mark.slow
def test_serving_decode_traces_are_decode(rel):
    t, s, ph = _phases(shared(rel))
    assert set(ph["phase"]) == {"decode"} and set(ph["source"]) == {"annotation"}
    sel, _ = select_phase(ph)
    assert sel["reason"].null_count() == sel.height and sel["decode_advice"].all()


@pytest.mark.slow
def test_gb300_every_mode_prefill_steps_excluded_by_phase():
    """With every SGLang mode as steps: 8 EXTEND (prefill) and 8 DECODE steps; --phase decode keeps the 8."""
    path = shared(GB300.format(0))
    events = json.load(gzip.open(path))["traceEvents"]
    names = [e["name"] for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("step[")]
    assert sum(n.startswith("step[EXTEND") for n in names) == 8 and sum(n.startswith("step[DECODE") for n in names) == 8
    t, s, ph = _phases(path, every_phase=True)
    assert s.windows.height == 16 and s.pattern == r"^step\["
    assert ph.group_by("phase").len().sort("phase").rows() == [("decode", 8), ("prefill", 8)]
    sel, warnings = select_phase(ph, "decode")
    assert sel["reason"].to_list().count("phase") == 8
    assert sel.filter(pl.col("reason").is_null())["phase"].unique().to_list() == ["decode"]
    assert select_phase(ph, "prefill")[0]["reason"].to_list().count("phase") == 8
    assert select_phase(ph, "all")[0]["reason"].null_count() == 16
    assert window_phase(ph["phase"]) == "mixed"
    assert find_steps(t).windows.height == 8  # without every_phase: the decode ranges only (as before)


@pytest.mark.slow
def test_spec_torch_trace_shapes_say_decode():
    """hf-small-spec-torch: the verify forward runs the target over K+1 = 4 tokens per sequence ([1, 4, 896]
    inputs of aten::linear), the drafts over 1: a handful of tokens per sequence, decode."""
    path = SAMPLES / "hf-small-spec-torch/trace.json.gz"
    events = json.load(gzip.open(path))["traceEvents"]
    step = next(e for e in events if e.get("cat") == "user_annotation" and e["name"] == "decode_step 40")
    lo, hi = step["ts"], step["ts"] + step["dur"]
    seq = [e["args"]["Input Dims"][0][-2] for e in events if e.get("name") == "aten::linear"
           and lo <= e["ts"] <= hi and len(e["args"]["Input Dims"][0]) == 3]
    assert max(seq) == 4 and min(seq) == 1
    t = tracekit.load(path)
    s = find_steps(t)
    g = gemm_rows(t, s.windows)
    assert g.filter(pl.col("step") == 0)["tokens"].to_list() == [4]
    # without annotations and manifest the shapes decide
    bare = t.__class__(**{**t.__dict__, "ranges": t.ranges.filter(~pl.col("name").str.starts_with("decode_step")),
                          "manifest": None})
    ph = step_phases(bare, s.windows)
    assert set(ph["phase"]) == {"decode"} and set(ph["source"]) == {"shapes"}
    assert "4 tokens per sequence" in ph["evidence"][0]


@pytest.mark.parametrize("name", ["hf-small-graph", "hf-small-eager-torch", "synthetic-graph", "hf-small-spec"])
def test_sample_traces_are_decode(name):
    path = next((SAMPLES / name).glob("trace.*"))
    t, s, ph = _phases(path)
    assert set(ph["phase"]) == {"decode"}
    # the same trace without its ranges: the manifest (a tracekit capture) says decode
    bare = t.__class__(**{**t.__dict__, "ranges": t.ranges.head(0)})
    ph2 = step_phases(bare, s.windows)
    assert set(ph2["phase"]) == {"decode"} and set(ph2["source"]) <= {"manifest", "shapes"}


def test_no_evidence_is_unknown_and_analysed_with_a_warning():
    """nsys-ai mfu_2gpu_before without its NVTX ranges (they hold its training evidence: see
    test_training_from_host_ranges): no annotation, shapes, manifest, graph replay or backward kernel, and its steps
    run attention: unknown; --phase decode keeps the steps (no evidence against) and warns."""
    import dataclasses

    t = tracekit.load(shared(MFU))
    bare = dataclasses.replace(t, ranges=t.ranges.head(0))
    s = find_steps(bare)
    ph = step_phases(bare, s.windows)
    assert set(ph["phase"]) == {"unknown"} and ph["source"].null_count() == ph.height
    sel, warnings = select_phase(ph)
    assert sel["reason"].null_count() == sel.height and any("unknown" in w for w in warnings)
    assert window_phase(ph["phase"]) == "unknown"


MFU = "nsys-ai/tests/fixtures/mfu_2gpu_before.sqlite"


def test_training_from_host_ranges():
    """nsys-ai mfu_2gpu_before is a training run (FACTS.toml; its command is /tmp/fv_mfu_training.py) whose window
    holds forward work only: no backward kernel. Its NVTX ranges (emit_nvtx) say training: FSDP's
    RegisterPostBackwardFunction (applied to forward outputs only while autograd records) and activation
    checkpointing (``_checkpoint_wrapped_module``), counted here by hand from the export. Every step is prefill with
    source "training", so no decode advice."""
    from conftest import sql_rows

    n = sql_rows(shared(MFU), "SELECT count(*) FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId "
                              "WHERE coalesce(e.text, s.value) LIKE '%RegisterPostBackwardFunction%' "
                              "OR coalesce(e.text, s.value) LIKE '%_checkpoint_wrapped_module%'")[0][0]
    assert n > 0
    t, s, ph = _phases(shared(MFU))
    assert set(ph["phase"]) == {"training"} and set(ph["source"]) == {"training"}
    assert ph["evidence"][0].startswith(f"training trace: {n} ") and "RegisterPostBackwardFunction" in ph["evidence"][0]
    sel, _ = select_phase(ph)
    assert not sel["decode_advice"].any()


def test_no_llm_decode_work_gets_no_decode_advice():
    """Micro-benchmarks with no LLM decode structure (FACTS.toml): pipit's saxpy runs one kernel per step and no GEMM
    or attention; the TraceLens MoE layer micro-benchmark runs GEMMs but no attention kernel and reads nothing back
    to the host (no device-to-host copy: counted from the JSON). Their steps stay phase unknown, and decode advice
    does not apply, saying why."""
    import tracekit.run.pipeline as bd

    saxpy = shared("pipit/pipit/tests/data/saxpy-mpi-cuda_nsys_perlmutter0.sqlite")
    from conftest import sql_rows

    names = sql_rows(saxpy, "SELECT DISTINCT s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s "
                            "ON s.id = k.demangledName")
    assert [n for (n,) in names] == ["saxpy(double *, double *, double *, double, int)"]
    moe = shared("TraceLens/evals/unit_tests_nv/moe/moe_01_many_experts_few_tokens_analysis_output/"
                 "moe_01_many_experts_few_tokens.json.gz")
    events = json.load(gzip.open(moe))["traceEvents"]
    assert not [e for e in events if e.get("cat") == "gpu_memcpy"]
    assert not [e for e in events if e.get("cat") == "kernel" and re.search(r"(?i)attn|attention|fmha", e["name"])]
    for path, why in ((saxpy, "no attention kernel and no GEMM"), (moe, "no token is read back")):
        st = bd.step_table(tracekit.load(path))
        assert st.phase == "unknown" and not st.decode_advice and st.phase_label == "non-decode"
        assert st.phase_note.startswith("no decode advice: these steps show no LLM decode work")
        assert why in st.phase_note


def test_phase_argument_checked():
    with pytest.raises(tracekit.TracekitError):
        select_phase(pl.DataFrame({"step": [0], "phase": ["decode"]}), "training")


def test_annotation_grammar():
    """The annotation parser on the forms the engines write (synthetic names: a definition unit test)."""
    from tracekit.analyses.phase import _SGLANG_MODES, _SGLANG_RX, _TRTLLM_RX, _VLLM_RX

    def sg(n):
        m = re.search(_SGLANG_RX, n)
        return _SGLANG_MODES[m.group(1)] if m else None

    assert sg("step[DECODE bs=16]") == "decode" and sg("step[EXTEND bs=2 toks=4096]") == "prefill"
    assert sg("step[TARGET_VERIFY bs=8]") == "decode" and sg("step[DRAFT_EXTEND bs=8]") == "decode"
    assert sg("step[MIXED bs=4]") == "mixed" and sg("step[IDLE]") is None and sg("DECODED_THING") is None
    assert re.search(_VLLM_RX, "execute_context_1(888)_generation_0(0)").groups() == ("1", "0")
    assert re.search(_VLLM_RX, "execute_32_context_0(sq0sk0sqsq0sqsk0)_generation_32(sq32sk55086)").groups() == (
        "0", "32")
    assert re.search(_TRTLLM_RX, "_forward_step 12: 2 ctx reqs, 30 gen reqs").groups() == ("2", "30")


# ---------------------------------------------------------------------------------------------------------------
# Phases from the steps' own work (issue 24): unmarked windows, token-proportional work, decode kernels, drafting.

GB300_0 = GB300.format(0)
NVLLM = "nvllm/benchmarks/nvllm/traces/cute_paged_attn/2026-04-13-nsys/rank0.1776116491109655086.pt.trace.json.gz"
MOE_BENCH = ("TraceLens/evals/unit_tests_nv/moe/moe_01_many_experts_few_tokens_analysis_output/"
             "moe_01_many_experts_few_tokens.json.gz")


def _bare(t):
    """The trace without any range and without its manifest: only the steps' own work can tell phases."""
    import dataclasses

    return dataclasses.replace(t, ranges=t.ranges.head(0), manifest=None)


def _truth_by_annotation(t, windows):
    """Each inferred window's phase by the SGLang annotation that starts inside it (hand-matched by start)."""
    ann = t.ranges.filter(pl.col("name").str.starts_with("step[")).select(
        "start", mode=pl.col("name").str.extract(r"^step\[(\w+)", 1))
    w = windows.filter(pl.col("end").is_not_null()).select(ws="start", we="end", step="step").sort("ws")
    hit = ann.sort("start").join_asof(w, left_on="start", right_on="ws").filter(pl.col("start") <= pl.col("we"))
    return dict(zip(hit["step"], hit["mode"].replace_strict({"EXTEND": "prefill", "DECODE": "decode"})))


def test_gb300_unmarked_extend_steps_are_prefill_by_their_work():
    """SGLang GB300 rank 0 without annotations: the EXTEND steps (4096 tokens) replay piecewise graphs whose shapes
    are not recorded; their one eager GEMM (the logits over the last token of 2 sequences) has 2 rows, which alone
    read as decode. Their own work says prefill: all-reduces 10-23x as long as the decode steps' (the activations
    of 4096 tokens), GEMMs 2.5x. Every inferred complete step gets the phase of the annotation inside it."""
    from tracekit.steps import infer_steps

    t = tracekit.load(shared(GB300_0))
    s = infer_steps(t)
    bare = _bare(t)
    ph = step_phases(bare, s.windows)
    truth = _truth_by_annotation(t, s.windows)
    assert sorted(truth.values()).count("prefill") >= 6 and sorted(truth.values()).count("decode") == 8
    got = dict(zip(ph["step"], ph["phase"]))
    assert {k: got[k] for k in truth} == truth
    src = ph.filter(pl.col("step").is_in(list(truth)))
    ext = src.filter(pl.col("phase") == "prefill")
    assert set(ext["source"]) == {"work"} and ext["evidence"].str.contains("collectives").all()
    g = gemm_rows(bare, s.windows).filter(pl.col("step").is_in(ext["step"].implode()))
    assert g["rows"].max() <= 2  # what the shapes alone saw


@pytest.mark.slow
def test_nvllm_unmarked_decode_by_decode_kernel():
    """vLLM piecewise-graph decode window (nvllm, execute_context_0(0)_generation_4(4)) without annotations: the
    recurrent-state update kernels of its linear-attention layers (fused_recurrent_gated_delta_rule_packed_decode_kernel,
    _causal_conv1d_update_kernel) run only for one new token per sequence."""
    path = shared(NVLLM)
    events = json.load(gzip.open(path))["traceEvents"]
    names = {e["name"] for e in events if e.get("cat") == "kernel"}
    assert {"_causal_conv1d_update_kernel", "fused_recurrent_gated_delta_rule_packed_decode_kernel"} <= names
    import tracekit.run.pipeline as bd

    st = bd.step_table(_bare(tracekit.load(path)), phase="all")
    assert st.phases_found == {"decode": 10} and st.phase == "decode"
    ph = st.attribution.phases
    assert set(ph["source"]) == {"kernels"}
    assert ph["evidence"].str.contains("packed_decode_kernel|causal_conv1d_update_kernel").all()


@pytest.mark.parametrize("name", ["spec-small-eager-nomark", "spec-small-graph-nomark", "spec-large-graph-nomark"])
def test_unmarked_speculative_loops_are_decode_by_drafting(name):
    """SGLang-shaped speculative loops without markers or manifest: the draft model's forwards (found by structure)
    make every step a speculative decode step (they were unknown before)."""
    import tracekit.run.pipeline as bd

    from conftest import sample_trace

    st = bd.step_table(_bare(tracekit.load(sample_trace(name))), phase="all")
    assert st.attribution.draft_detection == "structure"
    ph = st.attribution.phases
    assert st.phase == "decode" and set(ph["phase"]) == {"decode"}
    assert set(ph["source"]) == {"speculation"} and any("draft forward" in e for e in ph["evidence"])


def test_moe_microbenchmark_is_not_decode():
    """TraceLens moe_01 (a MoE layer over 16 tokens, FACTS: microbenchmark): 16-row GEMM inputs, but no attention
    kernel in its steps: not a decode step."""
    t, s, ph = _phases(shared(MOE_BENCH))
    assert gemm_rows(t, s.windows)["rows"].max() == 16
    assert "decode" not in set(ph["phase"])


def _graph_window():
    """SYNTHETIC (definition test): an eager prefill step then three decode steps that replay a CUDA graph (GEMMs
    and all-reduces), attention eager, as vLLM's piecewise graphs run them. Prefill: GEMMs 5x, all-reduces 6x."""
    from tracekit.trace import LAUNCHES, conform

    from factory import make_trace

    kernels, ranges = [], []
    t0 = 0
    for step in range(4):
        prefill = step == 0
        at = t0 + 5
        for _layer in range(2):
            for name, us in [("nvjet_tst_64x8_64x16_4x1_v_bz_TNT", 50 if prefill else 10),
                             ("flash_fwd_kernel", 20 if prefill else 4),
                             ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 60 if prefill else 10)]:
                kernels.append((name, at + 20, at + 20 + us, at))
                at += us + 25
        ranges.append((f"window {step}", t0, at + 10))
        t0 = at + 50
    t = make_trace(kernels=kernels, ranges=ranges)
    # steps 1-3: every GEMM and all-reduce replayed from one graph launch per layer (their launch rows become one
    # cudaGraphLaunch each; the kernels take its correlation)
    k, lau = t.kernels, t.launches
    step_of = pl.Series([i // 6 for i in range(k.height)])
    graphed = (step_of > 0) & ~k["name"].cast(pl.String).str.contains("flash")
    layer_first = pl.Series([(i // 6) * 6 + ((i % 6) // 3) * 3 for i in range(k.height)])  # first kernel of a layer
    corr = pl.when(pl.lit(graphed)).then(pl.lit(layer_first) + 1).otherwise(pl.col("correlation"))
    k = k.with_columns(correlation=corr)
    keep_launch = ~graphed | (pl.Series(range(k.height)) == layer_first)
    lau = lau.filter(keep_launch).with_columns(
        kind=pl.when(pl.lit(graphed.filter(keep_launch))).then(pl.lit("graph")).otherwise(pl.col("kind").cast(
            pl.String)),
        name=pl.when(pl.lit(graphed.filter(keep_launch))).then(pl.lit("cudaGraphLaunch")).otherwise(
            pl.col("name").cast(pl.String)))
    import dataclasses

    return dataclasses.replace(t, kernels=k, launches=conform(lau, LAUNCHES)).validate()


def test_graph_pieces_vs_eager_definition():
    """The light steps that replay graphs beside an eager, token-heavy step are decode; the heavy one prefill."""
    from tracekit.steps import select_ranges

    t = _graph_window()
    w = select_ranges(t.ranges, r"^window").sort("start").with_row_index("step").select(
        pl.col("step").cast(pl.Int64), "pid", "tid", "start", "end")
    ph = step_phases(t, w)
    assert ph["phase"].to_list() == ["prefill", "decode", "decode", "decode"]
    assert ph["source"].to_list() == ["work"] * 4
    assert "5.0x" in ph["evidence"][0] and "6.0x" in ph["evidence"][0]
    assert "replays CUDA graphs" in ph["evidence"][1]


def test_phase_prefill_on_a_decode_trace_is_refused_and_messages_are_said_once():
    """--phase prefill on a decode trace: exit 2 naming the phases there (not "decode steps: no decode advice");
    a training trace's verdict is said once and does not point to --phase decode (it has no decode step)."""
    from click.testing import CliRunner

    from tracekit.cli import cli

    from conftest import sample_trace

    r = CliRunner().invoke(cli, ["breakdown", str(sample_trace("hf-small-graph")), "--phase", "prefill"])
    assert r.exit_code == 2 and "no prefill steps" in r.stderr and "decode 16" in r.stderr
    assert "--phase decode" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = CliRunner().invoke(cli, ["breakdown", str(shared(TRAINING[-2])), "--format", "md"])
    assert r.exit_code == 0
    verdicts = [line for line in r.stdout.splitlines() if "decode advice does not apply" in line]
    assert len(verdicts) == 1 and "training steps" in verdicts[0] and "--phase decode" not in verdicts[0]


def test_gb300_phase_all_keeps_both_kinds_of_step():
    """--phase all on the mixed GB300 window (8 EXTEND + 8 DECODE): the steady step is found per phase, so no
    EXTEND step is dropped as warm-up/transition; steps.phases counts every step found."""
    import tracekit.run.pipeline as bd

    st = bd.step_table(tracekit.load(shared(GB300_0)), phase="all")
    assert st.phases_found == {"decode": 8, "prefill": 8}
    assert st.excluded_reasons == {"last step (no following step)": 1} and st.phase == "mixed"


SERVE_PREFILL = [SAMPLES / n for n in ("serve-prefill-eager-nomark", "serve-prefill-graph-nomark",
                                       "serve-prefill-eager-torch-nomark")]


@pytest.mark.parametrize("folder", SERVE_PREFILL, ids=lambda f: f.name)
def test_serve_prefill_nomark_steps_match_the_manifest(folder):
    """Unmarked serve windows captured on the H200 that start with a prefill step and continue with decode steps
    (eager and graph, nsys and torch): every inferred complete step's phase, from the trace alone (manifest
    stripped), equals the phase the capture ran it as (manifest ``phases``, one per profiled step)."""
    import tracekit.run.pipeline as bd

    from conftest import sample_trace

    man = json.load(open(folder / "manifest.json"))
    n = man["steps"]
    listed = man["phases"]
    assert len(listed) == n and listed[0] == "prefill" and set(listed[1:]) == {"decode"}
    assert man["prefill"]["profiled_step"] == 0
    t = tracekit.load(sample_trace(folder.name))
    st = bd.step_table(_bare(t), phase="all")
    w = st.attribution.steps.windows.filter(pl.col("end").is_not_null()).sort("start")
    got = w.join(st.attribution.phases, on="step", how="left")["phase"].to_list()
    assert got[0] == "prefill", "the first step (a complete prefill) must not be cut by the capture window"
    assert len(got) >= n - 1 and got == listed[:len(got)]


def test_phase_training_selects_training_steps(tmp_path):
    """Contract (Additions to /3): ``--phase training`` analyses the training steps; ``--phase prefill`` on a training
    window is refused naming training as the phase there (issue 44, 6: mfu_2gpu, HTA and DeepSeek training traces)."""
    from _robust import run_cli

    path = shared(TRAINING[0])
    r = run_cli(["breakdown", path, "--phase", "training", "--format", "json"], timeout=120)
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["steps"]["phase"] == "training" and set(out["steps"]["phases"]) == {"training"}
    assert not any(a["applicable"] for a in out["advice"].values())
    r = run_cli(["breakdown", path, "--phase", "prefill"], timeout=120)
    assert r.exit_code == 2 and "training" in r.stderr and "--phase training" in r.stderr
