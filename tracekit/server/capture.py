"""``tracekit capture --server URL``: profile a running SGLang or vLLM server through its own HTTP API and write
``manifest.json`` (``tracekit.manifest/2``) beside the rank traces it wrote.

In order (the contract, "``tracekit capture --server URL`` ... and ``tracekit.manifest/2``"):

1. identify the engine and read its configuration (:func:`tracekit.server.engines.identify`);
2. measure the decode step without a profiler: a warm-up, then ``repeats`` loads of ``concurrency`` streamed
   requests (:func:`tracekit.server.load.measure`);
3. drive the same load again and, once every request has its first output (the prefills are done: the window
   holds decode steps), start the server's profiler into a fresh folder with ``num_steps`` where the engine takes
   it; stop it after that many steps (SGLang stops itself; the explicit stop is then answered "not in progress");
   the profiler is ALWAYS stopped once it may have started, on an error and on Ctrl-C / SIGTERM too (the signals
   are held while the stop is sent); a profile that was already running (someone else's) is left alone;
4. wait for one trace per rank, their sizes stable (:mod:`tracekit.server.traces`), copy them into ``DIR`` when
   they were written elsewhere, and write ``DIR/manifest.json``: every rank file in ``trace_files``, ``tp`` and
   ``spec`` from the server, ``tokens_per_step`` = the concurrency, the unprofiled step with its spread, the
   weight bytes from the model's files when they are on this machine.

Every failure the contract lists is a ``TracekitError`` (one line, exit 2): no server at URL, not an SGLang or
vLLM server, profiling not enabled (vLLM), profiling already in progress (SGLang), the traces did not appear, the
server went away mid-capture. Standard library only (polars is never imported: the GPU host may not have it).
"""

from __future__ import annotations

import gzip
import json
import math
import re
import shutil
import signal
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import tracekit.server.engines as eng
from tracekit.contract import MANIFEST_V2_SCHEMA
from tracekit.errors import (
    BadOptionValue,
    CannotWrite,
    CaptureFailed,
    ModelFilesMissing,
    ServerRefused,
    ServerUnreachable,
    TracekitError,
)
from tracekit.server.client import Server, Unreachable
from tracekit.server.load import Load, LoadFailed, measure
from tracekit.server.traces import Progress, TracesMissing, new_files, wait_for_ranks

DEFAULT_STEPS = 20


def _gone(url: str, why: str, what: str) -> TracekitError:
    return ServerUnreachable(f"the server at {url} went away mid-capture ({why}) {what}")


@contextmanager
def _signals_raise():
    """SIGTERM raises KeyboardInterrupt as Ctrl-C does (so the profiler is stopped on either); restored after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.getsignal(signal.SIGTERM)

    def _raise(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _raise)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


@contextmanager
def _signals_held():
    """Ctrl-C and SIGTERM held (remembered, not acted on) while the profiler is being stopped; a held signal is
    raised as KeyboardInterrupt afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got: list[int] = []
    olds = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    for s in olds:
        signal.signal(s, lambda signum, frame: got.append(signum))
    try:
        yield
    finally:
        for s, old in olds.items():
            signal.signal(s, old)
    if got:
        raise KeyboardInterrupt


class _Profile:
    """The server's profiler during one capture: started (maybe), stopped (yes / no / by itself)."""

    def __init__(self, server: Server, info: eng.EngineInfo, stop_timeout: float):
        self.server, self.info, self.stop_timeout = server, info, stop_timeout
        self.maybe_running = False
        self.stopped_by = None    # "stop_profile" | "num_steps" | None
        self.stop_note: str | None = None

    def stop(self) -> None:
        if not self.maybe_running:
            return
        with _signals_held():
            try:
                r = eng.stop_profile(self.server, self.info, self.stop_timeout)
            except Unreachable as e:
                self.stop_note = f"the stop could not be sent ({e.why})"
                raise
            finally:
                self.maybe_running = False
        if r.ok:
            self.stopped_by = "stop_profile"
        elif self.info.engine == eng.SGLANG and r.status == 500:
            # "Profiling is not in progress": it stopped itself after num_steps (scheduler_profiler_mixin.py)
            self.stopped_by = "num_steps"
        else:
            self.stop_note = f"/stop_profile answered HTTP {r.status} {r.text()}"
            raise ServerRefused(f"the server did not stop profiling: /stop_profile answered HTTP {r.status} "
                                f"({r.text()}); stop it yourself: curl -X POST {self.server.url('/stop_profile')}")


def _prepare_out(out: Path) -> bool:
    created = not out.exists()
    if out.exists() and not out.is_dir():
        raise BadOptionValue(f"--out {out}: a file, not a folder")
    from tracekit.readers import trace_suffixes

    out.mkdir(parents=True, exist_ok=True)
    old = [p.name for p in out.iterdir() if p.is_file() and (p.name.endswith(trace_suffixes()) or p.name ==
                                                             "manifest.json")]
    if old:
        raise CannotWrite(f"--out {out} already holds a capture ({', '.join(sorted(old)[:3])}): give a new folder "
                            "(each capture's manifest belongs to its own traces)")
    return created


def _gpu_name(path: Path) -> str | None:
    """The GPU name in a Kineto trace's ``deviceProperties`` (written before its events), read from its head."""
    try:
        opener = gzip.open if path.name.endswith(".gz") else open
        with opener(path, "rb") as f:
            head = f.read(1 << 20).decode("utf-8", "replace")
    except (OSError, EOFError, gzip.BadGzipFile):
        return None
    m = re.search(r'"deviceProperties"\s*:\s*\[\s*\{[^\]]*?"name"\s*:\s*"([^"]{1,120})"', head)
    return m.group(1) if m else None


def model_bytes(info: eng.EngineInfo, *, batch: int, context: int | None) -> tuple[dict, list[str]]:
    """The manifest's byte keys from the model's files, when they are on this machine: ``weight_bytes_per_step``
    (per GPU: the target's shard plus the draft's reads, ``tracekit.model.step_bytes``), ``draft_bytes_per_step``,
    ``kv_bytes_per_step`` at ``context``, ``model`` / ``draft_model``. Else ``{}`` and a warning."""
    from tracekit.model import load_model, resolve_model, step_bytes

    if not info.model_path:
        return {}, ["weight bytes per step unknown: the server names no model path"]
    path, how = resolve_model(info.model_path)
    if path is None:
        return {}, [f"weight bytes per step unknown: the model {info.model_path!r} is not on this machine ({how}); "
                    "pass --model PATH to tracekit breakdown, or run the capture where the model's files are"]
    spec = info.spec
    forwards = (spec.draft_forwards or 0) if spec else 0
    k = (spec.draft_tokens or 0) if spec else 0
    tp, ep = info.tp or 1, info.ep or 1
    try:
        model = load_model(path)
        separate = bool(spec and spec.draft_model_path and forwards)
        if not ((ep <= tp and tp % ep == 0) or (ep > tp and ep % tp == 0)):
            ep = 1   # (a layout tracekit.model does not split: the experts counted as tensor-parallel)
        sb = step_bytes(model, tp=tp, ep=ep, batch=max(1, batch),
                        context=context, draft_forwards=0 if separate else forwards, verify_tokens=k + 1)
    except TracekitError as e:
        return {}, [f"weight bytes per step unknown: {path}: {e}"]
    out = {"weight_bytes_per_step": sb.weight_bytes_per_step, "draft_bytes_per_step": sb.draft_bytes_per_step,
           "kv_bytes_per_step": sb.kv_bytes_per_step,
           "model": {"path": str(path), "found": how, "checkpoint_bytes": sb.checkpoint_bytes, "tp": tp, "ep": ep,
                     "batch": batch, "context": context, "notes": list(sb.notes)[:20]}}
    warnings = list(sb.warnings)
    if sb.draft_bytes_per_step and forwards:
        out["draft_model"] = {"kind": "MTP / next-n layers of the target's checkpoint",
                              "weight_bytes": int(round(sb.draft_bytes_per_step / forwards)),
                              "forwards_per_step": forwards}
    if spec and spec.draft_model_path and forwards:
        dpath, dhow = resolve_model(spec.draft_model_path)
        try:
            if dpath is None:
                raise ModelFilesMissing(dhow)
            dsb = step_bytes(load_model(dpath), tp=tp, batch=max(1, batch))
            per = dsb.weight_bytes_per_step
            out["draft_model"] = {"kind": "separate draft model", "path": str(dpath), "weight_bytes": per,
                                  "forwards_per_step": forwards}
            out["draft_bytes_per_step"] = per * forwards
            out["weight_bytes_per_step"] = sb.weight_bytes_per_step + per * forwards
        except TracekitError as e:
            warnings.append(f"the draft model's bytes are not counted ({spec.draft_model_path}: {e})")
    return out, warnings


def capture_server(*, url: str, out: Path, engine: str = "auto", steps: int = DEFAULT_STEPS, concurrency: int = 1,
                   decode_tokens: int = 128, prompt_tokens: int = 256, server_dir: str | None = None,
                   repeats: int = 3, trace_timeout: float = 300.0, settle: float = 2.0,
                   request_timeout: float = 300.0, argv: list[str] | None = None,
                   progress: Progress | None = None) -> dict:
    """Profile the server at ``url``; return the manifest written to ``out/manifest.json``."""
    if engine not in ("auto", *eng.ENGINES):
        raise BadOptionValue(f"--engine {engine}: use auto, sglang or vllm")
    if decode_tokens < 2:
        raise BadOptionValue(f"--decode-tokens {decode_tokens}: at least 2 (the first token is the prefill's)")
    progress = progress or Progress()
    server = Server(url, timeout=request_timeout)
    try:
        info = eng.identify(server, engine)
    except Unreachable as e:
        raise ServerUnreachable(f"no server at {server.base} ({e.why}): start the SGLang or vLLM server, or check the "
                            "host and port of --server")
    if info.engine == eng.VLLM and info.profiler_enabled is False:
        raise _not_enabled(info)
    out = Path(out)
    created = _prepare_out(out)
    try:
        return _capture(server, info, out, steps=steps, concurrency=concurrency, decode_tokens=decode_tokens,
                        prompt_tokens=prompt_tokens, server_dir=server_dir, repeats=repeats,
                        trace_timeout=trace_timeout, settle=settle, request_timeout=request_timeout,
                        argv=argv, progress=progress)
    except (TracekitError, KeyboardInterrupt):
        progress.clear()
        if created and out.is_dir() and not any(out.iterdir()):
            out.rmdir()
        raise


def _not_enabled(info: eng.EngineInfo) -> TracekitError:
    return ServerRefused(
        "profiling is not enabled on this vLLM server (/start_profile is not served): restart it with "
        "--profiler-config '{\"profiler\": \"torch\", \"torch_profiler_dir\": \"/shared/traces\"}' "
        "(vLLM before 0.13: VLLM_TORCH_PROFILER_DIR=/shared/traces), a folder this host sees at the same path")


def _trace_folder(info: eng.EngineInfo, out: Path, server_dir, warnings: list[str]) -> tuple[Path, str]:
    """The folder to watch for the server's traces and the output_dir /start_profile is given: sglang's under
    ``server_dir`` (or ``out``), vLLM's own profiler folder (``server_dir``, /server_info, else ``out``)."""
    if info.engine == eng.SGLANG:
        if server_dir is None or Path(server_dir) == out:
            watch = out
        else:  # a fresh folder under the shared one (the sglang.profiler CLI's own way: output_dir/<time>)
            watch = Path(server_dir) / f"tracekit-{time.time():.3f}"
        output_dir = str(watch)
    else:
        folder = server_dir or info.profiler_dir
        if folder is None:
            warnings.append("vLLM's trace folder is unknown (no --server-dir, no /server_info): watching --out; "
                            "pass the torch_profiler_dir of its --profiler-config as --server-dir")
            folder = str(out)
        watch, output_dir = Path(folder), folder
    return watch, output_dir


def _profile(server: Server, info: eng.EngineInfo, prof: _Profile, load: Load, output_dir: str, *, steps: int,
             request_timeout, say) -> None:
    """Profile ``steps`` decode steps under ``load``: start the load, /start_profile once the first output came,
    /stop_profile after ``steps`` + 2 outputs; the load is cancelled and the profiler stopped whatever happens."""
    with _signals_raise():
        try:
            load.start()
            if not load.wait_first(request_timeout) or load.failure():
                raise _load_failure(server, load, "before profiling started; nothing was profiled")
            prof.maybe_running = True
            try:
                r = eng.start_profile(server, info, output_dir, steps)
            except Unreachable as e:
                raise _gone(server.base, e.why, "while /start_profile was sent")
            if not r.ok:
                prof.maybe_running = False
                raise _start_refused(server, info, r)
            t_start = time.perf_counter()
            say(f"profiling {steps} steps into {output_dir}")
            while not load.finished and load.outputs_after(t_start) < steps + 2:
                time.sleep(0.02)
            if load.failure():
                raise _load_failure(server, load, "while it was profiling")
            try:
                prof.stop()
            except Unreachable as e:
                raise _gone(server.base, e.why, "while /stop_profile was sent; it may still be profiling")
            load.join(request_timeout)
        finally:
            load.cancel()
            if prof.maybe_running:
                try:
                    prof.stop()
                except (Unreachable, TracekitError):
                    pass        # the error being raised says what went wrong; the stop was tried


def _capture(server: Server, info: eng.EngineInfo, out: Path, *, steps, concurrency, decode_tokens, prompt_tokens,
             server_dir, repeats, trace_timeout, settle, request_timeout, argv, progress) -> dict:
    say = lambda msg: progress.say(msg, force=True)  # noqa: E731
    spec_txt = (f", speculative {info.spec.algorithm} ({info.spec.draft_tokens} draft tokens)" if info.spec else "")
    say(f"{info.engine} {info.version or '(version unknown)'} at {server.base}: {info.model_path}, "
        f"tp {info.tp if info.tp is not None else '?'}{spec_txt}")
    warnings = list(info.warnings)

    # ---- where the server writes its traces
    watch, output_dir = _trace_folder(info, out, server_dir, warnings)
    before = set(new_files(watch, set())) if watch.is_dir() else set()

    # ---- 2. the unprofiled step
    try:
        m = measure(server, info, concurrency=concurrency, decode_tokens=decode_tokens, prompt_tokens=prompt_tokens,
                    repeats=repeats, timeout=request_timeout, say=say)
    except Unreachable as e:
        raise _gone(server.base, e.why, "while the unprofiled step was measured; nothing was profiled")
    except LoadFailed as e:
        raise _load_error(server, e.why, "while the unprofiled step was measured; nothing was profiled")
    accept = m.accept_len
    say(f"unprofiled decode step {m.step_ms:.3f} ms (spread {m.spread[0]:.3f}-{m.spread[1]:.3f} ms over "
        f"{repeats} repetitions, concurrency {concurrency})" + (f", accept length {accept:.3f}" if accept else ""))

    # ---- 3. the profiled steps
    profiled_tokens = max(decode_tokens, int(math.ceil((2 * steps + 8) * (accept or 1.0))))
    prof = _Profile(server, info, stop_timeout=max(request_timeout, 600.0))
    load = Load(server, info, concurrency, prompt_tokens, profiled_tokens, seed=30_000, timeout=request_timeout)
    _profile(server, info, prof, load, output_dir, steps=steps, request_timeout=request_timeout, say=say)

    # ---- 4. the traces
    hint = _where_hint(info, output_dir, out)
    last_ping = [time.monotonic(), True]

    def alive() -> bool:
        now = time.monotonic()
        if now - last_ping[0] >= 2.0:
            last_ping[0] = now
            try:
                server.get("/health", timeout=10)
                last_ping[1] = True
            except Unreachable:
                last_ping[1] = False
        return last_ping[1]

    try:
        found = wait_for_ranks(watch, info.engine, info.expected_ranks, before=before, timeout=trace_timeout,
                               settle=settle, progress=progress, alive=alive, where_hint=hint, layout=_layout(info))
    except TracesMissing as e:
        if e.gone:
            raise ServerUnreachable(f"the server at {server.base} went away mid-capture, before its traces were "
                                f"written: {e}")
        raise CaptureFailed(str(e))
    progress.clear()
    if watch.resolve() != out.resolve():
        for rf in found.ranks:
            shutil.copy2(watch / rf.name, out / rf.name)
    ranks = list(found.ranks)
    if info.tp is None:   # vLLM without /server_info: the parallel layout the file names show
        info.tp = max(r.tp for r in ranks) + 1
        info.pp = max(r.pp for r in ranks) + 1
        info.dp = max(r.dp for r in ranks) + 1
        info.sources.update({"tp": "trace file names", "pp": "trace file names", "dp": "trace file names"})
    say(f"{len(ranks)} rank trace(s): {', '.join(r.name for r in ranks)}")
    return _write_manifest(out, server, info, m, ranks, found, steps=steps, profiled_tokens=profiled_tokens,
                           output_dir=output_dir, prof=prof, argv=argv, warnings=warnings)


def _layout(info: eng.EngineInfo) -> list[str] | None:
    """The labels of the rank files one capture should write (as :attr:`RankFile.label` gives them), when the
    server said its layout."""
    if info.tp is None:
        return None
    pp = info.pp or 1
    dp = 1 if info.dp_attention else (info.dp or 1)
    named_dp = dp > 1 or info.engine == eng.VLLM
    named_pp = pp > 1 or info.engine == eng.VLLM
    return ["-".join([f"TP-{t}"] + ([f"DP-{d}"] if named_dp else []) + ([f"PP-{p}"] if named_pp else []))
            for d in range(dp) for p in range(pp) for t in range(info.tp)]


def _where_hint(info: eng.EngineInfo, output_dir: str, out: Path) -> str:
    if info.engine == eng.SGLANG:
        return (f"SGLang writes them on the server's own file system into output_dir={output_dir}: when the server "
                "runs on another host (or in a container), give --server-dir a folder both see at the same path; "
                "a server started with SGLANG_PROFILE_V2=1 refuses manual starts")
    return (f"vLLM writes them into the torch_profiler_dir of its --profiler-config (watched here: {output_dir}): "
            "pass that folder as --server-dir, shared with this host at the same path")


def _load_error(server: Server, why: str, when: str) -> TracekitError:
    if why.startswith("unreachable:"):
        return _gone(server.base, why.split(":", 1)[1].strip(), when)
    return ServerRefused(f"the server refused the load's request ({why.split(':', 1)[1].strip()}) {when}; check "
                         "--prompt-tokens and --decode-tokens against its context length")


def _load_failure(server: Server, load: Load, when: str) -> TracekitError:
    why = load.failure()
    if why is None:
        return CaptureFailed(f"no request of the load produced a first output in time {when}")
    return _load_error(server, why, when)


def _start_refused(server: Server, info: eng.EngineInfo, r) -> TracekitError:
    if info.engine == eng.VLLM and r.status == 404:
        return _not_enabled(info)
    if info.engine == eng.SGLANG and r.status == 500:
        return ServerRefused(
            f"profiling already in progress: SGLang refused /start_profile (HTTP 500 {r.text(80)}), as it does while "
            f"a profile runs (\"Profiling is already in progress. Call /stop_profile first.\"); tracekit leaves that "
            f"profile alone: let it finish, or stop it (curl -X POST {server.url('/stop_profile')}) and run again")
    return ServerRefused(f"the server refused /start_profile (HTTP {r.status} {r.text()})")


def _write_manifest(out: Path, server: Server, info: eng.EngineInfo, m, ranks, found, *, steps, profiled_tokens,
                    output_dir, prof: _Profile, argv, warnings) -> dict:
    from tracekit.manifest import trace_file_entry

    spec = info.spec
    accept = m.accept_len
    k = spec.draft_tokens if spec else None
    if spec and k is None and m.draft_tokens:  # vLLM without /server_info: K from its counters
        k = int(round(m.draft_tokens))
    context = int(round(m.prompt_tokens + (1 + steps / 2) * (accept or 1.0)))
    bytes_keys, bwarn = model_bytes(info, batch=m.concurrency, context=context)
    warnings += bwarn
    dtype = info.dtype if info.dtype and info.dtype != "auto" else None
    if dtype is None and bytes_keys.get("model"):
        try:
            cfg = json.loads((Path(bytes_keys["model"]["path"]) / "config.json").read_text())
            dtype = cfg.get("torch_dtype") or cfg.get("dtype")
        except (OSError, ValueError, TypeError):
            dtype = None
    gpu = _gpu_name(out / ranks[0].name) if ranks else None
    manifest = {
        "schema": MANIFEST_V2_SCHEMA,
        "workload": f"{info.engine}-server",
        "profiler": "torch",
        "mode": info.mode,
        "steps": int(steps),
        "gpu_name": gpu or "unknown",
        "peak_bw_gbps": None,
        "weight_bytes_per_step": bytes_keys.get("weight_bytes_per_step"),
        "dtype": str(dtype or info.dtype or "unknown"),
        "tp": int(info.tp or 1),
        "spec": ({"draft_tokens": k, "accept_len": None if accept is None else round(accept, 4)} if spec else None),
        "tokens_per_step": int(m.concurrency),
        "unprofiled_step_ms": round(m.step_ms, 6),
        "versions": {"torch": None, "cuda": None, "nsys": None,
                     "framework": f"{info.engine} {info.version}" if info.version else info.engine},
        "command": [str(a) for a in (argv or ["tracekit", "capture", "--server", server.base, "--out", str(out)])],
        "trace_files": [trace_file_entry(out / r.name) for r in ranks],
        "server": {"url": server.base, "engine": info.engine, "version": info.version, "model_path": info.model_path,
                   "config": info.config},
        "unprofiled_step_ms_spread": [round(m.spread[0], 6), round(m.spread[1], 6)],
        "concurrency": int(m.concurrency),
        # extension keys
        "phase": "decode",   # profiling starts once every request has its first token: the window is decode
        "context": context,
        **{k_: v for k_, v in bytes_keys.items() if k_ != "weight_bytes_per_step"},
        "parallel": {"tp": info.tp, "dp": info.dp, "pp": info.pp, "ep": info.ep, "dp_attention": info.dp_attention,
                     "sources": info.sources},
        "rank_traces": [{"name": r.name, "tp": r.tp, "dp": r.dp, "pp": r.pp, "ep": r.ep} for r in ranks],
        "unprofiled": m.to_dict(),
        "profile": {"num_steps": int(steps), "server_dir": output_dir, "stopped_by": prof.stopped_by,
                    "started_after_first_output": True, "decode_tokens": profiled_tokens,
                    "waited_for_traces_s": round(found.waited_s, 1), "other_new_files": list(found.others)[:20]},
        "warnings": warnings,
    }
    if spec:
        manifest["spec_settings"] = {"algorithm": spec.algorithm, "draft_forwards_per_step": spec.draft_forwards,
                                     "draft_model_path": spec.draft_model_path, **spec.settings}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2, default=str) + "\n")
    return manifest


__all__ = ["DEFAULT_STEPS", "capture_server", "model_bytes"]
