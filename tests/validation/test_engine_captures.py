"""The engine-shaped H200 captures (sample_traces/spec-*, serve-*, kv-*; capture/run_session.sh) and the
safetensors checkpoints made with them (tests/data/h200_checkpoints), pinned against independent figures:
the models' bytes from their shapes (arithmetic here, not the workload's count), raw SQL on the exports,
and torch's own byte counts. What the analyses must find in these traces is tested where they live."""

from __future__ import annotations

import json
import sqlite3
import statistics
import struct
import sys

import pytest

from conftest import DATA, sample, sample_sqlite

# The validation sweeps are the slow tier (`python -m pytest -m slow`; .ci/run runs them after the fast tier).
pytestmark = pytest.mark.slow

CKPT = DATA / "h200_checkpoints"
SPEC = ["spec-small-graph", "spec-small-graph-nomark", "spec-small-eager", "spec-small-eager-nomark",
        "spec-large-graph", "spec-large-graph-nomark", "spec-large-eager"]
SERVE = ["serve-small-eager", "serve-small-graph", "serve-small-graph-nomark"]
KV = ["kv-large-ctx16k", "kv-large-ctx32k"]
NSYS = SPEC + SERVE + KV
TORCH = ["spec-small-graph-torch", "spec-small-graph-torch-nomark", "spec-small-eager-torch",
         "spec-small-eager-torch-nomark"]
# the model shapes (capture/llama_torch.py SIZES), written out again here
SHAPES = {"small": dict(H=896, L=24, heads=14, kv=2, F=4864, V=151936, tied=True),
          "large": dict(H=4096, L=32, heads=32, kv=8, F=14336, V=128256, tied=False)}


def manifest(name):
    return json.loads(sample(f"{name}/manifest.json").read_text())  # (committed: missing is a failure)


def db(name):
    return sqlite3.connect(f"file:{sample_sqlite(name)}?mode=ro", uri=True)


def layer_params(s):
    D = s["H"] // s["heads"]
    return 2 * s["H"] + (s["heads"] + 2 * s["kv"]) * D * s["H"] + s["H"] * s["heads"] * D + 3 * s["H"] * s["F"]


def target_bytes(s):   # layers + final norm + lm_head (the embedding is read only as a tied lm_head)
    return 2 * (s["L"] * layer_params(s) + s["H"] + s["V"] * s["H"])


def draft_bytes_per_forward(s):   # MTP layer + enorm/hnorm/shared_head.norm + eh_proj + the shared lm_head
    return 2 * (layer_params(s) + 3 * s["H"] + 2 * s["H"] * s["H"] + s["V"] * s["H"])


def kv_bytes_per_token(s):
    return s["L"] * 2 * s["kv"] * (s["H"] // s["heads"]) * 2


@pytest.mark.parametrize("name", SPEC + TORCH)
def test_spec_weight_bytes_from_shapes(name):
    m = manifest(name)
    s = SHAPES[m["model"]["size"]]
    K = m["spec"]["draft_tokens"]
    assert K == 3 and m["draft_model"]["forwards_per_step"] == K + 1
    assert m["draft_model"]["forwards"] == {"draft": K, "draft_extend": 1}
    assert m["target_bytes_per_step"] == m["model"]["weight_bytes"] == target_bytes(s)
    assert m["draft_model"]["weight_bytes"] == draft_bytes_per_forward(s)
    assert m["weight_bytes_per_step"] == target_bytes(s) + (K + 1) * draft_bytes_per_forward(s)
    assert m["draft_bytes_per_step"] == (K + 1) * draft_bytes_per_forward(s)
    # random weights: the greedy draft is never right, every step emits one token
    assert m["spec"]["accept_len"] == 1.0 and m["accept"]["accepted_drafts_profiled"] == [[0]] * m["steps"]
    # the unprofiled times the manifest promises: plain decode and the draft phase, measured in the same process
    assert 0 < m["unprofiled_draft_phase_ms"] < m["unprofiled_step_ms"]
    assert m["unprofiled_draft_phase_ms"] == pytest.approx(m["unprofiled_draft_ms"] + m["unprofiled_draft_extend_ms"])
    assert 0 < m["unprofiled_plain_step_ms"] < m["unprofiled_step_ms"]
    assert set(m["unprofiled_phases_ms"]) == {"draft", "build_verify_inputs", "verify", "accept", "draft_extend",
                                               "process_result"}


def test_large_spec_is_memory_bound_gemms_at_70pct_of_peak():
    """The large target's weight GEMMs alone (graphed, unprofiled) run at >= 70% of the H200's 4.8 TB/s."""
    for name in ("spec-large-graph", "spec-large-graph-nomark", "spec-large-eager"):
        m = manifest(name)
        for probe in m["gemm_probe"].values():
            assert probe["weight_bytes"] == target_bytes(SHAPES["large"]) - 2 * SHAPES["large"]["H"] * (
                2 * SHAPES["large"]["L"] + 1)                      # every GEMM weight: all but the norms
            assert probe["achieved_gbps"] >= 0.70 * 4800
        assert target_bytes(SHAPES["large"]) >= 8e9


@pytest.mark.parametrize("name", NSYS)
def test_per_step_structure_by_sql(name):
    """Graph launches, host reads and copies per step, counted in the export."""
    m = manifest(name)
    n = m["steps"]
    with db(name) as con:
        launches = con.execute("""SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId
                                  WHERE s.value LIKE 'cudaGraphLaunch%'""").fetchone()[0]
        copies = dict(con.execute("""SELECT copyKind || ':' || srcKind, count(*) FROM CUPTI_ACTIVITY_KIND_MEMCPY
                                     GROUP BY 1""").fetchall())
    graphs = (m["graphs"] or {}).get("per_step", 0) if m["workload"] != "kv" else (1 if m["mode"] == "graph" else 0)
    assert launches == graphs * n
    d2h = sum(v for k, v in copies.items() if k.startswith("2:"))
    # copyKind 1 = HtoD; srcKind per the export's ENUM_CUDA_MEM_KIND: 0 pageable, 1 pinned
    pageable_h2d = copies.get("1:0", 0)
    pinned_h2d = copies.get("1:1", 0)
    if m["workload"] == "spec":                  # accept lengths .tolist() + committed tokens .tolist()
        assert m["host_reads_per_step"] == 2 and d2h == 2 * n and pageable_h2d == pinned_h2d == 0
    elif m["workload"] == "serve":               # torch.tensor(positions, device=cuda), the bitmask, the tokens
        assert d2h == n and pageable_h2d == n and pinned_h2d == n
    else:
        assert d2h == n and pageable_h2d == pinned_h2d == 0


@pytest.mark.parametrize("marked,unmarked", [("spec-small-graph", "spec-small-graph-nomark"),
                                             ("spec-small-eager", "spec-small-eager-nomark"),
                                             ("spec-large-graph", "spec-large-graph-nomark"),
                                             ("serve-small-graph", "serve-small-graph-nomark")])
def test_unmarked_capture_runs_the_same_kernels(marked, unmarked):
    def names(name):
        with db(name) as con:
            return con.execute("""SELECT s.value, count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k
                                  JOIN StringIds s ON s.id = k.shortName GROUP BY 1 ORDER BY 1""").fetchall()
    assert manifest(unmarked)["markers"] is None and manifest(marked)["markers"] is not None
    assert names(marked) == names(unmarked)


def _gpu_gaps(con):
    acts = con.execute("""SELECT start, end FROM CUPTI_ACTIVITY_KIND_KERNEL UNION ALL
                          SELECT start, end FROM CUPTI_ACTIVITY_KIND_MEMCPY UNION ALL
                          SELECT start, end FROM CUPTI_ACTIVITY_KIND_MEMSET ORDER BY 1""").fetchall()
    gaps, busy_to = [], acts[0][1]
    for s, e in acts[1:]:
        if s > busy_to:
            gaps.append((busy_to, s))
        busy_to = max(busy_to, e)
    return gaps


@pytest.mark.parametrize("name", SERVE)
def test_serve_injected_stall_is_one_gpu_gap_per_step(name):
    """The stall (GPU drained, then ~0.5 ms of Python) is the one GPU gap of >= 0.4 ms in every step; in the
    marked captures it lies around the `grammar_mask` range, which launches nothing."""
    m = manifest(name)
    stall = m["serve"]["injected_stall"]
    assert stall["range_name"] == "grammar_mask" and stall["target_ms"] == 0.5
    assert stall["range"] == ("grammar_mask" if m["markers"] else None)
    assert stall["measured_profiled"]["min_ms"] >= 0.5 and stall["measured_timed"]["median_ms"] >= 0.5
    with db(name) as con:
        gaps = _gpu_gaps(con)
        big = [(a, b) for a, b in gaps if b - a >= 400_000]
        assert len(big) == m["steps"]
        if m["markers"]:
            ranges = con.execute("""SELECT e.start, e.end FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId
                                    WHERE coalesce(e.text, s.value) = 'grammar_mask' ORDER BY 1""").fetchall()
            assert len(ranges) == m["steps"]
            for (s, e), (a, b) in zip(ranges, big):
                assert a <= s and e <= b                     # the range sits inside the stall's GPU gap
                assert (e - s) / 1e6 >= 0.5
    assert statistics.median((b - a) / 1e6 for a, b in big) < m["unprofiled_step_ms"]


def test_kv_attention_time_tracks_kv_bytes():
    """Two contexts, same model and batch: the attention kernels' time per step grows with the KV bytes
    (ratio within 15% of 2.0), and their achieved bandwidth stays under the H200's peak."""
    s = SHAPES["large"]
    per = {}
    for name in KV:
        m = manifest(name)
        assert m["batch"] == m["tokens_per_step"] == 8 and m["attention_backend"] == "flash_attention"
        assert m["kv_bytes_per_token"] == kv_bytes_per_token(s) == 131072
        assert m["kv_bytes_per_step"] == kv_bytes_per_token(s) * m["context"] * 8
        assert m["weight_bytes_per_step"] == target_bytes(s)
        with db(name) as con:
            ns = con.execute("""SELECT sum(k.end - k.start) FROM CUPTI_ACTIVITY_KIND_KERNEL k
                                JOIN StringIds s ON s.id = k.shortName WHERE s.value LIKE 'flash%'""").fetchone()[0]
        per[m["context"]] = (ns / m["steps"] / 1e6, m["kv_bytes_per_step"])
        gbps = m["kv_bytes_per_step"] / (ns / m["steps"])
        assert 0.6 * 4800 < gbps < 4800
    (t1, b1), (t2, b2) = per[16384], per[32768]
    assert b2 / b1 == 2
    assert t2 / t1 == pytest.approx(b2 / b1, rel=0.15)


# ---------------------------------------------------------------- safetensors checkpoints

sys.path.insert(0, str(CKPT))


def _headers(variant, tmp_path):
    from materialize import materialize

    d = materialize(variant, tmp_path)
    out = {}
    for shard in json.loads((CKPT / variant / "sizes.json").read_text()):
        with open(d / shard, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            out[shard] = (json.loads(f.read(n)), n, (d / shard).stat().st_size)
    return d, out


DT_BYTES = {"BF16": 2, "F8_E4M3": 1, "F32": 4}


@pytest.mark.parametrize("variant", ["bf16", "fp8"])
def test_checkpoint_headers_agree_with_torch_counts(variant, tmp_path):
    assert (CKPT / variant).is_dir(), f"{CKPT / variant} is committed (tests/data/h200_checkpoints/README.md)"
    d, shards = _headers(variant, tmp_path)
    counts = json.loads((CKPT / variant / "torch_counts.json").read_text())
    index = json.loads((d / "model.safetensors.index.json").read_text())
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["num_nextn_predict_layers"] == 1 and cfg["num_hidden_layers"] == 24
    assert ("quantization_config" in cfg) == (variant == "fp8")
    seen = {}
    for shard, (head, n, size) in shards.items():
        head.pop("__metadata__", None)
        ends = []
        for name, t in head.items():
            nbytes = DT_BYTES[t["dtype"]]
            for dim in t["shape"]:
                nbytes *= dim
            a, b = t["data_offsets"]
            assert b - a == nbytes
            ends.append(b)
            seen[name] = nbytes
            assert index["weight_map"][name] == shard
        assert 8 + n + max(ends) == size                     # the shard's true size, data right after the header
    assert seen == {k: v["bytes"] for k, v in counts["tensors"].items()}
    assert index["metadata"]["total_size"] == counts["total_bytes"] == sum(seen.values())
    # the step-read rule, applied to the headers, gives torch's count
    L = cfg["num_hidden_layers"]
    mtp = f"model.layers.{L}."
    target = sum(v for k, v in seen.items() if not k.startswith(mtp) and k != "model.embed_tokens.weight") \
        + (seen["model.embed_tokens.weight"] if cfg["tie_word_embeddings"] else 0)
    draft = sum(v for k, v in seen.items() if k.startswith(mtp) and not k.endswith("embed_tokens.weight"))
    sr = counts["step_read"]
    assert (target, draft) == (sr["target_bytes"], sr["draft_bytes_per_forward"])
    assert sr["bytes_per_step"] == target + 4 * draft
    if variant == "bf16":   # the same model the spec captures ran: the same bytes per step
        s = SHAPES["small"]
        assert (target, draft) == (target_bytes(s), draft_bytes_per_forward(s))
        assert sr["bytes_per_step"] == manifest("spec-small-graph")["weight_bytes_per_step"]
    else:
        scales = [k for k in seen if k.endswith("weight_scale_inv")]
        assert len(scales) == 7 * (L + 1)                    # every projection of 24 layers + the MTP layer
        assert cfg["quantization_config"]["weight_block_size"] == [128, 128]
