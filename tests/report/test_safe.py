"""Untrusted names: kernel and range names are whatever the traced program wrote.

Copies of a real nsys export (pipit saxpy 2022.2) and a real Kineto trace (HTA ROCm MI250)
get kernel names and NVTX / annotation range names holding markdown, HTML, backticks,
newlines, terminal control sequences (CSI colour, OSC 8 hyperlink), carriage returns, NUL
and a spreadsheet formula. Every output format must render them safely:

* table / md / csv: no ESC, BEL, NUL or CR byte, no injected line;
* md (and plot HTML): no raw ``<script`` / ``<img``, no live link, and every table row has
  the header's number of unescaped ``|``;
* csv: every row has the header's number of cells, no cell starts a formula;
* json (and the Perfetto export): the exact original strings round-trip.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import re
import shutil
import sqlite3

import pytest

from tracekit.cli import cli

from _robust import assert_clean, run_cli
from conftest import DATA

EVIL = [
    "| ** [x](javascript:alert(1)) #",
    "<script>alert(1)</script>",
    '<img src=x onerror="alert(1)">',
    "`rm -rf /` ``code``",
    "first line\nINJECTED_LINE | x |",
    "\x1b[31mRED\x1b[0m \x1b[2J",
    "\x1b]8;;http://evil\x07click\x1b]8;;\x07",
    "over\rWRITTEN",
    "nul\x00byte",
    '=HYPERLINK("http://evil","x")',
    "\u202eRTL override \u2028 sep",
    "[/bold] [link=http://evil]rich markup[/link]",
]
MARKUP = EVIL[-1]  # also the GPU name and producer version: rich must print it, not parse it
STEP = "STEPMARK"
CONTROL = ("\x1b", "\x07", "\x00", "\r", "\u202e", "\u2028")


def _nsys_names():
    # 5 kernels in the saxpy trace: each name carries two (or three) fragments
    return [f"{EVIL[2 * i]} {EVIL[(2 * i + 1) % len(EVIL)]} k{i}" + (f" {EVIL[10]} {EVIL[11]}" if i == 4 else "")
            for i in range(5)]


@pytest.fixture(scope="module")
def evil_nsys(tmp_path_factory):
    p = tmp_path_factory.mktemp("evil_nsys") / "trace.sqlite"
    shutil.copyfile(DATA / "nsys" / "pipit_saxpy_2022.2.sqlite", p)
    con = sqlite3.connect(p)
    names = _nsys_names()
    base = con.execute("SELECT max(id) FROM StringIds").fetchone()[0] + 1
    rows = con.execute("SELECT rowid FROM CUPTI_ACTIVITY_KIND_KERNEL ORDER BY start").fetchall()
    for i, (rowid,) in enumerate(rows):
        con.execute("INSERT INTO StringIds (id, value) VALUES (?, ?)", (base + i, names[i]))
        con.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET demangledName = ?, shortName = ? WHERE rowid = ?",
                    (base + i, base + i, rowid))
    ranges = con.execute("SELECT rowid FROM NVTX_EVENTS WHERE text = 'saxpy' ORDER BY start").fetchall()
    rnames = [f"{EVIL[i]} {STEP}" for i in range(len(ranges))]
    for (rowid,), n in zip(ranges, rnames):
        con.execute("UPDATE NVTX_EVENTS SET text = ? WHERE rowid = ?", (n, rowid))
    con.execute("UPDATE TARGET_INFO_GPU SET name = ?", (MARKUP,))
    con.execute("UPDATE EXPORT_META_DATA SET value = ? WHERE name = 'EXPORT_PRODUCT_VERSION'", (MARKUP,))
    con.commit()
    con.close()
    return p, names, rnames


@pytest.fixture(scope="module")
def evil_kineto(tmp_path_factory):
    p = tmp_path_factory.mktemp("evil_kineto") / "trace.json.gz"
    doc = json.loads(gzip.decompress((DATA / "kineto" / "hta_rocm_mi250.json.gz").read_bytes()))
    names, renamed = [], {}
    ki = 0
    for e in doc["traceEvents"]:
        if e.get("cat") == "kernel":
            e["name"] = f"{EVIL[ki % len(EVIL)]} k{ki}"
            names.append(e["name"])
            ki += 1
    for cat in ("user_annotation", "gpu_user_annotation"):  # the CPU range first, then its GPU mirror alike
        for e in doc["traceEvents"]:
            n = str(e.get("name", ""))
            if e.get("cat") == cat and n.startswith("ProfilerStep"):
                if n not in renamed:
                    renamed[n] = f"{EVIL[len(renamed) + 1]} {STEP}"
                e["name"] = renamed[n]
    rnames = sorted(renamed.values())
    doc["deviceProperties"] = [dict(d, name=MARKUP) for d in doc.get("deviceProperties") or [{"id": 0}]]
    doc["cupti_version"] = MARKUP
    assert ki >= len(EVIL) and rnames
    p.write_bytes(gzip.compress(json.dumps(doc).encode()))
    return p, sorted(set(names)), sorted(set(rnames))


def _assert_terminal_safe(text: str, what: str):
    for c in CONTROL:
        assert c not in text, f"{what}: raw {c!r} in output"
    for line in text.splitlines():
        assert not line.lstrip().startswith("INJECTED_LINE"), f"{what}: a name broke the line: {line!r}"


def _assert_markdown_safe(text: str, what: str):
    _assert_terminal_safe(text, what)
    low = text.lower()
    assert "<script" not in low and "<img" not in low, f"{what}: raw HTML"
    assert not re.search(r"(?<!\\)\]\(javascript:", low), f"{what}: live link"
    unescaped = re.compile(r"(?<!\\)\|")
    expected = None
    for line in text.splitlines():
        if not line.startswith("|"):
            expected = None
            continue
        n = len(unescaped.findall(line))
        if expected is None:
            expected = n  # header row of a new table
        assert n == expected, f"{what}: row has {n} cell separators, header has {expected}: {line!r}"


def _assert_csv_safe(text: str, what: str, names_col: int | None = None):
    _assert_terminal_safe(text, what)
    rows = list(csv.reader(io.StringIO(text)))
    assert rows, what
    for r in rows:
        assert len(r) == len(rows[0]), f"{what}: row {r!r} has {len(r)} cells, header {len(rows[0])}"
    if names_col is not None:
        for r in rows[1:]:
            assert r[names_col][:1] not in ("=", "+", "-", "@"), f"{what}: formula cell {r[names_col]!r}"


def _run(args) -> str:
    res = run_cli(args, timeout=120)
    assert_clean(res, args)
    assert res.exit_code == 0, f"{args}: {res.stderr}"
    return res.stdout


@pytest.fixture(params=["nsys", "kineto"])
def evil(request, evil_nsys, evil_kineto):
    return evil_nsys if request.param == "nsys" else evil_kineto


def test_kernels_every_format(evil):
    p, names, _ = evil
    doc = json.loads(_run(["kernels", "--format", "json", p]))
    assert sorted(k["name"] for k in doc["kernels"]) == sorted(names)  # exact strings, NUL and ESC included
    _assert_markdown_safe(_run(["kernels", "--format", "md", p]), "kernels md")
    _assert_csv_safe(_run(["kernels", "--format", "csv", p]), "kernels csv", names_col=1)
    _assert_terminal_safe(_run(["kernels", "--format", "table", p]), "kernels table")


def test_info_every_format(evil):
    p, _, rnames = evil
    doc = json.loads(_run(["info", "--format", "json", p]))
    patterns = {r["pattern"] for r in doc["range_names"]}
    # (info lists the ranges that launch GPU work: the Kineto fixture's last ProfilerStep launches none)
    listed = [n for n in rnames if re.sub(r"\d+", "#", n) in patterns]
    assert listed and len(listed) >= len(rnames) - 1
    for n in listed:
        # exact text (digits -> '#', as info documents)
        regex = next(r["regex"] for r in doc["range_names"] if r["pattern"] == re.sub(r"\d+", "#", n))
        assert re.search(regex, n), f"the --step-range regex info suggests does not select {n!r}"
    _assert_markdown_safe(_run(["info", "--format", "md", p]), "info md")
    table = _run(["info", "--format", "table", p])
    _assert_terminal_safe(table, "info table")
    assert MARKUP in table.replace("\n", "")  # shown literally, not parsed as rich markup
    assert MARKUP in json.dumps(doc, ensure_ascii=False)


@pytest.mark.slow
def test_breakdown_every_format(evil, tmp_path):
    p, names, _ = evil
    step = ["--step-range", STEP]
    doc = json.loads(_run(["breakdown", "--format", "json", *step, p]))
    assert doc["steps"]["count"] >= 1
    _assert_markdown_safe(_run(["breakdown", "--format", "md", *step, p]), "breakdown md")
    _assert_csv_safe(_run(["breakdown", "--format", "csv", *step, p]), "breakdown csv")
    table = _run(["breakdown", "--format", "table", *step, p])
    _assert_terminal_safe(table, "breakdown table")
    assert "[link=http://evil]" in table
    out = tmp_path / "b.txt"
    _run(["breakdown", "--format", "table", "-o", out, *step, p])
    _assert_terminal_safe(out.read_text(encoding="utf-8"), "breakdown table -o")
    if "diff" in cli.commands:
        _assert_markdown_safe(_run(["diff", "--format", "md", *step, p, p]), "diff md")
        _assert_terminal_safe(_run(["diff", "--format", "table", *step, p, p]), "diff table")
        json.loads(_run(["diff", "--format", "json", *step, p, p]))


@pytest.mark.skipif("plot" not in cli.commands, reason="no plot command")
def test_plot_html(evil, tmp_path):
    p, names, _ = evil
    html = tmp_path / "plot.html"
    _run(["plot", "--step-range", STEP, p, "-o", html])
    text = html.read_text(encoding="utf-8")
    for frag in ("<script>alert(1)</script>", "<img src=x onerror", "\x1b", "\x00"):
        assert frag not in text, f"plot html holds {frag!r}"
    assert not re.search(r"""(href|src)\s*=\s*["']?\s*javascript:""", text, re.I)
    # the only <script> elements are the page's own (same count as for an innocent trace)
    clean = tmp_path / "clean.html"
    src = DATA / "nsys" / "pipit_saxpy_2022.2.sqlite" if p.suffix == ".sqlite" else DATA / "kineto" / "hta_rocm_mi250.json.gz"
    _run(["plot", "--step-range", "saxpy" if p.suffix == ".sqlite" else "ProfilerStep", src, "-o", clean])
    assert text.lower().count("<script") == clean.read_text(encoding="utf-8").lower().count("<script")


@pytest.mark.skipif("export" not in cli.commands, reason="no export command")
def test_perfetto_export_round_trips(evil, tmp_path):
    p, names, _ = evil
    out = tmp_path / "perfetto.json"
    _run(["export", "--step-range", STEP, p, "--perfetto", out])
    doc = json.loads(out.read_text(encoding="utf-8"))
    exported = {e.get("name") for e in doc["traceEvents"]}
    hit = exported & set(names)
    assert hit, "no kernel of the analysed steps was exported"
    assert all(n in names for n in exported if n and n.endswith(tuple(f"k{i}" for i in range(20)))), \
        "a kernel name was altered in the export"


@pytest.mark.skipif("stats" not in cli.commands, reason="no stats command")
def test_stats_every_format(evil):
    """`tracekit stats`: kernel and range names (and, for nsys, the launching range of every kernel) in every
    table, safe in each format, exact in the JSON."""
    p, names, rnames = evil
    doc = json.loads(_run(["stats", "--format", "json", "--step-range", STEP, p]))
    assert sorted(k["name"] for k in doc["kernels"]) == sorted(names)
    assert set(rnames) <= {r["name"] for r in doc["ranges"]}
    _assert_markdown_safe(_run(["stats", "--format", "md", "--step-range", STEP, p]), "stats md")
    _assert_csv_safe(_run(["stats", "--format", "csv", "--step-range", STEP, p]), "stats csv", names_col=1)
    table = _run(["stats", "--format", "table", "--step-range", STEP, p])
    _assert_terminal_safe(table, "stats table")
    assert "[link=http://evil]" in table.replace("\n", "")
