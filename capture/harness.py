"""The one loop harness of the decode workloads: warm-up, unprofiled timing, markers, engine spans, profiler
start/stop, the per-phase truth and the facts file, around a workload that only says what one step does.

Workloads on it (each file says what one step does; the loop is this file's): ``capture/spec_decode.py`` (EAGLE/NEXTN
shaped speculative decoding), ``capture/zoo.py`` (the engine-shaped speculative loops), ``capture/kv_decode.py``,
``capture/lora_decode.py``, ``capture/moe_decode.py``, ``capture/serve_decode.py``, ``capture/sp_decode.py`` and
``capture/hf_decode.py`` (also under torchrun, ``--tp N``). Not on it: ``capture/sglang_decode.py`` (a real SGLang
engine runs its own loop) and ``capture/synthetic.py`` (the calibration loop); ``capture/tp.py`` is the tensor-parallel
helpers, no workload.

A workload subclasses :class:`Workload` and supplies

* ``name`` (the manifest's ``workload``), ``PHASES`` (the parts of a step, in order; none: no per-phase truth),
  ``MARKERS`` (phase -> the marker range it gets with markers on: ``draft``, ``verify``, ``draft_extend``...),
  ``SPANS`` (engine dialect -> ``{site: span name template}``: what an engine writes, e.g.
  ``{"verify": "step[TARGET_VERIFY bs={B}]"}``);
* ``add_args(parser)``, ``build()`` (models, caches, CUDA graphs), ``reset()`` (back to the start state),
  ``step(i)`` (one speculative -- or plain -- decode step, host reads included), ``contract()`` (weight
  bytes per step, tokens per step, the ``spec`` draft tokens; optionally ``tp`` and ``framework``) and
  ``facts(run)`` (its own manifest keys, after the profiled steps);
* optionally ``plain_step(i)`` (a speculative workload's target decoding one token per sequence, same mode, with
  its own sampling and host read; a workload without one has no plain timing), ``extra_timings()``, ``probes()``,
  ``drain()`` (an overlapped loop's last deferred host read), and for several processes (``--tp``):
  ``setup(args)`` (join the process group, point ``--device`` and the output files at this rank: before the
  device is picked), ``barrier()`` (all ranks' timed and profiled windows start and stop together) and
  ``close()`` (after the facts are written: leave the process group).

Inside ``step`` a workload wraps each part in ``self.h.phase(name)`` (per-phase CUDA events while the truth is
measured; the phase's marker range while profiling with markers) and each place an engine writes a span in
``self.h.span(site)`` (a ``record_function`` range named as the chosen ``--engine-spans`` dialect names that
site; nothing for a site the dialect leaves out). Adding an engine's spans to a workload is one ``SPANS`` entry.
``self.h.stage`` says which run a step belongs to (``warmup``, ``timed``, ``plain``, ``phases``, ``extra:<name>``,
``profiled``), for a workload that records something of some runs only (tokens, stall times).
``engine_class(path, name, methods)`` makes a class named like an engine's whose frames carry the engine's file
path, so ``torch.profiler(with_stack=True)`` records e.g. ``sglang/srt/speculative/eagle_worker.py(5): draft``.

What the harness runs, in one process (``run``):

1. ``build``; warm-up: ``--warmup`` steps, each followed by a plain step where the workload has one (CUDA graphs
   captured, Triton kernels compiled);
2. unprofiled, markers and spans off: ``--timed-steps`` steps (``unprofiled``: period of each step from CUDA
   events at step starts -- median, mean, min, max, p10, p90), the same number of plain steps
   (``unprofiled_plain``; only a workload with a plain step), then again steps with an event at every phase start
   (``unprofiled_phases_ms``: median per phase, a phase running to the next one's start; only a workload with
   ``PHASES``), the workload's extra timings (``--timed-steps`` calls each, or the count it gives) and probes;
   the accepted draft tokens of the timed steps give ``spec.accept_len``; the workload is reset before each run;
3. profiled: ``--steps`` steps between ``cudaProfilerStart/Stop`` (nsys ``--capture-range=cudaProfilerApi``) or
   under ``torch.profiler`` (``record_shapes``; ``--with-stack`` adds Python frames), each wrapped in
   ``decode_step <i>`` and its phases in their marker ranges unless ``--no-markers``, the engine's spans with
   ``--engine-spans``;
4. the facts (``_common.contract_facts`` + the harness' keys + the workload's) to ``--facts-out``.

``run(cls, argv, serve=fn)`` (the server validation, ``capture/server_gpu.py``): after warm-up and the timed spec
steps of 2., ``fn(loop)`` gets the :class:`Loop` (``loop.timing``, ``loop.accept_len``, ``loop.contract``,
``loop.wl``; :meth:`Loop.measure` times more steps, :meth:`Loop.decorate` turns markers and spans on while its
profiler records) and its result is returned instead of the rest of 2., 3. and 4.

Only torch is needed (no polars, no tracekit); modules are imported as top-level names (``capture/__init__.py``
puts this folder on ``sys.path`` for package imports).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time

import _common
import markers

FRAMES_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "engine_frames")


def engine_class(path: str, name: str, methods: tuple[str, ...]):
    """A class ``name`` whose ``methods`` delegate to ``self.impl``, compiled with the file name
    ``FRAMES_DIR/path`` (no such file exists; only the frames' text matters). With ``FRAMES_DIR`` on ``sys.path``
    (``Loop`` puts it there before a ``--with-stack`` profile), the torch profiler strips that prefix and records
    ``<path>(<line>): <method>``, the frame an engine's own worker leaves."""
    lines = [f"class {name}:", "    def __init__(self, impl):", "        self.impl = impl"]
    for m in methods:
        lines += [f"    def {m}(self, *args, **kwargs):", f"        return self.impl.{m}(*args, **kwargs)"]
    ns: dict = {}
    exec(compile("\n".join(lines) + "\n", os.path.join(FRAMES_DIR, path), "exec"), ns)  # noqa: S102
    return ns[name]


class Workload:
    """What one decode loop does; the harness does the rest (see the module docstring)."""

    name = "workload"
    PHASES: tuple[str, ...] = ()
    MARKERS: dict[str, str] = {}
    SPANS: dict[str, dict[str, str]] = {}

    def __init__(self, h: Loop):
        self.h, self.args, self.torch, self.dev, self.cuda = h, h.args, h.torch, h.dev, h.cuda

    @classmethod
    def add_args(cls, p: argparse.ArgumentParser) -> None:
        pass

    @classmethod
    def check_args(cls, p: argparse.ArgumentParser, args) -> None:
        pass

    @classmethod
    def setup(cls, args) -> None:
        """Before the device is picked (after parsing): e.g. join a process group and point ``args.device`` and
        the output files at this rank."""

    def build(self) -> None:
        raise NotImplementedError

    def reset(self) -> None:
        raise NotImplementedError

    def step(self, i: int) -> None:
        raise NotImplementedError

    def plain_step(self, i: int) -> None:
        """Optional: the target decoding one token per sequence (a speculative workload's baseline)."""
        raise NotImplementedError

    def has_plain(self) -> bool:
        return type(self).plain_step is not Workload.plain_step

    def drain(self) -> None:
        """Finish a deferred host read (overlapped loops); called after every measured run."""

    def barrier(self) -> None:
        """Several processes: wait for every rank (before the timed steps, around the profiled ones)."""

    def close(self) -> None:
        """After the facts are written (e.g. leave the process group)."""

    def span_fields(self) -> dict:
        """Values the span templates use (e.g. ``B``, ``T``)."""
        return {}

    def extra_timings(self) -> dict:
        """``{name: fn(i)}`` timed like the steps (unprofiled, after the phases), ``--timed-steps`` calls each;
        ``{name: (fn, n)}``: ``n`` calls."""
        return {}

    def probes(self):
        return None

    def contract(self) -> dict:
        """``weight_bytes`` (per step), ``tokens_per_step``, ``draft_tokens`` (None: no speculation); optionally
        ``dtype`` (else ``--dtype``), ``tp`` (the world size, else 1) and ``framework`` (``versions.framework``)."""
        raise NotImplementedError

    def facts(self, run: dict) -> dict:
        return {}


def _percentile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    k = (len(s) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


class Loop:
    """Runs one workload class (``run``); what a workload sees as ``self.h``."""

    def __init__(self, cls, argv=None):
        p = argparse.ArgumentParser(description=(cls.__doc__ or cls.name).split("\n\n")[0])
        _common.add_common_args(p)
        dialects = sorted(cls.SPANS)
        p.add_argument("--engine-spans", choices=["none", *dialects], default="none",
                       help="write the spans an engine writes (record_function ranges; torch profiler)")
        p.add_argument("--with-stack", action="store_true",
                       help="torch profiler: record Python frames (with_stack=True)")
        cls.add_args(p)
        args = p.parse_args(argv)
        cls.check_args(p, args)
        _common.apply_marker_flag(args)
        cls.setup(args)
        self.args, self.cls = args, cls
        self.markers_requested = markers.enabled()
        self.torch, self.dev, self.cuda = _common.torch_device(args)
        self.spans = {} if args.engine_spans == "none" else dict(cls.SPANS[args.engine_spans])
        self._decorate = False          # markers and spans: only while profiling
        self._stamps: list | None = None
        self.accepted: list[list[int]] = []   # accepted draft tokens, per step: one entry per sequence
        self.wl: Workload | None = None
        self.stage = "build"            # build, warmup, timed, plain, phases, extra:<name>, profiled

    # ---- what a workload calls inside step() ----------------------------------------------------------------
    def _stamp(self):
        if self.cuda:
            e = self.torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    @contextlib.contextmanager
    def phase(self, name: str):
        """One part of a step: a timing stamp at its start (truth runs), its marker range (profiled, markers on)."""
        if self._stamps is not None:
            self._stamps.append((name, self._stamp()))
        marker = self.wl.MARKERS.get(name) if self._decorate else None
        if marker:
            with markers.range_(marker):
                yield
        else:
            yield

    def span(self, site: str, **fields):
        """The span the chosen engine writes at ``site`` (profiled steps only), else nothing."""
        tmpl = self.spans.get(site) if self._decorate else None
        if not tmpl:
            return contextlib.nullcontext()
        return self.torch.profiler.record_function(tmpl.format(**{**self.wl.span_fields(), **fields}))

    def record_accept(self, per_sequence: list[int]) -> None:
        self.accepted.append([int(a) for a in per_sequence])

    def decorate(self, on: bool) -> None:
        """Markers (unless ``--no-markers``) and engine spans on the steps that follow: on only while profiling."""
        markers.set_enabled(on and self.markers_requested)
        self._decorate = on

    def measure(self, n: int) -> tuple[dict, float | None]:
        """``n`` unprofiled spec steps from the start state: their timing (:func:`_common.time_steps` + spread)
        and accept length (1 + the mean accepted drafts; None without speculation)."""
        self.wl.reset()
        self.accepted = []
        t = self._timed(self.wl.step, n)
        t.update(self._spread(t))
        acc = [a for s in self.accepted for a in s]
        return t, (1 + statistics.fmean(acc) if acc else None)

    # ---- the run ---------------------------------------------------------------------------------------------
    def _sync(self):
        _common.sync(self.dev)

    def _timed(self, fn, n: int, start: int = 0) -> dict:
        t = _common.time_steps(fn, n, self.dev, start_index=start)
        self.wl.drain()
        self._sync()
        return t

    def _phase_truth(self, n: int) -> dict | None:
        """Median time of each phase over ``n`` spec steps (a phase runs until the next one starts)."""
        wl = self.wl
        per_step = []
        for i in range(n):
            self._stamps = []
            wl.step(i)
            per_step.append(self._stamps)
        self._stamps = None
        end = self._stamp()
        wl.drain()
        self._sync()

        def dt(a, b):
            return a.elapsed_time(b) if self.cuda else (b - a) * 1e3

        out: dict[str, list[float]] = {}
        for k, stamps in enumerate(per_step):
            nxt = per_step[k + 1][0][1] if k + 1 < len(per_step) and per_step[k + 1] else end
            sums: dict[str, float] = {}
            for j, (name, st) in enumerate(stamps):
                until = stamps[j + 1][1] if j + 1 < len(stamps) else nxt
                sums[name] = sums.get(name, 0.0) + dt(st, until)
            for name, v in sums.items():
                out.setdefault(name, []).append(v)
        return {name: round(statistics.median(v), 6) for name, v in out.items()} if out else None

    def main(self, serve=None) -> int:
        args = self.args
        wl = self.wl = self.cls(self)
        has_plain = wl.has_plain()
        markers.set_enabled(False)
        wl.build()
        wl.reset()
        self.stage = "warmup"
        for i in range(args.warmup):
            wl.step(-1 - i)
            if has_plain:
                wl.plain_step(-1 - i)
        wl.drain()
        self._sync()

        n = args.timed_steps
        wl.reset()
        self.accepted = []
        wl.barrier()
        self.stage = "timed"
        timing = self._timed(wl.step, n)
        acc_timed = [a for s in self.accepted for a in s]
        if serve is not None:          # the server validation: the loop goes to the server (module docstring)
            self.timing, self.contract = {**timing, **self._spread(timing)}, wl.contract()
            self.accept_len = 1 + statistics.fmean(acc_timed) if acc_timed else None
            wl.reset()
            self.accepted = []
            self.stage = "serve"
            return serve(self)
        plain = phases = None
        if has_plain:
            wl.reset()
            self.stage = "plain"
            plain = self._timed(wl.plain_step, n)
        if wl.PHASES:
            wl.reset()
            self.stage = "phases"
            phases = self._phase_truth(n)
        extra = {}
        for name, fn in wl.extra_timings().items():
            fn, m = fn if isinstance(fn, tuple) else (fn, n)
            wl.reset()
            self.stage = f"extra:{name}"
            extra[name] = self._timed(fn, m)
        probes = wl.probes() if self.cuda else None
        for t in (timing, plain, *extra.values()):
            if t is not None:
                t.update(self._spread(t))
        accept_len = 1 + statistics.fmean(acc_timed) if acc_timed else None
        c = wl.contract()
        K = c.get("draft_tokens")
        _common.log(f"{wl.name}: unprofiled {'spec ' if K is not None else ''}step {timing['median_ms']:.3f} ms "
                    f"(p10 {timing['p10_ms']:.3f}, p90 {timing['p90_ms']:.3f})"
                    + (f", plain step {plain['median_ms']:.3f} ms" if plain else "")
                    + (f", accept_len {accept_len}" if K is not None else "")
                    + "".join(f", {k} {v['median_ms']:.3f} ms" for k, v in extra.items()))
        if phases:
            _common.log("phases (median ms): " + ", ".join(f"{k} {v:.3f}" for k, v in phases.items()))

        # ---- the profiled steps ----
        wl.reset()
        self.accepted = []
        self.stage = "profiled"
        self.decorate(True)
        if args.with_stack and FRAMES_DIR not in sys.path:
            sys.path.append(FRAMES_DIR)     # the profiler strips sys.path prefixes from frame file names
        prof = profiled_phase(wl.step, args, start_index=n, with_stack=args.with_stack, after=wl.drain,
                              barrier=wl.barrier)
        self.decorate(False)
        acc_prof = [list(s) for s in self.accepted]
        flat_prof = [a for s in acc_prof for a in s]

        facts = _common.contract_facts(
            wl.name, args, self.dev, weight_bytes=c.get("weight_bytes"), tokens_per_step=c["tokens_per_step"],
            timing=timing, dtype=c.get("dtype"), tp=c.get("tp", 1), framework=c.get("framework"),
            spec=None if K is None else {"draft_tokens": K,
                                         "accept_len": round(accept_len, 4) if accept_len is not None else None})
        facts["unprofiled"] = timing
        if plain is not None:          # a workload with a plain step (speculative: the target alone)
            facts.update({"unprofiled_plain_step_ms": round(plain["median_ms"], 6), "unprofiled_plain": plain})
        if wl.PHASES:                  # a workload with phases: their names and unprofiled medians
            facts.update({"unprofiled_phases_ms": phases, "phases": list(wl.PHASES)})
        if K is not None:
            facts["accept"] = {
                "accept_len_timed": round(accept_len, 4) if accept_len is not None else None,
                "accepted_drafts_timed_hist": {str(a): acc_timed.count(a) for a in range(K + 1)},
                "accepted_drafts_profiled": acc_prof,
                "accept_len_profiled": round(1 + statistics.fmean(flat_prof), 4) if flat_prof else None}
        facts.update({
            "markers": ({"step": "decode_step <i>", **{ph: m for ph, m in wl.MARKERS.items()}}
                        if self.markers_requested else None),
            "nvtx_backend": markers.nvtx_backend_name() if self.markers_requested else None,
            "engine_spans": None if not self.spans else {"dialect": args.engine_spans, "sites": self.spans},
            "with_stack": bool(args.with_stack) if args.profiler == "torch" else None,
            "unprofiled_extra": {k: round(v["median_ms"], 6) for k, v in extra.items()} or None,
            "gemm_probe": probes,
            "profiled": prof,
        })
        facts.update(wl.facts({"timing": timing, "plain": plain, "phases": phases, "extra": extra,
                               "probes": probes, "profiled": prof, "accept_timed": acc_timed,
                               "accept_profiled": acc_prof, "accept_len": accept_len}))
        _common.write_facts(args, facts)
        wl.close()
        return 0

    @staticmethod
    def _spread(t: dict) -> dict:
        ps = t.get("periods_ms") or []
        if not ps:
            return {}
        return {"p10_ms": round(_percentile(ps, 0.1), 6), "p90_ms": round(_percentile(ps, 0.9), 6),
                "stdev_ms": round(statistics.pstdev(ps), 6)}


def profiled_phase(step_fn, args, start_index: int, with_stack: bool = False, after=None, barrier=None) -> dict:
    """``_common.profiled_phase`` with ``with_stack`` (Python frames in the torch profiler's trace), a hook run
    after the steps, before the profiler stops (an overlapped loop's last host read), and the ranks' ``barrier``."""
    return _common.profiled_phase(step_fn, args, start_index, barrier=barrier, with_stack=with_stack, after=after)


def run(cls, argv=None, serve=None) -> int:
    """Parse the command line for workload class ``cls`` and run it (a workload script's ``main``); ``serve``: see
    the module docstring."""
    return Loop(cls, argv).main(serve)


__all__ = ["Workload", "Loop", "run", "engine_class", "FRAMES_DIR"]
