"""The two sides of ``diff``, analysed with the same options: what ``tracekit diff BASE NEW`` and
``tracekit.diff(base, new, ...)`` both run (one code path, so the API's result is the command's JSON).

A side is a path (a trace file, a breakdown saved as JSON, a directory of rank files), a loaded
:class:`~tracekit.trace.Trace`, or something already analysed (a Breakdown, a saved breakdown, a rank set). The same
GPU is analysed on both sides unless told otherwise (:func:`pair_devices`). Each side has its own unprofiled step and
accept length (``--base-measured-step-ms``, ``--new-accept-len``, ...), else the shared flag, else its manifest.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from os import PathLike
from pathlib import Path

from tracekit.errors import ConflictingOptions, TracekitError
from tracekit.options import OPTION, AnalysisOptions

SIDE_OPTIONS = ("measured_step_ms", "accept_len", "device")  # the options each side may have its own value of


def side_options(opts: AnalysisOptions, side: str, **changes) -> AnalysisOptions:
    """``opts`` with one side's values (``side_options(opts, "base", measured_step_ms=20.0)``; None keeps the shared
    value), checked as the declaration says; an error naming the side's flag (``--base-measured-step-ms``)."""
    changes = {k: v for k, v in changes.items() if v is not None}
    try:
        return dataclasses.replace(opts, **changes)
    except TracekitError as e:
        msg = str(e)
        for name in changes:
            msg = msg.replace(OPTION[name].flag, f"--{side}-{OPTION[name].flag[2:]}")
        raise TracekitError(msg) from None


def _is_path(x) -> bool:
    return isinstance(x, (str, PathLike))


def _analysed(x) -> bool:
    """True for a side that is already a result (nothing to analyse)."""
    from tracekit.results.diff import SavedBreakdown, Side

    return isinstance(x, (SavedBreakdown, Side)) or hasattr(x, "per_step_ms") or (
        hasattr(x, "rank_breakdowns") and hasattr(x, "report"))


def analyse_pair(base, new, opts: AnalysisOptions | None = None, *, base_changes: dict | None = None,
                 new_changes: dict | None = None, loader: Callable | None = None):
    """The two sides (a Breakdown, a saved breakdown or a rank set each), the notes on how their devices were
    paired (:func:`pair_devices`) and each side's label (a directory's path, else None): ``(sides, notes, labels)``.

    ``opts``: the options both sides share; ``base_changes`` / ``new_changes``: one side's own values
    (:data:`SIDE_OPTIONS`). BASE is analysed first (its trace given back before NEW's is read), so that NEW can be
    analysed on the GPU BASE was. ``loader(path)``: how a trace file is read (the command's shows progress)."""
    from tracekit.results.diff import read_saved
    from tracekit.run.pipeline import breakdown

    opts = opts or AnalysisOptions()
    if loader is None:
        from tracekit.readers import load as _load

        def loader(p):
            return _load(p, kernel_dims=False)

    out, notes, labels = [], [], []
    analysed = None  # the GPU BASE was analysed on (one trace, or a saved breakdown)
    for name, x, changes in (("base", base, base_changes or {}), ("new", new, new_changes or {})):
        given = {k: v for k, v in changes.items() if v is not None}
        o = side_options(opts, name, **{k: v for k, v in given.items() if k != "device"})
        dev = given.get("device", opts.device)
        label = None
        if _analysed(x):
            if given or opts.given():
                which = ", ".join(sorted([*given, *opts.given()]))
                raise ConflictingOptions(f"{name.upper()} is already analysed: options ({which}) apply to traces only; "
                                    "give the trace (a path or a loaded Trace) instead")
            out.append(x)
            labels.append(None)
            if name == "base":
                analysed = _device_of(x)
            continue
        trace = None
        if _is_path(x):
            path = Path(x)
            s = read_saved(path)
            if s is not None:
                if o.measured_step_ms is not None:
                    raise ConflictingOptions(f"--{name}-measured-step-ms: {path} is a saved breakdown, whose time base is "
                                        "fixed; give the trace file instead")
                out.append(s)
                labels.append(None)
                analysed = s.data["gpu"].get("device") if name == "base" else analysed
                continue
            files = expand_trace_paths([path])
            if len(files) > 1:
                from tracekit.run.ranks import analyse_files, cross_rank

                out.append(cross_rank(analyse_files(files, side_options(o, name, device=dev))))
                labels.append(str(path))
                continue
            trace = loader(files[0])
            label = str(path) if path.is_dir() else None
        elif hasattr(x, "kernels") and hasattr(x, "meta"):
            trace = x
        else:
            raise TracekitError(f"{name.upper()}: a trace path, a directory of rank files, a saved breakdown or a "
                                f"loaded Trace, not {type(x).__name__}")
        if name == "new" and dev is None:
            dev, note = pair_devices(analysed, trace)
            notes.extend(note)
        b = breakdown(trace, side_options(o, name, device=dev), consume=_is_path(x))
        del trace
        out.append(b)
        labels.append(label)
        if name == "base":
            analysed = b.gpu.device
    return out, notes, tuple(labels)


def _device_of(x) -> int | None:
    """The GPU an analysed side was analysed on (None for a rank set)."""
    gpu = getattr(x, "gpu", None)
    if gpu is not None:
        return gpu.device
    data = getattr(x, "data", None)
    return data["gpu"].get("device") if isinstance(data, dict) else None


def expand_trace_paths(paths) -> list[Path]:
    """Files as given; a directory contributes its trace files, one per rank (``tracekit.readers.paths``)."""
    from tracekit.readers.paths import expand_traces

    return expand_traces(paths)


def pair_devices(base_device: int | None, new_trace) -> tuple[int | None, list[str]]:
    """The GPU NEW is analysed on when no flag says, and a note when it is not BASE's: ``(device, notes)``.

    NEW analyses the GPU BASE was analysed on (``base_device``) where NEW ran work on it (issue 44: a two-GPU
    before/after pair must not compare GPU 0 with GPU 1); where it did not, NEW's busiest GPU, with a note, unless
    NEW ran work on one GPU only (a single-GPU capture on another device number: nothing to choose)."""
    from tracekit.analyses.attribution import devices_with_activity

    if base_device is None:
        return None, []
    devs = devices_with_activity(new_trace)
    if not devs:
        return None, []  # (no GPU work: the analysis says so)
    if base_device in devs:
        return base_device, []
    if len(devs) == 1:
        return int(devs[0]), []
    return int(devs[0]), [f"NEW ran no work on GPU {base_device} (the one BASE was analysed on): NEW analyses its "
                          f"busiest, GPU {devs[0]} (pass --new-device N to pick another)"]


def diff_sides(base, new, opts: AnalysisOptions | None = None, *, fail_on_regression=None,
               base_changes: dict | None = None, new_changes: dict | None = None, loader: Callable | None = None):
    """Analyse both sides (:func:`analyse_pair`) and compare them (``tracekit.results.diff.diff``): a
    :class:`~tracekit.results.diff.Diff`. ``fail_on_regression``: the gate's threshold (``3``, ``"3%"``)."""
    from tracekit.results.diff import diff, parse_threshold

    threshold = None if fail_on_regression is None else parse_threshold(fail_on_regression)
    sides, notes, labels = analyse_pair(base, new, opts, base_changes=base_changes, new_changes=new_changes,
                                        loader=loader)
    return diff(sides[0], sides[1], fail_on_regression=threshold, labels=labels, warnings=notes)


__all__ = ["SIDE_OPTIONS", "side_options", "analyse_pair", "pair_devices", "diff_sides"]
