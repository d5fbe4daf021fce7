"""The pipeline's stages: pure functions from a ``Trace`` (and the stages before) to frames and typed values.

In the order a breakdown runs them (``tracekit.run.pipeline``)::

    attribution    which step / draft phase each GPU activity belongs to, and what it is (Attribution)
    phase, steady  each step's phase; the steady step and the warm-up/transition steps excluded
    drafting       the draft phase by ranges, structure or speculative kernels (Drafting, VerifyCost)
    partition      each analysed step's period split exactly into categories (StepTable); gaps: their causes
    timebase       the step every saving is stated against (TimeBase)
    collectives    the step's collectives, transfer against waiting (CommSplit); communication: their overheads
    bytes          the one resolver of bytes per step and TP/EP (ResolvedBytes); roofline: floor and ceiling
    advice         every lever from the measured facts (StepFacts -> Advice)

Stages never open files (but the trace they are given), never print, and never import the per-command results
(``tracekit.results``), the orchestration (``tracekit.run``), the renderers or the readers
(``tests/test_architecture.py``). Step segmentation and kernel categories are ``tracekit.steps`` and
``tracekit.classify``.
"""
