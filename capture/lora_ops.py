"""Punica-style LoRA shrink/expand for the LoRA workload: Triton kernels named and shaped like vLLM's,
and a torch fallback for CPUs.

What vLLM does per LoRA linear (read in ``vllm/lora/punica_wrapper/punica_gpu.py`` ``add_lora_linear``,
``vllm/lora/ops/triton_ops/lora_shrink_op.py`` / ``lora_expand_op.py`` / ``lora_kernel_metadata.py``):

* once per step, on the host path before the forward (``LoRAKernelMeta.prepare_tensors``): the token ->
  adapter mapping copied to the GPU, ``torch.sort`` of it (token indices grouped by adapter),
  ``torch.unique(..., return_counts=True)`` (adapter ids and tokens per adapter; a device-to-host sync) and
  their cumulative sum (each adapter's start), all into fixed buffers;
* per LoRA linear: the base GEMM, a float32 buffer ``[slices, tokens, rank]``, ``_lora_shrink_kernel``
  (zeroes the buffer, then ``buffer[s, t] = scaling * x[t] @ A[adapter(t), s].T``; grid
  ``(SPLIT_K * cdiv(M, BLOCK_M) * cdiv(rank, BLOCK_N), slices, adapters)``, split-K partial sums added
  atomically) and ``_lora_expand_kernel`` (``y[t, slice s] += buffer[s, t] @ B[adapter(t), s].T``, the input
  cast to the weights' dtype, ``add_inputs``; grid ``(cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N), slices,
  adapters)``). Each CTA reads the rows of ONE adapter (``token_indices_sorted_by_lora_ids`` from
  ``lora_token_start_loc``) and exits early when its adapter id is -1 (no LoRA) or it has no rows.

The kernels below are written from that description (not copied): same names, same grids, same metadata
arguments, simplified (one weight tensor per linear with the slices stacked, instead of vLLM's pointer
tables; no PDL, no tuned config files). ``impl="torch"`` computes the same sums with torch ops (the CPU smoke
run and the reference the Triton kernels are tested against, in Triton's interpreter on a CPU).

Only imported by ``lora_decode.py`` on the GPU host (or tests). The kernels are defined at import (module level,
as vLLM's are) when triton can be imported; without it only ``impl="torch"`` works.
"""

from __future__ import annotations

SHRINK_KERNEL = "_lora_shrink_kernel"
EXPAND_KERNEL = "_lora_expand_kernel"


try:  # the kernels are defined at import where triton exists (the GPU host); a CPU needs none
    import triton
    import triton.language as tl
except Exception:  # noqa: BLE001 - no triton (a CPU host), or one that cannot load here
    triton = tl = None

if triton is not None:
    @triton.jit
    def _lora_shrink_kernel(input_ptr, lora_ptr, out_ptr, M, N: tl.constexpr, K: tl.constexpr,
                            token_indices_sorted_by_lora_ids, num_tokens_per_lora, lora_token_start_loc, lora_ids,
                            scaling, input_d0_stride, input_d1_stride, lora_d0_stride, lora_d1_stride,
                            lora_d2_stride, lora_d3_stride, output_d0_stride, output_d1_stride, output_d2_stride,
                            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                            SPLIT_K: tl.constexpr):
        cta_n_num = tl.cdiv(N, BLOCK_N)
        cta_m_num = tl.cdiv(M, BLOCK_M)
        pid_sk_m_n = tl.program_id(axis=0)
        pid_sk = pid_sk_m_n % SPLIT_K
        pid_m_n = pid_sk_m_n // SPLIT_K
        pid_m = pid_m_n % cta_m_num
        pid_n = (pid_m_n // cta_m_num) % cta_n_num
        slice_id = tl.program_id(axis=1)
        lora_idx = tl.program_id(axis=2)
        lora_id = tl.load(lora_ids + lora_idx)
        if lora_id == -1:                 # tokens without an adapter
            return
        lora_m_size = tl.load(num_tokens_per_lora + lora_idx)
        cta_m_offset = pid_m * BLOCK_M
        if cta_m_offset >= lora_m_size:
            return
        cta_m_len = tl.minimum(BLOCK_M, lora_m_size - cta_m_offset)
        start = tl.load(lora_token_start_loc + lora_idx)
        offset_m = tl.arange(0, BLOCK_M) % cta_m_len
        ram = tl.load(token_indices_sorted_by_lora_ids + start + cta_m_offset + offset_m)
        offset_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        rbn = offset_n % N
        offset_k = pid_sk * BLOCK_K + tl.arange(0, BLOCK_K)
        a_ptr = input_ptr + ram[:, None] * input_d0_stride + offset_k[None, :] * input_d1_stride
        b_ptr = (lora_ptr + slice_id * lora_d0_stride + lora_id * lora_d1_stride + rbn[None, :] * lora_d2_stride
                 + offset_k[:, None] * lora_d3_stride)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(0, tl.cdiv(K, BLOCK_K * SPLIT_K)):
            k_left = K - k * (BLOCK_K * SPLIT_K)
            tiled_a = tl.load(a_ptr, mask=offset_k[None, :] < k_left, other=0.0)
            tiled_b = tl.load(b_ptr, mask=offset_k[:, None] < k_left, other=0.0)
            acc += tl.dot(tiled_a, tiled_b)
            a_ptr += BLOCK_K * SPLIT_K * input_d1_stride
            b_ptr += BLOCK_K * SPLIT_K * lora_d3_stride
        acc *= scaling
        c_ptr = (out_ptr + slice_id * output_d0_stride + ram[:, None] * output_d1_stride
                 + offset_n[None, :] * output_d2_stride)
        c_mask = (tl.arange(0, BLOCK_M)[:, None] < cta_m_len) & (offset_n[None, :] < N)
        if SPLIT_K == 1:
            tl.store(c_ptr, acc, mask=c_mask)
        else:
            tl.atomic_add(c_ptr, acc, mask=c_mask)

    @triton.jit
    def _lora_expand_kernel(input_ptr, lora_ptr, out_ptr, M, K: tl.constexpr,
                            token_indices_sorted_by_lora_ids, num_tokens_per_lora, lora_token_start_loc, lora_ids,
                            slice_start_loc, slice_n, input_d0_stride, input_d1_stride, input_d2_stride,
                            lora_d0_stride, lora_d1_stride, lora_d2_stride, output_d0_stride, output_d1_stride,
                            MAX_N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                            ADD_INPUTS: tl.constexpr):
        cta_n_num = tl.cdiv(MAX_N, BLOCK_N)
        cta_m_num = tl.cdiv(M, BLOCK_M)
        pid_mn = tl.program_id(axis=0)
        pid_m = pid_mn % cta_m_num
        pid_n = (pid_mn // cta_m_num) % cta_n_num
        slice_id = tl.program_id(axis=1)
        lora_idx = tl.program_id(axis=2)
        lora_id = tl.load(lora_ids + lora_idx)
        if lora_id == -1:
            return
        lora_m_size = tl.load(num_tokens_per_lora + lora_idx)
        cta_m_offset = pid_m * BLOCK_M
        if cta_m_offset >= lora_m_size:
            return
        n_size = tl.load(slice_n + slice_id)
        if pid_n * BLOCK_N >= n_size:     # this slice is narrower than the widest one
            return
        n_start = tl.load(slice_start_loc + slice_id)
        cta_m_len = tl.minimum(BLOCK_M, lora_m_size - cta_m_offset)
        start = tl.load(lora_token_start_loc + lora_idx)
        offset_m = tl.arange(0, BLOCK_M) % cta_m_len
        ram = tl.load(token_indices_sorted_by_lora_ids + start + cta_m_offset + offset_m)
        offset_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        rbn = offset_n % n_size
        offset_k = tl.arange(0, BLOCK_K)
        a_ptr = input_ptr + slice_id * input_d0_stride + ram[:, None] * input_d1_stride + offset_k[None, :] * input_d2_stride
        b_ptr = lora_ptr + lora_id * lora_d0_stride + (n_start + rbn)[None, :] * lora_d1_stride \
            + offset_k[:, None] * lora_d2_stride
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(0, tl.cdiv(K, BLOCK_K)):
            k_left = K - k * BLOCK_K
            tiled_b = tl.load(b_ptr, mask=offset_k[:, None] < k_left, other=0.0)
            tiled_a = tl.load(a_ptr, mask=offset_k[None, :] < k_left, other=0.0).to(tiled_b.dtype)   # CAST_TYPE
            acc += tl.dot(tiled_a, tiled_b)
            a_ptr += BLOCK_K * input_d2_stride
            b_ptr += BLOCK_K * lora_d2_stride
        c_ptr = out_ptr + ram[:, None] * output_d0_stride + (n_start + offset_n)[None, :] * output_d1_stride
        c_mask = (tl.arange(0, BLOCK_M)[:, None] < cta_m_len) & (offset_n[None, :] < n_size)
        tiled_c = acc.to(out_ptr.dtype.element_ty)
        if ADD_INPUTS:
            tiled_c += tl.load(c_ptr, mask=c_mask, other=0.0)
        tl.store(c_ptr, tiled_c, mask=c_mask)


def _kernels():
    if triton is None:
        raise RuntimeError("the Triton kernels need triton (pip install triton); use the torch path on a CPU")
    return _lora_shrink_kernel, _lora_expand_kernel



def _pow2_at_least(n: int, lo: int = 16) -> int:
    p = lo
    while p < n:
        p *= 2
    return p


class LoRAMeta:
    """vLLM's ``LoRAKernelMeta``: fixed buffers the kernels read, refilled once per step by :meth:`prepare`."""

    def __init__(self, torch, max_loras: int, max_tokens: int, device):
        L = torch.long
        self.torch = torch
        self.max_loras = max_loras
        self.token_lora_mapping = torch.empty(max_tokens, dtype=L, device=device)
        self.token_indices_sorted_by_lora_ids = torch.empty(max_tokens, dtype=L, device=device)
        self.active_lora_ids = torch.full((max_loras + 1,), -1, dtype=L, device=device)
        self.num_tokens_per_lora = torch.zeros(max_loras + 1, dtype=L, device=device)
        self.lora_token_start_loc = torch.zeros(max_loras + 2, dtype=L, device=device)
        self.no_lora_flag_cpu = torch.zeros(1, dtype=torch.bool)

    def prepare(self, mapping_cpu) -> None:
        """``prepare_tensors``: the host mapping (a CPU tensor, -1 = no adapter) -> the kernels' metadata.
        The no-LoRA flag read and ``torch.unique`` (its output size is data-dependent) wait for the GPU, as in
        vLLM. (vLLM returns early when no token has an adapter; here every step has some.)"""
        torch = self.torch
        m = mapping_cpu.numel()
        self.token_lora_mapping[:m].copy_(mapping_cpu, non_blocking=True)
        mapping = self.token_lora_mapping[:m]
        self.no_lora_flag_cpu[0] = torch.all(mapping == -1)      # a device-to-host read, as in vLLM
        _, idx = torch.sort(mapping, stable=True)
        self.token_indices_sorted_by_lora_ids[:m].copy_(idx)
        ids, counts = torch.unique(mapping, sorted=True, return_counts=True)
        n = ids.numel()
        self.active_lora_ids.fill_(-1)
        self.active_lora_ids[:n].copy_(ids)
        self.num_tokens_per_lora.zero_()
        self.num_tokens_per_lora[:n].copy_(counts)
        self.lora_token_start_loc.zero_()
        self.lora_token_start_loc[1:1 + n].copy_(torch.cumsum(counts, dim=0))

    def args(self):
        return (self.token_indices_sorted_by_lora_ids, self.num_tokens_per_lora, self.lora_token_start_loc,
                self.active_lora_ids)


def lora_shrink(x, a, out, meta: LoRAMeta, scaling: float, impl: str, split_k: int = 4) -> None:
    """``out[s, t] = scaling * x[t] @ a[s, adapter(t)].T`` for tokens with an adapter, 0 elsewhere.
    ``x [M, K]`` (contiguous), ``a [slices, adapters, rank, K]``, ``out [slices, M, rank]`` float32."""
    M, K = x.shape
    S, _, R, _ = a.shape
    out.zero_()
    if impl == "torch":
        torch = meta.torch
        mp = meta.token_lora_mapping[:M]
        has = mp >= 0
        at = a[:, mp.clamp(min=0)]                                             # [S, M, R, K]
        prod = torch.einsum("mk,smrk->smr", x.float(), at.float()) * scaling
        out.copy_(prod * has.view(1, M, 1))
        return
    shrink, _ = _kernels()
    BLOCK_M, BLOCK_N = 16, _pow2_at_least(R)
    BLOCK_K = 32 if K >= 32 * split_k else 16
    grid = (split_k * -(-M // BLOCK_M) * -(-R // BLOCK_N), S, meta.max_loras + 1)
    shrink[grid](x, a, out, M, R, K, *meta.args(), scaling, x.stride(0), x.stride(1), a.stride(0), a.stride(1),
                 a.stride(2), a.stride(3), out.stride(0), out.stride(1), out.stride(2),
                 BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, SPLIT_K=split_k, num_warps=4)


def lora_expand(buf, b, y, meta: LoRAMeta, slice_start, slice_n, slices: tuple[int, ...], impl: str) -> None:
    """``y[t, slice s] += buf[s, t] @ b[adapter(t), slice s].T`` for tokens with an adapter.
    ``buf [slices, M, rank]`` float32, ``b [adapters, sum(slices), rank]``, ``y [M, sum(slices)]`` (contiguous);
    ``slice_start`` / ``slice_n``: device tensors of each slice's first output column and width."""
    S, M, R = buf.shape
    if impl == "torch":
        mp = meta.token_lora_mapping[:M]
        has = (mp >= 0).view(M, 1)
        bt = b[mp.clamp(min=0)]                                               # [M, N, R]
        col = 0
        for s, n in enumerate(slices):
            d = meta.torch.einsum("mr,mnr->mn", buf[s].to(b.dtype).float(), bt[:, col:col + n].float())
            y[:, col:col + n] += (d * has).to(y.dtype)
            col += n
        return
    _, expand = _kernels()
    BLOCK_M, BLOCK_N, BLOCK_K = 16, 64, _pow2_at_least(R)
    max_n = max(slices)
    grid = (-(-M // BLOCK_M) * -(-max_n // BLOCK_N), S, meta.max_loras + 1)
    expand[grid](buf, b, y, M, R, *meta.args(), slice_start, slice_n, buf.stride(0), buf.stride(1), buf.stride(2),
                 b.stride(0), b.stride(1), b.stride(2), y.stride(0), y.stride(1),
                 MAX_N=max_n, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, ADD_INPUTS=True, num_warps=4)


__all__ = ["LoRAMeta", "lora_shrink", "lora_expand", "SHRINK_KERNEL", "EXPAND_KERNEL"]
