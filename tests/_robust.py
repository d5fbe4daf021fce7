"""Shared checks of the robustness tests (conformance, fuzz, read-only, untrusted names, abstention).

``run_cli`` calls the real CLI in-process (``click.testing.CliRunner`` on ``tracekit.cli.cli``)
under a wall-clock alarm; ``assert_clean`` is the contract every input must meet:
exit 0, or exit 2 with exactly one ``tracekit: error:`` line, never a traceback.
"""

from __future__ import annotations

import contextlib
import json
import math
import signal

from click.testing import CliRunner

from tracekit.cli import cli


class Hang(BaseException):
    """Raised by the alarm; a BaseException so that the CLI's last-line ``except Exception`` cannot swallow it."""


@contextlib.contextmanager
def time_limit(seconds: float):
    if not hasattr(signal, "setitimer"):  # pragma: no cover - Windows
        yield
        return

    def on_alarm(signum, frame):
        raise Hang(f"no answer within {seconds} s")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def run_cli(args, timeout: float = 20.0):
    runner = CliRunner()
    with time_limit(timeout):
        return runner.invoke(cli, [str(a) for a in args], catch_exceptions=True, env={"NO_COLOR": "1"})


def _no_nan(x):
    raise AssertionError(f"JSON output holds {x}")


def assert_clean(res, args=()) -> dict | None:
    """The contract for any input; returns the parsed JSON when the command printed JSON and exited 0."""
    what = " ".join(str(a) for a in args)
    out, err = res.stdout, res.stderr
    assert "Traceback (most recent call last)" not in out + err, f"{what}: traceback\n{err[-2000:]}"
    if res.exit_code not in (0, 2):
        exc = res.exception
        detail = f"{type(exc).__name__}: {exc}" if exc is not None and not isinstance(exc, SystemExit) else err
        raise AssertionError(f"{what}: exit {res.exit_code}: {detail[:2000]}")
    if res.exit_code == 2:
        lines = err.strip("\n").split("\n")
        assert len(lines) == 1 and lines[0].startswith("tracekit: error: "), f"{what}: stderr is not one line: {err!r}"
        return None
    if "--format" in args and "json" in args and "-o" not in args:
        doc = json.loads(out, parse_constant=_no_nan)
        if args and str(args[0]) == "breakdown":
            assert_breakdown_sane(doc)
        return doc
    return None


def assert_breakdown_sane(doc: dict) -> None:
    """Numbers a breakdown may report: finite, non-negative, per_step_ms partitioning the step (0.5%)."""
    for d in doc.get("ranks") or [doc]:
        st = d["steps"]
        assert st["count"] >= 1, st
        mean = st["mean_ms"]
        assert mean is not None and math.isfinite(mean) and mean >= 0, st
        ps = d["per_step_ms"]
        for k, v in ps.items():
            assert v is None or (math.isfinite(v) and v >= -1e-9), f"per_step_ms.{k} = {v}"
        for k, v in d["kernel_ms_per_step"].items():
            assert v is None or (math.isfinite(v) and v >= -1e-9), f"kernel_ms_per_step.{k} = {v}"
        total = sum(v for v in ps.values() if v is not None)
        assert abs(total - mean) <= 0.005 * mean + 1e-9, f"per_step_ms sums to {total}, steps.mean_ms = {mean}"
        if any(v is None for v in list(ps.values()) + list(d["kernel_ms_per_step"].values())):
            assert d["warnings"], "a null number without a warning saying why"
