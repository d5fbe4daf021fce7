"""Helpers shared by the readers (and only by them)."""

from __future__ import annotations

import polars as pl

from tracekit.readers.api_names import API_KINDS as _API_KINDS  # (the one table: tracekit.readers.api_names)
from tracekit.readers.api_names import VERSION_SUFFIX
from tracekit.trace import WORK_KINDS  # noqa: E402,F401  (re-exported for the readers)


def strip_api_version(name: pl.Expr) -> pl.Expr:
    """``cudaLaunchKernel_v7000`` -> ``cudaLaunchKernel``; ``cudaMemcpyAsync_ptsz_v7000`` -> ``cudaMemcpyAsync``."""
    return name.str.replace(VERSION_SUFFIX, "")


def api_kind(name: pl.Expr) -> pl.Expr:
    """Launch kind of a (suffix-stripped) host API name, as a polars expression."""
    expr = pl.lit("other")
    for prefix, kind in reversed(_API_KINDS):
        expr = pl.when(name.str.starts_with(prefix)).then(pl.lit(kind)).otherwise(expr)
    return expr


# (nesting depth lives with the other interval primitives; re-exported for the readers)
from tracekit.intervals import nesting_depth  # noqa: E402,F401


def release_freed_memory() -> None:
    """Give the C library's freed heap memory back to the system (glibc's ``malloc_trim``; nothing elsewhere).

    The SQLite engines build their Arrow batches with the C allocator on their own threads, and glibc keeps what
    those threads free in their arenas for reuse: ~0.35 GB after reading ten million kernels (0.04 GB at one
    million), memory the analysis never reuses (polars allocates with its own allocator), which would only add
    to the peak of everything after the read. The call takes ~0.04 s at ten million kernels."""
    import ctypes
    import sys

    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # (not glibc: musl has no malloc_trim, and nothing to give back this way)
        pass
