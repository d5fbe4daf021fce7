"""Build a large SYNTHETIC Kineto trace by replicating a real one along the timeline.

Each copy of the source's activity events is shifted by the source's time span (plus a
1 ms gap), and its correlation / External id / flow ids are offset, so launches still join
their kernels and graph launches their replayed kernels. Metadata (``ph='M'``), instant
(``ph='i'``) and ``Trace`` span events and the header are written once. The output is
labelled synthetic in its header (``"synthetic": "..."``) so it is never mistaken for a
capture. A source without ``python_function`` events (a capture without ``with_stack=True``, such as
our samples) gets one synthetic Python frame around every ``cpu_op`` (``--python-functions N``: N
nested frames; 0: none), so the copy carries the host work the reader keeps (Trace.ops): every CPU
op and Python function.

    python benchmarks/make_kineto.py --size-mb 100 -o /tmp/tracekit-bench/kineto_100MB.json
    python benchmarks/make_kineto.py --size-mb 1000 -o /tmp/tracekit-bench/kineto_1GB.json.gz

The output keeps the source's own text, so it has the layout libkineto writes (one key
group per line, ``"ts": 5366601892462.641`` with three decimals, ``},\\n  {`` between
events), not a compact re-serialization no profiler writes. The event texts are turned
into a template once: a regex splits them at every ``"ts"``, ``"id"``, ``"correlation"``
and ``"External id"`` value, and each copy only formats those values (ts as integer
thousandths of a µs, so shifting is exact) and joins. The source is small (a few MB) and
read whole; the output is written copy by copy, never held whole in memory.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import sys
from itertools import chain
from pathlib import Path

DEFAULT_SOURCE = (
    Path(__file__).resolve().parents[2]
    / "shared/external_traces/HolisticTraceAnalysis/tests/data/negative_queue_length_values_check/rank0.json.gz"
)

_EVENTS_KEY = re.compile(r'"traceEvents"\s*:\s*\[')
_SEP = ",\n  "  # between two events, as libkineto writes it
# A shifted value: group 1 the key, group 2 the number (top-level ts/id, args ids).
_SLOT = re.compile(r'("(ts|id|correlation|External id|external id)"\s*:\s*)(-?\d+(?:\.\d+)?)(?=[,\s}])')


def _text(path: Path) -> str:
    raw = path.read_bytes()
    return (gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw).decode("utf-8")


def _events(text: str) -> tuple[str, list[tuple[dict, str]], str]:
    """(text before the first event, each event with its own text, text after the last one)."""
    m = _EVENTS_KEY.search(text)
    if m is None:
        raise SystemExit("make_kineto: the source has no traceEvents array")
    dec, ws = json.JSONDecoder(), re.compile(r"[\s,]*")
    pos, out, first, last = m.end(), [], None, m.end()
    while True:
        pos = ws.match(text, pos).end()
        if text[pos] == "]":
            return text[:first if first is not None else last], out, text[last:]
        obj, end = dec.raw_decode(text, pos)
        out.append((obj, text[pos:end]))
        first = pos if first is None else first
        pos = last = end


def _milli(num: str) -> int:
    """Decimal µs text -> integer thousandths of a µs (half away from zero)."""
    neg = num.startswith("-")
    whole, _, frac = num.lstrip("-").partition(".")
    v = int(whole) * 1000 + (int((frac + "0000")[:4]) + 5) // 10
    return -v if neg else v


def _fmt_milli(v: int) -> str:
    q, r = divmod(abs(v), 1000)
    return f"{'-' if v < 0 else ''}{q}.{r:03d}"


_PY_FRAME = '{{\n    "ph": "X", "cat": "python_function", "name": {name}, "pid": {pid}, "tid": {tid},\n    "ts": {ts}, ' \
    '"dur": {dur},\n    "args": {{\n      "Python parent id": {parent}, "Python id": {pyid}, "Python thread": 0\n    }}\n  }}'


def _with_python_functions(events: list[tuple[dict, str]], per_op: int) -> list[tuple[dict, str]]:
    """``per_op`` nested ``python_function`` frames around every ``cpu_op`` (what a capture with
    ``with_stack=True`` adds), in libkineto's layout; synthetic frame names, the op's own ts and dur."""
    if per_op <= 0:
        return events
    out: list[tuple[dict, str]] = []
    pyid = 0
    for i, (e, t) in enumerate(events):
        if e.get("cat") == "cpu_op" and e.get("ph") == "X":
            ts_text = re.search(r'"ts"\s*:\s*(-?\d+(?:\.\d+)?)', t).group(1)
            dur_text = re.search(r'"dur"\s*:\s*(-?\d+(?:\.\d+)?)', t).group(1)
            parent = 0
            for level in range(per_op):
                pyid += 1
                name = f"synthetic/model.py({100 + level * 10 + i % 7}): forward_{level}"
                ev = {"ph": "X", "cat": "python_function", "name": name, "pid": e.get("pid"), "tid": e.get("tid"),
                      "ts": float(ts_text), "dur": float(dur_text)}
                out.append((ev, _PY_FRAME.format(name=json.dumps(name), pid=json.dumps(e.get("pid")),
                                                 tid=json.dumps(e.get("tid")), ts=ts_text, dur=dur_text,
                                                 parent=parent, pyid=pyid)))
                parent = pyid
        out.append((e, t))
    return out


def make(source: Path, out: Path, size_mb: float, python_functions: int = 1) -> dict:
    head, events, tail = _events(_text(source))
    replicated = [(e, t) for e, t in events if e.get("ph") not in ("M", "i") and e.get("cat") != "Trace"]
    if not any(e.get("cat") == "python_function" for e, _ in replicated):
        replicated = _with_python_functions(replicated, python_functions)
    once = [t for e, t in events if not (e.get("ph") not in ("M", "i") and e.get("cat") != "Trace")]
    body = [e for e, _ in replicated]
    ts = [e["ts"] for e in body if isinstance(e.get("ts"), (int, float))]
    ends = [e["ts"] + e.get("dur", 0) for e in body if isinstance(e.get("ts"), (int, float)) and isinstance(e.get("dur", 0), (int, float))]
    period = round(((max(ends) - min(ts)) + 1000.0) * 1000)  # thousandths of a µs
    ids = [v for e in body for v in ((e.get("args") or {}).get("correlation"), e.get("id")) if isinstance(v, int)]
    id_off = max(ids) + 1 if ids else 1

    # template: text up to a value (its key included), value, ..., text after the last value
    parts = _SLOT.split(_SEP.join(t for _, t in replicated))
    keys, names, vals = parts[1::4], parts[2::4], parts[3::4]
    lits = [a + b for a, b in zip(parts[0::4], keys)] + [parts[-1]]
    is_ts = [k == "ts" for k in names]
    want = (len(ts), sum(isinstance(v, int) for e in body for v in (
        e.get("id"), *((e.get("args") or {}).get(k) for k in ("correlation", "External id", "external id")))))
    if (sum(is_ts), len(is_ts) - sum(is_ts)) != want:  # a value the regex missed would not be shifted
        raise SystemExit(f"make_kineto: found {sum(is_ts)} ts / {len(is_ts) - sum(is_ts)} ids in the text, expected {want}")
    base = [_milli(v) if t else int(v) for v, t in zip(vals, is_ts)]

    def copy(k: int) -> str:
        new = [_fmt_milli(b + k * period) if t else str(b + k * id_off) for b, t in zip(base, is_ts)]
        return "".join(chain.from_iterable(zip(lits, new))) + lits[-1]

    label = f"tracekit benchmarks/make_kineto.py: {source.name} replicated along the timeline, not a real capture"
    key = _EVENTS_KEY.search(head)
    head = f'{head[:key.start()]}"synthetic": {json.dumps(label)},\n  {head[key.start():]}'
    tail = "".join(_SEP + t for t in once) + tail  # tail: the closing ']' and the keys after it

    target = int(size_mb * 1e6)
    opener = gzip.open(out, "wb", compresslevel=1) if out.name.endswith(".gz") else open(out, "wb")
    written = copies = 0
    with opener as f:
        b = head.encode()
        f.write(b)
        written += len(b)
        while written < target or copies == 0:
            b = ((_SEP if copies else "") + copy(copies)).encode()
            f.write(b)
            written += len(b)
            copies += 1
        b = tail.encode()
        f.write(b)
        written += len(b)
    return {"out": str(out), "uncompressed_bytes": written, "copies": copies,
            "events": copies * len(replicated) + len(once)}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--source", type=Path, default=DEFAULT_SOURCE, help="a real Kineto trace (.json or .json.gz)")
    p.add_argument("--size-mb", type=float, default=100.0, help="uncompressed size to reach, MB (1e6 bytes)")
    p.add_argument("-o", "--out", type=Path, required=True, help="output path (.json or .json.gz)")
    p.add_argument("--python-functions", type=int, default=1,
                   help="python_function frames nested around every cpu_op when the source has none (as with_stack=True "
                        "records; 0: none)")
    a = p.parse_args(argv)
    json.dump(make(a.source, a.out, a.size_mb, a.python_functions), sys.stdout)
    print()


if __name__ == "__main__":
    main()
