"""Compute on the roofline: dense peak TFLOP/s per GPU and dtype (the datasheets' figures), the FLOPs a decode
step does (2 x the parameters a token multiplies x the tokens, + attention), the compute floor, and the floor as
the larger of the memory and compute floors, in ``ceiling`` and in breakdown's ``roofline``.

Figures are checked against what was published independently of tracekit: the datasheets' peaks (halved where
they print "with sparsity"), the models' parameter counts on their cards and checkpoint indexes
(tests/data/configs/README.md), torch's own count of the H200 checkpoint (tests/data/h200_checkpoints), and a
real prefill capture's GEMM time.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from click.testing import CliRunner

import tracekit
from tracekit.analyses.resolve import peak_tflops as resolve_peak_tflops
from tracekit.analyses.roofline import (
    model_compute_dtype,
    model_flops,
    physical_check,
    step_roofline,
    weight_bytes_from_shapes,
    with_compute,
)
from tracekit.cli.app import cli
from tracekit.gpus import list_gpus, lookup, tflops_markdown
from tracekit.model import load_config, model_from_config
from tracekit.model.units import dtype_bytes
from tracekit.results.ceiling import ceiling

from conftest import DATA, ROOT, sample_trace

CONFIGS = DATA / "configs"
H100_BW, H100_BF16 = 3350.0, 989.0  # H100 SXM datasheet: 3.35 TB/s; BF16 1,979 TFLOPS with sparsity


def run_json(*args: str) -> dict:
    r = CliRunner().invoke(cli, ["ceiling", *args, "--format", "json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


# --------------------------------------------------------------------------- the done-when

def test_dense_8b_bf16_on_an_h100_is_memory_bound_at_batch_1_and_compute_bound_at_512():
    one = run_json("--gpu", "NVIDIA H100 80GB HBM3", "--params", "8e9", "--dtype", "bf16")
    assert one["bound"] == "memory" and one["peak_tflops"] == H100_BF16 and one["peak_tflops_source"] == "table"
    assert one["floor_ms"] == one["memory_floor_ms"] == pytest.approx(16e9 / (H100_BW * 1e9) * 1e3)
    big = run_json("--gpu", "NVIDIA H100 80GB HBM3", "--params", "8e9", "--dtype", "bf16", "--batch", "512")
    by_hand = 2 * 8e9 * 512 / (H100_BF16 * 1e12) * 1e3  # 2 x parameters x tokens / peak = 8.28 ms
    assert big["bound"] == "compute"
    assert big["compute_floor_ms"] == pytest.approx(by_hand, rel=0.05) and round(by_hand, 1) == 8.3
    assert big["memory_floor_ms"] == pytest.approx(4.776, abs=1e-3)  # 16 GB of weights at 3.35 TB/s
    assert big["floor_ms"] == big["compute_floor_ms"]  # the larger floor; the ceilings follow it
    assert big["ceiling_tokens_per_s"] == pytest.approx(512 * 1000 / big["compute_floor_ms"])
    assert big["flops_per_step_per_gpu"] == 2 * 8e9 * 512
    assert big["roofline"]["floor_ms"] == big["memory_floor_ms"]  # (the roofline block: the bytes' own figures)
    assert "compute-bound" in big["summary"]


def test_a_real_8b_config_crosses_over_between_batch_1_and_512():
    """Llama-3.1-8B's config: 8,030,261,248 parameters (its checkpoint index); a token multiplies all but the
    embedding table (128,256 x 4,096) and the 65 norm vectors."""
    llama = CONFIGS / "Llama-3.1-8B.json"
    per_token = 2 * (8_030_261_248 - 128_256 * 4096 - 65 * 4096)
    for batch, bound in ((1, "memory"), (512, "compute")):
        c = ceiling(gpu="H100", model=llama, batch=batch)
        assert c.bound == bound and c.flops_per_step_per_gpu == per_token * batch
    c = ceiling(gpu="H100", model=llama, batch=512)
    assert c.compute_floor_ms == pytest.approx(2 * 8.03e9 * 512 / (H100_BF16 * 1e12) * 1e3, rel=0.07)
    assert c.compute_floor_ms == pytest.approx(per_token * 512 / (H100_BF16 * 1e12) * 1e3, rel=1e-12)
    # TP 2 halves every GPU's FLOPs; the context adds attention (4 x 32 heads x 128 x context per token and layer)
    c2 = ceiling(gpu="H100", model=llama, batch=512, tp=2, context=1024)
    attention = 512 * 32 * 4 * (32 // 2) * 128 * 1024
    assert c2.flops_per_step_per_gpu == pytest.approx(per_token * 512 / 2 + attention)


@pytest.mark.parametrize("config,published_active,embedding", [
    ("Qwen3-30B-A3B.json", 3.3e9, 151_936 * 2048),   # model card: 3.3B activated
    ("DeepSeek-V3.json", 37e9, 129_280 * 7168),      # model card: 37B activated per token
])
def test_moe_flops_count_the_activated_parameters(config, published_active, embedding):
    f = model_flops(model_from_config(load_config(CONFIGS / config)), tokens=1)
    assert f.gemm / 2 == pytest.approx(published_active - embedding, rel=0.03)


def test_the_gemms_run_at_the_checkpoints_dtype():
    assert model_compute_dtype(model_from_config(load_config(CONFIGS / "DeepSeek-V3.json")))[0] == "fp8"
    assert model_compute_dtype(model_from_config(load_config(CONFIGS / "Qwen3-8B.json")))[0] == "bfloat16"
    fp8 = model_from_config(load_config(DATA / "h200_checkpoints" / "fp8" / "config.json"))
    assert model_compute_dtype(fp8)[0] == "fp8"
    c = ceiling(gpu="NVIDIA H200", model=DATA / "h200_checkpoints" / "fp8" / "config.json", batch=64)
    assert c.peak_tflops == 1979.0  # H200 SXM: FP8 3,958 TFLOPS with sparsity
    nv = model_from_config({**load_config(CONFIGS / "Qwen3-8B.json"),
                            "quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4"}})
    assert model_compute_dtype(nv)[0] == "nvfp4"
    awq = model_from_config({**load_config(CONFIGS / "Qwen3-8B.json"),
                             "quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128}})
    assert model_compute_dtype(awq)[0] == "bfloat16"  # weight-only: the GEMMs run at the activations' rate


# --------------------------------------------------------------------------- the table's peaks

DATASHEET = [  # (trace name, dtype, dense TFLOP/s: the datasheet's, halved where it prints "with sparsity")
    ("NVIDIA H100 80GB HBM3", "bf16", 989), ("NVIDIA H100 80GB HBM3", "fp8", 1979),
    ("NVIDIA H100 PCIe", "bf16", 756), ("NVIDIA H100 PCIe", "fp8", 1513),
    ("NVIDIA H200", "bf16", 989), ("NVIDIA H200", "fp8", 1979), ("NVIDIA H200 NVL", "fp8", 1671),
    ("NVIDIA B200", "bf16", 2250), ("NVIDIA B200", "fp8", 4500), ("NVIDIA B200", "nvfp4", 9000),
    ("NVIDIA B200", "mxfp4", 9000), ("NVIDIA GB200", "bf16", 2500), ("NVIDIA GB200", "fp4", 10000),
    ("NVIDIA GB300", "nvfp4", 15000), ("NVIDIA GB300", "fp8", 5000),
    ("NVIDIA A100-SXM4-80GB", "bf16", 312), ("NVIDIA A100-PCIE-40GB", "fp16", 312), ("NVIDIA A100-SXM4-80GB", "fp8", 312),
    ("NVIDIA L40S", "bf16", 366.5), ("NVIDIA L40S", "fp8", 733),
    ("NVIDIA RTX A6000", "bf16", 154.8), ("NVIDIA GeForce RTX 4090", "bf16", 165.2),
    ("NVIDIA GeForce RTX 4090", "fp8", 330.3), ("NVIDIA GeForce RTX 5090", "bf16", 209.5),
    ("NVIDIA GeForce RTX 5090", "nvfp4", 1676),
    ("NVIDIA GB10", "nvfp4", 500), ("NVIDIA GB10", "bf16", None), ("NVIDIA GB10", "fp8", None),  # 1 PFLOP FP4
    # with sparsity; no BF16/FP8 published
    ("AMD Instinct MI300X", "bf16", 1307.4), ("AMD Instinct MI300X", "fp8", 2614.9),
    ("NVIDIA H100 80GB HBM3", "int4", 989),  # weight-only int4: the bf16 rate
    # no tensor cores for the weights' dtype (fp8 on Ampere, fp4 on Hopper and MI300X): dequantized, the bf16 rate
    ("AMD Instinct MI300X", "mxfp4", 1307.4), ("NVIDIA H100 80GB HBM3", "nvfp4", 989),
]


@pytest.mark.parametrize("name,dtype,tflops", DATASHEET)
def test_dense_peaks_are_the_datasheets(name, dtype, tflops):
    value, source, _ = resolve_peak_tflops(None, name, dtype)
    assert value == tflops and source == ("table" if tflops else None)


def test_every_peak_has_a_source_and_the_docs_show_the_table():
    with_peaks = [g for g in list_gpus() if g.peak_tflops]
    assert len(with_peaks) >= 20 and all(g.tflops_source for g in with_peaks)
    for g in with_peaks:  # (a typo guard: every datasheet here doubles the rate from bf16 to fp8, and again to fp4)
        t = dict(g.peak_tflops)
        if "fp8" in t and "bf16" in t:
            assert t["fp8"] == pytest.approx(2 * t["bf16"], rel=0.01), g.name
        if "fp4" in t and "fp8" in t:
            assert t["fp4"] >= 2 * t["fp8"], g.name
    gb10 = lookup("NVIDIA GB10")
    assert (gb10.peak_bw_gbps, gb10.memory_gb) == (273, 128)  # DGX Spark: 273 GB/s LPDDR5x, 128 GB
    assert tflops_markdown() in (ROOT / "docs" / "roofline.md").read_text()


def test_fp4_dtypes_count_their_scales():
    # nvfp4: 4-bit values + an FP8 scale per 16; mxfp4: + an E8M0 scale per 32; bare fp4: the 4 bits alone
    assert (dtype_bytes("nvfp4"), dtype_bytes("mxfp4"), dtype_bytes("fp4")) == (0.5625, 0.53125, 0.5)
    d = run_json("--gpu", "NVIDIA B200", "--params", "27e9", "--dtype", "nvfp4", "--batch", "64")
    assert d["bytes_per_step_per_gpu"] == 27e9 * 0.5625 and d["peak_tflops"] == 9000
    assert any("nvfp4" in a and "FP4" in a for a in d["assumptions"])
    gb10 = run_json("--gpu", "NVIDIA GB10", "--params", "27e9", "--dtype", "mxfp4")
    assert gb10["bytes_per_step_per_gpu"] == 27e9 * 0.53125 and gb10["gpu"]["peak_bw_gbps"] == 273


def test_the_flag_wins_and_unknowns_stay_null():
    d = run_json("--gpu", "NVIDIA GB10", "--params", "8e9", "--dtype", "bf16", "--peak-tflops", "62")
    assert (d["peak_tflops"], d["peak_tflops_source"], d["bound"]) == (62.0, "flag", "memory")
    none = run_json("--gpu", "NVIDIA GB10", "--params", "8e9", "--dtype", "bf16")
    assert none["peak_tflops"] is None and none["compute_floor_ms"] is None and none["bound"] is None
    assert none["floor_ms"] == none["memory_floor_ms"]
    assert any("compute not bounded" in a and "--peak-tflops" in a for a in none["assumptions"])
    bytes_only = run_json("--gpu", "H100", "--weight-bytes", "16GB", "--batch", "512")
    assert bytes_only["flops_per_step_per_gpu"] is None and bytes_only["bound"] is None
    r = CliRunner().invoke(cli, ["ceiling", "--gpu", "H100", "--params", "8e9", "--peak-tflops", "-3"])
    assert r.exit_code == 2 and r.output.count("\n") == 1 and "--peak-tflops" in r.output


# --------------------------------------------------------------------------- breakdown's roofline

def test_shape_flops_by_hand():
    import polars as pl

    ops = pl.DataFrame([
        dict(start=0, end=5, pid=1, tid=1, name="aten::addmm", input_dims="[[768], [1, 768], [768, 3072], [], []]",
             input_types='["float", "float", "float", "Scalar", "Scalar"]'),
        dict(start=10, end=15, pid=1, tid=1, name="aten::linear", input_dims="[[2, 3, 4096], [11008, 4096], [11008]]",
             input_types='["c10::Half", "c10::Half", "c10::Half"]'),
        dict(start=20, end=25, pid=1, tid=1, name="aten::mm", input_dims="[[4096, 4096], [4096, 5]]",
             input_types='["c10::Half", "c10::Half"]'),
    ])
    _, d = weight_bytes_from_shapes(ops)
    assert d["flops_per_step"] == 2 * (1 * 768 * 3072 + 6 * 4096 * 11008 + 4096 * 4096 * 5)
    assert d["weight_dtype"] == "half"


def test_breakdown_flops_from_shapes_equal_those_from_the_config():
    """The H200 capture's small model: its recorded shapes (Kineto, no manifest) and its config give the same
    FLOPs, 2 x torch's count of the step's parameters less the 49 norm vectors (tests/data/h200_checkpoints)."""
    counts = json.loads((DATA / "h200_checkpoints" / "bf16" / "torch_counts.json").read_text())
    params = counts["step_read"]["target_bytes"] // 2  # bf16
    want = 2 * (params - 49 * 896)
    t = tracekit.load(sample_trace("hf-small-eager-torch"))
    shapes = tracekit.breakdown(replace(t, manifest=None)).roofline
    assert shapes["weight_bytes_source"] == "shapes" and shapes["flops_per_step"] == want
    model = tracekit.breakdown(tracekit.load(sample_trace("hf-small-eager")),
                               model=DATA / "h200_checkpoints" / "bf16" / "config.json").roofline
    assert model["weight_bytes_source"] == "model" and model["flops_per_step"] == want
    for r in (shapes, model):  # batch 1 decode on an H200: memory-bound; GEMM TFLOP/s = FLOPs over gemm time
        assert r["bound"] == "memory" and r["peak_tflops"] == 989.0
        assert r["floor_ms"] == r["memory_floor_ms"] > r["compute_floor_ms"]
        gemm_s = r["weight_bytes_per_step"] / (r["gemm_achieved_bw_gbps"] * 1e9)  # the gemm kernel time per step
        assert r["gemm_achieved_tflops"] == pytest.approx(want / gemm_s / 1e12)


def test_a_prefill_step_is_compute_bound():
    """serve-prefill: the same small model prefilling hundreds of tokens per step on the H200. Its GEMMs do ~1.47
    TFLOP per step at ~620 TFLOP/s: compute-bound, while the weights stream at only ~420 GB/s; its decode steps
    are memory-bound."""
    t = replace(tracekit.load(sample_trace("serve-prefill-eager-torch-nomark")), manifest=None)
    pre = tracekit.breakdown(t, phase="prefill").roofline
    assert pre["bound"] == "compute" and pre["floor_ms"] == pre["compute_floor_ms"] > pre["memory_floor_ms"]
    assert 0.5 * 989 < pre["gemm_achieved_tflops"] < 989  # below the peak, above half of it
    assert pre["gemm_achieved_bw_gbps"] < 0.1 * 4800     # nowhere near the bandwidth ceiling
    dec = tracekit.breakdown(t, phase="decode").roofline
    assert dec["bound"] == "memory" and dec["flops_per_step"] < pre["flops_per_step"] / 100


def test_impossible_tflops_refuse_the_roofline():
    m = step_roofline(weight_bytes_per_step=1e9, peak_bw_gbps=4800, reference_step_ms=5.0, tokens_per_step=512,
                      gemm_ms=1.0)
    r = with_compute(m, gemm_flops_per_step=2e12, peak_tflops=989, gemm_ms=1.0, reference_step_ms=5.0)
    assert r.gemm_achieved_tflops == pytest.approx(2000)  # 2 TFLOP in 1 ms: twice the peak
    refused, why = physical_check(r, 4800, gemm_ms=1.0, reference_step_ms=5.0, suspects=["--tokens-per-step (512)"])
    assert "cannot run in 1.000 ms of gemm kernels at the peak 989 TFLOP/s" in why and why.endswith("(512)")
    assert refused.floor_ms is None and refused.bound is None and refused.gemm_achieved_tflops is None
    assert refused.flops_per_step == 2e12  # the inputs to check stay


def test_a_compute_floor_is_stated_as_one():
    """Where the FLOPs at peak take longer than the bytes (the small H200 model at 512 tokens a step: 2 x its
    parameters x 512 at 989 TFLOP/s, 0.511 ms, against 0.206 ms for its 0.99 GB), the memory-bandwidth lever and the
    headline state the compute floor — never "X% of the bandwidth ceiling" for a step the bandwidth does not bound."""
    counts = json.loads((DATA / "h200_checkpoints" / "bf16" / "torch_counts.json").read_text())
    params = counts["step_read"]["target_bytes"] // 2 - 49 * 896  # (less the norm vectors, as above)
    b = tracekit.breakdown(tracekit.load(sample_trace("hf-small-graph")), tokens_per_step=512,
                           model=DATA / "h200_checkpoints" / "bf16" / "config.json")
    r, verdict = b.roofline, b.advice["memory_bandwidth"]["verdict"]
    assert r["bound"] == "compute"
    assert r["compute_floor_ms"] == pytest.approx(2 * params * 512 / 989e12 * 1e3, rel=1e-6)
    assert r["floor_ms"] == r["compute_floor_ms"] > r["memory_floor_ms"]
    assert verdict.startswith(f"the step's FLOPs take {r['compute_floor_ms']:.3f} ms at 989 TFLOP/s peak")
    assert "bandwidth ceiling" not in b.headline and "of the compute ceiling" in b.headline
