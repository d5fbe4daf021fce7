"""TEST SERVER plumbing (not an engine): a threaded HTTP server, responses the way FastAPI/uvicorn send them, and
the scheduler a test engine runs.

HTTP: ``http.server.ThreadingHTTPServer`` speaking HTTP/1.1; JSON bodies with a Content-Length; streamed bodies
(server-sent events) in chunked transfer encoding, as uvicorn sends a ``StreamingResponse``; an unknown route is
FastAPI's ``404 {"detail": "Not Found"}``, a known route with another method ``405 {"detail": "Method Not
Allowed"}``, an exception in a route Starlette's ``500 Internal Server Error`` (text/plain). :meth:`TestServer.die`
ends the server abruptly (listening socket closed, open streams cut without their last chunk): "the server went
away".

Scheduler: one thread runs the engine loop. Requests wait in a queue; a batch either prefills the waiting ones
(each gets its first token, as a prefill samples one) or decodes the running ones (one step: each gets the tokens
its step accepts). Between two batches the thread runs the control calls (a profiler start or stop: the engines
handle them in their scheduler loop, between forward batches); before each batch it counts the batch
(``forward_ct``) and calls ``before_batch`` (the profiler's step check: SGLang's ``Scheduler.run_batch``
increments ``forward_ct`` and runs ``_profile_batch_predicate`` before the forward). Standard library only.
"""

from __future__ import annotations

import json
import queue
import socket
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

# ------------------------------------------------------------------------------------------------
# HTTP
# ------------------------------------------------------------------------------------------------


class Gone(Exception):
    """The server died while a route ran: the connection is cut."""


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _HTTPServer

    def log_message(self, fmt, *args):  # quiet
        pass

    def _dispatch(self, method: str) -> None:
        app = self.server.app
        parts = urlsplit(self.path)
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n) if n else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            send_json(self, 400, {"detail": "invalid JSON"})
            return
        routes = app.routes()
        fn = routes.get((method, parts.path))
        if fn is None:
            if any(p == parts.path for _, p in routes):
                send_json(self, 405, {"detail": "Method Not Allowed"})
            else:
                send_json(self, 404, {"detail": "Not Found"})
            return
        try:
            fn(self, body, {k: v[-1] for k, v in parse_qs(parts.query).items()})
        except Gone:
            cut(self)
        except (BrokenPipeError, ConnectionResetError):
            pass
        except Exception:  # noqa: BLE001 - Starlette's ServerErrorMiddleware answer
            send_text(self, 500, "Internal Server Error")

    def do_GET(self):
        self._dispatch("GET")

    def do_POST(self):
        self._dispatch("POST")

    def do_PUT(self):
        self._dispatch("PUT")


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


def send_json(h: BaseHTTPRequestHandler, status: int, obj) -> None:
    data = json.dumps(obj).encode()
    h.send_response(status)
    h.send_header("Content-Type", "application/json")
    h.send_header("Content-Length", str(len(data)))
    h.end_headers()
    h.wfile.write(data)


def send_text(h: BaseHTTPRequestHandler, status: int, text: str, content_type: str = "text/plain; charset=utf-8"):
    data = text.encode()
    h.send_response(status)
    h.send_header("Content-Type", content_type)
    h.send_header("Content-Length", str(len(data)))
    h.end_headers()
    h.wfile.write(data)


def start_sse(h: BaseHTTPRequestHandler) -> None:
    h.send_response(200)
    h.send_header("Content-Type", "text/event-stream; charset=utf-8")
    h.send_header("Transfer-Encoding", "chunked")
    h.send_header("Connection", "close")
    h.end_headers()
    h.close_connection = True


def sse(h: BaseHTTPRequestHandler, payload: bytes) -> None:
    """One server-sent event ``data: ...`` as one HTTP chunk."""
    data = b"data: " + payload + b"\n\n"
    h.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
    h.wfile.flush()


def end_sse(h: BaseHTTPRequestHandler) -> None:
    sse(h, b"[DONE]")
    h.wfile.write(b"0\r\n\r\n")
    h.wfile.flush()


def cut(h: BaseHTTPRequestHandler) -> None:
    """End the connection abruptly (a dying server)."""
    h.close_connection = True
    try:
        h.connection.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


class App:
    """A test server's routes and its state; ``dead`` once the server died."""

    dead = False

    def routes(self) -> dict:
        raise NotImplementedError


class TestServer:
    """``app`` served on ``host:port`` (0: a free port) in a background thread. ``url`` once started."""

    __test__ = False  # (not a pytest class)

    def __init__(self, app: App, host: str = "127.0.0.1", port: int = 0):
        self.app = app
        self.httpd = _HTTPServer((host, port), Handler)
        self.httpd.app = app
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                       daemon=True, name="test-server")

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> TestServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        stop = getattr(self.app, "close", None)
        if stop:
            stop()

    def die(self) -> None:
        """The server goes away: no new connection is accepted, open streams are cut."""
        self.app.dead = True
        threading.Thread(target=self.httpd.shutdown, daemon=True).start()
        self.httpd.socket.close()


# ------------------------------------------------------------------------------------------------
# the scheduler
# ------------------------------------------------------------------------------------------------

@dataclass
class Request:
    """One generation request inside the test engine; its events go to ``out`` as ``(new tokens, verify
    forwards so far, finished)``."""

    rid: str
    prompt_len: int
    max_tokens: int
    out: queue.Queue = field(default_factory=queue.Queue)
    produced: int = 0
    verify_ct: int = 0
    cancelled: bool = False

    def give(self, n: int, verify: bool) -> None:
        n = max(0, min(n, self.max_tokens - self.produced))
        self.produced += n
        if verify:
            self.verify_ct += 1
        self.out.put((n, self.verify_ct, self.produced >= self.max_tokens))

    @property
    def done(self) -> bool:
        return self.produced >= self.max_tokens or self.cancelled


class Scheduler:
    """The engine loop of a test server. Subclasses define :meth:`prefill` and :meth:`decode` (which returns the
    tokens each running request gets this step); ``before_batch(mode, bs)`` runs before every batch, once
    ``forward_ct`` counts it (mode ``EXTEND`` or ``DECODE``, SGLang's ForwardMode names); control calls run between
    batches (:meth:`call`).

    ``admit_when_idle``: new requests join only when none runs (an engine whose batch shares one reset state);
    ``admit_wait_s``: once a request waits, wait this long for more to fill the batch (requests sent together
    start together)."""

    speculative = False

    def __init__(self, *, max_batch: int = 64, admit_when_idle: bool = False, admit_wait_s: float = 0.0):
        self.max_batch, self.admit_when_idle, self.admit_wait_s = max_batch, admit_when_idle, admit_wait_s
        self.waiting: queue.Queue = queue.Queue()
        self.control: queue.Queue = queue.Queue()
        self.running: list[Request] = []
        self.before_batch = lambda mode, bs: None
        self.forward_ct = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # subclasses
    def prefill(self, reqs: list[Request]) -> None:
        raise NotImplementedError

    def decode(self, reqs: list[Request]) -> list[int]:
        raise NotImplementedError

    # interface
    def submit(self, req: Request) -> None:
        self.waiting.put(req)

    def call(self, fn, timeout: float = 600.0):
        """Run ``fn()`` in the scheduler thread between two batches; return its result (as the engines' scheduler
        handles a profile request)."""
        fut: Future = Future()
        self.control.put((fn, fut))
        return fut.result(timeout)

    def start(self) -> Scheduler:
        self._thread = threading.Thread(target=self.run, daemon=True, name="test-scheduler")
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def run(self, until=lambda: False) -> None:
        """The loop (in a thread of its own after :meth:`start`, or in the caller's: ``until()`` ends it)."""
        while not self._stop.is_set() and not until():
            self._controls()
            self.running = [r for r in self.running if not r.done]
            new = []
            if not (self.admit_when_idle and self.running):
                until_t = None
                while len(self.running) + len(new) < self.max_batch:
                    try:
                        if until_t is None:
                            r = self.waiting.get_nowait()
                        else:
                            r = self.waiting.get(timeout=max(0.0, until_t - time.monotonic()))
                    except queue.Empty:
                        break
                    if until_t is None:
                        until_t = time.monotonic() + self.admit_wait_s
                    if not r.cancelled:
                        new.append(r)
            if new:
                self.forward_ct += 1
                self.before_batch("EXTEND", len(new))
                self.prefill(new)
                for r in new:
                    r.give(1, False)
                self.running += [r for r in new if not r.done]
                continue
            if self.running:
                self.forward_ct += 1
                self.before_batch("DECODE", len(self.running))
                got = self.decode(self.running)
                for r, n in zip(self.running, got):
                    r.give(n, self.speculative)
                continue
            try:  # idle: wait for work or a control call
                fn, fut = self.control.get(timeout=0.01)
            except queue.Empty:
                continue
            self._run_control(fn, fut)

    def _controls(self) -> None:
        while True:
            try:
                fn, fut = self.control.get_nowait()
            except queue.Empty:
                return
            self._run_control(fn, fut)

    @staticmethod
    def _run_control(fn, fut: Future) -> None:
        try:
            fut.set_result(fn())
        except BaseException as e:  # noqa: BLE001 - handed to the waiting route
            fut.set_exception(e)


class SimScheduler(Scheduler):
    """A decode loop simulated on the CPU: a prefill takes ``prefill_s``, a decode step ``step_s`` (times
    ``slowdown()`` while profiling: a profiler's overhead), and accepts ``accept_cycle[i % len]`` tokens in a
    request's i-th step (``[1]``: no speculation). Nothing is computed: the traces these servers write are
    recorded ones."""

    def __init__(self, *, step_s: float = 0.008, prefill_s: float = 0.004, accept_cycle=(1,), max_batch: int = 64,
                 slowdown=lambda: 1.0):
        super().__init__(max_batch=max_batch)
        self.step_s, self.prefill_s, self.accept_cycle, self.slowdown = step_s, prefill_s, tuple(accept_cycle), slowdown
        self.speculative = self.accept_cycle != (1,)
        self.step_log: list[tuple[float, bool]] = []   # (seconds, profiled) per decode step

    def prefill(self, reqs):
        time.sleep(self.prefill_s)

    def decode(self, reqs):
        factor = self.slowdown()
        t0 = time.perf_counter()
        time.sleep(self.step_s * factor)
        # (the step as this loop took it, profiled or not: on a loaded machine a sleep lasts longer than asked, and
        # tests compare a measured step with these rather than with step_s)
        self.step_log.append((time.perf_counter() - t0, factor != 1.0))
        return [self.accept_cycle[r.verify_ct % len(self.accept_cycle)] for r in reqs]

    def taken_ms(self, profiled: bool) -> float:
        """The median decode step this loop took (ms), profiled or not."""
        import statistics

        return 1e3 * statistics.median(d for d, p in self.step_log if p == profiled)


def stream_request(h: BaseHTTPRequestHandler, app: App, req: Request, first_event, event_of, timeout: float = 600.0):
    """Stream ``req``'s events as server-sent events: ``event_of(new_tokens, verify_ct, finished)`` -> bytes.
    A dying server cuts the stream (:class:`Gone`); a client gone cancels the request."""
    start_sse(h)
    try:
        if first_event is not None:
            sse(h, first_event)
        while True:
            if app.dead:
                raise Gone
            try:
                n, ct, fin = req.out.get(timeout=0.05)
            except queue.Empty:
                continue
            if app.dead:
                raise Gone
            sse(h, event_of(n, ct, fin))
            if fin:
                break
        end_sse(h)
    except (BrokenPipeError, ConnectionResetError):
        req.cancelled = True


def copy_slowly(src, dst, chunk_s: float = 0.0, chunks: int = 4) -> None:
    """Copy ``src`` to ``dst`` in ``chunks`` pieces, ``chunk_s`` apart: a trace file growing while it is written,
    as torch's gzipped export does."""
    data = open(src, "rb").read()
    step = max(1, len(data) // chunks + 1)
    with open(dst, "wb") as f:
        for i in range(0, len(data), step):
            f.write(data[i:i + step])
            f.flush()
            if chunk_s:
                time.sleep(chunk_s)


__all__ = ["App", "Gone", "Request", "Scheduler", "SimScheduler", "TestServer", "copy_slowly", "cut", "end_sse",
           "send_json", "send_text", "sse", "start_sse", "stream_request"]
