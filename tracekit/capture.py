"""``tracekit capture``: run a decode workload under nsys or the torch profiler, with step
markers, and write the trace + ``manifest.json`` (schema ``tracekit.manifest/1``).

GPU-host side. Needs only the standard library and click here (the workload scripts need
torch and their framework); it never imports polars or torch, so it runs on a GPU box where
the analyzer's dependencies are absent (``PYTHONPATH=. python -m tracekit capture ...``).

The workload scripts live in the top-level ``capture/`` folder, shipped in the wheel as the
package ``tracekit.workloads``; each is run as a separate Python process so that nsys sees
the whole process and its ``cudaProfilerStart/Stop`` capture range. The script reports its
facts (weight bytes, unprofiled step time, versions, ...) through a small JSON file which
this driver merges into the manifest.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import click

from tracekit.errors import TracekitError

MANIFEST_SCHEMA = "tracekit.manifest/1"
MANIFEST_KEYS = ("schema", "workload", "profiler", "mode", "steps", "gpu_name", "peak_bw_gbps",
                 "weight_bytes_per_step", "dtype", "tp", "spec", "tokens_per_step", "unprofiled_step_ms",
                 "versions", "command")
WORKLOADS = {"hf": "hf_decode.py", "synthetic": "synthetic.py", "sglang": "sglang_decode.py"}
FACTS_FILE = "workload_facts.json"

# Where nsys is usually installed (after --nsys, $NSYS and PATH). Globs, newest version first.
NSYS_GLOBS = (
    "/opt/nvidia/nsight-systems/*/bin/nsys",
    "/opt/nvidia/nsight-systems-cli/*/bin/nsys",
    "/usr/local/cuda/bin/nsys",
    "/usr/local/cuda-*/bin/nsys",
    "/usr/local/cuda/nsight-systems-*/bin/nsys",
    "/opt/nvidia/nsight-compute/*/host/target-linux-x64/nsys",
    "/usr/lib/nsight-systems/bin/nsys",
    "/usr/bin/nsys",
)


# --------------------------------------------------------------------------------------------
# nsys discovery and command lines (pure functions: unit-tested without a GPU)
# --------------------------------------------------------------------------------------------

def _version_key(path: str):
    return [int(x) if x.isdigit() else x for x in re.split(r"(\d+)", path)]


def find_nsys(explicit: str | None = None, env: dict | None = None, globs=None) -> str:
    """The nsys binary: ``--nsys PATH`` > ``$NSYS`` > PATH > the usual install folders."""
    env = os.environ if env is None else env
    globs = NSYS_GLOBS if globs is None else globs
    if explicit:
        if os.path.isfile(explicit) and os.access(explicit, os.X_OK):
            return explicit
        raise TracekitError(f"--nsys {explicit}: no executable there; give the path of the nsys binary")
    if env.get("NSYS"):
        p = env["NSYS"]
        if os.path.isfile(p) and os.access(p, os.X_OK):
            return p
        raise TracekitError(f"$NSYS={p}: no executable there; fix or unset NSYS, or pass --nsys PATH")
    on_path = shutil.which("nsys", path=env.get("PATH"))
    if on_path:
        return on_path
    for pattern in globs:
        for hit in sorted(glob.glob(pattern), key=_version_key, reverse=True):
            if os.path.isfile(hit) and os.access(hit, os.X_OK):
                return hit
    raise TracekitError(
        "nsys not found (looked at $NSYS, PATH and /opt/nvidia/nsight-systems/*/bin, "
        "/opt/nvidia/nsight-compute/*/host/target-linux-x64); install Nsight Systems or pass --nsys PATH"
    )


def nsys_version(nsys: str) -> str | None:
    try:
        out = subprocess.run([nsys, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"(\d{4}\.\d+(?:\.\d+)*[\w.\-]*)", out.stdout + out.stderr)
    return m.group(1) if m else ((out.stdout or out.stderr).strip() or None)


def nsys_profile_cmd(nsys: str, out_dir: Path, workload_cmd: list[str], graph_trace: str = "node",
                     trace: str = "cuda,nvtx") -> list[str]:
    """``nsys profile`` with the flags decode analysis needs."""
    if graph_trace not in ("node", "graph"):
        raise TracekitError(f"--nsys-graph-trace {graph_trace}: use node or graph")
    return [nsys, "profile", "-t", trace, f"--cuda-graph-trace={graph_trace}",
            "--capture-range=cudaProfilerApi", "--capture-range-end=stop",
            "--trace-fork-before-exec=true", "--force-overwrite=true",
            "-o", str(Path(out_dir) / "trace"), *workload_cmd]


def nsys_export_cmd(nsys: str, out_dir: Path) -> list[str]:
    out_dir = Path(out_dir)
    return [nsys, "export", "--type", "sqlite", "-o", str(out_dir / "trace.sqlite"),
            str(out_dir / "trace.nsys-rep")]


def workload_script(name: str) -> Path:
    """``<repo>/capture/X.py`` next to this package, else the installed ``tracekit.workloads``."""
    if name not in WORKLOADS:
        raise TracekitError(f"--workload {name}: use one of {', '.join(sorted(WORKLOADS))}")
    fname = WORKLOADS[name]
    repo = Path(__file__).resolve().parent.parent / "capture" / fname
    if repo.is_file():
        return repo
    try:
        from importlib.resources import files

        p = files("tracekit.workloads") / fname
        if p.is_file():
            return Path(str(p))
    except (ImportError, ModuleNotFoundError, TypeError):
        pass
    raise TracekitError(f"workload script {fname} not found (neither capture/{fname} nor tracekit.workloads)")


def workload_cmd(script: Path, *, profiler: str, steps: int, mode: str | None, spec: int | None,
                 out_dir: Path, extra: list[str], python: str | None = None) -> list[str]:
    out_dir = Path(out_dir)
    cmd = [python or sys.executable, str(script), "--profiler", profiler, "--steps", str(steps),
           "--facts-out", str(out_dir / FACTS_FILE)]
    if mode:
        cmd += ["--mode", mode]
    if spec:
        cmd += ["--spec", str(spec)]
    if profiler == "torch":
        cmd += ["--trace-out", str(out_dir / "trace.json.gz")]
    return cmd + list(extra)


def build_manifest(facts: dict, *, workload: str, profiler: str, mode: str, steps: int, command: list[str],
                   nsys_ver: str | None, peak_bw_gbps: float | None) -> dict:
    """``manifest.json`` from the workload's facts: the contract's keys first, the rest after."""
    versions = dict(facts.get("versions") or {})
    versions.setdefault("torch", None)
    versions.setdefault("cuda", None)
    versions["nsys"] = nsys_ver if profiler == "nsys" else None
    versions.setdefault("framework", None)
    unprofiled = facts.get("unprofiled_step_ms")
    m = {
        "schema": MANIFEST_SCHEMA,
        "workload": str(facts.get("workload") or workload),
        "profiler": profiler,
        "mode": str(facts.get("mode") or mode),
        "steps": int(facts.get("steps") or steps),
        "gpu_name": str(facts.get("gpu_name") or "unknown"),
        "peak_bw_gbps": peak_bw_gbps if peak_bw_gbps is not None else facts.get("peak_bw_gbps"),
        "weight_bytes_per_step": facts.get("weight_bytes_per_step"),
        "dtype": str(facts.get("dtype") or "unknown"),
        "tp": int(facts.get("tp") or 1),
        "spec": facts.get("spec"),
        "tokens_per_step": int(facts.get("tokens_per_step") or 1),
        "unprofiled_step_ms": float(unprofiled) if unprofiled is not None else None,
        "versions": {k: versions[k] for k in ("torch", "cuda", "nsys", "framework")},
        "command": [str(c) for c in command],
    }
    for k, v in facts.items():  # extension keys (model, timing details, ...)
        if k not in m:
            m[k] = v
    return m


def _run(cmd: list[str], what: str, env: dict | None = None) -> None:
    # progress goes to stdout: stderr carries only the one error line on failure
    click.echo(f"tracekit capture: {shlex.join(cmd)}")
    try:
        rc = subprocess.run(cmd, env=env).returncode
    except OSError as e:
        raise TracekitError(f"{what}: cannot run {cmd[0]}: {e.strerror or e}")
    if rc != 0:
        raise TracekitError(f"{what} failed with exit code {rc} (command: {shlex.join(cmd)})")


def capture(*, workload: str, profiler: str, out: Path, steps: int = 16, mode: str = "eager",
            spec: int | None = None, nsys: str | None = None, nsys_graph_trace: str = "node",
            peak_bw: float | None = None, extra: tuple[str, ...] = (), python: str | None = None,
            argv: list[str] | None = None) -> dict:
    """Run one capture; return the manifest written to ``out/manifest.json``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    script = workload_script(workload)
    nsys_bin = find_nsys(nsys) if profiler == "nsys" else None
    wcmd = workload_cmd(script, profiler=profiler, steps=steps, mode=mode, spec=spec, out_dir=out,
                        extra=list(extra), python=python)
    facts_path = out / FACTS_FILE
    if facts_path.exists():
        facts_path.unlink()
    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")
    for k, v in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
                 ("NVSHMEM_DISABLE_NVLS", "1")):
        env.setdefault(k, v)
    nsys_ver = None
    if profiler == "nsys":
        for f in ("trace.nsys-rep", "trace.sqlite"):
            if (out / f).exists():
                (out / f).unlink()
        nsys_ver = nsys_version(nsys_bin)
        _run(nsys_profile_cmd(nsys_bin, out, wcmd, graph_trace=nsys_graph_trace), "nsys profile", env)
        if not (out / "trace.nsys-rep").exists():
            raise TracekitError(
                f"nsys wrote no {out / 'trace.nsys-rep'}: the workload never called cudaProfilerStart "
                "(did it reach the profiled steps?)")
        _run(nsys_export_cmd(nsys_bin, out), "nsys export", env)
        if not (out / "trace.sqlite").exists():
            raise TracekitError(f"nsys export wrote no {out / 'trace.sqlite'}")
    elif profiler == "torch":
        _run(wcmd, f"workload {script.name}", env)
        if not (out / "trace.json.gz").exists():
            raise TracekitError(f"workload wrote no {out / 'trace.json.gz'}")
    else:
        raise TracekitError(f"--profiler {profiler}: use nsys or torch")
    try:
        facts = json.loads(facts_path.read_text())
    except (OSError, ValueError) as e:
        raise TracekitError(f"workload wrote no usable facts file {facts_path}: {e}")
    command = argv if argv is not None else ["tracekit", "capture", "--workload", workload, "--profiler", profiler,
                                             "--out", str(out), "--steps", str(steps), "--mode", mode]
    manifest = build_manifest(facts, workload=workload, profiler=profiler, mode=mode, steps=steps,
                              command=command, nsys_ver=nsys_ver, peak_bw_gbps=peak_bw)
    manifest["workload_command"] = wcmd
    if profiler == "nsys":
        manifest["nsys_graph_trace"] = nsys_graph_trace
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    facts_path.unlink()
    return manifest


@click.command("capture", context_settings=dict(ignore_unknown_options=True, allow_extra_args=True,
                                                help_option_names=["-h", "--help"]))
@click.option("--workload", type=click.Choice(sorted(WORKLOADS)), required=True,
              help="sglang (a real SGLang engine), hf (transformers, random weights) or synthetic")
@click.option("--profiler", type=click.Choice(["nsys", "torch"]), required=True)
@click.option("--out", "out", type=click.Path(file_okay=False), required=True, help="output folder")
@click.option("--steps", type=click.IntRange(1), default=16, show_default=True, help="profiled decode steps")
@click.option("--mode", type=click.Choice(["eager", "graph", "compile"]), default="eager", show_default=True,
              help="hf/synthetic: eager, CUDA graph replay, torch.compile; sglang: eager disables its CUDA graphs")
@click.option("--spec", type=click.IntRange(0), default=None, help="speculative decoding: K draft tokens")
@click.option("--nsys", "nsys", default=None, help="the nsys binary (else $NSYS, PATH, usual install folders)")
@click.option("--nsys-graph-trace", type=click.Choice(["node", "graph"]), default="node", show_default=True,
              help="--cuda-graph-trace for nsys: node (per-kernel rows) or graph (whole graphs)")
@click.option("--peak-bw", type=click.FloatRange(min=0, min_open=True), default=None,
              help="GPU peak memory bandwidth in GB/s to record in the manifest")
@click.argument("workload_args", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def capture_command(ctx, workload, profiler, out, steps, mode, spec, nsys, nsys_graph_trace, peak_bw,
                    workload_args):
    """Run a decode WORKLOAD under nsys or the torch profiler; write the trace and manifest.json to --out.

    Options it does not know (e.g. --size large, --layers 8) are passed to the workload script.
    """
    args = sys.argv[1:]
    argv = ["tracekit", "capture", *(args[args.index("capture") + 1:] if "capture" in args else args)]
    try:
        m = capture(workload=workload, profiler=profiler, out=Path(out), steps=steps, mode=mode, spec=spec,
                    nsys=nsys, nsys_graph_trace=nsys_graph_trace, peak_bw=peak_bw,
                    extra=tuple(workload_args) + tuple(ctx.args), argv=argv)
    except TracekitError as e:
        click.echo(f"tracekit: error: {e}", err=True)
        ctx.exit(2)
    click.echo(f"tracekit capture: wrote {Path(out) / 'manifest.json'} "
               f"(unprofiled step {m['unprofiled_step_ms']:.3f} ms, weight bytes/step {m['weight_bytes_per_step']})")


__all__ = ["capture", "capture_command", "find_nsys", "nsys_profile_cmd", "nsys_export_cmd", "build_manifest",
           "workload_cmd", "workload_script", "MANIFEST_KEYS", "MANIFEST_SCHEMA"]


if __name__ == "__main__":  # `python -m tracekit.capture ...` where tracekit.cli cannot be imported
    capture_command(prog_name="tracekit capture")
