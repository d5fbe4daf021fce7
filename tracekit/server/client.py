"""The HTTP client of ``tracekit capture --server``: plain requests and server-sent-event streams.

Standard library only (``urllib`` for requests, ``http.client`` for streams, whose lines must be read as they
arrive): the capture side runs on hosts where nothing but Python and click is installed. A failure to reach the
server at all raises :class:`Unreachable` (the caller words it: "no server at URL" before the capture started,
"the server went away mid-capture" after); an HTTP error status is not an exception here, it is returned with its
body (each endpoint's caller knows what a 404 or a 500 means for it).

>>> Server("http://127.0.0.1:30000/").url("/get_server_info")
'http://127.0.0.1:30000/get_server_info'
>>> Server("https://gpu.example:8443/sglang").url("/generate")
'https://gpu.example:8443/sglang/generate'
>>> Server("localhost:8000").base
'http://localhost:8000'
"""

from __future__ import annotations

import http.client
import json
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from tracekit.errors import BadOptionValue

# the most of a response body read into memory (an untrusted server may send anything)
MAX_BODY = 16 << 20


class Unreachable(Exception):
    """The server could not be reached (refused, reset, name unknown, timed out): ``why`` says which."""

    def __init__(self, url: str, why: str):
        super().__init__(f"{url}: {why}")
        self.url, self.why = url, why


@dataclass(frozen=True)
class Response:
    """One HTTP answer: ``status`` (200, 404, ...), its ``body`` bytes and ``content_type``."""

    status: int
    body: bytes
    content_type: str = ""

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    def json(self):
        """The body as JSON, or None when it is not JSON."""
        try:
            return json.loads(self.body.decode("utf-8", "replace"))
        except ValueError:
            return None

    def text(self, limit: int = 200) -> str:
        """The body's first ``limit`` characters on one line (for messages)."""
        return " ".join(self.body[:4 * limit].decode("utf-8", "replace").split())[:limit]


def _why(e: BaseException) -> str:
    r = getattr(e, "reason", e)
    if isinstance(r, ConnectionRefusedError):
        return "connection refused"
    if isinstance(r, socket.gaierror):
        return f"host name not resolved ({r.strerror or r})"
    if isinstance(r, (TimeoutError, socket.timeout)):
        return "no answer (timed out)"
    if isinstance(r, (ConnectionResetError, BrokenPipeError, http.client.RemoteDisconnected,
                      http.client.IncompleteRead)):
        return "connection closed by the server"
    return f"{type(r).__name__}: {r}"


class Server:
    """A server's base URL (``http://host:port`` with an optional path prefix) and the requests made to it."""

    def __init__(self, url: str, timeout: float = 30.0):
        u = url.strip()
        if "://" not in u:
            u = "http://" + u
        parts = urllib.parse.urlsplit(u)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise BadOptionValue(f"--server {url}: not an http(s) URL; give e.g. http://127.0.0.1:30000")
        self.base = f"{parts.scheme}://{parts.netloc}{parts.path.rstrip('/')}"
        self.scheme, self.netloc, self.prefix = parts.scheme, parts.netloc, parts.path.rstrip("/")
        self.timeout = timeout

    def url(self, path: str) -> str:
        return self.base + path

    def request(self, method: str, path: str, body: dict | None = None, timeout: float | None = None) -> Response:
        """One request; a JSON ``body`` is sent as ``application/json``. Raises :class:`Unreachable` when there is
        no answer at all."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url(path), data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=timeout or self.timeout) as r:
                return Response(r.status, r.read(MAX_BODY), r.headers.get("Content-Type", ""))
        except urllib.error.HTTPError as e:
            try:
                payload = e.read(MAX_BODY)
            except (OSError, http.client.HTTPException):
                payload = b""
            return Response(e.code, payload, (e.headers or {}).get("Content-Type", "") if e.headers else "")
        except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
            raise Unreachable(self.base, _why(e))

    def get(self, path: str, timeout: float | None = None) -> Response:
        return self.request("GET", path, timeout=timeout)

    def post(self, path: str, body: dict | None = None, timeout: float | None = None) -> Response:
        return self.request("POST", path, body, timeout)

    def stream(self, path: str, body: dict, timeout: float | None = None,
               cancelled: Callable[[], bool] = lambda: False) -> Iterator[tuple[float, dict]]:
        """POST ``body`` and yield ``(perf_counter time, event)`` for each server-sent event ``data: {...}`` as its
        line arrives, until ``data: [DONE]`` or the end of the stream. An error status raises
        :class:`StreamRefused`; a connection lost raises :class:`Unreachable`."""
        conn_cls = http.client.HTTPSConnection if self.scheme == "https" else http.client.HTTPConnection
        conn = conn_cls(self.netloc, timeout=timeout or self.timeout)
        try:
            try:
                conn.request("POST", self.prefix + path, json.dumps(body).encode(),
                             {"Content-Type": "application/json", "Accept": "text/event-stream"})
                resp = conn.getresponse()
            except (OSError, http.client.HTTPException) as e:
                raise Unreachable(self.base, _why(e))
            if resp.status != 200:
                raise StreamRefused(Response(resp.status, resp.read(MAX_BODY), resp.getheader("Content-Type", "")))
            while not cancelled():
                try:
                    line = resp.readline(MAX_BODY)
                except (OSError, http.client.HTTPException) as e:
                    raise Unreachable(self.base, _why(e))
                t = time.perf_counter()
                if not line:
                    return
                line = line.strip()
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    return
                try:
                    event = json.loads(payload)
                except ValueError:
                    continue
                if isinstance(event, dict):
                    yield t, event
        finally:
            conn.close()


class StreamRefused(Exception):
    """A streamed request answered with an error status (``response`` holds it)."""

    def __init__(self, response: Response):
        super().__init__(f"HTTP {response.status}: {response.text()}")
        self.response = response


__all__ = ["MAX_BODY", "Response", "Server", "StreamRefused", "Unreachable"]
