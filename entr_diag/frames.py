"""Argument checks of the library's public entry points: a token frame or a loaded dataset
of the wrong type (a pandas DataFrame, a path, a list, ...), or a numeric parameter given as
something else (a str), raises a :class:`TypeError` naming the function, the parameter, the
type expected and the type given, instead of an AttributeError or a bare TypeError from
deep inside a pass.

These are programming errors, not bad input: the CLI never makes them, so they are plain
``TypeError`` (not :class:`~entr_diag.errors.EntrDiagError`, whose exit code 2 is for
input and parameters a user gives).
"""

from __future__ import annotations

import numbers
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

__all__ = ["dataset", "given", "number", "number_array", "token_frame"]


def _given(obj: Any) -> str:
    """The type of ``obj`` as a reader knows it: ``pandas DataFrame``, ``str``, ``list``."""
    t = type(obj)
    root = t.__module__.split(".")[0]
    return t.__qualname__ if root == "builtins" else f"{root} {t.__qualname__}"


def given(value: Any) -> str:
    """A wrong-typed argument as a TypeError names it: its type, and a str's value
    (``str ('4')``, ``list``, ``pandas DataFrame``)."""
    return _given(value) + (f" ({value!r})" if isinstance(value, str | bytes) else "")


def _is_dataset(obj: Any) -> bool:
    from entr_diag.io.load import Dataset  # the loader imports the core: imported late

    return isinstance(obj, Dataset)


def token_frame(obj: Any, who: str) -> pl.LazyFrame:
    """``obj`` as the canonical token frame that ``who`` (a public function) takes: a polars
    LazyFrame as is, a polars DataFrame made lazy. Rows and columns are not checked here.

    Raises:
        TypeError: anything else, e.g. ``fit_scaling_law: expected the token frame as a
            polars LazyFrame (or DataFrame), got pandas DataFrame; ...``.
    """
    if isinstance(obj, pl.LazyFrame):
        return obj
    if isinstance(obj, pl.DataFrame):
        return obj.lazy()
    if _is_dataset(obj):
        hint = "pass the dataset's token frame, ds.lf"
    elif isinstance(obj, (str, Path)):
        hint = "load the files first: entr_diag.io.load_dataset([path]).lf"
    else:
        hint = ("load the Parquet dump with entr_diag.io.load_dataset(paths) and pass its "
                ".lf (the canonical token frame: seq_key, delta, ...)")
    raise TypeError(f"{who}: expected the token frame as a polars LazyFrame (or DataFrame), "
                    f"got {_given(obj)}; {hint}.")


def dataset(obj: Any, who: str) -> Any:
    """``obj`` if it is a loaded :class:`~entr_diag.io.load.Dataset`, the argument of ``who``
    (the forensics read its token frame, its raw rows and its accounting).

    Raises:
        TypeError: anything else, naming ``who``, the type expected and the type given.
    """
    if _is_dataset(obj):
        return obj
    raise TypeError(f"{who}: expected a loaded dataset (entr_diag.io.load_dataset(paths)), "
                    f"got {_given(obj)}; the forensics also read the raw rows and the "
                    "accounting that a token frame lacks.")


def number(value: Any, who: str, param: str, *, optional: bool = False) -> Any:
    """``value`` as given if it is a real number (int, float, a numpy scalar; not a bool),
    or None when ``optional``: the numeric parameter ``param`` of ``who`` (a public function
    or class). Its value (range, finiteness) is not checked here.

    Raises:
        TypeError: anything else, e.g. ``EntrGate: expected tau as a real number, got str
            ('4').``
    """
    if value is None and optional:
        return value
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return value
    raise TypeError(f"{who}: expected {param} as a real number{' or None' if optional else ''}, "
                    f"got {given(value)}.")


def number_array(values: Any, who: str, param: str) -> np.ndarray:
    """``values`` (a sequence or array of real numbers, or one number) as a flat float64
    array: the numeric list parameter ``param`` of ``who``. Its values (range, order) are
    not checked here.

    Raises:
        TypeError: an entry that is not a real number (a str, a bool, None, a list: a
            nested list is refused whole), e.g. ``compare_gates: expected sweep_tau as real
            numbers, got '1' (str).``
    """
    if isinstance(values, np.ndarray) and values.dtype.kind in "iuf":
        return values.astype(np.float64).ravel()
    arr = np.asarray(values, dtype=object)
    if arr.ndim > 1 and not isinstance(values, np.ndarray):  # [[1, 2]]: not flattened
        raise TypeError(f"{who}: expected {param} as a flat sequence of real numbers, got a "
                        f"nested {_given(values)} (shape {arr.shape}).")
    arr = arr.ravel()
    for v in arr:
        if not isinstance(v, numbers.Real) or isinstance(v, bool | np.bool_):
            raise TypeError(f"{who}: expected {param} as real numbers, got {v!r} "
                            f"({type(v).__name__}).")
    return arr.astype(np.float64)
