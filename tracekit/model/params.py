"""Parameters (elements) of a config's model, by scope: from the tensors its config implies
(:func:`tracekit.model.synth.tensor_shapes`, classified by :mod:`tracekit.model.roles`), any dtype."""

from __future__ import annotations

import math
from dataclasses import dataclass

from tracekit.model.arch import Arch
from tracekit.model.roles import classify
from tracekit.model.synth import tensor_shapes


@dataclass(frozen=True)
class ParamCounts:
    """Parameters (elements) of a config's model, by scope."""

    total: int             # main model: every layer, embedding, lm_head (tied: once); no MTP layers
    with_mtp: int          # total + the MTP/next-n layers as the checkpoint stores them
    active_per_token: int  # main model, one token's forward: top-k experts + shared, embedding included
    embedding: int
    lm_head: int
    mtp: int


def param_counts(arch: Arch) -> ParamCounts:
    """Count parameters from the config (synthesized HF tensors; element counts, any dtype)."""
    total = mtp = embedding = lm_head = routed = 0
    for name, shape, _ in tensor_shapes(arch):
        n = math.prod(shape)
        r = classify(name, len(shape), layers=arch.layers)
        if r.draft:
            mtp += n
            continue
        total += n
        if r.group == "embedding":
            embedding += n
        elif r.group == "lm_head":
            lm_head += n
        elif r.group == "experts":
            routed += n
    active = total - routed + (routed * arch.top_k // arch.experts if arch.experts else 0)
    return ParamCounts(total=total, with_mtp=total + mtp, active_per_token=active, embedding=embedding,
                       lm_head=lm_head if not arch.tied else embedding, mtp=mtp)
