"""The capture workloads (shipped as ``tracekit.workloads``). They run as scripts (``python capture/X.py``: this
folder is then ``sys.path[0]``) and import each other as top-level modules; imported as a package instead, this
puts the folder on ``sys.path`` so those imports resolve the same way -- the one import shim of the folder."""

import os as _os
import sys as _sys

_HERE = _os.path.dirname(_os.path.abspath(__file__))
if _HERE not in _sys.path:
    _sys.path.append(_HERE)
