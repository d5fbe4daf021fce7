"""One parser for byte amounts, shared by every command that takes bytes.

``27e9``, ``27000000000``, ``27GB`` and ``27 GB`` are 27 x 10^9 bytes (GB, MB, TB, kB are
decimal, as disks and datasheets count); ``25.1GiB`` is 25.1 x 2^30 (KiB, MiB, GiB, TiB are
binary). A bare ``B`` ("27B") is refused: it reads as 27 billion parameters as easily as
27 bytes.

>>> parse_bytes("27e9"), parse_bytes("27GB"), parse_bytes("1.5 GiB"), parse_bytes(4096)
(27000000000, 27000000000, 1610612736, 4096)
"""

from __future__ import annotations

import math
import re

import click

from tracekit.errors import TracekitError

BYTE_UNITS: dict[str, int] = {
    "": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
_AMOUNT = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE]([+-]?[0-9]{1,3}))?\s*([A-Za-z]*)\s*")
_EXAMPLES = "e.g. 27e9, 27GB (10^9) or 25.1GiB (2^30)"


def parse_bytes(value: str | int | float, *, what: str = "byte amount") -> int:
    """A byte amount as an int; ``TracekitError`` (one line, with examples) when it is not one.

    Negative, infinite and NaN amounts are refused; fractions of a byte round to the
    nearest byte.
    """
    if isinstance(value, bool):
        raise TracekitError(f"{what} {value!r} is not a byte amount ({_EXAMPLES})")
    if isinstance(value, (int, float)):
        if not math.isfinite(value) or value < 0:
            raise TracekitError(f"{what} must be a non-negative number of bytes, got {value!r}")
        return int(round(value))
    text = str(value)
    m = _AMOUNT.fullmatch(text)
    unit = m.group(3).lower() if m else ""
    if m and unit == "b":
        raise TracekitError(f"{what} {text!r} is ambiguous (bytes or billions?): write {m.group(1)}GB or "
                            f"{m.group(1)}e9 for 10^9 bytes")
    if not m or unit not in BYTE_UNITS:
        raise TracekitError(f"{what} {text!r} is not a byte amount ({_EXAMPLES})")
    number = float(m.group(1) + (f"e{m.group(2)}" if m.group(2) else ""))
    result = number * BYTE_UNITS[unit]
    if not math.isfinite(result):
        raise TracekitError(f"{what} {text!r} is too large")
    return int(round(result))


def format_bytes(n: int | float | None) -> str:
    """``13.5 GB`` style (decimal units, as datasheet bandwidths are); ``-`` for None.

    >>> format_bytes(13_500_000_000), format_bytes(524288), format_bytes(None)
    ('13.5 GB', '524 kB', '-')
    """
    if n is None:
        return "-"
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.3g} {unit}"
    return f"{int(n)} B"


class ByteAmount(click.ParamType):
    """click type for ``--weight-bytes`` and friends: :func:`parse_bytes`, a usage error when it fails."""

    name = "BYTES"

    def convert(self, value, param, ctx):
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        try:
            return parse_bytes(value, what=f"--{param.name.replace('_', '-')}" if param is not None else "value")
        except TracekitError as e:
            self.fail(str(e), param, ctx)


BYTES = ByteAmount()
