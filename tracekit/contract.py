"""The contract JSON, written in one place: typed results in, the contract's dicts and text out.

Every result a command prints with ``--format json`` is a frozen dataclass whose fields are the contract's keys
in the order the JSON shows them (``../shared/spec/CONTRACT.md``): :class:`Block` is their base, :func:`to_dict`
the one serialiser (it walks a block's fields; nested blocks, tuples and mappings recursively) and
:func:`to_json` the one JSON writer. A class's ``SCHEMA`` is written first, as ``"schema"``. Field metadata say
what differs from "every field, in order" (:func:`internal`, :func:`extension`, :func:`flattened`):

* ``internal()``: not in the JSON (a frame, the facts the advice was computed from);
* ``extension(omit=...)``: an extension key left out of the JSON when ``omit(block)`` is true;
* ``flattened(keys)``: a mapping whose items are written in the field's place, each key one of ``keys``
  (the five levers of ``advice``; a lever's extension keys).

Access: code in tracekit reads attributes (``b.steps.count``, ``b.roofline.floor_ms``). A block is also a
read-only mapping by its JSON keys, as the dicts it replaced were (``b.steps["count"]``,
``b.roofline.get("floor_ms")``, ``dict(b.gpu)``): docs, tests and scripts read it so. A key that is not the
block's, a misspelling, raises ``KeyError``, from :meth:`Block.get` too (``get``'s default applies only to a key
the block declares and its JSON leaves out), so a misspelt key is never a silent ``None``; an attribute that is not
a field raises ``AttributeError``.

The schema strings of every JSON tracekit writes are named here, once.

>>> from dataclasses import dataclass
>>> @dataclass(frozen=True)
... class Span(Block):
...     start_ms: float
...     note: str | None = extension(omit=lambda s: s.note is None)
>>> s = Span(1.5)
>>> to_dict(s), s["start_ms"], s.get("note", "none"), list(s)
({'start_ms': 1.5}, 1.5, 'none', ['start_ms'])
>>> s.get("start")
Traceback (most recent call last):
...
KeyError: "Span has no key 'start' (its keys: start_ms, note)"
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from functools import cache
from typing import Any, ClassVar

# The schema strings, named once (what each JSON's "schema" key says).
BREAKDOWN_SCHEMA = "tracekit.breakdown/3"
DIFF_SCHEMA = "tracekit.diff/3"
INFO_SCHEMA = "tracekit.info/1"
KERNELS_SCHEMA = "tracekit.kernels/1"
STATS_SCHEMA = "tracekit.stats/1"
CEILING_SCHEMA = "tracekit.ceiling/1"
HISTORY_SCHEMA = "tracekit.history/2"
MANIFEST_SCHEMA = "tracekit.manifest/1"
MANIFEST_V2_SCHEMA = "tracekit.manifest/2"  # /1 + server, unprofiled_step_ms_spread, concurrency (capture --server)

_INTERNAL, _EXTENSION, _FLAT = "internal", "extension", "flattened"


def internal(*, tag: str | None = None, **kw) -> Any:
    """A field kept out of the JSON (``dataclasses.field`` keywords pass through); ``tag`` marks a group of such
    fields for a writer of its own (e.g. ``cross_rank_detail``: :func:`tagged`)."""
    return field(metadata={"contract": _INTERNAL, "tag": tag}, **kw)


def tagged(cls: type, tag: str) -> tuple[str, ...]:
    """The names of ``cls``'s internal fields tagged ``tag``, in order."""
    return tuple(f.name for f in fields(cls) if f.metadata.get("tag") == tag)


def extension(*, omit: Callable[[Any], bool], **kw) -> Any:
    """A field written to the JSON unless ``omit(block)``; its default is None unless given."""
    kw.setdefault("default", None)
    return field(metadata={"contract": _EXTENSION, "omit": omit}, **kw)


def flattened(keys: tuple[str, ...], *, complete: bool = False, **kw) -> Any:
    """A mapping field whose items are written in its place; each key must be one of ``keys``, and with
    ``complete`` every one of them must be there (checked when the block is made)."""
    return field(metadata={"contract": _FLAT, "keys": tuple(keys), "complete": complete}, **kw)


@dataclass(frozen=True)
class _Spec:
    keys: tuple[str, ...]  # JSON keys of the plain and extension fields, in order
    omit: dict[str, Callable]  # extension key -> when it is left out
    flat: tuple[tuple[str, tuple[str, ...]], ...]  # (field, its allowed keys)
    complete: tuple[str, ...]  # the flattened fields that must hold every allowed key
    order: tuple[tuple[str, str], ...]  # (field, kind) of every written field, in order


@cache
def _spec(cls: type) -> _Spec:
    keys, omit, flat, order, complete = [], {}, [], [], []
    for f in fields(cls):
        kind = f.metadata.get("contract")
        if kind == _INTERNAL:
            continue
        order.append((f.name, kind or ""))
        if kind == _FLAT:
            flat.append((f.name, f.metadata["keys"]))
            if f.metadata["complete"]:
                complete.append(f.name)
            continue
        keys.append(f.name)
        if kind == _EXTENSION:
            omit[f.name] = f.metadata["omit"]
    return _Spec(keys=tuple(keys), omit=omit, flat=tuple(flat), complete=tuple(complete), order=tuple(order))


class Block:
    """Base of the typed results: a frozen dataclass whose fields are contract keys (see the module docstring).

    Read-only mapping access by JSON key; :meth:`to_dict` is :func:`to_dict`. A subclass sets ``SCHEMA`` when its
    JSON is a whole document (written first, as ``"schema"``)."""

    SCHEMA: ClassVar[str | None] = None

    def __post_init__(self) -> None:
        spec = _spec(type(self))
        for name, allowed in spec.flat:
            items = getattr(self, name)
            wrong = [k for k in items if k not in allowed]
            if wrong:
                raise KeyError(f"{type(self).__name__}.{name}: {', '.join(map(repr, wrong))} not among its keys "
                               f"({', '.join(allowed)})")
            missing = [k for k in allowed if k not in items] if name in spec.complete else []
            if missing:
                raise KeyError(f"{type(self).__name__}.{name}: no {', '.join(map(repr, missing))}")

    def to_dict(self) -> dict:
        """The contract JSON of this block (:func:`to_dict`)."""
        return to_dict(self)

    # ---- read-only mapping access by JSON key
    def _lookup(self, key: str, missing):
        spec = _spec(type(self))
        if key == "schema" and self.SCHEMA is not None:
            return self.SCHEMA
        if key in spec.keys:
            omit = spec.omit.get(key)
            if omit is not None and omit(self):
                return missing
            return getattr(self, key)
        declared = False
        for name, allowed in spec.flat:
            items = getattr(self, name)
            if key in items:
                return items[key]
            declared = declared or key in allowed
        if declared:
            return missing
        every = [*spec.keys, *(k for _, allowed in spec.flat for k in allowed)]
        raise KeyError(f"{type(self).__name__} has no key {key!r} (its keys: {', '.join(every)})")

    def __getitem__(self, key: str):
        v = self._lookup(key, _MISSING)
        if v is _MISSING:
            raise KeyError(key)
        return v

    def get(self, key: str, default=None):
        """The value of ``key``; ``default`` when the block declares ``key`` but its JSON leaves it out; a key the
        block does not declare (a misspelling) raises ``KeyError``."""
        v = self._lookup(key, _MISSING)
        return default if v is _MISSING else v

    def keys(self) -> list[str]:
        """The JSON keys, in order (those left out of this block's JSON excluded)."""
        spec = _spec(type(self))
        out = [] if self.SCHEMA is None else ["schema"]
        for name, kind in spec.order:
            if kind == _FLAT:
                out.extend(getattr(self, name))
            elif kind != _EXTENSION or not spec.omit[name](self):
                out.append(name)
        return out

    def items(self) -> list[tuple[str, Any]]:
        return [(k, self[k]) for k in self.keys()]

    def values(self) -> list:
        return [self[k] for k in self.keys()]

    def __contains__(self, key: object) -> bool:
        return key in self.keys()

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def __len__(self) -> int:
        return len(self.keys())


class _Missing:
    def __repr__(self) -> str:
        return "<missing>"


_MISSING = _Missing()


def to_dict(obj):
    """The contract JSON of ``obj`` as plain Python (dicts, lists, numbers, text): a :class:`Block` by its fields
    (``SCHEMA`` first), mappings and sequences element by element; anything else as it is."""
    if isinstance(obj, Block):
        out = {} if obj.SCHEMA is None else {"schema": obj.SCHEMA}
        spec = _spec(type(obj))
        for name, kind in spec.order:
            v = getattr(obj, name)
            if kind == _FLAT:
                out.update({str(k): to_dict(x) for k, x in v.items()})
            elif kind != _EXTENSION or not spec.omit[name](obj):
                out[name] = to_dict(v)
        return out
    if isinstance(obj, Mapping):
        return {k: to_dict(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    if is_dataclass(obj) and not isinstance(obj, type) and hasattr(obj, "to_dict"):
        return obj.to_dict()
    return obj


def _clean(obj):
    """JSON-safe copy: NaN/inf -> None, tuples -> lists."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def to_json(obj) -> str:
    """The JSON text of a result (a :class:`Block`, an object with ``to_dict()``, or plain data): two-space
    indents, non-ASCII kept, NaN and infinities as null."""
    if isinstance(obj, Block) or (not isinstance(obj, (dict, list, tuple)) and hasattr(obj, "to_dict")):
        obj = obj.to_dict()
    return json.dumps(_clean(to_dict(obj)), indent=2, ensure_ascii=False, allow_nan=False) + "\n"


__all__ = ["Block", "to_dict", "to_json", "internal", "tagged", "extension", "flattened", "BREAKDOWN_SCHEMA", "DIFF_SCHEMA",
           "INFO_SCHEMA", "KERNELS_SCHEMA", "STATS_SCHEMA", "CEILING_SCHEMA", "HISTORY_SCHEMA", "MANIFEST_SCHEMA",
           "MANIFEST_V2_SCHEMA"]
