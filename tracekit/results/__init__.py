"""Per-command results: the typed blocks each analysis command returns.

``breakdown`` (the blocks of the per-step split, roofline and advice of one trace; ``tracekit.run.pipeline`` fills
them), ``info``, ``kernels``, ``ceiling``, ``diff`` and ``stats`` (these still assemble their result from
``tracekit.analyses``). None opens a file but the trace it is given, none prints (``tracekit.report`` renders
them).
"""
