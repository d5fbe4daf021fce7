"""Runtime shared by the workload scripts: argument conventions, the unprofiled timing
phase, the profiled phase (nsys capture range or torch profiler) and the facts file.

Protocol between a workload and the driver (``tracekit/capture.py``):

* the driver passes ``--profiler nsys|torch|none``, ``--steps N``, ``--facts-out PATH``
  and, for torch, ``--trace-out PATH.json.gz``;
* the workload times ``--timed-steps`` steps WITHOUT any profiler (CUDA events, median),
  then runs ``--steps`` marked steps between ``cudaProfilerStart/Stop`` (nsys,
  ``--capture-range=cudaProfilerApi``) or under ``torch.profiler`` (``record_shapes=True``,
  Chrome trace, gzipped);
* it writes its facts (weight bytes, dtype, unprofiled step time, versions, ...) as JSON to
  ``--facts-out``; the driver turns them into ``manifest.json``.

Shared by every workload (issue 26: one copy each): :func:`graphed` (capture a step in a CUDA graph
after side-stream warm-up runs, replay it), :func:`median_ms` (median time of a call: CUDA events or
``perf_counter``), :func:`time_steps` (the unprofiled timing), :func:`profiled_phase`, and
:func:`contract_facts` + :func:`write_facts` (the manifest's contract keys, written the same way by all).

Only torch is needed here (no polars, no tracekit).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import statistics
import sys
import time
from typing import Callable

import markers


def add_common_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profiler", choices=["nsys", "torch", "none"], default="none")
    p.add_argument("--steps", type=int, default=16, help="profiled (marked) decode steps")
    p.add_argument("--timed-steps", type=int, default=50, help="unprofiled steps timed before profiling")
    p.add_argument("--warmup", type=int, default=5, help="steps run before timing")
    p.add_argument("--mode", choices=["eager", "graph", "compile"], default="eager")
    p.add_argument("--device", default="cuda")
    p.add_argument("--facts-out", default=None, help="JSON file the driver reads (manifest facts)")
    p.add_argument("--trace-out", default=None, help="torch profiler: output .json.gz")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-markers", action="store_true",
                   help="no step/draft/verify ranges at all (NVTX or record_function): a user's server trace")


def apply_marker_flag(args) -> None:
    """``--no-markers``: every marker range becomes a no-op (call right after parse_args)."""
    markers.set_enabled(not getattr(args, "no_markers", False))


def torch_device(args):
    """The shared start of every torch workload: seed torch, pick ``--device``, refuse ``--mode graph`` off CUDA.
    Returns ``(torch, device, cuda)``."""
    import torch

    torch.manual_seed(args.seed)
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    if args.mode == "graph" and not cuda:
        raise SystemExit("--mode graph needs a CUDA device")
    return torch, dev, cuda


def versions(framework: str | None = None) -> dict:
    import torch

    return {"torch": torch.__version__, "cuda": torch.version.cuda or "none", "nsys": None,
            "framework": framework}


def gpu_name(device) -> str:
    import torch

    if str(device).startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    return "cpu"


def sync(device) -> None:
    import torch

    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def graphed(fn: Callable[[], object], warm: int = 2, pool=None) -> Callable[[], object]:
    """Capture ``fn`` (over static buffers) in a CUDA graph after ``warm`` runs on a side stream; return
    ``replay()``, which replays the graph and returns what ``fn`` returned during the capture (its static
    output). ``replay.graph`` is the ``torch.cuda.CUDAGraph``. ``fn``'s side effects during warm-up and capture
    (a KV length advanced, a token written) are the caller's to undo."""
    import torch

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(warm):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, pool=pool):
        out = fn()
    torch.cuda.synchronize()

    def replay():
        g.replay()
        return out

    replay.graph = g
    return replay


def median_ms(fn: Callable[[], object], reps: int, device) -> float:
    """Median duration of ``fn()`` over ``reps`` calls: CUDA events around each call on a GPU (the
    call's GPU time, the host waiting after each), ``perf_counter`` on a CPU."""
    import torch

    cuda = str(device).startswith("cuda")
    times = []
    for _ in range(reps):
        if cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def time_steps(step_fn: Callable[[int], None], n: int, device, start_index: int = 0) -> dict:
    """Run ``n`` unprofiled steps; per-step period from CUDA events (start of step i to start
    of step i+1; the last step ends at its end event), plus the host wall time per step."""
    import torch

    cuda = str(device).startswith("cuda")
    periods: list[float] = []
    walls: list[float] = []
    if cuda:
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        end = torch.cuda.Event(enable_timing=True)
    sync(device)
    t_all = time.perf_counter()
    for k in range(n):
        t0 = time.perf_counter()
        if cuda:
            starts[k].record()
        step_fn(start_index + k)
        walls.append((time.perf_counter() - t0) * 1e3)
    if cuda:
        end.record()
    sync(device)
    total_ms = (time.perf_counter() - t_all) * 1e3
    if cuda:
        for k in range(n):
            nxt = starts[k + 1] if k + 1 < n else end
            periods.append(starts[k].elapsed_time(nxt))
    else:
        periods = list(walls)
    return {
        "periods_ms": [round(p, 6) for p in periods],
        "median_ms": statistics.median(periods),
        "mean_ms": statistics.fmean(periods),
        "min_ms": min(periods),
        "max_ms": max(periods),
        "wall_median_ms": statistics.median(walls),
        "total_ms": total_ms,
        "n": n,
        "method": "cuda-events" if cuda else "perf_counter",
    }


def profiled_phase(step_fn: Callable[[int], None], args, start_index: int,
                   barrier: Callable[[], None] | None = None, with_stack: bool = False,
                   after: Callable[[], None] | None = None) -> dict:
    """Run ``args.steps`` marked steps under the chosen profiler. Returns facts about it.

    ``barrier`` (tensor parallelism): called on every rank right before the profiler starts and
    before it stops, so that all ranks' capture windows cover the same steps. ``with_stack``: the torch
    profiler records Python frames too. ``after``: run after the last step, inside the window (an
    overlapped loop's deferred host read)."""
    import torch

    barrier = barrier or (lambda: None)

    n = args.steps
    info: dict = {"profiled_steps": n, "first_step_index": start_index}

    def marked_loop() -> None:
        t0 = time.perf_counter()
        for k in range(n):
            with markers.step(start_index + k):
                step_fn(start_index + k)
        if after is not None:
            after()
        # host time of the marked loop alone: the final synchronize also waits for the
        # profiler's buffer flush (hundreds of ms under nsys), which is no step time
        info["host_loop_ms_per_step"] = (time.perf_counter() - t0) * 1e3 / max(n, 1)

    if args.profiler == "nsys":
        on_gpu = str(args.device).startswith("cuda")     # a CPU run (tests, stand-in nsys) has no capture range
        sync(args.device)
        barrier()
        if on_gpu:
            torch.cuda.cudart().cudaProfilerStart()
        marked_loop()
        sync(args.device)
        barrier()
        if on_gpu:
            torch.cuda.cudart().cudaProfilerStop()
    elif args.profiler == "torch":
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU]
        if str(args.device).startswith("cuda"):
            acts.append(ProfilerActivity.CUDA)
        # No profiler schedule: it would add `ProfilerStep#N` ranges that compete with our
        # `decode_step <i>` markers. The profiler is started before the first marked step.
        sync(args.device)
        barrier()
        prof = profile(activities=acts, record_shapes=True, with_stack=with_stack)
        prof.start()
        marked_loop()
        sync(args.device)
        barrier()
        prof.stop()
        out = args.trace_out or "trace.json.gz"
        raw = out[:-3] if out.endswith(".gz") else out
        prof.export_chrome_trace(raw)
        if out.endswith(".gz"):
            with open(raw, "rb") as f_in, gzip.open(out, "wb", compresslevel=9) as f_out:
                shutil.copyfileobj(f_in, f_out)
            os.remove(raw)
        info["trace"] = out
    else:  # plain run, markers only (useful under an external profiler)
        marked_loop()
        sync(args.device)
    return info


def finish(args, facts: dict, tp_facts: dict | None, dist_) -> int:
    """Every workload's last step: add the tensor-parallel facts, report them, leave the process group."""
    if tp_facts:
        facts["tensor_parallel"] = tp_facts
        facts["allreduce"] = tp_facts["allreduce"]
        facts["allreduce_message_bytes"] = tp_facts["allreduce_message_bytes"]
    write_facts(args, facts)
    if dist_ is not None:
        dist_.barrier()
        dist_.close()
    return 0


def contract_facts(workload: str, args, device, *, weight_bytes: int | None, tokens_per_step: int, timing: dict,
                   dtype: str | None = None, spec=None, tp: int = 1, framework: str | None = None) -> dict:
    """The manifest's contract keys that every workload reports the same way (the driver adds the rest):
    ``unprofiled_step_ms`` is the median of ``timing`` (:func:`time_steps`), rounded to the ns."""
    return {
        "workload": workload,
        "mode": args.mode,
        "steps": args.steps,
        "gpu_name": gpu_name(device),
        "weight_bytes_per_step": None if weight_bytes is None else int(weight_bytes),
        "dtype": dtype if dtype is not None else args.dtype,
        "tp": tp,
        "spec": spec,
        "tokens_per_step": int(tokens_per_step),
        "unprofiled_step_ms": round(timing["median_ms"], 6),
        "versions": versions(framework),
    }


def write_facts(args, facts: dict) -> None:
    text = json.dumps(facts, indent=2, sort_keys=True)
    print("FACTS " + json.dumps(facts, sort_keys=True), flush=True)
    if args.facts_out:
        with open(args.facts_out, "w") as f:
            f.write(text + "\n")


def log(*a) -> None:
    print("[workload]", *a, file=sys.stderr, flush=True)
