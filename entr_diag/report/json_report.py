"""JSON output: one versioned envelope around the results' ``to_dict()``.

Conventions: ``schema_version`` (bumped on any incompatible change), the tool version, the
command, the inputs (paths, layout, row counts, mapping, token accounting) and every
parameter. Non-finite floats (NaN, +-inf) become ``null``, finite ones keep 12 significant
digits (:data:`FLOAT_DIGITS`) but thresholds re-applied to tokens (:data:`EXACT_KEYS`); numpy scalars and arrays become plain numbers and lists. Files are written atomically.
"""

from __future__ import annotations

import dataclasses
import json
import math
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from entr_diag import __version__
from entr_diag.atomic import write_text

SCHEMA_VERSION = "1.0"
#: significant digits of a float in the JSON: sums that polars' multi-threaded group-bys
#: add up in a varying order differ run to run in their last bit; 12 digits make two runs
#: on the same input give the same document (a float's 17 digits would not)
FLOAT_DIGITS = 12


#: floats kept whole (17 significant digits at most: they read back to the same value), not
#: rounded to FLOAT_DIGITS: thresholds a reader re-applies to the tokens. Every float under
#: a ``params`` key (a gate's parameters, as its spec gives them), and ``c`` under
#: ``matched`` (the matched band's c, one token's |delta|: rounded, the band kept one
#: token fewer than ENTR)
EXACT_UNDER = "params"
EXACT_KEYS = {("matched", "c")}


def sanitize(obj: Any, exact: bool = False, key: str | None = None) -> Any:
    """Recursively convert ``obj`` to JSON-safe plain types (NaN/inf -> None, floats to
    :data:`FLOAT_DIGITS` significant digits, but the thresholds of :data:`EXACT_UNDER` and
    :data:`EXACT_KEYS` whole; ``exact`` and ``key``, the key ``obj`` is under, are for the
    recursion).

    Raises:
        TypeError: for a type with no faithful JSON form (no silent ``str()`` fallback).
    """
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, (int, np.integer)) and not isinstance(obj, bool):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        f = float(obj)
        if not math.isfinite(f):
            return None
        return f if exact else float(f"{f:.{FLOAT_DIGITS}g}")
    if isinstance(obj, np.bool_):
        return bool(obj)
    if isinstance(obj, dict):
        return {str(k): sanitize(v, exact or str(k) == EXACT_UNDER
                                 or (key, str(k)) in EXACT_KEYS, str(k))
                for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [sanitize(v, exact) for v in obj]
    if isinstance(obj, np.ndarray):
        return [sanitize(v, exact) for v in obj.tolist()]
    if isinstance(obj, Path):
        return str(obj)
    if dataclasses.is_dataclass(obj) and hasattr(obj, "to_dict"):
        return sanitize(obj.to_dict())
    raise TypeError(f"cannot serialise {type(obj).__name__} to JSON")


def envelope(command: str, inputs: dict, parameters: dict, **sections: Any) -> dict:
    """The versioned JSON document for ``command`` (sections are result dicts)."""
    doc = {
        "schema_version": SCHEMA_VERSION,
        "tool": "entr-diag",
        "tool_version": __version__,
        "command": command,
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "inputs": inputs,
        "parameters": parameters,
    }
    doc.update(sections)
    return sanitize(doc)


def dumps(doc: dict) -> str:
    """Serialise a sanitised document; refuses NaN tokens (``allow_nan=False``)."""
    return json.dumps(sanitize(doc), indent=2, allow_nan=False) + "\n"


def write_json(path: str | Path, doc: dict) -> Path:
    """Write ``doc`` to ``path`` atomically."""
    return write_text(path, dumps(doc))
