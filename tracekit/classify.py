"""Kernel-name taxonomy: which category a GPU activity belongs to, from its name alone.

This module owns the rule table (``tracekit/data/kernels.toml``: ordered regex rules, first match
wins, see ``docs/taxonomy.md``), the loading of user rule files (``--rules FILE``: same shape, tried
first, so they add or override), and :func:`classify`, which maps a column of kernel names to
``category``, ``sub`` and ``rule``.

Context does not apply here: a kernel launched inside a draft range, or replayed from a draft CUDA
graph, is relabelled ``drafting`` by the analyses afterwards (docs/definitions.md, "Attribution").
Names no rule matches are ``other`` with ``rule`` null, so ``tracekit kernels`` can show the gaps.

**By the launching op.** A name no ``[[rule]]`` matches takes the category of the framework op that launched it
where the trace records one (:func:`launching_ops`, :func:`with_op_categories`): the ``[[op]]`` tables of the same
file match the op's name (``aten::mm`` -> gemm, ``vllm::unified_attention`` -> attention, ...) and the kernel's
``rule`` becomes ``op:<op name>``. A name launched by several ops takes the op that launched most of its time.

>>> import polars as pl
>>> classify(pl.Series(["nvjet_tst_64x8_64x16_4x1_v_bz_TNT", "[CUDA memcpy Device-to-Host]", "mystery"]))
shape: (3, 4)
┌─────────────────────────────────┬──────────┬─────────┬──────┐
│ name                            ┆ category ┆ sub     ┆ rule │
│ ---                             ┆ ---      ┆ ---     ┆ ---  │
│ str                             ┆ str      ┆ str     ┆ str  │
╞═════════════════════════════════╪══════════╪═════════╪══════╡
│ nvjet_tst_64x8_64x16_4x1_v_bz_… ┆ gemm     ┆ cublas  ┆ G9   │
│ [CUDA memcpy Device-to-Host]    ┆ memory   ┆ memcpy  ┆ M1   │
│ mystery                         ┆ other    ┆ unknown ┆ null │
└─────────────────────────────────┴──────────┴─────────┴──────┘
"""

from __future__ import annotations

import functools
import re
import sys
import threading
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import polars as pl

from tracekit.categories import KERNEL_CATEGORIES
from tracekit.errors import BadRulesFile
from tracekit.text import one_line

if sys.version_info >= (3, 11):
    import tomllib as _toml
else:  # pragma: no cover - Python 3.10 (tomli is a dependency there)
    import tomli as _toml

CATEGORIES: tuple[str, ...] = KERNEL_CATEGORIES
UNKNOWN_SUB = "unknown"
_FIELDS = ("id", "category", "sub", "pattern", "source")
_TABLES = ("rule", "op")  # [[rule]]: kernel names; [[op]]: the launching framework op's name
# A framework op as Kineto (cpu_op) and emit_nvtx name it: namespace::name (aten::mm, vllm::unified_attention,
# _C_cache_ops::reshape_and_cache_flash); an NVTX op range carries more after it (", seq = 12, sizes = ...").
OP_NAME = r"^([A-Za-z_][\w.]*::[A-Za-z_]\w*)"
OP_RULE_PREFIX = "op:"
# Memcpy/memset records (nsys CUPTI_ACTIVITY_KIND_MEMCPY/_MEMSET names, Kineto gpu_memcpy/gpu_memset)
# are memory whatever a user rule says: they are copies by construction, not kernels.
_MEMOPS = (("[CUDA memcpy", "memcpy"), ("[CUDA memset", "memset"), ("Memcpy ", "memcpy"), ("Memset ", "memset"))
_MEMOP_RULE = "M1"


@dataclass(frozen=True)
class Rule:
    """One taxonomy rule: ``pattern`` is searched (``re.search``) in the full kernel name."""

    id: str
    category: str
    sub: str
    pattern: str
    source: str
    origin: str = ""  # the file it came from
    regex: re.Pattern[str] = field(default=None, repr=False, compare=False)  # type: ignore[assignment]


@dataclass(frozen=True)
class Rules:
    """An ordered rule list; the first rule whose pattern matches a name decides its category."""

    rules: tuple[Rule, ...]
    files: tuple[str, ...] = ()
    _cache: dict[str, Rule | None] = field(default_factory=dict, repr=False, compare=False)
    ops: tuple[Rule, ...] = ()  # the [[op]] rules: category by the launching op's name

    def match_op(self, op: str) -> Rule | None:
        """The first ``[[op]]`` rule matching the op name ``op``, or None."""
        return next((r for r in self.ops if r.regex.search(op)), None)

    def match(self, name: str) -> Rule | None:
        """The first rule matching ``name``, or None."""
        try:
            return self._cache[name]
        except KeyError:
            pass
        hit = next((r for r in self.rules if r.regex.search(name)), None)
        self._cache[name] = hit
        return hit

    def __len__(self) -> int:
        return len(self.rules)

    def __iter__(self) -> Iterator[Rule]:
        return iter(self.rules)

    def by_id(self, rule_id: str) -> Rule | None:
        return next((r for r in self.rules if r.id == rule_id), None)


def load_rules(extra: str | Path | None = None) -> Rules:
    """The shipped rules, with the rules of the TOML file ``extra`` (if given) tried first.

    A rule in ``extra`` whose ``id`` is also a shipped id replaces that shipped rule; other extra rules
    are added in front. A file that cannot be read, is not valid TOML, or holds a bad rule (missing
    key, unknown category, invalid regex) raises :class:`TracekitError` saying what to fix.
    """
    shipped = _shipped_rules()
    if extra is None:
        return shipped
    path = Path(extra)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise BadRulesFile(f"rules file {path} not found; pass an existing TOML file to --rules") from None
    except (OSError, UnicodeDecodeError) as e:
        raise BadRulesFile(f"cannot read rules file {path}: {one_line(e)}") from None
    mine, mine_ops = _parse_tables(text, str(path))
    if not mine and not mine_ops:
        raise BadRulesFile(f"{path}: no [[rule]] or [[op]] tables; see docs/taxonomy.md for the format")
    ids = {r.id for r in mine}
    kept = tuple(r for r in shipped.rules if r.id not in ids)
    op_ids = {r.id for r in mine_ops}
    kept_ops = tuple(r for r in shipped.ops if r.id not in op_ids)
    return Rules(mine + kept, files=(str(path),) + shipped.files, ops=mine_ops + kept_ops)


@functools.lru_cache(maxsize=1)
def _shipped_rules() -> Rules:
    res = resources.files("tracekit").joinpath("data/kernels.toml")
    rules, ops = _parse_tables(res.read_text(encoding="utf-8"), "tracekit/data/kernels.toml")
    return Rules(rules, files=("tracekit/data/kernels.toml",), ops=ops)


def classify(names: pl.Series, rules: Rules | None = None) -> pl.DataFrame:
    """Classify kernel (and memcpy/memset) names.

    Returns a frame with columns ``name, category, sub, rule`` (all strings; ``rule`` null where no
    rule matched, then ``category`` is ``other`` and ``sub`` ``unknown``), one row per input row in
    input order. Only the distinct names are matched against the rules (a trace has millions of
    kernels but a few hundred names); see :func:`name_table`.
    """
    col = names.cast(pl.String).rename("name")
    pos, table = name_table(col, rules)
    return pl.DataFrame({
        "name": col,
        "category": table["category"].gather(pos).fill_null("other"),
        "sub": table["sub"].gather(pos).fill_null(UNKNOWN_SUB),
        "rule": table["rule"].gather(pos),
    })


def name_table(names: pl.Series, rules: Rules | None = None) -> tuple[pl.Series, pl.DataFrame]:
    """The distinct names of ``names`` classified once: ``(pos, table)``.

    ``table`` has one row per distinct non-null name (an Enum: per category; columns ``name, category, sub, rule``) and ``pos``
    (UInt32, null for a null name) is each input row's row in it, so a per-row column is a gather
    (``table["category"].gather(pos)``) and a per-name aggregate a group-by on integers, never a hash
    of ten million strings. The distinct names are found from categorical codes (the trace's kernel names are
    categorical already, so no string is hashed).

    >>> pos, table = name_table(pl.Series(["b", "a", "b", None]))
    >>> table["name"].gather(pos).to_list()
    ['b', 'a', 'b', None]
    """
    rules = load_rules() if rules is None else rules
    if isinstance(names.dtype, pl.Enum):
        # An Enum's categories are its distinct names (``table`` has a row for each, used or not): classified
        # once, then one gather by code per row, with no cast of ten million values.
        cpos, table = name_table(pl.Series("name", names.dtype.categories), rules)
        return cpos.gather(names.to_physical()).rename("pos"), table
    col = names if names.dtype == pl.Categorical else names.cast(pl.String).cast(pl.Categorical)
    codes = col.to_physical()
    top = codes.max()
    # the first row of each distinct code (a hash table of the few codes: no column of ten million row numbers)
    first = codes.arg_unique()
    first = first.filter(codes.gather(first).is_not_null())
    if top is not None and top <= 4 * codes.len() + (1 << 20):
        first = first.gather(codes.gather(first).arg_sort())  # (small codes: the table in code order, as always)
    uniq = col.gather(first).cast(pl.String).to_list()
    cats, subs, ids = [], [], []
    for name in uniq:
        cat, sub, rid = _classify_one(name, rules)
        cats.append(cat)
        subs.append(sub)
        ids.append(rid)
    table = pl.DataFrame(
        {"name": uniq, "category": cats, "sub": subs, "rule": ids},
        schema={"name": pl.String, "category": pl.String, "sub": pl.String, "rule": pl.String},
    )
    if not uniq:
        return pl.repeat(None, col.len(), dtype=pl.UInt32, eager=True).alias("pos"), table
    ucodes = codes.gather(first).cast(pl.Int64)
    slots = pl.Series("pos", [None], dtype=pl.UInt32).extend_constant(None, int(ucodes.max()))
    slots = slots.scatter(ucodes, pl.int_range(0, len(uniq), dtype=pl.UInt32, eager=True))
    return slots.gather(codes).rename("pos"), table


# frame_name_table's tables: id(frame) -> (a weak reference to the frame, [(rules, pos, table), ...], a lock)
_FRAME_TABLES: dict[int, tuple[weakref.ref, list, threading.Lock]] = {}
_FRAME_TABLES_LOCK = threading.Lock()


def frame_name_table(frame: pl.DataFrame, rules: Rules | None = None) -> tuple[pl.Series, pl.DataFrame]:
    """:func:`name_table` of ``frame["name"]``, made once per frame (e.g. a trace's kernels) and rules object:
    the kernels' names are classified by several analyses (categories, communication kernels, training
    kernels), a pass over ten million rows each time otherwise. The entry goes when the frame does. A frame's names
    never change: the one change tracekit makes to a trace's frame in place, ``attribute(consume=True)``'s, drops
    other columns. Thread-safe: a caller that asks while another thread is making the frame's table waits for it
    (the attribution's names and the communication kernels ask at the same moment, on two threads: ten million
    kernels, ~0.1 s of CPU and ~0.2 s of wall time each, made twice otherwise)."""
    rules = load_rules() if rules is None else rules
    key = id(frame)
    with _FRAME_TABLES_LOCK:
        entry = _FRAME_TABLES.get(key)
        if entry is None or entry[0]() is not frame:
            entry = (weakref.ref(frame, lambda _, key=key: _FRAME_TABLES.pop(key, None)), [], threading.Lock())
            _FRAME_TABLES[key] = entry
    with entry[2]:
        for r, pos, table in entry[1]:
            if r is rules:
                return pos, table
        pos, table = name_table(frame["name"], rules)
        entry[1].append((rules, pos, table))
    return pos, table


def _classify_one(name: str, rules: Rules) -> tuple[str, str, str | None]:
    for prefix, sub in _MEMOPS:
        if name.startswith(prefix):
            return "memory", sub, _MEMOP_RULE
    hit = rules.match(name)
    if hit is None:
        return "other", UNKNOWN_SUB, None
    return hit.category, hit.sub, hit.id


# ───────────────────────── category by the launching op ─────────────────────────

# Nesting levels of framework ops looked at (the innermost op of a launch is rarely deeper than a handful).
MAX_OP_DEPTH = 64


def op_frames(trace) -> pl.DataFrame:
    """The framework ops of ``trace`` as host intervals: ``pid, tid, start, end, op`` (the op's name,
    ``namespace::name``), from ``Trace.ops`` (Kineto cpu_op events) and from NVTX ranges named as
    ``torch.autograd.profiler.emit_nvtx`` names them (``aten::mm, seq = 12, ...``)."""
    parts = []
    for f in (trace.ops, trace.ranges):
        if f.height:
            if f.schema["name"] == pl.Categorical:  # (Trace.ops: the op of each distinct name, joined to its rows)
                d = f["name"].unique()
                ops = pl.DataFrame([d, d.cast(pl.String).str.extract(OP_NAME, 1).alias("op")]).drop_nulls("op")
                f = f.join(ops, on="name", how="inner", maintain_order="left")
            else:
                f = f.with_columns(op=pl.col("name").str.extract(OP_NAME, 1))
            parts.append(f.select("pid", "tid", "start", "end", "op")
                         .filter(pl.col("op").is_not_null() & pl.col("end").is_not_null()
                                 & (pl.col("end") >= pl.col("start"))))
    if not parts:
        return pl.DataFrame(schema={"pid": pl.Int64, "tid": pl.Int64, "start": pl.Int64, "end": pl.Int64,
                                    "op": pl.String})
    return pl.concat(parts).sort("start")


def launching_ops(frames: pl.DataFrame, launches: pl.DataFrame) -> pl.Series:
    """For each launch (``pid, tid, start``), the innermost framework op of ``frames`` (:func:`op_frames`) open
    on its thread at its start, else null. Ops nest on a thread, so at each nesting level at most one op can
    enclose the launch: one as-of join per level (a handful), the deepest hit wins."""
    out = pl.repeat(None, launches.height, dtype=pl.String, eager=True).alias("op")
    if frames.height == 0 or launches.height == 0:
        return out
    from tracekit.intervals import nesting_depth

    frames = frames.with_columns(depth=nesting_depth(frames)).filter(pl.col("depth") < MAX_OP_DEPTH)
    left = launches.select("pid", "tid", "start").with_row_index("_i").sort("start")
    best = left.select("_i", op=pl.lit(None, pl.String))
    for d in range(int(frames["depth"].max()) + 1):  # nesting levels, not events
        level = frames.filter(pl.col("depth") == d).select("pid", "tid", fs="start", fe="end", op_d="op").sort("fs")
        if level.height == 0:
            continue
        hit = left.join_asof(level, left_on="start", right_on="fs", by=["pid", "tid"], strategy="backward",
                             check_sortedness=False).select(
            "_i", op_d=pl.when(pl.col("fe") >= pl.col("start")).then(pl.col("op_d")))
        best = best.join(hit, on="_i", how="left").select("_i", op=pl.coalesce("op_d", "op"))
    return best.sort("_i")["op"].alias("op")


def with_op_categories(table: pl.DataFrame, pos: pl.Series, kernels: pl.DataFrame, trace,
                       rules: Rules | None = None) -> pl.DataFrame:
    """``table`` (:func:`name_table`'s) with the names no ``[[rule]]`` matched categorised by their launching op.

    ``kernels``: the kernel records ``pos`` indexes into ``table`` (columns ``pid``, ``correlation``, ``start``,
    ``end``); ``trace``: where the launches and ops are. A name takes the op that launched most of its kernel time
    (eager launches only: a graph replay has no launching op per kernel) and, when an ``[[op]]`` rule matches that
    op, its category, ``sub`` and ``rule = "op:<op>"``; other rows are unchanged. Vectorised: one join of the
    unmatched kernels to their launches, one as-of join per op nesting level.
    """
    rules = load_rules() if rules is None else rules
    if not rules.ops or table.height == 0 or not table["rule"].is_null().any():
        return table
    if trace.ops.height == 0 and not trace.ranges["name"].str.contains(OP_NAME).any():
        return table  # no framework op recorded
    open_rows = table["rule"].is_null()
    k = kernels.select("pid", "correlation", dur=pl.col("end") - pl.col("start")).with_columns(pos=pos)
    k = k.filter(open_rows.gather(pos).fill_null(False))
    if k.height == 0:
        return table
    eager = trace.launches.filter(pl.col("kind") == "kernel").select("pid", "correlation", "tid", "start")
    k = k.join(eager, on=["pid", "correlation"], how="inner")
    frames = op_frames(trace)
    if k.height == 0 or frames.height == 0:
        return table
    k = k.with_columns(op=launching_ops(frames, k))
    by_op = (k.filter(pl.col("op").is_not_null()).group_by("pos", "op").agg(t=pl.col("dur").sum())
             .sort(["pos", "t", "op"], descending=[False, True, False]).group_by("pos", maintain_order=True).first())
    if by_op.height == 0:
        return table
    ops = by_op["op"].unique().to_list()
    hits = {op: rules.match_op(op) for op in ops}  # distinct op names (a few dozen), not kernels
    found = pl.DataFrame({"op": ops, "o_cat": [h.category if h else None for h in hits.values()],
                          "o_sub": [h.sub if h else None for h in hits.values()]},
                         schema={"op": pl.String, "o_cat": pl.String, "o_sub": pl.String})
    by_op = by_op.join(found, on="op", how="inner").filter(pl.col("o_cat").is_not_null())
    if by_op.height == 0:
        return table
    upd = table.with_row_index("pos").join(by_op.select("pos", "op", "o_cat", "o_sub"), on="pos", how="left",
                                           maintain_order="left")
    have = pl.col("o_cat").is_not_null()
    return upd.select(
        "name",
        category=pl.when(have).then(pl.col("o_cat")).otherwise(pl.col("category")),
        sub=pl.when(have).then(pl.col("o_sub")).otherwise(pl.col("sub")),
        rule=pl.when(have).then(pl.lit(OP_RULE_PREFIX) + pl.col("op")).otherwise(pl.col("rule")),
    )


# ───────────────────────── parsing and validation ─────────────────────────


def _parse_tables(text: str, origin: str) -> tuple[tuple[Rule, ...], tuple[Rule, ...]]:
    """``([[rule]] rules, [[op]] rules)`` of a rules file, validated."""
    try:
        doc = _toml.loads(text)
    except _toml.TOMLDecodeError as e:
        raise BadRulesFile(f"{origin}: invalid TOML: {one_line(e)}") from None
    if set(doc) - set(_TABLES):
        bad = ", ".join(sorted(set(doc) - set(_TABLES)))
        raise BadRulesFile(f"{origin}: unexpected top-level key(s) {bad}; a rules file holds only [[rule]] and "
                            "[[op]] tables")
    out: dict[str, tuple[Rule, ...]] = {}
    for table in _TABLES:
        raw = doc.get(table, [])
        if not isinstance(raw, list):
            raise BadRulesFile(f"{origin}: '{table}' must be an array of tables: write each {table} as [[{table}]]")
        seen: set[str] = set()
        out[table] = tuple(_make_rule(entry, i, origin if table == "rule" else f"{origin} [[op]]", seen)
                           for i, entry in enumerate(raw, 1))
    return out["rule"], out["op"]


def _make_rule(entry: Any, i: int, origin: str, seen: set[str]) -> Rule:
    where = f"{origin}: rule #{i}"
    if not isinstance(entry, dict):
        raise BadRulesFile(f"{where} is not a table; write it as [[rule]] with keys {', '.join(_FIELDS)}")
    rid = entry.get("id")
    if isinstance(rid, str) and rid:
        where = f"{origin}: rule {rid!r} (#{i})"
    missing = [k for k in ("id", "category", "pattern") if k not in entry]
    if missing:
        raise BadRulesFile(f"{where}: missing key(s) {', '.join(missing)}")
    unknown = sorted(set(entry) - set(_FIELDS) - {"note"})
    if unknown:
        raise BadRulesFile(f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(_FIELDS)}, note")
    for key in ("id", "category", "sub", "source"):
        if key in entry and not isinstance(entry[key], str):
            raise BadRulesFile(f"{where}: {key} must be a string")
    if not rid:
        raise BadRulesFile(f"{where}: id must be a non-empty string")
    if rid in seen:
        raise BadRulesFile(f"{where}: duplicate id {rid!r}; give every rule its own id")
    seen.add(rid)
    cat = entry["category"]
    if cat not in CATEGORIES:
        raise BadRulesFile(f"{where}: unknown category {cat!r}; use one of {', '.join(CATEGORIES)}")
    pattern = _join_pattern(entry["pattern"], where)
    try:
        regex = re.compile(pattern)
    except re.error as e:
        raise BadRulesFile(f"{where}: invalid regex {pattern!r}: {one_line(e)}") from None
    return Rule(
        id=rid,
        category=cat,
        sub=entry.get("sub") or cat,
        pattern=pattern,
        source=entry.get("source", ""),
        origin=origin,
        regex=regex,
    )


def _join_pattern(value: Any, where: str) -> str:
    if isinstance(value, str):
        alts = [value]
    elif isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        alts = value
    else:
        raise BadRulesFile(f"{where}: pattern must be a regex string or a non-empty list of regex strings")
    if any(not a for a in alts):
        raise BadRulesFile(f"{where}: empty pattern would match every name; write a regex")
    if len(alts) == 1:
        return alts[0]
    # Inline flags such as (?i) must lead the whole regex in Python >= 3.11; each alternative keeps
    # its own flags by turning a leading (?i) into a scoped group (?i:...).
    parts = []
    for a in alts:
        m = re.match(r"^\(\?([aiLmsux]+)\)", a)
        parts.append(f"(?{m.group(1)}:{a[m.end():]})" if m else f"(?:{a})")
    return "|".join(parts)
