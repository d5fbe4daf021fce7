"""tracekit diff (tracekit.results.diff): the tracekit.diff/3 JSON (reference steps compared), the PR markdown
(stable, escaped) and the CLI, on real traces; then the per-kernel deltas, diff per token and the CI gate
(--fail-on-regression), each in a section below."""

from __future__ import annotations

import json
import re
import statistics

import polars as pl
import pytest
from click.testing import CliRunner

import tracekit
from tracekit.categories import BREAKDOWN_SCHEMA, LEVERS
from tracekit.cli import cli
from tracekit.report.diff import diff_md, headline
from tracekit.results.diff import GATE_RESAMPLES, bootstrap_ratio, change, diff, gate, parse_threshold, read_saved

from conftest import DATA, sample, sample_sqlite, sample_trace, shared, sql_rows

MFU = DATA / "nsys" / "nsysai_mfu_2gpu_before_2026.2.sqlite"
SGLANG = "TraceLens/tests/traces/inference/sglang_decode/sglang_Qwen3-8B_decode.json.gz"


@pytest.fixture(scope="module")
def pair():
    # The nsys-ai run is training, and its NVTX ranges say so (FSDP backward hooks, activation checkpointing:
    # docs/definitions.md, Phase), which leaves it no decode lever. Without them (its steps are inferred either
    # way) nothing tells its phase, it is analysed as decode, and its levers can flip against the SGLang decode trace.
    import dataclasses

    t = tracekit.load(MFU)
    return (tracekit.breakdown(dataclasses.replace(t, ranges=t.ranges.head(0))),
            tracekit.breakdown(tracekit.load(shared(SGLANG))))


def test_schema_and_deltas_are_the_breakdowns_numbers(pair):
    base, new = pair
    d = diff(base, new).to_dict()
    assert list(d) == ["schema", "base", "new", "delta", "kernels", "kernel_categories"]  # (+ gate, cross_rank when asked)
    assert d["schema"] == "tracekit.diff/3" and d["base"]["schema"] == d["new"]["schema"] == BREAKDOWN_SCHEMA
    assert d["base"] == base.to_dict() and d["new"] == new.to_dict()
    for k, c in d["delta"]["per_step_ms"].items():
        b, n = base.per_step_ms[k], new.per_step_ms[k]
        assert (c["base"], c["new"]) == (b, n)
        assert c["abs"] == pytest.approx(n - b, abs=1e-9)
        assert c["rel"] == (pytest.approx((n - b) / b) if b else None)
    m = d["delta"]["steps"]["mean_ms"]
    # base: 16 inferred steps of the DiT forward (one 163-launch block per host read; docs/definitions.md), the last excluded
    assert m["base"] == pytest.approx(17.369, abs=5e-4) and m["new"] == pytest.approx(10.367, abs=5e-4)
    spread = d["delta"]["steps"]["spread_ms"]
    assert spread["base"] == pytest.approx(base.steps["p90_ms"] - base.steps["p10_ms"])
    assert spread["new"] == pytest.approx(0.0)
    assert d["delta"]["steps"]["count"] == {"base": 15, "new": 1, "abs": -14, "rel": pytest.approx(-14 / 15)}
    # attention moves most in absolute terms (7.994 → 2.301 ms).
    assert d["delta"]["largest_change"] == "attention"
    # The SGLang trace replays CUDA graphs, the nsys-ai one is eager: the cuda_graphs lever flips.
    flips = {a["lever"]: a for a in d["delta"]["advice_changed"]}
    assert flips["cuda_graphs"]["applicable"] == {"base": True, "new": False}
    assert flips["cuda_graphs"]["applicable_flipped"] is True
    assert flips["communication"]["applicable_flipped"] is True
    assert "drafting" not in flips  # same verdict on both sides
    assert any("steps found differently" in w for w in d["delta"]["warnings"])


def test_headline_names_the_largest_change(pair):
    # neither trace has an unprofiled time: the traced steps are the reference, and the headline says so
    d = diff(*pair).to_dict()
    assert d["delta"]["reference_step_ms"]["basis"] == "traced"
    assert headline(d) == ("traced step 17.369 → 10.367 ms (−40%; no unprofiled time on either side); in the traced "
                           "step: attention −5.693 ms")


def test_self_diff_is_zero_and_within_noise(pair):
    base, _ = pair
    d = diff(base, base).to_dict()
    assert all(c["abs"] == 0 for c in d["delta"]["per_step_ms"].values())
    assert d["delta"]["largest_change"] is None
    assert d["delta"]["advice_changed"] == []
    assert d["delta"]["steps"]["within_noise"] is True


def test_change_helper():
    assert change(23.5, 3.7).to_dict() == {"base": 23.5, "new": 3.7, "abs": -19.8, "rel": pytest.approx(-0.8425532)}
    assert change(None, 2.0)["abs"] is None and change(0.0, 2.0)["rel"] is None


@pytest.mark.slow
def test_markdown_is_stable_escaped_and_collapsible(pair):
    runner = CliRunner()
    args = ["diff", str(MFU), str(shared(SGLANG)), "--format", "md"]
    r1, r2 = runner.invoke(cli, args), runner.invoke(cli, args)
    assert r1.exit_code == 0, r1.output
    assert r1.output == r2.output
    lines = r1.output.splitlines()
    assert lines[0] == ("### tracekit diff: traced step 17.369 → 10.367 ms (−40%; no unprofiled time on either side); "
                        "in the traced step: attention −5.693 ms")
    assert "| **traced mean** | 17.369 | 10.367 | −7.003 | −40% |" in lines
    assert "| traced p90 | 18.977 | 10.367 | −8.610 | −45% |" in lines
    assert "<details><summary>details</summary>" in lines and "</details>" in lines
    # Names and paths are escaped (markdown metacharacters, HTML).
    assert "nsysai\\_mfu\\_2gpu" in r1.output
    # Only our own tags appear as HTML.
    assert set(re.findall(r"</?([a-z]+)", r1.output)) == {"details", "summary"}


def test_markdown_escapes_hostile_names(pair):
    base, new = pair
    d = diff(base, new).to_dict()
    d["new"]["source"]["path"] = "<img src=x onerror=alert(1)>|**x**"
    d["new"]["warnings"] = ["<script>alert(1)</script>"]
    text = diff_md(d)
    assert "<img" not in text and "<script" not in text
    assert "&lt;img src=x onerror=alert(1)&gt;\\|\\*\\*x\\*\\*" in text


@pytest.mark.slow
def test_json_and_table_cli(pair):
    runner = CliRunner()
    r = runner.invoke(cli, ["diff", str(MFU), str(shared(SGLANG)), "--format", "json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["schema"] == "tracekit.diff/3"
    assert d["delta"]["per_step_ms"]["gemm"]["abs"] == pytest.approx(4.079, abs=0.01)
    r = runner.invoke(cli, ["diff", str(MFU), str(MFU)])
    assert r.exit_code == 0, r.output
    assert "traced step 17.369 → 17.369 ms (±0%; no unprofiled time on either side) (within step-to-step noise)" \
        in " ".join(r.output.split())  # (the table wraps at 80 columns, on words)


def test_options_apply_to_both_sides():
    runner = CliRunner()
    p = DATA / "nsys" / "pipit_saxpy_2022.2.sqlite"
    r = runner.invoke(cli, ["diff", str(p), str(p), "--step-range", "^saxpy$", "--format", "json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["base"]["steps"]["pattern"] == d["new"]["steps"]["pattern"] == "^saxpy$"
    assert d["base"]["steps"]["count"] == 4


def test_unusable_input_is_one_line_exit_2(tmp_path):
    r = CliRunner().invoke(cli, ["diff", str(MFU), str(tmp_path / "missing.sqlite")])
    assert r.exit_code == 2
    assert r.output.startswith("tracekit: error: ") and r.output.count("\n") == 1


def manifest_ms(path) -> float:
    return json.loads((path.parent / "manifest.json").read_text())["unprofiled_step_ms"]


@pytest.mark.slow
def test_eager_vs_graph_headline_compares_the_unprofiled_steps():
    """The bundled eager and graph captures both carry a manifest: the headline is their unprofiled steps (what a
    user's tokens/s follows), not the traced ones (inflated 2.2x by the profiler)."""
    eager, graph = sample("hf-small-eager/trace.sqlite"), sample_trace("hf-small-graph")
    man = [manifest_ms(eager), manifest_ms(graph)]
    assert [round(m, 3) for m in man] == [36.670, 2.822]
    r = CliRunner().invoke(cli, ["diff", str(eager), str(graph), "--format", "json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    ref = d["delta"]["reference_step_ms"]
    assert (ref["base"], ref["new"]) == (man[0], man[1]) and ref["abs"] == pytest.approx(man[1] - man[0])
    assert ref["rel"] == pytest.approx((man[1] - man[0]) / man[0])
    assert (ref["base_source"], ref["new_source"], ref["basis"]) == ("manifest", "manifest", "unprofiled")
    assert d["delta"]["time_base"]["reference_step_ms"] == ref
    big = d["delta"]["largest_change"]
    assert big in ("idle", "launch_gaps") and d["delta"]["per_step_ms"][big]["abs"] < 0
    md_text = CliRunner().invoke(cli, ["diff", str(eager), str(graph), "--format", "md"]).output
    assert md_text.startswith(f"### tracekit diff: unprofiled step 36.670 → 2.822 ms (−92%); in the traced step: {big} −")
    assert "| **unprofiled step** | 36.670 | 2.822 | −33.849 | −92% |" in md_text
    table = CliRunner().invoke(cli, ["diff", str(eager), str(graph)]).output
    assert table.startswith("unprofiled step 36.670 → 2.822 ms (−92%)")


@pytest.mark.slow
def test_an_unprofiled_step_is_not_compared_with_a_traced_one():
    graph = sample_trace("hf-small-graph")
    r = CliRunner().invoke(cli, ["diff", str(MFU), str(graph), "--format", "json"])
    d = json.loads(r.output)
    ref = d["delta"]["reference_step_ms"]
    assert ref["basis"] == "mixed" and ref["abs"] is None and ref["rel"] is None
    assert (ref["base_source"], ref["new_source"]) == ("traced", "manifest")
    assert ref["new"] == manifest_ms(graph) and ref["base"] == d["base"]["time_base"]["traced_step_ms"]
    assert any("pass --base-measured-step-ms" in w for w in d["delta"]["warnings"])
    md_text = CliRunner().invoke(cli, ["diff", str(MFU), str(graph), "--format", "md"]).output
    head = md_text.splitlines()[0]
    assert head.startswith("### tracekit diff: step 17.369 ms traced → 2.822 ms unprofiled (manifest): not compared")
    assert "%" not in head.split(";")[0]  # no change stated between the two
    assert "| **reference step (traced → unprofiled)** | 17.369 | 2.822 | — | — |" in md_text
    assert "the reference steps are not compared (one unprofiled, one traced)" in md_text
    # a flag for the side without a manifest makes both unprofiled: now compared
    r = CliRunner().invoke(cli, ["diff", str(MFU), str(graph), "--base-measured-step-ms", "10", "--format", "json"])
    ref = json.loads(r.output)["delta"]["reference_step_ms"]
    assert (ref["basis"], ref["base_source"], ref["abs"]) == ("unprofiled", "flag", pytest.approx(manifest_ms(graph) - 10))


def test_every_lever_is_compared(pair):
    """The host-stalls lever changes between the eager and graph captures; every lever of categories.LEVERS is
    looked at (none is spelled out in the diff)."""
    eager, graph = (tracekit.breakdown(tracekit.load(p)) for p in (sample("hf-small-eager/trace.sqlite"),
                                                                   sample_trace("hf-small-graph")))
    d = diff(eager, graph).to_dict()
    changed = {a["lever"] for a in d["delta"]["advice_changed"]}
    want = {k for k in LEVERS if d["base"]["advice"][k]["verdict"] != d["new"]["advice"][k]["verdict"]
            or d["base"]["advice"][k]["applicable"] != d["new"]["advice"][k]["applicable"]}
    assert changed == want and len(want) >= 3 and set(d["base"]["advice"]) == set(LEVERS)


@pytest.mark.slow
def test_each_side_has_its_own_time_base():
    # hf-small eager vs graph: each side's unprofiled step from its own manifest
    eager, graph = sample("hf-small-eager/trace.sqlite"), sample_trace("hf-small-graph")
    man = [json.loads((p.parent / "manifest.json").read_text())["unprofiled_step_ms"] for p in (eager, graph)]
    assert [round(m, 3) for m in man] == [36.670, 2.822]
    r = CliRunner().invoke(cli, ["diff", str(eager), str(graph), "--format", "json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    tb = d["delta"]["reference_step_ms"]
    assert (tb["base"], tb["new"]) == (man[0], man[1]) and tb["abs"] == pytest.approx(man[1] - man[0])
    assert d["base"]["time_base"]["unprofiled_source"] == d["new"]["time_base"]["unprofiled_source"] == "manifest"
    md_text = CliRunner().invoke(cli, ["diff", str(eager), str(graph), "--format", "md"]).output
    assert ("time base: base 36.670 ms unprofiled (manifest), new 2.822 ms unprofiled (manifest); reference step "
            f"−{man[0] - man[1]:.3f} ms (−92%)") in md_text
    assert "| **unprofiled step** | 36.670 | 2.822 | −33.849 | −92% |" in md_text
    # a flag per side replaces that side's manifest only
    r = CliRunner().invoke(cli, ["diff", str(eager), str(graph), "--base-measured-step-ms", "40",
                                 "--format", "json"])
    d = json.loads(r.output)
    assert d["base"]["time_base"]["unprofiled_source"] == "flag" and d["base"]["time_base"]["reference_step_ms"] == 40
    assert d["new"]["time_base"]["reference_step_ms"] == man[1]
    # a side without an unprofiled time: its traced step, and the markdown says its savings are upper bounds
    md_text = CliRunner().invoke(cli, ["diff", str(MFU), str(graph), "--format", "md"]).output
    assert "time base: base 17.369 ms traced (no unprofiled time: its savings are upper bounds), new 2.822 ms" in md_text


@pytest.mark.slow
def test_saved_breakdowns_as_sides(tmp_path):
    graph = sample_trace("hf-small-graph")
    saved = tmp_path / "graph.json"
    r = CliRunner().invoke(cli, ["breakdown", str(graph), "--format", "json", "-o", str(saved)])
    assert r.exit_code == 0, r.output
    live = json.loads(CliRunner().invoke(cli, ["diff", str(MFU), str(graph), "--format", "json"]).output)
    from_file = json.loads(CliRunner().invoke(cli, ["diff", str(MFU), str(saved), "--format", "json"]).output)
    # a saved breakdown of the current schema is the same side as its trace, but for the per-kernel times it does
    # not keep (kernels null, and a warning says so)
    assert from_file["kernels"] is None and live["kernels"]
    assert [w for w in from_file["delta"]["warnings"] if w not in live["delta"]["warnings"]] == [
        "NEW: a saved breakdown keeps no per-kernel times, so `kernels` is null (diff the trace files for the kernels "
        "that moved)"]
    for d in (live, from_file):
        d.pop("kernels")
        d["delta"]["warnings"] = [w for w in d["delta"]["warnings"] if "per-kernel" not in w]
    assert from_file == live
    assert json.loads(saved.read_text())["schema"] == BREAKDOWN_SCHEMA
    # a result saved under an older schema (/1, and /2 once breakdown is /3) is refused with the reason, exit 2
    v1 = DATA / "saved" / "saxpy_breakdown_v1.json"
    assert json.loads(v1.read_text())["schema"] == "tracekit.breakdown/1"
    current = int(BREAKDOWN_SCHEMA.rsplit("/", 1)[1])
    for version in range(1, current):
        old = tmp_path / f"v{version}.json"
        old.write_text(v1.read_text().replace("tracekit.breakdown/1", f"tracekit.breakdown/{version}", 1))
        r = CliRunner().invoke(cli, ["diff", str(old), str(saved)])
        assert r.exit_code == 2 and r.output.count("\n") == 1
        assert r.output.startswith(f"tracekit: error: {old}: a saved tracekit.breakdown/{version} result; diff "
                                   f"compares {BREAKDOWN_SCHEMA} breakdowns")
    r = CliRunner().invoke(cli, ["diff", str(MFU), str(saved), "--new-measured-step-ms", "3"])
    assert r.exit_code == 2 and "is a saved breakdown" in r.output


# ───────────────────────── rank directories (issue 45) ─────────────────────────

LORA = "lora_perf_lora_profile/runs/Qwen3-30B-A3B-Instruct-2507-BF16-expert_shared-20260609-133913/current_base_lora/profile/base"


@pytest.fixture(scope="module")
def rank_sets(tmp_path_factory):
    """The LoRA TP4 rank directory, a directory of two of its ranks (symlinks: the files are never copied), each
    analysed as `breakdown DIR` does (its report is what the diff's rank-set figures must equal)."""
    from tracekit.cli.output import expand_traces
    from tracekit.contract import to_dict
    from tracekit.run.ranks import analyse_files, cross_rank

    four = shared(LORA)
    two = tmp_path_factory.mktemp("two_ranks")
    for f in ("bs16-TP-0.trace.json.gz", "bs16-TP-1.trace.json.gz"):
        (two / f).symlink_to(four / f)
    sets = {k: cross_rank(analyse_files(expand_traces([p]))) for k, p in (("four", four), ("two", two))}
    return four, two, sets, {k: json.loads(json.dumps(to_dict(cr.report()))) for k, cr in sets.items()}


@pytest.mark.slow
def test_rank_directories_diff_as_sets(rank_sets):
    four, two, _, runs = rank_sets
    r = CliRunner().invoke(cli, ["diff", str(four), str(two), "--fail-on-regression", "3%", "--format", "json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["base"] == runs["four"] and d["new"] == runs["two"]  # each side: its `breakdown DIR` report
    cr = d["cross_rank"]
    for side, run in (("base", runs["four"]), ("new", runs["two"])):
        x = run["cross_rank"]
        assert cr["ranks"][side] == x["ranks"] == len(run["ranks"])
        assert cr["skew_ms"][side] == x["skew_ms"] and cr["transfer_ms"][side] == x["transfer_ms"]
        assert cr["max_wait_ms"][side] == max(x["wait_ms_by_rank"])
        assert cr["slowest_rank"][side] == x["slowest_rank"] and cr["pacing_rank"][side] == x["pacing_rank"]
        assert cr["step_ms_by_rank"][side] == x["step_ms_by_rank"]
        # the set's step is its slowest rank's; its per-step split the mean over its ranks (per GPU)
        assert cr["step_ms"][side] == max(x["step_ms_by_rank"]) == d["delta"]["steps"]["mean_ms"][side]
        for k, c in d["delta"]["per_step_ms"].items():
            assert c[side] == pytest.approx(sum(rk["per_step_ms"][k] for rk in run["ranks"]) / len(run["ranks"]))
    assert cr["ranks"]["abs"] == -2
    assert any(w.startswith("BASE has 4 rank(s), NEW 2: per-step figures and kernels are per GPU")
               for w in d["delta"]["warnings"])
    # kernels: means over the ranks, adding up to the kernel-time delta
    ks = d["kernels"]
    assert sum(k["delta_ms_per_step"] for k in ks) == pytest.approx(d["delta"]["kernel_total_ms_per_step"]["abs"],
                                                                     abs=1e-9)
    comm = sum(k["base_ms_per_step"] for k in ks if k["category"] == "communication")
    assert comm == pytest.approx(sum(rk["kernel_ms_per_step"]["communication"] for rk in runs["four"]["ranks"]) / 4)
    # the gate compares the sets' steps: the slowest ranks' traced steps (no manifest)
    g = d["gate"]
    assert g["basis"] == "traced" and g["steps"] == {"base": 7, "new": 7} and not g["failed"]
    md_text = diff_md(d)
    assert "| across ranks (ms per step) | base | new | Δ |" in md_text and "| ranks | 4 | 2 | −2 |" in md_text
    assert "- base rank 3: " in md_text and "- new rank 1: " in md_text


def test_a_rank_set_against_itself_is_zero(rank_sets):
    _, _, sets, runs = rank_sets
    d = diff(sets["two"], sets["two"], fail_on_regression=0.0).to_dict()
    assert all(c["abs"] == 0 for c in d["delta"]["per_step_ms"].values())
    assert all(k["delta_ms_per_step"] == 0 for k in d["kernels"])
    assert all(d["cross_rank"][k]["abs"] == 0 for k in ("ranks", "skew_ms", "transfer_ms", "max_wait_ms"))
    assert d["gate"]["change_pct"] == 0 and d["gate"]["failed"] is False
    assert d["base"]["cross_rank"] == runs["two"]["cross_rank"]


def test_a_directory_of_one_trace_is_that_trace():
    graph = sample_trace("hf-small-graph")
    by_dir = json.loads(CliRunner().invoke(cli, ["diff", str(graph.parent), str(graph), "--format", "json"]).stdout)
    assert "cross_rank" not in by_dir and by_dir["delta"]["steps"]["mean_ms"]["abs"] == 0

# ───────────────────────── per-kernel deltas (formerly test_diff_kernels.py)
# tracekit diff's per-kernel deltas (``kernels``, ``kernel_categories``, ``delta.kernel_total_ms_per_step``): which
# kernels moved, largest first, adding up to the kernel-time delta; checked against raw SQL on the committed H200
# captures.

_CACHE: dict = {}


def bd(name: str):
    if name not in _CACHE:
        _CACHE[name] = tracekit.breakdown(tracekit.load(sample_trace(name)))
    return _CACHE[name]


def adds_up(d: dict) -> None:
    """The contract's sums: the kernels' deltas add up to the kernel-time delta, per category and in total."""
    ks = d["kernels"]
    assert sum(k["delta_ms_per_step"] for k in ks) == pytest.approx(d["delta"]["kernel_total_ms_per_step"]["abs"],
                                                                     abs=1e-9)
    for cat, c in d["delta"]["kernel_ms_per_step"].items():
        if c["abs"] is not None:
            assert sum(k["delta_ms_per_step"] for k in ks if k["category"] == cat) == pytest.approx(c["abs"], abs=1e-9)
    for k in ks:
        assert k["delta_ms_per_step"] == pytest.approx(k["new_ms_per_step"] - k["base_ms_per_step"], abs=1e-12)
    deltas = [abs(k["delta_ms_per_step"]) for k in ks]
    assert deltas == sorted(deltas, reverse=True)  # largest change first


def test_an_added_kernel_is_the_largest_mover():
    """The same session's synthetic graph loop without and with a symmetric-memory one-shot all-reduce per layer (32
    per step): the all-reduce kernel is new, and first; its time per step is 32 x its mean duration by SQL."""
    d = diff(bd("tp1-synthetic-nccl-graph"), bd("tp1-synthetic-symm1-graph")).to_dict()
    adds_up(d)
    top = d["kernels"][0]
    assert top["name"].startswith("void <unnamed>::one_shot_all_reduce_kernel<c10::BFloat16")
    assert top["category"] == "communication" and top["base_ms_per_step"] == 0.0
    [(n, mean_ns)] = sql_rows(sample_sqlite("tp1-synthetic-symm1-graph"),
                              "SELECT COUNT(*), AVG(k.end - k.start) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s "
                              "ON s.id = k.demangledName WHERE s.value LIKE '%one_shot_all_reduce_kernel%'")
    assert n == 512 == 32 * 16  # 32 per step, 16 profiled steps
    assert top["new_ms_per_step"] == pytest.approx(32 * mean_ns / 1e6, rel=0.005)
    # its copy-in (a device-to-device copy per all-reduce) is second
    assert d["kernels"][1]["name"] == "[CUDA memcpy Device-to-Device]" and d["kernels"][1]["category"] == "memory"
    # the categories that moved: communication first, then memory
    cats = d["kernel_categories"]
    assert [c["category"] for c in cats[:2]] == ["communication", "memory"]
    assert cats[0]["delta_ms_per_step"] == pytest.approx(top["delta_ms_per_step"], abs=1e-9)
    assert {c["category"] for c in cats} == set(d["delta"]["kernel_ms_per_step"])


def test_rows_are_the_breakdowns_own_kernel_tables():
    b, n = bd("hf-small-graph"), bd("hf-small-eager")
    d = diff(b, n).to_dict()
    adds_up(d)
    for side, x in (("base", b), ("new", n)):
        mine = {(k["name"], k["category"]): k[f"{side}_ms_per_step"] for k in d["kernels"]
                if k[f"{side}_ms_per_step"]}
        theirs = {(r["name"], r["category"]): r["per_step_ms"] for r in x.top_kernels.iter_rows(named=True)}
        assert mine == theirs
    assert d["delta"]["kernel_total_ms_per_step"]["base"] == pytest.approx(
        sum(v for v in b.kernel_ms_per_step.values() if v is not None), abs=1e-12)


def test_one_name_in_two_categories_is_two_rows():
    """spec-small-graph: the same elementwise kernels run in the draft model (drafting) and in the target (other);
    each (name, category) is its own row, so the category sums hold."""
    d = diff(bd("spec-small-graph"), bd("spec-small-graph-nomark")).to_dict()
    adds_up(d)
    names = pl.DataFrame(d["kernels"]).group_by("name").agg(pl.col("category").n_unique().alias("n"))
    assert names.filter(pl.col("n") > 1).height > 0
    self_diff = diff(bd("spec-small-graph"), bd("spec-small-graph")).to_dict()
    assert all(k["delta_ms_per_step"] == 0 for k in self_diff["kernels"])
    assert len(self_diff["kernels"]) == bd("spec-small-graph").top_kernels.height


def test_whole_graph_side_only_its_copies():
    """A whole-graph capture has no per-kernel rows (its compute categories are null): its kernels are its copies,
    and the sum still holds against the categories it knows."""
    d = diff(bd("hf-small-graph"), bd("hf-small-graph-wholegraph")).to_dict()
    adds_up(d)
    assert {k["category"] for k in d["kernels"] if k["new_ms_per_step"]} == {"memory"}
    unknown = [c for c in d["kernel_categories"] if c["delta_ms_per_step"] is None]
    assert {c["category"] for c in unknown} == {"gemm", "attention", "communication", "drafting", "other"}
    assert d["kernel_categories"][-len(unknown):] == unknown  # unknown changes last


def test_markdown_and_table_show_the_top_movers():
    a, b = sample_trace("tp1-synthetic-nccl-graph"), sample_trace("tp1-synthetic-symm1-graph")
    r = CliRunner().invoke(cli, ["diff", str(a), str(b), "--format", "md"])
    assert r.exit_code == 0, r.output
    text = r.stdout
    d = json.loads(CliRunner().invoke(cli, ["diff", str(a), str(b), "--format", "json"]).stdout)
    tot = d["delta"]["kernel_total_ms_per_step"]["abs"]
    assert f"kernel time +{tot:.3f} ms per step (+18%): communication +0.129, memory +0.032, gemm +0.006" in text
    moved = [k for k in d["kernels"] if round(k["delta_ms_per_step"], 6) != 0][:10]
    assert f"**kernels that moved** (top {len(moved)} of {len(d['kernels'])}; ms per step)" in text
    row = next(line for line in text.splitlines() if "one\\_shot\\_all\\_reduce\\_kernel" in line)
    assert row.startswith("| void &lt;unnamed&gt;::one\\_shot\\_all\\_reduce\\_kernel&lt;c10::BFloat16")
    assert row.endswith("| communication | 0.000 | 0.129 | +0.129 |")
    table = CliRunner().invoke(cli, ["diff", str(a), str(b)]).stdout
    assert f"kernels that moved (top {len(moved)} of" in table and "one_shot_all_reduce_kernel" in table

# ───────────────────────── diff per token (formerly test_diff_per_token.py)
# ``tracekit diff`` per token (issue 51 item 1, contract "diff per token"): when the two sides emit different tokens
# per step (accept length x batch), ms per token and tok/s on both sides, and the headline and the gate compare per
# token; a speculative side without an accept length is named and gets no per-step verdict.
#
# Real pairs from sample_traces/: a plain and a speculative capture of the same target (hf small, CUDA graphs: the
# spec capture drafts K = 3 with a 2-layer draft model), zoo shapes of different batches and accept lengths, and a
# zoo shape against the plain step its own manifest measured. Every expected figure comes from the manifests
# (``unprofiled_step_ms``, ``unprofiled_plain_step_ms``, ``spec.accept_len``, ``tokens_per_step``), computed here.

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

# ───────────────────────── the CI gate (--fail-on-regression) (formerly test_diff_gate.py)
# tracekit diff --fail-on-regression: the CI gate (exit 3, the ``gate`` block), its noise model and the validation pairs
# of docs/validation.md ("The diff gate on real pairs"), on the committed H200 captures; and the same GPU on both
# sides by default (issue 44 item 5, the nsys-ai MFU pair).
#
# Every ``change_pct`` below is checked against the unprofiled steps in the two manifests (measured by the capture,
# independently of the trace); the exit codes are the validation's expected verdicts.

MFU_BEFORE = DATA / "nsys" / "nsysai_mfu_2gpu_before_2026.2.sqlite"
MFU_AFTER = DATA / "nsys" / "nsysai_mfu_2gpu_after_2026.2.sqlite"


def unprofiled(name: str) -> float:
    return json.loads((sample_trace(name).parent / "manifest.json").read_text())["unprofiled_step_ms"]


# (base, new, expected exit): the validation set of docs/validation.md. Known changes: graph → eager (the same loop
# without CUDA graphs) and an added kernel (32 / 48 symmetric-memory all-reduce kernels per step in the same session's
# capture of the same loop) must fail; their reverses pass. Same GPU work captured in another process (NVTX-marked
# against unmarked twins; world-size-1 NCCL, which launches no kernel, against the plain loop) must pass.
EAGER_VS_GRAPH = ["hf-small", "hf-large", "synthetic", "spec-small", "spec-large", "serve-small"]
SLOWER_KERNEL = [("tp1-synthetic-nccl-graph", "tp1-synthetic-symm1-graph"),
                 ("tp1-hf-small-nccl-graph", "tp1-hf-small-symm1-graph")]
SAME_WORK = [("spec-small-graph", "spec-small-graph-nomark"), ("spec-large-graph", "spec-large-graph-nomark"),
             ("serve-small-graph", "serve-small-graph-nomark"), ("synthetic-graph", "tp1-synthetic-nccl-graph"),
             ("hf-small-graph", "tp1-hf-small-nccl-graph")]
PAIRS = ([(f"{w}-graph", f"{w}-eager", 3) for w in EAGER_VS_GRAPH] + [(f"{w}-eager", f"{w}-graph", 0)
                                                                       for w in EAGER_VS_GRAPH]
         + [(a, b, 3) for a, b in SLOWER_KERNEL] + [(b, a, 0) for a, b in SLOWER_KERNEL]
         + [(a, b, 0) for a, b in SAME_WORK] + [(b, a, 0) for a, b in SAME_WORK])


@pytest.mark.parametrize("base,new,exit_code", PAIRS, ids=[f"{a}->{b}" for a, b, _ in PAIRS])
@pytest.mark.slow
def test_the_validation_pairs(base, new, exit_code):
    """Known changes fail (3), their reverses pass (0); the same work in another process never fails: it passes, or
    (above the threshold, the two clocks of the pair disagreeing) is inconclusive (4)."""
    d = diff(bd(base), bd(new), fail_on_regression=3.0)
    g = d.gate
    # what is compared: the two manifests' unprofiled steps (both sides have one; these H200 manifests hold no
    # per-step unprofiled times, so the noise is the traced steps')
    assert g.basis == "unprofiled" and g.statistic == "median" and g.method == "bootstrap"
    assert g.change_pct == pytest.approx(100 * (unprofiled(new) / unprofiled(base) - 1), rel=1e-9)
    assert g.failed is (exit_code == 3) and (g.verdict == "fail") is g.failed
    if exit_code == 0 and (base, new) not in [*SAME_WORK, *[(b, a) for a, b in SAME_WORK]]:
        assert g.verdict == "pass"
    if g.verdict == "inconclusive":  # above the threshold, the interval includes no change
        assert g.change_pct > 3 and g.ci_pct[0] <= 0 and d.exit_code == 4
    lo, hi = g.ci_pct
    # the interval covers the reference change and the traced steps' own change (the noise of both clocks)
    assert lo <= min(g.change_pct, g.traced_change_pct) and hi >= max(g.change_pct, g.traced_change_pct)
    if exit_code == 3:
        assert g.change_pct > 3 and lo > 0 and g.reason.startswith("NEW's unprofiled step is ")
        assert "beyond the step noise" in g.reason


def test_same_work_above_the_threshold_is_held_back_by_the_traced_steps():
    """serve-small-graph against its unmarked twin: the unprofiled step is 6.7% slower (2.710 → 2.891 ms, two processes;
    their 40 timed steps do not even overlap), but the same runs' traced steps are 4.6% *faster*: the two clocks of
    one pair of runs disagree by more than their step noise, so the change is not beyond the noise."""
    g = diff(bd("serve-small-graph"), bd("serve-small-graph-nomark"), fail_on_regression=3.0).gate
    assert round(unprofiled("serve-small-graph"), 3) == 2.710 and round(unprofiled("serve-small-graph-nomark"), 3) == 2.891
    assert g.change_pct == pytest.approx(6.67, abs=0.01) and not g.failed
    # above the threshold, not beyond the noise: the gate cannot tell (exit 4), not a pass (issue 51 item 2)
    assert g.verdict == "inconclusive" and "not beyond the step noise" in g.reason
    # the traced medians, by hand from the per-step periods
    med = [statistics.median(bd(n).per_step["period_ms"].to_list()) for n in ("serve-small-graph",
                                                                              "serve-small-graph-nomark")]
    assert g.traced_change_pct == pytest.approx(100 * (med[1] / med[0] - 1), rel=1e-9) and g.traced_change_pct < -4
    assert g.ci_pct[0] < 0 < g.ci_pct[1]
    assert "above the 3% threshold but not beyond the step noise" in g.reason
    assert "the traced steps' median changed -4.6%" in g.reason


def test_the_interval_is_the_traced_bootstrap_scaled_to_the_reference_and_widened():
    """By hand: the bootstrap of the traced medians' ratio, its ends scaled by (reference ratio / traced ratio),
    and the hull of the scaled and the unscaled interval."""
    b, n = bd("tp1-hf-small-nccl-graph"), bd("tp1-hf-small-symm1-graph")
    pb, pn = b.per_step["period_ms"].to_list(), n.per_step["period_ms"].to_list()
    lo, hi = bootstrap_ratio(pb, pn, "median")
    traced = statistics.median(pn) / statistics.median(pb)
    ref = unprofiled("tp1-hf-small-symm1-graph") / unprofiled("tp1-hf-small-nccl-graph")
    g = gate(b, n, 3.0)
    want = (100 * (min(lo, lo * ref / traced) - 1), 100 * (max(hi, hi * ref / traced) - 1))
    assert g.ci_pct == pytest.approx(want, rel=1e-12)
    assert g.traced_ci_pct == pytest.approx((100 * (lo - 1), 100 * (hi - 1)), rel=1e-12)
    assert g.steps.to_dict() == {"base": len(pb), "new": len(pn)} and g.resamples == GATE_RESAMPLES and g.seed == 0
    assert "bootstrap of the ratio of the traced steps' medians (15 BASE and 15 NEW steps, 4000 resamples, seed 0, " \
           "95% percentile interval), scaled to the unprofiled reference steps" in g.noise_basis


def test_the_bootstrap_is_deterministic_and_agrees_with_the_normal_theory():
    # synthetic samples (labelled: a check of the statistics alone): two normal samples, means 10 and 11, sd 0.5
    import random

    rng = random.Random(1)
    a = [rng.gauss(10, 0.5) for _ in range(40)]
    c = [rng.gauss(11, 0.5) for _ in range(40)]
    one, two = bootstrap_ratio(a, c, "mean"), bootstrap_ratio(a, c, "mean")
    assert one == two  # fixed seed: the same interval every time
    other = bootstrap_ratio(a, c, "mean", seed=7)
    assert other != one and other == pytest.approx(one, abs=0.003)
    # the delta method's 95% interval of the ratio of means
    ma, mc = statistics.fmean(a), statistics.fmean(c)
    se = ((statistics.stdev(a) / ma) ** 2 / len(a) + (statistics.stdev(c) / mc) ** 2 / len(c)) ** 0.5
    r = mc / ma
    assert one[0] == pytest.approx(r * (1 - 1.96 * se), abs=0.004) and one[1] == pytest.approx(r * (1 + 1.96 * se),
                                                                                               abs=0.004)


@pytest.mark.slow
def test_traced_steps_only_compare_their_means():
    """The nsys-ai MFU pair (no manifest): the traced mean steps are the reference, their means bootstrapped."""
    d = CliRunner().invoke(cli, ["diff", str(MFU_BEFORE), str(MFU_AFTER), "--fail-on-regression", "3%",
                                 "--format", "json"])
    assert d.exit_code == 3, d.output
    out = json.loads(d.stdout)
    g = out["gate"]
    assert (g["basis"], g["statistic"], g["method"]) == ("traced", "mean", "bootstrap")
    means = [statistics.fmean(tracekit_periods(p)) for p in (MFU_BEFORE, MFU_AFTER)]  # (both on GPU 0)
    assert out["base"]["steps"]["mean_ms"] == pytest.approx(means[0]) and out["new"]["steps"]["mean_ms"] == \
        pytest.approx(means[1])
    assert g["change_pct"] == pytest.approx(100 * (means[1] / means[0] - 1), rel=1e-9)
    assert g["change_pct"] == pytest.approx(15.0, abs=0.05) and g["ci_pct"][0] > 3 and g["failed"] is True
    assert g["traced_change_pct"] == g["change_pct"] and g["traced_ci_pct"] == g["ci_pct"]
    assert set(g) >= {"threshold_pct", "change_pct", "ci_pct", "noise_basis", "failed"}
    assert g["threshold_pct"] == 3.0


def tracekit_periods(path):
    return tracekit.breakdown(tracekit.load(path), device=0).per_step["period_ms"].to_list()


@pytest.mark.slow
def test_exit_3_writes_the_output_in_full(tmp_path):
    graph, eager = sample_trace("hf-small-graph"), sample_trace("hf-small-eager")
    out = tmp_path / "gate.json"
    r = CliRunner().invoke(cli, ["diff", str(graph), str(eager), "--fail-on-regression", "3%", "--format", "json",
                                 "-o", str(out)])
    assert r.exit_code == 3 and r.output == ""
    d = json.loads(out.read_text())
    assert d["gate"]["failed"] is True and d["kernels"] and d["delta"]["per_step_ms"]
    assert list(d)[:4] == ["schema", "base", "new", "delta"] and list(d)[-1] == "gate"
    # the reverse passes: exit 0, the same keys
    r = CliRunner().invoke(cli, ["diff", str(eager), str(graph), "--fail-on-regression", "3", "--format", "json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["gate"]["failed"] is False
    # without the flag: no gate key, exit 0 whatever changed
    r = CliRunner().invoke(cli, ["diff", str(graph), str(eager), "--format", "json"])
    assert r.exit_code == 0 and "gate" not in json.loads(r.stdout)


@pytest.mark.slow
def test_markdown_leads_with_the_verdict_and_folds_the_rest():
    graph, eager = sample_trace("hf-small-graph"), sample_trace("hf-small-eager")
    r = CliRunner().invoke(cli, ["diff", str(graph), str(eager), "--fail-on-regression", "3%", "--format", "md"])
    assert r.exit_code == 3
    lines = r.stdout.splitlines()
    man = (unprofiled("hf-small-graph"), unprofiled("hf-small-eager"))
    pct = 100 * (man[1] / man[0] - 1)
    assert lines[0].startswith(f"### ❌ perf gate failed: unprofiled step +{pct:,.1f}% (threshold 3%, 95% interval +")
    assert lines[2] == (f"NEW's unprofiled step is {pct:,.1f}% slower than BASE's ({man[0]:.3f} → {man[1]:.3f} ms): "
                        "above the 3% threshold, beyond the step noise (95% interval " + lines[2].split("interval ")[1])
    assert lines[4].startswith("<details><summary>tracekit diff: unprofiled step 2.822 → 36.670 ms (+1,200%)")
    assert lines[-1] == "</details>" and r.stdout.count("<details>") == 2  # the body's own details nest inside
    assert "launch_gaps" in lines[4] and "launch\\_gaps" not in lines[4]  # (HTML, not markdown, in a summary)
    r = CliRunner().invoke(cli, ["diff", str(eager), str(graph), "--fail-on-regression", "3%", "--format", "md"])
    assert r.exit_code == 0
    assert r.stdout.startswith("### ✅ perf gate passed: unprofiled step −92.3% (threshold 3%")
    assert r.stdout.splitlines()[2].startswith("NEW's unprofiled step is not slower than BASE's (36.670 → 2.822 ms, ")
    # the table leads with the verdict too
    r = CliRunner().invoke(cli, ["diff", str(graph), str(eager), "--fail-on-regression", "3%"])
    assert r.exit_code == 3 and r.stdout.startswith("perf gate failed: unprofiled step +")


def test_too_few_steps_no_noise_estimate_the_threshold_decides():
    # TraceLens' SGLang decode window holds one step: no spread to tell noise from
    from conftest import shared

    one = shared("TraceLens/tests/traces/inference/sglang_decode/sglang_Qwen3-8B_decode.json.gz")
    r = CliRunner().invoke(cli, ["diff", str(one), str(MFU_BEFORE), "--fail-on-regression", "3%", "--format", "json"])
    g = json.loads(r.stdout)["gate"]
    # above the threshold without a noise estimate: inconclusive, exit 4 (it was a failure before issue 51)
    assert r.exit_code == 4 and g["ci_pct"] is None and g["method"] == "none" and g["failed"] is False
    assert g["verdict"] == "inconclusive" and g["change_pct"] > 3
    assert g["noise_basis"].startswith("none: fewer than 3 steps on a side (1 BASE and 15 NEW steps)")
    assert "too few steps on a side to tell it from noise" in g["reason"]
    r = CliRunner().invoke(cli, ["diff", str(one), str(MFU_BEFORE), "--fail-on-regression", "3%"])
    assert r.exit_code == 4 and r.stdout.startswith("perf gate inconclusive: traced step +")


def test_a_saved_breakdown_gets_the_normal_approximation(tmp_path):
    """A saved breakdown keeps no per-step times: its noise comes from its p10-p90 spread and count; on the
    slower-kernel pair it agrees with the bootstrap within a few points and gives the same verdict."""
    base, new = sample_trace("tp1-hf-small-nccl-graph"), sample_trace("tp1-hf-small-symm1-graph")
    saved = tmp_path / "base.json"
    assert CliRunner().invoke(cli, ["breakdown", str(base), "--format", "json", "-o", str(saved)]).exit_code == 0
    live = gate(bd("tp1-hf-small-nccl-graph"), bd("tp1-hf-small-symm1-graph"), 3.0)
    g = gate(read_saved(saved), bd("tp1-hf-small-symm1-graph"), 3.0)
    assert g.method == "normal" and g.resamples is None and "normal approximation" in g.noise_basis
    assert g.change_pct == pytest.approx(live.change_pct, rel=1e-12) and g.failed and live.failed
    assert g.ci_pct == pytest.approx(live.ci_pct, abs=3.0)
    r = CliRunner().invoke(cli, ["diff", str(saved), str(new), "--fail-on-regression", "3%", "--format", "json"])
    assert r.exit_code == 3 and json.loads(r.stdout)["gate"]["method"] == "normal"


def test_one_unprofiled_one_traced_compares_the_traced_steps():
    graph = sample_trace("hf-small-graph")
    r = CliRunner().invoke(cli, ["diff", str(MFU_BEFORE), str(graph), "--fail-on-regression", "3%", "--format", "json"])
    d = json.loads(r.stdout)
    g = d["gate"]
    assert d["delta"]["reference_step_ms"]["basis"] == "mixed" and g["basis"] == "traced" and r.exit_code == 0
    assert g["change_pct"] == pytest.approx(100 * (d["new"]["steps"]["mean_ms"] / d["base"]["steps"]["mean_ms"] - 1))
    assert g["reason"].startswith("the reference steps are of different kinds (one unprofiled, one traced): the traced "
                                  "steps compared; NEW's traced mean step is not slower")


@pytest.mark.parametrize("text", ["-1%", "abc", "3%%", "inf"])
def test_a_bad_threshold_is_a_usage_error(text):
    r = CliRunner().invoke(cli, ["diff", str(MFU_BEFORE), str(MFU_AFTER), "--fail-on-regression", text])
    assert r.exit_code == 2 and r.output.count("\n") == 1
    assert r.output.startswith(f"tracekit: error: --fail-on-regression {text}: a percentage >= 0, e.g. 3%")


def test_threshold_parsing():
    assert [parse_threshold(x) for x in ("3%", "3", " 0.5% ", 10)] == [3.0, 3.0, 0.5, 10.0]


# ───────────────────────── the same GPU on both sides (issue 44 item 5) ─────────────────────────

def busiest(path) -> int:
    rows = sql_rows(path, "SELECT deviceId, SUM(end - start) AS t FROM CUPTI_ACTIVITY_KIND_KERNEL GROUP BY deviceId "
                          "ORDER BY t DESC")
    return rows[0][0]


@pytest.mark.slow
def test_the_same_device_on_both_sides_by_default():
    """nsys-ai's two-GPU MFU pair: GPU 0 is the busiest of `before`, GPU 1 of `after` (by SQL). Each side on its own
    busiest compared GPU 0 with GPU 1; the default now analyses BASE's GPU on both sides, as `--device 0` does."""
    assert (busiest(MFU_BEFORE), busiest(MFU_AFTER)) == (0, 1)
    run = lambda *a: json.loads(CliRunner().invoke(cli, ["diff", str(MFU_BEFORE), str(MFU_AFTER), *a,  # noqa: E731
                                                         "--format", "json"]).stdout)
    default, pinned = run(), run("--device", "0")
    assert default["base"]["gpu"]["device"] == default["new"]["gpu"]["device"] == 0
    assert default == pinned
    assert not any("different devices" in w for w in default["delta"]["warnings"])
    # each GPU of its own on each side, asked for: compared as asked, with the warning
    mixed = run("--base-device", "0", "--new-device", "1")
    assert (mixed["base"]["gpu"]["device"], mixed["new"]["gpu"]["device"]) == (0, 1)
    assert any(w.startswith("different devices analysed: base GPU 0, new GPU 1") for w in mixed["delta"]["warnings"])
    # --device applies to both sides, --new-device overrides it for NEW
    both = run("--device", "1", "--new-device", "0")
    assert (both["base"]["gpu"]["device"], both["new"]["gpu"]["device"]) == (1, 0)


def test_single_gpu_captures_on_different_device_numbers_pair_without_a_note():
    from tracekit.cli.diff import pair_devices

    t = tracekit.load(sample_trace("hf-small-graph"))  # one GPU, device 0
    assert pair_devices(0, t) == (0, [])
    assert pair_devices(3, t) == (0, [])  # BASE on GPU 3 of its host, NEW on GPU 0 of its own: nothing to choose
    two = tracekit.load(MFU_AFTER)
    assert pair_devices(1, two) == (1, [])
    dev, notes = pair_devices(5, two)
    assert dev == 1 and notes == ["NEW ran no work on GPU 5 (the one BASE was analysed on): NEW analyses its busiest, "
                                  "GPU 1 (pass --new-device N to pick another)"]


# ───────────────────────── the gate captures (capture/gate_captures.sh) ─────────────────────────
# SKIPPED UNTIL COMMITTED: these run once the integrator has run `bash capture/gate_captures.sh` on the GPU and
# unpacked its tarball into sample_traces/ (folders gate-graph-r1 .. gate-graph-rN, gate-graph-nomark,
# gate-graph-slow2048; see docs/validation.md, "The diff gate on real pairs").

def gate_capture(name: str):
    from conftest import SAMPLES

    if not (SAMPLES / name / "manifest.json").is_file():
        pytest.skip(f"gate captures not committed yet: sample_traces/{name} (run capture/gate_captures.sh on a GPU)")
    return name


def repeats() -> list[str]:
    from conftest import SAMPLES

    names = sorted(p.name for p in SAMPLES.glob("gate-graph-r*") if (p / "manifest.json").is_file())
    if len(names) < 2:
        pytest.skip("gate captures not committed yet: sample_traces/gate-graph-r* (run capture/gate_captures.sh)")
    return names


@pytest.mark.slow
def test_repeat_captures_of_one_configuration_pass():
    """Every ordered pair of the repeat captures (each its own process: N = 6 gives 30 pairs), and the unmarked twin
    against each, pass at 3%."""
    names = repeats() + [gate_capture("gate-graph-nomark")]
    for a in names:
        for b in names:
            if a != b:
                g = diff(bd(a), bd(b), fail_on_regression=3.0).gate
                assert g.change_pct == pytest.approx(100 * (unprofiled(b) / unprofiled(a) - 1), rel=1e-9)
                assert g.method == "unprofiled-bootstrap" and g.steps.to_dict() == {"base": 40, "new": 40}
                assert g.verdict == "pass", (a, b, g.reason)


def test_the_captured_slower_kernel_fails_and_its_reverse_passes():
    slow = gate_capture("gate-graph-slow2048")
    extra = 32 * 4096 * 2048 * 2  # one more bf16 GEMV of [4096, 2048] per layer, 32 layers
    for r in repeats():
        assert (json.loads((sample_trace(slow).parent / "manifest.json").read_text())["weight_bytes_per_step"]
                - json.loads((sample_trace(r).parent / "manifest.json").read_text())["weight_bytes_per_step"]) == extra
        d = diff(bd(r), bd(slow), fail_on_regression=3.0)
        assert d.gate.failed and d.exit_code == 3, d.gate.reason
        assert diff(bd(slow), bd(r), fail_on_regression=3.0).gate.verdict == "pass"
        # what moved: GEMM time, at least the extra bytes at the H100's peak bandwidth (3,350 GB/s: 0.160 ms; the
        # captures ran on an H100, sample_traces/gpu_gate.txt) and within 3x of it (measured 0.32 ms: a skinny
        # [4096, 2048] GEMV reads at about half of peak), and a GEMV kernel leads the movers
        gemm = d.delta.kernel_ms_per_step["gemm"].abs
        floor = extra / 3350e9 * 1e3
        assert floor <= gemm <= 3 * floor
        assert d.kernels[0].category == "gemm" and d.kernels[0].delta_ms_per_step > 0


# ───────────────────────── the manifests' unprofiled steps are the noise (issue 51 item 2) ─────────────────────────

def periods(name: str) -> list[float]:
    return json.loads((sample_trace(name).parent / "manifest.json").read_text())["unprofiled"]["periods_ms"]


def test_noisy_traced_steps_no_longer_pass_a_measured_regression():
    """The issue's defect: gate-graph-nomark → gate-graph-slow512 passed ("+24.0%") because the base's traced steps
    are noisy (their interval −3.5% to +33.3%), although both manifests timed 40 steps without a profiler: 1.120 →
    1.389 ms, and no step of the one is as slow as any step of the other. Now those steps are the noise: it fails."""
    base, new = gate_capture("gate-graph-nomark"), gate_capture("gate-graph-slow512")
    pb, pn = periods(base), periods(new)
    assert len(pb) == len(pn) == 40 and max(pb) < min(pn)  # (by hand: the two runs' unprofiled steps do not overlap)
    r = CliRunner().invoke(cli, ["diff", str(sample_trace(base).parent), str(sample_trace(new).parent),
                                 "--fail-on-regression", "3%", "--format", "json"])
    assert r.exit_code == 3, r.output
    g = json.loads(r.stdout)["gate"]
    assert g["verdict"] == "fail" and g["failed"] is True and g["method"] == "unprofiled-bootstrap"
    assert g["change_pct"] == pytest.approx(100 * (statistics.median(pn) / statistics.median(pb) - 1), rel=1e-6)
    assert round(g["change_pct"], 1) == 24.0 and g["steps"] == {"base": 40, "new": 40}
    # the interval, by hand: the bootstrap of the unprofiled medians' ratio, widened to the traced medians' change
    lo, hi = bootstrap_ratio(pb, pn, "median")
    traced = [statistics.median(bd(x).per_step["period_ms"].to_list()) for x in (base, new)]
    t = traced[1] / traced[0]
    assert g["ci_pct"] == pytest.approx([100 * (min(lo, t) - 1), 100 * (max(hi, t) - 1)], rel=1e-9)
    assert g["ci_pct"][0] > 0 and "unprofiled.periods_ms: 40 BASE and 40 NEW steps" in g["noise_basis"]
    # the traced steps alone could not tell (the old answer's interval)
    assert g["traced_ci_pct"][0] < 0 < g["traced_ci_pct"][1]
    r = CliRunner().invoke(cli, ["diff", str(sample_trace(base)), str(sample_trace(new)), "--fail-on-regression", "3%"])
    assert r.exit_code == 3 and r.stdout.startswith("perf gate failed: unprofiled step +24.0% (threshold 3%")


@pytest.mark.slow
def test_a_quarter_of_the_gemv_fails_from_every_repeat_and_the_twin():
    slow = gate_capture("gate-graph-slow512")
    for r in [*repeats(), gate_capture("gate-graph-nomark")]:
        g = diff(bd(r), bd(slow), fail_on_regression=3.0).gate
        assert g.verdict == "fail" and g.method == "unprofiled-bootstrap", (r, g.reason)
        assert g.change_pct == pytest.approx(100 * (unprofiled(slow) / unprofiled(r) - 1), rel=1e-9)
        assert diff(bd(slow), bd(r), fail_on_regression=3.0).gate.verdict == "pass"


def test_clocks_that_disagree_are_inconclusive():
    """The eager repeats (host-bound steps, two processes at different speeds): r2 → r1 is +7.0% unprofiled (each
    run's 40 unprofiled steps tightly around its median) but the same runs' traced steps moved −5.3%: the gate cannot
    tell a slower build from a slower process (exit 4); the reverse is faster on the unprofiled clock and passes."""
    a, b = gate_capture("gate-eager-r2"), gate_capture("gate-eager-r1")
    d = diff(bd(a), bd(b), fail_on_regression=3.0)
    g = d.gate
    assert g.change_pct == pytest.approx(100 * (unprofiled(b) / unprofiled(a) - 1), rel=1e-9) and g.change_pct > 6
    traced = [statistics.median(bd(x).per_step["period_ms"].to_list()) for x in (a, b)]
    assert g.traced_change_pct == pytest.approx(100 * (traced[1] / traced[0] - 1), rel=1e-9)
    assert g.traced_change_pct < 0
    assert g.verdict == "inconclusive" and d.exit_code == 4 and g.ci_pct[0] == pytest.approx(g.traced_change_pct)
    assert "not beyond the step noise" in g.reason
    assert diff(bd(b), bd(a), fail_on_regression=3.0).gate.verdict == "pass"


def test_a_flag_s_unprofiled_step_has_no_spread_of_its_own():
    """--new-measured-step-ms replaces the manifest's step: its periods no longer describe it, so the traced steps'
    noise is used (method bootstrap), as for a manifest without periods."""
    base, new = sample_trace(gate_capture("gate-graph-r1")), sample_trace(gate_capture("gate-graph-slow512"))
    r = CliRunner().invoke(cli, ["diff", str(base), str(new), "--new-measured-step-ms", "1.2", "--fail-on-regression",
                                 "3%", "--format", "json"])
    g = json.loads(r.stdout)["gate"]
    assert g["method"] == "bootstrap" and g["change_pct"] == pytest.approx(100 * (1.2 / unprofiled("gate-graph-r1")
                                                                                   - 1), rel=1e-9)
    assert r.exit_code == {"fail": 3, "inconclusive": 4, "pass": 0}[g["verdict"]]
