"""``python -m tracekit``: the command line (``tracekit.cli``) where the console script is not installed, as on the
GPU host, where ``capture`` runs without polars."""

from tracekit.cli import main

main()
