"""Kernel-name taxonomy: which category a GPU activity belongs to, from its name alone.

This module owns the rule table (``tracekit/data/kernels.toml``: ordered regex rules, first match
wins, see ``docs/taxonomy.md``), the loading of user rule files (``--rules FILE``: same shape, tried
first, so they add or override), and :func:`classify`, which maps a column of kernel names to
``category``, ``sub`` and ``rule``.

Context does not apply here: a kernel launched inside a draft range, or replayed from a draft CUDA
graph, is relabelled ``drafting`` by the analyses afterwards (docs/definitions.md, "Attribution").
Names no rule matches are ``other`` with ``rule`` null, so ``tracekit kernels`` can show the gaps.

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
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import polars as pl

from tracekit.categories import KERNEL_CATEGORIES
from tracekit.errors import TracekitError
from tracekit.report._fmt import one_line

if sys.version_info >= (3, 11):
    import tomllib as _toml
else:  # pragma: no cover - Python 3.10 (tomli is a dependency there)
    import tomli as _toml

CATEGORIES: tuple[str, ...] = KERNEL_CATEGORIES
UNKNOWN_SUB = "unknown"
_FIELDS = ("id", "category", "sub", "pattern", "source")
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
        raise TracekitError(f"rules file {path} not found; pass an existing TOML file to --rules") from None
    except (OSError, UnicodeDecodeError) as e:
        raise TracekitError(f"cannot read rules file {path}: {one_line(e)}") from None
    mine = _parse(text, str(path))
    if not mine:
        raise TracekitError(f"{path}: no [[rule]] tables; see docs/taxonomy.md for the format")
    ids = {r.id for r in mine}
    kept = tuple(r for r in shipped.rules if r.id not in ids)
    return Rules(mine + kept, files=(str(path),) + shipped.files)


@functools.lru_cache(maxsize=1)
def _shipped_rules() -> Rules:
    res = resources.files("tracekit").joinpath("data/kernels.toml")
    rules = _parse(res.read_text(encoding="utf-8"), "tracekit/data/kernels.toml")
    return Rules(rules, files=("tracekit/data/kernels.toml",))


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
    if top is not None and top <= 4 * codes.len() + (1 << 20):
        # Categorical codes are small integers: one row of each distinct code by a scatter into a table of
        # codes (no hashing of ten million values)
        have = codes.drop_nulls()
        at = pl.int_range(0, codes.len(), dtype=pl.UInt32, eager=True).filter(codes.is_not_null())
        first = pl.Series([None], dtype=pl.UInt32).extend_constant(None, int(top)).scatter(have, at).drop_nulls()
    else:
        first = codes.arg_unique()
        first = first.filter(codes.gather(first).is_not_null())
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


def _classify_one(name: str, rules: Rules) -> tuple[str, str, str | None]:
    for prefix, sub in _MEMOPS:
        if name.startswith(prefix):
            return "memory", sub, _MEMOP_RULE
    hit = rules.match(name)
    if hit is None:
        return "other", UNKNOWN_SUB, None
    return hit.category, hit.sub, hit.id


# ───────────────────────── parsing and validation ─────────────────────────


def _parse(text: str, origin: str) -> tuple[Rule, ...]:
    try:
        doc = _toml.loads(text)
    except _toml.TOMLDecodeError as e:
        raise TracekitError(f"{origin}: invalid TOML: {one_line(e)}") from None
    if set(doc) - {"rule"}:
        bad = ", ".join(sorted(set(doc) - {"rule"}))
        raise TracekitError(f"{origin}: unexpected top-level key(s) {bad}; a rules file holds only [[rule]] tables")
    raw = doc.get("rule", [])
    if not isinstance(raw, list):
        raise TracekitError(f"{origin}: 'rule' must be an array of tables: write each rule as [[rule]]")
    out: list[Rule] = []
    seen: set[str] = set()
    for i, entry in enumerate(raw, 1):
        out.append(_make_rule(entry, i, origin, seen))
    return tuple(out)


def _make_rule(entry: Any, i: int, origin: str, seen: set[str]) -> Rule:
    where = f"{origin}: rule #{i}"
    if not isinstance(entry, dict):
        raise TracekitError(f"{where} is not a table; write it as [[rule]] with keys {', '.join(_FIELDS)}")
    rid = entry.get("id")
    if isinstance(rid, str) and rid:
        where = f"{origin}: rule {rid!r} (#{i})"
    missing = [k for k in ("id", "category", "pattern") if k not in entry]
    if missing:
        raise TracekitError(f"{where}: missing key(s) {', '.join(missing)}")
    unknown = sorted(set(entry) - set(_FIELDS) - {"note"})
    if unknown:
        raise TracekitError(f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(_FIELDS)}, note")
    for key in ("id", "category", "sub", "source"):
        if key in entry and not isinstance(entry[key], str):
            raise TracekitError(f"{where}: {key} must be a string")
    if not rid:
        raise TracekitError(f"{where}: id must be a non-empty string")
    if rid in seen:
        raise TracekitError(f"{where}: duplicate id {rid!r}; give every rule its own id")
    seen.add(rid)
    cat = entry["category"]
    if cat not in CATEGORIES:
        raise TracekitError(f"{where}: unknown category {cat!r}; use one of {', '.join(CATEGORIES)}")
    pattern = _join_pattern(entry["pattern"], where)
    try:
        regex = re.compile(pattern)
    except re.error as e:
        raise TracekitError(f"{where}: invalid regex {pattern!r}: {one_line(e)}") from None
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
        raise TracekitError(f"{where}: pattern must be a regex string or a non-empty list of regex strings")
    if any(not a for a in alts):
        raise TracekitError(f"{where}: empty pattern would match every name; write a regex")
    if len(alts) == 1:
        return alts[0]
    # Inline flags such as (?i) must lead the whole regex in Python >= 3.11; each alternative keeps
    # its own flags by turning a leading (?i) into a scoped group (?i:...).
    parts = []
    for a in alts:
        m = re.match(r"^\(\?([aiLmsux]+)\)", a)
        parts.append(f"(?{m.group(1)}:{a[m.end():]})" if m else f"(?:{a})")
    return "|".join(parts)
