"""Kineto JSON, part 3 of 3: the header. The top-level keys around ``traceEvents`` -> trace metadata.

Producer versions (PyTorch, CUPTI, CUDA, ROCm), the ranks of a distributed run, and the GPUs of
``deviceProperties``. Values whose JSON type varies between producers are kept as ``msgspec.Raw`` by the
stream and read here leniently: a value of the wrong type is unknown (null), never an error.
"""

from __future__ import annotations

import msgspec
import polars as pl
from msgspec import Raw, Struct

from tracekit.readers.kineto.stream import NULL, Doc
from tracekit.trace import GPUS, ProcessGroup, conform, empty


class _Device(Struct):
    id: Raw = NULL
    name: Raw = NULL
    totalGlobalMem: Raw = NULL
    numSms: Raw = NULL


def header_int(raw: Raw) -> int | None:
    try:
        v = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return None
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, str) and v.strip().lstrip("-").isdigit():
        return int(v)
    return None


def header_text(raw: Raw) -> str | None:
    try:
        v = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return None
    if v is None or isinstance(v, (dict, list)):
        return None
    return str(v)


def producer_version(doc: Doc) -> str | None:
    parts = []
    for label, raw in (
        ("pytorch", doc.torch_version),
        ("pytorch", doc.pytorch_version),
        ("cupti", doc.cupti_version),
        ("cuda runtime", doc.cuda_runtime_version),
        ("cuda driver", doc.cuda_driver_version),
        ("roctracer", doc.roctracer_version),
        ("hip runtime", doc.hip_runtime_version),
    ):
        v = header_text(raw)
        if v is not None and v != "":
            parts.append(f"{label} {v}")
    return ", ".join(parts) or None


def distributed(raw: Raw) -> tuple[int | None, int | None]:
    try:
        info = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return None, None
    if not isinstance(info, dict):
        return None, None
    return (
        header_int(msgspec.json.encode(info.get("rank"))),
        header_int(msgspec.json.encode(info.get("world_size"))),
    )


def process_groups(raw: Raw) -> tuple[ProcessGroup, ...]:
    """The process groups of ``distributedInfo.pg_config`` (PyTorch 2.2+); entries without a usable size are
    skipped, anything malformed is none."""
    try:
        info = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return ()
    pgs = info.get("pg_config") if isinstance(info, dict) else None
    if not isinstance(pgs, list):
        return ()
    out = []
    for pg in pgs:
        if not isinstance(pg, dict):
            continue
        size = header_int(msgspec.json.encode(pg.get("pg_size")))
        if size is None or size < 1:
            continue
        ranks = pg.get("ranks")
        ranks = tuple(r for r in ranks if isinstance(r, int) and not isinstance(r, bool)) \
            if isinstance(ranks, list) else ()
        text = [header_text(msgspec.json.encode(pg.get(k))) for k in ("pg_name", "pg_desc", "backend_config")]
        out.append(ProcessGroup(name=text[0] or "", desc=text[1], backend=text[2], size=size, ranks=ranks))
    return tuple(out)


def gpus_from_header(raw: Raw) -> pl.DataFrame | None:
    try:
        devs = msgspec.json.decode(raw, type=list[_Device] | None)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    if devs is None:
        return None
    rows = []
    for i, d in enumerate(devs):
        name = header_text(d.name)
        rows.append(
            {
                "device": header_int(d.id) if header_int(d.id) is not None else i,
                "name": name or None,
                "peak_bw_gbps": None,  # Kineto records no memory clock or bus width
                "sm_count": header_int(d.numSms),
                "memory_bytes": header_int(d.totalGlobalMem),
            }
        )
    if not rows:
        return empty(GPUS)
    return conform(pl.DataFrame(rows, schema={k: v[0] for k, v in GPUS.items()}), GPUS)



def merge_into(header: Doc, doc: Doc) -> None:
    """Copy ``doc``'s known header fields (those before ``traceEvents``, and the tail's after it) into ``header``."""
    for f in Doc.__struct_fields__:
        v = getattr(doc, f)
        if f != "traceEvents" and not (isinstance(v, Raw) and bytes(v) == b"null"):
            setattr(header, f, v)
