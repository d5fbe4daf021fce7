"""Load a model's structure: ``config.json`` plus the safetensors headers (never the weights).

:func:`load_model` accepts

- a model directory or Hugging Face cache snapshot (``.../models--Org--Name/snapshots/<rev>/``)
  with ``config.json`` and ``model.safetensors.index.json`` / ``*.safetensors``: every tensor
  at its stored dtype and shape, read from the headers;
- a bare ``config.json`` (or a directory with no weights): the tensors a checkpoint of that
  config would hold (:mod:`tracekit.model.synth`), at ``dtype`` or the config's own dtype
  and quantization.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from tracekit.errors import BadModelFiles, ModelFilesMissing, TracekitError
from tracekit.model.arch import Arch, arch_from_config, load_config
from tracekit.model.params import param_counts
from tracekit.model.roles import Role, classify
from tracekit.model.safetensors import TensorInfo, read_header
from tracekit.model.synth import synthesize

MAX_INDEX_BYTES = 50_000_000


@dataclass(frozen=True)
class Model:
    """A model's tensors (from headers or synthesized from the config) and its architecture."""

    path: str | None
    source: str                      # "safetensors" | "config"
    arch: Arch
    tensors: tuple[TensorInfo, ...]
    roles: tuple[Role, ...]          # roles[i] is tensors[i]'s
    files: tuple[str, ...] = ()      # safetensors files whose headers were read
    dtype: str | None = None         # the dtype applied to a bare config (None: the config's own)
    notes: tuple[str, ...] = ()
    warnings: tuple[str, ...] = field(default=())

    @property
    def checkpoint_bytes(self) -> int:
        """Every stored tensor's bytes, whole model (the index's ``metadata.total_size``)."""
        return sum(t.nbytes for t in self.tensors)

    @property
    def dtypes(self) -> dict[str, int]:
        """Stored bytes per dtype."""
        c: Counter = Counter()
        for t in self.tensors:
            c[t.dtype] += t.nbytes
        return dict(c.most_common())

    def summary(self) -> dict:
        """A small JSON-able description (for ``ceiling``'s ``model`` block and reports)."""
        a = self.arch
        try:
            pc = param_counts(a)
            params = {"total": pc.total, "with_mtp": pc.with_mtp, "active_per_token": pc.active_per_token}
        except TracekitError:
            params = None
        return {
            "path": self.path, "source": self.source, "model_type": a.model_type, "layers": a.layers,
            "hidden_size": a.hidden, "vocab_size": a.vocab, "heads": a.heads, "kv_heads": a.kv_heads,
            "head_dim": a.head_dim, "tied_embeddings": a.tied, "experts": a.experts, "experts_per_token": a.top_k,
            "moe_layers": len(a.moe_layers), "mtp_layers": a.mtp_layers, "mla": a.mla,
            "layer_kinds": dict(Counter(a.layer_kinds)), "tensors": len(self.tensors),
            "checkpoint_bytes": self.checkpoint_bytes, "dtypes": self.dtypes, "files": len(self.files),
            "dtype": self.dtype, "params": params, "notes": list(self.notes), "warnings": list(self.warnings),
        }


def _roles(tensors, arch: Arch) -> tuple[Role, ...]:
    return tuple(classify(t.name, len(t.shape), layers=arch.layers) for t in tensors)


def model_from_config(cfg: dict, *, dtype: str | None = None, path: str | None = None,
                      notes: tuple[str, ...] = ()) -> Model:
    """A :class:`Model` from a config dict alone (tensors synthesized)."""
    arch = arch_from_config(cfg)
    tensors, synth_notes = synthesize(arch, dtype)
    return Model(path=path, source="config", arch=arch, tensors=tuple(tensors), roles=_roles(tensors, arch),
                 dtype=dtype, notes=tuple(notes) + tuple(synth_notes), warnings=arch.warnings)


def load_model(path: str | Path, *, dtype: str | None = None) -> Model:
    """Read a model directory, HF cache snapshot or bare ``config.json`` (see the module docstring).

    ``dtype`` applies only when no safetensors are read (a bare config); with headers the
    stored dtypes win and ``dtype`` is ignored with a note. ``TracekitError`` (one line)
    for a missing path, an unreadable config or a corrupt header.
    """
    p = Path(path).expanduser()
    if not p.exists():
        raise ModelFilesMissing(f"--model {path} does not exist (give a model directory, a Hugging Face snapshot or a "
                            "config.json)")
    if p.is_file():
        if p.suffix == ".safetensors" or p.name.endswith(".index.json"):
            p = p.parent
        else:
            return model_from_config(load_config(p), dtype=dtype, path=str(p))
    cfg_path = p / "config.json"
    if not cfg_path.is_file():
        snaps = sorted((p / "snapshots").glob("*/config.json")) if (p / "snapshots").is_dir() else []
        if snaps:  # the cache's models--Org--Name folder itself
            return load_model(_pick_snapshot(p), dtype=dtype)
        raise ModelFilesMissing(f"--model {path}: no config.json there (give the folder that holds config.json and "
                            "the *.safetensors files)")
    cfg = load_config(cfg_path)
    files, notes, warnings = _weight_files(p)
    if not files:
        return model_from_config(cfg, dtype=dtype, path=str(p), notes=tuple(notes))
    arch = arch_from_config(cfg)
    tensors: list[TensorInfo] = []
    seen: set[str] = set()
    for f in files:
        header, _meta = read_header(f)
        for name, t in header.items():
            if name in seen:
                warnings.append(f"tensor {name[:80]!r} is stored twice; counted once")
                continue
            seen.add(name)
            tensors.append(t)
    if dtype is not None:
        notes.append(f"--dtype {dtype} ignored: the safetensors headers give every tensor's stored dtype")
    notes.insert(0, f"weights from the safetensors headers of {len(files)} file(s): every tensor at its stored "
                    "dtype and shape")
    return Model(path=str(p), source="safetensors", arch=arch, tensors=tuple(tensors), roles=_roles(tensors, arch),
                 files=tuple(str(f) for f in files), dtype=None, notes=tuple(notes),
                 warnings=arch.warnings + tuple(warnings))


def _pick_snapshot(repo_dir: Path) -> Path:
    """``snapshots/<rev>`` of a cache repo folder: the one ``refs/main`` names, else the newest."""
    ref = repo_dir / "refs" / "main"
    if ref.is_file():
        rev = ref.read_text(encoding="utf-8", errors="replace").strip()
        if rev and "/" not in rev and (repo_dir / "snapshots" / rev / "config.json").is_file():
            return repo_dir / "snapshots" / rev
    snaps = [c.parent for c in (repo_dir / "snapshots").glob("*/config.json")]
    return max(snaps, key=lambda s: s.stat().st_mtime)


def _weight_files(d: Path) -> tuple[list[Path], list[str], list[str]]:
    """The safetensors files to read, notes, warnings. Empty list: read none (config only)."""
    notes: list[str] = []
    warnings: list[str] = []
    index = d / "model.safetensors.index.json"
    if index.is_file():
        try:
            if index.stat().st_size > MAX_INDEX_BYTES:
                raise ValueError("too large")
            data = json.loads(index.read_text(encoding="utf-8"))
            weight_map = data["weight_map"]
            names = sorted({str(v) for v in weight_map.values()})
        except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:
            raise BadModelFiles(f"{index}: not a readable safetensors index ({type(e).__name__}); re-download it"
                                ) from None
        bad = [n for n in names if Path(n).name != n or n in ("", ".", "..")]
        if bad:
            raise BadModelFiles(f"{index}: shard name {bad[0][:60]!r} is not a file name in the model folder")
        files = [d / n for n in names]
        missing = [f for f in files if not f.is_file()]
        if missing:
            notes.append(f"{len(missing)} of {len(files)} safetensors shards listed in the index are missing "
                         f"(e.g. {missing[0].name}): weights counted from config.json instead")
            return [], notes, warnings
        return files, notes, warnings
    files = sorted(f for f in d.glob("*.safetensors") if not f.name.startswith("consolidated"))
    if not files:
        notes.append("no *.safetensors beside config.json: weights counted from config.json")
    return files, notes, warnings
