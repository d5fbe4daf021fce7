"""The bytes a GPU reads per decode step and the tensor parallelism that divides them (``tracekit.analyses.bytes``):
one precedence for every source, checked with real inputs against figures obtained elsewhere: Llama-3.1-8B's
published parameter count (8,030,261,248: tests/data/configs/README.md) and its config's sizes, the capture
manifests of two captures of the same target model, a real Kineto trace's NCCL arguments and process groups."""

from __future__ import annotations

import gzip
import json

import pytest

import tracekit
from tracekit.analyses.bytes import resolve_bytes, tp_from_process_groups
from tracekit.analyses.collectives import tp_from_trace
from tracekit.analyses.resolve import resolve_tp
from tracekit.errors import TracekitError

from conftest import DATA, sample

LLAMA = DATA / "configs/Llama-3.1-8B.json"
LLAMA_PARAMS = 8_030_261_248  # published (the checkpoint index's total_parameters)


def llama_config() -> dict:
    return json.loads(LLAMA.read_text())


def test_a_model_step_reads_every_weight_but_the_input_embedding():
    c = llama_config()
    embedding = c["vocab_size"] * c["hidden_size"]  # untied: lm_head is read, the embedding only row by row
    assert not c["tie_word_embeddings"]
    r = resolve_bytes(parallel=resolve_tp(), model=LLAMA)
    assert (r.weight_bytes_source, r.tp) == ("model", 1)
    assert r.target_bytes_per_step == (LLAMA_PARAMS - embedding) * 2 == 15_009_849_344  # bf16
    # tensor parallel over 2: every matrix split, the RMSNorm weights (2 per layer + the final one) on each GPU
    norms = (2 * c["num_hidden_layers"] + 1) * c["hidden_size"] * 2
    tp2 = resolve_bytes(parallel=resolve_tp(flag=2), model=LLAMA)
    assert tp2.target_bytes_per_step == (r.target_bytes_per_step - norms) // 2 + norms
    # the KV cache: K and V of every layer's KV heads, bf16, for each token of context
    kv = resolve_bytes(parallel=resolve_tp(), model=LLAMA, context=1000)
    head_dim = c["hidden_size"] // c["num_attention_heads"]
    assert kv.kv_bytes_per_step == c["num_hidden_layers"] * c["num_key_value_heads"] * head_dim * 2 * 2 * 1000
    assert kv.kv_bytes_source == "model"


def test_the_manifest_weights_are_target_plus_draft():
    """hf-small-spec's manifest counts the draft model's three forwards; its target is the model of hf-small-eager,
    captured apart: the same bytes."""
    spec = json.loads(sample("hf-small-spec/manifest.json").read_text())
    plain = json.loads(sample("hf-small-eager/manifest.json").read_text())
    r = resolve_bytes(parallel=resolve_tp(manifest=spec["tp"]), manifest=spec)
    draft = spec["draft_model"]["weight_bytes"] * spec["draft_model"]["forwards_per_step"]
    assert (r.weight_bytes_source, r.parallel.source) == ("manifest", "manifest")
    assert r.draft_bytes_per_step == draft == 242_818_560
    assert r.target_bytes_per_step == plain["weight_bytes_per_step"] == 988_010_240
    assert r.weight_bytes_per_step == spec["weight_bytes_per_step"]


def test_a_flag_beats_the_model_which_beats_the_manifest():
    spec = json.loads(sample("hf-small-spec/manifest.json").read_text())
    both = resolve_bytes(parallel=resolve_tp(), manifest=spec, model=LLAMA)
    assert both.weight_bytes_source == "model" and both.target_bytes_per_step == 15_009_849_344
    flag = resolve_bytes(parallel=resolve_tp(flag=4), manifest=spec, model=LLAMA, weight_bytes=16e9)
    assert flag.weight_bytes_source == "flag" and flag.target_bytes_per_step == 4_000_000_000  # summed over GPUs / tp
    with pytest.raises(TracekitError, match="--weight-bytes must be > 0"):
        resolve_bytes(parallel=resolve_tp(), weight_bytes=-1)


def test_tp_is_the_all_reduce_communicator_never_the_job():
    """HTA's NCCL trace: 15 all-reduces on a communicator of 2 ranks (their NCCL args), and one process group, the
    job's default one: its size is the world's, never taken as tp."""
    with gzip.open(DATA / "kineto/hta_nccl_data.json.gz") as f:
        doc = json.load(f)
    sizes = {e["args"]["Group size"] for e in doc["traceEvents"]
             if e.get("cat") == "kernel" and e.get("args", {}).get("Collective name") == "allreduce"}
    assert sizes == {2} and [g["pg_desc"] for g in doc["distributedInfo"]["pg_config"]] == ["default_pg"]
    t = tracekit.load(DATA / "kineto/hta_nccl_data.json.gz")
    communicator, pg = tp_from_trace(t), tp_from_process_groups(t.meta.process_groups)
    assert communicator[0] == 2 and pg[0] is None
    p = resolve_tp(communicator=communicator, process_group=pg)
    assert (p.tp, p.source, p.known) == (2, "communicator", True)
    # the precedence: the flag, the manifest, the recorded command line, then the trace
    assert resolve_tp(flag=4, manifest=8, command=2, communicator=communicator).source == "flag"
    assert resolve_tp(manifest=8, command=2, communicator=communicator).tp == 8
    assert resolve_tp(command=2, communicator=(4, "x")).source == "command"
    nothing = resolve_tp(communicator=(None, "no all-reduce in the trace"), process_group=pg)
    assert (nothing.tp, nothing.source, nothing.known) == (1, "default", False)
