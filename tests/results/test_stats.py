"""`tracekit stats`: each table against a figure obtained without tracekit.

* kernels: nsys stats' own ``cuda_gpu_kern_sum`` CSVs (the references of ``test_kernels.py``).
* memory operations, CUDA API calls, NVTX ranges: we hold no CSV of nsys stats' ``cuda_gpu_mem_time_sum``,
  ``cuda_api_sum`` or ``nvtx_sum`` (``tests/data/nsys_stats`` has the kernel report only), so the reference is the
  SQL of those report scripts run on the export itself with Python's ``statistics`` (:data:`MEM_SQL`,
  :data:`API_SQL`, :data:`NVTX_SQL`: the scripts' queries, medians and deviations taken in Python as nsys' SQLite
  extension takes them), compared within the tolerance of the kernel test (1 ns or 0.1%).
* Kineto op grouping: a hand computation on a real trace through Kineto's own link, the ``External id`` a kernel
  shares with the ``cpu_op`` that launched it (tracekit finds the op by time on the launching thread instead).
* utilisation and coverage: sums by SQL on the export, and the identity in + outside = total.
"""

from __future__ import annotations

import gzip
import json
import statistics
from collections import defaultdict

import pytest
from results.test_kernels import INDEX, close, nsys_rows, trace_path

import tracekit
from tracekit.readers.nsys.stats import api_calls, nvtx_ranges
from tracekit.results.stats import NO_LAUNCH, api_table, memop_table, range_table
from tracekit.run.stats import stats

from conftest import DATA, ROOT, sample, sample_sqlite, shared, sql_rows

EXPORTS = sorted((DATA / "nsys").glob("*.sqlite"))
SAMPLE_EXPORTS = ["hf-small-eager", "hf-small-graph", "spec-small-graph", "moe-small-graph-nomark"]  # (moe: an empty NVTX table)
# the external exports not copied into tests/data (read in place; skipped where absent): nsys 2023.1, 2023.3 (no
# CUDA tables), 2024.5 (4 GPUs listed), 2025.1 (13.5k NVTX ranges), 2026.2 (16.8k NVTX ranges, two GPUs)
SHARED_EXPORTS = ["memfusion_artifact/report1.sqlite", "qcu/report1.sqlite",
                  "pipit/pipit/tests/data/cloverleaf-nsys/perlmutter-cloverleaf-cuda.sqlite", "Fuser/report1.sqlite",
                  "nsys-ai/tests/fixtures/h100_2gpu_1s.sqlite"]

# cuda_gpu_mem_time_sum's memops (its query_memcpy UNION ALL query_memset)
MEM_SQL = {
    "CUPTI_ACTIVITY_KIND_MEMCPY": "SELECT '[CUDA memcpy ' || mos.label || ']', m.end - m.start, m.bytes "
                                  "FROM CUPTI_ACTIVITY_KIND_MEMCPY m JOIN ENUM_CUDA_MEMCPY_OPER mos "
                                  "ON mos.id = m.copyKind",
    "CUPTI_ACTIVITY_KIND_MEMSET": "SELECT '[CUDA memset]', end - start, bytes FROM CUPTI_ACTIVITY_KIND_MEMSET",
}
# cuda_api_sum: every runtime row grouped by nameId; the name loses its last six characters when they start '_v'
API_SQL = """SELECT r.nameId, CASE substr(s.value, -6, 2) WHEN '_v' THEN substr(s.value, 1, length(s.value) - 6)
             ELSE s.value END, r.end - r.start FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId
             {where}"""
# nvtx_sum: push/pop and start/end ranges (59, 60, 70, 71), 'domain:' before the name where the domain was created
# with a name in the same process, an open range lasting to the last NVTX timestamp
NVTX_SQL = """
WITH domains AS (SELECT min(ne.start), ne.domainId AS id, ne.globalTid AS globalTid,
                        coalesce(sid.value, ne.text) AS name
                 FROM NVTX_EVENTS ne LEFT JOIN StringIds sid ON ne.textId = sid.id
                 WHERE ne.eventType = 75 GROUP BY 2, 3),
     maxts AS (SELECT max(max(start), max(end)) AS m FROM NVTX_EVENTS)
SELECT CASE WHEN d.name NOT NULL AND sid.value IS NOT NULL THEN d.name || ':' || sid.value
            WHEN d.name NOT NULL AND sid.value IS NULL THEN d.name || ':' || ne.text
            WHEN d.name IS NULL AND sid.value NOT NULL THEN sid.value
            ELSE ne.text END,
       CASE WHEN ne.eventType IN (59, 70) THEN 'PushPop' ELSE 'StartEnd' END,
       coalesce(ne.end, (SELECT m FROM maxts)) - ne.start
FROM NVTX_EVENTS ne
LEFT JOIN domains d ON ne.domainId = d.id
     AND (ne.globalTid & 0x0000FFFFFF000000) = (d.globalTid & 0x0000FFFFFF000000)
LEFT JOIN StringIds sid ON ne.textId = sid.id
WHERE ne.eventType IN (59, 60, 70, 71)"""


def _tables(path) -> set[str]:
    return {r[0] for r in sql_rows(path, "SELECT name FROM sqlite_master WHERE type = 'table'")}


def _columns(path, table) -> set[str]:
    return {r[1] for r in sql_rows(path, f"PRAGMA table_info({table})")}


def _summarise(groups: dict) -> dict:
    """key -> nsys stats' numbers of a list of durations (ns)."""
    return {k: {"count": len(d), "total": sum(d), "mean": sum(d) / len(d), "median": statistics.median(d),
                "min": min(d), "max": max(d), "stddev": statistics.stdev(d) if len(d) > 1 else 0.0}
            for k, d in groups.items()}


def _compare(ours: dict, ref: dict, what: str) -> int:
    assert sorted(ours) == sorted(ref), f"{what}: the rows differ: {sorted(set(ours) ^ set(ref))[:5]}"
    grand = sum(r["total"] for r in ref.values())
    bad = []
    for key, r in ref.items():
        o = ours[key]
        if o.count != r["count"]:
            bad.append((key, "count", o.count, r["count"]))
        for k, v in (("total", o.total_ms * 1e6), ("mean", o.mean_us * 1e3), ("median", o.median_ms * 1e6),
                     ("min", o.min_ms * 1e6), ("max", o.max_ms * 1e6), ("stddev", o.stddev_ms * 1e6)):
            if not close(v, r[k]):
                bad.append((key, k, v, r[k]))
        if grand and abs(o.share - r["total"] / grand) > 1e-9:
            bad.append((key, "share", o.share, r["total"] / grand))
    assert not bad, f"{what}: {len(bad)} value(s) differ from the nsys stats query, e.g. {bad[:5]}"
    return len(ref)


def api_reference(path, *, backtrace_copies: bool = False) -> dict:
    if "CUPTI_ACTIVITY_KIND_RUNTIME" not in _tables(path):
        return {}
    skip = not backtrace_copies and "eventClass" in _columns(path, "CUPTI_ACTIVITY_KIND_RUNTIME")
    groups = defaultdict(list)
    for name_id, name, dur in sql_rows(path, API_SQL.format(where="WHERE r.eventClass != 67" if skip else "")):
        groups[(name_id, name)].append(dur)
    return _summarise(groups)


def nvtx_reference(path) -> dict:
    if "NVTX_EVENTS" not in _tables(path):
        return {}
    groups = defaultdict(list)
    for name, style, dur in sql_rows(path, NVTX_SQL):
        groups[(name or "", style)].append(dur)
    return _summarise(groups)


def mem_reference(path) -> tuple[dict, dict]:
    groups, nbytes = defaultdict(list), defaultdict(int)
    tables = _tables(path)
    for table, q in MEM_SQL.items():
        if table in tables:
            if "ENUM_CUDA_MEMCPY_OPER" not in tables and "mos" in q:
                # nsys 2022.2 wrote no ENUM tables (nsys stats refuses the report there): the labels of a newer
                # export's enum (the ids are CUPTI's, stable)
                enum = sql_rows(sample("hf-small-eager/trace.sqlite"), "SELECT id, label FROM ENUM_CUDA_MEMCPY_OPER")
                values = ", ".join(f"({i}, '{label}')" for i, label in enum)
                q = f"WITH ENUM_CUDA_MEMCPY_OPER(id, label) AS (VALUES {values}) " + q
            for name, dur, b in sql_rows(path, q):
                groups[name].append(dur)
                nbytes[name] += b or 0
    return _summarise(groups), dict(nbytes)


def _exports():
    return [pytest.param(p, id=p.name) for p in EXPORTS] + [
        pytest.param(s, id=f"sample:{s}") for s in SAMPLE_EXPORTS] + [
        pytest.param(f"shared:{s}", id=f"shared:{s}") for s in SHARED_EXPORTS]


def _path(p):
    if isinstance(p, str):
        return shared(p.removeprefix("shared:")) if p.startswith("shared:") else sample_sqlite(p)
    return p


@pytest.mark.parametrize("export", _exports())
def test_api_calls_equal_cuda_api_sum(export):
    path = _path(export)
    calls = api_calls(path)
    ref = api_reference(path)
    # (nsys groups by name id; where two ids showed one name, both would be rows: none of these exports has one)
    assert len({name for _, name in ref}) == len(ref)
    _compare({r.name: r for r in api_table(calls)}, {name: v for (_, name), v in ref.items()}, f"{path.name} api")


def test_the_2022_export_counts_each_backtraced_call_once():
    """nsys 2022.2 lists a backtraced call twice (eventClass 67: an unversioned copy, §6.2 of the schema notes);
    nsys stats would show both as rows of the same name; tracekit counts the call once."""
    path = DATA / "nsys" / "pipit_saxpy_2022.2.sqlite"
    copies = sql_rows(path, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE eventClass = 67")[0][0]
    assert copies == 38
    ours = api_table(api_calls(path))
    assert sum(r.count for r in ours) == sql_rows(path, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME")[0][0] - 38
    both = api_reference(path, backtrace_copies=True)
    assert sum(v["count"] for v in both.values()) == sum(r.count for r in ours) + copies
    k = {r.name: r for r in ours}["cudaLaunchKernel"]
    assert k.count == 5  # the five saxpy launches, once each


@pytest.mark.parametrize("export", _exports())
def test_nvtx_ranges_equal_nvtx_sum(export):
    path = _path(export)
    ref = nvtx_reference(path)
    ours = {(r.name, r.style): r for r in range_table(nvtx_ranges(path))}
    _compare(ours, ref, f"{path.name} nvtx")


def test_nvtx_names_carry_their_domain():
    """pipit saxpy 2022.2: its MPI ranges are in a domain created as 'MPI' (nvtx_sum shows 'MPI:MPI_Send')."""
    rows = {(r.name, r.style): r.count for r in range_table(nvtx_ranges(DATA / "nsys" / "pipit_saxpy_2022.2.sqlite"))}
    assert rows[("MPI:MPI_Send", "PushPop")] == 10 and rows[("saxpy", "PushPop")] == 5


@pytest.mark.parametrize("export", _exports())
def test_memory_operations_equal_cuda_gpu_mem_time_sum(export):
    path = _path(export)
    ref, nbytes = mem_reference(path)
    ours = {r.name: r for r in memop_table(tracekit.load(path).memops)}
    _compare(ours, ref, f"{path.name} memops")
    assert {k: r.bytes for k, r in ours.items()} == nbytes


REFS = list({r["trace"]: r for r in INDEX if r["trace"] in (
    "sample:hf-small-eager/trace.sqlite", "sample:hf-small-graph/trace.sqlite.gz")
    or r["trace"].endswith("mfu_2gpu_before.sqlite")}.values())


@pytest.mark.parametrize("ref", [pytest.param(r, marks=pytest.mark.slow) if r["trace"].startswith("shared:") else r
                                 for r in REFS], ids=[r["trace"] for r in REFS])
def test_the_kernel_table_equals_nsys_stats_kern_sum(ref):
    path = trace_path(ref["trace"])
    rows = nsys_rows(ROOT / ref["csv"])
    ours = {k.name: k for k in stats(tracekit.load(path)).kernels}
    assert sorted(ours) == sorted(r["name"] for r in rows)
    for r in rows:
        k = ours[r["name"]]
        assert k.count == int(r["count"]) and close(k.total_ms * 1e6, r["total"])
        assert close(k.median_ms * 1e6, r["median"]) and close(k.stddev_ms * 1e6, r["stddev"])


@pytest.mark.slow
def test_one_trace_end_to_end_by_sql():
    """hf-small-eager (nsys 2025.3, one GPU, one stream, 15 NVTX steps): every table of the result against SQL."""
    path = sample("hf-small-eager/trace.sqlite")
    s = stats(tracekit.load(path))
    assert s.to_dict()["schema"] == "tracekit.stats/1"
    _compare({r.name: r for r in s.api}, {n: v for (_, n), v in api_reference(path).items()}, "api")
    _compare({(r.name, r.style): r for r in s.ranges}, nvtx_reference(path), "nvtx")
    # the GPU window and the busy time: one stream, its activities never overlap, so the union is their plain sum
    q = ("SELECT min(start), max(end), sum(end - start), count(*) FROM (SELECT start, end FROM CUPTI_ACTIVITY_KIND_KERNEL "
         "UNION ALL SELECT start, end FROM CUPTI_ACTIVITY_KIND_MEMCPY UNION ALL SELECT start, end FROM "
         "CUPTI_ACTIVITY_KIND_MEMSET)")
    t0, t1, busy, n = sql_rows(path, q)[0]
    u = s.utilisation
    assert (u.start_ns, u.end_ns) == (t0, t1)
    (st,) = u.streams
    assert st.count == n and st.busy_ms * 1e6 == busy and u.devices[0].busy_ms * 1e6 == busy
    assert st.utilisation == pytest.approx(busy / (t1 - t0), rel=1e-12)
    kern = sql_rows(path, "SELECT sum(end - start) FROM CUPTI_ACTIVITY_KIND_KERNEL")[0][0]
    assert u.devices[0].kernel_ms * 1e6 == kern
    # coverage: all kernel + memop time of GPU 0, in + outside = total exactly, the outside named
    c = s.coverage
    assert c.kernel_ms_total * 1e6 == pytest.approx(busy, abs=0.5)
    assert c.kernel_ms_in_steps + c.kernel_ms_outside_steps == pytest.approx(c.kernel_ms_total, abs=1e-9)
    assert sum(c.outside_by_reason.values()) == pytest.approx(c.kernel_ms_outside_steps, abs=1e-9)
    assert c.steps == 15 and c.outside_by_reason.keys() == {"last step (no following step)"}
    # the analysed steps hold what the breakdown counts per step (its kernel categories x its steps)
    b = tracekit.breakdown(tracekit.load(path))
    per_step = sum(v for v in b.kernel_ms_per_step.to_dict().values() if v)
    assert c.kernel_ms_in_steps == pytest.approx(per_step * b.steps.count, rel=1e-6)
    # every grouping of launched_by is a partition of the kernel time
    for g, rows in s.launched_by.items():
        assert sum(r.total_ms for r in rows) * 1e6 == pytest.approx(kern, abs=1), g
        assert sum(r.kernels for r in rows) == sql_rows(path, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL")[0][0]


@pytest.mark.slow
def test_kernel_time_by_launching_api_by_sql():
    """mfu_2gpu_before (two processes): the kernel -> runtime call join on (process, correlationId) as nsys'
    docs give it, by SQL; 24 kernels have no runtime row (the capture window cut their launches)."""
    path = DATA / "nsys" / "nsysai_mfu_2gpu_before_2026.2.sqlite"
    rows = sql_rows(path, """
        SELECT coalesce(CASE substr(s.value, -6, 2) WHEN '_v' THEN substr(s.value, 1, length(s.value) - 6)
                        ELSE s.value END, 'none'), count(*), sum(k.end - k.start)
        FROM CUPTI_ACTIVITY_KIND_KERNEL k
        LEFT JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = k.correlationId
             AND (r.globalTid >> 24) = (k.globalPid >> 24)
        LEFT JOIN StringIds s ON s.id = r.nameId GROUP BY 1""")
    ref = {("(launch not recorded)" if n == "none" else n): (c, t) for n, c, t in rows}
    ours = {r.name: (r.kernels, round(r.total_ms * 1e6)) for r in stats(tracekit.load(path)).launched_by["api"]}
    # (nsys keeps cudaLaunchKernelExC's version suffix; tracekit's launch names have none)
    ours = {k if k in ref else next(n for n in ref if n.startswith(k)): v for k, v in ours.items()}
    assert ours == ref and ours[NO_LAUNCH][0] == 24


def _external_id_grouping(path):
    """Kernel time (µs, as the trace writes it) per name of the cpu_op whose External id the kernel carries."""
    ev = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    op_of = {e["args"]["External id"]: e["name"] for e in ev
             if e.get("cat") == "cpu_op" and "External id" in e.get("args", {})}
    out = defaultdict(lambda: [0, 0.0])
    for e in ev:
        if e.get("cat") == "kernel":
            row = out[op_of.get(e["args"].get("External id"), "(none open)")]
            row[0] += 1
            row[1] += e["dur"]
    return {k: (n, round(us, 3)) for k, (n, us) in out.items()}


@pytest.mark.parametrize("trace", ["sample_traces/synthetic-eager-torch/trace.json.gz",
                                   "tests/data/kineto/hta_rocm_mi250.json.gz"])
def test_kineto_op_grouping_equals_the_external_id_link(trace):
    """The op that launched each kernel, by Kineto's External id (synthetic-eager-torch: 3,600 kernels of four
    aten ops; HTA's MI250 trace: 14 kernels of a training step), equals tracekit's op found on the launching
    thread at the launch."""
    path = ROOT / trace
    ref = _external_id_grouping(path)
    ours = {r.name: (r.kernels, round(r.total_ms * 1e3, 3)) for r in stats(tracekit.load(path)).launched_by["op"]}
    assert ours == ref
    assert len(ref) >= 4


def test_python_frames_and_modules_where_the_trace_has_stacks():
    """TraceLens' vLLM decode trace (with_stack): the graph replay's 421 kernels are launched from
    torch/cuda/graphs.py's replay, the one eager GEMM from the LogitsProcessor module."""
    s = stats(tracekit.load(DATA / "kineto" / "tracelens_rocm_vllm_decode_graph.json.gz"))
    py = {r.name: r.kernels for r in s.launched_by["python"]}
    assert py["torch/cuda/graphs.py(139): replay"] == 421
    assert {r.name: r.kernels for r in s.launched_by["module"]}["nn.Module: LogitsProcessor_#"] == 1
    assert {r.name: r.kernels for r in s.launched_by["api"]}["hipGraphLaunch"] == 421


def test_no_steps_is_a_warning_not_an_error():
    s = stats(tracekit.load(DATA / "nsys" / "nsysai_mock_2026.1.sqlite"))
    assert s.coverage is None or s.coverage.kernel_ms_total >= 0
    assert s.to_dict()["schema"] == "tracekit.stats/1"


def test_the_one_group_sweep_equals_the_merge_of_intervals():
    """mfu_2gpu_before: the two GPUs' activities taken as one group overlap in time; their covered time by the
    one-group sweep equals the union the interval merge (tracekit.intervals) gives, and lies between the busier
    GPU's and the two GPUs' sum."""
    import polars as pl

    from tracekit.intervals import union_length
    from tracekit.results.stats import _gpu_activity, _union

    acts = _gpu_activity(tracekit.load(DATA / "nsys" / "nsysai_mfu_2gpu_before_2026.2.sqlite"), None)
    per_gpu = _union(acts, ["device"])  # (two groups: the merge)
    one = acts.with_columns(device=pl.lit(0, acts.schema["device"]))
    swept = _union(one, ["device"])["union_ns"][0]  # (one group: the sweep)
    assert swept == union_length(one, ["device"]).collect()["union_ns"][0]
    assert per_gpu.height == 2 and per_gpu["union_ns"].max() < swept < per_gpu["union_ns"].sum()


# nsys stats' own CSVs of the three reports, where the GPU host made them (`EXTRA_REPORTS="cuda_gpu_mem_time_sum
# cuda_api_sum nvtx_sum" bash benchmarks/device_nsys_stats.sh refs ...`: tests/data/nsys_stats/<report>/); none is
# committed yet, so these cases are listed only once the CSVs are there.
REPORT_KEYS = {"cuda_api_sum": ("Name",), "cuda_gpu_mem_time_sum": ("Operation",), "nvtx_sum": ("Range", "Style")}


def _report_refs():
    from results.test_kernels import REFS as KERN_REFS
    from results.test_kernels import read_index

    return [pytest.param(report, r, id=f"{report}:{r['trace']}") for report in REPORT_KEYS
            if (KERN_REFS / report).is_dir() for r in read_index(KERN_REFS / report)]


def _csv_rows(path, keys) -> dict:
    import csv

    with path.open(newline="", encoding="utf-8") as fh:
        rows = list(csv.reader(fh))
    head = [h.strip() for h in rows[0]]

    def col(prefix):
        return next(i for i, h in enumerate(head) if h.startswith(prefix))

    ix = {k: col(p) for k, p in (("total", "Total"), ("mean", "Avg"), ("median", "Med"), ("min", "Min"),
                                 ("max", "Max"), ("stddev", "StdDev"))}
    count = next(i for i, h in enumerate(head) if h.startswith(("Num Calls", "Count", "Instances")))
    out = {}
    for r in rows[1:]:
        if r:
            key = tuple(r[col(k)] for k in keys)
            out[key if len(key) > 1 else key[0]] = {"count": int(r[count].replace(",", "")),
                                                    **{k: float(r[i].replace(",", "")) for k, i in ix.items()}}
    return out


@pytest.mark.parametrize("report, ref", _report_refs())
def test_the_tables_equal_nsys_stats_csvs(report, ref):
    path = trace_path(ref["trace"])
    s = stats(tracekit.load(path))
    ours = {"cuda_api_sum": {r.name: r for r in s.api}, "cuda_gpu_mem_time_sum": {r.name: r for r in s.memops},
            "nvtx_sum": {(r.name, r.style): r for r in s.ranges}}[report]
    _compare(ours, _csv_rows(ROOT / ref["csv"], REPORT_KEYS[report]), f"{ref['csv']}")
