"""Where the time of one ``tracekit breakdown`` goes: the stage table (seconds per function), in one process.

    python benchmarks/stages.py benchmarks/out/work/nsys_10M.sqlite -o benchmarks/results/X-stages.json

What it does, in order:

1. reads the trace as the command does (``tracekit.load(path, kernel_dims=False)``, polars' allocator set as the
   console script sets it: ``nsys_scan.keep_freed_memory``): wall and CPU seconds, peak RSS after the read;
2. runs the analysis as the command does (``breakdown(consume=True)`` + ``to_dict`` + the JSON text; its own
   threads on; the trace given back as it is copied): wall and CPU seconds, peak RSS after it;
3. runs it again on a fresh read under ``cProfile`` with the stages one after the other (``tracekit.parallel.in_threads`` made
   serial, so every stage's cost is its own) and reports, for every ``tracekit`` function that took at least
   ``--min`` seconds, its cumulative seconds (nested functions counted in their callers too) and its own
   ("self": outside any other profiled Python function, i.e. mostly in polars). The profiler's clock is CPU time
   of the whole process (``time.process_time``: polars' worker threads included), steadier than wall time on a
   shared machine; ``--timer wall`` for wall seconds. ``--read`` profiles the read the same way (serially).

``--memory`` instead samples the resident set every 10 ms while the trace is read and analysed, with the
``tracekit`` functions on the main thread's stack at that moment: the peak, the stack at the peak, and the most
resident memory seen inside each function (what holds the memory when it peaks).

The 1-minute load average is recorded before and after (a loaded machine stretches wall time, not CPU time).
"""

from __future__ import annotations

import argparse
import cProfile
import inspect
import json
import os
import platform
import pstats
import resource
import statistics
import sys
import time
from pathlib import Path

# TRACEKIT_SRC=/path/to/checkout: profile another checkout's tracekit (e.g. main, from `git archive`)
sys.path.insert(0, os.environ.get("TRACEKIT_SRC") or str(Path(__file__).resolve().parents[1]))

if __name__ == "__main__":  # (as the console script does, before polars is imported: the allocator's setting)
    try:
        from tracekit.readers.nsys.scan import keep_freed_memory
    except ImportError:  # (a checkout from before issue 25's sixth pass)
        pass
    else:
        keep_freed_memory(sys.argv[1:])


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _cpu() -> float:
    return time.process_time()


def _profile(fn, timer) -> tuple[object, list[dict], float]:
    prof = cProfile.Profile(timer)
    t0 = timer()
    prof.enable()
    try:
        out = fn()
    finally:
        prof.disable()
    total = timer() - t0
    st = pstats.Stats(prof)
    rows = []
    for (file, _line, func), (_cc, _nc, tt, ct, _callers) in st.stats.items():  # type: ignore[attr-defined]
        if "/tracekit/" not in file:
            continue
        mod = file.split("/tracekit/", 1)[1].removesuffix(".py").replace("/", ".")
        rows.append({"stage": f"{mod}.{func}", "cum_s": round(ct, 4), "self_s": round(tt, 4)})
    rows.sort(key=lambda r: -r["cum_s"])
    return out, rows, total


class _Sampler:
    """RSS every ``period`` s, with the tracekit functions on the main thread's stack (innermost last)."""

    def __init__(self, period: float = 0.01):
        import threading

        self.period, self.samples = period, []
        self.main = threading.get_ident()
        self.page = os.sysconf("SC_PAGE_SIZE")
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _stack(self) -> tuple[str, ...]:
        f = sys._current_frames().get(self.main)
        out = []
        while f is not None:
            file = f.f_code.co_filename
            if "/tracekit/" in file:
                mod = file.split("/tracekit/", 1)[1].removesuffix(".py").replace("/", ".")
                out.append(f"{mod}.{f.f_code.co_name}:{f.f_lineno}")
            f = f.f_back
        return tuple(reversed(out))

    def _run(self):
        with open("/proc/self/statm") as fh:
            while not self._stop.wait(self.period):
                fh.seek(0)
                rss = int(fh.read().split()[1]) * self.page / 2**20
                self.samples.append((time.perf_counter(), rss, self._stack()))

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()

    def report(self, top: int = 25) -> dict:
        if not self.samples:
            return {}
        t0 = self.samples[0][0]
        peak = max(self.samples, key=lambda s: s[1])
        by_fn: dict[str, float] = {}
        for _t, rss, stack in self.samples:
            for fr in stack:
                name = fr.rsplit(":", 1)[0]
                by_fn[name] = max(by_fn.get(name, 0.0), rss)
        inner: dict[str, float] = {}
        for _t, rss, stack in self.samples:
            if stack:
                inner[stack[-1]] = max(inner.get(stack[-1], 0.0), rss)
        return {"peak_rss_mb": round(peak[1], 1), "peak_at_s": round(peak[0] - t0, 2), "peak_stack": list(peak[2]),
                "innermost_line_max_rss_mb": dict(sorted(((k, round(v, 1)) for k, v in inner.items()),
                                                         key=lambda kv: -kv[1])[:top]),
                "timeline": [(round(t - t0, 2), round(r, 1), st[-1] if st else "") for t, r, st in self.samples[::10]]}


def kineto_parts(path: Path) -> dict:
    """CPU seconds of a Kineto read cut after each of its parts, no profiler: the JSON decoded into events
    (msgspec), + grouped by category, + their fields made into columns, + typed and assembled (the whole read)."""
    from tracekit.readers.kineto import columns as kc
    from tracekit.readers.kineto.reader import read_kineto
    from tracekit.readers.kineto.stream import Decoded, iter_chunks

    def decoded():
        for ev, _doc in iter_chunks(path, Decoded(path)):
            del ev

    def grouped():
        codes: dict = {None: 0}
        for ev, _doc in iter_chunks(path, Decoded(path)):
            kc._grouped(ev, codes)
            del ev

    def columns():
        codes: dict = {None: 0}
        names = {g: kc._Names(g) for g in kc._SPECS}
        for ev, _doc in iter_chunks(path, Decoded(path)):
            for g, evs in kc._grouped(ev, codes).items():
                kc._columns(g, evs, names[g], False)
            del ev

    out = {}
    for name, fn in (("decode", decoded), ("+ group", grouped), ("+ columns", columns),
                     ("+ typing and assembly (the read)", lambda: read_kineto(path, kernel_dims=False))):
        c0 = _cpu()
        fn()
        out[name] = round(_cpu() - c0, 3)
    return out


def _serial():
    """Make tracekit's in-analysis threads run their stages one after the other (for the profile): ``in_threads``
    serial, and a stage ``started`` beside the caller's run where it is started (cProfile sees one thread only)."""
    import tracekit.parallel as par

    orig, orig_started = par.in_threads, par.started

    def serial(*tasks, threads=True, per_cpu=1):
        return orig(*tasks, threads=False)

    def inline(task, threads=True):
        return orig_started(task, threads=False)

    par.in_threads, par.started = serial, inline
    for mod in list(sys.modules.values()):
        if getattr(mod, "__name__", "").startswith("tracekit."):
            if getattr(mod, "in_threads", None) is orig:
                mod.in_threads = serial
            if getattr(mod, "started", None) is orig_started:
                mod.started = inline
    return orig


def _median_rows(runs: list[list[dict]], least: float) -> list[dict]:
    """Stage rows of several profiles of one analysis: each stage's median cumulative and self seconds (0 in a run
    that lacks it), largest first, those of at least ``least`` cumulative seconds."""
    names = {r["stage"] for rows in runs for r in rows}
    by = [{} for _ in runs]
    for b, rows in zip(by, runs):
        for r in rows:  # (a name defined twice, e.g. a module's lambdas: its largest, as the report reads it)
            if r["cum_s"] > b.get(r["stage"], {"cum_s": -1.0})["cum_s"]:
                b[r["stage"]] = r
    out = []
    for n in names:
        cum = statistics.median(b[n]["cum_s"] if n in b else 0.0 for b in by)
        own = statistics.median(b[n]["self_s"] if n in b else 0.0 for b in by)
        if cum >= least:
            out.append({"stage": n, "cum_s": round(cum, 4), "self_s": round(own, 4)})
    return sorted(out, key=lambda r: (-r["cum_s"], r["stage"]))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("trace", type=Path)
    p.add_argument("--timer", choices=("cpu", "wall"), default="cpu")
    p.add_argument("--min", type=float, default=0.05, help="smallest cumulative seconds listed")
    p.add_argument("--profile-runs", type=int, default=1,
                   help="profile the analysis this many times and keep each stage's median (a page fault's price "
                        "moves from one run to the next on a shared VM)")
    p.add_argument("--read", action="store_true", help="profile the read too (serially)")
    p.add_argument("--no-profile", action="store_true", help="only the plain timings (steps 1 and 2)")
    p.add_argument("--memory", action="store_true", help="sample RSS with the stack instead of profiling")
    p.add_argument("-o", "--out", type=Path, default=None)
    a = p.parse_args(argv)
    if a.memory:
        a.no_profile = True

    with open(a.trace, "rb") as fh:  # in the page cache first, as benchmarks/run.py has it (a cold read is the disk's)
        while fh.read(1 << 24):
            pass
    load0 = os.getloadavg()[0]
    import polars as pl  # noqa: F401  (imported before the clocks start, as in the command)

    import tracekit
    from tracekit.options import AnalysisOptions
    from tracekit.run.pipeline import breakdown

    kwargs = AnalysisOptions().analysis_kwargs()
    timer = time.process_time if a.timer == "cpu" else time.perf_counter
    res: dict = {"trace": str(a.trace), "tracekit": str(Path(tracekit.__file__).parents[1]), "bytes": a.trace.stat().st_size, "date": time.strftime("%Y-%m-%d %H:%M"),
                 "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                             "polars": pl.__version__,
                             "mem_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)},
                 "timer": a.timer, "load_avg_1min_before": round(load0, 2)}

    sampler = _Sampler() if a.memory else None
    if sampler:
        sampler.__enter__()
    w0, c0 = time.perf_counter(), _cpu()
    trace = tracekit.load(a.trace, kernel_dims=False)
    res["read"] = {"wall_s": round(time.perf_counter() - w0, 3), "cpu_s": round(_cpu() - c0, 3),
                   "peak_rss_mb": round(_rss_mb(), 1), "kernels": trace.kernels.height,
                   "launches": trace.launches.height, "ops": trace.ops.height}
    print(f"read: {res['read']}", flush=True)

    box = {"trace": trace}
    del trace
    # (a checkout from before ``consume`` existed, given with TRACEKIT_SRC, analyses a trace it reads afresh too)
    own = {"consume": True} if "consume" in inspect.signature(breakdown).parameters else {}
    # (the analysis takes one options object; a checkout from before it took them as keywords)
    args = (AnalysisOptions(),) if "options" in inspect.signature(breakdown).parameters else ()
    kwargs = {} if args else kwargs

    def analysis():
        # (as the command runs it: the trace is the analysis' own, and it gives back the kernel columns it copies;
        # each profiled run below gets a fresh read)
        b = breakdown(box.pop("trace"), *args, **kwargs, **own)
        return json.dumps(b.to_dict())

    w0, c0 = time.perf_counter(), _cpu()
    text = analysis()
    res["analysis"] = {"wall_s": round(time.perf_counter() - w0, 3), "cpu_s": round(_cpu() - c0, 3),
                       "peak_rss_mb": round(_rss_mb(), 1), "json_bytes": len(text)}
    print(f"analysis: {res['analysis']}", flush=True)
    del text
    if sampler:
        sampler.__exit__(None, None, None)
        res["memory"] = sampler.report()
        m = res["memory"]
        print(f"\npeak {m['peak_rss_mb']} MB at {m['peak_at_s']} s in:")
        for fr in m["peak_stack"]:
            print(f"    {fr}")
        print("most RSS seen per innermost tracekit line:")
        for k, v in m["innermost_line_max_rss_mb"].items():
            print(f"  {v:8.1f}  {k}")

    if not a.no_profile:
        _serial()
        runs = []
        for _ in range(max(1, a.profile_runs)):
            box["trace"] = tracekit.load(a.trace, kernel_dims=False)
            runs.append(_profile(analysis, timer)[1:])
        res["analysis_profiled"] = {"total_s": round(statistics.median(t for _, t in runs), 3),
                                    "stages": _median_rows([r for r, _ in runs], a.min)}
        if len(runs) > 1:
            res["analysis_profiled"]["runs"] = len(runs)
            res["analysis_profiled"]["totals_s"] = [round(t, 3) for _, t in runs]
        if a.read and a.trace.suffix in (".json", ".gz"):
            res["kineto_read_parts_cpu_s"] = kineto_parts(a.trace)
            print(f"kineto read, CPU s by part: {res['kineto_read_parts_cpu_s']}", flush=True)
        if a.read:
            _, rows, total = _profile(lambda: tracekit.load(a.trace, kernel_dims=False), timer)
            res["read_profiled"] = {"total_s": round(total, 3), "stages": [r for r in rows if r["cum_s"] >= a.min]}
    res["load_avg_1min_after"] = round(os.getloadavg()[0], 2)
    for key in ("analysis_profiled", "read_profiled"):
        if key in res:
            print(f"\n{key}: {res[key]['total_s']:.2f} s ({a.timer})")
            for r in res[key]["stages"]:
                print(f"  {r['cum_s']:8.3f} {r['self_s']:8.3f}  {r['stage']}")
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
