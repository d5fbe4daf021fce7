"""Roofline and advice: which lever (CUDA graphs, all-reduce, drafting, fewer bytes) is worth pulling.

Each lever gets ``predicted_step_ms`` (the step with that lever pulled as far as it
goes), ``max_saving_ms`` = mean step − predicted, ``max_saving_fraction`` and a verdict
sentence. Every number comes from the breakdown of the trace plus, for CUDA graphs, a
per-kernel replay cost calibrated on the H200 (``tracekit capture --workload synthetic``
writes it; ``--device-profile`` passes one in). docs/validation.md records predicted
versus measured step times.

CUDA-graph model. In an eager step the GPU waits for the host between kernels
(``launch_gaps``), and the host's per-launch cost is inflated by the profiler. Replayed
from a graph, the same kernels run back to back with a small fixed cost each, so::

    predicted = busy + n_launches × replay_gap

where ``busy`` is the step's GPU-busy time (the union of its activity), ``n_launches`` the
work it launched one by one, and ``replay_gap`` the per-node cost of graph replay on this
GPU. The host time between steps is assumed to shrink to the replay itself (true for a
tight decode loop; a server's scheduler keeps its own time, reported as ``idle``).
``replay_gap`` comes from ``--device-profile`` (key ``graph_replay_gap_us``), else the
H200 calibration below, measured with the synthetic calibration loop
(docs/validation.md): its eager trace's busy time and launches against its unprofiled
graph-replay step time.
"""

from __future__ import annotations

from tracekit.gpus import lookup, resolve_peak_bw

# Per-node cost of graph replay (µs) when no device profile is given. Calibrated on the H200 with
# sample_traces/synthetic-eager (busy 0.912 ms, 227 launches per step) against the unprofiled
# graph-replay step of the same loop (1.0438 ms): (1.0438 - 0.912) / 227 = 0.58 µs.
DEFAULT_REPLAY_GAP_US = 0.58
GRAPHED_SHARE = 0.8  # contract: not applicable when >= 80% of kernel time is graph replay


def _lever(applicable: bool, predicted: float | None, mean: float, verdict: str) -> dict:
    saving = None if predicted is None else max(0.0, mean - predicted)
    return {
        "applicable": bool(applicable),
        "predicted_step_ms": predicted,
        "max_saving_ms": saving,
        "max_saving_fraction": None if saving is None or mean <= 0 else saving / mean,
        "verdict": verdict,
    }


def _pct(x: float) -> str:
    v = 100 * x
    return f"{v:.1f}%" if abs(v) < 10 else f"{v:.0f}%"


def _first(*values):
    return next((v for v in values if v is not None), None)


def cuda_graphs_lever(b, replay_gap_us: float) -> dict:
    ps = b.per_step_ms
    mean = b.steps["mean_ms"]
    share = b.extras["graph_kernel_share"]
    gaps, idle = ps["launch_gaps"], ps["idle"]
    if share >= GRAPHED_SHARE:
        return _lever(False, mean, mean,
                      f"steps already replay CUDA graphs ({_pct(share)} of kernel time); what remains is "
                      f"{gaps:.3f} ms of launch gaps and {idle:.3f} ms of idle per step")
    n_eager = b.extras["launched_per_step"]
    busy = b.extras["busy_ms"]
    predicted = min(busy + n_eager * replay_gap_us / 1000.0, mean)
    saving = mean - predicted
    part = f" for its eager part ({_pct(1 - share)} of kernel time)" if share > 0.01 else ""
    verdict = (f"CUDA graphs{part} would cut the step from {mean:.3f} to about {predicted:.3f} ms "
               f"(−{saving:.3f} ms, {_pct(saving / mean if mean else 0)}): {gaps:.3f} ms of launch gaps between "
               f"{n_eager:.0f} launches become ≈{replay_gap_us:.2f} µs each, and the {idle:.3f} ms idle after "
               f"the last kernel shrinks to the replay (host work between steps is not modelled)")
    if saving / mean < 0.05 if mean else True:
        verdict = (f"CUDA graphs would save little: {gaps:.3f} ms of launch gaps per step "
                   f"({_pct(gaps / mean if mean else 0)}); the GPU is already kept busy")
    return _lever(True, predicted, mean, verdict)


_DTYPE_BYTES = {"float": 4, "float32": 4, "double": 8, "float64": 8, "bfloat16": 2, "half": 2, "float16": 2,
                "long": 8, "int64": 8, "int": 4, "int32": 4, "short": 2, "byte": 1, "char": 1, "bool": 1,
                "float8_e4m3fn": 1, "float8_e5m2": 1, "uint8": 1, "int8": 1}


def collective_bandwidth(b, trace) -> dict | None:
    """Achieved bus bandwidth of the step's collectives whose message sizes the trace records (NCCL convention:
    all-reduce algbw × 2(n−1)/n; all-gather / reduce-scatter × (n−1)/n). None when no sizes are known."""
    import polars as pl

    acts = b.activities
    if acts is None or trace.collectives.height == 0:
        return None
    comm = acts.filter((pl.col("category") == "communication") & (pl.col("kind") == "kernel"))
    coll = trace.collectives.with_columns(
        size=pl.col("dtype").str.to_lowercase().replace_strict(_DTYPE_BYTES, default=None, return_dtype=pl.Int64))
    # join on the unclipped kernel start: the activity frame keeps it in `start` unless clipped at a period edge
    j = comm.join(coll, on=["pid", "correlation", "start"], how="inner").filter(
        pl.col("size").is_not_null() & (pl.col("dur") > 0) & (pl.col("group_size") > 1))
    if j.height == 0:
        return None
    name = pl.col("collective").str.to_lowercase()
    n = pl.col("group_size").cast(pl.Float64)
    factor = (pl.when(name.str.contains("allreduce|all_reduce")).then(2 * (n - 1) / n)
              .when(name.str.contains("allgather|all_gather|reduce_scatter|reducescatter")).then((n - 1) / n)
              .otherwise(1.0))
    j = j.with_columns(bytes=pl.max_horizontal("in_nelems", "out_nelems") * pl.col("size"),
                       busbw=pl.max_horizontal("in_nelems", "out_nelems") * pl.col("size") * factor
                       / (pl.col("dur") * 1e-9) / 1e9)
    top = j.group_by("collective").agg(count=pl.len(), bytes=pl.col("bytes").median(),
                                       busbw=pl.col("busbw").median()).sort("count", descending=True)
    return {"collective": top["collective"][0], "count": int(top["count"][0]),
            "median_bytes": float(top["bytes"][0]), "median_busbw_gbps": float(top["busbw"][0]),
            "group_size": int(j["group_size"][0])}


def communication_lever(b, trace=None) -> dict:
    mean = b.steps["mean_ms"]
    exposed = b.per_step_ms["communication"]
    kernel = b.kernel_ms_per_step["communication"]
    if exposed is None:
        return _lever(False, None, mean, "communication cannot be measured: graph work has no per-kernel rows")
    if not kernel:
        return _lever(False, mean, mean, "no communication kernels in the step: an all-reduce change cannot help")
    hidden = max(0.0, kernel - exposed)
    verdict = (f"exposed communication is {exposed:.3f} ms per step ({_pct(exposed / mean if mean else 0)}; "
               f"{hidden:.3f} ms more overlaps compute): the most a faster all-reduce could save")
    cost = collective_overheads(b)
    if cost and (cost["staging_ms"] > 0 or cost["node_ms"] > 0):
        parts = [f"its staging copies ({cost['staging_ms']:.3f} ms)"] if cost["staging_ms"] > 0 else []
        if cost["node_ms"] > 0:
            parts.append(f"{cost['nodes_per_step']:.0f} graph nodes ({cost['node_ms']:.3f} ms)")
        verdict += (f"; counting {' and '.join(parts)}, the all-reduce costs "
                    f"{exposed + cost['staging_ms'] + cost['node_ms']:.3f} ms per step")
    bw = collective_bandwidth(b, trace) if trace is not None else None
    if bw:
        b.extras["collective_bandwidth"] = bw
        spec = lookup(b.gpu.get("name"))
        link = f" against {spec.link_bw_gbps:,.0f} GB/s per direction over {spec.link}" if spec and spec.link_bw_gbps \
            else ""
        verdict += (f"; its {bw['collective']} of {bw['median_bytes'] / 1e6:.2f} MB over {bw['group_size']} ranks "
                    f"reaches {bw['median_busbw_gbps']:,.1f} GB/s bus bandwidth (median; kernel time includes "
                    f"waiting for other ranks){link}")
    lever = _lever(True, mean - exposed, mean, verdict)
    if cost:
        # extension keys (the contract's max_saving_ms stays the exposed kernel time)
        total = exposed + cost["staging_ms"] + cost["node_ms"]
        lever.update(staging_ms=cost["staging_ms"], graph_node_ms=cost["node_ms"], implementation_cost_ms=total,
                     free_allreduce_step_ms=max(0.0, mean - total))
    return lever


def collective_overheads(b) -> dict | None:
    """What a collective costs besides its kernel: memory copies issued right before it on its stream (staging
    into symmetric-memory or custom all-reduce buffers) and, in graph-replayed steps, one replay node each."""
    import polars as pl

    acts = b.activities
    if acts is None or acts.height == 0:
        return None
    if acts.filter((pl.col("category") == "communication") & (pl.col("kind") == "kernel")).height == 0:
        return None  # (before the sort below: ten million activities, none of them a collective)
    a = acts.select("step", "stream", "start", "dur", "kind", "category").sort(["stream", "start"])
    a = a.with_columns(next_cat=pl.col("category").shift(-1).over("stream"))
    comm = a.filter((pl.col("category") == "communication") & (pl.col("kind") == "kernel"))
    if comm.height == 0:
        return None
    staging = a.filter((pl.col("kind") == "memop") & (pl.col("next_cat") == "communication"))
    n = max(1, b.steps["count"])
    nodes = (comm.height + staging.height) / n
    graphed = b.extras.get("graph_kernel_share", 0) >= GRAPHED_SHARE
    gap = b.extras.get("replay_gap_us", DEFAULT_REPLAY_GAP_US)
    return {"staging_ms": float(staging["dur"].sum()) / 1e6 / n, "nodes_per_step": nodes,
            "node_ms": nodes * gap / 1000.0 if graphed else 0.0}


def drafting_lever(b, accept_len: float | None, tokens_per_step: float) -> dict:
    mean = b.steps["mean_ms"]
    draft = b.per_step_ms["drafting"]
    if draft is None:
        return _lever(False, None, mean, "drafting cannot be measured: graph work has no per-kernel rows")
    if draft <= 0:
        return _lever(False, mean, mean, "no drafting in the step (no draft ranges or speculative kernels)")
    # The draft phase costs its wall time on the GPU timeline, launch gaps between its kernels included.
    phase = max(draft, min(b.extras.get("draft_phase_ms", 0.0), mean))
    without = mean - phase
    verdict = f"the draft phase takes {phase:.3f} ms per step ({_pct(phase / mean if mean else 0)})"
    if phase > draft * 1.05:
        verdict += f", {draft:.3f} ms of it GPU work"
    if accept_len:
        spec_tps = accept_len * tokens_per_step / mean * 1000
        plain_tps = tokens_per_step / without * 1000 if without > 0 else None
        if plain_tps:
            better = "pays off" if spec_tps > plain_tps else "does not pay off"
            verdict += (f"; with {accept_len:.2f} tokens accepted per step speculation gives {spec_tps:.1f} tok/s "
                        f"against ≈{plain_tps:.1f} tok/s without it (verify forward kept, draft removed): it {better}")
            verdict += f" (break-even at {mean / without:.2f} accepted tokens per step)"
    else:
        verdict += "; pass --accept-len to compare tokens/s with and without speculation"
    return _lever(True, without, mean, verdict)


def memory_lever(b, roof: dict) -> dict:
    mean = b.steps["mean_ms"]
    floor = roof.get("floor_ms")
    if floor is None:
        return _lever(False, None, mean, "weight bytes or peak bandwidth unknown: pass --weight-bytes and --peak-bw "
                                         "to compare the step with the memory-bandwidth floor")
    frac = floor / mean if mean else 0
    gemm = b.per_step_ms["gemm"]
    bw = roof.get("gemm_achieved_bw_gbps")
    peak = b.gpu.get("peak_bw_gbps")
    if frac >= 0.7 and gemm is not None:
        bw_txt = f" at {_pct(bw / peak)} of peak bandwidth" if bw and peak else ""
        verdict = (f"{_pct(gemm / mean if mean else 0)} of the step reads weights{bw_txt}; the step is at "
                   f"{_pct(frac)} of the weight-read floor ({floor:.3f} ms): memory-bound; CUDA graphs or NCCL "
                   f"changes cannot help much — fewer bytes can (quantization, batching, better acceptance)")
    else:
        verdict = (f"the step takes {mean:.3f} ms against a weight-read floor of {floor:.3f} ms ({_pct(frac)} of "
                   f"it): {mean - floor:.3f} ms per step are not spent reading weights")
        rest = sorted(((k, v) for k, v in b.per_step_ms.items() if k != "gemm" and v), key=lambda kv: -kv[1])[:2]
        if rest:
            verdict += "; the largest other parts: " + ", ".join(f"{k.replace('_', ' ')} {v:.3f} ms" for k, v in rest)
        if gemm and bw and peak:
            verdict += f" (the gemm kernels themselves read at {_pct(bw / peak)} of peak bandwidth)"
    return _lever(True, floor, mean, verdict)


def advise(b, trace, *, trace_bw=None, weight_bytes=None, peak_bw=None, accept_len=None, tokens_per_step=None,
           device_profile=None):
    """Fill ``b.gpu`` peak bandwidth, ``b.roofline`` and ``b.advice`` (returns ``b``)."""
    from tracekit.analyses.roofline import roofline

    man = trace.manifest or {}
    warnings = b.warnings
    bw, bw_src = resolve_peak_bw(peak_bw, man.get("peak_bw_gbps"), trace_bw, b.gpu["name"] or man.get("gpu_name"))
    b.gpu["peak_bw_gbps"], b.gpu["peak_bw_source"] = bw, bw_src
    if bw is None:
        warnings.append("peak memory bandwidth unknown (GPU not in the trace or the table): pass --peak-bw GBPS")
    if weight_bytes is not None:
        wb, wb_src = int(weight_bytes), "flag"
    elif man.get("weight_bytes_per_step") is not None:
        wb, wb_src = int(man["weight_bytes_per_step"]), "manifest"
    else:
        wb, wb_src = _weight_bytes_from_trace(trace, b, warnings)
    if wb is None:
        warnings.append("weight bytes per step unknown: pass --weight-bytes N (or capture with tracekit capture, "
                        "whose manifest records them)")
    spec = man.get("spec") or {}
    acc = _first(accept_len, spec.get("accept_len"))
    tps_batch = _first(tokens_per_step, man.get("tokens_per_step"), 1)
    tokens = (acc if acc else 1) * tps_batch
    roof = roofline(wb, bw, b.steps["mean_ms"], tokens, b.kernel_ms_per_step.get("gemm")).to_dict()
    roof = {"weight_bytes_per_step": roof["weight_bytes_per_step"], "weight_bytes_source": wb_src if wb else None,
            **{k: v for k, v in roof.items() if k != "weight_bytes_per_step"}}
    b.roofline = roof
    unprof = man.get("unprofiled_step_ms")
    if man:
        b.extras["manifest"] = {k: man.get(k) for k in ("workload", "mode", "unprofiled_step_ms", "tp")}
    if unprof and b.steps["mean_ms"] > 1.2 * unprof:
        warnings.append(
            f"the traced steps ({b.steps['mean_ms']:.3f} ms) are {b.steps['mean_ms'] / unprof:.1f}x the unprofiled step "
            f"time in the manifest ({unprof:.3f} ms): launch gaps and idle include the profiler's own overhead")
    gap = DEFAULT_REPLAY_GAP_US
    if device_profile and isinstance(device_profile.get("graph_replay_gap_us"), (int, float)) \
            and device_profile["graph_replay_gap_us"] > 0:
        gap = float(device_profile["graph_replay_gap_us"])
    b.extras["replay_gap_us"] = gap
    b.advice = {
        "cuda_graphs": cuda_graphs_lever(b, gap),
        "communication": communication_lever(b, trace),
        "drafting": drafting_lever(b, acc, tps_batch),
        "memory_bandwidth": memory_lever(b, roof),
    }
    ranked = sorted((k for k, v in b.advice.items() if v["applicable"] and (v["max_saving_ms"] or 0) > 0
                     and k != "memory_bandwidth"),
                    key=lambda k: -(b.advice[k]["max_saving_ms"] or 0))
    b.extras["ranked"] = ranked
    return b


def _weight_bytes_from_trace(trace, b, warnings):
    """Weight bytes from the trace itself: recorded op shapes (Kineto) or SGLang layer-wise NVTX text."""
    try:
        from tracekit.analyses.roofline import weight_bytes_from_nvtx, weight_bytes_from_shapes
    except ImportError:  # pragma: no cover
        return None, None
    if trace.ops.height and trace.ops["input_dims"].is_not_null().any():
        # Only the ops of the analysed steps (warm-up or prefill ops would inflate the bytes).
        import polars as pl

        w = b.extras["step_windows"].sort("start")
        ops = (trace.ops.sort("start")
               .join_asof(w.rename({"start": "ws", "end": "we"}), left_on="start", right_on="ws",
                          by=["pid", "tid"], strategy="backward", check_sortedness=False)
               .filter(pl.col("step").is_not_null() & (pl.col("start") <= pl.col("we")))
               .drop("ws", "we"))
        if ops.height:
            wb, _detail = weight_bytes_from_shapes(ops, n_steps=b.steps["count"])
            if wb:
                return int(wb), "shapes"
    if trace.ranges.height:
        wb = weight_bytes_from_nvtx(trace.ranges["name"])
        if wb:
            return int(wb), "nvtx"
    return None, None


__all__ = ["advise", "lookup"]
