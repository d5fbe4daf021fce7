"""Decode-step segmentation: which host ranges are the decode steps.

Three ways, tried in this order (``Steps.marker`` says which was used):

1. ``--step-range REGEX``: every range whose name matches (Python ``re.search``).
2. Auto-detection: names that differ only in numbers are one *pattern*
   (``decode_step 12`` -> ``decode_step #``). Known step patterns of tracekit capture,
   SGLang, vLLM, TensorRT-LLM and the torch profiler are preferred; otherwise the
   outermost repeating pattern whose ranges launch GPU work.
3. Inference from structure when there are no usable ranges: one step per launch of the
   heaviest repeating CUDA graph, else one per host synchronisation of the launching
   thread. ``marker = "inferred"`` and a warning say so.

A step here is a host-side window on one thread (pid, tid, start, end); the GPU period
of each step is computed in ``analyses/breakdown.py`` from the work launched inside it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import polars as pl

from tracekit.trace import Trace

# Known per-step range patterns (after digits -> '#'), most specific first.
KNOWN_STEP_PATTERNS: list[tuple[str, str]] = [
    (r"^decode_step #$", "tracekit capture"),
    (r"^step\[DECODE", "SGLang torch profiler"),
    (r"^scheduler\.run_batch$", "SGLang NVTX scheduler spans"),
    (r"^execute_", "vLLM Worker.annotate_profile"),
    (r"_forward_step #", "TensorRT-LLM py_executor"),
    (r"^ProfilerStep#", "torch profiler step"),
]

_SPECIAL = set(".^$*+?{}[]\\|()")


def name_pattern(expr: pl.Expr) -> pl.Expr:
    """Range name -> pattern: every run of digits becomes '#'."""
    return expr.str.replace_all(r"\d+", "#")


def pattern_regex(pattern: str) -> str:
    """``decode_step #`` -> ``^decode_step \\d+$`` (the regex that selects the pattern's names)."""
    out = []
    for ch in pattern:
        if ch == "#":
            out.append(r"\d+")
        elif ch in _SPECIAL:
            out.append("\\" + ch)
        else:
            out.append(ch)
    return "^" + "".join(out) + "$"


def name_regex(name: str, limit: int = 200) -> str:
    """The regex that selects ``name`` and the names that differ from it only in numbers.

    Built from a name, not from its pattern: a literal '#' in a name (``ProfilerStep#12``)
    must stay a '#', not become ``\\d+``. Names longer than ``limit`` (patterns are built
    from their first ``limit`` characters) match by prefix.
    """
    out = []
    for i, piece in enumerate(re.split(r"(\d+)", name[:limit])):
        if i % 2:  # a run of digits (the split's captured group)
            out.append(r"\d+")
        else:
            out.append("".join("\\" + ch if ch in _SPECIAL else ch for ch in piece))
    return "^" + "".join(out) + ("$" if len(name) <= limit else "")


def range_patterns(ranges: pl.DataFrame, top: int | None = 10) -> pl.DataFrame:
    """Most frequent range-name patterns: columns pattern, regex, count, min_depth.

    NCCL-domain ranges are left out (they are the library's, not the application's).
    """
    if ranges.height == 0:
        return pl.DataFrame(schema={"pattern": pl.String, "regex": pl.String, "count": pl.Int64,
                                    "min_depth": pl.Int32})
    rng = ranges.filter(pl.col("domain").is_null() | (pl.col("domain") != "NCCL"))
    df = (
        rng.with_columns(pattern=name_pattern(pl.col("name").str.slice(0, 200)))
        .group_by("pattern")
        .agg(count=pl.len().cast(pl.Int64), min_depth=pl.col("depth").min(), example=pl.col("name").min())
        .sort(["count", "pattern"], descending=[True, False])
    )
    if top is not None:
        df = df.head(top)
    return df.with_columns(
        regex=pl.col("example").map_elements(name_regex, return_dtype=pl.String)
    ).select("pattern", "regex", "count", "min_depth")


@dataclass
class Steps:
    """Host-side step windows: frame with step, pid, tid, start, end (end null = cut off)."""

    windows: pl.DataFrame
    marker: str  # "nvtx" | "annotation" | "inferred"
    pattern: str | None
    warnings: list[str] = field(default_factory=list)


def _regex_match(names: pl.Series, regex: str) -> pl.Series:
    """Python ``re.search`` semantics, evaluated once per distinct name."""
    try:
        rx = re.compile(regex)
    except re.error as e:
        from tracekit.errors import TracekitError

        raise TracekitError(f"invalid regular expression {regex!r}: {e}")
    uniq = names.unique()
    hits = pl.DataFrame({"name": uniq, "hit": [bool(rx.search(n)) if n is not None else False for n in uniq]})
    return pl.DataFrame({"name": names}).join(hits, on="name", how="left", maintain_order="left")["hit"]


def select_ranges(ranges: pl.DataFrame, regex: str) -> pl.DataFrame:
    if ranges.height == 0:
        return ranges
    return ranges.filter(_regex_match(ranges["name"], regex))


def _marker_kind(trace: Trace) -> str:
    return "nvtx" if trace.meta.format == "nsys-sqlite" else "annotation"


def _windows(rng: pl.DataFrame) -> pl.DataFrame:
    return rng.sort("start").with_row_index("step").select(
        pl.col("step").cast(pl.Int64), "pid", "tid", "start", "end", "name"
    )


def _launching(ranges: pl.DataFrame, launches: pl.DataFrame) -> pl.DataFrame:
    """Ranges that enclose at least one work launch on their thread: adds column n_launches."""
    work = launches.filter(pl.col("kind").is_in(["kernel", "graph", "memcpy", "memset"]))
    if ranges.height == 0 or work.height == 0:
        return ranges.with_columns(n_launches=pl.lit(0, pl.Int64))
    r = ranges.with_row_index("_r").sort("start")
    # Only outermost-of-pattern matters here; count launches by an asof join per thread.
    hit = (
        work.select("pid", "tid", "start").sort("start")
        .join_asof(r.select("pid", "tid", "start", "end", "_r").rename({"start": "rs"}),
                   left_on="start", right_on="rs", by=["pid", "tid"], strategy="backward", check_sortedness=False)
        .filter(pl.col("end").is_null() | (pl.col("start") <= pl.col("end")))
        .group_by("_r").agg(n_launches=pl.len().cast(pl.Int64))
    )
    return r.join(hit, on="_r", how="left").with_columns(pl.col("n_launches").fill_null(0)).drop("_r")


def auto_pattern(trace: Trace) -> tuple[str, str] | None:
    """(pattern, why) of the step ranges, or None when no range pattern looks like steps."""
    pats = range_patterns(trace.ranges, top=None)
    if pats.height == 0:
        return None
    for rx, why in KNOWN_STEP_PATTERNS:
        hit = pats.filter(pl.col("pattern").str.contains(rx))
        if hit.height:
            return hit["pattern"][0], why
    # Generic: outermost repeating pattern (>= 3 ranges) whose ranges hold most of the GPU work launches
    # (op-level ranges such as aten::* from emit_nvtx each hold a launch or two, so they never qualify).
    cands = pats.filter((pl.col("count") >= 3) & ~pl.col("pattern").str.contains(r"^(aten|c10d|nccl|cuda)\w*[:.]"))
    cands = cands.sort(["min_depth", "count"], descending=[False, True])
    work = trace.launches.filter(pl.col("kind").is_in(["kernel", "graph", "memcpy", "memset"])).height
    for pattern in cands["pattern"].head(20):
        rng = trace.ranges.filter(name_pattern(pl.col("name").str.slice(0, 200)) == pattern)
        lr = _launching(rng, trace.launches)
        if work and lr["n_launches"].sum() >= 0.5 * work and (lr["n_launches"] > 0).mean() >= 0.8:
            return pattern, "outermost repeating range that holds most GPU work launches"
    return None


def find_steps(trace: Trace, *, step_range: str | None = None, device: int | None = None) -> Steps | None:
    """Step windows of ``trace`` (None when none can be found)."""
    warnings: list[str] = []
    if step_range is not None:
        rng = select_ranges(trace.ranges, step_range)
        if rng.height == 0:
            return None
        return Steps(_windows(rng), _marker_kind(trace), step_range, warnings)
    found = auto_pattern(trace)
    if found is not None:
        pattern, why = found
        rng = trace.ranges.filter(name_pattern(pl.col("name").str.slice(0, 200)) == pattern)
        # Keep the outermost occurrences only (a pattern can nest in itself, e.g. recursion).
        rng = rng.filter(pl.col("depth") == rng["depth"].min()) if rng.height else rng
        return Steps(_windows(rng), _marker_kind(trace), pattern, warnings)
    return infer_steps(trace, device=device)


def _main_thread(trace: Trace, device: int | None) -> tuple[int, int] | None:
    work = trace.launches.filter(pl.col("kind").is_in(["kernel", "graph"]))
    if device is not None:
        on_dev = (trace.kernels.select("device", "pid", "correlation").filter(pl.col("device") == device)
                  .select("pid", "correlation").unique())
        work = work.join(on_dev, on=["pid", "correlation"], how="semi")
    if work.height == 0:
        return None
    top = work.group_by("pid", "tid").agg(n=pl.len()).sort("n", descending=True).row(0)
    return top[0], top[1]


def infer_steps(trace: Trace, device: int | None = None) -> Steps | None:
    """Steps from structure: heaviest repeating graph launch, else host synchronisations."""
    main = _main_thread(trace, device)
    if main is None:
        return None
    pid, tid = main
    thread = trace.launches.filter((pl.col("pid") == pid) & (pl.col("tid") == tid)).sort("start")
    graphs = thread.filter(pl.col("kind") == "graph")
    anchors = None
    how = None
    if graphs.height >= 2:
        # Signature of each graph launch = number of kernels it replayed; anchor on the signature with
        # the most GPU time (the target model's forward).
        k = (trace.kernels.filter(pl.col("pid") == pid).group_by("correlation")
             .agg(n=pl.len(), t=(pl.col("end") - pl.col("start")).sum()))
        g = graphs.join(k, on="correlation", how="left").with_columns(pl.col("n").fill_null(0), pl.col("t").fill_null(0))
        sig = g.group_by("n").agg(total=pl.col("t").sum(), count=pl.len()).sort("total", descending=True)
        if sig.height and sig["count"][0] >= 2 and sig["total"][0] > 0:
            anchors = g.filter(pl.col("n") == sig["n"][0]).select("start")
            how = f"one step per replay of the CUDA graph of {sig['n'][0]} kernels ({sig['count'][0]} replays)"
    if anchors is None:
        syncs = thread.filter(pl.col("kind") == "sync")
        if syncs.height >= 3:
            # A step ends at a host synchronisation; the next one starts right after it.
            anchors = pl.concat([thread.select("start").head(1), syncs.select(pl.col("end").alias("start")).head(-1)])
            how = f"one step per host synchronisation of the launching thread ({syncs.height} syncs)"
    if anchors is None or anchors.height < 2:
        return None
    starts = anchors["start"].sort()
    last_end = thread["end"].max()
    ends = pl.concat([starts.slice(1), pl.Series([last_end], dtype=pl.Int64)])
    windows = pl.DataFrame({"start": starts, "end": ends}).with_columns(
        pid=pl.lit(pid, pl.Int64), tid=pl.lit(tid, pl.Int64), name=pl.lit("inferred step"))
    return Steps(_windows(windows), "inferred", None, [f"no step markers found: steps inferred from structure, {how}; "
                                                        "pass --step-range to use a range instead"])
