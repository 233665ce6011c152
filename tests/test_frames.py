"""The library's public entry points refuse a token frame or dataset of the wrong type, or
a numeric parameter that is not a number, with a TypeError naming the function, the type
expected and the type given."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from entr_diag.compare import compare_gates, compare_plan, decisions_frame
from entr_diag.fit import fit_plan, fit_scaling_law
from entr_diag.forensics import detect_misalignment, forensics_plan, run_forensics
from entr_diag.gates import GATE_TYPES, FixedBand, SeqIS
from entr_diag.io import load_dataset
from entr_diag.metrics import compute_metrics, metrics_plan
from entr_diag.passes import run_pass
from entr_diag.profiles import compute_profiles, profiles_plan
from entr_diag.regime import flagged_tokens

#: (name, call) of the entry points taking a token frame
FRAME_TAKERS = [
    ("fit_scaling_law", fit_scaling_law),
    ("fit_plan", fit_plan),
    ("compare_gates", compare_gates),
    ("compare_plan", compare_plan),
    ("decisions_frame", lambda x: decisions_frame(x, [FixedBand()])),
    ("compute_metrics", compute_metrics),
    ("metrics_plan", metrics_plan),
    ("compute_profiles", compute_profiles),
    ("profiles_plan", profiles_plan),
    ("flagged_tokens", lambda x: flagged_tokens(x, 0.1)),
    ("run_pass", lambda x: run_pass(x, metrics_plan(_TOKENS.lazy()).accumulators)),
]
#: (name, call) of the entry points taking a loaded dataset
DATASET_TAKERS = [
    ("run_forensics", run_forensics),
    ("forensics_plan", forensics_plan),
    ("detect_misalignment", detect_misalignment),
]

_TOKENS = pl.DataFrame({
    "seq_key": pl.Series([1, 1, 2, 2], dtype=pl.UInt64),
    "seq_id": [1, 1, 2, 2],
    "position": [0, 1, 0, 1],
    "train_logprob": [-0.1, -0.2, -1.0, -2.0],
    "infer_logprob": [-0.12, -0.19, -1.1, -1.9],
}).with_columns(delta=pl.col("train_logprob") - pl.col("infer_logprob"),
                entropy=pl.lit(0.5))

WRONG = {
    "list": ([1, 2], "got list;"),
    "str path": ("logs.parquet", "got str; load the files first"),
    "Path": (Path("logs.parquet"), "got pathlib "),
    "numpy array": (np.zeros(3), "got numpy ndarray;"),
    "dict of columns": ({"delta": [0.1]}, "got dict;"),
    "None": (None, "got NoneType;"),
}


@pytest.mark.parametrize("what", list(WRONG))
@pytest.mark.parametrize("name,call", FRAME_TAKERS, ids=[n for n, _ in FRAME_TAKERS])
def test_frame_takers_refuse_a_wrong_type(name, call, what):
    """A list, a path, an array, a dict or None where a token frame is expected: TypeError
    naming the function, the expected polars LazyFrame and the type given."""
    bad, words = WRONG[what]
    with pytest.raises(TypeError) as e:
        call(bad)
    msg = str(e.value)
    assert msg.startswith(f"{name}: expected the token frame as a polars LazyFrame"), msg
    assert words in msg, msg


def _pandas_frame():
    """A pandas DataFrame, or (pandas is optional: the benchmark's extra, absent in [dev]) a
    stand-in of the same module and name, so the naming is checked on every install."""
    try:
        import pandas as pd
    except ImportError:
        DataFrame = type("DataFrame", (), {"__module__": "pandas.core.frame"})
        return DataFrame()
    return pd.DataFrame({"delta": [0.1]})


def test_a_pandas_frame_is_named_as_such():
    """A pandas DataFrame is named as such, with the way to load the dump."""
    with pytest.raises(TypeError, match="compute_metrics: .* got pandas DataFrame; load the "):
        compute_metrics(_pandas_frame())


def test_a_dataset_where_a_frame_is_expected_points_to_its_lf(tmp_path):
    """A loaded Dataset where its token frame is expected: the message says to pass ds.lf."""
    p = tmp_path / "x.parquet"
    _TOKENS.drop("seq_key", "delta").write_parquet(p)
    with pytest.raises(TypeError, match=r"got entr_diag Dataset; pass the dataset's token "
                                        r"frame, ds\.lf"):
        fit_scaling_law(load_dataset([p]))


def test_a_polars_dataframe_is_taken_as_its_lazy_frame():
    """A polars DataFrame is accepted where a LazyFrame is expected: same result."""
    eager, lazy = compute_metrics(_TOKENS), compute_metrics(_TOKENS.lazy())
    assert eager.to_dict() == lazy.to_dict() and eager.overall.tokens == 4
    assert flagged_tokens(_TOKENS, None).collect().height == 0


@pytest.mark.parametrize("name,call", DATASET_TAKERS, ids=[n for n, _ in DATASET_TAKERS])
@pytest.mark.parametrize("bad", [_TOKENS, _TOKENS.lazy(), "logs.parquet"],
                         ids=["DataFrame", "LazyFrame", "str"])
def test_forensics_refuse_anything_but_a_dataset(name, call, bad):
    """The forensics take a loaded dataset (they read its raw rows and accounting too): a
    frame or a path is a TypeError naming the function and the type given."""
    with pytest.raises(TypeError, match=rf"^{name}: expected a loaded dataset "
                                        r"\(entr_diag\.io\.load_dataset\(paths\)\), got "):
        call(bad)


@pytest.mark.parametrize("bad,named", [(_TOKENS, "polars DataFrame"),
                                       (_TOKENS.lazy(), "polars LazyFrame"), (3, "int"),
                                       (["x.parquet", 5], "int")],
                         ids=["DataFrame", "LazyFrame", "int", "list with an int"])
def test_load_dataset_refuses_what_is_not_a_path(bad, named):
    """load_dataset takes paths: a frame (whose truth value polars refuses), a number or a
    list holding one is a TypeError naming what was given; a generator of paths works."""
    with pytest.raises(TypeError, match=f"load_dataset: expected a path .* got {named};"):
        load_dataset(bad)


def test_load_dataset_takes_any_iterable_of_paths(tmp_path):
    p = tmp_path / "x.parquet"
    _TOKENS.drop("seq_key", "delta").write_parquet(p)
    assert load_dataset(q for q in [p]).accounting.tokens_valid == _TOKENS.height


def test_load_dataset_empty_paths_is_an_error_not_the_sample():
    """An empty list (a glob that matched nothing) is refused; only None reads the sample."""
    from entr_diag.errors import InputError

    for empty in ([], (), iter([])):
        with pytest.raises(InputError, match="no input path given .*pass None for the bundled"):
            load_dataset(empty)
    assert load_dataset(None).bundled


@pytest.mark.parametrize("cls", list(GATE_TYPES.values()), ids=list(GATE_TYPES))
def test_gate_constructors_refuse_a_parameter_that_is_not_a_number(cls):
    """Every gate given a str (or a bool) for any of its parameters raises a TypeError
    naming the gate, the parameter, the type expected and the one given; numpy scalars
    and ints are numbers."""
    for f in fields(cls):
        for bad, given in (("4", "got str ('4')."), (True, "got bool.")):
            with pytest.raises(TypeError) as e:
                cls(**{f.name: bad})
            assert str(e.value).startswith(f"{cls.__name__}: expected {f.name} as a real "
                                           "number"), str(e.value)
            assert str(e.value).endswith(given), str(e.value)
        assert cls(**{f.name: np.float64(getattr(cls(), f.name))}) == cls()
    assert SeqIS(lower=None) == SeqIS()  # lower may be None (1/upper)


@pytest.mark.parametrize("param", ["h_star", "law_k", "law_alpha", "flag_tau", "flag_eps"])
def test_compare_gates_refuses_a_law_parameter_that_is_not_a_number(param):
    """compare_gates given a str for a numeric parameter raises a TypeError naming it at
    the entry, before any pass."""
    with pytest.raises(TypeError, match=rf"^compare_gates: expected {param} as a real number"
                                        r"( or None)?, got str \('x'\)\.$"):
        compare_gates(_TOKENS, **{param: "x"})


@pytest.mark.parametrize("param", ["sweep_tau", "sweep_c", "entropy_edges", "p_edges"])
def test_compare_gates_refuses_a_list_entry_that_is_not_a_number(param):
    """A sweep or edge list holding a str (once turned silently into a float, or a bare
    ValueError) or None raises a TypeError naming the parameter and the entry."""
    for bad, shown in ((["1", 2.0, 3.0], r"'1' \(str\)"), ([0.5, None, 2.0], r"None \(NoneType\)")):
        with pytest.raises(TypeError, match=rf"^compare_gates: expected {param} as real "
                                            rf"numbers, got {shown}\.$"):
            compare_gates(_TOKENS, **{param: bad})


@pytest.mark.parametrize("fn", [compare_gates, compare_plan], ids=["compare_gates", "compare_plan"])
@pytest.mark.parametrize(("panel", "shown"), [
    ("fixed", r"str \('fixed'\)"),
    (FixedBand(c=0.5), r"one gate spec, FixedBand\(c=0.5\); wrap it in a list: panel=\[gate\]"),
    (5, "int"),
])
def test_compare_gates_refuses_a_panel_that_is_not_a_sequence_of_gates(fn, panel, shown):
    """A str panel (was iterated letter by letter: "panel entry 'f' is not a gate spec"), a
    single gate spec or a number raises a TypeError saying what panel must be."""
    with pytest.raises(TypeError, match=r"^compare_gates: expected panel as a sequence of gate "
                                        r"specs \(e\.g\. \[parse_gate_spec\('fixed'\)\] or "
                                        rf"DEFAULT_PANEL\), got {shown}\.$"):
        fn(_TOKENS, panel=panel)
    r = compare_gates(_TOKENS, panel=[FixedBand(c=0.5)])  # the same gate in a list is fine
    assert r.panel_specs == (FixedBand(c=0.5),)


@pytest.mark.parametrize("fn", [fit_scaling_law, fit_plan], ids=["fit_scaling_law", "fit_plan"])
@pytest.mark.parametrize("param", ["bins", "eps", "tau", "n_boot", "n_blocks", "seed"])
def test_fit_refuses_a_parameter_that_is_not_a_number(fn, param):
    """The fit given a str for a numeric parameter raises a TypeError naming the function
    and the parameter (was a bare TypeError from a comparison deep inside)."""
    with pytest.raises(TypeError, match=rf"^{fn.__name__}: expected {param} as a real number, "
                                        r"got str \('4'\)\.$"):
        fn(_TOKENS, **{param: "4"})


@pytest.mark.parametrize("fn", [fit_scaling_law, fit_plan], ids=["fit_scaling_law", "fit_plan"])
@pytest.mark.parametrize("param", ["bins", "n_boot", "n_blocks", "seed"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf"), 30.5])
def test_fit_refuses_an_integer_parameter_given_a_non_integral_float(fn, param, bad):
    """An integer parameter given NaN, +-inf or a fraction raises ParameterError naming
    it (was a bare ValueError or OverflowError from int())."""
    from entr_diag.errors import ParameterError

    with pytest.raises(ParameterError, match=rf"^{fn.__name__}: {param} must be an integer, "
                                             rf"got {bad!r}\.$"):
        fn(_TOKENS, **{param: bad})


def test_fit_too_many_bins_names_bins_not_n_boot():
    """bins so large that no n_boot >= MIN_BOOT fits the bootstrap's memory says that bins
    is too large and its maximum (was 'use at most n_boot = 0')."""
    from entr_diag.errors import ParameterError
    from entr_diag.fit import MAX_BOOT_CELLS, MIN_BOOT, check_fit_parameters

    most = MAX_BOOT_CELLS // (2 * MIN_BOOT)
    with pytest.raises(ParameterError, match=rf"^bins = 1000000000 is too "
                                             rf"large: .*use at most bins = {most:,} \(with "
                                             rf"the minimum n_boot = {MIN_BOOT}\), or "
                                             rf"{MAX_BOOT_CELLS // 2000:,} with n_boot = 1000\.$"):
        fit_scaling_law(_TOKENS, bins=10**9)
    with pytest.raises(ParameterError, match=r"use at most n_boot = \d+ at 30 bins"):
        check_fit_parameters(0.01, 4.0, 10**7, 30)
    with pytest.raises(ParameterError, match="bins must be an integer, got inf"):
        check_fit_parameters(0.01, 4.0, 1000, float("inf"))
    with pytest.raises(ParameterError, match="n_boot must be an integer >= 100"):
        check_fit_parameters(0.01, 4.0, float("nan"))


@pytest.mark.parametrize("fn", [fit_scaling_law, fit_plan], ids=["fit_scaling_law", "fit_plan"])
def test_fit_refuses_with_strata_that_is_not_a_bool(fn):
    """with_strata='no' (truthy: strata computed) raises a TypeError naming it."""
    with pytest.raises(TypeError, match=rf"^{fn.__name__}: expected with_strata as a bool "
                                        r"\(True or False\), got str \('no'\)\.$"):
        fn(_TOKENS, with_strata="no")


@pytest.mark.parametrize("fn", [compare_gates, compare_plan], ids=["compare_gates", "compare_plan"])
@pytest.mark.parametrize(("kwargs", "message"), [
    ({"panel": ["fixed"]}, r"expected panel entries as gate specs \(e\.g\. "
                           r"parse_gate_spec\('fixed'\)\), got str \('fixed'\)"),
    ({"panel": {FixedBand(): 1}}, r"expected panel as a sequence of gate specs .*got dict"),
    ({"entr": "4"}, r"expected entr as an EntrGate .*got str \('4'\)"),
    ({"no_fit": 1}, r"expected no_fit as a str \(why no law was fitted\) or None, got int"),
    ({"sweep_c": [[1, 2]]}, r"expected sweep_c as a flat sequence of real numbers, got a "
                            r"nested list \(shape \(1, 2\)\)"),
    ({"sweep_tau": [[1.0], [2.0]]}, r"expected sweep_tau as a flat sequence of real numbers, "
                                    r"got a nested list \(shape \(2, 1\)\)"),
])
def test_compare_gates_refuses_arguments_of_the_wrong_type(fn, kwargs, message):
    """A panel holding a str, a dict panel, an entr gate given as a str, a non-str no_fit
    or a nested sweep list raises a TypeError naming the parameter and the type given
    (were a ParameterError, or accepted silently: the dict's keys, the list flattened)."""
    with pytest.raises(TypeError, match=rf"^compare_gates: {message}\.$"):
        fn(_TOKENS, **kwargs)
