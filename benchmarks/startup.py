"""The standing startup benchmark: what a short command costs against `python -c "import polars"`.

Issue 19's targets, on our smallest real capture (sample_traces/hf-small-eager/trace.sqlite, 3.7 MB, 19k kernels):
`tracekit --help` and `--version` <= 0.2 s and without polars or pyarrow; `tracekit breakdown` <= 1.5x
`python -c "import polars"`; `tracekit plot` <= 2 s. Every command runs as a subprocess under /usr/bin/time,
interleaved in rounds (each command once per round, so a slow spell of this shared 2-core machine hits them
alike) and each row keeps its medians: wall seconds and CPU seconds (user + system; what the process itself
cost, steadier than wall when other work shares the cores). The breakdown also runs with the engine chain
small exports used before (ADBC first), to show what the plain-sqlite3 choice for small files saves.

    python benchmarks/startup.py --repeat 7 --out benchmarks/results/startup-2core.json

tracekit's own modules are byte-compiled first (``compileall``), as pip does when it installs a wheel: this
environment sets PYTHONDONTWRITEBYTECODE=1, so an editable checkout would otherwise compile every tracekit module
from source in every timed process (~0.1-0.15 s of CPU that no installed copy pays).

docs/performance.md shows the committed results file (cog), so the page cannot drift from it.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

import run  # noqa: E402  (timed_interleaved: the one implementation of interleaved medians)

TRACE = REPO / "sample_traces/hf-small-eager/trace.sqlite"
DEFAULT_OUT = HERE / "results" / "startup-2core.json"


def specs(trace: Path, tmp: Path) -> list[tuple]:
    py = sys.executable
    tk = [py, "-m", "tracekit"]
    return [
        ([py, "-c", "pass"], "python -c pass", None, 600),
        ([py, "-c", "import polars"], "python -c 'import polars'", None, 600),
        ([*tk, "--help"], "tracekit --help", None, 600),
        ([*tk, "--version"], "tracekit --version", None, 600),
        ([*tk, "breakdown", str(trace)], "tracekit breakdown (table)", None, 600),
        ([*tk, "breakdown", str(trace), "--format", "json"], "tracekit breakdown --format json", None, 600),
        ([*tk, "breakdown", str(trace), "--format", "json"], "breakdown --format json, ADBC first (before)",
         {"TRACEKIT_SQLITE_ENGINES": "connectorx,adbc,sqlite3"}, 600),
        ([*tk, "plot", str(trace), "-o", str(tmp / "plot.png")], "tracekit plot -o PNG", None, 600),
    ]


STAGES = r"""
import io, json, sys, time
c = time.process_time
t = {"Python interpreter start": c()}
import click, tracekit.cli  # noqa
t["click + tracekit.cli"] = c()
import polars  # noqa
t["import polars"] = c()
import tracekit
trace = tracekit.load(sys.argv[1], kernel_dims=False)
t["read the export (nsys reader)"] = c()
from tracekit.classify import _shipped_rules
_shipped_rules()
t["load the kernel rules"] = c()
b = tracekit.breakdown(trace)
t["the analysis (first call)"] = c()
from rich.console import Console
from tracekit.report import render
render("breakdown", b, "table", lambda: Console(file=io.StringIO(), width=100))
t["import rich + render the table"] = c()
keys = list(t)
print(json.dumps({k: round(t[k] - (t[keys[i - 1]] if i else 0.0), 3) for i, k in enumerate(keys)}))
"""


def stages(trace: Path, repeat: int) -> dict:
    """CPU seconds of each stage of a breakdown, in one process (medians of ``repeat`` fresh processes)."""
    import subprocess

    runs = [json.loads(subprocess.run([sys.executable, "-c", STAGES, str(trace)], capture_output=True, text=True,
                                      check=True).stdout) for _ in range(repeat)]
    return {k: sorted(r[k] for r in runs)[len(runs) // 2] for k in runs[0]}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, default=TRACE)
    ap.add_argument("--repeat", type=int, default=7, help="rounds; each row keeps its medians")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    a = ap.parse_args(argv)
    run.REPEAT = a.repeat
    import compileall

    compileall.compile_dir(str(REPO / "tracekit"), quiet=1)  # (as an installed wheel is; see the docstring)
    with tempfile.TemporaryDirectory() as tmp:
        rows = run.timed_interleaved(specs(a.trace, Path(tmp)))
    by = {r["label"]: r for r in rows}
    polars = by["python -c 'import polars'"]
    for r in rows:
        r["x_import_polars_wall"] = round(r["wall_s"] / polars["wall_s"], 2)
        r["x_import_polars_cpu"] = round(r["cpu_s"] / polars["cpu_s"], 2) if r.get("cpu_s") else None
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = None
    out = {"benchmark": "startup", "date": _dt.date.today().isoformat(), "trace": str(a.trace.relative_to(REPO))
           if a.trace.is_relative_to(REPO) else str(a.trace), "trace_bytes": a.trace.stat().st_size,
           "repeat": a.repeat, "cpus": os.cpu_count(), "load_average_1min_after": load,
           "python": platform.python_version(), "rows": rows, "breakdown_cpu_stages_s": stages(a.trace, a.repeat)}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(out, indent=1) + "\n")
    print(table(out))


def table(res: dict) -> str:
    """The results as a markdown table (docs/performance.md pastes it with cog)."""
    lines = ["| command | wall s (median) | CPU s (median) | × import polars (wall / CPU) |",
             "|---|---:|---:|---:|"]
    for r in res["rows"]:
        cpu = "—" if r.get("cpu_s") is None else f"{r['cpu_s']:.2f}"
        xc = "—" if r.get("x_import_polars_cpu") is None else f"{r['x_import_polars_cpu']:.2f}"
        lines.append(f"| {r['label']} | {r['wall_s']:.2f} | {cpu} | {r['x_import_polars_wall']:.2f} / {xc} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
