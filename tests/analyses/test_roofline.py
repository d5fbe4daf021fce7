"""tracekit.analyses.roofline: the GPU table, peak-bandwidth precedence, roofline arithmetic and weight-byte inference;
then compute on the roofline (peak TFLOP/s, FLOPs per step, the compute floor; section below)."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import polars as pl
import pytest
from click.testing import CliRunner

import tracekit
from tracekit.analyses import resolve
from tracekit.analyses.resolve import peak_tflops as resolve_peak_tflops
from tracekit.analyses.roofline import (
    RooflineBlock,
    bytes_per_step,
    dtype_bytes,
    model_compute_dtype,
    model_flops,
    physical_check,
    roofline,
    step_roofline,
    weight_bytes_from_nvtx,
    weight_bytes_from_nvtx_detail,
    weight_bytes_from_shapes,
    with_compute,
)
from tracekit.cli.app import cli
from tracekit.errors import TracekitError
from tracekit.gpus import GpuSpec, list_gpus, lookup, table_markdown, tflops_markdown
from tracekit.model import load_config, model_from_config
from tracekit.results.ceiling import ceiling

from conftest import DATA, ROOT, sample_trace

# --------------------------------------------------------------------------- GPU table

# Names exactly as nsys (TARGET_INFO_GPU.name), Kineto (deviceProperties.name) and
# torch.cuda.get_device_name() report them -> expected row, datasheet GB/s.
TRACE_NAMES = [
    ("NVIDIA H200", "NVIDIA H200 SXM", 4800),
    ("NVIDIA H200 NVL", "NVIDIA H200 NVL", 4800),
    ("NVIDIA A100-SXM4-40GB", "NVIDIA A100 40GB SXM", 1555),
    ("A100-PG509-200", "NVIDIA A100 40GB SXM", 1555),
    ("NVIDIA A100-PG509-200", "NVIDIA A100 40GB SXM", 1555),
    ("NVIDIA A100-PCIE-40GB", "NVIDIA A100 40GB PCIe", 1555),
    ("NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB SXM", 2039),
    ("NVIDIA A100 80GB PCIe", "NVIDIA A100 80GB PCIe", 1935),
    ("NVIDIA H100 80GB HBM3", "NVIDIA H100 SXM", 3350),
    ("NVIDIA H100 PCIe", "NVIDIA H100 PCIe", 2000),
    ("NVIDIA H100 NVL", "NVIDIA H100 NVL", 3900),
    ("NVIDIA GH200 480GB", "NVIDIA GH200", 4000),
    ("NVIDIA GH200 144G HBM3e", "NVIDIA GH200 144GB HBM3e", 4900),
    ("Tesla V100-SXM2-32GB", "Tesla V100 SXM2", 900),
    ("Tesla V100-SXM2-16GB", "Tesla V100 SXM2", 900),
    ("Tesla V100-PCIE-16GB", "Tesla V100 PCIe", 900),
    ("Tesla T4", "Tesla T4", 320),
    ("NVIDIA GB300", "NVIDIA GB300", 8000),
    ("NVIDIA B300 SXM6 AC", "NVIDIA B300", 8000),
    ("NVIDIA GB200", "NVIDIA GB200", 8000),
    ("NVIDIA B200", "NVIDIA B200", 8000),
    ("NVIDIA GB10", "NVIDIA GB10", 273),  # DGX Spark (the nvllm trace's deviceProperties name)
    ("NVIDIA RTX A6000", "NVIDIA RTX A6000", 768),
    ("NVIDIA GeForce RTX 3090", "NVIDIA GeForce RTX 3090", 936),
    ("NVIDIA GeForce RTX 4090", "NVIDIA GeForce RTX 4090", 1008),
    ("NVIDIA GeForce RTX 3080", "NVIDIA GeForce RTX 3080", 760),
    ("NVIDIA GeForce RTX 4060 Laptop GPU", "NVIDIA GeForce RTX 4060 Laptop GPU", 256),
    ("NVIDIA L4", "NVIDIA L4", 300),
    ("NVIDIA L40S", "NVIDIA L40S", 864),
    ("NVIDIA L40", "NVIDIA L40", 864),
    ("NVIDIA A10", "NVIDIA A10", 600),
    ("NVIDIA A10G", "NVIDIA A10G", 600),
    ("Quadro GP100", "Quadro GP100", 732),
    ("AMD Instinct MI300X", "AMD Instinct MI300X", 5300),
    ("AMD Instinct MI325X", "AMD Instinct MI325X", 6000),
    ("AMD Instinct MI355X", "AMD Instinct MI355X", 8000),
    ("AMD Instinct MI250X", "AMD Instinct MI250X", 3277),
    ("AMD Instinct MI250", "AMD Instinct MI250", 3277),
    ("nvidia h200", "NVIDIA H200 SXM", 4800),  # case does not matter
    ("  NVIDIA   H200  ", "NVIDIA H200 SXM", 4800),
]


@pytest.mark.parametrize("name,row,bw", TRACE_NAMES)
def test_lookup_trace_names(name, row, bw):
    spec = lookup(name)
    assert isinstance(spec, GpuSpec), name
    assert (spec.name, spec.peak_bw_gbps) == (row, bw)


@pytest.mark.parametrize("name", [None, "", "NVIDIA A1000", "NVIDIA A100X", "Intel Arc A770", "cpu"])
def test_lookup_unknown(name):
    assert lookup(name) is None


def test_every_row_is_reachable_and_sourced():
    rows = list_gpus()
    assert len(rows) >= 40
    names = [r.name for r in rows]
    assert len(names) == len(set(names))
    for r in rows:
        # no earlier (less specific) pattern shadows a later row
        assert lookup(r.name) == r, f"{r.name} is shadowed by {lookup(r.name).name}"
        assert r.peak_bw_gbps > 0 and r.memory_gb > 0 and r.link_bw_gbps > 0
        assert r.source and r.link
        assert re.compile(r.pattern)


def test_links():
    assert lookup("NVIDIA H200").link.startswith("NVLink") and lookup("NVIDIA H200").link_bw_gbps == 450
    assert lookup("NVIDIA RTX A6000").link.startswith("PCIe") and lookup("NVIDIA RTX A6000").link_bw_gbps == 32
    assert "xGMI" in lookup("AMD Instinct MI300X").link


def test_user_table(tmp_path):
    p = tmp_path / "gpus.toml"
    p.write_text('[[gpu]]\nname = "Lab GPU"\npattern = "\\\\bLAB9\\\\b"\npeak_bw_gbps = 1234\nmemory_gb = 8\n'
                 'link = "PCIe"\nlink_bw_gbps = 16\nsource = "measured"\n')
    assert lookup("ACME LAB9", table=p).peak_bw_gbps == 1234
    assert lookup("NVIDIA H200", table=p) is None
    bad = tmp_path / "bad.toml"
    bad.write_text("[[gpu]]\nname = 1\n")
    with pytest.raises(TracekitError):
        lookup("x", table=bad)


def resolve_peak_bw(flag, manifest, trace, name):
    r = resolve.peak_bandwidth(flag=flag, manifest=manifest, trace=trace, name=name)
    return r.value, r.source


def test_resolve_peak_bw_precedence():
    assert resolve_peak_bw(900.0, 1000.0, 4700.0, "NVIDIA H200") == (900.0, "flag")
    assert resolve_peak_bw(None, 1000.0, 4700.0, "NVIDIA H200") == (1000.0, "manifest")
    assert resolve_peak_bw(None, None, 4700.0, "NVIDIA H200") == (4700.0, "trace")
    assert resolve_peak_bw(None, None, None, "NVIDIA H200") == (4800.0, "table")
    # nsys writes 0 for an unknown bandwidth: skipped, not used
    assert resolve_peak_bw(None, 0.0, float("nan"), "NVIDIA H200") == (4800.0, "table")
    assert resolve_peak_bw(None, None, None, "mystery") == (None, None)
    assert resolve_peak_bw(None, None, None, None) == (None, None)
    with pytest.raises(TracekitError):
        resolve_peak_bw(-1.0, None, None, "NVIDIA H200")


def test_resolve_peak_bw_multi_die_package():
    # An MI250X is two GCDs; a trace device is one of them.
    assert lookup("AMD Instinct MI250X").device_bw_gbps == pytest.approx(1638.5)
    assert resolve_peak_bw(None, None, None, "AMD Instinct MI250X") == (1638.5, "table")


def test_docs_gpu_table_is_current():
    doc = (ROOT / "docs" / "roofline.md").read_text()
    assert table_markdown() in doc, "docs/roofline.md GPU table is stale: regenerate it from table_markdown()"


# --------------------------------------------------------------------------- arithmetic

def test_issue_10_hand_computed():
    # 27e9 fp8 params, TP 2, RTX A6000 768 GB/s, 3.2 accepted tokens per step.
    b = bytes_per_step(27e9 * dtype_bytes("fp8"), tp=2)
    assert b == 13_500_000_000
    r = roofline(b, 768.0, None, resolve.tokens_per_step(flag=1, accept_len=3.2).value, None)
    assert r.floor_ms == pytest.approx(17.578125)
    assert r.ceiling_steps_per_s == pytest.approx(56.8889, abs=1e-4)
    assert r.ceiling_tokens_per_s == pytest.approx(182.04, abs=0.01)
    assert r.fraction_of_ceiling is None and r.gemm_achieved_bw_gbps is None


def test_roofline_all_keys():
    r = roofline(4_000_000_000, 4800.0, 1.25, 1.0, 1.0)
    assert {k: v for k, v in r.to_dict().items() if k in V1_KEYS} == {
        "weight_bytes_per_step": 4_000_000_000,
        "floor_ms": pytest.approx(0.833333, abs=1e-6),
        "ceiling_steps_per_s": pytest.approx(1200.0),
        "tokens_per_step": 1.0,
        "ceiling_tokens_per_s": pytest.approx(1200.0),
        "fraction_of_ceiling": pytest.approx(0.666667, abs=1e-6),
        "gemm_achieved_bw_gbps": pytest.approx(4000.0),
    }
    assert isinstance(r, RooflineBlock) and r.kv_bytes_per_step is None and r.bytes_per_step == 4_000_000_000


V1_KEYS = ("weight_bytes_per_step", "floor_ms", "ceiling_steps_per_s", "tokens_per_step", "ceiling_tokens_per_s",
           "fraction_of_ceiling", "gemm_achieved_bw_gbps")


@pytest.mark.parametrize("args,none_keys", [
    ((None, 4800.0, 1.0, 1.0, 1.0), {"weight_bytes_per_step", "floor_ms", "ceiling_steps_per_s",
                                      "ceiling_tokens_per_s", "fraction_of_ceiling", "gemm_achieved_bw_gbps"}),
    ((4e9, None, 1.0, 1.0, 1.0), {"floor_ms", "ceiling_steps_per_s", "ceiling_tokens_per_s", "fraction_of_ceiling"}),
    ((4e9, 4800.0, None, 1.0, 1.0), {"fraction_of_ceiling"}),
    ((4e9, 4800.0, 1.0, None, 1.0), {"tokens_per_step", "ceiling_tokens_per_s"}),
    ((4e9, 4800.0, 1.0, 1.0, None), {"gemm_achieved_bw_gbps"}),
    ((4e9, 4800.0, 0.0, 1.0, 0.0), {"fraction_of_ceiling", "gemm_achieved_bw_gbps"}),
    ((0, 4800.0, 1.0, 1.0, 1.0), {"weight_bytes_per_step", "floor_ms", "ceiling_steps_per_s",
                                   "ceiling_tokens_per_s", "fraction_of_ceiling", "gemm_achieved_bw_gbps"}),
])
def test_roofline_nulls(args, none_keys):
    d = roofline(*args).to_dict()
    assert {k for k, v in d.items() if v is None and k in V1_KEYS} == none_keys


def test_bytes_per_step_terms():
    assert bytes_per_step(8e9, tp=4) == 2_000_000_000
    # draft: 1 GB x 3 forwards, sharded over tp=2 or replicated
    assert bytes_per_step(8e9, tp=2, draft_bytes=1e9, draft_forwards=3) == 4_000_000_000 + 1_500_000_000
    assert bytes_per_step(8e9, tp=2, draft_bytes=1e9, draft_forwards=3, draft_sharded=False) == 7_000_000_000
    # KV: 131072 B/token (Llama-3-8B bf16) x 8192 context x batch 4
    assert bytes_per_step(0, kv_bytes_per_token=131072, context=8192, batch=4) == 131072 * 8192 * 4
    assert bytes_per_step(0, tp=2, kv_bytes_per_token=131072, context=8192) == 131072 * 8192 // 2
    assert bytes_per_step(0, tp=2, kv_bytes_per_token=131072, context=8192, kv_sharded=False) == 131072 * 8192
    # the batch does not multiply the weights
    assert bytes_per_step(8e9, batch=16) == 8_000_000_000
    with pytest.raises(ValueError):
        bytes_per_step(8e9, tp=0)
    with pytest.raises(ValueError):
        bytes_per_step(-1)


def test_dtype_bytes():
    assert [dtype_bytes(d) for d in ("bf16", "fp16", "fp32", "fp8", "int8", "int4")] == [2, 2, 4, 1, 1, 0.5]
    assert dtype_bytes("c10::BFloat16") == 2 and dtype_bytes("torch.float16") == 2
    assert dtype_bytes("c10::Float8_e4m3fn") == 1
    with pytest.raises(ValueError):
        dtype_bytes("bogus")


def test_tokens_per_step():
    """The one resolver of the tokens a step produces (tracekit.analyses.resolve): accept length x batch."""
    assert resolve.tokens_per_step(flag=1).value == 1.0
    assert resolve.tokens_per_step(flag=4, accept_len=3.2).value == pytest.approx(12.8)
    assert resolve.tokens_per_step(accept_len=3.2).value == pytest.approx(3.2)  # batch: default 1


# --------------------------------------------------------------------------- weight bytes from op shapes

H, I, V = 4096, 11008, 32000  # Llama-2-7B sizes
BF = '"c10::BFloat16"'


def _llama_step_ops(t0: int, layers: int = 2, step: int | None = None) -> list[dict]:
    """The matmul-like ops HF Llama records per decode step with record_shapes=True,
    including the aten::matmul/aten::mm children of each aten::linear (nested in time)."""
    rows, t = [], t0

    def linear(out_f, in_f, bias=False):
        nonlocal t
        dims = json.dumps([[1, 1, in_f], [out_f, in_f], [out_f] if bias else []])
        third = BF if bias else '""'
        types = f"[{BF}, {BF}, {third}]"
        rows.append(dict(start=t, end=t + 10, pid=1, tid=7, name="aten::linear", input_dims=dims, input_types=types, step=step))
        rows.append(dict(start=t + 1, end=t + 9, pid=1, tid=7, name="aten::matmul",
                         input_dims=json.dumps([[1, 1, in_f], [in_f, out_f]]), input_types=f"[{BF}, {BF}]", step=step))
        rows.append(dict(start=t + 2, end=t + 8, pid=1, tid=7, name="aten::mm",
                         input_dims=json.dumps([[1, in_f], [in_f, out_f]]), input_types=f"[{BF}, {BF}]", step=step))
        t += 20

    for _ in range(layers):
        for _p in ("q", "k", "v", "o"):
            linear(H, H)
        # attention scores: batched matmul on activations, no weight
        rows.append(dict(start=t, end=t + 5, pid=1, tid=7, name="aten::matmul",
                         input_dims=json.dumps([[1, 32, 1, 128], [1, 32, 128, 17]]), input_types=f"[{BF}, {BF}]", step=step))
        t += 10
        linear(I, H)
        linear(I, H)
        linear(H, I)
    linear(V, H)  # lm_head
    return rows


LLAMA_2_LAYER_BYTES = (2 * (4 * H * H + 3 * H * I) + V * H) * 2


def test_shapes_one_step():
    ops = pl.DataFrame(_llama_step_ops(0)).drop("step")
    wb, detail = weight_bytes_from_shapes(ops)
    assert wb == LLAMA_2_LAYER_BYTES
    assert detail["weights"] == 2 * 7 + 1 and detail["n_steps"] == 1
    assert detail["bytes_by_op"] == {"aten::linear": LLAMA_2_LAYER_BYTES}


def test_shapes_many_steps_divides():
    ops = pl.DataFrame(_llama_step_ops(0) + _llama_step_ops(10_000) + _llama_step_ops(20_000)).drop("step")
    assert weight_bytes_from_shapes(ops, 3)[0] == LLAMA_2_LAYER_BYTES
    assert weight_bytes_from_shapes(ops, n_steps=1)[0] == 3 * LLAMA_2_LAYER_BYTES


def test_shapes_step_column_takes_median():
    partial = _llama_step_ops(30_000, step=3)[:5]  # a step cut off by the capture window
    ops = pl.DataFrame(_llama_step_ops(0, step=0) + _llama_step_ops(10_000, step=1)
                       + _llama_step_ops(20_000, step=2) + partial)
    wb, detail = weight_bytes_from_shapes(ops)
    assert wb == LLAMA_2_LAYER_BYTES and detail["n_steps"] == 4


def test_shapes_addmm_mm_bias_and_dtypes():
    ops = pl.DataFrame([
        # addmm(bias, mat1, mat2): weight = input 2 ([in, out], transposed), bias = input 0; fp32
        dict(start=0, end=5, pid=1, tid=1, name="aten::addmm",
             input_dims="[[768], [1, 768], [768, 3072], [], []]",
             input_types='["float", "float", "float", "Scalar", "Scalar"]'),
        # linear with bias, fp16
        dict(start=10, end=15, pid=1, tid=1, name="aten::linear",
             input_dims="[[1, 1, 4096], [11008, 4096], [11008]]",
             input_types='["c10::Half", "c10::Half", "c10::Half"]'),
        # mm where the weight comes first (W @ x), fp8
        dict(start=20, end=25, pid=1, tid=1, name="aten::mm",
             input_dims="[[4096, 4096], [4096, 1]]",
             input_types='["c10::Float8_e4m3fn", "c10::Float8_e4m3fn"]'),
        # a thread of its own, overlapping in time: not nested
        dict(start=11, end=14, pid=1, tid=2, name="aten::mm",
             input_dims="[[1, 1024], [1024, 1024]]", input_types='["c10::BFloat16", "c10::BFloat16"]'),
    ])
    wb, detail = weight_bytes_from_shapes(ops)
    assert wb == (768 * 3072 + 768) * 4 + (11008 * 4096 + 11008) * 2 + 4096 * 4096 * 1 + 1024 * 1024 * 2


def test_shapes_missing():
    assert weight_bytes_from_shapes(pl.DataFrame())[0] is None
    ops = pl.DataFrame({"start": [0], "end": [1], "pid": [1], "tid": [1], "name": ["aten::linear"],
                        "input_dims": [None], "input_types": [None]}, schema_overrides={"input_dims": pl.String, "input_types": pl.String})
    wb, detail = weight_bytes_from_shapes(ops)
    assert wb is None and "record_shapes" in detail["reason"]
    odd = pl.DataFrame({"start": [0], "end": [1], "pid": [1], "tid": [1], "name": ["aten::linear"],
                        "input_dims": ["[[1, 8], [8, 8]]"], "input_types": ['["weird", "weird"]']})
    wb, detail = weight_bytes_from_shapes(odd)
    assert wb is None and detail["unknown_dtypes"] == ["weird"]


# --------------------------------------------------------------------------- weight bytes from SGLang NVTX

def _sglang_ranges(steps: int = 2) -> list[str]:
    # As sglang/srt/utils/nvtx_pytorch_hooks.py writes them: str(dict), module prefix 'top'.
    out = []
    for s in range(steps):
        out.append(f"decode_step {s}")
        out.append("{'Module': 'top', 'Inputs': [[1], [1]]}")
        out.append("{'Module': 'top.model.embed_tokens', 'TrainableParams': {'weight': [128256, 4096]}, 'Inputs': [[1]]}")
        for layer in range(2):
            p = f"top.model.layers.{layer}"
            out.append(f"{{'Module': '{p}', 'Inputs': [[1, 4096], [1, 4096]]}}")
            out.append(f"{{'Module': '{p}.input_layernorm', 'TrainableParams': {{'weight': [4096]}}, 'Inputs': [[1, 4096]]}}")
            out.append(f"{{'Module': '{p}.self_attn.qkv_proj', 'TrainableParams': {{'weight': [6144, 4096]}}, "
                       f"'Inputs': [[1, 4096]]}}")
            out.append(f"{{'Module': '{p}.self_attn.o_proj', 'TrainableParams': {{'weight': [4096, 4096]}}, "
                       f"'Inputs': [[1, 4096]]}}")
            out.append(f"{{'Module': '{p}.mlp.gate_up_proj', 'TrainableParams': {{'weight': [28672, 4096]}}, "
                       f"'Inputs': [[1, 4096]]}}")
            out.append(f"{{'Module': '{p}.mlp.down_proj', 'TrainableParams': {{'weight': [4096, 14336]}}, "
                       f"'Inputs': [[1, 14336]], 'StaticParams': {{'in_features': 14336, 'out_features': 4096}}}}")
        out.append("{'Module': 'top.model.norm', 'TrainableParams': {'weight': [4096]}, 'Inputs': [[1, 4096]]}")
    return out


SGL_BYTES = (2 * (4096 + 6144 * 4096 + 4096 * 4096 + 28672 * 4096 + 4096 * 14336) + 4096) * 2


def test_nvtx_sglang():
    s = pl.Series(_sglang_ranges(3))
    assert weight_bytes_from_nvtx(s) == SGL_BYTES
    wb, detail = weight_bytes_from_nvtx_detail(s, n_steps=3)
    assert wb == SGL_BYTES
    assert detail["excluded_embedding"] == ["top.model.embed_tokens"] and detail["modules"] == 11
    assert weight_bytes_from_nvtx(s, dtype="fp8") == SGL_BYTES // 2


def test_nvtx_without_params():
    assert weight_bytes_from_nvtx(pl.Series(["decode_step 1", "forward"])) is None
    assert weight_bytes_from_nvtx(pl.Series([], dtype=pl.String)) is None


# --------------------------------------------------------------------------- the breakdown/2 roofline block

# The contract's roofline keys (spec/CONTRACT.md, tracekit.breakdown/2), in its order.
CONTRACT_ROOFLINE_KEYS = [
    "weight_bytes_per_step", "weight_bytes_source", "kv_bytes_per_step", "kv_bytes_source", "draft_bytes_per_step",
    "bytes_per_step", "tp", "floor_ms", "ceiling_steps_per_s", "tokens_per_step", "ceiling_tokens_per_s",
    "fraction_of_ceiling", "gemm_achieved_bw_gbps", "attention_achieved_bw_gbps",
]


def test_step_roofline_keys_are_the_contracts():
    from tracekit.analyses.roofline import step_roofline

    assert list(step_roofline(weight_bytes_per_step=1e9, peak_bw_gbps=1000).to_dict()) == CONTRACT_ROOFLINE_KEYS


def test_step_roofline_weights_kv_draft():
    from tracekit.analyses.roofline import step_roofline

    # per GPU: 8 GB of weights of which 1 GB is the draft's (x forwards), 2 GB of KV; H200 4800 GB/s
    r = step_roofline(weight_bytes_per_step=8e9, weight_bytes_source="model", draft_bytes_per_step=1e9,
                      kv_bytes_per_step=2e9, kv_bytes_source="model", peak_bw_gbps=4800, reference_step_ms=2.5,
                      tokens_per_step=8, tp=2, gemm_ms=1.75, attention_ms=0.5)
    assert r.bytes_per_step == 10_000_000_000 and r.tp == 2
    assert r.floor_ms == pytest.approx(10e9 / 4800e9 * 1e3)
    assert r.fraction_of_ceiling == pytest.approx(r.floor_ms / 2.5)
    assert r.ceiling_tokens_per_s == pytest.approx(8 * 1000 / r.floor_ms)
    assert r.gemm_achieved_bw_gbps == pytest.approx(7e9 / 1.75e-3 / 1e9)      # target weights over gemm time
    assert r.attention_achieved_bw_gbps == pytest.approx(2e9 / 0.5e-3 / 1e9)  # KV over attention time
    assert (r.weight_bytes_source, r.kv_bytes_source) == ("model", "model")


def test_step_roofline_unknown_kv_and_weights():
    from tracekit.analyses.roofline import roofline, step_roofline

    r = step_roofline(weight_bytes_per_step=4e9, peak_bw_gbps=4800, reference_step_ms=1.0, tokens_per_step=1,
                      gemm_ms=0.9, attention_ms=0.1, kv_bytes_source="model")
    assert r.kv_bytes_per_step is None and r.kv_bytes_source is None and r.attention_achieved_bw_gbps is None
    assert r.bytes_per_step == 4_000_000_000                      # the floor counts the weights alone
    old = roofline(4_000_000_000, 4800.0, 1.0, 1.0, 0.9)          # the /1 form: the same numbers
    assert (old.floor_ms, old.fraction_of_ceiling, old.gemm_achieved_bw_gbps) == (
        r.floor_ms, r.fraction_of_ceiling, r.gemm_achieved_bw_gbps)
    none = step_roofline(weight_bytes_per_step=None, kv_bytes_per_step=1e9, peak_bw_gbps=4800)
    assert none.bytes_per_step is None and none.floor_ms is None and none.kv_bytes_per_step == 1_000_000_000
    with pytest.raises(ValueError, match="draft bytes"):
        step_roofline(weight_bytes_per_step=1e9, draft_bytes_per_step=2e9, peak_bw_gbps=1)


def test_weight_bytes_flag_is_summed_over_gpus():
    from tracekit.analyses.roofline import weight_bytes_per_gpu

    assert weight_bytes_per_gpu(27e9, 2) == 13_500_000_000
    with pytest.raises(ValueError):
        weight_bytes_per_gpu(1e9, 0)


# --------------------------------------------------------------------------- physical sanity, TP sources, coverage
# (issue 23 item 3: a roofline verdict never states a figure beyond the hardware; tp says where it came from)

GB300_0 = ("lora_perf_lora_profile/runs/Qwen3-30B-A3B-Instruct-2507-BF16-expert_shared-20260609-133913/"
           "current_base_lora/profile/base/bs16-TP-0.trace.json.gz")
QWEN3_MOE = ROOT / "tests" / "data" / "configs" / "Qwen3-30B-A3B.json"


def _raw(path):
    import gzip

    return json.load(gzip.open(path))


def _decode_step_max_ms(raw: dict) -> float:
    """The longest step[DECODE ...] annotation of a Kineto trace, ms (by hand from the JSON)."""
    return max(e["dur"] for e in raw["traceEvents"] if e.get("cat") == "user_annotation"
               and e.get("name", "").startswith("step[DECODE")) / 1e3


def test_physical_check_refuses_weights_beyond_peak_bandwidth():
    from tracekit.analyses.roofline import physical_check, step_roofline

    ok = step_roofline(weight_bytes_per_step=4e9, peak_bw_gbps=4800, reference_step_ms=2.0, gemm_ms=1.0)
    assert physical_check(ok, 4800, gemm_ms=1.0, reference_step_ms=2.0) == (ok, None)   # 4,000 GB/s: holds
    bad = step_roofline(weight_bytes_per_step=6e9, kv_bytes_per_step=1e9, peak_bw_gbps=4800, reference_step_ms=2.0,
                        gemm_ms=1.0, attention_ms=1.0)
    block, why = physical_check(bad, 4800, gemm_ms=1.0, attention_ms=1.0, reference_step_ms=2.0,
                                suspects=["--tp (1, default)"])
    # 6 GB in 1 ms = 6,000 GB/s > 1.05 x 4,800: no floor, ceiling, fraction or gemm bandwidth; KV (1,000 GB/s) stays
    assert (block.floor_ms, block.ceiling_steps_per_s, block.fraction_of_ceiling, block.gemm_achieved_bw_gbps) == (
        None, None, None, None)
    assert block.attention_achieved_bw_gbps == pytest.approx(1000.0) and block.weight_bytes_per_step == 6e9
    assert "takes at least 1.250 ms" in why and why.endswith("check --tp (1, default)")
    # a floor longer than the whole step is impossible whatever the kernels
    long = step_roofline(weight_bytes_per_step=12e9, peak_bw_gbps=4800, reference_step_ms=2.0)
    assert physical_check(long, 4800, reference_step_ms=2.0)[1].startswith("reading 12.00 GB per GPU")


@pytest.mark.slow
def test_weight_bytes_beyond_the_gpu_name_the_input_to_check():
    """The counter-example of the field: --weight-bytes 60GB on one GB300 rank with --tp 1: 60 GB at 8,000 GB/s is
    7.5 ms, longer than any of the trace's decode steps (by hand): refused, no ceiling stated, the flags named."""
    import tracekit

    from conftest import shared

    p = shared(GB300_0)
    assert 60e9 / 8000e9 * 1e3 == 7.5 > _decode_step_max_ms(_raw(p))
    d = tracekit.breakdown(tracekit.load(p), weight_bytes=60_000_000_000, tp=1).to_dict()
    r, mem = d["roofline"], d["advice"]["memory_bandwidth"]
    assert r["weight_bytes_per_step"] == 60_000_000_000 and r["tp_source"] == "flag"
    assert r["floor_ms"] is None and r["ceiling_tokens_per_s"] is None and r["fraction_of_ceiling"] is None
    assert r["gemm_achieved_bw_gbps"] is None and r["refused"]
    assert not mem["applicable"] and mem["basis"] == "unknown" and "--weight-bytes" in mem["verdict"]
    assert "--tp (1, flag)" in mem["verdict"] and "memory-bound" not in mem["verdict"]
    assert "no bandwidth ceiling" in d["headline"] and "tok/s" not in d["headline"]
    assert any(w.startswith("roofline refused:") for w in d["warnings"])
    # the same bytes on the trace's own TP (4, from its communicator): 15 GB per GPU, within the GPU
    d4 = tracekit.breakdown(tracekit.load(p), weight_bytes=60_000_000_000).to_dict()
    assert d4["roofline"]["tp"] == 4 and d4["roofline"]["weight_bytes_per_step"] == 15_000_000_000
    assert d4["roofline"]["refused"] is None and d4["roofline"]["gemm_achieved_bw_gbps"] <= 8000


def test_moe_model_on_one_gpu_of_four_is_refused():
    """--model Qwen3-30B-A3B at batch 16 with --tp 1 on a TP4 rank: every expert of 48 layers on one GPU (39.8 GB)
    cannot be read in the step's GEMM time; refused and --tp, --model, --tokens-per-step named."""
    import tracekit

    from conftest import shared

    d = tracekit.breakdown(tracekit.load(shared(GB300_0)), model=str(QWEN3_MOE), tp=1, tokens_per_step=16).to_dict()
    why = d["roofline"]["refused"]
    assert why and all(s in why for s in ("--tp (1, flag)", "--model", "--tokens-per-step (16)"))
    assert not d["advice"]["memory_bandwidth"]["applicable"]
    assert "CUDA graphs or NCCL changes cannot help" not in json.dumps(d)


@pytest.mark.slow
def test_tp_from_the_process_groups_never_the_world_size():
    """The process-group fallback (Kineto distributedInfo.pg_config): the GB300 ranks' GPU groups besides the
    default one all have 4 ranks (by hand from the JSON); a job whose only multi-rank group is the default one
    gives no TP (its size is the world's)."""
    from dataclasses import replace

    import tracekit
    from tracekit.analyses.bytes import tp_from_process_groups
    from tracekit.analyses.resolve import resolve_tp
    from tracekit.trace import COLLECTIVES, ProcessGroup, empty

    from conftest import shared

    p = shared(GB300_0)
    pgs = _raw(p)["distributedInfo"]["pg_config"]
    sizes = {g["pg_size"] for g in pgs if "nccl" in g["backend_config"] and g["pg_size"] > 1
             and g["pg_desc"] != "default_pg"}
    assert sizes == {4}
    t = tracekit.load(p)
    assert [(g.name, g.size) for g in t.meta.process_groups] == [(g["pg_name"], g["pg_size"]) for g in pgs]
    assert tp_from_process_groups(t.meta.process_groups)[0] == 4
    # without the NCCL args (no communicator recorded), the step's custom all-reduces fall back to the groups
    bare = replace(t, collectives=empty(COLLECTIVES))
    r = tracekit.breakdown(bare, weight_bytes=60_000_000_000).roofline
    assert (r["tp"], r["tp_source"]) == (4, "process_group") and "pg_config" in r["tp_evidence"]
    # only the default group (the whole job): never taken
    only_default = replace(bare, meta=replace(bare.meta, process_groups=(ProcessGroup("0", "default_pg", "cuda:nccl",
                                                                                      4, (0, 1, 2, 3)),)))
    r = tracekit.breakdown(only_default, weight_bytes=60_000_000_000).roofline
    assert (r["tp"], r["tp_source"]) == (1, "default")
    # a group labelled as the tensor-parallel one wins over the others
    g = [ProcessGroup("0", "default_pg", "cuda:nccl", 8), ProcessGroup("1", "TP_GROUP", "cuda:nccl", 2),
         ProcessGroup("2", "dp", "cuda:nccl", 4)]
    assert tp_from_process_groups(g)[0] == 2
    assert tp_from_process_groups(g[:1] + g[2:], all_reduce_pgs=["2"])[0] == 4
    assert tp_from_process_groups([g[0], ProcessGroup("1", "x", "cuda:nccl", 2), g[2]])[0] is None
    # precedence: flag > manifest > command > communicator > process group > default
    full = dict(flag=8, manifest=4, command=2, communicator=(3, "c"), process_group=(5, "p"))
    order = ["flag", "manifest", "command", "communicator", "process_group"]
    for i, src in enumerate(order):
        kw = {k: (v if j >= i else (None if k in ("flag", "manifest", "command") else (None, "-")))
              for j, (k, v) in enumerate(full.items())}
        assert resolve_tp(**kw).source == src
    assert resolve_tp().source == "default" and resolve_tp().tp == 1


def test_shapes_are_used_only_when_they_cover_the_gemms():
    """vLLM's full-graph decode step replays its GEMMs from one graph launch: the one linear op with recorded
    shapes (the lm_head) launched a small part of them, so its 1.16 GB are not the step's weights (refused, with the
    coverage); an eager
    torch capture whose GEMMs all run under aten::linear keeps them."""
    from dataclasses import replace

    import tracekit

    from conftest import sample_trace, shared

    raw = _raw(shared("TraceLens/tests/traces/inference/vllm_decode_full/graph_execution.json.gz"))
    graph_corr = {e["args"]["correlation"] for e in raw["traceEvents"] if e.get("name") == "hipGraphLaunch"}
    gemm = [(e["args"].get("correlation"), e["dur"]) for e in raw["traceEvents"] if e.get("cat") == "kernel"
            and re.search(r"(?i)gemm|Cijk", e.get("name", ""))]
    graphed = sum(d for c, d in gemm if c in graph_corr) / sum(d for _, d in gemm)
    # by hand: 72 of the 73 Cijk GEMM kernels replay from the graph launch; the 73rd (the lm_head, under the one
    # aten::linear with shapes) is at most 1 - graphed of the GEMM time: far from the 80% the shapes need
    assert 1 - graphed < 0.8
    b = tracekit.breakdown(tracekit.load(shared("TraceLens/tests/traces/inference/vllm_decode_full/"
                                                "graph_execution.json.gz")))
    assert b.roofline["weight_bytes_per_step"] is None and b.roofline["shape_coverage"] <= 1 - graphed
    assert any("not used" in w and "1,158,266,880" in w for w in b.warnings)
    t = tracekit.load(sample_trace("hf-small-eager-torch"))
    e = tracekit.breakdown(replace(t, manifest=None))
    assert e.roofline["weight_bytes_source"] == "shapes" and e.roofline["shape_coverage"] > 0.99


@pytest.mark.parametrize("name", ["spec-small-eager", "spec-large-eager"])
def test_gemm_bandwidth_counts_the_target_not_the_draft(name):
    """A speculative capture's manifest weights are target + draft x forwards; the draft's GEMMs run as `drafting`,
    so the gemm bandwidth is the target's bytes over gemm time. Against the capture's own probe of the target's
    GEMMs (CUDA events on the H200, manifest `gemm_probe`): within 10% (before, 3,680 and 5,257 GB/s: the latter
    110% of the 4,800 GB/s peak)."""
    import tracekit

    from conftest import sample, sample_trace

    man = json.loads(sample(f"{name}/manifest.json").read_text())
    r = tracekit.breakdown(tracekit.load(sample_trace(name))).roofline
    assert r["draft_bytes_per_step"] == man["draft_bytes_per_step"]
    assert r["weight_bytes_per_step"] - r["draft_bytes_per_step"] == man["target_bytes_per_step"]
    assert r["gemm_achieved_bw_gbps"] == pytest.approx(man["gemm_probe"]["m1"]["achieved_gbps"], rel=0.10)

# ───────────────────────── compute on the roofline (formerly test_compute_roofline.py)
# Compute on the roofline: dense peak TFLOP/s per GPU and dtype (the datasheets' figures), the FLOPs a decode
# step does (2 x the parameters a token multiplies x the tokens, + attention), the compute floor, and the floor as
# the larger of the memory and compute floors, in ``ceiling`` and in breakdown's ``roofline``.
#
# Figures are checked against what was published independently of tracekit: the datasheets' peaks (halved where
# they print "with sparsity"), the models' parameter counts on their cards and checkpoint indexes
# (tests/data/configs/README.md), torch's own count of the H200 checkpoint (tests/data/h200_checkpoints), and a
# real prefill capture's GEMM time.

CONFIGS = DATA / "configs"
H100_BW, H100_BF16 = 3350.0, 989.0  # H100 SXM datasheet: 3.35 TB/s; BF16 1,979 TFLOPS with sparsity


def run_json(*args: str) -> dict:
    r = CliRunner().invoke(cli, ["ceiling", *args, "--format", "json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


# --------------------------------------------------------------------------- the issue's done-when

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
