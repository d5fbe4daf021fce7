"""A serving-loop-shaped decode with the host stalls a real server has (pure torch, random weights).

    python capture/serve_decode.py --size small --mode eager|graph [--batch B] [--stall-ms 0.5] \
        [--no-markers] --profiler nsys|torch|none --steps 16 --facts-out facts.json

Shaped like SGLang's scheduler in its normal (non-overlap) loop, ``Scheduler.event_loop_normal``:
``recv_requests`` / ``get_next_batch_to_run`` (host work), ``run_batch`` (the forward), and
``process_batch_result`` (the sampled tokens read back with ``.tolist()``). One step, in order:

1. ``scheduler`` range: ~``--scheduler-ms`` of Python (batch bookkeeping), then the positions uploaded
   with a PAGEABLE host-to-device copy, ``torch.tensor(positions, device="cuda")``;
2. the forward of the target model (eager; or one CUDA graph in graph mode);
3. the INJECTED HOST STALL: the GPU drained (``torch.cuda.synchronize()``, as a CPU logits processor must
   wait for the logits), then ``--stall-ms`` of Python in a range named ``--stall-range`` (default
   ``grammar_mask``: a CPU grammar bitmask, as xgrammar fills one), then the bitmask copied to the GPU
   (pinned, non-blocking);
4. sampling launches: apply the bitmask, softmax, argmax (eager; or a second CUDA graph in graph mode:
   the GPU work in graphs, the host parts eager, as piecewise graphs leave them);
5. the token read, ``.tolist()`` (``process_batch_result``).

With ``--no-markers`` there are no ranges at all; the stall stays. The manifest records the stall's
range name, its target and measured durations, and the unprofiled step time (measured with markers off).

``--prefill-in-window`` (issue 24: a serving window that starts with a prefill): the requests arrive fresh
when profiling starts, so the FIRST profiled step is a prefill and the rest are decode steps. The prefill step
is shaped like SGLang's extend batch (``Scheduler.get_next_batch_to_run`` -> ``ScheduleBatch.prepare_for_extend``
-> ``run_batch``/``forward_extend`` -> ``process_batch_result_prefill``): the scheduler's Python work, the flat
prompt ids and the sequence lengths built on the host and copied with ``torch.tensor(...).to(device,
non_blocking=True)`` (as ``prepare_for_extend`` does), positions computed on the device, the target over the
``--prompt-len`` P tokens of each of the B sequences (GEMMs of B*P rows; causal attention over the P new
tokens; K/V written to the cache), logits of the last token only (``LogitsProcessor``), then the same stall,
bitmask and sampling as a decode step, and the token read. It runs EAGERLY in graph mode too (SGLang replays
CUDA graphs for decode batches only; extend runs eagerly unless piecewise graphs are on); the decode steps
after it replay their graphs. The manifest's ``phases`` lists each profiled step's phase in order
(``["prefill", "decode", ...]``), ``prefill`` has P, B and the unprofiled prefill step time, and
``unprofiled_step_ms`` stays the DECODE step (timed before profiling, from a random cache of P tokens).

The loop (warm-up, unprofiled timing, markers, profiler, facts) is ``capture/harness.py``'s; this file says what
one step does (``ServeDecode``: the decode step, and the prefill step the profiled window starts with); the
unprofiled prefill step is its extra timing ``prefill`` (``--prefill-timed-steps`` steps).
"""

from __future__ import annotations

import random
import statistics
import sys
import time
from collections import defaultdict

import _common
import harness
import llama_torch as lt

SCHEDULER_RANGE = "scheduler"
PREFILL_RANGE = "prefill"     # around the prefill forward (with markers only)


def busy_python(ms: float, state: list) -> int:
    """Pure-Python work (no torch call) for ``ms`` milliseconds; returns the iterations done.
    A toy grammar automaton walked over token ids: the kind of per-token CPU work a logits
    processor or a grammar matcher does."""
    deadline = time.perf_counter() + ms / 1e3
    it = 0
    s = state[0]
    while True:
        for tok in range(64):
            s = (s * 1103515245 + tok * 12345 + 1) & 0x7FFFFFFF
        it += 1
        if time.perf_counter() >= deadline:
            break
    state[0] = s
    return it


class ServeDecode(harness.Workload):
    """A serving-loop-shaped decode with the host stalls a real server has (pure torch, random weights)."""

    name = "serve"

    @classmethod
    def add_args(cls, p):
        p.add_argument("--size", choices=sorted(lt.SIZES), default="small")
        p.add_argument("--batch", type=int, default=1)
        p.add_argument("--prompt-len", type=int, default=128)
        p.add_argument("--dtype", choices=["bfloat16", "float16"], default="bfloat16")
        p.add_argument("--stall-ms", type=float, default=0.5, help="CPU work of the injected host stall, per step")
        p.add_argument("--stall-range", default="grammar_mask", help="range name around the injected stall")
        p.add_argument("--scheduler-ms", type=float, default=0.1, help="Python scheduler work per step")
        p.add_argument("--prefill-in-window", action="store_true",
                       help="the first profiled step is a prefill of --prompt-len tokens per sequence, then decode")
        p.add_argument("--prefill-timed-steps", type=int, default=5, help="unprofiled prefill steps timed (median)")

    @classmethod
    def check_args(cls, p, args):
        if args.mode == "compile":
            p.error("--mode compile: the serve workload runs eager or graph")

    def __init__(self, h):
        super().__init__(h)
        a = self.args
        # the ranges of a step (with markers on, profiled steps only): phase -> range name
        self.MARKERS = {"scheduler": SCHEDULER_RANGE, "stall": a.stall_range,
                        **({"prefill": PREFILL_RANGE} if a.prefill_in_window else {})}
        self.stall_ms: dict[str, list[float]] = defaultdict(list)     # per harness stage (timed, profiled, ...)
        self.sched_ms: dict[str, list[float]] = defaultdict(list)
        self.out_tokens: dict[str, list] = defaultdict(list)

    def build(self):
        torch, dev, args, cuda = self.torch, self.dev, self.args, self.cuda
        dtype = self.dtype = getattr(torch, args.dtype)
        cfg = self.cfg = lt.config(args.size)
        B, V = self.B, self.V = args.batch, cfg.vocab
        phase_len = max(args.timed_steps, args.steps, args.prefill_timed_steps) + args.warmup + 2
        window = self.window = lt.round_up(args.prompt_len + phase_len + 2, 64)
        _common.log(f"serve: {args.size} model ({cfg.layers} layers), batch {B}, mode {args.mode}, stall "
                    f"{args.stall_ms} ms in '{args.stall_range}', markers {'on' if self.h.markers_requested else 'off'}")
        target = self.target = lt.Target(cfg, dev, dtype, seed=args.seed)
        gen = self.gen = torch.Generator(device=dev)
        gen.manual_seed(args.seed + 2)
        cache = lt.KVCache(cfg, cfg.layers, B, window, dev, dtype, gen)

        tok = self.tok = torch.zeros(B, 1, dtype=torch.long, device=dev)
        lens = self.lens = torch.zeros(B, dtype=torch.long, device=dev)
        logits_buf = torch.zeros(B, V, dtype=dtype, device=dev)
        words = (V + 31) // 32
        self.host_mask = torch.full((B, words), -1, dtype=torch.int32, pin_memory=cuda)   # all tokens allowed
        dev_mask = self.dev_mask = torch.full((B, words), -1, dtype=torch.int32, device=dev)
        word_idx = torch.arange(V, device=dev) // 32
        bit_idx = (torch.arange(V, device=dev) % 32).to(torch.int32)

        def forward():
            pos = lens.view(B, 1)
            _, _, logits = target.forward(tok, pos, cache, pos, window, lengths=lens, logits_at="last")
            logits_buf.copy_(logits)

        def sample():
            allowed = (dev_mask[:, word_idx] >> bit_idx) & 1
            masked = logits_buf.masked_fill(allowed == 0, float("-inf"))
            probs = torch.softmax(masked.float(), dim=-1)
            tok.copy_(probs.argmax(dim=-1).view(B, 1))
            lens.add_(1)

        self.f_core, self.s_core = forward, sample
        self.graphs = None
        lens.fill_(args.prompt_len)
        if args.mode == "graph":
            pool = torch.cuda.graph_pool_handle()
            self.f_core = lt.graphed(forward, pool=pool)
            self.s_core = lt.graphed(sample, pool=pool)
            self.graphs = {"forward": 1, "sampling": 1, "per_step": 2}

        self.positions = [args.prompt_len] * B     # the scheduler's host-side view of each request
        self.state = [12345]
        P = args.prompt_len
        prompt_rng = random.Random(args.seed + 3)
        self.prompt_ids = [[prompt_rng.randrange(3, V) for _ in range(P)] for _ in range(B)]   # the requests' prompts
        prefill_pos = torch.arange(P, device=dev).view(1, P).expand(B, P)

        def prefill_forward(ids):
            _, _, logits = target.forward(ids, prefill_pos, cache, prefill_pos, None, logits_at="last")
            logits_buf.copy_(logits)

        self.prefill_forward = prefill_forward

    def reset(self):
        self.positions[:] = [self.args.prompt_len] * self.B
        self.lens.fill_(self.args.prompt_len)
        self.tok.copy_(self.torch.randint(3, self.V, (self.B, 1), device=self.dev, generator=self.gen))

    def _stall_and_sample(self, stage):
        """The injected stall (GPU drained, then CPU work in its range), the bitmask upload, the sampling launches
        and the token read (``process_batch_result``)."""
        h, args = self.h, self.args
        if self.cuda:
            self.torch.cuda.synchronize()                    # the GPU drained before the CPU work
        t1 = time.perf_counter()
        with h.phase("stall"):
            busy_python(args.stall_ms, self.state)
            self.host_mask[:, 0] = -1 ^ (1 << (self.state[0] % 3))   # ban one of tokens 0..2 (never sampled anyway)
        self.stall_ms[stage].append((time.perf_counter() - t1) * 1e3)
        self.dev_mask.copy_(self.host_mask, non_blocking=True)
        self.s_core()
        return self.tok.view(-1).tolist()                   # tokens to the host

    def step(self, i):
        stage, args = self.h.stage, self.args
        if args.prefill_in_window and stage == "profiled" and i == args.timed_steps:
            return self.prefill_step(i)                      # the profiled window starts with the prefill
        t0 = time.perf_counter()
        with self.h.phase("scheduler"):
            busy_python(args.scheduler_ms, self.state)
            pos_t = self.torch.tensor(self.positions, device=self.dev)   # pageable host-to-device copy
        self.sched_ms[stage].append((time.perf_counter() - t0) * 1e3)
        self.lens.copy_(pos_t)
        self.f_core()
        toks = self._stall_and_sample(stage)
        for b in range(self.B):
            self.positions[b] += 1
        self.out_tokens[stage].append(toks)

    def prefill_step(self, i):
        """One extend batch of the B fresh requests (see the module docstring), then sampling as in decode."""
        torch, dev, stage, B, P = self.torch, self.dev, self.h.stage, self.B, self.args.prompt_len
        if stage == "profiled":
            self.positions[:] = [0] * B      # fresh requests: nothing cached yet; this step prefills them
        t0 = time.perf_counter()
        with self.h.phase("scheduler"):
            busy_python(self.args.scheduler_ms, self.state)
            flat = [t for ids in self.prompt_ids for t in ids]                       # prepare_for_extend
            input_ids = torch.tensor(flat, dtype=torch.int64).to(dev, non_blocking=True)
            seq_lens = torch.tensor([P] * B, dtype=torch.int64).to(dev, non_blocking=True)
        self.sched_ms[stage].append((time.perf_counter() - t0) * 1e3)
        self.lens.copy_(seq_lens)
        with self.h.phase("prefill"):
            self.prefill_forward(input_ids.view(B, P))
        toks = self._stall_and_sample(stage)                                         # process_batch_result_prefill
        for b in range(B):
            self.positions[b] = P
        self.out_tokens[stage].append(toks)

    def extra_timings(self):
        a = self.args
        return {"prefill": (self.prefill_step, a.prefill_timed_steps)} if a.prefill_in_window else {}

    def contract(self):
        return {"weight_bytes": self.target.step_bytes()["bytes"], "tokens_per_step": self.B}

    def facts(self, run):
        args, cfg, B, P = self.args, self.cfg, self.B, self.args.prompt_len
        tb = self.target.step_bytes()
        on = self.h.markers_requested
        stall_timed, sched_timed, stall_prof = self.stall_ms["timed"], self.sched_ms["timed"], self.stall_ms["profiled"]
        _common.log(f"serve: stall median {statistics.median(stall_timed):.3f} ms, scheduler "
                    f"{statistics.median(sched_timed):.3f} ms (timed steps)")

        def stats(v):
            return {"median_ms": round(statistics.median(v), 6), "min_ms": round(min(v), 6),
                    "max_ms": round(max(v), 6), "n": len(v)} if v else None

        facts = {
            "model": {"arch": "llama (plain torch, fused qkv/gate_up)", "size": args.size, "params": tb["params"],
                      "weight_bytes": tb["bytes"], "embedding_bytes": tb["embedding_bytes"],
                      "tied_embeddings": tb["tied"], "layers": cfg.layers, "hidden": cfg.hidden, "vocab": self.V,
                      "prompt_len": P, "batch": B},
            "kv": {"kv_bytes_per_token": cfg.kv_bytes_per_token(self.dtype.itemsize),
                   "attention_window_tokens": self.window},
            "serve": {
                "injected_stall": {"range": args.stall_range if on else None,
                                   "range_name": args.stall_range, "target_ms": args.stall_ms,
                                   "measured_timed": stats(stall_timed), "measured_profiled": stats(stall_prof),
                                   "where": "after the forward: torch.cuda.synchronize() (GPU drained), then "
                                            "the CPU work, then the bitmask copy and the sampling launches"},
                "scheduler": {"range": SCHEDULER_RANGE if on else None, "target_ms": args.scheduler_ms,
                              "measured_timed": stats(sched_timed),
                              "includes": "Python work + a pageable torch.tensor(..., device='cuda') copy"},
                "order": ["scheduler (python + pageable H2D)", "forward", "synchronize", "stall (python)",
                          "bitmask H2D (pinned)", "sampling", "token read (.tolist())"],
                "host_syncs_per_step": 3,
                "pageable_h2d_per_step": 1,
            },
            "graphs": self.graphs,
            "tokens_head": list(self.out_tokens["timed"][:8]),
        }
        if args.prefill_in_window:
            prefill_timing = run["extra"]["prefill"]
            facts["phases"] = ["prefill"] + ["decode"] * (args.steps - 1)    # each profiled step's phase
            facts["speculative"] = False
            facts["prefill"] = {
                "step_index": args.timed_steps, "profiled_step": 0, "prompt_len": P, "batch": B, "tokens": B * P,
                "unprofiled_prefill_step_ms": round(prefill_timing["median_ms"], 6),
                "unprofiled_prefill": prefill_timing,
                "mode": "eager (also in graph mode: SGLang graphs decode batches only)",
                "attention": "causal SDPA over the P new tokens (enable_gqa), K/V written to cache slots 0..P-1",
                "logits": "last token of each sequence", "range": PREFILL_RANGE if on else None,
                "host_to_device": "flat prompt ids and seq_lens: torch.tensor(...).to(device, non_blocking=True)",
            }
            facts["decode_steps_profiled"] = args.steps - 1
        return facts


def main(argv=None) -> int:
    return harness.run(ServeDecode, argv)


if __name__ == "__main__":
    sys.exit(main())
