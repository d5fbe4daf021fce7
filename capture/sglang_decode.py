"""A real SGLang engine's decode loop, marked for tracekit (NOT RUN by us: see docs/capture.md).

    python capture/sglang_decode.py --model-path meta-llama/Llama-3.1-8B-Instruct [--load-format dummy] \
        [--tp 2] [--mode eager|graph] [--spec K --speculative-algorithm EAGLE|EAGLE3|NEXTN \
        --speculative-draft-model-path PATH] --profiler nsys|torch --steps 16 --facts-out facts.json

Written against the SGLang source at these commits of sgl-project/sglang (read 2026-12-02; the
nearest tagged line is v0.5.x):

* ``python/sglang/bench_one_batch.py`` @ 00944150 -- ``load_model``/``extend``/``decode`` (no
  speculative decoding there: ``ScheduleBatch.init_new(..., spec_algorithm=SpeculativeAlgorithm.NONE)``),
  which is why this integration drives the offline ``sglang.Engine`` instead;
* ``python/sglang/srt/managers/scheduler.py`` -- ``Scheduler.run_batch(self, batch)``, one call per
  scheduler iteration (prefill or decode), and ``run_scheduler_process``, the entry of each
  scheduler (= TP rank) process, started by ``sglang/srt/entrypoints/engine.py``;
* ``python/sglang/srt/speculative/eagle_worker.py`` @ 00559eac -- ``EAGLEWorker.draft(batch)`` and
  ``EAGLEWorker.verify(batch, spec_info)`` called from ``forward_batch_generation`` (EAGLE, EAGLE3 and
  NEXTN/MTP all use this worker); ``eagle_worker_v2.py`` @ 006b0e3d -- ``EagleDraftWorker.draft``
  and ``EAGLEWorkerV2.verify`` of the overlap ("spec v2") path.

How it works: the engine starts one scheduler process per TP rank. We replace the engine's
reference to ``run_scheduler_process`` with :func:`_scheduler_entry`, which (inside each
scheduler process) wraps ``Scheduler.run_batch`` in ``decode_step <i>`` markers for decode
batches, ``draft``/``verify`` in markers, times ``--timed-steps`` decode batches unprofiled (CUDA
events at the start of consecutive decode batches), then brackets ``--steps`` decode batches with
``cudaProfilerStart/Stop`` (nsys ``--capture-range=cudaProfilerApi``) or a torch profiler, and
writes the facts file from rank 0. One request of random token ids with ``ignore_eos`` keeps the
engine decoding long enough. ``--mode eager`` passes ``disable_cuda_graph=True``.

Everything that touches SGLang is resolved lazily, so this file imports (and its argument
building is unit-tested) where SGLang is not installed.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys

import _common
import markers

SGLANG_PINNED = "sgl-project/sglang main, bench_one_batch.py@00944150, eagle_worker.py@00559eac (v0.5.x)"
ENV_CFG = "TRACEKIT_SGLANG_CFG"   # JSON config handed to the scheduler processes

# (module, attribute path, marker kind). "step" wraps decode batches; missing optional targets
# are skipped with a warning (SGLang moves code around between versions).
PATCH_TARGETS = (
    ("sglang.srt.managers.scheduler", "Scheduler.run_batch", "step", True),
    ("sglang.srt.speculative.eagle_worker", "EAGLEWorker.draft", "draft", False),
    ("sglang.srt.speculative.eagle_worker", "EAGLEWorker.verify", "verify", False),
    ("sglang.srt.speculative.eagle_worker_v2", "EagleDraftWorker.draft", "draft", False),
    ("sglang.srt.speculative.eagle_worker_v2", "EAGLEWorkerV2.verify", "verify", False),
)
ENGINE_MODULE = "sglang.srt.entrypoints.engine"
ENGINE_ENTRY = "run_scheduler_process"


class SGLangMissing(RuntimeError):
    pass


def require_sglang():
    try:
        return importlib.import_module("sglang")
    except ImportError as e:
        raise SGLangMissing(
            f"sglang is not installed ({e}); install it on the GPU host (pip install 'sglang[all]'), "
            "or use --workload hf / synthetic") from None


def resolve(module: str, attr_path: str):
    """(owner, name, function) for ``module:attr_path``, imported now (lazily, at use)."""
    try:
        mod = importlib.import_module(module)
    except ImportError as e:
        raise SGLangMissing(f"cannot import {module} ({e}): is sglang installed?") from None
    owner = mod
    parts = attr_path.split(".")
    for p in parts[:-1]:
        owner = getattr(owner, p, None)
        if owner is None:
            raise AttributeError(f"{module}.{attr_path}: {p} not found (SGLang version differs from "
                                 f"{SGLANG_PINNED})")
    fn = getattr(owner, parts[-1], None)
    if fn is None:
        raise AttributeError(f"{module}.{attr_path} not found (SGLang version differs from {SGLANG_PINNED})")
    return owner, parts[-1], fn


def build_engine_kwargs(args) -> dict:
    """The ``sglang.Engine(**kwargs)`` (= ServerArgs fields) for our options."""
    kw = {
        "model_path": args.model_path,
        "tp_size": int(args.tp),
        "disable_cuda_graph": args.mode == "eager",
        "load_format": args.load_format,
        "dtype": args.dtype,
        "mem_fraction_static": args.mem_fraction_static,
        "random_seed": args.seed,
        "log_level": "error",
    }
    if args.mode == "compile":
        kw["enable_torch_compile"] = True
    if args.mode != "eager":
        kw["cuda_graph_max_bs"] = max(1, args.batch_size)
    if args.disable_overlap_schedule:
        kw["disable_overlap_schedule"] = True
    if args.spec:
        kw.update(
            speculative_algorithm=args.speculative_algorithm,
            speculative_num_steps=int(args.spec),
            speculative_eagle_topk=int(args.speculative_eagle_topk),
            speculative_num_draft_tokens=int(args.speculative_num_draft_tokens or args.spec + 1),
        )
        if args.speculative_draft_model_path:
            kw["speculative_draft_model_path"] = args.speculative_draft_model_path
        elif args.speculative_algorithm != "NEXTN":
            raise SystemExit("--spec with EAGLE/EAGLE3 needs --speculative-draft-model-path "
                             "(NEXTN uses the model's own MTP layers)")
    if args.attention_backend:
        kw["attention_backend"] = args.attention_backend
    return kw


def scheduler_config(args) -> dict:
    """What each scheduler process needs to know (passed through the environment)."""
    return {"profiler": args.profiler, "steps": args.steps, "timed_steps": args.timed_steps,
            "warmup": args.warmup, "facts_out": args.facts_out, "trace_out": args.trace_out,
            "mode": args.mode, "spec": args.spec or None, "tp": int(args.tp), "dtype": args.dtype,
            "batch_size": args.batch_size}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    _common.add_common_args(p)
    p.add_argument("--model-path", required=True)
    p.add_argument("--load-format", default="dummy", help="dummy = random weights, no download of weights")
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--input-len", type=int, default=256)
    p.add_argument("--mem-fraction-static", type=float, default=0.8)
    p.add_argument("--spec", type=int, default=0, help="speculative steps (draft tokens per step)")
    p.add_argument("--speculative-algorithm", choices=["EAGLE", "EAGLE3", "NEXTN"], default="EAGLE")
    p.add_argument("--speculative-draft-model-path", default=None)
    p.add_argument("--speculative-eagle-topk", type=int, default=1)
    p.add_argument("--speculative-num-draft-tokens", type=int, default=None)
    p.add_argument("--disable-overlap-schedule", action="store_true")
    p.add_argument("--attention-backend", default=None)
    return p.parse_args(argv)


# ------------------------------------------------------------------------------------------------
# inside each scheduler process
# ------------------------------------------------------------------------------------------------

class _StepController:
    """Counts decode batches; times, profiles and writes facts at the right ones."""

    def __init__(self, cfg: dict, rank: int):
        self.cfg = cfg
        self.rank = rank
        self.n = 0                       # decode batches seen
        self.events = []
        self.prof = None
        self.done = False
        w, t, s = cfg["warmup"], cfg["timed_steps"], cfg["steps"]
        self.t_begin, self.p_begin, self.p_end = w, w + t, w + t + s

    def before(self):
        i = self.n
        if not self.t_begin <= i <= self.p_begin:
            return
        import torch

        ev = torch.cuda.Event(enable_timing=True)   # the event at p_begin closes the last timed step
        ev.record()
        self.events.append(ev)
        if i == self.p_begin:
            torch.cuda.synchronize()
            if self.cfg["profiler"] == "nsys":
                torch.cuda.cudart().cudaProfilerStart()
            elif self.cfg["profiler"] == "torch":
                from torch.profiler import ProfilerActivity, profile

                self.prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True)
                self.prof.start()

    def after(self, scheduler):
        self.n += 1
        if self.n == self.p_end and not self.done:
            import torch

            self.done = True
            torch.cuda.synchronize()
            if self.cfg["profiler"] == "nsys":
                torch.cuda.cudart().cudaProfilerStop()
            elif self.prof is not None:
                self.prof.stop()
                out = self.cfg["trace_out"] or "trace.json.gz"
                if self.cfg["tp"] > 1:
                    out = out.replace(".json", f".rank{self.rank}.json")
                _export_gz(self.prof, out)
            if self.rank == 0:
                self.write_facts(scheduler)

    def write_facts(self, scheduler):
        import statistics

        periods = [a.elapsed_time(b) for a, b in zip(self.events, self.events[1:])]
        wb, draft_wb = _weight_bytes(scheduler)
        cfg = self.cfg
        spec = None
        per_gpu = None
        if wb is not None:
            per_gpu = wb + (draft_wb or 0) * (cfg["spec"] or 0)
        if cfg["spec"]:
            spec = {"draft_tokens": int(cfg["spec"]), "accept_len": _accept_len(scheduler)}
        sglang = importlib.import_module("sglang")
        facts = {
            "workload": "sglang", "mode": cfg["mode"], "steps": cfg["steps"],
            "gpu_name": _common.gpu_name("cuda"),
            "weight_bytes_per_step": None if per_gpu is None else int(per_gpu * cfg["tp"]),
            "weight_bytes_per_step_per_gpu": per_gpu,
            "dtype": cfg["dtype"], "tp": cfg["tp"], "spec": spec, "tokens_per_step": cfg["batch_size"],
            "unprofiled_step_ms": statistics.median(periods) if periods else None,
            "versions": _common.versions(f"sglang {getattr(sglang, '__version__', '?')}"),
            "unprofiled": {"n": len(periods), "method": "cuda-events at consecutive decode batches",
                           "min_ms": min(periods) if periods else None, "max_ms": max(periods) if periods else None},
            "sglang_pinned_source": SGLANG_PINNED,
        }
        with open(cfg["facts_out"] or "sglang_facts.json", "w") as f:
            json.dump(facts, f, indent=2)


def _export_gz(prof, out: str) -> None:
    import gzip
    import shutil

    raw = out[:-3] if out.endswith(".gz") else out
    prof.export_chrome_trace(raw)
    if out.endswith(".gz"):
        with open(raw, "rb") as a, gzip.open(out, "wb") as b:
            shutil.copyfileobj(a, b)
        os.remove(raw)


def _model_of(worker):
    for path in ("model_runner.model", "worker.model_runner.model", "draft_runner.model",
                 "draft_worker.model_runner.model"):
        obj = worker
        for p in path.split("."):
            obj = getattr(obj, p, None)
            if obj is None:
                break
        if obj is not None:
            return obj
    return None


def _param_bytes(model) -> int:
    """This rank's parameter bytes read per forward: all but the input embedding, unless tied."""
    seen, total = set(), 0
    named = list(model.named_parameters())
    head_ptrs = {p.data_ptr() for n, p in named if "lm_head" in n}
    for n, p in named:
        if p.data_ptr() in seen:
            continue
        seen.add(p.data_ptr())
        if "embed_tokens" in n and p.data_ptr() not in head_ptrs:
            continue
        total += p.numel() * p.element_size()
    return total


def _weight_bytes(scheduler):
    try:
        target = _model_of(getattr(scheduler, "tp_worker", None))
        draft = _model_of(getattr(scheduler, "draft_worker", None)) if getattr(scheduler, "draft_worker", None) else None
        return (_param_bytes(target) if target is not None else None,
                _param_bytes(draft) if draft is not None else None)
    except Exception:
        return None, None


def _accept_len(scheduler):
    for name in ("spec_num_total_accepted_tokens", "cum_spec_accept_length"):
        acc = getattr(scheduler, name, None)
        fw = getattr(scheduler, "spec_num_total_forward_ct", None) or getattr(scheduler, "cum_spec_accept_count", None)
        if acc and fw:
            return float(acc) / float(fw)
    return None


def _is_decode(batch) -> bool:
    fm = getattr(batch, "forward_mode", None)
    try:
        return bool(fm.is_decode())
    except Exception:
        return False


def install_patches(cfg: dict, rank: int) -> list[str]:
    """Wrap SGLang's functions with markers; returns the targets that were found."""
    ctl = _StepController(cfg, rank)
    found = []
    for module, attr, kind, required in PATCH_TARGETS:
        try:
            owner, name, fn = resolve(module, attr)
        except (AttributeError, SGLangMissing) as e:
            if required:
                raise
            print(f"[tracekit] skip {module}.{attr}: {e}", file=sys.stderr)
            continue
        setattr(owner, name, _wrap(fn, kind, ctl))
        found.append(f"{module}.{attr}")
    return found


def _wrap(fn, kind, ctl):
    import functools

    if kind == "step":
        @functools.wraps(fn)
        def run_batch(self, batch, *a, **k):
            if not _is_decode(batch):
                return fn(self, batch, *a, **k)
            ctl.before()
            with markers.step(ctl.n):
                out = fn(self, batch, *a, **k)
            ctl.after(self)
            return out
        return run_batch
    ctx = markers.draft if kind == "draft" else markers.verify

    @functools.wraps(fn)
    def marked(*a, **k):
        with ctx():
            return fn(*a, **k)
    return marked


def _scheduler_entry(server_args, port_args, gpu_id, tp_rank, *rest, **kw):
    """Replaces the engine's ``run_scheduler_process`` in each scheduler process."""
    cfg = json.loads(os.environ[ENV_CFG])
    install_patches(cfg, tp_rank)
    original = resolve("sglang.srt.managers.scheduler", ENGINE_ENTRY)[2]
    return original(server_args, port_args, gpu_id, tp_rank, *rest, **kw)


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        sglang = require_sglang()
        engine_mod = importlib.import_module(ENGINE_MODULE)
    except (SGLangMissing, ImportError) as e:
        print(f"sglang_decode: {e}", file=sys.stderr)
        return 2
    if not hasattr(engine_mod, ENGINE_ENTRY):
        print(f"sglang_decode: {ENGINE_MODULE}.{ENGINE_ENTRY} not found: this SGLang "
              f"({getattr(sglang, '__version__', '?')}) differs from {SGLANG_PINNED}", file=sys.stderr)
        return 2
    os.environ[ENV_CFG] = json.dumps(scheduler_config(args))
    setattr(engine_mod, ENGINE_ENTRY, _scheduler_entry)
    import random

    total = args.warmup + args.timed_steps + args.steps + 8
    rng = random.Random(args.seed)
    ids = [[rng.randrange(10, 20000) for _ in range(args.input_len)] for _ in range(args.batch_size)]
    engine = sglang.Engine(**build_engine_kwargs(args))
    try:
        engine.generate(input_ids=ids, sampling_params={"max_new_tokens": total, "ignore_eos": True,
                                                        "temperature": 0.0})
    finally:
        engine.shutdown()
    if args.facts_out and not os.path.exists(args.facts_out):
        print("sglang_decode: the scheduler wrote no facts (fewer decode batches than "
              "--warmup + --timed-steps + --steps?)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
