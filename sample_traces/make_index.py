"""Regenerate sample_traces/index.json from the manifests beside each trace.

    python sample_traces/make_index.py
"""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> None:
    index = {}
    for m in sorted(HERE.glob("*/manifest.json")):
        man = json.loads(m.read_text())
        d = m.parent
        trace = d / ("trace.sqlite" if man["profiler"] == "nsys" else "trace.json.gz")
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
        }
    out = {"schema": "tracekit.sample_index/1", "device_profile": "sample_traces/device_profile.json",
           "traces": index}
    (HERE / "index.json").write_text(json.dumps(out, indent=2) + "\n")
    print(f"{len(index)} traces -> {HERE / 'index.json'}")


if __name__ == "__main__":
    main()
