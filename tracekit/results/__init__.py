"""Per-command results: what each analysis command returns, built from the pipeline's stages.

``breakdown`` (the per-step split, roofline and advice of one trace), ``info``, ``kernels``, ``ceiling`` and
``diff``. Each module assembles its command's result from ``tracekit.analyses`` (the pipeline stages); none opens
a file but the trace it is given, none prints (``tracekit.report`` renders them).
"""
