"""Parameter counts from a Hugging Face ``config.json`` (the older API; :mod:`tracekit.model` is the library).

:func:`count_params` counts the tensors a checkpoint of the config would store
(:func:`tracekit.model.synth.tensor_shapes`, Hugging Face names and shapes), so it and
``tracekit.model.step_bytes`` share one description of the model. MTP (next-n) layers are
not in ``total``: they are the draft's (``tracekit.model.param_counts(...).with_mtp``).

>>> cfg = {"model_type": "llama", "vocab_size": 128256, "hidden_size": 4096,
...        "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
...        "num_key_value_heads": 8, "tie_word_embeddings": False}
>>> count_params(cfg).total
8030261248
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from tracekit.model.arch import arch_from_config, load_config
from tracekit.model.step import expected_experts, param_counts

__all__ = ["ModelParams", "count_params", "from_config_file", "load_config"]


@dataclass(frozen=True)
class ModelParams:
    """Parameter counts (elements, not bytes) of a decoder-only language model."""

    model_type: str
    total: int                   # every parameter, embedding included (tied lm_head once), no MTP layers
    active_per_token: int        # parameters one token's forward uses (MoE: top-k + shared experts)
    embedding: int               # token embedding table
    lm_head: int                 # output projection (vocab x hidden, read every step even when tied)
    tied: bool
    layers: int
    moe_layers: int = 0
    experts: int = 0             # routed experts per MoE layer
    experts_per_token: int = 0
    expert_params: int = 0       # parameters of ONE routed expert
    kv_elements_per_token: int = 0   # K and V cache elements per token, all layers (MLA: the latent)
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
            distinct = expected_experts(self.experts, self.experts_per_token, batch)
            base += self.moe_layers * self.expert_params * (distinct - self.experts_per_token)
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


def from_config_file(path: str | Path) -> ModelParams:
    """``count_params(load_config(path))``."""
    return count_params(load_config(path))


def count_params(cfg: dict) -> ModelParams:
    """Count a Hugging Face config's parameters. Raises ``TracekitError`` when a size the count needs is missing."""
    a = arch_from_config(cfg)
    pc = param_counts(a)
    head = a.vocab * a.hidden
    kv = a.layers * ((a.kv_lora_rank + a.qk_rope_head_dim) if a.mla else 2 * a.kv_heads * a.head_dim)
    return ModelParams(
        model_type=a.model_type, total=pc.total, active_per_token=pc.active_per_token, embedding=pc.embedding,
        lm_head=head, tied=a.tied, layers=a.layers, moe_layers=len(a.moe_layers), experts=a.experts,
        experts_per_token=a.top_k, expert_params=3 * a.hidden * a.moe_intermediate if a.experts else 0,
        kv_elements_per_token=kv, warnings=a.warnings,
    )
