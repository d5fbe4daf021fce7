"""Docs that cannot drift: what cog does not generate is checked here against the code (sqlite-utils' test_docs)."""

from __future__ import annotations

import re

from tracekit.cli import cli
from tracekit.readers.nsys import _Db

from conftest import ROOT


def test_every_command_has_its_help_in_docs_cli_md():
    text = (ROOT / "docs" / "cli.md").read_text()
    for name in cli.commands:
        assert f"## `tracekit {name}`" in text, name


def test_every_command_is_in_the_readme():
    text = (ROOT / "README.md").read_text()
    for name in cli.commands:
        assert f"tracekit {name}" in text, name


def test_the_small_export_threshold_the_readme_states_is_the_code():
    text = (ROOT / "README.md").read_text()
    mib = int(re.search(r"exports under (\d+) MiB are read with plain `sqlite3`", text).group(1))
    assert mib * 2**20 == _Db.SMALL_FILE_BYTES


def test_docs_link_to_existing_files():
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = re.sub(r"<!-- \[\[\[cog.*?\]\]\] -->", "", page.read_text(), flags=re.S)  # generators' code
        for target in re.findall(r"\]\(((?!https?:|#)[^)#\s]+)", text):
            assert (page.parent / target).exists(), f"{page.name} links to missing {target}"
