"""The blocks several results share: the trace file (:class:`Source`) and a GPU with its peak bandwidth
(:class:`Gpu`). Frozen :class:`tracekit.contract.Block`s, as every block of a result; this module imports only the
standard library and ``tracekit.contract``."""

from __future__ import annotations

from dataclasses import dataclass

from tracekit.contract import Block


@dataclass(frozen=True)
class Source(Block):
    """``source``: the trace file and what wrote it."""

    path: str
    format: str
    producer_version: str | None
    graph_trace_mode: str

    @classmethod
    def of(cls, meta, **more) -> Source:
        """From a trace's ``meta`` (``tracekit.trace.TraceMeta``); ``more``: a subclass's own fields."""
        return cls(path=meta.path, format=meta.format, producer_version=meta.producer_version,
                   graph_trace_mode=meta.graph_trace_mode, **more)


@dataclass(frozen=True)
class Gpu(Block):
    """``gpu``: a GPU of the trace and its peak memory bandwidth, with where that came from."""

    device: int
    name: str | None
    peak_bw_gbps: float | None
    peak_bw_source: str | None


__all__ = ["Source", "Gpu"]
