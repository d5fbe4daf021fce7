"""Rendering untrusted text (kernel and range names come from whatever file a user points us at).

* ``plain``: terminal / CSV-safe — control characters (incl. ANSI escapes) shown as \\xNN, length capped.
* ``md``: safe inside a markdown table cell and a PR comment — ``plain`` + ``&``, ``<`` and ``>`` as
  entities and markdown metacharacters backslash-escaped, so a name can neither inject HTML nor break the
  table. Quotes stay quotes (``profiler's``, not ``profiler&#x27;s``): outside an HTML attribute, which
  markdown text never is, they inject nothing.
* ``md_code``: a markdown code span: markdown renders it literally (no HTML, no entities decoded), so only the
  backtick that would close it (shown as ``'``) and, in a table, ``|`` are made safe; ``<`` stays ``<``.
* ``rich_text``: a ``rich.text.Text`` (never parsed as rich markup).
"""

from __future__ import annotations

import html
import re

_CTRL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_MD_META = re.compile(r"([\\`*_\[\]|~])")


def plain(s: object, limit: int = 300) -> str:
    text = "" if s is None else str(s)
    text = _CTRL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return text


def md(s: object, limit: int = 120) -> str:
    """``s`` for markdown text.

    >>> print(md("<img src=x onerror=alert(1)>|*the profiler's*"))
    &lt;img src=x onerror=alert(1)&gt;\\|\\*the profiler's\\*
    """
    text = plain(s, limit)
    text = html.escape(text, quote=False)
    # html.escape produced &...; — escape markdown metacharacters but keep the entities intact.
    parts = re.split(r"(&[a-z#0-9]+;)", text)
    return "".join(p if p.startswith("&") and p.endswith(";") else _MD_META.sub(r"\\\1", p) for p in parts)


def md_code(s: object, limit: int = 120, table: bool = True) -> str:
    """``s`` as a markdown code span (``table``: inside a table cell, where ``|`` must be escaped even in code).

    >>> print(md_code("void k<float>(T|U) `x`"))
    `void k<float>(T\\|U) 'x'`
    """
    text = plain(s, limit).replace("`", "'")
    return f"`{text.replace('|', chr(92) + '|') if table else text}`"


def rich_text(s: object, limit: int = 300, style: str = ""):
    from rich.text import Text

    return Text(plain(s, limit), style=style)
