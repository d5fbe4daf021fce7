"""The profiled command line: read from real nsys exports (META_DATA_CAPTURE), parsed for the serving engine's
model and parallelism (SGLang / vLLM spellings), resolved in a local Hugging Face cache."""

from __future__ import annotations

import json
import sqlite3

import pytest

import tracekit
from tracekit.model import discover_model, parse_command
from tracekit.readers.nsys.reader import read_nsys

from conftest import sample, sample_sqlite, sample_trace, shared


def argv_by_hand(path) -> tuple[str, ...]:
    """PROCESS_0's COMMAND and ARGUMENT_0..n straight from the export, independently of the reader."""
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    rows = dict(con.execute("SELECT name, value FROM META_DATA_CAPTURE WHERE name LIKE 'PROCESS_0:%'").fetchall())
    con.close()
    n = sum(1 for k in rows if k.startswith("PROCESS_0:ARGUMENT_"))
    return (rows["PROCESS_0:COMMAND"], *(rows[f"PROCESS_0:ARGUMENT_{i}"] for i in range(n)))


@pytest.mark.parametrize("trace", ["tp1-hf-small-nccl-graph", "hf-large-eager"])
def test_nsys_command_line_from_our_h200_captures(trace):
    # (the samples are committed gzipped: read through tracekit.load, checked against the SQL of the plain export)
    t = tracekit.load(sample_trace(trace))
    assert t.meta.command == argv_by_hand(sample_sqlite(trace))
    args = parse_command(t.meta.command)
    manifest = json.loads(sample(f"{trace}/manifest.json").read_text())
    if "--tp" in t.meta.command:
        assert args.tp == manifest["tp"] == 1
    assert args.model is None and args.engine is None       # our HF workload builds its model from a preset
    assert discover_model(t.meta.command).note == "the profiled command line names no --model / --model-path"


def test_nsys_command_line_inside_bash_c():
    path = shared("nsys-ai/tests/fixtures/h100_2gpu_1s.sqlite")
    t = read_nsys(path)
    assert t.meta.command[:2] == ("bash", "-c") and t.meta.command == argv_by_hand(path)
    assert parse_command(t.meta.command).argv[2:4] == ("pytest", "-vs")


def test_old_export_without_capture_metadata():
    path = shared("memfusion_artifact/report1.sqlite")
    assert read_nsys(path).meta.command is None


@pytest.mark.parametrize("cmd,model,tp,ep,extra", [
    ("python3 -m sglang.launch_server --model-path Qwen/Qwen3-8B --tp 2 --port 30000",
     "Qwen/Qwen3-8B", 2, None, {"engine": "sglang"}),
    ("python -m sglang.launch_server --model deepseek-ai/DeepSeek-V3 --tp-size=8 --ep-size 8 "
     "--speculative-algorithm NEXTN --speculative-num-steps 3 --speculative-num-draft-tokens 4 --kv-cache-dtype fp8_e4m3",
     "deepseek-ai/DeepSeek-V3", 8, 8,
     {"speculative_algorithm": "NEXTN", "speculative_num_steps": 3, "speculative_num_draft_tokens": 4,
      "kv_cache_dtype": "fp8_e4m3"}),
    ("python -m sglang.bench_one_batch --model-path /models/Llama-3.1-8B --batch-size 32 --input-len 1024 "
     "--output-len 64", "/models/Llama-3.1-8B", None, None, {"batch_size": 32, "input_len": 1024, "output_len": 64}),
    ("vllm serve meta-llama/Llama-3.1-8B -tp 4 --max-model-len 32768", "meta-llama/Llama-3.1-8B", 4, None,
     {"engine": "vllm", "max_context": 32768}),
    ("python -m vllm.entrypoints.openai.api_server --model Qwen/Qwen3-30B-A3B --tensor-parallel-size 2 "
     "--data-parallel-size 2 --enable-expert-parallel", "Qwen/Qwen3-30B-A3B", 2, 4, {"dp": 2}),
    ("vllm serve deepseek-ai/DeepSeek-V3 --tensor-parallel-size 8 "
     "--speculative-config '{\"method\": \"deepseek_mtp\", \"num_speculative_tokens\": 2}'",
     "deepseek-ai/DeepSeek-V3", 8, None, {"speculative_algorithm": "deepseek_mtp", "speculative_num_steps": 2}),
    ("bash -c \"cd /srv && python -m sglang.launch_server --model-path Qwen/Qwen3-32B --tp 4\"", "Qwen/Qwen3-32B", 4,
     None, {}),
])
def test_parse_serving_command_lines(cmd, model, tp, ep, extra):
    """Definition test: SGLang and vLLM spellings (no real serving-engine nsys export is stored here)."""
    a = parse_command(cmd)
    assert (a.model, a.tp, a.ep) == (model, tp, ep)
    for k, v in extra.items():
        assert getattr(a, k) == v, k


def test_discover_in_local_cache(tmp_path):
    snap = tmp_path / "hub" / "models--Qwen--Qwen3-8B" / "snapshots" / "abc"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text("{}")
    env = {"HF_HUB_CACHE": str(tmp_path / "hub")}
    d = discover_model(["python", "-m", "sglang.launch_server", "--model-path", "Qwen/Qwen3-8B", "--tp", "2"], env=env)
    assert d.model_path == snap and d.args.tp == 2
    assert "--tp 2" in d.note and "local Hugging Face cache" in d.note
    miss = discover_model("python -m sglang.launch_server --model-path Qwen/Qwen3-32B --tp 2", env=env)
    assert miss.model_path is None and "pass --model PATH" in miss.note
