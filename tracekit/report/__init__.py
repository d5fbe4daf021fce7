"""Reports: render result objects; they never compute.

Every number shown in the table, markdown or CSV comes from the same dict that
``--format json`` prints, so the formats always agree.
"""

from __future__ import annotations

import json
import math


def _clean(obj):
    """JSON-safe copy: NaN/inf -> None, tuples -> lists."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def to_json(obj) -> str:
    return json.dumps(_clean(obj), indent=2, ensure_ascii=False, allow_nan=False) + "\n"


def rounded(x, nd=3):
    return None if x is None else round(float(x), nd)
