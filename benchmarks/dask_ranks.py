"""Many rank files: the per-file stage on a Dask cluster against the local process pool (tracekit/run/engines.py).

The inputs are REPLICATED: N copies (hard links, else copies) of one real rank file, by default rank 0 of the
GB300 TP4 SGLang capture in ../shared/external_traces. Every copy is analysed in full; since they are the same
rank, the cross-rank figures are trivial (no skew) and only the times mean anything.

    python benchmarks/dask_ranks.py --copies 256                        # both engines, a local cluster
    python benchmarks/dask_ranks.py --copies 256 --engines dask=tcp://head:8786 --dir /shared/ranks256
    python benchmarks/dask_ranks.py --copies 256 --out benchmarks/results/dask_ranks.json

For each engine: wall time of ``analyse_files(files, AnalysisOptions(engine=...))`` (the product path: what
``tracekit breakdown DIR --engine ...`` runs before it builds the cross-rank table; the LocalCluster's start is
included, as a user pays it), the median wall and CPU time of one file's task where it ran (the per-file stage
``analyse_rank``, timed on the worker), the time of ``cross_rank`` over all results, and the bytes that came back
(the pickled per-rank results: the breakdown dict and one row per communication kernel).
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import platform
import shutil
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
EXTERNAL = Path(os.environ.get("TRACEKIT_EXTERNAL_TRACES") or REPO.parent / "shared" / "external_traces")
DEFAULT_SOURCE = (EXTERNAL / "lora_perf_lora_profile" / "runs"
                  / "Qwen3-30B-A3B-Instruct-2507-BF16-expert_shared-20260609-133913" / "current_base_lora" / "profile"
                  / "base" / "bs16-TP-0.trace.json.gz")


def replicate(src: Path, n: int, out: Path) -> list[Path]:
    """``out/rank-00000.<suffixes>`` ... : n hard links to (or copies of) ``src``."""
    out.mkdir(parents=True, exist_ok=True)
    suffix = "".join(src.suffixes[-2:]) if src.name.endswith(".json.gz") else src.suffix
    files = []
    for i in range(n):
        f = out / f"rank-{i:05d}{suffix}"
        if not f.exists():
            try:
                os.link(src, f)
            except OSError:
                shutil.copyfile(src, f)
        files.append(f)
    return files


def timed_rank(path, opts):
    """analyse_rank, with the wall and CPU seconds it took where it ran (the task's own time, on the worker)."""
    from tracekit.run.ranks import analyse_rank

    w, c = time.perf_counter(), time.process_time()
    r = analyse_rank(path, opts)
    return r, time.perf_counter() - w, time.process_time() - c


def run(engine: str, files: list[Path], workers: int | None) -> dict:
    from statistics import median

    from tracekit.options import AnalysisOptions
    from tracekit.run.ranks import analyse_files, cross_rank

    t0 = time.perf_counter()
    out = analyse_files(files, AnalysisOptions(engine=engine), workers=workers, stage=timed_rank)
    t1 = time.perf_counter()
    results = [r for r, _, _ in out]
    cr = cross_rank(results)
    t2 = time.perf_counter()
    shipped = sum(len(pickle.dumps(r)) for r in results)
    return {"engine": engine, "files": len(files), "map_s": round(t1 - t0, 2), "cross_rank_s": round(t2 - t1, 2),
            "files_per_s": round(len(files) / (t1 - t0), 2), "task_wall_s_median": round(median(w for _, w, _ in out), 3),
            "task_cpu_s_median": round(median(c for _, _, c in out), 3),
            "shipped_bytes_per_rank": shipped // len(results), "pacing_rank": cr.pacing_rank, "skew_ms": cr.skew_ms}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--source", type=Path, default=DEFAULT_SOURCE, help="the real rank file to replicate")
    p.add_argument("--copies", type=int, default=256)
    p.add_argument("--dir", type=Path, default=Path("/tmp/tracekit-bench/ranks-replicated"))
    p.add_argument("--engines", default="process,dask", help="comma-separated: process, dask, dask=ADDRESS")
    p.add_argument("--workers", type=int, default=None, help="processes / local Dask workers (default: one per core)")
    p.add_argument("--repeat", type=int, default=1, help="rounds, each engine once per round")
    p.add_argument("--out", type=Path, default=None, help="write the rows as JSON there")
    a = p.parse_args(argv)
    if not a.source.exists():
        sys.exit(f"{a.source}: not found (pass --source RANK_FILE)")
    files = replicate(a.source, a.copies, a.dir / f"{a.copies}x-{a.source.name.split('.')[0]}")
    import polars

    import tracekit

    machine = {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
               "tracekit": tracekit.__version__, "polars": polars.__version__}
    try:
        import distributed

        machine["distributed"] = distributed.__version__
    except ImportError:
        pass
    rows = []
    for rnd in range(a.repeat):  # interleaved: each engine once per round (a noisy VM slows whole spells)
        for engine in a.engines.split(","):
            row = {"round": rnd, **run(engine.strip(), files, a.workers)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    doc = {"source": str(a.source), "replicated": True, "copies": a.copies,
           "source_bytes": a.source.stat().st_size, "machine": machine, "rows": rows,
           "date": time.strftime("%Y-%m-%d")}
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
