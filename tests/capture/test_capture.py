"""`tracekit capture` (the GPU-host driver) and the committed sample traces' manifests.

Runs without torch: the driver is exercised with a fake nsys; only the tests that run a real
workload on the CPU need torch (+ transformers) and skip, saying so, where it is absent.
"""

from __future__ import annotations

import importlib.util
import json
import sqlite3
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

import tracekit.capture as cap
from tracekit.cli.capture import capture_command
from tracekit.errors import TracekitError
from tracekit.manifest import manifest_matches

from conftest import sample_sqlite, sample_trace

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "sample_traces"
CAPTURE_DIR = ROOT / "capture"
HAVE_TORCH = importlib.util.find_spec("torch") is not None
HAVE_TRANSFORMERS = HAVE_TORCH and importlib.util.find_spec("transformers") is not None

CONTRACT_KEYS = ["schema", "workload", "profiler", "mode", "steps", "gpu_name", "peak_bw_gbps",
                 "weight_bytes_per_step", "dtype", "tp", "spec", "tokens_per_step", "unprofiled_step_ms",
                 "versions", "command", "trace_files"]
REAL_MISSING_MODULES = cap.missing_modules


@pytest.fixture(autouse=True)
def _workload_python_has_everything(monkeypatch):
    """The driver checks that the workload's Python can import torch (+ framework) before it runs; the
    fake nsys / torchrun here stand in for that Python (tests of the check itself use REAL_MISSING_MODULES)."""
    monkeypatch.setattr(cap, "missing_modules", lambda python, modules: [])


def runner():
    try:
        return CliRunner(mix_stderr=False)  # click 8.1
    except TypeError:
        return CliRunner()  # click >= 8.2 keeps stderr apart


def _exe(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


# ---------------------------------------------------------------- nsys command lines / discovery

def test_nsys_profile_cmd_has_the_decode_flags(tmp_path):
    cmd = cap.nsys_profile_cmd("/x/nsys", tmp_path, ["python3", "w.py", "--steps", "3"])
    assert cmd[:2] == ["/x/nsys", "profile"]
    assert cmd[cmd.index("-t") + 1] == "cuda,nvtx"
    for flag in ("--cuda-graph-trace=node", "--capture-range=cudaProfilerApi", "--capture-range-end=stop",
                 "--trace-fork-before-exec=true"):
        assert flag in cmd
    assert cmd[cmd.index("-o") + 1] == str(tmp_path / "trace")
    assert cmd[-4:] == ["python3", "w.py", "--steps", "3"]  # the workload comes last, untouched
    assert "--cuda-graph-trace=graph" in cap.nsys_profile_cmd("n", tmp_path, ["p"], graph_trace="graph")
    with pytest.raises(TracekitError):
        cap.nsys_profile_cmd("n", tmp_path, ["p"], graph_trace="whole")


def test_nsys_export_cmd_keeps_the_report(tmp_path):
    cmd = cap.nsys_export_cmd("nsys", tmp_path)
    assert cmd[:4] == ["nsys", "export", "--type", "sqlite"]
    assert cmd[cmd.index("-o") + 1] == str(tmp_path / "trace.sqlite")
    assert cmd[-1] == str(tmp_path / "trace.nsys-rep")


def test_workload_cmd(tmp_path):
    script = cap.workload_script("hf")
    assert script == CAPTURE_DIR / "hf_decode.py"
    c = cap.workload_cmd(script, profiler="torch", steps=7, mode="graph", spec=3, out_dir=tmp_path,
                         extra=["--size", "tiny"], python="py")
    assert c[:2] == ["py", str(script)]
    assert c[c.index("--steps") + 1] == "7" and c[c.index("--mode") + 1] == "graph"
    assert c[c.index("--spec") + 1] == "3"
    assert c[c.index("--trace-out") + 1] == str(tmp_path / "trace.json.gz")
    assert c[-2:] == ["--size", "tiny"]
    c = cap.workload_cmd(script, profiler="nsys", steps=2, mode="eager", spec=None, out_dir=tmp_path, extra=[])
    assert "--trace-out" not in c and "--spec" not in c
    with pytest.raises(TracekitError):
        cap.workload_script("vllm")


def test_find_nsys_order(tmp_path):
    a = _exe(tmp_path / "a_nsys", "echo a\n")
    b = _exe(tmp_path / "b_nsys", "echo b\n")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    on_path = _exe(bindir / "nsys", "echo p\n")
    env = {"NSYS": str(b), "PATH": str(bindir)}
    assert cap.find_nsys(str(a), env=env, globs=()) == str(a)           # --nsys first
    assert cap.find_nsys(None, env=env, globs=()) == str(b)             # then $NSYS
    assert cap.find_nsys(None, env={"PATH": str(bindir)}, globs=()) == str(on_path)   # then PATH
    # then the install folders, newest version first
    for v in ("2024.5.1", "2025.3.1"):
        d = tmp_path / "opt" / "nsight-systems" / v / "bin"
        d.mkdir(parents=True)
        _exe(d / "nsys", "echo\n")
    got = cap.find_nsys(None, env={"PATH": ""}, globs=(str(tmp_path / "opt/nsight-systems/*/bin/nsys"),))
    assert got == str(tmp_path / "opt/nsight-systems/2025.3.1/bin/nsys")


def test_find_nsys_errors(tmp_path):
    with pytest.raises(TracekitError, match="--nsys"):
        cap.find_nsys(str(tmp_path / "missing"), env={}, globs=())
    with pytest.raises(TracekitError, match=r"\$NSYS"):
        cap.find_nsys(None, env={"NSYS": str(tmp_path / "missing")}, globs=())
    with pytest.raises(TracekitError, match="nsys not found.*--nsys PATH"):
        cap.find_nsys(None, env={"PATH": str(tmp_path)}, globs=())


def _one_error_line(result):
    err = result.stderr.strip().splitlines()
    assert result.exit_code == 2, (result.exit_code, result.stderr, result.output)
    assert len(err) == 1 and err[0].startswith("tracekit: error: "), err
    assert "Traceback" not in result.stderr
    return err[0]


def test_cli_nsys_missing_is_one_line_exit_2(tmp_path, monkeypatch):
    monkeypatch.setattr(cap, "NSYS_GLOBS", ())
    monkeypatch.delenv("NSYS", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    r = runner().invoke(capture_command, ["--workload", "hf", "--profiler", "nsys", "--out", str(tmp_path / "o")])
    assert "nsys not found" in _one_error_line(r)
    r = runner().invoke(capture_command, ["--workload", "hf", "--profiler", "nsys", "--out", str(tmp_path / "o"),
                                              "--nsys", str(tmp_path / "nope")])
    assert "--nsys" in _one_error_line(r)


def _fake_nsys(tmp_path: Path, profile_rc: int = 0) -> Path:
    """A stand-in nsys: `profile` writes the facts file a workload would and an .nsys-rep;
    `export` writes a SQLite file; `--version` prints a version."""
    facts = {"workload": "hf", "mode": "graph", "steps": 3, "gpu_name": "NVIDIA H200",
             "weight_bytes_per_step": 988010240, "dtype": "bfloat16", "tp": 1,
             "spec": {"draft_tokens": 3, "accept_len": 1.5}, "tokens_per_step": 1,
             "unprofiled_step_ms": 2.5, "versions": {"torch": "2.11.0", "cuda": "13.0", "nsys": None,
                                                    "framework": "transformers 5.17.0"},
             "model": {"size": "small"}}
    helper = tmp_path / "fake_nsys.py"
    helper.write_text(textwrap.dedent(f"""
        import json, sqlite3, sys
        a = sys.argv[1:]
        if a[0] == "--version":
            print("NVIDIA Nsight Systems version 2025.3.1.0-fake"); sys.exit(0)
        if a[0] == "profile":
            out = a[a.index("-o") + 1]
            facts = a[a.index("--facts-out") + 1]
            json.dump(json.loads({json.dumps(facts)!r}), open(facts, "w"))
            open(out + ".nsys-rep", "wb").write(b"rep")
            sys.exit({profile_rc})
        if a[0] == "export":
            db = sqlite3.connect(a[a.index("-o") + 1]); db.execute("create table StringIds(id, value)"); db.commit()
            sys.exit(0)
        sys.exit(9)
    """))
    return _exe(tmp_path / "nsys", f'exec "{sys.executable}" "{helper}" "$@"\n')


def test_capture_with_fake_nsys_writes_manifest(tmp_path):
    nsys = _fake_nsys(tmp_path)
    out = tmp_path / "run"
    r = runner().invoke(capture_command, ["--workload", "hf", "--profiler", "nsys", "--out", str(out),
                                              "--steps", "3", "--mode", "graph", "--spec", "3", "--nsys", str(nsys),
                                              "--peak-bw", "4800", "--size", "small"])
    assert r.exit_code == 0, r.stderr
    assert (out / "trace.sqlite").is_file() and (out / "trace.nsys-rep").is_file()
    assert not (out / cap.FACTS_FILE).exists()
    m = json.loads((out / "manifest.json").read_text())
    # every trace file the capture wrote, identified by name, size and the sha256 of its first MiB
    assert [e["name"] for e in m["trace_files"]] == ["trace.sqlite", "trace.nsys-rep"]
    import hashlib
    for e in m["trace_files"]:
        data = (out / e["name"]).read_bytes()
        assert e["bytes"] == len(data) and e["sha256_first_mib"] == hashlib.sha256(data[:1 << 20]).hexdigest()
    assert list(m)[:len(CONTRACT_KEYS)] == CONTRACT_KEYS
    assert m["schema"] == "tracekit.manifest/1" and m["profiler"] == "nsys" and m["mode"] == "graph"
    assert m["versions"] == {"torch": "2.11.0", "cuda": "13.0", "nsys": "2025.3.1.0-fake",
                             "framework": "transformers 5.17.0"}
    assert m["peak_bw_gbps"] == 4800.0 and m["weight_bytes_per_step"] == 988010240
    assert m["spec"] == {"draft_tokens": 3, "accept_len": 1.5}
    assert m["model"] == {"size": "small"}                 # extension keys survive
    assert m["nsys_graph_trace"] == "node"
    wc = m["workload_command"]
    assert wc[1].endswith("hf_decode.py") and wc[-2:] == ["--size", "small"] and "--spec" in wc


def test_capture_nsys_failure_is_one_line(tmp_path):
    nsys = _fake_nsys(tmp_path, profile_rc=3)
    r = runner().invoke(capture_command, ["--workload", "synthetic", "--profiler", "nsys",
                                              "--out", str(tmp_path / "o"), "--nsys", str(nsys)])
    assert "nsys profile failed with exit code 3" in _one_error_line(r)


def test_build_manifest_contract_keys():
    m = cap.build_manifest({"unprofiled_step_ms": 1, "weight_bytes_per_step": 10, "extra": 1}, workload="synthetic",
                           profiler="torch", mode="eager", steps=4, command=["tracekit", "capture"],
                           nsys_ver="2025.3", peak_bw_gbps=None)
    assert list(m)[:len(CONTRACT_KEYS)] == CONTRACT_KEYS and m["extra"] == 1
    assert m["versions"]["nsys"] is None                  # torch profiler: no nsys version
    assert m["unprofiled_step_ms"] == 1.0 and isinstance(m["unprofiled_step_ms"], float)
    assert m["tp"] == 1 and m["tokens_per_step"] == 1 and m["spec"] is None


def test_driver_and_workloads_import_light():
    code = ("import sys; import tracekit.capture; "
            "bad = [m for m in ('polars', 'torch', 'numpy') if m in sys.modules]; "
            "sys.exit(1 if bad else 0)")
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 0
    for f in list(CAPTURE_DIR.glob("*.py")) + [ROOT / "tracekit" / "capture.py"]:
        text = f.read_text()
        assert "import polars" not in text and "from polars" not in text, f


# ---------------------------------------------------------------- sample traces

def _manifests():
    return sorted(SAMPLES.glob("*/manifest.json"))


def test_sample_traces_present():
    names = {p.parent.name for p in _manifests()}
    for need in ("hf-small-eager", "hf-small-graph", "hf-small-spec", "hf-large-eager", "hf-large-graph",
                 "synthetic-eager", "synthetic-graph", "hf-small-eager-torch", "hf-small-graph-torch"):
        assert need in names


@pytest.mark.parametrize("mp", _manifests(), ids=lambda p: p.parent.name)
def test_sample_manifest_has_every_contract_key(mp):
    m = json.loads(mp.read_text())
    for k in CONTRACT_KEYS:
        assert k in m, k
    assert m["schema"] == "tracekit.manifest/1"
    assert m["profiler"] in ("nsys", "torch") and m["workload"] in ("hf", "synthetic", "sglang", "spec", "serve", "kv",
                                                                    "lora", "moe", "zoo")
    assert isinstance(m["steps"], int) and m["steps"] > 0
    # (the lent GPUs: H200 captures of 2026-12-02..04, H100 captures of 2026-12-06; each with its datasheet peak)
    assert (m["gpu_name"], m["peak_bw_gbps"]) in (("NVIDIA H200", 4800.0), ("NVIDIA H100 80GB HBM3", 3350.0))
    assert isinstance(m["weight_bytes_per_step"], int) and m["weight_bytes_per_step"] > 0
    assert isinstance(m["unprofiled_step_ms"], float) and 0 < m["unprofiled_step_ms"] < 1000
    assert m["tp"] == 1 and m["dtype"] == "bfloat16"
    # tokens per step = the batch (kv records it at the top level, the serve/lora/moe loops under "model")
    assert m["tokens_per_step"] == (m.get("batch") or (m.get("model") or {}).get("batch") or 1)
    assert set(m["versions"]) == {"torch", "cuda", "nsys", "framework"}
    assert (m["versions"]["nsys"] is not None) == (m["profiler"] == "nsys")
    # (the zoo's captures ran through its own driver, which records its command line the same way)
    assert m["command"][:2] in (["tracekit", "capture"], ["python3", "capture/zoo_driver.py"])
    assert all(isinstance(c, str) for c in m["command"])
    trace = sample_trace(mp.parent.name)
    assert trace.name == {"nsys": "trace.sqlite.gz" if mp.parent.name != "hf-small-eager" else "trace.sqlite",
                          "torch": "trace.json.gz"}[m["profiler"]]
    # the manifest names its trace (name, size, sha256 of the first MiB): it applies to that file only
    assert manifest_matches(m, trace, None) == (True, None)
    if trace.name.endswith(".sqlite.gz"):        # and to the plain export a user gunzips it to
        assert [e["name"] for e in m["trace_files"]][:2] == ["trace.sqlite.gz", "trace.sqlite"]
        assert manifest_matches(m, sample_sqlite(mp.parent.name), None)[0] is False   # other name (cache copy)
    if m["spec"] is not None:
        assert set(m["spec"]) == {"draft_tokens", "accept_len"}
        draft = m["draft_model"]
        assert m["weight_bytes_per_step"] == m["model"]["weight_bytes"] + (draft.get("weight_bytes") or 0) * \
            draft["forwards_per_step"]
    elif m["workload"] == "hf":
        assert m["weight_bytes_per_step"] == m["model"]["weight_bytes"]
    for f in mp.parent.iterdir():
        assert f.stat().st_size < 5_000_000, f
        assert not f.name.endswith(".nsys-rep")


def test_sample_sqlite_markers_and_modes():
    for mp in _manifests():
        m = json.loads(mp.read_text())
        if m["profiler"] != "nsys":
            continue
        db = sqlite3.connect(f"file:{sample_sqlite(mp.parent.name)}?mode=ro", uri=True)
        tables = {r[0] for r in db.execute("select name from sqlite_master where type='table'")}
        names = [r[0] for r in db.execute(
            "select coalesce(e.text, s.value) from NVTX_EVENTS e left join StringIds s on s.id = e.textId")] \
            if "NVTX_EVENTS" in tables else []
        steps = [n for n in names if n and n.startswith("decode_step ")]
        if m.get("markers", "legacy") is None or "--no-markers" in m["command"]:  # none of ours (CUB's may remain)
            assert not steps and not {"draft", "verify", "draft_extend", "scheduler", "grammar_mask"} & set(names)
            db.close()
            continue
        assert len(steps) == m["steps"], mp
        if m.get("nsys_graph_trace") == "graph":
            assert "CUPTI_ACTIVITY_KIND_KERNEL" not in tables and "CUPTI_ACTIVITY_KIND_GRAPH_TRACE" in tables
        else:
            assert "CUPTI_ACTIVITY_KIND_KERNEL" in tables
        if m["spec"]:
            marks = m.get("markers") if isinstance(m.get("markers"), dict) else {"draft": 1, "verify": 1}
            assert names.count("verify") == m["steps"]
            assert names.count("draft") == (m["steps"] if "draft" in marks else 0)
            n_extend = names.count("draft_extend")
            if m["workload"] == "spec" or "draft_extend" in marks:  # (one a step; one per MTP module for multi-layer)
                assert n_extend % m["steps"] == 0 and n_extend >= m["steps"]
            else:
                assert n_extend == 0
        if m["workload"] == "serve":
            assert names.count("scheduler") == names.count("grammar_mask") == m["steps"]
        db.close()


def test_sample_index_matches_manifests():
    idx = json.loads((SAMPLES / "index.json").read_text())["traces"]
    assert set(idx) == {p.parent.name for p in _manifests()}
    for name, e in idx.items():
        m = json.loads((SAMPLES / name / "manifest.json").read_text())
        assert (ROOT / e["path"]).is_file()
        for k in ("workload", "mode", "unprofiled_step_ms", "weight_bytes_per_step", "steps"):
            assert e[k] == m[k], (name, k)
    # graph replay removes launch overhead: every graph capture is faster than its eager twin
    assert idx["hf-small-graph"]["unprofiled_step_ms"] < idx["hf-small-eager"]["unprofiled_step_ms"]
    assert idx["synthetic-graph"]["unprofiled_step_ms"] < idx["synthetic-eager"]["unprofiled_step_ms"]
    assert idx["hf-large-graph"]["unprofiled_step_ms"] < idx["hf-large-eager"]["unprofiled_step_ms"]
    dp = json.loads((SAMPLES / "device_profile.json").read_text())
    assert dp["schema"] == "tracekit.device_profile/1"
    assert dp["launch"]["graph_us_per_kernel"] < dp["launch"]["eager_us_per_kernel"]


def test_replay_gap_from_graph_traces():
    rg = _load_workload("replay_gap")
    gaps = rg.replay_gaps_ns(str(sample_trace("synthetic-graph")))          # a .sqlite.gz, read as is
    assert gaps == rg.replay_gaps_ns(str(sample_sqlite("synthetic-graph")))
    assert len(gaps) > 1000 and 100 < sum(gaps) / len(gaps) < 5000     # ns: sub-microsecond node gaps
    assert rg.replay_gaps_ns(str(sample_trace("hf-small-graph-wholegraph"))) == []
    assert rg.replay_gaps_ns(str(sample_trace("synthetic-eager"))) == []   # no graph nodes
    dp = json.loads((SAMPLES / "device_profile.json").read_text())
    assert dp["graph_replay_gap_us"] == pytest.approx(sum(gaps) / len(gaps) / 1e3)


# ---------------------------------------------------------------- sglang integration (no sglang here)

def _load_workload(name):
    sys.path.insert(0, str(CAPTURE_DIR))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(CAPTURE_DIR))


def test_sglang_engine_kwargs():
    sg = _load_workload("sglang_decode")
    a = sg.parse_args(["--model-path", "m", "--mode", "eager", "--tp", "2"])
    kw = sg.build_engine_kwargs(a)
    assert kw["disable_cuda_graph"] is True and kw["tp_size"] == 2 and "speculative_algorithm" not in kw
    a = sg.parse_args(["--model-path", "m", "--mode", "graph", "--spec", "3", "--speculative-algorithm", "NEXTN"])
    kw = sg.build_engine_kwargs(a)
    assert kw["disable_cuda_graph"] is False
    assert (kw["speculative_algorithm"], kw["speculative_num_steps"], kw["speculative_num_draft_tokens"]) == ("NEXTN", 3, 4)
    a = sg.parse_args(["--model-path", "m", "--spec", "2"])  # EAGLE needs a draft model
    with pytest.raises(SystemExit):
        sg.build_engine_kwargs(a)
    cfg = sg.scheduler_config(sg.parse_args(["--model-path", "m", "--steps", "5", "--profiler", "nsys"]))
    assert cfg["steps"] == 5 and cfg["profiler"] == "nsys"


@pytest.mark.skipif(importlib.util.find_spec("sglang") is not None, reason="sglang is installed here")
def test_sglang_missing_is_clear(capsys):
    sg = _load_workload("sglang_decode")
    assert sg.main(["--model-path", "m"]) == 2
    assert "sglang is not installed" in capsys.readouterr().err
    with pytest.raises(sg.SGLangMissing):
        sg.resolve("sglang.srt.managers.scheduler", "Scheduler.run_batch")


def test_sglang_patches_resolve_lazily_and_mark(monkeypatch):
    import types

    sg = _load_workload("sglang_decode")
    calls = []

    class Mode:
        def __init__(self, d):
            self.d = d

        def is_decode(self):
            return self.d

    class Scheduler:
        def run_batch(self, batch):
            calls.append(batch.forward_mode.d)
            return "ran"

    class EAGLEWorker:
        def draft(self, batch):
            return "d"

        def verify(self, batch, spec):
            return "v"

    fake = {"sglang": types.ModuleType("sglang"),
            "sglang.srt.managers.scheduler": types.ModuleType("s"),
            "sglang.srt.speculative.eagle_worker": types.ModuleType("e")}
    fake["sglang.srt.managers.scheduler"].Scheduler = Scheduler
    fake["sglang.srt.speculative.eagle_worker"].EAGLEWorker = EAGLEWorker
    for k, v in fake.items():
        monkeypatch.setitem(sys.modules, k, v)
    monkeypatch.setitem(sys.modules, "sglang.srt.speculative.eagle_worker_v2", None)  # absent: skipped
    cfg = {"profiler": "none", "steps": 2, "timed_steps": 0, "warmup": 1000, "facts_out": None, "trace_out": None,
           "mode": "eager", "spec": None, "tp": 1, "dtype": "bfloat16", "batch_size": 1}
    found = sg.install_patches(cfg, rank=0)
    assert found == ["sglang.srt.managers.scheduler.Scheduler.run_batch",
                     "sglang.srt.speculative.eagle_worker.EAGLEWorker.draft",
                     "sglang.srt.speculative.eagle_worker.EAGLEWorker.verify"]
    s = Scheduler()
    assert s.run_batch(types.SimpleNamespace(forward_mode=Mode(True))) == "ran"
    assert s.run_batch(types.SimpleNamespace(forward_mode=Mode(False))) == "ran"
    assert calls == [True, False]
    assert EAGLEWorker().draft(None) == "d" and EAGLEWorker().verify(None, None) == "v"
    assert Scheduler.run_batch.__name__ == "run_batch"


# ---------------------------------------------------------------- real workloads on the CPU (need torch)

@pytest.mark.skipif(not HAVE_TRANSFORMERS, reason="needs torch + transformers (the GPU-host side); CI has neither")
def test_hf_tiny_torch_capture_on_cpu(tmp_path):
    import gzip

    out = tmp_path / "hf"
    m = cap.capture(workload="hf", profiler="torch", out=out, steps=2, mode="eager", spec=2,
                    extra=("--size", "tiny", "--device", "cpu", "--dtype", "float32", "--timed-steps", "3",
                           "--warmup", "1", "--prompt-len", "8"))
    assert m["spec"]["draft_tokens"] == 2 and m["unprofiled_step_ms"] > 0
    assert m["weight_bytes_per_step"] == m["model"]["weight_bytes"] + 2 * m["draft_model"]["weight_bytes"]
    ev = json.load(gzip.open(out / "trace.json.gz"))["traceEvents"]
    ann = [e["name"] for e in ev if e.get("cat") == "user_annotation"]
    assert sorted(a for a in ann if a.startswith("decode_step")) == ["decode_step 3", "decode_step 4"]
    assert ann.count("draft") == 2 and ann.count("verify") == 2
    assert not any(a.startswith("ProfilerStep") for a in ann)
    assert any("Input Dims" in e.get("args", {}) for e in ev if e.get("cat") == "cpu_op")  # record_shapes


@pytest.mark.skipif(not HAVE_TORCH, reason="needs torch (the GPU-host side); CI has none")
def test_hf_weight_bytes_exclude_untied_embedding():
    hf = _load_workload("hf_decode")
    if not HAVE_TRANSFORMERS:
        pytest.skip("needs transformers")
    import torch

    for tied in (True, False):
        cfg = hf.build_config("llama", dict(hf.SIZES["tiny"], tie_word_embeddings=tied), 64)
        model = hf.build_model(cfg, torch.device("cpu"), torch.float32)
        wb = hf.weight_bytes(model)
        every = sum(p.numel() * 4 for p in model.parameters())  # parameters() yields a tied tensor once
        emb = model.get_input_embeddings().weight.numel() * 4
        assert wb["tied"] is tied
        assert wb["bytes"] == (every if tied else every - emb)


# ---------------------------------------------------------------- tensor parallelism (issue 9)

def test_tp_launch_command_is_torchrun_one_process_per_gpu(tmp_path):
    script = cap.workload_script("hf")
    c = cap.workload_cmd(script, profiler="nsys", steps=4, mode="graph", spec=None, out_dir=tmp_path,
                         extra=["--size", "small"], python="py", tp=2, allreduce="symm-two-shot")
    assert c[:6] == ["py", "-m", "torch.distributed.run", "--standalone", "--nnodes=1", "--nproc_per_node=2"]
    assert c[6] == str(script)
    assert c[c.index("--tp") + 1] == "2" and c[c.index("--allreduce") + 1] == "symm-two-shot"
    assert c[-2:] == ["--size", "small"]
    # --tp 1: the same distributed path (a process group of size 1); nccl is the default all-reduce
    c = cap.workload_cmd(cap.workload_script("synthetic"), profiler="torch", steps=2, mode="eager", spec=None,
                         out_dir=tmp_path, extra=[], python="py", tp=1)
    assert c[5] == "--nproc_per_node=1" and c[c.index("--allreduce") + 1] == "nccl"
    assert c[c.index("--trace-out") + 1] == str(tmp_path / "trace.json.gz")   # ranks insert .rank<r>
    # no --tp: unchanged single-process command
    c = cap.workload_cmd(script, profiler="nsys", steps=2, mode="eager", spec=None, out_dir=tmp_path, extra=[],
                         python="py")
    assert c[:2] == ["py", str(script)] and "--tp" not in c
    # sglang starts its own TP processes: --tp goes to the script, no torchrun
    c = cap.workload_cmd(cap.workload_script("sglang"), profiler="nsys", steps=2, mode="eager", spec=None,
                         out_dir=tmp_path, extra=[], python="py", tp=2)
    assert c[:2] == ["py", str(cap.workload_script("sglang"))] and c[c.index("--tp") + 1] == "2"
    # under nsys the torchrun command is the profiled one, so one report covers every rank
    n = cap.nsys_profile_cmd("nsys", tmp_path, ["py", "-m", "torch.distributed.run", "--nproc_per_node=2", "w.py"])
    assert "--trace-fork-before-exec=true" in n and n[-5:-3] == ["py", "-m"]


def test_tp_argument_errors():
    with pytest.raises(TracekitError, match="needs --tp"):
        cap.tp_args("hf", None, "symm-one-shot")
    with pytest.raises(TracekitError, match="SGLang"):
        cap.tp_args("sglang", 2, "nccl")
    with pytest.raises(TracekitError, match="--allreduce"):
        cap.tp_args("hf", 2, "multimem")
    with pytest.raises(TracekitError, match=">= 1"):
        cap.launch_prefix(0)
    assert cap.tp_args("synthetic", None, "symm") == ["--allreduce", "symm"]   # the older world-of-one option
    r = runner().invoke(capture_command, ["--workload", "hf", "--profiler", "torch", "--out", "o", "--tp", "0"])
    assert r.exit_code == 2


def test_tp_worker_env_forces_multicast_off():
    env = cap.worker_env({"NCCL_NVLS_ENABLE": "1", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "0", "PATH": "/bin"})
    assert env["NCCL_NVLS_ENABLE"] == "0" and env["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1"
    assert env["NVSHMEM_DISABLE_NVLS"] == "1" and env["PATH"] == "/bin" and env["PYTHONUNBUFFERED"] == "1"
    tp = _load_workload("tp")
    assert tp.NO_MULTICAST_ENV == cap.NO_MULTICAST_ENV
    assert tp.force_no_multicast({"NCCL_NVLS_ENABLE": "1"}) == cap.NO_MULTICAST_ENV
    assert tuple(tp.ALLREDUCE_CHOICES) == cap.ALLREDUCE_CHOICES
    # no multimem / NVLS op anywhere in the workloads
    for f in CAPTURE_DIR.glob("*.py"):
        assert "symm_mem.multimem" not in f.read_text(), f


def test_tp_pure_helpers():
    tp = _load_workload("tp")
    assert tp.dist_env({}) == {"rank": 0, "world_size": 1, "local_rank": 0, "launcher": "none"}
    assert tp.dist_env({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"})["launcher"] == "torchrun"
    assert tp.shard_range(4864, 2, 1) == (2432, 4864)
    with pytest.raises(ValueError):
        tp.shard_range(7, 2, 0)
    with pytest.raises(SystemExit, match="num_key_value_heads=2"):
        tp.check_divisible(4, num_key_value_heads=2, intermediate_size=4864)
    for rank, world in ((0, 1), (1, 2), (3, 4)):
        for name in ("trace.json.gz", "workload_facts.json"):
            assert tp.rank_path(f"/d/{name}", rank, world) == str(cap.rank_file(Path("/d") / name, rank, world))
    assert tp.rank_path("/d/trace.json.gz", 1, 2) == "/d/trace.rank1.json.gz"
    assert tp.rank_path(None, 1, 2) is None
    syn = _load_workload("synthetic")
    assert syn.tp_choice("none", None) == ("none", None) and syn.tp_choice("symm", None) == ("symm", None)
    assert syn.tp_choice("nccl", None) == ("nccl", 1)                 # a TP choice implies --tp 1
    assert syn.tp_choice("none", 2) == ("nccl", 2) and syn.tp_choice("symm", 2) == ("symm-one-shot", 2)


def _fake_torchrun(tmp_path: Path) -> Path:
    """A stand-in `python` for `python -m torch.distributed.run ...`: writes each rank's facts file and
    torch trace the way capture/tp.py names them."""
    helper = tmp_path / "fake_torchrun.py"
    helper.write_text(textwrap.dedent("""
        import gzip, json, sys
        a = sys.argv[1:]
        assert a[:2] == ["-m", "torch.distributed.run"], a
        world = int([x for x in a if x.startswith("--nproc_per_node=")][0].split("=")[1])
        facts, trace = a[a.index("--facts-out") + 1], a[a.index("--trace-out") + 1]
        for r in range(world):
            f = facts[:-5] + f".rank{r}.json" if world > 1 else facts
            t = trace[:-8] + f".rank{r}.json.gz" if world > 1 else trace
            json.dump({"workload": "hf", "tp": world, "weight_bytes_per_step": 100, "unprofiled_step_ms": 2.0 + r,
                       "allreduce": a[a.index("--allreduce") + 1], "allreduce_message_bytes": 1792,
                       "profiled": {"host_loop_ms_per_step": 1.0}}, open(f, "w"))
            gzip.open(t, "wt").write(json.dumps({"traceEvents": []}))
    """))
    return _exe(tmp_path / "python", f'exec "{sys.executable}" "{helper}" "$@"\n')


def test_tp_capture_merges_ranks(tmp_path):
    py = _fake_torchrun(tmp_path)
    out = tmp_path / "tp2"
    m = cap.capture(workload="hf", profiler="torch", out=out, steps=2, tp=2, allreduce="symm-one-shot", python=str(py))
    assert m["tp"] == 2 and m["allreduce"] == "symm-one-shot" and m["allreduce_message_bytes"] == 1792
    assert m["unprofiled_step_ms"] == 3.0                       # the slowest rank's median
    assert [r["unprofiled_step_ms"] for r in m["per_rank"]] == [2.0, 3.0]
    assert m["rank_traces"] == ["trace.rank0.json.gz", "trace.rank1.json.gz"]
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "trace.rank0.json.gz", "trace.rank1.json.gz"]
    assert m["command"][-4:] == ["--tp", "2", "--allreduce", "symm-one-shot"]
    m1 = cap.capture(workload="hf", profiler="torch", out=tmp_path / "tp1", steps=2, tp=1, python=str(py))
    assert m1["tp"] == 1 and "per_rank" not in m1 and (tmp_path / "tp1" / "trace.json.gz").is_file()


def _tp_samples():
    return [p for p in _manifests() if json.loads(p.read_text()).get("tensor_parallel")]


def test_tp_samples_world_size_one():
    samples = _tp_samples()
    assert {p.parent.name for p in samples} >= {"tp1-synthetic-symm1-eager", "tp1-synthetic-symm1-graph",
                                                "tp1-hf-small-symm1-eager", "tp1-hf-small-nccl-eager"}
    for mp in samples:
        m = json.loads(mp.read_text())
        t = m["tensor_parallel"]
        assert m["tp"] == t["world_size"] == 1 and t["launcher"] == "torchrun" and t["allreduce_fallback"] is None
        assert m["workload_command"][1:4] == ["-m", "torch.distributed.run", "--standalone"]
        assert m["allreduce"] == t["allreduce"] == t["allreduce_requested"]
        hidden = (m.get("model") or m.get("synthetic"))["hidden"]
        assert m["allreduce_message_bytes"] == hidden * 2          # one bf16 token row
        db = sqlite3.connect(f"file:{sample_sqlite(mp.parent.name)}?mode=ro", uri=True)
        names = [r[0] for r in db.execute("select s.value from CUPTI_ACTIVITY_KIND_KERNEL k "
                                          "join StringIds s on s.id = k.shortName")]
        db.close()
        ar = [n for n in names if "all_reduce" in n or "nccl" in n.lower()]
        if m["allreduce"].startswith("symm"):        # a real kernel per all-reduce, even at world size 1
            assert len(ar) == m["steps"] * t["allreduce_per_step"], mp
        else:                                         # NCCL at world size 1 launches no kernel
            assert ar == [], mp
        if m["workload"] == "hf":
            assert m["weight_bytes_per_step"] == t["shard_weight_bytes"] == t["full_weight_bytes"]
            assert t["allreduce_per_step"] == 2 * m["model"]["layers"]


@pytest.mark.skipif(not HAVE_TRANSFORMERS, reason="needs torch + transformers (the GPU-host side); CI has neither")
def test_hf_tiny_tp2_on_cpu_matches_single_process(tmp_path):
    """TP=2 over gloo on the CPU: the sharded model (two processes, all-reduces, vocab-parallel lm_head)
    makes the same greedy tokens as the unsharded one, and each rank reads half the layer weights."""
    common = ("--size", "tiny", "--device", "cpu", "--dtype", "float32", "--timed-steps", "6", "--warmup", "1",
              "--prompt-len", "8")
    ref = cap.capture(workload="hf", profiler="torch", out=tmp_path / "ref", steps=1, extra=common)
    m = cap.capture(workload="hf", profiler="torch", out=tmp_path / "tp2", steps=1, tp=2, extra=common)
    assert m["tp"] == 2 and m["tokens_head"] == ref["tokens_head"] and len(ref["tokens_head"]) >= 6
    # everything is sharded but the 5 RMSNorm weights (2 layers x 2 + final, 256 float32 each), replicated
    assert m["weight_bytes_per_step"] * 2 - ref["weight_bytes_per_step"] == 5 * 256 * 4
    assert m["tensor_parallel"]["allreduce_per_step"] == 4 and m["allreduce_message_bytes"] == 256 * 4
    assert (tmp_path / "tp2" / "trace.rank1.json.gz").is_file()


# ---------------------------------------------------------------- issue 19: the workload's Python is checked first

def _python_without_torch(tmp_path: Path) -> Path:
    """An interpreter that cannot import torch (no site-packages): the same Python, started with -S -I."""
    return _exe(tmp_path / "bare_python", f'exec "{sys.executable}" -I -S "$@"\n')


def test_missing_torch_is_one_line_and_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(cap, "missing_modules", REAL_MISSING_MODULES)
    bare = _python_without_torch(tmp_path)
    assert REAL_MISSING_MODULES(str(bare), ("torch", "json")) == ["torch"]
    out = tmp_path / "o"
    with pytest.raises(TracekitError, match=r"needs torch, which .*bare_python cannot import"):
        cap.capture(workload="spec", profiler="torch", out=out, steps=2, python=str(bare))
    assert not out.exists()
    # the command: exit 2, one line, no traceback, no output folder
    monkeypatch.setattr(cap.sys, "executable", str(bare))
    r = runner().invoke(capture_command, ["--workload", "hf", "--profiler", "torch", "--out", str(out)])
    line = _one_error_line(r)
    assert "needs torch and transformers" in line and "pip install torch" in line
    assert not out.exists()


def test_failed_capture_removes_the_folder_it_created(tmp_path):
    nsys = _fake_nsys(tmp_path, profile_rc=3)
    out = tmp_path / "fresh"
    r = runner().invoke(capture_command, ["--workload", "spec", "--profiler", "nsys", "--out", str(out),
                                              "--nsys", str(_exe(tmp_path / "nsys0", "exit 3\n"))])
    assert "nsys profile failed" in _one_error_line(r) and not out.exists()
    keep = tmp_path / "mine"
    keep.mkdir()
    (keep / "notes.txt").write_text("x")
    r = runner().invoke(capture_command, ["--workload", "spec", "--profiler", "nsys", "--out", str(keep),
                                              "--nsys", str(nsys)])
    assert r.exit_code == 2 and (keep / "notes.txt").is_file()      # a folder the user had is left alone


# ---------------------------------------------------------------- manifest matching (contract) and .sqlite.gz

def _copy_sample(name, dst: Path, files=("manifest.json",)):
    import shutil

    dst.mkdir(parents=True, exist_ok=True)
    src = sample_trace(name)
    shutil.copyfile(src, dst / src.name)
    for f in files:
        shutil.copyfile(SAMPLES / name / f, dst / f)
    return dst / src.name


def _warnings(trace):
    return list(trace.meta.warnings)


def test_manifest_applies_only_to_its_own_trace(tmp_path):
    import tracekit

    # its own trace: applied (a .sqlite.gz read as is, through the cache dir)
    p = _copy_sample("synthetic-graph", tmp_path / "a")
    t = tracekit.load(p)
    assert t.manifest is not None and t.manifest["applied_by"] == "trace_files"
    assert t.manifest["unprofiled_step_ms"] == json.loads((SAMPLES / "synthetic-graph/manifest.json").read_text())[
        "unprofiled_step_ms"]
    # the user gunzips it: the plain export is listed too, and matches
    import gzip
    import shutil

    plain = tmp_path / "a" / "trace.sqlite"
    with gzip.open(p, "rb") as src, open(plain, "wb") as dst:
        shutil.copyfileobj(src, dst)
    p.unlink()
    assert tracekit.load(plain).manifest["applied_by"] == "trace_files"
    # another capture's trace beside this manifest: ignored, with the reason
    other = tmp_path / "b"
    other.mkdir()
    shutil.copyfile(sample_trace("synthetic-eager"), other / "trace.sqlite.gz")
    shutil.copyfile(SAMPLES / "synthetic-graph" / "manifest.json", other / "manifest.json")
    t = tracekit.load(other / "trace.sqlite.gz")
    assert t.manifest is None
    assert any("describes another trace.sqlite.gz" in w and "ignored" in w for w in _warnings(t))
    # a renamed trace: not listed, ignored
    (other / "trace.sqlite.gz").rename(other / "run2.sqlite.gz")
    t = tracekit.load(other / "run2.sqlite.gz")
    assert t.manifest is None and any("lists other trace files" in w for w in _warnings(t))


def test_legacy_manifest_rule(tmp_path):
    import tracekit
    from tracekit.manifest import manifest_applies_legacy

    p = _copy_sample("hf-small-graph-torch", tmp_path / "k")
    mp = tmp_path / "k" / "manifest.json"
    m = json.loads(mp.read_text())
    del m["trace_files"]
    mp.write_text(json.dumps(m))
    t = tracekit.load(p)                     # profiler torch == a Kineto trace: applies, steps still to check
    assert t.manifest["applied_by"] == "legacy"
    assert manifest_applies_legacy(t.manifest, m["steps"]) and not manifest_applies_legacy(t.manifest, m["steps"] + 1)
    m["profiler"] = "nsys"
    mp.write_text(json.dumps(m))
    t = tracekit.load(p)
    assert t.manifest is None and any("is for a nsys capture" in w for w in _warnings(t))
    assert manifest_applies_legacy(None, 16) is False
    assert manifest_applies_legacy({"applied_by": "trace_files", "steps": 3}, 16) is True
    m["trace_files"] = [{"name": "trace.json.gz", "bytes": "many"}]     # malformed: the whole manifest ignored
    mp.write_text(json.dumps(m))
    t = tracekit.load(p)
    assert t.manifest is None and any("malformed trace_files" in w for w in _warnings(t))


def test_sqlite_gz_reads_like_the_export_and_writes_only_to_the_cache(tmp_path, monkeypatch):
    import hashlib

    import tracekit

    cache = tmp_path / "cache"
    monkeypatch.setenv("TRACEKIT_CACHE", str(cache))
    p = _copy_sample("synthetic-graph", tmp_path / "in", files=())
    before = hashlib.sha256(p.read_bytes()).hexdigest(), sorted(x.name for x in p.parent.iterdir())
    gz = tracekit.load(p)
    plain = tracekit.load(sample_sqlite("synthetic-graph"))
    assert gz.meta.format == "nsys-sqlite" and gz.meta.path == str(p)
    assert gz.kernels.height == plain.kernels.height > 0 and gz.kernels.equals(plain.kernels)
    assert (hashlib.sha256(p.read_bytes()).hexdigest(), sorted(x.name for x in p.parent.iterdir())) == before
    made = sorted(cache.iterdir())
    assert len(made) == 1 and made[0].suffix == ".sqlite"
    tracekit.load(p)                                       # unchanged file: decompressed once
    assert sorted(cache.iterdir()) == made
    # a damaged gzip: one clear error
    bad = tmp_path / "bad" / "trace.sqlite.gz"
    bad.parent.mkdir()
    bad.write_bytes(p.read_bytes()[:50_000])
    with pytest.raises(TracekitError, match="damaged gzip"):
        tracekit.load(bad)
    assert not list(bad.parent.glob("*.tmp")) and len(list(cache.glob("*.tmp"))) == 0


def test_gzip_capture_export_lists_both_names(tmp_path):
    import gzip

    nsys = _fake_nsys(tmp_path)
    out = tmp_path / "run"
    cap.capture(workload="spec", profiler="nsys", out=out, steps=3, nsys=str(nsys))
    plain = (out / "trace.sqlite").read_bytes()
    m = cap.gzip_capture_export(out)
    assert not (out / "trace.sqlite").exists() and gzip.decompress((out / "trace.sqlite.gz").read_bytes()) == plain
    names = [e["name"] for e in m["trace_files"]]
    assert names == ["trace.sqlite.gz", "trace.sqlite", "trace.nsys-rep"]
    assert m["trace_files"][1]["bytes"] == len(plain)
    assert json.loads((out / "manifest.json").read_text())["trace_files"] == m["trace_files"]


# ---------------------------------------------------------------- the engine-shaped workloads on the CPU (need torch)

@pytest.mark.skipif(not HAVE_TORCH, reason="needs torch (the GPU-host side); CI has none")
@pytest.mark.parametrize("workload,extra", [
    ("spec", ("--size", "tiny", "--batch", "2")),
    ("serve", ("--size", "tiny", "--stall-ms", "0.3")),
    ("kv", ("--size", "tiny", "--batch", "2", "--context", "128")),
])
def test_engine_workloads_tiny_torch_capture_on_cpu(tmp_path, workload, extra, monkeypatch):
    import gzip

    monkeypatch.setattr(cap, "missing_modules", REAL_MISSING_MODULES)
    out = tmp_path / workload
    m = cap.capture(workload=workload, profiler="torch", out=out, steps=2, mode="eager",
                    extra=(*extra, "--device", "cpu", "--timed-steps", "3", "--warmup", "1"))
    assert m["workload"] == workload and m["unprofiled_step_ms"] > 0 and m["trace_files"][0]["name"] == "trace.json.gz"
    ann = [e["name"] for e in json.load(gzip.open(out / "trace.json.gz"))["traceEvents"]
           if e.get("cat") == "user_annotation"]
    assert sorted(a for a in ann if a.startswith("decode_step")) == ["decode_step 3", "decode_step 4"]
    if workload == "spec":
        assert ann.count("draft") == ann.count("verify") == ann.count("draft_extend") == 2
        assert m["tokens_per_step"] == 2 and len(m["accept"]["accepted_drafts_profiled"]) == 2
        assert m["unprofiled_plain"]["n"] == 3 and m["unprofiled_plain_step_ms"] > 0
        assert set(m["unprofiled_phases_ms"]) == set(m["phases"])
    else:   # on the harness without a plain step or phases: no plain timing, no per-phase truth, no acceptance
        assert not {"unprofiled_plain", "unprofiled_plain_step_ms", "unprofiled_phases_ms", "accept"} & set(m)
        assert m["spec"] is None and m["unprofiled"]["n"] == 3 and m["profiled"]["first_step_index"] == 3
    if workload == "serve":
        assert ann.count("scheduler") == ann.count("grammar_mask") == 2
        assert m["serve"]["injected_stall"]["measured_profiled"]["min_ms"] >= 0.3
    elif workload == "kv":
        assert m["kv_bytes_per_step"] == m["kv_bytes_per_token"] * 128 * 2
    # --no-markers: no range of ours at all
    m2 = cap.capture(workload=workload, profiler="torch", out=tmp_path / "nm", steps=2, mode="eager",
                     extra=(*extra, "--device", "cpu", "--timed-steps", "3", "--warmup", "1", "--no-markers"))
    ann = [e for e in json.load(gzip.open(tmp_path / "nm" / "trace.json.gz"))["traceEvents"]
           if e.get("cat") == "user_annotation"]
    assert ann == [] and m2.get("markers") is None


# ---------------------------------------------------------------- session 3: serve prefill window, lora, moe, sp, probe

HAVE_TRITON = HAVE_TORCH and importlib.util.find_spec("triton") is not None


def test_new_workloads_are_wired(tmp_path):
    for name, script in (("lora", "lora_decode.py"), ("moe", "moe_decode.py"), ("sp", "sp_decode.py")):
        assert cap.workload_script(name) == CAPTURE_DIR / script
        assert cap.WORKLOAD_MODULES[name] == ("torch",)          # triton only on the GPU path, imported there
        c = cap.workload_cmd(cap.workload_script(name), profiler="nsys", steps=5, mode="graph", spec=None,
                             out_dir=tmp_path, extra=["--size", "tiny", "--no-markers"], python="py")
        assert c[:2] == ["py", str(CAPTURE_DIR / script)] and c[c.index("--steps") + 1] == "5"
        assert c[c.index("--mode") + 1] == "graph" and c[-3:] == ["--size", "tiny", "--no-markers"]
        assert "--tp" not in c
    r = runner().invoke(capture_command, ["--help"])
    assert r.exit_code == 0 and "lora" in r.output and "moe" in r.output


def test_single_process_workloads_say_one_step_and_run_on_the_harness():
    """Every decode workload script but sglang (a real engine) and synthetic (calibration) is a harness.Workload
    subclass whose main() is harness.run: no loop of its own (no time_steps / profiled_phase / write_facts)."""
    import ast

    for script in ("spec_decode.py", "zoo.py", "kv_decode.py", "lora_decode.py", "moe_decode.py",
                   "serve_decode.py", "sp_decode.py", "hf_decode.py"):
        src = (CAPTURE_DIR / script).read_text()
        tree = ast.parse(src)
        workloads = [c for c in tree.body if isinstance(c, ast.ClassDef)
                     and any(ast.unparse(b) == "harness.Workload" for b in c.bases)]
        assert len(workloads) == 1, script
        methods = {f.name for f in workloads[0].body if isinstance(f, ast.FunctionDef)}
        assert {"build", "reset", "step", "contract"} <= methods or script == "zoo.py", (script, methods)
        main = next(f for f in tree.body if isinstance(f, ast.FunctionDef) and f.name == "main")
        assert "harness.run(" in ast.unparse(main) and len(main.body) <= 2, script
        for loop_part in ("time_steps(", "profiled_phase(", "write_facts(", "_common.finish("):
            assert loop_part not in src, (script, loop_part)


def test_python_m_tracekit_capture_needs_no_analyzer_dependency():
    """run_session*.sh call ``python3 -m tracekit capture`` on the GPU host, which has no polars (nor rich, pyarrow)."""
    code = ("import runpy, sys\n"
            "for m in ('polars', 'rich', 'pyarrow', 'adbc_driver_sqlite', 'msgspec'): sys.modules[m] = None\n"
            "sys.argv = ['tracekit', 'capture', '--help']; runpy.run_module('tracekit', run_name='__main__')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "Usage: tracekit capture" in out.stdout and "--workload" in out.stdout
    for script in ("run_session.sh", "run_session3.sh"):
        assert "TK=(python3 -m tracekit capture)" in (CAPTURE_DIR / script).read_text()


def test_run_session3_script_parses():
    script = CAPTURE_DIR / "run_session3.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    text = script.read_text()
    tarballs = set(__import__("re").findall(r"bundle (\S+\.tar\.gz)", text))
    assert len(tarballs) <= 7                       # + session3.log: at most 8 files come back from the device


@pytest.mark.skipif(not HAVE_TORCH, reason="needs torch (the GPU-host side); CI has none")
def test_serve_prefill_in_window_on_cpu(tmp_path, monkeypatch):
    """The first profiled step is a prefill of B x P tokens, the rest decode (issue 24): pinned against the
    GEMM input shapes the torch profiler recorded, not against the manifest alone."""
    import gzip

    monkeypatch.setattr(cap, "missing_modules", REAL_MISSING_MODULES)
    B, P, steps = 2, 32, 3
    m = cap.capture(workload="serve", profiler="torch", out=tmp_path / "s", steps=steps, mode="eager",
                    extra=("--size", "tiny", "--device", "cpu", "--timed-steps", "2", "--warmup", "1",
                           "--prefill-in-window", "--prompt-len", str(P), "--batch", str(B), "--no-markers",
                           "--prefill-timed-steps", "2"))
    assert m["phases"] == ["prefill", "decode", "decode"] and m["steps"] == steps and m["speculative"] is False
    assert m["prefill"]["prompt_len"] == P and m["prefill"]["batch"] == B and m["tokens_per_step"] == B
    assert m["prefill"]["unprofiled_prefill_step_ms"] > 0 and m["unprofiled_step_ms"] > 0
    ev = json.load(gzip.open(tmp_path / "s" / "trace.json.gz"))["traceEvents"]
    assert not [e for e in ev if e.get("cat") == "user_annotation"]          # no markers at all
    lin = [e["args"]["Input Dims"][0] for e in ev if e.get("cat") == "cpu_op" and e.get("name") == "aten::linear"
           and e.get("args", {}).get("Input Dims")]
    H, layers = 256, 2                                                        # llama_torch SIZES["tiny"]
    assert sum(d == [B, P, H] for d in lin) == 3 * layers                     # qkv, o, gate_up: the prompt's rows
    assert sum(d == [B, 1, H] for d in lin) == 3 * layers * (steps - 1)       # the same per decode step
    assert sum(d == [B, H] for d in lin) == steps                             # lm_head: last token only, each step
    sdpa = [e["args"].get("Input Dims") for e in ev if e.get("name") == "aten::scaled_dot_product_attention"]
    assert sum(d[0][2] == P for d in sdpa) == layers                          # causal over the P new tokens


def _tiny_lora_bytes_per_adapter(rank: int) -> int:
    # tiny: hidden 256, 4 heads of 64 (2 KV heads), ffn 512, 2 layers; A [rank, K] per slice, B [N, rank]; bf16
    H, q, kv, ffn, layers = 256, 256, 128, 512, 2
    per_layer = (3 * rank * H + (q + 2 * kv) * rank) + (rank * q + H * rank) + (2 * rank * H + 2 * ffn * rank) \
        + (rank * ffn + H * rank)
    return per_layer * layers * 2


@pytest.mark.skipif(not HAVE_TORCH, reason="needs torch (the GPU-host side); CI has none")
def test_lora_moe_sp_workloads_on_cpu(tmp_path):
    def run(script, *args):
        facts = tmp_path / f"{script}.json"
        r = subprocess.run([sys.executable, str(CAPTURE_DIR / script), "--device", "cpu", "--steps", "1",
                            "--timed-steps", "2", "--warmup", "0", "--facts-out", str(facts), *args],
                           capture_output=True, text=True, cwd=tmp_path)
        assert r.returncode == 0, r.stderr[-2000:]
        return json.loads(facts.read_text())

    f = run("lora_decode.py", "--size", "tiny", "--batch", "3", "--adapters", "2", "--rank", "8")
    assert f["speculative"] is False and f["spec"] is None and f["lora"]["impl"] == "torch"
    assert f["lora"]["rank"] == 8 and f["lora"]["mapping"] == [0, 1, 0] and f["lora"]["adapters_active"] == 2
    per = _tiny_lora_bytes_per_adapter(8)
    assert f["lora"]["bytes_per_adapter"] == per
    assert f["weight_bytes_per_step"] == f["lora"]["base_weight_bytes_per_step"] + 2 * per
    assert f["lora"]["unprofiled_base_step_ms"] > 0

    from tracekit.model.step import expected_experts

    f = run("moe_decode.py", "--size", "tiny", "--batch", "8", "--experts", "loop")
    m = f["moe"]
    assert f["speculative"] is False and m["impl"] == "loop" and (m["experts"], m["top_k"]) == (8, 2)
    e = expected_experts(8, 2, 8)                                    # the analyzer's definition
    assert m["expected_distinct_experts"] == pytest.approx(e, abs=1e-6)
    # tiny MoE by hand (bf16 = 2 bytes): per layer qkv (4 + 2*2 heads) x 64 x 256, o 256 x 256, 2 norms, router
    # 8 x 256; 2 layers; tied lm_head 2048 x 256 + the final norm; experts 8 x (2*128*256 + 256*128) per layer
    non_expert = 2 * (2 * (8 * 64 * 256 + 256 * 256 + 2 * 256 + 8 * 256) + 2048 * 256 + 256)
    experts = 2 * 2 * 8 * (2 * 128 * 256 + 256 * 128)
    assert m["non_expert_bytes_per_step"] == non_expert and m["expert_bytes_stored"] == experts
    assert f["weight_bytes_per_step"] == round(non_expert + experts * e / 8)
    assert 1 <= m["measured_distinct_experts"] <= 8

    f = run("sp_decode.py", "--rs", "local", "--ag", "local", "--layers", "2", "--hidden", "128", "--ffn", "256",
            "--tokens", "4")
    assert f["sp"]["per_step"] == {"reduce_scatter": 2, "all_gather": 2} and f["tp"] == 1
    assert f["weight_bytes_per_step"] == 2 * (2 * 128 * 256 + 128) * 2


@pytest.mark.skipif(not HAVE_TORCH, reason="needs torch (the GPU-host side); CI has none")
def test_moe_grouped_and_aligned_paths_match_the_loop():
    import torch

    mo = _load_workload("moe_ops")
    g = torch.Generator().manual_seed(3)
    T, H, F_, E, k = 6, 64, 32, 8, 2
    h = torch.randn(T, H, generator=g).to(torch.bfloat16)
    router = torch.randn(E, H, generator=g).to(torch.bfloat16)
    w13 = (torch.randn(E, 2 * F_, H, generator=g) * 0.1).to(torch.bfloat16)
    w2 = (torch.randn(E, H, F_, generator=g) * 0.1).to(torch.bfloat16)
    w, ids = mo.route(torch, h, router, k)
    assert torch.allclose(w.float().sum(-1), torch.ones(T), atol=1e-2)
    ref = mo.experts_loop(torch, h, w13, w2, w, ids).float()
    if hasattr(torch, "_grouped_mm"):
        out = mo.experts_grouped_mm(torch, h, w13, w2, w, ids).float()
        assert (out - ref).abs().max() <= 2e-2 * ref.abs().max()
    # moe_align_block_size: every (token, k) row once, in its expert's padded block, blocks labelled by expert
    sorted_ids, expert_ids, n = mo.moe_align_block_size(torch, ids, E, 4)
    flat = ids.reshape(-1).tolist()
    valid = [(i, r) for i, r in enumerate(sorted_ids.tolist()) if r < T * k]
    assert sorted(r for _, r in valid) == list(range(T * k))
    for i, r in valid:
        assert expert_ids[i // 4].item() == flat[r]
    counts = [flat.count(x) for x in range(E)]
    assert n.item() == sum(-(-c // 4) * 4 for c in counts)
    assert all(e == -1 for e in expert_ids.tolist()[n.item() // 4:])


@pytest.mark.skipif(not HAVE_TRITON, reason="needs torch + triton (the GPU-host side): the kernels run in Triton's "
                                            "CPU interpreter here")
def test_triton_lora_and_moe_kernels_match_torch_in_the_interpreter(tmp_path):
    """The GPU path's Triton kernels (_lora_shrink_kernel/_lora_expand_kernel, fused_moe_kernel) against the
    torch reference, in TRITON_INTERPRET=1 on a CPU (float16: the interpreter mishandles bfloat16)."""
    code = textwrap.dedent("""
        import sys, torch
        import lora_ops as lo, moe_ops as mo
        torch.manual_seed(0)
        dt = torch.float16
        M, K, R, n = 5, 96, 16, 3
        slices = (48, 16, 16)
        x = torch.randn(M, K, dtype=dt)
        a = torch.randn(len(slices), n, R, K, dtype=dt) * 0.1
        b = torch.randn(n, sum(slices), R, dtype=dt) * 0.1
        meta = lo.LoRAMeta(torch, n, 8, "cpu")
        meta.prepare(torch.tensor([2, -1, 0, 2, 1]))
        starts, ns = torch.tensor([0, 48, 64]), torch.tensor(slices)
        bt, y0 = torch.empty(len(slices), M, R), torch.randn(M, sum(slices), dtype=dt)
        lo.lora_shrink(x, a, bt, meta, 0.5, "torch")
        for sk in (1, 2):
            bq = torch.empty_like(bt)
            lo.lora_shrink(x, a, bq, meta, 0.5, "triton", split_k=sk)
            assert (bq - bt).abs().max() < 1e-3, sk
        assert bt[:, 1].abs().max() == 0                       # the token without an adapter
        yt, yq = y0.clone(), y0.clone()
        lo.lora_expand(bt, b, yt, meta, starts, ns, slices, "torch")
        lo.lora_expand(bt, b, yq, meta, starts, ns, slices, "triton")
        assert (yt.float() - yq.float()).abs().max() < 1e-2 and (yt - y0).abs().max() > 0.05
        assert torch.equal(yt[1], y0[1])
        T, H, F, E = 5, 64, 32, 8
        h = torch.randn(T, H, dtype=dt)
        w13, w2 = torch.randn(E, 2 * F, H, dtype=dt) * 0.1, torch.randn(E, H, F, dtype=dt) * 0.1
        w, ids = mo.route(torch, h, torch.randn(E, H, dtype=dt), 2)
        ref = mo.experts_loop(torch, h, w13, w2, w, ids).float()
        out = mo.experts_triton(torch, h, w13, w2, w, ids).float()
        assert (out - ref).abs().max() < 1e-2 * max(1.0, ref.abs().max().item()), (out - ref).abs().max()
        print("ok")
    """)
    env = dict(__import__("os").environ, TRITON_INTERPRET="1", PYTHONPATH=str(CAPTURE_DIR))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]


def _probe_sqlite(path: Path) -> None:
    """A minimal nsys-export-shaped file: two probe ranges, one kernel and one memcpy launched inside them."""
    con = sqlite3.connect(path)
    con.executescript("""
        create table StringIds (id integer primary key, value text);
        create table NVTX_EVENTS (start int, end int, text text, textId int, globalTid int, eventType int);
        create table CUPTI_ACTIVITY_KIND_RUNTIME (start int, end int, correlationId int, globalTid int, nameId int);
        create table CUPTI_ACTIVITY_KIND_KERNEL (start int, end int, correlationId int, shortName int,
                                                demangledName int);
        create table CUPTI_ACTIVITY_KIND_MEMCPY (start int, end int, correlationId int);
        insert into StringIds values (1, 'one_shot_all_reduce_kernel'), (2, 'probe nccl all_gather_into_tensor');
        insert into NVTX_EVENTS values (100, 200, 'probe symm one_shot_all_reduce', null, 7, 59),
                                       (300, 400, null, 2, 7, 59);
        insert into CUPTI_ACTIVITY_KIND_RUNTIME values (110, 120, 1, 7, 0), (130, 140, 2, 7, 0), (150, 160, 3, 7, 0),
                                                        (310, 320, 4, 7, 0), (330, 340, 5, 8, 0);
        insert into CUPTI_ACTIVITY_KIND_KERNEL values (500, 510, 1, 1, 1), (520, 530, 2, 1, 1), (540, 550, 3, 1, 1),
                                                       (560, 570, 5, 1, 1);
        insert into CUPTI_ACTIVITY_KIND_MEMCPY values (600, 610, 4);
    """)
    con.commit()
    con.close()


def test_collectives_probe_reads_nsys_ranges(tmp_path, capsys):
    probe = _load_workload("collectives_probe")
    db = tmp_path / "p.sqlite"
    _probe_sqlite(db)
    rows = {r["op"]: r for r in probe.from_sqlite(str(db))}
    assert rows["symm one_shot_all_reduce"]["kernels_per_call"] == 1.0      # 3 launches / 3 calls
    assert rows["symm one_shot_all_reduce"]["kernel_names"] == ["one_shot_all_reduce_kernel"]
    ag = rows["nccl all_gather_into_tensor"]
    assert ag["kernels_per_call"] == 0 and ag["memcpy_per_call"] == pytest.approx(1 / 3)   # other thread's kernel
    s = probe.summary(list(rows.values()))
    assert s["rs_ag_capture_possible_on_one_gpu"] is False and s["all_gather_kernel_ops"] == []
    assert "needs >= 2 GPUs" in s["verdict"]
    s = probe.summary([{"op": "nccl reduce_scatter_tensor", "kernels_per_call": 1.0},
                       {"op": "symm _low_contention_all_gather", "kernels_per_call": 2.0}])
    assert s["rs_ag_capture_possible_on_one_gpu"] is True
    out = tmp_path / "probe.json"
    assert probe.main(["--from-sqlite", str(db), "--json-out", str(out)]) == 0
    assert "symm one_shot_all_reduce" in capsys.readouterr().out
    assert json.loads(out.read_text())["summary"]["reduce_scatter_kernel_ops"] == []
