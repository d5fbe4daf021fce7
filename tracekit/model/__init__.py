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

# Each name is imported from its module when first asked for (PEP 562): importing ``tracekit.model.units`` (the
# option parser's dtypes) then costs only that module, not the whole package (~0.03 s, before a command starts).
_HOME = {
    "arch": ("Arch", "arch_from_config", "load_config"),
    "checkpoint": ("Model", "load_model", "model_from_config"),
    "discover": ("Discovery", "ServeArgs", "discover_model", "parse_command", "resolve_model"),
    "params": ("ParamCounts", "param_counts"),
    "roles": ("Role", "classify"),
    "safetensors": ("TensorInfo", "read_header"),
    "step": ("KvCache", "StepBytes", "expected_experts", "kv_cache", "step_bytes"),
    "units": ("BYTES", "format_bytes", "parse_bytes"),
}
_MODULE_OF = {name: module for module, names in _HOME.items() for name in names}


def __getattr__(name: str):
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'tracekit.model' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"tracekit.model.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_MODULE_OF))


__all__ = [
    "Arch", "BYTES", "Discovery", "KvCache", "Model", "ParamCounts", "Role", "ServeArgs", "StepBytes", "TensorInfo",
    "arch_from_config", "classify", "discover_model", "expected_experts", "format_bytes", "kv_cache", "load_config",
    "load_model", "model_from_config", "param_counts", "parse_bytes", "parse_command", "read_header",
    "resolve_model", "step_bytes",
]
