"""Markdown (made to be pasted into a pull request) and CSV renderers.

Stable output: the same trace gives the same text byte for byte. Untrusted names go
through ``report.safe.md`` so they cannot inject HTML or break a table.
"""

from __future__ import annotations

import csv
import io

from tracekit.categories import GAP_CAUSES, KERNEL_CATEGORIES, STEP_CATEGORIES
from tracekit.report.safe import md, plain
from tracekit.text import MISSING, distinct_short, num
from tracekit.tokens import tok_s_unit

SPLIT_ORDER = list(STEP_CATEGORIES)


def split_rows(b):
    """(category, ms/step, % of the traced step, kernel ms/step) rows in display order (from the JSON numbers)."""
    d = b.to_dict()
    mean = d["steps"]["mean_ms"]
    rows = []
    for k in SPLIT_ORDER:
        ms = d["per_step_ms"].get(k)
        kms = d["kernel_ms_per_step"].get(k)
        pct = None if ms is None or not mean else 100 * ms / mean
        rows.append((k, ms, pct, kms))
    return rows


def gap_rows(b):
    """(cause, ms/step, % of the traced step) rows of ``gaps`` in display order."""
    d = b.to_dict()
    mean = d["steps"]["mean_ms"]
    return [(k, d["gaps"][k], None if not mean else 100 * d["gaps"][k] / mean) for k in GAP_CAUSES]


def biggest_category(b):
    best = None
    for k in KERNEL_CATEGORIES:
        v = b.per_step_ms.get(k)
        if v is not None and (best is None or v > b.per_step_ms[best]):
            best = k
    return best


def ranked_levers(b) -> list[str]:
    """The applicable levers with a positive saving, largest first, as the analysis ranked them."""
    return list(b.ranked_levers)


def headline(b) -> str:
    """The analysis' one-line summary (computed there, never here)."""
    return b.headline


def verdict_lines(b) -> list[str]:
    """Verdicts ranked by the time they would save; the rest after; memory-bandwidth context last."""
    adv = b.to_dict()["advice"]
    return list(dict.fromkeys(adv[k]["verdict"] for k in b.display_levers if k in adv))  # each said once


# how each advice.drafting.detection reads in the speculation line
_DETECTION = {"ranges": "found from draft ranges", "engine": "found from the engine's annotations",
              "structure": "found by structure (a draft model's forwards)",
              "kernels": "found from speculative kernels", "not_detected": "not detected"}


def speculation_line(d: dict) -> str | None:
    """The speculation evidence in one line (``advice.drafting``: ``detection`` and ``evidence``), or None when the
    lever records neither: 'speculation: found from draft ranges — <evidence>; <evidence>'."""
    a = (d.get("advice") or {}).get("drafting") or {}
    detection, evidence = a.get("detection"), a.get("evidence") or []
    if not detection and not evidence:
        return None
    how = _DETECTION.get(detection, str(detection).replace("_", " ")) if detection else "evidence"
    if a.get("speculative") and detection == "not_detected":
        how = "speculative, draft phase not found"  # (speculative: true never reads "not detected")
    return f"speculation: {how}" + (" — " + "; ".join(evidence) if evidence else "")


def time_base_line(d: dict) -> str:
    """What every saving is stated against, for a PR reader."""
    tb = d["time_base"]
    if tb["unprofiled_step_ms"] is not None:
        return (f"unprofiled step {tb['unprofiled_step_ms']:.3f} ms ({tb['unprofiled_source']}); traced "
                f"{tb['traced_step_ms']:.3f} ms ({tb['profiler_inflation']:.2f}x): savings are against the unprofiled "
                "step")
    if tb.get("rejected_unprofiled_step_ms") is not None:
        return (f"the unprofiled step given ({tb['rejected_unprofiled_step_ms']:.3f} ms) is longer than the traced "
                f"{tb['traced_step_ms']:.3f} ms step, which is impossible (see the warning): savings are upper bounds "
                "on the traced step")
    return (f"no unprofiled time: savings are upper bounds on the traced {tb['traced_step_ms']:.3f} ms step (pass "
            "--measured-step-ms or --measured-tok-s)")


# The kernel time outside the analysed steps is named in the reports when, beyond the last step's (excluded by rule:
# one step's worth in every trace), it is at least this share of the device's kernel time.
OUTSIDE_NOTABLE = 0.05


def coverage_line(d: dict) -> str | None:
    """The device's kernel time outside the analysed steps, by reason, in words, when it is notable
    (:data:`OUTSIDE_NOTABLE`); None otherwise or without ``coverage``.

    >>> print(coverage_line({"coverage": {"kernel_ms_total": 100.0, "kernel_ms_in_steps": 60.0,
    ...     "kernel_ms_outside_steps": 40.0, "outside_by_reason": {"before the first step": 34.0,
    ...     "last step (no following step)": 6.0}}}))
    kernel time outside the analysed steps: 40.000 of 100.000 ms (40.0% of the GPU's kernel time): before the first step 34.000 ms, last step (no following step) 6.000 ms
    """
    from tracekit.categories import LAST_STEP

    cov = d.get("coverage")
    if not cov or not cov["kernel_ms_total"]:
        return None
    total, out = cov["kernel_ms_total"], cov["kernel_ms_outside_steps"]
    if out - cov["outside_by_reason"].get(LAST_STEP, 0.0) < OUTSIDE_NOTABLE * total:
        return None
    why = ", ".join(f"{r} {ms:.3f} ms" for r, ms in cov["outside_by_reason"].items())
    return (f"kernel time outside the analysed steps: {out:.3f} of {total:.3f} ms ({100 * out / total:.1f}% of the "
            f"GPU's kernel time): {why}")


def gap_where(g: dict) -> str:
    before = g.get("before")
    what = f"{before['kind']} {md(before['name'], 80)}" if before else MISSING
    return f"| {g['step']} | {g['at_ms']:.3f} | {g['ms']:.3f} | {g['cause'].replace('_', ' ')} | {g['where']} | {what} |"


def breakdown_md(b) -> str:
    d = b.to_dict()
    st, roof, gpu = d["steps"], d["roofline"], d["gpu"]
    out = [f"### tracekit: {md(headline(b), 1000)}", "", f"*{md(time_base_line(d), 500)}*", ""]
    outside = coverage_line(d)
    if outside:
        out += [md(outside, 1000), ""]
    for line in verdict_lines(b):
        out.append(f"- {md(line, 1000)}")
    spec = speculation_line(d)
    if spec:
        out += ["", f"*{md(spec, 2000)}*"]
    out += ["", "| category | ms / step | % of traced step | kernel ms / step |", "|---|---:|---:|---:|"]
    for name, ms, share, kms in split_rows(b):
        out.append(f"| {name} | {num(ms)} | {MISSING if share is None else f'{share:.1f}%'} | {num(kms)} |")
    out.append(f"| **traced step** | **{num(st['mean_ms'])}** | 100.0% | |")
    out += ["", "| gaps by cause | ms / step | % of traced step |", "|---|---:|---:|"]
    for name, ms, share in gap_rows(b):
        out.append(f"| {name.replace('_', ' ')} | {num(ms)} | {MISSING if share is None else f'{share:.1f}%'} |")
    out += ["", "<details><summary>details</summary>", ""]
    out.append(f"- trace: {md(d['source']['path'], 200)} ({d['source']['format']}, "
               f"{md(d['source']['producer_version'] or 'unknown version')}, graph trace mode "
               f"{d['source']['graph_trace_mode']})")
    out.append(f"- GPU {gpu['device']}: {md(gpu['name'] or 'unknown')}, peak {num(gpu['peak_bw_gbps'], 0)} GB/s "
               f"({gpu['peak_bw_source'] or 'unknown'})")
    pattern = f", pattern {md(st['pattern'])}" if st["pattern"] else ""
    why = "; ".join(f"{k}: {v}" for k, v in st["excluded_reasons"].items())
    out.append(f"- steps: {st['count']} analysed ({st['phase']}), {st['excluded']} excluded"
               f"{f' ({md(why)})' if why else ''} (marker {st['marker']}{pattern}); traced mean {num(st['mean_ms'])} ms, "
               f"median {num(st['median_ms'])}, p10 {num(st['p10_ms'])}, p90 {num(st['p90_ms'])}")
    if roof.get("weight_bytes_per_step") is not None:
        out.append(f"- roofline: {roof['weight_bytes_per_step']:,} weight bytes/step per GPU "
                   f"({roof['weight_bytes_source']}); floor {num(roof['floor_ms'])} ms; ceiling "
                   f"{num(roof['ceiling_tokens_per_s'], 1)} {tok_s_unit(roof)}; fraction of ceiling "
                   f"{num(roof['fraction_of_ceiling'], 3)}"
                   f"; gemm achieved {num(roof['gemm_achieved_bw_gbps'], 0)} GB/s")
    largest = d["gaps"]["largest"]
    if largest:
        out += ["", "| largest gaps: step | at ms | ms | cause | before | host was in |",
                "|---:|---:|---:|---|---|---|"]
        out += [gap_where(g) for g in largest]
    top = b.top_kernels.head(10)
    if top.height:
        n = max(1, st["count"])
        out += ["", "| top kernels | category | per step | ms / step | mean µs |", "|---|---|---:|---:|---:|"]
        names = distinct_short([plain(x, 4000) for x in top["name"]], 90)  # (two kernels never cut to one name)
        for name, r in zip(names, top.iter_rows(named=True)):
            out.append(f"| {md(name, 200)} | {r['category']} | {r['count'] / n:.1f} | {num(r['per_step_ms'])} | "
                       f"{num(r['mean_us'], 1)} |")
    if d["warnings"]:
        out += ["", "warnings:"]
        out += [f"- {md(w, 500)}" for w in d["warnings"]]
    out += ["", "</details>", ""]
    return "\n".join(out)


def breakdown_csv(b) -> str:
    buf = io.StringIO()
    cols = ["step", "start_ns", "end_ns", "period_ms", *SPLIT_ORDER, *GAP_CAUSES, "n_kernels", "phase"]
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(cols)
    for row in b.per_step.select(cols).iter_rows():
        w.writerow(["" if v is None else (f"{v:.6f}" if isinstance(v, float) else v) for v in row])
    return buf.getvalue()


def info_md(result: dict) -> str:
    if "ranks" in result:
        return "\n".join(info_md(r) for r in result["ranks"]) + ("\n" + _table_md(result) if "table" in result else "")
    s = result["source"]
    out = [f"### {md(s['path'], 200)}", "",
           f"{s['format']}, {md(s['producer_version'] or 'unknown version')}, CUDA-graph trace mode "
           f"{s['graph_trace_mode']}", "", "| device | GPU | peak BW (GB/s) |", "|---:|---|---:|"]
    for g in result["gpus"]:
        out.append(f"| {g['device']} | {md(g['name'] or 'unknown')} | {num(g['peak_bw_gbps'], 0)} |")
    c = result["counts"]
    out += ["", "| " + " | ".join(c) + " |", "|" + "---:|" * len(c), "| " + " | ".join(f"{v:,}" for v in c.values()) + " |"]
    cands = result.get("step_candidates", result["range_names"])
    if cands:
        out += ["", "| step candidate | count | GPU time | --step-range |", "|---|---:|---:|---|"]
        for r in cands:
            share = f"{100 * r['gpu_share']:.0f}%" if r.get("gpu_share") is not None else ""
            out.append(f"| {md(r['pattern'])} | {r['count']:,} | {share} | {md(r['regex'])} |")
    if result["warnings"]:
        out += [""] + [f"- warning: {md(w, 500)}" for w in result["warnings"]]
    return "\n".join(out) + "\n"


def kernels_md(result: dict) -> str:
    if "ranks" in result:  # each rank's table under its rank and file
        return "\n".join(f"### rank {row[0]}: {md(row[1], 500)}\n\n" + kernels_md(r)
                         for r, row in zip(result["ranks"], result["table"])) + "\n" + _table_md(result)
    out = ["| kernel | category | rule | count | total ms | mean µs | median µs | min µs | max µs | stddev µs | share |",
           "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in result["kernels"]:  # (names whole: a pasted table is where they are read)
        out.append(f"| {md(r['name'], 4000)} | {r['category']} | {r['rule'] or '**no rule**'} | {r['count']:,} | "
                   f"{num(r['total_ms'])} | {num(r['mean_us'], 1)} | {_us(r['median_ms'])} | {_us(r['min_ms'])} | "
                   f"{_us(r['max_ms'])} | {_us(r['stddev_ms'])} | {100 * r['share']:.1f}% |")
    if result["warnings"]:
        out += [""] + [f"- warning: {md(w, 500)}" for w in result["warnings"]]
    return "\n".join(out) + "\n"


def kernels_csv(result: dict) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["rank", "name", "category", "rule", "count", "total_ms", "mean_us", "share", "min_ms", "median_ms",
                "max_ms", "stddev_ms"])
    ranks = result["ranks"] if "ranks" in result else [result]
    for i, r in enumerate(ranks):
        for k in r["kernels"]:  # (the statistics to 0.1 ns: a median may end in half a nanosecond)
            w.writerow([i, _csv_safe(k["name"]), k["category"], k["rule"] or "", k["count"], f"{k['total_ms']:.6f}",
                        f"{k['mean_us']:.3f}", f"{k['share']:.6f}", f"{k['min_ms']:.7f}", f"{k['median_ms']:.7f}",
                        f"{k['max_ms']:.7f}", f"{k['stddev_ms']:.7f}"])
    return buf.getvalue()


def _us(ms: float) -> str:
    """A kernel statistic (ms in the JSON) in µs, one decimal."""
    return num(ms * 1e3, 1)


def _csv_safe(s: str) -> str:
    """No formula injection when a CSV is opened in a spreadsheet."""
    s = plain(s, 2000)
    return "'" + s if s[:1] in ("=", "+", "-", "@") else s


def _table_md(multi: dict) -> str:
    """The cross-file table of ``info`` / ``kernels`` over several files (``columns``, ``table``)."""
    out = ["| " + " | ".join(multi["columns"]) + " |", "|" + "---|" * len(multi["columns"])]
    for row in multi["table"]:
        out.append("| " + " | ".join(md(v, 80) if isinstance(v, str) else (str(v) if isinstance(v, int) else num(v))
                                     for v in row) + " |")
    out += [""] + [f"- {md(w, 500)}" for w in multi.get("warnings", [])]
    return "\n".join(out) + "\n"
