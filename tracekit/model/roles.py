"""What each stored tensor is, from its Hugging Face name: which part of the model, whether a
decode step reads it, and how tensor/expert parallelism splits it.

Rules (``split``):

- ``"tp"``: column- or row-parallel linear layers (q/o/gate/up/down projections, MLA's
  q_b/kv_b, linear-attention projections, the lm_head as a vocab-parallel head), their
  quantization scales and column-parallel biases: divided by ``tp``.
- ``"kv"``: k_proj / v_proj: divided by ``min(tp, kv_heads)`` (KV heads are replicated when
  ``tp`` exceeds them). ``"qkv"``: a fused qkv projection, its q rows ``/ tp`` and its k/v
  rows ``/ min(tp, kv_heads)``.
- ``"whole"``: replicated on every GPU: norms, the MoE router and its bias, MLA's
  q_a/kv_a projections (replicated linears in SGLang and vLLM), row-parallel biases,
  MTP glue (eh_proj, enorm/hnorm, Qwen3-Next's mtp.fc).
- ``"expert"``: routed experts (``experts.N.*`` or a fused ``experts.*`` tensor holding all
  of them): a step reads the expected distinct experts, spread over ``max(tp, ep)`` GPUs.
- ``"none"``: not read by a decode step: the token embedding (a gather of a few rows; a
  tied lm_head is counted through the embedding instead), vision/audio towers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_VISION = {"visual", "vision_tower", "vision_model", "vision_encoder", "multi_modal_projector", "mm_projector",
           "audio_tower", "audio_encoder", "vision", "image_newline", "vit", "patch_embed", "mlp1"}
_EMBED = {"embed_tokens", "wte", "word_embeddings", "tok_embeddings", "embed_in", "embeddings", "embedding"}
_HEAD = {"lm_head", "output", "embed_out"}
_KV = {"k_proj", "v_proj", "wk", "wv", "key", "value"}
_QKV = {"qkv_proj", "query_key_value", "wqkv", "c_attn", "qkv"}
_REPLICATED_ATTN = {"q_a_proj", "kv_a_proj_with_mqa", "fused_qkv_a_proj_with_mqa"}
_DRAFT_GLUE = {"eh_proj", "enorm", "hnorm", "pre_fc_norm_embedding", "pre_fc_norm_hidden"}
_MOE_BLOCK = {"mlp", "block_sparse_moe", "feed_forward", "moe", "ffn"}
_ROW = {"o_proj", "down_proj", "w2", "out_proj", "dense", "wo", "c_proj", "fc2", "dense_4h_to_h"}
_ATTN = {"self_attn", "attention", "attn", "self_attention"}
_LINEAR_ATTN = {"linear_attn", "mixer"}
_SHARED = {"shared_expert", "shared_experts", "shared_mlp"}
_LAYER = re.compile(r"(?:^|\.)(?:layers|h|blocks|layer|decoder_layers)\.(\d+)(?:\.|$)")


@dataclass(frozen=True)
class Role:
    """One tensor's part in a decode step (see the module docstring for ``split``)."""

    group: str          # attention | linear_attention | mlp | experts | shared_experts | router | norms |
                        # lm_head | embedding | draft_glue | vision | other
    split: str          # tp | kv | qkv | whole | expert | none
    layer: int | None
    draft: bool         # an MTP / next-n layer (read only by draft forwards)
    guessed: bool = False  # no rule matched: a 2-D tensor assumed split by tp


def classify(name: str, ndim: int, *, layers: int) -> Role:
    """The role of the tensor called ``name`` (``ndim`` dimensions) in a model of ``layers`` decoder layers.

    A tensor of a layer numbered ``layers`` or more (DeepSeek's ``model.layers.61``) or under
    ``mtp`` / ``mtp_layers`` (Qwen3-Next, MiMo) belongs to an MTP draft layer.
    """
    parts = name.split(".")
    comps = set(parts)
    if comps & _VISION:
        return Role("vision", "none", None, False)
    m = _LAYER.search(name)
    layer = int(m.group(1)) if m else None
    draft = bool(comps & {"mtp", "mtp_layers"}) or (layer is not None and layer >= layers)
    param = parts[-1]
    module = parts[:-1]
    leaf = module[-1] if module else param
    if "experts" in module:  # experts.N.* and fused experts.* tensors (gpt-oss *_blocks, Llama 4 gate_up_proj)
        return Role("experts", "expert", layer, draft)
    if leaf in _EMBED:
        return Role("embedding", "none", layer, draft)
    if (leaf in _HEAD and layer is None) or (leaf == "head" and "shared_head" in comps):
        return Role("lm_head", "tp", layer, draft)
    if comps & _SHARED and leaf != "shared_expert_gate":
        return Role("shared_experts", _row_or_col(leaf, param), layer, draft)
    if (leaf in ("gate", "router") and comps & _MOE_BLOCK) or param == "e_score_correction_bias" \
            or leaf == "shared_expert_gate":
        return Role("router", "whole", layer, draft)
    if leaf in _REPLICATED_ATTN:
        return Role("attention", "whole", layer, draft)
    if leaf in _DRAFT_GLUE or (leaf == "fc" and "mtp" in comps):
        return Role("draft_glue", "whole", layer, draft)
    if "norm" in leaf or leaf.startswith(("ln_", "ln", "layernorm")) or leaf.endswith("_ln"):
        return Role("norms", "whole", layer, draft)
    if comps & _ATTN:
        if leaf in _KV:
            return Role("attention", "kv", layer, draft)
        if leaf in _QKV:
            return Role("attention", "qkv", layer, draft)
        return Role("attention", _row_or_col(leaf, param), layer, draft)
    if comps & _LINEAR_ATTN:
        return Role("linear_attention", _row_or_col(leaf, param), layer, draft)
    if comps & _MOE_BLOCK:
        return Role("mlp", _row_or_col(leaf, param), layer, draft)
    if ndim >= 2:
        return Role("other", "tp", layer, draft, guessed=True)
    return Role("other", "whole", layer, draft)


def _row_or_col(leaf: str, param: str) -> str:
    """Row-parallel layers keep their bias whole on every GPU; everything else of a linear is split."""
    return "whole" if leaf in _ROW and param == "bias" else "tp"
