"""One command: build big SYNTHETIC inputs from our real traces, time `tracekit breakdown` on
them side by side with the floor and the peers, and write the table.

    python benchmarks/run.py --sizes 1M,5M,10M --kineto 100MB,1GB --ranks 4 --out benchmarks/out/

Every measurement is a subprocess run under ``/usr/bin/time -v`` (wall time, peak RSS), in
this one run, so ratios compare like with like on a noisy machine; with ``--repeat N`` the commands of
one input run in N rounds (each once per round) and each row keeps its median:

* nsys SQLite (benchmarks/make_nsys.py): ``tracekit breakdown --format json`` vs the floor
  (benchmarks/floor.py: a bare scan of the columns breakdown reads, by sqlite3 / ADBC /
  connectorx, the fastest counted as the floor). ``nsys stats`` runs on the GPU machine
  (benchmarks/device_nsys_stats.sh) and is merged from ``--nsys-stats JSON`` if given.
* Kineto JSON (benchmarks/make_kineto.py): breakdown vs a bare ``orjson`` parse vs HTA
  (``traceinsight`` in its own venv, ``--hta-python``; benchmarks/hta_bench.py).
* ranks: a directory of N copies of the 1M-kernel export, ``tracekit breakdown DIR``
  (one process per file) vs one file alone.

Results: ``OUT/results.json`` (every row) and ``OUT/table.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

import make_nsys  # noqa: E402

KINETO_SOURCES = [REPO / "sample_traces/hf-small-eager-torch/trace.json.gz"]


FLOOR_JSON = True  # --no-json-floor: skip the orjson parse (7.6 GB and ~40 s at 1 GB; it never changes)
REPEAT = 1  # --repeat: runs per measurement; the row keeps the median wall time (all runs listed in "walls")


def timed(cmd: list[str], label: str, env: dict | None = None, timeout: int = 3600) -> dict:
    """``cmd`` run REPEAT times: the median wall time, every wall time, the largest peak RSS, rc and the last
    stdout line of the last run."""
    return timed_interleaved([(cmd, label, env, timeout)])[0]


def timed_interleaved(specs: list[tuple]) -> list[dict]:
    """Each spec ``(cmd, label, env, timeout)`` run REPEAT times, in rounds: every command once per round, so a
    slow spell of this noisy machine hits the tool and its floor alike. Rows as :func:`timed` makes them."""
    runs: list[list[dict]] = [[] for _ in specs]
    for _ in range(REPEAT):
        for i, (cmd, label, env, timeout) in enumerate(specs):
            runs[i].append(_timed_once(cmd, label, env, timeout))
    rows = []
    for (_cmd, label, _env, _timeout), rs in zip(specs, runs):
        row = dict(rs[-1])
        walls = sorted(r["wall_s"] for r in rs)
        row["wall_s"] = walls[len(walls) // 2]
        row["walls"] = [r["wall_s"] for r in rs]
        row["rc"] = max(r["rc"] for r in rs)
        cpus = sorted(r["cpu_s"] for r in rs if r.get("cpu_s") is not None)
        row["cpu_s"] = cpus[len(cpus) // 2] if cpus else None
        row["cpus"] = [r.get("cpu_s") for r in rs]
        row["loads"] = [r.get("load1_before") for r in rs]
        rss = [r["peak_rss_mb"] for r in rs if r["peak_rss_mb"] is not None]
        row["peak_rss_mb"] = max(rss) if rss else None
        if REPEAT > 1:
            print(f"  {label:48s} median {row['wall_s']:.2f} s of {row['walls']}", flush=True)
        rows.append(row)
    return rows


def _timed_once(cmd: list[str], label: str, env: dict | None = None, timeout: int = 3600) -> dict:
    """Run ``cmd`` under /usr/bin/time -v; wall seconds, peak RSS (MB), rc and the last stdout line."""
    tfile = Path(os.environ.get("TMPDIR", "/tmp")) / f"tk_time_{os.getpid()}.txt"
    full = ["/usr/bin/time", "-v", "-o", str(tfile), *cmd]
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    try:
        p = subprocess.run(full, capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=timeout)
        rc, out, err = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired:
        rc, out, err = 124, "", "timeout"
    wall = time.perf_counter() - t0
    text = tfile.read_text() if tfile.exists() else ""
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", text)
    cpu = [float(m) for m in re.findall(r"(?:User|System) time \(seconds\): ([\d.]+)", text)]
    row = {"label": label, "cmd": " ".join(cmd), "rc": rc, "wall_s": round(wall, 3),
           "cpu_s": round(sum(cpu), 2) if len(cpu) == 2 else None,
           "peak_rss_mb": round(int(rss.group(1)) / 1024, 1) if rss else None, "load1_before": round(load, 2)}
    if rc != 0:
        row["stderr"] = err.strip()[-500:]
    elif (result := last_json(out)) is not None:
        row["result"] = result
    print(f"  {label:48s} rc={rc} {row['wall_s']:8.2f} s  {row['peak_rss_mb']} MB", flush=True)
    return row


def last_json(out: str) -> dict | None:
    """The command's result: its last non-empty line of output, where that is a JSON object (else None)."""
    lines = [ln for ln in out.strip().splitlines() if ln.strip()]
    if lines and lines[-1].startswith("{"):
        try:
            return json.loads(lines[-1])
        except ValueError:
            pass
    return None


def warm(path: Path) -> None:
    """Read ``path`` (a file, or every file of a folder) once, untimed, so that every timed run finds it in the page
    cache: the first round would otherwise pay the disk for whichever command runs first (a 10M-kernel export
    read cold took 76 s against 11 s warm on this VM)."""
    for f in ([path] if path.is_file() else sorted(p for p in path.iterdir() if p.is_file())):
        with open(f, "rb") as fh:
            while fh.read(1 << 24):
                pass


# --versions: other checkouts of tracekit timed in the same rounds as this one (label -> source folder).
VERSIONS: list[tuple[str, str]] = []


def _python_of(src: str | None, argv: list[str]) -> list[str]:
    """``python -m tracekit ARGV`` with this checkout, or with the tracekit of folder ``src`` (first on the path;
    the import is checked), so two versions run through the same interpreter and packages."""
    if src is None:
        return [sys.executable, "-m", "tracekit", *argv]
    code = (f"import sys, runpy; sys.path.insert(0, {src!r}); import tracekit; "
            f"assert tracekit.__file__.startswith({src!r}), tracekit.__file__; "
            "runpy.run_module('tracekit', run_name='__main__')")
    return [sys.executable, "-c", code, *argv]


def tracekit_cmd(path: Path, extra=(), src: str | None = None) -> list[str]:
    # Output goes to /dev/null via -o so the JSON rendering counts but a huge stdout does not.
    return _python_of(src, ["breakdown", str(path), "--format", "json", "-o", os.devnull, *extra])


def tracekit_specs(path: Path, group: str, timeout: int = 3600) -> tuple[list, list]:
    """``tracekit breakdown`` of ``path`` by every version of ``--versions``, then by this checkout."""
    specs, kinds = [], []
    for label, src in VERSIONS:
        specs.append((tracekit_cmd(path, src=src), f"{group}: tracekit breakdown [{label}]", None, timeout))
        kinds.append(f"tracekit@{label}")
    specs.append((tracekit_cmd(path), f"{group}: tracekit breakdown", None, timeout))
    kinds.append("tracekit")
    return specs, kinds


def size_label(n: int) -> str:
    return f"{n // 10**6}M" if n % 10**6 == 0 else str(n)


def bench_nsys(sizes: list[int], work: Path, engines: list[str], rows: list):
    for n in sizes:
        db = work / f"nsys_{size_label(n)}.sqlite"
        if not db.exists():
            info = make_nsys.make(make_nsys.default_source(), db, n)
            print(f"built {db} ({info['kernels']} kernels, {info['bytes'] / 1e9:.2f} GB, {info['seconds']} s)")
        group = f"nsys {size_label(n)}"
        warm(db)
        meta = {"group": group, "input": str(db), "input_bytes": db.stat().st_size, "kernels": n}
        specs, kinds = [], []
        for e in engines:
            if e == "sqlite3" and n != sizes[0]:
                continue  # ~10x slower than the Arrow engines: measured at the smallest size only
            for par in (False, True):
                how = "parallel" if par else "one connection"
                specs.append(([sys.executable, str(HERE / "floor.py"), "sqlite", str(db), "--engine", e,
                               *(["--parallel"] if par else [])], f"{group}: floor scan ({e}, {how})", None, 3600))
                kinds.append(f"floor:{e}" + (":parallel" if par else ""))
        more = tracekit_specs(db, group)
        specs += more[0]
        kinds += more[1]
        if n == sizes[0]:
            specs.append((tracekit_cmd(db), f"{group}: tracekit breakdown (sqlite3 only)",
                          {"TRACEKIT_SQLITE_ENGINES": "sqlite3"}, 3600))
            kinds.append("tracekit:sqlite3")
        rows.extend({**meta, **row, "kind": kind} for row, kind in zip(timed_interleaved(specs), kinds))
        rows[:] = [r for r in rows if r is not None]


def ranks_cmd(folder: Path, workers: int, cores: int | None = None) -> list[str]:
    """The per-file stage of ``tracekit breakdown DIR --engine process`` with ``workers`` processes, then the
    cross-rank comparison: what the command runs (``analyse_files`` + ``cross_rank``), with the pool's size set.
    ``cores``: the process (and so its workers) pinned to that many of its CPUs first, as ``taskset`` would."""
    # (the CPUs first, then the allocator set as the console script sets it for a directory of big exports, both
    # before polars is imported: polars sizes its thread pool by the CPUs it may use)
    pin = (f"import os; os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:{cores}]); " if cores else "")
    code = (pin + "import sys; from pathlib import Path; "
            "from tracekit.readers.nsys.scan import keep_freed_memory; keep_freed_memory([sys.argv[1]]); "
            "from tracekit.run.ranks import analyse_files, cross_rank; "
            "files = sorted(Path(sys.argv[1]).glob('*.sqlite')); "
            "cross_rank(analyse_files(files, engine='process', workers=int(sys.argv[2])))")
    return [sys.executable, "-c", code, str(folder), str(workers)]


def bench_ranks(n_ranks: int, size: int, work: Path, rows: list):
    """A folder of ``n_ranks`` copies of the ``size`` export: one file alone, the folder through the command
    (``--engine process``, one worker per core) and through the same per-file stage with 1 and 2 workers (does
    it scale with cores?), interleaved."""
    src = work / f"nsys_{size_label(size)}.sqlite"
    if not src.exists():
        make_nsys.make(make_nsys.default_source(), src, size)
    d = work / f"ranks_{n_ranks}x{size_label(size)}"
    d.mkdir(exist_ok=True)
    for i in range(n_ranks):
        f = d / f"rank{i}.sqlite"
        if not f.exists():
            shutil.copyfile(src, f)
    group = f"ranks {n_ranks}x{size_label(size)}"
    warm(d)
    warm(src)
    meta = {"group": group, "input": str(d), "input_bytes": src.stat().st_size * n_ranks, "kernels": size * n_ranks}
    specs = [(tracekit_cmd(src), f"{group}: one file", None, 3600),
             (tracekit_cmd(d), f"{group}: directory (process pool)", None, 3600),
             (ranks_cmd(d, 1), f"{group}: per-file stage, 1 worker", None, 3600),
             (ranks_cmd(d, 2), f"{group}: per-file stage, 2 workers", None, 3600)]
    kinds = ["tracekit:one", "tracekit", "ranks:1", "ranks:2"]
    if hasattr(os, "sched_setaffinity") and len(os.sched_getaffinity(0)) >= 2:
        # Scaling with cores: one worker on one core against two workers on two (the rows above give one worker
        # both cores, which its polars threads already use: process parallelism can add little there).
        specs.append((ranks_cmd(d, 1, cores=1), f"{group}: per-file stage, 1 worker on 1 core", None, 3600))
        kinds.append("ranks:1core")
    rows.extend({**meta, **row, "kind": kind} for row, kind in zip(timed_interleaved(specs), kinds))


def bench_kineto(sizes_mb: list[float], work: Path, hta_python: str | None, rows: list):
    source = next((p for p in KINETO_SOURCES if p.exists()), None)
    for mb in sizes_mb:
        label = f"{int(mb)}MB" if mb < 1000 else f"{mb / 1000:g}GB"
        js = work / f"kineto_{label}.json"
        if not js.exists():
            cmd = [sys.executable, str(HERE / "make_kineto.py"), "--size-mb", str(mb), "-o", str(js)]
            if source is not None:
                cmd += ["--source", str(source)]
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        group = f"kineto {label}"
        warm(js)
        meta = {"group": group, "input": str(js), "input_bytes": js.stat().st_size}
        specs = [([sys.executable, str(HERE / "floor.py"), "json", str(js)], f"{group}: floor parse (orjson)",
                  None, 3600)]
        kinds = ["floor:orjson"]
        if FLOOR_JSON is False:
            specs, kinds = [], []
        more = tracekit_specs(js, group)
        specs += more[0]
        kinds += more[1]
        if hta_python:
            specs.append(([hta_python, str(HERE / "hta_bench.py"), str(js), str(work / "hta")],
                          f"{group}: HTA load + temporal + kernel breakdown", None, 5400))
            kinds.append("hta")
        rows.extend({**meta, **row, "kind": kind} for row, kind in zip(timed_interleaved(specs), kinds))


def table(rows: list, nsys_stats: dict | None) -> str:
    """Markdown table. 'vs floor': against the fastest bare scan of any kind; for nsys also against the fastest
    one-connection scan (in parentheses)."""
    out = ["| input | size | what | wall s | CPU s | peak RSS MB | vs floor (time) | vs HTA (time / memory) |",
           "|---|---|---|---:|---:|---:|---:|---:|"]
    groups = list(dict.fromkeys(r["group"] for r in rows))
    for g in groups:
        rs = [r for r in rows if r["group"] == g]
        floors = [r for r in rs if r["kind"].startswith("floor") and r["rc"] == 0]
        floor = min(floors, key=lambda r: r["wall_s"]) if floors else None
        serial = [r for r in floors if not r["kind"].endswith(":parallel")]
        floor1 = min(serial, key=lambda r: r["wall_s"]) if serial and serial != floors else None
        hta = next((r for r in rs if r["kind"] == "hta" and r["rc"] == 0), None)
        for r in rs:
            vs_floor = f"{r['wall_s'] / floor['wall_s']:.2f}×" if floor and r["kind"].startswith("tracekit") else ""
            if vs_floor and floor1 is not None:
                vs_floor += f" ({r['wall_s'] / floor1['wall_s']:.2f}×)"
            vs_hta = ""
            if hta and r["kind"] == "tracekit" and r["peak_rss_mb"]:
                vs_hta = f"{hta['wall_s'] / r['wall_s']:.1f}× faster / {r['peak_rss_mb'] / hta['peak_rss_mb']:.2f}×"
            what = r["label"].split(": ", 1)[1] + ("" if r["rc"] == 0 else f" (rc {r['rc']})")
            size = f"{r['input_bytes'] / 1e9:.2f} GB" if r["input_bytes"] >= 1e8 else f"{r['input_bytes'] / 1e6:.0f} MB"
            cpu = f"{r['cpu_s']:.1f}" if r.get("cpu_s") is not None else ""
            out.append(f"| {g} | {size} | {what} | {r['wall_s']:.1f} | {cpu} | {r['peak_rss_mb']:.0f} | {vs_floor} | {vs_hta} |")
    if nsys_stats:
        out.append(f"| nsys 10M (GPU machine) | | nsys stats --report cuda_gpu_kern_sum | {nsys_stats['wall_s']} | | "
                   f"{nsys_stats['peak_rss_mb']} | | |")
    tk = {r["kernels"]: r["wall_s"] for r in rows if r["group"].startswith("nsys") and r["kind"] == "tracekit"}
    if len(tk) >= 2:
        lo, hi = min(tk), max(tk)
        out.append("")
        out.append(f"Growth: {size_label(lo)} → {size_label(hi)} kernels ({hi / lo:.0f}× the input): breakdown time "
                   f"×{tk[hi] / tk[lo]:.1f} (linear would be ×{hi / lo:.0f}); per million kernels: "
                   + ", ".join(f"{size_label(k)}: {tk[k] / (k / 1e6):.2f} s" for k in sorted(tk)))
    for g in dict.fromkeys(r["group"] for r in rows if r["group"].startswith("ranks")):
        by = {r["kind"]: r for r in rows if r["group"] == g and r["rc"] == 0}
        if "ranks:1" in by and "ranks:2" in by:
            one, two = by["ranks:1"], by["ranks:2"]
            out.append("")
            out.append(f"Scaling ({g}, --engine process): 1 worker {one['wall_s']:.1f} s, 2 workers {two['wall_s']:.1f} s: "
                       f"{one['wall_s'] / two['wall_s']:.2f}× faster on 2 workers (2 cores: at most 2×)")
            if "ranks:1core" in by:
                solo = by["ranks:1core"]
                out.append(f"With cores ({g}): 1 worker on 1 core {solo['wall_s']:.1f} s, 2 workers on 2 cores "
                           f"{two['wall_s']:.1f} s: {solo['wall_s'] / two['wall_s']:.2f}× (at most 2×)")
    return "\n".join(out) + "\n"


def _versions() -> dict:
    """The CPU model and the versions that matter for these figures."""
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    try:
        out["cpu"] = next(ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    for pkg in ("polars", "connectorx", "adbc-driver-sqlite", "msgspec", "pyarrow"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            pass
    try:
        out["commit"] = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                                       text=True).stdout.strip()
    except OSError:
        pass
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="1M,5M,10M", help="nsys kernel counts (empty: skip)")
    p.add_argument("--kineto", default="100MB,1GB", help="Kineto JSON sizes (empty: skip)")
    p.add_argument("--ranks", type=int, default=4, help="rank files for the directory run (0: skip)")
    p.add_argument("--engines", default="adbc,connectorx,sqlite3",
                   help="floor-scan engines (each one query at a time and in parallel)")
    p.add_argument("--hta-python", default="/tmp/hta-venv/bin/python",
                   help="python of a venv with traceinsight (HTA); '' to skip")
    p.add_argument("--nsys-stats", type=Path, default=None, help="JSON row from the GPU machine's nsys stats run")
    p.add_argument("--work", type=Path, default=Path("/tmp/tracekit-bench"), help="where big inputs are built")
    p.add_argument("--out", type=Path, default=HERE / "out")
    p.add_argument("--repeat", type=int, default=1, help="runs per measurement (the median wall time is kept)")
    p.add_argument("--versions", default="", help="LABEL=FOLDER,...: other tracekit checkouts timed in the same "
                   "rounds (e.g. main=/tmp/tracekit-main, from `git archive main | tar -x -C /tmp/tracekit-main`)")
    p.add_argument("--no-json-floor", action="store_true", help="skip the orjson floor of the Kineto inputs")
    p.add_argument("--ranks-size", default=None, help="kernels per rank file (default: the smallest --sizes)")
    p.add_argument("--no-byte-compile", action="store_true",
                   help="time tracekit's modules as found (this environment sets PYTHONDONTWRITEBYTECODE=1: every "
                        "timed process then compiles them from source, which no installed copy does); default: "
                        "byte-compile this checkout's and every --versions folder's tracekit first, as "
                        "benchmarks/startup.py does and pip does when it installs a wheel")
    a = p.parse_args(argv)
    global REPEAT, FLOOR_JSON
    REPEAT = max(1, a.repeat)
    FLOOR_JSON = not a.no_json_floor
    VERSIONS[:] = [(v.split("=", 1)[0], str(Path(v.split("=", 1)[1]).resolve())) for v in a.versions.split(",") if v]
    if not a.no_byte_compile:
        import compileall

        for src in [str(HERE.parent), *(src for _, src in VERSIONS)]:
            compileall.compile_dir(str(Path(src) / "tracekit"), quiet=1)
    a.work.mkdir(parents=True, exist_ok=True)
    a.out.mkdir(parents=True, exist_ok=True)
    hta = a.hta_python if a.hta_python and Path(a.hta_python).exists() else None
    rows: list = []
    machine = {"cpus": os.cpu_count(), "python": sys.version.split()[0],
               "mem_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
               **_versions(), "load_avg_before": [round(x, 2) for x in os.getloadavg()]}
    print(f"machine: {machine}")
    sizes = [make_nsys.parse_count(s) for s in a.sizes.split(",") if s.strip()]
    if sizes:
        bench_nsys(sizes, a.work, [e for e in a.engines.split(",") if e], rows)
    if a.ranks:
        bench_ranks(a.ranks, make_nsys.parse_count(a.ranks_size) if a.ranks_size else (sizes[0] if sizes else 10**6),
                    a.work, rows)
    mbs = [float(s.upper().replace("GB", "e3").replace("MB", "")) for s in a.kineto.split(",") if s.strip()]
    if mbs:
        bench_kineto(mbs, a.work, hta, rows)
    stats = json.loads(a.nsys_stats.read_text()) if a.nsys_stats else None
    machine["load_avg_after"] = [round(x, 2) for x in os.getloadavg()]
    run = {"argv": sys.argv[1:], "date": time.strftime("%Y-%m-%d %H:%M:%S"), "versions": VERSIONS,
           "byte_compiled": not a.no_byte_compile}
    (a.out / "results.json").write_text(json.dumps({"machine": machine, "run": run, "rows": rows,
                                                    "nsys_stats": stats}, indent=1))
    md = table(rows, stats)
    (a.out / "table.md").write_text(f"machine: {machine}\n\n" + md)
    print(md)


if __name__ == "__main__":
    main()
