"""TEST SERVERS — not SGLang, not vLLM: small standard-library HTTP servers that speak each engine's API as the
engine's own source defines it, for testing ``tracekit capture --server`` where the real engines cannot run (CI,
a CPU-only machine, a GPU image whose torch the engines do not support).

* :mod:`.common`: the HTTP plumbing (a threaded ``http.server``, JSON, chunked server-sent events, a server that
  can die mid-request) and the scheduler every test engine runs: requests queued, prefilled, decoded step by step
  with a speculative accept pattern, the engine's profiler asked between two batches, as a serving scheduler does;
* :mod:`.sglang`: SGLang's ``/get_server_info`` and ``/server_info``, ``/get_model_info`` and ``/model_info``,
  ``/generate`` (SSE, ``meta_info.completion_tokens`` / ``spec_verify_ct``), ``/start_profile`` and
  ``/stop_profile`` with SGLang's state machine (``num_steps`` auto-stop, HTTP 500 when already profiling or not
  profiling) and file names ``{profile_id}-TP-{tp}[-DP-{dp}][-PP-{pp}].trace.json.gz``;
* :mod:`.vllm`: vLLM's ``/version``, ``/v1/models``, ``/server_info`` (dev mode only), ``/metrics`` with the
  ``vllm:spec_decode_*_total`` counters, ``/v1/completions`` (SSE with usage), ``/start_profile`` and
  ``/stop_profile`` only with a profiler configured (else 404), file names
  ``dp{d}_pp{p}_tp{t}_dcp0_ep{e}_rank{r}.{time_ns}.pt.trace.json.gz``.

Each cites the engine file it follows. The traces they write are REAL traces: on the CPU, copies of committed
samples (``sample_traces/``) or of the shared multi-rank sets (read in place, copied only into a test's temporary
folder); on the GPU (``capture/server_gpu.py``), the torch profiler around a real speculative decode loop.

    python -m tests.servers sglang --port 30000 --tp 2 --traces A.json.gz B.json.gz
    python -m tests.servers vllm --port 8000 --profiler-dir /tmp/vp --traces A.json.gz
"""
