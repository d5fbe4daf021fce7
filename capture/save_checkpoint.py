"""Save the spec workload's target + MTP draft as a Hugging Face-style checkpoint (bf16 and fp8), and
torch's own count of the bytes one decode step reads. No profiler.

    python capture/save_checkpoint.py --size small --spec 3 --out DIR [--device cuda] [--shard-mb 300]

Writes, for each of ``bf16`` and ``fp8``:

* ``DIR/<variant>/config.json`` -- a Llama config plus ``num_nextn_predict_layers: 1`` (fp8: a
  ``quantization_config`` as DeepSeek-V3's and Qwen3-FP8's: ``quant_method fp8``, ``fmt e4m3``,
  ``activation_scheme dynamic``, ``weight_block_size [128, 128]``);
* ``model-0000i-of-0000N.safetensors`` shards and ``model.safetensors.index.json`` (``metadata.total_size``
  + ``weight_map``), as ``save_pretrained`` shards them;
* ``DIR/headers/<variant>/``: config.json, the index, each shard's header (the 8-byte little-endian
  length + the JSON header: ``<shard>.header``), ``sizes.json`` (each shard's true size) and
  ``torch_counts.json`` -- what comes back from the GPU host (the weights stay there).

Tensor names: the Hugging Face Llama names (``model.layers.<i>.self_attn.q_proj.weight``, ...; the fused
qkv and gate_up of ``llama_torch`` split back), and the MTP/NEXTN layer under DeepSeek-V3's names at
index ``num_hidden_layers`` (``model.layers.<L>.{embed_tokens,enorm,hnorm,eh_proj,shared_head.norm,
shared_head.head}`` + a decoder layer), where SGLang's ``deepseek_nextn.py`` loads it; DeepSeek-V3 stores
its own copies of the embedding and the lm_head there, and so do we. fp8: every attention and MLP
projection (target and MTP layer) as float8_e4m3fn with a float32 ``<module>.weight_scale_inv`` per
128x128 block (dequantised weight = fp8 value x scale_inv); embedding, lm_head, norms and ``eh_proj``
stay bf16 (SGLang's ``eh_proj`` is a plain ``nn.Linear``).

``torch_counts.json`` = every tensor's dtype, shape and bytes (``numel x element_size``) and the bytes
one decode step reads: the target's layers + final norm + lm_head (the embedding only when tied, as the
lm_head), and the draft's tensors per forward (its layer, eh_proj, norms and shared_head.head; not its
embedding copy) x draft forwards per step.
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import sys

import llama_torch as lt

FP8_QUANT = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
PROJ = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
        "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


def layer_tensors(cfg, layer, prefix: str) -> dict:
    """HF names of one decoder layer (fused tensors split back)."""
    D = cfg.head_dim
    q, k, v = layer.qkv.split([cfg.heads * D, cfg.kv_heads * D, cfg.kv_heads * D], dim=0)
    gate, up = layer.gate_up.split([cfg.ffn, cfg.ffn], dim=0)
    return {
        f"{prefix}.input_layernorm.weight": layer.input_norm,
        f"{prefix}.self_attn.q_proj.weight": q, f"{prefix}.self_attn.k_proj.weight": k,
        f"{prefix}.self_attn.v_proj.weight": v, f"{prefix}.self_attn.o_proj.weight": layer.o,
        f"{prefix}.post_attention_layernorm.weight": layer.post_norm,
        f"{prefix}.mlp.gate_proj.weight": gate, f"{prefix}.mlp.up_proj.weight": up,
        f"{prefix}.mlp.down_proj.weight": layer.down,
    }


def bf16_state(target, draft) -> dict:
    cfg = target.cfg
    sd = {"model.embed_tokens.weight": target.embed}
    for i, layer in enumerate(target.layers):
        sd.update(layer_tensors(cfg, layer, f"model.layers.{i}"))
    sd["model.norm.weight"] = target.norm
    if not cfg.tied:
        sd["lm_head.weight"] = target.lm_head
    m = f"model.layers.{cfg.layers}"
    sd[f"{m}.embed_tokens.weight"] = target.embed          # DeepSeek-V3 keeps its own copies here
    sd[f"{m}.enorm.weight"] = draft.enorm
    sd[f"{m}.hnorm.weight"] = draft.hnorm
    sd[f"{m}.eh_proj.weight"] = draft.eh_proj
    sd.update(layer_tensors(cfg, draft.layer, m))
    sd[f"{m}.shared_head.norm.weight"] = draft.shared_head_norm
    sd[f"{m}.shared_head.head.weight"] = target.lm_head
    return {k: v.detach().contiguous().cpu().clone() for k, v in sd.items()}


def quantize_block_fp8(w, block: int = 128):
    """(float8_e4m3fn weight, float32 scale_inv [ceil(out/128), ceil(in/128)]): w ~= q x scale_inv per block."""
    import torch

    out_f, in_f = w.shape
    ob, ib = -(-out_f // block), -(-in_f // block)
    pad = torch.zeros(ob * block, ib * block, dtype=torch.float32)
    pad[:out_f, :in_f] = w.float()
    blocks = pad.view(ob, block, ib, block)
    amax = blocks.abs().amax(dim=(1, 3)).clamp(min=1e-12)
    scale_inv = amax / 448.0
    q = (blocks / scale_inv.view(ob, 1, ib, 1)).clamp(-448.0, 448.0).view(ob * block, ib * block)
    return q[:out_f, :in_f].contiguous().to(torch.float8_e4m3fn), scale_inv.contiguous()


def fp8_state(sd: dict) -> dict:
    out = {}
    for name, t in sd.items():
        mod = name[: -len(".weight")] if name.endswith(".weight") else None
        if mod and any(mod.endswith(p) for p in PROJ):
            q, s = quantize_block_fp8(t)
            out[name] = q
            out[f"{mod}.weight_scale_inv"] = s
        else:
            out[name] = t
    return out


def nbytes(t) -> int:
    return int(t.numel() * t.element_size())


def step_read(sd: dict, cfg, draft_forwards: int) -> dict:
    """Which tensors one decode step reads, and torch's byte count of them."""
    mtp = f"model.layers.{cfg.layers}."
    target, draft = {}, {}
    for name, t in sd.items():
        if name.startswith(mtp):
            if not name.endswith("embed_tokens.weight"):
                draft[name] = nbytes(t)
        elif name == "model.embed_tokens.weight":
            if cfg.tied:
                target[name] = nbytes(t)        # read as the lm_head
        else:
            target[name] = nbytes(t)
    tb, dbf = sum(target.values()), sum(draft.values())
    return {"target_bytes": tb, "target_tensors": len(target),
            "draft_bytes_per_forward": dbf, "draft_tensors": len(draft),
            "draft_forwards_per_step": draft_forwards,
            "draft_bytes_per_step": dbf * draft_forwards,
            "bytes_per_step": tb + dbf * draft_forwards,
            "rule": "target: every model.layers.<i<L>.* tensor + model.norm + lm_head (embed_tokens only when tied, "
                    "as the lm_head); draft: every model.layers.<L>.* tensor except its embed_tokens copy, "
                    "x draft forwards per step"}


def save_sharded(sd: dict, out_dir: str, shard_bytes: int) -> list:
    from safetensors.torch import save_file

    os.makedirs(out_dir, exist_ok=True)
    shards, cur, size = [], {}, 0
    for name, t in sd.items():
        b = nbytes(t)
        if cur and size + b > shard_bytes:
            shards.append(cur)
            cur, size = {}, 0
        cur[name] = t
        size += b
    if cur:
        shards.append(cur)
    n = len(shards)
    weight_map, files = {}, []
    for i, shard in enumerate(shards, 1):
        fname = f"model-{i:05d}-of-{n:05d}.safetensors"
        save_file(shard, os.path.join(out_dir, fname), metadata={"format": "pt"})
        files.append(fname)
        for name in shard:
            weight_map[name] = fname
    index = {"metadata": {"total_size": sum(nbytes(t) for t in sd.values())}, "weight_map": weight_map}
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f, indent=2)
        f.write("\n")
    return files


def header_bytes(path: str) -> bytes:
    with open(path, "rb") as f:
        head = f.read(8)
        (n,) = struct.unpack("<Q", head)
        return head + f.read(n)


def write_variant(sd: dict, cfg_json: dict, out: str, variant: str, shard_bytes: int, counts: dict) -> None:
    d = os.path.join(out, variant)
    files = save_sharded(sd, d, shard_bytes)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg_json, f, indent=2)
        f.write("\n")
    h = os.path.join(out, "headers", variant)
    os.makedirs(h, exist_ok=True)
    sizes = {}
    for fname in files:
        p = os.path.join(d, fname)
        sizes[fname] = os.path.getsize(p)
        with open(os.path.join(h, fname + ".header"), "wb") as f:
            f.write(header_bytes(p))
    for name in ("config.json", "model.safetensors.index.json"):
        with open(os.path.join(d, name), "rb") as src, open(os.path.join(h, name), "wb") as dst:
            dst.write(src.read())
    for name, obj in (("sizes.json", sizes), ("torch_counts.json", counts)):
        with open(os.path.join(h, name), "w") as f:
            json.dump(obj, f, indent=2, sort_keys=True)
            f.write("\n")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", choices=sorted(lt.SIZES), default="small")
    p.add_argument("--spec", type=int, default=3, help="K of the spec workload: K + 1 draft forwards per step")
    p.add_argument("--out", required=True)
    p.add_argument("--device", default="cpu")
    p.add_argument("--shard-mb", type=float, default=300.0, help="largest shard, MB (1e6 bytes)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    import torch

    cfg = lt.config(args.size)
    target = lt.Target(cfg, torch.device(args.device), torch.bfloat16, seed=args.seed)
    draft = lt.MTPDraft(target, seed=args.seed + 1)
    sd = bf16_state(target, draft)
    del target, draft
    cfg_json = dict(cfg.hf_config(), num_nextn_predict_layers=1)
    shard_bytes = int(args.shard_mb * 1e6)
    forwards = args.spec + 1
    for variant, state, cj in (("bf16", sd, cfg_json),
                               ("fp8", None, dict(cfg_json, quantization_config=FP8_QUANT))):
        state = state if state is not None else fp8_state(sd)
        counts = {
            "variant": variant, "size": args.size, "torch": torch.__version__,
            "tensors": {k: {"dtype": str(t.dtype).replace("torch.", ""), "shape": list(t.shape), "bytes": nbytes(t)}
                        for k, t in state.items()},
            "total_bytes": sum(nbytes(t) for t in state.values()),
            "step_read": step_read(state, cfg, forwards),
            "spec_k": args.spec,
            "kv_bytes_per_token": cfg.kv_bytes_per_token(2),
        }
        write_variant(state, cj, args.out, variant, shard_bytes, counts)
        sr = counts["step_read"]
        print(f"{variant}: {len(state)} tensors, {counts['total_bytes']:,} bytes; a step reads target "
              f"{sr['target_bytes']:,} + draft {sr['draft_bytes_per_forward']:,} x {forwards} "
              f"= {sr['bytes_per_step']:,}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
