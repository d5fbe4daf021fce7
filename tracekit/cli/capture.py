"""``tracekit capture`` (GPU host): run a decode workload under nsys or the torch profiler.

The driver is ``tracekit.capture`` (standard library and click only); this module is its click command.
Neither imports polars or torch, so ``PYTHONPATH=. python -m tracekit capture ...`` runs on a GPU host that
has only torch and click (tests/test_architecture.py checks it).
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from tracekit.capture import ALLREDUCE_CHOICES, WORKLOADS
from tracekit.errors import TracekitError


@click.command("capture", context_settings=dict(ignore_unknown_options=True, allow_extra_args=True,
                                                help_option_names=["-h", "--help"]))
@click.option("--workload", type=click.Choice(sorted(WORKLOADS)), required=True,
              help="sglang (a real SGLang engine), hf (transformers, random weights), synthetic (calibration), "
                   "spec / serve / kv (plain-torch loops shaped like SGLang's speculative worker, scheduler, long "
                   "context), lora / moe / sp (LoRA adapters, routed experts, sequence-parallel collectives; "
                   "docs/capture.md)")
@click.option("--profiler", type=click.Choice(["nsys", "torch"]), required=True)
@click.option("--out", "out", type=click.Path(file_okay=False), required=True, help="output folder")
@click.option("--steps", type=click.IntRange(1), default=16, show_default=True, help="profiled decode steps")
@click.option("--mode", type=click.Choice(["eager", "graph", "compile"]), default="eager", show_default=True,
              help="hf/synthetic: eager, CUDA graph replay, torch.compile; sglang: eager disables its CUDA graphs")
@click.option("--spec", type=click.IntRange(0), default=None, help="speculative decoding: K draft tokens")
@click.option("--nsys", "nsys", default=None, help="the nsys binary (else $NSYS, PATH, usual install folders)")
@click.option("--nsys-graph-trace", type=click.Choice(["node", "graph"]), default="node", show_default=True,
              help="--cuda-graph-trace for nsys: node (per-kernel rows) or graph (whole graphs)")
@click.option("--peak-bw", type=click.FloatRange(min=0, min_open=True), default=None,
              help="GPU peak memory bandwidth in GB/s to record in the manifest")
@click.option("--tp", type=click.IntRange(1), default=None,
              help="tensor parallelism: N processes, one per GPU (hf/synthetic via torchrun; sglang: its --tp)")
@click.option("--allreduce", type=click.Choice([*ALLREDUCE_CHOICES, "symm", "none"]), default=None,
              help="with --tp (hf/synthetic): the all-reduce after each row-parallel linear [default: nccl]; "
                   "synthetic without --tp: none|symm (world-of-one one_shot_all_reduce)")
@click.argument("workload_args", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def capture_command(ctx, workload, profiler, out, steps, mode, spec, nsys, nsys_graph_trace, peak_bw,
                    tp, allreduce, workload_args):
    """Run a decode WORKLOAD under nsys or the torch profiler; write the trace and manifest.json to --out.

    Options it does not know (e.g. --size large, --layers 8) are passed to the workload script.
    """
    args = sys.argv[1:]
    argv = ["tracekit", "capture", *(args[args.index("capture") + 1:] if "capture" in args else args)]
    from tracekit.capture import capture

    try:
        m = capture(workload=workload, profiler=profiler, out=Path(out), steps=steps, mode=mode, spec=spec,
                    nsys=nsys, nsys_graph_trace=nsys_graph_trace, peak_bw=peak_bw,
                    extra=tuple(workload_args) + tuple(ctx.args), argv=argv, tp=tp, allreduce=allreduce)
    except TracekitError as e:
        click.echo(f"tracekit: error: {e}", err=True)
        ctx.exit(2)
    click.echo(f"tracekit capture: wrote {Path(out) / 'manifest.json'} "
               f"(unprofiled step {m['unprofiled_step_ms']:.3f} ms, weight bytes/step {m['weight_bytes_per_step']})")


COMMANDS = (capture_command,)
