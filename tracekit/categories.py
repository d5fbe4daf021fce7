"""Every category name tracekit uses, in one place (import these; never spell the lists out again).

* Kernel categories (what a GPU activity is, by its name or its draft range):
  :data:`KERNEL_CATEGORIES`, the keys of ``kernel_ms_per_step``.
* Step categories (what each instant of a step's period is): :data:`STEP_CATEGORIES`, the keys of
  ``per_step_ms`` in display order; :data:`BUSY_CATEGORIES` are the GPU-busy ones and
  :data:`GAP_CATEGORIES` the GPU-idle ones.
* :data:`PRIORITY`: the partition order (each instant goes to the first active category).
* :data:`GAP_CAUSES`: the keys of ``gaps`` (``launch_gaps`` + ``idle`` split by cause).
* :data:`LEVERS`: the keys of ``advice``; :data:`LEVER_NAMES` (and :data:`HOST_WORK_NAMES`): what the headline
  calls pulling each.
* :data:`EXCLUSION_REASONS`: the keys of ``steps.excluded_reasons`` (why a step is not analysed), each named once
  (:data:`NO_GPU_WORK`, :data:`CUT_BY_WINDOW`, :data:`NOT_SELECTED_PHASE`, :data:`LAST_STEP`, :data:`WARM_UP`).
* The schema strings live in ``tracekit.contract`` (:data:`BREAKDOWN_SCHEMA` is re-exported here).

>>> STEP_CATEGORIES[:3], GAP_CATEGORIES
(('gemm', 'attention', 'communication'), ('launch_gaps', 'idle'))
>>> set(PRIORITY) == set(BUSY_CATEGORIES)
True
"""

from __future__ import annotations

from typing import Literal

from tracekit.contract import BREAKDOWN_SCHEMA  # (named there, with every other schema string)

KernelCategory = Literal["gemm", "attention", "communication", "drafting", "other", "memory"]

# Name-based categories of GPU activity (data/kernels.toml rules use these), display order.
KERNEL_CATEGORIES: tuple[str, ...] = ("gemm", "attention", "communication", "drafting", "other", "memory")
# Compute categories: the ones a whole-graph capture (no per-kernel rows) cannot measure.
COMPUTE_CATEGORIES: tuple[str, ...] = ("gemm", "attention", "communication", "drafting", "other")
# GPU-busy time whose category cannot be known (whole-graph executions).
UNATTRIBUTED = "unattributed"
BUSY_CATEGORIES: tuple[str, ...] = KERNEL_CATEGORIES + (UNATTRIBUTED,)
GAP_CATEGORIES: tuple[str, ...] = ("launch_gaps", "idle")
# per_step_ms keys, display order.
STEP_CATEGORIES: tuple[str, ...] = BUSY_CATEGORIES + GAP_CATEGORIES
# Partition priority: each instant goes to the first active category of this list.
PRIORITY: tuple[str, ...] = ("drafting", "gemm", "attention", "other", "communication", "memory", UNATTRIBUTED)
# gaps keys: launch_gaps + idle by cause.
GAP_CAUSES: tuple[str, ...] = ("launch_overhead", "host_stalls", "graph_bubbles", "between_steps")
# advice keys, display order (the contract's).
LEVERS: tuple[str, ...] = ("cuda_graphs", "communication", "host_work", "drafting", "memory_bandwidth")
# How the headline names pulling each lever: what it removes, in the words of the gaps table.
# Each is what to do (never a negation such as "no host work").
LEVER_NAMES: dict[str, str] = {"cuda_graphs": "CUDA graphs", "communication": "faster collectives",
                               "host_work": "move host work off the critical path",
                               "drafting": "decode without speculation", "memory_bandwidth": "fewer bytes per step"}
# host_work's name by which of its two gaps it removes (gaps.host_stalls, gaps.between_steps, or both).
HOST_WORK_NAMES: dict[str, str] = {"host_stalls": "move the host stalls inside the step off the critical path",
                                   "between_steps": "move the host work between steps off the critical path",
                                   "both": "move the host stalls and the host work between steps off the critical "
                                           "path"}
# Why a step is excluded: the keys of steps.excluded_reasons, in the order they are counted (the contract's).
NO_GPU_WORK = "no GPU work"
CUT_BY_WINDOW = "cut by capture window"
NOT_SELECTED_PHASE = "phase"  # not of the phase --phase selects
LAST_STEP = "last step (no following step)"
WARM_UP = "warm-up/transition"
EXCLUSION_REASONS: tuple[str, ...] = (NO_GPU_WORK, CUT_BY_WINDOW, NOT_SELECTED_PHASE, LAST_STEP, WARM_UP)
# Range names whose GPU work is drafting (--draft-range's default; Python re.search).
DEFAULT_DRAFT_RANGE = r"(?i)\bdraft"
# Step phases (steps.phase) and what --phase accepts.
PHASES: tuple[str, ...] = ("decode", "prefill", "mixed", "training", "unknown")
PHASE_CHOICES: tuple[str, ...] = ("decode", "prefill", "mixed", "training", "all")

__all__ = ["KERNEL_CATEGORIES", "COMPUTE_CATEGORIES", "UNATTRIBUTED", "BUSY_CATEGORIES", "GAP_CATEGORIES",
           "STEP_CATEGORIES", "PRIORITY", "GAP_CAUSES", "LEVERS", "LEVER_NAMES", "HOST_WORK_NAMES", "PHASES",
           "PHASE_CHOICES", "DEFAULT_DRAFT_RANGE", "BREAKDOWN_SCHEMA", "KernelCategory", "NO_GPU_WORK", "CUT_BY_WINDOW",
           "NOT_SELECTED_PHASE", "LAST_STEP", "WARM_UP", "EXCLUSION_REASONS"]
