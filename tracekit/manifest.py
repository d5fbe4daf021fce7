"""The capture manifest (``manifest.json`` beside a trace, schema ``tracekit.manifest/1`` or ``/2``).

``tracekit capture`` writes it; every analysis command reads it when it lies beside the trace. A
malformed manifest is ignored with a warning (the trace itself is still analysable), never trusted
half-way.

``/2`` (``tracekit capture --server URL``, ``tracekit.server``) is ``/1`` plus ``server`` (the engine, its
version, model path and own settings), ``unprofiled_step_ms_spread`` (``[lo, hi]`` over the repetitions) and
``concurrency`` (the streamed requests in flight: the batch, so ``tokens_per_step`` = ``concurrency``); one
manifest names every rank file of the capture in ``trace_files``, so it applies to each rank of the directory.
Both versions are read alike: the keys the analysis uses (``unprofiled_step_ms``, ``tp``, ``spec``,
``tokens_per_step``, ``weight_bytes_per_step``) mean the same in each.

A manifest applies to a trace only when it belongs to it (contract, "manifest matching"):

* with ``trace_files`` (``[{"name", "bytes", "sha256_first_mib"}]``, every trace file the capture wrote;
  a gzipped export is listed twice, as ``trace.sqlite.gz`` and as the plain ``trace.sqlite`` it
  decompresses to): one entry must match the trace file's name, size and the sha256 of its first MiB;
* without (an older manifest): its ``profiler`` must match the trace's format (nsys / torch) and its
  ``steps`` the number of step windows found before exclusion -- the second half needs the step
  windows, so the step finder calls :func:`manifest_applies_legacy` (``manifest["applied_by"]`` is
  ``"legacy"`` then).

A manifest that does not match is ignored with a warning saying why, never applied silently.
Standard library only: ``tracekit capture`` uses the hashing helpers on a GPU host without polars.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path

from tracekit.contract import MANIFEST_SCHEMA, MANIFEST_V2_SCHEMA

SCHEMA = MANIFEST_SCHEMA  # "tracekit.manifest/1" (tracekit.contract names it once)
SCHEMAS = (MANIFEST_SCHEMA, MANIFEST_V2_SCHEMA)  # every version read
MIB = 1 << 20


# ------------------------------------------------------------------------------------------------
# identifying a trace file (capture writes these entries; matching recomputes them)
# ------------------------------------------------------------------------------------------------

def sha256_first_mib(path) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read(MIB)).hexdigest()


def trace_file_entry(path, name: str | None = None) -> dict:
    """``{"name", "bytes", "sha256_first_mib"}`` of one file."""
    p = Path(path)
    return {"name": name or p.name, "bytes": p.stat().st_size, "sha256_first_mib": sha256_first_mib(p)}


def gunzipped_entry(path) -> dict:
    """The entry of the plain file a ``X.gz`` decompresses to (name ``X``), computed by streaming it."""
    p = Path(path)
    h = hashlib.sha256()
    size = 0
    with gzip.open(p, "rb") as f:
        while True:
            chunk = f.read(MIB)
            if not chunk:
                break
            if size < MIB:
                h.update(chunk[:MIB - size])
            size += len(chunk)
    return {"name": p.name[:-len(".gz")], "bytes": size, "sha256_first_mib": h.hexdigest()}


def trace_file_entries(path, gunzipped: bool = False) -> list[dict]:
    """Entries for one trace file as capture lists it; ``gunzipped``: a gzipped export also as the plain file it
    decompresses to (so a user who gunzips it still matches)."""
    p = Path(path)
    out = [trace_file_entry(p)]
    if gunzipped:
        out.append(gunzipped_entry(p))
    return out


def gzip_export(path, level: int = 9, keep: bool = False) -> Path:
    """``X.sqlite`` -> ``X.sqlite.gz`` beside it (written to a temporary name, then renamed); the plain
    file is removed unless ``keep``. Used by capture on its own output folder, never on a user's input."""
    p = Path(path)
    out = p.with_name(p.name + ".gz")
    with tempfile.NamedTemporaryFile(dir=p.parent, prefix=out.name, suffix=".tmp", delete=False) as tmp:
        with open(p, "rb") as src, gzip.GzipFile(filename=p.name, mode="wb", fileobj=tmp, compresslevel=level,
                                                 mtime=0) as dst:
            shutil.copyfileobj(src, dst, MIB)
    Path(tmp.name).replace(out)
    if not keep:
        p.unlink()
    return out


# ------------------------------------------------------------------------------------------------
# reading and matching
# ------------------------------------------------------------------------------------------------

def find_manifest(trace_path: Path) -> Path | None:
    p = Path(trace_path).parent / "manifest.json"
    return p if p.is_file() else None


def read_manifest(path: Path) -> tuple[dict | None, str | None]:
    """(manifest, warning). Only well-formed values are kept; each bad field is dropped."""
    try:
        raw = path.read_bytes()
        if len(raw) > 1_000_000:
            return None, f"{path}: manifest larger than 1 MB, ignored"
        data = json.loads(raw)
    except (OSError, ValueError) as e:
        return None, f"{path}: unreadable manifest ignored ({e})"
    if not isinstance(data, dict) or data.get("schema") not in SCHEMAS:
        return None, f"{path}: not a {' or '.join(SCHEMAS)} manifest, ignored"

    def num(v, kind=float):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return None
        if v != v or v < 0 or v == float("inf"):
            return None
        return kind(v)

    out = dict(data)
    out["peak_bw_gbps"] = num(data.get("peak_bw_gbps"))
    out["weight_bytes_per_step"] = num(data.get("weight_bytes_per_step"), int)
    out["unprofiled_step_ms"] = num(data.get("unprofiled_step_ms"))
    out["tokens_per_step"] = num(data.get("tokens_per_step"))
    out["tp"] = num(data.get("tp"), int)
    out["steps"] = num(data.get("steps"), int)
    if data.get("schema") == MANIFEST_V2_SCHEMA:
        out["concurrency"] = num(data.get("concurrency"), int)
        if out["tokens_per_step"] is None and out["concurrency"]:
            out["tokens_per_step"] = float(out["concurrency"])
        spread = data.get("unprofiled_step_ms_spread")
        lo_hi = [num(x) for x in spread] if isinstance(spread, list) and len(spread) == 2 else None
        out["unprofiled_step_ms_spread"] = lo_hi if lo_hi and None not in lo_hi and lo_hi[0] <= lo_hi[1] else None
        out["server"] = data.get("server") if isinstance(data.get("server"), dict) else None
    spec = data.get("spec")
    if isinstance(spec, dict):
        out["spec"] = {"draft_tokens": num(spec.get("draft_tokens"), int), "accept_len": num(spec.get("accept_len"))}
    else:
        out["spec"] = None
    files = data.get("trace_files")
    if files is not None:
        ok = isinstance(files, list) and all(
            isinstance(e, dict) and isinstance(e.get("name"), str) and num(e.get("bytes"), int) is not None
            and isinstance(e.get("sha256_first_mib"), str) for e in files)
        if not ok:
            return None, f"{path}: malformed trace_files, manifest ignored"
    return out, None


def manifest_matches(manifest: dict, trace_path, fmt: str | None, profiler: str | None = None) -> tuple[bool, str | None]:
    """(applies, why not). ``trace_path`` is the user's file (for a ``.sqlite.gz``, the gzipped file);
    ``fmt`` the reader's format (``nsys-sqlite`` / ``kineto-json``) and ``profiler`` the profiler whose captures it
    reads (:attr:`tracekit.readers.Format.profiler`), used for older manifests."""
    p = Path(trace_path)
    files = manifest.get("trace_files")
    if files is not None:
        named = [e for e in files if e.get("name") == p.name]
        if not named:
            listed = ", ".join(sorted({str(e.get("name")) for e in files})) or "none"
            return False, (f"manifest.json beside {p.name} lists other trace files ({listed}): ignored; "
                           f"pass --measured-step-ms etc. yourself, or keep each capture's manifest with its trace")
        size = p.stat().st_size
        sha = sha256_first_mib(p)
        if any(e.get("bytes") == size and e.get("sha256_first_mib") == sha for e in named):
            return True, None
        return False, (f"manifest.json beside {p.name} describes another {p.name} (size or content differs): "
                       f"ignored; it belongs to a different capture")
    prof = manifest.get("profiler")
    if profiler and prof == profiler:
        return True, None
    return False, (f"manifest.json beside {p.name} (no trace_files) is for a {prof!s} capture, this is a "
                   f"{fmt or 'unknown'} trace: ignored")


def manifest_applies_legacy(manifest: dict | None, n_windows: int) -> bool:
    """The steps half of the rule for older manifests (no ``trace_files``): the manifest applies only
    when its ``steps`` equals the number of step windows found before exclusion. True for a manifest
    matched by ``trace_files`` (nothing left to check); False for no manifest."""
    if not manifest:
        return False
    if manifest.get("applied_by") != "legacy":
        return True
    return manifest.get("steps") is not None and int(manifest["steps"]) == int(n_windows)


def attach_manifest(trace, trace_path: Path, profiler: str | None = None):
    """Return ``trace`` with the manifest beside ``trace_path`` attached, when it matches that file (``profiler``: the
    one whose captures the trace's format reads, for older manifests); otherwise ``trace`` with a warning saying why
    it was ignored."""
    mp = find_manifest(trace_path)
    if mp is None:
        return trace
    manifest, warning = read_manifest(mp)
    if manifest is None:
        return trace.with_warning(warning) if warning else trace
    ok, why = manifest_matches(manifest, trace_path, getattr(trace.meta, "format", None), profiler)
    if not ok:
        return trace.with_warning(why)
    manifest["applied_by"] = "trace_files" if manifest.get("trace_files") is not None else "legacy"
    return replace(trace, manifest=manifest)
