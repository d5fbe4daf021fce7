"""Fingerprint every frame of every real trace as the readers return it: a reader change that must not change
the Trace (dtypes, values, row order) is checked against a fingerprint taken before it.

    python benchmarks/trace_fingerprint.py dump /tmp/fp-before.json
    python benchmarks/trace_fingerprint.py compare /tmp/fp-before.json /tmp/fp-after.json

Each frame: its schema (categoricals as ``Categorical``) and a SHA-256 of its rows in order and of its columns'
sortedness flags (categorical and
enum columns as their text, so the fingerprint does not depend on the process's category codes). The traces are
those of ``benchmarks/same_outputs.py`` (sample_traces/, tests/data/, the external traces); ``--also FILE`` adds
more (e.g. the big synthetic inputs). ``TRACEKIT_SRC=/path/to/checkout`` fingerprints another checkout's readers.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, os.environ.get("TRACEKIT_SRC") or str(HERE.parent))  # TRACEKIT_SRC: another checkout's tracekit
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tools"))


def fingerprint(path: Path) -> dict:
    import polars as pl

    import tracekit
    from tracekit.trace import SCHEMAS

    out: dict = {}
    for dims in (False, True):
        try:
            t = tracekit.load(path, kernel_dims=dims)
        except tracekit.TracekitError as e:
            return {"error": str(e)}
        for name in SCHEMAS:
            df: pl.DataFrame = getattr(t, name)
            text = df.with_columns(pl.col(pl.Categorical, pl.Enum).cast(pl.String))
            h = hashlib.sha256()
            for c in text.columns:
                h.update(c.encode())
                h.update(text[c].hash(seed=7).to_numpy().tobytes())
                h.update(text[c].is_null().to_numpy().tobytes())
                h.update(repr(sorted(df[c].flags.items())).encode())  # sortedness flags: later sorts rely on them
            out[f"{name}{'' if not dims else '+dims'}"] = {
                "schema": {c: str(d) for c, d in df.schema.items()}, "rows": df.height, "sha": h.hexdigest()}
        out["meta" + ("+dims" if dims else "")] = repr(t.meta)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dump")
    d.add_argument("out", type=Path)
    d.add_argument("--also", type=Path, nargs="*", default=[])
    c = sub.add_parser("compare")
    c.add_argument("a", type=Path)
    c.add_argument("b", type=Path)
    a = p.parse_args()
    if a.cmd == "dump":
        from conformance import find_traces
        from same_outputs import _dirs

        traces = [t.resolve() for t in find_traces([x for x in _dirs() if x.exists()])] + list(a.also)
        res = {}
        for t in traces:
            res[str(t)] = fingerprint(t)
            print(t, flush=True)
        a.out.write_text(json.dumps(res, indent=1, sort_keys=True))
        print(f"{len(res)} traces -> {a.out}")
        return 0
    x, y = json.loads(a.a.read_text()), json.loads(a.b.read_text())
    bad = [k for k in sorted(set(x) | set(y)) if x.get(k) != y.get(k)]
    for k in bad:
        fx, fy = x.get(k) or {}, y.get(k) or {}
        diff = [f for f in sorted(set(fx) | set(fy)) if fx.get(f) != fy.get(f)]
        print(f"DIFFERS {k}: {diff}")
    print(f"{len(x)} vs {len(y)} traces, {len(bad)} differ")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
