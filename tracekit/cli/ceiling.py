"""``tracekit ceiling``: the tok/s ceiling before any trace (the library call is ``tracekit.ceiling``)."""

from __future__ import annotations

from pathlib import Path

import click

from tracekit.analyses.ceiling import DTYPES
from tracekit.cli.options import BYTES, COUNT, POSITIVE, output_options
from tracekit.cli.output import emit


@click.command("ceiling")
@click.option("--gpu", metavar="NAME",
              help="GPU name as a trace or nvidia-smi shows it, e.g. 'RTX A6000', 'NVIDIA H200'.")
@click.option("--weight-bytes", type=BYTES,
              help="Weight bytes a step reads (whole model, all GPUs): 27e9, 13.5GB, 25.1GiB.")
@click.option("--params", type=COUNT, help="Parameter count read per step (with --dtype): 27e9, 27B.")
@click.option("--dtype", type=click.Choice(DTYPES),
              help="Weight dtype for --params (default bf16) or a bare config.json (default: its own).")
@click.option("--model", "--model-config", "model", metavar="PATH",
              help="Model folder / HF snapshot (config.json + safetensors headers) or a config.json.")
@click.option("--tp", type=click.IntRange(min=1), default=1, show_default=True,
              help="Tensor-parallel GPUs the weights are split over.")
@click.option("--ep", type=click.IntRange(min=1), default=1, show_default=True,
              help="Expert-parallel GPUs the experts are split over (with --model).")
@click.option("--accept-len", type=POSITIVE, help="Mean tokens accepted per speculative step.")
@click.option("--draft-bytes", type=BYTES, default=0, help="Draft model weight bytes (speculative decoding).")
@click.option("--draft-forwards", type=click.FloatRange(min=0), default=0,
              help="Draft forward passes per step (a --model's MTP layers when no --draft-bytes).")
@click.option("--draft-replicated", is_flag=True,
              help="The draft model is not split over --tp (each GPU reads all of it).")
@click.option("--batch", type=click.IntRange(min=1), default=1, show_default=True, help="Sequences decoded per step.")
@click.option("--kv-bytes-per-token", type=BYTES, help="KV cache bytes per token, whole model (all layers, K and V).")
@click.option("--context", type=click.IntRange(min=0), default=0, help="Context length whose KV cache each step reads.")
@click.option("--kv-dtype", type=click.Choice(DTYPES), help="KV cache dtype with --model (default: the model's dtype).")
@click.option("--peak-bw", type=POSITIVE, metavar="GBPS", help="Peak memory bandwidth, GB/s; overrides the GPU table.")
@click.option("--measured-tok-s", type=POSITIVE, metavar="X", help="Your measured tokens/s, to compare with the ceiling.")
@output_options(("table", "md", "json"))
def ceiling(gpu, weight_bytes, params, dtype, model, tp, ep, accept_len, draft_bytes, draft_forwards,
            draft_replicated, batch, kv_bytes_per_token, context, kv_dtype, peak_bw, measured_tok_s, fmt, output,
            color):
    """How fast could decode be? The memory-bandwidth ceiling, without a trace.

    Example: tracekit ceiling --gpu "RTX A6000" --params 27e9 --dtype fp8 --tp 2 --accept-len 3.2 --measured-tok-s 55

    Or from the model's own files: tracekit ceiling --gpu H200 --model PATH --tp 2 --batch 8 --context 8192
    """
    import tracekit

    if not gpu and peak_bw is None:
        raise click.UsageError("give --gpu NAME or --peak-bw GBPS")
    if draft_bytes and not draft_forwards:
        raise click.UsageError("--draft-bytes needs --draft-forwards K (draft forward passes per step)")
    if (params is not None and (weight_bytes is not None or model is not None)) or \
            (weight_bytes is None and params is None and model is None):
        raise click.UsageError("give exactly one of --weight-bytes N, --params N (with --dtype) or --model PATH "
                               "(--weight-bytes may go with --model: it replaces the weights term)")
    result = tracekit.ceiling(gpu=gpu, weight_bytes=weight_bytes, params=params, dtype=dtype, model=model, tp=tp, ep=ep,
                              accept_len=accept_len, draft_bytes=draft_bytes, draft_forwards=draft_forwards,
                              draft_sharded=not draft_replicated, batch=batch, kv_bytes_per_token=kv_bytes_per_token,
                              context=context, kv_dtype=kv_dtype, peak_bw=peak_bw, measured_tok_s=measured_tok_s)
    emit("ceiling", result, fmt, None if output is None else Path(output), color)


COMMANDS = (ceiling,)
