"""Build a large SYNTHETIC Kineto trace by replicating a real one along the timeline.

Each copy of the source's ``traceEvents`` is shifted by the source's time span (plus a
1 ms gap), and its correlation / External id / flow ids are offset, so launches still join
their kernels and graph launches their replayed kernels. Metadata events (``ph='M'``) and
the header are written once. The output is labelled synthetic in its header
(``"synthetic": "..."``) so it is never mistaken for a capture.

    python benchmarks/make_kineto.py --size-mb 100 -o /tmp/kineto_100mb.json
    python benchmarks/make_kineto.py --size-mb 1000 -o /tmp/kineto_1gb.json.gz

The source is read with the standard json module: it is small (a few MB); only the output
is large, and it is written copy by copy, never held whole in memory.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

import orjson

DEFAULT_SOURCE = (
    Path(__file__).resolve().parents[2]
    / "shared/external_traces/HolisticTraceAnalysis/tests/data/negative_queue_length_values_check/rank0.json.gz"
)


def _load(path: Path) -> dict:
    opener = gzip.open if path.read_bytes()[:2] == b"\x1f\x8b" else open
    with opener(path, "rb") as f:
        return json.load(f)


def _shifted(events: list[dict], shift_us: float, id_off: int) -> list[dict]:
    out = []
    for e in events:
        e = dict(e)
        if isinstance(e.get("ts"), (int, float)):
            e["ts"] = round(e["ts"] + shift_us, 3)
        if "id" in e and isinstance(e["id"], int):
            e["id"] += id_off
        a = e.get("args")
        if isinstance(a, dict):
            a = dict(a)
            for key in ("correlation", "External id", "external id"):
                if isinstance(a.get(key), int):
                    a[key] += id_off
            e["args"] = a
        out.append(e)
    return out


def make(source: Path, out: Path, size_mb: float) -> dict:
    doc = _load(source)
    events = doc.pop("traceEvents")
    meta = [e for e in events if e.get("ph") == "M"]
    body = [e for e in events if e.get("ph") != "M" and e.get("cat") != "Trace"]
    ts = [e["ts"] for e in body if isinstance(e.get("ts"), (int, float))]
    ends = [e["ts"] + e.get("dur", 0) for e in body if isinstance(e.get("ts"), (int, float)) and isinstance(e.get("dur", 0), (int, float))]
    period = (max(ends) - min(ts)) + 1000.0  # µs
    ids = [v for e in body for v in ((e.get("args") or {}).get("correlation"), e.get("id")) if isinstance(v, int)]
    id_off = max(ids) + 1 if ids else 1
    doc["synthetic"] = f"tracekit benchmarks/make_kineto.py: {source.name} replicated along the timeline, not a real capture"

    target = int(size_mb * 1e6)
    opener = gzip.open(out, "wb", compresslevel=1) if out.name.endswith(".gz") else open(out, "wb")
    written = copies = n_events = 0
    with opener as f:
        head = orjson.dumps(doc)[:-1] + b',"traceEvents":['
        f.write(head)
        chunk = orjson.dumps(meta)[1:-1]
        f.write(chunk)
        written += len(head) + len(chunk)
        n_events += len(meta)
        while written < target:
            chunk = orjson.dumps(_shifted(body, copies * period, copies * id_off))[1:-1]
            f.write(b"," + chunk)
            written += len(chunk) + 1
            copies += 1
            n_events += len(body)
        f.write(b"]}")
    return {"out": str(out), "uncompressed_bytes": written + 2, "copies": copies, "events": n_events}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--source", type=Path, default=DEFAULT_SOURCE, help="a real Kineto trace (.json or .json.gz)")
    p.add_argument("--size-mb", type=float, default=100.0, help="uncompressed size to reach, MB (1e6 bytes)")
    p.add_argument("-o", "--out", type=Path, required=True, help="output path (.json or .json.gz)")
    a = p.parse_args(argv)
    json.dump(make(a.source, a.out, a.size_mb), sys.stdout)
    print()


if __name__ == "__main__":
    main()
