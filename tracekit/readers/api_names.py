"""Host API names that launch GPU work or synchronise with it: the one table, polars-free.

:mod:`tracekit.readers.common` builds its polars expressions (``strip_api_version``, ``api_kind``) from these;
:func:`strip_version` and :func:`launch_kind` are the same rules on one Python string (the nsys reader's head
start picks the runtime calls to scan before polars is imported: :mod:`tracekit.readers.nsys.scan`).
"""

from __future__ import annotations

import re

# Host API name (version suffix stripped) -> launch kind. Matched by prefix, first match wins.
API_KINDS: list[tuple[str, str]] = [
    ("cudaGraphLaunch", "graph"),
    ("cuGraphLaunch", "graph"),
    ("hipGraphLaunch", "graph"),
    ("cudaLaunch", "kernel"),  # cudaLaunchKernel, cudaLaunchKernelExC, cudaLaunchCooperativeKernel
    ("cuLaunch", "kernel"),  # cuLaunchKernel, cuLaunchKernelEx, cuLaunchCooperativeKernel
    ("hipLaunch", "kernel"),
    ("hipExtLaunch", "kernel"),
    ("hipModuleLaunch", "kernel"),
    ("cudaMemset", "memset"),
    ("cuMemset", "memset"),
    ("hipMemset", "memset"),
    ("cudaMemcpy", "memcpy"),
    ("cuMemcpy", "memcpy"),
    ("hipMemcpy", "memcpy"),
    ("cudaDeviceSynchronize", "sync"),
    ("cudaStreamSynchronize", "sync"),
    ("cudaEventSynchronize", "sync"),
    ("cudaStreamWaitEvent", "sync"),
    ("cuStreamSynchronize", "sync"),
    ("cuEventSynchronize", "sync"),
    ("cuCtxSynchronize", "sync"),
    ("hipDeviceSynchronize", "sync"),
    ("hipStreamSynchronize", "sync"),
    ("hipEventSynchronize", "sync"),
]

# The version / per-thread-stream suffix of an API name (``_v7000``, ``_ptsz_v7000``), at the very end.
VERSION_SUFFIX = r"(_ptsz|_ptds)?(_v\d+)?(_ptsz|_ptds)?$"
_SUFFIX_RX = re.compile(VERSION_SUFFIX[:-1] + r"\Z")  # (Python's $ would also match before a final newline)


def strip_version(name: str) -> str:
    """``cudaLaunchKernel_v7000`` -> ``cudaLaunchKernel``; ``cudaMemcpyAsync_ptsz_v7000`` -> ``cudaMemcpyAsync``.

    >>> strip_version("cudaMemcpyAsync_ptsz_v7000"), strip_version("cuLaunchKernel")
    ('cudaMemcpyAsync', 'cuLaunchKernel')
    """
    return _SUFFIX_RX.sub("", name, count=1)


def launch_kind(name: str) -> str:
    """Launch kind of a (suffix-stripped) host API name: graph, kernel, memset, memcpy, sync or other.

    >>> launch_kind("cudaLaunchKernelExC"), launch_kind("cudaGetDevice")
    ('kernel', 'other')
    """
    return next((kind for prefix, kind in API_KINDS if name.startswith(prefix)), "other")
