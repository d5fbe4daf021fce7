"""The contract JSON is written in one place (tracekit.contract), from typed blocks: every key the contract's
``tracekit.breakdown/3`` schema block names is produced, and a misspelt key fails loudly.

The keys are parsed from the contract's own text (../shared/spec/CONTRACT.md; docs/contract.md is its copy kept
with the code), not listed here, so a key added to the contract and not produced fails this test.
"""

from __future__ import annotations

import dataclasses
import re

import pytest

import tracekit
from tracekit.analyses.advice import Advice, Lever
from tracekit.contract import Block, to_dict, to_json
from tracekit.report import render
from tracekit.results.breakdown import Breakdown, Steps

from conftest import DATA, ROOT, sample_trace

SAXPY = DATA / "nsys" / "pipit_saxpy_2022.2.sqlite"


def contract_text() -> str:
    shared = ROOT.parent / "shared" / "spec" / "CONTRACT.md"
    return (shared if shared.is_file() else ROOT / "docs" / "contract.md").read_text(encoding="utf-8")


def schema_block(text: str, schema: str) -> str:
    """The fenced JSON sketch under the heading that names ``schema``."""
    head = re.search(rf"^##+ .*\(schema `{re.escape(schema)}`\)\s*$", text, re.M)
    assert head, f"no heading for {schema} in the contract"
    m = re.search(r"```\n(.*?)```", text[head.end():], re.S)
    assert m, f"no schema block under the {schema} heading"
    return m.group(1)


def contract_paths(block: str) -> dict[str, None]:
    """Every key path of a contract JSON sketch, in the sketch's order (a dict used as an ordered set):
    ``steps.count``, ``gaps.largest[].before.kind``, ``advice.drafting.detection``. Comments (``# ...``) are
    dropped; ``{str: int}`` maps have no fixed keys."""
    text = re.sub(r"#[^\n]*", "", block)
    paths: dict[str, None] = {}
    stack: list[str] = []  # one path part per open { or [ ("" when it adds none: the top level, a list's element)
    key = None  # the key whose value the next bracket opens (set only right after `"key":`)
    for tok in re.finditer(r'"([A-Za-z_][A-Za-z0-9_]*)"\s*:|[{}\[\]]|[^\s{}\[\]"]+|"[^"]*"', text):
        t = tok.group(0)
        if tok.group(1):
            paths[".".join(p for p in [*stack, tok.group(1)] if p)] = None
            key = tok.group(1)
        elif t in "{[":
            stack.append((key + ("[]" if t == "[" else "")) if key else "")
            key = None
        elif t in "}]":
            stack.pop()
            key = None
        else:
            key = None  # a value: the next bracket is not this key's
    return paths


def produced_paths(obj, prefix: str = "") -> set[str]:
    """Every key path of a produced JSON dict (lists: each element's keys under ``key[]``)."""
    out: set[str] = set()
    if isinstance(obj, dict):
        for k, v in obj.items():
            p = f"{prefix}.{k}" if prefix else k
            out.add(p)
            out |= produced_paths(v, p)
    elif isinstance(obj, list):
        for v in obj:
            out |= produced_paths(v, prefix + "[]")
    return out


@pytest.fixture(scope="module")
def saxpy():
    return tracekit.breakdown(tracekit.load(SAXPY), step_range="^saxpy$")


def test_the_parser_reads_the_sketch():
    paths = contract_paths('{"a": 1, "b": {"c": f, "d": [{"e": int, "f": {"g": str}|null}]}, "m": {str: int}}')
    assert list(paths) == ["a", "b", "b.c", "b.d", "b.d[].e", "b.d[].f", "b.d[].f.g", "m"]


def test_every_contract_key_of_breakdown3_is_produced_by_the_one_serialiser(saxpy):
    want = set(contract_paths(schema_block(contract_text(), "tracekit.breakdown/3")))
    # (the sketch is the real one: it names blocks, nested keys and the gaps' entries)
    assert {"schema", "steps.excluded_reasons", "gaps.largest[].before.kind", "roofline.tp_source",
            "advice.communication.by_kind[].exposed_ms", "advice.drafting.evidence", "time_base.reference_step_ms",
            "headline", "warnings"} <= want and len(want) > 90
    d = saxpy.to_dict()
    assert d == to_dict(saxpy)  # Breakdown.to_dict is the serialiser
    got = produced_paths(d)
    # a gap named by what covers most of it (nothing recorded covers most of saxpy's: ``before`` null there);
    # serve-small-graph's longest gaps are its 'grammar_mask' range
    got |= produced_paths(tracekit.breakdown(tracekit.load(sample_trace("serve-small-graph"))).to_dict())
    # by_kind rows exist only with collectives: the saxpy trace has none; its row keys are checked below
    missing = {p for p in want - got if not p.startswith("advice.communication.by_kind[]")}
    assert missing == set()
    assert d["schema"] == "tracekit.breakdown/3" and list(d)[:3] == ["schema", "source", "gpu"]


def test_the_by_kind_rows_of_a_trace_with_collectives():
    want = {p for p in contract_paths(schema_block(contract_text(), "tracekit.breakdown/3"))
            if p.startswith("advice.communication.by_kind[]")}
    d = tracekit.breakdown(tracekit.load(DATA / "kineto" / "hta_nccl_data.json.gz")).to_dict()
    assert want and want <= produced_paths(d)


def test_the_json_text_is_the_serialised_blocks(saxpy):
    import json

    assert json.loads(to_json(saxpy)) == json.loads(json.dumps(saxpy.to_dict()))
    assert to_json(saxpy) == render("breakdown", saxpy, "json")


def test_blocks_are_typed_frozen_and_read_by_key(saxpy):
    for name in ("source", "gpu", "steps", "time_base", "per_step_ms", "gaps", "kernel_ms_per_step", "roofline",
                 "advice"):
        block = getattr(saxpy, name)
        assert isinstance(block, Block) and dataclasses.is_dataclass(block), name
        assert list(block.keys()) == list(to_dict(block)), name  # the mapping view is the JSON's
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(block, next(iter(dataclasses.fields(block))).name, None)
    assert saxpy.steps["count"] == saxpy.steps.count == 4
    assert saxpy.roofline.get("floor_ms") is saxpy.roofline.floor_ms
    assert dict(saxpy.gpu) == to_dict(saxpy.gpu)
    assert saxpy.gaps["largest"][0]["before"] is saxpy.gaps.largest[0].before is None
    named = tracekit.breakdown(tracekit.load(sample_trace("serve-small-graph"))).gaps
    assert named["largest"][0]["before"]["kind"] == named.largest[0].before.kind == "range"
    assert saxpy.advice["drafting"]["detection"] == "not_detected"  # a lever's extension key


@pytest.mark.parametrize("read", [
    lambda b: b.steps["cuont"],
    lambda b: b.steps.get("cuont"),  # get's default is for declared keys only
    lambda b: b.roofline.get("floor"),
    lambda b: b.per_step_ms["gem"],
    lambda b: b.gaps["largest"][0]["befor"],
    lambda b: b.advice["cuda_graph"],
    lambda b: b.advice["drafting"].get("detecton"),
    lambda b: b["stpes"],
])
def test_a_misspelt_key_fails_loudly(saxpy, read):
    with pytest.raises(KeyError):
        read(saxpy)


def test_a_misspelt_attribute_or_field_fails_loudly(saxpy):
    with pytest.raises(AttributeError):
        _ = saxpy.steps.cuont
    with pytest.raises(TypeError):
        Steps(**{**saxpy.steps.__dict__, "cuont": 4})
    lever = saxpy.advice["drafting"]
    with pytest.raises(KeyError, match="detecton"):
        dataclasses.replace(lever, extra={"detecton": "ranges"})  # a lever's extension keys are declared
    with pytest.raises(KeyError, match="cuda_graph"):
        Advice(levers={"cuda_graph": lever})
    with pytest.raises(KeyError, match="host_work"):  # every lever of the contract, none left out
        Advice(levers={k: v for k, v in saxpy.advice.levers.items() if k != "host_work"})
    assert isinstance(lever, Lever) and lever.get("missing_flag") is None  # declared, left out: the default


def test_declared_but_omitted_keys_read_as_their_default_and_are_absent_from_the_json(saxpy):
    r = saxpy.roofline
    assert r.shape_coverage is None and "shape_coverage" not in r and "shape_coverage" not in to_dict(r)
    assert r.get("shape_coverage", "none") == "none"
    with pytest.raises(KeyError):
        _ = r["shape_coverage"]  # as the dict it replaced: an absent key


def test_a_breakdown_pickles_by_name(saxpy):
    import pickle

    b = pickle.loads(pickle.dumps(dataclasses.replace(saxpy, activities=None)))
    assert isinstance(b, Breakdown) and b.to_dict() == saxpy.to_dict()


def test_the_names_tracekit_declares_once_are_the_contracts():
    """Categories, gap causes, levers and exclusion reasons: tracekit.categories names each list once; the
    contract's sketch and prose name the same, in the same order."""
    from tracekit.categories import EXCLUSION_REASONS, GAP_CAUSES, KERNEL_CATEGORIES, LEVERS, STEP_CATEGORIES

    text = contract_text()
    block = schema_block(text, "tracekit.breakdown/3")
    paths = list(contract_paths(block))

    def children(parent: str) -> list[str]:
        return list(dict.fromkeys(p[len(parent) + 1:] for p in paths
                                  if p.startswith(parent + ".") and "." not in p[len(parent) + 1:]))

    assert children("per_step_ms") == list(STEP_CATEGORIES)
    assert children("kernel_ms_per_step") == list(KERNEL_CATEGORIES)
    assert [k for k in children("gaps") if k != "largest"] == list(GAP_CAUSES)
    assert children("advice") == list(LEVERS)
    prose = re.search(r"`excluded_reasons` under one of:(.*?)Percentiles", text, re.S).group(1)
    assert set(re.findall(r'`"([^"]+)"`', prose)) == set(EXCLUSION_REASONS)
