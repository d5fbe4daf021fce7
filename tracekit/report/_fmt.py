"""The formatters of :mod:`tracekit.text`, under their former name (modules on other branches still import them
from here; new code imports ``tracekit.text``)."""

from tracekit.text import MINUS, MISSING, distinct_tails, num, one_line, pct, sig, size, tail

__all__ = ["MISSING", "MINUS", "one_line", "num", "pct", "sig", "size", "tail", "distinct_tails"]
