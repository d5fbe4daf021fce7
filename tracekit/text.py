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


def short(name: str, limit: int) -> str:
    """``name`` cut to ``limit`` characters, an ellipsis marking the cut."""
    return name if len(name) <= limit else name[:max(1, limit - 1)] + "…"


def distinct_short(names: list[str], limit: int) -> list[str]:
    """Each name cut to at most ``limit`` characters, names that differ kept apart: where two cut the same way
    (C++ kernel names share long prefixes), a name keeps its head, then the part around where it first differs
    from the others, each cut marked with an ellipsis.

    >>> a = "void at::native::elementwise_kernel<128, 4, gpu_kernel_impl<FillFunctor<float>>>"
    >>> b = "void at::native::elementwise_kernel<128, 4, gpu_kernel_impl<CopyFunctor<float>>>"
    >>> distinct_short([a, b, "nvjet_tst"], 40)
    ['void at::n…nel_impl<FillFunctor<float>>>', 'void at::n…nel_impl<CopyFunctor<float>>>', 'nvjet_tst']
    """
    out = [short(n, limit) for n in names]
    seen: dict[str, list[int]] = {}
    for i, s in enumerate(out):
        seen.setdefault(s, []).append(i)
    for idx in seen.values():
        group = {names[i] for i in idx}
        if len(group) < 2:
            continue
        for i in idx:
            n = names[i]
            # where this name first differs from another of its group
            first = min(next((k for k, (x, y) in enumerate(zip(n, m)) if x != y), min(len(n), len(m)))
                        for m in group if m != n)
            head = max(4, limit // 4)
            room = limit - head - 1  # one ellipsis after the head ...
            start = max(head, first - room // 3)
            if start + room < len(n):  # ... and one at the end
                out[i] = n[:head] + "…" + n[start:start + room - 1] + "…"
            else:
                out[i] = n[:head] + "…" + n[max(head, len(n) - room):]
    return out


__all__ = ["MISSING", "MINUS", "one_line", "num", "pct", "sig", "size", "tail", "distinct_tails", "short",
           "distinct_short"]
