"""Kineto JSON: the second process that reads the events after a cut (``python -m tracekit.readers.kineto.worker``).

Started by :mod:`tracekit.readers.kineto.split` (which says when and why) with the trace, the cut (the offset where
a read alone ends one of its pieces), the file to write to (a descriptor) and the piece sizes. It reads the events
from the cut to the end in the same pieces as a read alone would (``stream.iter_chunks_from``), groups and
types them with the same code (``columns``), puts Trace.ops' rows in order (``OpsInOrder``, as the command
does for its part) and writes, in reading order, one record per typed batch and per chunk of ordered ops
(``split.write_record``: Arrow IPC), then the end record (dropped events, NaN literals, whether its ops are
in order, the header fields after ``traceEvents``). It exits 0 only after that; any failure exits 1 and the
command reads this part itself.

It runs beside the command, whose memory counts with it: Trace.ops' rows are put in order in rounds of 64k rows
with the op and host rows typed together (``Frames.ops_together``), so that few rows wait for their place (~130 MB
at 1 GB against ~200 MB with the command's rounds).
"""

from __future__ import annotations

import io
import os
import sys
from pathlib import Path

import msgspec

import tracekit.readers.kineto.columns as columns
import tracekit.readers.kineto.stream as stream
from tracekit.readers.kineto.columns import _AHEAD, CODED, Frames, _typed, _typed_ops
from tracekit.readers.kineto.split import write_record
from tracekit.readers.kineto.stream import Decoded, iter_chunks_from


class _Shipping(Frames):
    """:class:`Frames` whose typed batches are written to ``fd`` (in the typing thread, in order) instead of
    kept; Trace.ops' rows are put in order here (OpsInOrder) and written as they are settled."""

    ops_together = True

    def __init__(self, kernel_dims: bool, fd: int):
        super().__init__(kernel_dims)
        self.fd = fd
        self.sent = 0  # names of the CODED table written so far

    def _flush(self, g: str) -> None:
        if self.pending[g]:
            hold = any(self.pending[h] and not self.typed[h] for h in CODED if h != g)
            job = self._pool.submit(self._ship, g, self.pending[g], hold)
            self.typed[g].append(job)
            self._ahead.append(job)
            self.pending[g], self.rows[g] = [], 0
            while len(self._ahead) > _AHEAD:
                self._ahead.popleft().result()

    def _ship(self, g: str, parts: list, hold: bool) -> None:
        if g in CODED:
            _typed_ops(g, parts, self.names[g], self.dropped, self.ops, hold)
            for chunk in self.ops.take_done():
                self._write("ops", chunk)
        else:
            self._write(g, _typed(g, parts, self.names[g], self.dropped))

    def _write(self, g: str, df) -> None:
        names = list(self.names["op"].index)[self.sent:]
        self.sent += len(names)
        buf = io.BytesIO()
        df.write_ipc(buf, compression="uncompressed")
        body = buf.getbuffer()
        write_record(self.fd, {"g": g, "names": names, "n": len(body)}, body)

    def finish(self) -> bool:
        """Everything written; whether Trace.ops' rows are in order (OpsInOrder.finish_parts)."""
        for g in self.pending:
            self._flush(g)
        for jobs in self.typed.values():
            for job in jobs:
                job.result()
        chunks, in_order = self.ops.finish_parts()
        for chunk in chunks:
            self._write("ops", chunk)
        return in_order


def main(argv: list[str]) -> int:
    path, start, kernel_dims, fd = Path(argv[0]), int(argv[1]), argv[2] == "1", int(argv[3])
    stream._BLOCK, stream._CHUNK, stream._WINDOW = map(int, argv[4].split(","))
    # (rounds of 64k rows: with ops_together, the rows waiting for their place stay few: ~75 MB less at 1 GB)
    columns._SETTLE = columns._SETTLE_FIRST = 1 << 16
    if sizes := os.environ.get("TRACEKIT_KINETO_TEST_SIZES"):  # (tests: the batch and round sizes, small)
        columns._BATCH, columns._SETTLE, columns._SETTLE_FIRST = map(int, sizes.split(","))
    st = Decoded(path)
    frames = _Shipping(kernel_dims, fd)
    tail = None
    codes_of: dict = {None: 0}
    try:
        for events, doc in iter_chunks_from(path, st, start):
            if doc is not None:
                tail = doc
            frames.add(events, codes_of)
            del events, doc
        in_order = frames.finish()
    finally:
        frames.close()
    if tail is not None:
        tail.traceEvents = None
    write_record(fd, {"end": True, "dropped": frames.dropped, "nan": st.nan_literals, "in_order": in_order,
                      "names": list(frames.names["op"].index)[frames.sent:],
                      "tail": msgspec.json.encode(tail).decode() if tail is not None else None})
    return 0


if __name__ == "__main__":
    try:
        code = main(sys.argv[1:])
    except BaseException:  # noqa: BLE001 - any failure: the command reads this part itself
        code = 1
    os._exit(code)
