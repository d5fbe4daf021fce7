"""Rebuild the H200-made checkpoints as sparse files: a reader that reads only safetensors headers sees
exactly the files the GPU host wrote.

    from materialize import materialize
    model_dir = materialize("fp8", tmp_path)     # -> tmp_path/fp8 with config.json, the index and every shard

Each shard = its committed header (``<shard>.header``: the 8-byte little-endian length + the JSON header)
followed by a hole up to the shard's true size (``sizes.json``; ``os.truncate``, no data written). The
tensor bytes themselves are zeros when read: only the headers are real.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

HERE = Path(__file__).resolve().parent
VARIANTS = ("bf16", "fp8")


def materialize(variant: str, dst) -> Path:
    src = HERE / variant
    if variant not in VARIANTS or not src.is_dir():
        raise ValueError(f"variant {variant!r}: use one of {VARIANTS}")
    out = Path(dst) / variant
    out.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "model.safetensors.index.json"):
        shutil.copyfile(src / name, out / name)
    sizes = json.loads((src / "sizes.json").read_text())
    for shard, size in sizes.items():
        head = (src / f"{shard}.header").read_bytes()
        with open(out / shard, "wb") as f:
            f.write(head)
        os.truncate(out / shard, size)
    return out
