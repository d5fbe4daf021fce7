"""One parser for byte amounts, and one table of element sizes, shared by every command that takes bytes.

``27e9``, ``27000000000``, ``27GB`` and ``27 GB`` are 27 x 10^9 bytes (GB, MB, TB, kB are
decimal, as disks and datasheets count); ``25.1GiB`` is 25.1 x 2^30 (KiB, MiB, GiB, TiB are
binary). A bare ``B`` ("27B") is refused: it reads as 27 billion parameters as easily as
27 bytes.

>>> parse_bytes("27e9"), parse_bytes("27GB"), parse_bytes("1.5 GiB"), parse_bytes(4096)
(27000000000, 27000000000, 1610612736, 4096)

Element sizes (:data:`DTYPE_BITS`, :func:`dtype_bytes`) cover every spelling tracekit meets: what users type
(``--dtype fp8``), safetensors headers (``BF16``, ``F8_E4M3``), torch and Kineto ``Input type`` names
(``c10::BFloat16``, ``long int``) and NCCL's ``dtype`` args (``bfloat16``, ``char``).

>>> dtype_bytes("bf16"), dtype_bytes("c10::Float8_e4m3fn"), dtype_bytes("int4"), dtype_bits("F6_E2M3")
(2.0, 1.0, 0.5, 6)

The block-scaled 4-bit formats a user names count their scales: ``nvfp4`` (NVIDIA) stores a 4-bit E2M1 value per
element plus one FP8 E4M3 scale per block of 16 elements, 4 + 8/16 = 4.5 bits (0.5625 bytes) per parameter;
``mxfp4`` (OCP Microscaling) one E8M0 scale per block of 32, 4 + 8/32 = 4.25 bits (0.53125 bytes). NVFP4's one
FP32 scale per tensor is left out (a few bytes per tensor). A bare ``fp4`` / ``int4`` is 4 bits, scales not
counted. In a safetensors header the scales are tensors of their own, so the header's ``F4`` / ``U8`` stay as
stored.

>>> dtype_bytes("nvfp4"), dtype_bytes("mxfp4"), dtype_bytes("fp4")
(0.5625, 0.53125, 0.5)
"""

from __future__ import annotations

import math
import re

import click

from tracekit.errors import BadOptionValue, TracekitError

# The dtypes a user names (--params with --dtype, --kv-dtype): each is a key of DTYPE_BITS.
DTYPES = ("bf16", "fp16", "fp32", "fp8", "int8", "int4", "fp4", "nvfp4", "mxfp4")

BYTE_UNITS: dict[str, int] = {
    "": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
# Bits per element, by lower-case name (look names up with dtype_bits/dtype_bytes: they lower-case a name and strip
# a "torch." or "c10::" prefix). Bits, not bytes: 4- and 6-bit types stay exact. nvfp4 and mxfp4 (what users type)
# include their block scales' share (module docstring): 4.5 and 4.25 bits.
DTYPE_BITS: dict[str, float] = {
    # safetensors header dtypes (tracekit.model.safetensors accepts exactly these, upper-case)
    "bool": 8, "u8": 8, "i8": 8, "f8_e4m3": 8, "f8_e5m2": 8, "f8_e8m0": 8, "e8m0": 8, "i16": 16, "u16": 16,
    "f16": 16, "bf16": 16, "i32": 32, "u32": 32, "f32": 32, "i64": 64, "u64": 64, "f64": 64, "c64": 64, "f4": 4,
    "f6_e2m3": 6, "f6_e3m2": 6,
    # what users type (--dtype, --kv-dtype); int4/fp4 pack two elements per byte
    "fp32": 32, "fp16": 16, "fp8": 8, "fp8_e4m3": 8, "fp8_e5m2": 8, "fp8_e4m3fn": 8, "int8": 8, "int4": 4, "fp4": 4,
    "nvfp4": 4 + 8 / 16, "mxfp4": 4 + 8 / 32,  # E2M1 + an E4M3 scale per 16 / an E8M0 scale per 32
    # torch / Kineto "Input type" (c10 TypeMeta names) and NCCL "dtype" args
    "float": 32, "float32": 32, "double": 64, "float64": 64, "half": 16, "float16": 16, "bfloat16": 16,
    "float8": 8, "float8_e4m3fn": 8, "float8_e5m2": 8, "float8_e4m3fnuz": 8, "float8_e5m2fnuz": 8,
    "float8_e8m0fnu": 8, "float4_e2m1fn_x2": 8,  # (two fp4 values per stored element)
    "uint8": 8, "byte": 8, "char": 8, "signed char": 8, "unsigned char": 8, "short": 16, "short int": 16,
    "int16": 16, "int": 32, "int32": 32, "long": 64, "long int": 64, "int64": 64,
    "qint8": 8, "quint8": 8, "quint4x2": 8,
}


def dtype_key(name: str) -> str:
    """The :data:`DTYPE_BITS` key of a dtype name: lower case, without a ``torch.`` or ``c10::`` prefix."""
    return str(name).strip().lower().removeprefix("torch.").removeprefix("c10::")


def dtype_bits(name: str) -> float:
    """Bits per element of a dtype name (a block-scaled format's scales included); ``ValueError`` for an unknown
    one."""
    key = dtype_key(name)
    if key not in DTYPE_BITS:
        raise ValueError(f"unknown dtype {name!r}; known: {', '.join(DTYPES)}")
    return DTYPE_BITS[key]


def dtype_bytes(name: str) -> float:
    """Bytes per element of a dtype name (0.5 for 4-bit types); ``ValueError`` for an unknown one."""
    return dtype_bits(name) / 8


_AMOUNT = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE]([+-]?[0-9]{1,3}))?\s*([A-Za-z]*)\s*")
_EXAMPLES = "e.g. 27e9, 27GB (10^9) or 25.1GiB (2^30)"


def parse_bytes(value: str | int | float, *, what: str = "byte amount") -> int:
    """A byte amount as an int; ``TracekitError`` (one line, with examples) when it is not one.

    Negative, infinite and NaN amounts are refused; fractions of a byte round to the
    nearest byte.
    """
    if isinstance(value, bool):
        raise BadOptionValue(f"{what} {value!r} is not a byte amount ({_EXAMPLES})")
    if isinstance(value, (int, float)):
        if not math.isfinite(value) or value < 0:
            raise BadOptionValue(f"{what} must be a non-negative number of bytes, got {value!r}")
        return int(round(value))
    text = str(value)
    m = _AMOUNT.fullmatch(text)
    unit = m.group(3).lower() if m else ""
    if m and unit == "b":
        raise BadOptionValue(f"{what} {text!r} is ambiguous (bytes or billions?): write {m.group(1)}GB or "
                            f"{m.group(1)}e9 for 10^9 bytes")
    if not m or unit not in BYTE_UNITS:
        raise BadOptionValue(f"{what} {text!r} is not a byte amount ({_EXAMPLES})")
    number = float(m.group(1) + (f"e{m.group(2)}" if m.group(2) else ""))
    result = number * BYTE_UNITS[unit]
    if not math.isfinite(result):
        raise BadOptionValue(f"{what} {text!r} is too large")
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
