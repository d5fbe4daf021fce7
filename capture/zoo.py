"""The speculative-decoding zoo: seven decode loops shaped like the engines' speculative workers, written from
their source (pure torch, random bf16 weights; Triton kernels named as the engines name theirs on a GPU with
triton, torch fallbacks on a CPU), on the one loop harness (``capture/harness.py``).

    python capture/zoo.py --shape NAME [--size full|tiny] --mode graph|eager --profiler nsys|torch|none \\
        [--no-markers] [--engine-spans sglang-v1|sglang-v2|vllm|vllm-v1] [--with-stack] [--spec-steps K] \\
        [--attn-backend auto|math|efficient|cudnn] [--plain-only] --steps 10 --facts-out f.json
    python capture/zoo.py --random N --seed S      # the random zoo's N shapes (rand-S-0 .. rand-S-<N-1>), JSON lines

The random zoo (issue 48): ``--shape rand-<seed>-<index>`` is shape ``index`` drawn by ``random_shape(seed, index)``:
draft kind (EAGLE chain or tree, MTP chain or multi-layer, standalone draft model under SGLang's or vLLM's loop,
n-gram), hidden size, layers, K 1..5, batch 1..32, tree top-k, the draft-extend with or without sampling, CUDA
graphs or eager (its ``--mode``) and the SDPA backend (its ``--attn-backend``: math, efficient or cuDNN with the
math kernel as fallback, or PyTorch's choice; no Triton attention kernel is written here). ``--plain-only`` runs
the shape's plain loop alone (the target decoding one token per sequence), e.g. the eager/graph pairs of the
CUDA-graph what-if.

``--spec-steps K`` overrides a shape's K (``--spec-steps 1``: the usual MTP setting, where SGLang's draft graph runs no
forward and the draft-extend is the one draft forward; a tree keeps its draft tokens and needs K >= 2).

Shapes (``SHAPES``; full sizes vary across shapes: batch 1..16, K 2..5, 8..32 target layers, hidden 1536..4096,
vocabularies 32000..151936, contexts 128..2048):

``sglang-chain``   SGLang EAGLE/MTP chain (topk 1): a NEXTN head; per step the draft CUDA graph (``num_steps - 1``
                   one-token draft forwards, the first draft token coming from the previous draft-extend), the
                   tree of the chain (``build_tree_efficient``), the target's verify over K+1 tokens (graph),
                   eager greedy acceptance (``VerifyTreeGreedy``) with host reads, the draft-extend over K+1
                   tokens (graph), the scheduler's host read of the committed tokens.
``sglang-tree``    SGLang EAGLE tree (topk 4, num_steps 3, 8 draft tokens): draft forwards over B*topk rows, the
                   tree's scores (``select_top_k_tokens``, ``organize_draft_results``), tree building, verify over
                   the tree's 8 tokens with a tree mask.
``standalone``     a standalone draft model (own embedding and lm_head, 4 layers, hidden 1024) run EAGERLY by
                   SGLang's EAGLE loop (``StandaloneWorker``), the target in CUDA graphs.
``ngram``          SGLang NGRAM: proposals from the host (an n-gram match over each sequence's token history,
                   H2D copies of the K tokens and the mask), verify over K+1, greedy acceptance, host reads; no
                   draft model.
``vllm-eagle``     vLLM's order (``GPUModelRunner``): inputs H2D, target forward over K+1 per sequence, sampling
                   and rejection sampling (``rejection_greedy_sample_kernel``), host read of the output tokens,
                   then ``EagleProposer.propose``: a first draft forward over the K+1 positions, K-1 one-token
                   forwards, the draft tokens read to the host.
``mtp-multilayer`` SGLang multi-layer MTP (``MultiLayerEagleWorkerV2``, overlap scheduler): draft = tree of the
                   tokens the previous step's MTP modules produced; verify (graph); sampling without a host read;
                   the draft-extend of each of the K MTP modules in turn over the K+1 tokens (module i, one graph
                   each, ``rotate_input_ids_kernel`` between them); the host read of the previous step's result.
``hybrid-nextn``   the seed case: SGLang NEXTN (topk 1, 3 steps) on a Qwen3-Next/Qwen3.5-style hybrid target (3 of
                   every 4 layers Gated DeltaNet: ``_causal_conv1d_update_kernel``, ``fused_gdn_gating_kernel``,
                   ``fused_recurrent_gated_delta_rule_update_fwd_kernel``; full attention every 4th), a
                   full-attention NEXTN head; the verify keeps every token's recurrent state and the accept
                   restores the last accepted one's (``_mamba_verify_update``).

Read in the engines' source (citations: repo@commit : path : symbol):
sgl-project/sglang@00559eac : python/sglang/srt/speculative/eagle_worker.py : EAGLEWorker.forward_batch_generation,
draft, _draft_preprocess_decode, draft_forward, verify, forward_draft_extend_after_decode, capture_for_decode;
@0007d13b : speculative/eagle_info.py : EagleVerifyInput.prepare_for_verify, verify, EagleDraftInput.
prepare_extend_after_decode; @003ddbce : speculative/eagle_utils.py : organize_draft_results,
build_tree_kernel_efficient; speculative/spec_utils.py : select_top_k_tokens, fast_topk,
_generate_simulated_accept_index (commit not pinned); @0094505d : speculative/eagle_draft_extend_cuda_graph_runner.py :
EAGLEDraftExtendCudaGraphRunner; @006b0e3d : speculative/eagle_worker_v2.py : EagleDraftWorker, EAGLEWorkerV2;
speculative/multi_layer_eagle_worker_v2.py : MultiLayerEagleDraftWorker._draft_extend_for_decode (commit not
pinned); @0037c142 : speculative/ngram_worker.py : NGRAMWorker; @72d0337e : utils/profile_utils.py :
build_step_span_name (``step[{ForwardMode.name} bs={bs}]``); hybrid_linear_attn_backend.py :
update_mamba_state_after_mtp_verify. vllm-project/vllm@008603a3 : vllm/v1/spec_decode/eagle.py :
EagleProposer.propose; @0097a7bb : vllm/v1/sample/rejection_sampler.py : rejection_sample,
rejection_greedy_sample_kernel, RejectionSampler.parse_output; vllm/v1/worker/gpu_model_runner.py :
sample_tokens/propose_draft_token_ids (non-padded drafter batch: the draft after ``_bookkeeping_sync``);
vllm/v1/worker/gpu_worker.py : annotate_profile (``execute_context_{n}({t})_generation_{m}({t})``).

Faithful in structure, simplified in data: a fixed-shape KV cache per model (attention over a fixed window,
masked), the request-to-token table is a plain ``[B, window]`` table, the draft-extend always runs K+1 tokens per
sequence (SGLang pads to that width in its graph), vLLM's drafter forwards are each one CUDA graph (its piecewise
graphs leave attention outside). SGLang's EAGLE loop runs ``num_steps - 1`` one-token draft forwards per step
(the first draft token is the previous draft-extend's); ``capture/spec_decode.py`` keeps the older K-forward shape.

Acceptance: random weights never agree, so each shape makes the target agree with the draft where a seeded mask
says so (probability ``--accept-p`` per draft position, the shape's default in ``SHAPES``): before the greedy
verify, the target's prediction at a tree node is replaced by its first child's token (SGLang has a
similar switch, ``SIMULATE_ACC_LEN``); for vLLM the target's argmax at draft position j by draft token j. The
kernels run as they would (the replacement is one ``torch.where``); accept lengths land around 2-3.5.

Engine spans (``--engine-spans``; record_function ranges in the profiled steps, as the engines write them):
``sglang-v1`` (EAGLE v1): ``step[TARGET_VERIFY bs=N]`` around the target's verify forward only; an eager draft
forward ``step[DECODE bs=N]``, an eager draft-extend ``step[DRAFT_EXTEND bs=N]``; graph replays of the draft and
the draft-extend get none. ``sglang-v2``: ``step[DRAFT bs=N]`` (draft graph replay or eager draft forward),
``step[VERIFY bs=N]``, ``step[DRAFT_EXTEND_V2 bs=N]`` (each draft-extend replay). ``vllm``:
``execute_context_0(0)_generation_B(B*(K+1))`` around the whole worker step; ``vllm-v1``: the same span around
``execute_model`` alone (the inputs and the target's forward), closed before ``sample_tokens`` (sampling, rejection,
the host read, ``propose_draft_token_ids``: the drafter's forwards), as vLLM V1's ``gpu_model_runner`` runs. With ``--with-stack`` the Python
frames carry the engines' classes and files (``harness.engine_class``): ``sglang/srt/speculative/eagle_worker.py:
EAGLEWorker.draft / verify / forward_draft_extend_after_decode``, ``vllm/v1/spec_decode/eagle.py:
EagleProposer.propose``, ...

Markers (the NVTX-marked twin, unless ``--no-markers``): ``decode_step <i>`` per step, ``draft`` (the draft
model's forwards before the verify, with their sampling; the host's proposal for ``ngram``; none for
``mtp-multilayer``, whose draft phase runs no forward), ``verify`` (the target's verify forward), ``draft_extend``
(the draft-extend forwards; all K module forwards for ``mtp-multilayer``). Tree building and the other
bookkeeping between them stay outside every range.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field, replace

import _common
import harness
import llama_torch as lt
import zoo_kernels as zk
import zoo_models as zm

# ---------------------------------------------------------------------------------------------------------------
# the shapes
# ---------------------------------------------------------------------------------------------------------------


def _dense(hidden, layers, heads, kv_heads, ffn, vocab, tied=False):
    return dict(hidden=hidden, layers=layers, heads=heads, kv_heads=kv_heads, ffn=ffn, vocab=vocab, tied=tied)


@dataclass(frozen=True)
class Shape:
    name: str
    engine: str                 # sglang-eagle | sglang-ngram | vllm-eagle | sglang-multilayer
    target: dict                # llama_torch.Config keys, or zoo_models.HybridConfig keys (hybrid=True)
    draft: str | None           # nextn | eagle | standalone | None (n-gram)
    batch: int
    context: int
    steps: int                  # SGLang speculative_num_steps / vLLM num_speculative_tokens / n-gram K
    topk: int = 1
    draft_tokens: int = 0       # N: tokens per sequence the verify processes (0: steps + 1)
    hybrid: bool = False
    draft_cfg: dict = field(default_factory=dict)   # the standalone draft model's shape
    draft_mode: str = "graph"   # graph | eager (with --mode graph)
    accept_p: float = 0.75
    spans: str = "sglang-v1"    # the dialect of the shape's engine-span capture (run_zoo.sh)
    extend_sample: bool = True  # SGLang: the draft-extend samples the next first draft token (False: it only fills
                                # the draft KV cache and the hidden state; the draft then runs one forward more)
    mode: str | None = None     # a random shape's --mode (graph | eager); None: the command line's
    attn: str = "auto"          # the SDPA backend (auto | math | efficient | cudnn; --attn-backend)

    @property
    def verify_tokens(self) -> int:
        return self.draft_tokens or self.steps + 1


SHAPES = {s.name: s for s in (
    Shape("sglang-chain", "sglang-eagle", _dense(2048, 24, 16, 4, 5632, 32000), "nextn", batch=4, context=512,
          steps=3, accept_p=0.75, spans="sglang-v1"),
    Shape("sglang-tree", "sglang-eagle", _dense(3072, 16, 24, 8, 8192, 128256), "eagle", batch=2, context=1024,
          steps=3, topk=4, draft_tokens=8, accept_p=0.8, spans="sglang-v2"),
    Shape("standalone", "sglang-eagle", _dense(4096, 32, 32, 8, 14336, 128256), "standalone", batch=1, context=256,
          steps=4, draft_cfg=_dense(1024, 4, 16, 4, 4096, 128256, tied=True), draft_mode="eager", accept_p=0.7,
          spans="sglang-v1"),
    Shape("ngram", "sglang-ngram", _dense(2560, 20, 20, 4, 6912, 151936), None, batch=8, context=2048, steps=5,
          accept_p=0.6, spans="sglang-v1"),
    Shape("vllm-eagle", "vllm-eagle", _dense(1536, 28, 12, 2, 8960, 151936, tied=True), "eagle", batch=16,
          context=128, steps=2, accept_p=0.75, spans="vllm"),
    Shape("mtp-multilayer", "sglang-multilayer", _dense(3584, 8, 28, 4, 18944, 102400), "nextn", batch=2,
          context=768, steps=3, accept_p=0.8, spans="sglang-v2"),
    Shape("hybrid-nextn", "sglang-eagle", dict(hidden=4096, layers=24, heads=32, kv_heads=4, ffn=12288, vocab=151936,
                                               k_heads=16, v_heads=32, k_dim=128, v_dim=128), "nextn", batch=4,
          context=1024, steps=3, hybrid=True, accept_p=0.78, spans="sglang-v1"),
)}


# ---------------------------------------------------------------------------------------------------------------
# the random zoo (issue 48 item 4): shapes drawn from a distribution, reproducible from (seed, index)
# ---------------------------------------------------------------------------------------------------------------

RANDOM_KINDS = ("eagle-chain", "mtp-chain", "eagle-tree", "eagle-tree", "standalone", "ngram", "vllm-eagle",
                "vllm-draft-model", "mtp-multilayer")      # (a tree twice: its shapes vary the most)
ATTN_BACKENDS = ("auto", "math", "efficient", "cudnn")


def random_shape(seed: int, index: int) -> Shape:
    """Shape ``index`` of the random zoo ``seed`` (named ``rand-<seed>-<index>``): the draft kind (EAGLE chain or
    tree, MTP chain or multi-layer, a standalone draft model, n-gram; SGLang's or vLLM's loop), hidden size
    512..4096, 2..16 target layers, K 1..5 (a tree 2..5), batch 1..32, a tree's top-k 2..4, the draft-extend with
    or without sampling, CUDA graphs or eager, the SDPA backend -- each drawn independently (``random.Random``)."""
    import random

    r = random.Random(seed * 1_000_003 + index)
    kind = r.choice(RANDOM_KINDS)
    head_dim = r.choice((64, 128))
    hidden = r.choice((512, 768, 1024, 1536, 2048, 2560, 3072, 4096))
    heads = max(2, hidden // head_dim)
    kv_heads = r.choice([d for d in (1, 2, 4, 8) if heads % d == 0])
    layers = r.randint(2, 16)
    ffn = 64 * round(hidden * r.uniform(2.0, 4.0) / 64) + 64 * r.randint(0, 3)
    vocab = r.choice((32000, 50304, 65536, 128256, 151936))
    batch = r.choice((1, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32))
    steps = r.randint(2, 5) if kind == "eagle-tree" else r.randint(1, 5)
    context = r.choice((128, 256, 512, 1024))
    accept_p = round(r.uniform(0.5, 0.9), 2)
    mode = r.choice(("graph", "graph", "eager"))
    attn = r.choice(ATTN_BACKENDS)
    extend_sample = r.random() < 0.5
    topk, draft_tokens, draft_cfg, draft_mode = 1, 0, {}, "graph"
    engine, draft, spans = "sglang-eagle", "eagle", r.choice(("sglang-v1", "sglang-v2"))
    if kind == "mtp-chain":
        draft = "nextn"
    elif kind == "eagle-tree":
        topk = r.randint(2, 4)
        draft_tokens = r.randint(steps + 1, min(topk * steps, 10) + 1)
    elif kind in ("standalone", "vllm-draft-model"):
        dh = r.choice((256, 512, 768))
        draft = "standalone"
        draft_cfg = _dense(dh, r.randint(1, 4), max(2, dh // 64), r.choice((1, 2)), 64 * round(dh * 3 / 64), vocab,
                           tied=True)
        draft_mode = r.choice(("graph", "eager"))
    elif kind == "ngram":
        engine, draft = "sglang-ngram", None
    elif kind == "mtp-multilayer":
        engine, draft, spans = "sglang-multilayer", "nextn", "sglang-v2"
    if kind.startswith("vllm"):
        engine, spans, extend_sample = "vllm-eagle", r.choice(("vllm", "vllm-v1")), True
    if engine != "sglang-eagle":
        extend_sample = True
    return Shape(f"rand-{seed}-{index}", engine, _dense(hidden, layers, heads, kv_heads, ffn, vocab,
                                                        tied=r.random() < 0.3),
                 draft, batch=batch, context=context, steps=steps, topk=topk, draft_tokens=draft_tokens,
                 draft_cfg=draft_cfg, draft_mode=draft_mode, accept_p=accept_p, spans=spans,
                 extend_sample=extend_sample, mode=mode, attn=attn)


def random_shapes(n: int, seed: int) -> list[Shape]:
    return [random_shape(seed, i) for i in range(n)]


def resolve(name: str) -> Shape:
    """A named shape (``SHAPES``) or a random one, ``rand-<seed>-<index>``."""
    if name in SHAPES:
        return SHAPES[name]
    if name in EXTRA_SHAPES:
        return EXTRA_SHAPES[name]
    parts = name.split("-")
    if len(parts) == 3 and parts[0] == "rand" and parts[1].isdigit() and parts[2].isdigit():
        return random_shape(int(parts[1]), int(parts[2]))
    raise ValueError(f"unknown shape {name!r}: one of {', '.join(sorted([*SHAPES, *EXTRA_SHAPES]))} or "
                     "rand-<seed>-<index>")


def shape_args(s: Shape) -> list[str]:
    """The command-line arguments a random shape runs with (its mode and attention backend)."""
    return [*(["--mode", s.mode] if s.mode else []), "--attn-backend", s.attn]


# Named shapes outside the seven of SHAPES: the vLLM V1 step with a standalone draft model (issue 48: a Qwen3-shaped
# target, a small draft model with its own embedding and lm_head, 4 draft tokens, one sequence; the span the vLLM
# dialect "vllm-v1" writes closes after the target's forward, the drafter's forwards run after it)
EXTRA_SHAPES = {s.name: s for s in (
    Shape("vllm-v1-draft-model", "vllm-eagle", _dense(4096, 16, 32, 8, 12288, 151936), "standalone", batch=1,
          context=512, steps=4, draft_cfg=_dense(1024, 4, 16, 8, 3072, 151936, tied=True), accept_p=0.7,
          spans="vllm-v1"),
)}


def tiny(s: Shape) -> Shape:
    """The CPU smoke-run size of a shape: the same structure, a few MB of weights (FFN widths unlike any other
    GEMM's, so that a GEMM's shapes tell which one it is)."""
    t = dict(s.target)
    t.update(hidden=128, layers=4 if s.hybrid else 2, heads=4, kv_heads=2, ffn=320, vocab=1024 + 512 * len(s.name) % 2048)
    if s.hybrid:
        t.update(k_heads=2, v_heads=4, k_dim=32, v_dim=32)
    d = dict(s.draft_cfg)
    if d:
        d.update(hidden=64, layers=min(d.get("layers", 2), 2), heads=2, kv_heads=1, ffn=160, vocab=t["vocab"])
    return replace(s, target=t, draft_cfg=d, batch=min(s.batch, 2), context=64)


# ---------------------------------------------------------------------------------------------------------------
# engine spans and frames
# ---------------------------------------------------------------------------------------------------------------

SGLANG_V1 = {"verify": "step[TARGET_VERIFY bs={B}]", "draft_forward": "step[DECODE bs={B}]",
             "draft_extend_eager": "step[DRAFT_EXTEND bs={B}]"}
SGLANG_V2 = {"verify": "step[VERIFY bs={B}]", "draft_graph": "step[DRAFT bs={B}]",
             "draft_forward": "step[DRAFT bs={B}]", "draft_extend_graph": "step[DRAFT_EXTEND_V2 bs={B}]",
             "draft_extend_eager": "step[DRAFT_EXTEND_V2 bs={B}]"}
VLLM = {"step": "execute_context_0(0)_generation_{B}({T})"}
# vLLM V1 as gpu_model_runner runs it: Worker.execute_model's span closes after the target's forward; sampling,
# rejection, the host read and the drafter's forwards (sample_tokens -> propose_draft_token_ids) run after it
VLLM_V1 = {"execute": "execute_context_0(0)_generation_{B}({T})"}
HYBRID_KERNELS = ("fused_recurrent_gated_delta_rule_update_fwd_kernel", "_causal_conv1d_update_kernel",
                  "fused_gdn_gating_kernel")
DIALECT_ENGINES = {"sglang-v1": "sglang", "sglang-v2": "sglang", "vllm": "vllm", "vllm-v1": "vllm"}

_SPEC = "sglang/srt/speculative/"
FRAMES = {
    "Scheduler": ("sglang/srt/managers/scheduler.py", ("run_batch", "process_batch_result")),
    "ModelRunner": ("sglang/srt/model_executor/model_runner.py", ("forward",)),
    "EAGLEWorker": (_SPEC + "eagle_worker.py", ("forward_batch_generation", "draft", "draft_forward", "verify",
                                                "forward_draft_extend_after_decode")),
    "EagleVerifyInput": (_SPEC + "eagle_info.py", ("prepare_for_verify", "verify")),
    "NGRAMWorker": (_SPEC + "ngram_worker.py", ("forward_batch_generation", "_prepare_for_speculative_decoding",
                                                "_update_ngram_cache")),
    "MultiLayerEagleWorkerV2": (_SPEC + "multi_layer_eagle_worker_v2.py", ("forward_batch_generation", "verify")),
    "MultiLayerEagleDraftWorker": (_SPEC + "multi_layer_eagle_worker_v2.py", ("draft", "draft_forward",
                                                                              "_draft_extend_for_decode")),
    "Worker": ("vllm/v1/worker/gpu_worker.py", ("execute_model", "sample_tokens")),
    "GPUModelRunner": ("vllm/v1/worker/gpu_model_runner.py", ("execute_model", "sample_tokens", "_bookkeeping_sync",
                                                              "propose_draft_token_ids", "take_draft_token_ids")),
    "RejectionSampler": ("vllm/v1/sample/rejection_sampler.py", ("forward",)),
    "EagleProposer": ("vllm/v1/spec_decode/eagle.py", ("propose",)),
}


def frame(name: str, impl):
    """``impl`` behind a class named and filed like the engine's (``harness.engine_class``)."""
    path, methods = FRAMES[name]
    return harness.engine_class(path, name, methods)(impl)


# ---------------------------------------------------------------------------------------------------------------
# SGLang's tree helpers (eagle_utils.py / spec_utils.py), on the device
# ---------------------------------------------------------------------------------------------------------------

def fast_topk(torch, values, topk: int):
    return torch.max(values, dim=-1, keepdim=True) if topk == 1 else torch.topk(values, topk, dim=-1)


def select_top_k_tokens(torch, i, topk_p, topk_index, hidden, scores, topk):
    """SGLang ``spec_utils.select_top_k_tokens``: the next draft inputs and this level's tree scores
    (``repeat_interleave`` written as expand + reshape: the same values, no host sync inside a graph capture)."""
    if i == 0:
        input_ids = topk_index.flatten()
        hidden = hidden.unsqueeze(1).expand(-1, topk, -1).reshape(-1, hidden.shape[-1])   # repeat_interleave
        scores = topk_p
        parents = torch.arange(-1, topk, device=topk_p.device).unsqueeze(0).repeat(topk_p.shape[0], 1)
        return input_ids, hidden, scores, (topk_p.unsqueeze(1), topk_index, parents)
    expand = scores.unsqueeze(2) * topk_p.reshape(-1, topk, topk)
    cs_p, cs_index = fast_topk(torch, expand.flatten(start_dim=1), topk)
    topk_index = topk_index.reshape(-1, topk ** 2)
    input_ids = torch.gather(topk_index, index=cs_index, dim=1).flatten()
    rows = torch.arange(0, hidden.shape[0], step=topk, device=hidden.device)
    sel = cs_index.flatten() // topk + rows.view(-1, 1).expand(-1, topk).reshape(-1)
    return input_ids, hidden[sel, :], cs_p, (expand, topk_index, cs_index + (topk ** 2 * (i - 1) + topk))


def organize_draft_results(torch, score_list, token_list, parents_list, num_draft_tokens):
    """SGLang ``eagle_utils.organize_draft_results``: the N-1 best draft tokens (sorted) and their parents."""
    scores = torch.cat(score_list, dim=1).flatten(1)
    tokens = torch.cat(token_list, dim=1)
    top = torch.sort(torch.topk(scores, num_draft_tokens - 1, dim=-1).indices).values
    draft_tokens = torch.gather(tokens, index=top, dim=1)
    if len(parents_list) > 1:
        parent_list = torch.cat(parents_list[:-1], dim=1)
    else:   # one draft step (speculative_num_steps 1): no parents, as SGLang's own branch
        parent_list = torch.empty(parents_list[0].shape[0], 0, dtype=torch.long, device=parents_list[0].device)
    return parent_list, top, draft_tokens


# ---------------------------------------------------------------------------------------------------------------
# the workload
# ---------------------------------------------------------------------------------------------------------------

class Zoo(harness.Workload):
    """A speculative decoding loop shaped like an engine's (capture/zoo.py --shape NAME)."""

    name = "zoo"
    SPANS = {"sglang-v1": SGLANG_V1, "sglang-v2": SGLANG_V2, "vllm": VLLM, "vllm-v1": VLLM_V1}

    @classmethod
    def add_args(cls, p):
        p.add_argument("--shape", type=_shape_name, required=True,
                       help=f"one of {', '.join(sorted(SHAPES))}, or rand-<seed>-<index> (the random zoo)")
        p.add_argument("--attn-backend", choices=ATTN_BACKENDS, default=None,
                       help="the SDPA backend (math, efficient, cudnn; each falls back to math where it cannot "
                            "run; auto: PyTorch's choice); default: the shape's")
        p.add_argument("--plain-only", action="store_true",
                       help="the plain loop alone (the target decoding one token per sequence): no speculation")
        p.add_argument("--size", choices=["full", "tiny"], default="full", help="tiny: the CPU smoke-run size")
        p.add_argument("--batch", type=int, default=None, help="override the shape's batch")
        p.add_argument("--context", type=int, default=None, help="override the shape's cached tokens per sequence")
        p.add_argument("--spec-steps", type=int, default=None,
                       help="override the shape's draft steps K (SGLang speculative_num_steps, vLLM "
                            "num_speculative_tokens, MTP modules); a chain then verifies K+1 tokens")
        p.add_argument("--accept-p", type=float, default=None,
                       help="probability the target agrees with a draft position (the shape's default)")
        p.add_argument("--kernels", choices=["auto", "triton", "torch"], default="auto",
                       help="auto: Triton on a CUDA device where triton imports, else the torch fallbacks")
        p.add_argument("--dtype", choices=["bfloat16", "float16"], default="bfloat16")

    @classmethod
    def check_args(cls, p, args):
        if args.mode == "compile":
            p.error("--mode compile: the zoo runs eager or graph")
        shape = resolve(args.shape)
        if args.spec_steps is not None and (args.spec_steps < 1 or (shape.topk > 1 and args.spec_steps < 2)):
            p.error(f"--spec-steps {args.spec_steps}: at least 1 (2 for a tree)")
        if args.engine_spans != "none":
            fam = "vllm" if shape.engine.startswith("vllm") else "sglang"
            if DIALECT_ENGINES[args.engine_spans] != fam:
                p.error(f"--engine-spans {args.engine_spans}: shape {args.shape} runs {fam}'s loop")

    def __init__(self, h):
        super().__init__(h)
        args = self.args
        s = resolve(args.shape)
        s = tiny(s) if args.size == "tiny" else s
        if args.spec_steps is not None:
            s = replace(s, steps=args.spec_steps, draft_tokens=s.draft_tokens if s.topk > 1 else 0)
        s = replace(s, batch=args.batch or s.batch, context=args.context or s.context,
                    accept_p=s.accept_p if args.accept_p is None else args.accept_p)
        self.shape = s
        self.attn = args.attn_backend or s.attn
        self.sdpa = _sdpa_backend(self.torch, self.attn)
        self.impl = ENGINES[s.engine](self)
        self.PHASES, self.MARKERS = self.impl.PHASES, self.impl.MARKERS   # the engine's (the harness reads these)
        if args.plain_only:
            self.PHASES, self.MARKERS = (), {}

    def build(self):
        self.impl.build()

    def reset(self):
        self.impl.reset()

    def step(self, i):
        if self.args.plain_only:
            self.impl.plain_step(i)
        else:
            self.impl.step(i)

    def plain_step(self, i):
        self.impl.plain_step(i)

    def has_plain(self) -> bool:
        return not self.args.plain_only

    def drain(self):
        self.impl.drain()

    def span_fields(self):
        s = self.shape
        return {"B": s.batch, "T": s.batch * s.verify_tokens}

    def contract(self):
        c = self.impl.contract()
        if self.args.plain_only:
            c = {**c, "weight_bytes": self.impl.target_bytes()["bytes"], "draft_tokens": None}
        return c

    def facts(self, run):
        f = self.impl.facts(run)
        f["attention_backend"] = {"asked": self.attn, "sdpa_backends": self.sdpa}
        f["extend_sample"] = self.shape.extend_sample
        if self.shape.name.startswith("rand-"):
            f["random_shape"] = {"seed": int(self.shape.name.split("-")[1]),
                                 "index": int(self.shape.name.split("-")[2]),
                                 "shape": {k: v for k, v in self.shape.__dict__.items()}}
        if self.args.plain_only:
            f.update(plain_only=True, draft_model={"exists": False, "note": "the plain loop alone (--plain-only)"},
                     draft_bytes_per_step=0, unprofiled_draft_phase_ms=None)
        return f


def _shape_name(name: str) -> str:
    import argparse

    try:
        resolve(name)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return name


def _sdpa_backend(torch, name: str):
    """Restrict ``F.scaled_dot_product_attention`` to backend ``name`` with the math kernel as its fallback
    (PyTorch picks in this order; a backend that cannot run a call's shape or mask leaves it to math), for the
    whole process -- the graphs captured and the eager steps alike. Returns the backends set (None: PyTorch's
    choice)."""
    if name == "auto":
        return None
    from torch.nn.attention import SDPBackend, sdpa_kernel

    want = {"math": [SDPBackend.MATH], "efficient": [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH],
            "cudnn": [SDPBackend.CUDNN_ATTENTION, SDPBackend.MATH]}[name]
    try:
        ctx = sdpa_kernel(want, set_priority=True)
    except TypeError:     # older torch: no priorities (the order is PyTorch's: efficient, math, cudnn)
        ctx = sdpa_kernel(want)
    ctx.__enter__()       # for the whole process (never left)
    return [b.name for b in want]


class Engine:
    """What the engine loops share: sizes, the target and its plain step, the acceptance mask, facts."""

    PHASES: tuple[str, ...] = ()
    MARKERS: dict[str, str] = {}
    HOST_READS = 0
    FRAME_NAMES: tuple[str, ...] = ()

    def __init__(self, z: Zoo):
        self.z, self.h, self.args, self.torch, self.dev, self.cuda = z, z.h, z.args, z.torch, z.dev, z.cuda
        self.s = z.shape
        self.B, self.N = self.s.batch, self.s.verify_tokens
        self.graph = self.args.mode == "graph"
        self.kimpl = zk.default_impl(self.dev) if self.args.kernels == "auto" else self.args.kernels
        self.pending = None

    # ---- sizes and state -----------------------------------------------------------------------------------
    def _window(self) -> int:
        a = self.args
        run = max(a.timed_steps, a.steps) + a.warmup + 2
        return lt.round_up(self.s.context + (run + 2) * (self.N + 1) + self.N, 64)

    def _verify_buffers(self, S: int, H: int) -> None:
        """The verify and draft-extend inputs SGLang's EAGLE workers keep per batch (EagleVerifyInput's tree and
        retrieve indices, the accept index/length, the extend's ids, positions and hidden states) for ``S`` draft
        steps and hidden size ``H``."""
        torch, B, N, dev, L = self.torch, self.B, self.N, self.dev, self.torch.long
        self.vids = torch.zeros(B, N, dtype=L, device=dev)
        self.vpos = torch.zeros(B, N, dtype=L, device=dev)
        self.tree = torch.zeros(B, N, N, dtype=torch.uint8, device=dev)
        self.retrive_index = torch.zeros(B, N, dtype=L, device=dev)
        self.retrive_next_token = torch.zeros(B, N, dtype=L, device=dev)
        self.retrive_next_sibling = torch.zeros(B, N, dtype=L, device=dev)
        self.predict = torch.zeros(B * N, dtype=L, device=dev)
        self.accept_index = torch.zeros(B, S + 1, dtype=torch.int32, device=dev)
        self.accept_length = torch.zeros(B, dtype=torch.int32, device=dev)
        self.ext_ids = torch.zeros(B, S + 1, dtype=L, device=dev)
        self.ext_pos = torch.zeros(B, S + 1, dtype=L, device=dev)
        self.ext_hid = torch.zeros(B, S + 1, H, dtype=self.dtype, device=dev)
        self.ext_start = torch.zeros(B, dtype=L, device=dev)
        self.ext_acc = torch.zeros(B, dtype=L, device=dev)
        self.new_verified = torch.zeros(B, dtype=L, device=dev)

    def _build_target(self):
        torch, s = self.torch, self.s
        self.dtype = getattr(torch, self.args.dtype)
        self.W = self._window()
        self.gen = torch.Generator(device=self.dev)
        self.gen.manual_seed(self.args.seed + 7)
        if s.hybrid:
            self.target = zm.HybridLM(zm.HybridConfig(**s.target), self.dev, self.dtype, self.args.seed, self.kimpl)
            self.target.alloc_state(self.B, self.W, self.N, self.gen)
            self.tkv = None
        else:
            self.target = zm.DenseLM(lt.Config(**s.target), self.dev, self.dtype, self.args.seed)
            self.tkv = self.target.kv_cache(self.B, self.W, self.gen)
        self.V = s.target["vocab"]
        # the acceptance mask: does the target agree with the draft at (step, sequence, tree node)?
        cpu = torch.Generator()
        cpu.manual_seed(self.args.seed + 11)
        n = max(self.args.timed_steps, self.args.steps) + self.args.warmup + 8
        self.agree = (torch.rand(n, self.B, self.N, generator=cpu) < s.accept_p).to(self.dev)

    def target_forward(self, tokens, positions, slots, mask, rows=None, verify=False):
        if self.s.hybrid:
            return self.target.forward(tokens, positions, slots, self.W, mask, rows=rows, verify=verify)
        return self.target.forward(tokens, positions, self.tkv, slots, self.W, mask, rows=rows)

    def _graphed(self, fn, pool):
        return lt.graphed(fn, pool=pool) if self.graph else fn

    def _build_plain(self, pool):
        """The plain step's forward: the target decoding one token per sequence, argmax, length + 1."""
        torch, B = self.torch, self.B
        self.P_tok = torch.zeros(B, 1, dtype=torch.long, device=self.dev)
        self.P_len = torch.full((B,), self.s.context, dtype=torch.long, device=self.dev)

        def plain_fwd():
            pos = self.P_len.view(B, 1)
            mask = lt.window_mask(self.P_len, 1, self.W, self.target.group, self.dtype)
            _, logits = self.target_forward(self.P_tok, pos, pos, mask, rows="last")
            self.P_tok.copy_(logits.argmax(dim=-1).view(B, 1))
            self.P_len.add_(1)

        self.p_core = self._graphed(plain_fwd, pool)

    def plain_step(self, i):
        self.p_core()
        self.P_tok.view(-1).tolist()           # the scheduler's host read of the sampled tokens

    def reset_plain(self):
        if hasattr(self, "P_len"):
            self.P_len.fill_(self.s.context)

    def agree_mask(self, i):
        return self.agree[i % self.agree.shape[0]]

    def drain(self):
        pass

    # ---- facts -----------------------------------------------------------------------------------------------
    def target_bytes(self) -> dict:
        return self.target.weight_bytes()

    def draft_bytes_per_step(self) -> int:
        return 0

    def draft_facts(self) -> dict:
        return {"exists": False}

    def contract(self):
        tb = self.target_bytes()["bytes"]
        return {"weight_bytes": tb + self.draft_bytes_per_step(), "tokens_per_step": self.B,
                "draft_tokens": self.s.steps if self.s.topk == 1 else self.N - 1, "dtype": self.args.dtype}

    def facts(self, run):
        s = self.s
        tb = self.target_bytes()
        tgt = dict(s.target)
        model = {"arch": "hybrid (Gated DeltaNet + full attention every 4th layer)" if s.hybrid else
                 "llama (plain torch, fused qkv/gate_up)", **tgt, "weight_bytes": tb["bytes"],
                 "params": tb["params"], "lm_head_bytes": tb["lm_head_bytes"], "prompt_len": s.context,
                 "batch": s.batch}
        if s.hybrid:
            model.update(linear_attention_layers=tb["linear_attention_layers"],
                         full_attention_layers=tb["full_attention_layers"], **self.target.state_bytes())
        phases = run["phases"] or {}
        draft_phase = sum(v for k, v in phases.items() if k in self.MARKERS and "draft" in self.MARKERS[k])
        return {
            "shape": s.name,
            "engine": s.engine,
            "model": model,
            "draft_model": self.draft_facts(),
            "verify_tokens": self.N,
            "topk": s.topk,
            "speculative_num_steps": s.steps,
            "target_bytes_per_step": tb["bytes"],
            "draft_bytes_per_step": self.draft_bytes_per_step(),
            "kv": {"attention_window_tokens": self.W, "context": s.context,
                   "note": "attention reads the whole fixed window (masked to each sequence's length)"},
            "acceptance": {"agree_p": s.accept_p, "how": "the target's prediction at a draft position is replaced "
                           "by the draft's token where a seeded mask (probability agree_p) says so"},
            "unprofiled_draft_phase_ms": round(draft_phase, 6) if phases else None,
            "host_reads_per_step": self.HOST_READS,
            "graphs": self.graph_facts(),
            "kernels": {"impl": self.kimpl, "named": [k for k in zk.KERNELS if k in self.KERNELS_USED
                                                      and (s.hybrid or k not in HYBRID_KERNELS)]},
            "python_frames": {n: f"{FRAMES[n][0]}: {', '.join(FRAMES[n][1])}" for n in self.FRAME_NAMES},
            "cpu": _cpu_name(),
        }

    KERNELS_USED: tuple[str, ...] = ()

    def graph_facts(self):
        return None


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


# ---------------------------------------------------------------------------------------------------------------
# SGLang EAGLE v1: chain, tree, standalone draft, hybrid target
# ---------------------------------------------------------------------------------------------------------------

class SGLangEagle(Engine):
    """``EAGLEWorker.forward_batch_generation`` of a decode batch: ``draft`` (preprocess, the draft graph, the
    tree), ``verify`` (prepare, the target's TARGET_VERIFY forward, ``EagleVerifyInput.verify``),
    ``forward_draft_extend_after_decode``; then the scheduler's ``process_batch_result``."""

    PHASES = ("draft_prep", "draft", "build_verify_inputs", "verify", "accept", "extend_prep", "draft_extend",
              "process_result")
    MARKERS = {"draft": "draft", "verify": "verify", "draft_extend": "draft_extend"}
    # seq_lens.sum().item(), accept_index.tolist(), predict.tolist(), accept_index[mask] (nonzero),
    # out_cache_loc[evict_mask] (nonzero), accept_length.tolist(), the committed tokens' .tolist()
    HOST_READS = 7
    KERNELS_USED = ("build_tree_efficient", "VerifyTreeGreedy", "assign_draft_cache_locs", "assign_req_to_token_pool",
                    "create_extend_after_decode_spec_info", "fused_recurrent_gated_delta_rule_update_fwd_kernel",
                    "_causal_conv1d_update_kernel", "fused_gdn_gating_kernel")
    FRAME_NAMES = ("Scheduler", "EAGLEWorker", "EagleVerifyInput", "ModelRunner")

    def build(self):
        torch, s, B, N, dev = self.torch, self.s, self.B, self.N, self.dev
        self.topk, self.S = s.topk, s.steps
        topk, S = self.topk, self.S
        self._build_target()
        H = s.target["hidden"]
        L = torch.long
        standalone = s.draft == "standalone"
        if standalone:
            self.dmodel = zm.DenseLM(lt.Config(**s.draft_cfg), dev, self.dtype, self.args.seed + 1)
            self.dkv = self.dmodel.kv_cache(B * topk, self.W, self.gen)
        else:
            self.dmodel = zm.DraftHead(self.target, self.args.seed + 1, kind=s.draft)
            self.dkv = self.dmodel.kv_cache(B * topk, self.W, self.gen)
        self.standalone = standalone
        # StandaloneWorker(EAGLEWorker) only overrides __init__: its draft / verify frames are eagle_worker.py's
        self.f = frame("EAGLEWorker", self)
        self.verify_input = frame("EagleVerifyInput", _VerifyInput(self))
        self.runner = frame("ModelRunner", _Runner(self))
        self.draft_runner = frame("ModelRunner", _DraftRunner(self))
        self.scheduler = frame("Scheduler", _Scheduler(self))
        # the batch's state (SGLang ScheduleBatch / EagleDraftInput / EagleVerifyInput fields)
        self.seq_lens = torch.zeros(B, dtype=L, device=dev)
        self.verified_id = torch.zeros(B, dtype=L, device=dev)
        self.topk_p = torch.zeros(B, topk, dtype=torch.float32, device=dev)
        self.topk_index = torch.zeros(B, topk, dtype=L, device=dev)
        Hd = s.draft_cfg["hidden"] if standalone else H       # the draft's own hidden states (unused standalone)
        self.dhid = torch.zeros(B, Hd, dtype=self.dtype, device=dev)
        self.req_pool_indices = torch.arange(B, dtype=L, device=dev)
        self.req_to_token = torch.zeros(B, self.W, dtype=L, device=dev)
        self.draft_loc = torch.arange(B * topk * S, dtype=L, device=dev).view(B, topk * S)
        self.verify_loc = torch.arange(B * N, dtype=L, device=dev)
        self.parent_list = torch.zeros(B, topk + 1 + (S - 2) * topk if S > 1 else 0, dtype=L, device=dev)
        self.top_scores_index = torch.zeros(B, N - 1, dtype=L, device=dev)
        self.draft_tokens = torch.zeros(B, N - 1, dtype=L, device=dev)
        self._verify_buffers(S, H)
        self.committed = None
        self.graphs = {}
        pool = torch.cuda.graph_pool_handle() if self.graph else None
        self.reset()
        # the draft CUDA graph (EAGLEDraftCudaGraphRunner replays draft_forward); standalone: eager
        self.draft_graphed = self.graph and s.draft_mode == "graph"
        self.d_core = self._graphed(self._draft_forward_body, pool) if self.draft_graphed else self._draft_forward_body
        self._tree_and_prepare()
        self.v_core = self._graphed(self._verify_body, pool)
        self._accept_fill()
        self.e_core = self._graphed(self._extend_body, pool) if self.draft_graphed else self._extend_body
        self._build_plain(pool)
        self.reset()
        self.graphs = {"draft": int(self.draft_graphed), "verify": int(self.graph),
                       "draft_extend": int(self.draft_graphed), "plain": int(self.graph)}

    def reset(self):
        torch, s, B = self.torch, self.s, self.B
        self.seq_lens.fill_(s.context)
        g = torch.Generator()
        g.manual_seed(self.args.seed + 3)
        self.verified_id.copy_(torch.randint(3, self.V, (B,), generator=g))
        self.topk_index.copy_(torch.randint(3, self.V, (B, self.topk), generator=g))
        self.topk_p.copy_(torch.rand(B, self.topk, generator=g).sort(dim=-1, descending=True).values)
        self.dhid.normal_(0.0, 1.0, generator=self.gen)
        self.reset_plain()

    # ---- the draft (EAGLEWorker.draft_forward, one CUDA graph) ---------------------------------------------
    def _draft_one(self, input_ids, hidden, positions):
        """One draft forward over B*topk rows of one token; (logits, hidden)."""
        R = input_ids.shape[0]
        pos = positions.view(R, 1)
        mask = lt.window_mask(positions, 1, self.W, self.dmodel.group, self.dtype)
        if self.standalone:
            x, logits = self.dmodel.forward(input_ids.view(R, 1), pos, self.dkv, pos, self.W, mask, rows="last")
        else:
            x, logits = self.dmodel.forward(input_ids.view(R, 1), hidden.view(R, 1, -1), pos, self.dkv.k[0],
                                           self.dkv.v[0], pos, self.W, mask, rows="last")
        return logits, x.view(R, -1)

    def _draft_fwd(self, input_ids, hidden, positions):
        if self.draft_graphed:
            return self._draft_one(input_ids, hidden, positions)
        with self.h.span("draft_forward"):   # draft_model_runner.forward: a ModelRunner.forward (DECODE mode)
            return self.draft_runner.forward(input_ids, hidden, positions)

    def _draft_forward_body(self):
        torch, topk, S, B = self.torch, self.topk, self.S, self.B
        positions = self.seq_lens.view(-1, 1).expand(-1, topk).reshape(-1)        # repeat_interleave(topk)
        topk_p, topk_index, hidden, scores = self.topk_p, self.topk_index, self.dhid, None
        if not self.s.extend_sample:
            # the draft-extend sampled nothing: a first draft forward from the verified token (over the B*topk
            # rows the draft graph keeps; row 0 of each sequence's topk is the one read)
            ids0 = self.verified_id.view(-1, 1).expand(-1, topk).reshape(-1)
            hid0 = self.dhid.unsqueeze(1).expand(-1, topk, -1).reshape(B * topk, -1)
            logits, h0 = self._draft_fwd(ids0, hid0, positions)
            probs = torch.softmax(logits.float(), dim=-1).view(B, topk, -1)[:, 0]
            topk_p, topk_index = fast_topk(torch, probs, topk)
            hidden = h0.view(B, topk, -1)[:, 0]
        score_list, token_list, parents_list = [], [], []
        for i in range(S):
            input_ids, hidden, scores, info = select_top_k_tokens(torch, i, topk_p, topk_index, hidden, scores, topk)
            score_list.append(info[0])
            token_list.append(info[1])
            parents_list.append(info[2])
            if i == S - 1:
                break
            positions = positions + 1
            logits, hidden = self._draft_fwd(input_ids, hidden, positions)
            probs = torch.softmax(logits.float(), dim=-1)
            topk_p, topk_index = fast_topk(torch, probs, topk)
        parent_list, top, tokens = organize_draft_results(torch, score_list, token_list, parents_list, self.N)
        self.parent_list.copy_(parent_list)
        self.top_scores_index.copy_(top)
        self.draft_tokens.copy_(tokens)

    def draft(self, i):
        # _draft_preprocess_decode: the draft's KV slots into the request table, the batch's seq_lens_sum
        with self.h.phase("draft_prep"):
            zk.draft_cache_locs(self.req_pool_indices, self.req_to_token, self.seq_lens, self.draft_loc, self.kimpl)
            self.seq_lens_sum = int(self.seq_lens.sum().item())
        with self.h.phase("draft"):
            if self.draft_graphed:
                with self.h.span("draft_graph"):
                    self.d_core()
            else:
                self.f.draft_forward()
        with self.h.phase("build_verify_inputs"):
            self._tree_and_prepare()

    def draft_forward(self):
        self.d_core()

    def _tree_and_prepare(self):
        # build_tree_kernel_efficient: the bonus token first, the tree; then prepare_for_verify's KV slots
        self.vids[:, :1].copy_(self.verified_id.view(self.B, 1))
        self.vids[:, 1:].copy_(self.draft_tokens)
        zk.build_tree(self.parent_list, self.top_scores_index, self.seq_lens, self.tree, self.vpos,
                      self.retrive_index, self.retrive_next_token, self.retrive_next_sibling, self.topk, self.S,
                      self.kimpl)
        self.verify_input.prepare_for_verify()

    def prepare_for_verify(self):
        zk.req_to_token_pool(self.req_pool_indices, self.req_to_token, self.seq_lens, self.seq_lens + self.N,
                             self.verify_loc, self.N, self.kimpl)

    # ---- the verify (the target's TARGET_VERIFY forward, then EagleVerifyInput.verify) -------------------------
    def _verify_body(self):
        B, N = self.B, self.N
        slots = self.seq_lens.view(B, 1) + self.torch.arange(N, device=self.dev).view(1, N)
        mask = zm.tree_mask(self.seq_lens, self.tree, self.W, self.target.group, self.dtype)
        x, logits = self.target_forward(self.vids, self.vpos, slots, mask, rows=None, verify=True)
        return x, logits

    def verify(self, i):
        with self.h.phase("verify"), self.h.span("verify"):
            self.x, self.logits = self.runner.forward()
        with self.h.phase("accept"):
            self.verify_input.verify(i)

    def run_target_verify(self):
        return self.v_core()

    def accept(self, i):
        torch, B, N, S = self.torch, self.B, self.N, self.S
        tp = self.logits.argmax(dim=-1).view(B, N)
        child = self.vids.gather(1, self.retrive_next_token.clamp(min=0))
        tp = torch.where(self.agree_mask(i) & (self.retrive_next_token >= 0), child, tp)
        zk.verify_tree_greedy(self.predict, self.accept_index, self.accept_length, self.vids, self.retrive_index,
                              self.retrive_next_token, self.retrive_next_sibling, tp, self.kimpl)
        self.accept_index.tolist()                      # the host walks the accepted tokens (req.output_ids)
        self.predict.tolist()
        flat = self.accept_index[self.accept_index != -1].long()
        self.committed = self.predict[flat]
        evict = torch.ones(B * N, dtype=torch.bool, device=self.dev)
        evict[flat] = False
        self.verify_loc[evict]                          # token_to_kv_pool_allocator.free(out_cache_loc[evict])
        zk.req_to_token_pool(self.req_pool_indices, self.req_to_token, self.seq_lens,
                             self.seq_lens + self.accept_length + 1, self.verify_loc[flat], S + 1, self.kimpl)
        self.seq_lens.add_(self.accept_length + 1)
        if self.s.hybrid:
            self.target.rollback(self.accept_length.long())     # _mamba_verify_update
        idx = self.accept_index.clamp(min=0).long()
        self.ext_hid.copy_(self.x.reshape(B * N, -1)[idx])
        self.ext_ids.copy_(self.predict[idx])
        acc = self.accept_length.tolist()
        self.h.record_accept(acc)

    def _accept_fill(self):
        """Before the draft-extend graph is captured: plausible extend inputs."""
        self.accept_length.zero_()
        self.ext_acc.zero_()
        self.ext_start.copy_(self.seq_lens)
        self.ext_pos.copy_(self.seq_lens.view(-1, 1) + self.torch.arange(self.S + 1, device=self.dev))

    # ---- the draft extend (forward_draft_extend_after_decode; EAGLEDraftExtendCudaGraphRunner) -----------------
    def _extend_body(self):
        torch, B, S1 = self.torch, self.B, self.S + 1
        mask = lt.window_mask(self.ext_start, S1, self.W, self.dmodel.group, self.dtype)
        rows = self.ext_acc
        sample = self.s.extend_sample
        if self.standalone:
            x, logits = self.dmodel.forward(self.ext_ids, self.ext_pos, self.dkv, self.ext_pos, self.W, mask,
                                           rows=rows, logits=sample)
        else:
            k, v = self.dkv.k[0][:B], self.dkv.v[0][:B]
            x, logits = self.dmodel.forward(self.ext_ids, self.ext_hid, self.ext_pos, k, v, self.ext_pos, self.W,
                                           mask, rows=rows, logits=sample)
        if not sample:      # the KV cache filled and the hidden state kept; the next draft samples
            self.dhid.copy_(zm.select_rows(x, rows))
            return
        probs = torch.softmax(logits.float(), dim=-1)                     # capture_for_decode
        p, idx = fast_topk(torch, probs, self.topk)
        self.topk_p.copy_(p)
        self.topk_index.copy_(idx)
        self.dhid.copy_(zm.select_rows(x, rows))

    def forward_draft_extend_after_decode(self, i):
        with self.h.phase("extend_prep"):               # prepare_extend_after_decode
            zk.extend_after_decode_info(self.ext_ids, self.seq_lens, self.accept_length, self.ext_pos,
                                        self.new_verified, self.kimpl)
            self.ext_acc.copy_(self.accept_length)
            self.ext_start.copy_(self.ext_pos[:, 0])
            self.verified_id.copy_(self.new_verified)
        with self.h.phase("draft_extend"):
            if self.draft_graphed:
                with self.h.span("draft_extend_graph"):
                    self.e_core()
            else:
                with self.h.span("draft_extend_eager"):
                    self.draft_runner.forward()

    # ---- the step ------------------------------------------------------------------------------------------------
    def forward_batch_generation(self, i):
        self.f.draft(i)
        self.f.verify(i)
        self.f.forward_draft_extend_after_decode(i)

    def process_batch_result(self, i):
        with self.h.phase("process_result"):
            self.committed.tolist()

    def step(self, i):
        self.scheduler.run_batch(i)
        self.scheduler.process_batch_result(i)

    # ---- facts ---------------------------------------------------------------------------------------------------
    def draft_bytes_per_step(self):
        wb = self.dmodel.weight_bytes()
        b = wb["bytes"]
        if self.s.extend_sample:
            return int(b * self.S)      # S-1 draft forwards + 1 draft-extend
        head = wb.get("shared_lm_head_bytes", wb.get("lm_head_bytes", 0))
        return int(b * self.S + b - head)   # S draft forwards + 1 draft-extend without its lm_head

    def draft_facts(self):
        s = self.s
        wb = self.dmodel.weight_bytes()
        kind = {"nextn": "mtp-nextn (1 decoder layer + eh_proj, the target's embedding and lm_head shared)",
                "eagle": "eagle head (fc + 1 decoder layer, the target's embedding and lm_head shared)",
                "standalone": "standalone draft model (own embedding and lm_head)"}[s.draft]
        extra = 0 if s.extend_sample else 1
        f = {"exists": True, "kind": kind, "weight_bytes": wb["bytes"], "forwards_per_step": self.S + extra,
             "forwards": {"draft": self.S - 1 + extra, "draft_extend": 1}, "draft_rows_per_sequence": self.topk,
             "extend_tokens_per_sequence": self.S + 1, "extend_samples": s.extend_sample,
             "mode": "graph" if self.draft_graphed else "eager"}
        if s.draft == "standalone":
            f.update(config=dict(s.draft_cfg), own_embedding=True, params=wb["params"])
        else:
            f.update(own_weight_bytes=wb["own_bytes"], shared_lm_head_bytes=wb["shared_lm_head_bytes"],
                     params=wb["own_params"])
        return f

    def graph_facts(self):
        return self.graphs


class _VerifyInput:
    """EagleVerifyInput's methods, on the engine."""

    def __init__(self, e):
        self.e = e

    def prepare_for_verify(self):
        self.e.prepare_for_verify()

    def verify(self, i):
        self.e.accept(i)


class _Runner:
    """ModelRunner.forward: the target's forward (its CUDA graph in graph mode)."""

    def __init__(self, e):
        self.e = e

    def forward(self):
        return self.e.run_target_verify()


class _DraftRunner:
    """The draft model's ModelRunner.forward (eager): a draft forward, or (no arguments) the draft-extend."""

    def __init__(self, e):
        self.e = e

    def forward(self, *args):
        return self.e._draft_one(*args) if args else self.e._extend_body()


class _Scheduler:
    def __init__(self, e):
        self.e = e

    def run_batch(self, i):
        return self.e.f.forward_batch_generation(i)

    def process_batch_result(self, i):
        return self.e.process_batch_result(i)


def _null():
    import contextlib

    return contextlib.nullcontext()


# ---------------------------------------------------------------------------------------------------------------
# SGLang NGRAM
# ---------------------------------------------------------------------------------------------------------------

class SGLangNgram(SGLangEagle):
    """``NGRAMWorker.forward_batch_generation``: the proposals from the host's n-gram match (H2D), the target's
    TARGET_VERIFY forward over K+1, ``verify`` (greedy), the n-gram cache update on the host."""

    PHASES = ("draft", "verify", "accept", "process_result")
    MARKERS = {"draft": "draft", "verify": "verify"}
    HOST_READS = 5      # accept_index, predict, nonzero of the accepted indices, accept_length, committed tokens
    KERNELS_USED = ("VerifyTreeGreedy",)
    FRAME_NAMES = ("Scheduler", "NGRAMWorker", "EagleVerifyInput", "ModelRunner")

    def build(self):
        import numpy as np

        torch, s, B, N, dev = self.torch, self.s, self.B, self.N, self.dev
        self.topk, self.S = 1, s.steps
        S = self.S
        self._build_target()
        L = torch.long
        self.seq_lens = torch.zeros(B, dtype=L, device=dev)
        self.vids = torch.zeros(B, N, dtype=L, device=dev)
        self.vpos = torch.zeros(B, N, dtype=L, device=dev)
        self.tree = torch.tril(torch.ones(N, N, dtype=torch.uint8, device=dev)).expand(B, N, N).contiguous()
        ar = torch.arange(N, dtype=L, device=dev)
        self.ar = ar
        self.retrive_index = (torch.arange(B, device=dev).view(B, 1) * N + ar).contiguous()
        self.retrive_next_token = torch.where(ar < N - 1, ar + 1, -1).expand(B, N).contiguous()
        self.retrive_next_sibling = torch.full((B, N), -1, dtype=L, device=dev)
        self.predict = torch.zeros(B * N, dtype=L, device=dev)
        self.accept_index = torch.zeros(B, S + 1, dtype=torch.int32, device=dev)
        self.accept_length = torch.zeros(B, dtype=torch.int32, device=dev)
        self.np = np
        self.host_draft = np.zeros((B, N), dtype=np.int64)
        self.host_mask = np.tril(np.ones((N, N), dtype=np.uint8))[None].repeat(B, 0)
        self.committed = None
        pool = torch.cuda.graph_pool_handle() if self.graph else None
        self.reset()
        self.v_core = self._graphed(self._verify_body, pool)
        self._build_plain(pool)
        self.reset()
        self.graphs = {"verify": int(self.graph), "plain": int(self.graph)}
        self.f = frame("NGRAMWorker", self)
        self.verify_input = frame("EagleVerifyInput", _VerifyInput(self))
        self.runner = frame("ModelRunner", _Runner(self))
        self.scheduler = frame("Scheduler", _Scheduler(self))

    def reset(self):
        import numpy as np

        s, B = self.s, self.B
        self.seq_lens.fill_(s.context)
        rng = np.random.default_rng(self.args.seed + 5)
        # prompts that repeat themselves (code, documents quoting themselves): the n-gram match finds continuations
        motif = rng.integers(3, self.V, size=(B, 48))
        reps = math.ceil(s.context / 48) + 1
        hist = np.concatenate([motif] * reps, axis=1)[:, :s.context]
        noise = rng.random(hist.shape) < 0.1
        hist = np.where(noise, rng.integers(3, self.V, size=hist.shape), hist)
        cap = s.context + (max(self.args.timed_steps, self.args.steps) + self.args.warmup + 4) * self.N
        self.history = np.zeros((B, cap), dtype=np.int64)
        self.history[:, :s.context] = hist
        self.hist_len = [s.context] * B
        self.reset_plain()

    def _propose(self):
        """The n-gram match on the host (SGLang's NgramCache.batch_get, vLLM's NgramProposer): the most recent
        earlier occurrence, in the last 512 tokens, of the longest suffix (3..1 tokens) and the K tokens after it;
        the bonus token first."""
        np, K = self.np, self.S
        for b in range(self.B):
            n_hist = self.hist_len[b]
            hist = self.history[b, max(0, n_hist - 512):n_hist]
            prop = np.full(K, hist[-1])
            for n in (3, 2, 1):
                win = np.lib.stride_tricks.sliding_window_view(hist[:-1], n)
                hits = np.flatnonzero((win == hist[-n:]).all(axis=1))
                if hits.size:
                    start = int(hits[-1]) + n
                    cont = hist[start:start + K]
                    prop[:cont.size] = cont
                    break
            self.host_draft[b, 0] = hist[-1]
            self.host_draft[b, 1:] = prop

    def _prepare_for_speculative_decoding(self):
        torch = self.torch
        with self.h.phase("draft"):
            self._propose()
            self.tree.copy_(torch.from_numpy(self.host_mask), non_blocking=True)
            self.vids.copy_(torch.from_numpy(self.host_draft), non_blocking=True)
            self.vpos.copy_(self.seq_lens.view(-1, 1) + self.ar)

    def forward_batch_generation(self, i):
        self.f._prepare_for_speculative_decoding()
        with self.h.phase("verify"), self.h.span("verify"):
            self.x, self.logits = self.runner.forward()
        with self.h.phase("accept"):
            self.verify_input.verify(i)

    def accept(self, i):
        torch, B, N = self.torch, self.B, self.N
        tp = self.logits.argmax(dim=-1).view(B, N)
        child = self.vids.gather(1, self.retrive_next_token.clamp(min=0))
        tp = torch.where(self.agree_mask(i) & (self.retrive_next_token >= 0), child, tp)
        zk.verify_tree_greedy(self.predict, self.accept_index, self.accept_length, self.vids, self.retrive_index,
                              self.retrive_next_token, self.retrive_next_sibling, tp, self.kimpl)
        self.accept_index.tolist()
        self.predict.tolist()
        flat = self.accept_index[self.accept_index != -1].long()
        self.committed = self.predict[flat]
        self.seq_lens.add_(self.accept_length + 1)
        self.acc = self.accept_length.tolist()
        self.h.record_accept(self.acc)

    def _update_ngram_cache(self, tokens):
        off = 0
        for b, a in enumerate(self.acc):
            n = self.hist_len[b]
            new = tokens[off:off + a + 1][:self.history.shape[1] - n]
            self.history[b, n:n + len(new)] = new
            self.hist_len[b] = n + len(new)
            off += a + 1

    def process_batch_result(self, i):
        with self.h.phase("process_result"):
            toks = self.committed.tolist()
            self.f._update_ngram_cache(toks)

    def draft_bytes_per_step(self):
        return 0

    def draft_facts(self):
        return {"exists": False, "kind": "n-gram match over each sequence's token history on the host (no model)",
                "proposal": "host numpy match of the last 3..1 tokens; H2D copies of the tokens and the mask",
                "forwards_per_step": 0}

    def contract(self):
        c = super().contract()
        c["draft_tokens"] = self.S
        return c


# ---------------------------------------------------------------------------------------------------------------
# vLLM: GPUModelRunner with EAGLE
# ---------------------------------------------------------------------------------------------------------------

class VLLMEagle(Engine):
    """vLLM V1's step with EAGLE (``Worker.execute_model`` -> ``GPUModelRunner``): inputs to the GPU, the
    target's forward over K+1 tokens per request, ``RejectionSampler`` (greedy), ``_bookkeeping_sync`` (the
    output tokens to the host), ``propose_draft_token_ids`` -> ``EagleProposer.propose`` (a first draft forward
    over the K+1 positions, K-1 one-token forwards), the draft tokens to the host for the next step's inputs."""

    PHASES = ("prepare_inputs", "verify", "sample", "bookkeeping", "draft", "process_result")
    MARKERS = {"verify": "verify", "draft": "draft"}
    HOST_READS = 2      # output_token_ids.cpu(), draft_token_ids.tolist()
    KERNELS_USED = ("rejection_greedy_sample_kernel",)
    FRAME_NAMES = ("Worker", "GPUModelRunner", "RejectionSampler", "EagleProposer")

    def build(self):
        import numpy as np

        torch, s, B, dev = self.torch, self.s, self.B, self.dev
        K = self.K = s.steps
        N = self.N
        self._build_target()
        H = s.target["hidden"]
        L = torch.long
        self.standalone = s.draft == "standalone"
        if self.standalone:       # vLLM's draft_model method: a small LM of its own (the proposer's forwards)
            self.dmodel = zm.DenseLM(lt.Config(**s.draft_cfg), dev, self.dtype, self.args.seed + 1)
            Hd = s.draft_cfg["hidden"]
        else:
            self.dmodel = zm.DraftHead(self.target, self.args.seed + 1, kind="eagle")
            Hd = H
        self.dkv = self.dmodel.kv_cache(B, self.W, self.gen)
        pin = self.cuda
        self.cpu_ids = torch.zeros(B, N, dtype=L, pin_memory=pin)
        self.cpu_pos = torch.zeros(B, N, dtype=L, pin_memory=pin)
        self.input_ids = torch.zeros(B, N, dtype=L, device=dev)
        self.positions = torch.zeros(B, N, dtype=L, device=dev)
        self.seq_start = torch.zeros(B, dtype=L, device=dev)
        self.cu_num_draft = (torch.arange(1, B + 1, device=dev) * K).to(L)
        self.out_tokens = torch.zeros(B, K + 1, dtype=L, device=dev)
        # the proposer's buffers
        self.d_ids = torch.zeros(B, N, dtype=L, device=dev)
        self.d_pos = torch.zeros(B, N, dtype=L, device=dev)
        self.d_hid = torch.zeros(B, N, H, dtype=self.dtype, device=dev)
        self.d_last = torch.zeros(B, dtype=L, device=dev)
        self.d1_ids = torch.zeros(B, 1, dtype=L, device=dev)
        self.d1_pos = torch.zeros(B, 1, dtype=L, device=dev)
        self.d1_hid = torch.zeros(B, 1, Hd, dtype=self.dtype, device=dev)
        self.np = np
        pool = torch.cuda.graph_pool_handle() if self.graph else None
        self.reset()
        self._h2d()
        self.v_core = self._graphed(self._verify_body, pool)
        self.d_first = self._graphed(self._draft_first_body, pool)
        self.d_next = self._graphed(self._draft_next_body, pool)
        self._build_plain(pool)
        self.reset()
        self.graphs = {"verify": int(self.graph), "draft_first": int(self.graph), "draft_one_token": int(self.graph),
                       "plain": int(self.graph), "note": "vLLM captures the drafter in piecewise graphs "
                       "(attention outside); here each draft forward is one graph"}
        self.runner = frame("GPUModelRunner", self)
        self.worker = frame("Worker", _VWorker(self))
        self.sampler = frame("RejectionSampler", _VSampler(self))
        self.proposer = frame("EagleProposer", _VProposer(self))

    def reset(self):
        np, s, B, K = self.np, self.s, self.B, self.K
        rng = np.random.default_rng(self.args.seed + 5)
        self.host_len = [s.context] * B                       # tokens cached per request
        self.host_next = [int(t) for t in rng.integers(3, self.V, B)]
        self.host_drafts = [[int(t) for t in rng.integers(3, self.V, K)] for _ in range(B)]
        self.reset_plain()

    def _h2d(self):
        """_prepare_inputs: the scheduled tokens (last sampled + the K drafts) and positions, from the host."""
        ids = self.np.array([[self.host_next[b], *self.host_drafts[b]] for b in range(self.B)], dtype=self.np.int64)
        pos = self.np.array(self.host_len, dtype=self.np.int64)[:, None] + self.np.arange(self.N)
        self.cpu_ids.numpy()[:] = ids
        self.cpu_pos.numpy()[:] = pos
        self.input_ids.copy_(self.cpu_ids, non_blocking=True)
        self.positions.copy_(self.cpu_pos, non_blocking=True)
        self.seq_start.copy_(self.positions[:, 0])

    def _verify_body(self):
        mask = lt.window_mask(self.seq_start, self.N, self.W, self.target.group, self.dtype)
        return self.target_forward(self.input_ids, self.positions, self.positions, mask, rows=None)

    def _dfwd(self, ids, hid, pos, mask, rows):
        if self.standalone:
            return self.dmodel.forward(ids, pos, self.dkv, pos, self.W, mask, rows=rows)
        return self.dmodel.forward(ids, hid, pos, self.dkv.k[0], self.dkv.v[0], pos, self.W, mask, rows=rows)

    # first draft forward over the K+1 positions (last valid row sampled), then one-token forwards
    def _draft_first_body(self):
        B = self.B
        mask = lt.window_mask(self.d_pos[:, 0].contiguous(), self.N, self.W, self.dmodel.group, self.dtype)
        x, logits = self._dfwd(self.d_ids, self.d_hid, self.d_pos, mask, self.d_last)
        tok = logits.argmax(dim=-1)
        self.d1_ids.copy_(tok.view(B, 1))
        self.d1_pos.copy_(self.d_pos.gather(1, self.d_last.view(B, 1)) + 1)
        self.d1_hid.copy_(zm.select_rows(x, self.d_last).view(B, 1, -1))
        return tok

    def _draft_next_body(self):
        B = self.B
        mask = lt.window_mask(self.d1_pos.view(B), 1, self.W, self.dmodel.group, self.dtype)
        x, logits = self._dfwd(self.d1_ids, self.d1_hid, self.d1_pos, mask, "last")
        tok = logits.argmax(dim=-1)
        self.d1_ids.copy_(tok.view(B, 1))
        self.d1_pos.add_(1)
        self.d1_hid.copy_(x)
        return tok

    # ---- the step (Worker.execute_model) ---------------------------------------------------------------------
    def step(self, i):
        # vLLM V1's Worker: execute_model (inputs, the target's forward), then sample_tokens (sampling, rejection,
        # the host read, the drafter); the ``vllm`` dialect's span covers both, ``vllm-v1``'s the first alone
        with self.h.span("step"):
            self.worker.execute_model(i)
            self.worker.sample_tokens(i)

    def execute_model(self, i):
        with self.h.span("execute"):
            with self.h.phase("prepare_inputs"):
                self._h2d()
            with self.h.phase("verify"):
                self.hidden, self.logits = self.v_core()

    def sample_tokens(self, i):
        with self.h.phase("sample"):
            self.sampler.forward(i)
        with self.h.phase("bookkeeping"):
            valid = self.runner._bookkeeping_sync()
        with self.h.phase("draft"):
            self.runner.propose_draft_token_ids(valid)
        with self.h.phase("process_result"):
            self.runner.take_draft_token_ids()

    def rejection_sample(self, i):
        torch, B, K, N = self.torch, self.B, self.K, self.N
        logits = self.logits.view(B, N, -1)
        bonus = logits[:, K].argmax(dim=-1)                   # the sampler on the bonus positions (greedy)
        target_argmax = logits[:, :K].argmax(dim=-1)          # compute_probs (greedy: the logits) -> argmax
        draft = self.input_ids[:, 1:]
        target_argmax = torch.where(self.agree_mask(i)[:, :K], draft, target_argmax).contiguous()
        zk.rejection_greedy_sample(self.out_tokens, self.cu_num_draft, draft.contiguous().view(-1),
                                   target_argmax.view(-1), bonus.contiguous(), K, self.kimpl)

    def _bookkeeping_sync(self):
        rows = self.out_tokens.cpu().tolist()                 # RejectionSampler.parse_output
        valid = [[t for t in r if t != -1] for r in rows]
        self.h.record_accept([len(v) - 1 for v in valid])
        return valid

    def propose_draft_token_ids(self, valid):
        torch, B, N = self.torch, self.B, self.N
        nxt = [v[-1] for v in valid]
        for b, v in enumerate(valid):                         # the cached tokens: the scheduled ones accepted
            self.host_len[b] += len(v)
            self.host_next[b] = nxt[b]
        next_ids = torch.tensor(nxt, dtype=torch.long, device=self.dev)           # prepare_next_token_ids_cpu
        last = torch.tensor([len(v) - 1 for v in valid], dtype=torch.long, device=self.dev)   # prepare_inputs
        # the drafter's inputs: the target's tokens shifted by one, the next token at each request's last row
        self.d_ids[:, :N - 1].copy_(self.input_ids[:, 1:])
        self.d_ids.scatter_(1, last.view(B, 1), next_ids.view(B, 1))
        self.d_pos.copy_(self.positions)
        if not self.standalone:
            self.d_hid.copy_(self.hidden)
        self.d_last.copy_(last)
        self.draft_token_ids = self.proposer.propose()

    def propose(self):
        torch = self.torch
        toks = [self.d_first().clone()]
        for _ in range(self.K - 1):
            toks.append(self.d_next().clone())
        return torch.stack(toks, dim=1)

    def take_draft_token_ids(self):
        self.host_drafts = self.draft_token_ids.tolist()

    # ---- facts ---------------------------------------------------------------------------------------------------
    def contract(self):
        c = super().contract()
        c["draft_tokens"] = self.K
        return c

    def draft_bytes_per_step(self):
        return int(self.dmodel.weight_bytes()["bytes"] * self.K)

    def draft_facts(self):
        wb = self.dmodel.weight_bytes()
        if self.standalone:
            own = {"kind": "standalone draft model (own embedding and lm_head; vLLM's draft_model method)",
                   "weight_bytes": wb["bytes"], "config": dict(self.s.draft_cfg), "own_embedding": True,
                   "params": wb["params"]}
        else:
            own = {"kind": "eagle head (fc + 1 decoder layer, the target's embedding and lm_head shared)",
                   "weight_bytes": wb["bytes"], "own_weight_bytes": wb["own_bytes"],
                   "shared_lm_head_bytes": wb["shared_lm_head_bytes"], "params": wb["own_params"]}
        return {"exists": True, **own,
                "forwards_per_step": self.K, "forwards": {"first": 1, "one_token": self.K - 1},
                "first_forward_tokens_per_sequence": self.N, "order": "after the host read (non-padded drafter batch)",
                "mode": "graph" if self.graph else "eager"}

    def graph_facts(self):
        return self.graphs


class _VWorker:
    def __init__(self, e):
        self.e = e

    def execute_model(self, i):
        return self.e.runner.execute_model(i)

    def sample_tokens(self, i):
        return self.e.runner.sample_tokens(i)


class _VSampler:
    def __init__(self, e):
        self.e = e

    def forward(self, i):
        return self.e.rejection_sample(i)


class _VProposer:
    def __init__(self, e):
        self.e = e

    def propose(self):
        return self.e.propose()


# ---------------------------------------------------------------------------------------------------------------
# SGLang multi-layer MTP (spec v2, overlap scheduler)
# ---------------------------------------------------------------------------------------------------------------

class SGLangMultiLayer(Engine):
    """``MultiLayerEagleWorkerV2.forward_batch_generation``: ``draft`` (the tree of the tokens the previous
    step's MTP modules proposed: no draft forward), ``verify`` (the target's forward; sampling on the GPU, the
    results copied to the host without waiting), ``_draft_extend_for_decode`` (MTP module j over the K+1 tokens,
    j = 0..K-1, each its own CUDA graph, the input ids rotated by the previous module's token); the overlap
    scheduler reads the previous step's result while this step runs."""

    # no draft forward before the verify: its draft phase only builds the tree (no `draft` range; the K module
    # forwards are the `draft_extend` range)
    PHASES = ("build_verify_inputs", "verify", "sample", "draft_extend", "process_result")
    MARKERS = {"verify": "verify", "draft_extend": "draft_extend"}
    HOST_READS = 1      # the previous step's tokens (copy_done event, then .tolist() of pinned memory)
    KERNELS_USED = ("build_tree_efficient", "VerifyTreeGreedy", "fill_new_verified_id", "rotate_input_ids_kernel",
                    "create_extend_after_decode_spec_info")
    FRAME_NAMES = ("Scheduler", "MultiLayerEagleWorkerV2", "MultiLayerEagleDraftWorker", "ModelRunner")

    def build(self):
        torch, s, B, N, dev = self.torch, self.s, self.B, self.N, self.dev
        S = self.S = s.steps
        self.topk = 1
        self._build_target()
        H = s.target["hidden"]
        L = torch.long
        self.heads = [zm.DraftHead(self.target, self.args.seed + 1 + j, kind="nextn") for j in range(S)]
        self.dkvs = [h.kv_cache(B, self.W, self.gen) for h in self.heads]
        self.seq_lens = torch.zeros(B, dtype=L, device=dev)
        self.verified_id = torch.zeros(B, dtype=L, device=dev)
        self.next_tokens = torch.zeros(B, S, dtype=L, device=dev)        # the K MTP modules' tokens
        self.parent_list = torch.arange(-1, S - 1, dtype=L, device=dev).expand(B, S).contiguous()
        self.top_scores_index = torch.arange(S, dtype=L, device=dev).expand(B, S).contiguous()
        self._verify_buffers(S, H)
        pin = self.cuda     # two sets: step i's copy may land while step i-1's is read (SGLang: new tensors each step)
        self.host_pred = [torch.zeros(B * N, dtype=L, pin_memory=pin) for _ in range(2)]
        self.host_acc = [torch.zeros(B, dtype=torch.int32, pin_memory=pin) for _ in range(2)]
        pool = torch.cuda.graph_pool_handle() if self.graph else None
        self.reset()
        self._draft_body()
        self.v_core = self._graphed(self._verify_body, pool)
        self.ext_pos.copy_(self.seq_lens.view(-1, 1) + torch.arange(S + 1, device=dev))
        self.ext_start.copy_(self.seq_lens)
        self.e_cores = [self._graphed(lambda j=j: self._extend_layer(j), pool) for j in range(S)]
        self._build_plain(pool)
        self.reset()
        self.graphs = {"verify": int(self.graph), "draft_extend_per_module": int(self.graph), "modules": S,
                       "plain": int(self.graph)}
        self.f = frame("MultiLayerEagleWorkerV2", self)
        self.dw = frame("MultiLayerEagleDraftWorker", _MLDraft(self))
        self.runner = frame("ModelRunner", _Runner(self))
        self.scheduler = frame("Scheduler", _Scheduler(self))

    def reset(self):
        torch, s, B = self.torch, self.s, self.B
        self.drain()
        self.seq_lens.fill_(s.context)
        g = torch.Generator()
        g.manual_seed(self.args.seed + 3)
        self.verified_id.copy_(torch.randint(3, self.V, (B,), generator=g))
        self.next_tokens.copy_(torch.randint(3, self.V, (B, self.S), generator=g))
        self.reset_plain()

    # ---- draft: no forward, the tree of the previous step's tokens --------------------------------------------
    def _draft_body(self):
        self.vids[:, :1].copy_(self.verified_id.view(self.B, 1))
        self.vids[:, 1:].copy_(self.next_tokens)
        zk.build_tree(self.parent_list, self.top_scores_index, self.seq_lens, self.tree, self.vpos,
                      self.retrive_index, self.retrive_next_token, self.retrive_next_sibling, 1, self.S, self.kimpl)

    def draft(self):
        with self.h.phase("build_verify_inputs"):
            self._draft_body()

    def _verify_body(self):
        B, N = self.B, self.N
        slots = self.seq_lens.view(B, 1) + self.torch.arange(N, device=self.dev).view(1, N)
        mask = zm.tree_mask(self.seq_lens, self.tree, self.W, self.target.group, self.dtype)
        return self.target_forward(self.vids, self.vpos, slots, mask, rows=None)

    def run_target_verify(self):
        return self.v_core()

    def verify(self, i):
        torch, B, N = self.torch, self.B, self.N
        with self.h.phase("verify"), self.h.span("verify"):
            self.x, self.logits = self.runner.forward()
        with self.h.phase("sample"):                     # EagleVerifyInput.sample: no host read in v2
            tp = self.logits.argmax(dim=-1).view(B, N)
            child = self.vids.gather(1, self.retrive_next_token.clamp(min=0))
            tp = torch.where(self.agree_mask(i) & (self.retrive_next_token >= 0), child, tp)
            zk.verify_tree_greedy(self.predict, self.accept_index, self.accept_length, self.vids, self.retrive_index,
                                  self.retrive_next_token, self.retrive_next_sibling, tp, self.kimpl)
            idx = self.accept_index.clamp(min=0).long()
            self.ext_ids.copy_(self.predict[idx])
            zk.new_verified_id(self.ext_ids, self.accept_length, self.new_verified, self.kimpl)
            self.seq_lens.add_(self.accept_length + 1)
            self.ext_hid.copy_(self.x.reshape(B * N, -1)[idx])
            # the overlap scheduler's copy to the host, read next step (copy_done event)
            slot = i % 2
            self.host_pred[slot].copy_(self.predict, non_blocking=True)
            self.host_acc[slot].copy_(self.accept_length, non_blocking=True)
            ev = torch.cuda.Event() if self.cuda else None
            if ev is not None:
                ev.record()
        return ev, slot

    def _extend_layer(self, j):
        torch, B, S1 = self.torch, self.B, self.S + 1
        if j > 0:
            zk.rotate_input_ids(self.ext_ids, self.ext_acc, self.next_tokens[:, j - 1].contiguous(), self.kimpl)
        head, kv = self.heads[j], self.dkvs[j]
        mask = lt.window_mask(self.ext_start, S1, self.W, head.group, self.dtype)
        x, logits = head.forward(self.ext_ids, self.ext_hid, self.ext_pos, kv.k[0], kv.v[0], self.ext_pos, self.W,
                                 mask, rows=self.ext_acc)
        probs = torch.softmax(logits.float(), dim=-1)
        _, idx = fast_topk(torch, probs, 1)
        self.next_tokens[:, j].copy_(idx.view(B))
        self.ext_hid.copy_(x)                             # the next module reads this module's hidden states

    def _draft_extend_for_decode(self):
        with self.h.phase("draft_extend"):
            zk.extend_after_decode_info(self.ext_ids, self.seq_lens, self.accept_length, self.ext_pos,
                                        self.new_verified, self.kimpl)
            self.ext_acc.copy_(self.accept_length)
            self.ext_start.copy_(self.ext_pos[:, 0])
            self.verified_id.copy_(self.new_verified)
            for j in range(self.S):
                with self.h.span("draft_extend_graph" if self.graph else "draft_extend_eager"):
                    self.e_cores[j]()

    def forward_batch_generation(self, i):
        self.dw.draft()
        pending = self.f.verify(i)
        self.dw._draft_extend_for_decode()
        return pending

    def step(self, i):
        pending = self.scheduler.run_batch(i)
        self.scheduler.process_batch_result(i)       # the previous step's result
        self.pending = pending

    def process_batch_result(self, i):
        with self.h.phase("process_result"):
            self._read_pending()

    def _read_pending(self):
        if self.pending is None:
            return
        ev, slot = self.pending
        self.pending = None
        if ev is not None:
            ev.synchronize()                          # the copy_done event
        else:
            _common.sync(self.dev)
        acc = self.host_acc[slot].tolist()
        self.host_pred[slot].tolist()
        self.h.record_accept(acc)

    def drain(self):
        if getattr(self, "pending", None) is not None:
            self._read_pending()

    def draft_bytes_per_step(self):
        return int(sum(h.weight_bytes()["bytes"] for h in self.heads))

    def draft_facts(self):
        wb = self.heads[0].weight_bytes()
        return {"exists": True, "kind": f"{self.S} MTP modules (NEXTN layers; module j drafts token j), the "
                "target's embedding and lm_head shared", "modules": self.S, "weight_bytes": wb["bytes"],
                "own_weight_bytes": wb["own_bytes"], "shared_lm_head_bytes": wb["shared_lm_head_bytes"],
                "params_per_module": wb["own_params"], "forwards_per_step": self.S,
                "forwards": {"draft": 0, "draft_extend": self.S}, "extend_tokens_per_sequence": self.S + 1,
                "overlap_scheduler": True, "mode": "graph" if self.graph else "eager"}

    def graph_facts(self):
        return self.graphs


class _MLDraft:
    def __init__(self, e):
        self.e = e

    def draft(self):
        return self.e.draft()

    def draft_forward(self):
        return None

    def _draft_extend_for_decode(self):
        return self.e._draft_extend_for_decode()


ENGINES = {"sglang-eagle": SGLangEagle, "sglang-ngram": SGLangNgram, "vllm-eagle": VLLMEagle,
           "sglang-multilayer": SGLangMultiLayer}


def print_random_plan(argv: list[str]) -> int:
    """``--random N --seed S``: the random zoo's plan, one JSON line per shape (capture/run_session5.sh reads it)."""
    import argparse
    import json

    p = argparse.ArgumentParser(prog="zoo.py --random")
    p.add_argument("--random", type=int, required=True, help="how many shapes")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    for sh in random_shapes(a.random, a.seed):
        t = sh.target
        print(json.dumps({"shape": sh.name, "args": shape_args(sh), "engine": sh.engine, "draft": sh.draft,
                          "spans": sh.spans, "K": sh.steps, "topk": sh.topk, "verify_tokens": sh.verify_tokens,
                          "batch": sh.batch, "hidden": t["hidden"], "layers": t["layers"], "vocab": t["vocab"],
                          "context": sh.context, "extend_sample": sh.extend_sample, "mode": sh.mode,
                          "attn": sh.attn, "draft_cfg": sh.draft_cfg or None, "draft_mode": sh.draft_mode}))
    return 0


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    return print_random_plan(argv) if "--random" in argv else harness.run(Zoo, argv)


if __name__ == "__main__":
    sys.exit(main())

__all__ = ["SHAPES", "Shape", "Zoo", "tiny", "main"]
