"""Kineto JSON read by two processes: where to cut, the worker process, its records. Imports no polars.

Decoding a Kineto trace holds the GIL (msgspec Structs, the C-level maps that group them and build their columns:
~6 s of one core for 1 GB), so threads cannot spread it. A plain-JSON trace of at least :data:`SPLIT_MIN_BYTES` is
therefore read by two processes: :func:`tracekit.readers.kineto.reader.read_kineto` reads the events before a cut (an
event boundary near :data:`SPLIT_AT` of the file, :func:`tracekit.readers.kineto.stream.split_at`), and a worker
(``python -m tracekit.readers.kineto.worker``), started beside it, reads the events after it and writes their typed
batches to a file the command made and deleted at once (in the system's temporary directory, never beside the
trace); the command puts them after its own, as if it had read them (:meth:`columns.Frames.take`).

The worker is spawned, not forked: a fresh interpreter that imports only the reader (never a copy of a process
whose polars thread pool runs). :func:`head_start` starts it before the command imports polars and the analysis
(as :func:`tracekit.readers.nsys.scan.head_start` starts the nsys scans), so that its imports overlap the
command's. The command takes the worker's batches only once it has exited 0 having written its last record;
on any other outcome it reads the events after the cut itself (errors and all); and when none of its own pieces
ends at the cut (a candidate ``},{`` inside a string) it simply reads on to the end alone. Either way the result
is the one a read alone gives, never a different or a partial one; a failing worker costs time only.

Records (``<u32 length><msgpack header><body>``): ``{"g": group, "names": [...], "n": body bytes}`` + Arrow IPC
of one typed batch of a group, or (group ``ops``) of a chunk of Trace.ops' rows the worker put in order, with their
``_seq`` (``names``: the names of Trace.ops the worker met since its previous record, for the command's table);
the last is ``{"end": true, "dropped": {...}, "nan": N, "in_order": bool, "names": [...], "tail": <the header
fields after traceEvents, as JSON>}``.

Why the pieces matter: a piece's events are grouped, so rows of Trace.ops that start at the same time keep their
order of reading only across pieces (within a piece, the CPU ops before the Python functions). The cut is
therefore where a read alone ends a piece (:func:`tracekit.readers.kineto.stream.split_at`), and the worker reads
its blocks on the same 1 MB grid, so that it decodes the very pieces the read alone would: every frame is the
same, row for row (``tests/readers/test_kineto.py`` compares them on every real trace).
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

import msgspec

# A plain-JSON trace of at least this many bytes is read by two processes; below it the second interpreter and
# polars (~0.3 s of CPU) cost about what they save (149 MB of JSON: no faster, +75 MB; 373 MB: -12% wall).
SPLIT_MIN_BYTES = 256 << 20
# Where the cut is, as a fraction of the file: the command reads the part before it. The worker's part is the
# smaller: it starts later (its interpreter and polars) and sorts in smaller rounds.
SPLIT_AT = 0.52
# A worker still running this long after the command read its own part (and 4 times as long as that took) is taken
# for stuck: the command reads the worker's part itself.
WAIT_MIN_S = 60.0

_LEN = struct.Struct("<I")


def write_record(fd: int, header: dict, body=b"") -> None:
    """One record to the worker's file."""
    head = msgspec.msgpack.encode(header)
    view = memoryview(b"".join((_LEN.pack(len(head)), head, body)))
    while view:
        view = view[os.write(fd, view):]


def read_records(fd: int, bodies: bool = True):
    """The records of a worker's file, in order: ``(header, body)`` (``bodies=False``: the body None, not read)."""
    off = 0
    while True:
        n = os.pread(fd, _LEN.size, off)
        if len(n) < _LEN.size:
            return
        (size,) = _LEN.unpack(n)
        header = msgspec.msgpack.decode(os.pread(fd, size, off + _LEN.size))
        off += _LEN.size + size
        body_size = header.get("n", 0)
        body = (os.pread(fd, body_size, off) if body_size else b"") if bodies else None
        off += body_size
        yield header, body


class Worker:
    """The second process, reading the events from ``start`` (the part before ``stop`` is the command's)."""

    def __init__(self, proc: subprocess.Popen, out, cut: int):
        self.proc, self.out, self.cut = proc, out, cut

    @classmethod
    def start(cls, path: Path, kernel_dims: bool) -> Worker | None:
        """A worker for ``path``, or None: a small or gzipped file, no cut found, or no process could start."""
        import tracekit.readers.kineto.stream as stream

        try:
            size = path.stat().st_size
        except OSError:
            return None
        if size < SPLIT_MIN_BYTES or not _cores_to_spare():
            return None
        cut = stream.split_at(path, int(size * SPLIT_AT))
        if cut is None:
            return None
        root = str(Path(__file__).resolve().parents[3])  # (where this tracekit is imported from)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        out = None
        try:
            out = tempfile.TemporaryFile(prefix="tracekit-kineto-")
            proc = subprocess.Popen(
                [sys.executable, "-m", "tracekit.readers.kineto.worker", str(path), str(cut),
                 "1" if kernel_dims else "0", str(out.fileno()),
                 # (its pieces must be the pieces of a read alone: the same sizes)
                 f"{stream._BLOCK},{stream._CHUNK},{stream._WINDOW}"],
                pass_fds=(out.fileno(),), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, env=env, close_fds=True)
        except (OSError, ValueError, subprocess.SubprocessError):
            if out is not None:
                out.close()
            return None
        return cls(proc, out, cut)

    def records(self, timeout: float | None = None):
        """Waits for the worker (at most ``timeout`` seconds): an iterator of its batch records ``(header, body)``
        and its end record, or None when it failed (exit status, no end record, or still running then)."""
        try:
            if self.proc.wait(timeout) != 0:
                return None
        except subprocess.TimeoutExpired:
            return None
        fd = self.out.fileno()
        end = None
        for header, _ in read_records(fd, bodies=False):  # (a pass over the headers: the end record must be there)
            end = header if header.get("end") else end
        if end is None:
            return None
        return ((h, b) for h, b in read_records(fd) if not h.get("end")), end

    def stop(self) -> None:
        """End the worker (if it still runs) and drop its file."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.out.close()


def _cores_to_spare() -> bool:
    """Whether a second process has a core of its own: not on one core, nor in a process of a pool
    (``--engine process`` reads several files at once, one per core, already)."""
    from tracekit.parallel import usable_cpus

    cores = usable_cpus()
    mp = sys.modules.get("multiprocessing")  # (a pool's spawned process has imported it)
    return cores >= 2 and not (mp is not None and mp.parent_process() is not None)


_PENDING: dict[tuple, Worker] = {}


def _key(path: Path, kernel_dims: bool) -> tuple | None:
    try:
        st = path.stat()
        return str(path.resolve()), kernel_dims, st.st_size, st.st_mtime_ns
    except OSError:
        return None


def take(path: Path, kernel_dims: bool) -> Worker | None:
    """The worker for this read: the one :func:`head_start` started, else a new one (or None)."""
    key = _key(path, kernel_dims)
    worker = _PENDING.pop(key, None) if key is not None else None
    return worker if worker is not None else Worker.start(path, kernel_dims)


@contextmanager
def head_start(path, *, kernel_dims: bool = True):
    """Inside this block the worker for a big ``.json`` trace ``path`` is already running (started before the
    caller imports polars and the analysis); :func:`tracekit.readers.kineto.reader.read_kineto` called inside takes it.
    One not taken is stopped on leaving. Any problem: no head start (the reader does as it always does)."""
    key = None
    try:
        path = Path(path)
        if path.suffix.lower() == ".json":
            key = _key(path, kernel_dims)
            if key is not None and key not in _PENDING:
                worker = Worker.start(path, kernel_dims)
                if worker is not None:
                    _PENDING[key] = worker
                else:
                    key = None
            else:
                key = None
    except Exception:  # noqa: BLE001 - no head start
        key = None
    try:
        yield
    finally:
        if key is not None:
            worker = _PENDING.pop(key, None)
            if worker is not None:
                worker.stop()
