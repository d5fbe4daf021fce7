"""The decode load ``tracekit capture --server`` drives, and the unprofiled decode step measured from it.

A load is ``C`` concurrent streamed requests (one thread each) of a fixed number of new tokens (``ignore_eos``,
greedy), each with its own prompt of token ids. Every event of every stream is timed as it arrives
(``time.perf_counter``) with the completion tokens it reports, so a request's decode time is the time from its
first output to its last (the first output carries the prefill; ``bench_serving`` / ``benchmark_serving`` time a
decode step the same way: (latency - TTFT) / (output tokens - 1)).

A decode step emits one token per sequence without speculation and several with it, so the step time is the
decode time per decode *step*, not per token:

* SGLang counts the verify forwards of each request (``meta_info.spec_verify_ct``): steps after the first output
  = (tokens after the first output) / (tokens per verify), tokens per verify = (completion tokens - 1) /
  ``spec_verify_ct`` (the first token comes from the prefill). Without speculation, one token per step.
* vLLM counts drafts and accepted tokens per server (``vllm:spec_decode_num_drafts_total``, ``..._accepted_``):
  scraped before and after each repetition, mean acceptance length = 1 + accepted / drafts (the bonus token
  included), draft tokens per draft = draft tokens / drafts.

Each repetition's step is the median over its requests; the recorded step is the median of the repetitions, with
their range as its spread. Standard library only.
"""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass, field

from tracekit.errors import CaptureFailed, UnsupportedServer
from tracekit.server.client import Response, Server, StreamRefused, Unreachable
from tracekit.server.engines import SGLANG, EngineInfo, parse_event, request_of, spec_counters


@dataclass
class Stream:
    """One streamed request as it ran: when it was sent, each event's time and completion tokens so far."""

    index: int
    t_sent: float = 0.0
    events: list = field(default_factory=list)     # (time, completion tokens so far | None, has output)
    verify_ct: int | None = None
    error: str | None = None                       # the server's error event
    refused: Response | None = None                # an error status
    unreachable: str | None = None                 # the connection failed
    done: bool = False
    first: threading.Event = field(default_factory=threading.Event)

    @property
    def outputs(self) -> list:
        return [e for e in self.events if e[2] or (e[1] or 0) > 0]

    @property
    def completion_tokens(self) -> int | None:
        counts = [e[1] for e in self.events if e[1] is not None]
        return max(counts) if counts else None


class Load:
    """``concurrency`` streamed requests of ``max_tokens`` tokens, run in threads (:meth:`start`, :meth:`join`)."""

    def __init__(self, server: Server, info: EngineInfo, concurrency: int, prompt_tokens: int, max_tokens: int,
                 seed: int, timeout: float):
        self.server, self.info, self.timeout = server, info, timeout
        self.streams = [Stream(i) for i in range(concurrency)]
        self.requests = [request_of(info, prompt_tokens, max_tokens, seed + i) for i in range(concurrency)]
        self._cancel = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> Load:
        for s, (path, body) in zip(self.streams, self.requests):
            t = threading.Thread(target=self._run, args=(s, path, body), daemon=True, name=f"tracekit-load-{s.index}")
            self._threads.append(t)
        for t in self._threads:
            t.start()
        return self

    def _run(self, s: Stream, path: str, body: dict) -> None:
        s.t_sent = time.perf_counter()
        try:
            for t, event in self.server.stream(path, body, timeout=self.timeout, cancelled=self._cancel.is_set):
                c = parse_event(self.info, event)
                if c.error is not None:
                    s.error = c.error
                    break
                if c.verify_ct is not None:
                    s.verify_ct = c.verify_ct
                s.events.append((t, c.tokens, c.has_output))
                if c.has_output or (c.tokens or 0) > 0:
                    s.first.set()
        except StreamRefused as e:
            s.refused = e.response
        except Unreachable as e:
            s.unreachable = e.why
        except Exception as e:  # noqa: BLE001 - reported by the caller as one line
            s.unreachable = f"{type(e).__name__}: {e}"
        finally:
            s.done = True
            s.first.set()

    def wait_first(self, timeout: float) -> bool:
        """True once every stream has its first output (or ended)."""
        end = time.monotonic() + timeout
        for s in self.streams:
            if not s.first.wait(max(0.0, end - time.monotonic())):
                return False
        return True

    def outputs_after(self, t: float) -> int:
        """Output events the first live stream received after ``t`` (about one per engine step)."""
        live = [s for s in self.streams if not s.done] or self.streams
        return sum(1 for e in list(live[0].events) if e[0] > t and (e[2] or (e[1] or 0) > 0))

    @property
    def finished(self) -> bool:
        return all(s.done for s in self.streams)

    def join(self, timeout: float | None = None) -> bool:
        end = None if timeout is None else time.monotonic() + timeout
        for t in self._threads:
            t.join(None if end is None else max(0.0, end - time.monotonic()))
        return self.finished

    def cancel(self) -> None:
        self._cancel.set()

    def failure(self) -> str | None:
        """The first failure of a stream as one phrase, or None."""
        for s in self.streams:
            if s.unreachable:
                return f"unreachable: {s.unreachable}"
        for s in self.streams:
            if s.refused is not None:
                return f"refused: HTTP {s.refused.status} {s.refused.text()}"
            if s.error:
                return f"refused: {s.error}"
        return None


# ------------------------------------------------------------------------------------------------
# one repetition -> step time and acceptance
# ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Repetition:
    """One repetition: the median decode step over its requests, its acceptance, its requests' own figures."""

    step_ms: float
    accept_len: float | None
    tpot_ms: float
    ttft_ms: float
    per_request_step_ms: tuple[float, ...]
    tokens: tuple[int, ...]
    steps: tuple[float, ...]
    draft_tokens: float | None = None       # vLLM: draft tokens per draft (K), from the counters

    def to_dict(self) -> dict:
        return {"step_ms": round(self.step_ms, 6), "accept_len": None if self.accept_len is None
                else round(self.accept_len, 4), "tpot_ms": round(self.tpot_ms, 6), "ttft_ms": round(self.ttft_ms, 3),
                "per_request_step_ms": [round(x, 6) for x in self.per_request_step_ms],
                "completion_tokens": list(self.tokens), "decode_steps": [round(x, 3) for x in self.steps],
                **({"draft_tokens_per_draft": round(self.draft_tokens, 3)} if self.draft_tokens else {})}


def _decode_window(s: Stream) -> tuple[float, float, int, int] | None:
    """(t_first, t_last, tokens at the first output, tokens at the end) of one stream, or None when it did not
    stream two outputs."""
    outs = s.outputs
    total = s.completion_tokens
    if len(outs) < 2 or total is None or total < 2:
        return None
    # the usage-only event after the last token (vLLM) carries no output: the last output is the last text event
    texts = [e for e in outs if e[2]] or outs
    t_first, n_first = texts[0][0], texts[0][1] or 1
    return t_first, texts[-1][0], max(1, n_first), total


def repetition(load: Load, engine: str, counters: tuple[dict | None, dict | None] = (None, None),
               spec: bool = False) -> Repetition:
    """The step time of one finished load. ``counters``: vLLM's speculative counters before and after it."""
    windows = [(s, _decode_window(s)) for s in load.streams]
    usable = [(s, w) for s, w in windows if w is not None]
    if not usable:
        raise CaptureFailed("the server streamed fewer than two outputs per request: no decode step to time "
                            "(is --decode-tokens at least 2, and does the server stream, stream_interval 1?)")
    accept = None
    k = None
    if engine == SGLANG:
        cts = [(s.completion_tokens - 1, s.verify_ct) for s, _ in usable if s.verify_ct]
        if spec and cts:
            accept = sum(a for a, _ in cts) / sum(b for _, b in cts)
        elif spec:
            raise UnsupportedServer("the SGLang server runs speculative decoding but its streamed meta_info carries no "
                                "spec_verify_ct: the decode steps cannot be counted")
    elif spec:
        before, after = counters
        if before is None or after is None:
            raise UnsupportedServer("the vLLM server runs speculative decoding but /metrics has no "
                                "vllm:spec_decode_* counters: the decode steps cannot be counted")
        d = {key: after.get(key, 0.0) - before.get(key, 0.0) for key in after}
        drafts = d.get("vllm:spec_decode_num_drafts_total", 0.0)
        if drafts <= 0:
            raise CaptureFailed("vLLM's vllm:spec_decode_num_drafts_total did not move during the load: the decode "
                                "steps cannot be counted")
        accept = 1.0 + d.get("vllm:spec_decode_num_accepted_tokens_total", 0.0) / drafts
        k = d.get("vllm:spec_decode_num_draft_tokens_total", 0.0) / drafts or None
    per_step, per_tok, steps_list, toks = [], [], [], []
    for s, (t0, t1, n1, n) in usable:
        if engine == SGLANG and spec and s.verify_ct:
            acc_r = (n - 1) / s.verify_ct
        else:
            acc_r = accept or 1.0
        steps = (n - n1) / acc_r
        if steps <= 0 or t1 <= t0:
            continue
        per_step.append((t1 - t0) * 1e3 / steps)
        per_tok.append((t1 - t0) * 1e3 / (n - n1))
        steps_list.append(steps)
        toks.append(n)
    if not per_step:
        raise CaptureFailed("every request ended with its first output: no decode step to time")
    ttft = statistics.median((usable_w[0] - s.t_sent) * 1e3 for s, usable_w in usable)
    return Repetition(statistics.median(per_step), accept, statistics.median(per_tok), ttft, tuple(per_step),
                      tuple(toks), tuple(steps_list), k)


@dataclass(frozen=True)
class Measurement:
    """The unprofiled decode step over several repetitions: median, spread (min, max of the repetitions),
    acceptance length (median) and each repetition."""

    step_ms: float
    spread: tuple[float, float]
    accept_len: float | None
    draft_tokens: float | None
    reps: tuple[Repetition, ...]
    concurrency: int
    decode_tokens: int
    prompt_tokens: int

    def to_dict(self) -> dict:
        return {"method": "streamed requests: (last output - first output) / decode steps, median over requests, "
                          "median over repetitions",
                "concurrency": self.concurrency, "decode_tokens": self.decode_tokens,
                "prompt_tokens": self.prompt_tokens, "step_ms": round(self.step_ms, 6),
                "spread_ms": [round(self.spread[0], 6), round(self.spread[1], 6)],
                "accept_len": None if self.accept_len is None else round(self.accept_len, 4),
                "tpot_ms": round(statistics.median(r.tpot_ms for r in self.reps), 6),
                "ttft_ms": round(statistics.median(r.ttft_ms for r in self.reps), 3),
                "repetitions": [r.to_dict() for r in self.reps]}


def run_load(server: Server, info: EngineInfo, *, concurrency: int, prompt_tokens: int, max_tokens: int, seed: int,
             timeout: float) -> Load:
    """Run one load to its end (every stream finished); raise on a failed stream."""
    load = Load(server, info, concurrency, prompt_tokens, max_tokens, seed, timeout).start()
    load.join()
    why = load.failure()
    if why is not None:
        raise LoadFailed(why)
    return load


class LoadFailed(Exception):
    """A stream of the load failed: ``why`` starts with ``unreachable:`` or ``refused:``."""

    def __init__(self, why: str):
        super().__init__(why)
        self.why = why


def measure(server: Server, info: EngineInfo, *, concurrency: int, decode_tokens: int, prompt_tokens: int,
            repeats: int, timeout: float, say=lambda msg: None) -> Measurement:
    """Warm up once, then ``repeats`` timed loads; the unprofiled step of the decode load."""
    spec = info.spec is not None
    vllm_spec = spec and info.engine != SGLANG
    say(f"warm-up: {concurrency} request(s) of {min(decode_tokens, 16)} tokens")
    run_load(server, info, concurrency=concurrency, prompt_tokens=prompt_tokens, max_tokens=min(decode_tokens, 16),
             seed=10_000, timeout=timeout)
    reps = []
    for r in range(repeats):
        before = spec_counters(server) if vllm_spec else None
        load = run_load(server, info, concurrency=concurrency, prompt_tokens=prompt_tokens, max_tokens=decode_tokens,
                        seed=20_000 + 100 * r, timeout=timeout)
        after = spec_counters(server) if vllm_spec else None
        rep = repetition(load, info.engine, (before, after), spec)
        reps.append(rep)
        acc = f", accept length {rep.accept_len:.3f}" if rep.accept_len is not None else ""
        say(f"unprofiled repetition {r + 1}/{repeats}: decode step {rep.step_ms:.3f} ms{acc}")
    steps = [r.step_ms for r in reps]
    accs = [r.accept_len for r in reps if r.accept_len is not None]
    ks = [r.draft_tokens for r in reps if r.draft_tokens]
    return Measurement(statistics.median(steps), (min(steps), max(steps)),
                       statistics.median(accs) if accs else None, statistics.median(ks) if ks else None,
                       tuple(reps), concurrency, decode_tokens, prompt_tokens)


__all__ = ["Load", "LoadFailed", "Measurement", "Repetition", "Stream", "measure", "repetition", "run_load"]
