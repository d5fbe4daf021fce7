"""The normalized trace model every analysis works on.

A :class:`Trace` is a small frozen dataclass of polars DataFrames with fixed,
documented columns. Readers (``tracekit.readers``) are the only code that knows a
producer's quirks; they must return frames with exactly these columns and dtypes
(``validate`` enforces it). Conventions, for every frame:

* times are integer nanoseconds on one clock per trace (``start`` <= ``end``);
* names are resolved strings (no string ids); the few columns with millions of rows and few distinct
  values (kernel names, launch kinds and API names, op names and shapes) are ``Categorical``: compare them with
  strings as usual, ``cast(pl.String)`` before ``.str`` functions (on the few rows that need it, or on the
  distinct values: ``analyses.phase.name_matches``);
* ``pid`` is the host process that issued the work. A ``correlation`` id is unique
  only within its ``pid`` (nsys correlation ids are per process), so every
  launch <-> GPU-activity join is on ``("pid", "correlation")``.
* kernels replayed from a CUDA graph carry the correlation of their graph launch
  (nsys node mode and Kineto alike).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

import polars as pl

GraphTraceMode = Literal["node", "graph", "none", "unknown"]
SourceFormat = str  # the reading format's name (tracekit.readers.Format.name): "nsys-sqlite", "kineto-json"
# Launch kinds that put work on a GPU (what `tracekit info` counts as launches).
WORK_KINDS: tuple[str, ...] = ("kernel", "graph", "memcpy", "memset")

# Every column of every frame, declared once: frame -> [(column, dtype, description)], in column order. GPU
# activity frames (kernels, memops, graph_execs) lead with the same six interval columns, host interval frames
# (ranges, ops) with the same four; the frames' own columns follow.
_GPU_INTERVAL = ("start", "end", "device", "stream", "correlation", "pid")
_HOST_INTERVAL = ("start", "end", "pid", "tid")
_LEAD = {
    "start": {"gpu": (pl.Int64, "GPU start, ns"), "host": (pl.Int64, "CPU start, ns")},
    "end": {"gpu": (pl.Int64, "GPU end, ns"), "host": (pl.Int64, "CPU end, ns")},
    "device": {"gpu": (pl.Int32, "CUDA device index")},
    "stream": {"gpu": (pl.Int64, "stream id")},
    "correlation": {"gpu": (pl.Int64, "joins launches.correlation within the same pid")},
    "pid": {"gpu": (pl.Int64, "host process"), "host": (pl.Int64, "host process")},
    "tid": {"host": (pl.Int64, "host thread")},
}
_OWN: dict[str, list[tuple[str, pl.DataType, str]]] = {
    "kernels": [
        ("device", pl.Int32, "CUDA device index (nsys deviceId / Kineto args.device)"),
        ("pid", pl.Int64, "host process that launched it"),
        ("name", pl.Categorical, "full (demangled) kernel name (categorical: a few thousand names, millions of rows)"),
        ("graph_id", pl.Int64, "CUDA graph id where known, else null"),
        ("graph_node", pl.Int64, "CUDA graph node id where known (nsys node mode), else null"),
        ("grid", pl.String, "grid dims 'x,y,z' where known"),
        ("block", pl.String, "block dims 'x,y,z' where known"),
    ],
    "memops": [
        ("kind", pl.String, "'memcpy' or 'memset'"),
        ("copy_kind", pl.String, "HtoD, DtoH, DtoD, PtoP, HtoH, ... (memset: null)"),
        ("bytes", pl.Int64, "bytes moved or set"),
        ("name", pl.String, "display name, e.g. '[CUDA memcpy Device-to-Host]'"),
        ("pageable", pl.Boolean, "memcpy from or to pageable host memory (the call blocks the host); null if unknown"),
    ],
    "launches": [
        ("start", pl.Int64, "host API call start, ns"),
        ("end", pl.Int64, "host API call end, ns"),
        ("pid", pl.Int64, "host process"),
        ("tid", pl.Int64, "host thread"),
        ("correlation", pl.Int64, "joins kernels/memops.correlation within the same pid"),
        ("kind", pl.Categorical, "kernel | graph | memcpy | memset | sync | other (nsys: only calls that launch work "
                                 "or synchronise are read; Kineto keeps every runtime call)"),
        ("name", pl.Categorical, "API name without version suffix, e.g. cudaLaunchKernel"),
    ],
    "ranges": [
        ("tid", pl.Int64, "host thread that opened the range"),
        ("name", pl.String, "range text (NVTX message / annotation name)"),
        ("depth", pl.Int32, "nesting depth on its thread, 0 = outermost"),
        ("domain", pl.String, "NVTX domain name, null for the default domain / Kineto"),
    ],
    "graph_execs": [
        ("start", pl.Int64, "GPU start of a whole-graph execution, ns (nsys graph mode)"),
        ("correlation", pl.Int64, "joins the cudaGraphLaunch in launches"),
        ("graph_id", pl.Int64, "graph id"),
    ],
    "ops": [
        ("name", pl.Categorical, "framework op or Python function, e.g. aten::linear (host work: what the launching "
                                 "thread was doing; shapes only for matmul-like and all-reduce ops; categorical: "
                                 "millions of rows of a few hundred names)"),
        ("input_dims", pl.Categorical, "JSON list of input shapes (Kineto 'Input Dims'), null if not recorded or not "
                                       "read (categorical: a few distinct shapes, null in most rows)"),
        ("input_types", pl.Categorical, "JSON list of input dtypes (Kineto 'Input type'), null if not recorded "
                                        "(categorical)"),
    ],
    "collectives": [
        ("start", pl.Int64, "GPU start of the collective's kernel, ns (joins kernels on pid, correlation, start)"),
        ("pid", pl.Int64, "host process"),
        ("correlation", pl.Int64, "the kernel's correlation"),
        ("collective", pl.String, "collective name, e.g. allreduce, _allgather_base"),
        ("in_nelems", pl.Int64, "input elements"),
        ("out_nelems", pl.Int64, "output elements"),
        ("group_size", pl.Int32, "ranks in the process group"),
        ("dtype", pl.String, "element type, e.g. BFloat16, Float"),
        ("pg_name", pl.String, "process group (communicator) name where recorded (Kineto 'Process Group Name'), "
                               "else null"),
    ],
    "gpus": [
        ("device", pl.Int32, "CUDA device index, as kernels.device"),
        ("name", pl.String, "GPU name, e.g. 'NVIDIA H200'"),
        ("peak_bw_gbps", pl.Float64, "peak DRAM bandwidth, GB/s (1e9 B/s), from the trace; null if unknown"),
        ("sm_count", pl.Int32, "multiprocessor count, null if unknown"),
        ("memory_bytes", pl.Int64, "device memory, bytes, null if unknown"),
    ],
}
_LEADS = {"kernels": "gpu", "memops": "gpu", "graph_execs": "gpu", "ranges": "host", "ops": "host"}


def _schema(frame: str) -> dict[str, tuple[pl.DataType, str]]:
    """``frame``'s columns: name -> (dtype, description), in column order (its lead columns first; a frame's own
    entry for a lead column changes its description, not its place)."""
    kind = _LEADS.get(frame)
    cols = {c: _LEAD[c][kind] for c in (_GPU_INTERVAL if kind == "gpu" else _HOST_INTERVAL)} if kind else {}
    cols.update({name: (dtype, text) for name, dtype, text in _OWN[frame]})
    return cols


KERNELS = _schema("kernels")
MEMOPS = _schema("memops")
LAUNCHES = _schema("launches")
RANGES = _schema("ranges")
GRAPH_EXECS = _schema("graph_execs")
OPS = _schema("ops")
COLLECTIVES = _schema("collectives")
GPUS = _schema("gpus")

# Framework ops that launch an all-reduce: their input shapes give the message size of custom / symmetric-memory
# all-reduce kernels, which carry no NCCL args (readers keep them in Trace.ops; tracekit.analyses.collectives
# reads them).
# vllm::all_reduce + symm_mem::multimem_all_reduce_ in trace:TraceLens/tests/traces/b200/eager_trace.json.gz; the
# others as vLLM, SGLang, sgl-kernel and PyTorch (symm_mem, _c10d_functional) register them.
COMM_OPS = (
    "vllm::all_reduce", "vllm::outplace_all_reduce", "vllm::inplace_all_reduce", "_C_custom_ar::all_reduce",
    "symm_mem::multimem_all_reduce_", "symm_mem::multimem_one_shot_all_reduce",
    "symm_mem::multimem_one_shot_all_reduce_out", "symm_mem::one_shot_all_reduce", "symm_mem::one_shot_all_reduce_out",
    "symm_mem::two_shot_all_reduce_", "symm_mem::two_shot_all_reduce_out", "sglang::inplace_all_reduce",
    "sglang::outplace_all_reduce", "sgl_kernel::all_reduce", "sgl_kernel::all_reduce_reg",
    "sgl_kernel::all_reduce_unreg", "_c10d_functional::all_reduce", "_c10d_functional::all_reduce_",
)

SCHEMAS: dict[str, dict[str, tuple[pl.DataType, str]]] = {
    "kernels": KERNELS,
    "memops": MEMOPS,
    "launches": LAUNCHES,
    "ranges": RANGES,
    "graph_execs": GRAPH_EXECS,
    "ops": OPS,
    "gpus": GPUS,
    "collectives": COLLECTIVES,
}


def empty(schema: dict[str, tuple[pl.DataType, str]]) -> pl.DataFrame:
    """An empty frame with the given schema."""
    return pl.DataFrame(schema={k: v[0] for k, v in schema.items()})


def conform(df: pl.DataFrame, schema: dict[str, tuple[pl.DataType, str]]) -> pl.DataFrame:
    """Select and cast ``df`` to ``schema``; missing columns become nulls."""
    cols = []
    for name, (dtype, _) in schema.items():
        if name in df.columns:
            cols.append(pl.col(name).cast(dtype, strict=False))
        else:
            cols.append(pl.lit(None, dtype=dtype).alias(name))
    return df.select(cols)


@dataclass(frozen=True)
class ProcessGroup:
    """One process group of a distributed job (Kineto ``distributedInfo.pg_config``): its name, description
    (``default_pg``, ``undefined``, or a framework's label such as ``tp``), backend (``cuda:nccl``), size and
    global ranks."""

    name: str
    desc: str | None
    backend: str | None
    size: int
    ranks: tuple[int, ...] = ()


@dataclass(frozen=True)
class CaptureStart:
    """The capture's own start as the trace records it: when recording began (``ns``, on the trace's host clock),
    by which call (``call``: ``cuProfilerStart`` / ``cudaProfilerStart`` in an nsys export, torch.profiler's
    ``start_trace`` Python frame or the ``PyTorch Profiler`` trace span in a Kineto trace) and, where recorded, on
    which thread (``pid``/``tid`` null: the profiler started at ``ns`` on a thread the trace does not name).
    ``tracekit.steps`` uses it to tell a whole first step from one the capture cut."""

    ns: int
    call: str
    pid: int | None = None
    tid: int | None = None


@dataclass(frozen=True)
class TraceMeta:
    """What we know about where a trace came from."""

    path: str
    format: SourceFormat
    producer: str  # "nsys" | "kineto"
    # What the format's step markers are called (Steps.marker): "nvtx" (nsys), "annotation" (Kineto)
    markers: str
    producer_version: str | None = None
    schema_version: str | None = None
    graph_trace_mode: GraphTraceMode = "unknown"
    rank: int | None = None
    world_size: int | None = None
    warnings: tuple[str, ...] = ()
    # The profiled command line as the profiler recorded it (nsys META_DATA_CAPTURE), argv order; untrusted text.
    command: tuple[str, ...] | None = None
    # The job's process groups where the producer lists them (Kineto distributedInfo.pg_config); untrusted text.
    process_groups: tuple[ProcessGroup, ...] = ()
    # The capture's recorded start (None: the trace does not record how its capture began).
    capture_start: CaptureStart | None = None


@dataclass(frozen=True)
class Trace:
    """One trace file, normalized. See the module docstring for conventions."""

    kernels: pl.DataFrame
    memops: pl.DataFrame
    launches: pl.DataFrame
    ranges: pl.DataFrame
    graph_execs: pl.DataFrame
    ops: pl.DataFrame
    gpus: pl.DataFrame
    meta: TraceMeta
    manifest: dict | None = field(default=None)
    # Collective metadata of communication kernels where the producer records it (Kineto NCCL kernel args).
    collectives: pl.DataFrame = field(default_factory=lambda: empty(COLLECTIVES))

    def with_warning(self, *msgs: str) -> Trace:
        return replace(self, meta=replace(self.meta, warnings=self.meta.warnings + tuple(msgs)))

    def validate(self) -> Trace:
        """Raise ``AssertionError`` if a frame does not match its schema (a reader bug)."""
        for name, schema in SCHEMAS.items():
            df: pl.DataFrame = getattr(self, name)
            want = [(k, v[0]) for k, v in schema.items()]
            got = list(df.schema.items())
            assert got == want, f"Trace.{name}: columns {got} != schema {want}"
        return self

    @property
    def has_gpu_activity(self) -> bool:
        return self.kernels.height + self.memops.height + self.graph_execs.height > 0


def schema_markdown() -> str:
    """The column reference, as markdown (docs/trace-model.md is generated from it)."""
    out = []
    for name, schema in SCHEMAS.items():
        out.append(f"### `Trace.{name}`\n\n| column | dtype | meaning |\n|---|---|---|")
        for col, (dtype, doc) in schema.items():
            out.append(f"| `{col}` | {dtype} | {doc} |")
        out.append("")
    return "\n".join(out)
