"""The bytes one GPU reads per decode step, resolved once for ``breakdown`` and ``ceiling`` alike.

Every source of a byte figure goes through this module; the precedence of each is
:mod:`tracekit.analyses.resolve`'s (``target_weight_bytes``, ``kv_bytes``, ``draft_bytes``: the one home of every
precedence rule), applied here once, after the model is loaded (docs/roofline.md, "Where the inputs come from"; the
parallelism that divides it is :func:`tracekit.analyses.resolve.resolve_tp`'s, whose :class:`Parallelism` it
takes)::

    target weights       --weight-bytes (summed over GPUs, / tp)  |  --params x --dtype (ceiling)
                         >  --model (safetensors headers or config.json: tracekit.model.step_bytes)
                         >  manifest  >  the trace (recorded shapes, SGLang layer-wise NVTX)
    draft weights        --draft-bytes x --draft-forwards (ceiling)  >  the model's MTP layers x forwards
    KV cache             --kv-bytes-per-token x --context (ceiling)  >  --model with a context  >  manifest

``--weight-bytes`` replaces only the target's weights: with ``--model`` the draft (MTP) and KV terms still come
from the model. :func:`resolve_bytes` gives the
:class:`ResolvedBytes` (per GPU, with sources, assumptions and warnings), whose :meth:`ResolvedBytes.roofline`
is the contract's roofline block (``tracekit.analyses.roofline.step_roofline``).

>>> from tracekit.analyses.resolve import resolve_tp
>>> b = resolve_bytes(parallel=resolve_tp(flag=2), weight_bytes=27e9)
>>> b.weight_bytes_per_step, b.weight_bytes_source, b.tp
(13500000000, 'flag', 2)
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from tracekit.analyses import resolve
from tracekit.analyses.resolve import Parallelism

if TYPE_CHECKING:
    from tracekit.analyses.roofline import RooflineBlock
    from tracekit.model.checkpoint import Model
    from tracekit.model.step import StepBytes
    from tracekit.trace import ProcessGroup

# A process group whose description names tensor parallelism (vLLM/SGLang/Megatron labels).
_TP_DESC = re.compile(r"(?i)(^|[^a-z])tp([^a-z]|$)|tp_group|tensor")


def tp_from_process_groups(groups: Sequence[ProcessGroup], all_reduce_pgs: Sequence[str] = ()) -> tuple[int | None,
                                                                                                         str]:
    """The size of the process group a trace's all-reduces use, from the job's process groups (Kineto
    ``distributedInfo.pg_config``), with the evidence; ``(None, why)`` when it cannot be told.

    In order: the group an all-reduce names (``all_reduce_pgs``, e.g. NCCL args' ``Process Group Name``); a
    GPU (NCCL) group whose description names tensor parallelism (``tp``, ``TP_GROUP``); else the GPU groups of
    more than one rank other than the job's default group, when they all have one size. The default group alone
    is never taken: its size is the whole job's.

    >>> from tracekit.trace import ProcessGroup as G
    >>> tp_from_process_groups([G("0", "default_pg", "cuda:nccl", 8), G("1", "undefined", "cuda:nccl", 4)])[0]
    4
    >>> tp_from_process_groups([G("0", "default_pg", "cuda:nccl", 8)])[0] is None
    True
    """
    if not groups:
        return None, "the trace lists no process groups"
    gpu = [g for g in groups if g.size > 1 and (g.backend is None or "nccl" in g.backend.lower())]
    by_name = {g.name: g for g in gpu}
    named = sorted({by_name[n].size for n in all_reduce_pgs if n in by_name})
    if len(named) == 1:
        return named[0], (f"the all-reduces' process group ({', '.join(repr(n) for n in all_reduce_pgs)}) has "
                          f"{named[0]} ranks (distributedInfo.pg_config)")
    tp_groups = sorted({g.size for g in gpu if g.desc and _TP_DESC.search(g.desc)})
    if len(tp_groups) == 1:
        g = next(g for g in gpu if g.desc and _TP_DESC.search(g.desc))
        return tp_groups[0], (f"process group {g.name!r} ({g.desc}) has {g.size} ranks "
                              "(distributedInfo.pg_config)")
    others = [g for g in gpu if g.desc != "default_pg"]
    sizes = sorted({g.size for g in others})
    if len(sizes) == 1:
        return sizes[0], (f"the job's GPU process groups besides the default one ({len(others)}, e.g. "
                          f"{others[0].name!r}) all have {sizes[0]} ranks (distributedInfo.pg_config)")
    if len(sizes) > 1:
        return None, (f"process groups of {', '.join(map(str, sizes))} ranks: which one the all-reduces use is not "
                      "recorded")
    return None, "no GPU process group of more than one rank besides the job's default one"


@dataclass(frozen=True)
class ResolvedBytes:
    """What one GPU reads per decode step, with where each term came from.

    ``weight_bytes_per_step`` = target weights + ``draft_bytes_per_step`` (the draft's weights x its forwards);
    ``kv_bytes_per_step`` None = unknown. ``assumptions``: what the figures rest on (``ceiling`` lists them);
    ``warnings``: what the user should know (``breakdown`` prints them).
    """

    target_bytes_per_step: int | None
    weight_bytes_source: str | None  # flag | params | model | manifest | shapes | nvtx
    draft_bytes_per_step: int | None
    kv_bytes_per_step: int | None
    kv_bytes_source: str | None  # flag | model | manifest
    parallel: Parallelism
    step: StepBytes | None = None  # tracekit.model.step_bytes, with --model
    model: Model | None = None
    assumptions: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    inputs: dict = field(default_factory=dict)

    @property
    def tp(self) -> int:
        return self.parallel.tp

    @property
    def weight_bytes_per_step(self) -> int | None:
        if self.target_bytes_per_step is None:
            return None
        return self.target_bytes_per_step + (self.draft_bytes_per_step or 0)

    def roofline(self, *, peak_bw_gbps: float | None, reference_step_ms: float | None = None,
                 tokens_per_step: float | None = None, gemm_ms: float | None = None,
                 attention_ms: float | None = None) -> RooflineBlock:
        """The contract's roofline block of these bytes (``tracekit.analyses.roofline.step_roofline``)."""
        from tracekit.analyses.roofline import step_roofline

        w = self.weight_bytes_per_step
        return step_roofline(weight_bytes_per_step=w, peak_bw_gbps=peak_bw_gbps,
                             reference_step_ms=reference_step_ms, tokens_per_step=tokens_per_step, tp=self.tp,
                             weight_bytes_source=self.weight_bytes_source if w else None,
                             kv_bytes_per_step=self.kv_bytes_per_step, kv_bytes_source=self.kv_bytes_source,
                             draft_bytes_per_step=self.draft_bytes_per_step, gemm_ms=gemm_ms,
                             attention_ms=attention_ms)


def load(model: str | Path | dict | Model, dtype: str | None = None) -> Model:
    """A :class:`tracekit.model.Model` from a path, a config dict or a Model."""
    from tracekit.model import Model as _Model
    from tracekit.model import load_model, model_from_config

    if isinstance(model, _Model):
        return model
    if isinstance(model, dict):
        return model_from_config(model, dtype=dtype)
    return load_model(model, dtype=dtype)


def resolve_bytes(*, parallel: Parallelism, weight_bytes: float | None = None, params: float | None = None,
                  dtype: str | None = None, model: str | Path | dict | Model | None = None,
                  kv_dtype: str | None = None, batch: int = 1, context: int | None = None,
                  kv_bytes_per_token: float | None = None, draft_forwards: float = 0, verify_tokens: int = 1,
                  draft_bytes: float = 0, draft_sharded: bool = True, manifest: dict | None = None,
                  discover: Callable[[], tuple[str | Path | None, str]] | None = None, draft_note: str = "",
                  from_trace: Callable[[], tuple[int | None, str | None, tuple[str, ...]]] | None = None,
                  ) -> ResolvedBytes:
    """The bytes per GPU per decode step from every source given (precedence: the module docstring).

    ``weight_bytes``: summed over all GPUs (divided by ``parallel.tp``); ``params`` x ``dtype`` likewise;
    ``model``: a model folder, HF snapshot, ``config.json``, config dict or Model (``dtype`` overrides its
    element size); ``batch``: sequences per step (MoE experts are read at ``batch x verify_tokens`` tokens);
    ``context``: KV tokens each sequence reads (None: KV unknown); ``draft_forwards``: draft (MTP) forwards per
    step; ``draft_bytes``: a separate draft model's bytes (read ``draft_forwards`` times, split over tp when
    ``draft_sharded``); ``manifest``: ``tracekit capture``'s (``weight_bytes_per_step``, ``kv_bytes_per_step``,
    per GPU). A trace's own sources (breakdown): ``discover``, called only when no flag, model or manifest gives
    the weights, returns the model the trace's recorded command line names (its path when it is on this machine,
    else None) and how it was found; ``from_trace``, called only when nothing above gives the weights, returns
    (bytes, source, warnings) from the recorded shapes or NVTX; ``draft_note`` says how the draft forwards were
    counted (a warning when a draft is counted). The warnings a breakdown prints (what is unknown, what was
    assumed) come back in ``warnings``.
    """
    from tracekit.model import step_bytes

    tp, ep = parallel.tp, parallel.ep
    man = manifest or {}
    assumptions: list[str] = []
    warnings: list[str] = []
    m = sb = None
    if (discover is not None and model is None and weight_bytes is None and params is None
            and man.get("weight_bytes_per_step") is None):
        found, note = discover()
        if found is not None:
            model = str(found)
            warnings.append(f"model bytes from {note}")
    if model is not None:
        m = load(model, dtype)
        # a separate draft model's bytes (--draft-bytes) replace the model's MTP layers as the draft
        sb = step_bytes(m, tp=tp, ep=ep, batch=batch, context=context,
                        draft_forwards=0 if draft_bytes else draft_forwards, verify_tokens=verify_tokens,
                        kv_dtype=kv_dtype)
        assumptions += [n for n in sb.notes + sb.warnings if not n.startswith("KV cache not counted")]
        warnings += list(sb.warnings)

    target, src, trace_warnings = resolve.target_weight_bytes(weight_bytes, params, dtype, sb, man, from_trace, tp, assumptions)
    kv, kv_src = resolve.kv_bytes(kv_bytes_per_token, sb, man, tp=tp, context=context, batch=batch, assumptions=assumptions)
    draft = resolve.draft_bytes(draft_bytes, draft_forwards, draft_sharded, sb, man, src, tp, assumptions)

    if draft_note and draft is not None and target is not None and draft:
        warnings.append(draft_note)
    if from_trace is not None:  # (breakdown: what a user should know of the bytes a trace's step reads)
        if sb is not None and kv is None:
            warnings.append("KV-cache bytes unknown: pass --context N (tokens of KV cache each sequence reads per "
                            "step); the floor counts the weights only")
        warnings.extend(trace_warnings)
        if target is None:
            warnings.append("weight bytes per step unknown: pass --model PATH or --weight-bytes N (or capture with "
                            "tracekit capture, whose manifest records them)")
        elif src in ("flag", "model") and not parallel.known:
            warnings.append(f"tensor parallelism unknown ({parallel.evidence}): the model's bytes are not divided "
                            "(--tp 1 assumed; pass --tp N)")
    inputs = {"tp": tp, "tp_source": parallel.source, "ep": ep, "batch": batch, "context": context,
              "draft_forwards": draft_forwards, "verify_tokens": verify_tokens}
    return ResolvedBytes(target_bytes_per_step=int(round(target)) if target is not None else None,
                         weight_bytes_source=src if target is not None else None,
                         draft_bytes_per_step=int(draft) if draft is not None and target is not None else None,
                         kv_bytes_per_step=kv, kv_bytes_source=kv_src, parallel=parallel, step=sb, model=m,
                         assumptions=tuple(assumptions), warnings=tuple(warnings), inputs=inputs)


__all__ = ["ResolvedBytes", "resolve_bytes", "tp_from_process_groups"]
