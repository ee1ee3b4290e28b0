"""JSON as RFC 8259 has it, for everything gpuenv writes for a program to read.

Python's `json.dumps` writes NaN and Infinity, which no strict parser (jq, JavaScript's
JSON.parse, Go) takes. A reading that is not a number is unknown: it is written as null.

>>> dumps({"temperature_c": float("nan"), "power_w": float("inf"), "gpus": [1.5]})
'{"temperature_c": null, "power_w": null, "gpus": [1.5]}'
"""

from __future__ import annotations

import json
import math
from typing import Any


def finite(value: Any) -> Any:
    """`value` with every float that is not finite replaced by None (lists, tuples and
    mappings walked; anything else as it is)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(item) for item in value]
    return value


def dumps(value: Any, **options: Any) -> str:
    """`json.dumps` of `value` made finite; never NaN or Infinity."""
    return json.dumps(finite(value), allow_nan=False, **options)
