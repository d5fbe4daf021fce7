"""Which collectives put work on the GPU in a process group of ONE rank (world size 1)?

    python capture/collectives_probe.py [--json-out probe.json]            # detect with torch.profiler (CUPTI)
    nsys profile -t cuda,nvtx --capture-range=cudaProfilerApi -o p python capture/collectives_probe.py --detect none
    python capture/collectives_probe.py --from-sqlite p.sqlite [--json-out nsys.json]   # the same table from nsys

A world of one is all a single-GPU machine offers. NCCL's all-reduce there launches nothing (seen on the
H200: the ``tp1-*-nccl-*`` samples have no communication kernel), while torch's symmetric-memory
``one_shot_all_reduce`` launches a real kernel. This probe asks the same of every collective a tensor- or
sequence-parallel decode step uses: NCCL ``all_reduce``, ``all_gather_into_tensor``, ``reduce_scatter_tensor``
(process group of size 1: ``init_process_group("nccl", world_size=1, rank=0)`` over a ``FileStore``), and the
``torch.ops.symm_mem`` ops that exist in this torch (``one_shot_all_reduce``, ``two_shot_all_reduce_``,
``reduce_scatter_out``, ``_low_contention_all_gather``, ``_low_contention_reduce_scatter``; the multicast
``multimem_*`` ops are skipped: NVLink multicast stays off, ``NCCL_NVLS_ENABLE=0
TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1``). For each: available or not, its error if it
fails, the GPU kernels / memcpys / memsets one call launches (torch.profiler's CUDA activity, 3 calls), and
whether it can be captured in a CUDA graph. Printed as a short table; ``--json-out`` writes it with a
``summary``: for reduce-scatter and all-gather, the implementations that launch a KERNEL at world size 1
(``sp_decode.py`` can then exercise them; if none, a reduce-scatter/all-gather capture needs >= 2 GPUs).

``--detect none`` runs each op inside an NVTX range ``probe <op>`` between ``cudaProfilerStart/Stop``, for
nsys; ``--from-sqlite`` reads that export (kernels, memcpys and memsets whose launch call lies inside each
range, on its thread) and prints the same table from nsys's point of view (stdlib ``sqlite3`` only).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
REPS = 3
RS_OPS = ("nccl reduce_scatter_tensor", "symm reduce_scatter_out", "symm _low_contention_reduce_scatter")
AG_OPS = ("nccl all_gather_into_tensor", "symm _low_contention_all_gather")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--detect", choices=["torch", "none"], default="torch",
                   help="torch: torch.profiler counts each op's GPU work; none: NVTX ranges only (run under nsys)")
    p.add_argument("--numel", type=int, default=8 * 4096, help="elements per message (bf16)")
    p.add_argument("--json-out", default=None)
    p.add_argument("--from-sqlite", default=None, help="print the table from an nsys export of a --detect none run")
    return p.parse_args(argv)


def build_ops(torch, dist, n: int, dev):
    """(name, callable or None, why-not) for every candidate; symmetric buffers set up when possible."""
    t = torch.ones(n, dtype=torch.bfloat16, device=dev)
    ag_out = torch.empty(n, dtype=torch.bfloat16, device=dev)     # world size 1: output = input size
    rs_out = torch.empty(n, dtype=torch.bfloat16, device=dev)
    ops = [("nccl all_reduce", lambda: dist.all_reduce(t), None),
           ("nccl all_gather_into_tensor", lambda: dist.all_gather_into_tensor(ag_out, t), None),
           ("nccl reduce_scatter_tensor", lambda: dist.reduce_scatter_tensor(rs_out, t), None)]
    symm = getattr(torch.ops, "symm_mem", None)
    gname = dist.group.WORLD.group_name
    buf = err = None
    try:
        import torch.distributed._symmetric_memory as symm_mem

        if hasattr(symm_mem, "enable_symm_mem_for_group"):
            symm_mem.enable_symm_mem_for_group(gname)
        buf = symm_mem.empty(n, dtype=torch.bfloat16, device=dev)
        symm_mem.rendezvous(buf, gname)
        buf.fill_(1)
    except Exception as e:  # noqa: BLE001
        err = f"symmetric memory unavailable: {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
    sym_out = torch.empty(n, dtype=torch.bfloat16, device=dev)

    def symm_op(name, call):
        if err:
            return (f"symm {name}", None, err)
        if symm is None or not hasattr(symm, name):
            return (f"symm {name}", None, f"torch {torch.__version__} has no torch.ops.symm_mem.{name}")
        return (f"symm {name}", call, None)

    ops += [symm_op("one_shot_all_reduce", lambda: symm.one_shot_all_reduce(buf, "sum", gname)),
            symm_op("two_shot_all_reduce_", lambda: symm.two_shot_all_reduce_(buf, "sum", gname)),
            symm_op("reduce_scatter_out", lambda: symm.reduce_scatter_out(buf, gname, False, sym_out)),
            symm_op("_low_contention_all_gather", lambda: symm._low_contention_all_gather(buf, gname)),
            symm_op("_low_contention_reduce_scatter", lambda: symm._low_contention_reduce_scatter(buf, "sum", gname)),
            ("symm multimem_all_gather_out", None, "skipped: NVLink multicast is kept off")]
    return ops


def gpu_work(torch, fn) -> dict:
    """GPU activity of REPS calls of ``fn`` under torch.profiler: kernel / memcpy / memset names and counts."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(REPS):
            fn()
        torch.cuda.synchronize()
    kernels, memcpy, memset = {}, 0, 0
    for e in prof.events():
        if e.device_type != DeviceType.CUDA:
            continue
        # a collective's GPU-side annotation (``nccl:_all_gather_base``) is a range, not a kernel: the H200 run of
        # 2026-12-04 counted it as one and wrongly concluded that NCCL reduce-scatter / all-gather launch kernels at
        # world size 1 (they run as a device copy)
        if getattr(e, "is_user_annotation", False) or e.name.startswith(("nccl:", "c10d::", "gloo:")):
            continue
        if e.name.startswith("Memcpy"):
            memcpy += 1
        elif e.name.startswith("Memset"):
            memset += 1
        else:
            kernels[e.name] = kernels.get(e.name, 0) + 1
    return {"kernels_per_call": sum(kernels.values()) / REPS, "kernel_names": sorted(kernels),
            "memcpy_per_call": memcpy / REPS, "memset_per_call": memset / REPS}


def graph_ok(torch, fn) -> str:
    try:
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            fn()
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
        with torch.cuda.graph(g):
            fn()
        g.replay()
        torch.cuda.synchronize()
        return "ok"
    except Exception as e:  # noqa: BLE001
        try:
            torch.cuda.synchronize()
        except Exception:  # noqa: BLE001
            pass
        return f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"


def summary(rows: list[dict]) -> dict:
    by = {r["op"]: r for r in rows}

    def kernel_ops(names):
        return [n for n in names if (by.get(n) or {}).get("kernels_per_call")]

    rs, ag = kernel_ops(RS_OPS), kernel_ops(AG_OPS)
    return {"reduce_scatter_kernel_ops": rs, "all_gather_kernel_ops": ag,
            "rs_ag_capture_possible_on_one_gpu": bool(rs and ag),
            "verdict": ("reduce-scatter AND all-gather launch kernels at world size 1: a sequence-parallel decode "
                        "capture on one GPU exercises both" if rs and ag else
                        "no kernel for " + " and ".join(k for k, v in (("reduce-scatter", rs), ("all-gather", ag))
                                                          if not v)
                        + " at world size 1: a reduce-scatter/all-gather capture needs >= 2 GPUs")}


def print_table(rows: list[dict], source: str) -> None:
    print(f"== collectives at world size 1 ({source}); per call:")
    print(f"{'op':38s} {'avail':5s} {'kernels':>7s} {'memcpy':>6s} {'memset':>6s}  {'graph':10s} kernel names / note")
    for r in rows:
        if not r["available"]:
            print(f"{r['op']:38s} {'no':5s} {'-':>7s} {'-':>6s} {'-':>6s}  {'-':10s} {r.get('note') or ''}")
            continue
        if r.get("error"):
            print(f"{r['op']:38s} {'yes':5s} {'err':>7s} {'-':>6s} {'-':>6s}  {'-':10s} {r['error']}")
            continue
        g = r.get("graph") or "-"
        print(f"{r['op']:38s} {'yes':5s} {r['kernels_per_call']:7.2f} {r['memcpy_per_call']:6.2f} "
              f"{r['memset_per_call']:6.2f}  {g[:10]:10s} {', '.join(r['kernel_names'])[:110]}")


def from_sqlite(path: str) -> list[dict]:
    """Per ``probe <op>`` NVTX range of an nsys export: the GPU work launched inside it (divided by REPS)."""
    import sqlite3

    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    tables = {r[0] for r in con.execute("select name from sqlite_master where type='table'")}
    ranges = con.execute(
        "select coalesce(n.text, s.value), n.start, n.end, n.globalTid from NVTX_EVENTS n "
        "left join StringIds s on s.id = n.textId where n.end is not null").fetchall()
    rows = []
    for text, start, end, tid in ranges:
        if not text or not text.startswith("probe "):
            continue
        op = text[len("probe "):]
        kinds = {"kernels": "CUPTI_ACTIVITY_KIND_KERNEL", "memcpy": "CUPTI_ACTIVITY_KIND_MEMCPY",
                 "memset": "CUPTI_ACTIVITY_KIND_MEMSET"}
        r = {"op": op, "available": True, "kernel_names": []}
        for k, tbl in kinds.items():
            if tbl not in tables:
                r[f"{k}_per_call"] = 0.0
                continue
            q = (f"select count(*) from {tbl} g join CUPTI_ACTIVITY_KIND_RUNTIME a on a.correlationId = g.correlationId "
                 "where a.start >= ? and a.start <= ? and a.globalTid = ?")
            r[f"{k}_per_call"] = con.execute(q, (start, end, tid)).fetchone()[0] / REPS
            if k == "kernels":
                names = con.execute(
                    "select distinct s.value from CUPTI_ACTIVITY_KIND_KERNEL g join CUPTI_ACTIVITY_KIND_RUNTIME a "
                    "on a.correlationId = g.correlationId join StringIds s on s.id = g.shortName "
                    "where a.start >= ? and a.start <= ? and a.globalTid = ?", (start, end, tid)).fetchall()
                r["kernel_names"] = sorted(n[0] for n in names)
        rows.append(r)
    con.close()
    return rows


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.from_sqlite:
        rows = from_sqlite(args.from_sqlite)
        print_table(rows, f"nsys export {os.path.basename(args.from_sqlite)}")
        out = {"source": "nsys", "rows": rows, "summary": summary(rows)}
        print("== " + out["summary"]["verdict"])
        if args.json_out:
            with open(args.json_out, "w") as f:
                json.dump(out, f, indent=2)
        return 0
    os.environ.update(NO_MULTICAST)
    import torch
    import torch.distributed as dist

    if not torch.cuda.is_available():
        print("== collectives probe: no CUDA device here; nothing to probe")
        if args.json_out:
            with open(args.json_out, "w") as f:
                json.dump({"source": "none", "rows": [], "summary": {"rs_ag_capture_possible_on_one_gpu": False,
                                                                    "verdict": "no CUDA device"}}, f, indent=2)
        return 0
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    store_file = tempfile.NamedTemporaryFile(prefix="tk_probe_store_", delete=False).name
    store = dist.FileStore(store_file, 1)
    dist.init_process_group("nccl", store=store, rank=0, world_size=1, device_id=dev)
    rows = []
    ops = build_ops(torch, dist, args.numel, dev)
    for name, fn, why in ops:
        row = {"op": name, "available": fn is not None, "note": why}
        if fn is not None:
            print(f"probe: {name} ...", flush=True)     # progress: a hang still leaves the ops done so far in the log
            try:
                fn()
                torch.cuda.synchronize()
                if args.detect == "torch":
                    row.update(gpu_work(torch, fn))
                    print(f"probe: {name}: {row['kernels_per_call']:g} kernel(s), {row['memcpy_per_call']:g} memcpy "
                          f"per call {row['kernel_names']}", flush=True)
            except Exception as e:  # noqa: BLE001
                row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
                print(f"probe: {name}: {row['error']}", flush=True)
        rows.append(row)
    if args.detect == "none":       # the nsys pass: one NVTX range per op, inside the capture range
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStart()
        for (name, fn, _), row in zip(ops, rows):
            if fn is None or row.get("error"):
                continue
            torch.cuda.nvtx.range_push(f"probe {name}")
            for _ in range(REPS):
                fn()
            torch.cuda.nvtx.range_pop()
            torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()
    else:
        for (_name, fn, _), row in zip(ops, rows):   # graph capture last: a failed capture cannot spoil the counts
            if fn is not None and not row.get("error"):
                row["graph"] = graph_ok(torch, fn)
        print_table(rows, f"torch.profiler, torch {torch.__version__}, NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}")
    out = {"source": "torch.profiler" if args.detect == "torch" else "nvtx-only", "torch": torch.__version__,
           "gpu": torch.cuda.get_device_name(dev), "numel": args.numel, "dtype": "bfloat16", "rows": rows,
           "env": {k: os.environ.get(k) for k in NO_MULTICAST}}
    if args.detect == "torch":
        out["summary"] = summary(rows)
        print("== " + out["summary"]["verdict"])
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(out, f, indent=2)
    try:
        dist.destroy_process_group()
    finally:
        if os.path.exists(store_file):     # FileStore may have removed it already
            os.unlink(store_file)
    return 0


if __name__ == "__main__":
    sys.exit(main())
