"""Orchestration: running the per-command results over files, ranks and engines, and recording the runs.

``ranks`` (several rank files analysed one by one, then compared: ``cross_rank``), ``engines`` (where the per-file
stage runs: a process pool or a Dask cluster) and ``history`` (the run database of ``breakdown --save`` and
``tracekit history``).
"""
