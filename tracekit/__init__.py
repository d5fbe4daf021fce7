"""tracekit: where every microsecond of an LLM decode step goes.

Every command of the ``tracekit`` CLI is a thin wrapper over one function here (as sqlite-utils'
commands are over its library); each takes the trace first and its options by keyword:

>>> import tracekit
>>> trace = tracekit.load("tests/data/nsys/pipit_saxpy_2022.2.sqlite")   # nsys SQLite or Kineto JSON
>>> b = tracekit.breakdown(trace, step_range="^saxpy$")                   # per-step split, roofline, advice
>>> b.steps["count"], round(b.steps["mean_ms"], 3)   # 5 ranges: the last has no following step
(4, 255.715)
>>> tracekit.diff(b, b).to_dict()["delta"]["steps"]["mean_ms"]["abs"]   # two breakdowns side by side
0.0

``info``, ``kernels`` and ``history`` return the dicts their commands print with ``--format json`` (built from
typed results: ``tracekit.results``); ``breakdown``, ``diff`` and ``ceiling`` return the typed results themselves,
frozen dataclasses whose ``to_dict()`` is that JSON (``tracekit.contract``: written in one place). Their blocks
read by attribute (``b.steps.count``) or, as the JSON's dicts do, by key (``b.steps["count"]``); a misspelt key
raises ``KeyError``. Importing ``tracekit`` imports neither polars nor pyarrow: each function imports what it needs.
"""

from __future__ import annotations

__version__ = "0.1.0"

from typing import TYPE_CHECKING

from tracekit.errors import TracekitError  # noqa: E402
from tracekit.options import (  # noqa: E402
    DEFAULT_DRAFT_RANGE,
    AnalysisOptions,
    CeilingOptions,
    api_signature,
    bind_options,
)

if TYPE_CHECKING:  # pragma: no cover
    from pathlib import Path

    from tracekit.results.breakdown import Breakdown
    from tracekit.results.ceiling import Ceiling
    from tracekit.results.diff import Diff
    from tracekit.results.stats import Stats
    from tracekit.run.ranks import CrossRank
    from tracekit.trace import Trace


def load(path: str | Path, *, kernel_dims: bool = True) -> Trace:
    """Read one trace file into a :class:`tracekit.trace.Trace` (polars frames, integer ns, one schema).

    ``path``: an nsys SQLite export, a Kineto/PyTorch-profiler ``.json`` / ``.json.gz``, or an
    ``.nsys-rep`` (converted with ``nsys`` into a cache folder, never beside the file). A ``manifest.json``
    written by ``tracekit capture`` beside the trace is attached when it matches the file.
    ``kernel_dims=False`` skips the kernels' grid/block dimensions (no analysis uses them; faster).
    The file is never modified. Raises :class:`TracekitError` for a file that is not a usable trace.

    >>> t = load("tests/data/nsys/pipit_saxpy_2022.2.sqlite")
    >>> t.meta.format, t.kernels.height, t.gpus["name"][0]
    ('nsys-sqlite', 5, 'NVIDIA A100-SXM4-40GB')
    """
    from tracekit.readers import load as _load

    return _load(path, kernel_dims=kernel_dims)


def breakdown(trace: Trace, **options) -> Breakdown | CrossRank:
    """Per-decode-step breakdown of ``trace``: the split of each step's period, roofline and advice.

    ``step_range`` / ``draft_range``: regexes (``re.search``) over range names marking a step / drafting
    (default: auto-detected steps, ``(?i)\\bdraft``); ``draft_range="none"`` turns drafting detection off (no
    ranges, no structure, no speculative kernels: ``advice.drafting.detection`` is ``not_detected``). ``device``: the
    GPU (default: the busiest).
    ``rules``: a TOML file of extra kernel rules. ``weight_bytes`` (an int or text such as ``"27GB"``), ``peak_bw``
    (GB/s), ``accept_len`` and ``tokens_per_step`` override the manifest and the trace; ``device_profile`` is a
    synthetic-workload device profile (its path or JSON object). ``measured_step_ms`` / ``measured_tok_s``: the
    step or throughput measured without a profiler (every saving is stated against it; default: the manifest's).
    ``phase``: decode | prefill | mixed | all (which steps are analysed). ``model`` (a model folder, HF snapshot or
    config.json), ``tp``, ``ep`` and ``context`` give the bytes a step reads per GPU. The keywords, their types and
    defaults are the options declared in :data:`tracekit.options.OPTIONS` (the ``tracekit breakdown`` flags of the
    same names). The result's ``to_dict()`` is ``tracekit breakdown --format json``.

    ``all_devices=True``: every GPU of the trace is analysed as a rank (one nsys report of several ranks) and the
    result is the rank set's :class:`~tracekit.run.ranks.CrossRank` (its ``report()`` is ``tracekit breakdown
    --all-devices --format json``).

    >>> b = breakdown(load("tests/data/nsys/pipit_saxpy_2022.2.sqlite"), step_range="^saxpy$")
    >>> b.steps["marker"], round(b.per_step_ms["other"], 3), round(b.per_step_ms["idle"], 3)
    ('nvtx', 17.715, 238.0)
    """
    from tracekit.run.pipeline import breakdown as _breakdown

    opts = bind_options(breakdown, AnalysisOptions, trace, **options)
    if opts.all_devices:
        from tracekit.run.ranks import analyse_devices, cross_rank

        return cross_rank(*analyse_devices(trace, opts))
    return _breakdown(trace, **opts.analysis_kwargs())


breakdown.__signature__ = api_signature(breakdown, "breakdown")


from tracekit.run.pipeline import breakdown_file  # noqa: E402  (one file in, one Breakdown out: tracekit.run.pipeline)


def kernels(trace: Trace, *, device: int | None = None, top: int | None = None,
            rules: str | Path | None = None) -> dict:
    """Every kernel name with its category, count, total and mean time and share (schema ``tracekit.kernels/1``).

    Over all GPUs unless ``device`` is given (so totals equal ``nsys stats --report cuda_gpu_kern_sum``);
    ``top``: only the N largest; ``rules``: a TOML file of extra kernel rules.

    >>> k = kernels(load("tests/data/nsys/pipit_saxpy_2022.2.sqlite"))
    >>> [(r["name"], r["category"], r["count"], round(r["total_ms"], 3)) for r in k["kernels"]]
    [('saxpy(double *, double *, double *, double, int)', 'other', 5, 88.573)]
    """
    from tracekit.results.kernels import kernel_summary

    return kernel_summary(trace, device=device, top=top, rules=rules).to_dict()


def stats(trace: Trace | str | Path, *, device: int | None = None, rules: str | Path | None = None,
          step_range: str | None = None, draft_range: str | None = None) -> Stats:
    """The tables an ``nsys stats`` user looks for (schema ``tracekit.stats/1``): kernels, memcpy/memset, CUDA API
    calls, NVTX ranges / annotations, GPU and stream utilisation, the kernel time outside the steps, and kernel time
    by what launched it (``launched_by``). ``trace``: a loaded trace or a path. ``device`` restricts the GPU tables
    (default: every GPU); ``step_range`` / ``draft_range`` as ``breakdown``'s (for the coverage). The result's
    ``to_dict()`` is ``tracekit stats --format json``.

    >>> s = stats("tests/data/nsys/pipit_saxpy_2022.2.sqlite", step_range="^saxpy$")
    >>> [(r["name"], r["count"]) for r in s["api"][:2]], [(r.name, r.kernels) for r in s.launched_by["range"]]
    ([('cudaMemcpy', 15), ('cudaHostRegister', 9)], [('saxpy', 5)])
    """
    from tracekit.run.stats import stats as _stats

    if not hasattr(trace, "kernels"):
        trace = load(trace)
    return _stats(trace, device=device, rules=rules, step_range=step_range, draft_range=draft_range)


def info(trace: Trace, *, device: int | None = None, top: int = 10) -> dict:
    """What is in ``trace`` (schema ``tracekit.info/1``): source, GPUs and their peak bandwidth, counts,
    graph trace mode, the ``top`` most frequent range names that launch GPU work (step candidates; also ranked by
    the kernel time they enclose, ``step_candidates``) and warnings. ``device`` restricts the GPU-side counts.

    >>> i = info(load("tests/data/nsys/pipit_saxpy_2022.2.sqlite"), top=1)
    >>> i["counts"], i["range_names"]  # (its 10 MPI_Send ranges launch nothing: no step candidate)
    ({'kernels': 5, 'memops': 15, 'launches': 20, 'ranges': 22}, [{'pattern': 'saxpy', 'regex': '^saxpy$', 'count': 5}])
    """
    from tracekit.results.info import info as _info

    return _info(trace, device=device, top=top).to_dict()


def diff(base: Breakdown, new: Breakdown, *, fail_on_regression: float | str | None = None) -> Diff:
    """Two breakdowns side by side: deltas per category and step statistic, the kernels that moved, and the advice
    that changed. ``base``/``new`` may also be saved breakdowns or rank sets (``tracekit.results.diff.as_side``).

    ``fail_on_regression`` (percent: ``3``, ``"3%"``): add the CI gate (``gate``): failed when NEW's reference
    step is slower by more than that *and* beyond the noise of the two sides' steps (``Diff.failed``; the
    command's exit 3). ``to_dict()`` is ``tracekit diff --format json`` (see ``tracekit.results.diff``).

    >>> b = breakdown(load("tests/data/nsys/pipit_saxpy_2022.2.sqlite"), step_range="^saxpy$")
    >>> d = diff(b, b, fail_on_regression="3%")
    >>> d.to_dict()["delta"]["advice_changed"], d.gate.change_pct, d.failed
    ([], 0.0, False)
    """
    from tracekit.results.diff import diff as _diff
    from tracekit.results.diff import parse_threshold

    threshold = None if fail_on_regression is None else parse_threshold(fail_on_regression)
    return _diff(base, new, fail_on_regression=threshold)


def ceiling(**options) -> Ceiling:
    """The tok/s ceiling without a trace (schema ``tracekit.ceiling/1``): bytes a decode step must read
    per GPU over the GPU's peak bandwidth. Weights from ``weight_bytes`` (summed over GPUs), ``params`` (x
    ``dtype``) or ``model`` (a model folder / HF snapshot / config.json: safetensors headers only); see
    :func:`tracekit.results.ceiling.ceiling` for what each option does. The keywords are the options declared
    in :data:`tracekit.options.OPTIONS` for ``ceiling`` (the ``tracekit ceiling`` flags; those shared with
    ``breakdown`` are the same declarations); "not given" means one GPU, one sequence, no KV term.

    >>> c = ceiling(gpu="NVIDIA H200", params=494005120, dtype="bf16")
    >>> round(c.floor_ms, 4), round(c.ceiling_tokens_per_s)
    (0.2058, 4858)
    """
    from tracekit.results.ceiling import ceiling as _ceiling

    return _ceiling(**bind_options(ceiling, CeilingOptions, **options).analysis_kwargs())


ceiling.__signature__ = api_signature(ceiling, "ceiling")


def history(db: str | Path, *, path_contains: str | None = None, last: int | None = None) -> dict:
    """The runs saved with ``tracekit breakdown --save DB`` (schema ``tracekit.history/2``), oldest first,
    each with its reference step (unprofiled where known), its change against the previous run of the same trace
    and reference source, and a ``regression`` flag.

    >>> import tempfile, os
    >>> db = os.path.join(tempfile.mkdtemp(), "runs.db")
    >>> b = breakdown(load("tests/data/nsys/pipit_saxpy_2022.2.sqlite"), step_range="^saxpy$")
    >>> from tracekit.run.history import save_runs
    >>> save_runs(db, [b, b], timestamp="2026-01-01T00:00:00+00:00", git={})
    [1, 2]
    >>> [(r["id"], r["reference_source"], r["delta_ms"], r["regression"]) for r in history(db)["runs"]]
    [(1, 'traced', None, False), (2, 'traced', 0.0, False)]
    """
    from tracekit.run.history import history as _history

    return _history(db, path_contains=path_contains, last=last)


__all__ = ["load", "breakdown", "breakdown_file", "kernels", "stats", "info", "diff", "ceiling", "history",
           "AnalysisOptions", "CeilingOptions", "DEFAULT_DRAFT_RANGE", "TracekitError", "__version__"]
