"""Scaling with cores on a machine with many of them (the lent GPU host: 16 cores), SYNTHETIC inputs.

The 2-core CI class of machine can only show 1 core -> 2 cores. Here:

* ranks: a directory of N copies of the 1M-kernel export (benchmarks/make_nsys.py), the per-file stage of
  ``tracekit breakdown DIR --engine process`` (run.py's ``ranks_cmd``) with W workers pinned to W cores, for each W
  of ``--workers``; then one worker given every core, with the console script's allocator setting (``narenas:1``)
  and with ``--arenas`` instead (is one arena per process a lock that many polars threads wait on?); and the
  command itself on the whole machine;
* optionally (``--big 10M``) one big export: ``tracekit breakdown`` against the floor scan (benchmarks/floor.py,
  each engine installed, in parallel), as run.py times it.

Every command runs ``--repeat`` times in interleaved rounds (run.py's ``timed_interleaved``); wall, CPU and page
faults come from the children's ``getrusage`` (no ``/usr/bin/time`` needed). Writes one JSON file (rows as run.py makes them, plus the machine):

    python benchmarks/cores.py --work /tmp/bw --ranks 16 --size 1M --workers 1,2,4,8,16 --big 10M -o cores.json

Where the kernel does not enforce CPU affinity (gVisor keeps the mask but schedules as it likes), W "cores" still
sizes every pool (polars' threads, the workers) by W; the CPU seconds in each row say what was used.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import make_nsys  # noqa: E402
import run  # noqa: E402


def _timed_once(cmd: list[str], label: str, env: dict | None = None, timeout: int = 3600) -> dict:
    """One run of ``cmd``: wall, CPU (user + system) and peak RSS of the process tree, from ``wait4``."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, **(env or {})})
    out, err = p.communicate(timeout=timeout)
    wall = time.perf_counter() - t0
    # (communicate() reaped it: the tree's usage is the difference of RUSAGE_CHILDREN around it, max RSS aside)
    import resource

    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    row = {"label": label, "rc": p.returncode, "wall_s": round(wall, 3), "cpu_total": ru.ru_utime + ru.ru_stime,
           "faults_total": ru.ru_minflt, "peak_rss_mb": round(ru.ru_maxrss / 1024, 1)}
    if p.returncode:
        row["stderr"] = err.decode(errors="replace")[-500:]
    if (result := run.last_json(out.decode(errors="replace"))) is not None:
        row["result"] = result
    print(f"  {label:56s} rc={p.returncode} {wall:8.2f} s", flush=True)
    return row


_LAST = {"cpu": 0.0, "faults": 0}


def _timed(cmd, label, env=None, timeout=3600):
    row = _timed_once(cmd, label, env, timeout)
    row["cpu_s"] = round(row.pop("cpu_total") - _LAST["cpu"], 2)
    row["faults"] = row.pop("faults_total") - _LAST["faults"]
    _LAST["cpu"] += row["cpu_s"]
    _LAST["faults"] += row["faults"]
    # (RUSAGE_CHILDREN's max RSS is the largest of any child so far, not this one's: kept only as an upper bound)
    row["peak_rss_mb_upper"] = row.pop("peak_rss_mb")
    row["peak_rss_mb"] = None
    return row


def machine() -> dict:
    info = {"cpus": os.cpu_count(), "usable_cpus": len(os.sched_getaffinity(0)), "platform": platform.platform(),
            "python": sys.version.split()[0]}
    try:
        import polars as pl

        info["polars"] = pl.__version__
    except ImportError:
        pass
    for m in ("connectorx", "adbc_driver_sqlite"):
        try:
            info[m] = __import__(m).__version__
        except Exception:  # noqa: BLE001 - not installed, or no version
            info[m] = None
    try:
        info["cpu_model"] = next(ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo")
                                 if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return info


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", type=Path, required=True)
    p.add_argument("--ranks", type=int, default=16)
    p.add_argument("--size", default="1M")
    p.add_argument("--workers", default="1,2,4,8,16")
    p.add_argument("--arenas", default="dirty_decay_ms:5000,muzzy_decay_ms:5000",
                   help="_RJEM_MALLOC_CONF of the rows marked 'arenas' (the console script's decay without "
                        "narenas:1 and oversize_threshold:0)")
    p.add_argument("--big", default=None, help="also time breakdown of one export of this many kernels vs the floor")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("-o", "--out", type=Path, required=True)
    a = p.parse_args(argv)
    run.REPEAT = a.repeat
    run._timed_once = _timed  # (wait4 accounting, per run)
    a.work.mkdir(parents=True, exist_ok=True)
    size = make_nsys.parse_count(a.size)
    src = a.work / f"nsys_{run.size_label(size)}.sqlite"
    t = time.perf_counter()
    if not src.exists():
        make_nsys.make(make_nsys.default_source(), src, size)
    d = a.work / f"ranks_{a.ranks}x{run.size_label(size)}"
    d.mkdir(exist_ok=True)
    for i in range(a.ranks):
        f = d / f"rank{i}.sqlite"
        if not f.exists():
            shutil.copyfile(src, f)
    print(f"inputs made in {time.perf_counter() - t:.1f} s", flush=True)
    run.warm(d)
    cpus = len(os.sched_getaffinity(0))
    workers = [w for w in (int(x) for x in a.workers.split(",")) if w <= cpus]
    group = f"ranks {a.ranks}x{run.size_label(size)}"
    specs, kinds = [], []
    for w in workers:
        specs.append((run.ranks_cmd(d, w, cores=w), f"{group}: {w} workers on {w} cores", None, 3600))
        kinds.append(f"ranks:{w}on{w}")
    wide = workers[-1]
    # One process with many polars threads: where one allocator arena could be a lock they wait on.
    specs.append((run.ranks_cmd(d, 1, cores=wide), f"{group}: 1 worker on {wide} cores", None, 3600))
    kinds.append(f"ranks:1on{wide}")
    specs.append((run.ranks_cmd(d, 1, cores=wide), f"{group}: 1 worker on {wide} cores, arenas {a.arenas}",
                  {"_RJEM_MALLOC_CONF": a.arenas}, 3600))
    kinds.append(f"ranks:1on{wide}:arenas")
    specs.append((run.tracekit_cmd(d), f"{group}: the command, whole machine", None, 3600))
    kinds.append("tracekit")
    rows = [{"group": group, "kind": k, **r} for r, k in zip(run.timed_interleaved(specs), kinds)]
    a.out.write_text(json.dumps({"machine": machine(), "rows": rows}, indent=1))  # (kept if the big run is cut short)
    if a.big:
        n = make_nsys.parse_count(a.big)
        big = a.work / f"nsys_{run.size_label(n)}.sqlite"
        t = time.perf_counter()
        if not big.exists():
            make_nsys.make(make_nsys.default_source(), big, n)
        print(f"{big.name} made in {time.perf_counter() - t:.1f} s", flush=True)
        run.warm(big)
        g = f"nsys {run.size_label(n)}"
        engines = [e for e in ("connectorx", "adbc") if machine().get(e if e == "connectorx" else "adbc_driver_sqlite")]
        specs = [([sys.executable, str(HERE / "floor.py"), "sqlite", str(big), "--engine", e, "--parallel"],
                  f"{g}: floor scan ({e}, parallel)", None, 3600) for e in engines]
        kinds = [f"floor:{e}:parallel" for e in engines]
        specs.append((run.tracekit_cmd(big), f"{g}: tracekit breakdown", None, 3600))
        kinds.append("tracekit")
        specs.append((run.tracekit_cmd(big), f"{g}: tracekit breakdown, arenas {a.arenas}",
                      {"_RJEM_MALLOC_CONF": a.arenas}, 3600))
        kinds.append("tracekit:arenas")
        rows += [{"group": g, "kind": k, **r} for r, k in zip(run.timed_interleaved(specs), kinds)]
    a.out.write_text(json.dumps({"machine": machine(), "rows": rows}, indent=1))
    base = {r["kind"]: r for r in rows if r["group"] == group and r["rc"] == 0}
    one = base.get("ranks:1on1")
    for w in workers:
        r = base.get(f"ranks:{w}on{w}")
        if one and r:
            print(f"{w:3d} workers on {w:3d} cores: {r['wall_s']:6.2f} s, ×{one['wall_s'] / r['wall_s']:.2f} "
                  f"(CPU {r['cpu_s']} s)")


if __name__ == "__main__":
    main()
