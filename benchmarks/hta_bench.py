"""Peer (b): HTA (PyPI ``traceinsight``, formerly HolisticTraceAnalysis) on one Kineto trace.

Loads the trace and computes HTA's temporal and kernel breakdowns, the analyses nearest to
``tracekit breakdown``. Run with the python of a separate venv (never the project's):

    python -m venv /tmp/hta-venv && /tmp/hta-venv/bin/pip install traceinsight
    /tmp/hta-venv/bin/python benchmarks/hta_bench.py /tmp/kineto_1GB.json /tmp/hta-work
"""

import json
import os
import sys
import time
from pathlib import Path


def main():
    trace, work = Path(sys.argv[1]).resolve(), Path(sys.argv[2])
    d = work / trace.name.replace(".", "_")
    d.mkdir(parents=True, exist_ok=True)
    link = d / ("rank0" + ("".join(trace.suffixes[-2:]) if trace.name.endswith(".gz") else ".json"))
    if not link.exists():
        os.symlink(trace, link)
    t0 = time.perf_counter()
    from hta.trace_analysis import TraceAnalysis

    ta = TraceAnalysis(trace_dir=str(d))
    t1 = time.perf_counter()
    res, errors = {}, {}
    for name, fn in (("temporal", lambda: ta.get_temporal_breakdown(visualize=False)),
                     ("kernel", lambda: ta.get_gpu_kernel_breakdown(visualize=False))):
        try:
            out = fn()
            res[name + "_rows"] = len(out[1] if isinstance(out, tuple) else out)
        except Exception as e:  # noqa: BLE001 - HTA asserts on some traces; the time still counts
            errors[name] = f"{type(e).__name__}: {e}"[:200]
    t2 = time.perf_counter()
    print(json.dumps({"load_s": round(t1 - t0, 2), "analyses_s": round(t2 - t1, 2), **res, "errors": errors}))


if __name__ == "__main__":
    main()
