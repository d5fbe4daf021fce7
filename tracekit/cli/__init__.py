"""The ``tracekit`` command line: a thin layer over the library (``tracekit.load``, ``breakdown``, ...).

* ``app``: the click group, ``--version``/``--debug``, and the one place errors become exit codes.
* ``options``: the shared option decorators (one ``AnalysisOptions`` for the analysis commands).
* ``output``: the console, ``-o FILE`` and ``emit`` (``tracekit.report.render`` picks the renderer).
* one module per command family, registered below, in one place: ``analysis`` (info, kernels,
  breakdown), ``diff``, ``plot`` (plot, export), ``history``, ``ceiling``, ``capture``, ``cache``.

No module here imports polars, pyarrow or rich at import time (``tracekit --help`` stays fast, and
``tracekit capture`` runs on a GPU host without polars); commands import what they need when they run.
``tracekit.cli:main`` is the console script; ``from tracekit.cli import cli`` gives the group (tests, docs).
"""

from __future__ import annotations

from tracekit.cli import analysis, cache, capture, ceiling, diff, history, plot, stats
from tracekit.cli.app import cli, main

for _family in (analysis, stats, diff, plot, history, ceiling, capture, cache):
    for _command in _family.COMMANDS:
        cli.add_command(_command)

__all__ = ["cli", "main"]
