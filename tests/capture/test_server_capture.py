"""``tracekit capture --server URL`` against the TEST SERVERS of ``tests/servers`` (SGLang's and vLLM's HTTP API as
their source defines it, in front of a simulated decode loop on the CPU) that write REAL traces: a committed sample
(``sample_traces/spec-small-graph-torch``, our SGLang-shaped EAGLE loop on an H200) and the shared 4-rank SGLang
set (``lora_perf_lora_profile``, GB300 TP4: read in place, copied only into the test's temporary folder).

What is checked against figures known independently: the decode step the test server's scheduler takes
(``STEP_S``; a profiled step is ``SLOWDOWN`` times longer, so a step measured from the profiled run would show),
its acceptance pattern (2, 3, 1, 4 tokens per step: 2.5 exactly), the server's own settings (tp, speculative
steps), the rank files' bytes (the copies equal their sources), the model's bytes (``torch_counts.json``: torch's
own count made on the H200), and the analysis applying the manifest to every rank with no flag typed. Every error
path of the contract: one line, exit 2, and the server left not profiling.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.servers.common import App, SimScheduler, TestServer, send_text
from tests.servers.sglang import CopyTraces, SGLangApp
from tests.servers.sglang import serve as serve_sglang
from tests.servers.vllm import VLLMApp
from tests.servers.vllm import serve as serve_vllm
from tracekit.cli import cli
from tracekit.manifest import read_manifest

from conftest import DATA, ROOT, sample, shared

STEP_S = 0.004          # the test server's decode step (s): below the recorded trace's traced 5.5 ms
SLOWDOWN = 5.0          # ... while its profiler runs


def assert_unprofiled_step(m: dict, sched) -> None:
    """The manifest's unprofiled step is the test server's own unprofiled decode step (as its loop timed it: on a
    loaded machine a 4 ms sleep takes longer), not its profiled one (SLOWDOWN x longer)."""
    own, profiled = sched.taken_ms(False), sched.taken_ms(True)
    assert 0.9 * own <= m["unprofiled_step_ms"] < 0.5 * (own + profiled), (m["unprofiled_step_ms"], own, profiled)
    assert 0.9 * STEP_S * 1e3 <= m["unprofiled_step_ms"]
CYCLE = (2, 3, 1, 4)    # tokens accepted per step, in turn: 2.5 per step
EAGLE = {"speculative_algorithm": "EAGLE", "speculative_num_steps": 3, "speculative_eagle_topk": 1,
         "speculative_num_draft_tokens": 4}
FAST = ["--settle", "0.1", "--repeats", "2", "--steps", "4", "--decode-tokens", "21", "--prompt-tokens", "16",
        "--request-timeout", "20", "--trace-timeout", "20"]
LORA = "lora_perf_lora_profile/runs/Qwen3-30B-A3B-Instruct-2507-BF16-expert_shared-20260609-133913/" \
       "current_base_lora/profile/base"


def sha(p: Path) -> str:
    return hashlib.sha256(Path(p).read_bytes()).hexdigest()


def run(*args) -> object:
    r = CliRunner().invoke(cli, ["capture", *map(str, args)])
    return r


def one_error_line(r) -> str:
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert r.exit_code == 2, (r.exit_code, r.stdout[-2000:], r.stderr)
    assert len(lines) == 1 and lines[0].startswith("tracekit: error: "), r.stderr
    return lines[0]


@pytest.fixture
def servers():
    """Start test servers (stopped at the end): ``make("sglang"|"vllm", sources=[...], **app_options)``."""
    started = []

    def make(kind: str, sources=(), chunk_s: float = 0.0, step_s: float = STEP_S, cycle=(1,), **kw):
        holder = {}
        sched = SimScheduler(step_s=step_s, accept_cycle=cycle,
                             slowdown=lambda: SLOWDOWN if holder["app"].profiling else 1.0)
        backend = CopyTraces(sources, chunk_s)
        app = (SGLangApp if kind == "sglang" else VLLMApp)(sched=sched, backend=backend, **kw)
        holder["app"] = app
        srv = (serve_sglang if kind == "sglang" else serve_vllm)(app)
        started.append(srv)
        return app, srv

    yield make
    for s in started:
        s.stop()


def spec_trace() -> Path:
    return sample("spec-small-graph-torch/trace.json.gz")


# ------------------------------------------------------------------------------------------------
# SGLang: one rank, speculative, the model's files on this machine
# ------------------------------------------------------------------------------------------------

def test_sglang_speculative_capture_and_breakdown(servers, tmp_path):
    sys.path.insert(0, str(DATA / "h200_checkpoints"))
    from materialize import materialize

    model = materialize("bf16", tmp_path)
    counts = json.loads((DATA / "h200_checkpoints/bf16/torch_counts.json").read_text())["step_read"]
    app, srv = servers("sglang", [spec_trace()], cycle=CYCLE, speculative=EAGLE, model_path=str(model))
    out = tmp_path / "cap"
    r = run("--server", srv.url, "--out", out, *FAST)
    assert r.exit_code == 0, r.stderr + r.stdout[-2000:]
    m = json.loads((out / "manifest.json").read_text())
    assert m["schema"] == "tracekit.manifest/2" and m["workload"] == "sglang-server" and m["profiler"] == "torch"
    # the server's own settings: tp and the speculative steps (a top-1 chain drafts speculative_num_steps tokens)
    assert m["tp"] == 1 and m["spec"]["draft_tokens"] == 3
    assert m["server"]["engine"] == "sglang" and m["server"]["model_path"] == str(model)
    assert m["server"]["config"]["speculative_algorithm"] == "EAGLE"
    # acceptance from meta_info.spec_verify_ct: 20 tokens after the first over 8 verify steps
    assert m["spec"]["accept_len"] == 2.5
    # the unprofiled step: the scheduler's step, not the profiled one (SLOWDOWN x longer)
    lo, hi = m["unprofiled_step_ms_spread"]
    assert lo <= m["unprofiled_step_ms"] <= hi
    assert_unprofiled_step(m, app.sched)
    assert m["tokens_per_step"] == m["concurrency"] == 1
    # weight bytes from the model's files: the target + the MTP layer x speculative_num_steps forwards (SGLang's
    # draft graph runs num_steps - 1, the draft-extend one more), against torch's own count on the H200
    assert m["weight_bytes_per_step"] == counts["target_bytes"] + 3 * counts["draft_bytes_per_forward"]
    assert m["draft_model"]["forwards_per_step"] == 3
    # one rank file, named as SGLang names it, byte-identical to the recorded trace, listed in trace_files
    [entry] = m["trace_files"]
    assert entry["name"].endswith("-TP-0.trace.json.gz") and sha(out / entry["name"]) == sha(spec_trace())
    assert not app.profiling and app.profiler.exports and app.backend.options["with_stack"] is True
    assert app.backend.options["record_shapes"] is True and m["profile"]["stopped_by"] in ("num_steps",
                                                                                          "stop_profile")
    # the printed breakdown states its savings against the manifest's step, no flag typed
    assert "unprofiled (manifest" in r.stdout
    b = json.loads(CliRunner().invoke(cli, ["breakdown", str(out), "--format", "json"]).stdout)
    assert b["time_base"]["unprofiled_step_ms"] == m["unprofiled_step_ms"]
    assert b["time_base"]["unprofiled_source"] == "manifest"
    assert b["roofline"]["tp_source"] == "manifest" and b["roofline"]["tokens_per_step_source"] == "manifest"
    assert b["roofline"]["weight_bytes_source"] == "manifest"
    assert b["manifest"]["workload"] == "sglang-server"


def test_sglang_newest_api_final_only_meta_and_concurrency(servers, tmp_path):
    """A newer SGLang: only /server_info and /model_info, spec_verify_ct only in the finished chunk; three requests
    in flight."""
    app, srv = servers("sglang", [spec_trace()], cycle=CYCLE, speculative=EAGLE, api="newest", spec_meta="final")
    out = tmp_path / "cap"
    r = run("--server", srv.url, "--out", out, "--concurrency", 3, "--no-analyse", *FAST)
    assert r.exit_code == 0, r.stderr + r.stdout[-2000:]
    m = json.loads((out / "manifest.json").read_text())
    assert m["spec"]["accept_len"] == 2.5 and m["tokens_per_step"] == m["concurrency"] == 3
    assert all(len(rep["per_request_step_ms"]) == 3 for rep in m["unprofiled"]["repetitions"])
    assert m["weight_bytes_per_step"] is None and any("not on this machine" in w for w in m["warnings"])
    assert not app.profiling


# ------------------------------------------------------------------------------------------------
# SGLang: a real multi-rank set
# ------------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_sglang_tp4_rank_set_collected_and_analysed_together(servers, tmp_path):
    srcs = [shared(f"{LORA}/bs16-TP-{r}.trace.json.gz") for r in range(4)]
    app, srv = servers("sglang", srcs, tp=4, chunk_s=0.05, api="new")
    out = tmp_path / "cap"
    r = run("--server", srv.url, "--out", out, "--concurrency", 2, "--no-analyse", *FAST)
    assert r.exit_code == 0, r.stderr + r.stdout[-3000:]
    m = json.loads((out / "manifest.json").read_text())
    assert m["tp"] == 4 and m["spec"] is None and m["tokens_per_step"] == 2
    names = [e["name"] for e in m["trace_files"]]
    assert [n.split("-TP-")[1] for n in names] == [f"{r}.trace.json.gz" for r in range(4)]
    assert [rt["tp"] for rt in m["rank_traces"]] == [0, 1, 2, 3]
    assert [sha(out / n) for n in names] == [sha(s) for s in srcs]   # every rank, whole (written in 4 pieces)
    assert not app.profiling
    b = json.loads(CliRunner().invoke(cli, ["breakdown", str(out), "--format", "json"]).stdout)
    assert len(b["ranks"]) == 4
    assert all(rk["time_base"]["unprofiled_source"] == "manifest" for rk in b["ranks"])
    assert all(rk["roofline"]["tp_source"] == "manifest" and rk["roofline"]["tp"] == 4 for rk in b["ranks"])


def test_sglang_data_parallel_names(servers, tmp_path):
    """tp 2 x dp 2: four schedulers, files ...-TP-t-DP-d...; all four expected and collected (the recorded
    traces are the TP4 set's, under the names a tp 2 x dp 2 server gives them)."""
    srcs = [shared(f"{LORA}/bs16-TP-{r}.trace.json.gz") for r in range(4)]
    app, srv = servers("sglang", srcs, tp=2, dp=2)
    out = tmp_path / "cap"
    r = run("--server", srv.url, "--out", out, "--no-analyse", *FAST)
    assert r.exit_code == 0, r.stderr + r.stdout[-2000:]
    m = json.loads((out / "manifest.json").read_text())
    assert sorted((rt["dp"], rt["tp"]) for rt in m["rank_traces"]) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert all("-DP-" in e["name"] for e in m["trace_files"]) and m["tp"] == 2


# ------------------------------------------------------------------------------------------------
# vLLM
# ------------------------------------------------------------------------------------------------

def test_vllm_dev_mode_config_counters_and_profiler_dir(servers, tmp_path):
    vdir = tmp_path / "vllm_traces"
    spec = {"method": "eagle", "num_speculative_tokens": 3, "model": "test/eagle-head"}
    app, srv = servers("vllm", [spec_trace()], cycle=CYCLE, speculative=spec, profiler_dir=str(vdir), dev_mode=True)
    out = tmp_path / "cap"
    r = run("--server", srv.url, "--out", out, "--no-analyse", *FAST)
    assert r.exit_code == 0, r.stderr + r.stdout[-2000:]
    m = json.loads((out / "manifest.json").read_text())
    assert m["server"]["engine"] == "vllm" and m["tp"] == 1
    assert m["spec"] == {"draft_tokens": 3, "accept_len": 2.5}     # 1 + accepted / drafts, from /metrics
    assert m["parallel"]["sources"]["tp"].startswith("/server_info")
    [entry] = m["trace_files"]
    assert entry["name"].startswith("dp0_pp0_tp0_dcp0_ep0_rank0.") and entry["name"].endswith(".pt.trace.json.gz")
    assert (vdir / entry["name"]).is_file() and sha(out / entry["name"]) == sha(spec_trace())
    assert m["profile"]["server_dir"] == str(vdir) and not app.profiling
    assert_unprofiled_step(m, app.sched)


def test_vllm_without_dev_mode_reads_the_rest_from_metrics_and_names(servers, tmp_path):
    vdir = tmp_path / "vllm_traces"
    vdir.mkdir()
    (vdir / "dp0_pp0_tp0_dcp0_ep0_rank0.1.pt.trace.json.gz").write_bytes(b"an older capture's file")
    app, srv = servers("vllm", [spec_trace(), spec_trace()], cycle=CYCLE, tp=2, profiler_dir=str(vdir),
                       speculative={"method": "eagle", "num_speculative_tokens": 3})
    out = tmp_path / "cap"
    r = run("--server", srv.url, "--out", out, "--server-dir", vdir, "--no-analyse", *FAST)
    assert r.exit_code == 0, r.stderr + r.stdout[-2000:]
    m = json.loads((out / "manifest.json").read_text())
    assert m["tp"] == 2 and m["parallel"]["sources"]["tp"] == "trace file names"
    assert m["spec"] == {"draft_tokens": 3, "accept_len": 2.5}   # K = draft tokens / drafts
    assert len(m["trace_files"]) == 2 and all(not e["name"].endswith(".1.pt.trace.json.gz")
                                              for e in m["trace_files"])
    assert any("VLLM_SERVER_DEV_MODE" in w for w in m["warnings"])


# ------------------------------------------------------------------------------------------------
# every error: one line, exit 2, the server left not profiling
# ------------------------------------------------------------------------------------------------

def test_no_server_at_url(tmp_path):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    line = one_error_line(run("--server", f"http://127.0.0.1:{port}", "--out", tmp_path / "cap", *FAST))
    assert "no server at http://127.0.0.1" in line and "connection refused" in line
    assert not (tmp_path / "cap").exists()


def test_not_an_engine(tmp_path):
    class Other(App):
        def routes(self):
            return {("GET", "/"): lambda h, b, q: send_text(h, 200, "hello")}

    srv = TestServer(Other()).start()
    try:
        line = one_error_line(run("--server", srv.url, "--out", tmp_path / "cap", *FAST))
    finally:
        srv.stop()
    assert "is not an SGLang or vLLM server" in line and "/get_server_info: 404" in line


def test_vllm_without_profiler_config(servers, tmp_path):
    app, srv = servers("vllm", [spec_trace()])          # no --profiler-config: /start_profile is 404
    line = one_error_line(run("--server", srv.url, "--out", tmp_path / "cap", *FAST))
    assert "profiling is not enabled" in line and "--profiler-config" in line and "VLLM_TORCH_PROFILER_DIR" in line
    assert not app.profiling and app.profiler.starts == 0 and not (tmp_path / "cap").exists()


def test_vllm_dev_mode_without_profiler_fails_before_the_load(servers, tmp_path):
    app, srv = servers("vllm", [spec_trace()], dev_mode=True)
    line = one_error_line(run("--server", srv.url, "--out", tmp_path / "cap", *FAST))
    assert "--profiler-config" in line and app.sched.forward_ct == 0   # nothing was run


def test_sglang_already_profiling_is_left_alone(servers, tmp_path):
    app, srv = servers("sglang", [spec_trace()])
    other = tmp_path / "someone_else"
    urlopen_post(srv.url + "/start_profile", {"output_dir": str(other)})
    assert app.profiling
    line = one_error_line(run("--server", srv.url, "--out", tmp_path / "cap", *FAST))
    assert "profiling already in progress" in line and "/stop_profile" in line
    # the other session's profile runs on, untouched; nothing of ours was written
    assert app.profiling and app.profiler.output_dir == other and not app.profiler.exports
    assert not (tmp_path / "cap").exists()


def test_traces_that_never_appear(servers, tmp_path):
    """The server writes on its own file system (here: another folder, as a server on another host does)."""
    app, srv = servers("sglang", [spec_trace()], tp=2, write_elsewhere=tmp_path / "server_host")
    out = tmp_path / "cap"
    line = one_error_line(run("--server", srv.url, "--out", out, *FAST[:-2], "--trace-timeout", "1"))
    assert f"the traces did not appear in {out}" in line
    assert "rank files found: none (2 expected; missing TP-0, TP-1" in line
    assert "--server-dir" in line
    assert not app.profiling and len(app.profiler.exports) == 1   # stopped: its files went where it writes


def test_server_dying_mid_capture(servers, tmp_path):
    """The server goes away while it profiles: the capture ends with one line (no traceback); a server that is
    gone profiles nothing."""
    app, srv = servers("sglang", [spec_trace()], die_after_profiled_batches=2)
    line = one_error_line(run("--server", srv.url, "--out", tmp_path / "cap", *FAST))
    assert "went away mid-capture" in line and srv.url in line


def test_server_dying_before_its_traces_are_written(servers, tmp_path):
    """The server answers /stop_profile, then goes away while tracekit waits for the files."""
    import threading

    app, srv = servers("sglang", [spec_trace()], write_elsewhere=tmp_path / "server_host")
    out = tmp_path / "cap"
    stop = app.stop_profile

    def stop_then_die(h, body, q):
        try:
            stop(h, body, q)
        finally:
            threading.Timer(0.3, srv.die).start()

    app.stop_profile = stop_then_die
    line = one_error_line(run("--server", srv.url, "--out", out, *FAST[:-2], "--trace-timeout", "30"))
    assert "went away mid-capture" in line and "before its traces were written" in line
    assert not app.profiling


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_stops_the_profiler(servers, tmp_path, sig):
    app, srv = servers("sglang", [spec_trace()])
    out = tmp_path / "cap"
    p = subprocess.Popen([sys.executable, "-m", "tracekit", "capture", "--server", srv.url, "--out", str(out),
                          "--steps", "2000", "--repeats", "1", "--decode-tokens", "5", "--settle", "0.1"],
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        # (an event, not a polling loop: the capture may be slow to start on a loaded machine, and its profile of
        # 2000 steps at SLOWDOWN x STEP_S lasts 40 s, far longer than the signal takes to arrive)
        assert app.profiler.started.wait(120), p.communicate(timeout=60)
        assert app.profiling
        p.send_signal(sig)
        _, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
    # (click turns the KeyboardInterrupt into its Abort: "aborted", exit 130 as an interrupted command)
    lines = [x for x in err.splitlines() if x.strip()]
    assert p.returncode == 130 and lines in (["tracekit: error: aborted"], ["tracekit: error: interrupted"]), err
    assert not app.profiling and len(app.profiler.exports) == 1   # stopped by the capture on its way out


# ------------------------------------------------------------------------------------------------
# the command line, the capture side without polars, manifests /1 and /2
# ------------------------------------------------------------------------------------------------

def test_usage_errors(tmp_path):
    line = one_error_line(run("--out", tmp_path / "x"))
    assert "--workload and --profiler" in line and "--server URL" in line
    line = one_error_line(run("--server", "http://127.0.0.1:1", "--workload", "spec", "--out", tmp_path / "x"))
    assert "--workload does not apply" in line


def test_capture_side_runs_without_polars(servers, tmp_path):
    app, srv = servers("sglang", [spec_trace()])
    out = tmp_path / "cap"
    code = ("import sys; sys.modules['polars'] = None; from tracekit.cli import cli; "
            f"cli.main(args={['capture', '--server', srv.url, '--out', str(out), *FAST]!r})")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert f"polars is not installed here; analyse with: tracekit breakdown {out}" in p.stdout
    assert (out / "manifest.json").is_file() and not app.profiling


def test_manifest_v1_and_v2_read_alike(tmp_path):
    v1, warn = read_manifest(sample("spec-small-graph-torch/manifest.json"))
    assert warn is None and v1["unprofiled_step_ms"] == 3.940624 and v1["tp"] == 1 and v1["tokens_per_step"] == 1
    raw = json.loads(sample("spec-small-graph-torch/manifest.json").read_text())
    raw.update(schema="tracekit.manifest/2", concurrency=4, unprofiled_step_ms_spread=[3.9, 4.1],
               server={"url": "http://x", "engine": "sglang"})
    del raw["tokens_per_step"]
    p = tmp_path / "manifest.json"
    p.write_text(json.dumps(raw))
    v2, warn = read_manifest(p)
    assert warn is None and v2["tokens_per_step"] == 4 and v2["unprofiled_step_ms_spread"] == [3.9, 4.1]
    assert v2["spec"] == v1["spec"] and v2["server"]["engine"] == "sglang"
    raw.update(unprofiled_step_ms_spread=[5, "x"])
    p.write_text(json.dumps(raw))
    assert read_manifest(p)[0]["unprofiled_step_ms_spread"] is None
    raw.update(schema="tracekit.manifest/3")
    p.write_text(json.dumps(raw))
    assert read_manifest(p)[0] is None


# ------------------------------------------------------------------------------------------------
# the GPU validation's loop (capture/server_gpu.py over capture/spec_decode.py on the harness), run on the CPU
# ------------------------------------------------------------------------------------------------

CAPTURE = ROOT / "capture"
needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                 reason="needs torch (the GPU-host side); CI has none")


def spec_facts(tmp_path, *extra) -> dict:
    facts = tmp_path / "facts.json"
    r = subprocess.run([sys.executable, str(CAPTURE / "spec_decode.py"), "--size", "tiny", "--device", "cpu",
                        "--timed-steps", "8", "--steps", "6", "--warmup", "2", "--no-probes", "--facts-out",
                        str(facts), *extra], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(facts.read_text())


@needs_torch
def test_spec_decode_known_acceptance(tmp_path):
    """--accept-pattern: the accepted drafts per step in turn from each reset (9 > K counts as K): 1, 2, 0, 3 =
    2.5 tokens per step over the 8 timed steps (two whole cycles), and the profiled steps start the cycle again;
    --accept-prob 1: every draft accepted (K + 1 tokens), for every sequence of the batch."""
    f = spec_facts(tmp_path, "--accept-pattern", "1,2,0,9")
    assert f["spec"] == {"draft_tokens": 3, "accept_len": 2.5} and f["accept_override"] == {"pattern": [1, 2, 0, 3]}
    assert f["accept"]["accepted_drafts_profiled"] == [[1], [2], [0], [3], [1], [2]]
    f = spec_facts(tmp_path, "--accept-prob", "1", "--batch", "2")
    assert f["spec"]["accept_len"] == 4.0 and f["accept_override"] == {"prob": 1.0}
    assert f["accept"]["accepted_drafts_profiled"] == [[3, 3]] * 6
    for bad in (["--accept-pattern", "1,x"], ["--accept-pattern", "-1"], ["--accept-prob", "1.5"],
                ["--accept-pattern", "1", "--accept-prob", "0.5"]):
        r = subprocess.run([sys.executable, str(CAPTURE / "spec_decode.py"), *bad], capture_output=True, text=True)
        assert r.returncode == 2 and "--accept-" in r.stderr.splitlines()[-1], (bad, r.stderr)


@needs_torch
def test_server_gpu_end_to_end_on_the_cpu(tmp_path):
    """capture/server_gpu.py's CPU smoke mode: the test server in front of the real loop, captured by the real
    client. The rank trace holds only SGLang EAGLE v1's span (step[TARGET_VERIFY bs=1], no markers of ours, one per
    profiled decode batch); the acceptance the client reads from spec_verify_ct is the pattern's 2.5, as is the
    loop's own before and after the capture."""
    r = subprocess.run([sys.executable, str(CAPTURE / "server_gpu.py"), "--device", "cpu", "--mode", "eager",
                        "--size", "tiny", "--timed-steps", "40", "--steps", "4", "--decode-tokens", "21",
                        "--prompt-tokens", "16", "--repeats", "2", "--out", str(tmp_path)],
                       capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert [p.name for p in tmp_path.iterdir()] == ["server_gpu_tiny.tar.gz"]
    with tarfile.open(tmp_path / "server_gpu_tiny.tar.gz") as t:
        t.extractall(tmp_path / "x", filter="data")
    cap = tmp_path / "x" / "server_gpu_tiny"
    m = json.loads((cap / "manifest.json").read_text())
    res = json.loads((tmp_path / "x" / "server_gpu_tiny_result.json").read_text())
    assert m["spec"] == {"draft_tokens": 3, "accept_len": 2.5} and m["workload"] == "sglang-server"
    assert res["client_rc"] == 0 and res["accept_ratio"] == 1.0 and res["within_5pct"]["accept_len"] is True
    assert res["loop"]["accept_len"] == res["loop"]["after_capture"]["accept_len"] == 2.5
    assert res["loop"]["timing"]["n"] == 40 and res["step_ratio"] > 0
    [entry] = m["trace_files"]
    ev = json.load(gzip.open(cap / entry["name"]))["traceEvents"]
    spans = [e["name"] for e in ev if e.get("cat") == "user_annotation"]
    assert set(spans) == {"step[TARGET_VERIFY bs=1]"} and 3 <= len(spans) <= 4, spans


def urlopen_post(url: str, body: dict) -> None:
    import urllib.request

    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    urllib.request.urlopen(req, timeout=10).read()
