"""The small kernels of the speculative-decoding zoo (``capture/zoo.py``): Triton kernels named as the engines name
theirs, and torch fallbacks for CPUs (the smoke run) that compute the same thing.

Written from the engines' source (the behaviour, not copied code), simplified to fixed-size batches:

* ``build_tree_efficient`` -- the EAGLE tree of a step: retrieve index, first child (``retrive_next_token``) and
  next sibling (``retrive_next_sibling``) of every draft token, its position, and the tree attention mask in
  SGLang's ``QLEN_ONLY`` layout ``[B, N, N]`` (token x sees token y). SGLang's CUDA kernel has this name
  (``sgl-kernel/csrc/speculative/eagle_utils.cu : build_tree_efficient``; called from
  ``sgl-project/sglang@003ddbce : python/sglang/srt/speculative/eagle_utils.py : build_tree_kernel_efficient``;
  its Triton twin ``python/sglang/kernels/ops/speculative/spec_tree.py : sgl_build_tree_kernel_efficient_triton``).
* ``VerifyTreeGreedy`` -- greedy acceptance along the tree: from the root, the child whose token equals the
  target's prediction is accepted, until none does (``eagle_info.py : EagleVerifyInput.verify`` ->
  ``verify_tree_greedy``; SGLang's CUDA kernel is ``VerifyTreeGreedy``).
* ``rejection_greedy_sample_kernel`` -- vLLM's greedy rejection sampling (``vllm-project/vllm@0097a7bb :
  vllm/v1/sample/rejection_sampler.py : rejection_greedy_sample_kernel``): output tokens = the target's argmax
  up to and including the first mismatch, plus the bonus token when every draft token matched.
* ``fused_recurrent_gated_delta_rule_update_fwd_kernel`` -- the gated delta rule over T tokens per sequence,
  state read from (and, unless ``DISABLE_STATE_UPDATE``, written back to) a state pool, every token's state kept
  in an intermediate buffer when ``CACHE_INTERMEDIATE_STATES`` (the MTP verify: the state of the last accepted
  token is restored afterwards) -- SGLang ``layers/attention/fla/fused_recurrent.py`` (after fla-org
  ``fla/ops/gated_delta_rule/fused_recurrent.py@bc3b101d : fused_recurrent_gated_delta_rule_fwd_kernel``).
* ``_causal_conv1d_update_kernel`` -- the short (width 4) causal convolution of a linear-attention layer over T
  new tokens from a rolling state, SiLU, intermediate windows kept for the verify (SGLang
  ``layers/attention/mamba/causal_conv1d_triton.py``).
* ``fused_gdn_gating_kernel`` -- ``g = -exp(A_log) * softplus(a + dt_bias)``, ``beta = sigmoid(b)`` (SGLang
  ``layers/attention/fla/fused_gdn_gating.py``).
* bookkeeping named as SGLang's (``speculative/spec_utils.py``, ``eagle_info_v2.py``,
  ``multi_layer_eagle_utils.py``): ``assign_draft_cache_locs``, ``assign_req_to_token_pool`` (slot indices into
  the request-to-token table), ``create_extend_after_decode_spec_info`` (draft-extend positions and the last
  verified token), ``fill_new_verified_id``, ``rotate_input_ids_kernel`` (the multi-layer draft extend's input ids,
  shifted by one with the previous layer's token).

Every op is a function ``op(..., impl)`` with ``impl`` "triton" (CUDA tensors; the kernel above) or "torch" (any
device; the reference the Triton kernels are tested against in Triton's CPU interpreter,
``tests/capture/test_zoo_capture.py``). The kernels are defined at import where triton exists (the GPU host).
"""

from __future__ import annotations

try:  # the kernels are defined at import where triton exists (the GPU host); a CPU needs none
    import triton
    import triton.language as tl
except Exception:  # noqa: BLE001 - no triton (a CPU host), or one that cannot load here
    triton = tl = None

KERNELS = ("build_tree_efficient", "VerifyTreeGreedy", "rejection_greedy_sample_kernel",
           "fused_recurrent_gated_delta_rule_update_fwd_kernel", "_causal_conv1d_update_kernel",
           "fused_gdn_gating_kernel", "assign_draft_cache_locs", "assign_req_to_token_pool",
           "create_extend_after_decode_spec_info", "fill_new_verified_id", "rotate_input_ids_kernel")


def default_impl(device) -> str:
    """"triton" on a CUDA device where triton imports, else "torch"."""
    return "triton" if triton is not None and str(device).startswith("cuda") else "torch"


def _np2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


if triton is not None:
    @triton.jit
    def build_tree_efficient(parent_list, selected_index, verified_seq_len, tree_mask, positions, retrive_index,
                             retrive_next_token, retrive_next_sibling, parent_stride, topk: tl.constexpr,
                             depth: tl.constexpr, N: tl.constexpr, NP2: tl.constexpr):
        b = tl.program_id(0)
        seq_len = tl.load(verified_seq_len + b)
        sel = selected_index + b * (N - 1)
        par = parent_list + b * parent_stride
        base = b * N
        tl.store(positions + base, seq_len)
        tl.store(retrive_index + base, base)
        # links, from the last draft token to the first: a parent's first child ends up the earliest one
        for ii in range(N - 1):
            i = N - 1 - ii
            tl.store(retrive_index + base + i, base + i)
            ptb = tl.load(sel + i - 1) // topk
            ppos = 0
            if ptb != 0:
                ptok = tl.load(par + ptb)
                for pp in range(N - 1):
                    if tl.load(sel + pp) == ptok:
                        ppos = pp + 1
            nxt = tl.load(retrive_next_token + base + ppos)
            tl.store(retrive_next_token + base + ppos, i)
            if nxt != -1:
                tl.store(retrive_next_sibling + base + i, nxt)
        # mask rows and positions: each token sees the root, itself and its ancestors
        offs = tl.arange(0, NP2)
        for x in range(N):
            row = tree_mask + (base + x) * N
            tl.store(row + offs, tl.zeros([NP2], dtype=tl.uint8), mask=offs < N)
            tl.store(row, 1)
            pos = 0
            if x > 0:
                cur = x - 1
                cont = 1
                for _ in range(depth):
                    if cont == 1:
                        pos += 1
                        tl.store(row + cur + 1, 1)
                        ptb2 = tl.load(sel + cur) // topk
                        if ptb2 == 0:
                            cont = 0
                        else:
                            ptok2 = tl.load(par + ptb2)
                            found = 0
                            for cp in range(N - 1):
                                if found == 0:
                                    if tl.load(sel + cp) == ptok2:
                                        cur = cp
                                        found = 1
                            if found == 0:
                                cont = 0
            tl.store(positions + base + x, seq_len + pos)

    @triton.jit
    def VerifyTreeGreedy(predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token,
                         retrive_next_sibling, target_predict, S1: tl.constexpr, N: tl.constexpr):  # noqa: N802
        b = tl.program_id(0)
        last = tl.load(retrive_index + b * N)
        tl.store(accept_index + b * S1, last)
        num = 0
        cur = last * 0
        cont = 1
        for _j in range(1, S1):
            if cont == 1:
                cur = tl.load(retrive_next_token + b * N + cur)
                tgt = tl.load(target_predict + last)
                matched = 0
                for _s in range(N):
                    if matched == 0:
                        if cur == -1:
                            matched = 2
                        else:
                            tok = tl.load(candidates + b * N + cur)
                            if tok == tgt:
                                didx = tl.load(retrive_index + b * N + cur)
                                tl.store(predicts + last, tgt)
                                num += 1
                                tl.store(accept_index + b * S1 + num, didx)
                                last = didx
                                matched = 1
                            else:
                                cur = tl.load(retrive_next_sibling + b * N + cur)
                if matched != 1:
                    cont = 0
        tl.store(accept_token_num + b, num)
        tl.store(predicts + last, tl.load(target_predict + last))

    @triton.jit
    def rejection_greedy_sample_kernel(output_token_ids, cu_num_draft_tokens, draft_token_ids, target_argmax,
                                       bonus_token_ids, max_spec_len):
        req = tl.program_id(0)
        start = tl.load(cu_num_draft_tokens + req - 1, mask=req > 0, other=0)
        end = tl.load(cu_num_draft_tokens + req)
        n = end - start
        rejected = 0
        for pos in range(n):
            if rejected == 0:
                d = tl.load(draft_token_ids + start + pos)
                t = tl.load(target_argmax + start + pos)
                tl.store(output_token_ids + req * (max_spec_len + 1) + pos, t)
                if d != t:
                    rejected = 1
        if rejected == 0:
            tl.store(output_token_ids + req * (max_spec_len + 1) + n, tl.load(bonus_token_ids + req))

    @triton.jit
    def fused_recurrent_gated_delta_rule_update_fwd_kernel(
            q, k, v, g, beta, o, h0_source, h0_indices, intermediate_states, scale, T,
            H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr,
            BV: tl.constexpr, USE_QK_L2NORM_IN_KERNEL: tl.constexpr, DISABLE_STATE_UPDATE: tl.constexpr,
            CACHE_INTERMEDIATE_STATES: tl.constexpr):
        i_v = tl.program_id(0)
        i_nh = tl.program_id(1)
        i_n = i_nh // HV
        i_hv = i_nh % HV
        i_h = i_hv // (HV // H)
        o_k = tl.arange(0, BK)
        o_v = i_v * BV + tl.arange(0, BV)
        mk = o_k < K
        mv = o_v < V
        mh = mk[:, None] & mv[None, :]
        idx = tl.load(h0_indices + i_n)
        p_h = h0_source + (idx * HV + i_hv) * K * V + o_k[:, None] * V + o_v[None, :]
        b_h = tl.load(p_h, mask=mh, other=0).to(tl.float32)
        for t in range(0, T):
            row = i_n * T + t
            b_q = tl.load(q + (row * H + i_h) * K + o_k, mask=mk, other=0).to(tl.float32)
            b_k = tl.load(k + (row * H + i_h) * K + o_k, mask=mk, other=0).to(tl.float32)
            b_v = tl.load(v + (row * HV + i_hv) * V + o_v, mask=mv, other=0).to(tl.float32)
            if USE_QK_L2NORM_IN_KERNEL:
                b_q = b_q / tl.sqrt(tl.sum(b_q * b_q) + 1e-6)
                b_k = b_k / tl.sqrt(tl.sum(b_k * b_k) + 1e-6)
            b_q = b_q * scale
            b_g = tl.load(g + row * HV + i_hv).to(tl.float32)
            b_beta = tl.load(beta + row * HV + i_hv).to(tl.float32)
            b_h *= tl.exp(b_g)
            b_v = b_beta * (b_v - tl.sum(b_h * b_k[:, None], 0))
            b_h += b_k[:, None] * b_v[None, :]
            b_o = tl.sum(b_h * b_q[:, None], 0)
            tl.store(o + (row * HV + i_hv) * V + o_v, b_o.to(o.dtype.element_ty), mask=mv)
            if CACHE_INTERMEDIATE_STATES:
                p_i = intermediate_states + (row * HV + i_hv) * K * V + o_k[:, None] * V + o_v[None, :]
                tl.store(p_i, b_h.to(intermediate_states.dtype.element_ty), mask=mh)
        if not DISABLE_STATE_UPDATE:
            tl.store(p_h, b_h.to(h0_source.dtype.element_ty), mask=mh)

    @triton.jit
    def _causal_conv1d_update_kernel(x, conv_state, weight, out, intermediate_conv_window, T, C,
                                     BLOCK_C: tl.constexpr, SILU: tl.constexpr, DISABLE_STATE_UPDATE: tl.constexpr,
                                     CACHE_INTERMEDIATE: tl.constexpr):
        b = tl.program_id(0)
        c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
        m = c < C
        st = conv_state + (b * C + c) * 3
        s0 = tl.load(st, mask=m, other=0).to(tl.float32)
        s1 = tl.load(st + 1, mask=m, other=0).to(tl.float32)
        s2 = tl.load(st + 2, mask=m, other=0).to(tl.float32)
        w0 = tl.load(weight + c * 4, mask=m, other=0).to(tl.float32)
        w1 = tl.load(weight + c * 4 + 1, mask=m, other=0).to(tl.float32)
        w2 = tl.load(weight + c * 4 + 2, mask=m, other=0).to(tl.float32)
        w3 = tl.load(weight + c * 4 + 3, mask=m, other=0).to(tl.float32)
        for t in range(0, T):
            xt = tl.load(x + (b * T + t) * C + c, mask=m, other=0).to(tl.float32)
            acc = s0 * w0 + s1 * w1 + s2 * w2 + xt * w3
            if SILU:
                acc = acc * tl.sigmoid(acc)
            tl.store(out + (b * T + t) * C + c, acc.to(out.dtype.element_ty), mask=m)
            s0 = s1
            s1 = s2
            s2 = xt
            if CACHE_INTERMEDIATE:
                iw = intermediate_conv_window + ((b * T + t) * C + c) * 3
                tl.store(iw, s0.to(intermediate_conv_window.dtype.element_ty), mask=m)
                tl.store(iw + 1, s1.to(intermediate_conv_window.dtype.element_ty), mask=m)
                tl.store(iw + 2, s2.to(intermediate_conv_window.dtype.element_ty), mask=m)
        if not DISABLE_STATE_UPDATE:
            tl.store(st, s0.to(conv_state.dtype.element_ty), mask=m)
            tl.store(st + 1, s1.to(conv_state.dtype.element_ty), mask=m)
            tl.store(st + 2, s2.to(conv_state.dtype.element_ty), mask=m)

    @triton.jit
    def fused_gdn_gating_kernel(g, beta_out, A_log, a, b, dt_bias, NH, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        h = tl.arange(0, BLOCK)
        m = h < NH
        A = tl.load(A_log + h, mask=m, other=0).to(tl.float32)
        av = tl.load(a + row * NH + h, mask=m, other=0).to(tl.float32)
        dt = tl.load(dt_bias + h, mask=m, other=0).to(tl.float32)
        bv = tl.load(b + row * NH + h, mask=m, other=0).to(tl.float32)
        xx = av + dt
        sp = tl.where(xx <= 20.0, tl.log(1.0 + tl.exp(xx)), xx)
        tl.store(g + row * NH + h, -tl.exp(A) * sp, mask=m)
        tl.store(beta_out + row * NH + h, tl.sigmoid(bv).to(beta_out.dtype.element_ty), mask=m)

    @triton.jit
    def assign_draft_cache_locs(req_pool_indices, req_to_token, seq_lens, out_cache_loc, pool_len,
                                NUM: tl.constexpr, BLOCK: tl.constexpr):
        b = tl.program_id(0)
        req = tl.load(req_pool_indices + b)
        sl = tl.load(seq_lens + b)
        j = tl.arange(0, BLOCK)
        m = j < NUM
        loc = tl.load(out_cache_loc + b * NUM + j, mask=m)
        tl.store(req_to_token + req * pool_len + sl + j, loc, mask=m)

    @triton.jit
    def assign_req_to_token_pool(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc, pool_len,
                                 BLOCK: tl.constexpr):
        b = tl.program_id(0)
        out_off = tl.load(start_offset + b) * 0          # int64 from the start (a loop-carried value keeps its type)
        for i in range(0, b):
            out_off += tl.load(end_offset + i) - tl.load(start_offset + i)
        req = tl.load(req_pool_indices + b)
        s = tl.load(start_offset + b)
        n = tl.load(end_offset + b) - s
        j = tl.arange(0, BLOCK)
        loc = tl.load(out_cache_loc + out_off + j, mask=j < n)
        tl.store(req_to_token + req * pool_len + s + j, loc, mask=j < n)

    @triton.jit
    def create_extend_after_decode_spec_info(ext_ids, seq_lens, accept_length, positions, new_verified_id,
                                             S1: tl.constexpr, BLOCK: tl.constexpr):
        b = tl.program_id(0)
        acc = tl.load(accept_length + b)
        sl = tl.load(seq_lens + b)
        j = tl.arange(0, BLOCK)
        pos = sl - (acc + 1) + tl.minimum(j, acc)
        tl.store(positions + b * S1 + j, pos, mask=j < S1)
        tl.store(new_verified_id + b, tl.load(ext_ids + b * S1 + acc))

    @triton.jit
    def fill_new_verified_id(all_verified_id, accept_length, verified_id, S1: tl.constexpr):
        b = tl.program_id(0)
        acc = tl.load(accept_length + b)
        tl.store(verified_id + b, tl.load(all_verified_id + b * S1 + acc))

    @triton.jit
    def rotate_input_ids_kernel(input_ids, accept_length, new_tokens, S1: tl.constexpr, BLOCK: tl.constexpr):
        b = tl.program_id(0)
        j = tl.arange(0, BLOCK)
        m = j < S1 - 1
        nxt = tl.load(input_ids + b * S1 + j + 1, mask=m)
        tl.store(input_ids + b * S1 + j, nxt, mask=m)
        tl.store(input_ids + b * S1 + tl.load(accept_length + b), tl.load(new_tokens + b))


def _need_triton():
    if triton is None:
        raise RuntimeError("the Triton kernels need triton; use impl='torch' on a CPU")


# ---------------------------------------------------------------------------------------------------------------
# the ops (impl "triton": the kernels above; "torch": the same result with torch ops)
# ---------------------------------------------------------------------------------------------------------------

def build_tree(parent_list, selected_index, seq_lens, tree_mask, positions, retrive_index, retrive_next_token,
               retrive_next_sibling, topk: int, depth: int, impl: str) -> None:
    """Fill the tree of every sequence (outputs pre-allocated; the retrive_* ones are reset to -1 here)."""
    B, N = retrive_index.shape
    retrive_index.fill_(-1)
    retrive_next_token.fill_(-1)
    retrive_next_sibling.fill_(-1)
    if impl == "triton":
        _need_triton()
        build_tree_efficient[(B,)](parent_list, selected_index, seq_lens, tree_mask, positions, retrive_index,
                                   retrive_next_token, retrive_next_sibling, parent_list.stride(0), topk=topk,
                                   depth=depth, N=N, NP2=_np2(N))
        return
    par, sel, sl = parent_list.tolist(), selected_index.tolist(), seq_lens.tolist()
    ri = [[-1] * N for _ in range(B)]
    nt = [[-1] * N for _ in range(B)]
    ns = [[-1] * N for _ in range(B)]
    mask = [[[0] * N for _ in range(N)] for _ in range(B)]
    pos = [[0] * N for _ in range(B)]

    def parent_pos(b, i):  # position (0 = root) of the parent of draft token i (1..N-1), None if unknown
        ptb = sel[b][i - 1] // topk
        if ptb == 0:
            return 0
        ptok = par[b][ptb]
        hits = [pp for pp in range(N - 1) if sel[b][pp] == ptok]
        return hits[-1] + 1 if hits else 0

    for b in range(B):
        ri[b][0] = b * N
        for i in range(N - 1, 0, -1):
            ri[b][i] = b * N + i
            p = parent_pos(b, i)
            if nt[b][p] != -1:
                ns[b][i] = nt[b][p]
            nt[b][p] = i
        for x in range(N):
            mask[b][x][0] = 1
            depth_x, cur = 0, x
            while cur > 0 and depth_x < depth:
                depth_x += 1
                mask[b][x][cur] = 1
                cur = parent_pos(b, cur)
            pos[b][x] = sl[b] + depth_x
    torch = _torch()
    dev = retrive_index.device
    retrive_index.copy_(torch.tensor(ri, device=dev))
    retrive_next_token.copy_(torch.tensor(nt, device=dev))
    retrive_next_sibling.copy_(torch.tensor(ns, device=dev))
    tree_mask.copy_(torch.tensor(mask, device=dev, dtype=tree_mask.dtype))
    positions.copy_(torch.tensor(pos, device=dev, dtype=positions.dtype))


def verify_tree_greedy(predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token,
                       retrive_next_sibling, target_predict, impl: str) -> None:
    """Greedy acceptance along each sequence's tree (accept_index reset to -1 here)."""
    B, N = candidates.shape
    S1 = accept_index.shape[1]
    accept_index.fill_(-1)
    if impl == "triton":
        _need_triton()
        VerifyTreeGreedy[(B,)](predicts, accept_index, accept_token_num, candidates, retrive_index,
                               retrive_next_token, retrive_next_sibling, target_predict, S1=S1, N=N)
        return
    cand, ri, nt, ns = candidates.tolist(), retrive_index.tolist(), retrive_next_token.tolist(), \
        retrive_next_sibling.tolist()
    tp = target_predict.reshape(-1).tolist()
    pred = predicts.tolist()
    acc_idx = [[-1] * S1 for _ in range(B)]
    acc_num = [0] * B
    for b in range(B):
        last = ri[b][0]
        acc_idx[b][0] = last
        cur = 0
        for _ in range(1, S1):
            cur = nt[b][cur]
            tgt = tp[last]
            while cur != -1 and cand[b][cur] != tgt:
                cur = ns[b][cur]
            if cur == -1:
                break
            pred[last] = tgt
            acc_num[b] += 1
            acc_idx[b][acc_num[b]] = ri[b][cur]
            last = ri[b][cur]
        pred[last] = tp[last]
    torch = _torch()
    dev = predicts.device
    predicts.copy_(torch.tensor(pred, device=dev))
    accept_index.copy_(torch.tensor(acc_idx, device=dev))
    accept_token_num.copy_(torch.tensor(acc_num, device=dev))


def rejection_greedy_sample(output_token_ids, cu_num_draft_tokens, draft_token_ids, target_argmax, bonus_token_ids,
                            max_spec_len: int, impl: str) -> None:
    """vLLM's greedy rejection sampling into ``output_token_ids [B, max_spec_len + 1]`` (reset to -1 here)."""
    torch = _torch()
    output_token_ids.fill_(-1)
    B = output_token_ids.shape[0]
    if impl == "triton":
        _need_triton()
        rejection_greedy_sample_kernel[(B,)](output_token_ids, cu_num_draft_tokens, draft_token_ids, target_argmax,
                                             bonus_token_ids, max_spec_len, num_warps=1)
        return
    K = max_spec_len                                        # every request drafts max_spec_len tokens here
    d = draft_token_ids.view(B, K)
    t = target_argmax.view(B, K)
    ok = (d == t).to(torch.int64).cumprod(dim=1)            # 1 while every draft token so far matched
    keep = torch.cat([torch.ones_like(ok[:, :1]), ok[:, :-1]], dim=1).bool()   # up to the first mismatch
    out = torch.where(keep, t, torch.full_like(t, -1))
    bonus = torch.where(ok[:, -1:].bool(), bonus_token_ids.view(B, 1).to(t.dtype), torch.full_like(t[:, :1], -1))
    output_token_ids.copy_(torch.cat([out, bonus], dim=1))


def gated_delta_rule_update(q, k, v, g, beta, o, state, indices, inter, scale: float, disable_state_update: bool,
                            impl: str) -> None:
    """q, k [B, T, H, K]; v, o [B, T, HV, V]; g, beta [B, T, HV]; state [pool, HV, K, V] (float32), read at
    ``indices [B]``; ``inter`` [B, T, HV, K, V] or None (every token's state kept)."""
    torch = _torch()
    B, T, H, Kd = q.shape
    HV, Vd = v.shape[2], v.shape[3]
    if impl == "triton":
        _need_triton()
        BK = _np2(Kd)
        BV = min(8, _np2(Vd))               # fla's choice for the recurrent forward (one warp per program)
        grid = (triton.cdiv(Vd, BV), B * HV)
        fused_recurrent_gated_delta_rule_update_fwd_kernel[grid](
            q, k, v, g, beta, o, state, indices, inter if inter is not None else o, scale, T, H=H, HV=HV, K=Kd, V=Vd,
            BK=BK, BV=BV, USE_QK_L2NORM_IN_KERNEL=True, DISABLE_STATE_UPDATE=disable_state_update,
            CACHE_INTERMEDIATE_STATES=inter is not None, num_warps=1)
        return
    h = state[indices].float()                                       # [B, HV, K, V]
    rep = HV // H
    qf = torch.nn.functional.normalize(q.float(), dim=-1, eps=1e-6).repeat_interleave(rep, dim=2) * scale
    kf = torch.nn.functional.normalize(k.float(), dim=-1, eps=1e-6).repeat_interleave(rep, dim=2)
    vf, gf, bf = v.float(), g.float(), beta.float()
    for t in range(T):
        h = h * torch.exp(gf[:, t])[..., None, None]
        kt = kf[:, t]                                                # [B, HV, K]
        vt = bf[:, t][..., None] * (vf[:, t] - torch.einsum("bhkv,bhk->bhv", h, kt))
        h = h + kt[..., :, None] * vt[..., None, :]
        o[:, t].copy_(torch.einsum("bhkv,bhk->bhv", h, qf[:, t]).to(o.dtype))
        if inter is not None:
            inter[:, t].copy_(h.to(inter.dtype))
    if not disable_state_update:
        state[indices] = h.to(state.dtype)


def causal_conv1d_update(x, conv_state, weight, out, inter, disable_state_update: bool, impl: str) -> None:
    """x, out [B, T, C]; conv_state [B, C, 3] (the last 3 inputs); weight [C, 4]; SiLU; ``inter`` [B, T, C, 3] or
    None (every token's window kept)."""
    torch = _torch()
    B, T, C = x.shape
    if impl == "triton":
        _need_triton()
        BLOCK_C = 256
        _causal_conv1d_update_kernel[(B, triton.cdiv(C, BLOCK_C))](
            x, conv_state, weight, out, inter if inter is not None else conv_state, T, C, BLOCK_C=BLOCK_C, SILU=True,
            DISABLE_STATE_UPDATE=disable_state_update, CACHE_INTERMEDIATE=inter is not None)
        return
    win = conv_state.float()
    w = weight.float()
    for t in range(T):
        xt = x[:, t].float()
        acc = (win * w[:, :3]).sum(-1) + xt * w[:, 3]
        out[:, t].copy_(torch.nn.functional.silu(acc).to(out.dtype))
        win = torch.cat([win[..., 1:], xt[..., None]], dim=-1)
        if inter is not None:
            inter[:, t].copy_(win.to(inter.dtype))
    if not disable_state_update:
        conv_state.copy_(win.to(conv_state.dtype))


def gdn_gating(A_log, a, b, dt_bias, g, beta, impl: str) -> None:
    """a, b [rows, HV] -> g (float32) and beta [rows, HV]."""
    torch = _torch()
    rows, NH = a.shape
    if impl == "triton":
        _need_triton()
        fused_gdn_gating_kernel[(rows,)](g, beta, A_log, a, b, dt_bias, NH, BLOCK=_np2(NH))
        return
    g.copy_(-torch.exp(A_log.float()) * torch.nn.functional.softplus(a.float() + dt_bias.float(), threshold=20.0))
    beta.copy_(torch.sigmoid(b.float()).to(beta.dtype))


def draft_cache_locs(req_pool_indices, req_to_token, seq_lens, out_cache_loc, impl: str) -> None:
    """req_to_token[req, seq_len + j] = out_cache_loc[b, j] for the step's draft slots."""
    B, NUM = out_cache_loc.shape
    if impl == "triton":
        _need_triton()
        assign_draft_cache_locs[(B,)](req_pool_indices, req_to_token, seq_lens, out_cache_loc, req_to_token.shape[1],
                                      NUM=NUM, BLOCK=_np2(NUM))
        return
    torch = _torch()
    cols = seq_lens.view(B, 1) + torch.arange(NUM, device=seq_lens.device).view(1, NUM)
    req_to_token[req_pool_indices.view(B, 1), cols] = out_cache_loc.to(req_to_token.dtype)


def req_to_token_pool(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc, width: int,
                      impl: str) -> None:
    """req_to_token[req, start:end] = the sequence's run of ``out_cache_loc`` (runs of end-start <= width)."""
    B = req_pool_indices.shape[0]
    if impl == "triton":
        _need_triton()
        assign_req_to_token_pool[(B,)](req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc,
                                       req_to_token.shape[1], BLOCK=_np2(width))
        return
    s, e, r = start_offset.tolist(), end_offset.tolist(), req_pool_indices.tolist()
    off = 0
    for b in range(B):
        n = e[b] - s[b]
        req_to_token[r[b], s[b]:e[b]] = out_cache_loc[off:off + n].to(req_to_token.dtype)
        off += n


def extend_after_decode_info(ext_ids, seq_lens, accept_length, positions, new_verified_id, impl: str) -> None:
    """Draft-extend positions ``[B, S1]`` (the accepted tokens' positions, the padding repeating the last) and
    the last verified token of each sequence (``ext_ids [B, S1]``, ``seq_lens`` after the accept)."""
    B, S1 = ext_ids.shape
    if impl == "triton":
        _need_triton()
        create_extend_after_decode_spec_info[(B,)](ext_ids, seq_lens, accept_length, positions, new_verified_id,
                                                   S1=S1, BLOCK=_np2(S1))
        return
    torch = _torch()
    acc = accept_length.to(torch.int64).view(B, 1)
    j = torch.arange(S1, device=ext_ids.device).view(1, S1)
    positions.copy_(seq_lens.view(B, 1) - (acc + 1) + torch.minimum(j, acc))
    new_verified_id.copy_(ext_ids.gather(1, acc).view(B).to(new_verified_id.dtype))


def new_verified_id(all_verified_id, accept_length, verified_id, impl: str) -> None:
    """verified_id[b] = all_verified_id[b, accept_length[b]] (``all_verified_id [B, S1]``)."""
    B, S1 = all_verified_id.shape
    if impl == "triton":
        _need_triton()
        fill_new_verified_id[(B,)](all_verified_id, accept_length, verified_id, S1=S1)
        return
    verified_id.copy_(all_verified_id.gather(1, accept_length.view(B, 1).long()).view(B).to(verified_id.dtype))


def rotate_input_ids(input_ids, accept_length, new_tokens, impl: str) -> None:
    """input_ids [B, S1] shifted left by one, the new token written at each sequence's last accepted position."""
    B, S1 = input_ids.shape
    if impl == "triton":
        _need_triton()
        rotate_input_ids_kernel[(B,)](input_ids, accept_length, new_tokens, S1=S1, BLOCK=_np2(S1))
        return
    shifted = input_ids[:, 1:].clone()
    input_ids[:, :-1].copy_(shifted)
    input_ids.scatter_(1, accept_length.view(B, 1).long(), new_tokens.view(B, 1).to(input_ids.dtype))


def _torch():
    import torch

    return torch


__all__ = ["KERNELS", "default_impl", "build_tree", "verify_tree_greedy", "rejection_greedy_sample",
           "gated_delta_rule_update", "causal_conv1d_update", "gdn_gating", "draft_cache_locs", "req_to_token_pool",
           "extend_after_decode_info", "new_verified_id", "rotate_input_ids"]
