"""What a Hugging Face ``config.json`` says about a decoder's shape.

:func:`arch_from_config` turns the config into an :class:`Arch`: sizes, attention kind of
every layer (full / sliding window / chunked / linear attention / Mamba / none), MoE
structure and the MTP (next-n prediction) layers. Everything that sizes weights or the
KV cache reads its numbers from here, so one config key is interpreted in one place.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from tracekit.errors import BadModelConfig, ModelFilesMissing

# Attention kind of a layer, for the KV cache.
FULL, SLIDING, CHUNKED, LINEAR, MAMBA, NONE = "full", "sliding", "chunked", "linear", "mamba", "none"

KNOWN_TYPES = frozenset({
    "llama", "mistral", "qwen2", "qwen3", "mixtral", "qwen2_moe", "qwen3_moe", "qwen3_next", "deepseek_v2",
    "deepseek_v3", "olmoe", "granite", "phi3", "yi", "internlm2", "gemma", "gemma2", "gemma3_text", "glm4_moe",
})

_LAYER_TYPE_NAMES = {
    "full_attention": FULL, "attention": FULL, "global": FULL, "global_attention": FULL, "full": FULL,
    "sliding_attention": SLIDING, "sliding_window": SLIDING, "local": SLIDING, "local_attention": SLIDING,
    "sliding": SLIDING,
    "chunked_attention": CHUNKED,
    "linear_attention": LINEAR, "linear": LINEAR,
    "mamba": MAMBA, "mamba2": MAMBA, "ssm": MAMBA,
    "mlp": NONE, "moe": NONE,
}


def load_config(path: str | Path) -> dict:
    """Read a ``config.json``; ``TracekitError`` with a one-line reason when it cannot."""
    p = Path(path)
    try:
        if p.stat().st_size > 50_000_000:
            raise BadModelConfig(f"model config {path} is {p.stat().st_size:,} bytes: not a config.json")
        cfg = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError as e:
        raise ModelFilesMissing(f"model config {path} does not exist") from e
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        raise BadModelConfig(f"cannot read model config {path}: {type(e).__name__}: {str(e)[:120]}") from None
    if not isinstance(cfg, dict):
        raise BadModelConfig(f"model config {path} is not a JSON object")
    return cfg


def _get(cfg: dict, *keys: str, default=None):
    for k in keys:
        if cfg.get(k) is not None:
            return cfg[k]
    return default


def _int(cfg: dict, *keys: str, default=None) -> int | None:
    v = _get(cfg, *keys, default=default)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != int(v) or v < 0:
        raise BadModelConfig(f"model config: {keys[0]} = {v!r} is not a non-negative integer")
    return int(v)


@dataclass(frozen=True)
class Arch:
    """A decoder's shape, from its config. Sizes in elements; ``layer_kinds[i]`` is layer i's attention kind."""

    model_type: str
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int | None
    tied: bool
    layer_kinds: tuple[str, ...]
    attention_bias: bool = False
    qkv_bias: bool = False
    qk_norm: bool = False
    gated_q: bool = False                  # Qwen3-Next: q_proj also emits the output gate
    sliding_window: int | None = None
    chunk_size: int | None = None
    # MLA (DeepSeek-V2/V3)
    mla: bool = False
    q_lora_rank: int | None = None
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    # MoE
    experts: int = 0                        # routed experts per MoE layer
    top_k: int = 0
    moe_intermediate: int = 0
    shared_experts: int = 0                 # DeepSeek n_shared_experts (each moe_intermediate wide)
    shared_intermediate: int = 0            # Qwen shared_expert_intermediate_size (with a sigmoid gate)
    moe_layers: tuple[int, ...] = ()
    router_bias: bool = False               # DeepSeek noaux_tc e_score_correction_bias
    # linear attention (Qwen3-Next gated delta net)
    linear_k_heads: int = 0
    linear_v_heads: int = 0
    linear_k_dim: int = 0
    linear_v_dim: int = 0
    conv_kernel: int = 0
    # Mamba2
    mamba_heads: int = 0
    mamba_head_dim: int = 0
    ssm_state: int = 0
    mamba_groups: int = 1
    mamba_inner: int = 0
    # MTP / next-n prediction layers
    mtp_layers: int = 0
    mtp_style: str | None = None            # "layers" (model.layers.N, N >= layers) | "mtp" (mtp.*) | None
    torch_dtype: str = "bfloat16"
    quantization: dict | None = None
    warnings: tuple[str, ...] = field(default=())


def text_config(cfg: dict) -> tuple[dict, list[str]]:
    """The language model's config of a multimodal config (``text_config`` / ``llm_config``), else ``cfg``."""
    for key in ("text_config", "llm_config", "language_config"):
        sub = cfg.get(key)
        if isinstance(sub, dict) and sub.get("hidden_size"):
            merged = {k: v for k, v in cfg.items() if k in ("torch_dtype", "dtype", "quantization_config",
                                                           "tie_word_embeddings")}
            merged.update(sub)
            return merged, [f"counted the language model of {cfg.get('model_type') or 'a multimodal model'} "
                            f"({key}); vision/audio towers do not run in a decode step"]
    return cfg, []


def arch_from_config(cfg: dict) -> Arch:
    """Interpret a Hugging Face config. ``TracekitError`` when a size the byte counts need is missing."""
    cfg, warnings = text_config(cfg)
    model_type = str(cfg.get("model_type") or "unknown")
    if model_type not in KNOWN_TYPES:
        warnings.append(f"model_type {model_type[:40]!r} is not one tracekit knows: counted as a Llama-style decoder")
    try:
        vocab = _int(cfg, "vocab_size", "padded_vocab_size")
        hidden = _int(cfg, "hidden_size", "d_model", "n_embd")
        n_layers = _int(cfg, "num_hidden_layers", "n_layer", "num_layers", "n_layers")
        heads = _int(cfg, "num_attention_heads", "n_head", "n_heads")
        if None in (vocab, hidden, n_layers, heads) or heads == 0:
            raise KeyError
    except KeyError:
        raise BadModelConfig("model config lacks a size tracekit needs: vocab_size, hidden_size, num_hidden_layers "
                            "and num_attention_heads") from None
    kv_heads = _int(cfg, "num_key_value_heads", "num_kv_heads", "n_kv_heads", default=heads) or heads
    head_dim = _int(cfg, "head_dim", default=hidden // heads)
    inter = _int(cfg, "intermediate_size", "ffn_dim", "ffn_hidden_size")
    tied = bool(cfg.get("tie_word_embeddings", False))
    dtype = str(_get(cfg, "torch_dtype", "dtype", default="bfloat16"))

    # ---- MoE
    n_experts = _int(cfg, "n_routed_experts", "num_local_experts", "num_experts", "moe_num_experts", default=0) or 0
    top_k = _int(cfg, "num_experts_per_tok", "moe_topk", "num_experts_per_token", "moe_top_k", default=0) or 0
    moe_inter = _int(cfg, "moe_intermediate_size", "expert_intermediate_size", default=inter or 0) or 0
    if n_experts and not top_k:
        raise BadModelConfig("MoE model config lacks num_experts_per_tok")
    if n_experts and not moe_inter:
        raise BadModelConfig("MoE model config lacks moe_intermediate_size")
    moe_layers: list[int] = []
    if n_experts:
        for i in range(n_layers):
            if "first_k_dense_replace" in cfg:  # DeepSeek / GLM-MoE
                moe = i >= int(cfg["first_k_dense_replace"]) and i % int(cfg.get("moe_layer_freq") or 1) == 0
            elif i in (cfg.get("mlp_only_layers") or []):  # Qwen-MoE
                moe = False
            else:
                step = int(cfg.get("decoder_sparse_step") or 1)
                moe = (i + 1) % step == 0
            if moe:
                moe_layers.append(i)
    if not n_experts and inter is None:
        raise BadModelConfig("model config lacks intermediate_size")

    # ---- attention kind per layer
    kinds = _layer_kinds(cfg, n_layers, warnings)
    sliding = _int(cfg, "sliding_window", "window_size")
    chunk = _int(cfg, "attention_chunk_size")
    if SLIDING in kinds and not sliding:
        warnings.append("config names sliding-window layers but no sliding_window: counted them as full attention")
        kinds = tuple(FULL if k == SLIDING else k for k in kinds)
    if CHUNKED in kinds and not chunk:
        kinds = tuple(FULL if k == CHUNKED else k for k in kinds)

    mla = bool(cfg.get("kv_lora_rank"))
    mtp = _int(cfg, "num_nextn_predict_layers", "mtp_num_hidden_layers", "num_mtp_layers", "mtp_num_layers",
               default=0) or 0
    mtp_style = None
    if mtp:
        mtp_style = "mtp" if model_type.startswith(("qwen3_next", "qwen3_5", "mimo")) else "layers"

    qk_norm = model_type.startswith(("qwen3", "olmo2", "gemma3")) or bool(cfg.get("use_qk_norm")) \
        or bool(cfg.get("qk_norm"))
    return Arch(
        model_type=model_type, vocab=vocab, hidden=hidden, layers=n_layers, heads=heads, kv_heads=kv_heads,
        head_dim=head_dim, intermediate=inter, tied=tied, layer_kinds=kinds,
        attention_bias=bool(cfg.get("attention_bias")),
        qkv_bias=model_type in ("qwen2", "qwen2_moe") or bool(cfg.get("qkv_bias")),
        qk_norm=qk_norm and not mla,
        gated_q=model_type.startswith(("qwen3_next", "qwen3_5")),
        sliding_window=sliding, chunk_size=chunk,
        mla=mla, q_lora_rank=_int(cfg, "q_lora_rank"), kv_lora_rank=_int(cfg, "kv_lora_rank", default=0),
        qk_nope_head_dim=_int(cfg, "qk_nope_head_dim", default=0),
        qk_rope_head_dim=_int(cfg, "qk_rope_head_dim", default=0), v_head_dim=_int(cfg, "v_head_dim", default=0),
        experts=n_experts, top_k=top_k, moe_intermediate=moe_inter,
        shared_experts=_int(cfg, "n_shared_experts", "num_shared_experts", default=0) or 0,
        shared_intermediate=_int(cfg, "shared_expert_intermediate_size", default=0) or 0,
        moe_layers=tuple(moe_layers), router_bias=cfg.get("topk_method") == "noaux_tc",
        linear_k_heads=_int(cfg, "linear_num_key_heads", default=0) or 0,
        linear_v_heads=_int(cfg, "linear_num_value_heads", default=0) or 0,
        linear_k_dim=_int(cfg, "linear_key_head_dim", default=0) or 0,
        linear_v_dim=_int(cfg, "linear_value_head_dim", default=0) or 0,
        conv_kernel=_int(cfg, "linear_conv_kernel_dim", "conv_kernel", "mamba_d_conv", "d_conv", default=4) or 4,
        mamba_heads=_int(cfg, "mamba_num_heads", "mamba_n_heads", default=0) or 0,
        mamba_head_dim=_int(cfg, "mamba_head_dim", "mamba_d_head", default=0) or 0,
        ssm_state=_int(cfg, "ssm_state_size", "mamba_d_state", "state_size", default=0) or 0,
        mamba_groups=_int(cfg, "n_groups", "mamba_n_groups", default=1) or 1,
        mamba_inner=(_int(cfg, "mamba_num_heads", "mamba_n_heads", default=0) or 0)
        * (_int(cfg, "mamba_head_dim", "mamba_d_head", default=0) or 0),
        mtp_layers=mtp, mtp_style=mtp_style, torch_dtype=dtype,
        quantization=cfg.get("quantization_config") if isinstance(cfg.get("quantization_config"), dict) else None,
        warnings=tuple(warnings),
    )


def _layer_kinds(cfg: dict, n: int, warnings: list[str]) -> tuple[str, ...]:
    """The attention kind of each of the ``n`` layers."""
    types = cfg.get("layer_types") or cfg.get("layers_block_type")
    if isinstance(types, list) and len(types) >= n:
        out = []
        unknown = set()
        for t in types[:n]:
            k = _LAYER_TYPE_NAMES.get(str(t).lower())
            if k is None:
                unknown.add(str(t)[:40])
                k = FULL
            out.append(k)
        if unknown:
            warnings.append(f"unknown layer types {sorted(unknown)} counted as full attention")
        return tuple(out)
    pattern = cfg.get("hybrid_override_pattern")  # Nemotron-H: M = Mamba2, * = attention, - = MLP, E = MoE
    if isinstance(pattern, str) and len(pattern) >= n:
        return tuple({"M": MAMBA, "*": FULL}.get(c, NONE) for c in pattern[:n])
    interval = cfg.get("full_attention_interval")  # Qwen3-Next without layer_types
    if isinstance(interval, int) and interval > 0 and cfg.get("linear_num_value_heads"):
        return tuple(FULL if (i + 1) % interval == 0 else LINEAR for i in range(n))
    if cfg.get("attn_layer_period") and cfg.get("mamba_d_state") is not None:  # Jamba-style
        period, offset = int(cfg["attn_layer_period"]), int(cfg.get("attn_layer_offset") or 0)
        return tuple(FULL if i % period == offset else MAMBA for i in range(n))
    window = cfg.get("sliding_window")
    if cfg.get("use_sliding_window") is False or not window:
        return (FULL,) * n
    if cfg.get("use_sliding_window") and cfg.get("max_window_layers") is not None:  # Qwen2: the first N are full
        full = int(cfg["max_window_layers"])
        return tuple(FULL if i < full else SLIDING for i in range(n))
    pattern_n = cfg.get("sliding_window_pattern")  # Gemma3 (older configs): every Nth layer is global
    if isinstance(pattern_n, int) and pattern_n > 0:
        return tuple(FULL if (i + 1) % pattern_n == 0 else SLIDING for i in range(n))
    if str(cfg.get("model_type", "")).startswith("gemma2"):
        return tuple(SLIDING if i % 2 == 0 else FULL for i in range(n))
    return (SLIDING,) * n  # Mistral-7B-v0.1 style: a window on every layer
