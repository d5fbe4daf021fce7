"""The small text formatters every layer uses (renderers, one-line errors, readers' messages); defined once, here.

It sits below every package (readers, analyses, results, reports and the command line all import it, and it
imports nothing but the standard library), so the command line, the readers and ``classify`` may use
:func:`one_line` without pulling polars or rich in.

>>> num(1234.5678), num(None), num(-0.5, minus=True), num(3.14159, 1, " ms")
('1,234.568', '—', '−0.500', '3.1 ms')
>>> pct(0.0345), pct(0.5), sig(0.20576), sig(4858.2), one_line("two\\n  lines")
('3.5%', '50%', '0.2058', '4,858', 'two lines')
>>> distinct_tails(["runs/a/eager/trace.sqlite", "runs/b/eager/trace.sqlite", "x/graph/trace.sqlite"])
['a/eager/trace.sqlite', 'b/eager/trace.sqlite', 'graph/trace.sqlite']
>>> size(988_010_240), size(2_322_432), size(512), size(None)
('988.0 MB', '2.3 MB', '512 B', '—')
"""

from __future__ import annotations

MISSING = "—"  # a number that is null (the JSON says why in its warnings)
MINUS = "\u2212"  # typographic minus: a signed column lines up and reads as a sign, not a hyphen


def one_line(msg: object) -> str:
    """``msg`` as one line: every run of whitespace (newlines included) becomes one space."""
    return " ".join(str(msg).split())


def num(x: float | None, nd: int = 3, unit: str = "", *, minus: bool = False) -> str:
    """``x`` with thousands separators and ``nd`` decimals (``—`` for null); ``minus``: a typographic minus."""
    if x is None:
        return MISSING
    s = f"{x:,.{nd}f}{unit}"
    return s.replace("-", MINUS) if minus else s


def pct(fraction: float) -> str:
    """A fraction as a percentage: one decimal below 10%, none above."""
    v = 100 * fraction
    return f"{v:.1f}%" if abs(v) < 10 else f"{v:.0f}%"


def sig(x: float | None) -> str:
    """Four significant digits, or a whole number with separators from 1,000 (``-`` for null)."""
    if x is None:
        return "-"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.4g}"


def size(n: int | float | None, missing: str = MISSING) -> str:
    """A byte count with a decimal unit (GB = 1e9, as every bandwidth figure here), one decimal."""
    if n is None:
        return missing
    for unit, k in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= k:
            return f"{n / k:.1f} {unit}"
    return f"{n:.0f} B"


def tail(path: str, parts: int = 2) -> str:
    """The last ``parts`` components of ``path`` (``runs/hf-small-eager/trace.sqlite`` -> ``hf-small-eager/trace.sqlite``):
    every capture names its file ``trace.sqlite``, so the folder is what tells runs apart."""
    bits = [b for b in str(path).replace("\\", "/").split("/") if b]
    return "/".join(bits[-parts:]) if bits else str(path)


def distinct_tails(paths: list[str], parts: int = 2) -> list[str]:
    """For each path the shortest tail (at least ``parts`` components) that no other path in ``paths`` shares."""
    out = []
    for p in paths:
        n = parts
        others = {q for q in paths if q != p}
        while n < len([b for b in str(p).split("/") if b]) and tail(p, n) in {tail(q, n) for q in others}:
            n += 1
        out.append(tail(p, n))
    return out


__all__ = ["MISSING", "MINUS", "one_line", "num", "pct", "sig", "size", "tail", "distinct_tails"]
