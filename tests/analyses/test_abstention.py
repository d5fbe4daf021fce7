"""Honest abstention: where the data cannot support a number, tracekit says so instead of guessing.

* a whole-graph nsys capture (``--cuda-graph-trace=graph``): busy time from the graph-level
  rows goes to ``unattributed``, compute categories are null, a warning says to capture with
  ``--cuda-graph-trace=node``;
* a Kineto trace whose graph launches have no kernels recorded (activity-buffer overflow):
  detected and warned; the affected steps are excluded (never reported as idle GPU time);
* a trace without steps: exit 2, the message suggests ``--step-range``;
* step ranges with no GPU work (or cut off by the capture) are excluded and counted.
"""

from __future__ import annotations

import gzip
import json
import shutil
import sqlite3

import pytest

from _robust import assert_breakdown_sane, assert_clean, run_cli
from conftest import DATA, sample

COMPUTE = ("gemm", "attention", "communication", "drafting", "other")
SAXPY = DATA / "nsys" / "pipit_saxpy_2022.2.sqlite"
VLLM_GRAPH = DATA / "kineto" / "tracelens_rocm_vllm_decode_graph.json.gz"


def _json(args):
    res = run_cli(args)
    assert res.exit_code == 0, res.stderr
    return json.loads(res.stdout)


def _error(args) -> str:
    res = run_cli(args)
    assert_clean(res, args)
    assert res.exit_code == 2, res.stdout[:500]
    return res.stderr.strip()


# ───────────────────── whole-graph nsys capture ─────────────────────

def test_whole_graph_capture_abstains_from_categories(tmp_path):
    src = sample("hf-small-graph-wholegraph/trace.sqlite.gz")
    p = tmp_path / "trace.sqlite.gz"
    shutil.copyfile(src, p)  # no manifest beside it: the trace alone must say it
    b = _json(["breakdown", "--format", "json", p])
    assert_breakdown_sane(b)
    assert b["source"]["graph_trace_mode"] == "graph"
    ps, ks = b["per_step_ms"], b["kernel_ms_per_step"]
    for k in COMPUTE:
        assert ps[k] is None and ks[k] is None, k
    assert ps["unattributed"] > 0
    # the graph-level rows are most of the step: busy time measured, not guessed away as idle
    assert ps["unattributed"] > 0.5 * b["steps"]["mean_ms"]
    assert b["steps"]["count"] >= 1
    assert any("--cuda-graph-trace=node" in w for w in b["warnings"])
    info = _json(["info", "--format", "json", p])
    assert info["source"]["graph_trace_mode"] == "graph"
    assert any("--cuda-graph-trace=node" in w for w in info["warnings"])
    kern = _json(["kernels", "--format", "json", p])
    assert any("graph work has no per-kernel rows" in w for w in kern["warnings"])
    # the table and markdown show the unknowns as unknown (—), not as 0
    md = run_cli(["breakdown", "--format", "md", p]).stdout
    assert "| gemm | — |" in md


# ───────────────────── Kineto graph launches without their kernels ─────────────────────

def _drop_graph_kernels(src, dst, keep_every: int | None = None) -> tuple[int, int]:
    """Copy ``src`` to ``dst`` without the GPU activity of its graph launches (all, or all but every k-th)."""
    doc = json.loads(gzip.decompress(src.read_bytes()))
    ev = doc["traceEvents"]
    launches = sorted((e["ts"], e["args"]["correlation"]) for e in ev
                      if e.get("ph") == "X" and str(e.get("name", "")).endswith("GraphLaunch"))
    lost = {c for i, (_, c) in enumerate(launches) if keep_every is None or i % keep_every != 0}
    doc["traceEvents"] = [e for e in ev if not (e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
                                                and e.get("args", {}).get("correlation") in lost)]
    dst.write_bytes(gzip.compress(json.dumps(doc).encode(), 1))
    return len(lost), len(launches)


def test_kineto_graph_without_kernels_is_detected(tmp_path):
    p = tmp_path / "vllm_lost_graph.json.gz"
    n_lost, n = _drop_graph_kernels(VLLM_GRAPH, p)
    assert n_lost == n >= 1
    info = _json(["info", "--format", "json", p])
    assert any("no kernels recorded" in w and "overflow" in w for w in info["warnings"]), info["warnings"]
    # its only step replayed the lost graph: no split can be given, and the message says why
    msg = _error(["breakdown", "--format", "json", p])
    assert "not recorded" in msg and "overflow" in msg
    # the intact copy has no such warning (the detection is not a false alarm)
    intact = tmp_path / "intact.json.gz"
    shutil.copyfile(VLLM_GRAPH, intact)
    assert not any("no kernels recorded" in w for w in _json(["info", "--format", "json", intact])["warnings"])
    assert _json(["breakdown", "--format", "json", intact])["per_step_ms"]["gemm"] > 0


def test_kineto_partly_lost_graph_steps_are_excluded(tmp_path):
    src = sample("hf-small-graph-torch/trace.json.gz")
    p = tmp_path / "trace.json.gz"
    n_lost, n = _drop_graph_kernels(src, p, keep_every=2)
    assert 0 < n_lost < n
    full = _json(["breakdown", "--format", "json", src])
    b = _json(["breakdown", "--format", "json", p])
    assert_breakdown_sane(b)
    assert b["steps"]["excluded"] - full["steps"]["excluded"] == n_lost
    assert b["steps"]["count"] == full["steps"]["count"] - n_lost
    assert any("not recorded" in w for w in b["warnings"])
    assert any("no kernels recorded" in w for w in b["warnings"])
    # what is reported comes from the intact steps: gemm time is still there, not diluted by 'idle' steps
    assert b["per_step_ms"]["gemm"] > 0.5 * full["per_step_ms"]["gemm"]


# ───────────────────── no steps ─────────────────────

def test_no_steps_says_so_and_suggests_step_range(tmp_path):
    src = DATA / "nsys" / "nsysai_mock_2026.1.sqlite"  # two kernels, nothing repeats
    p = tmp_path / src.name
    shutil.copyfile(src, p)
    msg = _error(["breakdown", "--format", "json", p])
    assert "no decode steps found" in msg and "--step-range" in msg
    # the candidates info lists are in the message
    msg = _error(["breakdown", "--step-range", "^no such range$", SAXPY])
    assert "no range matches --step-range" in msg and "--step-range" in msg and "'^saxpy$'" in msg


def test_saxpy_loop_steps_are_inferred_from_its_period():
    """pipit's MPI saxpy (no step-like range names): 5 iterations of two host-to-device copies, the kernel and a
    device-to-host copy (a host read): 5 inferred steps, the iterations its 5 `saxpy` ranges mark."""
    b = _json(["breakdown", "--format", "json", SAXPY])
    ranges = _json(["breakdown", "--format", "json", "--step-range", "^saxpy$", SAXPY])
    assert b["steps"]["marker"] == "inferred" and ranges["steps"]["count"] + ranges["steps"]["excluded"] == 5
    assert b["steps"]["count"] + b["steps"]["excluded"] == 5
    assert b["steps"]["count"] == ranges["steps"]["count"] == 4  # the last has no following step


def test_no_gpu_activity_is_exit_2_but_info_is_exit_0(tmp_path):
    p = tmp_path / "cpu_only.json.gz"
    shutil.copyfile(DATA / "kineto" / "hta_cpu_only_rank34.json.gz", p)
    info = _json(["info", "--format", "json", p])
    assert info["counts"]["kernels"] == 0 and any("no GPU activity" in w for w in info["warnings"])
    assert "no GPU activity" in _error(["breakdown", "--format", "json", p])


# ───────────────────── excluded steps ─────────────────────

def test_step_ranges_without_gpu_work_are_excluded_and_counted():
    base = _json(["breakdown", "--format", "json", "--step-range", "^saxpy$", SAXPY])
    # 5 saxpy ranges; the last has no following step (contract: excluded with that reason)
    assert base["steps"]["count"] == 4 and base["steps"]["excluded_reasons"] == {"last step (no following step)": 1}
    # MPI_Send ranges launch no GPU work: 10 of them, all excluded, none in any statistic
    b = _json(["breakdown", "--format", "json", "--step-range", "^(saxpy|MPI_Send)$", SAXPY])
    assert b["steps"]["count"] == 4 and b["steps"]["excluded"] == 11
    assert b["steps"]["excluded_reasons"] == {"last step (no following step)": 1, "no GPU work": 10}
    assert b["steps"]["mean_ms"] == base["steps"]["mean_ms"]
    assert any("10 step range(s) launched no GPU work" in w for w in b["warnings"])


def test_cut_off_step_ranges_are_excluded_and_counted(tmp_path):
    p = tmp_path / "saxpy.sqlite"
    shutil.copyfile(SAXPY, p)
    con = sqlite3.connect(p)
    con.execute("""UPDATE NVTX_EVENTS SET "end" = NULL WHERE rowid = (SELECT n.rowid FROM NVTX_EVENTS n
                   JOIN StringIds s ON s.id = n.textId WHERE s.value = 'saxpy' UNION
                   SELECT rowid FROM NVTX_EVENTS WHERE text = 'saxpy' ORDER BY 1 DESC LIMIT 1)""")
    con.commit()
    con.close()
    b = _json(["breakdown", "--format", "json", "--step-range", "^saxpy$", p])
    assert_breakdown_sane(b)
    assert b["steps"]["count"] == 3 and b["steps"]["excluded"] == 2
    assert b["steps"]["excluded_reasons"] == {"cut by capture window": 1, "last step (no following step)": 1}
    assert any("cut off" in w for w in b["warnings"])


# ───────────────────── hedging: every saving an upper bound without an unprofiled time (issue 23 item 4) ─────────────────────

def _alone(name: str):
    """The breakdown of a sample as if no manifest lay beside it (no unprofiled time, no accept length)."""
    from dataclasses import replace

    import tracekit

    from conftest import sample_trace

    return tracekit.breakdown(replace(tracekit.load(sample_trace(name)), manifest=None))


def test_without_unprofiled_time_every_saving_is_an_upper_bound():
    for name in ("hf-small-eager", "hf-small-graph", "spec-small-eager"):
        b = _alone(name)
        assert b.time_base.unprofiled_step_ms is None
        for k, lever in b.advice.levers.items():
            if (lever.max_saving_ms or 0) > 0.0005:
                assert lever.basis == "upper_bound" and "at most" in lever.verdict, (name, k, lever.verdict)
        assert "savings are upper bounds" in b.headline and "at most −" in b.headline, b.headline


def test_the_host_work_lever_is_named_by_what_it_removes():
    """The field case: a GPU-bound graph step whose gap table shows no host stalls must not be sold as 'no host
    stalls': its GPU-idle time is between steps, and the lever (and the headline) say so."""
    b = _alone("hf-small-graph")
    g = b.gaps
    assert g["host_stalls"] < 0.0005 < g["between_steps"]
    hw = b.advice["host_work"]
    assert hw.name == "move the host work between steps off the critical path" and "host stalls" not in hw.verdict
    assert hw.max_saving_ms == pytest.approx(g["host_stalls"] + g["between_steps"])  # the contract's sum
    assert "host stalls" not in b.headline
    assert "move the host work between steps off the critical path → at most" in b.headline


def test_host_work_is_scaled_to_the_unprofiled_step():
    """With an unprofiled step (the manifest's), host_work = (host_stalls + between_steps) x unprofiled / traced,
    capped by what the unprofiled step leaves besides its GPU work."""
    import tracekit

    from conftest import sample_trace

    b = tracekit.breakdown(tracekit.load(sample_trace("serve-small-graph")))
    tb, g, f = b.time_base, b.gaps, b.facts
    scaled = (g["host_stalls"] + g["between_steps"]) * tb.unprofiled_step_ms / tb.traced_step_ms
    room = tb.unprofiled_step_ms - f.busy_ms - g["graph_bubbles"] - f.launched_per_step * f.replay_gap_us / 1000
    hw = b.advice["host_work"]
    assert hw.max_saving_ms == pytest.approx(min(scaled, max(0.0, room)))
    assert hw.max_saving_ms > 0 and hw.basis == "estimated" and hw.verdict.startswith(
        f"removing the host stalls and the host work between steps would save ≈{hw.max_saving_ms:.3f} ms")
    # where the unprofiled step leaves no room, all the traced host time was the profiler's
    z = tracekit.breakdown(tracekit.load(sample_trace("hf-small-graph"))).advice["host_work"]
    assert z.max_saving_ms == 0 and not z.applicable and "profiler's own overhead" in z.verdict


def test_an_unknown_lever_is_listed_never_no_lever():
    """The field case: a speculative trace without a manifest (no accept length): drafting is unknown, the headline
    lists it with the flag that resolves it and never says 'no lever'."""
    b = _alone("spec-small-eager")
    dr = b.advice["drafting"]
    assert dr.applicable and dr.max_saving_ms is None and dr.basis == "unknown" and dr.needs == ("--accept-len",)
    assert "unknown: drafting (" in b.headline and "pass --accept-len" in b.headline
    assert "no lever" not in b.headline
    d = b.to_dict()["advice"]["drafting"]
    assert d["basis"] == "unknown" and d["needs"] == ["--accept-len"]


def test_graph_replay_host_time_is_not_launch_overhead():
    """In the GB300 decode steps (one full-graph replay each), the in-step gap before the graph launch is SGLang's
    host work before replay(): named so, and never offered as something CUDA graphs would remove."""
    import tracekit

    from conftest import shared

    b = tracekit.breakdown(tracekit.load(shared(
        "lora_perf_lora_profile/runs/Qwen3-30B-A3B-Instruct-2507-BF16-expert_shared-20260609-133913/"
        "current_base_lora/profile/base/bs16-TP-0.trace.json.gz")))
    cg = b.advice["cuda_graphs"]
    assert not cg.applicable and "host work before the graph launches" in cg.verdict
    assert "launch overhead" not in cg.verdict and "launch overhead" not in b.headline
    assert "host work before graph launches" in b.headline  # its share of the traced step, named so
