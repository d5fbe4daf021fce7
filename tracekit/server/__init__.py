"""``tracekit capture --server URL``: profile a running SGLang or vLLM server through its own HTTP API.

The server profiles itself (its torch profiler, one trace per rank); tracekit identifies the engine and reads its
configuration, measures the decode step without a profiler from streamed requests, starts and always stops the
profiler under the same load, waits for every rank's trace and writes ``manifest.json`` (``tracekit.manifest/2``)
so that ``tracekit breakdown DIR`` states its savings against the measured step with no flag typed.

* :mod:`.client`: HTTP requests and server-sent-event streams (standard library);
* :mod:`.engines`: SGLang and vLLM: identification, configuration, request bodies, profiler calls, file names;
* :mod:`.load`: the concurrent streamed load and the unprofiled step measured from it;
* :mod:`.traces`: waiting for the rank files (progress, timeout naming what is missing);
* :mod:`.capture`: the whole capture, in order, and the manifest.

Nothing here imports polars (the capture side runs on GPU hosts without it). ``docs/server.md`` is the user's
guide; ``tests/servers/`` holds the test servers that speak each engine's API.
"""

from __future__ import annotations

from tracekit.server.capture import DEFAULT_STEPS, capture_server

__all__ = ["DEFAULT_STEPS", "capture_server"]
