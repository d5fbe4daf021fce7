"""Tokens per step: how many tokens (sequences) a decode step produces without speculation — the batch — and
where that figure comes from (contract ``roofline.tokens_per_step``, ``tokens_per_step_source``).

The value and its words; the resolver (``--tokens-per-step`` flag > the manifest beside the trace > the engine's own
step annotations in the trace > 1, ``default``: then every tokens/s figure is per sequence, and says so) is
``tracekit.analyses.resolve.tokens_per_step``. :attr:`TokensPerStep.unit` is the words every tok/s figure carries.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TokensPerStep:
    """The batch a step decodes: ``value`` tokens per step (per sequence: 1), ``source`` flag | manifest |
    annotation | default, ``detail`` (what was read, for annotations)."""

    value: float
    source: str
    detail: str | None = None

    @property
    def unit(self) -> str:
        """What a tok/s figure computed with :attr:`value` (the batch) counts: the whole batch, or one sequence.
        No parentheses: the words often stand inside some ("(4,858 tok/s for a batch of 1)").

        >>> TokensPerStep(1.0, "manifest").unit, TokensPerStep(32.0, "annotation").unit
        ('tok/s for a batch of 1', 'tok/s for the whole batch of 32')
        """
        if self.source == "default":
            return "tok/s per sequence, batch unknown: --tokens-per-step N gives the whole batch's"
        if self.value == 1:
            return "tok/s for a batch of 1"
        return f"tok/s for the whole batch of {self.value:g}"


def tok_s_unit(roofline) -> str:
    """The words of a tok/s figure of a breakdown's ``roofline`` block: its ``tokens_per_s_unit`` (the batch's
    words, written by the analysis); for a breakdown saved without it, from its ``tokens_per_step_source`` and
    tokens per step."""
    unit = roofline.get("tokens_per_s_unit")
    if unit:
        return unit
    src = roofline.get("tokens_per_step_source") or "default"
    tps = roofline.get("tokens_per_step")
    return TokensPerStep(float(tps) if tps else 1.0, src).unit


__all__ = ["TokensPerStep", "tok_s_unit"]
