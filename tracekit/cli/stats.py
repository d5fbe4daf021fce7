"""``tracekit stats``: the tables an ``nsys stats`` user looks for first (``tracekit.results.stats``)."""

from __future__ import annotations

from pathlib import Path

import click

from tracekit.cli.options import OPTION, click_option, device_option, output_options, rules_option
from tracekit.cli.output import emit, load


@click.command()
@click.argument("trace", type=click.Path(exists=False, path_type=Path), metavar="TRACE")
@device_option("Restrict the GPU tables to this GPU and take its steps (default: every GPU; the busiest's steps).")
@click_option(OPTION["step_range"])
@click_option(OPTION["draft_range"])
@rules_option
@click.option("--top", type=click.IntRange(min=1), default=None,
              help="Rows per table in table and md (default: 20; json and csv always have every row).")
@output_options()
def stats(trace, device, step_range, draft_range, rules, top, fmt, output, color):
    """The nsys stats tables: kernels, memcpy/memset, CUDA API calls, NVTX ranges, GPU and stream utilisation,
    kernel time outside the steps, and kernel time by what launched it (API call, op, module, range).

    The kernels, memory operation, API and range tables sum as `nsys stats` reports cuda_gpu_kern_sum,
    cuda_gpu_mem_time_sum, cuda_api_sum and nvtx_sum do. Example:
    tracekit stats sample_traces/hf-small-eager/trace.sqlite --format md
    """
    from dataclasses import replace

    from tracekit.run.stats import stats as stats_of

    result = stats_of(load(trace, fmt == "json"), device=device, rules=rules, step_range=step_range,
                      draft_range=draft_range)
    emit("stats", result if top is None else replace(result, shown=top), fmt, output, color)


COMMANDS = (stats,)
