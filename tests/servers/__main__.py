"""Run a TEST SERVER (not SGLang, not vLLM) from the command line, for trying ``tracekit capture --server`` by hand:

    python -m tests.servers sglang --port 30000 --traces sample_traces/spec-small-graph-torch/trace.json.gz \\
        --speculative-num-steps 3 --accept 2,3,1,4
    python -m tests.servers vllm --port 8000 --profiler-dir /tmp/vp --dev-mode --traces A.json.gz B.json.gz --tp 2

It serves until interrupted; its decode step is simulated (``--step-ms``), its traces are the files given (one per
rank, cycled), copied when the profiler stops.
"""

from __future__ import annotations

import argparse
import time

from tests.servers.common import SimScheduler
from tests.servers.sglang import CopyTraces, SGLangApp
from tests.servers.sglang import serve as serve_sglang
from tests.servers.vllm import VLLMApp
from tests.servers.vllm import serve as serve_vllm


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.servers", description=__doc__.split("\n\n")[0])
    p.add_argument("engine", choices=["sglang", "vllm"])
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--traces", nargs="+", required=True, help="recorded trace per rank (cycled)")
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--dp", type=int, default=1)
    p.add_argument("--model", default="test/model", help="the model path the server reports")
    p.add_argument("--step-ms", type=float, default=6.0, help="the simulated decode step")
    p.add_argument("--profiled-slowdown", type=float, default=1.5, help="the step's factor while profiling")
    p.add_argument("--accept", default="1", help="tokens each step accepts, in turn (e.g. 2,3,1,4)")
    p.add_argument("--speculative-num-steps", type=int, default=None, help="speculative: K draft tokens")
    p.add_argument("--profiler-dir", default=None, help="vllm: its torch_profiler_dir (none: no profiler)")
    p.add_argument("--dev-mode", action="store_true", help="vllm: serve /server_info")
    a = p.parse_args(argv)
    cycle = tuple(int(x) for x in a.accept.split(","))
    holder = {}
    sched = SimScheduler(step_s=a.step_ms / 1e3, accept_cycle=cycle,
                         slowdown=lambda: a.profiled_slowdown if holder["app"].profiling else 1.0)
    backend = CopyTraces(a.traces)
    k = a.speculative_num_steps
    if a.engine == "sglang":
        spec = ({"speculative_algorithm": "EAGLE", "speculative_num_steps": k, "speculative_eagle_topk": 1,
                 "speculative_num_draft_tokens": k + 1} if k else None)
        app = SGLangApp(sched=sched, backend=backend, model_path=a.model, tp=a.tp, dp=a.dp, speculative=spec,
                        api="new")
        holder["app"] = app
        srv = serve_sglang(app, a.port)
    else:
        spec = {"method": "eagle", "num_speculative_tokens": k} if k else None
        app = VLLMApp(sched=sched, backend=backend, model=a.model, tp=a.tp, dp=a.dp, speculative=spec,
                      profiler_dir=a.profiler_dir, dev_mode=a.dev_mode)
        holder["app"] = app
        srv = serve_vllm(app, a.port)
    print(f"TEST SERVER ({a.engine} API, not {a.engine}) at {srv.url}", flush=True)
    try:
        while True:
            time.sleep(1)
    except KeyboardInterrupt:
        pass
    finally:
        srv.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
