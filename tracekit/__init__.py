"""tracekit: where every microsecond of an LLM decode step goes.

Every command of the ``tracekit`` CLI is a thin wrapper over one function here (as sqlite-utils'
commands are over its library); each takes the trace first and its options by keyword:

>>> import tracekit
>>> b = tracekit.breakdown("tests/data/nsys/pipit_saxpy_2022.2.sqlite", step_range="^saxpy$")   # a path...
>>> b.steps["count"], round(b.steps["mean_ms"], 3)   # 5 ranges: the last has no following step
(4, 255.715)
>>> trace = tracekit.load("tests/data/nsys/pipit_saxpy_2022.2.sqlite")   # ... or a loaded trace
>>> tracekit.diff(trace, "tests/data/nsys/pipit_saxpy_2022.2.sqlite", step_range="^saxpy$").to_dict()[
...     "delta"]["steps"]["mean_ms"]["abs"]   # two breakdowns side by side
0.0

Each analysis function (``info``, ``kernels``, ``breakdown``, ``diff``) takes a trace as a path (``str`` or
``Path``), a directory of rank files, or a loaded :class:`~tracekit.trace.Trace`, and the command's options by their
names (``step_range``, ``accept_len``, ``fail_on_regression``, ...). It returns a typed result whose ``to_dict()``
is the command's ``--format json`` (``tracekit.contract``: written in one place): frozen dataclasses (``Breakdown``,
``Diff``, ``Ceiling``, ``Info``, ``KernelSummary``) read by attribute (``b.steps.count``) or, as the JSON's dicts
are, by key (``b.steps["count"]``; a misspelt key raises ``KeyError``); several rank files give a ``RankSet``
(``breakdown``) or a ``RankReport`` (``info``, ``kernels``). ``history`` returns the dict its command prints.
Errors the user can cause raise :class:`TracekitError` subclasses (the command's exit 2). Importing ``tracekit``
imports neither polars nor pyarrow: each function imports what it needs.
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
    from tracekit.results.info import Info
    from tracekit.results.kernels import KernelSummary
    from tracekit.results.rankset import RankReport, RankSet
    from tracekit.results.stats import Stats
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


def _files(trace) -> list | None:
    """The trace files a path names (a directory: its rank files), or None for a loaded trace."""
    import os

    if isinstance(trace, (str, os.PathLike)):
        from tracekit.run.sides import expand_trace_paths

        return expand_trace_paths([trace])
    if not (hasattr(trace, "kernels") and hasattr(trace, "meta")):
        raise TracekitError(f"a trace path (str or Path), a directory of rank files or a loaded Trace, not "
                            f"{type(trace).__name__}")
    return None


def _load_file(path) -> Trace:
    """A trace file as the commands read it (no kernel grid dimensions: no analysis uses them)."""
    return load(path, kernel_dims=False)


def breakdown(trace: str | Path | Trace, **options) -> Breakdown | RankSet:
    """Per-decode-step breakdown of ``trace``: the split of each step's period, roofline and advice.

    ``trace``: a trace file's path, a directory of rank files (every file a rank: the result is a
    :class:`~tracekit.results.rankset.RankSet`, ``tracekit breakdown DIR``) or a loaded Trace.

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
    result is the rank set's :class:`~tracekit.results.rankset.RankSet` (its ``to_dict()`` is ``tracekit breakdown
    --all-devices --format json``; ``.cross_rank`` the cross-rank object).

    >>> b = breakdown("tests/data/nsys/pipit_saxpy_2022.2.sqlite", step_range="^saxpy$")
    >>> b.steps["marker"], round(b.per_step_ms["other"], 3), round(b.per_step_ms["idle"], 3)  # (the copies between
    ...                                                    # the saxpy ranges belong to the steps: every kernel counted)
    ('nvtx', 17.715, 0.014)
    """
    from tracekit.results.rankset import RankSet
    from tracekit.run.pipeline import breakdown as _breakdown

    opts = bind_options(breakdown, AnalysisOptions, trace, **options)
    files = _files(trace)
    if opts.all_devices:
        from tracekit.run.ranks import analyse_devices, cross_rank

        if files is not None:
            if len(files) != 1:
                raise TracekitError("--all-devices takes one trace file")
            trace = _load_file(files[0])
        return RankSet(cross_rank(*analyse_devices(trace, opts)))
    if files is None:
        return _breakdown(trace, opts)
    if len(files) == 1:
        return breakdown_file(files[0], opts)
    from tracekit.run.ranks import analyse_files, cross_rank

    return RankSet(cross_rank(analyse_files(files, opts), None))


breakdown.__signature__ = api_signature(breakdown, "breakdown")


from tracekit.run.pipeline import breakdown_file  # noqa: E402  (one file in, one Breakdown out: tracekit.run.pipeline)


def kernels(trace: str | Path | Trace, *, device: int | None = None, top: int | None = None,
            rules: str | Path | None = None) -> KernelSummary | RankReport:
    """Every kernel name with its category, count, total and mean time and share (schema ``tracekit.kernels/1``).

    ``trace``: a path, a directory of rank files (a :class:`~tracekit.results.rankset.RankReport`: each rank's table
    and kernel time per category per rank) or a loaded Trace. Over all GPUs unless ``device`` is given (so totals
    equal ``nsys stats --report cuda_gpu_kern_sum``); ``top``: only the N largest; ``rules``: a TOML file of extra
    kernel rules. ``to_dict()`` is ``tracekit kernels --format json``.

    >>> k = kernels("tests/data/nsys/pipit_saxpy_2022.2.sqlite")
    >>> [(r["name"], r["category"], r["count"], round(r["total_ms"], 3)) for r in k["kernels"]]
    [('saxpy(double *, double *, double *, double, int)', 'other', 5, 88.573)]
    """
    from tracekit.results.kernels import kernel_summary

    files = _files(trace)
    if files is None or len(files) == 1:
        t = trace if files is None else _load_file(files[0])
        return kernel_summary(t, device=device, top=top, rules=rules)
    from tracekit.results.rankset import RankReport
    from tracekit.run.ranks import kernels_ranks

    # the cross-rank totals are over every kernel; ``top`` only shortens each rank's list (as the command)
    multi = kernels_ranks([kernel_summary(_load_file(p), device=device, rules=rules).to_dict() for p in files], files)
    if top is not None:
        multi["ranks"] = [{**r, "kernels": r["kernels"][:top]} for r in multi["ranks"]]
    return RankReport(multi)


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


def info(trace: str | Path | Trace, *, device: int | None = None, top: int = 10) -> Info | RankReport:
    """What is in ``trace`` (schema ``tracekit.info/1``): source, GPUs and their peak bandwidth, counts,
    graph trace mode, the ``top`` most frequent range names that launch GPU work (step candidates; also ranked by
    the kernel time they enclose, ``step_candidates``) and warnings. ``device`` restricts the GPU-side counts.
    ``trace``: a path, a directory of rank files (a :class:`~tracekit.results.rankset.RankReport`) or a loaded
    Trace; ``to_dict()`` is ``tracekit info --format json``.

    >>> i = info("tests/data/nsys/pipit_saxpy_2022.2.sqlite", top=1)
    >>> i.to_dict()["counts"], i.to_dict()["range_names"]  # (its 10 MPI_Send ranges launch nothing: no step candidate)
    ({'kernels': 5, 'memops': 15, 'launches': 20, 'ranges': 22}, [{'pattern': 'saxpy', 'regex': '^saxpy$', 'count': 5}])
    """
    from tracekit.results.info import info as _info

    files = _files(trace)
    if files is None or len(files) == 1:
        return _info(trace if files is None else _load_file(files[0]), device=device, top=top)
    from tracekit.results.rankset import RankReport
    from tracekit.run.ranks import info_ranks

    return RankReport(info_ranks([_info(_load_file(p), device=device, top=top).to_dict() for p in files]))


def diff(base, new, *, fail_on_regression: float | str | None = None, base_measured_step_ms: float | None = None,
         new_measured_step_ms: float | None = None, base_accept_len: float | None = None,
         new_accept_len: float | None = None, base_device: int | None = None, new_device: int | None = None,
         **options) -> Diff:
    """Two breakdowns side by side: deltas per category and step statistic, the kernels that moved, the advice
    that changed, per token when the two sides emit different tokens per step (``per_token``), and with
    ``fail_on_regression`` the CI gate. ``to_dict()`` is ``tracekit diff BASE NEW --format json`` with the same
    options (see ``tracekit.results.diff``).

    ``base`` / ``new``: each a trace path, a directory of rank files, a breakdown saved as JSON, a loaded Trace, or
    an analysed result (a Breakdown, a RankSet). The analysis options (``step_range``, ``accept_len``, ``phase``,
    ``device``, ...: those of :func:`breakdown` but the measured step) apply to both sides; ``base_*`` / ``new_*``
    give one side its own unprofiled step (``base_measured_step_ms``), accept length (``new_accept_len``) or GPU.

    ``fail_on_regression`` (percent: ``3``, ``"3%"``): ``gate.verdict`` is ``fail`` when NEW's reference step (per
    token, where the sides emit different tokens per step) is slower by more than that *and* beyond the noise,
    ``inconclusive`` when it is slower by more than that but the noise cannot tell, else ``pass``;
    ``Diff.exit_code`` is the command's exit code (3, 4, 0).

    >>> d = diff("tests/data/nsys/pipit_saxpy_2022.2.sqlite", "tests/data/nsys/pipit_saxpy_2022.2.sqlite",
    ...          step_range="^saxpy$", fail_on_regression="3%")
    >>> d.to_dict()["delta"]["advice_changed"], d.gate.change_pct, d.gate.verdict, d.exit_code
    ([], 0.0, 'pass', 0)
    """
    from tracekit.run.sides import diff_sides

    opts = bind_options(diff, AnalysisOptions, base, new, **options)
    return diff_sides(base, new, opts, fail_on_regression=fail_on_regression,
                      base_changes={"measured_step_ms": base_measured_step_ms, "accept_len": base_accept_len,
                                    "device": base_device},
                      new_changes={"measured_step_ms": new_measured_step_ms, "accept_len": new_accept_len,
                                   "device": new_device})


def _diff_signature():
    """``diff``'s signature: its own keywords, then the analysis options both sides share (``breakdown``'s, but the
    measured step: each side has its own)."""
    import inspect

    sig = inspect.signature(diff)
    own = [p for p in sig.parameters.values() if p.kind != p.VAR_KEYWORD]
    shared = [p for p in api_signature(breakdown, "breakdown").parameters.values()
              if p.kind == p.KEYWORD_ONLY and not p.name.startswith("measured_") and p.name != "all_devices"]
    return sig.replace(parameters=own + shared)


diff.__signature__ = _diff_signature()


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
