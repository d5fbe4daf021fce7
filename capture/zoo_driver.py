"""The zoo's capture driver (``capture/run_zoo.sh``): ``tracekit capture`` split in two, so that a session can
export one nsys report (and gzip it) in the background while the next capture runs on the GPU.

    python3 capture/zoo_driver.py profile --out DIR --profiler nsys|torch [--nsys PATH] [--peak-bw GBPS] \\
        -- ZOO_ARGS...          # capture/zoo.py's arguments (--shape, --size, --mode, --steps, ...)
    python3 capture/zoo_driver.py finish DIR [--nsys PATH]

``profile`` runs ``capture/zoo.py`` once -- under ``nsys profile -t cuda,nvtx --cuda-graph-trace=node
--capture-range=cudaProfilerApi`` or with the torch profiler -- and writes ``DIR/manifest.json`` from the
workload's facts (``tracekit.manifest/1``, as ``tracekit capture`` writes it; ``trace_files`` lists the trace
written so far). ``finish`` (nsys only) runs ``nsys export --type sqlite``, gzips ``trace.sqlite`` into
``trace.sqlite.gz``, removes ``trace.nsys-rep`` and rewrites ``trace_files`` for the gzipped export and the plain
file it decompresses to. Both use ``tracekit.capture``'s helpers (standard library and click; no polars, no torch).
Exit 2 with one ``zoo_driver: error: ...`` line on a failure.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))     # tracekit (the repository's), when run as capture/zoo_driver.py

from tracekit import capture as cap  # noqa: E402
from tracekit.errors import TracekitError  # noqa: E402

FACTS = cap.FACTS_FILE


def _run(cmd: list[str], what: str, env: dict) -> None:
    print("zoo_driver: " + " ".join(cmd), flush=True)
    rc = subprocess.run(cmd, env=env).returncode
    if rc != 0:
        raise TracekitError(f"{what} failed with exit code {rc}")


def profile(out: Path, profiler: str, zoo_args: list[str], nsys: str | None, peak_bw: float | None,
            python: str | None = None, script: str = "zoo.py") -> dict:
    out.mkdir(parents=True, exist_ok=True)
    for f in (FACTS, "trace.json.gz", "trace.nsys-rep", "trace.sqlite", "trace.sqlite.gz", "manifest.json"):
        (out / f).unlink(missing_ok=True)
    env = cap.worker_env()
    wcmd = [python or sys.executable, str(HERE / script), "--profiler", profiler, "--facts-out", str(out / FACTS)]
    if profiler == "torch":
        wcmd += ["--trace-out", str(out / "trace.json.gz")]
    wcmd += zoo_args
    nsys_ver = None
    if profiler == "nsys":
        nsys_bin = cap.find_nsys(nsys)
        nsys_ver = cap.nsys_version(nsys_bin)
        _run(cap.nsys_profile_cmd(nsys_bin, out, wcmd), "nsys profile", env)
        if not (out / "trace.nsys-rep").exists():
            raise TracekitError(f"nsys wrote no {out / 'trace.nsys-rep'} (did the workload reach cudaProfilerStart?)")
        names = ["trace.nsys-rep"]
    else:
        _run(wcmd, f"capture/{script}", env)
        if not (out / "trace.json.gz").exists():
            raise TracekitError(f"the workload wrote no {out / 'trace.json.gz'}")
        names = ["trace.json.gz"]
    try:
        facts = json.loads((out / FACTS).read_text())
    except (OSError, ValueError) as e:
        raise TracekitError(f"the workload wrote no usable facts file: {e}")
    command = ["python3", "capture/zoo_driver.py", "profile", "--out", str(out), "--profiler", profiler,
               *(["--peak-bw", str(peak_bw)] if peak_bw else []),
               *(["--script", script] if script != "zoo.py" else []), "--", *zoo_args]
    workload = "zoo" if script == "zoo.py" else Path(script).stem.replace("_decode", "")
    m = cap.build_manifest(facts, workload=workload, profiler=profiler, mode=str(facts.get("mode")),
                           steps=int(facts.get("steps") or 0), command=command, nsys_ver=nsys_ver,
                           peak_bw_gbps=peak_bw)
    m["workload_command"] = wcmd
    if profiler == "nsys":
        m["nsys_graph_trace"] = "node"
    m["trace_files"] = cap.trace_files_of(out, names)
    (out / "manifest.json").write_text(json.dumps(m, indent=2) + "\n")
    (out / FACTS).unlink()
    return m


def finish(out: Path, nsys: str | None, plain: bool = False) -> dict:
    """The nsys export of a ``profile``d folder, gzipped (``plain``: left as ``trace.sqlite``, for an archive
    compressed as a whole); the manifest's ``trace_files`` rewritten."""
    if not (out / "manifest.json").is_file():
        raise TracekitError(f"{out}: no manifest.json (run profile first)")
    if (out / "trace.nsys-rep").is_file():
        nsys_bin = cap.find_nsys(nsys)
        _run(cap.nsys_export_cmd(nsys_bin, out), "nsys export", cap.worker_env())
        if not (out / "trace.sqlite").is_file():
            raise TracekitError(f"nsys export wrote no {out / 'trace.sqlite'}")
        (out / "trace.nsys-rep").unlink()
    if plain:
        m = json.loads((out / "manifest.json").read_text())
        m["trace_files"] = cap.trace_files_of(out, ["trace.sqlite"])
        (out / "manifest.json").write_text(json.dumps(m, indent=2) + "\n")
        return m
    return cap.gzip_capture_export(out)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    zoo_args: list[str] = []
    if "--" in argv:
        k = argv.index("--")
        argv, zoo_args = argv[:k], argv[k + 1:]
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("profile")
    a.add_argument("--out", required=True)
    a.add_argument("--profiler", choices=["nsys", "torch"], required=True)
    a.add_argument("--nsys", default=None)
    a.add_argument("--peak-bw", type=float, default=None)
    a.add_argument("--python", default=None, help="the workload's Python (default: this one)")
    a.add_argument("--script", default="zoo.py", help="the capture script (default zoo.py; e.g. hf_decode.py)")
    b = sub.add_parser("finish")
    b.add_argument("out")
    b.add_argument("--nsys", default=None)
    b.add_argument("--plain", action="store_true", help="keep trace.sqlite (no gzip)")
    args = p.parse_args(argv)
    try:
        if args.cmd == "profile":
            m = profile(Path(args.out), args.profiler, zoo_args, args.nsys, args.peak_bw, args.python, args.script)
        else:
            m = finish(Path(args.out), args.nsys, args.plain)
    except TracekitError as e:
        print(f"zoo_driver: error: {e}", file=sys.stderr)
        return 2
    keys = ("shape", "profiler", "unprofiled_step_ms", "unprofiled_plain_step_ms", "spec", "tokens_per_step")
    print("zoo_driver: manifest " + json.dumps({k: m.get(k) for k in keys}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
