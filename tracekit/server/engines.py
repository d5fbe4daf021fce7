"""SGLang and vLLM as ``tracekit capture --server`` meets them over HTTP: which engine answers, its configuration,
the streamed request that drives a decode load, the profiler's start and stop, and the names of the trace files it
writes (one per rank).

Everything here is read from the engines' own source (``../shared/reference/engine-profiling-apis.md`` collects
it); behaviour differs between versions, so each rule names the file it follows (``repo@commit:path:symbol``):

SGLang
  * configuration: ``GET /get_server_info`` (renamed ``/server_info`` in newer builds, the old path forwarding),
    ``dataclasses.asdict(server_args)`` + ``scheduler_info`` + ``internal_states`` + ``version``
    (sgl-project/sglang@9c0549b7:python/sglang/srt/entrypoints/http_server.py:get_server_info); ``GET
    /get_model_info`` (``/model_info``): ``model_path``, ``tokenizer_path``, ``is_generation``.
  * load: ``POST /generate`` ``{"input_ids", "sampling_params": {"max_new_tokens", "ignore_eos"}, "stream": true}``
    answers server-sent events ``data: {"text", "meta_info": {"completion_tokens", "spec_verify_ct", ...}}`` and
    ``data: [DONE]`` (http_server.py:generate_request); ``spec_verify_ct`` counts the verify forwards of a
    speculative request, in every chunk in older builds, in the last one in newer ones
    (managers/tokenizer_manager.py:_handle_batch_output).
  * profiler: ``POST /start_profile`` with a ``ProfileReqInput`` body (``output_dir``, ``num_steps``,
    ``activities``, ``with_stack``, ``record_shapes``) answers ``"Start profiling.\\n"``; ``/stop_profile`` answers
    ``"Stop profiling. This will take some time.\\n"`` (http_server.py:start_profile_async/stop_profile_async). A
    refusal ("Profiling is already in progress. Call /stop_profile first.", "Profiling is not in progress") is a
    ``RuntimeError`` in ``_execute_profile`` (managers/tokenizer_communicator_mixin.py), which FastAPI answers with
    HTTP 500 ``Internal Server Error``: the message itself stays in the server's log. With ``num_steps`` and no
    ``start_step`` the profiler starts at once and stops itself after ``num_steps`` forward batches
    (sgl-project/sglang@e9149048:python/sglang/srt/managers/scheduler_profiler_mixin.py:init_profile,
    _profile_batch_predicate).
  * files: ``[{prefix}-]{profile_id}-TP-{tp}[-DP-{dp}][-PP-{pp}][-EP-{ep}][-{STAGE}].trace.json.gz`` in
    ``output_dir``, one per scheduler process, ``profile_id = str(time.time())`` chosen by the server
    (scheduler_profiler_mixin.py:stop_profile).

vLLM
  * configuration: ``GET /version`` ``{"version"}``, ``GET /v1/models`` (``id``, ``root``, ``max_model_len``),
    ``GET /server_info?config_format=json`` (the whole ``vllm_config``, only with ``VLLM_SERVER_DEV_MODE=1``:
    vllm-project/vllm@4652ef5d:vllm/entrypoints/serve/instrumentator/server_info.py:show_server_info), ``GET
    /metrics`` (Prometheus text; the speculative-decoding counters ``vllm:spec_decode_num_drafts``,
    ``..._num_draft_tokens``, ``..._num_accepted_tokens`` exposed with ``_total``:
    vllm-project/vllm@ee4ceaae:vllm/v1/spec_decode/metrics.py:SpecDecodingProm; mean acceptance length =
    1 + accepted / drafts, the bonus token included).
  * load: ``POST /v1/completions`` with ``prompt`` as token ids, ``max_tokens``, ``ignore_eos``, ``stream`` and
    ``stream_options`` (``include_usage``, ``continuous_usage_stats``: the usage in every chunk).
  * profiler: ``POST /start_profile`` and ``/stop_profile``, no body, an empty 200; the routes exist only when the
    server was started with ``--profiler-config`` whose ``profiler`` is set (``VLLM_TORCH_PROFILER_DIR`` before
    v0.13), else 404 (vllm-project/vllm@063e5a89:vllm/entrypoints/serve/profile/api_router.py:attach_router). The
    output folder is the server's ``torch_profiler_dir``, fixed at start; ``/stop_profile`` returns once the traces
    are flushed. A second ``/start_profile`` while one runs is ignored, not refused
    (vllm-project/vllm@02773ee0:vllm/profiler/wrapper.py:WorkerProfiler.start).
  * files: ``torch.profiler.tensorboard_trace_handler(dir, worker_name, use_gzip)`` writes
    ``{worker_name}.{time_ns}.pt.trace.json[.gz]`` per worker, ``worker_name`` =
    ``[{prefix}_]dp{d}_pp{p}_tp{t}_dcp{c}_ep{e}_rank{r}`` (vllm-project/vllm@5a6541db:vllm/distributed/utils.py:
    get_worker_rank_suffix; ``{instance_id}-rank-{r}`` in older builds), plus ``profiler_out_{rank}.txt``.

Standard library only (the capture side).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from tracekit.errors import UnsupportedServer
from tracekit.server.client import Response, Server

SGLANG, VLLM = "sglang", "vllm"
ENGINES = (SGLANG, VLLM)
# SGLang's speculative algorithms that run a draft model (or MTP layers) each step; NGRAM / LOOKAHEAD propose
# from the host (no draft forward)
_SGLANG_DRAFTED = ("EAGLE", "EAGLE3", "NEXTN", "MTP", "STANDALONE")
# keys of a server's own settings kept in the manifest when its configuration is too large to keep whole
_CONFIG_LIMIT = 256 << 10


@dataclass(frozen=True)
class Spec:
    """Speculative decoding as the server is configured: the ``algorithm`` (method), ``draft_tokens`` drafted per
    step per sequence (the contract's ``spec.draft_tokens``), ``draft_forwards`` (draft-model forward passes per
    step: what its weights cost), the draft model's path when it is a separate model, and the engine's own keys."""

    algorithm: str | None
    draft_tokens: int | None
    draft_forwards: int | None
    draft_model_path: str | None = None
    settings: dict = field(default_factory=dict)


@dataclass
class EngineInfo:
    """What the server says about itself (``None``: it does not say)."""

    engine: str
    version: str | None = None
    model_path: str | None = None
    served_model: str | None = None        # the model name a request names (vLLM's /v1/models id)
    tp: int | None = None
    dp: int | None = None
    pp: int | None = None
    ep: int | None = None
    dp_attention: bool = False
    spec: Spec | None = None               # None: no speculation (or, with spec_known False, unknown)
    spec_known: bool = True
    graphs: bool | None = None
    compile: bool | None = None
    dtype: str | None = None
    kv_cache_dtype: str | None = None
    max_model_len: int | None = None
    config: dict = field(default_factory=dict)
    profiler_dir: str | None = None        # vLLM: torch_profiler_dir, where the traces land
    profiler_enabled: bool | None = None   # vLLM: a profiler configured (None: not known before /start_profile)
    sources: dict = field(default_factory=dict)   # setting -> the endpoint it came from
    warnings: list = field(default_factory=list)

    @property
    def expected_ranks(self) -> int | None:
        """Trace files one capture writes: one per rank, tp x pp x dp (SGLang's data-parallel attention runs its
        dp groups inside the tp ranks: tp x pp)."""
        if self.tp is None:
            return None
        dp = 1 if self.dp_attention else (self.dp or 1)
        return self.tp * (self.pp or 1) * dp

    @property
    def mode(self) -> str:
        if self.compile:
            return "compile"
        return {True: "graph", False: "eager"}.get(self.graphs, "unknown")


def _int(v) -> int | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v:
        return None
    return int(v)


def _str(v, limit: int = 1000) -> str | None:
    """A server's value as a string for messages and the manifest: control characters (terminal escapes, newlines)
    replaced, at most ``limit`` characters."""
    if not isinstance(v, (str, int, float)) or isinstance(v, bool):
        return None
    return re.sub(r"[\x00-\x1f\x7f]", "?", str(v))[:limit]


def _bounded(d: dict, keep: tuple[str, ...] = ()) -> dict:
    """``d`` as the manifest keeps it: whole when it is small, else only the ``keep`` keys (an untrusted server may
    answer with anything)."""
    import json

    try:
        text = json.dumps(d, default=str)
    except (TypeError, ValueError):
        return {}
    if len(text) <= _CONFIG_LIMIT:
        return json.loads(text)
    return {k: d[k] for k in keep if k in d}


# ------------------------------------------------------------------------------------------------
# identification
# ------------------------------------------------------------------------------------------------

def _json_dict(r: Response) -> dict | None:
    j = r.json() if r.ok else None
    return j if isinstance(j, dict) else None


def identify(server: Server, engine: str = "auto") -> EngineInfo:
    """Which engine answers at ``server`` and its configuration. Raises :class:`Unreachable` when nothing answers
    and ``TracekitError`` when what answers is neither SGLang nor vLLM (or not the ``engine`` asked for)."""
    tried: list[str] = []
    vllm_info = None
    if engine in ("auto", SGLANG):
        for path in ("/get_server_info", "/server_info"):
            r = server.get(path)
            tried.append(f"{path}: {r.status}")
            d = _json_dict(r)
            if d is not None and "tp_size" in d and "model_path" in d:
                return _sglang(server, d, path)
            if d is not None and "vllm_config" in d:
                vllm_info = d
                break
    if engine in ("auto", VLLM):
        rv = server.get("/version")
        rm = server.get("/v1/models")
        tried += [f"/version: {rv.status}", f"/v1/models: {rm.status}"]
        ver, models = _json_dict(rv), _json_dict(rm)
        if ver is not None and "version" in ver and models is not None and isinstance(models.get("data"), list):
            return _vllm(server, ver, models, vllm_info)
    which = {"auto": "an SGLang or vLLM server", SGLANG: "an SGLang server", VLLM: "a vLLM server"}[engine]
    raise UnsupportedServer(f"{server.base} answers HTTP but is not {which} ({', '.join(tried)}): check the URL and "
                        "port (SGLang serves /get_server_info or /server_info, vLLM /version and /v1/models)"
                        + ("" if engine == "auto" else ", or drop --engine"))


def _sglang(server: Server, d: dict, path: str) -> EngineInfo:
    info = EngineInfo(engine=SGLANG)
    info.version = _str(d.get("version"))
    info.model_path = _str(d.get("model_path"))
    info.tp, info.dp, info.pp = _int(d.get("tp_size")), _int(d.get("dp_size")) or 1, _int(d.get("pp_size")) or 1
    info.ep = _int(d.get("ep_size")) or _int(d.get("moe_ep_size")) or 1
    info.dp_attention = bool(d.get("enable_dp_attention"))
    info.graphs = not bool(d.get("disable_cuda_graph")) if "disable_cuda_graph" in d else None
    info.compile = bool(d.get("enable_torch_compile")) if "enable_torch_compile" in d else None
    info.dtype = _str(d.get("dtype"))
    info.kv_cache_dtype = _str(d.get("kv_cache_dtype"))
    info.max_model_len = _int(d.get("context_length"))
    for k in ("model_path", "tp", "dp", "pp", "ep", "spec", "graphs", "dtype", "version"):
        info.sources[k] = path
    alg = _str(d.get("speculative_algorithm"))
    if alg and alg.upper() not in ("NONE", "NULL"):
        steps, topk = _int(d.get("speculative_num_steps")), _int(d.get("speculative_eagle_topk"))
        ndraft = _int(d.get("speculative_num_draft_tokens"))
        # tokens drafted per step per sequence (the contract): a top-1 chain drafts num_steps tokens, a tree
        # (topk > 1) or an n-gram proposal num_draft_tokens - 1 (the verified root excluded)
        if alg.upper() in _SGLANG_DRAFTED and (topk or 1) == 1:
            drafted = steps
        else:
            drafted = ndraft - 1 if ndraft else None
        # draft forwards per step: the draft graph runs num_steps - 1 forwards and the draft-extend one more
        # (sgl-project/sglang@00559eac:python/sglang/srt/speculative/eagle_worker.py:forward_batch_generation)
        forwards = steps if alg.upper() in _SGLANG_DRAFTED else 0
        draft_path = _str(d.get("speculative_draft_model_path"))
        info.spec = Spec(alg, drafted, forwards, draft_path if draft_path and draft_path != info.model_path else None,
                         {k: d.get(k) for k in ("speculative_algorithm", "speculative_num_steps",
                                                "speculative_eagle_topk", "speculative_num_draft_tokens",
                                                "speculative_draft_model_path") if k in d})
    states = d.get("internal_states")
    config = {k: v for k, v in d.items() if k != "internal_states"}
    info.config = _bounded(config, ("model_path", "tp_size", "dp_size", "pp_size", "ep_size", "enable_dp_attention",
                                    "speculative_algorithm", "speculative_num_steps", "speculative_eagle_topk",
                                    "speculative_num_draft_tokens", "speculative_draft_model_path",
                                    "disable_cuda_graph", "cuda_graph_max_bs", "enable_torch_compile",
                                    "attention_backend", "dtype", "kv_cache_dtype", "version"))
    if isinstance(states, list):
        acc = [round(float(s["avg_spec_accept_length"]), 4) if isinstance(s, dict)
               and _int(s.get("avg_spec_accept_length")) is not None else None for s in states[:64]]
        if any(a is not None for a in acc):
            # cumulative since the server started (scheduler.py:get_internal_state): context, not this capture's
            info.config["avg_spec_accept_length_since_start"] = acc
    for mpath in ("/get_model_info", "/model_info"):
        m = _json_dict(server.get(mpath))
        if m is not None:
            info.config["model_info"] = _bounded({k: m.get(k) for k in ("model_path", "tokenizer_path",
                                                                       "is_generation", "model_type",
                                                                       "architectures") if k in m})
            info.model_path = info.model_path or _str(m.get("model_path"))
            break
    return info


def _vllm(server: Server, ver: dict, models: dict, dev: dict | None) -> EngineInfo:
    info = EngineInfo(engine=VLLM)
    info.version = _str(ver.get("version"))
    info.sources["version"] = "/version"
    first = next((m for m in models["data"] if isinstance(m, dict)), {})
    info.served_model = _str(first.get("id"))
    info.model_path = _str(first.get("root")) or info.served_model
    info.max_model_len = _int(first.get("max_model_len"))
    info.sources["model_path"] = "/v1/models"
    if dev is None or not isinstance(dev.get("vllm_config"), dict):  # (text unless config_format=json)
        dev = _json_dict(server.get("/server_info?config_format=json"))
    vc = dev.get("vllm_config") if isinstance(dev, dict) else None
    if isinstance(vc, dict):
        _vllm_config(info, vc, dev.get("vllm_env") if isinstance(dev.get("vllm_env"), dict) else {})
    else:
        info.spec_known = False
        info.warnings.append("vLLM's /server_info is not served (start the server with VLLM_SERVER_DEV_MODE=1 to "
                             "expose its configuration): tp, pp and dp are read from the trace files' names, the "
                             "speculative settings from /metrics")
    metrics = parse_metrics(server.get("/metrics"))
    info.config["metrics_info"] = {k: v for k, v in metrics.items() if k.endswith("_info")}
    if not info.spec_known and any(k.startswith("vllm:spec_decode_num_draft") for k in metrics):
        # the counters exist only when speculative decoding is on (SpecDecodingProm); K from their ratio later
        info.spec = Spec("unknown (from /metrics)", None, None)
        info.sources["spec"] = "/metrics"
    elif not info.spec_known:
        info.spec, info.spec_known = None, True
        info.sources["spec"] = "/metrics (no vllm:spec_decode_* counters: no speculative decoding)"
    return info


def _vllm_config(info: EngineInfo, vc: dict, env: dict) -> None:
    src = "/server_info?config_format=json"
    mc = vc.get("model_config") if isinstance(vc.get("model_config"), dict) else {}
    pc = vc.get("parallel_config") if isinstance(vc.get("parallel_config"), dict) else {}
    sc = vc.get("speculative_config") if isinstance(vc.get("speculative_config"), dict) else None
    cc = vc.get("compilation_config") if isinstance(vc.get("compilation_config"), dict) else {}
    kc = vc.get("cache_config") if isinstance(vc.get("cache_config"), dict) else {}
    prc = vc.get("profiler_config") if isinstance(vc.get("profiler_config"), dict) else None
    info.model_path = _str(mc.get("model")) or info.model_path
    info.dtype = _str(mc.get("dtype"))
    info.max_model_len = _int(mc.get("max_model_len")) or info.max_model_len
    info.tp = _int(pc.get("tensor_parallel_size"))
    info.pp = _int(pc.get("pipeline_parallel_size")) or 1
    info.dp = _int(pc.get("data_parallel_size")) or 1
    info.ep = info.tp * info.dp if pc.get("enable_expert_parallel") and info.tp else 1
    enforce_eager = bool(mc.get("enforce_eager"))
    mode = str(cc.get("cudagraph_mode") or "")
    info.graphs = not enforce_eager and "NONE" not in mode.upper()
    info.kv_cache_dtype = _str(kc.get("cache_dtype"))
    if sc:
        k = _int(sc.get("num_speculative_tokens"))
        method = _str(sc.get("method")) or "unknown"
        # the drafter's forwards per step: one over K+1 tokens, K-1 one-token ones (vllm/v1/spec_decode/eagle.py:
        # EagleProposer.propose); n-gram and suffix proposals run no draft model
        forwards = 0 if method in ("ngram", "suffix") else k
        draft = _str(sc.get("model"))
        info.spec = Spec(method, k, forwards, draft if draft and draft != info.model_path else None,
                         {x: sc.get(x) for x in ("method", "num_speculative_tokens", "model") if x in sc})
    else:
        info.spec = None
    if prc is not None:
        info.profiler_enabled = prc.get("profiler") is not None
        info.profiler_dir = _str(prc.get("torch_profiler_dir")) or None
    elif env.get("VLLM_TORCH_PROFILER_DIR"):
        info.profiler_enabled, info.profiler_dir = True, _str(env["VLLM_TORCH_PROFILER_DIR"])
    for k in ("model_path", "tp", "dp", "pp", "ep", "spec", "graphs", "dtype"):
        info.sources[k] = src
    info.config = _bounded(vc, ("model_config", "parallel_config", "speculative_config", "compilation_config",
                                "cache_config", "profiler_config"))


# ------------------------------------------------------------------------------------------------
# /metrics (Prometheus text)
# ------------------------------------------------------------------------------------------------

_METRIC = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+([-+0-9.eE]+|NaN|[+-]Inf)\s*(?:\d+)?$")


def parse_metrics(r: Response) -> dict[str, float]:
    """Prometheus text -> ``{name: value summed over every label set}`` (engines of a data-parallel server, models);
    an ``*_info`` gauge keeps its labels instead: ``{name: {label: value}}`` of its first sample.

    >>> parse_metrics(Response(200, b'# TYPE x counter\\nx_total{engine="0"} 3\\nx_total{engine="1"} 4.5\\n'))
    {'x_total': 7.5}
    """
    out: dict = {}
    if not r.ok:
        return out
    for line in r.body.decode("utf-8", "replace").splitlines():
        if not line or line.startswith("#"):
            continue
        m = _METRIC.match(line.strip())
        if not m:
            continue
        name, labels, value = m.group(1), m.group(2), m.group(3)
        if name.endswith("_info"):
            if name not in out and labels:
                out[name] = dict(re.findall(r'(\w+)="([^"]*)"', labels)[:32])
            continue
        try:
            v = float(value)
        except ValueError:
            continue
        out[name] = out.get(name, 0.0) + v
    return out


SPEC_COUNTERS = ("vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
                 "vllm:spec_decode_num_accepted_tokens_total")


def spec_counters(server: Server) -> dict[str, float] | None:
    """vLLM's speculative-decoding counters now (None when the server exposes none)."""
    m = parse_metrics(server.get("/metrics"))
    got = {k: m[k] for k in SPEC_COUNTERS if k in m}
    return got or None


# ------------------------------------------------------------------------------------------------
# the streamed request that drives the load
# ------------------------------------------------------------------------------------------------

def prompt_ids(n: int, seed: int) -> list[int]:
    """``n`` prompt token ids, different per ``seed`` (so that no two requests share a cached prefix), all in
    ``[1000, 1000 + 8192)``: inside every vocabulary tracekit has met.

    >>> prompt_ids(4, 0), prompt_ids(4, 1)[0] != prompt_ids(4, 0)[0]
    ([1000, 1037, 1074, 1111], True)
    """
    return [1000 + ((seed * 7919 + i * 37) % 8192) for i in range(n)]


def request_of(info: EngineInfo, n_prompt: int, max_tokens: int, seed: int) -> tuple[str, dict]:
    """(path, body) of one streamed request of exactly ``max_tokens`` new tokens (``ignore_eos``, greedy)."""
    ids = prompt_ids(n_prompt, seed)
    if info.engine == SGLANG:
        return "/generate", {"input_ids": ids, "stream": True,
                             "sampling_params": {"max_new_tokens": max_tokens, "ignore_eos": True,
                                                 "temperature": 0.0}}
    return "/v1/completions", {"model": info.served_model, "prompt": ids, "max_tokens": max_tokens,
                               "ignore_eos": True, "temperature": 0.0, "stream": True,
                               "stream_options": {"include_usage": True, "continuous_usage_stats": True}}


@dataclass(frozen=True)
class Chunk:
    """What one streamed event says: the request's completion tokens so far (None: the event does not say), the
    verify forwards so far (SGLang ``spec_verify_ct``), whether it carried text, and an error message."""

    tokens: int | None
    verify_ct: int | None
    has_output: bool
    error: str | None = None


def parse_event(info: EngineInfo, event: dict) -> Chunk:
    err = event.get("error")
    if err is not None:
        msg = err.get("message") if isinstance(err, dict) else err
        return Chunk(None, None, False, " ".join(str(msg).split())[:300])
    if info.engine == SGLANG:
        mi = event.get("meta_info") if isinstance(event.get("meta_info"), dict) else {}
        return Chunk(_int(mi.get("completion_tokens")), _int(mi.get("spec_verify_ct")), True)
    usage = event.get("usage") if isinstance(event.get("usage"), dict) else {}
    choices = event.get("choices") if isinstance(event.get("choices"), list) else []
    has = any(isinstance(c, dict) and (c.get("text") or c.get("token_ids")) for c in choices)
    return Chunk(_int(usage.get("completion_tokens")), None, has)


# ------------------------------------------------------------------------------------------------
# the profiler
# ------------------------------------------------------------------------------------------------

def start_profile(server: Server, info: EngineInfo, output_dir: str, num_steps: int) -> Response:
    """Start the server's profiler (SGLang: into ``output_dir``, auto-stop after ``num_steps`` forward batches, CPU
    and GPU, stacks and shapes; vLLM: into its own ``torch_profiler_dir``, no body: older builds reject unknown
    keys)."""
    if info.engine == SGLANG:
        return server.post("/start_profile", {"output_dir": output_dir, "num_steps": int(num_steps),
                                              "activities": ["CPU", "GPU"], "with_stack": True,
                                              "record_shapes": True}, timeout=120)
    return server.post("/start_profile", None, timeout=300)


def stop_profile(server: Server, info: EngineInfo, timeout: float) -> Response:
    """Stop the profiler (vLLM's answer waits for the traces to be flushed: ``timeout`` is long)."""
    return server.post("/stop_profile", None, timeout=timeout)


# ------------------------------------------------------------------------------------------------
# trace file names
# ------------------------------------------------------------------------------------------------

_SGLANG_FILE = re.compile(r"^(?:(?P<prefix>.*)-)?(?P<pid>\d+(?:\.\d+)?)-TP-(?P<tp>\d+)(?:-DP-(?P<dp>\d+))?"
                          r"(?:-PP-(?P<pp>\d+))?(?:-EP-(?P<ep>\d+))?(?:-(?P<stage>[A-Za-z_]+))?\.trace\.json\.gz$")
_VLLM_FILE = re.compile(r"^(?:(?P<prefix>.*)_)?dp(?P<dp>\d+)_pp(?P<pp>\d+)_tp(?P<tp>\d+)_dcp(?P<dcp>\d+)"
                        r"_ep(?P<ep>\d+)(?:_rank(?P<rank>\d+))?\.(?P<ts>\d+)\.pt\.trace\.json(?:\.gz)?$")
_VLLM_OLD_FILE = re.compile(r"^(?P<inst>.+)-rank-(?P<rank>\d+)\.(?P<ts>\d+)\.pt\.trace\.json(?:\.gz)?$")


@dataclass(frozen=True, order=True)
class RankFile:
    """One rank's trace file: its (dp, pp, tp) position (the sort order) and name."""

    dp: int
    pp: int
    tp: int
    name: str = field(compare=False)
    ep: int | None = field(default=None, compare=False)
    rank: int | None = field(default=None, compare=False)
    stage: str | None = field(default=None, compare=False)
    multi: tuple[bool, bool] = field(default=(False, False), compare=False)   # the name has a dp / pp part

    @property
    def label(self) -> str:
        """``TP-1``, ``TP-1-DP-0``: the rank as the file's name gives it (for messages)."""
        return "-".join([f"TP-{self.tp}"] + ([f"DP-{self.dp}"] if self.multi[0] else [])
                        + ([f"PP-{self.pp}"] if self.multi[1] else []))


def rank_file(engine: str, name: str) -> RankFile | None:
    """The rank a trace file's ``name`` is for, or None when the engine does not name its rank traces so.

    >>> rank_file("sglang", "1723456789.12-TP-1-DP-0.trace.json.gz").label
    'TP-1-DP-0'
    >>> rank_file("vllm", "dp0_pp0_tp1_dcp0_ep1_rank1.1723456789123456789.pt.trace.json.gz").tp
    1
    >>> rank_file("sglang", "1723456789.12-TP-0-DECODE.trace.json.gz").stage
    'DECODE'
    >>> rank_file("sglang", "merged-1723456789.12.trace.json.gz") is None
    True
    """
    if engine == SGLANG:
        m = _SGLANG_FILE.match(name)
        if not m:
            return None
        g = m.groupdict()
        return RankFile(int(g["dp"] or 0), int(g["pp"] or 0), int(g["tp"]), name,
                        int(g["ep"]) if g["ep"] else None, None, g["stage"], (g["dp"] is not None, g["pp"] is not None))
    m = _VLLM_FILE.match(name)
    if m:
        g = m.groupdict()
        return RankFile(int(g["dp"]), int(g["pp"]), int(g["tp"]), name, int(g["ep"]),
                        int(g["rank"]) if g["rank"] else None, None, (True, True))
    m = _VLLM_OLD_FILE.match(name)
    if m:
        r = int(m.group("rank"))
        return RankFile(0, 0, r, name, None, r)
    return None


FILE_PATTERNS = {SGLANG: "[{prefix}-]{profile_id}-TP-{tp}[-DP-{dp}][-PP-{pp}].trace.json.gz",
                 VLLM: "dp{d}_pp{p}_tp{t}_dcp{c}_ep{e}_rank{r}.{time_ns}.pt.trace.json.gz"}


__all__ = ["ENGINES", "EngineInfo", "Chunk", "FILE_PATTERNS", "RankFile", "SGLANG", "SPEC_COUNTERS", "Spec", "VLLM",
           "identify", "parse_event", "parse_metrics", "prompt_ids", "rank_file", "request_of", "spec_counters",
           "start_profile", "stop_profile"]
