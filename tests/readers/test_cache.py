"""The cache directory (tracekit.readers.cache): bounded, least recently used entries evicted first;
`tracekit cache info|clear`; and a test session that leaves no decompressed copies behind."""

from __future__ import annotations

import gzip
import json
import os
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

import tracekit
from tracekit.cli import cli
from tracekit.errors import TracekitError
from tracekit.readers import cache
from tracekit.readers.nsys.sqlitegz import decompress_to_cache

from conftest import sample_trace

GRAPH = "hf-small-graph"  # a committed .sqlite.gz sample


def plain_size(gz: Path) -> int:
    with gzip.open(gz, "rb") as f:
        return sum(len(chunk) for chunk in iter(lambda: f.read(1 << 20), b""))


def fake_entry(d: Path, name: str, size: int, age_s: float) -> Path:
    p = d / f"{name}.sqlite"
    p.write_bytes(b"\0" * size)
    t = time.time() - age_s
    os.utime(p, (t, t))
    return p


def test_least_recently_used_entries_go_first(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    d.mkdir()
    monkeypatch.setenv("TRACEKIT_CACHE", str(d))
    gz = sample_trace(GRAPH)
    new_size = plain_size(gz)
    fake_entry(d, "old-1", 1000, age_s=300)
    used = fake_entry(d, "used-2", 1000, age_s=200)
    mid = fake_entry(d, "mid-3", 1000, age_s=100)
    died = d / "x-4.sqlite.123.tmp"
    died.write_bytes(b"partial")
    os.utime(died, (time.time() - 2 * cache.STALE_TMP_S,) * 2)
    assert cache.hit(used)  # read again just now: the most recently used of the three
    # room for the new entry and two of the three old ones
    monkeypatch.setenv("TRACEKIT_CACHE_MAX", str(new_size + 2000))
    out = decompress_to_cache(gz)
    assert out.parent == d and out.stat().st_size == new_size
    assert sorted(p.name for p in d.iterdir()) == sorted([out.name, used.name, mid.name])  # old-1 and the tmp gone
    # a cap smaller than the newest entry keeps that one only
    monkeypatch.setenv("TRACEKIT_CACHE_MAX", "0")
    assert cache.evict(keep=out) and [p.name for p in d.iterdir()] == [out.name]


def test_a_hit_marks_the_entry_used(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACEKIT_CACHE", str(tmp_path))
    out = decompress_to_cache(sample_trace(GRAPH))
    t = time.time() - 1000
    os.utime(out, (t, t))
    assert decompress_to_cache(sample_trace(GRAPH)) == out  # made once
    assert out.stat().st_mtime > t + 900
    out.unlink()  # evicted by another process meanwhile: made again
    assert decompress_to_cache(sample_trace(GRAPH)).exists()


def test_the_cap_is_a_byte_amount(monkeypatch):
    monkeypatch.setenv("TRACEKIT_CACHE_MAX", "500MiB")
    assert cache.max_bytes() == 500 * 2**20
    monkeypatch.delenv("TRACEKIT_CACHE_MAX")
    assert cache.max_bytes() == cache.DEFAULT_MAX
    monkeypatch.setenv("TRACEKIT_CACHE_MAX", "lots")
    with pytest.raises(TracekitError, match="TRACEKIT_CACHE_MAX"):
        cache.max_bytes()


def test_cache_info_and_clear(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACEKIT_CACHE", str(tmp_path))
    tracekit.load(sample_trace(GRAPH))
    r = CliRunner().invoke(cli, ["cache", "info", "--format", "json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["dir"] == str(tmp_path) and len(d["entries"]) == 1
    assert d["bytes"] == plain_size(sample_trace(GRAPH)) == (tmp_path / d["entries"][0]["name"]).stat().st_size
    text = CliRunner().invoke(cli, ["cache", "info"]).output
    assert text.startswith(f"{tmp_path}: 1 entries, ") and d["entries"][0]["name"] in text
    r = CliRunner().invoke(cli, ["cache", "clear"])
    assert r.exit_code == 0 and r.output.startswith("removed 1 file (") and not list(tmp_path.iterdir())
    assert "cache" in CliRunner().invoke(cli, ["--help"]).output


def test_the_test_session_has_its_own_cache():
    """The suite reads its gzipped samples through a temporary cache (tests/conftest.py), never ~/.cache/tracekit."""
    d = Path(os.environ["TRACEKIT_CACHE"])
    assert d.name.startswith("tracekit-test-cache-") and d != Path("~/.cache/tracekit").expanduser()
