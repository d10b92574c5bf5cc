"""One way serving turns numpy-laden values into JSON (and YAML) that any parser reads.

Standard JSON has no NaN or infinity: NaN becomes ``null``; an infinity becomes the string
``"inf"``/``"-inf"`` where a reader wants to tell it apart (the dashboard, plans), or ``null``
where a number or nothing is expected (answers). Numpy scalars and arrays become Python
numbers and lists, mappings get string keys, tuples become lists, anything else its ``str``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Literal

import numpy as np


def clean(value: Any, *, infinity: Literal["string", "null"] = "string") -> Any:
    """A JSON-safe plain-Python copy of ``value`` (see the module docstring)."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        f = float(value)
        if math.isnan(f):
            return None
        if math.isinf(f):
            return None if infinity == "null" else ("inf" if f > 0 else "-inf")
        return f
    if isinstance(value, Mapping):
        return {str(k): clean(v, infinity=infinity) for k, v in value.items()}
    if isinstance(value, np.ndarray):
        return clean(value.tolist(), infinity=infinity)
    if isinstance(value, (list, tuple)):
        return [clean(v, infinity=infinity) for v in value]
    return str(value)
