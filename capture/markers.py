"""Step / draft / verify markers shared by every capture workload.

Each marker opens an NVTX range (for nsys) AND a ``torch.profiler.record_function``
range (for the torch profiler / Kineto) with the same name, so both trace kinds
carry the names tracekit looks for:

* ``decode_step <i>`` -- one decode iteration (tracekit's default step regex
  ``^decode_step \\d+$``),
* ``draft``  -- the speculative draft forwards of a step,
* ``verify`` -- the target model's verify forward of a step.

``set_enabled(False)`` (the workloads' ``--no-markers``) turns every range into a no-op: the
trace then looks like a user's own server trace, with no step, draft or verify ranges at all
(neither NVTX nor ``record_function``).

NVTX comes from the ``nvtx`` package when it is installed, else from
``torch.cuda.nvtx`` (always present in torch builds with CUDA, a no-op without a GPU).
Nothing here needs a GPU: on a CPU-only torch the NVTX half is skipped.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

STEP_PREFIX = "decode_step"
DRAFT = "draft"
VERIFY = "verify"


def step_name(i: int) -> str:
    return f"{STEP_PREFIX} {int(i)}"


def _nvtx_backend():
    """(push, pop, name) of the NVTX implementation that is available, or None."""
    try:  # the `nvtx` package: cheapest, and its domain is the default one nsys shows
        import nvtx  # type: ignore

        return nvtx.push_range, nvtx.pop_range, "nvtx"
    except Exception:
        pass
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.nvtx.range_push, torch.cuda.nvtx.range_pop, "torch.cuda.nvtx"
    except Exception:
        pass
    return None


_BACKEND = None
_BACKEND_RESOLVED = False
_ENABLED = True


def set_enabled(on: bool) -> None:
    """Turn every marker range on (default) or off (``--no-markers``)."""
    global _ENABLED
    _ENABLED = bool(on)


def enabled() -> bool:
    return _ENABLED


def nvtx_backend_name() -> str | None:
    b = _backend()
    return b[2] if b else None


def _backend():
    global _BACKEND, _BACKEND_RESOLVED
    if not _BACKEND_RESOLVED:
        _BACKEND = _nvtx_backend()
        _BACKEND_RESOLVED = True
    return _BACKEND


@contextlib.contextmanager
def range_(name: str) -> Iterator[None]:
    """One named range in both NVTX and the torch profiler (nothing when markers are off)."""
    if not _ENABLED:
        yield
        return
    backend = _backend()
    try:
        import torch

        rf = torch.profiler.record_function(name)
    except Exception:  # torch missing: NVTX only
        rf = contextlib.nullcontext()
    if backend is not None:
        backend[0](name)
    try:
        with rf:
            yield
    finally:
        if backend is not None:
            backend[1]()


def step(i: int):
    """``decode_step <i>``: wrap everything one decode iteration launches."""
    return range_(step_name(i))


def draft():
    """``draft``: wrap the draft model's forwards of a speculative step."""
    return range_(DRAFT)


def verify():
    """``verify``: wrap the target model's verify forward of a speculative step."""
    return range_(VERIFY)


__all__ = ["step", "draft", "verify", "range_", "step_name", "nvtx_backend_name", "set_enabled", "enabled",
           "STEP_PREFIX", "DRAFT", "VERIFY"]
