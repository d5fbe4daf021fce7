"""``tracekit ceiling`` (schema tracekit.ceiling/1) and the HF config parameter counter."""

from __future__ import annotations

import io
import json
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from rich.console import Console

from tracekit.analyses.roofline import step_roofline
from tracekit.cli.ceiling import ceiling as ceiling_command
from tracekit.errors import TracekitError
from tracekit.model import arch_from_config, load_config, load_model, param_counts, parse_bytes, step_bytes
from tracekit.report.ceiling import render_markdown, render_table
from tracekit.results.ceiling import ceiling

CONTRACT_KEYS = {"schema", "gpu", "bytes_per_step_per_gpu", "floor_ms", "ceiling_steps_per_s", "tokens_per_step",
                 "ceiling_tokens_per_s", "measured_tokens_per_s", "fraction_of_ceiling", "assumptions"}


def run(*args: str):
    return CliRunner().invoke(ceiling_command, list(args))


def run_json(*args: str) -> dict:
    res = run(*args, "--format", "json")
    assert res.exit_code == 0, (res.output, res.exception)
    return json.loads(res.output)


# --------------------------------------------------------------------------- hand-computed figures

def test_issue_10_a6000_27b_fp8_tp2():
    # 27e9 fp8 params = 27 GB; TP 2 -> 13.5 GB per GPU per step; 768 GB/s -> 17.58 ms
    # -> 56.9 steps/s; x 3.2 accepted tokens = 182 tok/s.
    d = run_json("--gpu", "RTX A6000", "--params", "27e9", "--dtype", "fp8", "--tp", "2", "--accept-len", "3.2")
    assert CONTRACT_KEYS <= set(d)
    assert d["schema"] == "tracekit.ceiling/1"
    assert d["gpu"] == {"name": "NVIDIA RTX A6000", "peak_bw_gbps": 768.0, "peak_bw_source": "table"}
    assert d["bytes_per_step_per_gpu"] == 13_500_000_000
    assert d["floor_ms"] == pytest.approx(17.578125)
    assert d["ceiling_steps_per_s"] == pytest.approx(56.889, abs=1e-3)
    assert d["tokens_per_step"] == pytest.approx(3.2)
    assert d["ceiling_tokens_per_s"] == pytest.approx(182.04, abs=0.01)
    assert d["measured_tokens_per_s"] is None and d["fraction_of_ceiling"] is None
    assert any("communication" in a for a in d["assumptions"])
    assert any("compute" in a for a in d["assumptions"])
    assert any("launch overhead" in a for a in d["assumptions"])
    assert any("activation" in a for a in d["assumptions"])


def test_issue_10_measured_sentence():
    d = run_json("--gpu", "RTX A6000", "--params", "27B", "--dtype", "fp8", "--tp", "2", "--accept-len", "3.2",
                 "--measured-tok-s", "55")
    assert d["fraction_of_ceiling"] == pytest.approx(55 / 182.044, abs=1e-4)
    assert d["summary"] == "ceiling 182 tok/s; you are at 30% of it"


def test_plain_sentence_84():
    # 10 GB at 840 GB/s -> 11.905 ms -> 84 tok/s; 54.6 tok/s measured is 65% of it.
    c = ceiling(peak_bw=840, weight_bytes=10e9, measured_tok_s=54.6)
    assert c.summary == "ceiling 84 tok/s; you are at 65% of it"
    assert c.peak_bw_source == "flag" and c.gpu_name == "custom"


def test_h200_4gb():
    d = run_json("--gpu", "NVIDIA H200", "--weight-bytes", "4GB")
    assert d["gpu"]["peak_bw_gbps"] == 4800.0
    assert d["bytes_per_step_per_gpu"] == 4_000_000_000
    assert d["floor_ms"] == pytest.approx(4e9 / 4800e9 * 1e3)
    assert d["ceiling_steps_per_s"] == pytest.approx(1200.0)
    assert d["ceiling_tokens_per_s"] == pytest.approx(1200.0)


def test_int4_halves_the_bytes():
    d = run_json("--gpu", "NVIDIA H200", "--params", "8e9", "--dtype", "int4")
    assert d["bytes_per_step_per_gpu"] == 4_000_000_000
    assert d["ceiling_tokens_per_s"] == pytest.approx(1200.0)
    assert any("scales" in a for a in d["assumptions"])


def test_kv_bytes_and_batch():
    # 16 GB bf16 (8e9 params) on H100 SXM, batch 8 at 4096 context, 131072 B/token of KV:
    # weights once (16 GB) + KV 131072 x 4096 x 8 = 4.295 GB -> 20.295 GB / 3350 GB/s.
    d = run_json("--gpu", "NVIDIA H100 80GB HBM3", "--params", "8e9", "--kv-bytes-per-token", "131072",
                 "--context", "4096", "--batch", "8")
    kv = 131072 * 4096 * 8
    assert d["bytes_per_step_per_gpu"] == 16_000_000_000 + kv
    assert d["bytes_breakdown"] == {"weights": 16_000_000_000, "draft": 0, "kv": kv}
    assert d["floor_ms"] == pytest.approx((16e9 + kv) / 3350e9 * 1e3)
    assert d["tokens_per_step"] == 8.0
    assert d["ceiling_tokens_per_s"] == pytest.approx(8 * 3350e9 / (16e9 + kv))


def test_draft_bytes():
    # target 27 GB fp8 at TP 2 + a 1 GB draft run 3 times a step, sharded: 13.5 + 1.5 GB
    d = run_json("--gpu", "RTX A6000", "--params", "27e9", "--dtype", "fp8", "--tp", "2", "--accept-len", "3.2",
                 "--draft-bytes", "1e9", "--draft-forwards", "3")
    assert d["bytes_per_step_per_gpu"] == 15_000_000_000
    assert d["floor_ms"] == pytest.approx(15e9 / 768e9 * 1e3)
    assert d["ceiling_tokens_per_s"] == pytest.approx(768e9 / 15e9 * 3.2)
    rep = run_json("--gpu", "RTX A6000", "--params", "27e9", "--dtype", "fp8", "--tp", "2",
                   "--draft-bytes", "1e9", "--draft-forwards", "3", "--draft-replicated")
    assert rep["bytes_per_step_per_gpu"] == 16_500_000_000


def test_peak_bw_flag_overrides_table():
    d = run_json("--gpu", "NVIDIA H200", "--weight-bytes", "4e9", "--peak-bw", "4000")
    assert d["gpu"] == {"name": "NVIDIA H200 SXM", "peak_bw_gbps": 4000.0, "peak_bw_source": "flag"}
    assert d["floor_ms"] == pytest.approx(1.0)


def test_same_arithmetic_as_breakdown():
    # breakdown fills its roofline block with roofline(bytes, bw, steps.mean_ms, tokens, gemm_ms);
    # ceiling with a measured tok/s must give the same floor, ceiling and fraction.
    from tracekit.analyses.roofline import roofline

    step_ms = 1.0
    r = roofline(4_000_000_000, 4800.0, step_ms, 1.0, None)
    c = ceiling(gpu="NVIDIA H200", weight_bytes=4e9, measured_tok_s=1000.0 / step_ms)
    assert (c.floor_ms, c.ceiling_steps_per_s, c.ceiling_tokens_per_s) == (
        r.floor_ms, r.ceiling_steps_per_s, r.ceiling_tokens_per_s)
    assert c.fraction_of_ceiling == pytest.approx(r.fraction_of_ceiling, rel=1e-12)


# --------------------------------------------------------------------------- formats and errors

A6000 = ("--gpu", "RTX A6000", "--params", "27e9", "--dtype", "fp8", "--tp", "2", "--accept-len", "3.2",
         "--measured-tok-s", "55")


def test_table_output():
    res = run(*A6000)
    assert res.exit_code == 0, res.output
    out = res.output
    for text in ("peak bandwidth (GB/s)", "768 (table)", "floor per step (ms)", "17.58", "ceiling (tok/s)",
                 "182", "ceiling 182 tok/s; you are at 30% of it", "assumptions:"):
        assert text in out, text
    # numbers are right-aligned: the value column ends flush at the border
    line = next(ln for ln in out.splitlines() if "floor per step" in ln)
    assert line.rstrip().endswith("17.58 │")


def test_render_table_console():
    buf = io.StringIO()
    render_table(ceiling(gpu="NVIDIA H200", weight_bytes=4e9), Console(file=buf, width=100, color_system=None))
    assert "1,200" in buf.getvalue() and "\x1b[" not in buf.getvalue()


def test_md_output_and_file(tmp_path):
    out = tmp_path / "c.md"
    res = run(*A6000, "--format", "md", "-o", str(out))
    assert res.exit_code == 0 and res.output == ""
    md = out.read_text()
    assert md.startswith("**ceiling 182 tok/s; you are at 30% of it**")
    assert "| quantity | value |" in md and "| floor per step (ms) | 17.58 |" in md
    assert md == render_markdown(ceiling(gpu="RTX A6000", params=27e9, dtype="fp8", tp=2, accept_len=3.2,
                                         measured_tok_s=55))
    js = tmp_path / "c.json"
    assert run(*A6000, "--format", "json", "-o", str(js)).exit_code == 0
    assert json.loads(js.read_text())["schema"] == "tracekit.ceiling/1"


@pytest.mark.parametrize("args,msg", [
    (("--params", "27e9"), "--gpu NAME or --peak-bw"),
    (("--gpu", "RTX A6000"), "exactly one of"),
    (("--gpu", "RTX A6000", "--params", "1e9", "--weight-bytes", "2e9"), "exactly one of"),
    (("--gpu", "RTX A6000", "--params", "1e9", "--draft-bytes", "1e8"), "--draft-forwards"),
    (("--gpu", "RTX A6000", "--params", "lots"), "is not a number"),
    (("--gpu", "RTX A6000", "--params", "1e9", "--tp", "0"), "--tp"),
    (("--gpu", "RTX A6000", "--params", "1e9", "--dtype", "fp6"), "--dtype"),
])
def test_usage_errors(args, msg):
    res = run(*args)
    assert res.exit_code == 2, res.output
    assert msg in res.output


@pytest.mark.parametrize("kwargs,msg", [
    (dict(gpu="Mystery GPU 9000", params=1e9), "unknown GPU 'Mystery GPU 9000': pass its peak memory bandwidth"),
    (dict(gpu="NVIDIA H200", params=1e9, kv_bytes_per_token=131072), "--context"),
    (dict(gpu="NVIDIA H200", params=1e9, context=4096), "--kv-bytes-per-token"),
    (dict(gpu="NVIDIA H200", params=1e9, accept_len=0), "--accept-len"),
    (dict(gpu="NVIDIA H200", model_config="/nonexistent/config.json"), "does not exist"),
])
def test_library_errors_are_one_line(kwargs, msg):
    with pytest.raises(TracekitError) as e:
        ceiling(**kwargs)
    assert msg in str(e.value) and "\n" not in str(e.value)


def test_unknown_gpu_through_cli():
    res = run("--gpu", "Mystery GPU 9000", "--params", "1e9")
    assert isinstance(res.exception, TracekitError)  # the tracekit group maps it to exit 2
    assert isinstance(click.UsageError("x"), click.ClickException)


# --------------------------------------------------------------------------- HF config parameter counts
# Configs copied from each model's config.json on the Hugging Face Hub; the expected totals are
# the parameter counts the Hub shows for the safetensors checkpoints (model cards cited inline).

LLAMA_31_8B = {  # meta-llama/Llama-3.1-8B config.json; card: "8B", Hub: 8,030,261,248 params
    "model_type": "llama", "vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
    "tie_word_embeddings": False, "attention_bias": False, "torch_dtype": "bfloat16",
}
QWEN25_05B = {  # Qwen/Qwen2.5-0.5B config.json; card: "Number of Parameters: 0.49B; Non-Embedding: 0.36B"
    "model_type": "qwen2", "vocab_size": 151936, "hidden_size": 896, "intermediate_size": 4864,
    "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2, "tie_word_embeddings": True,
}
MIXTRAL_8X7B = {  # mistralai/Mixtral-8x7B-v0.1 config.json; Mistral: "46.7B total, 12.9B active per token"
    "model_type": "mixtral", "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "num_local_experts": 8, "num_experts_per_tok": 2, "tie_word_embeddings": False,
}
QWEN3_30B_A3B = {  # Qwen/Qwen3-30B-A3B config.json; card: "30.5B in total and 3.3B activated"
    "model_type": "qwen3_moe", "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 6144,
    "moe_intermediate_size": 768, "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4,
    "head_dim": 128, "num_experts": 128, "num_experts_per_tok": 8, "decoder_sparse_step": 1,
    "mlp_only_layers": [], "tie_word_embeddings": False,
}
QWEN15_MOE_A27B = {  # Qwen/Qwen1.5-MoE-A2.7B config.json; card: "14.3B parameters in total and 2.7B activated"
    "model_type": "qwen2_moe", "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 5632,
    "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632, "num_hidden_layers": 24,
    "num_attention_heads": 16, "num_key_value_heads": 16, "num_experts": 60, "num_experts_per_tok": 4,
    "decoder_sparse_step": 1, "mlp_only_layers": [], "tie_word_embeddings": False,
}
DEEPSEEK_V3 = {  # deepseek-ai/DeepSeek-V3 config.json; card: "671B total parameters, 37B activated per token"
    "model_type": "deepseek_v3", "vocab_size": 129280, "hidden_size": 7168, "intermediate_size": 18432,
    "moe_intermediate_size": 2048, "num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": 128,
    "n_shared_experts": 1, "n_routed_experts": 256, "num_experts_per_tok": 8, "q_lora_rank": 1536,
    "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
    "first_k_dense_replace": 3, "moe_layer_freq": 1, "topk_method": "noaux_tc", "tie_word_embeddings": False,
}


def count_params(cfg: dict):
    """(Arch, ParamCounts) of a config: what the deleted ``tracekit.modelconfig.count_params`` wrapped."""
    a = arch_from_config(cfg)
    return a, param_counts(a)


def test_llama_31_8b():
    a, m = count_params(LLAMA_31_8B)
    assert m.total == 8_030_261_248
    assert m.embedding == m.lm_head == 128256 * 4096
    assert m.active_per_token == m.total and not a.warnings
    assert m.total - m.embedding == 8_030_261_248 - 128256 * 4096  # a step reads lm_head, not the embedding


def test_qwen25_05b_tied():
    a, m = count_params(QWEN25_05B)
    assert m.total == 494_032_768  # 0.49B
    assert m.total - m.embedding == 357_898_112  # 0.36B non-embedding
    assert a.tied and m.lm_head == m.embedding  # the tied lm_head is the embedding matrix, counted once in total


def test_mixtral():
    a, m = count_params(MIXTRAL_8X7B)
    assert m.total == 46_702_792_704
    assert m.active_per_token == 12_879_925_248
    assert (a.experts, a.top_k, len(a.moe_layers)) == (8, 2, 32)


def test_qwen3_moe():
    _, m = count_params(QWEN3_30B_A3B)
    assert m.total == 30_532_122_624
    assert m.active_per_token == 3_353_032_704


def test_qwen15_moe_shared_expert():
    _, m = count_params(QWEN15_MOE_A27B)
    assert m.total == 14_315_784_192
    assert m.active_per_token == 2_689_173_504


def test_deepseek_v3_mla():
    a, m = count_params(DEEPSEEK_V3)
    assert m.total == pytest.approx(671e9, rel=1e-3)
    assert m.active_per_token == pytest.approx(37e9, rel=0.02)
    assert len(a.moe_layers) == 58


def test_multimodal_and_unknown(tmp_path):
    a, m = count_params({"model_type": "llava", "text_config": dict(LLAMA_31_8B)})
    assert m.total == 8_030_261_248 and "text_config" in a.warnings[0]
    a, u = count_params({**LLAMA_31_8B, "model_type": "somethingnew"})
    assert u.total == 8_030_261_248 and "Llama-style" in a.warnings[0]
    with pytest.raises(TracekitError, match="hidden_size"):
        count_params({"vocab_size": 10})
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    with pytest.raises(TracekitError, match="cannot read model config"):
        load_config(bad)


def test_ceiling_from_model_config(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(LLAMA_31_8B))
    d = run_json("--gpu", "NVIDIA H200", "--model-config", str(cfg), "--context", "8192", "--batch", "4")
    weights = (8_030_261_248 - 128256 * 4096) * 2
    kv = 32 * 2 * 8 * 128 * 2 * 8192 * 4
    assert d["bytes_per_step_per_gpu"] == weights + kv
    assert d["bytes_breakdown"] == {"weights": weights, "draft": 0, "kv": kv}
    assert d["model"]["params"]["total"] == 8_030_261_248
    assert d["inputs"]["weight_bytes_source"] == "model" and d["inputs"]["kv_bytes_source"] == "model"
    assert d["ceiling_tokens_per_s"] == pytest.approx(4 * 4800e9 / (weights + kv))


# --------------------------------------------------------------------------- units and --model (issue 17)


CONFIGS = Path(__file__).parents[1] / "data" / "configs"


@pytest.mark.parametrize("text,value", [
    ("27e9", 27_000_000_000), ("27GB", 27_000_000_000), ("27 gb", 27_000_000_000), ("25.1GiB", round(25.1 * 2**30)),
    ("16.4e9", 16_400_000_000), ("512MiB", 512 * 2**20), ("1.5TB", 1_500_000_000_000), ("2TiB", 2 * 2**40),
    ("300MB", 300_000_000), ("4096", 4096), ("64kB", 64_000), (8_000_000_000, 8_000_000_000),
])
def test_parse_bytes(text, value):
    assert parse_bytes(text) == value


@pytest.mark.parametrize("text,msg", [("27B", "ambiguous"), ("lots", "not a byte amount"), ("-5GB", "not a byte"),
                                      ("1e999", "too large"), ("5 GHz", "not a byte amount")])
def test_parse_bytes_refuses(text, msg):
    with pytest.raises(TracekitError, match=msg):
        parse_bytes(text)


def test_weight_bytes_units_and_tp_through_the_cli():
    d = run_json("--gpu", "NVIDIA H200", "--weight-bytes", "25.1GiB", "--tp", "2")
    assert d["bytes_per_step_per_gpu"] == round(round(25.1 * 2**30) / 2)
    assert d["roofline"]["tp"] == 2 and d["roofline"]["weight_bytes_source"] == "flag"
    res = run("--gpu", "NVIDIA H200", "--weight-bytes", "27B")
    assert res.exit_code == 2 and "ambiguous" in res.output


def test_ceiling_and_breakdown_agree_per_gpu():
    """The same model, TP and context give the same per-GPU bytes through ceiling() and through the library calls
    breakdown makes (step_bytes -> step_roofline)."""
    model = CONFIGS / "Qwen3-8B.json"
    c = ceiling(gpu="NVIDIA H200", model=model, tp=2, batch=8, context=8192, measured_tok_s=900)
    sb = step_bytes(load_model(model), tp=2, batch=8, context=8192)
    r = step_roofline(weight_bytes_per_step=sb.weight_bytes_per_step, weight_bytes_source=sb.weight_bytes_source,
                      kv_bytes_per_step=sb.kv_bytes_per_step, kv_bytes_source=sb.kv_bytes_source,
                      draft_bytes_per_step=sb.draft_bytes_per_step, peak_bw_gbps=4800.0,
                      reference_step_ms=8 * 1000 / 900, tokens_per_step=8, tp=2)
    assert c.bytes_per_step_per_gpu == r.bytes_per_step == sb.bytes_per_step
    assert c.roofline == r and c.roofline.to_dict() == r.to_dict()
    # by hand: Qwen3-8B bf16 without the embedding, linears / 2, norms whole; KV 36 layers x 2 x (8/2) heads x 128
    norms = (36 * (2 * 4096 + 2 * 128) + 4096) * 2
    assert sb.weight_bytes_per_step == (8_190_735_360 - 151936 * 4096) * 2 / 2 + norms / 2
    assert sb.kv_bytes_per_step == 8 * 8192 * 36 * 2 * 4 * 128 * 2
    # --weight-bytes is summed over GPUs in both: ceiling divides by tp, as breakdown will
    assert ceiling(gpu="NVIDIA H200", weight_bytes=16e9, tp=2).bytes_per_step_per_gpu == 8_000_000_000


@pytest.mark.slow
def test_ceiling_model_directory_with_mtp_and_ep():
    d = run_json("--gpu", "NVIDIA H200", "--model", str(CONFIGS / "DeepSeek-V3.json"), "--tp", "8", "--ep", "8",
                 "--batch", "16", "--context", "4096", "--draft-forwards", "2", "--accept-len", "2.4")
    sb = step_bytes(load_model(CONFIGS / "DeepSeek-V3.json"), tp=8, ep=8, batch=16, context=4096, draft_forwards=2,
                    verify_tokens=3)
    assert d["bytes_per_step_per_gpu"] == sb.bytes_per_step
    assert d["bytes_breakdown"] == {"weights": sb.weight_bytes_per_step - sb.draft_bytes_per_step,
                                    "draft": sb.draft_bytes_per_step, "kv": sb.kv_bytes_per_step}
    assert d["roofline"]["draft_bytes_per_step"] == sb.draft_bytes_per_step > 0
    assert d["model"]["params"]["total"] == pytest.approx(671e9, rel=0.001)
    assert any("E(1-(1-k/E)^b)" in a for a in d["assumptions"])
    assert any("MLA" in a for a in d["assumptions"])


def test_ceiling_weight_flag_replaces_only_the_weights_term():
    c = ceiling(gpu="NVIDIA H200", model=CONFIGS / "Llama-3.1-8B.json", weight_bytes=10e9, tp=2, context=1000)
    assert c.bytes_breakdown == {"weights": 5_000_000_000, "draft": 0, "kv": 1000 * 65536}
    assert c.inputs["weight_bytes_source"] == "flag" and c.inputs["kv_bytes_source"] == "model"
    with pytest.raises(TracekitError, match="one of"):
        ceiling(gpu="NVIDIA H200", model=CONFIGS / "Llama-3.1-8B.json", params=8e9)


@pytest.mark.slow
def test_ceiling_and_breakdown_resolve_bytes_with_one_function(monkeypatch):
    """`ceiling --model` and `breakdown --model` give the same bytes, from the same resolver
    (tracekit.analyses.bytes.resolve_bytes; issue 26): spied on, it is called once by each, and the per-GPU
    weights agree. The GB300 rank file is SGLang TP4, batch 16 (its step[DECODE bs=16] annotations)."""
    import tracekit
    import tracekit.analyses.bytes as bytes_mod

    from conftest import shared

    gb300 = shared("lora_perf_lora_profile/runs/Qwen3-30B-A3B-Instruct-2507-BF16-expert_shared-20260609-133913/"
                   "current_base_lora/profile/base/bs16-TP-0.trace.json.gz")
    calls = []
    real = bytes_mod.resolve_bytes

    def spy(**kw):
        calls.append(kw)
        return real(**kw)

    monkeypatch.setattr(bytes_mod, "resolve_bytes", spy)
    model = CONFIGS / "Qwen3-30B-A3B.json"
    b = tracekit.breakdown(tracekit.load(gb300), model=str(model), tp=4, tokens_per_step=16)
    c = ceiling(gpu="NVIDIA GB300", model=model, tp=4, batch=16)
    assert len(calls) == 2 and {k: calls[0][k] for k in ("batch", "draft_forwards", "verify_tokens")} \
        == {k: calls[1][k] for k in ("batch", "draft_forwards", "verify_tokens")}
    assert b.roofline["weight_bytes_per_step"] == c.roofline["weight_bytes_per_step"] == c.bytes_per_step_per_gpu
    assert b.roofline["weight_bytes_source"] == c.roofline["weight_bytes_source"] == "model"
    assert b.roofline["tp"] == c.roofline["tp"] == 4
    # and what the model library says for a 16-token forward on one of 4 GPUs
    sb = step_bytes(load_model(model), tp=4, batch=16)
    assert c.bytes_per_step_per_gpu == sb.weight_bytes_per_step
    # --weight-bytes with --model: the flag replaces the target's weights in both (summed over GPUs, / tp)
    b2 = tracekit.breakdown(tracekit.load(gb300), model=str(model), weight_bytes=int(24e9), tp=4, tokens_per_step=16)
    c2 = ceiling(gpu="NVIDIA GB300", model=model, weight_bytes=24e9, tp=4, batch=16)
    assert b2.roofline["weight_bytes_per_step"] == c2.bytes_per_step_per_gpu == 6_000_000_000
