"""Tables for docs/performance.md from the committed results in benchmarks/results/ (its cog blocks call these).

* :func:`current` — one row per input: the floor, tracekit (each version of the run), ratios, CPU, peak memory;
  from a ``benchmarks/run.py`` results file (``--versions`` rows included).
* :func:`targets` — issue 25's "done when", met or not, with the version measured in the same rounds;
  :func:`growth` and :func:`ranks` — 1M → 10M, and 1 vs 2 workers on a directory of rank files.
* :func:`runs` — several runs of the same code, one row each: every target's figure, and in how many runs it
  was met (a median at a target's edge is met in one run and missed in the next).
* :func:`stages` — where the time of one run goes: the read, then the analysis by function, from
  ``benchmarks/stages.py`` files (one column per file).

    python benchmarks/report.py benchmarks/results/2026-12-04-2core.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _load(path) -> dict:
    return json.loads(Path(path).read_text())


def _floor(rows: list[dict], kind: str) -> dict | None:
    return next((r for r in rows if r["kind"] == kind and r["rc"] == 0), None)


def machine_line(res: dict) -> str:
    m, run = res["machine"], res.get("run", {})
    load = m.get("load_avg_before", [None])[0], m.get("load_avg_after", [None])[0]
    return (f"{run.get('date', '?')[:10]}, {m['cpus']} cores ({m.get('cpu', '?')}), {m['mem_gb']} GB, Python "
            f"{m['python']}, polars {m.get('polars', '?')}, connectorx {m.get('connectorx', '?')}, commit "
            f"{m.get('commit', '?')}; 1-minute load average {load[0]} before the run, {load[1]} after")


def current(path, labels: dict[str, str] | None = None) -> str:
    """The summary table of a run.py results file: per input, the floor and each tracekit version (``labels``
    renames the kinds: ``{"tracekit@main": "main", "tracekit": "this"}``)."""
    res = _load(path)
    rows = res["rows"]
    labels = labels or {}
    out = ["| input | what | wall s | CPU s | peak RSS MB | × parallel scan (wall) |",
           "|---|---|---:|---:|---:|---:|"]
    for g in dict.fromkeys(r["group"] for r in rows):
        rs = [r for r in rows if r["group"] == g]
        par = _floor(rs, "floor:connectorx:parallel") or _floor(rs, "floor:adbc:parallel")
        for r in rs:
            k = r["kind"]
            if k.startswith("floor") and r is not par and k != "floor:orjson":
                continue
            if k in ("tracekit:sqlite3", "tracekit:one"):
                continue
            what = labels.get(k, r["label"].split(": ", 1)[1])
            ratio = f"{r['wall_s'] / par['wall_s']:.2f}×" if par and k.startswith("tracekit") else ""
            cpu = f"{r['cpu_s']:.1f}" if r.get("cpu_s") is not None else ""
            size = f"{r['input_bytes'] / 1e9:.2f} GB"
            out.append(f"| {g} ({size}) | {what} | {r['wall_s']:.1f} | {cpu} | {r['peak_rss_mb']:,.0f} | {ratio} |")
    return "\n".join(out) + "\n"


def growth(path, kind: str = "tracekit") -> str:
    rows = _load(path)["rows"]
    tk = {r["kernels"]: r for r in rows if r["group"].startswith("nsys") and r["kind"] == kind}
    if len(tk) < 2:
        return ""
    lo, hi = min(tk), max(tk)
    return (f"1M → 10M kernels (10× the input): wall ×{tk[hi]['wall_s'] / tk[lo]['wall_s']:.1f}, CPU "
            f"×{tk[hi]['cpu_s'] / tk[lo]['cpu_s']:.1f}, peak memory ×{tk[hi]['peak_rss_mb'] / tk[lo]['peak_rss_mb']:.1f}"
            f"; per million kernels {tk[lo]['wall_s'] / (lo / 1e6):.2f} s at 1M, {tk[hi]['wall_s'] / (hi / 1e6):.2f} s "
            f"at 10M")


def ranks(path) -> str:
    rows = _load(path)["rows"]
    by = {r["kind"]: r for r in rows if r["group"].startswith("ranks") and r["rc"] == 0}
    if "ranks:1" not in by or "ranks:2" not in by:
        return ""
    one, two = by["ranks:1"], by["ranks:2"]
    g = one["group"]
    out = (f"{g} (`--engine process`): 1 worker {one['wall_s']:.1f} s wall / {one['cpu_s']:.1f} s CPU, 2 workers "
           f"{two['wall_s']:.1f} s / {two['cpu_s']:.1f} s: {one['wall_s'] / two['wall_s']:.2f}× on 2 workers (rounds: "
           f"{', '.join(f'{a:.0f}/{b:.0f} s' for a, b in zip(one['walls'], two['walls']))} at load "
           f"{', '.join(f'{x:.1f}' for x in one.get('loads', []))})")
    if "ranks:1core" in by:
        solo = by["ranks:1core"]
        out += (f"; 1 worker on 1 core {solo['wall_s']:.1f} s wall / {solo['cpu_s']:.1f} s CPU: "
                f"{solo['wall_s'] / two['wall_s']:.2f}× from 1 core to 2 (rounds: "
                f"{', '.join(f'{a:.0f}/{b:.0f} s' for a, b in zip(solo['walls'], two['walls']))})")
    return out


# The analysis by stage: (function, what it does); top-level stages (summed for "the rest") and, indented, the
# costliest functions inside them. "A|B": the first of the functions a results file has (they were renamed);
# "A+B": the sum of those.
STAGES = [
    ("analyses.attribution.activities", "GPU activities: names and categories, each one's launch, one frame in time order"),
    ("  analyses.attribution._merge_by_start", "· the merge into time order (a gather of every column but those of one value)"),
    ("  analyses.attribution.launch_rows", "· the launch of each activity (`lookup.row_lookup`)"),
    ("  analyses.attribution.of", "· the step of each activity (by its launch; since the ninth pass made by the merge)"),
    ("analyses.attribution.windows_side", "step windows and the window of each launch"),
    ("analyses.phase.step_phases", "phase of each step"),
    ("analyses.drafting.detect_drafting", "drafting by structure"),
    ("analyses.steady.steady_exclusions", "steady state: kernel sequence of each step"),
    ("analyses.partition.serialise", "same-stream serialisation"),
    ("analyses.partition.unions|intervals.cumulative_union_lengths", "exact partition: unions by category"),
    ("analyses.partition.sums|analyses.partition._kernel_sums", "kernel time by category, launches"),
    ("analyses.partition._holes|analyses.partition._holes_piece+analyses.partition._gap_inputs"
     "+analyses.partition._gaps", "gaps by cause"),
    ("analyses.partition._largest", "the largest gaps, named"),
    ("  analyses.gaps.name_gaps", "· what the host was doing in each (candidates by binary search)"),
    ("analyses.collectives.step_communication", "collectives table"),
    ("results.breakdown._weight_bytes_from_trace|run.pipeline._weight_bytes_from_trace", "weight bytes from recorded shapes"),
]


def _stage_s(cum: dict, fn: str) -> float:
    """Seconds of a STAGES entry in one results file's profile (see STAGES for "|" and "+")."""
    for alt in fn.strip().split("|"):
        names = alt.split("+")
        if any(n in cum for n in names):
            return sum(cum.get(n, 0) for n in names)
    return 0.0


def stages(columns: dict[str, str]) -> str:
    """``columns``: heading -> a benchmarks/stages.py results file. The read and the whole analysis (wall / CPU,
    in the process as the command runs them), then the analysis by stage (CPU seconds, stages one after the other,
    under the profiler; "the rest" is every other line of the analysis)."""
    data = {h: _load(p) for h, p in columns.items()}
    heads = list(data)
    out = ["| stage | " + " | ".join(heads) + " |", "|---|" + "---:|" * len(heads)]
    out.append("| read the trace (wall / CPU) | " + " | ".join(
        f"{d['read']['wall_s']:.2f} / {d['read']['cpu_s']:.2f}" for d in data.values()) + " |")
    out.append("| **the analysis** (wall / CPU) | " + " | ".join(
        f"{d['analysis']['wall_s']:.2f} / {d['analysis']['cpu_s']:.2f}" for d in data.values()) + " |")
    cum = {h: {r["stage"]: r["cum_s"] for r in d.get("analysis_profiled", {}).get("stages", [])}
           for h, d in data.items()}
    out.append("| the analysis under the profiler, CPU | " + " | ".join(
        f"{d.get('analysis_profiled', {}).get('total_s', 0):.2f}" for d in data.values()) + " |")
    for fn, what in STAGES:
        out.append(f"| {what} | " + " | ".join(f"{_stage_s(cum[h], fn):.2f}" for h in heads) + " |")
    rest = []
    for h, d in data.items():
        top = sum(_stage_s(cum[h], fn) for fn, _ in STAGES if not fn.startswith(" "))
        rest.append(f"{d.get('analysis_profiled', {}).get('total_s', 0) - top:.2f}")
    out.append("| the rest (per-step table, roofline, advice, JSON) | " + " | ".join(rest) + " |")
    out.append("| peak RSS after the read / after the analysis, MB | " + " | ".join(
        f"{d['read']['peak_rss_mb']:,.0f} / {d['analysis']['peak_rss_mb']:,.0f}" for d in data.values()) + " |")
    return "\n".join(out) + "\n"


# Issue 25's figures for the version it was filed against (2026-12-03, the same machine), for the targets table.
ISSUE_25 = {"nsys 10M": "13.4–14.4 s, 3.1× the parallel scan, 3.48 GB", "nsys 1M": "1.7 s, 2.4×",
            "kineto 1GB": "8.0 s, 805 MB"}


def _by(rows: list[dict], group: str) -> dict[str, dict]:
    return {r["kind"]: r for r in rows if r["group"] == group and r["rc"] == 0}


def _scan_and(rows: list[dict], group: str, kind: str = "tracekit") -> tuple[dict | None, dict | None]:
    """The parallel scan's row of ``group`` (connectorx, else ADBC) and ``kind``'s row (None where missing)."""
    by = _by(rows, group)
    return by.get("floor:connectorx:parallel") or by.get("floor:adbc:parallel"), by.get(kind)


def targets(path, before: str = "tracekit@before") -> str:
    """Issue 25's "done when", one row per target: the version measured in the same rounds (``before``), this
    checkout, and whether the target is met (by this checkout's medians)."""
    rows = _load(path)["rows"]
    out = ["| target (issue 25) | issue's figure (2026-12-03) | before this pass (same rounds) | now | met? |",
           "|---|---|---:|---:|---|"]

    def ratio(g, kind):
        par, r = _scan_and(rows, g, kind)
        return (r["wall_s"] / par["wall_s"], r) if r and par else (None, r)

    def cell(x, r, mem=False):
        if r is None:
            return "—"
        s = f"{r['wall_s']:.1f} s" + (f", {x:.2f}×" if x is not None else "")
        return s + (f", {r['peak_rss_mb'] / 1000:.2f} GB" if mem else "")

    for g, limit, mem_gb in (("nsys 10M", 1.5, 2.5), ("nsys 1M", 1.5, None)):
        xb, rb = ratio(g, before)
        xn, rn = ratio(g, "tracekit")
        if rn is None:
            continue
        out.append(f"| {g}: ≤ {limit}× the parallel scan | {ISSUE_25[g]} | {cell(xb, rb)} | {cell(xn, rn)} | "
                   f"{'yes' if xn <= limit else 'no'} |")
        if mem_gb:  # (the memory target on a row of its own: it is met or not on its own)
            def gb(r):
                return f"{r['peak_rss_mb'] / 1000:.2f} GB" if r else "—"
            out.append(f"| {g}: peak ≤ {mem_gb} GB | | {gb(rb)} | {gb(rn)} | "
                       f"{'yes' if rn['peak_rss_mb'] / 1000 <= mem_gb else 'no'} |")
    k = _by(rows, "kineto 1GB")
    if "tracekit" in k:
        rb, rn = k.get(before), k["tracekit"]
        ok = rn["wall_s"] <= 5 and rn["peak_rss_mb"] <= 400

        def fmt(r):
            return f"{r['wall_s']:.1f} s, {r['peak_rss_mb']:,.0f} MB" if r else "—"
        out.append(f"| Kineto 1 GB: ≤ 5 s and ≤ 0.4 GB | {ISSUE_25['kineto 1GB']} | {fmt(rb)} | {fmt(rn)} | "
                   f"{'yes' if ok else 'no'} |")
    one, ten = _by(rows, "nsys 1M"), _by(rows, "nsys 10M")
    if "tracekit" in one and "tracekit" in ten:
        def grow(kind):
            return (f"×{ten[kind]['wall_s'] / one[kind]['wall_s']:.1f} time, "
                    f"×{ten[kind]['peak_rss_mb'] / one[kind]['peak_rss_mb']:.1f} memory") if kind in one and kind in ten else "—"
        ok = ten["tracekit"]["wall_s"] / one["tracekit"]["wall_s"] <= 10
        out.append(f"| growth 1M → 10M no worse than linear (×10) | | {grow(before)} | {grow('tracekit')} | "
                   f"{'yes' if ok else 'no'} |")
    rk = {r["kind"]: r for r in rows if r["group"].startswith("ranks") and r["rc"] == 0}
    if "ranks:1core" in rk and "ranks:2" in rk:  # (since the eighth pass: the cores given, as well as the workers)
        s = rk["ranks:1core"]["wall_s"] / rk["ranks:2"]["wall_s"]
        out.append(f"| {rk['ranks:2']['group']}, `--engine process`: scales with cores (1 worker on 1 core vs 2 "
                   f"workers on 2) | | | {rk['ranks:1core']['wall_s']:.1f} s → {rk['ranks:2']['wall_s']:.1f} s, "
                   f"×{s:.2f} | {'yes' if s >= 1.5 else 'partly' if s > 1.1 else 'no'} |")
    elif "ranks:1" in rk and "ranks:2" in rk:
        s = rk["ranks:1"]["wall_s"] / rk["ranks:2"]["wall_s"]
        out.append(f"| {rk['ranks:1']['group']}, `--engine process`: scales with cores (1 vs 2 workers) | | | "
                   f"{rk['ranks:1']['wall_s']:.1f} s → {rk['ranks:2']['wall_s']:.1f} s, ×{s:.2f} | "
                   f"{'yes' if s >= 1.5 else 'partly' if s > 1.1 else 'no'} |")
    return "\n".join(out) + "\n"


def runs(paths: list[str]) -> str:
    """One row per ``run.py`` results file (runs of the same code): when, each target's figure, and how many of
    the runs met it. The targets of issue 25 are medians of one invocation; a figure at a target's edge is met in
    some runs and not others, which one run's table cannot show."""
    head = ["| run (start) | 10M: scan → tracekit (≤ 1.5×) | 10M peak (≤ 2.5 GB) | 1M (≤ 1.5×) "
            "| Kineto 1 GB (≤ 5 s, ≤ 0.4 GB) | 16 ranks, 1 core → 2 (scales) |",
            "|---|---:|---:|---:|---:|---:|"]
    met = {k: 0 for k in ("10M", "peak", "1M", "kineto", "ranks")}
    out = []
    for path in paths:
        res = _load(path)
        rows = res["rows"]

        p10, t10 = _scan_and(rows, "nsys 10M")
        p1, t1 = _scan_and(rows, "nsys 1M")
        k = _by(rows, "kineto 1GB").get("tracekit")
        rk = {r["kind"]: r for r in rows if r["group"].startswith("ranks") and r["rc"] == 0}
        x10, x1 = t10["wall_s"] / p10["wall_s"], t1["wall_s"] / p1["wall_s"]
        sc = rk["ranks:1core"]["wall_s"] / rk["ranks:2"]["wall_s"] if "ranks:1core" in rk and "ranks:2" in rk else None
        ok = {"10M": x10 <= 1.5, "peak": t10["peak_rss_mb"] <= 2500, "1M": x1 <= 1.5,
              "kineto": k is not None and k["wall_s"] <= 5 and k["peak_rss_mb"] <= 400,
              "ranks": sc is not None and sc >= 1.5}
        for key, v in ok.items():
            met[key] += v

        def mark(key, ok=ok):
            return "" if ok[key] else " (missed)"
        out.append(
            f"| `{Path(path).name}` ({res['run']['date'][5:16]}) | {p10['wall_s']:.1f} → {t10['wall_s']:.1f} s: "
            f"**{x10:.2f}×**{mark('10M')} | {t10['peak_rss_mb'] / 1000:.2f} GB{mark('peak')} | {x1:.2f}×{mark('1M')} | "
            + (f"{k['wall_s']:.1f} s, {k['peak_rss_mb']:,.0f} MB{mark('kineto')}" if k else "—")
            + " | " + (f"×{sc:.2f}{mark('ranks')}" if sc is not None else "—") + " |")
    n = len(paths)
    out.append(f"| **met in** | {met['10M']} of {n} | {met['peak']} of {n} | {met['1M']} of {n} | {met['kineto']} of {n} "
               f"| {met['ranks']} of {n} |")
    return "\n".join(head + out) + "\n"


if __name__ == "__main__":
    for p in sys.argv[1:]:
        print(machine_line(_load(p)))
        print(current(p))
        print(growth(p))
        print(ranks(p))
        print(targets(p))
    if len(sys.argv) > 2:
        print(runs(sys.argv[1:]))
