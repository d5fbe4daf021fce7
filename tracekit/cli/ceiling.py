"""``tracekit ceiling``: the tok/s ceiling before any trace (the library call is ``tracekit.ceiling``; its options
are declared in ``tracekit.options.OPTIONS``, shared with ``breakdown`` where they mean the same)."""

from __future__ import annotations

from pathlib import Path

import click

from tracekit.cli.options import ceiling_options, output_options
from tracekit.cli.output import emit


@click.command("ceiling")
@ceiling_options
@output_options(("table", "md", "json"))
def ceiling(opts, fmt, output, color):
    """How fast could decode be? The memory and compute ceilings, without a trace.

    The floor per step is the larger of the weight and KV reads at peak bandwidth and the
    FLOPs at the dense peak TFLOP/s for the weights' dtype (`bound` says which).

    Example: tracekit ceiling --gpu "RTX A6000" --params 27e9 --dtype fp8 --tp 2 --accept-len 3.2 --measured-tok-s 55

    Or from the model's own files: tracekit ceiling --gpu H200 --model PATH --tp 2 --batch 8 --context 8192
    """
    from tracekit.results.ceiling import ceiling as run

    emit("ceiling", run(**opts.analysis_kwargs()), fmt, None if output is None else Path(output), color)


COMMANDS = (ceiling,)
