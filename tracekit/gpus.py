"""The GPU table: device name -> peak memory bandwidth, dense peak TFLOP/s per dtype, memory size, interconnect.

The data lives in ``tracekit/data/gpus.toml`` (ordered regex patterns, most specific
first, each with its datasheet ``source`` and ``tflops_source``); this module loads it once, matches the
names traces report (``'NVIDIA H200'``, ``'NVIDIA A100-SXM4-40GB'``,
``'Tesla V100-SXM2-32GB'``, ``'AMD Instinct MI300X'``, ...). The precedence of the flags, the manifest and the
trace over the table is :mod:`tracekit.analyses.resolve`'s (``peak_bandwidth``, ``peak_tflops``).

>>> lookup("NVIDIA A100-SXM4-40GB").peak_bw_gbps
1555.0
>>> lookup("NVIDIA H100 80GB HBM3").tflops("bf16")
(989.0, 'bf16')
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path

try:  # Python >= 3.11
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

from tracekit.errors import BadGpuTable

# The peak a GEMM runs at, by the dtype of its weights (a user's --dtype, a checkpoint's, a trace's operand type):
# the keys of an entry's peak_tflops it reads, first found wins. Weight-only integer quantization (GPTQ/AWQ int4,
# int8 weights) dequantizes to the activations' bf16 and runs at the bf16 rate; nvfp4/mxfp4 read the fp4 figure;
# on a GPU without tensor cores for fp8 (A100, A6000) or fp4 (Hopper, MI300X), the weights are dequantized
# (W8A16 / W4A16 kernels such as Marlin) and the GEMMs run at the bf16 rate.
_FP8, _FP4 = ("fp8", "bf16"), ("fp4", "bf16")
PEAK_KEYS: dict[str, tuple[str, ...]] = {
    "bf16": ("bf16",), "bfloat16": ("bf16",), "fp16": ("fp16", "bf16"), "f16": ("fp16", "bf16"),
    "float16": ("fp16", "bf16"), "half": ("fp16", "bf16"),
    "fp8": _FP8, "fp8_e4m3": _FP8, "fp8_e5m2": _FP8, "fp8_e4m3fn": _FP8, "f8_e4m3": _FP8, "f8_e5m2": _FP8,
    "float8_e4m3fn": _FP8, "float8_e5m2": _FP8,
    "fp4": _FP4, "f4": _FP4, "nvfp4": ("nvfp4", *_FP4), "mxfp4": ("mxfp4", *_FP4),
    "int4": ("bf16",), "int8": ("bf16",),
}
WEIGHT_ONLY = ("int4", "int8")  # (the dtypes PEAK_KEYS runs at the bf16 rate)


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
    peak_tflops: tuple[tuple[str, float], ...] = ()  # (dtype key, dense TFLOP/s of one device), as the table lists
    tflops_source: str | None = None
    graph_node_us: float | None = None  # a CUDA-graph node's cost besides its GPU time, unprofiled (measured)
    graph_node_source: str | None = None
    graph_node_gap_us: float | None = None  # the gap between two nodes inside one graph replay, unprofiled
    graph_node_gap_source: str | None = None

    @property
    def device_bw_gbps(self) -> float:
        """Peak bandwidth of one device as the driver exposes it (MI250: one GCD)."""
        return self.peak_bw_gbps / self.devices_per_package

    def tflops(self, dtype: str | None) -> tuple[float | None, str | None]:
        """Dense peak TFLOP/s of one device for GEMMs whose weights are ``dtype`` (:data:`PEAK_KEYS`), with the
        table key it came from (``bf16`` for fp8 weights on a GPU without fp8 tensor cores: dequantized);
        ``(None, None)`` when the datasheet lists none for it.

        >>> lookup("NVIDIA H100 SXM").tflops("fp8"), lookup("NVIDIA A100 80GB SXM").tflops("fp8")
        ((1979.0, 'fp8'), (312.0, 'bf16'))
        >>> lookup("NVIDIA GB10").tflops("bf16")
        (None, None)
        """
        have = dict(self.peak_tflops)
        for key in PEAK_KEYS.get(_dtype_key(dtype), ()) if dtype else ():
            if key in have:
                return have[key], key
        return None, None

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
            "peak_tflops": dict(self.peak_tflops),
            "tflops_source": self.tflops_source,
            "graph_node_us": self.graph_node_us,
            "graph_node_source": self.graph_node_source,
            "graph_node_gap_us": self.graph_node_gap_us,
            "graph_node_gap_source": self.graph_node_gap_source,
        }


def _dtype_key(name: str) -> str:
    return str(name).strip().lower().removeprefix("torch.").removeprefix("c10::")


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
        raise BadGpuTable(f"cannot read GPU table {path or 'gpus.toml'}: {e}") from e
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
                peak_tflops=tuple((str(k), float(v)) for k, v in dict(entry.get("peak_tflops", {})).items()),
                tflops_source=entry.get("tflops_source"),
                graph_node_us=float(entry["graph_node_us"]) if "graph_node_us" in entry else None,
                graph_node_source=entry.get("graph_node_source"),
                graph_node_gap_us=float(entry["graph_node_gap_us"]) if "graph_node_gap_us" in entry else None,
                graph_node_gap_source=entry.get("graph_node_gap_source"),
            )
            for key in ("graph_node_us", "graph_node_gap_us"):
                if getattr(spec, key) is not None and (not _usable(getattr(spec, key))
                                                       or not getattr(spec, key.replace("_us", "_source"))):
                    raise ValueError(f"{key} must be a positive number, with a {key.replace('_us', '_source')}")
            if any(not _usable(v) for _, v in spec.peak_tflops) or (spec.peak_tflops and not spec.tflops_source):
                raise ValueError("peak_tflops must be positive numbers, with a tflops_source")
            rx = re.compile(spec.pattern, re.IGNORECASE)
        except (KeyError, TypeError, ValueError, re.error) as e:
            raise BadGpuTable(f"GPU table {path or 'gpus.toml'}: entry {i + 1} is invalid ({e!r})") from e
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


def graph_node_us(name: str | None, *, table: str | Path | None = None) -> float | None:
    """The GPU table's measured cost of one CUDA-graph node on ``name`` besides its GPU time (µs, unprofiled), the
    one figure every graph what-if uses (the CUDA-graph lever, the plain step's re-cost); None where the table has
    none for that GPU.

    >>> graph_node_us("NVIDIA H100 80GB HBM3"), graph_node_us("NVIDIA H200"), graph_node_us("NVIDIA A100-SXM4-40GB")
    (0.356, None, None)
    """
    spec = lookup(name, table=table)
    return spec.graph_node_us if spec else None


def graph_node_gap_us(name: str | None, *, table: str | Path | None = None) -> float | None:
    """The GPU table's measured gap between two nodes inside one CUDA-graph replay on ``name`` (µs, unprofiled): what
    the plain step's re-cost prices a node of a speculative step's verify graph at; None where the table has none.

    >>> graph_node_gap_us("NVIDIA H100 80GB HBM3"), graph_node_gap_us("NVIDIA H200"), graph_node_gap_us("NVIDIA B200")
    (0.29, 0.37, None)
    """
    spec = lookup(name, table=table)
    return spec.graph_node_gap_us if spec else None


def list_gpus(*, table: str | Path | None = None) -> list[GpuSpec]:
    """Every row of the table, in match order."""
    return [spec for _, spec in _table(str(table) if table is not None else None)]


def _usable(x: float | None) -> bool:
    return x is not None and isinstance(x, (int, float)) and math.isfinite(x) and x > 0


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


def tflops_markdown(*, table: str | Path | None = None) -> str:
    """The dense peak TFLOP/s of the GPU table as markdown, with sources (docs/roofline.md is generated from it)."""
    keys = ("bf16", "fp16", "fp8", "fp4")
    out = ["| GPU | " + " | ".join(keys) + " | source |", "|---|" + "---:|" * len(keys) + "---|"]
    for s in list_gpus(table=table):
        if not s.peak_tflops:
            continue
        have = dict(s.peak_tflops)
        out.append(f"| {s.name} | " + " | ".join(f"{have[k]:,g}" if k in have else "—" for k in keys)
                   + f" | {s.tflops_source} |")
    return "\n".join(out)
