"""One declaration per option (tracekit.options.OPTIONS): the command line, the options objects, the Python API's
signatures and the analyses' keywords agree with it; and the one byte-amount parser."""

from __future__ import annotations

import dataclasses
import inspect
import json
from types import SimpleNamespace

import click
import pytest
from click.testing import CliRunner

import tracekit
from tracekit.cli import cli
from tracekit.errors import TracekitError
from tracekit.options import (
    API_ALSO,
    DEFAULT_DRAFT_RANGE,
    OPTION,
    OPTIONS,
    AnalysisOptions,
    CeilingOptions,
    Option,
    options_of,
    parse_amount,
)
from tracekit.results.ceiling import ceiling as ceiling_analysis
from tracekit.run.pipeline import breakdown as breakdown_analysis

from conftest import DATA

SAXPY = DATA / "nsys" / "pipit_saxpy_2022.2.sqlite"
# Parameters of the commands that are not analysis options (what to read, where to write, the command's own
# switches): every other parameter must be a declared option.
OUTPUT = ("fmt", "output", "color")
COMMAND_OWN = {
    "breakdown": ("traces", "save", *OUTPUT),
    "diff": ("base", "new", "base_measured_step_ms", "new_measured_step_ms", "base_device", "new_device",
             "base_accept_len", "new_accept_len",
             "fail_on_regression", *OUTPUT),
    "plot": ("trace", "output"),
    "export": ("trace", "perfetto"),
    "ceiling": OUTPUT,
}
COMMANDS = {"breakdown": ("breakdown", "diff", "plot", "export"), "ceiling": ("ceiling",)}
OBJECTS = {"breakdown": AnalysisOptions, "ceiling": CeilingOptions}
API = {"breakdown": tracekit.breakdown, "ceiling": tracekit.ceiling}


def breakdown_reads() -> set[str]:
    """The inputs the breakdown analysis reads (``tracekit.run.pipeline.breakdown`` takes one options object and
    reads each input by name from ``_inputs``' namespace): recorded over one run on a real trace."""
    import tracekit.run.pipeline as pipeline

    seen: set[str] = set()

    class Recording(SimpleNamespace):
        def __getattribute__(self, name):
            if not name.startswith("__"):
                seen.add(name)
            return super().__getattribute__(name)

    made = pipeline._inputs
    pipeline._inputs = lambda options: Recording(**vars(made(options)))
    try:
        breakdown_analysis(tracekit.load(SAXPY), AnalysisOptions(step_range="^saxpy$"))
    finally:
        pipeline._inputs = made
    return seen


def ceiling_keywords() -> set[str]:
    return {p.name for p in inspect.signature(ceiling_analysis).parameters.values() if p.kind == p.KEYWORD_ONLY}


# what each analysis uses of its options (breakdown: the inputs it reads; ceiling: its keyword parameters)
ANALYSES = {"breakdown": breakdown_reads, "ceiling": ceiling_keywords}


def disagreements(commands=None, objects=None, api=None, analyses=None, declared=None) -> list[str]:
    """Every place where the command line, the options objects, the API or the analyses' keywords differ from the
    declaration (each argument defaults to the real thing; the tests below hand in a broken one)."""
    commands, objects = commands or {a: [cli.commands[c] for c in cs] for a, cs in COMMANDS.items()}, objects or OBJECTS
    api, analyses, declared = api or API, analyses or ANALYSES, declared or options_of
    out = []
    for analysis in ("breakdown", "ceiling"):
        opts = declared(analysis)
        names = [o.name for o in opts]
        fields = {f.name: f for f in dataclasses.fields(objects[analysis])}
        for o in opts:
            f = fields.get(o.name)
            if f is None or f.default != o.default or f.type != o.annotation:
                out.append(f"{objects[analysis].__name__}.{o.name}")
        kw = {p.name: p for p in inspect.signature(api[analysis]).parameters.values() if p.kind == p.KEYWORD_ONLY}
        if list(kw) != names + list(API_ALSO[analysis]):
            out.append(f"tracekit.{analysis} keywords {list(kw)}")
        out += [f"tracekit.{analysis}({o.name}=)" for o in opts if o.name in kw
                and (kw[o.name].default != o.default or kw[o.name].annotation != o.annotation)]
        uses = analyses[analysis]()
        out += [f"analysis {analysis} takes no {n}" for n in names if n not in uses]
        if analysis == "breakdown":  # (its defaults are the options object's; ceiling's keywords' defaults say
            # what "not given" means without a trace)
            out += [f"analysis breakdown({n}=) is not declared" for n in sorted(uses) if n not in names]
        mine = {o.name: o for o in opts}
        for cmd in commands[analysis]:
            params = {p.name: p for p in cmd.params}
            for name, p in params.items():
                o = mine.get(name)
                if o is None:
                    if name not in COMMAND_OWN[cmd.name] and not (name in OPTION and "files" in OPTION[name].used_by):
                        out.append(f"{cmd.name}: {name} is not a declared option of {analysis}")
                    continue
                help_ = o.ceiling_help if analysis == "ceiling" and o.ceiling_help else o.help
                spelled = o.flags or (f"--{name.replace('_', '-')}",)
                flags = [f for decl in spelled for f in decl.split("/")]
                if p.default != o.default or p.help != help_ or [*p.opts, *p.secondary_opts] != flags:
                    out.append(f"{cmd.name} {o.flag}")
    return out


def test_the_command_line_the_options_objects_the_api_and_the_analyses_agree():
    assert disagreements() == []
    # every declared option of breakdown is a flag of breakdown, diff (but the measured pair), plot and export
    for analysis, cmds in COMMANDS.items():
        for c in cmds:
            params = {p.name for p in cli.commands[c].params}
            want = {o.name for o in options_of(analysis)} - ({"measured_step_ms", "measured_tok_s"} if c == "diff"
                                                             else set())
            assert want <= params, (c, want - params)


def test_the_agreement_check_catches_each_kind_of_drift():
    """A test that cannot fail proves nothing: hand the check one drifted piece at a time."""
    # a flag added to a command by hand, not declared
    extra = click.Command("breakdown", params=[*cli.commands["breakdown"].params, click.Option(["--temperature"])])
    assert disagreements(commands={"breakdown": [extra], "ceiling": []}) == \
        ["breakdown: temperature is not a declared option of breakdown"]
    # an API keyword whose default differs (the old facade had phase: str = "decode" and model: str | Path)
    def facade(trace, **options):
        pass
    facade.__signature__ = inspect.signature(tracekit.breakdown).replace(parameters=[
        p.replace(default=None) if p.name == "phase" else p for p in inspect.signature(tracekit.breakdown).parameters.values()])
    assert disagreements(api={**API, "breakdown": facade}) == ["tracekit.breakdown(phase=)"]

    # an input the analysis reads that the declaration does not know (a new option used but not declared)
    reads = breakdown_reads()
    assert disagreements(analyses={**ANALYSES, "breakdown": lambda: reads | {"temperature"}}) == \
        ["analysis breakdown(temperature=) is not declared"]
    # a declared option the analysis no longer reads
    assert disagreements(analyses={**ANALYSES, "breakdown": lambda: reads - {"context"}}) == \
        ["analysis breakdown takes no context"]
    # a declaration nothing uses (declared, but not in the options object, the API, the analysis or the CLI)
    ghost = Option("temperature", "float | None", "positive", "Sampling temperature.")
    found = disagreements(declared=lambda a: options_of(a) + ((ghost,) if a == "breakdown" else ()))
    assert "AnalysisOptions.temperature" in found and "analysis breakdown takes no temperature" in found


def test_a_new_option_is_one_declaration():
    """What the declaration alone produces: the options-object field, the API keyword and the click flag."""
    from tracekit.options import _AnalysisChecks, _options_class

    new = Option("temperature", "float | None", "positive", "Sampling temperature.", metavar="T")
    cls = _options_class("Opts", options_of("breakdown") + (new,), _AnalysisChecks, "")
    assert cls(temperature=0.7).temperature == 0.7
    with pytest.raises(TracekitError, match="--temperature must be a positive number, got -1"):
        cls(temperature=-1)
    from tracekit.cli.options import click_option

    cmd = click_option(new)(click.Command("x", callback=lambda **kw: None))
    assert [p.opts for p in cmd.params] == [["--temperature"]] and cmd.params[0].help == "Sampling temperature."


def test_every_contract_key_an_option_names_is_in_the_json():
    d = tracekit.breakdown(tracekit.load(SAXPY), step_range="^saxpy$").to_dict()
    c = tracekit.ceiling(gpu="NVIDIA H200", params=1e9).to_dict()
    for o in OPTIONS:
        for key in o.contract:
            doc, path = (c, key.split(":", 1)[1]) if key.startswith("ceiling:") else (d, key)
            node = doc
            for part in path.split("."):
                assert isinstance(node, dict) and part in node, (o.name, key)
                node = node[part]


def test_cli_and_api_refuse_the_same_values_with_the_same_words(tmp_path):
    """One validator: the flag and the keyword give the same message (the CLI's is its one-line usage error)."""
    trace = tracekit.load(SAXPY)
    for kwargs, args in [(dict(tp=0), ["--tp", "0"]), (dict(peak_bw=-3.0), ["--peak-bw", "-3"]),
                         (dict(measured_step_ms=0.0), ["--measured-step-ms", "0"]),
                         (dict(context=-1), ["--context", "-1"]), (dict(phase="later"), ["--phase", "later"]),
                         (dict(measured_step_ms=20.0, measured_tok_s=48.0),
                          ["--measured-step-ms", "20", "--measured-tok-s", "48"]),
                         (dict(rules=tmp_path / "none.toml"), ["--rules", str(tmp_path / "none.toml")])]:
        with pytest.raises(TracekitError) as e:
            tracekit.breakdown(trace, **kwargs)
        r = CliRunner().invoke(cli, ["breakdown", str(SAXPY), *args])
        assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
        if "phase" not in kwargs:  # (click refuses a choice itself, in its words)
            assert str(e.value) in r.stderr, (str(e.value), r.stderr)
    with pytest.raises(TypeError, match="temperature"):
        tracekit.breakdown(trace, temperature=0.7)  # an unknown keyword is a TypeError, as for any function
    with pytest.raises(TypeError, match="engine"):
        tracekit.breakdown(trace, engine="dask")  # engine places several files; one trace has nowhere to go


def test_measured_step_ms_is_checked_once_in_the_declaration():
    """--measured-step-ms: flag -> AnalysisOptions (checked) -> the analysis keyword -> time_base (trusted)."""
    assert OPTION["measured_step_ms"].check(20) == 20
    for bad in (0, -1.0, float("nan"), float("inf"), "20", True):
        with pytest.raises(TracekitError, match="--measured-step-ms must be a positive number"):
            OPTION["measured_step_ms"].check(bad)
    b = tracekit.breakdown(tracekit.load(SAXPY), step_range="^saxpy$", measured_step_ms=100.0)
    assert b.time_base.unprofiled_step_ms == 100.0 and b.time_base.unprofiled_source == "flag"
    r = CliRunner().invoke(cli, ["diff", str(SAXPY), str(SAXPY), "--step-range", "^saxpy$",
                                 "--base-measured-step-ms", "-5"])
    assert r.exit_code == 2 and "--base-measured-step-ms must be a positive number, got -5" in r.stderr


def test_ceiling_and_breakdown_share_the_declarations():
    shared = {o.name for o in options_of("breakdown")} & {o.name for o in options_of("ceiling")}
    assert shared == {"weight_bytes", "model", "tp", "ep", "context", "peak_bw", "accept_len", "measured_tok_s"}
    # the same flag takes the same text in both commands
    for args in (["--weight-bytes", "27B"], ["--tp", "0"]):
        b = CliRunner().invoke(cli, ["breakdown", str(SAXPY), *args])
        c = CliRunner().invoke(cli, ["ceiling", "--gpu", "NVIDIA H200", *args])
        assert b.exit_code == c.exit_code == 2
        assert b.stderr.split(" (see")[0] == c.stderr.split(" (see")[0], (b.stderr, c.stderr)
    # not given is not a number in either: ceiling's "one GPU" is the analysis' meaning of None
    assert CeilingOptions(gpu="NVIDIA H200", params=1e9).tp is None
    assert tracekit.ceiling(gpu="NVIDIA H200", params=1e9).inputs["tp"] == 1
    r = CliRunner().invoke(cli, ["ceiling", "--gpu", "NVIDIA H200", "--params", "1e9", "--format", "json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["inputs"]["tp"] == 1


@pytest.mark.parametrize("text,kind,value", [
    ("27e9", "bytes", 27e9), ("27GB", "bytes", 27e9), ("27 gb", "bytes", 27e9), ("25.1GiB", "bytes", 25.1 * 2**30),
    ("512MiB", "bytes", 512 * 2**20), ("1.5TB", "bytes", 1.5e12), ("300MB", "bytes", 3e8), ("4096", "bytes", 4096),
    ("27B", "count", 27e9), ("8.03G", "count", 8.03e9), ("70M", "count", 70e6), (".5e3", "count", 500),
])
def test_parse_amount(text, kind, value):
    # (bytes are whole: 25.1GiB rounds to the nearest byte)
    assert parse_amount(text, kind) == pytest.approx(round(value) if kind == "bytes" else value, rel=1e-15)


@pytest.mark.parametrize("text,kind", [("27B", "bytes"), ("lots", "bytes"), ("27GiB", "count"), ("1e999", "bytes"),
                                       ("-5GB", "bytes"), ("", "bytes")])
def test_parse_amount_refuses_with_an_example(text, kind):
    # (a bare B of bytes is ambiguous: the message says how to write 10^9 bytes)
    with pytest.raises(TracekitError, match=r"e\.g\. 27e9, |ambiguous|too large"):
        parse_amount(text, kind)


def test_options_are_frozen_and_validated():
    o = AnalysisOptions(weight_bytes=parse_amount("25.1GiB"), draft_range="")
    assert o.weight_bytes == round(25.1 * 2**30) and isinstance(o.weight_bytes, int)
    assert AnalysisOptions(weight_bytes="25.1GiB") == o.__class__(weight_bytes=26950919782, draft_range=DEFAULT_DRAFT_RANGE)
    assert o.draft_range is None  # --draft-range '' switches drafting by range off
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.device = 1  # type: ignore[misc]
    assert AnalysisOptions().draft_range == DEFAULT_DRAFT_RANGE and AnalysisOptions().given() == {}
    for bad in (dict(measured_step_ms=20.0, measured_tok_s=48.0), dict(peak_bw=-1.0), dict(tp=0), dict(phase="x"),
                dict(engine="ray"), dict(engine="process=tcp://h:1"), dict(tp=1.5), dict(device=-1)):
        with pytest.raises(TracekitError):
            AnalysisOptions(**bad)
    with pytest.raises(TypeError):
        AnalysisOptions("^s$")  # keyword-only


def test_analysis_kwargs_are_the_analysis_keywords(tmp_path):
    profile = tmp_path / "device_profile.json"
    profile.write_text('{"graph_replay_gap_us": 1.5}')
    o = AnalysisOptions(step_range="^s$", measured_step_ms=20.0, device_profile=profile, engine="dask=tcp://h:8786")
    kw = o.analysis_kwargs()
    assert list(kw) + list(API_ALSO["breakdown"]) == [
        p.name for p in inspect.signature(tracekit.breakdown).parameters.values()][1:]
    assert kw["step_range"] == "^s$" and kw["measured_step_ms"] == 20.0
    assert kw["device_profile"] == {"graph_replay_gap_us": 1.5}  # read here, once
    assert "engine" not in kw  # where several files run, not what is computed


def test_options_objects_pickle_by_name():
    """The per-rank workers receive them through process pools and Dask."""
    import pickle

    o = AnalysisOptions(step_range="^s$", tp=2)
    assert pickle.loads(pickle.dumps(o)) == o and type(o).__module__ == "tracekit.options"


def test_help_shows_every_keyword():
    text = inspect.getdoc(tracekit.breakdown) and str(inspect.signature(tracekit.breakdown))
    for o in options_of("breakdown"):
        assert f"{o.name}: '{o.annotation}' = {o.default!r}" in text
    diff = CliRunner().invoke(cli, ["diff", "--help"], terminal_width=200).output
    assert "--base-measured-step-ms" in diff and "--new-measured-step-ms" in diff and "--measured-tok-s" not in diff


def test_every_kind_is_parsed_on_the_command_line_and_checked():
    from tracekit.cli.options import CLICK_TYPES
    from tracekit.options import KINDS

    assert set(CLICK_TYPES) | {"choice", "flag"} == set(KINDS)
    assert {o.kind for o in OPTIONS} <= set(KINDS)
    assert all(o.choices for o in OPTIONS if o.kind == "choice")
