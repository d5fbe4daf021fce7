"""TEST SERVER speaking SGLang's HTTP API (not SGLang): what ``tracekit capture --server`` calls, as SGLang's
source defines it.

* ``GET /get_server_info`` = ``dataclasses.asdict(server_args)`` + ``scheduler_info`` + ``internal_states`` +
  ``version`` (sgl-project/sglang@9c0549b7:python/sglang/srt/entrypoints/http_server.py:get_server_info); with
  ``api="new"`` also ``GET /server_info``, the old path forwarding to it, and ``/model_info`` beside
  ``/get_model_info`` (the newer http_server.py, where ``/get_server_info`` is "deprecated - use /server_info");
  with ``api="newest"`` only the new paths.
* ``POST|PUT /generate`` with ``stream: true``: ``data: {"text", "output_ids", "meta_info": {"id",
  "finish_reason", "prompt_tokens", "completion_tokens", "cached_tokens", "spec_verify_ct"}}`` per scheduler
  output, then ``data: [DONE]`` (http_server.py:generate_request; managers/tokenizer_manager.py:
  _handle_batch_output: ``spec_verify_ct`` in every chunk of a speculative server, or with
  ``spec_meta="final"`` only in the finished one, as newer builds do).
* ``GET|POST /start_profile`` (``ProfileReqInput``: ``output_dir``, ``num_steps``, ``activities``, ``with_stack``,
  ``record_shapes``, ``profile_by_stage``) -> ``"Start profiling.\\n"``; ``GET|POST /stop_profile`` -> ``"Stop
  profiling. This will take some time.\\n"``; a refusal of the scheduler ("Profiling is already in progress. Call
  /stop_profile first.", "Profiling is not in progress. Call /start_profile first.") is a ``RuntimeError``
  (managers/tokenizer_communicator_mixin.py:_execute_profile), answered ``500 Internal Server Error``.
* the profiler state machine of the scheduler (sgl-project/sglang@e9149048:python/sglang/srt/managers/
  scheduler_profiler_mixin.py: init_profile, start_profile, stop_profile, _profile_batch_predicate): with
  ``num_steps`` and no ``start_step`` it starts at once and stops itself once ``forward_ct`` reaches
  ``forward_ct_at_start + num_steps``; the stop writes one file per scheduler (rank),
  ``{profile_id}-TP-{tp}[-DP-{dp}][-PP-{pp}][-EP-{ep}].trace.json.gz`` into ``output_dir`` (default
  ``$SGLANG_TORCH_PROFILER_DIR`` or ``/tmp``), ``profile_id = str(time.time())``.

The traces written are whatever the ``backend`` exports: :class:`CopyTraces` copies recorded traces (one source
per rank); ``capture/server_gpu.py`` plugs in the torch profiler around a real decode loop.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from pathlib import Path

from tests.servers.common import (
    App,
    Request,
    Scheduler,
    SimScheduler,
    copy_slowly,
    send_json,
    send_text,
    stream_request,
)

VERSION = "0.5.6.test"   # a test server: never mistaken for a release


class CopyTraces:
    """The profiler backend of the CPU test servers: exporting = copying one recorded trace per rank (``sources``,
    cycled), ``chunk_s`` between four pieces of each (a file growing while written)."""

    def __init__(self, sources, chunk_s: float = 0.0):
        self.sources = [Path(s) for s in sources]
        self.chunk_s = chunk_s
        self.started = 0
        self.options: dict = {}

    def start(self, **options) -> None:
        self.started += 1
        self.options = options

    def export(self, paths: list[Path]) -> None:
        for i, p in enumerate(paths):
            copy_slowly(self.sources[i % len(self.sources)], p, self.chunk_s)


class SGLangProfiler:
    """The scheduler's profiler (scheduler_profiler_mixin.py), one for every rank of this test server."""

    def __init__(self, sched: Scheduler, backend, ranks: list[tuple[int, int, int]], sizes: dict,
                 write_elsewhere: Path | None = None, async_export: bool = False):
        self.sched, self.backend, self.ranks, self.sizes = sched, backend, ranks, sizes
        self.write_elsewhere, self.async_export = write_elsewhere, async_export
        self.in_progress = False
        self.target_forward_ct: int | None = None
        self.output_dir: Path | None = None
        self.profile_id: str | None = None
        self.exports: list[list[Path]] = []
        self.started = threading.Event()   # set once a profile has started (tests wait on it, never poll)
        self.batches_profiled = 0

    def init_and_start(self, output_dir, num_steps, activities, with_stack, record_shapes, start_step=None):
        if self.in_progress:
            return False, "Profiling is already in progress. Call /stop_profile first."
        if start_step:
            return False, "start_step is not modelled by this test server"
        self.output_dir = Path(output_dir or os.environ.get("SGLANG_TORCH_PROFILER_DIR", "/tmp")).expanduser()
        self.profile_id = str(time.time())
        self.target_forward_ct = self.sched.forward_ct + num_steps if num_steps else None
        self.backend.start(activities=activities or ["CPU", "GPU"],
                           with_stack=with_stack if with_stack is not None else True,
                           record_shapes=record_shapes if record_shapes is not None else False)
        self.in_progress = True
        self.batches_profiled = 0
        self.started.set()
        return True, "Succeeded"

    def before_batch(self, mode: str, bs: int) -> None:   # _profile_batch_predicate (no profile_by_stage)
        if self.target_forward_ct and self.target_forward_ct <= self.sched.forward_ct:
            self.stop()
        if self.in_progress:
            self.batches_profiled += 1

    def stop(self):
        if not self.in_progress:
            return False, "Profiling is not in progress. Call /start_profile first."
        folder = self.write_elsewhere or self.output_dir
        folder.mkdir(parents=True, exist_ok=True)
        paths = []
        for tp, dp, pp in self.ranks:
            parts = [self.profile_id, f"TP-{tp}"]
            if self.sizes["dp"] > 1:
                parts.append(f"DP-{dp}")
            if self.sizes["pp"] > 1:
                parts.append(f"PP-{pp}")
            paths.append(folder / ("-".join(parts) + ".trace.json.gz"))
        if self.async_export:
            threading.Thread(target=self.backend.export, args=(paths,), daemon=True).start()
        else:
            self.backend.export(paths)
        self.exports.append(paths)
        self.in_progress = False
        self.target_forward_ct = None
        return True, "Succeeded."


class SGLangApp(App):
    """The test server's state: ``server_args`` (what ``/get_server_info`` returns), the scheduler, the profiler."""

    def __init__(self, *, sched: Scheduler | None = None, backend=None, model_path: str = "test/model",
                 tp: int = 1, dp: int = 1, pp: int = 1, dp_attention: bool = False, speculative: dict | None = None,
                 api: str = "old", spec_meta: str = "every", write_elsewhere: Path | None = None,
                 async_export: bool = False, die_after_profiled_batches: int | None = None,
                 extra_args: dict | None = None):
        self.sched = sched or SimScheduler()
        self.backend = backend
        self.api, self.spec_meta = api, spec_meta
        self.spec = speculative
        self.server_args = {
            "model_path": model_path, "tokenizer_path": model_path, "host": "127.0.0.1", "port": 30000,
            "dtype": "auto", "kv_cache_dtype": "auto", "context_length": None, "tp_size": tp, "dp_size": dp,
            "pp_size": pp, "ep_size": 1, "enable_dp_attention": dp_attention, "stream_interval": 1,
            "disable_cuda_graph": False, "cuda_graph_max_bs": 160, "enable_torch_compile": False,
            "attention_backend": "flashinfer", "speculative_algorithm": None, "speculative_draft_model_path": None,
            "speculative_num_steps": None, "speculative_eagle_topk": None, "speculative_num_draft_tokens": None,
            "enable_metrics": False,
            **(speculative or {}), **(extra_args or {})}
        ranks_dp = 1 if dp_attention else dp
        ranks = [(t, d if dp > 1 else 0, p) for d in range(ranks_dp) for p in range(pp) for t in range(tp)]
        self.profiler = SGLangProfiler(self.sched, backend, ranks, {"dp": dp if dp > 1 else 1, "pp": pp},
                                       write_elsewhere, async_export)
        self.die_after = die_after_profiled_batches
        self.on_die = None   # set by TestServer users: what dying means (TestServer.die)
        self.sched.before_batch = self._before_batch
        self.requests_seen = 0

    def _before_batch(self, mode, bs):
        self.profiler.before_batch(mode, bs)
        if self.die_after is not None and self.profiler.in_progress and self.profiler.batches_profiled >= self.die_after:
            self.die_after = None
            if self.on_die:
                self.on_die()

    @property
    def profiling(self) -> bool:
        return self.profiler.in_progress

    def close(self) -> None:
        self.sched.stop()

    # ---- routes
    def routes(self) -> dict:
        r = {("GET", "/health"): self.health, ("POST", "/generate"): self.generate, ("PUT", "/generate"): self.generate,
             ("GET", "/start_profile"): self.start_profile, ("POST", "/start_profile"): self.start_profile,
             ("GET", "/stop_profile"): self.stop_profile, ("POST", "/stop_profile"): self.stop_profile}
        if self.api in ("old", "new"):
            r[("GET", "/get_server_info")] = self.server_info
            r[("GET", "/get_model_info")] = self.model_info
        if self.api in ("new", "newest"):
            r[("GET", "/server_info")] = self.server_info
            r[("GET", "/model_info")] = self.model_info
        return r

    def health(self, h, body, q):
        send_text(h, 200, "", "application/json")

    def server_info(self, h, body, q):
        states = [{"avg_spec_accept_length": 2.5 if self.spec else None, "last_gen_throughput": 0.0}]
        send_json(h, 200, {**self.server_args, "max_total_num_tokens": 400000, "max_req_input_len": 32760,
                           "internal_states": states, "version": VERSION})

    def model_info(self, h, body, q):
        send_json(h, 200, {"model_path": self.server_args["model_path"],
                           "tokenizer_path": self.server_args["tokenizer_path"], "is_generation": True})

    def generate(self, h, body, q):
        body = body or {}
        ids = body.get("input_ids")
        if ids is None and body.get("text") is None:
            send_json(h, 400, {"error": {"message": "Either text or input_ids should be provided."}})
            return
        sp = body.get("sampling_params") or {}
        n = int(sp.get("max_new_tokens") or 128)
        req = Request(body.get("rid") or uuid.uuid4().hex, len(ids or []) or 8, n)
        self.requests_seen += 1
        spec = bool(self.server_args.get("speculative_algorithm"))
        state = {"produced": 0}

        def event(new, ct, fin):
            state["produced"] += new
            p = state["produced"]
            mi = {"id": req.rid, "finish_reason": {"type": "length", "length": n} if fin else None,
                  "prompt_tokens": req.prompt_len, "completion_tokens": p, "cached_tokens": 0}
            if spec and (self.spec_meta == "every" or fin):
                mi["spec_verify_ct"] = ct
            if fin:
                mi["e2e_latency"] = 0.0
            return json.dumps({"text": " tok" * p, "output_ids": list(range(100, 100 + p)), "meta_info": mi}).encode()

        if not body.get("stream"):
            send_json(h, 400, {"error": {"message": "this test server streams only"}})
            return
        self.sched.submit(req)
        stream_request(h, self, req, None, event)

    def start_profile(self, h, body, q):
        o = body or {}
        ok, msg = self.sched.call(lambda: self.profiler.init_and_start(
            o.get("output_dir"), o.get("num_steps"), o.get("activities"), o.get("with_stack"),
            o.get("record_shapes"), o.get("start_step")))
        if not ok:
            raise RuntimeError(msg)
        send_text(h, 200, "Start profiling.\n")

    def stop_profile(self, h, body, q):
        ok, msg = self.sched.call(self.profiler.stop)
        if not ok:
            raise RuntimeError(msg)
        send_text(h, 200, "Stop profiling. This will take some time.\n")




def serve(app: SGLangApp, port: int = 0):
    """Start ``app``'s scheduler and a :class:`~tests.servers.common.TestServer` for it; dying = the server's."""
    from tests.servers.common import TestServer

    app.sched.start()
    srv = TestServer(app, port=port).start()
    app.on_die = srv.die
    return srv


__all__ = ["CopyTraces", "SGLangApp", "SGLangProfiler", "VERSION", "serve"]
