"""The capture manifest (``manifest.json`` beside a trace, schema ``tracekit.manifest/1``).

Read-only here: ``tracekit capture`` writes it; every analysis command reads it when it
lies beside the trace. A malformed manifest is ignored with a warning (the trace itself
is still analysable), never trusted half-way.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

SCHEMA = "tracekit.manifest/1"
KEYS = ("schema", "workload", "profiler", "mode", "steps", "gpu_name", "peak_bw_gbps", "weight_bytes_per_step",
        "dtype", "tp", "spec", "tokens_per_step", "unprofiled_step_ms", "versions", "command")


def find_manifest(trace_path: Path) -> Path | None:
    p = Path(trace_path).parent / "manifest.json"
    return p if p.is_file() else None


def read_manifest(path: Path) -> tuple[dict | None, str | None]:
    """(manifest, warning). Only well-formed values are kept; each bad field is dropped."""
    try:
        raw = path.read_bytes()
        if len(raw) > 1_000_000:
            return None, f"{path}: manifest larger than 1 MB, ignored"
        data = json.loads(raw)
    except (OSError, ValueError) as e:
        return None, f"{path}: unreadable manifest ignored ({e})"
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        return None, f"{path}: not a {SCHEMA} manifest, ignored"

    def num(v, kind=float):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return None
        if v != v or v < 0 or v == float("inf"):
            return None
        return kind(v)

    out = dict(data)
    out["peak_bw_gbps"] = num(data.get("peak_bw_gbps"))
    out["weight_bytes_per_step"] = num(data.get("weight_bytes_per_step"), int)
    out["unprofiled_step_ms"] = num(data.get("unprofiled_step_ms"))
    out["tokens_per_step"] = num(data.get("tokens_per_step"))
    out["tp"] = num(data.get("tp"), int)
    spec = data.get("spec")
    if isinstance(spec, dict):
        out["spec"] = {"draft_tokens": num(spec.get("draft_tokens"), int), "accept_len": num(spec.get("accept_len"))}
    else:
        out["spec"] = None
    return out, None


def attach_manifest(trace, trace_path: Path):
    """Return ``trace`` with the manifest beside ``trace_path`` attached (if any)."""
    mp = find_manifest(trace_path)
    if mp is None:
        return trace
    manifest, warning = read_manifest(mp)
    trace = replace(trace, manifest=manifest)
    return trace.with_warning(warning) if warning else trace
