"""The shape the architecture promises: analyses and reports never touch readers; the analyzer never imports
torch; `tracekit capture` runs where polars is absent (the GPU host)."""

from __future__ import annotations

import ast
import subprocess
import sys

from conftest import ROOT

PKG = ROOT / "tracekit"


def imports_of(path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.module


def test_analyses_and_reports_never_import_readers():
    offenders = [(p.relative_to(ROOT), m) for sub in ("analyses", "report") for p in (PKG / sub).glob("*.py")
                 for m in imports_of(p) if m.startswith("tracekit.readers")]
    assert offenders == []


def test_no_torch_in_the_analyzer():
    offenders = [(p.relative_to(ROOT), m) for p in PKG.rglob("*.py") for m in imports_of(p)
                 if m.split(".")[0] in ("torch", "nvtx")]
    assert offenders == []
    code = ("import sys, tracekit; from tracekit.cli import cli; from click.testing import CliRunner; "
            f"r = CliRunner().invoke(cli, ['breakdown', r'{ROOT / 'tests/data/nsys/nsysai_mock_2026.1.sqlite'}', "
            "'--step-range', '.', '--format', 'json']); "
            "print(r.exit_code, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT).stdout.split()
    assert out[-1] == "False"


def test_capture_runs_without_polars():
    code = ("import sys; sys.modules['polars'] = None; from tracekit.cli import cli; "
            "from click.testing import CliRunner; r = CliRunner().invoke(cli, ['capture', '--help']); "
            "print(r.exit_code, 'polars' in sys.modules and sys.modules['polars'] is not None)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.stdout.split() == ["0", "False"], out.stderr


# ───────────────────────── structure: no import cycle, a light command line ─────────────────────────

def _module_name(path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """tracekit module -> the tracekit modules it imports, anywhere in it (top level, inside functions, and
    ``importlib.import_module("...")`` with a literal name); an import of a package's name edges to the package."""
    mods = {_module_name(p): p for p in PKG.rglob("*.py")}
    graph = {}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        out = set()
        tree = ast.parse(path.read_text())
        # imports for type checkers only (`if TYPE_CHECKING:`) never run: no edge
        typing_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If)
                       and getattr(block.test, "id", getattr(block.test, "attr", "")) == "TYPE_CHECKING"
                       for stmt in block.body for n in ast.walk(stmt)}
        for node in ast.walk(tree):
            targets = []
            if id(node) in typing_only:
                continue
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([node.module] if node.module else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module"
                  and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
                targets = [node.args[0].value]
            out |= {t for t in targets if t in mods and t != name}
        graph[name] = out
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while not comp or comp[-1] != v:
                comp.append(stack.pop())
                on.discard(comp[-1])
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle_anywhere_in_tracekit():
    graph = import_graph()
    assert "tracekit.cli.analysis" in graph["tracekit.cli"]  # the graph sees the registrations
    assert cycles(graph) == []
    # the detector does find one: the old cli.py <-> diffcmd.py pair (importlib by name one way)
    assert cycles({**graph, "tracekit.report.diff": graph["tracekit.report.diff"] | {"tracekit.cli"},
                   "tracekit.cli": graph["tracekit.cli"] | {"tracekit.report.diff"}}) != []


def _modules_after(args: list[str]) -> set[str]:
    code = ("import sys; from tracekit.cli import cli\n"
            f"try:\n    cli.main(args={args!r}, standalone_mode=False)\nexcept SystemExit:\n    pass\n"
            "print(' '.join(m for m in ('polars', 'pyarrow', 'adbc_driver_sqlite', 'rich', 'msgspec') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    return set(out.stdout.split("\n")[-2].split())


def test_help_and_version_import_no_analyzer_dependency():
    assert _modules_after(["--help"]) == set()
    assert _modules_after(["--version"]) == set()
    assert _modules_after(["breakdown", "--help"]) == set()
    out = subprocess.run([sys.executable, "-c", "import sys, tracekit; print('polars' in sys.modules)"],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.stdout.strip() == "False"
