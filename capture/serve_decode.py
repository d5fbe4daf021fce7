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
range name, its target and measured durations, and the unprofiled step time.

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
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import _common
import llama_torch as lt
import markers

SCHEDULER_RANGE = "scheduler"
PREFILL_RANGE = "prefill"     # around the prefill forward (with markers only)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    _common.add_common_args(p)
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
    args = p.parse_args(argv)
    if args.mode == "compile":
        p.error("--mode compile: the serve workload runs eager or graph")
    _common.apply_marker_flag(args)
    return args


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


def main(argv=None) -> int:
    args = parse_args(argv)
    torch, dev, cuda = _common.torch_device(args)
    dtype = getattr(torch, args.dtype)
    cfg = lt.config(args.size)
    B, V = args.batch, cfg.vocab
    phase_len = max(args.timed_steps, args.steps, args.prefill_timed_steps) + args.warmup + 2
    window = lt.round_up(args.prompt_len + phase_len + 2, 64)
    _common.log(f"serve: {args.size} model ({cfg.layers} layers), batch {B}, mode {args.mode}, stall "
                f"{args.stall_ms} ms in '{args.stall_range}', markers {'on' if markers.enabled() else 'off'}")
    target = lt.Target(cfg, dev, dtype, seed=args.seed)
    gen = torch.Generator(device=dev)
    gen.manual_seed(args.seed + 2)
    cache = lt.KVCache(cfg, cfg.layers, B, window, dev, dtype, gen)
    tb = target.step_bytes()

    tok = torch.zeros(B, 1, dtype=torch.long, device=dev)
    lens = torch.zeros(B, dtype=torch.long, device=dev)
    logits_buf = torch.zeros(B, V, dtype=dtype, device=dev)
    words = (V + 31) // 32
    host_mask = torch.full((B, words), -1, dtype=torch.int32, pin_memory=cuda)   # all tokens allowed
    dev_mask = torch.full((B, words), -1, dtype=torch.int32, device=dev)
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

    f_core, s_core = forward, sample
    graphs = None
    lens.fill_(args.prompt_len)
    if args.mode == "graph":
        pool = torch.cuda.graph_pool_handle()
        f_core = lt.graphed(forward, pool=pool)
        s_core = lt.graphed(sample, pool=pool)
        graphs = {"forward": 1, "sampling": 1, "per_step": 2}

    positions = [args.prompt_len] * B          # the scheduler's host-side view of each request
    state = [12345]
    stall_ms: list[float] = []
    sched_ms: list[float] = []
    out_tokens: list = []

    def step(i):
        t0 = time.perf_counter()
        with markers.range_(SCHEDULER_RANGE):
            busy_python(args.scheduler_ms, state)
            pos_t = torch.tensor(positions, device=dev)       # pageable host-to-device copy
        sched_ms.append((time.perf_counter() - t0) * 1e3)
        lens.copy_(pos_t)
        f_core()
        if cuda:
            torch.cuda.synchronize()                          # the GPU drained before the CPU work
        t1 = time.perf_counter()
        with markers.range_(args.stall_range):
            busy_python(args.stall_ms, state)
            host_mask[:, 0] = -1 ^ (1 << (state[0] % 3))     # ban one of tokens 0..2 (never sampled anyway)
        stall_ms.append((time.perf_counter() - t1) * 1e3)
        dev_mask.copy_(host_mask, non_blocking=True)
        s_core()
        toks = tok.view(-1).tolist()                          # process_batch_result: tokens to the host
        for b in range(B):
            positions[b] += 1
        out_tokens.append(toks)

    P = args.prompt_len
    prompt_rng = __import__("random").Random(args.seed + 3)
    prompt_ids = [[prompt_rng.randrange(3, V) for _ in range(P)] for _ in range(B)]   # the requests' prompts
    prefill_pos = torch.arange(P, device=dev).view(1, P).expand(B, P)

    def prefill_forward(ids):
        _, _, logits = target.forward(ids, prefill_pos, cache, prefill_pos, None, logits_at="last")
        logits_buf.copy_(logits)

    def prefill_step(i):
        """One extend batch of the B fresh requests (see the module docstring), then sampling as in decode."""
        t0 = time.perf_counter()
        with markers.range_(SCHEDULER_RANGE):
            busy_python(args.scheduler_ms, state)
            flat = [t for ids in prompt_ids for t in ids]                        # prepare_for_extend
            input_ids = torch.tensor(flat, dtype=torch.int64).to(dev, non_blocking=True)
            seq_lens = torch.tensor([P] * B, dtype=torch.int64).to(dev, non_blocking=True)
        sched_ms.append((time.perf_counter() - t0) * 1e3)
        lens.copy_(seq_lens)
        with markers.range_(PREFILL_RANGE):
            prefill_forward(input_ids.view(B, P))
        if cuda:
            torch.cuda.synchronize()
        t1 = time.perf_counter()
        with markers.range_(args.stall_range):
            busy_python(args.stall_ms, state)
            host_mask[:, 0] = -1 ^ (1 << (state[0] % 3))
        stall_ms.append((time.perf_counter() - t1) * 1e3)
        dev_mask.copy_(host_mask, non_blocking=True)
        s_core()
        toks = tok.view(-1).tolist()                                             # process_batch_result_prefill
        for b in range(B):
            positions[b] = P
        out_tokens.append(toks)

    def reset():
        positions[:] = [args.prompt_len] * B
        lens.fill_(args.prompt_len)
        tok.copy_(torch.randint(3, V, (B, 1), device=dev, generator=gen))
        stall_ms.clear()
        sched_ms.clear()
        out_tokens.clear()

    reset()
    for i in range(args.warmup):
        step(-1 - i)
    _common.sync(dev)
    reset()
    timing = _common.time_steps(step, args.timed_steps, dev, start_index=0)
    stall_timed, sched_timed = list(stall_ms), list(sched_ms)
    head = list(out_tokens[:8])
    _common.log(f"unprofiled step: median {timing['median_ms']:.3f} ms; stall median "
                f"{statistics.median(stall_timed):.3f} ms, scheduler {statistics.median(sched_timed):.3f} ms")
    prefill_timing = None
    if args.prefill_in_window:
        prefill_timing = _common.time_steps(prefill_step, args.prefill_timed_steps, dev, start_index=0)
        _common.log(f"unprofiled prefill step ({B} x {P} tokens): median {prefill_timing['median_ms']:.3f} ms")
    reset()
    first = args.timed_steps
    phases = ["decode"] * args.steps
    window_step = step
    if args.prefill_in_window:
        positions[:] = [0] * B        # fresh requests: nothing cached yet; the first profiled step prefills them
        phases[0] = "prefill"

        def window_step(i):
            (prefill_step if i == first else step)(i)
    prof = _common.profiled_phase(window_step, args, start_index=first)
    stall_prof = list(stall_ms)

    def stats(v):
        return {"median_ms": round(statistics.median(v), 6), "min_ms": round(min(v), 6),
                "max_ms": round(max(v), 6), "n": len(v)} if v else None

    facts = {
        **_common.contract_facts("serve", args, dev, weight_bytes=tb["bytes"], tokens_per_step=B, timing=timing),
        "model": {"arch": "llama (plain torch, fused qkv/gate_up)", "size": args.size, "params": tb["params"],
                  "weight_bytes": tb["bytes"], "embedding_bytes": tb["embedding_bytes"],
                  "tied_embeddings": tb["tied"], "layers": cfg.layers, "hidden": cfg.hidden, "vocab": V,
                  "prompt_len": args.prompt_len, "batch": B},
        "kv": {"kv_bytes_per_token": cfg.kv_bytes_per_token(dtype.itemsize), "attention_window_tokens": window},
        "serve": {
            "injected_stall": {"range": args.stall_range if markers.enabled() else None,
                               "range_name": args.stall_range, "target_ms": args.stall_ms,
                               "measured_timed": stats(stall_timed), "measured_profiled": stats(stall_prof),
                               "where": "after the forward: torch.cuda.synchronize() (GPU drained), then "
                                        "the CPU work, then the bitmask copy and the sampling launches"},
            "scheduler": {"range": SCHEDULER_RANGE if markers.enabled() else None, "target_ms": args.scheduler_ms,
                          "measured_timed": stats(sched_timed),
                          "includes": "Python work + a pageable torch.tensor(..., device='cuda') copy"},
            "order": ["scheduler (python + pageable H2D)", "forward", "synchronize", "stall (python)",
                      "bitmask H2D (pinned)", "sampling", "token read (.tolist())"],
            "host_syncs_per_step": 3,
            "pageable_h2d_per_step": 1,
        },
        "graphs": graphs,
        "markers": ({"step": "decode_step <i>", "scheduler": SCHEDULER_RANGE, "stall": args.stall_range,
                     **({"prefill": PREFILL_RANGE} if args.prefill_in_window else {})}
                    if markers.enabled() else None),
        "unprofiled": timing,
        "profiled": prof,
        "nvtx_backend": markers.nvtx_backend_name() if markers.enabled() else None,
        "tokens_head": head,
    }
    if args.prefill_in_window:
        facts["phases"] = phases
        facts["speculative"] = False
        facts["prefill"] = {
            "step_index": first, "profiled_step": 0, "prompt_len": P, "batch": B, "tokens": B * P,
            "unprofiled_prefill_step_ms": round(prefill_timing["median_ms"], 6), "unprofiled_prefill": prefill_timing,
            "mode": "eager (also in graph mode: SGLang graphs decode batches only)",
            "attention": "causal SDPA over the P new tokens (enable_gqa), K/V written to cache slots 0..P-1",
            "logits": "last token of each sequence", "range": PREFILL_RANGE if markers.enabled() else None,
            "host_to_device": "flat prompt ids and seq_lens: torch.tensor(...).to(device, non_blocking=True)",
        }
        facts["decode_steps_profiled"] = args.steps - 1
    _common.write_facts(args, facts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
