"""TEST SERVER speaking vLLM's OpenAI-compatible API (not vLLM): what ``tracekit capture --server`` calls, as vLLM's
source defines it.

* ``GET /version`` ``{"version"}``; ``GET /v1/models`` (``id``, ``root``, ``max_model_len``); ``GET /metrics``
  (Prometheus text: ``vllm:spec_decode_num_drafts_total``, ``..._num_draft_tokens_total``,
  ``..._num_accepted_tokens_total``, ``..._num_accepted_tokens_per_pos_total`` with ``engine`` and ``model_name``
  labels, as ``prometheus_client`` exposes the counters of vllm-project/vllm@ee4ceaae:vllm/v1/spec_decode/
  metrics.py:SpecDecodingProm, observed once per verified draft as ``SpecDecodingStats.observe_draft`` does);
  ``GET /server_info?config_format=json`` only in dev mode (``VLLM_SERVER_DEV_MODE=1``:
  vllm-project/vllm@4652ef5d:vllm/entrypoints/serve/instrumentator/server_info.py).
* ``POST /v1/completions`` with ``stream``: ``data: {"id", "object": "text_completion", "choices": [{"text",
  "finish_reason"}], "usage"}`` (``usage`` in every chunk with ``stream_options.continuous_usage_stats``; a last
  usage-only chunk with ``include_usage``), then ``data: [DONE]``.
* ``POST /start_profile`` / ``POST /stop_profile``: no body, an empty 200, registered only when a profiler is
  configured (``--profiler-config``; else 404: vllm-project/vllm@063e5a89:vllm/entrypoints/serve/profile/
  api_router.py:attach_router). Each worker's ``WorkerProfiler`` (vllm-project/vllm@02773ee0:vllm/profiler/
  wrapper.py): a start while active is ignored, ``max_iterations`` stops it after that many steps, the stop flushes
  ``{worker_name}.{time_ns}.pt.trace.json.gz`` (``tensorboard_trace_handler``) and ``profiler_out_{rank}.txt``
  into ``torch_profiler_dir`` before ``/stop_profile`` answers; ``worker_name`` =
  ``dp{d}_pp{p}_tp{t}_dcp0_ep{e}_rank{r}`` (vllm-project/vllm@5a6541db:vllm/distributed/utils.py:
  get_worker_rank_suffix).
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

from tests.servers.common import App, Request, Scheduler, SimScheduler, TestServer, send_json, send_text, stream_request

VERSION = "0.13.0.test"   # a test server: never mistaken for a release


class VLLMProfiler:
    """Every worker's ``WorkerProfiler`` + ``TorchProfilerWrapper`` (one state: the workers step together)."""

    def __init__(self, backend, ranks: list[tuple[int, int, int, int, int]], folder: Path,
                 max_iterations: int = 0):
        self.backend, self.ranks, self.folder, self.max_iters = backend, ranks, Path(folder), max_iterations
        self.active = self.running = False
        self.profiling_for = 0
        self.exports: list[list[Path]] = []
        self.starts = 0

    def start(self) -> None:
        if self.active:   # "start_profile received when profiler is already active. Ignoring request."
            return
        self.active = True
        self.starts += 1
        self.backend.start(activities=["CPU", "CUDA"], with_stack=True, record_shapes=False)
        self.running = True

    def step(self) -> None:
        if not self.active:
            return
        if self.running:
            self.profiling_for += 1
        if self.max_iters > 0 and self.running and self.profiling_for > self.max_iters:
            self._stop()

    def stop(self) -> None:
        if not self.active:
            return
        self.active = False
        self.profiling_for = 0
        if self.running:
            self._stop()

    def _stop(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        paths = [self.folder / f"dp{d}_pp{p}_tp{t}_dcp0_ep{e}_rank{r}.{time.time_ns()}.pt.trace.json.gz"
                 for d, p, t, e, r in self.ranks]
        self.backend.export(paths)
        for *_, r in self.ranks:
            (self.folder / f"profiler_out_{r}.txt").write_text("(test server: no table)\n")
        self.exports.append(paths)
        self.running = False


class VLLMApp(App):
    def __init__(self, *, sched: Scheduler | None = None, backend=None, model: str = "test/model",
                 served_model: str | None = None, tp: int = 1, pp: int = 1, dp: int = 1,
                 enable_expert_parallel: bool = False, speculative: dict | None = None,
                 profiler_dir: str | None = None, max_iterations: int = 0, dev_mode: bool = False,
                 enforce_eager: bool = False, dtype: str = "bfloat16"):
        self.sched = sched or SimScheduler()
        self.model, self.served = model, served_model or model
        self.tp, self.pp, self.dp, self.ep_on = tp, pp, dp, enable_expert_parallel
        self.spec, self.profiler_dir, self.dev_mode = speculative, profiler_dir, dev_mode
        self.enforce_eager, self.dtype = enforce_eager, dtype
        self.counters = {"drafts": 0, "draft_tokens": 0, "accepted": 0}
        self.per_pos = [0] * int((speculative or {}).get("num_speculative_tokens") or 0)
        world = tp * pp
        ranks = [(d, p, t, (d * tp + t) if enable_expert_parallel else 0, d * world + p * tp + t)
                 for d in range(dp) for p in range(pp) for t in range(tp)]
        self.profiler = VLLMProfiler(backend, ranks, Path(profiler_dir or "/nonexistent"), max_iterations)
        self.sched.before_batch = lambda mode, bs: self.profiler.step()
        decode = self.sched.decode

        def counted(reqs):
            got = decode(reqs)
            if self.spec:
                k = len(self.per_pos)
                for n in got:   # SpecDecodingStats.observe_draft(num_draft_tokens=k, num_accepted_tokens=n - 1)
                    self.counters["drafts"] += 1
                    self.counters["draft_tokens"] += k
                    self.counters["accepted"] += n - 1
                    for i in range(n - 1):
                        self.per_pos[i] += 1
            return got

        self.sched.decode = counted

    @property
    def profiling(self) -> bool:
        return self.profiler.running

    def close(self) -> None:
        self.sched.stop()

    def routes(self) -> dict:
        r = {("GET", "/health"): self.health, ("GET", "/version"): self.version, ("GET", "/v1/models"): self.models,
             ("GET", "/metrics"): self.metrics, ("POST", "/v1/completions"): self.completions}
        if self.profiler_dir:
            r[("POST", "/start_profile")] = self.start_profile
            r[("POST", "/stop_profile")] = self.stop_profile
        if self.dev_mode:
            r[("GET", "/server_info")] = self.server_info
        return r

    def health(self, h, body, q):
        send_text(h, 200, "")

    def version(self, h, body, q):
        send_json(h, 200, {"version": VERSION})

    def models(self, h, body, q):
        send_json(h, 200, {"object": "list", "data": [{
            "id": self.served, "object": "model", "created": int(time.time()), "owned_by": "vllm", "root": self.model,
            "parent": None, "max_model_len": 4096, "permission": []}]})

    def metrics(self, h, body, q):
        lab = f'engine="0",model_name="{self.served}"'
        lines = ["# HELP vllm:num_requests_running Number of requests in model execution batches.",
                 "# TYPE vllm:num_requests_running gauge",
                 f"vllm:num_requests_running{{{lab}}} {float(len(self.sched.running))}",
                 "# TYPE vllm:cache_config_info gauge",
                 'vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="0",num_gpu_blocks="4096"} 1.0']
        if self.spec:
            for name, key in (("num_drafts", "drafts"), ("num_draft_tokens", "draft_tokens"),
                              ("num_accepted_tokens", "accepted")):
                lines += [f"# TYPE vllm:spec_decode_{name}_total counter",
                          f"vllm:spec_decode_{name}_total{{{lab}}} {float(self.counters[key])}",
                          f"vllm:spec_decode_{name}_created{{{lab}}} 1.7e9"]
            lines.append("# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter")
            lines += [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{lab},position="{i}"}} {float(v)}'
                      for i, v in enumerate(self.per_pos)]
        send_text(h, 200, "\n".join(lines) + "\n", "text/plain; version=0.0.4; charset=utf-8")

    def server_info(self, h, body, q):
        cfg = {
            "model_config": {"model": self.model, "dtype": self.dtype, "max_model_len": 4096,
                             "enforce_eager": self.enforce_eager},
            "parallel_config": {"tensor_parallel_size": self.tp, "pipeline_parallel_size": self.pp,
                                "data_parallel_size": self.dp, "enable_expert_parallel": self.ep_on},
            "speculative_config": self.spec,
            "compilation_config": {"cudagraph_mode": "NONE" if self.enforce_eager else "FULL_AND_PIECEWISE"},
            "cache_config": {"block_size": 16, "cache_dtype": "auto"},
            "profiler_config": ({"profiler": "torch", "torch_profiler_dir": self.profiler_dir,
                                 "max_iterations": self.profiler.max_iters} if self.profiler_dir
                                else {"profiler": None, "torch_profiler_dir": ""}),
        }
        fmt = q.get("config_format", "text")
        send_json(h, 200, {"vllm_config": cfg if fmt == "json" else json.dumps(cfg), "vllm_env": {},
                           "system_env": {}})

    def completions(self, h, body, q):
        body = body or {}
        if body.get("model") not in (None, self.served):
            send_json(h, 404, {"error": {"message": f"The model `{body.get('model')}` does not exist.",
                                         "type": "NotFoundError", "param": "model", "code": 404}})
            return
        prompt = body.get("prompt")
        n = int(body.get("max_tokens") or 16)
        req = Request("cmpl-" + uuid.uuid4().hex, len(prompt) if isinstance(prompt, list) else 8, n)
        so = body.get("stream_options") or {}
        cont, include = bool(so.get("continuous_usage_stats")), bool(so.get("include_usage"))
        state = {"produced": 0}
        base = {"id": req.rid, "object": "text_completion", "created": int(time.time()), "model": self.served}

        def usage():
            return {"prompt_tokens": req.prompt_len, "completion_tokens": state["produced"],
                    "total_tokens": req.prompt_len + state["produced"]}

        def event(new, ct, fin):
            state["produced"] += new
            ev = {**base, "choices": [{"index": 0, "text": " tok" * new, "logprobs": None,
                                       "finish_reason": "length" if fin else None, "stop_reason": None}],
                  "usage": usage() if cont else None}
            data = json.dumps(ev).encode()
            if fin and include:
                data += b"\n\ndata: " + json.dumps({**base, "choices": [], "usage": usage()}).encode()
            return data

        if not body.get("stream"):
            send_json(h, 400, {"error": {"message": "this test server streams only"}})
            return
        self.sched.submit(req)
        stream_request(h, self, req, None, event)

    def start_profile(self, h, body, q):
        self.sched.call(self.profiler.start)
        h.send_response(200)
        h.send_header("Content-Length", "0")
        h.end_headers()

    def stop_profile(self, h, body, q):
        self.sched.call(self.profiler.stop)
        h.send_response(200)
        h.send_header("Content-Length", "0")
        h.end_headers()


def serve(app: VLLMApp, port: int = 0) -> TestServer:
    app.sched.start()
    return TestServer(app, port=port).start()


__all__ = ["VERSION", "VLLMApp", "VLLMProfiler", "serve"]
