"""Bytes from the model's own files: weights per GPU, MoE and MTP draft layers, the KV cache.

The library the roofline uses (``ceiling`` and ``breakdown``)::

    from tracekit.model import load_model, step_bytes
    m = load_model("/models/Qwen3-8B")                 # config.json + safetensors headers
    s = step_bytes(m, tp=2, batch=8, context=4096)     # per GPU, per decode step
    s.weight_bytes_per_step, s.kv_bytes_per_step, s.draft_bytes_per_step, s.notes

- :func:`load_model` (:mod:`.checkpoint`): a model directory, Hugging Face snapshot or bare
  ``config.json``; safetensors headers only (:mod:`.safetensors`), never the weights.
- :func:`step_bytes`, :func:`kv_cache` (:mod:`.step`): which tensors a step reads and how
  tensor / expert parallelism splits them (:mod:`.roles`), the KV cache by layer kind.
- :func:`parse_bytes` (:mod:`.units`): the one parser for byte amounts.
- :func:`discover_model` (:mod:`.discover`): the model and TP of a profiled command line.
"""

from tracekit.model.arch import Arch, arch_from_config, load_config
from tracekit.model.checkpoint import Model, load_model, model_from_config
from tracekit.model.discover import Discovery, ServeArgs, discover_model, parse_command, resolve_model
from tracekit.model.roles import Role, classify
from tracekit.model.safetensors import TensorInfo, read_header
from tracekit.model.step import (
    KvCache,
    ParamCounts,
    StepBytes,
    expected_experts,
    kv_cache,
    param_counts,
    step_bytes,
)
from tracekit.model.units import BYTES, format_bytes, parse_bytes

__all__ = [
    "Arch", "BYTES", "Discovery", "KvCache", "Model", "ParamCounts", "Role", "ServeArgs", "StepBytes", "TensorInfo",
    "arch_from_config", "classify", "discover_model", "expected_experts", "format_bytes", "kv_cache", "load_config",
    "load_model", "model_from_config", "param_counts", "parse_bytes", "parse_command", "read_header",
    "resolve_model", "step_bytes",
]
