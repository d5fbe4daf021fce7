"""docs/definitions.md, rule by rule, on SYNTHETIC traces small enough to compute by hand (tests/factory.py).

Each case is an example the definitions page states: steps found from ranges, attribution by launch time on
the launching thread, the period, the partition's priority order, launch gaps (between a step's activities)
versus idle (after its last). Real figures are pinned elsewhere, on real traces.
"""

from __future__ import annotations

import pytest

import tracekit

from factory import SYNTHETIC, make_trace

GEMM = "nvjet_tst_64x8_64x16_4x1_v_bz_TNT"
ATTN = "flash_fwd_splitkv_kernel"
NCCL = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL"
OTHER = "vectorized_elementwise_kernel"
DRAFT = "build_tree_efficient"


def step_rows(b) -> list[dict]:
    """per-step ms of the analysed steps, in time order, rounded to the ns."""
    return [{k: round(v, 6) if isinstance(v, float) else v for k, v in r.items()} for r in b.per_step.to_dicts()]


def _shift(k, by):
    name, start, end, at, *rest = k
    return (name, start + by, end + by, at + by, *rest)


def three_steps(step0_kernels, extra=()):
    """Step 0 as given (host range 0-100 µs); steps 1 and 2 repeat it 100 and 200 µs later (a steady loop: a step
    unlike the others would be a warm-up/transition step, and the last of three has no following step, so both
    would be excluded: definitions.md 'Steady state')."""
    kernels = [*step0_kernels, *(_shift(k, 100) for k in step0_kernels), *(_shift(k, 200) for k in step0_kernels),
               *extra]
    ranges = [("decode_step 0", 0, 100), ("decode_step 1", 100, 200), ("decode_step 2", 200, 300)]
    return make_trace(kernels=kernels, ranges=ranges)


def test_the_factory_labels_its_traces():
    t = three_steps([(GEMM, 10, 30, 1)])
    assert t.meta.producer == "synthetic" and SYNTHETIC in t.meta.warnings
    b = tracekit.breakdown(t)
    assert SYNTHETIC in b.warnings and b.steps["marker"] == "nvtx" and b.steps["pattern"] == "decode_step #"
    assert b.steps["count"] == 2 and b.steps["excluded_reasons"] == {"last step (no following step)": 1}


def test_period_runs_to_the_next_steps_first_activity_and_partitions_exactly():
    """definitions.md 'Period' and 'The partition': step 0 = gemm 10-30, attention 20-40 (gemm wins 20-30),
    other 50-60; its period is 10 µs (first activity) -> 110 µs (step 1's first activity) = 100 µs:
    gemm 20, attention 10, launch gap 40-50 = 10, other 10, idle 60-110 = 50."""
    b = tracekit.breakdown(three_steps([(GEMM, 10, 30, 1), (ATTN, 20, 40, 2), (OTHER, 50, 60, 3)]))
    s0 = step_rows(b)[0]
    assert s0["period_ms"] == 0.1
    assert {k: s0[k] for k in ("gemm", "attention", "other", "launch_gaps", "idle")} == {
        "gemm": 0.02, "attention": 0.01, "other": 0.01, "launch_gaps": 0.01, "idle": 0.05}
    assert sum(s0[k] for k in ("gemm", "attention", "communication", "drafting", "other", "memory", "unattributed",
                               "launch_gaps", "idle")) == pytest.approx(s0["period_ms"], abs=1e-9)


@pytest.mark.parametrize("first,second,winner", [
    (DRAFT, GEMM, "drafting"), (GEMM, ATTN, "gemm"), (ATTN, OTHER, "attention"), (OTHER, NCCL, "other"),
])
def test_priority_order_first_active_category_wins(first, second, winner):
    """'Each instant of the period goes to the first category active at that instant, in the order drafting,
    gemm, attention, other, communication, memory': two kernels on two streams over the same 10-30 µs."""
    b = tracekit.breakdown(three_steps([(first, 10, 30, 1, 7), (second, 10, 30, 2, 8)]))
    s0 = step_rows(b)[0]
    assert s0[winner] == 0.02
    loser = {DRAFT: "drafting", GEMM: "gemm", ATTN: "attention", OTHER: "other", NCCL: "communication"}[second]
    assert s0[loser] == 0.0
    # kernel_ms_per_step counts both in full (as nsys stats sums them)
    assert b.kernel_ms_per_step[loser] > 0


def test_communication_is_only_its_exposed_part():
    """An all-reduce 10-40 µs beside a gemm 10-30 µs on another stream: 20 µs hidden, 10 µs exposed."""
    b = tracekit.breakdown(three_steps([(GEMM, 10, 30, 1, 7), (NCCL, 10, 40, 2, 8)]))
    s0 = step_rows(b)[0]
    assert (s0["gemm"], s0["communication"]) == (0.02, 0.01)


def test_launch_gaps_are_between_activities_idle_is_after_the_last():
    """Same GPU work (two 10 µs kernels), the gap placed differently: between them it is a launch gap, after
    the last one it is idle (host time before the next step)."""
    gap_inside = step_rows(tracekit.breakdown(three_steps([(GEMM, 10, 20, 1), (OTHER, 70, 80, 2)])))[0]
    gap_after = step_rows(tracekit.breakdown(three_steps([(GEMM, 10, 20, 1), (OTHER, 20, 30, 2)])))[0]
    assert (gap_inside["launch_gaps"], gap_inside["idle"]) == (0.05, 0.03)
    assert (gap_after["launch_gaps"], gap_after["idle"]) == (0.0, 0.08)
    assert gap_inside["period_ms"] == gap_after["period_ms"] == 0.1


def test_work_belongs_to_the_step_open_when_it_was_launched():
    """'Attribution': a kernel launched at 90 µs, inside step 0's range (0-100 µs), runs at 95-105 µs, after
    that range has closed; it is step 0's work (its launch was), not step 1's (which has its own, at 195-205)."""
    b = tracekit.breakdown(three_steps([(GEMM, 10, 20, 1), (OTHER, 95, 105, 90)]))
    rows = step_rows(b)
    assert (rows[0]["other"], rows[1]["other"]) == (0.01, 0.01)
    assert b.kernel_ms_per_step["other"] == 0.01
    assert (rows[0]["launch_gaps"], rows[0]["idle"]) == (0.075, 0.005)  # 20-95 between, 105-110 after
