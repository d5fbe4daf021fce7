"""Parameter counts from a Hugging Face ``config.json``, without downloading weights.

Covers the decoder families LLM serving mostly sees: dense Llama / Mistral / Qwen2 /
Qwen3-style (GQA attention, gated MLP, optional attention bias, tied or untied
embeddings), MoE (Mixtral ``num_local_experts``, Qwen2/3-MoE ``num_experts`` with
optional shared expert, DeepSeek-V2/V3 ``n_routed_experts`` + ``n_shared_experts`` with
MLA attention and leading dense layers). Multimodal configs are counted for their
``text_config`` (vision towers do not run in a decode step).

What a decode step reads (the roofline's weight bytes)::

    params read per step = active non-embedding parameters + lm_head
                           (with batch > 1: the experts the batch routes to)

The embedding table is a gather of a few rows, not a full read; a tied lm_head still
reads the whole vocab x hidden matrix, so ``lm_head`` is counted either way.

>>> cfg = {"model_type": "llama", "vocab_size": 128256, "hidden_size": 4096,
...        "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
...        "num_key_value_heads": 8, "tie_word_embeddings": False}
>>> count_params(cfg).total
8030261248
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tracekit.errors import TracekitError

_KNOWN_TYPES = {
    "llama", "mistral", "qwen2", "qwen3", "mixtral", "qwen2_moe", "qwen3_moe",
    "deepseek_v2", "deepseek_v3", "olmoe", "granite", "phi3", "yi", "internlm2",
}


@dataclass(frozen=True)
class ModelParams:
    """Parameter counts (elements, not bytes) of a decoder-only language model."""

    model_type: str
    total: int                   # every parameter, embedding included (tied lm_head once)
    active_per_token: int        # parameters one token's forward uses (MoE: top-k + shared experts)
    embedding: int               # token embedding table
    lm_head: int                 # output projection (vocab x hidden, read every step even when tied)
    tied: bool
    layers: int
    moe_layers: int = 0
    experts: int = 0             # routed experts per MoE layer
    experts_per_token: int = 0
    expert_params: int = 0       # parameters of ONE routed expert
    kv_elements_per_token: int = 0   # K and V cache elements per token, all layers
    warnings: tuple[str, ...] = field(default=())

    @property
    def non_embedding(self) -> int:
        """Total minus the embedding table and a separate lm_head."""
        return self.total - self.embedding - (0 if self.tied else self.lm_head)

    @property
    def active_non_embedding(self) -> int:
        return self.active_per_token - self.embedding - (0 if self.tied else self.lm_head)

    def params_per_step(self, batch: int = 1) -> float:
        """Parameters a decode step of ``batch`` sequences reads: active non-embedding
        + lm_head; for MoE the routed experts are the expected number of DISTINCT
        experts ``batch`` tokens pick under uniform routing, E(1 - (1 - k/E)^batch).

        >>> m = ModelParams("x", 10, 10, 1, 1, True, 1)
        >>> m.params_per_step()
        10.0
        """
        base = self.active_non_embedding + self.lm_head
        if self.moe_layers and self.experts and batch > 1:
            k, e = self.experts_per_token, self.experts
            distinct = e * (1 - (1 - k / e) ** batch)
            base += self.moe_layers * self.expert_params * (distinct - k)
        return float(base)

    def kv_bytes_per_token(self, kv_dtype_bytes: float = 2) -> int:
        return int(round(self.kv_elements_per_token * kv_dtype_bytes))

    def to_dict(self) -> dict:
        d = asdict(self)
        d["warnings"] = list(self.warnings)
        d["non_embedding"] = self.non_embedding
        d["active_non_embedding"] = self.active_non_embedding
        d["params_per_step"] = int(self.params_per_step())
        return d


def load_config(path: str | Path) -> dict:
    """Read a ``config.json``; ``TracekitError`` with a one-line reason when it cannot."""
    try:
        cfg = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError as e:
        raise TracekitError(f"model config {path} does not exist") from e
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TracekitError(f"cannot read model config {path}: {e}") from e
    if not isinstance(cfg, dict):
        raise TracekitError(f"model config {path} is not a JSON object")
    return cfg


def from_config_file(path: str | Path) -> ModelParams:
    """``count_params(load_config(path))``."""
    return count_params(load_config(path))


def _get(cfg: dict, *keys: str, default=None):
    for k in keys:
        if cfg.get(k) is not None:
            return cfg[k]
    return default


def count_params(cfg: dict) -> ModelParams:
    """Count a Hugging Face config's parameters. Raises ``TracekitError`` when a size
    the count needs is missing."""
    warnings: list[str] = []
    if isinstance(cfg.get("text_config"), dict):
        outer_type = cfg.get("model_type")
        cfg = {**cfg["text_config"]}
        warnings.append(f"counted the language model of {outer_type or 'a multimodal model'} (text_config); "
                        "vision/audio towers are not counted")
    model_type = str(cfg.get("model_type") or "unknown")
    try:
        vocab = int(cfg["vocab_size"])
        hidden = int(cfg["hidden_size"])
        n_layers = int(_get(cfg, "num_hidden_layers", "n_layer", "num_layers"))
        heads = int(_get(cfg, "num_attention_heads", "n_head"))
    except (KeyError, TypeError, ValueError) as e:
        raise TracekitError(
            f"model config lacks {e}: need vocab_size, hidden_size, num_hidden_layers, num_attention_heads"
        ) from e
    if model_type not in _KNOWN_TYPES:
        warnings.append(f"model_type {model_type!r} is not one tracekit knows: counted as a Llama-style decoder")
    kv_heads = int(_get(cfg, "num_key_value_heads", default=heads))
    head_dim = int(_get(cfg, "head_dim", default=hidden // heads))
    tied = bool(cfg.get("tie_word_embeddings", False))
    inter = _get(cfg, "intermediate_size", "ffn_dim")

    # ---- attention, per layer
    if cfg.get("kv_lora_rank"):  # DeepSeek MLA
        q_lora = cfg.get("q_lora_rank")
        nope, rope = int(cfg["qk_nope_head_dim"]), int(cfg["qk_rope_head_dim"])
        v_dim, kv_lora = int(cfg["v_head_dim"]), int(cfg["kv_lora_rank"])
        q = (hidden * q_lora + q_lora + q_lora * heads * (nope + rope)) if q_lora else hidden * heads * (nope + rope)
        kv = hidden * (kv_lora + rope) + kv_lora + kv_lora * heads * (nope + v_dim)
        attn = q + kv + heads * v_dim * hidden
        if cfg.get("attention_bias"):
            attn += hidden
        kv_elems = n_layers * (kv_lora + rope)  # the compressed latent + rope key is what is cached
    else:
        q_out, kv_out = heads * head_dim, kv_heads * head_dim
        attn = hidden * q_out + 2 * hidden * kv_out + q_out * hidden
        qkv_bias = model_type in ("qwen2", "qwen2_moe") or bool(cfg.get("attention_bias")) or bool(cfg.get("qkv_bias"))
        if qkv_bias:
            attn += q_out + 2 * kv_out
        if cfg.get("attention_bias"):  # Llama-style attention_bias covers o_proj too
            attn += hidden
        if model_type.startswith("qwen3"):
            attn += 2 * head_dim  # q_norm, k_norm
        kv_elems = n_layers * 2 * kv_out
    norms = 2 * hidden  # input_layernorm + post_attention_layernorm

    # ---- MLP / MoE, per layer
    n_experts = int(_get(cfg, "num_local_experts", "num_experts", "n_routed_experts", default=0) or 0)
    top_k = int(_get(cfg, "num_experts_per_tok", "moe_topk", default=0) or 0)
    moe_inter = _get(cfg, "moe_intermediate_size", default=inter)
    if inter is None and not n_experts:
        raise TracekitError("model config lacks intermediate_size")
    dense_mlp = 3 * hidden * int(inter) if inter is not None else 0

    def is_moe_layer(i: int) -> bool:
        if not n_experts:
            return False
        if "first_k_dense_replace" in cfg:  # DeepSeek
            return i >= int(cfg["first_k_dense_replace"]) and i % int(cfg.get("moe_layer_freq", 1)) == 0
        if i in (cfg.get("mlp_only_layers") or []):  # Qwen-MoE
            return False
        step = int(cfg.get("decoder_sparse_step", 1) or 1)
        return (i + 1) % step == 0

    expert = 3 * hidden * int(moe_inter) if n_experts else 0
    router = hidden * n_experts
    if cfg.get("topk_method") == "noaux_tc":
        router += n_experts  # e_score_correction_bias
    shared = 0
    if cfg.get("n_shared_experts"):
        shared = int(cfg["n_shared_experts"]) * 3 * hidden * int(moe_inter)
    if cfg.get("shared_expert_intermediate_size"):
        shared += 3 * hidden * int(cfg["shared_expert_intermediate_size"]) + hidden  # + shared_expert_gate
    if n_experts and not top_k:
        raise TracekitError("MoE model config lacks num_experts_per_tok")

    total = active = 0
    moe_layers = 0
    for i in range(n_layers):
        base = attn + norms
        if is_moe_layer(i):
            moe_layers += 1
            total += base + router + shared + n_experts * expert
            active += base + router + shared + top_k * expert
        else:
            total += base + dense_mlp
            active += base + dense_mlp
    embedding = vocab * hidden
    lm_head = vocab * hidden
    final_norm = hidden
    head_total = embedding + final_norm + (0 if tied else lm_head)
    return ModelParams(
        model_type=model_type,
        total=int(total + head_total),
        active_per_token=int(active + head_total),
        embedding=embedding,
        lm_head=lm_head,
        tied=tied,
        layers=n_layers,
        moe_layers=moe_layers,
        experts=n_experts,
        experts_per_token=top_k,
        expert_params=expert,
        kv_elements_per_token=int(kv_elems),
        warnings=tuple(warnings),
    )
