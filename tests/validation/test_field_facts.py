"""Field facts: on real traces by other people, no verdict contradicts what the traces' authors state.

``../shared/external_traces/FACTS.toml`` records, for each of the shared real traces, facts taken from its authors'
own description (workload, speculative or not, world size, TP, collective kinds) — never from an analysis of ours.
Each trace is analysed once, as a user would (``tracekit.breakdown`` of the file, its busiest GPU, default options;
the result's JSON dict), and every check below runs on every trace (issue 23, item 5):

* exit codes: a trace with no GPU work is refused (exit 2, "no GPU activity"); a decode or mixed serving trace is
  analysed;
* no drafting on a trace without speculative decoding;
* no decode advice (an applicable lever, a lever in the headline) on training, prefill, micro-benchmark, non-LLM
  inference traces;
* ``roofline.tp`` is the stated tensor parallelism;
* no verdict speaks of an all-reduce on a trace whose collectives are of other kinds, and ``by_kind`` names no kind
  the authors did not list;
* no bandwidth above the GPU's peak (x 1.05) in any verdict, the headline or the roofline block;
* without an unprofiled time, every saving is worded as an upper bound ("at most", "≤"), and the headline never
  says "no lever" while a lever is unknown; no verdict was withheld by the advice's own check.

Our own H200 samples (``sample_traces/*/manifest.json``: speculative or not, tp, a decode workload) go through the
same checks. The figures behind each check come from FACTS.toml and the manifests, not from tracekit.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

import tracekit
from tracekit.errors import TracekitError

from conftest import SAMPLES, SHARED, sample_trace, shared

# The validation sweeps are the slow tier (`python -m pytest -m slow`; .ci/run runs them after the fast tier).
pytestmark = pytest.mark.slow

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 (tomli is a dependency there)
    import tomli as tomllib

PEAK_TOLERANCE = 1.05
NOT_DECODE = ("training", "prefill", "microbenchmark", "inference", "none")
HEDGES = ("at most", "≤")


def _external() -> dict[str, dict]:
    f = SHARED / "FACTS.toml"
    return tomllib.loads(f.read_text()) if f.is_file() else {}


# Our captures, one of each kind (speculative by draft ranges and by structure, nsys and torch, eager and graph, a
# large model whose draft the manifest counts, KV-bound, collectives): the whole set takes ~40 s, these a few.
SAMPLE_NAMES = ("hf-small-spec", "spec-small-eager-nomark", "spec-small-graph-torch-nomark", "spec-large-graph",
                "spec-large-eager", "hf-small-graph", "serve-small-eager", "kv-large-ctx16k", "tp1-synthetic-nccl-graph",
                "synthetic-symm-eager", "hf-small-eager-torch")


def _samples() -> dict[str, dict]:
    """Our captures' facts from their manifests: speculative iff a spec block, the manifest's tp, decode loops."""
    out = {}
    for name in SAMPLE_NAMES:
        man = json.loads((SAMPLES / name / "manifest.json").read_text())
        out[f"sample:{name}"] = {"workload": "decode", "speculative": bool(man.get("spec")),
                                          "tp": int(man.get("tp") or 1)}
    return out


FACTS = {**_external(), **_samples()}
IDS = sorted(FACTS) or ["(no facts: external traces absent)"]


def _id(key: str) -> str:
    """A short test id: the sample's name, or the trace's folder and file name."""
    return key.removeprefix("sample:") if key.startswith("sample:") else "/".join(Path(key).parts[-2:])


def _path(key: str) -> Path:
    if key.startswith("sample:"):
        return sample_trace(key.removeprefix("sample:"))
    return shared(key)


@pytest.fixture(scope="module")
def analysed():
    """Every trace analysed once per session: key -> (result dict | None, error text | None)."""
    cache: dict[str, tuple[dict | None, str | None]] = {}

    def get(key: str):
        if key not in FACTS:
            pytest.skip(f"external trace not present: {SHARED} (set TRACEKIT_EXTERNAL_TRACES=DIR)")
        if key not in cache:
            p = _path(key)
            try:
                cache[key] = (tracekit.breakdown(tracekit.load(p)).to_dict(), None)
            except TracekitError as e:
                cache[key] = (None, str(e))
        return cache[key]

    return get


def _texts(d: dict) -> list[str]:
    return [d["headline"], *(lever["verdict"] for lever in d["advice"].values())]


@pytest.mark.parametrize("key", IDS, ids=_id)
def test_exit_code(key, analysed):
    d, err = analysed(key)
    wl = FACTS[key].get("workload")
    if wl == "none":
        assert err is not None and "no GPU activity" in err, "a trace without GPU work must be refused (exit 2)"
    elif wl in ("decode", "mixed"):
        assert err is None, f"a {wl} serving trace must be analysed: {err}"


@pytest.mark.parametrize("key", IDS, ids=_id)
def test_no_drafting_without_speculation(key, analysed):
    d, _ = analysed(key)
    if d is None or FACTS[key].get("speculative") is not False:
        return
    dr = d["advice"]["drafting"]
    assert dr["detection"] == "not_detected", f"drafting '{dr['detection']}' on a non-speculative trace: {dr['verdict']}"
    assert not d["per_step_ms"]["drafting"], f"{d['per_step_ms']['drafting']} ms of drafting per step"
    # (contract, Additions to /3) never called speculative, by any source: spans, frames, shapes or structure
    assert dr["speculative"] is not True, f"speculative on a non-speculative trace: {dr['evidence']}"
    assert dr["draft_model"] is not True and dr["verify_tokens"] is None


@pytest.mark.parametrize("key", IDS, ids=_id)
def test_speculation_where_facts_say_so(key, analysed):
    """Where FACTS (or our manifest) says the trace decodes speculatively, tracekit says so too."""
    d, _ = analysed(key)
    if d is None or FACTS[key].get("speculative") is not True or d["steps"]["phase"] != "decode":
        return
    dr = d["advice"]["drafting"]
    assert dr["speculative"] is True and dr["draft_model"] is True, dr["evidence"]


@pytest.mark.parametrize("key", IDS, ids=_id)
def test_no_decode_advice_off_decode(key, analysed):
    d, _ = analysed(key)
    wl = FACTS[key].get("workload")
    if d is None or wl not in NOT_DECODE:
        return
    applicable = [k for k, v in d["advice"].items() if v["applicable"]]
    assert applicable == [], f"decode advice on a {wl} trace (steps.phase {d['steps']['phase']}): {applicable}"
    assert "→" not in d["headline"] and "lever" not in d["headline"], d["headline"]


@pytest.mark.parametrize("key", IDS, ids=_id)
def test_tp_is_the_stated_one(key, analysed):
    d, _ = analysed(key)
    if d is None or "tp" not in FACTS[key]:
        return
    r = d["roofline"]
    assert r["tp"] == FACTS[key]["tp"], f"tp {r['tp']} ({r.get('tp_source')}: {r.get('tp_evidence')})"


def _says_all_reduce(text: str) -> bool:
    return re.search(r"(?i)all[-_ ]?reduce", text) is not None


@pytest.mark.parametrize("key", IDS, ids=_id)
def test_collective_kinds(key, analysed):
    d, _ = analysed(key)
    kinds = FACTS[key].get("collectives")
    if d is None or kinds is None:
        return
    if "all-reduce" not in kinds:
        said = [t for t in _texts(d) if _says_all_reduce(t)]
        assert said == [], f"an all-reduce verdict on a trace whose collectives are {kinds}: {said[0][:300]}"
    named = {str(r["kind"]).replace("_", "-") for r in d["advice"]["communication"].get("by_kind") or []}
    assert named <= set(kinds), f"by_kind names {sorted(named - set(kinds))}; the authors list {kinds}"


_GBPS = re.compile(r"(\d[\d,]*(?:\.\d+)?) GB/s")
_OF_PEAK = re.compile(r"(\d+(?:\.\d+)?)% of (?:the )?(?:GPU's )?peak")
_OF_CEILING = re.compile(r"(\d+(?:\.\d+)?)% of the [\d,.]+ (?:ms floor|tok/s bandwidth ceiling)")


@pytest.mark.parametrize("key", IDS, ids=_id)
def test_no_bandwidth_above_peak(key, analysed):
    d, _ = analysed(key)
    if d is None:
        return
    peak = d["gpu"]["peak_bw_gbps"]
    r = d["roofline"]
    for k in ("gemm_achieved_bw_gbps", "attention_achieved_bw_gbps"):
        if peak and r[k] is not None:
            assert r[k] <= PEAK_TOLERANCE * peak, f"roofline.{k} = {r[k]:,.0f} GB/s against a {peak:,.0f} GB/s peak"
    if r["fraction_of_ceiling"] is not None:
        assert r["fraction_of_ceiling"] <= PEAK_TOLERANCE, f"fraction_of_ceiling {r['fraction_of_ceiling']:.2f}"
    for text in _texts(d):
        for m in _OF_PEAK.finditer(text):
            assert float(m.group(1)) <= 100 * PEAK_TOLERANCE, f"{m.group(0)!r} in {text[:300]!r}"
        for m in _OF_CEILING.finditer(text):
            assert float(m.group(1)) <= 100 * PEAK_TOLERANCE, f"{m.group(0)!r} in {text[:300]!r}"
        if peak:
            for m in _GBPS.finditer(text):
                if "bus bandwidth" in text[m.end():m.end() + 20]:  # a link figure, not memory
                    continue
                assert float(m.group(1).replace(",", "")) <= PEAK_TOLERANCE * peak, f"{m.group(0)!r} in {text[:300]!r}"


# a saving stated in a sentence: "−0.804 ms", "saves 0.2 ms", "could save ≈0.2 ms", "cut ... by 0.2 ms"
_SAVING = re.compile(r"−\s?\d+\.\d+ ms|\b(?:save|saves|saving|cut|cuts)\s+(?:about\s+|up to\s+|≈\s?)?\d+\.\d+ ms")


@pytest.mark.parametrize("key", IDS, ids=_id)
def test_savings_hedged_without_unprofiled_time(key, analysed):
    d, _ = analysed(key)
    if d is None:
        return
    withheld = [k for k, v in d["advice"].items() if v["verdict"].startswith("verdict withheld")]
    assert withheld == [], f"the advice's own check withheld {withheld}: {d['advice'][withheld[0]]['verdict']}"
    unknown = [k for k, v in d["advice"].items() if v.get("basis") == "unknown" and v.get("needs")]
    if unknown:
        assert "no lever" not in d["headline"], f"'no lever' while {unknown} are unknown: {d['headline']}"
    if d["time_base"]["unprofiled_step_ms"] is not None:
        return
    for k, v in d["advice"].items():
        if (v["max_saving_ms"] or 0) > 0.0005:
            assert any(h in v["verdict"] for h in HEDGES), f"{k}: saving {v['max_saving_ms']:.3f} ms unhedged: " \
                                                          f"{v['verdict'][:300]}"
    for text in _texts(d):
        for m in _SAVING.finditer(text):
            before = text[max(0, m.start() - 9):m.start()]
            assert any(h in before or h in m.group(0) for h in HEDGES), f"unhedged {m.group(0)!r} in {text[:300]!r}"
