"""SYNTHETIC traces, built in memory from a few tuples: for definition tests only.

A definition (what a step is, which category an instant goes to, what a launch gap is) is easiest to pin
on a trace small enough to compute by hand; ``docs/definitions.md`` states each rule, and the tests built
with this module take their examples from it. Figures that matter to users stay pinned on real traces
(``sample_traces/``, ``tests/data/``): nothing built here is a measurement, and every trace it builds says
so (``meta.producer == "synthetic"`` and a warning).

Times are given in microseconds (readable by hand) and stored in integer nanoseconds, as readers do.
One host process (pid 1) and one launching thread (tid 1) unless a tuple says otherwise; each GPU activity
gets its own launch call on that thread, so attribution follows the launch time, as in a real trace::

    t = make_trace(
        kernels=[("nvjet_tst_64x8_64x16_4x1_v_bz_TNT", 10, 30, 1)],  # name, GPU start, GPU end, launched at
        ranges=[("decode_step 0", 0, 100)],                            # name, CPU start, CPU end
    )
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from tracekit.trace import GPUS, GRAPH_EXECS, KERNELS, LAUNCHES, MEMOPS, OPS, RANGES, Trace, TraceMeta, conform, empty

SYNTHETIC = "synthetic trace built by tests/factory.py (for definition tests, not a measurement)"
PID, TID, DEVICE, STREAM = 1, 1, 0, 7
LAUNCH_US = 1  # every launch call lasts 1 µs


def _ns(us: float) -> int:
    return int(round(us * 1000))


def make_trace(kernels: Sequence[tuple] = (), ranges: Sequence[tuple] = (), memops: Sequence[tuple] = (),
               *, gpu: str = "NVIDIA H200", peak_bw_gbps: float | None = 4800.0) -> Trace:
    """A :class:`Trace` from tuples (µs).

    ``kernels``: ``(name, gpu_start, gpu_end, launched_at[, stream[, tid]])``. ``memops``: ``(kind, gpu_start,
    gpu_end, launched_at[, copy_kind])`` with ``kind`` ``memcpy`` or ``memset``. ``ranges``: ``(name, start, end[,
    tid])``, nesting depth from containment on their thread.
    """
    k_rows, m_rows, l_rows = [], [], []
    corr = 0
    for k in kernels:
        name, start, end, at = k[:4]
        stream = k[4] if len(k) > 4 else STREAM
        tid = k[5] if len(k) > 5 else TID
        corr += 1
        k_rows.append({"start": _ns(start), "end": _ns(end), "device": DEVICE, "stream": stream, "correlation": corr,
                       "pid": PID, "name": name})
        l_rows.append({"start": _ns(at), "end": _ns(at + LAUNCH_US), "pid": PID, "tid": tid, "correlation": corr,
                       "kind": "kernel", "name": "cudaLaunchKernel"})
    for m in memops:
        kind, start, end, at = m[:4]
        copy_kind = m[4] if len(m) > 4 else ("DtoH" if kind == "memcpy" else None)
        corr += 1
        m_rows.append({"start": _ns(start), "end": _ns(end), "device": DEVICE, "stream": STREAM, "correlation": corr,
                       "pid": PID, "kind": kind, "copy_kind": copy_kind, "bytes": 4096,
                       "name": f"[CUDA {kind} {'Device-to-Host' if copy_kind == 'DtoH' else ''}]".replace(" ]", "]")})
        l_rows.append({"start": _ns(at), "end": _ns(at + LAUNCH_US), "pid": PID, "tid": TID, "correlation": corr,
                       "kind": kind, "name": "cudaMemcpyAsync" if kind == "memcpy" else "cudaMemsetAsync"})
    r_rows = [{"start": _ns(r[1]), "end": _ns(r[2]), "pid": PID, "tid": r[3] if len(r) > 3 else TID, "name": r[0]}
              for r in ranges]

    def frame(rows, schema):
        return conform(pl.DataFrame(rows), schema).sort("start") if rows else empty(schema)

    rng = frame(r_rows, RANGES)
    if rng.height:  # depth: how many earlier ranges of the thread still enclose it (a handful of rows)
        rows = rng.to_dicts()
        for i, r in enumerate(rows):
            r["depth"] = sum(1 for o in rows[:i] if o["tid"] == r["tid"] and o["start"] <= r["start"] and o["end"] >= r["end"])
        rng = conform(pl.DataFrame(rows), RANGES)
    gpus = conform(pl.DataFrame([{"device": DEVICE, "name": gpu, "peak_bw_gbps": peak_bw_gbps}]), GPUS)
    meta = TraceMeta(path="<synthetic>", format="nsys-sqlite", producer="synthetic", markers="nvtx", producer_version=None,
                     graph_trace_mode="none", warnings=(SYNTHETIC,))
    return Trace(kernels=frame(k_rows, KERNELS), memops=frame(m_rows, MEMOPS), launches=frame(l_rows, LAUNCHES),
                 ranges=rng, graph_execs=empty(GRAPH_EXECS), ops=empty(OPS), gpus=gpus, meta=meta).validate()


__all__ = ["make_trace", "SYNTHETIC"]
