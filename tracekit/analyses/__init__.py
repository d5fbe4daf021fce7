"""The pipeline's stages: pure functions from a ``Trace`` (and the stages before) to frames and typed values.

In the order a breakdown runs them (``tracekit.run.pipeline``, the one place the pipeline runs)::

    attribution    which step / draft phase each GPU activity belongs to, and what it is (Attribution)
    phase, steady  each step's phase; the steady step and the warm-up/transition steps excluded
    speculation    whether the steps decode speculatively, with a draft model or not, over how many verify tokens,
                   from the engines' spans and frames, kernels, structure, shapes and the manifest (Speculation)
    drafting       the draft phase by ranges, the engine's records, structure or speculative kernels (Drafting);
                   the verify forward re-costed at one token and the plain step (VerifyCost, plain_step)
    partition      each analysed step's period split exactly into categories (StepTable); gaps: their causes
    resolve        one resolver per input that can come from several places (value, source, warnings): peak
                   bandwidth, the trace's GPU, tokens per step, accept length, context, the time base (timebase:
                   its arithmetic, TimeBase)
    collectives    the step's collectives, transfer against waiting (CommSplit); communication: their overheads
    bytes          the one resolver of bytes per step and TP/EP (ResolvedBytes); roofline: floor and ceiling
    advice         every lever from the measured facts (StepFacts -> Advice): ranked, order, the floor the step is
                   bound at and the headline, decided once; verdicts: the levers and the headline as typed values
                   whose sentences are rendered from their fields, and the self-check on those fields

Stages never open files (but the trace they are given), never print, and never import the per-command results
(``tracekit.results``), the orchestration (``tracekit.run``), the renderers or the readers
(``tests/test_architecture.py``). Step segmentation and kernel categories are ``tracekit.steps`` and
``tracekit.classify``.
"""
