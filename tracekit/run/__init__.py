"""The pipeline and its orchestration: running the analyses over files, ranks and engines, and recording the runs.

``pipeline`` (read -> steps -> attribution -> analyses -> result: the one place a breakdown runs), ``ranks``
(several rank files analysed one by one, then compared: ``cross_rank``), ``engines`` (where the per-file stage
runs: a process pool or a Dask cluster), ``stats`` (``tracekit stats``: what its tables read beyond the Trace, the
steps, the summary) and ``history`` (the run database of ``breakdown --save`` and ``tracekit
history``).
"""
