"""Docs that cannot drift: what cog does not generate is checked here against the code (sqlite-utils' test_docs)."""

from __future__ import annotations

import re

from tracekit.cli import cli
from tracekit.readers.nsys.reader import _Db

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


def test_readme_starts_with_the_two_commands_and_they_point_at_real_things(monkeypatch):
    """The README's first code block: install + run on a bundled real trace, install + run the tests. What they name
    exists (the trace, the extras in pyproject.toml) and the first one's tracekit command works here."""
    import shlex

    from click.testing import CliRunner

    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib

    text = (ROOT / "README.md").read_text()
    block = re.search(r"```bash\n(.*?)```", text, re.S)
    assert block and text.index(block.group(0)) < text.index("## ")  # before the first section
    run, test = block.group(1).strip().splitlines()
    assert run.startswith("python3 -m venv .venv && ") and test.startswith("python3 -m venv .venv && ")
    assert test.endswith('pip install -e ".[test]" && python -m pytest')
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert {"pytest", "cogapp", "hypothesis"} <= {re.split(r"[<>=\[]", d)[0] for d in extras["test"]}
    cmd = shlex.split(run.split(" && ")[-1])
    assert cmd[:2] == ["tracekit", "breakdown"] and (ROOT / cmd[2]).is_file()
    monkeypatch.chdir(ROOT)
    r = CliRunner().invoke(cli, cmd[1:], catch_exceptions=False)
    assert r.exit_code == 0 and r.stdout.startswith("step ")


def test_every_module_says_what_it_owns():
    """docs/architecture.md's module map is each module's docstring (cog): every module has one."""
    import ast

    missing = [str(p.relative_to(ROOT)) for p in sorted((ROOT / "tracekit").rglob("*.py"))
               if not ast.get_docstring(ast.parse(p.read_text()))]
    assert missing == []


def test_the_architecture_doc_names_real_files():
    """What docs/architecture.md says by hand (outside its cog blocks): every tracekit/ or tests/ path it names
    exists, and each kind of change it places is in its table."""
    text = re.sub(r"<!-- \[\[\[cog.*?\[\[\[end\]\]\] -->", "", (ROOT / "docs" / "architecture.md").read_text(),
                  flags=re.S)
    paths = set(re.findall(r"`((?:tracekit|tests)/[\w/.<>-]+?)`", text))
    assert paths, "no path found"
    assert [p for p in sorted(paths) if "<" not in p and not (ROOT / p).exists()] == []
    for what in ("a **lever**", "a **kernel category**", "a **resolver**", "a **trace format**"):
        assert f"| {what}" in text, what
