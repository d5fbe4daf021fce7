"""Errors users can cause. The CLI maps ``TracekitError`` to exit code 2 and one line."""


class TracekitError(Exception):
    """Unusable input or arguments. The message says what is wrong and what to do."""


class NoGpuActivity(TracekitError):
    """The trace holds no kernels, memory operations or graph executions."""


class NoSteps(TracekitError):
    """No decode steps could be found."""
