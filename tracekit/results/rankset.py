"""Results of several rank files (or every GPU of one trace) as the Python API returns them.

``tracekit.breakdown(directory)`` returns a :class:`RankSet`, ``tracekit.info(directory)`` and
``tracekit.kernels(directory)`` a :class:`RankReport`: each one's ``to_dict()`` is the command's ``--format json``
for the same files, as for one trace's typed result.
"""

from __future__ import annotations

import json
from collections.abc import Mapping


def _plain(obj) -> dict:
    """``obj`` as the command prints it with ``--format json``, parsed back (numbers, lists, dicts, null)."""
    from tracekit.contract import to_json

    return json.loads(to_json(obj))


class RankSet:
    """Several ranks analysed together (``tracekit breakdown DIR`` / ``--all-devices``): ``to_dict()`` is the
    command's JSON (every rank's breakdown, the per-rank table and the ``cross_rank`` object); ``cross_rank`` is the
    :class:`~tracekit.run.ranks.CrossRank`, and its attributes read through (``labels``, ``rank_breakdowns``,
    ``slowest_rank``, ...). A side of ``tracekit.diff`` as it is."""

    def __init__(self, cross_rank) -> None:
        self.cross_rank = cross_rank

    def __getattr__(self, name: str):
        if name == "cross_rank":  # (not yet set: unpickling)
            raise AttributeError(name)
        return getattr(self.cross_rank, name)

    def report(self) -> dict:
        """The multi-rank report (what ``tracekit.report.render`` prints)."""
        return self.cross_rank.report()

    def to_dict(self) -> dict:
        """``tracekit breakdown DIR --format json``."""
        return _plain(self.cross_rank.report())

    def __repr__(self) -> str:
        return f"RankSet({self.cross_rank.ranks} ranks: {', '.join(map(str, self.cross_rank.labels))})"


class RankReport(Mapping):
    """The result of ``info`` or ``kernels`` over several rank files: every rank's result and the cross-rank table;
    read by key as the JSON is, ``to_dict()`` is the command's ``--format json``."""

    def __init__(self, data: dict) -> None:
        self._data = data

    def __getitem__(self, key):
        return self._data[key]

    def __iter__(self):
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def to_dict(self) -> dict:
        return _plain(self._data)

    def __repr__(self) -> str:
        return f"RankReport({self._data.get('schema')}, {len(self._data.get('ranks', []))} ranks)"


__all__ = ["RankSet", "RankReport"]
