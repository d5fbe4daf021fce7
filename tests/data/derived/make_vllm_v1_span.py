"""Make ``vllm_v1_span_cut.json.gz`` from the validation set's real torch-profiler trace (derived, not captured).

Source: ``../shared/validation/sv_vllm_eagle_vllm_torch.json.xz`` (a vLLM-order EAGLE loop captured on an H100 by a
harness outside this project; its ``execute_context_0(0)_generation_1(4)`` annotation covers the whole step). vLLM V1
closes that span after the target's verify forward and runs sampling, rejection and the drafter after it
(``gpu_model_runner.py``: ``execute_model`` returns before ``sample_tokens`` / ``propose_draft_token_ids``). This
script gives the same trace that shape, and changes nothing else: every ``execute_context`` annotation (the CPU
``user_annotation`` and its ``gpu_user_annotation`` mirror) is cut to end where the step's first CUDA graph launch
(the verify graph) ends on the host, and where that graph's last kernel ends on the GPU. Every other event is copied
as it is (same order, same fields).

    python tests/data/derived/make_vllm_v1_span.py ../shared/validation/sv_vllm_eagle_vllm_torch.json.xz \
        tests/data/derived/vllm_v1_span_cut.json.gz
"""

from __future__ import annotations

import gzip
import json
import lzma
import sys

SPAN = "execute_context_"


def cut(doc: dict) -> int:
    """Cut the spans of ``doc`` in place; returns how many were cut."""
    ev = doc["traceEvents"]
    cpu = sorted((e for e in ev if e.get("cat") == "user_annotation" and e["name"].startswith(SPAN)),
                 key=lambda e: e["ts"])
    gpu = sorted((e for e in ev if e.get("cat") == "gpu_user_annotation" and e["name"].startswith(SPAN)),
                 key=lambda e: e["ts"])
    graphs = sorted((e for e in ev if e.get("cat") == "cuda_runtime" and e["name"] == "cudaGraphLaunch"),
                    key=lambda e: e["ts"])
    kernels: dict[int, float] = {}  # graph launch correlation -> end of its last kernel (µs)
    for e in ev:
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and "correlation" in e.get("args", {}):
            c = e["args"]["correlation"]
            kernels[c] = max(kernels.get(c, 0.0), e["ts"] + e.get("dur", 0.0))
    n = 0
    for a in cpu:
        end = a["ts"] + a["dur"]
        verify = next((g for g in graphs if a["ts"] <= g["ts"] <= end), None)
        if verify is None:
            continue
        a["dur"] = verify["ts"] + verify["dur"] - a["ts"]
        gpu_end = kernels.get(verify["args"]["correlation"])
        # the GPU mirror that overlaps the verify graph's kernels
        mirror = next((g for g in gpu if gpu_end is not None and g["ts"] <= gpu_end <= g["ts"] + g["dur"]), None)
        if mirror is not None:
            mirror["dur"] = gpu_end - mirror["ts"]
        n += 1
    return n


def main(src: str, dst: str) -> None:
    opener = lzma.open if src.endswith(".xz") else gzip.open if src.endswith(".gz") else open
    with opener(src, "rt") as f:
        doc = json.load(f)
    n = cut(doc)
    with gzip.GzipFile(dst, "wb", compresslevel=9, mtime=0) as f:
        f.write(json.dumps(doc, separators=(",", ":")).encode())
    print(f"{n} execute_context spans cut after the verify graph -> {dst}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
