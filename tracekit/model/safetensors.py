"""Read safetensors HEADERS only: the tensors' names, dtypes, shapes and stored byte sizes.

A ``.safetensors`` file is an 8-byte little-endian header length N, N bytes of JSON
``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}``,
then the tensor data. Only the first 8 + N bytes are read, so a sparse copy (the header
followed by a truncated or zero-filled data section) reads the same as the real file.

The header comes from a file someone else wrote: its length is bounded (100 MB, the
format's own limit), the JSON must be an object of well-formed entries, and each
tensor's byte size from its offsets must agree with dtype x shape. Anything else is a
one-line ``TracekitError`` naming the file.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path

from tracekit.errors import BadModelFiles, TracekitError
from tracekit.model.units import dtype_bits

MAX_HEADER_BYTES = 100_000_000

# The dtypes the safetensors format defines (as its headers spell them); their sizes are tracekit.model.units'.
SAFETENSORS_DTYPES = ("BOOL", "U8", "I8", "F8_E4M3", "F8_E5M2", "F8_E8M0", "E8M0", "I16", "U16", "F16", "BF16", "I32",
                      "U32", "F32", "I64", "U64", "F64", "C64", "F4", "F6_E2M3", "F6_E3M2")
DTYPE_BITS: dict[str, int] = {d: dtype_bits(d) for d in SAFETENSORS_DTYPES}


@dataclass(frozen=True)
class TensorInfo:
    """One stored tensor: what its header says. ``nbytes`` = its stored bytes (from the offsets)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    file: str | None = None

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def _fail(path: Path, why: str) -> TracekitError:
    return BadModelFiles(f"{path}: not a readable safetensors file ({why}); re-download it or pass --dtype "
                         "with a bare config.json")


def read_header(path: str | Path) -> tuple[dict[str, TensorInfo], dict[str, str]]:
    """``({name: TensorInfo}, metadata)`` from one ``.safetensors`` file's header.

    Reads 8 + N bytes, never the tensor data.
    """
    p = Path(path)
    try:
        with p.open("rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise _fail(p, f"{len(head)} bytes, shorter than the 8-byte header length")
            (n,) = struct.unpack("<Q", head)
            if n < 2 or n > MAX_HEADER_BYTES:
                raise _fail(p, f"header length {n:,} bytes is outside 2..{MAX_HEADER_BYTES:,}")
            raw = f.read(n)
    except OSError as e:
        raise BadModelFiles(f"cannot read {p}: {e.strerror or e}") from e
    if len(raw) < n:
        raise _fail(p, f"the file ends inside its {n:,}-byte header")
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise _fail(p, f"header is not JSON: {type(e).__name__}") from None
    if not isinstance(header, dict):
        raise _fail(p, "header is not a JSON object")
    meta = header.pop("__metadata__", None) or {}
    if not isinstance(meta, dict):
        raise _fail(p, "__metadata__ is not an object")
    tensors: dict[str, TensorInfo] = {}
    for name, entry in header.items():
        tensors[name] = _tensor(p, name, entry)
    return tensors, {str(k): str(v) for k, v in meta.items()}


def _tensor(p: Path, name: str, entry) -> TensorInfo:
    short = name if len(name) <= 80 else name[:77] + "..."
    if not isinstance(entry, dict):
        raise _fail(p, f"entry {short!r} is not an object")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in DTYPE_BITS:
        raise _fail(p, f"tensor {short!r} has unknown dtype {str(dtype)[:20]!r}")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                              for d in shape) or len(shape) > 16:
        raise _fail(p, f"tensor {short!r} has a malformed shape")
    if (not isinstance(offsets, list) or len(offsets) != 2
            or not all(isinstance(o, int) and not isinstance(o, bool) and o >= 0 for o in offsets)
            or offsets[1] < offsets[0]):
        raise _fail(p, f"tensor {short!r} has malformed data_offsets")
    nbytes = offsets[1] - offsets[0]
    expected = math.ceil(math.prod(shape) * DTYPE_BITS[dtype] / 8)
    if nbytes != expected:
        raise _fail(p, f"tensor {short!r}: data_offsets span {nbytes:,} bytes but {dtype} x {shape} is "
                       f"{expected:,}")
    return TensorInfo(name=name, dtype=dtype, shape=tuple(shape), nbytes=nbytes, file=p.name)


def write_header_only(path: str | Path, tensors: dict[str, tuple[str, list[int]]],
                      metadata: dict[str, str] | None = None) -> int:
    """Write a safetensors file whose data section is a sparse hole of the right size
    (the header is real; the data reads as zeros). For tests and for sharing a
    checkpoint's structure without its weights. Returns the data bytes it stands for.
    """
    header: dict = {}
    offset = 0
    for name, (dtype, shape) in tensors.items():
        n = math.ceil(math.prod(shape) * DTYPE_BITS[dtype] / 8)
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    if metadata:
        header["__metadata__"] = metadata
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    with Path(path).open("wb") as f:
        f.write(struct.pack("<Q", len(blob)) + blob)
        f.truncate(8 + len(blob) + offset)
    return offset
