"""The tensors a checkpoint of this config would store, named as Hugging Face names them.

With only a ``config.json`` the weight bytes come from these synthesized tensors, so a
bare config and a real checkpoint go through the same per-tensor rules (which tensors a
decode step reads, which are split by tensor parallelism). Shapes are ``[out, in]`` as in
HF checkpoints. Covered: Llama / Mistral / Qwen2 / Qwen3 (GQA, gated MLP, biases, q/k
norms), MoE (Mixtral, Qwen2/3-MoE with or without a shared expert, DeepSeek-V2/V3 with
MLA and leading dense layers), Qwen3-Next (gated delta-net linear attention) and MTP
layers (DeepSeek ``model.layers.N``, Qwen3-Next ``mtp.*``).

Element sizes: ``dtype`` given -> every tensor at that dtype (the ``--dtype`` of
``ceiling``); else the config's ``torch_dtype``, with FP8 (block or per-tensor scales)
or 4-bit GPTQ/AWQ packing where ``quantization_config`` says so.
"""

from __future__ import annotations

import math

from tracekit.errors import BadModelConfig, BadOptionValue
from tracekit.model.arch import FULL, LINEAR, MAMBA, NONE, Arch
from tracekit.model.safetensors import DTYPE_BITS, TensorInfo
from tracekit.model.units import dtype_bits, dtype_key

# --dtype names -> the dtype name the synthesized tensors carry (safetensors-like; int4/fp4 have none); their
# sizes come from tracekit.model.units.DTYPE_BITS, the one table.
DTYPE_ALIASES: dict[str, str] = {
    "bf16": "BF16", "bfloat16": "BF16", "fp16": "F16", "float16": "F16", "half": "F16", "fp32": "F32",
    "float32": "F32", "float": "F32", "fp8": "F8_E4M3", "float8_e4m3fn": "F8_E4M3", "int8": "I8",
    "int4": "int4", "fp4": "fp4", "mxfp4": "fp4", "nvfp4": "fp4",
}


def _dtype(name: str) -> tuple[str, float]:
    key = dtype_key(name)
    if key not in DTYPE_ALIASES:
        raise BadOptionValue(f"unknown dtype {name!r}; known: bf16, fp16, fp32, fp8, int8, int4")
    return DTYPE_ALIASES[key], dtype_bits(key)


def _layer_tensors(a: Arch, prefix: str, i: int, kind: str, moe: bool) -> list[tuple[str, tuple, bool]]:
    """(name, shape, quantizable) of one decoder layer."""
    h = a.hidden
    out: list[tuple[str, tuple, bool]] = []

    def lin(name, o, n, bias=False):
        out.append((f"{name}.weight", (o, n), True))
        if bias:
            out.append((f"{name}.bias", (o,), False))

    def vec(name, n):
        out.append((name, (n,), False))

    p = f"{prefix}{i}."
    if kind == FULL or kind not in (LINEAR, MAMBA, NONE):
        if a.mla:
            qk = a.qk_nope_head_dim + a.qk_rope_head_dim
            if a.q_lora_rank:
                lin(p + "self_attn.q_a_proj", a.q_lora_rank, h)
                vec(p + "self_attn.q_a_layernorm.weight", a.q_lora_rank)
                lin(p + "self_attn.q_b_proj", a.heads * qk, a.q_lora_rank)
            else:
                lin(p + "self_attn.q_proj", a.heads * qk, h)
            lin(p + "self_attn.kv_a_proj_with_mqa", a.kv_lora_rank + a.qk_rope_head_dim, h)
            vec(p + "self_attn.kv_a_layernorm.weight", a.kv_lora_rank)
            lin(p + "self_attn.kv_b_proj", a.heads * (a.qk_nope_head_dim + a.v_head_dim), a.kv_lora_rank)
            lin(p + "self_attn.o_proj", h, a.heads * a.v_head_dim, bias=a.attention_bias)
        else:
            q_out, kv_out = a.heads * a.head_dim, a.kv_heads * a.head_dim
            qkv_bias = a.qkv_bias or a.attention_bias
            lin(p + "self_attn.q_proj", q_out * (2 if a.gated_q else 1), h, bias=qkv_bias)
            lin(p + "self_attn.k_proj", kv_out, h, bias=qkv_bias)
            lin(p + "self_attn.v_proj", kv_out, h, bias=qkv_bias)
            lin(p + "self_attn.o_proj", h, q_out, bias=a.attention_bias)
            if a.qk_norm:
                vec(p + "self_attn.q_norm.weight", a.head_dim)
                vec(p + "self_attn.k_norm.weight", a.head_dim)
    elif kind == LINEAR:
        key_dim, value_dim = a.linear_k_heads * a.linear_k_dim, a.linear_v_heads * a.linear_v_dim
        conv_dim = 2 * key_dim + value_dim
        lin(p + "linear_attn.in_proj_qkvz", 2 * key_dim + 2 * value_dim, h)
        lin(p + "linear_attn.in_proj_ba", 2 * a.linear_v_heads, h)
        out.append((p + "linear_attn.conv1d.weight", (conv_dim, 1, a.conv_kernel), False))
        vec(p + "linear_attn.dt_bias", a.linear_v_heads)
        vec(p + "linear_attn.A_log", a.linear_v_heads)
        vec(p + "linear_attn.norm.weight", a.linear_v_dim)
        lin(p + "linear_attn.out_proj", h, value_dim)
    vec(p + "input_layernorm.weight", h)
    vec(p + "post_attention_layernorm.weight", h)

    if moe:
        mixtral = a.model_type.startswith("mixtral")
        block = p + ("block_sparse_moe." if mixtral else "mlp.")
        out.append((block + "gate.weight", (a.experts, h), False))
        if a.router_bias:
            out.append((block + "gate.e_score_correction_bias", (a.experts,), False))
        for j in range(a.experts):
            e = f"{block}experts.{j}."
            if mixtral:
                lin(e + "w1", a.moe_intermediate, h)
                lin(e + "w2", h, a.moe_intermediate)
                lin(e + "w3", a.moe_intermediate, h)
            else:
                lin(e + "gate_proj", a.moe_intermediate, h)
                lin(e + "up_proj", a.moe_intermediate, h)
                lin(e + "down_proj", h, a.moe_intermediate)
        if a.shared_experts:
            w = a.shared_experts * a.moe_intermediate
            lin(block + "shared_experts.gate_proj", w, h)
            lin(block + "shared_experts.up_proj", w, h)
            lin(block + "shared_experts.down_proj", h, w)
        if a.shared_intermediate:
            lin(block + "shared_expert.gate_proj", a.shared_intermediate, h)
            lin(block + "shared_expert.up_proj", a.shared_intermediate, h)
            lin(block + "shared_expert.down_proj", h, a.shared_intermediate)
            out.append((block + "shared_expert_gate.weight", (1, h), False))
    else:
        if not a.intermediate:
            raise BadModelConfig("model config lacks intermediate_size (needed for the dense layers)")
        lin(p + "mlp.gate_proj", a.intermediate, h)
        lin(p + "mlp.up_proj", a.intermediate, h)
        lin(p + "mlp.down_proj", h, a.intermediate)
    return out


def tensor_shapes(a: Arch, *, include_mtp: bool = True) -> list[tuple[str, tuple, bool]]:
    """``(name, shape, quantizable)`` of every tensor a checkpoint of ``a`` stores."""
    if any(k in (MAMBA, NONE) for k in a.layer_kinds):
        raise BadModelConfig("weights of hybrid Mamba models are not modelled from config.json alone: point --model "
                            "at the checkpoint directory (its safetensors headers give the bytes)")
    h = a.hidden
    out: list[tuple[str, tuple, bool]] = [("model.embed_tokens.weight", (a.vocab, h), False)]
    moe = set(a.moe_layers)
    for i in range(a.layers):
        out += _layer_tensors(a, "model.layers.", i, a.layer_kinds[i], i in moe)
    out.append(("model.norm.weight", (h,), False))
    if not a.tied:
        out.append(("lm_head.weight", (a.vocab, h), False))
    if include_mtp and a.mtp_layers:
        mtp_moe = bool(a.experts)
        for m in range(a.mtp_layers):
            if a.mtp_style == "mtp":
                if m == 0:
                    out += [("mtp.fc.weight", (h, 2 * h), False), ("mtp.pre_fc_norm_embedding.weight", (h,), False),
                            ("mtp.pre_fc_norm_hidden.weight", (h,), False), ("mtp.norm.weight", (h,), False)]
                out += _layer_tensors(a, "mtp.layers.", m, FULL, mtp_moe)
            else:
                idx = a.layers + m
                p = f"model.layers.{idx}."
                out += [(p + "embed_tokens.weight", (a.vocab, h), False), (p + "enorm.weight", (h,), False),
                        (p + "hnorm.weight", (h,), False), (p + "eh_proj.weight", (h, 2 * h), False),
                        (p + "shared_head.norm.weight", (h,), False),
                        (p + "shared_head.head.weight", (a.vocab, h), False)]
                out += _layer_tensors(a, "model.layers.", idx, FULL, mtp_moe)
    return out


def _excluded(name: str, skip: list[str]) -> bool:
    module = name.rsplit(".", 1)[0]
    return any(module == s or module.startswith(s + ".") or module.endswith("." + s) for s in skip)


def synthesize(a: Arch, dtype: str | None = None) -> tuple[list[TensorInfo], list[str]]:
    """The checkpoint's tensors with their stored dtype and bytes, and notes on what was assumed."""
    shapes = tensor_shapes(a)
    notes: list[str] = []
    if dtype is not None:
        name, bits = _dtype(dtype)
        notes.append(f"weights from config.json: parameter count x {dtype} (no checkpoint headers read)")
        return [TensorInfo(n, name, s, math.ceil(math.prod(s) * bits / 8)) for n, s, _ in shapes], notes
    base, base_bits = _dtype(a.torch_dtype) if dtype_key(a.torch_dtype) in DTYPE_ALIASES \
        else ("BF16", 16)
    q = a.quantization or {}
    method = str(q.get("quant_method") or "").lower()
    skip = [str(s) for s in (q.get("modules_to_not_convert") or q.get("ignored_layers") or q.get("ignore") or [])]
    out: list[TensorInfo] = []

    def plain(n, s, dt=base, bits=base_bits):
        out.append(TensorInfo(n, dt, s, math.ceil(math.prod(s) * bits / 8)))

    if method == "fp8":
        block = q.get("weight_block_size")
        notes.append("weights from config.json: FP8 (e4m3) linear layers with "
                     + (f"{block[0]}x{block[1]} block scales" if block else "per-tensor scales")
                     + f" as quantization_config says, the rest {a.torch_dtype}")
        for n, s, quant in shapes:
            if quant and not _excluded(n, skip):
                plain(n, s, "F8_E4M3", 8)
                if block:
                    sc = (math.ceil(s[0] / block[0]), math.ceil(s[1] / block[1]))
                    plain(n.removesuffix(".weight") + ".weight_scale_inv", sc, "F32", 32)
                else:
                    plain(n.removesuffix(".weight") + ".weight_scale", (), "F32", 32)
            elif n.endswith("e_score_correction_bias"):
                plain(n, s, "F32", 32)
            else:
                plain(n, s)
        return out, notes
    if method in ("gptq", "awq", "auto-round", "autoround") and q.get("bits"):
        bits, group = int(q["bits"]), int(q.get("group_size") or 128)
        if group <= 0:
            group = None
        notes.append(f"weights from config.json: {bits}-bit {method} packed linear layers (group size "
                     f"{group or 'per-channel'}, fp16 scales, packed zeros) as quantization_config says, "
                     f"the rest {a.torch_dtype}")
        pack = 32 // bits
        for n, s, quant in shapes:
            if quant and not _excluded(n, skip) and len(s) == 2:
                o, i = s
                m = n.removesuffix(".weight")
                groups = math.ceil(i / group) if group else 1
                if method == "awq":
                    plain(m + ".qweight", (i, math.ceil(o / pack)), "I32", 32)
                else:
                    plain(m + ".qweight", (math.ceil(i / pack), o), "I32", 32)
                plain(m + ".qzeros", (groups, math.ceil(o / pack)), "I32", 32)
                plain(m + ".scales", (groups, o), "F16", 16)
                if method != "awq":
                    plain(m + ".g_idx", (i,), "I32", 32)
            else:
                plain(n, s)
        return out, notes
    if method:
        notes.append(f"quantization {method!r} is not modelled from config.json: weights counted at "
                     f"{a.torch_dtype}; point --model at the checkpoint (safetensors headers) or pass --dtype")
    else:
        notes.append(f"weights from config.json: parameter count x {a.torch_dtype} (no checkpoint headers read)")
    for n, s, _ in shapes:
        plain(n, s)
    return out, notes


assert all(v in DTYPE_BITS or v in ("int4", "fp4") for v in DTYPE_ALIASES.values())
