"""Which model a trace profiled, from the command line the profiler recorded.

nsys records the launched command in ``META_DATA_CAPTURE`` (``PROCESS_0:COMMAND`` +
``PROCESS_0:ARGUMENT_N``; the nsys reader exposes it as ``TraceMeta.command``).
:func:`parse_command` finds the serving engine's model and parallelism flags in it
(SGLang and vLLM spellings, ``--flag value`` and ``--flag=value``, inside ``bash -c "..."``
too); :func:`resolve_model` finds that model on this machine: a path, or a Hugging Face
repo id in the local cache (``HF_HUB_CACHE``, ``HF_HOME/hub``, ``~/.cache/huggingface/hub``:
``models--Org--Name/snapshots/<rev>/``). Nothing is downloaded.

The command line is untrusted text from the trace: it is only parsed and used as a
file-system lookup (a repo id must look like ``org/name``); render the notes through
``tracekit.report.safe``.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

_MODEL = ("--model-path", "--model", "--model-name-or-path", "--model_name_or_path", "--model-id")
_TP = ("--tp", "--tp-size", "--tensor-parallel-size", "-tp", "--tensor-parallel")
_EP = ("--ep", "--ep-size", "--expert-parallel-size", "-ep")
_DP = ("--dp", "--dp-size", "--data-parallel-size", "-dp")
_DRAFT = ("--speculative-draft-model-path", "--speculative-draft", "--speculative-model",
          "--speculative-draft-model")
_ALGO = ("--speculative-algorithm", "--speculative-algo")
_STEPS = ("--speculative-num-steps",)
_DRAFT_TOKENS = ("--speculative-num-draft-tokens", "--num-speculative-tokens")
_KV_DTYPE = ("--kv-cache-dtype",)
_DTYPE = ("--dtype",)
_QUANT = ("--quantization", "-q")
_BATCH = ("--batch-size", "--batch", "--max-batch-size")
_INPUT = ("--input-len", "--input-length", "--prompt-len")
_OUTPUT = ("--output-len", "--output-length")
_MAXLEN = ("--context-length", "--max-model-len")
_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}$")
_CACHE_DIR = re.compile(r"models--([A-Za-z0-9][A-Za-z0-9_.-]*)--([A-Za-z0-9][A-Za-z0-9_.-]*)")


@dataclass(frozen=True)
class ServeArgs:
    """What a serving command line says (None: not on the line)."""

    engine: str | None = None           # "sglang" | "vllm" | None
    model: str | None = None
    tp: int | None = None
    ep: int | None = None
    dp: int | None = None
    draft_model: str | None = None
    speculative_algorithm: str | None = None
    speculative_num_steps: int | None = None       # draft forward passes per step (SGLang EAGLE/NEXTN)
    speculative_num_draft_tokens: int | None = None
    kv_cache_dtype: str | None = None
    dtype: str | None = None
    quantization: str | None = None
    batch_size: int | None = None       # benchmark scripts (sglang.bench_one_batch --batch-size)
    input_len: int | None = None
    output_len: int | None = None
    max_context: int | None = None      # --context-length / --max-model-len (a limit, not the context used)
    argv: tuple[str, ...] = field(default=(), repr=False)


def _tokens(command: str | Sequence[str]) -> list[str]:
    if isinstance(command, str):
        parts = _split(command)
    else:
        parts = [str(a) for a in command]
    out: list[str] = []
    for a in parts:
        # `bash -c "python -m sglang.launch_server --model-path X"`: look inside one level
        if " " in a and re.search(r"(^|\s)-{1,2}[A-Za-z]", a):
            out += _split(a)
        else:
            out.append(a)
    return out


def _split(text: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError:
        return text.split()


def _int(v: str | None) -> int | None:
    if v is None:
        return None
    m = re.fullmatch(r"\s*(\d{1,7})\s*", v.split(",")[0])
    return int(m.group(1)) if m else None


def parse_command(command: str | Sequence[str] | None) -> ServeArgs:
    """The model, TP/EP/DP and speculation flags of a serving (or benchmark) command line.

    >>> a = parse_command("python -m sglang.launch_server --model-path Qwen/Qwen3-8B --tp 2")
    >>> a.engine, a.model, a.tp
    ('sglang', 'Qwen/Qwen3-8B', 2)
    >>> parse_command(["vllm", "serve", "meta-llama/Llama-3.1-8B", "--tensor-parallel-size=4"]).tp
    4
    """
    if not command:
        return ServeArgs()
    argv = _tokens(command)
    vals: dict[str, str] = {}
    flags: set[str] = set()
    i = 0
    while i < len(argv):
        a = argv[i]
        if a.startswith("-"):
            if "=" in a:
                k, v = a.split("=", 1)
                vals[k] = v
            elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                vals[a] = argv[i + 1]
                i += 1
            else:
                flags.add(a)
        i += 1

    def get(names):
        for n in names:
            if n in vals:
                return vals[n]
        return None

    text = " ".join(argv[:6]).lower()
    engine = "sglang" if "sglang" in text else "vllm" if "vllm" in text else None
    model = get(_MODEL)
    if model is None and "serve" in argv:  # `vllm serve MODEL [...]`
        j = argv.index("serve")
        if j + 1 < len(argv) and not argv[j + 1].startswith("-"):
            model = argv[j + 1]
    tp, dp = _int(get(_TP)), _int(get(_DP))
    ep = _int(get(_EP))
    if ep is None and "--enable-expert-parallel" in flags | set(vals):  # vLLM: experts over TP x DP
        ep = (tp or 1) * (dp or 1)
    algo, steps, draft_tokens = get(_ALGO), _int(get(_STEPS)), _int(get(_DRAFT_TOKENS))
    spec = get(("--speculative-config",))
    if spec:
        try:
            sc = json.loads(spec)
            if isinstance(sc, dict):
                algo = algo or (str(sc.get("method")) if sc.get("method") else None)
                n = sc.get("num_speculative_tokens")
                if isinstance(n, int) and n > 0:
                    steps = steps or n
                    draft_tokens = draft_tokens or n + 1
        except ValueError:
            pass
    return ServeArgs(
        engine=engine, model=model, tp=tp, ep=ep, dp=dp, draft_model=get(_DRAFT), speculative_algorithm=algo,
        speculative_num_steps=steps, speculative_num_draft_tokens=draft_tokens, kv_cache_dtype=get(_KV_DTYPE),
        dtype=get(_DTYPE), quantization=get(_QUANT), batch_size=_int(get(_BATCH)), input_len=_int(get(_INPUT)),
        output_len=_int(get(_OUTPUT)), max_context=_int(get(_MAXLEN)), argv=tuple(argv),
    )


def hf_cache_dirs(env: Mapping[str, str] | None = None) -> list[Path]:
    """The Hugging Face hub cache folders to look in, in the order huggingface_hub uses them."""
    env = os.environ if env is None else env
    dirs: list[Path] = []
    for key in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if env.get(key):
            dirs.append(Path(env[key]).expanduser())
    if env.get("HF_HOME"):
        dirs.append(Path(env["HF_HOME"]).expanduser() / "hub")
    if env.get("XDG_CACHE_HOME"):
        dirs.append(Path(env["XDG_CACHE_HOME"]).expanduser() / "huggingface" / "hub")
    home = env.get("HOME")
    dirs.append((Path(home) if home else Path.home()) / ".cache" / "huggingface" / "hub")
    seen, out = set(), []
    for d in dirs:
        if d not in seen:
            seen.add(d)
            out.append(d)
    return out


def resolve_model(name: str | None, *, env: Mapping[str, str] | None = None) -> tuple[Path | None, str]:
    """``(path, how)``: where model ``name`` (a path or ``org/name`` repo id) lies on this machine.

    ``path`` is a folder with ``config.json`` (or a ``config.json``), None when not found;
    ``how`` says where it was found or why not, in one line.
    """
    if not name:
        return None, "no model on the command line"
    shown = name if len(name) <= 120 else name[:117] + "..."
    p = Path(name).expanduser()
    try:
        if (p / "config.json").is_file() or (p.is_file() and p.name.endswith(".json")):
            return p, f"model path {shown}"
    except OSError:
        pass
    m = _CACHE_DIR.search(name)
    repo = f"{m.group(1)}/{m.group(2)}" if m else name
    if not _REPO_ID.fullmatch(repo) or ".." in repo:
        return None, f"model {shown!r} is not a path on this machine nor a Hugging Face repo id"
    org, rest = repo.split("/")
    for cache in hf_cache_dirs(env):
        d = cache / f"models--{org}--{rest}"
        snap = _snapshot(d)
        if snap is not None:
            return snap, f"{repo} from the local Hugging Face cache ({snap})"
    return None, (f"{repo} is not in the local Hugging Face cache "
                  f"({', '.join(str(c) for c in hf_cache_dirs(env)[:2])}): pass --model PATH")


def _snapshot(repo_dir: Path) -> Path | None:
    try:
        snaps = [c.parent for c in (repo_dir / "snapshots").glob("*/config.json")]
    except OSError:
        return None
    if not snaps:
        return None
    ref = repo_dir / "refs" / "main"
    try:
        rev = ref.read_text(encoding="utf-8", errors="replace").strip() if ref.is_file() else ""
    except OSError:
        rev = ""
    for s in snaps:
        if s.name == rev:
            return s
    return max(snaps, key=lambda s: s.stat().st_mtime)


@dataclass(frozen=True)
class Discovery:
    """The profiled command's model, found (``model_path``) or not, and what to tell the user."""

    args: ServeArgs
    model_path: Path | None
    note: str


def discover_model(command: str | Sequence[str] | None, *, env: Mapping[str, str] | None = None) -> Discovery:
    """Parse a recorded command line and resolve its model locally (see the module docstring).

    >>> discover_model(None).note
    'the trace records no command line'
    """
    if not command:
        return Discovery(ServeArgs(), None, "the trace records no command line")
    args = parse_command(command)
    if not args.model:
        return Discovery(args, None, "the profiled command line names no --model / --model-path")
    path, how = resolve_model(args.model, env=env)
    par = "".join(f", --{k} {v}" for k, v in (("tp", args.tp), ("ep", args.ep)) if v)
    if path is None:
        return Discovery(args, None, f"the profiled command ran {args.model[:120]}{par}; {how}")
    return Discovery(args, path, f"model from the profiled command line{par}: {how}")
