"""The speculative-decoding zoo (issue 42: capture/zoo.py, harness.py, zoo_kernels.py, zoo_models.py,
zoo_driver.py, run_zoo.sh), checked on a CPU.

What is pinned, and against what:
* the tree and acceptance kernels on a tree built by hand (SGLang's index layout: ``select_top_k_tokens`` level 1
  = indices 0..topk-1, level 2 = topk.. ; parents from ``organize_draft_results``), the gated delta rule and the
  causal conv against closed forms -- the torch fallbacks here, the Triton kernels in Triton's CPU interpreter
  (float16: the interpreter mishandles bfloat16);
* every shape, run tiny under the torch profiler with markers, its engine's spans and Python stacks: the GEMMs the
  profiler recorded (``aten::linear`` input shapes) per profiled step -- the draft's one-token and (K+1)-token
  forwards, the target's verify over N tokens -- against the counts the engines' loops imply (written out here from
  the shape's sizes, not read from the workload), the spans' names and counts, the engine-named frames;
* the session script (``bash -n``, at most 3 tarballs) and the driver (a stand-in nsys; no polars, no torch).
The GPU numbers themselves come from the session (``capture/run_zoo.sh``; sample_traces/README.md).
"""

from __future__ import annotations

import gzip
import importlib
import importlib.util
import json
import os
import re
import stat
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CAPTURE = ROOT / "capture"
HAVE_TORCH = importlib.util.find_spec("torch") is not None
HAVE_TRITON = HAVE_TORCH and importlib.util.find_spec("triton") is not None
needs_torch = pytest.mark.skipif(not HAVE_TORCH, reason="needs torch (the GPU-host side); CI has none")


def _load(name):
    sys.path.insert(0, str(CAPTURE))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(CAPTURE))


# ---------------------------------------------------------------------------------------------------- the shapes

def test_shapes_span_the_sizes_the_issue_asks_for():
    zoo = _load("zoo")
    S = zoo.SHAPES
    assert set(S) == {"sglang-chain", "sglang-tree", "standalone", "ngram", "vllm-eagle", "mtp-multilayer",
                      "hybrid-nextn"}
    batches = [s.batch for s in S.values()]
    ks = [s.steps for s in S.values()]
    layers = [s.target["layers"] for s in S.values()]
    hidden = [s.target["hidden"] for s in S.values()] + [s.draft_cfg["hidden"] for s in S.values() if s.draft_cfg]
    vocab = {s.target["vocab"] for s in S.values()}
    ctx = [s.context for s in S.values()]
    assert (min(batches), max(batches)) == (1, 16) and (min(ks), max(ks)) == (2, 5)
    assert (min(layers), max(layers)) == (8, 32) and (min(hidden), max(hidden)) == (1024, 4096)
    assert (min(vocab), max(vocab)) == (32000, 151936) and len(vocab) >= 4
    assert (min(ctx), max(ctx)) == (128, 2048)
    assert S["sglang-tree"].topk == 4 and S["sglang-tree"].verify_tokens == 8
    assert S["ngram"].draft is None and S["standalone"].draft_mode == "eager"
    assert S["hybrid-nextn"].hybrid and S["hybrid-nextn"].draft == "nextn"
    for s in S.values():   # every shape's engine-span dialect is its engine's
        assert s.spans in zoo.Zoo.SPANS and zoo.DIALECT_ENGINES[s.spans] == s.engine.split("-")[0]


def test_engine_class_frames_carry_the_engine_file():
    harness = _load("harness")
    cls = harness.engine_class("sglang/srt/speculative/eagle_worker.py", "EAGLEWorker", ("draft", "verify"))

    class Impl:
        def draft(self, x):
            return x + 1

    w = cls(Impl())
    assert type(w).__name__ == "EAGLEWorker" and w.draft(1) == 2
    code = type(w).draft.__code__
    assert code.co_filename == os.path.join(harness.FRAMES_DIR, "sglang/srt/speculative/eagle_worker.py")
    assert code.co_name == "draft"


# ---------------------------------------------------------------------------------------------------- kernels

_KERNEL_CHECK = r"""
import json, sys, torch
import zoo_kernels as zk
impls = sys.argv[1].split(",")
out = {}
for impl in impls:
    r = {}
    # a tree by hand: topk 2, 2 steps, 4 verify tokens. parents_list[0] = [-1, 0, 1] (the root's children are
    # level-1 indices 0, 1); the best 3 of the 2 + 4 scores are indices 0, 1 (level 1) and 2 (level 2, the first
    # child of level-1 token 0, parent index 2 // topk = 1 -> parent_list[1] = 0 = token 1's selected index)
    par = torch.tensor([[-1, 0, 1]]); sel = torch.tensor([[0, 1, 2]]); L = torch.tensor([10])
    tm = torch.zeros(1, 4, 4, dtype=torch.uint8); pos = torch.zeros(1, 4, dtype=torch.long)
    ri, nt, ns = (torch.empty(1, 4, dtype=torch.long) for _ in range(3))
    zk.build_tree(par, sel, L, tm, pos, ri, nt, ns, 2, 2, impl)
    r["tree"] = [tm.tolist(), pos.tolist(), ri.tolist(), nt.tolist(), ns.tolist()]
    # greedy verify on that tree: the target picks token 2 (the root's second child), then nothing
    cand = torch.tensor([[5, 7, 8, 9]])
    tp = torch.tensor([[8, 1, 3, 4]])
    pred = torch.zeros(4, dtype=torch.long); ai = torch.empty(1, 3, dtype=torch.int32)
    an = torch.empty(1, dtype=torch.int32)
    zk.verify_tree_greedy(pred, ai, an, cand, ri, nt, ns, tp, impl)
    r["verify"] = [pred.tolist(), ai.tolist(), an.tolist()]
    # a chain that matches twice: the target then takes token 3, its own prediction after it is the bonus
    parc = torch.tensor([[-1, 0, 1]]); selc = torch.tensor([[0, 1, 2]])
    tmc = torch.zeros(1, 4, 4, dtype=torch.uint8); posc = torch.zeros(1, 4, dtype=torch.long)
    ric, ntc, nsc = (torch.empty(1, 4, dtype=torch.long) for _ in range(3))
    zk.build_tree(parc, selc, L, tmc, posc, ric, ntc, nsc, 1, 3, impl)
    r["chain"] = [tmc.tolist(), posc.tolist(), ntc.tolist(), nsc.tolist()]
    candc = torch.tensor([[5, 6, 7, 8]]); tpc = torch.tensor([[6, 7, 9, 2]])
    ai4 = torch.empty(1, 4, dtype=torch.int32)
    zk.verify_tree_greedy(pred, ai4, an, candc, ric, ntc, nsc, tpc, impl)
    r["chain_verify"] = [pred.tolist(), ai4.tolist(), an.tolist()]
    # vLLM greedy rejection: request 0 accepts both drafts (+ bonus), request 1 rejects at the first
    o = torch.empty(2, 3, dtype=torch.long)
    zk.rejection_greedy_sample(o, torch.tensor([2, 4]), torch.tensor([4, 5, 6, 7]), torch.tensor([4, 5, 9, 7]),
                               torch.tensor([3, 3]), 2, impl)
    r["rejection"] = o.tolist()
    # the gated delta rule from a zero state, g = 0 (no decay): v' = beta * v, h = k v'^T, o = v' (k . q) / sqrt(K)
    q = torch.tensor([[[[1.0, 0.0]]]], dtype=torch.float16); k = torch.tensor([[[[0.6, 0.8]]]], dtype=torch.float16)
    v = torch.tensor([[[[2.0, -4.0]]]], dtype=torch.float16)
    g = torch.zeros(1, 1, 1); beta = torch.full((1, 1, 1), 0.5)
    st = torch.zeros(1, 1, 2, 2); o = torch.empty(1, 1, 1, 2, dtype=torch.float16)
    zk.gated_delta_rule_update(q, k, v, g, beta, o, st, torch.tensor([0]), None, 2 ** -0.5, False, impl)
    r["gdn"] = [o.float().tolist(), st.tolist()]
    # the causal conv (width 4, SiLU off by a zero input): state [1, 2, 3], weights [1, 1, 1, 1], x = 4 -> 10
    x = torch.tensor([[[4.0]]], dtype=torch.float16); cs = torch.tensor([[[1.0, 2.0, 3.0]]], dtype=torch.float16)
    w = torch.ones(1, 4, dtype=torch.float16); oc = torch.empty_like(x)
    inter = torch.zeros(1, 1, 1, 3, dtype=torch.float16)
    zk.causal_conv1d_update(x, cs, w, oc, inter, True, impl)
    r["conv"] = [oc.float().tolist(), cs.float().tolist(), inter.float().tolist()]
    out[impl] = r
print(json.dumps(out))
"""


def _kernel_results(impls, interpret=False):
    env = dict(os.environ, PYTHONPATH=str(CAPTURE))
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    r = subprocess.run([sys.executable, "-c", _KERNEL_CHECK, ",".join(impls)], capture_output=True, text=True,
                       env=env, cwd=CAPTURE, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def _check_kernels(r):
    import math

    mask, pos, ri, nt, ns = r["tree"]
    assert mask == [[[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]]]
    assert pos == [[10, 11, 11, 12]] and ri == [[0, 1, 2, 3]]
    assert nt == [[1, 3, -1, -1]] and ns == [[-1, 2, -1, -1]]     # root -> 1 (sibling 2); 1 -> 3
    pred, ai, an = r["verify"]
    assert ai == [[0, 2, -1]] and an == [1] and pred[0] == 8 and pred[2] == 3
    cmask, cpos, cnt, cns = r["chain"]
    assert cmask == [[[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]]] and cpos == [[10, 11, 12, 13]]
    assert cnt == [[1, 2, 3, -1]] and cns == [[-1] * 4]
    pred, ai, an = r["chain_verify"]
    assert ai == [[0, 1, 2, -1]] and an == [2] and pred[:3] == [6, 7, 9]
    assert r["rejection"] == [[4, 5, 3], [9, -1, -1]]
    o, st = r["gdn"]
    kq = 0.6 / math.sqrt(2)                       # k (unit norm) . q (unit norm) * scale 2 ** -0.5
    assert o[0][0][0] == pytest.approx([1.0 * kq, -2.0 * kq], abs=2e-3)
    assert st[0][0][0] + st[0][0][1] == pytest.approx([0.6, -1.2, 0.8, -1.6], abs=2e-3)   # k (x) v'; decode: kept
    oc, cs, inter = r["conv"]
    assert oc[0][0][0] == pytest.approx(10.0 / (1 + math.exp(-10.0)), abs=2e-2)   # SiLU(10)
    assert cs == [[[1.0, 2.0, 3.0]]] and inter == [[[[2.0, 3.0, 4.0]]]]         # verify: state kept, window cached


@needs_torch
def test_kernels_torch_fallbacks_against_hand_built_cases():
    _check_kernels(_kernel_results(["torch"])["torch"])


@pytest.mark.skipif(not HAVE_TRITON, reason="needs torch + triton (the GPU-host side): the kernels run in Triton's "
                                            "CPU interpreter here")
def test_triton_kernels_in_the_interpreter_against_hand_built_cases():
    r = _kernel_results(["triton"], interpret=True)
    _check_kernels(r["triton"])


# ---------------------------------------------------------------------------------------------------- each shape

def _run_zoo(tmp_path, shape, *extra, steps=2):
    facts, trace = tmp_path / f"{shape}.json", tmp_path / f"{shape}.json.gz"
    r = subprocess.run([sys.executable, str(CAPTURE / "zoo.py"), "--shape", shape, "--size", "tiny", "--device",
                        "cpu", "--mode", "eager", "--profiler", "torch", "--steps", str(steps), "--timed-steps", "2",
                        "--warmup", "1", "--facts-out", str(facts), "--trace-out", str(trace), *extra],
                       capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(facts.read_text()), json.load(gzip.open(trace))["traceEvents"]


def _linear_inputs(events):
    """(input dims, weight dims) of every aten::linear the profiler recorded."""
    return Counter((tuple(e["args"]["Input Dims"][0]), tuple(e["args"]["Input Dims"][1])) for e in events
                   if e.get("cat") == "cpu_op" and e.get("name") == "aten::linear" and e.get("args", {}).get("Input Dims"))


def _expected_linears(s):
    """Per profiled step: {(input dims, weight dims): count} of the GEMMs that tell the shape apart, from the
    engines' loops (written out here, independent of the workload's own counts)."""
    H, V, B, N, S, topk = s.target["hidden"], s.target["vocab"], s.batch, s.verify_tokens, s.steps, s.topk
    exp = {((B, N, H), (V, H)): 1}                                  # the target's verify lm_head, every token
    if s.engine == "sglang-eagle" and s.draft != "standalone":      # S-1 one-token draft forwards + 1 extend
        exp[((B * topk, 1, 2 * H), (H, 2 * H))] = S - 1
        exp[((B, S + 1, 2 * H), (H, 2 * H))] = 1
    elif s.draft == "standalone":
        Hd, heads, kvh = s.draft_cfg["hidden"], s.draft_cfg["heads"], s.draft_cfg["kv_heads"]
        qkv = ((heads + 2 * kvh) * (Hd // heads), Hd)
        exp[((B, 1, Hd), qkv)] = (S - 1) * s.draft_cfg["layers"]
        exp[((B, S + 1, Hd), qkv)] = s.draft_cfg["layers"]
    elif s.engine == "vllm-eagle":                                  # first forward over K+1, K-1 one-token ones
        exp[((B, N, 2 * H), (H, 2 * H))] = 1
        exp[((B, 1, 2 * H), (H, 2 * H))] = S - 1
    elif s.engine == "sglang-multilayer":                           # K MTP modules, each over the K+1 tokens
        exp[((B, S + 1, 2 * H), (H, 2 * H))] = S
        exp[((B, 1, 2 * H), (H, 2 * H))] = 0
    else:                                                            # n-gram: no draft model at all
        exp[((B, 1, 2 * H), (H, 2 * H))] = 0
        exp[((B, S + 1, 2 * H), (H, 2 * H))] = 0
    return exp


SPAN_COUNTS = {   # per profiled step, eager (the CPU run): every draft forward is a ModelRunner.forward
    "sglang-chain": lambda s: {"step[TARGET_VERIFY bs={B}]": 1, "step[DECODE bs={B}]": s.steps - 1,
                               "step[DRAFT_EXTEND bs={B}]": 1},
    "hybrid-nextn": lambda s: {"step[TARGET_VERIFY bs={B}]": 1, "step[DECODE bs={B}]": s.steps - 1,
                               "step[DRAFT_EXTEND bs={B}]": 1},
    "standalone": lambda s: {"step[TARGET_VERIFY bs={B}]": 1, "step[DECODE bs={B}]": s.steps - 1,
                             "step[DRAFT_EXTEND bs={B}]": 1},
    "ngram": lambda s: {"step[TARGET_VERIFY bs={B}]": 1},
    "sglang-tree": lambda s: {"step[VERIFY bs={B}]": 1, "step[DRAFT bs={B}]": s.steps - 1,
                              "step[DRAFT_EXTEND_V2 bs={B}]": 1},
    "mtp-multilayer": lambda s: {"step[VERIFY bs={B}]": 1, "step[DRAFT_EXTEND_V2 bs={B}]": s.steps},
    "vllm-eagle": lambda s: {"execute_context_0(0)_generation_{B}({T})": 1},
}
FRAME_OF = {"sglang-eagle": ("sglang/srt/speculative/eagle_worker.py", ("draft", "verify",
                                                                        "forward_draft_extend_after_decode")),
            "sglang-ngram": ("sglang/srt/speculative/ngram_worker.py", ("forward_batch_generation",)),
            "sglang-multilayer": ("sglang/srt/speculative/multi_layer_eagle_worker_v2.py",
                                  ("_draft_extend_for_decode", "verify")),
            "vllm-eagle": ("vllm/v1/spec_decode/eagle.py", ("propose",))}


@needs_torch
@pytest.mark.parametrize("shape", ["sglang-chain", "sglang-tree", "standalone", "ngram", "vllm-eagle",
                                   "mtp-multilayer", "hybrid-nextn"])
def test_each_shape_runs_the_engines_structure(tmp_path, shape):
    _check_structure(tmp_path, shape)


@needs_torch
@pytest.mark.parametrize("shape", ["sglang-chain", "vllm-eagle", "mtp-multilayer", "hybrid-nextn"])
def test_one_draft_step_runs_the_engines_structure(tmp_path, shape):
    """--spec-steps 1 (the usual MTP setting): SGLang's draft graph runs no forward (num_steps - 1 = 0) and the
    draft-extend over 2 tokens is the one draft forward; vLLM's proposer runs its first forward only; one MTP head."""
    _check_structure(tmp_path, shape, spec_steps=1)


def _check_structure(tmp_path, shape, spec_steps=None):
    import dataclasses

    zoo = _load("zoo")
    s = zoo.tiny(zoo.SHAPES[shape])
    extra = []
    if spec_steps is not None:
        s = dataclasses.replace(s, steps=spec_steps, draft_tokens=s.draft_tokens if s.topk > 1 else 0)
        extra = ["--spec-steps", str(spec_steps)]
    steps = 2
    f, ev = _run_zoo(tmp_path, shape, "--engine-spans", s.spans, "--with-stack", *extra, steps=steps)
    # the manifest's speculation facts
    assert f["workload"] == "zoo" and f["shape"] == shape and f["tokens_per_step"] == s.batch
    assert f["verify_tokens"] == s.verify_tokens and f["draft_model"]["exists"] is (s.draft is not None)
    K = s.verify_tokens - 1 if s.topk > 1 else s.steps
    assert f["spec"]["draft_tokens"] == K and 1.0 <= f["spec"]["accept_len"] <= s.steps + 1
    assert f["unprofiled_step_ms"] > 0 and f["unprofiled_plain_step_ms"] > 0
    assert set(f["unprofiled_phases_ms"]) == set(f["phases"])
    assert len(f["accept"]["accepted_drafts_profiled"]) == steps
    assert all(len(a) == s.batch for a in f["accept"]["accepted_drafts_profiled"])
    # the GEMMs the profiler recorded, per step
    got = _linear_inputs(ev)
    for key, n in _expected_linears(s).items():
        assert got.get(key, 0) == n * steps, (key, got.get(key, 0), n * steps)
    # markers: decode_step <i> per step, draft / verify per step
    ann = Counter(e["name"] for e in ev if e.get("cat") == "user_annotation")
    assert sorted(a for a in ann if a.startswith("decode_step")) == ["decode_step 2", "decode_step 3"]
    assert ann["verify"] == steps and ann["draft"] == (0 if shape == "mtp-multilayer" else steps)
    assert ann["draft_extend"] == (0 if shape in ("ngram", "vllm-eagle") else steps)
    # the engine's spans
    fields = {"B": s.batch, "T": s.batch * s.verify_tokens}
    for tmpl, n in SPAN_COUNTS[shape](s).items():
        assert ann[tmpl.format(**fields)] == n * steps, (tmpl, ann)
    spans = {a for a in ann if a.startswith(("step[", "execute_context"))}
    assert spans == {t.format(**fields) for t, n in SPAN_COUNTS[shape](s).items() if n}
    # the Python frames, named and filed like the engine's
    path, methods = FRAME_OF[s.engine]
    frames = {e["name"] for e in ev if e.get("cat") == "python_function"}
    for m in methods:
        assert any(re.fullmatch(re.escape(path) + r"\(\d+\): " + m, n) for n in frames), (path, m)


@needs_torch
def test_no_markers_and_no_spans_leave_no_range(tmp_path):
    f, ev = _run_zoo(tmp_path, "vllm-eagle", "--no-markers")
    assert [e for e in ev if e.get("cat") == "user_annotation"] == [] and f["markers"] is None
    assert f["engine_spans"] is None and not [e for e in ev if e.get("cat") == "python_function"]


@needs_torch
def test_spec_decode_engine_spans_are_one_table_entry(tmp_path):
    """spec_decode.py on the harness: --engine-spans sglang writes step[TARGET_VERIFY bs=N] around the verify
    forward only (SGLang EAGLE v1); its manifest keys and markers are as before."""
    facts, trace = tmp_path / "f.json", tmp_path / "t.json.gz"
    r = subprocess.run([sys.executable, str(CAPTURE / "spec_decode.py"), "--size", "tiny", "--batch", "2", "--device",
                        "cpu", "--profiler", "torch", "--steps", "2", "--timed-steps", "2", "--warmup", "1",
                        "--facts-out", str(facts), "--trace-out", str(trace), "--engine-spans", "sglang"],
                       capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    ann = [e["name"] for e in json.load(gzip.open(trace))["traceEvents"] if e.get("cat") == "user_annotation"]
    assert ann == ["decode_step 2", "draft", "verify", "step[TARGET_VERIFY bs=2]", "draft_extend"] * 1 + \
        ["decode_step 3", "draft", "verify", "step[TARGET_VERIFY bs=2]", "draft_extend"]
    f = json.loads(facts.read_text())
    assert f["engine_spans"]["dialect"] == "sglang" and f["host_reads_per_step"] == 2
    assert 0 < f["unprofiled_draft_phase_ms"] and f["draft_model"]["forwards_per_step"] == 4


# ---------------------------------------------------------------------------------------------------- the session

def test_run_zoo_script_parses_and_returns_few_files():
    script = CAPTURE / "run_zoo.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    text = script.read_text()
    tarballs = set(re.findall(r"bundle (zoo_\d\.tar\.gz)", text))
    assert tarballs == {"zoo_1.tar.gz", "zoo_2.tar.gz", "zoo_3.tar.gz"}        # + zoo.log: 4 of the 8 files
    assert "DRV=(python3 capture/zoo_driver.py)" in text and "14 MiB" in text
    zoo = _load("zoo")
    groups = re.findall(r"GROUP\d=\(([^)]*)\)", text)
    assert sorted(x for g in groups for x in g.split()) == sorted(zoo.SHAPES)


def test_driver_imports_no_polars_nor_torch():
    code = ("import runpy, sys\n"
            "for m in ('polars', 'rich', 'pyarrow', 'torch', 'numpy'): sys.modules[m] = None\n"
            f"sys.argv = ['zoo_driver.py', '--help']; runpy.run_path({str(CAPTURE / 'zoo_driver.py')!r}, "
            "run_name='__main__')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "profile" in out.stdout and "finish" in out.stdout


def _fake_nsys(tmp_path: Path) -> Path:
    """A stand-in nsys: `profile` runs the workload command it was given (the real zoo.py, eager on the CPU, so it
    writes its real facts) and writes an .nsys-rep; `export` writes a SQLite file."""
    helper = tmp_path / "fake_nsys.py"
    helper.write_text(textwrap.dedent("""
        import sqlite3, subprocess, sys
        a = sys.argv[1:]
        if a[0] == "--version":
            print("NVIDIA Nsight Systems version 2025.3.1.0-fake"); sys.exit(0)
        if a[0] == "profile":
            out = a[a.index("-o") + 1]
            cmd = a[a.index("--force-overwrite=true") + 3:]
            rc = subprocess.run(cmd).returncode
            open(out + ".nsys-rep", "wb").write(b"rep")
            sys.exit(rc)
        if a[0] == "export":
            db = sqlite3.connect(a[a.index("-o") + 1]); db.execute("create table StringIds(id, value)"); db.commit()
            sys.exit(0)
        sys.exit(9)
    """))
    exe = tmp_path / "nsys"
    exe.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{helper}" "$@"\n')
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return exe


@needs_torch
def test_driver_profile_then_finish_writes_a_matching_manifest(tmp_path):
    drv = _load("zoo_driver")
    from tracekit.manifest import manifest_matches

    nsys = _fake_nsys(tmp_path)
    out = tmp_path / "zoo-ngram-nomark"
    zoo_args = ["--shape", "ngram", "--size", "tiny", "--device", "cpu", "--mode", "eager", "--steps", "2",
                "--timed-steps", "2", "--warmup", "1", "--no-markers"]
    m = drv.profile(out, "nsys", zoo_args, str(nsys), 3350.0)
    assert m["workload"] == "zoo" and m["shape"] == "ngram" and m["profiler"] == "nsys" and m["steps"] == 2
    assert m["peak_bw_gbps"] == 3350.0 and m["versions"]["nsys"].startswith("2025.3.1")
    assert m["draft_model"]["exists"] is False and m["spec"]["draft_tokens"] == 5
    assert [e["name"] for e in m["trace_files"]] == ["trace.nsys-rep"]
    m2 = drv.finish(out, str(nsys))
    assert not (out / "trace.nsys-rep").exists() and (out / "trace.sqlite.gz").is_file()
    assert [e["name"] for e in m2["trace_files"]] == ["trace.sqlite.gz", "trace.sqlite"]
    assert m2["unprofiled_step_ms"] == m["unprofiled_step_ms"]
    saved = json.loads((out / "manifest.json").read_text())
    assert manifest_matches(saved, out / "trace.sqlite.gz", "nsys-sqlite")[0]


# ---------------------------------------------------------------------------------------------- the random zoo

def test_random_zoo_plan_is_seeded_and_spans_the_distribution():
    """capture/zoo.py --random N --seed S (issue 48 item 4): the same plan from the same seed, and seed 48's 48 shapes
    cover what the issue lists (every draft kind, K 1-5, batch 1..32, trees, extend with and without sampling, graphs
    and eager, each SDPA backend)."""
    zoo = _load("zoo")
    out = subprocess.run([sys.executable, str(CAPTURE / "zoo.py"), "--random", "48", "--seed", "48"],
                         capture_output=True, text=True, check=True).stdout.splitlines()
    plan = [json.loads(x) for x in out]
    assert [p["shape"] for p in plan] == [f"rand-48-{i}" for i in range(48)]
    assert plan == [json.loads(x) for x in subprocess.run(
        [sys.executable, str(CAPTURE / "zoo.py"), "--random", "48", "--seed", "48"], capture_output=True, text=True,
        check=True).stdout.splitlines()]
    shapes = [zoo.resolve(p["shape"]) for p in plan]
    assert [s.steps for s in shapes] == [p["K"] for p in plan]
    assert {s.steps for s in shapes} == {1, 2, 3, 4, 5} and min(s.batch for s in shapes) == 1
    assert max(s.batch for s in shapes) == 32 and {s.topk > 1 for s in shapes} == {True, False}
    assert {s.engine for s in shapes} == {"sglang-eagle", "sglang-ngram", "vllm-eagle", "sglang-multilayer"}
    assert {s.draft for s in shapes} == {"eagle", "nextn", "standalone", None}
    assert {s.extend_sample for s in shapes if s.engine == "sglang-eagle"} == {True, False}
    assert {s.mode for s in shapes} == {"graph", "eager"} and {s.attn for s in shapes} == set(zoo.ATTN_BACKENDS)
    for s in shapes:
        assert s.topk == 1 or s.steps >= 2 and s.steps + 1 <= s.verify_tokens <= s.topk * s.steps + 1
    with pytest.raises(ValueError):
        zoo.resolve("rand-48")


@needs_torch
def test_vllm_v1_span_closes_after_the_verify_forward(tmp_path):
    """The ``vllm-v1`` dialect: execute_context_0(0)_generation_B(T) covers the inputs and the target's forward; the
    sampling, the host read and the draft model's forwards (a standalone one here) run after it, before the next."""
    trace = tmp_path / "t.json.gz"
    subprocess.run([sys.executable, str(CAPTURE / "zoo.py"), "--shape", "vllm-v1-draft-model", "--size", "tiny",
                    "--device", "cpu", "--mode", "eager", "--timed-steps", "1", "--warmup", "1", "--steps", "3",
                    "--profiler", "torch", "--trace-out", str(trace), "--no-markers", "--engine-spans", "vllm-v1",
                    "--facts-out", str(tmp_path / "f.json")], check=True, capture_output=True)
    ev = [e for e in json.loads(gzip.open(trace).read())["traceEvents"] if e.get("ph") == "X"]
    spans = sorted((e for e in ev if e["name"] == "execute_context_0(0)_generation_1(5)"), key=lambda e: e["ts"])
    assert len(spans) == 3
    lin = sorted((e["ts"], tuple(e["args"]["Input Dims"][1])) for e in ev if e["name"] == "aten::linear")
    s0, s1 = spans[1]["ts"], spans[1]["ts"] + spans[1]["dur"]
    inside = [w for t, w in lin if s0 <= t <= s1]
    after = [w for t, w in lin if s1 < t < spans[2]["ts"]]
    # tiny target (hidden 128): 2 layers x (qkv, o, gate_up, down) + lm_head; the draft model (hidden 64): K = 4
    # forwards of 2 layers x 4 + its lm_head, all after the span; no weight of one is the other's
    assert len(inside) == 9 and len(after) == 4 * 9
    assert not set(inside) & set(after) and all(128 in w or 320 in w for w in inside)
