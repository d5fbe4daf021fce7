"""tracekit.model on real public configs and on the H200 captures' models: parameter counts against the published
ones, checkpoint bytes against the real checkpoints, per-GPU weight bytes under TP/EP, MoE expected experts, MTP
draft bytes and the KV cache by layer kind. Sources of every published figure: tests/data/configs/README.md."""

from __future__ import annotations

import json
import math

import pytest

from tracekit.errors import TracekitError
from tracekit.model import (
    arch_from_config,
    expected_experts,
    kv_cache,
    load_config,
    load_model,
    model_from_config,
    param_counts,
    step_bytes,
)

from conftest import DATA, sample

CONFIGS = DATA / "configs"


def cfg(name: str) -> dict:
    return load_config(CONFIGS / f"{name}.json")


def params(name: str):
    return param_counts(arch_from_config(cfg(name)))


# --------------------------------------------------------------------------- parameter counts vs the published ones

@pytest.mark.parametrize("name,published,scope", [
    ("Llama-3.1-8B", 8_030_261_248, "all parameters (index metadata total_parameters)"),
    ("Qwen3-8B", 8.2e9, "total"),
    ("Qwen3-32B", 32.8e9, "total"),
    ("Qwen3-30B-A3B", 30.5e9, "total, all 128 experts"),
    ("DeepSeek-V3", 671e9, "main model, without the MTP module"),
    ("Qwen3-Next-80B-A3B-Instruct", 80e9, "main model, all 512 experts"),
])
@pytest.mark.slow
def test_total_params_within_1pct_of_published(name, published, scope):
    assert params(name).total == pytest.approx(published, rel=0.01), scope


def test_llama_31_8b_exact():
    p = params("Llama-3.1-8B")
    assert p.total == 8_030_261_248 and p.with_mtp == p.total and p.mtp == 0
    assert p.embedding == p.lm_head == 128256 * 4096


@pytest.mark.parametrize("name,published", [("Qwen3-8B", 6.95e9), ("Qwen3-32B", 31.2e9), ("Qwen3-30B-A3B", 29.9e9)])
def test_qwen_non_embedding_within_1pct(name, published):
    # the Qwen cards' "non-embedding" leaves out both the embedding table and the (untied) lm_head
    p = params(name)
    assert p.total - p.embedding - p.lm_head == pytest.approx(published, rel=0.01)


def test_deepseek_v3_with_mtp_685b():
    p = params("DeepSeek-V3")
    assert p.with_mtp == pytest.approx(685e9, rel=0.01)            # the Hub's 685B = 671B + the MTP module
    assert p.mtp == pytest.approx(14e9, rel=0.05)                  # "14B of the MTP module"
    assert p.active_per_token == pytest.approx(37e9, rel=0.02)     # "37B activated" (embedding row included)


def test_qwen3_30b_a3b_active():
    p = params("Qwen3-30B-A3B")
    assert p.active_per_token == 3_353_032_704                     # card: 3.3B activated
    assert p.active_per_token - p.embedding == pytest.approx(3.04e9, rel=0.01)


# --------------------------------------------------------------------------- stored bytes vs the real checkpoints

def test_llama_31_8b_checkpoint_bytes_equal_index_total_size():
    assert load_model(CONFIGS / "Llama-3.1-8B.json").checkpoint_bytes == 16_060_522_496


@pytest.mark.parametrize("name,file_bytes,files", [
    # the safetensors files' sizes summed: tensor bytes + one JSON header per file (tens of kB to a few MB)
    ("Qwen3-30B-A3B", 61_066_575_648, 16),
    ("DeepSeek-V3", 688_586_727_753, 163),    # FP8 e4m3 weights + 128x128 F32 block scales, as its config says
])
@pytest.mark.slow
def test_checkpoint_bytes_match_the_real_files(name, file_bytes, files):
    ours = load_model(CONFIGS / f"{name}.json").checkpoint_bytes
    headers = file_bytes - ours
    assert 0 < headers < files * 200_000, (ours, headers)         # only the headers are missing
    assert ours == pytest.approx(file_bytes, rel=1e-4)


@pytest.mark.slow
def test_deepseek_v3_dtypes_from_quantization_config():
    m = load_model(CONFIGS / "DeepSeek-V3.json")
    d = m.dtypes
    assert set(d) == {"F8_E4M3", "BF16", "F32"}
    assert d["F8_E4M3"] > 0.97 * m.checkpoint_bytes
    scales = [t for t in m.tensors if t.name.endswith("weight_scale_inv")]
    q_b = next(t for t in scales if t.name == "model.layers.0.self_attn.q_b_proj.weight_scale_inv")
    assert q_b.shape == (math.ceil(128 * 192 / 128), math.ceil(1536 / 128)) and q_b.dtype == "F32"


# --------------------------------------------------------------------------- the H200 captures' models

HF_SIZES = {  # capture/hf_decode.py SIZES (LlamaForCausalLM, bf16) and its --spec draft model
    "small": dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                  intermediate_size=4864, vocab_size=151936, tie_word_embeddings=True),
    "large": dict(hidden_size=2560, num_hidden_layers=28, num_attention_heads=20, num_key_value_heads=4,
                  intermediate_size=6912, vocab_size=128256, tie_word_embeddings=False),
}
DRAFT = dict(hidden_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=768,
             tie_word_embeddings=True)


def hf_model(size: str, **extra):
    return model_from_config(dict(HF_SIZES[size], model_type="llama", torch_dtype="bfloat16", **extra))


@pytest.mark.parametrize("trace,size,spec", [
    ("hf-small-eager", "small", 0), ("hf-large-eager", "large", 0),
    ("hf-small-spec", "small", 3), ("hf-large-spec", "large", 3), ("tp1-hf-small-nccl-graph", "small", 0),
])
def test_config_bytes_equal_what_torch_counted_on_the_h200(trace, size, spec):
    """The manifests' weight_bytes_per_step: numel x element_size of the real torch model on the H200 (target, lm_head
    included, embedding excluded unless tied) + the draft model x 3 forwards. Ours from the config alone."""
    manifest = json.loads(sample(f"{trace}/manifest.json").read_text())  # (committed: missing is a failure)
    assert (manifest["spec"] or {}).get("draft_tokens", 0) == spec
    ours = step_bytes(hf_model(size)).weight_bytes_per_step
    if spec:
        draft = model_from_config(dict(DRAFT, vocab_size=HF_SIZES[size]["vocab_size"], model_type="llama",
                                       torch_dtype="bfloat16"))
        ours += spec * step_bytes(draft).weight_bytes_per_step
    assert ours == manifest["weight_bytes_per_step"]


# --------------------------------------------------------------------------- tensor parallelism

def test_llama_tp_splits():
    m = load_model(CONFIGS / "Llama-3.1-8B.json")
    one = step_bytes(m).weight_bytes_per_step
    assert one == (8_030_261_248 - 128256 * 4096) * 2             # every parameter but the embedding, bf16
    norms = (2 * 32 + 1) * 4096 * 2                                 # replicated on every GPU
    two = step_bytes(m, tp=2).weight_bytes_per_step
    assert two == (one - norms) / 2 + norms
    # tp 16 > 8 KV heads: k_proj and v_proj are split only 8 ways (each GPU holds one KV head)
    kv_proj = 32 * 2 * (8 * 128) * 4096 * 2
    sixteen = step_bytes(m, tp=16).weight_bytes_per_step
    assert sixteen == pytest.approx((one - norms - kv_proj) / 16 + kv_proj / 8 + norms, abs=1)


@pytest.mark.slow
def test_deepseek_mla_replicated_parts():
    """q_a_proj and kv_a_proj_with_mqa are replicated linears (SGLang, vLLM); q_b/kv_b/o split; router whole."""
    m = load_model(CONFIGS / "DeepSeek-V3.json")
    one, eight = step_bytes(m, tp=1), step_bytes(m, tp=8)
    whole = sum(t.nbytes for t, r in zip(m.tensors, m.roles) if not r.draft and r.split == "whole")
    a_proj = sum(t.nbytes for t in m.tensors if ".q_a_proj." in t.name or ".kv_a_proj_with_mqa." in t.name
                 if not t.name.startswith("model.layers.61."))
    assert a_proj > 0 and whole > a_proj
    assert eight.by_group["router"] == one.by_group["router"]      # replicated
    assert eight.by_group["lm_head"] == one.by_group["lm_head"] / 8
    att1, att8 = one.by_group["attention"], eight.by_group["attention"]
    a_whole = sum(t.nbytes for t, r in zip(m.tensors, m.roles) if r.group == "attention" and r.split == "whole"
                  and not r.draft)
    assert att8 == pytest.approx((att1 - a_whole) / 8 + a_whole, abs=2)


# --------------------------------------------------------------------------- MoE

def test_expected_distinct_experts():
    assert expected_experts(128, 8, 1) == 8
    assert expected_experts(128, 8, 64) == pytest.approx(128 * (1 - (1 - 8 / 128) ** 64))
    assert expected_experts(8, 2, 10_000) == pytest.approx(8)


@pytest.mark.parametrize("batch", [1, 8, 64])
@pytest.mark.slow
def test_qwen3_moe_experts_read(batch):
    m = load_model(CONFIGS / "Qwen3-30B-A3B.json")
    s = step_bytes(m, batch=batch)
    one_expert = 3 * 2048 * 768 * 2
    assert s.by_group["experts"] == pytest.approx(48 * expected_experts(128, 8, batch) * one_expert, abs=1)
    assert s.expected_experts == pytest.approx(expected_experts(128, 8, batch))
    assert any("E(1-(1-k/E)^b)" in n for n in s.notes)
    # expert parallelism: ep 4 = tp 4 spreads the experts over 4 GPUs; ep 8 with tp 1 (DP attention) over 8
    assert step_bytes(m, batch=batch, tp=4, ep=4).by_group["experts"] == pytest.approx(s.by_group["experts"] / 4)
    e8 = step_bytes(m, batch=batch, tp=1, ep=8)
    assert e8.by_group["experts"] == pytest.approx(s.by_group["experts"] / 8)
    assert e8.by_group["attention"] == s.by_group["attention"]


def test_ep_must_fit_tp():
    m = load_model(CONFIGS / "Qwen3-30B-A3B.json")
    with pytest.raises(TracekitError, match="--ep 3 must divide --tp 4"):
        step_bytes(m, tp=4, ep=3)


@pytest.mark.slow
def test_deepseek_v3_step_bytes_and_mtp_draft():
    m = load_model(CONFIGS / "DeepSeek-V3.json")
    plain = step_bytes(m, tp=8, batch=16)
    assert plain.draft_bytes_per_step == 0 and any("MTP" in n and "not counted" in n for n in plain.notes)
    spec = step_bytes(m, tp=8, batch=16, draft_forwards=2)
    # the draft = layer 61 (its embedding excluded) read twice; its MoE routes 16 tokens per forward
    assert spec.draft_bytes_per_step > 0
    assert spec.weight_bytes_per_step == plain.weight_bytes_per_step + spec.draft_bytes_per_step
    # layer 61 by hand: FP8 linears with 128x128 F32 block scales, BF16 norms / router / eh_proj / head
    h = 7168

    def fp8(o, i):
        return o * i + math.ceil(o / 128) * math.ceil(i / 128) * 4

    split = fp8(128 * 192, 1536) + fp8(128 * 256, 512) + fp8(h, 128 * 128)             # q_b, kv_b, o_proj: / tp
    whole = fp8(1536, h) + fp8(576, h) + (1536 + 512) * 2 + 2 * h * 2                  # q_a, kv_a, their norms, layer norms
    expert = 2 * fp8(2048, h) + fp8(h, 2048)
    router = 256 * h * 2 + 256 * 4
    glue = h * 2 * h * 2 + 3 * h * 2                                                    # eh_proj, enorm, hnorm, head norm
    head = 129280 * h * 2
    per_forward = (split / 8 + whole + 256 * expert * expected_experts(256, 8, 16) / 256 / 8 + expert / 8
                   + router + glue + head / 8)
    assert spec.draft_bytes_per_step == pytest.approx(2 * per_forward, abs=2)


# --------------------------------------------------------------------------- KV cache

def test_kv_llama_per_token_and_tp():
    a = arch_from_config(cfg("Llama-3.1-8B"))
    assert kv_cache(a).full_bytes_per_token == 32 * 2 * 8 * 128 * 2 == 131072
    assert kv_cache(a, tp=2).full_bytes_per_token == 65536
    k16 = kv_cache(a, tp=16)
    assert k16.full_bytes_per_token == 32 * 2 * 1 * 128 * 2 and "replicated" in k16.notes[0]
    assert kv_cache(a, kv_dtype="fp8").full_bytes_per_token == 65536


@pytest.mark.slow
def test_kv_deepseek_mla_latent_not_split():
    a = arch_from_config(cfg("DeepSeek-V3"))
    for tp in (1, 8):
        k = kv_cache(a, tp=tp)
        assert k.full_bytes_per_token == 61 * (512 + 64) * 2 and k.draft_bytes_per_token == 576 * 2
    m = load_model(CONFIGS / "DeepSeek-V3.json")
    s = step_bytes(m, tp=8, batch=4, context=32768, draft_forwards=3)
    assert s.kv_bytes_per_step == 4 * 32768 * (61 + 3) * 576 * 2     # target layers + the MTP layer per forward


def test_kv_qwen3_next_hybrid():
    a = arch_from_config(cfg("Qwen3-Next-80B-A3B-Instruct"))
    assert a.layer_kinds.count("full") == 12 and a.layer_kinds.count("linear") == 36
    k = kv_cache(a)
    assert k.full_bytes_per_token == 12 * 2 * 2 * 256 * 2
    recurrent = 32 * 128 * 128 * 4                 # v heads x k dim x v dim, fp32
    conv = 3 * (2 * 16 * 128 + 32 * 128) * 2       # (kernel - 1) x conv channels, bf16
    assert k.state_bytes_per_sequence == 36 * (recurrent + conv)
    k2 = kv_cache(a, tp=2)
    assert k2.full_bytes_per_token == 12 * 2 * 1 * 256 * 2
    assert k2.state_bytes_per_sequence == 36 * (16 * 128 * 128 * 4 + 3 * (2 * 8 * 128 + 16 * 128) * 2)
    # the state does not grow with the context; the full layers do
    assert k.bytes_per_step(0, 1) == k.state_bytes_per_sequence
    assert k.bytes_per_step(2000, 3) - k.bytes_per_step(1000, 3) == 3 * 1000 * k.full_bytes_per_token


def test_kv_sliding_window_synthetic():
    """Definition test (synthetic config, labelled): Mistral-style window on every layer, and gpt-oss-style
    alternating sliding/full layer_types."""
    base = dict(model_type="mistral", vocab_size=1000, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                num_key_value_heads=2, intermediate_size=512, torch_dtype="bfloat16")
    per_layer = 2 * 2 * 64 * 2
    k = kv_cache(arch_from_config(dict(base, sliding_window=4096)))
    assert k.full_bytes_per_token == 0 and k.windowed == ((4096, 4 * per_layer),)
    assert k.bytes_per_step(1000, 2) == 2 * 1000 * 4 * per_layer
    assert k.bytes_per_step(100_000, 2) == 2 * 4096 * 4 * per_layer
    alt = kv_cache(arch_from_config(dict(base, sliding_window=128, layer_types=["sliding_attention", "full_attention"] * 2)))
    assert alt.full_bytes_per_token == 2 * per_layer and alt.windowed == ((128, 2 * per_layer),)
    # Qwen2-style: use_sliding_window false means every layer is full, whatever sliding_window says
    assert kv_cache(arch_from_config(dict(base, sliding_window=4096, use_sliding_window=False))).windowed == ()


def test_step_kv_unknown_context_is_none():
    s = step_bytes(load_model(CONFIGS / "Qwen3-8B.json"), tp=2)
    assert s.kv_bytes_per_step is None and s.kv_bytes_source is None
    assert s.bytes_per_step == s.weight_bytes_per_step
    assert any("context length is unknown" in n for n in s.notes)
    s = step_bytes(load_model(CONFIGS / "Qwen3-8B.json"), tp=2, batch=8, context=4096)
    assert s.kv_bytes_per_step == 8 * 4096 * 36 * 2 * 4 * 128 * 2 and s.kv_bytes_source == "model"
    assert s.bytes_per_step == s.weight_bytes_per_step + s.kv_bytes_per_step
