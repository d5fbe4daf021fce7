"""Routed experts for the MoE workload, three ways, all graph-capturable except ``loop``:

* ``grouped_mm`` -- Hugging Face transformers' ``grouped_mm_experts_forward``
  (``transformers/integrations/moe.py``): flatten the top-k expert ids, ``argsort`` them (stable) to group
  the (token, k) rows by expert, gather the rows, ``histc`` + ``cumsum`` for the group offsets (histc rather
  than bincount: no host sync), ``torch._grouped_mm`` for gate|up, SiLU * up, ``torch._grouped_mm`` for down,
  the routing weights, the inverse permutation, ``index_add_`` back to the tokens. On a GPU before SM90 torch's
  grouped GEMM takes a fallback path that syncs (not capturable); on an H200 it is one CUTLASS kernel per GEMM.
* ``triton`` -- vLLM's / SGLang's ``fused_experts`` (``vllm/model_executor/layers/fused_moe/fused_moe.py``):
  ``moe_align_block_size`` (the (token, k) rows sorted by expert, each expert's rows padded to a multiple of
  BLOCK_M, the expert of every block; vLLM has a CUDA kernel for it, here it is torch ops with no host sync),
  ``fused_moe_kernel`` for w13 (each CTA: BLOCK_M rows of ONE expert x a BLOCK_N slice of its weight),
  SiLU-and-mul, ``fused_moe_kernel`` for w2 with the routing weight applied (``MUL_ROUTED_WEIGHT``), and
  ``moe_sum`` (the top-k rows of a token added). The kernel is written from that description (same name, same
  grid and arguments, simplified: no quantisation, no expert parallelism, fixed block sizes).
* ``loop`` -- Hugging Face's eager per-expert loop (the ``Experts.forward`` example in the same file):
  ``one_hot``, the experts that were hit (``nonzero``: a host sync), then per hit expert ``torch.where``, two
  GEMMs and ``index_add_``. Eager only.

Routing (all three): router GEMM ``[tokens, experts]``, softmax, top-k, renormalised to sum 1 (Mixtral /
vLLM ``fused_topk(renormalize=True)``).

Expected distinct experts read per layer and step (uniform routing): ``E * (1 - (1 - k/E)^tokens)``, the
definition ``tracekit/model/step.py`` (``expected_experts``) uses.
"""

from __future__ import annotations

FUSED_MOE_KERNEL = "fused_moe_kernel"
IMPLS = ("grouped_mm", "triton", "loop")


def expected_experts(experts: int, top_k: int, tokens: float) -> float:
    """Expected distinct experts ``tokens`` tokens pick when each picks ``top_k`` of ``experts`` uniformly
    (the same formula as ``tracekit.model.step.expected_experts``; the GPU host has no tracekit)."""
    if experts <= 0 or tokens <= 0:
        return 0.0
    if tokens == 1:
        return float(min(top_k, experts))
    return experts * (1.0 - (1.0 - min(top_k, experts) / experts) ** tokens)


def route(torch, h2, router, top_k: int):
    """Router logits, softmax, top-k, renormalise: (weights [T, k] in h's dtype, ids [T, k] int64)."""
    import torch.nn.functional as F

    logits = F.linear(h2, router)
    probs = torch.softmax(logits.float(), dim=-1)
    w, ids = torch.topk(probs, top_k, dim=-1)
    w = w / w.sum(dim=-1, keepdim=True)
    return w.to(h2.dtype), ids


def experts_grouped_mm(torch, h2, w13, w2, weights, ids):
    """transformers ``grouped_mm_experts_forward`` (see the module docstring)."""
    import torch.nn.functional as F

    T, k = ids.shape
    E = w13.shape[0]
    F_ = w2.shape[2]
    out = torch.zeros_like(h2)
    expert_ids = ids.reshape(-1)
    token_idx = torch.arange(T, device=h2.device).unsqueeze(1).expand(-1, k).reshape(-1)
    perm = torch.argsort(expert_ids, stable=True)
    inv_perm = torch.argsort(perm, stable=True)
    sample_w = weights.reshape(-1)
    x_g = h2[token_idx][perm]
    per_expert = torch.histc(expert_ids[perm].float(), bins=E, min=0, max=E - 1)
    offs = torch.cumsum(per_expert, dim=0, dtype=torch.int32)
    gu = torch._grouped_mm(x_g, w13.transpose(-2, -1), offs=offs)
    a = F.silu(gu[:, :F_]) * gu[:, F_:]
    y_g = torch._grouped_mm(a, w2.transpose(-2, -1), offs=offs)
    y_g = y_g * sample_w[perm].unsqueeze(-1)
    out.index_add_(0, token_idx, y_g[inv_perm].to(out.dtype))
    return out


def experts_loop(torch, h2, w13, w2, weights, ids):
    """Hugging Face's eager per-expert loop (host sync on the hit experts)."""
    import torch.nn.functional as F

    E = w13.shape[0]
    F_ = w2.shape[2]
    out = torch.zeros_like(h2)
    mask = F.one_hot(ids, num_classes=E).permute(2, 1, 0)          # [E, k, T]
    hit = torch.greater(mask.sum(dim=(-1, -2)), 0).nonzero()
    for e in hit.view(-1).tolist():
        kpos, tidx = torch.where(mask[e])
        gu = F.linear(h2[tidx], w13[e])
        a = F.silu(gu[:, :F_]) * gu[:, F_:]
        y = F.linear(a, w2[e]) * weights[tidx, kpos, None]
        out.index_add_(0, tidx, y.to(out.dtype))
    return out


def moe_align_block_size(torch, ids, experts: int, block_m: int):
    """(sorted_token_ids [EM], expert_ids [EM / block_m], num_tokens_post_padded [1]): the (token, k) rows
    grouped by expert, each group padded to a multiple of ``block_m`` with the invalid row index T*k; the
    expert of each block (-1 past the end). Static shapes, no host sync (graph-capturable)."""
    flat = ids.reshape(-1)
    S = flat.numel()
    dev = flat.device
    em = -(-(S + experts * (block_m - 1)) // block_m) * block_m
    counts = torch.zeros(experts, dtype=torch.long, device=dev).scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    pad_end = torch.cumsum(padded, 0)
    cnt_start = torch.cumsum(counts, 0) - counts
    perm = torch.argsort(flat, stable=True)
    sorted_e = flat[perm]
    dest = (pad_end - padded)[sorted_e] + torch.arange(S, device=dev) - cnt_start[sorted_e]
    sorted_token_ids = torch.full((em,), S, dtype=torch.long, device=dev).scatter_(0, dest, perm)
    block_starts = torch.arange(0, em, block_m, device=dev)
    expert_ids = torch.searchsorted(pad_end, block_starts, right=True)
    expert_ids = torch.where(expert_ids < experts, expert_ids, torch.full_like(expert_ids, -1))
    return sorted_token_ids, expert_ids, pad_end[-1:]


try:  # the kernels are defined at import where triton exists (the GPU host); a CPU needs none
    import triton
    import triton.language as tl
except Exception:  # noqa: BLE001 - no triton (a CPU host), or one that cannot load here
    triton = tl = None

if triton is not None:
    @triton.jit
    def fused_moe_kernel(a_ptr, b_ptr, c_ptr, topk_weights_ptr, sorted_token_ids_ptr, expert_ids_ptr,
                         num_tokens_post_padded_ptr, N, K: tl.constexpr, EM, num_valid_tokens,
                         stride_am, stride_ak, stride_be, stride_bn, stride_bk, stride_cm, stride_cn,
                         BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
                         MUL_ROUTED_WEIGHT: tl.constexpr, top_k: tl.constexpr):
        pid = tl.program_id(axis=0)
        num_pid_m = tl.cdiv(EM, BLOCK_SIZE_M)
        pid_m = pid % num_pid_m
        pid_n = pid // num_pid_m
        num_tokens_post_padded = tl.load(num_tokens_post_padded_ptr)
        if pid_m * BLOCK_SIZE_M >= num_tokens_post_padded:
            return
        offs_token_id = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
        offs_token = tl.load(sorted_token_ids_ptr + offs_token_id)
        token_mask = offs_token < num_valid_tokens
        off_expert = tl.load(expert_ids_ptr + pid_m)
        if off_expert == -1:
            return
        offs_bn = (pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)) % N
        offs_k = tl.arange(0, BLOCK_SIZE_K)
        a_ptrs = a_ptr + (offs_token[:, None] // top_k * stride_am + offs_k[None, :] * stride_ak)
        b_ptrs = b_ptr + off_expert * stride_be + (offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn)
        acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
        for k in range(0, tl.cdiv(K, BLOCK_SIZE_K)):
            k_left = K - k * BLOCK_SIZE_K
            a = tl.load(a_ptrs, mask=token_mask[:, None] & (offs_k[None, :] < k_left), other=0.0)
            b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
            acc += tl.dot(a, b)
            a_ptrs += BLOCK_SIZE_K * stride_ak
            b_ptrs += BLOCK_SIZE_K * stride_bk
        if MUL_ROUTED_WEIGHT:
            w = tl.load(topk_weights_ptr + offs_token, mask=token_mask, other=0)
            acc = acc * w[:, None]
        offs_cn = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
        c_ptrs = c_ptr + stride_cm * offs_token[:, None] + stride_cn * offs_cn[None, :]
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=token_mask[:, None] & (offs_cn[None, :] < N))


def _kernel():
    if triton is None:
        raise RuntimeError("the Triton kernels need triton (pip install triton); use the torch path on a CPU")
    return fused_moe_kernel



def _invoke(a, w, c, topk_weights, sorted_ids, expert_ids, num_post, mul_routed_weight: bool, top_k: int,
            block_m: int, block_n: int = 64, block_k: int = 64):
    kern = _kernel()
    E, N, K = w.shape
    EM = sorted_ids.numel()
    grid = (-(-EM // block_m) * -(-N // block_n),)
    kern[grid](a, w, c, topk_weights, sorted_ids, expert_ids, num_post, N, K, EM, c.shape[0], a.stride(0), a.stride(1), w.stride(0), w.stride(1), w.stride(2),
               c.stride(0), c.stride(1), BLOCK_SIZE_M=block_m, BLOCK_SIZE_N=block_n, BLOCK_SIZE_K=block_k,
               MUL_ROUTED_WEIGHT=mul_routed_weight, top_k=top_k, num_warps=4)


def experts_triton(torch, h2, w13, w2, weights, ids, block_m: int = 16):
    """vLLM ``fused_experts`` (see the module docstring): align, fused_moe_kernel x2, silu_and_mul, moe_sum."""
    import torch.nn.functional as F

    T, k = ids.shape
    E, twoF, H = w13.shape
    F_ = twoF // 2
    sorted_ids, expert_ids, num_post = moe_align_block_size(torch, ids, E, block_m)
    cache1 = torch.empty(T * k, twoF, dtype=h2.dtype, device=h2.device)
    _invoke(h2, w13, cache1, weights, sorted_ids, expert_ids, num_post, False, k, block_m)
    cache2 = F.silu(cache1[:, :F_]) * cache1[:, F_:]
    cache3 = torch.empty(T * k, H, dtype=h2.dtype, device=h2.device)
    _invoke(cache2, w2, cache3, weights.reshape(-1), sorted_ids, expert_ids, num_post, True, 1, block_m)
    return cache3.view(T, k, H).sum(dim=1)


EXPERTS = {"grouped_mm": experts_grouped_mm, "triton": experts_triton, "loop": experts_loop}

__all__ = ["route", "EXPERTS", "IMPLS", "expected_experts", "moe_align_block_size", "FUSED_MOE_KERNEL"]
