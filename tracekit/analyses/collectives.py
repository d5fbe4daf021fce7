"""Collectives: what each communication kernel is, how big, how fast, and how much of it compute hides.

One rank's communication is summarised in a :class:`CommSummary` (small and picklable: what a Dask worker
sends back instead of the whole breakdown); :mod:`tracekit.run.ranks` matches the summaries of several
ranks. Definitions (../shared/spec/CONTRACT.md):

* **kind** of a collective: the NCCL args' ``Collective name`` where recorded, else the kernel name
  (``all_reduce``, ``all_gather``, ``reduce_scatter``, ``all_to_all``, ``broadcast``, ``reduce``,
  ``send_recv``); custom, fused all-reduce+norm, symmetric-memory and one/two-shot kernels are all-reduces;
  NCCL ``SendRecv`` kernels are send-recvs; a kernel whose name does not say (``ncclDevKernel_Generic``) takes
  the kind of the ``nccl:<collective>`` annotation or ``c10d::`` op it was launched in. ``by_kind`` and the
  verdicts use NCCL's names (:data:`NCCL_KIND`: all-reduce, all-gather, ...).
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
  *transfer* is at most twice the latency term is latency-bound too (its bandwidth term cannot exceed the
  latency). One rule for one rank and a rank set (:func:`is_latency_bound`): the call's transfer is its duration
  on the last-arriving rank across ranks, and from one rank's file its estimate (:func:`split_one_rank`: the
  recurring instances' fastest), never a duration that includes waiting for the other ranks. There a one-shot /
  custom all-reduce or fewer, fused calls help; a bandwidth verdict is wrong.
* **hidden communication** (``advice.communication.hidden_communication_ms``): communication kernel time
  overlapped by compute (gemm, attention, other, drafting) on *other* streams. Activities of one stream are
  serialised first (each starts at the later of its own start and the end of the activities before it on
  that stream), so programmatic-dependent-launch overlap on one stream hides nothing. Per kernel
  (:func:`kernel_exposure`): ``exposed`` + ``hidden`` = its serialised time.
* **transfer and wait** (:class:`CommSplit`): a collective kernel runs from the rank's arrival until the last
  rank's data is in; the transfer is its duration when this rank arrives last, the rest is waiting for the
  other ranks. From one file, :func:`split_one_rank` (each recurring collective's fastest instances); across
  rank files, :mod:`tracekit.run.ranks`. ``advice.communication.max_saving_ms`` = the exposed transfer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl

from tracekit.analyses.phase import name_matches
from tracekit.analyses.resolve import STATED_TP_SOURCES
from tracekit.categories import COMPUTE_CATEGORIES
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
    (r"(?i)send_?recv|(^|[^a-z])i?(send|recv)([^a-z]|$)", "send_recv"),
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
    "group_size": pl.Int32, "bytes": pl.Int64, "exposed": pl.Int64, "hidden": pl.Int64,
    "transfer": pl.Int64,
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


def _is_comm(names: pl.Series | pl.DataFrame, rules=None, sub: bool = True) -> tuple[pl.Series, pl.Series | None]:
    """(is communication, rule sub) per name, by the kernel rules (distinct names matched once); ``sub=False``:
    no sub (None). The test is made once per distinct name and its booleans gathered: no string per row.
    ``names`` may be a frame with a ``name`` column (a trace's kernels): its name table is then the one the
    attribution made (``classify.frame_name_table``)."""
    from tracekit.classify import frame_name_table, load_rules, name_table

    loaded = load_rules(rules) if rules is not None else None
    pos, table = frame_name_table(names, loaded) if isinstance(names, pl.DataFrame) else name_table(names, loaded)
    hit = table["category"] == "communication"
    # (no communication kernel at all, the usual single-GPU trace: no gather of ten million booleans)
    is_comm = (hit.gather(pos).fill_null(False) if hit.any() else pl.repeat(False, pos.len(), dtype=pl.Boolean,
                                                                             eager=True)).alias("category")
    return is_comm, table["sub"].gather(pos) if sub else None


def kernel_exposure(acts: pl.DataFrame | None) -> pl.DataFrame:
    """Per communication kernel of a breakdown's ``activities`` (serialised on their stream, clipped to their
    step): ``exposed`` = its time not overlapped by compute (gemm, attention, other, drafting) on OTHER streams,
    ``hidden`` = the rest. Keys ``pid``, ``correlation``, ``start0`` (the recorded start) and ``step``.

    One pass per stream that carries communication (a handful): the compute of the other streams is merged into
    disjoint segments once, and each kernel's overlap with them is read off their cumulative length (two as-of
    joins), so ten million compute activities cost one sort, not a loop."""
    from tracekit.intervals import merge

    schema = {"pid": pl.Int64, "correlation": pl.Int64, "start0": pl.Int64, "step": pl.Int64, "exposed": pl.Int64,
              "hidden": pl.Int64}
    if acts is None or acts.height == 0:
        return pl.DataFrame(schema=schema)
    comm_rows = (pl.col("category") == "communication") & (pl.col("kind") == "kernel")
    start0 = "start0" if "start0" in acts.columns else "start"
    comm = acts.filter(comm_rows).select("pid", "correlation", "stream", "start", "end", pl.col("step").cast(pl.Int64),
                                         start0=start0)
    if comm.height == 0:
        return pl.DataFrame(schema=schema)
    comm = comm.with_columns(end=pl.max_horizontal("start", "end"))
    streams = comm["stream"].unique().to_list()
    compute = acts.select("start", "end", "stream", "category").filter(  # (narrow first: most rows are compute)
        pl.col("category").is_in([c for c in COMPUTE_CATEGORIES if c != "communication"])
        & (pl.col("end") > pl.col("start"))).drop("category")
    parts = []
    for s in streams:  # a handful of communication streams, not events
        c = comm.filter(pl.col("stream") == s).with_row_index("_i")
        k = compute.filter(pl.col("stream") != s)
        if k.height == 0:
            parts.append(c.with_columns(hidden=pl.lit(0, pl.Int64)))
            continue
        seg = merge(k.with_columns(g=pl.lit(0)), ["g"]).collect().select(s_start="start", s_end="end")
        length = pl.col("s_end") - pl.col("s_start")
        seg = seg.with_columns(before=length.cum_sum() - length)

        c = c.join(_covered(c, seg, "start"), on="_i").join(_covered(c, seg, "end"), on="_i")
        parts.append(c.with_columns(hidden=(pl.col("F_end") - pl.col("F_start")).cast(pl.Int64)))
    out = pl.concat([p.select("pid", "correlation", "start0", "step", "start", "end", "hidden") for p in parts])
    return out.select("pid", "correlation", "start0", "step", "hidden",
                      exposed=pl.col("end") - pl.col("start") - pl.col("hidden")).cast(schema)


def _covered(c: pl.DataFrame, seg: pl.DataFrame, col: str) -> pl.DataFrame:
    """``_i`` and ``F_<col>``: the length of the disjoint segments ``seg`` (s_start, s_end, before = their length
    before each) that lies before each row's ``col``."""
    j = c.select("_i", col).sort(col).join_asof(seg, left_on=col, right_on="s_start", strategy="backward")
    f = pl.col("before") + (pl.col(col) - pl.col("s_start")).clip(0, pl.col("s_end") - pl.col("s_start"))
    return j.select("_i", **{f"F_{col}": f.fill_null(0)})


def hidden_communication(acts: pl.DataFrame | None) -> float:
    """Communication kernel time per step overlapped by compute on OTHER streams (ms).

    ``acts``: a Breakdown's ``activities`` (start, end, stream, kind, category, step), serialised per stream
    (programmatic-dependent-launch overlap on one stream hides nothing); the sum over
    :func:`kernel_exposure`'s kernels.
    """
    if acts is None or acts.height == 0:
        return 0.0
    n = acts["step"].drop_nulls().n_unique() or 1
    return float(kernel_exposure(acts)["hidden"].sum() or 0) / 1e6 / n


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
    from tracekit.classify import frame_name_table

    # (the kernels' distinct names as the attribution classified them, once per trace: no unique() of ten million)
    _, table = frame_name_table(trace.kernels)
    if table.height:
        kinds = table.filter(pl.col("category") == "communication").select("name", "sub").with_columns(
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
    """``comm`` with ``step`` (the analysed step of each kernel, from the breakdown's activities) and ``exposed``
    (its time no compute on another stream overlaps, :func:`kernel_exposure`; null outside the analysed steps)."""
    if acts is None or acts.height == 0:
        return comm.with_columns(step=pl.lit(None, pl.Int64), exposed=pl.lit(None, pl.Int64),
                                 hidden=pl.lit(None, pl.Int64))
    # (``start0``: the recorded start; the partition's ``start`` is serialised and clipped)
    start = "start0" if "start0" in acts.columns else "start"
    # (only the activities of these kernels' correlations: a unique() over every activity of ten million
    # kernels cost more than the rest of the communication table)
    mine = pl.col("correlation").is_in(comm["correlation"].unique().implode())
    a = acts.filter((pl.col("kind") == "kernel") & mine).select("pid", "correlation", start=start, step="step").unique(
        ["pid", "correlation", "start"], keep="first")
    e = kernel_exposure(acts).select("pid", "correlation", "exposed", "hidden", start="start0").unique(
        ["pid", "correlation", "start"], keep="first")
    return comm.join(a, on=["pid", "correlation", "start"], how="left").join(
        e, on=["pid", "correlation", "start"], how="left")


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
        dims=pl.col("dims").cast(pl.String).str.json_decode(pl.List(pl.List(pl.Int64))),
        types=pl.col("types").cast(pl.String).fill_null("[]").str.json_decode(pl.List(pl.String)))
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


def _launch_name(comm: pl.DataFrame, trace: Trace) -> pl.DataFrame:
    """``comm`` with ``launched_in``: the innermost ``nccl:<collective>`` annotation (Kineto record_function,
    NVTX) or ``c10d::<collective>`` op open on the launching thread when each kernel was launched, where the
    kernel's own name does not say which collective it is (``ncclDevKernel_Generic``)."""
    none = comm.with_columns(launched_in=pl.lit(None, pl.String))
    unknown = kind_of(pl.col("name"), pl.col("impl")) == "other"
    if comm.height == 0 or trace.launches.height == 0 or not comm.select(
            (unknown & pl.col("collective").is_null()).any()).item():
        return none
    names = [f.filter(name_matches(f["name"], r"^(?:nccl:|c10d::)")).select(
                 "pid", "tid", "start", "end", pl.col("name").cast(pl.String))
             for f in (trace.ranges, trace.ops) if f.height]
    names = [f for f in names if f.height]
    if not names:
        return none
    ann = pl.concat(names).select("pid", l_tid="tid", a_start="start", a_end="end",
                                  launched_in=pl.col("name").str.replace(r"^(?:nccl:|c10d::)_?", "")
                                  .str.replace(r",.*$", "")).sort("a_start")
    launches = trace.launches.filter(pl.col("kind") == "kernel").select(
        "pid", "correlation", l_tid="tid", l_start="start").unique(["pid", "correlation"], keep="first")
    c = comm.with_row_index("_i").join(launches, on=["pid", "correlation"], how="left")
    have = c.filter(pl.col("l_start").is_not_null()).sort("l_start").join_asof(
        ann, left_on="l_start", right_on="a_start", by=["pid", "l_tid"], strategy="backward", check_sortedness=False)
    have = have.select("_i", launched_in=pl.when(pl.col("l_start") <= pl.col("a_end")).then(pl.col("launched_in")))
    return c.join(have, on="_i", how="left").select(*comm.columns, "launched_in")


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
    is_comm, _ = _is_comm(k, rules, sub=False)
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
                 rules=None, found: pl.DataFrame | None = None) -> tuple[pl.DataFrame, list[str]]:
    """The communication kernels of ``device`` (:data:`SUMMARY_SCHEMA`: arrival, kind, implementation, the
    analysed step each belongs to, communicator, message bytes), and warnings. From the ``trace`` (every such
    kernel, sizes and communicators) or, without it, from a breakdown's ``acts`` (the analysed steps only).
    ``found``: ``_comm_kernels(trace, device, rules)`` made already (``Attribution.comm_kernels``)."""
    warnings: list[str] = []
    if trace is not None:
        comm = found if found is not None else _comm_kernels(trace, device, rules)
        comm = _step_of(comm, acts)
        coll = trace.collectives.with_columns(
            dsize=pl.col("dtype").str.to_lowercase().replace_strict(DTYPE_BYTES, default=None, return_dtype=pl.Int64))
        comm = comm.join(coll.select("pid", "correlation", "start", "collective", "group_size", "pg_name",
                                     nccl_bytes=pl.max_horizontal("in_nelems", "out_nelems") * pl.col("dsize")),
                         on=["pid", "correlation", "start"], how="left")
        comm = _op_bytes(comm, trace)
        comm = _launch_name(comm, trace)
    elif acts is not None:
        # a breakdown's activities are those of the analysed steps only, their ends clipped to the step period
        is_comm, _ = _is_comm(acts["name"], rules, sub=False)
        narrow = acts.select("start", "end", "stream", comm=is_comm & (pl.col("kind") == "kernel"),
                             row=pl.int_range(0, pl.len(), dtype=pl.UInt32))
        arr = _serialised(narrow).filter("comm")
        start0 = "start0" if "start0" in acts.columns else "start"
        comm = acts[arr["row"]].select("start", "end", "stream", "pid", "correlation", "step", start0=start0,
                                       name=pl.col("name").cast(pl.String)).with_columns(arrival=arr["arrival"])
        e = kernel_exposure(acts).select("pid", "correlation", "start0", "exposed", "hidden").unique(
            ["pid", "correlation", "start0"], keep="first")
        comm = comm.join(e, on=["pid", "correlation", "start0"], how="left")
        _, sub = _is_comm(comm["name"], rules)
        comm = comm.with_columns(impl=sub, collective=pl.lit(None, pl.String), group_size=pl.lit(None, pl.Int32),
                                 pg_name=pl.lit(None, pl.String), nccl_bytes=pl.lit(None, pl.Int64),
                                 op_bytes=pl.lit(None, pl.Int64), launched_in=pl.lit(None, pl.String)).sort("start")
        warnings.append("no trace given: collective sizes and communicators unknown")
    else:
        text = {k: (pl.String if v == pl.Categorical else v) for k, v in SUMMARY_SCHEMA.items()}
        comm = pl.DataFrame(schema={**text, "collective": pl.String, "pg_name": pl.String,
                                    "nccl_bytes": pl.Int64, "op_bytes": pl.Int64, "pid": pl.Int64,
                                    "correlation": pl.Int64, "launched_in": pl.String})
    kind = kind_of(pl.coalesce(pl.col("collective"), pl.col("name")), pl.col("impl"))
    # a kernel whose name does not say (ncclDevKernel_Generic, a catch-all NCCL name): the collective the
    # framework called, from the annotation it was launched in (``nccl:all_gather``, ``c10d::allreduce_``)
    kind = pl.when((kind == "other") & pl.col("launched_in").is_not_null()).then(
        kind_of(pl.col("launched_in"))).otherwise(kind)
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
        bytes=pl.coalesce("nccl_bytes", "op_bytes").cast(pl.Int64), exposed="exposed", hidden="hidden",
        transfer=pl.lit(None, pl.Int64)).sort("start").cast(SUMMARY_SCHEMA)
    return kernels, warnings


DEFAULT_RANKS = 4  # communicator size the fastest-instances quantile assumes where the trace does not record one
MIN_INSTANCES = 4  # a recurring collective: at least this many instances in the analysed steps
FLOOR_TOL = 0.02  # a place's two fastest instances within 2% of each other: a transfer floor, not waiting
FLOOR_ABOVE = 2.0  # ... kept as that place's own transfer when above twice its collective's fastest instances
SPLIT_SHARE = 0.5  # below this share of the communication time in recurring collectives: no split ("none")
NCCL_KIND = {"all_reduce": "all-reduce", "all_gather": "all-gather", "reduce_scatter": "reduce-scatter",
             "all_to_all": "all-to-all", "send_recv": "send-recv", "broadcast": "broadcast", "reduce": "reduce",
             "other": "other"}


@dataclass(frozen=True)
class CommSplit:
    """A rank's communication kernel time per step split into the data movement (``transfer_ms``) and waiting for
    the other ranks (``wait_ms``), with the exposed part of each (ms per step; the contract's
    ``advice.communication`` keys). ``basis``: ``"cross-rank"`` (the ranks' files matched,
    :mod:`tracekit.run.ranks`), ``"fastest-instances"`` (this file alone, :func:`split_one_rank`) or
    ``"none"`` (transfer and wait unknown: ``exposed_ms`` is the bound). ``kernels``: the communication
    kernels it was computed from (:data:`SUMMARY_SCHEMA`, ``transfer`` filled), not compared or shipped."""

    basis: str
    kernel_ms: float  # communication kernel time, each kernel from its arrival (serialised start) to its end
    transfer_ms: float | None
    wait_ms: float | None
    exposed_ms: float  # communication kernel time no compute on another stream overlaps
    exposed_transfer_ms: float | None  # the transfer's share of it: what faster collectives could save
    hidden_ms: float  # communication kernel time overlapped by compute on other streams
    by_kind: tuple = ()  # per collective kind, NCCL's names, largest kernel time first
    how: str = ""  # how transfer and wait were found, one clause for the verdict
    ranks: int | None = None  # ranks in the communicator (1: nothing to wait for), where known
    kernels: pl.DataFrame | None = field(default=None, compare=False, repr=False)

    def to_json(self) -> dict:
        """The contract keys of ``advice.communication`` this split fills."""
        return {"transfer_ms": self.transfer_ms, "wait_ms": self.wait_ms, "split_basis": self.basis,
                "by_kind": [dict(r) for r in self.by_kind]}

    def kinds_that_matter(self, share: float = 0.8, most: int = 3) -> list[str]:
        """The kinds (NCCL's names) that hold ``share`` of the exposed transfer (of the exposed time without a
        split), largest first: what the lever is named after."""
        key = "exposed_transfer_ms" if self.exposed_transfer_ms is not None else "exposed_ms"
        rows = sorted(self.by_kind, key=lambda r: -(r.get(key) or 0))
        total = sum(r.get(key) or 0 for r in rows)
        out: list[str] = []
        got = 0.0
        for r in rows:
            if len(out) >= most or (out and total and got >= share * total):
                break
            out.append(r["kind"])
            got += r.get(key) or 0
        return out


def split_one_rank(kernels: pl.DataFrame, n_steps: int, *, ranks: int | None = None,
                   one_rank: str | None = None) -> CommSplit:
    """Transfer and wait of one rank's collectives from its own file (``split_basis: fastest-instances``).

    A collective kernel runs from the rank's arrival until the last rank's data is in: its duration is the
    transfer when this rank arrived last, the transfer plus a wait otherwise. A *recurring* collective is one
    kind, kernel, communicator and message size (unknown sizes, as in graph replays, count as one size) with at
    least :data:`MIN_INSTANCES` instances in the analysed steps, pooled over steps and over the positions it takes
    in a step; its transfer per call is a low quantile of its instances' durations (arrival to end), the
    median of the share at which this rank may be expected to arrive last: 1/(2n) for n ranks in its
    communicator (:data:`DEFAULT_RANKS` where unknown), held within 1/16..1/4. Each instance is charged the
    smaller of that and its own duration, the rest is wait. A *place* of it (its n-th instance in each step) whose
    two fastest instances agree within :data:`FLOOR_TOL` and lie above :data:`FLOOR_ABOVE` times that transfer is
    a larger message under the same kernel (sizes unknown) and keeps its own floor; a rank that waits there by the
    same amount every step is then counted as transfer (an overestimate: the saving stays an upper bound). A
    collective that does not recur is charged in full (an upper bound). Where less than :data:`SPLIT_SHARE` of the time is in recurring collectives, no split:
    ``basis`` ``"none"``. ``one_rank`` (the evidence that the communicator holds one rank): every kernel is
    transfer, nothing waits. The exposed transfer = each instance's transfer x the exposed share of its kernel.
    """
    n_steps = max(1, n_steps)
    kernels = kernels.with_row_index("_r")
    k = kernels.filter(pl.col("step").is_not_null()).with_columns(
        dur=(pl.col("end") - pl.col("arrival")).clip(lower_bound=0), raw=pl.col("end") - pl.col("start"),
        exposed=pl.col("exposed").fill_null(0), kind=pl.col("kind").cast(pl.String),
        name=pl.col("name").cast(pl.String),
        _g=pl.col("group").cast(pl.String).fill_null(""), _b=pl.col("bytes").fill_null(-1))
    if k.height == 0:
        return CommSplit(basis="none", kernel_ms=0.0, transfer_ms=0.0, wait_ms=0.0, exposed_ms=0.0,
                         exposed_transfer_ms=0.0, hidden_ms=0.0, how="no communication kernels in the analysed steps",
                         kernels=kernels.drop("_r"))
    keys = ["kind", "name", "_g", "_b"]
    cls = k.group_by(keys).agg(n_c=pl.len(), d=pl.col("dur").sort(),
                               gs=pl.col("group_size").drop_nulls().mode().first())
    n = pl.coalesce(pl.col("gs").cast(pl.Float64), pl.lit(ranks, pl.Float64), pl.lit(float(DEFAULT_RANKS)))
    cls = cls.with_columns(q=(0.5 / n).clip(1 / 16, 1 / 4),
                           alone=(pl.lit(one_rank is not None) | (pl.col("gs") == 1)).fill_null(False))
    pos = pl.col("q") * (pl.col("n_c") - 1)
    lo = pos.floor().cast(pl.Int64)
    hi = pl.min_horizontal(lo + 1, pl.col("n_c") - 1)
    at = lambda i: pl.col("d").list.get(i, null_on_oob=True)  # noqa: E731
    cls = cls.with_columns(T=at(lo) + (pos - lo) * (at(hi) - at(lo)), recurring=pl.col("n_c") >= MIN_INSTANCES)
    cls = cls.select(*keys, "alone", "recurring", T=pl.when(~pl.col("alone") & pl.col("recurring")).then("T"))
    k = k.join(cls, on=keys, how="left")
    # Where the size is unknown, one kernel may move messages of different sizes at different places in the step.
    # A place (the n-th such collective of its step) whose fastest instances sit well above the collective's
    # fastest and agree with each other (a floor: the transfer of a larger message, reached whenever this rank
    # arrives last) keeps its own floor; a place that is only ever slower, by varying amounts, is waiting.
    k = k.sort("start").with_columns(place=pl.int_range(pl.len()).over([*keys, "step"]))
    places = k.group_by([*keys, "place"]).agg(m=pl.col("dur").sort().head(2), n_p=pl.len())
    floor = pl.col("m").list.get(0, null_on_oob=True)
    places = places.select(*keys, "place", floor=pl.when(
        (pl.col("n_p") >= 2) & (pl.col("m").list.get(1, null_on_oob=True) <= floor * (1 + FLOOR_TOL))).then(floor))
    k = k.join(places, on=[*keys, "place"], how="left").with_columns(
        T=pl.when(pl.col("T").is_not_null() & (pl.col("floor") > FLOOR_ABOVE * pl.col("T"))).then("floor")
        .otherwise("T"))
    t = pl.when(pl.col("alone")).then(pl.col("dur")).otherwise(pl.min_horizontal("dur", pl.coalesce("T", "dur")))
    k = k.with_columns(transfer=t.round(0).cast(pl.Int64))
    k = k.with_columns(wait=pl.col("dur") - pl.col("transfer"),
                       ex_t=pl.col("transfer") * (pl.col("exposed") / pl.col("dur")).fill_nan(0).clip(0, 1))
    ms = lambda e: float(e or 0) / 1e6 / n_steps  # noqa: E731
    total = k["dur"].sum()
    covered = k.filter(pl.col("alone") | pl.col("recurring"))["dur"].sum()
    alone = bool(k["alone"].all())
    if alone:
        basis = "fastest-instances"
        how = f"one rank in the communicator, {one_rank}: nothing to wait for" if one_rank else (
            "one rank in the communicator: nothing to wait for")
    elif total and covered / total >= SPLIT_SHARE:
        uncounted = 1 - covered / total
        basis = "fastest-instances"
        how = ("from this rank alone: each recurring collective's transfer at its fastest instances, when this rank "
               "arrived last"
               + (f"; {pct_text(uncounted)} of the time is in collectives that do not recur, counted whole"
                  if uncounted > 0.005 else ""))
    else:
        basis = "none"
        how = ("too few recurring collectives to tell transfer from waiting on one rank "
               f"({pct_text(covered / total if total else 0)} of the communication time)")
    split = basis != "none"
    by_kind = (k.group_by("kind").agg(count=pl.len(), raw=pl.col("raw").sum(), exposed=pl.col("exposed").sum(),
                                      transfer=pl.col("transfer").sum(), wait=pl.col("wait").sum(),
                                      ex_t=pl.col("ex_t").sum())
               .sort("raw", "kind", descending=[True, False]))
    rows = tuple({"kind": NCCL_KIND.get(r["kind"], r["kind"].replace("_", "-")),
                  "count_per_step": r["count"] / n_steps, "kernel_ms": ms(r["raw"]), "exposed_ms": ms(r["exposed"]),
                  "transfer_ms": ms(r["transfer"]) if split else None, "wait_ms": ms(r["wait"]) if split else None,
                  "exposed_transfer_ms": ms(r["ex_t"]) if split else None}
                 for r in by_kind.iter_rows(named=True))
    exposed = ms(k["exposed"].sum())
    out_kernels = kernels.join(k.select("_r", t_est="transfer"), on="_r", how="left").sort("_r")
    out_kernels = out_kernels.with_columns(transfer=pl.col("t_est")).drop("t_est", "_r").cast(SUMMARY_SCHEMA)
    return CommSplit(
        basis=basis, kernel_ms=ms(total), transfer_ms=ms(k["transfer"].sum()) if split else None,
        wait_ms=ms(k["wait"].sum()) if split else None, exposed_ms=exposed,
        exposed_transfer_ms=ms(k["ex_t"].sum()) if split else None,
        hidden_ms=ms(k["hidden"].sum()), by_kind=rows, how=how,
        ranks=1 if alone else ranks, kernels=out_kernels)


def pct_text(x: float) -> str:
    v = 100 * x
    return f"{v:.1f}%" if abs(v) < 10 else f"{v:.0f}%"


@dataclass(frozen=True)
class StepComm:
    """What a breakdown measures of its steps' collectives: the table per (kind, implementation), the
    communication kernels, and the communicator size of the trace's all-reduces with its evidence."""

    rows: list
    kernels: pl.DataFrame
    tp: int | None
    tp_evidence: str


def step_communication(trace: Trace, acts: pl.DataFrame | None, *, device: int, n_steps: int,
                       gpu_name: str | None, rules=None, found: pl.DataFrame | None = None) -> StepComm:
    """The analysed steps' communication of ``trace`` (its communication kernels found once; ``found``: see
    :func:`comm_kernels`)."""
    tp, tp_ev = tp_from_trace(trace)
    kernels, _ = comm_kernels(trace, acts, device, tp=tp, rules=rules, found=found)
    link, link_gbps = link_of(gpu_name)
    return StepComm(_table(kernels, n_steps, link, link_gbps), kernels, tp, tp_ev)


def one_rank_evidence(trace: Trace, kernels: pl.DataFrame, tp: int, tp_source: str | None, ep: int | None
                      ) -> str | None:
    """Why the communicator holds a single rank, or None: the trace's world size is 1, every communication kernel
    records a communicator of 1, or tensor parallelism 1 was stated (flag, manifest, command line) for a trace
    whose collectives are all all-reduces (the tensor-parallel collective) and no expert parallelism."""
    if trace.meta.world_size == 1:
        return "world size 1"
    gs = kernels["group_size"].drop_nulls()
    if gs.len() == kernels.height and kernels.height and (gs == 1).all():
        return "its communicator has 1 rank"
    kinds = kernels["kind"].cast(pl.String).unique().to_list()
    if tp == 1 and tp_source in STATED_TP_SOURCES and (ep or 1) <= 1 and kinds == ["all_reduce"]:
        return f"tensor parallelism 1 ({tp_source})"
    return None


def comm_summary(b, trace: Trace | None = None, *, rules=None) -> CommSummary:
    """The communication of one analysed rank (a :class:`~tracekit.results.breakdown.Breakdown`), with sizes and
    communicators when its ``trace`` is given (the Breakdown alone carries only the analysed steps' kernels).
    The kernels the breakdown already found (its ``facts.comm_split``) are not looked for again."""
    acts = b.activities
    dev = b.gpu.device
    n_steps = max(1, b.steps.count)
    tp, tp_ev = tp_from_trace(trace) if trace is not None else (None, "no trace given")
    split = getattr(getattr(b, "facts", None), "comm_split", None)
    if split is not None and split.kernels is not None:
        kernels, warnings = split.kernels, []
        hidden = split.hidden_ms
    else:
        kernels, warnings = comm_kernels(trace, acts, dev, tp=tp, rules=rules)
        hidden = float(kernels.filter(pl.col("step").is_not_null())["hidden"].sum() or 0) / 1e6 / n_steps
    in_steps = kernels.filter(pl.col("step").is_not_null())
    serial = float((in_steps["end"] - in_steps["arrival"]).clip(0).sum() or 0) / 1e6 / n_steps
    link, link_gbps = link_of(b.gpu.name)
    return CommSummary(
        path=b.source.path, rank=b.rank, device=dev, gpu_name=b.gpu.name,
        steps=b.steps.count, step_ms=b.steps.mean_ms, exposed_ms=b.per_step_ms.communication,
        kernel_ms=b.kernel_ms_per_step.communication, hidden_ms=hidden,
        serial_ms=serial, tp=tp, tp_evidence=tp_ev, link=link, link_gbps=link_gbps, kernels=kernels,
        warnings=warnings)


def collective_rows(calls: pl.DataFrame, n_steps: int, time_col: str, call_col: str | None = None) -> pl.DataFrame:
    """Per (kind, implementation): counts, sizes and times of ``calls`` (one row per call; ``time_col`` = the
    time the bandwidth is computed from, ns; ``call_col`` = each call's transfer, ns, whose median decides whether
    the collective is latency-bound: :func:`is_latency_bound`; default ``time_col``)."""
    return (calls.group_by("kind", "impl").agg(
        count=pl.len(),
        total_ns=(pl.col("end") - pl.col("start")).sum(),
        time_ns=pl.col(time_col).sum(),
        call_ns=pl.col(call_col or time_col).median(),
        bytes=pl.col("bytes").median(),
        bytes_sum=pl.col("bytes").filter(pl.col("bytes").is_not_null()).sum(),
        time_sized_ns=pl.col(time_col).filter(pl.col("bytes").is_not_null()).sum(),
        group_size=pl.col("group_size").drop_nulls().mode().first(),
        kernel=pl.col("name").mode().first(),
    ).with_columns(count_per_step=pl.col("count") / n_steps).sort("total_ns", "kind", descending=[True, False]))


def row_dicts(rows: pl.DataFrame, n_steps: int, link: str | None, link_gbps: float | None) -> list[dict]:
    """The contract's ``collectives`` entries (plus extension keys) from :func:`collective_rows`."""
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
    (:func:`tracekit.run.ranks.cross_rank`) computes them from the transfer alone.
    """
    return _table(s.kernels, max(1, s.steps), s.link, s.link_gbps)


def collectives_of(kernels: pl.DataFrame, n_steps: int, gpu_name: str | None) -> list[dict]:
    """One rank's collectives table from its communication kernels (those of :func:`split_one_rank`, whose
    ``transfer`` is filled: latency-bound is then judged from each call's transfer, as across ranks)."""
    link, link_gbps = link_of(gpu_name)
    return _table(kernels, max(1, n_steps), link, link_gbps)


def _table(kernels: pl.DataFrame, n_steps: int, link: str | None, link_gbps: float | None) -> list[dict]:
    """Bandwidths from the kernels' own durations (waiting included: lower bounds); latency-bound from each call's
    transfer where it is known (``transfer``: :func:`split_one_rank`), else from its duration."""
    calls = kernels.filter(pl.col("step").is_not_null()).with_columns(
        pl.col("name", "impl", "kind", "group").cast(pl.String), dur=pl.col("end") - pl.col("start"))
    if calls.height == 0:
        return []
    call = pl.coalesce("transfer", "dur") if "transfer" in calls.columns else pl.col("dur")
    calls = calls.with_columns(call=call)
    return row_dicts(collective_rows(calls, n_steps, "dur", "call"), n_steps, link, link_gbps)


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
               if r["implementation"] != "nccl" else "a one-shot / custom all-reduce or fewer, fused calls help"
               if r["kind"] == "all_reduce" else "fewer, fused calls or overlapping them with compute help")
        if r["latency_bound_basis"] == "bytes":
            move_us = r["bytes"] * (bus_factor(r["kind"], r["group_size"]) or 1.0) / (r["link_gbps"] * 1e3)
            why = (f"the link moves its bytes in {move_us:.2f} µs against ≈{r['latency_us']:.1f} µs of latency "
                   "per call")
        else:
            why = (f"each call's transfer takes {r['call_us']:.1f} µs, within twice the ≈{r['latency_us']:.1f} µs "
                   f"latency of a {r['group_size']}-rank ring")
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


__all__ = ["CommSummary", "CommSplit", "StepComm", "split_one_rank", "step_communication", "one_rank_evidence",
           "kernel_exposure", "NCCL_KIND", "comm_summary", "comm_kernels", "collective_rows", "row_dicts", "collective_table", "collectives_of", "collectives_verdict",
           "hidden_communication",
           "tp_from_trace", "bus_factor", "is_latency_bound", "HOP_LATENCY_US", "DTYPE_BYTES"]
