"""Kineto JSON, part 1 of 3: the stream. Bytes in, decoded events out, chunk by chunk (the tokenizer).

The file is read (or gunzipped) 1 MB at a time in a second thread (I/O and zlib release the GIL), and the
``traceEvents`` array is cut between two events into ~1 MB pieces, each decoded by ``msgspec`` into the
small typed Structs below, which name only the fields tracekit uses (msgspec skips the rest without building
Python objects for it; ``args`` stays JSON text, decoded by :func:`decode_args` for the events whose args are read). A piece is decoded from a memoryview of its buffer, with the byte after its last
event overwritten by ``]``, so it is copied once. Everything before ``"traceEvents": [`` and after its
closing ``]`` is the header (:class:`Doc`), read by ``header``. Errors are one line, msgspec's own.
"""

from __future__ import annotations

import queue
import re
import threading
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
from msgspec import Raw, Struct, field

from tracekit.errors import TracekitError, UnreadableTrace
from tracekit.text import one_line

NULL = Raw(b"null")


class _Args(Struct, frozen=True, gc=False):
    device: Any = None
    stream: Any = None
    correlation: Any = None
    nbytes: Any = field(name="bytes", default=None)
    grid: Raw = NULL
    block: Raw = NULL
    graph_id: Any = field(name="graph id", default=None)
    graph_node: Any = field(name="graph node id", default=None)
    input_dims: Raw = field(name="Input Dims", default=NULL)
    input_dims_legacy: Raw = field(name="Input dims", default=NULL)
    input_types: Raw = field(name="Input type", default=NULL)
    coll_name: Raw = field(name="Collective name", default=NULL)
    in_nelems: Any = field(name="In msg nelems", default=None)
    out_nelems: Any = field(name="Out msg nelems", default=None)
    group_size: Any = field(name="Group size", default=None)
    dtype: Raw = NULL
    pg_name: Raw = field(name="Process Group Name", default=NULL)


class Event(Struct, gc=False):
    ph: str | None = None
    cat: str | None = None
    name: str | None = None
    pid: Any = None
    tid: Any = None
    ts: Any = None
    dur: Any = None
    # the args' JSON text, decoded (:func:`decode_args`) only for the events whose args are read: most events are
    # host work (CPU ops, Python functions) whose args are never looked at
    args: Raw = NULL




class Doc(Struct):
    traceEvents: list[Event] | None = None
    schemaVersion: Raw = NULL
    deviceProperties: Raw = NULL
    distributedInfo: Raw = NULL
    cupti_version: Raw = NULL
    cuda_runtime_version: Raw = NULL
    cuda_driver_version: Raw = NULL
    roctracer_version: Raw = NULL
    hip_runtime_version: Raw = NULL
    torch_version: Raw = NULL
    pytorch_version: Raw = NULL


# Untyped (Any) fields keep a float as its JSON text (``float_hook``): exact, and cheaper than a float.
DECODER = msgspec.json.Decoder(Doc, float_hook=str.strip)
_EVENTS = msgspec.json.Decoder(list[Event], float_hook=str.strip)
_ARGS = msgspec.json.Decoder(list[_Args | None], float_hook=str.strip)


def decode_args(raws: list[Raw]) -> list[_Args | None]:
    """The args of some events (their ``Event.args``), decoded at once (one JSON array of their texts); None for
    an event without args or with ``"args": null``. Raises :class:`ArgsError` for args that are not an object."""
    try:
        return _ARGS.decode(b"".join((b"[", b",".join(raws), b"]")))
    except msgspec.ValidationError as e:
        raise ArgsError(re.sub(r"`\$\[\d+\]", "`$.traceEvents[...].args", one_line(e))) from None


class ArgsError(ValueError):
    """An event's args of the wrong JSON type (msgspec's message, located in the trace)."""


def fail(path: Path, what: str, todo: str = "check that it is a complete PyTorch profiler / Kineto trace") -> TracekitError:
    return UnreadableTrace(f"{path}: {what}; {todo}")


# --- streaming input ---------------------------------------------------------------------
_BLOCK = 1 << 20  # bytes read / decompressed at a time
_CHUNK = 1 << 20  # event text decoded at a time (bounds the Python objects alive at once)
_WINDOW = 1 << 16  # a piece is cut at the first event boundary in its last _WINDOW bytes


def _raw_blocks(path: Path, start: int = 0) -> Iterator[bytes]:
    """The file's (decompressed) bytes, block by block. ``start`` (plain JSON only): from that offset, the first
    block up to the next multiple of _BLOCK (the blocks end where a read from the start would end them)."""
    try:
        f = open(path, "rb")
    except OSError as e:
        raise fail(path, f"cannot read the file ({e.strerror or e})", "check the path and its permissions")
    with f:
        head = f.read(2)
        f.seek(start)
        if head != b"\x1f\x8b":
            if start % _BLOCK and (block := f.read(_BLOCK - start % _BLOCK)):
                yield block
            while block := f.read(_BLOCK):
                yield block
            return
        if start:
            raise ValueError("a gzip stream is read from its start")
        d, fed = zlib.decompressobj(wbits=31), False
        try:
            while comp := f.read(_BLOCK // 4):
                data = comp
                while data:
                    out = d.decompress(data, _BLOCK)
                    fed = True
                    if out:
                        yield out
                    if d.eof:  # concatenated gzip members
                        data, d, fed = d.unused_data, zlib.decompressobj(wbits=31), False
                    else:
                        data = d.unconsumed_tail
            if fed and not d.eof:
                raise fail(path, "the gzip stream ends early (truncated file)", "copy or download the file again")
        except zlib.error as e:
            raise fail(path, f"the gzip stream is damaged ({e})", "copy or download the file again")


def _prefetched(it: Iterator[bytes], depth: int = 2) -> Iterator[bytes]:
    """Run ``it`` in a thread: reading and zlib release the GIL, so decompression overlaps decoding."""
    q: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def work():
        try:
            for b in it:
                if stop.is_set():
                    return
                q.put(b)
            q.put(None)
        except BaseException as e:  # handed to the consumer
            q.put(e)

    t = threading.Thread(target=work, daemon=True)
    t.start()
    try:
        while True:
            b = q.get()
            if b is None:
                return
            if isinstance(b, BaseException):
                raise b
            yield b
    finally:
        stop.set()
        while t.is_alive():
            try:
                q.get_nowait()
            except queue.Empty:
                t.join(0.01)


_BAD_LITERAL = re.compile(rb"(?<=[:,\[])(\s*)(-?Infinity|NaN)(?=\s*[,\]\}])")
_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_SPLIT = re.compile(rb"\}\s*,\s*\{")


class Decoded:
    """Decode-time state: warnings and counters."""

    def __init__(self, path: Path):
        self.path = path
        self.warnings: list[str] = []
        self.nan_literals = 0
        self.cut = False  # iter_chunks ended at its stop


def _decode_bytes(st: Decoded, decoder, data):
    """msgspec decode with one-line errors; NaN/Infinity (Python's json writes them) are read as null."""
    try:
        return decoder.decode(data)
    except msgspec.ValidationError as e:
        raise fail(st.path, f"unexpected JSON structure ({one_line(e)})")
    except msgspec.DecodeError as e:
        msg = one_line(e)
        if "truncated" in msg:
            raise fail(st.path, "the JSON ends early (truncated file)", "the profiler may not have finished writing it; capture or copy it again")
        fixed, n = _BAD_LITERAL.subn(rb"\1null", data)
        if n:
            try:
                out = decoder.decode(fixed)
            except (msgspec.ValidationError, msgspec.DecodeError):
                pass
            else:
                st.nan_literals += n
                return out
        raise fail(st.path, f"not valid JSON ({msg})")


def _is_bad_split(e: msgspec.DecodeError, n: int) -> bool:
    """True when decoding a candidate chunk failed only because it was cut inside a string or nested value."""
    msg = str(e)
    if "truncated" in msg:
        return True
    m = re.search(r"\(byte (\d+)\)", msg)
    return bool(m) and int(m.group(1)) >= n - 1


class _Blocks:
    """The prefetched blocks, with an end-of-input flag."""

    def __init__(self, path: Path, start: int = 0):
        self._it = _prefetched(_raw_blocks(path, start))
        self.eof = False
        self.delivered = start  # the offset after the last block given

    def next(self) -> bytes | None:
        b = None if self.eof else next(self._it, None)
        self.eof = b is None
        if b is not None:
            self.delivered += len(b)
        return b

    def close(self) -> None:
        self._it.close()


def _whole(st: Decoded, data: bytes) -> Doc:
    doc = _decode_bytes(st, DECODER, data)
    if doc.traceEvents is None:
        raise fail(st.path, "no 'traceEvents' list at the top level, so this is not a Kineto trace")
    return doc


def _header(st: Decoded, blocks: _Blocks) -> tuple[Doc, bool, bytes]:
    """Read up to ``"traceEvents": [``: (header, whole, rest). ``whole``: the header is the whole
    document (it could not be split there), else ``rest`` is the text read after the ``[``."""
    buf = b""
    while True:
        stripped = buf.lstrip()
        if stripped and stripped[:1] != b"{":
            if stripped[:1] == b"[":
                raise fail(st.path, "the top level is a JSON array, not a Kineto trace object with 'traceEvents'",
                            "give the trace file the PyTorch profiler wrote (export_chrome_trace / tensorboard_trace_handler)")
            raise fail(st.path, "not a JSON object (a Kineto trace starts with '{')")
        m = _EVENTS_KEY.search(buf)
        if m:
            break
        b = blocks.next()
        if b is None:  # no events key: let msgspec say what is wrong with the (small) document
            return _whole(st, buf), True, b""
        buf += b
    try:
        return DECODER.decode(buf[: m.start()] + b'"traceEvents":null}'), False, buf[m.end():]
    except (msgspec.DecodeError, msgspec.ValidationError):  # "traceEvents" was not a top-level key after all
        parts = [buf]
        while (b := blocks.next()) is not None:
            parts.append(b)
        return _whole(st, b"".join(parts)), True, b""


def _cut(st: Decoded, buf: bytearray, blocks: _Blocks) -> tuple[list | None, bytearray, int]:
    """Decode the events of ``buf`` (``[`` + event text) up to its last clean event boundary.

    Returns (events, buffer, where the next event starts); events is None when no boundary
    worked before the end of the input (then the buffer holds all the rest). The ``,`` or space
    after the chosen ``}`` is overwritten with ``]`` and the events are decoded from a
    memoryview, so the piece is not copied (their ``Raw`` fields point into ``buf``).
    """
    pos = max(1, len(buf) - _WINDOW)
    while True:
        s = _SPLIT.search(buf, pos)
        if s is None:
            if pos > 1 and len(buf) - pos <= _WINDOW:  # no boundary in the window: try the whole piece
                pos = 1
                continue
            b = blocks.next()
            if b is None:
                return None, buf, 0
            buf = bytearray().join((buf, b))
            continue
        end = s.start() + 1
        keep = buf[end]
        buf[end] = 0x5D  # ']'
        view = memoryview(buf)[: end + 1]
        try:
            return _EVENTS.decode(view), buf, s.end() - 1
        except msgspec.ValidationError as e:  # a DecodeError too: first
            raise fail(st.path, f"unexpected JSON structure ({one_line(e)})")
        except msgspec.DecodeError as e:
            if _is_bad_split(e, end + 1):
                buf[end] = keep
                pos = end
                continue
            events = _with_nan_literals(st, bytes(view), e)
            buf[end] = keep
            if events is None:  # NaN literals and a cut inside a string or nested value
                pos = end
                continue
            return events, buf, s.end() - 1


def _with_nan_literals(st: Decoded, data: bytes, error: msgspec.DecodeError) -> list | None:
    """Events of a piece that is not valid JSON: NaN/Infinity literals read as null (Python's json
    writes them); None when the piece, so fixed, turns out to be cut inside a value."""
    fixed, n = _BAD_LITERAL.subn(rb"\1null", data)
    if n:
        try:
            events = _EVENTS.decode(fixed)
        except msgspec.DecodeError as e:
            if _is_bad_split(e, len(fixed)):
                return None
        except msgspec.ValidationError:
            pass
        else:
            st.nan_literals += n
            return events
    raise fail(st.path, f"not valid JSON ({one_line(error)})")


def iter_chunks(path: Path, st: Decoded, stop: int | None = None) -> Iterator[tuple[list, Doc | None]]:
    """Yield (events, header-or-None) chunk by chunk, never holding the whole document.

    The top-level object is cut into: the text before ``"traceEvents": [`` (the header),
    the events (decoded ~_CHUNK bytes at a time, cut between two events), and the tail
    (the last events, the closing ``]`` and any keys after it, e.g. ``displayTimeUnit``,
    decoded as one small document). Whatever this cannot cut cleanly is decoded whole by
    msgspec, so errors are always msgspec's. The consumer must drop each chunk's events
    before asking for the next (their ``Raw`` fields point into the chunk's buffer).

    ``stop`` (a plain JSON file; :func:`split_at`): end after the piece that ends at that offset, with
    ``st.cut`` True; if no piece ends there, read on to the end (``st.cut`` False).
    """
    blocks = _Blocks(path)
    try:
        header, whole, rest = _header(st, blocks)
        if whole:
            yield header.traceEvents, header
            return
        yield [], header
        yield from _events(st, blocks, rest, blocks.delivered - len(rest), stop)
    finally:
        blocks.close()


def iter_chunks_from(path: Path, st: Decoded, start: int) -> Iterator[tuple[list, Doc | None]]:
    """:func:`iter_chunks`'s pieces from offset ``start`` (where one of its pieces ends: :func:`split_at`) to the
    end, the same pieces (the blocks end where they end for it), and the tail after them (yielded with the last
    events: its keys, the header fields after ``traceEvents``)."""
    blocks = _Blocks(path, start)
    try:
        yield from _events(st, blocks, b"", start)
    finally:
        blocks.close()


def _events(st: Decoded, blocks: _Blocks, rest: bytes, at: int, stop: int | None = None
            ) -> Iterator[tuple[list, Doc | None]]:
    """The pieces from ``rest`` (the text from offset ``at``) and the blocks after it."""
    while True:
        parts, size = [b"[", rest], 1 + len(rest)
        del rest
        while size < _CHUNK and (b := blocks.next()) is not None:
            parts.append(b)
            size += len(b)
        if blocks.eof:
            parts[0] = b'{"traceEvents":['
            tail = _decode_bytes(st, DECODER, b"".join(parts))
            yield tail.traceEvents or [], tail
            return
        buf = bytearray().join(parts)
        del parts
        events, buf, nxt = _cut(st, buf, blocks)
        if events is None:  # no boundary before the end: the rest is the tail
            tail = _decode_bytes(st, DECODER, b'{"traceEvents":' + buf)
            yield tail.traceEvents or [], tail
            return
        rest = bytes(memoryview(buf)[nxt:])
        at += nxt - 1  # (the offset of the next event: buf is '[' + the text from at)
        yield events, None
        del events, buf
        if stop is not None and at >= stop:
            if at == stop:
                st.cut = True
                return
            stop = None  # (no piece ends at stop: read on)


_HEAD = 1 << 20  # the events key must be in the file's first bytes for a cut


def split_at(path: Path, at: int) -> int | None:
    """Where :func:`iter_chunks` of a plain-JSON file will likely end a piece near offset ``at``: the start of
    the event after the first boundary (``},{``) in the last _WINDOW bytes of the block that holds ``at``, as
    :func:`_cut` chooses it when that boundary decodes; None for a gzip file, a file without the events key in its
    first MB, or no boundary there. A candidate only (``},{`` can be inside a string): ``iter_chunks(stop=...)``
    tells whether a piece really ends there. The pieces after it are then those of :func:`iter_chunks_from`."""
    end = (at // _BLOCK + 1) * _BLOCK
    try:
        with open(path, "rb") as f:
            head = f.read(_HEAD)
            if head[:2] == b"\x1f\x8b":
                return None
            key = _EVENTS_KEY.search(head)
            if key is None or end - _WINDOW <= key.end() + _BLOCK:  # (past the header's blocks)
                return None
            f.seek(end - _WINDOW)
            window = f.read(_WINDOW)
    except OSError:
        return None
    s = _SPLIT.search(window)
    if s is None or len(window) < _WINDOW:
        return None
    return end - _WINDOW + s.end() - 1
