"""Every number in a sentence adds up with the numbers beside it (issue 51 item 6): the headline's and each lever's
sentences are parsed back into numbers and their arithmetic is checked on every sample — a saving and the step it
is a share of, the step with a lever pulled and the step minus the saving, a floor and what is not spent reading
memory, drafting's plain step times the accepted tokens. A sentence that mixes units (a plain step beside a saving
per step's worth of tokens, as "no drafting → ≈3.229 ms (−0.393 ms)" on a 4.268 ms step did) fails here.

The numbers are rounded as printed (3 decimals for ms, 1 or 0 for percentages, 2 for tokens): each check allows
the rounding of the numbers it combines, nothing more."""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest

import tracekit

from conftest import SAMPLES, sample_trace

MS = 0.0005  # half the last printed digit of a ms figure
HITS: Counter = Counter()  # how often each check found its sentence (a check that never fires checks nothing)
N = r"(\d[\d,]*\.?\d*)"  # a printed number


def _f(x: str) -> float:
    return float(x.replace(",", ""))


def _pct_ok(share: float, printed: str) -> bool:
    """``share`` (0-1) as :func:`tracekit.analyses.verdicts.pct` prints it (the ms figures it came from rounded)."""
    v, tol = 100 * share, (0.05 if "." in printed else 0.5)
    return abs(v - _f(printed)) <= tol + 0.002 * max(v, 1)


def _share_ok(s: float, r: float, printed: str) -> bool:
    """``printed`` (a percentage) is the share ``s / r`` of two ms figures printed rounded to 3 decimals: anywhere
    between the smallest and the largest share the unrounded figures can give (a 0.014 ms saving of a 1.099 ms
    step is 1.23-1.32%), within the percentage's own rounding."""
    lo, hi = 100 * max(0.0, s - MS) / (r + MS), 100 * (s + MS) / max(r - MS, MS)
    tol = 0.05 if "." in printed else 0.5
    return lo - tol - 0.002 * max(lo, 1) <= _f(printed) <= hi + tol + 0.002 * max(hi, 1)


def sentence_problems(text: str, traced_ms: float | None = None) -> list[str]:
    """What does not add up in one rendered sentence (headline or lever verdict)."""
    out = []
    ref = None
    if m := re.match(rf"step {N} ms unprofiled \([^;]*; traced {N} ms\)", text):
        ref, traced_ms = _f(m.group(1)), _f(m.group(2))
    elif m := re.match(rf"traced step {N} ms", text):
        traced_ms = _f(m.group(1))
    # the headline's top lever: "NAME → ≈P ms[ for ...] (−S ms)": P = the step − S (both in one unit)
    for m in re.finditer(rf"→ ≈{N} ms[^(;]*\(−{N} ms\)", text):
        HITS["top"] += 1
        p, s = _f(m.group(1)), _f(m.group(2))
        if ref is None or abs(ref - s - p) > 3 * MS:
            out.append(f"'{m.group(0)}': {ref} ms − {s} ms ≠ {p} ms")
    # "→ at most −S ms (F% of the traced step)"
    for m in re.finditer(rf"→ at most −{N} ms \({N}% of the traced step\)", text):
        HITS["top_upper"] += 1
        if traced_ms is None or not _share_ok(_f(m.group(1)), traced_ms, m.group(2)):
            out.append(f"'{m.group(0)}': not that share of the {traced_ms} ms traced step")
    # a saving and its share: "≈S ms per step (F% of the R ms unprofiled|traced step"
    for m in re.finditer(rf"(?:≈|at most ){N} ms per step \({N}% of the {N} ms (?:unprofiled|traced) step", text):
        HITS["share"] += 1
        s, r = _f(m.group(1)), _f(m.group(3))
        if not _share_ok(s, r, m.group(2)):
            out.append(f"'{m.group(0)}': {s} / {r} is not {m.group(2)}%")
    # CUDA graphs: "save S ms per step (... R ms ...): the step would take about P ms with graphs": P = R − S
    if m := re.search(rf"save (?:≈|at most ){N} ms per step \([^)]*of the {N} ms [^)]*\): the step would take about "
                      rf"{N} ms with graphs", text):
        HITS["graphs"] += 1
        s, r, p = (_f(m.group(i)) for i in (1, 2, 3))
        if abs(r - s - p) > 3 * MS:
            out.append(f"graphs: {r} − {s} ≠ {p}")
    # "the step takes R ms (...) against ≈P ms with graphs (a saving of S ms)"
    if m := re.search(rf"the step takes {N} ms \([^)]*\) against ≈{N} ms with graphs \(a saving of (?:at most |≈){N} ms\)",
                      text):
        HITS["graphs_little"] += 1
        r, p, s = (_f(m.group(i)) for i in (1, 2, 3))
        if abs(max(r - p, 0) - s) > 3 * MS:
            out.append(f"graphs (little): {r} − {p} ≠ {s}")
    # the floor: "the step takes R ms (...) against a floor of F ms ... (P% of it): S ms per step ..."
    if m := re.search(rf"the step takes {N} ms \([^)]*\) against a floor of {N} ms .*?\({N}% of it\): (?:≈|at most )"
                      rf"{N} ms per step", text):
        HITS["floor"] += 1
        r, f, s = _f(m.group(1)), _f(m.group(2)), _f(m.group(4))
        if not _pct_ok(f / r, m.group(3)) or abs(r - f - s) > 3 * MS:
            out.append(f"floor: {r} ms step, {f} ms floor, {m.group(3)}%, {s} ms not reading memory")
    if m := re.search(rf"at {N} ms \([^)]*\) it is at {N}% of the {N} ms floor .*? with (?:≈|at most ){N} ms per step",
                      text):
        HITS["floor_bound"] += 1
        r, f, s = _f(m.group(1)), _f(m.group(3)), _f(m.group(4))
        if not _pct_ok(f / r, m.group(2)) or abs(r - f - s) > 3 * MS:
            out.append(f"floor (bound): {r} ms step, {f} ms floor, {m.group(2)}%, {s} ms not reading memory")
    # drafting: "with A tokens accepted per step ... (≈P ms per plain step ...) ... break-even at B ... save ≈S ms per
    # step (F% of the R ms ...": S = R − A x P, B = R / P
    if m := re.search(rf"with {N} tokens accepted per step .*?\(≈{N} ms per plain step", text):
        HITS["drafting"] += 1
        a, p = _f(m.group(1)), _f(m.group(2))
        b = re.search(rf"break-even at {N} accepted tokens", text)
        if s := re.search(rf"speculation (?:would|could) save (?:≈|at most ){N} ms per step \({N}% of the {N} ms", text):
            sv, r = _f(s.group(1)), _f(s.group(3))
            if abs(r - a * p - sv) > 3 * MS + 0.005 * p:
                out.append(f"drafting: {r} − {a} x {p} ≠ {sv}")
            if b and abs(r / p - _f(b.group(1))) > 0.005 + 0.001 * r / p:
                out.append(f"drafting: break-even {b.group(1)} ≠ {r} / {p}")
    # host work on the unprofiled step: "would save ≈S ms ... on the unprofiled step that is at most S ms"
    if m := re.search(rf"on the unprofiled step that is at most {N} ms", text):
        HITS["host_work"] += 1
        if s := re.search(rf"would save ≈{N} ms per step", text):
            if s.group(1) != m.group(1):
                out.append(f"host work: saves {s.group(1)} ms, 'at most {m.group(1)} ms' on the unprofiled step")
    return out


def report_problems(d: dict) -> list[str]:
    """What does not add up in a breakdown's headline and levers (``--format json``)."""
    traced = d["time_base"]["traced_step_ms"]
    out = [f"headline: {p}" for p in sentence_problems(d["headline"], traced)]
    for key, lever in d["advice"].items():
        out += [f"{key}: {p}" for p in sentence_problems(lever["verdict"], traced)]
    return out


def test_the_checker_catches_what_the_issue_showed():
    """The issue's sentences fail; the same sentences with the numbers in one unit pass."""
    bad = ("step 4.268 ms unprofiled (manifest; traced 4.985 ms); other 34%, graph bubbles 18% of the traced step; "
           "no drafting → ≈3.229 ms (−0.393 ms)")
    assert sentence_problems(bad)
    assert not sentence_problems(bad.replace("≈3.229 ms", "≈3.875 ms for the same 1.20 tokens a sequence"))
    assert sentence_problems("the step takes 4.268 ms (unprofiled, manifest) against a floor of 0.256 ms for reading "
                             "1.23 GB of weights (manifest) per GPU (6.0% of it): ≈4.111 ms per step (94% of the "
                             "4.268 ms unprofiled step, manifest)")
    assert sentence_problems("CUDA graphs would save ≈33.594 ms per step (92% of the 36.670 ms unprofiled step, "
                             "manifest): the step would take about 3.177 ms with graphs")
    assert sentence_problems("faster all-reduce would save ≈0.500 ms per step (20% of the 5.000 ms unprofiled step)")
    # a share of two rounded figures: gate-graph-r2's 0.0136 ms of 1.099 ms prints 1.2%, though 0.014 / 1.099 is 1.27%;
    # a share no rounding of the two figures gives still fails
    host = "would save ≈0.014 ms per step ({}% of the 1.099 ms unprofiled step, manifest)"
    assert not sentence_problems(host.format("1.2")) and not sentence_problems(host.format("1.3"))
    assert sentence_problems(host.format("1.1")) and sentence_problems(host.format("1.4"))


def test_the_hf_small_spec_graph_headline_states_drafting_in_one_unit():
    """The sample the issue quoted: the headline's drafting lever is the same tokens' time without speculation
    (the unprofiled step minus the saving: 4.268 − 0.393), not one plain step (3.229 ms), and it is named by what
    to do. The plain step and the accept length come from the lever's fields: reference − accept x plain."""
    d = tracekit.breakdown(tracekit.load(sample_trace("hf-small-spec-graph"))).to_dict()
    a, ref = d["advice"]["drafting"], d["time_base"]["reference_step_ms"]
    assert a["max_saving_ms"] > 0 and d["headline"].count("→") == 1
    assert f"→ ≈{ref - a['max_saving_ms']:.3f} ms for the same" in d["headline"]
    assert f"(−{a['max_saving_ms']:.3f} ms)" in d["headline"]
    assert f"{a['predicted_step_ms']:.3f} ms" not in d["headline"]
    assert "no drafting" not in d["headline"] and "decode without speculation →" in d["headline"]
    assert report_problems(d) == []


def test_every_check_fires_on_the_samples_that_have_its_sentence():
    """Each check finds its sentence somewhere (else it would check nothing): an eager sample (CUDA graphs, host
    work, the floor), a speculative one whose speculation does not pay (drafting in the headline), one without
    an unprofiled time (upper bounds) and a memory-bound one."""
    HITS.clear()
    for name in ("hf-small-eager", "hf-small-spec-graph", "kv-large-ctx32k", "spec-small-graph-nomark"):
        d = tracekit.breakdown(tracekit.load(sample_trace(name))).to_dict()
        assert report_problems(d) == [], name
    d["time_base"]["unprofiled_step_ms"] = None
    d["headline"] = ("traced step 5.000 ms, no unprofiled time: savings are upper bounds; "
                     "CUDA graphs → at most −1.000 ms (20% of the traced step)")
    assert report_problems(d) == []
    assert set(HITS) >= {"top", "top_upper", "share", "graphs", "floor", "floor_bound", "drafting"}, HITS


SAMPLE_NAMES = sorted(json.loads((SAMPLES / "index.json").read_text())["traces"])


@pytest.mark.slow
@pytest.mark.parametrize("name", SAMPLE_NAMES)
def test_every_sentence_adds_up_on_every_sample(name):
    d = tracekit.breakdown(tracekit.load(sample_trace(name))).to_dict()
    assert report_problems(d) == []


@pytest.mark.parametrize("name", ["hf-small-spec-graph", "zoo-vllm-eagle-nomark", "hf-small-eager"])
def test_text_and_markdown_show_the_speculation_evidence_in_one_line(name):
    """Issue 51 item 6: the evidence speculation was found (or not found) from was only in the JSON. The table and
    markdown views now give ``advice.drafting``'s detection and every one of its evidence facts in one line."""
    import html
    import io

    from rich.console import Console

    from tracekit.report.markdown import breakdown_md
    from tracekit.report.terminal import render_breakdown

    b = tracekit.breakdown(tracekit.load(sample_trace(name)))
    a = b.to_dict()["advice"]["drafting"]
    assert a["evidence"]
    text = io.StringIO()
    render_breakdown(b, Console(file=text, width=100000))  # (piped: a sentence is one line)
    for out in (text.getvalue(), breakdown_md(b)):
        lines = [line for line in out.splitlines() if line.strip("*").startswith("speculation: ")]
        assert len(lines) == 1, out
        def bare(x: str) -> str:  # (markdown escapes; what is compared is the words and numbers)
            return re.sub(r"[^0-9A-Za-z]", "", html.unescape(x))

        assert all(bare(fact) in bare(lines[0]) for fact in a["evidence"])
        assert ("not detected" in lines[0]) == (a["detection"] == "not_detected" and not a.get("speculative"))
