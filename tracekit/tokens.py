"""Tokens per step: how many tokens (sequences) a decode step produces without speculation — the batch — and
where that figure comes from (contract ``roofline.tokens_per_step``, ``tokens_per_step_source``).

One resolver, precedence as everywhere: ``--tokens-per-step`` flag > the manifest beside the trace > the engine's
own step annotations in the trace (SGLang ``step[DECODE bs=128]``, vLLM ``execute_context_0(0)_generation_32(32)``
/ ``generation_32``, TensorRT-LLM ``N gen reqs``; the median over the analysed steps) > 1 (``default``: then every
tokens/s figure is per sequence, and says so). :attr:`TokensPerStep.unit` is the words every tok/s figure carries.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from tracekit.trace import Trace


@dataclass(frozen=True)
class TokensPerStep:
    """The batch a step decodes: ``value`` tokens per step (per sequence: 1), ``source`` flag | manifest |
    annotation | default, ``detail`` (what was read, for annotations)."""

    value: float
    source: str
    detail: str | None = None

    @property
    def unit(self) -> str:
        """What a tok/s figure computed with :attr:`value` counts: the whole batch, or one sequence."""
        if self.source == "default":
            return "tok/s per sequence (batch unknown: --tokens-per-step N gives the whole batch's)"
        if self.value == 1:
            return "tok/s (batch of 1)"
        return f"tok/s for the whole batch of {self.value:g}"


def tok_s_unit(roofline: dict) -> str:
    """The words of a tok/s figure of a breakdown's ``roofline`` block (its ``tokens_per_step_source`` and value)."""
    src = roofline.get("tokens_per_step_source") or "default"
    tps = roofline.get("tokens_per_step")
    return TokensPerStep(float(tps) if tps else 1.0, src).unit


def annotated_batch(trace: Trace, windows: pl.DataFrame) -> tuple[float, str] | None:
    """The batch the engine's step annotations name for ``windows`` (median over the steps that name one) and the
    first such annotation, or None."""
    from tracekit.analyses.phase import annotation_phases

    if trace.ranges.height == 0 or windows.height == 0:
        return None
    ann = annotation_phases(trace, windows).filter(pl.col("bs").is_not_null() & (pl.col("bs") > 0))
    if ann.height == 0:
        return None
    return float(ann["bs"].median()), str(ann.sort("step")["evidence"][0])


def resolve_tokens_per_step(flag: float | None, manifest: dict | None, trace: Trace,
                            windows: pl.DataFrame) -> TokensPerStep:
    """The batch of the analysed steps (``windows``: their step windows): flag > manifest > annotations > 1."""
    if flag is not None:
        return TokensPerStep(float(flag), "flag")
    if manifest and manifest.get("tokens_per_step") is not None:
        return TokensPerStep(float(manifest["tokens_per_step"]), "manifest")
    found = annotated_batch(trace, windows)
    if found is not None:
        value, seen = found
        return TokensPerStep(value, "annotation", f"batch {value:g} from the step annotations ({seen})")
    return TokensPerStep(1.0, "default")


__all__ = ["TokensPerStep", "resolve_tokens_per_step", "annotated_batch", "tok_s_unit"]
