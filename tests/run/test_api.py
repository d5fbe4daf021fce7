"""The Python API (``tracekit.breakdown`` and friends) does what the command line does, with the same names."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

import tracekit
from tracekit.cli import cli

from conftest import DATA

MFU = DATA / "nsys" / "nsysai_mfu_2gpu_before_2026.2.sqlite"


def test_breakdown_all_devices_is_the_command_s_rank_set():
    """Fix 8: `tracekit.breakdown()` lacked `all_devices` (`breakdown --all-devices`): every GPU of the 2-GPU
    nsys report as a rank, the same cross-rank object as the command's JSON."""
    cr = tracekit.breakdown(tracekit.load(MFU), all_devices=True)
    r = CliRunner().invoke(cli, ["breakdown", str(MFU), "--all-devices", "--format", "json"])
    assert r.exit_code == 0, r.stderr
    d = json.loads(r.stdout)
    assert cr.ranks == 2 and cr.labels == ["gpu0", "gpu1"]
    assert cr.to_dict() == d  # (the typed result's JSON is the command's, issue 51 item 3)
    assert cr.cross_rank.to_dict() == d["cross_rank"]
    assert [b.gpu.device for b in cr.rank_breakdowns] == [0, 1]
    assert json.loads(json.dumps(cr.report()["levers"])) == d["levers"]
    with pytest.raises(tracekit.TracekitError, match="--all-devices"):
        tracekit.breakdown(tracekit.load(MFU), all_devices=True, device=0)
    assert "all_devices" in str(__import__("inspect").signature(tracekit.breakdown))
