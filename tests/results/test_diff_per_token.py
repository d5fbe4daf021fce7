"""``tracekit diff`` per token (issue 51 item 1, contract "diff per token"): when the two sides emit different tokens
per step (accept length x batch), ms per token and tok/s on both sides, and the headline and the gate compare per
token; a speculative side without an accept length is named and gets no per-step verdict.

Real pairs from sample_traces/: a plain and a speculative capture of the same target (hf small, CUDA graphs: the
spec capture drafts K = 3 with a 2-layer draft model), zoo shapes of different batches and accept lengths, and a
zoo shape against the plain step its own manifest measured. Every expected figure comes from the manifests
(``unprofiled_step_ms``, ``unprofiled_plain_step_ms``, ``spec.accept_len``, ``tokens_per_step``), computed here.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

import tracekit
from tracekit.cli import cli
from tracekit.report.diff import diff_md, headline

from conftest import sample_trace


def manifest(name: str) -> dict:
    return json.loads((sample_trace(name).parent / "manifest.json").read_text())


def ms_per_token(name: str) -> float:
    """The unprofiled step over the tokens it emits (accept length x batch; 1 x batch without speculation)."""
    m = manifest(name)
    acc = (m.get("spec") or {}).get("accept_len") or 1.0
    return m["unprofiled_step_ms"] / (acc * m["tokens_per_step"])


def run_json(*args) -> tuple[int, dict]:
    r = CliRunner().invoke(cli, ["diff", *map(str, args), "--format", "json"])
    assert r.exit_code in (0, 3, 4), r.output
    return r.exit_code, json.loads(r.stdout)


def test_plain_against_speculative_of_the_same_target_compares_per_token():
    """hf small with CUDA graphs, plain (2.822 ms a token) against speculative (4.268 ms a step emitting 1.2
    tokens: 3.557 ms a token): +51% a step, +26.0% a token; the gate compares the per-token change."""
    plain, spec = sample_trace("hf-small-graph"), sample_trace("hf-small-spec-graph")
    code, d = run_json(plain, spec, "--fail-on-regression", "3%")
    pt = d["per_token"]
    want_b, want_n = ms_per_token("hf-small-graph"), ms_per_token("hf-small-spec-graph")
    assert manifest("hf-small-spec-graph")["spec"]["accept_len"] == 1.2 and not manifest("hf-small-graph")["spec"]
    assert pt["base_ms_per_token"] == pytest.approx(want_b, rel=1e-9)
    assert pt["new_ms_per_token"] == pytest.approx(want_n, rel=1e-9)
    assert pt["base_tok_s"] == pytest.approx(1000 / want_b, rel=1e-9)
    assert pt["new_tok_s"] == pytest.approx(1000 / want_n, rel=1e-9)
    assert pt["change_pct"] == pytest.approx(100 * (want_n / want_b - 1), rel=1e-9)
    assert round(pt["change_pct"], 1) == 26.0 and round(100 * d["delta"]["reference_step_ms"]["rel"]) == 51
    assert pt["source"] == {"base": "plain", "new": "manifest"} and pt["basis"] == "unprofiled" and not pt["missing"]
    assert pt["tokens_per_step"] == {"base": 1.0, "new": 1.2}
    # the headline and the gate say it per token, and the gate's change is the per-token change
    assert headline(d).startswith("per token (unprofiled): 2.822 → 3.557 ms (+26.0%), 354.4 → 281.2 tok/s")
    g = d["gate"]
    assert g["compares"] == "token" and g["change_pct"] == pytest.approx(pt["change_pct"], rel=1e-9)
    assert "per token" in g["reason"] and "per token" in diff_md(d).split("\n")[0]
    # the per-step verdict is not given: the time base line does not state the step change as one
    assert "+51%" not in headline(d)
    # the reverse (speculation dropped) is faster per token, and passes
    code, r = run_json(spec, plain, "--fail-on-regression", "3%")
    assert r["per_token"]["change_pct"] == pytest.approx(100 * (want_b / want_n - 1), rel=1e-9)
    assert code == 0 and r["gate"]["verdict"] == "pass"


ZOO_PAIRS = [("zoo-sglang-chain-marked", "zoo-vllm-eagle-marked"), ("zoo-sglang-tree-marked", "zoo-ngram-marked"),
             ("zoo-standalone-marked", "zoo-mtp-multilayer-marked")]


@pytest.mark.slow
@pytest.mark.parametrize("base,new", ZOO_PAIRS, ids=[f"{a}->{b}" for a, b in ZOO_PAIRS])
def test_zoo_shapes_of_different_batches_and_accept_lengths(base, new):
    """Two speculative captures whose steps emit different tokens (accept length x batch from each manifest)."""
    d = tracekit.diff(sample_trace(base), sample_trace(new), fail_on_regression=3).to_dict()
    pt = d["per_token"]
    for side, name in (("base", base), ("new", new)):
        m = manifest(name)
        assert pt["tokens_per_step"][side] == pytest.approx(m["spec"]["accept_len"] * m["tokens_per_step"], rel=1e-9)
        assert pt[f"{side}_ms_per_token"] == pytest.approx(ms_per_token(name), rel=1e-9)
        assert pt["source"][side] == "manifest"
    assert pt["change_pct"] == pytest.approx(100 * (ms_per_token(new) / ms_per_token(base) - 1), rel=1e-9)
    assert d["gate"]["change_pct"] == pytest.approx(pt["change_pct"], rel=1e-9)


@pytest.mark.slow
@pytest.mark.parametrize("shape", ["sglang-chain", "vllm-eagle", "standalone"])
def test_does_speculation_pay_against_the_manifest_s_plain_step(shape):
    """A zoo capture against its own plain step (the manifest's ``unprofiled_plain_step_ms``: the same target
    decoding one token per sequence, same process): BASE is given that step and accept length 1 with the side
    flags. Per token, speculation pays where its step over the accept length is shorter than the plain step."""
    name = f"zoo-{shape}-marked"
    m, path = manifest(name), sample_trace(name)
    plain = m["unprofiled_plain_step_ms"]
    code, d = run_json(path, path, "--base-measured-step-ms", plain, "--base-accept-len", "1",
                       "--fail-on-regression", "3%")
    pt = d["per_token"]
    batch = m["tokens_per_step"]
    assert pt["source"] == {"base": "flag", "new": "manifest"}
    assert pt["base_ms_per_token"] == pytest.approx(plain / batch, rel=1e-9)
    assert pt["new_ms_per_token"] == pytest.approx(ms_per_token(name), rel=1e-9)
    assert pt["new_tok_s"] == pytest.approx(1000 * m["spec"]["accept_len"] * batch / m["unprofiled_step_ms"],
                                            rel=1e-9)
    pays = m["unprofiled_step_ms"] / m["spec"]["accept_len"] < plain
    assert (pt["change_pct"] < 0) is pays
    assert code == {"fail": 3, "inconclusive": 4, "pass": 0}[d["gate"]["verdict"]]
    assert not pays or d["gate"]["verdict"] == "pass"


def test_a_speculative_side_without_an_accept_length_is_named_not_compared(tmp_path):
    """The speculative zoo capture without its manifest (a symlink in an empty folder): speculation is found from
    its draft ranges, its accept length is nowhere. The headline says what is missing, no per-step verdict is given,
    and the gate cannot tell (exit 4); --new-accept-len gives it, and the steps compare per token."""
    spec = tmp_path / "spec" / "trace.sqlite.gz"
    spec.parent.mkdir()
    spec.symlink_to(sample_trace("zoo-sglang-chain-marked").resolve())
    plain = sample_trace("hf-small-graph")
    code, d = run_json(plain, spec, "--fail-on-regression", "3%")
    assert d["new"]["advice"]["drafting"]["speculative"] is True and d["new"]["roofline"]["accept_len"] is None
    pt = d["per_token"]
    assert pt["missing"] == ["new"] and pt["source"]["new"] == "missing"
    assert pt["new_ms_per_token"] is None and pt["change_pct"] is None
    h = headline(d)
    assert h.startswith("NEW is speculative without an accept length") and "--new-accept-len" in h
    assert "%" not in h.split(";")[0]  # no per-step change stated
    assert code == 4 and d["gate"]["verdict"] == "inconclusive" and d["gate"]["change_pct"] is None
    assert any("no per-step verdict" in w for w in d["delta"]["warnings"])
    # given on the command line
    acc = manifest("zoo-sglang-chain-marked")["spec"]["accept_len"]
    code, d = run_json(plain, spec, "--new-accept-len", acc)
    pt = d["per_token"]
    assert pt["source"] == {"base": "plain", "new": "flag"} and not pt["missing"]
    traced = d["new"]["time_base"]["traced_step_ms"]  # (no manifest: the traced step)
    assert pt["basis"] == "traced" and pt["new_ms_per_token"] == pytest.approx(traced / acc, rel=1e-9)


def test_a_shared_accept_length_is_not_applied_to_a_plain_side():
    """`--accept-len 3` applies to both sides; the plain side's steps emit one token per sequence whatever it says
    (the issue's vLLM pair: plain against a draft model with --accept-len 3)."""
    code, d = run_json(sample_trace("hf-small-graph"), sample_trace("hf-small-spec-graph"), "--accept-len", "3")
    pt = d["per_token"]
    assert pt["source"] == {"base": "plain", "new": "flag"} and pt["tokens_per_step"] == {"base": 1.0, "new": 3.0}
    assert pt["new_ms_per_token"] == pytest.approx(manifest("hf-small-spec-graph")["unprofiled_step_ms"] / 3, rel=1e-9)
    assert any(w.startswith("BASE's steps are plain decode") for w in d["delta"]["warnings"])


def test_the_same_tokens_per_step_compare_per_step():
    """Two plain captures (one token a step each): no ``per_token``, the gate compares steps."""
    d = tracekit.diff(sample_trace("hf-small-graph"), sample_trace("hf-small-eager"), fail_on_regression=3).to_dict()
    assert "per_token" not in d and d["gate"]["compares"] == "step"
    assert headline(d).startswith("unprofiled step 2.822 → 36.670 ms")
