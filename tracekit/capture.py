"""``tracekit capture``: run a decode workload under nsys or the torch profiler, with step
markers, and write the trace + ``manifest.json`` (schema ``tracekit.manifest/1``).

GPU-host side. Needs only the standard library and click here (the workload scripts need
torch and their framework); it never imports polars or torch, so it runs on a GPU box where
the analyzer's dependencies are absent (``PYTHONPATH=. python -m tracekit capture ...``).

The workload scripts live in the top-level ``capture/`` folder, shipped in the wheel as the
package ``tracekit.workloads``; each is run as a separate Python process so that nsys sees
the whole process and its ``cudaProfilerStart/Stop`` capture range. The script reports its
facts (weight bytes, unprofiled step time, versions, ...) through a small JSON file which
this driver merges into the manifest, with ``trace_files`` (name, size, sha256 of the first MiB of every trace
file written), so that the manifest applies to its own trace only (``tracekit.manifest``). Before anything
runs, the workload's Python is checked for what the workload imports (one-line error, exit 2, no folder left).
Workloads: ``WORKLOADS`` below (``spec``/``serve``/``kv``/``lora``/``moe`` are the engine-shaped plain-torch loops of
``capture/llama_torch.py``).

On the GPU host the run scripts call ``python3 -m tracekit capture ...``: neither polars nor rich is imported for it
(``tests/capture/test_capture.py``). (``python -m tracekit.capture`` ran the driver before the CLI moved to ``tracekit/cli``;
it does nothing now.)
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

from tracekit.contract import MANIFEST_SCHEMA  # ("tracekit.manifest/1", named once there)
from tracekit.errors import BadOptionValue, CaptureFailed, ConflictingOptions, ToolMissing, TracekitError

MANIFEST_KEYS = ("schema", "workload", "profiler", "mode", "steps", "gpu_name", "peak_bw_gbps",
                 "weight_bytes_per_step", "dtype", "tp", "spec", "tokens_per_step", "unprofiled_step_ms",
                 "versions", "command", "trace_files")
# --workload NAME -> its script in capture/. spec / serve / kv: plain-torch engine-shaped loops (llama_torch.py):
# SGLang-style EAGLE/MTP speculative decoding, a serving loop with host stalls, a KV-cache-heavy batch decode.
# lora / moe / sp: a decode loop with LoRA adapters (vLLM-shaped Triton shrink/expand), a mixture-of-experts decode
# loop (grouped GEMMs or a Triton fused_moe_kernel), a sequence-parallel loop (reduce-scatter + all-gather per layer).
# zoo: the speculative-decoding zoo (issue 42), seven engine-shaped loops (``--shape NAME``; capture/run_zoo.sh).
WORKLOADS = {"hf": "hf_decode.py", "synthetic": "synthetic.py", "sglang": "sglang_decode.py",
             "spec": "spec_decode.py", "serve": "serve_decode.py", "kv": "kv_decode.py",
             "lora": "lora_decode.py", "moe": "moe_decode.py", "sp": "sp_decode.py", "zoo": "zoo.py"}
# what each workload's Python must be able to import (checked before anything runs or is written); lora/moe
# need triton only for their GPU kernels, which they import when they launch them
WORKLOAD_MODULES = {"hf": ("torch", "transformers"), "synthetic": ("torch",), "sglang": ("torch", "sglang"),
                    "spec": ("torch",), "serve": ("torch",), "kv": ("torch",), "lora": ("torch",), "moe": ("torch",),
                    "sp": ("torch",), "zoo": ("torch",)}
FACTS_FILE = "workload_facts.json"
# tensor parallelism (capture/tp.py): workloads launched one process per GPU by torchrun
TP_WORKLOADS = ("hf", "synthetic")
ALLREDUCE_CHOICES = ("nccl", "symm-one-shot", "symm-two-shot")
# NVLink multicast (NVLS / multimem) stays off in every worker, whatever the caller's environment says
NO_MULTICAST_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}

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
        raise ToolMissing(f"--nsys {explicit}: no executable there; give the path of the nsys binary")
    if env.get("NSYS"):
        p = env["NSYS"]
        if os.path.isfile(p) and os.access(p, os.X_OK):
            return p
        raise ToolMissing(f"$NSYS={p}: no executable there; fix or unset NSYS, or pass --nsys PATH")
    on_path = shutil.which("nsys", path=env.get("PATH"))
    if on_path:
        return on_path
    for pattern in globs:
        for hit in sorted(glob.glob(pattern), key=_version_key, reverse=True):
            if os.path.isfile(hit) and os.access(hit, os.X_OK):
                return hit
    raise ToolMissing(
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
        raise BadOptionValue(f"--nsys-graph-trace {graph_trace}: use node or graph")
    return [nsys, "profile", "-t", trace, f"--cuda-graph-trace={graph_trace}",
            "--capture-range=cudaProfilerApi", "--capture-range-end=stop",
            "--trace-fork-before-exec=true", "--force-overwrite=true",
            "-o", str(Path(out_dir) / "trace"), *workload_cmd]


TRACE = "trace"  # the stem of a capture's trace files; their suffixes are their format's (tracekit.readers)


def trace_name(profiler: str, form: str = "extension") -> str:
    """The name of a capture's trace file for ``profiler`` (``nsys``, ``torch``): ``form`` ``"extension"``
    (trace.sqlite), ``"compressed"`` (trace.sqlite.gz, trace.json.gz) or ``"report"`` (trace.nsys-rep), as the
    format that reads it names them (:func:`tracekit.readers.of_profiler`; imported here, not at the top: ``tracekit
    capture --help`` loads no reader)."""
    from tracekit.readers import of_profiler

    fmt = of_profiler(profiler)
    return TRACE + (fmt.suffixes[0] if form == "report" else getattr(fmt, form))


def nsys_export_cmd(nsys: str, out_dir: Path) -> list[str]:
    out_dir = Path(out_dir)
    return [nsys, "export", "--type", "sqlite", "-o", str(out_dir / trace_name("nsys")),
            str(out_dir / trace_name("nsys", "report"))]


def workload_script(name: str) -> Path:
    """``<repo>/capture/X.py`` next to this package, else the installed ``tracekit.workloads``."""
    if name not in WORKLOADS:
        raise BadOptionValue(f"--workload {name}: use one of {', '.join(sorted(WORKLOADS))}")
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
    raise ToolMissing(f"workload script {fname} not found (neither capture/{fname} nor tracekit.workloads)")


def launch_prefix(tp: int | None, python: str | None = None) -> list[str]:
    """How the workload process(es) start: ``python`` alone, or with ``--tp N`` torchrun (as
    ``python -m torch.distributed.run``: the same interpreter) with one process per GPU on this host.
    torchrun fork+execs its workers, which nsys follows with ``--trace-fork-before-exec=true``."""
    py = python or sys.executable
    if tp is None:
        return [py]
    if tp < 1:
        raise BadOptionValue(f"--tp {tp}: must be >= 1")
    return [py, "-m", "torch.distributed.run", "--standalone", "--nnodes=1", f"--nproc_per_node={tp}"]


def tp_args(workload: str, tp: int | None, allreduce: str | None) -> list[str]:
    """The workload script's own tensor-parallel arguments.

    ``--allreduce none|symm`` without ``--tp`` is the synthetic loop's older world-of-one option
    (no launcher, no process group of its own making unless symm), passed through unchanged."""
    if tp is None and workload == "synthetic" and allreduce in ("none", "symm", *ALLREDUCE_CHOICES):
        return ["--allreduce", allreduce]
    if allreduce is not None and allreduce not in ALLREDUCE_CHOICES:
        raise BadOptionValue(f"--allreduce {allreduce}: use one of {', '.join(ALLREDUCE_CHOICES)}")
    if workload == "sglang":
        if allreduce is not None:
            raise ConflictingOptions("--allreduce is for --workload hf|synthetic; SGLang picks its own all-reduce "
                                "(pass --disable-custom-all-reduce to the engine for NCCL)")
        return ["--tp", str(tp)] if tp is not None else []
    if tp is None:
        if allreduce is not None:
            raise ConflictingOptions(f"--allreduce {allreduce} needs --tp N (--tp 1: a process group of size 1)")
        return []
    return ["--tp", str(tp), "--allreduce", allreduce or "nccl"]


def worker_env(base: dict | None = None) -> dict:
    """The workers' environment: the caller's, unbuffered output, NVLink multicast forced off."""
    env = dict(os.environ if base is None else base)
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.update(NO_MULTICAST_ENV)
    return env


def rank_file(path: Path, rank: int, world_size: int) -> Path:
    """``trace.json.gz`` -> ``trace.rank1.json.gz`` when world_size > 1 (as capture/tp.py names them)."""
    path = Path(path)
    if world_size <= 1:
        return path
    from tracekit.readers import of_profiler

    kineto = of_profiler("torch")  # (the facts file is JSON too)
    for ext in (kineto.compressed, kineto.extension, ".gz"):
        if path.name.endswith(ext):
            return path.with_name(f"{path.name[:-len(ext)]}.rank{rank}{ext}")
    return path.with_name(f"{path.name}.rank{rank}")


def workload_cmd(script: Path, *, profiler: str, steps: int, mode: str | None, spec: int | None,
                 out_dir: Path, extra: list[str], python: str | None = None, tp: int | None = None,
                 allreduce: str | None = None) -> list[str]:
    out_dir = Path(out_dir)
    workload = next((k for k, v in WORKLOADS.items() if v == Path(script).name), None)
    launched = tp if workload in TP_WORKLOADS else None     # sglang starts its own TP processes
    cmd = [*launch_prefix(launched, python), str(script), "--profiler", profiler, "--steps", str(steps),
           "--facts-out", str(out_dir / FACTS_FILE)]
    if mode:
        cmd += ["--mode", mode]
    if spec:
        cmd += ["--spec", str(spec)]
    if profiler == "torch":
        cmd += ["--trace-out", str(out_dir / trace_name("torch", "compressed"))]
    return cmd + tp_args(workload or "", tp, allreduce) + list(extra)


def missing_modules(python: str, modules) -> list[str]:
    """The ``modules`` that ``python`` cannot import (found with ``importlib.util.find_spec``: nothing is
    imported, so this is quick even for torch)."""
    code = ("import importlib.util, sys\n"
            "print(','.join(m for m in sys.argv[1:] if importlib.util.find_spec(m) is None))")
    try:
        out = subprocess.run([python, "-c", code, *modules], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError) as e:
        raise ToolMissing(f"cannot run the workload's Python {python}: {e}")
    if out.returncode != 0:
        raise CaptureFailed(f"the workload's Python {python} failed to start (exit {out.returncode})")
    return [m for m in out.stdout.strip().split(",") if m]


def check_workload_python(workload: str, python: str | None = None) -> None:
    """One-line error (exit 2) when the workload's Python lacks what the workload imports: before
    anything runs, so no child traceback and no empty output folder (issue 19)."""
    py = python or sys.executable
    missing = missing_modules(py, WORKLOAD_MODULES.get(workload, ("torch",)))
    if missing:
        raise ToolMissing(
            f"--workload {workload} needs {' and '.join(missing)}, which {py} cannot import; run tracekit capture "
            f"on the GPU host with the Python that has {missing[0]} installed (pip install {missing[0]})")


def trace_files_of(out: Path, names) -> list[dict]:
    """The manifest's ``trace_files`` entries for the files ``names`` in ``out`` that exist (a
    ``.sqlite.gz`` also listed as its plain ``.sqlite``)."""
    from tracekit.manifest import trace_file_entries

    entries = []
    for n in names:
        p = Path(out) / n
        if p.is_file():
            entries += trace_file_entries(p, gunzipped=p.name.endswith(trace_name("nsys", "compressed")))
    return entries


def gzip_capture_export(out: Path, keep_plain: bool = False) -> dict:
    """Gzip a capture folder's ``trace.sqlite`` into ``trace.sqlite.gz`` (the plain file removed unless
    ``keep_plain``) and rewrite its manifest's ``trace_files``: the ``.sqlite.gz`` and the plain ``.sqlite``
    it decompresses to, so the manifest matches either. Returns the manifest."""
    from tracekit.manifest import gzip_export

    out = Path(out)
    mp = out / "manifest.json"
    m = json.loads(mp.read_text())
    if (out / trace_name("nsys")).is_file():
        gzip_export(out / trace_name("nsys"), keep=keep_plain)
    names = [trace_name("nsys", "compressed"), *([trace_name("nsys")] if keep_plain else []), trace_name("nsys", "report")]
    entries = trace_files_of(out, names)
    seen, uniq = set(), []
    for e in entries:           # trace.sqlite appears twice when kept: once from the .gz, once itself
        if e["name"] not in seen:
            seen.add(e["name"])
            uniq.append(e)
    m["trace_files"] = uniq
    mp.write_text(json.dumps(m, indent=2) + "\n")
    return m


def merge_rank_facts(per_rank: list[dict]) -> dict:
    """One facts dict from every rank's (rank order): rank 0's, with the slowest rank's median as
    ``unprofiled_step_ms`` (a TP step ends when the last rank does) and ``per_rank`` details."""
    if len(per_rank) == 1:
        return per_rank[0]
    facts = dict(per_rank[0])
    meds = [f.get("unprofiled_step_ms") for f in per_rank]
    if all(m is not None for m in meds):
        facts["unprofiled_step_ms"] = max(meds)
    facts["per_rank"] = [{"rank": r, "gpu_name": f.get("gpu_name"), "unprofiled_step_ms": f.get("unprofiled_step_ms"),
                          "weight_bytes_per_step": f.get("weight_bytes_per_step"),
                          "allreduce": f.get("allreduce"),
                          "host_loop_ms_per_step": (f.get("profiled") or {}).get("host_loop_ms_per_step")}
                         for r, f in enumerate(per_rank)]
    return facts


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
        "trace_files": [],
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
        raise CaptureFailed(f"{what}: cannot run {cmd[0]}: {e.strerror or e}")
    if rc != 0:
        raise CaptureFailed(f"{what} failed with exit code {rc} (command: {shlex.join(cmd)})")


def capture(*, workload: str, profiler: str, out: Path, steps: int = 16, mode: str = "eager",
            spec: int | None = None, nsys: str | None = None, nsys_graph_trace: str = "node",
            peak_bw: float | None = None, extra: tuple[str, ...] = (), python: str | None = None,
            argv: list[str] | None = None, tp: int | None = None, allreduce: str | None = None) -> dict:
    """Run one capture; return the manifest written to ``out/manifest.json``.

    ``tp`` (hf, synthetic): tensor parallelism over ``tp`` processes, one per GPU (torchrun); nsys
    writes one report covering every rank, the torch profiler one ``trace.rank<r>.json.gz`` per rank
    (``trace.json.gz`` at tp 1)."""
    out = Path(out)
    script = workload_script(workload)
    tp_args(workload, tp, allreduce)   # argument errors before anything runs
    if profiler not in ("nsys", "torch"):
        raise BadOptionValue(f"--profiler {profiler}: use nsys or torch")
    nsys_bin = find_nsys(nsys) if profiler == "nsys" else None
    check_workload_python(workload, python)
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    try:
        return _capture_into(out, script=script, workload=workload, profiler=profiler, steps=steps, mode=mode,
                             spec=spec, nsys_bin=nsys_bin, nsys_graph_trace=nsys_graph_trace, peak_bw=peak_bw,
                             extra=extra, python=python, argv=argv, tp=tp, allreduce=allreduce)
    except TracekitError:
        if created and out.is_dir() and not any(out.iterdir()):
            out.rmdir()                  # nothing left behind by a capture that wrote nothing
        raise


def _capture_into(out: Path, *, script: Path, workload: str, profiler: str, steps: int, mode: str, spec,
                  nsys_bin, nsys_graph_trace: str, peak_bw, extra, python, argv, tp, allreduce) -> dict:
    wcmd = workload_cmd(script, profiler=profiler, steps=steps, mode=mode, spec=spec, out_dir=out,
                        extra=list(extra), python=python, tp=tp, allreduce=allreduce)
    world = tp if (tp is not None and workload in TP_WORKLOADS) else 1
    facts_paths = [rank_file(out / FACTS_FILE, r, world) for r in range(world)]
    traces = [rank_file(out / trace_name("torch", "compressed"), r, world) for r in range(world)]
    for f in (*facts_paths, *(traces if profiler == "torch" else ())):
        if f.exists():
            f.unlink()
    env = worker_env()
    nsys_ver = None
    if profiler == "nsys":
        for f in (trace_name("nsys", "report"), trace_name("nsys")):
            if (out / f).exists():
                (out / f).unlink()
        nsys_ver = nsys_version(nsys_bin)
        _run(nsys_profile_cmd(nsys_bin, out, wcmd, graph_trace=nsys_graph_trace), "nsys profile", env)
        if not (out / trace_name("nsys", "report")).exists():
            raise CaptureFailed(
                f"nsys wrote no {out / trace_name('nsys', 'report')}: the workload never called cudaProfilerStart "
                "(did it reach the profiled steps?)")
        _run(nsys_export_cmd(nsys_bin, out), "nsys export", env)
        if not (out / trace_name("nsys")).exists():
            raise CaptureFailed(f"nsys export wrote no {out / trace_name('nsys')}")
    elif profiler == "torch":
        _run(wcmd, f"workload {script.name}", env)
        for t in traces:
            if not t.exists():
                raise CaptureFailed(f"workload wrote no {t}")
    else:
        raise BadOptionValue(f"--profiler {profiler}: use nsys or torch")
    per_rank = []
    for fp in facts_paths:
        try:
            per_rank.append(json.loads(fp.read_text()))
        except (OSError, ValueError) as e:
            raise CaptureFailed(f"workload wrote no usable facts file {fp}: {e}")
    facts = merge_rank_facts(per_rank)
    command = argv if argv is not None else ["tracekit", "capture", "--workload", workload, "--profiler", profiler,
                                             "--out", str(out), "--steps", str(steps), "--mode", mode,
                                             *(["--tp", str(tp)] if tp is not None else []),
                                             *(["--allreduce", allreduce] if allreduce else [])]
    manifest = build_manifest(facts, workload=workload, profiler=profiler, mode=mode, steps=steps,
                              command=command, nsys_ver=nsys_ver, peak_bw_gbps=peak_bw)
    manifest["workload_command"] = wcmd
    if profiler == "nsys":
        manifest["nsys_graph_trace"] = nsys_graph_trace
    if world > 1 and profiler == "torch":
        manifest["rank_traces"] = [t.name for t in traces]
    names = [trace_name("nsys"), trace_name("nsys", "report")] if profiler == "nsys" else [t.name for t in traces]
    manifest["trace_files"] = trace_files_of(out, names)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    for fp in facts_paths:
        fp.unlink()
    return manifest


__all__ = ["capture", "find_nsys", "nsys_profile_cmd", "nsys_export_cmd", "build_manifest",
           "check_workload_python", "missing_modules", "trace_files_of", "gzip_capture_export", "WORKLOAD_MODULES",
           "workload_cmd", "workload_script", "launch_prefix", "tp_args", "worker_env", "rank_file",
           "merge_rank_facts", "MANIFEST_KEYS", "MANIFEST_SCHEMA", "ALLREDUCE_CHOICES", "NO_MULTICAST_ENV"]

