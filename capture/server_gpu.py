"""GPU validation of ``tracekit capture --server``: the SGLang TEST SERVER (``tests/servers/sglang.py``, SGLang's
HTTP API as its source defines it; NOT SGLang) in front of a REAL speculative decode loop on the GPU, captured by
the real client, compared with the loop's own measurement in the same process.

    PYTHONPATH=. python3 capture/server_gpu.py --size small --mode graph --spec 3 --accept-pattern 1,2,0,3 \\
        --steps 20 --decode-tokens 121 --out "$OUT"          # -> $OUT/server_gpu_small.tar.gz

1. ``capture/spec_decode.py`` builds its SGLang-shaped EAGLE loop on ``capture/harness.py`` (draft graph, verify,
   acceptance with a host read, draft-extend; ``--engine-spans sglang-v1 --no-markers``: only
   ``step[TARGET_VERIFY bs=N]`` around the verify, the draft and draft-extend replays unspanned, as SGLang's EAGLE
   v1 writes them, and no markers of ours; ``--accept-pattern``: a known acceptance, 1, 2, 0, 3 drafts in turn =
   2.5 tokens per step, from the first step of each request; 121 tokens = the first + 12 whole cycles, so no
   request ends inside a cycle), warms up and measures the loop's own unprofiled step (CUDA events, median) and
   acceptance length; the harness then hands the loop to ``serve`` (``spec_decode.main(argv, serve=...)``)
   instead of its own profiled phase.
2. The loop becomes the test server's engine: each ``/generate`` request is a sequence of the loop's batch
   (``--batch`` = ``--concurrency``; a round starts when the batch is free: the loop resets, and its random
   "prefilled" cache stands for the prefill), one streamed chunk per step with that step's accepted tokens,
   ``meta_info.spec_verify_ct`` = the steps. ``/start_profile`` starts ``torch.profiler`` (CPU + CUDA, stacks and
   shapes as asked; the engine span on only while it records: ``Loop.decorate``) in the loop's thread between two
   steps, SGLang's ``num_steps`` auto-stop applies, and the stop exports ``{profile_id}-TP-0.trace.json.gz`` into
   ``output_dir``. The loop runs in the main thread; the HTTP server in threads.
3. ``python -m tracekit capture --server http://127.0.0.1:PORT --out DIR --no-analyse`` runs as a separate
   process (the GPU host has no polars; analyse DIR later: ``tracekit breakdown DIR``).
4. ``server_gpu_<size>_result.json``: the loop's own step and acceptance (before the capture and again after
   it), the manifest's, their ratios and whether each is within 5% (issue 43's targets); it and DIR are packed into
   ``$OUT/server_gpu_<size>.tar.gz`` (``server_gpu_<size>/`` = the traces + ``manifest.json``).

``--size small``: the server's model path is the small model's real safetensors headers
(``tests/data/h200_checkpoints/bf16``, made by ``capture/save_checkpoint.py`` from this loop's model: sparse files,
headers only), so the manifest's weight bytes come from the model's files; SGLang counts
``speculative_num_steps`` (= K) draft forwards per step where this loop runs K + 1 (its draft graph holds K, the
extend one more; SGLang's holds K - 1): the manifest's bytes are one draft forward short of the loop's, and the
result says so. On a CPU (``--device cpu --mode eager --size tiny``) it runs as a smoke test.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

from tests.servers.common import Scheduler, TestServer  # noqa: E402
from tests.servers.sglang import SGLangApp  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", default="small", help="spec_decode.py --size (tiny|small|large)")
    p.add_argument("--mode", default="graph", choices=["eager", "graph"])
    p.add_argument("--spec", type=int, default=3, help="K draft tokens per step")
    p.add_argument("--accept-pattern", default="1,2,0,3", help="accepted drafts per step, in turn (spec_decode.py)")
    p.add_argument("--accept-prob", type=float, default=None,
                   help="instead of the pattern: each draft token accepted with this probability (sampling noise!)")
    p.add_argument("--concurrency", type=int, default=1, help="streamed requests in flight = the loop's batch")
    p.add_argument("--steps", type=int, default=20, help="profiled steps (the client's --steps)")
    p.add_argument("--decode-tokens", type=int, default=121)
    p.add_argument("--prompt-tokens", type=int, default=128, help="the loop's cached tokens per sequence")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--timed-steps", type=int, default=300,
                   help="the loop's own timed steps (also sizes its KV window: a request may run this many steps)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", default=os.environ.get("OUT", "."), help="where the tarball goes")
    p.add_argument("--keep", default=None, help="keep the capture folder here too")
    return p.parse_args(argv)


class LoopScheduler(Scheduler):
    """The test server's engine: the speculative loop (``harness.Loop``; ``loop.wl`` the workload). A round = the
    requests admitted together, one per batch slot; each decode step is one ``step`` of the workload, and each
    request gets its slot's accepted drafts + 1."""

    speculative = True

    def __init__(self, loop):
        wl = loop.wl
        super().__init__(max_batch=wl.B, admit_when_idle=True, admit_wait_s=0.05 if wl.B > 1 else 0.0)
        self.loop, self.wl, self.i, self.in_round = loop, wl, 0, 0
        # steps a round may take before the KV window is full (positions grow by at most K + 1 a step)
        self.capacity = max(1, (wl.window - loop.args.prompt_len) // (wl.K + 1) - 2)
        self.capped = 0

    def prefill(self, reqs):
        self.wl.reset()
        self.loop.accepted = []
        for slot, r in enumerate(reqs):
            r.slot = slot
        self.in_round = 0

    def decode(self, reqs):
        self.wl.step(self.i)
        self.i += 1
        self.in_round += 1
        acc = self.loop.accepted[-1]              # this step's accepted drafts, one per sequence
        if self.in_round >= self.capacity:    # the window is full: end the round (never reached at the defaults)
            self.capped += 1
            return [r.max_tokens for r in reqs]
        return [acc[r.slot] + 1 for r in reqs]


class TorchProfiler:
    """The test server's profiler backend on the GPU: ``torch.profiler`` started and stopped in the loop's thread,
    exported as SGLang does (``export_chrome_trace`` to ``...trace.json.gz``)."""

    def __init__(self, loop):
        self.loop, self.prof, self.options = loop, None, {}

    def start(self, activities, with_stack, record_shapes):
        torch = self.loop.torch
        acts = [torch.profiler.ProfilerActivity.CPU]
        if self.loop.cuda and "GPU" in activities:
            acts.append(torch.profiler.ProfilerActivity.CUDA)
        self.options = {"activities": activities, "with_stack": with_stack, "record_shapes": record_shapes}
        self.prof = torch.profiler.profile(activities=acts, with_stack=with_stack, record_shapes=record_shapes)
        self.prof.start()
        self.loop.decorate(True)      # the engine spans (step[TARGET_VERIFY bs=N]) while it records

    def export(self, paths):
        self.loop.decorate(False)
        if self.loop.cuda:
            self.loop.torch.cuda.synchronize()
        self.prof.stop()
        for p in paths:   # one rank
            raw = str(p)[:-3]
            self.prof.export_chrome_trace(raw)
            with open(raw, "rb") as f_in, gzip.open(p, "wb", compresslevel=6) as f_out:
                shutil.copyfileobj(f_in, f_out)
            os.remove(raw)
        self.prof = None


def model_dir(size: str, tmp: Path) -> str:
    """The small model's checkpoint headers (sparse files), else a name that is no path (no weight bytes)."""
    if size == "small":
        sys.path.insert(0, str(ROOT / "tests" / "data" / "h200_checkpoints"))
        from materialize import materialize

        return str(materialize("bf16", tmp))
    return f"spec-decode-{size} (random weights, no files)"


def main(argv=None) -> int:
    a = parse_args(argv)
    import spec_decode  # capture/spec_decode.py

    tmp = Path(tempfile.mkdtemp(prefix="server_gpu_"))
    capdir = tmp / f"server_gpu_{a.size}"
    result: dict = {}

    def serve(loop):
        sched = LoopScheduler(loop)
        backend = TorchProfiler(loop)
        K, B = loop.wl.K, loop.wl.B
        app = SGLangApp(sched=sched, backend=backend, model_path=model_dir(a.size, tmp),
                        speculative={"speculative_algorithm": "EAGLE", "speculative_num_steps": K,
                                     "speculative_eagle_topk": 1, "speculative_num_draft_tokens": K + 1},
                        extra_args={"disable_cuda_graph": a.mode != "graph", "dtype": "bfloat16",
                                    "cuda_graph_max_bs": B})
        srv = TestServer(app).start()
        cmd = [sys.executable, "-m", "tracekit", "capture", "--server", srv.url, "--out", str(capdir),
               "--steps", str(a.steps), "--concurrency", str(a.concurrency), "--decode-tokens", str(a.decode_tokens),
               "--prompt-tokens", str(a.prompt_tokens), "--repeats", str(a.repeats), "--no-analyse",
               "--settle", "1"]
        print("[server_gpu] " + " ".join(cmd), flush=True)
        t0 = time.time()
        client = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
        try:
            sched.run(until=lambda: client.poll() is not None)   # the loop, in this (the main) thread
        finally:
            if client.poll() is None:
                client.terminate()
            srv.httpd.shutdown()
            srv.httpd.server_close()
            if backend.prof is not None:      # a capture that never stopped its profile: stop it, export nothing
                loop.decorate(False)
                backend.prof.stop()
                backend.prof = None
        rc = client.wait()
        # the loop's own step again, after the capture (same process, same GPU): drift shows here
        after, acc_after = loop.measure(min(200, a.timed_steps))
        result.update(client_rc=rc, client_s=round(time.time() - t0, 1), capped_rounds=sched.capped,
                      profiler_options=backend.options,
                      loop={"unprofiled_step_ms": round(loop.timing["median_ms"], 6), "timing": loop.timing,
                            "accept_len": None if loop.accept_len is None else round(loop.accept_len, 4),
                            "after_capture": {"unprofiled_step_ms": round(after["median_ms"], 6),
                                              "accept_len": None if acc_after is None else round(acc_after, 4)},
                            "weight_bytes_per_step": loop.contract["weight_bytes"],
                            "draft_forwards_per_step": K + 1},
                      device=(loop.torch.cuda.get_device_name(0) if loop.cuda else "cpu"),
                      torch=loop.torch.__version__)
        return rc

    spec_args = ["--size", a.size, "--mode", a.mode, "--spec", str(a.spec), "--batch", str(a.concurrency),
                 *(["--accept-prob", str(a.accept_prob)] if a.accept_prob is not None
                   else ["--accept-pattern", a.accept_pattern]),
                 "--engine-spans", "sglang-v1", "--no-markers", "--timed-steps", str(a.timed_steps),
                 "--prompt-len", str(a.prompt_tokens), "--device", a.device, "--profiler", "none", "--no-probes"]
    rc = spec_decode.main(spec_args, serve=serve)
    mpath = capdir / "manifest.json"
    if mpath.is_file():
        m = json.loads(mpath.read_text())
        loop = result["loop"]
        ms, acc = m["unprofiled_step_ms"], (m.get("spec") or {}).get("accept_len")
        result["manifest"] = {k: m.get(k) for k in ("unprofiled_step_ms", "unprofiled_step_ms_spread", "spec", "tp",
                                                     "tokens_per_step", "weight_bytes_per_step", "trace_files")}
        result["step_ratio"] = round(ms / loop["unprofiled_step_ms"], 4)
        result["accept_ratio"] = round(acc / loop["accept_len"], 4) if acc and loop["accept_len"] else None
        result["within_5pct"] = {"step": abs(result["step_ratio"] - 1) <= 0.05,
                                 "accept_len": result["accept_ratio"] is not None
                                 and abs(result["accept_ratio"] - 1) <= 0.05}
        result["note"] = ("manifest weight bytes count speculative_num_steps (K) draft forwards per step, as "
                          "SGLang's EAGLE runs them; this loop runs K + 1 (its draft graph holds K forwards)")
        (tmp / f"server_gpu_{a.size}_result.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    brief = {**result, "loop": {k: v for k, v in (result.get("loop") or {}).items() if k != "timing"}}
    print("[server_gpu] RESULT " + json.dumps(brief, default=str), flush=True)   # the step periods: in the file
    if capdir.is_dir():
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        tar = out / f"server_gpu_{a.size}.tar.gz"
        with tarfile.open(tar, "w:gz") as t:
            t.add(capdir, arcname=capdir.name)
            res = tmp / f"server_gpu_{a.size}_result.json"
            if res.is_file():
                t.add(res, arcname=res.name)
        print(f"[server_gpu] wrote {tar} ({tar.stat().st_size} bytes)", flush=True)
        if a.keep:
            shutil.copytree(capdir, Path(a.keep) / capdir.name, dirs_exist_ok=True)
    shutil.rmtree(tmp, ignore_errors=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
