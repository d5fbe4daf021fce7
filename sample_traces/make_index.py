"""Regenerate sample_traces/index.json from the manifests beside each trace.

    python sample_traces/make_index.py
    python sample_traces/make_index.py --zoo-rows     # the README's zoo table rows (zoo-* folders), to stdout

Each entry's ``path`` is the committed trace file: ``trace.sqlite`` (kept plain for hf-small-eager only),
``trace.sqlite.gz`` (every other nsys export, gzipped; tracekit reads it as is) or ``trace.json.gz``.
"""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
TRACE_NAMES = ("trace.sqlite", "trace.sqlite.gz", "trace.json.gz")


def trace_path(d: Path) -> Path:
    for name in TRACE_NAMES:
        if (d / name).is_file():
            return d / name
    raise SystemExit(f"{d}: no trace file ({', '.join(TRACE_NAMES)})")


def extras(man: dict) -> dict:
    """Workload-specific facts the tests and docs use (None where a workload has none)."""
    serve = man.get("serve") or {}
    stall = serve.get("injected_stall") or {}
    return {
        "tokens_per_step": man.get("tokens_per_step"),
        "markers": man.get("markers", "legacy") is not None,
        "context": man.get("context"),
        "kv_bytes_per_step": man.get("kv_bytes_per_step"),
        "unprofiled_plain_step_ms": man.get("unprofiled_plain_step_ms"),
        "unprofiled_draft_phase_ms": man.get("unprofiled_draft_phase_ms"),
        "draft_forwards_per_step": (man.get("draft_model") or {}).get("forwards_per_step"),
        "injected_stall_range": stall.get("range_name"),
        "injected_stall_ms": stall.get("target_ms"),
        # the speculative-decoding zoo (capture/zoo.py)
        "shape": man.get("shape"),
        "draft_model_exists": (man.get("draft_model") or {}).get("exists"),
        "verify_tokens": man.get("verify_tokens"),
        "engine_spans": (man.get("engine_spans") or {}).get("dialect"),
    }


def main() -> None:
    index = {}
    for m in sorted(HERE.glob("*/manifest.json")):
        man = json.loads(m.read_text())
        d = m.parent
        trace = trace_path(d)
        index[d.name] = {
            "path": str(trace.relative_to(HERE.parent)),
            "manifest": str(m.relative_to(HERE.parent)),
            "workload": man["workload"],
            "size": (man.get("model") or {}).get("size"),
            "profiler": man["profiler"],
            "mode": man["mode"],
            "nsys_graph_trace": man.get("nsys_graph_trace"),
            "spec": man["spec"],
            "unprofiled_step_ms": man["unprofiled_step_ms"],
            "weight_bytes_per_step": man["weight_bytes_per_step"],
            "steps": man["steps"],
            "first_step_index": (man.get("profiled") or {}).get("first_step_index"),
            "gpu_name": man["gpu_name"],
            "peak_bw_gbps": man["peak_bw_gbps"],
            "tp": man.get("tp", 1),
            "allreduce": man.get("allreduce"),
            "allreduce_message_bytes": man.get("allreduce_message_bytes"),
            "nsys_stats_kern_sum": (str((d / "nsys_stats_kern_sum.csv").relative_to(HERE.parent))
                                    if (d / "nsys_stats_kern_sum.csv").exists() else None),
            **extras(man),
        }
    out = {"schema": "tracekit.sample_index/1", "device_profile": "sample_traces/device_profile.json",
           "traces": index}
    (HERE / "index.json").write_text(json.dumps(out, indent=2) + "\n")
    print(f"{len(index)} traces -> {HERE / 'index.json'}")


def zoo_rows() -> str:
    """One markdown row per zoo-* capture (sample_traces/README.md, "Speculative-decoding zoo")."""
    rows = []
    for m in sorted(HERE.glob("zoo-*/manifest.json")):
        man = json.loads(m.read_text())
        t = man.get("unprofiled") or {}
        spans = (man.get("engine_spans") or {}).get("dialect")
        marks = "markers" if man.get("markers") else (f"{spans} spans + stack" if spans else "none")
        trace = trace_path(m.parent)
        mb = trace.stat().st_size / 1e6
        rows.append(f"| `{m.parent.name}` | {man['profiler']} | {marks} | {man['steps']} | "
                    f"**{man['unprofiled_step_ms']:.3f}** ({t.get('p10_ms', float('nan')):.3f}–"
                    f"{t.get('p90_ms', float('nan')):.3f}) | {man.get('unprofiled_plain_step_ms', float('nan')):.3f} | "
                    f"{(man.get('spec') or {}).get('accept_len')} | {man.get('unprofiled_draft_phase_ms')} | "
                    f"{trace.name} ({mb:.2f} MB) |")
    return "\n".join(rows)


if __name__ == "__main__":
    import sys

    if "--zoo-rows" in sys.argv[1:]:
        print(zoo_rows())
    else:
        main()
