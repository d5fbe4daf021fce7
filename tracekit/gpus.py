"""The GPU table: device name -> peak memory bandwidth, memory size, interconnect.

The data lives in ``tracekit/data/gpus.toml`` (ordered regex patterns, most specific
first, each with its datasheet ``source``); this module loads it once, matches the
names traces report (``'NVIDIA H200'``, ``'NVIDIA A100-SXM4-40GB'``,
``'Tesla V100-SXM2-32GB'``, ``'AMD Instinct MI300X'``, ...) and implements the
contract's precedence for peak bandwidth: flag > manifest > trace > table.

>>> lookup("NVIDIA A100-SXM4-40GB").peak_bw_gbps
1555.0
>>> resolve_peak_bw(None, None, None, "NVIDIA H200")
(4800.0, 'table')
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Literal

try:  # Python >= 3.11
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

from tracekit.errors import TracekitError

PeakBwSource = Literal["flag", "manifest", "trace", "table"]


@dataclass(frozen=True)
class GpuSpec:
    """One row of the GPU table. Bandwidths in GB/s (1e9 B/s); links per direction."""

    name: str
    peak_bw_gbps: float
    memory_gb: float
    link: str
    link_bw_gbps: float
    source: str
    pattern: str = ""
    note: str | None = None
    devices_per_package: int = 1

    @property
    def device_bw_gbps(self) -> float:
        """Peak bandwidth of one device as the driver exposes it (MI250: one GCD)."""
        return self.peak_bw_gbps / self.devices_per_package

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "peak_bw_gbps": self.peak_bw_gbps,
            "device_bw_gbps": self.device_bw_gbps,
            "memory_gb": self.memory_gb,
            "link": self.link,
            "link_bw_gbps": self.link_bw_gbps,
            "source": self.source,
            "note": self.note,
        }


def _normalize(name: str) -> str:
    # Trace producers spell the same board 'A100-SXM4-40GB', 'A100 SXM4 40GB', ...
    return re.sub(r"[\s_\-]+", " ", name).strip()


def load_table(path: str | Path | None = None) -> tuple[tuple[re.Pattern, GpuSpec], ...]:
    """Parse a GPU table TOML (default: the shipped one) into ordered (regex, spec) pairs.

    Raises ``TracekitError`` when a user-supplied file is unreadable or malformed.
    """
    try:
        if path is None:
            raw = resources.files("tracekit").joinpath("data/gpus.toml").read_bytes()
        else:
            raw = Path(path).read_bytes()
        data = tomllib.loads(raw.decode("utf-8"))
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise TracekitError(f"cannot read GPU table {path or 'gpus.toml'}: {e}") from e
    rows = []
    for i, entry in enumerate(data.get("gpu", [])):
        try:
            spec = GpuSpec(
                name=str(entry["name"]),
                peak_bw_gbps=float(entry["peak_bw_gbps"]),
                memory_gb=float(entry["memory_gb"]),
                link=str(entry["link"]),
                link_bw_gbps=float(entry["link_bw_gbps"]),
                source=str(entry["source"]),
                pattern=str(entry["pattern"]),
                note=entry.get("note"),
                devices_per_package=int(entry.get("devices_per_package", 1)),
            )
            rx = re.compile(spec.pattern, re.IGNORECASE)
        except (KeyError, TypeError, ValueError, re.error) as e:
            raise TracekitError(f"GPU table {path or 'gpus.toml'}: entry {i + 1} is invalid ({e!r})") from e
        rows.append((rx, spec))
    return tuple(rows)


@lru_cache(maxsize=None)
def _table(path: str | None) -> tuple[tuple[re.Pattern, GpuSpec], ...]:
    return load_table(path)


def lookup(name: str | None, *, table: str | Path | None = None) -> GpuSpec | None:
    """The table row for a device name as a trace reports it, or None if unknown.

    ``table``: a user TOML with the same layout as ``tracekit/data/gpus.toml``.

    >>> lookup("NVIDIA GeForce RTX 3090").peak_bw_gbps
    936.0
    >>> lookup("NVIDIA GH200 480GB").name
    'NVIDIA GH200'
    >>> lookup("Some Future GPU") is None
    True
    """
    if not name or not name.strip():
        return None
    key = _normalize(name)
    for rx, spec in _table(str(table) if table is not None else None):
        if rx.search(key):
            return spec
    return None


def list_gpus(*, table: str | Path | None = None) -> list[GpuSpec]:
    """Every row of the table, in match order."""
    return [spec for _, spec in _table(str(table) if table is not None else None)]


def _usable(x: float | None) -> bool:
    return x is not None and isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def resolve_peak_bw(
    flag: float | None,
    manifest: float | None,
    trace: float | None,
    name: str | None,
    *,
    table: str | Path | None = None,
) -> tuple[float | None, PeakBwSource | None]:
    """Peak memory bandwidth (GB/s) and where it came from: flag > manifest > trace > table.

    A missing, zero, negative or NaN manifest/trace value is skipped (nsys writes 0 when
    it does not know); a bad ``flag`` is the user's error and raises ``TracekitError``.
    The table gives one device's share (an MI250 GCD gets half the package figure).

    >>> resolve_peak_bw(900.0, 1000.0, 4800.0, "NVIDIA H200")
    (900.0, 'flag')
    >>> resolve_peak_bw(None, None, 0.0, "NVIDIA H200")
    (4800.0, 'table')
    >>> resolve_peak_bw(None, None, None, None)
    (None, None)
    """
    if flag is not None:
        if not _usable(flag):
            raise TracekitError(f"--peak-bw must be a positive number of GB/s, got {flag!r}")
        return float(flag), "flag"
    if _usable(manifest):
        return float(manifest), "manifest"
    if _usable(trace):
        return float(trace), "trace"
    spec = lookup(name, table=table)
    if spec is not None:
        return float(spec.device_bw_gbps), "table"
    return None, None


def table_markdown(*, table: str | Path | None = None) -> str:
    """The GPU table as markdown (docs/roofline.md is generated from it)."""
    out = [
        "| GPU | peak memory bandwidth (GB/s) | memory (GB) | link | link GB/s per direction | source |",
        "|---|---:|---:|---|---:|---|",
    ]
    for s in list_gpus(table=table):
        bw = f"{s.peak_bw_gbps:g}"
        if s.devices_per_package > 1:
            bw += f" ({s.device_bw_gbps:g} per device)"
        src = s.source + (f"; {s.note}" if s.note else "")
        out.append(f"| {s.name} | {bw} | {s.memory_gb:g} | {s.link} | {s.link_bw_gbps:g} | {src} |")
    return "\n".join(out)
