"""The example CI workflow (examples/ci/perf-gate.yml) run locally: its shell steps that call tracekit, executed as
GitHub Actions executes them (`bash --noprofile --norc -eo pipefail`), against the committed sample traces; and the
project's own test workflow (.github/workflows/tests.yml) runs .ci/run.

The comment step talks to GitHub through `gh api`; here a stand-in `gh` (a small script, labelled as such below)
keeps the pull request's comments in a JSON file, and the real `jq` evaluates the step's `--jq` filter, so what is
tested is the step's own logic: one comment, found again by its hidden marker and updated, never a second one.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, sample_trace

yaml = pytest.importorskip("yaml")

WORKFLOW = ROOT / "examples" / "ci" / "perf-gate.yml"
MARKER = "<!-- tracekit-perf-gate -->"


def workflow() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())


def step(name: str) -> dict:
    return next(s for s in workflow()["jobs"]["gate"]["steps"] if s.get("name") == name)


def run_step(s: dict, cwd: Path, env: dict) -> subprocess.CompletedProcess:
    """A workflow step's `run:` block as GitHub runs it: bash -eo pipefail, the workflow's and the step's `env`
    (expressions `${{ ... }}` replaced by the values the test gives), in ``cwd``."""
    full = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    for k, v in {**workflow()["env"], **(s.get("env") or {})}.items():
        full[k] = str(v)
    full.update(env)
    assert "${{" not in s["run"]  # no expression inside a script: values reach it through env (no injection)
    script = cwd / "step.sh"
    script.write_text(s["run"])
    return subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)], cwd=cwd, env=full,
                          capture_output=True, text=True, timeout=300)


def gate_env(tmp_path: Path, base: Path, head: Path) -> dict:
    summary, output = tmp_path / "summary.md", tmp_path / "output.txt"
    summary.write_text("")
    output.write_text("")
    return {"BASE_TRACE": str(base), "HEAD_TRACE": str(head), "GITHUB_STEP_SUMMARY": str(summary),
            "GITHUB_OUTPUT": str(output)}


def test_the_steps_that_call_tracekit_are_the_gate():
    calls = [s for job in workflow()["jobs"].values() for s in job["steps"] if "tracekit " in (s.get("run") or "")]
    assert [s["name"] for s in calls] == ["Capture the head build's decode trace", "Gate"]
    assert "tracekit diff \"$BASE_TRACE\" \"$HEAD_TRACE\" --fail-on-regression \"$THRESHOLD\" --format md" in \
        step("Gate")["run"]
    assert workflow()["env"]["THRESHOLD"] == "3%"


def test_the_capture_step_is_a_valid_tracekit_capture_command():
    """The capture job runs on a GPU; here its command line is parsed by `tracekit capture`'s own options."""
    from tracekit.cli import cli

    line = next(ln for ln in step_of("capture", "Capture the head build's decode trace")["run"].splitlines()
                if ln.strip().startswith("tracekit capture"))
    args = line.split()[2:]
    cmd = cli.commands["capture"]
    ctx = cmd.make_context("capture", list(args), resilient_parsing=False)
    assert ctx.params["workload"] == "synthetic" and ctx.params["mode"] == "graph" and ctx.params["profiler"] == "nsys"


def step_of(job: str, name: str) -> dict:
    return next(s for s in workflow()["jobs"][job]["steps"] if s.get("name") == name)


@pytest.mark.parametrize("base,head,status,verdict,job", [
    ("hf-small-graph", "hf-small-eager", 3, "### ❌ perf gate failed: unprofiled step +", None),
    ("hf-small-eager", "hf-small-graph", 0, "### ✅ perf gate passed: unprofiled step −92.3%", None),
    # same work in another process, +6.7% unprofiled but −4.6% traced: the gate cannot tell (exit 4)
    ("serve-small-graph", "serve-small-graph-nomark", 4, "### ⚠️ perf gate inconclusive: unprofiled step +6.7%", None),
    ("serve-small-graph", "serve-small-graph-nomark", 4, "### ⚠️ perf gate inconclusive: unprofiled step +6.7%", 0),
])
@pytest.mark.slow
def test_the_gate_step_exit_code_summary_and_comment(tmp_path, base, head, status, verdict, job):
    # the capture job's artifact is a capture folder (trace + manifest.json): a directory of one trace
    env = gate_env(tmp_path, sample_trace(base).parent, sample_trace(head).parent)
    if job is not None:
        env["INCONCLUSIVE"] = "pass"  # (the job passes an inconclusive gate; the summary still says so)
    r = run_step(step("Gate"), tmp_path, env)
    assert r.returncode == (status if job is None else job), r.stderr
    summary = Path(env["GITHUB_STEP_SUMMARY"]).read_text()
    assert summary.startswith(verdict) and "</details>" in summary
    assert summary == (tmp_path / "perf-gate.md").read_text()  # the whole markdown, as tracekit wrote it
    assert (tmp_path / "perf-gate-comment.md").read_text() == f"{MARKER}\n{summary}"
    assert Path(env["GITHUB_OUTPUT"]).read_text() == f"status={status}\n"


def test_the_gate_step_when_tracekit_cannot_run(tmp_path):
    env = gate_env(tmp_path, tmp_path / "missing.sqlite", sample_trace("hf-small-graph").parent)
    r = run_step(step("Gate"), tmp_path, env)
    assert r.returncode == 2
    summary = Path(env["GITHUB_STEP_SUMMARY"]).read_text()
    assert summary.startswith("### ⚠ perf gate could not run (tracekit exit 2)")
    assert re.search(r"^tracekit: error: .*missing\.sqlite", summary, re.M)
    assert Path(env["GITHUB_OUTPUT"]).read_text() == "status=2\n"


# A stand-in for GitHub's `gh` (test scaffolding, not GitHub): `gh api PATH [--paginate] [--jq F] [--method M]
# [-F body=@FILE]` against a JSON file of comments; --jq is evaluated by the real jq.
FAKE_GH = r'''#!/usr/bin/env python3
import json, os, re, subprocess, sys
store = os.environ["FAKE_GH_STORE"]
args = sys.argv[1:]
assert args[0] == "api", args
path, method, jq, body = None, "GET", None, None
i = 1
while i < len(args):
    a = args[i]
    if a == "--method": method = args[i + 1]; i += 2
    elif a == "--jq": jq = args[i + 1]; i += 2
    elif a == "-F": k, v = args[i + 1].split("=", 1); body = open(v[1:]).read() if v.startswith("@") else v; i += 2
    elif a == "--paginate": i += 1
    else: path = a; i += 1
comments = json.load(open(store))
with open(store + ".log", "a") as log:
    log.write(f"{method} {path}\n")
if method == "GET" and re.fullmatch(r"repos/[^/]+/[^/]+/issues/\d+/comments", path):
    out = json.dumps(comments)
    print(subprocess.run(["jq", "-r", jq], input=out, text=True, capture_output=True, check=True).stdout if jq else out,
          end="")
elif method == "POST":
    comments.append({"id": 100 + len(comments), "body": body})
elif method == "PATCH":
    cid = int(path.rsplit("/", 1)[1])
    for c in comments:
        if c["id"] == cid:
            c["body"] = body
else:
    sys.exit(f"unexpected: {args}")
json.dump(comments, open(store, "w"))
'''


@pytest.mark.skipif(shutil.which("jq") is None, reason="jq not installed (the stand-in gh evaluates --jq with it)")
def test_one_comment_posted_then_updated(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    gh = bin_dir / "gh"
    gh.write_text(FAKE_GH)
    gh.chmod(0o755)
    store = tmp_path / "comments.json"
    store.write_text(json.dumps([{"id": 1, "body": "LGTM"}]))
    env = {"FAKE_GH_STORE": str(store), "GITHUB_REPOSITORY": "acme/decoder", "PR": "7", "GH_TOKEN": "x",
           "PATH": f"{bin_dir}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    post = step("Post or update the pull-request comment")
    for text in ("first verdict\n", "second verdict\n"):
        (tmp_path / "perf-gate-comment.md").write_text(f"{MARKER}\n### perf gate: {text}")
        r = run_step(post, tmp_path, env)
        assert r.returncode == 0, r.stderr
        comments = json.loads(store.read_text())
        assert len(comments) == 2 and comments[0] == {"id": 1, "body": "LGTM"}  # one of ours, the others untouched
        assert comments[1]["body"] == f"{MARKER}\n### perf gate: {text}"
    assert (tmp_path / "comments.json.log").read_text().splitlines() == [
        "GET repos/acme/decoder/issues/7/comments", "POST repos/acme/decoder/issues/7/comments",
        "GET repos/acme/decoder/issues/7/comments", "PATCH repos/acme/decoder/issues/comments/101"]


def test_the_project_tests_workflow_runs_ci_run():
    wf = yaml.safe_load((ROOT / ".github" / "workflows" / "tests.yml").read_text())
    assert set(wf[True]) >= {"push", "pull_request"}  # (`on:` reads as True in YAML 1.1)
    steps = wf["jobs"]["tests"]["steps"]
    assert any(s.get("run") == "bash .ci/run" for s in steps)
    assert (ROOT / ".ci" / "run").is_file()
