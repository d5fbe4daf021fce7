"""``tracekit capture`` (GPU host): run a decode workload under nsys or the torch profiler, or (``--server URL``)
profile a running SGLang or vLLM server through its HTTP API.

The drivers are ``tracekit.capture`` (workloads) and ``tracekit.server`` (servers), standard library and click
only; this module is their click command. None of them imports polars or torch, so ``PYTHONPATH=. python -m
tracekit capture ...`` runs on a GPU host that has only torch and click (tests/test_architecture.py checks it);
after a server capture the breakdown of the rank directory is printed where polars is installed (else the command
to run is).
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from tracekit.capture import ALLREDUCE_CHOICES, WORKLOADS
from tracekit.cli.app import fail
from tracekit.errors import TracekitError


@click.command("capture", context_settings=dict(ignore_unknown_options=True, allow_extra_args=True,
                                                help_option_names=["-h", "--help"]))
@click.option("--workload", type=click.Choice(sorted(WORKLOADS)), default=None,
              help="sglang (a real SGLang engine), hf (transformers, random weights), synthetic (calibration), "
                   "spec / serve / kv (plain-torch loops shaped like SGLang's speculative worker, scheduler, long "
                   "context), lora / moe / sp (LoRA adapters, routed experts, sequence-parallel collectives; "
                   "docs/capture.md)")
@click.option("--profiler", type=click.Choice(["nsys", "torch"]), default=None,
              help="nsys or torch (required with --workload)")
@click.option("--out", "out", type=click.Path(file_okay=False), required=True, help="output folder")
@click.option("--steps", type=click.IntRange(1), default=None,
              help="profiled decode steps [default: 16; with --server: 20]")
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
@click.option("--server", "server", default=None, metavar="URL",
              help="profile a running SGLang or vLLM server at URL instead of a workload (docs/server.md)")
@click.option("--engine", type=click.Choice(["auto", "sglang", "vllm"]), default="auto", show_default=True,
              help="with --server: which engine serves URL")
@click.option("--concurrency", type=click.IntRange(1), default=1, show_default=True,
              help="with --server: streamed requests in flight (the decode batch)")
@click.option("--decode-tokens", type=click.IntRange(2), default=128, show_default=True,
              help="with --server: new tokens per timed request (ignore_eos)")
@click.option("--prompt-tokens", type=click.IntRange(1), default=256, show_default=True,
              help="with --server: prompt tokens per request")
@click.option("--server-dir", default=None, metavar="PATH",
              help="with --server: the folder the server writes its traces into, as both hosts see it "
                   "[default: --out; vLLM: its torch_profiler_dir]")
@click.option("--repeats", type=click.IntRange(1), default=3, show_default=True,
              help="with --server: timed repetitions of the unprofiled load")
@click.option("--trace-timeout", type=click.FloatRange(min=0, min_open=True), default=300.0, show_default=True,
              help="with --server: seconds to wait for every rank's trace")
@click.option("--settle", type=click.FloatRange(min=0), default=2.0, show_default=True,
              help="with --server: seconds a trace file's size must stay unchanged to count as written")
@click.option("--request-timeout", type=click.FloatRange(min=0, min_open=True), default=300.0, show_default=True,
              help="with --server: seconds to wait for an answer or the next streamed token")
@click.option("--no-analyse", "no_analyse", is_flag=True,
              help="with --server: write the traces and manifest.json only, do not print the breakdown")
@click.argument("workload_args", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def capture_command(ctx, workload, profiler, out, steps, mode, spec, nsys, nsys_graph_trace, peak_bw,
                    tp, allreduce, server, engine, concurrency, decode_tokens, prompt_tokens, server_dir, repeats,
                    trace_timeout, settle, request_timeout, no_analyse, workload_args):
    """Run a decode WORKLOAD under nsys or the torch profiler; write the trace and manifest.json to --out.
    With --server URL: profile a running SGLang or vLLM server (its own profiler, one trace per rank).

    Options it does not know (e.g. --size large, --layers 8) are passed to the workload script.
    """
    args = sys.argv[1:]
    argv = ["tracekit", "capture", *(args[args.index("capture") + 1:] if "capture" in args else args)]
    if server is not None:
        _server_capture(ctx, argv=argv, url=server, out=Path(out), workload=workload, profiler=profiler,
                        steps=steps, engine=engine, concurrency=concurrency, decode_tokens=decode_tokens,
                        prompt_tokens=prompt_tokens, server_dir=server_dir, repeats=repeats,
                        trace_timeout=trace_timeout, settle=settle, request_timeout=request_timeout,
                        no_analyse=no_analyse, extra=tuple(workload_args) + tuple(ctx.args))
        return
    if workload is None or profiler is None:
        raise click.UsageError("give --workload and --profiler (a decode loop of ours), or --server URL (a running "
                               "SGLang or vLLM server)", ctx=ctx)
    steps = 16 if steps is None else steps
    from tracekit.capture import capture

    try:  # (the command also runs on its own, outside the group: tests, a GPU host's scripts)
        m = capture(workload=workload, profiler=profiler, out=Path(out), steps=steps, mode=mode, spec=spec,
                    nsys=nsys, nsys_graph_trace=nsys_graph_trace, peak_bw=peak_bw,
                    extra=tuple(workload_args) + tuple(ctx.args), argv=argv, tp=tp, allreduce=allreduce)
    except TracekitError as e:
        fail(e)
    click.echo(f"tracekit capture: wrote {Path(out) / 'manifest.json'} "
               f"(unprofiled step {m['unprofiled_step_ms']:.3f} ms, weight bytes/step {m['weight_bytes_per_step']})")


def _server_capture(ctx, *, argv, url, out, workload, profiler, steps, engine, concurrency, decode_tokens,
                    prompt_tokens, server_dir, repeats, trace_timeout, settle, request_timeout, no_analyse, extra):
    if workload is not None or extra:
        what = "--workload" if workload is not None else f"{' '.join(extra)}"
        raise click.UsageError(f"--server profiles a running server: {what} does not apply", ctx=ctx)
    if profiler == "nsys":
        raise click.UsageError("--server uses the server's own torch profiler; for nsys see docs/server.md", ctx=ctx)
    from tracekit.server import DEFAULT_STEPS, capture_server

    try:
        m = capture_server(url=url, out=out, engine=engine, steps=steps or DEFAULT_STEPS, concurrency=concurrency,
                           decode_tokens=decode_tokens, prompt_tokens=prompt_tokens, server_dir=server_dir,
                           repeats=repeats, trace_timeout=trace_timeout, settle=settle,
                           request_timeout=request_timeout, argv=argv)
    except TracekitError as e:
        fail(e)
    spec = m.get("spec") or {}
    acc = f", accept length {spec['accept_len']:.3f}" if spec.get("accept_len") else ""
    wb = m.get("weight_bytes_per_step")
    click.echo(f"tracekit capture: wrote {out / 'manifest.json'} ({len(m['trace_files'])} rank trace(s); unprofiled "
               f"step {m['unprofiled_step_ms']:.3f} ms{acc}; tp {m['tp']}; weight bytes/step "
               f"{wb if wb is not None else 'unknown'})")
    for w in m.get("warnings") or []:
        click.echo(f"warning: {w}", err=True)
    if no_analyse:
        return
    import importlib.util

    if importlib.util.find_spec("polars") is None:
        click.echo(f"tracekit capture: polars is not installed here; analyse with: tracekit breakdown {out}")
        return
    from tracekit.cli.analysis import breakdown

    click.echo(f"tracekit capture: tracekit breakdown {out}")
    ctx.invoke(breakdown, traces=(out,))


COMMANDS = (capture_command,)
