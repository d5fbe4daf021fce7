"""Kernel-name taxonomy (tracekit.classify + tracekit/data/kernels.toml).

Every name below is copied from a real trace under ../shared/external_traces (path in the comment) or
from ../shared/reference/kernel_taxonomy.md (section in the comment). Traces are read here with plain
sqlite3 / gzip+json so these tests do not depend on tracekit's readers.
"""

from __future__ import annotations

import collections
import gzip
import json
import re
import sqlite3

import polars as pl
import pytest

from tracekit import classify as cl
from tracekit.classify import classify, load_rules
from tracekit.errors import TracekitError

from conftest import shared, shared_dir

LORA = "lora_perf_lora_profile/runs/Qwen3-30B-A3B-Instruct-2507-BF16-expert_shared-20260609-133913/current_base_lora/profile/base"
NVLLM = "nvllm/benchmarks/nvllm/traces/cute_paged_attn/2026-04-13-nsys/rank0.1776116491109655086.pt.trace.json.gz"


def one(name: str, rules=None) -> tuple[str, str, str | None]:
    row = classify(pl.Series([name]), rules).row(0, named=True)
    return row["category"], row["sub"], row["rule"]


def check(cases: list[tuple[str, str, str]]) -> None:
    """cases: (name, expected category, expected rule id)."""
    got = classify(pl.Series([n for n, _, _ in cases]))
    bad = [
        (n[:90], (c, r), (gc, gr))
        for (n, c, r), gc, gr in zip(cases, got["category"], got["rule"])
        if (gc, gr) != (c, r)
    ]
    assert not bad, bad


# ───────────────────────────── rule families ─────────────────────────────


def test_memory():
    check([
        ("[CUDA memcpy Device-to-Host]", "memory", "M1"),  # nsys stats naming (reference §1.1)
        ("[CUDA memset]", "memory", "M1"),
        ("Memcpy DtoH (Device -> Pinned)", "memory", "M1"),  # Kineto gpu_memcpy (reference §0)
        ("Memset (Device)", "memory", "M1"),  # Kineto gpu_memset
        ("memcpy128", "memory", "M2"),  # graph memcpy node, lora_perf bs16-TP-0 (x1552)
        ("memcpy32_post", "memory", "M2"),  # our H200 capture, hf-small-graph-torch (torch 2.11 Kineto)
    ])
    # memcpy/memset records stay memory even when a user rule would match them
    assert one("Memcpy HtoD (Pageable -> Device)")[0] == "memory"


def test_nccl_every_era():
    check([
        # NCCL < 2.19 (2022 era), HTA nccl_parser_config/nccl_data.json.gz
        ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", "communication", "C3"),
        # NCCL 2.17.1, HTA trace_diff/control/control.json.gz
        ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)", "communication", "C3"),
        ("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclWorkElem)", "communication", "C3"),
        # NCCL >= 2.19, lora_perf bs16-TP-0 and TraceLens b200/eager_trace.json.gz
        ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "communication", "C1"),
        # reference §1.2 C1 (R3090)
        ("ncclDevKernel_AllReduce_Sum_f16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "communication", "C1"),
        # nsys 2026.2 demangling, nsys-ai/tests/fixtures/mfu_2gpu_before.sqlite
        ("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<(unsigned long)4096>)", "communication", "C2"),
        ("ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)", "communication", "C2"),  # reference §4.8
        ("ncclSymkDevKernel_AllReduce_RSxLD_AGxST_sum_bf16", "communication", "C4"),  # NCCL symmetric/generate.py
    ])


def test_custom_and_fused_allreduce_and_symm_mem():
    check([
        # SGLang JIT custom AR, lora_perf bs16-TP-0 (x776 / x16)
        ("void (anonymous namespace)::all_reduce_two_shot_kernel<__nv_bfloat16, 4u, true>(host::distributed::"
         "AllReduceData const*, (anonymous namespace)::AllReduceParams, device::distributed::PullController)",
         "communication", "C6"),
        ("void (anonymous namespace)::all_reduce_one_shot_push_kernel<__nv_bfloat16, 4u, true>((anonymous "
         "namespace)::AllReducePushData, device::distributed::PushController)", "communication", "C6"),
        # SGLang/vLLM custom AR, reference §1.2 C5
        ("void sglang::cross_device_reduce_1stage<__nv_bfloat16, 2>(sglang::RankData*, sglang::RankSignals, "
         "sglang::Signal*, __nv_bfloat16*, int, int)", "communication", "C5"),
        ("void vllm::cross_device_reduce_2stage<c10::BFloat16, 8>(vllm::RankData*, vllm::RankSignals, "
         "vllm::Signal*, c10::BFloat16*, int, int)", "communication", "C5"),
        # flashinfer fused AR + residual + RMSNorm, lora_perf bs16-TP-0 (x760)
        ("void flashinfer::trtllm_allreduce_fusion::allreduce_fusion_kernel_oneshot_lamport<(flashinfer::"
         "trtllm_allreduce_fusion::AllReduceFusionPattern)1, __nv_bfloat16, 4, false, false>(flashinfer::"
         "trtllm_allreduce_fusion::AllReduceFusionParams<__nv_bfloat16>)", "communication", "C7"),
        # torch symmetric memory, TraceLens b200/eager_trace.json.gz (x73)
        ("void (anonymous namespace)::multimem_all_reduce_kernel<c10::BFloat16, 16>(c10::BFloat16*, unsigned long, "
         "unsigned int**, unsigned long, unsigned long)", "communication", "C8"),
        # torch symm-mem one/two-shot (PT symm_mem/CUDASymmetricMemoryOps.cu; SGL torch_symm_mem.py)
        ("void c10d::symmetric_memory::one_shot_all_reduce_kernel<c10::BFloat16, 16, 8>(c10::BFloat16**, "
         "c10::BFloat16*, unsigned long, unsigned long, unsigned int**, unsigned long, unsigned long)",
         "communication", "C8"),
        ("void c10d::symmetric_memory::two_shot_all_reduce_kernel<c10::BFloat16, 16, 8>(c10::BFloat16**, "
         "unsigned long, unsigned long, unsigned int**, unsigned long, unsigned long)", "communication", "C8"),
        # DeepEP, profile-data/train.json
        ("void dpsk::ep::internode::dispatch<false, 8, false, 8>(int4*, float*, long*, float*, dpsk::ep::internode::"
         "SourceMeta*, int4 const*, float const*, long const*)", "communication", "C12"),
    ])
    assert one("void flashinfer::trtllm_allreduce_fusion::allreduce_fusion_kernel_oneshot_lamport<(x)1>(y)")[1] \
        == "fused_ar_norm"
    assert one("void (anonymous namespace)::multimem_all_reduce_kernel<c10::BFloat16, 16>(x)")[1] == "symm_mem"


def test_spec_bookkeeping():
    check([
        ("build_tree_efficient", "drafting", "S1"),  # SGK speculative/eagle_utils.cu (reference §1.3)
        ("void VerifyTreeGreedy<int, long>(int*, int*, int*, long*, long*, long*, long*, int*, unsigned int, "
         "unsigned int, unsigned int)", "drafting", "S2"),
        ("assign_draft_cache_locs_page_size_1", "drafting", "S3"),  # SGL speculative/spec_utils.py (Triton)
        ("fill_new_verified_id", "drafting", "S3"),
        ("rejection_greedy_sample_kernel", "drafting", "S4"),  # VL v1/sample/rejection_sampler.py
        ("eagle_prepare_inputs_padded_kernel", "drafting", "S5"),  # VL v1/spec_decode/utils.py
    ])


def test_linear_attention():
    check([
        # nvllm rank0 trace (Qwen3.5-27B GDN decode), x480 each
        ("fused_recurrent_gated_delta_rule_packed_decode_kernel", "attention", "L1"),
        ("_causal_conv1d_update_kernel", "attention", "L3"),
        # reference §1.4
        ("fused_sigmoid_gating_delta_rule_update_kernel", "attention", "L2"),
        ("fused_gdn_gating_kernel", "attention", "L4"),
        ("chunk_gated_delta_rule_fwd_kernel_h_blockdim64", "attention", "L5"),
        ("_selective_scan_update_kernel", "attention", "L6"),
        # GDN glue is OTHER, not attention (reference L7, L8; #12 in R3090)
        ("fused_qkvzba_split_reshape_cat_kernel", "other", "L7"),
        ("_layer_norm_fwd_1pass_kernel", "other", "L8"),
    ])
    assert one("fused_recurrent_gated_delta_rule_packed_decode_kernel")[1] == "linear_attention"


def test_attention_backends():
    check([
        # FlashInfer prefill kernel running decode, nvllm rank0 trace (x160)
        ("void flashinfer::BatchPrefillWithPagedKVCacheKernel<flashinfer::KernelTraits<(flashinfer::MaskMode)0, 16u, "
         "1u, 1u, 16u, 16u, 1u, 4u, (flashinfer::PosEncodingMode)0, __nv_bfloat16, __nv_fp8_e4m3, __nv_bfloat16, "
         "float, int, flashinfer::DefaultAttention<false, false, false, false> > >", "attention", "A1"),
        ("void flashinfer::PersistentVariableLengthMergeStatesKernel<8u, 16u, 8u, 4u, __nv_bfloat16>", "attention", "A2"),
        # HF SDPA decode (PyTorch's FA2 copy)
        ("void pytorch_flash::flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128, 64, 128, 4, false, false, "
         "cutlass::bfloat16_t, Flash_kernel_traits<128, 64, 128, 4, cutlass::bfloat16_t> >, false, true, false, "
         "false, true, true, false, false>(pytorch_flash::Flash_fwd_params)", "attention", "A3"),
        ("void pytorch_flash::flash_fwd_splitkv_combine_kernel<Flash_fwd_kernel_traits<128, 64, 128, 4, false, false, "
         "cutlass::bfloat16_t>, 4, 1, false>(pytorch_flash::Flash_fwd_params)", "attention", "A3"),
        # FA2, nsys-ai/tests/fixtures/mfu_2gpu_before.sqlite
        ("void flash::flash_fwd_kernel<Flash_fwd_kernel_traits<(int)128, (int)128, (int)64, (int)4, (bool)0, (bool)0, "
         "cutlass::bfloat16_t, Flash_kernel_traits<(int)128, (int)128, (int)64, (int)4, cutlass::bfloat16_t>>, "
         "(bool)0, (bool)0, (bool)0, (bool)0, (bool)1, (bool)1, (bool)0, (bool)0>(Flash_fwd_params)",
         "attention", "A3"),
        # trtllm-gen FMHA, lora_perf bs16-TP-0 (decode) and TraceLens b200/eager_trace.json.gz
        ("fmhaSm100fKernel_QkvBfloat16OBfloat16H128PagedKvCausalP64MultiCtasKvVarSeqQ8Kv128StaticSwapsAbForGen",
         "attention", "A7"),
        ("fmhaSm103aKernel_QkvBfloat16OBfloat16H128PagedKvCausalP64VarSeqQ128Kv128PersistentContext", "attention", "A7"),
        ("fmhaSm100aKernel_QkvE4m3OBfloat16H64PagedKvCausalP16VarSeqQ128Kv128PersistentContext", "attention", "A7"),
        # vLLM Triton unified attention, TraceLens vllm_decode_full/graph_execution.json.gz
        ("kernel_unified_attention_3d", "attention", "A10"),
        ("reduce_segments", "attention", "A10"),
        # ROCm paged attention, TraceLens sglang_decode/sglang_Qwen3-8B_decode.json.gz
        ("void paged_attention_ll4mi_QKV_mfma16_kernel<0, __hip_bfloat16, __hip_bfloat16, (vllm::Fp8KVCacheDataType)0, "
         "1, 128, 256, false, 4, 1, ck_tile::ComposedAttention<0u, false> >(__hip_bfloat16 const*)", "attention", "A13"),
        # KV-cache writes: vLLM (TraceLens b200), SGLang (TraceLens sglang_decode, lora_perf)
        ("void vllm::reshape_and_cache_flash_kernel<__nv_bfloat16, unsigned char, (vllm::Fp8KVCacheDataType)1>"
         "(__nv_bfloat16 const*, __nv_bfloat16 const*, unsigned char*, unsigned char*, long const*)", "attention", "A11"),
        ("void (anonymous namespace)::store_kvcache<2048l, 4, false, long>((anonymous namespace)::StoreKVCacheParams)",
         "attention", "A11"),
        ("void (anonymous namespace)::fused_rope_store_kernel<true, 128l, true, __nv_bfloat16, long, 16u>((anonymous "
         "namespace)::FusedRopeStoreParams)", "attention", "A11"),
        ("_fwd_grouped_kernel_stage1", "attention", "A8"),  # SGL triton_ops/decode_attention.py
        ("fmha_cutlassF_bf16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<cutlass::bfloat16_t, "
         "cutlass::arch::Sm80, true, 64, 64, 64, true, true>::Params)", "attention", "A5"),
    ])


def test_gemm_families():
    check([
        ("nvjet_sm103_tst_144x128_64x6_1x4_h_bz_TNN", "gemm", "G9"),  # lora_perf bs16-TP-0
        ("nvjet_tst_64x64_64x16_2x1_2cta_v_bz_bias_TNT", "gemm", "G9"),  # TraceLens b200
        ("nvjet_hsh_256x128_64x4_1x2_h_bz_coopA_NTT", "gemm", "G9"),  # Fuser/report2.sqlite (H200)
        # profile-data/train.json (H800)
        ("sm90_xmma_gemm_bf16f32_bf16f32_f32_nt_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel"
         "__5x_cublas", "gemm", "G9"),
        # nsys-ai/tests/fixtures/h100_2gpu_1s.sqlite
        ("sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize64x256x8_stage3_warpsize1x4x1_ffma_aligna4_alignc4_execute"
         "_kernel__5x_cublas", "gemm", "G9"),
        ("ampere_sgemm_128x64_nn", "gemm", "G9"),  # HTA critical_path/alexnet
        ("volta_sgemm_128x64_nn", "gemm", "G9"),  # HTA df_index_resolver
        # cuBLAS GEMV (M=1), HTA traces and reference §1.7 G10 (R3090)
        ("void gemv2T_kernel_val<int, int, float, float, float, float, 128, 16, 4, 4, false, false, cublasGemvParams<"
         "cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<float const>, "
         "cublasGemvTensorStridedBatched<float>, float> >(cublasGemvParams<...>, float, float)", "gemm", "G10"),
        ("std::enable_if<!(false), void>::type internal::gemvx::kernel<int, int, __half, __half, __half, float, false, "
         "true, true, false, 7, false, cublasGemvParamsEx<int, cublasGemvTensorStridedBatched<__half const>, "
         "cublasGemvTensorStridedBatched<__half const>, cublasGemvTensorStridedBatched<__half>, float> >", "gemm", "G10"),
        # trtllm-gen MoE, lora_perf bs16-TP-0 and TraceLens b200
        ("bmm_Bfloat16_Bfloat16Bfloat16_Fp32_t128x64x128u2_s5_et128x64_m256x64x16_c2x1x1_16dp256b_rM_BN_transOut_"
         "schPd2x1x2x3_bN_tma_tmaSf_rgTma_clmp_swiGlu_dynB_sm100f", "gemm", "G7"),
        ("bmm_MxE4m3_MxE2m1MxE4m3_Fp32_t128x16x256u2_s3_et128x16_m128x16x32_cga1x1x1_16dp256b_rM_TN_transOut_"
         "schedP2x1x2x3_biasM_bN_tma_tmaOpt_clmp_swiGlu_dynBatch_sm100f", "gemm", "G7"),
        # triton_kernels MoE, TraceLens vllm_decode_full
        ("_matmul_ogs_NNT_bf16xbf16xmxfp4_16x128x256x1_swiglu", "gemm", "G7"),
        # CUTLASS: lm_head (nvllm rank0) and the still-mangled NVFP4 GEMM of the same trace
        ("void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_16x16_128x1_tn_align8>("
         "cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_16x16_128x1_tn_align8::Params)", "gemm", "G8"),
        ("_ZN7cutlass13device_kernelINS_4gemm6kernel13GemmUniversalIN4cute5tupleIJiiiiEEENS1_10collective13"
         "CollectiveMmaINS1_42MainloopSm120TmaWarpSpecializedBlockScaledILi2ELi3E", "gemm", "G8"),
        # hipBLASLt, TraceLens sglang_decode (MI300X)
        ("Cijk_Alik_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT256x32x64_MI16x16x1_SN_LDSB1_AFC1_AFEM1_AFEM1_ASEM1_CLR1",
         "gemm", "G13"),
        ("void device::marlin::Marlin<__half, 4, 256, 1, 8, 8, true, 4, 8, false>(int4 const*)", "gemm", "G2"),  # R3090
        ("fused_moe_kernel", "gemm", "G7"),  # SGL fused_moe_triton
        ("void deep_gemm::sm90_fp8_gemm_1d2d_impl<128u>(float*, int*, unsigned int)", "gemm", "G6"),
    ])


def test_other_families():
    check([
        # flashinfer norm (lora_perf), vLLM norm (TraceLens b200), SGLang qk-norm (lora_perf)
        ("void flashinfer::norm::FusedAddRMSNormKernel<8u, __nv_bfloat16>(__nv_bfloat16*, __nv_bfloat16*, "
         "__nv_bfloat16*, unsigned int, unsigned int, unsigned int, float, float)", "other", "O1"),
        ("std::enable_if<(((8)>(0)))&&vllm::_typeConvert<c10::BFloat16>::exists, void>::type vllm::"
         "fused_add_rms_norm_kernel<c10::BFloat16, 8>(c10::BFloat16*, long, c10::BFloat16*)", "other", "O1"),
        ("void (anonymous namespace)::fused_qknorm_warp<128l, true, __nv_bfloat16>((anonymous namespace)::QKNormParams)",
         "other", "O1"),
        # aiter / ck_tile norms (mangled), TraceLens sglang_decode and vllm_decode_full
        ("_ZN5aiter24add_rmsnorm_quant_kernelIDF16bDF16bLi256ELi16ELb1ELb0ELb1ELi1EEEvPT0_PT_PfS4_S4_S4_diiiiiiib",
         "other", "O1"),
        ("_ZN7ck_tile6kentryILi1ENS_12Rmsnorm2dFwdINS_27Rmsnorm2dFwdPipelineOnePassINS_27Rmsnorm2dFwdPipelineProblem",
         "other", "O1"),
        # activation: SGLang ROCm (mangled, TraceLens sglang_decode)
        ("_ZN7sgl_hip10activation18act_and_mul_kernelI14__hip_bfloat16TnPFT_RKS3_EXadL_Z4siluIS2_ES3_S5_EEEEvPS3_PS4_i",
         "other", "O2"),
        ("void vllm::rotary_embedding_kernel<c10::BFloat16, true>(long const*, c10::BFloat16*, c10::BFloat16*)",
         "other", "O3"),  # TraceLens b200
        # sampling: nvllm rank0
        ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, at::native::(anonymous "
         "namespace)::SoftMaxForwardEpilogue>(float*, float const*, int)", "other", "O4"),
        ("void vllm::scaled_fp8_quant_kernel_strided<c10::BFloat16, c10::Float8_e4m3fn>(c10::Float8_e4m3fn*)",
         "other", "O5"),  # TraceLens b200
        ("void moe::dev::routing::routingIndicesHistogramKernel<moe::dev::routing::routingRenormalize::KernelParams<"
         "__nv_bfloat16, __nv_bfloat16, 128, false, true, true> >", "other", "O6"),  # TraceLens b200
        ("void moe::dev::finalize::finalizeKernel<moe::dev::finalize::KernelParams<cutlass::bfloat16_t, "
         "cutlass::bfloat16_t, 4, true> >(moe::dev::finalize::KernelParams<cutlass::bfloat16_t>)", "other", "O6"),
        ("void at::native::(anonymous namespace)::indexSelectSmallIndex<c10::BFloat16, long, unsigned int, 2, 2, -2>"
         "(at::cuda::detail::TensorInfo<c10::BFloat16, unsigned int>)", "other", "O7"),  # lora_perf
        ("compute_position_kernel", "other", "O8"),  # lora_perf
        # PyTorch generic glue (lora_perf, nvllm, TraceLens b200)
        ("void at::native::vectorized_elementwise_kernel<8, at::native::FillFunctor<c10::BFloat16>, std::array<char*, "
         "1ul> >(int, at::native::FillFunctor<c10::BFloat16>, std::array<char*, 1ul>)", "other", "P1"),
        ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::ArgMaxOps<float>, unsigned "
         "int, long, 4, 4> >(at::native::ReduceOp<float, at::native::ArgMaxOps<float>, unsigned int, long, 4, 4>)",
         "other", "P2"),
        ("void at::native::(anonymous namespace)::CatArrayBatchedCopy_alignedK_contig<at::native::(anonymous "
         "namespace)::OpaqueType<4u>, unsigned int, 1, 128, 1, 16>(at::native::(anonymous namespace)::OpaqueType<4u>*)",
         "other", "P3"),
        ("void at::native::index_elementwise_kernel<128, 4, at::native::gpu_index_kernel<at::native::index_kernel_impl<"
         "at::native::OpaqueType<4> >(at::TensorIteratorBase&, c10::ArrayRef<long>, c10::ArrayRef<long>)", "other", "P4"),
        ("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_scaled_fp4_quant_zeros_3", "other", "P5"),  # nvllm
        ("<unnamed>::nvfuser_pointwise_f0_c1_r0_g0(<unnamed>::Tensor<float, (int)2, (int)2>)", "other", "O9"),  # Fuser
    ])


def test_hf_llama_decode_on_h200_torch_2_11():
    """Names from our own H200 captures (capture/run_h200.sh: hf-small-eager nsys export, torch 2.11, CUDA 13)."""
    check([
        ("nvjet_sm90_tst_64x8_64x16_4x1_v_bz_TNT", "gemm", "G9"),
        ("nvjet_sm90_tst_64x8_64x16_4x1_v_bz_splitK_TNT", "gemm", "G9"),
        ("void cutlass::Kernel2<cutlass_80_simt_sgemm_128x32_8x5_tn_align1>(T1::Params)", "gemm", "G8"),
        ("void cublasLt::splitKreduce_kernel<(int)32, (int)16, int, float, __nv_bfloat16, float, __nv_bfloat16, (bool)0, "
         "float, __nv_bfloat16, __nv_bfloat16, (bool)1, (bool)0, (bool)0, (bool)0>(T7)", "gemm", "G11"),
        ("cudnn_generated_fort_native_sdpa_sm80_flash_fprop_wmma_f16_knob_3_64x64x64_4x1x1_cga1x1x1_kernel0_0",
         "attention", "A5"),
        # HF RMSNorm = pow + mean + rsqrt + mul: elementwise and reduce, all OTHER
        ("void at::native::vectorized_elementwise_kernel<(int)4, void at::native::<unnamed>::pow_tensor_scalar_kernel_impl"
         "<float, float>(at::TensorIteratorBase &, T2)::[lambda(T1) (instance 2)], std::array<char *, (unsigned long)2>>"
         "(int, T2, T3)", "other", "P1"),
        ("void at::native::reduce_kernel<(int)512, (int)1, at::native::ReduceOp<float, at::native::MeanOps<float, float, "
         "float, float>, unsigned int, float, (int)4, (int)4>>(T3)", "other", "P2"),
        ("void at::native::<unnamed>::CatArrayBatchedCopy<at::native::<unnamed>::OpaqueType<(unsigned int)2>, unsigned int, "
         "(int)4, (int)64, (int)64>(T1 *, at::native::<unnamed>::CatArrInputTensorMetadata<T1, T2, T4, T5>, "
         "at::native::<unnamed>::TensorSizeStride<T2, (unsigned int)4>, int, T2)", "other", "P3"),
        ("void at::native::index_elementwise_kernel<(int)128, (int)4, void at::native::index_copy_kernel_impl<at::native::"
         "OpaqueType<(int)2>>(at::TensorIterator &, long, long, long)::[lambda(int) (instance 1)]>(long, T3)",
         "other", "P4"),
        ("void at::native::<unnamed>::indexSelectSmallIndex<c10::BFloat16, long, unsigned int, (int)2, (int)2, (int)-2>("
         "at::cuda::detail::TensorInfo<T1, T3>, at::cuda::detail::TensorInfo<const T1, T3>)", "other", "O7"),
        # torch symmetric memory at world size 1 (synthetic-symm-eager capture)
        ("void <unnamed>::one_shot_all_reduce_kernel<c10::BFloat16, (int)16, (int)-1>(T1 **, T1 *, T1 *, unsigned long, "
         "unsigned long, unsigned long, unsigned int **, unsigned long, unsigned long)", "communication", "C8"),
    ])


def test_name_traps():
    check([
        # splitKreduce is part of the GEMM, not a reduction (reference §4.3; lora_perf bs16-TP-0)
        ("void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16, float, __nv_bfloat16, false, float, "
         "__nv_bfloat16, __nv_bfloat16, true, false, false, false>(cublasLt::cublasSplitKParams<float>)", "gemm", "G11"),
        # CuTe-DSL norm contains 'cutlass' but is a norm (lora_perf bs16-TP-0)
        ("kernel_cutlass_kernel_flashinfernormkernelsfused_add_rmsnormFusedAddRMSNormKernel_object_at__tensorptrbf16"
         "gmemalign128o204820481_tensorptrbf16gmemalign128o204820481_tensorptrbf16gmemalign_0", "other", "O0"),
        # FA3 is a cutlass::device_kernel, but attention (profile-data/train.json)
        ("void cutlass::device_kernel<flash::FlashAttnBwd<flash::CollectiveMainloopBwd<2, cute::tuple<cute::C<1>, "
         "cute::C<1>, cute::C<1> >, cute::tuple<cute::C<64>, cute::C<128>, cute::C<192> > > > >", "attention", "A4"),
        # cuDNN / flash names with cutlass template args stay attention (pytorch_flash above); and the MoE
        # finalize (cutlass::bfloat16_t args) is not a GEMM (TraceLens b200)
        ("void moe::dev::finalize::finalizeKernelVecLoad<moe::dev::finalize::KernelParams<cutlass::bfloat16_t, "
         "cutlass::bfloat16_t, 4, true> >(moe::dev::finalize::KernelParams<cutlass::bfloat16_t, cutlass::bfloat16_t, "
         "4, true>)", "other", "O6"),
        # act_and_mul inside fused names, rotary fused with the KV store -> KV write (attention)
        ("void (anonymous namespace)::fused_rope_store_kernel<true, 128l, true, __nv_bfloat16, long, 16u>(x)",
         "attention", "A11"),
        # fbgemm in argument types does not make an embedding kernel a GEMM (HTA sampled_rank-0)
        ("void split_embedding_codegen_forward_unweighted_kernel<c10::Half, c10::Half, float, false, long, 2ul, 32ul>("
         "at::GenericPackedTensorAccessor<c10::Half, 1ul, at::RestrictPtrTraits, long>, fbgemm_gpu::FixedDivisor)",
         "other", "O7"),
        # symm-mem one_shot_all_reduce vs SGLang all_reduce_one_shot: both communication, different subs
        ("void (anonymous namespace)::all_reduce_one_shot_kernel<__nv_bfloat16, 2u, true>(x)", "communication", "C6"),
    ])


def test_unknown_is_other_with_null_rule():
    # pipit/.../saxpy-mpi-cuda_nsys_perlmutter0.sqlite: a plain user kernel
    assert one("saxpy(double *, double *, double *, double, int)") == ("other", "unknown", None)


def test_classify_keeps_rows_order_nulls_and_classifies_unique_names(monkeypatch):
    calls = collections.Counter()
    real = cl._classify_one

    def counting(name, rules):
        calls[name] += 1
        return real(name, rules)

    monkeypatch.setattr(cl, "_classify_one", counting)
    names = pl.Series("kernel", ["nvjet_tst_64x8_64x16_4x1_v_bz_TNT", None, "memcpy128"] * 1000 + ["rotary_kernel"])
    out = classify(names)
    assert out.columns == ["name", "category", "sub", "rule"]
    assert out.height == names.len()
    assert out["name"].to_list() == names.to_list()
    assert out["category"].to_list()[:4] == ["gemm", "other", "memory", "gemm"]
    assert out["rule"].to_list()[:3] == ["G9", None, "M2"]
    assert out["category"][-1] == "other" and out["rule"][-1] == "O3"
    assert max(calls.values()) == 1 and len(calls) == 3  # each distinct non-null name once
    assert classify(pl.Series([], dtype=pl.String)).height == 0


def test_shipped_rules_shape_and_order():
    rules = load_rules()
    assert load_rules() is rules  # loaded once
    ids = [r.id for r in rules]
    assert len(ids) == len(set(ids)) and len(rules) >= 70
    assert {r.category for r in rules} == set(cl.CATEGORIES)
    assert all(r.source for r in rules)
    # order of families per reference §0
    family = [r.id.rstrip("0123456789") for r in rules]
    firsts = {f: family.index(f) for f in dict.fromkeys(family)}
    assert list(firsts) == ["M", "C", "S", "L", "O", "A", "G", "P"]
    assert ids.index("O0") < ids.index("A1") < ids.index("G1") < ids.index("O1") < ids.index("P1")


# ───────────────────────────── user rules (--rules FILE) ─────────────────────────────


def test_extra_rules_add_and_override(tmp_path):
    f = tmp_path / "my.toml"
    f.write_text(
        "[[rule]]\n"
        "id = \"X1\"\ncategory = \"communication\"\nsub = \"mine\"\n"
        "pattern = '^saxpy\\('\nsource = \"our in-house AR\"\n\n"
        "[[rule]]\n"  # override a shipped rule by id: reduce_kernel becomes sampling
        "id = \"P2\"\ncategory = \"other\"\nsub = \"sampling\"\npattern = ['ArgMaxOps', 'reduce_kernel']\n"
    )
    rules = load_rules(f)
    assert [r.id for r in rules][:2] == ["X1", "P2"]
    assert sum(r.id == "P2" for r in rules) == 1
    assert one("saxpy(double *, double *, double *, double, int)", rules) == ("communication", "mine", "X1")
    assert one("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::ArgMaxOps<float>>>",
               rules) == ("other", "sampling", "P2")
    # extra rules are tried first: they win over a shipped rule that also matches
    f2 = tmp_path / "first.toml"
    f2.write_text("[[rule]]\nid = 'MYNV'\ncategory = 'other'\npattern = '^nvjet_'\n")
    assert one("nvjet_tst_64x8_64x16_4x1_v_bz_TNT", load_rules(f2)) == ("other", "other", "MYNV")
    assert one("nvjet_tst_64x8_64x16_4x1_v_bz_TNT") == ("gemm", "cublas", "G9")  # shipped set untouched


@pytest.mark.parametrize(
    "text, message",
    [
        ("[[rule]]\nid = 'B1'\ncategory = 'gemm'\npattern = 'gemm(('\n", r"rule 'B1' \(#1\): invalid regex"),
        ("[[rule]]\nid = 'B1'\ncategory = 'gpu'\npattern = 'x'\n", r"unknown category 'gpu'; use one of"),
        ("[[rule]]\nid = 'B1'\ncategory = 'gemm'\n", r"missing key\(s\) pattern"),
        ("[[rule]]\nid = 'B1'\ncategory = 'gemm'\npattern = ''\n", r"empty pattern"),
        ("[[rule]]\nid = 'B1'\ncategory = 'gemm'\npattern = 'x'\ncolour = 'red'\n", r"unknown key\(s\) colour"),
        ("[[rule]]\nid = 'B1'\ncategory = 'gemm'\npattern = 'x'\n[[rule]]\nid = 'B1'\ncategory = 'gemm'\npattern = 'y'\n",
         r"duplicate id 'B1'"),
        ("[[rule]\nid = 'B1'\n", r"invalid TOML"),
        ("[rule]\nid = 'B1'\n", r"write each rule as \[\[rule\]\]"),
        ("# nothing\n", r"no \[\[rule\]\] or \[\[op\]\] tables"),
    ],
)
def test_bad_rules_file_raises_one_line_tracekit_error(tmp_path, text, message):
    f = tmp_path / "bad.toml"
    f.write_text(text)
    with pytest.raises(TracekitError, match=message) as e:
        load_rules(f)
    assert "\n" not in str(e.value) and str(f) in str(e.value)


def test_missing_rules_file(tmp_path):
    with pytest.raises(TracekitError, match="not found"):
        load_rules(tmp_path / "nope.toml")


# ───────────────────────────── conformance on real traces ─────────────────────────────

DECODE_TRACES = [
    "TraceLens/tests/traces/inference/sglang_decode/sglang_Qwen3-8B_decode.json.gz",  # SGLang, MI300X, graph
    "TraceLens/tests/traces/inference/vllm_decode_full/graph_execution.json.gz",  # vLLM, MI300X, full graph
    "TraceLens/tests/traces/b200/eager_trace.json.gz",  # vLLM TP8, B200, eager
    *[f"{LORA}/bs16-TP-{r}.trace.json.gz" for r in range(4)],  # SGLang TP4, GB300, graph
    NVLLM,  # vLLM, GB10, piecewise graphs
]
# every trace that holds communication kernels (plus the rest of the decode traces above)
COMM_TRACES = DECODE_TRACES + [
    "HolisticTraceAnalysis/tests/data/nccl_parser_config/nccl_data.json.gz",
    "HolisticTraceAnalysis/tests/data/df_index_resolver/df_index_resolver.json.gz",
    "HolisticTraceAnalysis/tests/data/negative_queue_length_values_check/rank0.json.gz",
    "HolisticTraceAnalysis/tests/data/trace_diff/control/control.json.gz",
    "HolisticTraceAnalysis/tests/data/trace_diff/test/test.json.gz",
    "HolisticTraceAnalysis/tests/data/timeline_analysis/sampled_rank-0.json.gz",
    "HolisticTraceAnalysis/tests/data/trace_filter/sampled_rank-1.json.gz",
    "profile-data/train.json",
    "nsys-ai/tests/fixtures/mfu_2gpu_before.sqlite",
    "nsys-ai/tests/fixtures/mfu_2gpu_after.sqlite",
]
# a name that any collective implementation would carry (DeepEP's get_dispatch_layout is local compute, not comm)
COMM_NAME = re.compile(
    r"(?i)nccl|all_?reduce|all_?gather|reduce_?scatter|multimem|cross_device_reduce|lamport|dpsk::ep::(internode|intranode)::|deep_ep::"
)


def _kernel_times(rel: str) -> dict[str, float]:
    """name -> summed duration (ns) of the kernel records of one trace."""
    path = shared(rel)
    out: collections.Counter[str] = collections.Counter()
    if path.suffix == ".sqlite":
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            q = ("SELECT s.value, SUM(k.end - k.start) FROM CUPTI_ACTIVITY_KIND_KERNEL k "
                 "JOIN StringIds s ON k.demangledName = s.id GROUP BY s.value")
            out.update(dict(con.execute(q).fetchall()))
        finally:
            con.close()
        return out
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt") as f:
        doc = json.load(f)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in ("kernel", "Kernel"):
            out[e["name"]] += float(e.get("dur", 0)) * 1000.0
    return out


@pytest.fixture(scope="module")
def trace_times():
    shared_dir()
    cache: dict[str, dict[str, float]] = {}

    def get(rel: str) -> dict[str, float]:
        if rel not in cache:
            cache[rel] = _kernel_times(rel)
        return cache[rel]

    return get


def _shares(times: dict[str, float]) -> tuple[float, dict[str, float]]:
    df = classify(pl.Series(list(times), dtype=pl.String)).with_columns(t=pl.Series(list(times.values())))
    total = df["t"].sum()
    unmatched = df.filter(pl.col("rule").is_null())["t"].sum() / total
    per_cat = {c: t / total for c, t in df.group_by("category").agg(pl.col("t").sum()).iter_rows()}
    return unmatched, per_cat


@pytest.mark.parametrize("rel", DECODE_TRACES, ids=lambda r: r.split("/")[-1][:40])
@pytest.mark.slow
def test_decode_traces_are_covered(trace_times, rel):
    unmatched, per_cat = _shares(trace_times(rel))
    assert unmatched < 0.05, f"{unmatched:.1%} of kernel time unmatched"
    assert per_cat.get("gemm", 0) > 0.05
    assert per_cat.get("attention", 0) > 0.01


def test_decode_traces_exact_shares(trace_times):
    """Pin the measured numbers of docs/taxonomy.md for two traces (time shares, %)."""
    un, cats = _shares(trace_times(f"{LORA}/bs16-TP-0.trace.json.gz"))
    assert un == 0.0
    assert round(100 * cats["communication"], 1) == 42.1 and round(100 * cats["gemm"], 1) == 34.3
    assert round(100 * cats["attention"], 1) == 7.7 and round(100 * cats["memory"], 1) == 3.0
    un, cats = _shares(trace_times("TraceLens/tests/traces/b200/eager_trace.json.gz"))
    assert un == 0.0 and round(100 * cats["communication"], 1) == 19.7 and round(100 * cats["gemm"], 1) == 55.2


@pytest.mark.parametrize("rel", COMM_TRACES, ids=lambda r: r.split("/")[-1][:40])
def test_every_collective_is_communication(trace_times, rel):
    times = trace_times(rel)
    comm = [n for n in times if COMM_NAME.search(n)]
    got = classify(pl.Series(comm, dtype=pl.String))
    wrong = got.filter(pl.col("category") != "communication")["name"].to_list()
    assert not wrong, wrong
    # and nothing else is: communication only where a collective name is
    others = classify(pl.Series([n for n in times if not COMM_NAME.search(n)], dtype=pl.String))
    assert others.filter(pl.col("category") == "communication").height == 0


# ───────────────────────────── issue 24: serving-window families, categories by the launching op ─────────────


def test_issue24_families():
    """Names from the engines' sources (kernels.toml cites each): MLA cache write / query concat / metadata are
    attention (as reshape_and_cache_flash is), low-latency linears and Inductor's decomposed mm are GEMMs, LoRA
    shrink/expand are GEMMs (sub lora), DeepGEMM's scheduler metadata and scale-layout kernels are NOT gemm."""
    check([
        ("void vllm::concat_and_cache_ds_mla_kernel<__nv_bfloat16, unsigned char>(__nv_bfloat16 const*, "
         "__nv_bfloat16 const*, unsigned char*, long const*, int, int, int, int, int, int, float const*)",
         "attention", "A14"),
        ("void vllm::concat_and_cache_mla_kernel<__nv_bfloat16, __nv_bfloat16, (vllm::Fp8KVCacheDataType)0>()",
         "attention", "A14"),
        ("void vllm::ConcatMLAQKernel<c10::BFloat16, 512>(c10::BFloat16*, c10::BFloat16 const*, "
         "c10::BFloat16 const*, int, int, long, long, long, long, long, long)", "attention", "A14"),
        ("void flash::get_mla_metadata_kernel<64, 1>(flash::Mla_metadata_params)", "attention", "A14"),
        ("ll_bf16_dotprodLLBf16Dotprod_object_at__tensorptrbf16gmemalign16o11", "gemm", "G17"),
        ("triton_red_fused_mm_0", "gemm", "G16"),
        ("triton_per_fused__to_copy_mm_3", "gemm", "G16"),
        ("triton_poi_fused_addmm_gelu_1", "other", "P5"),  # the epilogue of an extern GEMM, not the GEMM
        ("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_3", "other", "P5"),
        ("_lora_shrink_kernel", "gemm", "G18"),
        ("_lora_expand_kernel", "gemm", "G18"),
        ("_sgemm_lora_a_kernel", "gemm", "G18"),
        ("_sgemm_lora_b_kernel", "gemm", "G18"),
        ("_qkv_lora_b_kernel", "gemm", "G18"),
        ("_bgmv_shrink_kernel", "gemm", "G18"),
        ("_sgmv_expand_kernel", "gemm", "G18"),
        ("void deep_gemm::sched::smxx_paged_mqa_logits_metadata<32u, 256u, 132u>(unsigned int, unsigned int, "
         "bool, unsigned int const*, unsigned int*)", "attention", "A12"),
        ("void deep_gemm::smxx_paged_mqa_logits_metadata<1>", "attention", "A12"),
        ("void deep_gemm::smxx_clean_logits<1>", "attention", "A12"),
        ("void deep_gemm::transpose_fp32<256u, 32u, 4u, 5u>(float const*, float*, unsigned int)", "other", "O11"),
        ("void deep_gemm::transpose_and_pack_fp32_into_ue8m0<256u, 32u, 4u>(float*, unsigned int*, unsigned int)",
         "other", "O11"),
        ("void deep_gemm::sm90_fp8_gemm_1d2d_impl<0u, 4096u, 7168u>(float*, int*, unsigned int)", "gemm", "G6"),
    ])
    assert one("_lora_shrink_kernel")[1] == "lora"


def test_launching_op_is_the_one_kineto_links():
    """The innermost framework op open on the launching thread at the launch call is the op Kineto links the kernel
    to (the kernel's and the cpu_op's 'External id', read here from the JSON): every one of the 19,278 linked kernels
    of hf-small-eager-torch."""
    import tracekit

    from conftest import sample

    path = sample("hf-small-eager-torch/trace.json.gz")
    events = json.load(gzip.open(path))["traceEvents"]
    op_of = {e["args"]["External id"]: e["name"] for e in events
             if e.get("cat") == "cpu_op" and "External id" in e.get("args", {})}
    want = {e["args"]["correlation"]: op_of.get(e["args"]["External id"]) for e in events
            if e.get("cat") == "kernel" and "External id" in e.get("args", {})}
    t = tracekit.load(path)
    launches = t.launches.filter(pl.col("kind") == "kernel")
    got = dict(zip(launches["correlation"], cl.launching_ops(cl.op_frames(t), launches)))
    assert len(want) == 19278
    assert all(got.get(c) == op for c, op in want.items())


@pytest.mark.parametrize("source", ["hf-small-eager-torch", "nsys-ai/tests/fixtures/h100_2gpu_1s.sqlite"])
def test_op_categories_agree_with_name_categories(source):
    """With the name rules taken away, every kernel takes its category from its launching op (Kineto cpu_op events;
    nsys NVTX ranges of emit_nvtx), and that category agrees with the one its name gives: two independent sources.
    ``rule`` says op:<name>."""
    import tracekit

    from conftest import sample_trace

    path = sample_trace(source) if "/" not in source else shared(source)
    t = tracekit.load(path)
    ops_only = cl.Rules(rules=(), ops=load_rules().ops)
    pos, table = cl.name_table(t.kernels["name"], ops_only)
    by_op = cl.with_op_categories(table, pos, t.kernels, t, ops_only)
    by_name = classify(by_op["name"])
    both = by_op.with_columns(by_name=by_name["category"]).filter(pl.col("rule").is_not_null())
    assert both.height >= 0.8 * by_op.height
    assert both["rule"].str.starts_with("op:").all()
    assert (both["category"] == both["by_name"]).all(), both.filter(pl.col("category") != pl.col("by_name"))
    assert {"gemm", "other"} <= set(both["category"])


def test_kernels_rule_op_only_where_no_name_rule(tmp_path):
    """`tracekit kernels`: a name no [[rule]] matches but whose launching op an [[op]] rule knows shows rule
    op:<op>; the shipped name rules still come first (a user rule file that claims nothing changes no name)."""
    import tracekit
    from tracekit.results.kernels import kernel_summary

    from conftest import sample_trace

    t = tracekit.load(sample_trace("hf-small-eager-torch"))
    plain = kernel_summary(t)
    assert not any((r["rule"] or "").startswith("op:") for r in plain["kernels"])
    f = tmp_path / "ops.toml"  # a user [[op]] table alone: the shipped name rules keep every kernel
    f.write_text("[[op]]\nid = 'U1'\ncategory = 'gemm'\npattern = '^aten::copy_$'\nsource = 'test'\n")
    assert kernel_summary(t, rules=str(f))["kernels"] == plain["kernels"]
    assert load_rules(str(f)).ops[0].id == "U1" and len(load_rules(str(f)).ops) == len(load_rules().ops) + 1
    # the lm_head / MLP GEMM renamed to a name no rule knows: its launching op (aten::mm) files it as gemm
    import dataclasses

    gemm = "nvjet_sm90_tst_64x8_64x16_4x1_v_bz_TNT"
    names = t.kernels["name"].cast(pl.String)
    k = t.kernels.with_columns(name=pl.when(names == gemm).then(pl.lit("mystery_xyz")).otherwise(names)
                               .cast(pl.Categorical))
    out = kernel_summary(dataclasses.replace(t, kernels=k))
    row = next(r for r in out["kernels"] if r["name"] == "mystery_xyz")
    before = next(r for r in plain["kernels"] if r["name"] == gemm)
    assert (row["category"], row["rule"], row["count"]) == ("gemm", "op:aten::mm", before["count"])
    assert any("categorised by the framework op" in w for w in out["warnings"])
