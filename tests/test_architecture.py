"""The shape the architecture promises: analyses and reports never touch readers; the analyzer never imports
torch; `tracekit capture` runs where polars is absent (the GPU host)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from conftest import ROOT

PKG = ROOT / "tracekit"


def imports_of(path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.module


def test_analyses_results_and_reports_never_import_readers():
    offenders = [(p.relative_to(ROOT), m) for sub in ("analyses", "results", "report") for p in (PKG / sub).glob("*.py")
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
            "print(r.exit_code, 'polars' in sys.modules and sys.modules['polars'] is not None, "
            "any(m.startswith('tracekit.readers') for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.stdout.split() == ["0", "False", "False"], out.stderr  # (nor the readers)


# ───────────────────────── structure: no import cycle, a light command line ─────────────────────────

def _module_name(path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, object]:
    """tracekit's module names -> their files."""
    return {_module_name(p): p for p in PKG.rglob("*.py")}


def imports_in(name: str, source: str, mods, through_packages: bool = False) -> set[str]:
    """The tracekit modules that module ``name`` (its ``source``) imports: see :func:`import_graph`."""
    path = mods.get(name)
    package = name if path is not None and path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(source)):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([node.module] if node.module else []))
            subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in mods]
            targets = subs + ([base] if through_packages or len(subs) < len(node.names) else [])
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            targets = [node.args[0].value]
        out |= {t for t in targets if t in mods and t != name}
    return out


def import_graph(through_packages: bool = False) -> dict[str, set[str]]:
    """tracekit module -> the tracekit modules it imports, anywhere in it (top level, inside functions, for type
    checkers, and ``importlib.import_module("...")`` with a literal name). ``from P import x`` edges to ``P.x`` when
    that is a module, else to P; ``through_packages`` (for the cycles): to P as well, since P's ``__init__`` runs
    and ``x`` is looked up there, so that a submodule naming its own package that way (``from tracekit.server
    import engines`` in ``tracekit.server.capture``, which ``tracekit.server`` imports) closes a cycle
    (``import P.x as x`` names the module alone)."""
    mods = modules()
    return {name: imports_in(name, path.read_text(), mods, through_packages) for name, path in mods.items()}


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
    """No cycle among the modules, imports inside functions and for type checkers included, nor between a package
    and its modules (issues 49, 50: tracekit.server <-> server.capture, readers.kineto <-> kineto.split,
    model.checkpoint <-> model.step)."""
    graph = import_graph(through_packages=True)
    assert "tracekit.cli.analysis" in graph["tracekit.cli"]  # the graph sees the registrations
    assert "tracekit.model.checkpoint" in graph["tracekit.model.step"]  # ... and imports for type checkers
    assert cycles(graph) == []
    # ... and a submodule naming its package (a function's import too) closes a cycle with the package's __init__
    for source, line in (("tracekit/server/capture.py", "from tracekit.server import engines as eng"),
                         ("tracekit/readers/kineto/split.py", "def f():\n    from tracekit.readers.kineto import stream")):
        module = _module_name(ROOT / source)
        extra = imports_in(module, line, modules(), through_packages=True)
        assert cycles({**graph, module: graph[module] | extra}) != [], source
    # the detector does find one: the old cli.py <-> diffcmd.py pair (importlib by name one way)
    assert cycles({**graph, "tracekit.report.diff": graph["tracekit.report.diff"] | {"tracekit.cli"},
                   "tracekit.cli": graph["tracekit.cli"] | {"tracekit.report.diff"}}) != []


# ───────────────────────── the layout shows the pipeline ─────────────────────────
# tracekit/*.py, model/ the core: data, names, the Trace, options, text formatters (below every package)
# tracekit/readers/   file formats -> one Trace: one package per format (readers/nsys/, readers/kineto/), registered
#                     in tracekit.readers.FORMATS; the pieces they share beside them (common, api_names, cache)
# tracekit/analyses/  the pipeline's stages (attribution, partition, gaps, steady, phase, drafting, collectives,
#                     communication, timebase, resolve, roofline, bytes, advice; verdicts: the levers' typed values
#                     and their sentences): pure functions, typed values out
# tracekit/results/   the typed result blocks per command (breakdown, info, kernels, ceiling, diff, stats; several ranks: rankset)
# tracekit/run/       the pipeline (read -> ... -> result), several ranks, engines, the run history, diff's two sides
# tracekit/report/    renderers of the results' JSON; tracekit/__init__ the facade; tracekit/cli/ the commands
STAGES = ("advice", "attribution", "bytes", "collectives", "communication", "drafting", "gaps", "partition", "phase",
          "resolve", "roofline", "speculation", "steady", "timebase", "verdicts")
RESULTS = ("breakdown", "ceiling", "common", "diff", "info", "kernels", "rankset", "stats")
RUN = ("engines", "history", "pipeline", "ranks", "sides", "stats")
FORMATS = ("nsys", "kineto")  # readers/<format>/, in the registry's order
SHARED_READERS = ("api_names", "cache", "common", "paths")
# The layers, lowest first. Imports point one way: a module imports only modules of its own layer or of a layer
# below it (the core also holds tracekit.model and tracekit.__main__'s target is the command line).
LAYERS = ("core", "tracekit.readers", "tracekit.server", "tracekit.analyses", "tracekit.results", "tracekit.run",
          "tracekit.report", "tracekit", "tracekit.cli")
# the capture side (tracekit.capture: our decode loops; tracekit.server: a running server) lies above the readers:
# it names the files it writes as their format does (tracekit.readers.of_profiler), and imports no analysis
CAPTURE = ("tracekit.capture", "tracekit.server")
# ... and besides the order, what a layer never imports although it lies below: the stages and the result blocks
# never read files (readers), the renderers render the results' JSON and compute nothing (only the core)
NEVER = {
    "tracekit.analyses": ("tracekit.readers",),
    "tracekit.results": ("tracekit.readers",),
    "tracekit.report": ("tracekit.readers", "tracekit.analyses", "tracekit.results", "tracekit.run"),
}


def _under(module: str, package: str) -> bool:
    return module == package if package == "tracekit" else (module == package or module.startswith(package + "."))


def layer(module: str) -> int:
    """The index in :data:`LAYERS` of ``module``'s layer (the core: top-level modules and ``tracekit.model``)."""
    if module == "tracekit.__main__":
        return LAYERS.index("tracekit.cli")
    if any(_under(module, c) for c in CAPTURE):
        return LAYERS.index("tracekit.server")
    for i in range(len(LAYERS) - 1, 0, -1):
        if _under(module, LAYERS[i]):
            return i
    return 0


def upward(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Every import that points up the layers, or to a layer its layer never imports."""
    bad = [(m, d) for m, deps in graph.items() for d in deps if layer(d) > layer(m)]
    bad += [(m, d) for m, deps in graph.items() for package, banned in NEVER.items() if _under(m, package)
            for d in deps for b in banned if _under(d, b)]
    return bad


def across_formats(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Every import of a format's package by another format's or by the readers' shared modules (a format is
    removed or added without touching another)."""
    formats = [f"tracekit.readers.{f}" for f in FORMATS]
    shared = [f"tracekit.readers.{s}" for s in SHARED_READERS]
    return [(m, d) for m, deps in graph.items() for d in deps for b in formats if _under(d, b)
            and (m in shared or any(_under(m, a) for a in formats if a != b))]


def test_the_layout_shows_the_pipeline():
    names = {p.stem for p in (PKG / "analyses").glob("*.py")} - {"__init__"}
    assert names == set(STAGES)
    assert {p.stem for p in (PKG / "results").glob("*.py")} - {"__init__"} == set(RESULTS)
    assert {p.stem for p in (PKG / "run").glob("*.py")} - {"__init__"} == set(RUN)
    # a format is a package of its own, registered by one line; the shared pieces of the readers lie beside them
    from tracekit.readers import FORMATS as registered

    assert registered == tuple(f"tracekit.readers.{f}" for f in FORMATS)
    assert {p.name for p in (PKG / "readers").iterdir() if (p / "__init__.py").is_file()} == set(FORMATS)
    assert {p.stem for p in (PKG / "readers").glob("*.py")} - {"__init__"} == set(SHARED_READERS)
    # each package says what it holds
    for package in ("analyses", "results", "run", "readers", *(f"readers/{f}" for f in FORMATS)):
        assert ast.get_docstring(ast.parse((PKG / package / "__init__.py").read_text())), package


def test_imports_point_one_way_down_the_layers():
    graph = import_graph()
    assert upward(graph) == []
    # every package is in a layer of its own, the core below them all
    packages = {_module_name(p.parent) for p in PKG.rglob("__init__.py")} - {"tracekit"}
    assert {layer(p) for p in packages if p != "tracekit.model"} >= set(range(1, len(LAYERS))) - {LAYERS.index("tracekit")}
    assert layer("tracekit.model.units") == layer("tracekit.text") == layer("tracekit.options") == 0
    assert across_formats(graph) == []
    # nothing but the command line (and python -m tracekit) imports the command line
    assert [m for m, deps in graph.items() if "tracekit.cli" in deps and not _under(m, "tracekit.cli")
            and m != "tracekit.__main__"] == []


def test_the_checks_above_can_fail():
    graph = import_graph()
    for m, d in (("tracekit.analyses.advice", "tracekit.results.breakdown"),   # a stage importing a result
                 ("tracekit.readers.kineto.stream", "tracekit.report.terminal"),  # a reader importing a renderer
                 ("tracekit.tokens", "tracekit.analyses.phase"),                 # the core importing a stage
                 ("tracekit.analyses.bytes", "tracekit.readers.nsys.reader")):          # a stage reading a file
        assert upward({**graph, m: graph[m] | {d}}) == [(m, d)], (m, d)
    assert not _under("tracekit.results", "tracekit") and _under("tracekit", "tracekit")
    for m, d in (("tracekit.readers.nsys.reader", "tracekit.readers.kineto.stream"),  # a format using another's
                 ("tracekit.readers.common", "tracekit.readers.nsys.scan")):         # a shared piece using a format
        assert across_formats({**graph, m: graph[m] | {d}}) == [(m, d)], (m, d)


def test_private_helpers_stay_private():
    """A name with a leading underscore is never imported from another package (a helper another package needs is
    public, without the underscore, and listed in its module's ``__all__`` where the module has one)."""
    offenders = []
    for path in PKG.rglob("*.py"):
        mod = _module_name(path)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tracekit"):
                for a in node.names:
                    src_pkg, dst_pkg = node.module.rsplit(".", 1)[0], mod.rsplit(".", 1)[0]
                    if a.name.startswith("_") and not a.name.startswith("__") and src_pkg != dst_pkg:
                        offenders.append((mod, f"{node.module}.{a.name}"))
            # ... and never listed as public
            if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__all__" for t in node.targets):
                offenders += [(mod, f"__all__: {e.value}") for e in getattr(node.value, "elts", [])
                              if isinstance(e, ast.Constant) and str(e.value).startswith("_")
                              and not str(e.value).startswith("__")]
    assert offenders == []


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


# ───────────────────────── the tests mirror the package ─────────────────────────
# tests/<group>/ for each part of tracekit (capture: tracekit/capture.py and tracekit/server/), validation/ for the
# checks against captured truth; at the top only the project-wide checks and the helpers every folder imports
# (pytest's pythonpath has tests/).
TEST_GROUPS = ("readers", "analyses", "results", "run", "report", "cli", "capture", "model", "validation")
TOP = ("conftest.py", "_robust.py", "factory.py", "test_architecture.py", "test_docs.py")


def test_the_tests_mirror_the_package():
    tests = ROOT / "tests"
    assert {p.name for p in tests.iterdir() if p.is_dir() and any(p.glob("test_*.py"))} == set(TEST_GROUPS)
    assert {p.name for p in tests.glob("*.py")} == set(TOP)
    packages = {p.parent.name for p in PKG.glob("*/__init__.py")}
    assert packages - {"server"} <= set(TEST_GROUPS), packages - set(TEST_GROUPS)
    # every stage of the pipeline has a test file of its own, named for it (steps: tracekit/steps.py)
    missing = [s for s in (*STAGES, "steps") if not list((tests / "analyses").glob(f"test_{s}*.py"))]
    assert missing == []
    # one basename per test module: pytest's default import mode imports each by its basename
    names = [p.name for p in tests.rglob("test_*.py")]
    assert len(names) == len(set(names))


def named_after_a_module(test: Path) -> bool:
    """tests/<pkg>/test_<m>.py is named after a module when tracekit/<pkg>/<m>.py, tracekit/<m>.py or the package
    tracekit/<pkg>/<m>/ exists (tests/readers/test_nsys.py: tracekit/readers/nsys/)."""
    m, pkg = test.stem.removeprefix("test_"), test.parent.name
    return (PKG / pkg / f"{m}.py").is_file() or (PKG / f"{m}.py").is_file() or (PKG / pkg / m).is_dir()


def test_most_test_files_are_named_after_the_module_they_test():
    # (a topic file that mixes modules is split or merged into the modules' files; the validation sweeps, against
    # captured truth, are apart and not counted)
    files = [p for p in (ROOT / "tests").rglob("test_*.py") if "validation" not in p.relative_to(ROOT).parts]
    named = [p for p in files if named_after_a_module(p)]
    assert len(named) >= 0.6 * len(files), sorted(str(p.relative_to(ROOT)) for p in set(files) - set(named))
    # the rule itself can tell a module's file from a topic's
    assert named_after_a_module(ROOT / "tests" / "readers" / "test_nsys.py")
    assert named_after_a_module(ROOT / "tests" / "results" / "test_contract.py")
    assert not named_after_a_module(ROOT / "tests" / "readers" / "test_fuzz.py")


# ───────────────────────── functions a reader can hold in view ─────────────────────────

def long_functions(limit: int = 100, root: Path = ROOT / "tracekit") -> list[str]:
    """Every function of ``root`` longer than ``limit`` lines (docstring included), as ``path:name (lines)``."""
    out = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > limit:
                    out.append(f"{path.relative_to(ROOT)}:{node.name} ({n})")
    return out


def test_no_function_over_100_lines_and_the_pipeline_reads_as_its_steps():
    """Issue 50: split where a reader would name the parts; ``pipeline.breakdown`` is the list of the pipeline's
    steps, one call each (docs/architecture.md, "The walk of one trace")."""
    assert long_functions() == []
    fn = next(n for n in ast.parse((ROOT / "tracekit/run/pipeline.py").read_text()).body
              if isinstance(n, ast.FunctionDef) and n.name == "breakdown")
    assert fn.end_lineno - fn.lineno + 1 <= 60
    assert [a.arg for a in fn.args.args] == ["trace", "options"]  # one options object
    # the check can fail: the old pipeline's 189-line breakdown is over it
    assert long_functions(limit=30) != []
