"""Collectives: what each communication kernel is, how big, how fast, and how much of it compute hides.

One rank's communication is summarised in a :class:`CommSummary` (small and picklable: what a Dask worker
sends back instead of the whole breakdown); :mod:`tracekit.analyses.ranks` matches the summaries of several
ranks. Definitions (../shared/spec/CONTRACT.md):

* **kind** of a collective: the NCCL args' ``Collective name`` where recorded, else the kernel name
  (``all_reduce``, ``all_gather``, ``reduce_scatter``, ``all_to_all``, ``broadcast``, ``reduce``,
  ``send_recv``); custom, fused all-reduce+norm, symmetric-memory and one/two-shot kernels are all-reduces.
  ``implementation`` is the kernel rule's ``sub`` (``nccl``, ``custom_ar``, ``fused_ar_norm``, ``symm_mem``...).
* **message bytes** (NCCL's "size": the whole buffer, the output of an all-gather, the input of a
  reduce-scatter): ``max(In msg nelems, Out msg nelems) x dtype size`` from Kineto NCCL kernel args; for
  kernels without them (custom / multimem / symmetric-memory all-reduces) the input shape of the framework op
  that launched the kernel (``vllm::all_reduce``, ``symm_mem::multimem_all_reduce_``...,
  ``tracekit.trace.COMM_OPS``): the largest tensor argument's elements x its dtype size. Kernels
  replayed from a CUDA graph have no launching op: their size is unknown (null).
* **algorithm bandwidth** = bytes / time; **bus bandwidth** (NCCL's convention, nccl-tests
  ``doc/PERFORMANCE.md``) = algbw x 2(n-1)/n for all-reduce, x (n-1)/n for all-gather, reduce-scatter and
  all-to-all, x 1 otherwise; n = the communicator's size.
* **latency-bound**: NCCL's own cost model (``src/graph/tuning.cc``) prices a ring collective at
  ``latency + bytes / bandwidth`` with a per-step hardware latency of 0.6 us over NVLink and 1.0 us over PCIe
  (ring, LL protocol) and 2(n-1) steps for an all-reduce, n-1 for all-gather / reduce-scatter. A collective
  is latency-bound when moving its bus bytes at the link's bandwidth takes no longer than that latency:
  ``bytes x busbw factor / link_gbps <= steps x hop latency``. A batch-1 decode all-reduce of 16 KB over 8
  NVLink-4 GPUs: 0.06 us of transfer against 8.4 us of latency. Where the size is unknown, a call whose
  whole duration is at most twice the latency term is latency-bound too (its bandwidth term cannot exceed
  the latency). There a one-shot / custom all-reduce or fewer, fused calls help; a bandwidth verdict is wrong.
* **hidden communication** (``advice.communication.hidden_communication_ms``): communication kernel time
  overlapped by compute (gemm, attention, other, drafting) on *other* streams. Activities of one stream are
  serialised first (each starts at the later of its own start and the end of the activities before it on
  that stream), so programmatic-dependent-launch overlap on one stream hides nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl

from tracekit.model.units import DTYPE_BITS
from tracekit.trace import COMM_OPS, Trace

# Per-step hardware latency of a ring collective, us (NCCL src/graph/tuning.cc hwLat, ring / LL protocol).
HOP_LATENCY_US = {"nvlink": 0.6, "pcie": 1.0}
# Element sizes of the dtypes traces name (NCCL args 'dtype', op 'Input type' without the 'c10::' prefix), lower
# case: whole-byte entries of the one table (tracekit.model.units).
DTYPE_BYTES = {k: v // 8 for k, v in DTYPE_BITS.items() if v % 8 == 0}
# (regex over the kernel name or the NCCL collective name, kind); the first match wins.
_KIND_PATTERNS = (
    (r"(?i)reduce_?scatter|ReduceScatter|rsag", "reduce_scatter"),
    (r"(?i)all_?gather", "all_gather"),
    (r"(?i)all_?to_?all|alltoall", "all_to_all"),
    (r"(?i)send_?recv|\bsend\b|\brecv\b", "send_recv"),
    (r"(?i)broadcast", "broadcast"),
    (r"(?i)all_?reduce|cross_device_reduce|rmsNormLamport", "all_reduce"),
    (r"(?i)nccl\w*_reduce_|^reduce$", "reduce"),
    (r"(?i)deep_ep|dpsk::ep", "all_to_all"),
)
# Implementations (kernel rule 'sub') that are all-reduces whatever their kernel is called.
_ALL_REDUCE_SUBS = ("custom_ar", "fused_ar_norm", "symm_mem", "mscclpp", "pcie_ipc_ar", "quick_ar", "nccl_symm")
KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce", "send_recv", "other")

# CommSummary.kernels columns
# (text as Categorical: a few distinct kernel names repeated per call; what a worker ships stays ~100 KB a rank)
SUMMARY_SCHEMA = {
    "start": pl.Int64, "end": pl.Int64, "arrival": pl.Int64, "stream": pl.Int64, "name": pl.Categorical,
    "impl": pl.Categorical, "kind": pl.Categorical, "step": pl.Int64, "group": pl.Categorical,
    "group_size": pl.Int32, "bytes": pl.Int64,
}


def kind_of(text: pl.Expr, sub: pl.Expr | None = None) -> pl.Expr:
    """The collective kind of a kernel (or NCCL collective) name; ``sub`` = the kernel rule's sub."""
    expr = pl.lit("other")
    for pattern, kind in reversed(_KIND_PATTERNS):
        expr = pl.when(text.str.contains(pattern)).then(pl.lit(kind)).otherwise(expr)
    if sub is not None:
        expr = pl.when((expr == "other") & sub.is_in(list(_ALL_REDUCE_SUBS))).then(pl.lit("all_reduce")).otherwise(expr)
    return expr


def bus_factor(kind: str, n: int | None) -> float | None:
    """NCCL's bus-bandwidth factor (busbw = algbw x factor)."""
    if not n or n < 1:
        return None
    if kind == "all_reduce":
        return 2 * (n - 1) / n
    if kind in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0


def latency_steps(kind: str, n: int) -> int:
    """Ring steps of a collective over n ranks (NCCL tuning model)."""
    if kind == "all_reduce":
        return 2 * (n - 1)
    if kind == "send_recv":
        return 1
    return max(1, n - 1)


def link_of(gpu_name: str | None) -> tuple[str | None, float | None]:
    """(link name, per-direction GB/s) of a GPU from the GPU table."""
    from tracekit.gpus import lookup

    spec = lookup(gpu_name) if gpu_name else None
    if spec is None or not spec.link_bw_gbps:
        return None, None
    return spec.link, float(spec.link_bw_gbps)


def latency_us(kind: str, n: int | None, link: str | None) -> float | None:
    """The latency term of a collective (us): ring steps x per-step latency of the link."""
    if not n or n < 2 or not link:
        return None
    hop = HOP_LATENCY_US["nvlink"] if "nvlink" in link.lower() else HOP_LATENCY_US["pcie"]
    return latency_steps(kind, n) * hop


def is_latency_bound(kind: str, n: int | None, nbytes: float | None, call_us: float | None, link: str | None,
                     link_gbps: float | None) -> tuple[bool, str | None]:
    """(latency-bound?, basis) — basis 'bytes' (size known), 'time' (from the call's duration) or None (unknown)."""
    lat = latency_us(kind, n, link)
    if lat is None or not link_gbps:
        return False, None
    if nbytes:
        return bool(nbytes * (bus_factor(kind, n) or 1.0) / (link_gbps * 1e3) <= lat), "bytes"
    if call_us is not None:
        return (True, "time") if call_us <= 2 * lat else (False, None)
    return False, None


@dataclass
class CommSummary:
    """One rank's communication, small enough to ship from a worker (a few rows per collective call).

    ``kernels``: one row per communication kernel of the analysed device over the whole trace (columns
    :data:`SUMMARY_SCHEMA`): unclipped ``start``/``end`` (ns), ``arrival`` = the start serialised behind the
    previous activity on its stream, ``step`` = the analysed step it belongs to (null outside them),
    ``group`` = the process group where recorded, ``bytes`` = message bytes where known.
    """

    path: str
    rank: int | None
    device: int
    gpu_name: str | None
    steps: int
    step_ms: float
    exposed_ms: float | None  # per_step_ms.communication
    kernel_ms: float | None  # kernel_ms_per_step.communication
    hidden_ms: float  # hidden_communication
    serial_ms: float  # communication kernel time per step, serialised on its stream
    tp: int | None
    tp_evidence: str
    link: str | None = None
    link_gbps: float | None = None
    kernels: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=SUMMARY_SCHEMA))
    warnings: list[str] = field(default_factory=list)


def _serialised(frame: pl.DataFrame) -> pl.DataFrame:
    """``frame`` (start, end, stream, ...) in start order, with ``arrival`` = the later of its start and the latest end
    of the activities before it on its stream (a running maximum per stream: no sort when already in start order)."""
    if not frame["start"].is_sorted():
        frame = frame.sort("start", maintain_order=True)
    prev = pl.col("end").cum_max().shift(1).over("stream")
    return frame.with_columns(arrival=pl.max_horizontal("start", prev.fill_null(pl.col("start"))))


def _is_comm(names: pl.Series, rules=None) -> tuple[pl.Series, pl.Series]:
    """(is communication, rule sub) per name, by the kernel rules (distinct names matched once)."""
    from tracekit.classify import load_rules, name_table

    pos, table = name_table(names, load_rules(rules) if rules is not None else None)
    return (table["category"].gather(pos).fill_null("other") == "communication"), table["sub"].gather(pos)


def hidden_communication(acts: pl.DataFrame | None) -> float:
    """Communication kernel time per step overlapped by compute on OTHER streams (ms).

    ``acts``: a Breakdown's ``activities`` (start, end, stream, kind, category, step). Same-stream overlap
    (programmatic dependent launch) is removed first by serialising each stream.
    """
    from tracekit.intervals import union_length

    if acts is None or acts.height == 0:
        return 0.0
    n = acts["step"].drop_nulls().n_unique() or 1
    comm_rows = (pl.col("category") == "communication") & (pl.col("kind") == "kernel")
    if not acts.select(comm_rows.any()).item():
        return 0.0
    a = _serialised(acts.select("start", "end", "stream", "kind", "category"))
    a = a.with_columns(start=pl.col("arrival")).filter(pl.col("end") > pl.col("start"))
    comm = a.filter(comm_rows)
    compute = a.filter(pl.col("category").is_in(["gemm", "attention", "other", "drafting"]))
    hidden = 0
    for s in comm["stream"].unique().to_list():  # a handful of communication streams, not events
        c = comm.filter(pl.col("stream") == s).select("start", "end", g=pl.lit(0))
        k = compute.filter(pl.col("stream") != s).select("start", "end", g=pl.lit(0))
        if k.height == 0:
            continue
        length = lambda f: (union_length(f, ["g"]).collect()["union_ns"].sum() or 0)  # noqa: E731
        hidden += length(c) + length(k) - length(pl.concat([c, k]))
    return hidden / 1e6 / n


def tp_from_trace(trace: Trace) -> tuple[int | None, str]:
    """The tensor-parallel group size = the size of the communicator the trace's all-reduces use (never the
    job's world size), with the evidence for it. ``(None, why)`` when the trace does not record it."""
    coll = trace.collectives.filter(pl.col("group_size").is_not_null() & (pl.col("group_size") > 0))
    if coll.height:
        coll = coll.with_columns(kind=kind_of(pl.col("collective")))
        ar = coll.filter(pl.col("kind") == "all_reduce")
        if ar.height:
            top = ar.group_by("group_size", "pg_name").len().sort("len", "group_size", descending=[True, False])
            n, pg, cnt = int(top["group_size"][0]), top["pg_name"][0], int(top["len"][0])
            where = f" (process group {pg!r})" if pg is not None else ""
            return n, f"Kineto NCCL args: {cnt} all-reduce kernel(s) on a communicator of {n} ranks{where}"
    names = trace.kernels["name"].unique()
    if names.len():
        is_comm, sub = _is_comm(names)
        kinds = pl.DataFrame({"name": names.cast(pl.String), "sub": sub}).filter(is_comm).with_columns(
            kind=kind_of(pl.col("name"), pl.col("sub")))
        custom_ar = kinds.filter((pl.col("kind") == "all_reduce") & (pl.col("sub") != "nccl"))
        if custom_ar.height and coll.height:
            sizes = coll.filter(pl.col("group_size") > 1)["group_size"].unique()
            if sizes.len() == 1:
                n = int(sizes[0])
                other = coll.filter(pl.col("group_size") == n)
                pg = other["pg_name"].drop_nulls()
                where = f" (process group {pg[0]!r})" if pg.len() else ""
                return n, (f"inferred: the trace's all-reduces ({custom_ar['sub'][0]} kernels) record no communicator; "
                           f"its NCCL {other['collective'][0]} kernels use one of {n} ranks{where}, the "
                           "tensor-parallel group in vLLM and SGLang")
        if kinds.filter(pl.col("kind") == "all_reduce").height:
            what = "its all-reduce kernels record no communicator size"
            if trace.meta.format == "nsys-sqlite":
                what += " (nsys: NCCL NVTX payloads with the communicator's rank count are not in this export)"
            return None, what
    return None, "no all-reduce in the trace"


def _step_of(comm: pl.DataFrame, acts: pl.DataFrame | None) -> pl.DataFrame:
    """``comm`` with ``step``: the analysed step of each kernel (from the breakdown's activities)."""
    if acts is None or acts.height == 0:
        return comm.with_columns(step=pl.lit(None, pl.Int64))
    # (``start0``: the recorded start; the partition's ``start`` is serialised and clipped)
    start = "start0" if "start0" in acts.columns else "start"
    # (only the activities of these kernels' correlations: a unique() over every activity of ten million
    # kernels cost more than the rest of the communication table)
    mine = pl.col("correlation").is_in(comm["correlation"].unique().implode())
    a = acts.filter((pl.col("kind") == "kernel") & mine).select("pid", "correlation", start=start, step="step").unique(
        ["pid", "correlation", "start"], keep="first")
    return comm.join(a, on=["pid", "correlation", "start"], how="left")


def _op_bytes(comm: pl.DataFrame, trace: Trace) -> pl.DataFrame:
    """``comm`` with ``op_bytes``: the size of the all-reduce op that launched each (eager) kernel."""
    ops = trace.ops.filter(pl.col("name").is_in(list(COMM_OPS)) & pl.col("input_dims").is_not_null())
    none = comm.with_columns(op_bytes=pl.lit(None, pl.Int64))
    if ops.height == 0 or trace.launches.height == 0:
        return none
    launches = trace.launches.filter(pl.col("kind") == "kernel").select(
        "pid", "correlation", l_tid="tid", l_start="start")
    c = comm.join(launches.unique(["pid", "correlation"], keep="first"), on=["pid", "correlation"], how="left")
    o = ops.select("pid", l_tid="tid", o_start="start", o_end="end", dims="input_dims", types="input_types")
    o = o.with_columns(
        dims=pl.col("dims").str.json_decode(pl.List(pl.List(pl.Int64))),
        types=pl.col("types").fill_null("[]").str.json_decode(pl.List(pl.String)))
    # the largest tensor argument (first of equals): its elements x its dtype size
    o = o.with_columns(i=pl.col("dims").list.eval(pl.element().list.len()).list.arg_max())
    o = o.with_columns(
        nel=pl.col("dims").list.get(pl.col("i"), null_on_oob=True).list.eval(pl.element().product()).list.first(),
        dsize=pl.col("types").list.get(pl.col("i"), null_on_oob=True).str.to_lowercase()
        .str.replace(r"^c10::", "").replace_strict(DTYPE_BYTES, default=None, return_dtype=pl.Int64))
    o = o.select("pid", "l_tid", "o_start", "o_end", op_bytes=pl.col("nel") * pl.col("dsize")).sort("o_start")
    have = c.filter(pl.col("l_start").is_not_null()).sort("l_start")
    j = have.join_asof(o, left_on="l_start", right_on="o_start", by=["pid", "l_tid"], strategy="backward",
                       check_sortedness=False)
    j = j.with_columns(op_bytes=pl.when(pl.col("l_start") <= pl.col("o_end")).then(pl.col("op_bytes")))
    j = j.select(*comm.columns, "op_bytes")
    rest = c.filter(pl.col("l_start").is_null()).select(*comm.columns).with_columns(op_bytes=pl.lit(None, pl.Int64))
    return pl.concat([j, rest]).sort("start")


def _on_device(df: pl.DataFrame, dev: int) -> pl.DataFrame:
    d = df["device"]
    if d.null_count() == 0 and d.len() and d.min() == d.max() == dev:
        return df  # (a filter that keeps every row would still copy every column)
    return df.filter(pl.col("device") == dev)


def _comm_kernels(trace: Trace, dev: int, rules=None) -> pl.DataFrame:
    """The communication kernels of ``dev`` (start order), with ``arrival`` (serialised on their stream) and
    ``impl``. Only narrow columns of the streams that carry communication are touched: ten million kernels cost
    one merge and one running maximum, not a copy of the kernel table."""
    k = _on_device(trace.kernels, dev)
    is_comm, _ = _is_comm(k["name"], rules)
    if not is_comm.any():
        return pl.DataFrame(schema={"start": pl.Int64, "end": pl.Int64, "stream": pl.Int64, "pid": pl.Int64,
                                    "correlation": pl.Int64, "name": pl.String, "impl": pl.String,
                                    "arrival": pl.Int64})
    rows = pl.int_range(0, k.height, dtype=pl.UInt32, eager=True).filter(is_comm)
    streams = k["stream"].gather(rows).unique().implode()
    on_k = k.select("start", "end", "stream", comm=is_comm, row=pl.int_range(0, pl.len(), dtype=pl.UInt32))
    on_k = on_k.filter(pl.col("stream").is_in(streams))
    m = _on_device(trace.memops, dev).select("start", "end", "stream", comm=pl.lit(False),
                                             row=pl.lit(None, pl.UInt32))
    m = m.filter(pl.col("stream").is_in(streams))
    if not on_k["start"].is_sorted():
        on_k = on_k.sort("start")
    on = on_k.merge_sorted(m.sort("start"), key="start") if m.height else on_k
    # in start order, so a running maximum over each stream's rows is the end of everything before on that stream
    prev = pl.col("end").cum_max().shift(1).over("stream")
    arrival = on.select("row", "comm", arrival=pl.max_horizontal("start", prev.fill_null(pl.col("start")))).filter(
        "comm")
    comm = k[arrival["row"]].select("start", "end", "stream", "pid", "correlation",
                                    name=pl.col("name").cast(pl.String)).with_columns(arrival=arrival["arrival"])
    _, sub = _is_comm(comm["name"], rules)
    return comm.with_columns(impl=sub).sort("start")


def comm_kernels(trace: Trace | None, acts: pl.DataFrame | None, device: int, *, tp: int | None = None,
                 rules=None) -> tuple[pl.DataFrame, list[str]]:
    """The communication kernels of ``device`` (:data:`SUMMARY_SCHEMA`: arrival, kind, implementation, the
    analysed step each belongs to, communicator, message bytes), and warnings. From the ``trace`` (every such
    kernel, sizes and communicators) or, without it, from a breakdown's ``acts`` (the analysed steps only)."""
    warnings: list[str] = []
    if trace is not None:
        comm = _comm_kernels(trace, device, rules)
        comm = _step_of(comm, acts)
        coll = trace.collectives.with_columns(
            dsize=pl.col("dtype").str.to_lowercase().replace_strict(DTYPE_BYTES, default=None, return_dtype=pl.Int64))
        comm = comm.join(coll.select("pid", "correlation", "start", "collective", "group_size", "pg_name",
                                     nccl_bytes=pl.max_horizontal("in_nelems", "out_nelems") * pl.col("dsize")),
                         on=["pid", "correlation", "start"], how="left")
        comm = _op_bytes(comm, trace)
    elif acts is not None:
        # a breakdown's activities are those of the analysed steps only, their ends clipped to the step period
        is_comm, _ = _is_comm(acts["name"], rules)
        narrow = acts.select("start", "end", "stream", comm=is_comm & (pl.col("kind") == "kernel"),
                             row=pl.int_range(0, pl.len(), dtype=pl.UInt32))
        arr = _serialised(narrow).filter("comm")
        comm = acts[arr["row"]].select("start", "end", "stream", "pid", "correlation", "step",
                                       name=pl.col("name").cast(pl.String)).with_columns(arrival=arr["arrival"])
        _, sub = _is_comm(comm["name"], rules)
        comm = comm.with_columns(impl=sub, collective=pl.lit(None, pl.String), group_size=pl.lit(None, pl.Int32),
                                 pg_name=pl.lit(None, pl.String), nccl_bytes=pl.lit(None, pl.Int64),
                                 op_bytes=pl.lit(None, pl.Int64)).sort("start")
        warnings.append("no trace given: collective sizes and communicators unknown")
    else:
        text = {k: (pl.String if v == pl.Categorical else v) for k, v in SUMMARY_SCHEMA.items()}
        comm = pl.DataFrame(schema={**text, "collective": pl.String, "pg_name": pl.String,
                                    "nccl_bytes": pl.Int64, "op_bytes": pl.Int64, "pid": pl.Int64,
                                    "correlation": pl.Int64})
    kind = kind_of(pl.coalesce(pl.col("collective"), pl.col("name")), pl.col("impl"))
    # kernels without NCCL args (graph replays) take the communicator size their name has where recorded, if one
    by_name = comm.filter(pl.col("group_size").is_not_null()).group_by("name").agg(
        named_size=pl.col("group_size").first(), sizes=pl.col("group_size").n_unique())
    comm = comm.join(by_name.filter(pl.col("sizes") == 1).drop("sizes"), on="name", how="left").with_columns(
        group_size=pl.coalesce("group_size", "named_size"))
    kernels = comm.with_columns(kind=kind).select(
        "start", "end", "arrival", "stream", "name", "impl", "kind", pl.col("step").cast(pl.Int64),
        group=pl.col("pg_name"),
        group_size=pl.col("group_size").cast(pl.Int32).fill_null(
            pl.when(pl.col("kind") == "all_reduce").then(pl.lit(tp, pl.Int32))),
        bytes=pl.coalesce("nccl_bytes", "op_bytes").cast(pl.Int64)).sort("start").cast(SUMMARY_SCHEMA)
    return kernels, warnings


def step_collectives(trace: Trace, acts: pl.DataFrame | None, *, device: int, n_steps: int,
                     gpu_name: str | None, rules=None) -> tuple[list[dict], int | None, str]:
    """One rank's collectives table (:func:`collective_table`) straight from a trace and its analysed
    activities, before a Breakdown exists (what ``advice.communication`` quotes); with the communicator size
    of the trace's all-reduces and its evidence (:func:`tp_from_trace`)."""
    tp, tp_ev = tp_from_trace(trace)
    kernels, _ = comm_kernels(trace, acts, device, tp=tp, rules=rules)
    link, link_gbps = link_of(gpu_name)
    return _table(kernels, n_steps, link, link_gbps), tp, tp_ev


def comm_summary(b, trace: Trace | None = None, *, rules=None) -> CommSummary:
    """The communication of one analysed rank (a :class:`~tracekit.analyses.breakdown.Breakdown`), with sizes and
    communicators when its ``trace`` is given (the Breakdown alone carries only the analysed steps' kernels)."""
    acts = b.activities
    dev = b.gpu["device"]
    n_steps = max(1, b.steps["count"])
    tp, tp_ev = tp_from_trace(trace) if trace is not None else (None, "no trace given")
    kernels, warnings = comm_kernels(trace, acts, dev, tp=tp, rules=rules)
    in_steps = kernels.filter(pl.col("step").is_not_null())
    serial = float((in_steps["end"] - in_steps["arrival"]).clip(0).sum() or 0) / 1e6 / n_steps
    link, link_gbps = link_of(b.gpu.get("name"))
    return CommSummary(
        path=b.source["path"], rank=b.rank, device=dev, gpu_name=b.gpu.get("name"),
        steps=b.steps["count"], step_ms=b.steps["mean_ms"], exposed_ms=b.per_step_ms.get("communication"),
        kernel_ms=b.kernel_ms_per_step.get("communication"), hidden_ms=hidden_communication(acts),
        serial_ms=serial, tp=tp, tp_evidence=tp_ev, link=link, link_gbps=link_gbps, kernels=kernels,
        warnings=warnings)


def _rows(calls: pl.DataFrame, n_steps: int, time_col: str) -> pl.DataFrame:
    """Per (kind, implementation): counts, sizes and times of ``calls`` (one row per call; ``time_col`` = the
    time the bandwidth is computed from, ns)."""
    return (calls.group_by("kind", "impl").agg(
        count=pl.len(),
        total_ns=(pl.col("end") - pl.col("start")).sum(),
        time_ns=pl.col(time_col).sum(),
        call_ns=pl.col(time_col).median(),
        bytes=pl.col("bytes").median(),
        bytes_sum=pl.col("bytes").filter(pl.col("bytes").is_not_null()).sum(),
        time_sized_ns=pl.col(time_col).filter(pl.col("bytes").is_not_null()).sum(),
        group_size=pl.col("group_size").drop_nulls().mode().first(),
        kernel=pl.col("name").mode().first(),
    ).with_columns(count_per_step=pl.col("count") / n_steps).sort("total_ns", "kind", descending=[True, False]))


def row_dicts(rows: pl.DataFrame, n_steps: int, link: str | None, link_gbps: float | None) -> list[dict]:
    """The contract's ``collectives`` entries (plus extension keys) from :func:`_rows`."""
    out = []
    for r in rows.iter_rows(named=True):
        n = r["group_size"]
        nbytes = int(r["bytes"]) if r["bytes"] is not None else None
        algbw = (r["bytes_sum"] / r["time_sized_ns"]) if r["bytes_sum"] and r["time_sized_ns"] else None  # B/ns = GB/s
        factor = bus_factor(r["kind"], n)
        call_us = r["call_ns"] / 1e3 if r["call_ns"] is not None else None
        lb, basis = is_latency_bound(r["kind"], n, nbytes, call_us, link, link_gbps)
        out.append({
            "kind": r["kind"], "count_per_step": r["count_per_step"], "bytes": nbytes,
            "ms_per_step": r["total_ns"] / 1e6 / n_steps,
            "algbw_gbps": algbw, "busbw_gbps": algbw * factor if algbw is not None and factor is not None else None,
            "link_gbps": link_gbps, "latency_bound": lb,
            # extensions
            "implementation": r["impl"], "kernel": r["kernel"], "group_size": n, "count": int(r["count"]),
            "total_ms": r["total_ns"] / 1e6, "call_us": call_us, "latency_us": latency_us(r["kind"], n, link),
            "latency_bound_basis": basis, "link": link,
        })
    return out


def collective_table(s: CommSummary) -> list[dict]:
    """One rank's collectives in its analysed steps, per (kind, implementation), largest time first.

    Times are the kernels' own durations (as ``tracekit kernels`` sums them): on one rank they include
    waiting for the other ranks, so bandwidths here are lower bounds; the cross-rank table
    (:func:`tracekit.analyses.ranks.cross_rank`) computes them from the transfer alone.
    """
    return _table(s.kernels, max(1, s.steps), s.link, s.link_gbps)


def _table(kernels: pl.DataFrame, n_steps: int, link: str | None, link_gbps: float | None) -> list[dict]:
    calls = kernels.filter(pl.col("step").is_not_null()).with_columns(
        pl.col("name", "impl", "kind", "group").cast(pl.String), dur=pl.col("end") - pl.col("start"))
    if calls.height == 0:
        return []
    return row_dicts(_rows(calls, n_steps, "dur"), n_steps, link, link_gbps)


def collectives_verdict(rows: list[dict], *, across_ranks: bool = False) -> str | None:
    """One sentence on the largest collective: bandwidth against the link, or latency-bound. ``rows`` from
    :func:`collective_table` (one rank: its kernel times include waiting, so the bandwidth is a lower bound) or
    from the cross-rank table (``across_ranks``: bandwidth from the transfer)."""
    if not rows:
        return None
    r = rows[0]
    what = f"{r['kind'].replace('_', '-')} ({r['implementation']})"
    size = f" of {_bytes(r['bytes'])}" if r["bytes"] else ""
    if r["latency_bound"]:
        fix = ("it is already a one-shot/custom kernel: fewer (fused) calls or overlapping them with compute help"
               if r["implementation"] != "nccl" else "a one-shot / custom all-reduce or fewer, fused calls help")
        if r["latency_bound_basis"] == "bytes":
            move_us = r["bytes"] * (bus_factor(r["kind"], r["group_size"]) or 1.0) / (r["link_gbps"] * 1e3)
            why = (f"the link moves its bytes in {move_us:.2f} µs against ≈{r['latency_us']:.1f} µs of latency "
                   "per call")
        else:
            why = (f"each call takes {r['call_us']:.1f} µs, within twice the ≈{r['latency_us']:.1f} µs latency of a "
                   f"{r['group_size']}-rank ring")
        return (f"the {what}{size} is latency-bound ({why}; {r['count_per_step']:.0f} calls per step): {fix}; "
                "bus bandwidth is not the measure here")
    if r["busbw_gbps"] is not None and r["link_gbps"]:
        return (f"the {what}{size} reaches {r['busbw_gbps']:,.1f} GB/s bus bandwidth against "
                f"{r['link_gbps']:,.0f} GB/s per direction over {r['link']} "
                f"({100 * r['busbw_gbps'] / r['link_gbps']:.0f}% of the link"
                + ("" if across_ranks else "; its kernel time includes waiting for the other ranks: a lower bound")
                + ")")
    return None


def _bytes(n: int | None) -> str:
    if n is None:
        return "?"
    for unit, k in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= k:
            return f"{n / k:.1f} {unit}"
    return f"{n} B"


__all__ = ["CommSummary", "comm_summary", "comm_kernels", "step_collectives", "collective_table", "collectives_verdict", "hidden_communication",
           "tp_from_trace", "bus_factor", "is_latency_bound", "HOP_LATENCY_US", "DTYPE_BYTES"]
