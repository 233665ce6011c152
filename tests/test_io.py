"""Ingest: layouts, column aliases per framework, exclusion accounting and refusals."""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pytest

from entr_diag.errors import InputError, SchemaError
from entr_diag.io import load_dataset
from entr_diag.io import schema as S

# ------------------------------------------------------------------ helpers


def _long(**over) -> pl.DataFrame:
    base = {
        "seq_id": [1, 1, 1, 2, 2],
        "position": [0, 1, 2, 0, 1],
        "step": [3, 3, 3, 3, 3],
        "train_logprob": [-0.1, -0.2, -0.3, -1.0, -2.0],
        "infer_logprob": [-0.12, -0.19, -0.35, -1.1, -1.9],
        "entropy": [0.5, 0.4, 0.3, 1.2, 2.0],
        "policy_version": [1, 1, 2, 0, 0],
        "train_version": [2, 2, 2, 2, 2],
        "loss_mask": [True, True, True, True, True],
    }
    base.update(over)
    return pl.DataFrame(base)


def _write(tmp_path: Path, df: pl.DataFrame, name: str = "x.parquet") -> Path:
    p = tmp_path / name
    p.parent.mkdir(parents=True, exist_ok=True)
    df.write_parquet(p)
    return p


def _valid(ds) -> pl.DataFrame:
    return ds.lf.collect().sort("seq_id", "position")


# ------------------------------------------------------------------ layouts


def test_long_layout_canonical_columns(tmp_path):
    """A long file with canonical names loads every token with delta and staleness."""
    ds = load_dataset([_write(tmp_path, _long())])
    df = _valid(ds)
    assert ds.layouts == ("long",)
    assert df.height == 5
    assert df["delta"].to_list() == pytest.approx([0.02, -0.01, 0.05, 0.1, -0.1])
    assert df["staleness"].to_list() == [1, 1, 0, 2, 2]
    assert df["seq_id"].dtype == pl.String
    assert ds.entropy_source == "inference"
    assert ds.accounting.sequences_with_version_switch == 1


def test_nested_layout_matches_long(tmp_path):
    """The nested layout (list columns, broadcast scalars) yields the same tokens as long."""
    long = _long()
    nested = (
        long.group_by("seq_id", maintain_order=True)
        .agg(pl.col("step").first(), pl.col("train_version").first(),
             pl.all().exclude("seq_id", "step", "train_version", "position"))
    )
    a = _valid(load_dataset([_write(tmp_path, long, "l.parquet")]))
    ds = load_dataset([_write(tmp_path, nested, "n.parquet")])
    b = _valid(ds)
    assert ds.layouts == ("nested",)
    cols = ["seq_id", "position", "step", "train_logprob", "infer_logprob", "entropy",
            "policy_version", "train_version", "delta"]
    assert a.select(cols).equals(b.select(cols))


def test_nested_seq_id_written_as_a_list_is_read_as_its_value(tmp_path):
    """A nested file whose seq_id is a list ([id], or the id once per token, as a
    broadcast per-token uid): read as that id, the same tokens as a scalar seq_id; a row
    whose list holds two ids is refused naming the file, column, rows and ids; in a long
    file (with or without positions) a list seq_id is refused naming the column (was a
    polars cast error)."""
    long = _long()
    nested = (long.group_by("seq_id", maintain_order=True)
              .agg(pl.col("step").first(), pl.all().exclude("seq_id", "step", "position"),
                   pl.col("seq_id").alias("sid_tok")))
    want = _valid(load_dataset([_write(tmp_path, nested.drop("sid_tok"), "n.parquet")]))
    cols = ["seq_id", "position", "step", "train_logprob", "infer_logprob", "delta"]
    for name, sid in (("one", pl.concat_list("seq_id")), ("tok", pl.col("sid_tok"))):
        f = _write(tmp_path, nested.with_columns(sid.alias("seq_id")).drop("sid_tok"),
                   f"{name}.parquet")
        got = _valid(load_dataset([f]))
        assert got.select(cols).equals(want.select(cols)), name
    mixed = nested.with_columns(
        pl.when(pl.col("seq_id") == 2).then(pl.lit([2, 7])).otherwise(pl.concat_list("seq_id"))
        .alias("seq_id")).drop("sid_tok")
    f = _write(tmp_path, mixed, "mixed.parquet")
    with pytest.raises(SchemaError, match=r"mixed.parquet: column 'seq_id' \(seq_id\) holds a "
                       r"list per row, with different values in 1 row\(s\) \(e.g. row 1: 2, 7"):
        load_dataset([f])
    for drop in ([], ["position"]):
        f = _write(tmp_path, long.with_columns(pl.concat_list("seq_id")).drop(drop),
                   "long.parquet")
        with pytest.raises(SchemaError, match=r"column 'seq_id' \(seq_id\) is a list column "
                           "but the file is in the long layout"):
            load_dataset([f])


def test_nested_one_element_lists_of_step_and_versions_hold_every_token(tmp_path):
    """A nested row's step, policy_version or train_version written as a one-element list
    ([3], also a fixed-size [1] array) is the value of all its tokens: the same tokens as
    the scalar (it was refused as per-token lists of different lengths)."""
    long = _long(policy_version=[1, 1, 1, 0, 0])
    nested = (long.group_by("seq_id", maintain_order=True)
              .agg(pl.col("step", "train_version", "policy_version").first(),
                   pl.all().exclude("seq_id", "step", "train_version", "policy_version",
                                    "position")))
    want = _valid(load_dataset([_write(tmp_path, nested, "n.parquet")]))
    cols = ["seq_id", "position", "step", "policy_version", "train_version", "delta",
            "staleness"]
    for name, df in (
            ("lists", nested.with_columns(pl.concat_list(c) for c in
                                          ("step", "train_version", "policy_version"))),
            ("arrays", nested.with_columns(pl.concat_list("step").list.to_array(1)))):
        got = _valid(load_dataset([_write(tmp_path, df, f"{name}.parquet")]))
        assert got.select(cols).equals(want.select(cols)), name


def test_nested_scalar_position_is_named_in_a_note(tmp_path):
    """A nested file whose position column holds one value per row (not a list) numbers
    its tokens by list index, and a note says so (it was ignored silently)."""
    long = _long()
    nested = (long.group_by("seq_id", maintain_order=True)
              .agg(pl.col("step").first(), pl.all().exclude("seq_id", "step", "position"))
              .with_columns(pl.lit(7).alias("position")))
    f = _write(tmp_path, nested, "n.parquet")
    ds = load_dataset([f])
    assert _valid(ds)["position"].to_list() == [0, 1, 2, 0, 1]
    assert (f"position ('position') holds one value per row in 1 nested file(s) (e.g. {f}), "
            "not a list: not used there, tokens are numbered by list index") in ds.notes


def test_nested_without_seq_id_uses_row(tmp_path):
    """Nested rows without a seq_id column are keyed by file and row number."""
    df = pl.DataFrame({"train_logprob": [[-0.1, -0.2], [-0.3]],
                       "infer_logprob": [[-0.1, -0.25], [-0.2]]})
    ds = load_dataset([_write(tmp_path, df, "n.parquet")])
    assert sorted(set(_valid(ds)["seq_id"])) == ["n.parquet:0", "n.parquet:1"]
    assert ds.accounting.sequences_total == 2


def test_layout_override_mismatch_refused(tmp_path):
    """--layout nested on a long file is refused with the reason."""
    with pytest.raises(SchemaError, match="layout nested"):
        load_dataset([_write(tmp_path, _long())], layout="nested")


def test_directory_of_shards_and_hive(tmp_path):
    """A directory of shards, hive-partitioned by step, loads as one dataset."""
    long = _long().drop("step")
    _write(tmp_path, long.head(3), "run/step=1/part-0.parquet")
    _write(tmp_path, long.tail(2), "run/step=2/part-0.parquet")
    ds = load_dataset([tmp_path / "run"])
    df = _valid(ds)
    assert df.height == 5 and len(ds.files) == 2
    assert sorted(df["step"].unique().to_list()) == [1, 2]


def test_step_folders_agreeing_with_a_global_step_column(tmp_path):
    """step=N/ folders over files holding a global_step column (another name of step) that
    says the same in every file (an empty row group included): the file's column is read,
    with a note, instead of refusing the two as ambiguous; a file that disagrees keeps the
    refusal."""
    import pyarrow.parquet as pq

    long = _long().rename({"step": "global_step"})
    _write(tmp_path, long.head(3).with_columns(pl.lit(1).alias("global_step")),
           "run/step=1/part-0.parquet")
    w = tmp_path / "run" / "step=2" / "part-0.parquet"
    w.parent.mkdir(parents=True)
    t = long.tail(2).with_columns(pl.lit(2).alias("global_step")).to_arrow()
    with pq.ParquetWriter(w, t.schema) as wr:  # (an empty row group: no statistics)
        wr.write_table(t)
        wr.write_table(t.slice(0, 0))
    ds = load_dataset([tmp_path / "run"])
    assert ds.mapping["step"] == "global_step"
    assert ("the partition folders step=... agree with the files' 'global_step' column in "
            "every file: 'global_step' is read") in ds.notes
    assert sorted(_valid(ds)["step"].unique().to_list()) == [1, 2]
    _write(tmp_path, long.head(3).with_columns(pl.lit(7).alias("global_step")),
           "run/step=1/part-9.parquet")
    with pytest.raises(SchemaError, match="ambiguous column step") as e:
        load_dataset([tmp_path / "run"])
    assert ("('step' comes from the partition folders step=...; the files' 'global_step' does "
            f"not say the same in every file: {tmp_path / 'run' / 'step=1' / 'part-9.parquet'}'s "
            "'global_step' holds 7..7 under step=1.)") in str(e.value)


def test_glob(tmp_path):
    """Glob patterns expand to the matching files."""
    _write(tmp_path, _long().head(3), "a.parquet")
    _write(tmp_path, _long().tail(2), "b.parquet")
    ds = load_dataset([str(tmp_path / "*.parquet")])
    assert ds.accounting.tokens_valid == 5


def test_position_from_row_order(tmp_path):
    """Without a position column, the token index is the row order within the sequence."""
    ds = load_dataset([_write(tmp_path, _long().drop("position"))])
    assert _valid(ds)["position"].to_list() == [0, 1, 2, 0, 1]


# ------------------------------------------------------------------ aliases


@pytest.mark.parametrize("framework", sorted(S.FRAMEWORKS))
def test_framework_names(tmp_path, framework):
    """Every framework's own column names map onto the canonical columns with --framework."""
    names = S.FRAMEWORKS[framework]
    df = _long().rename({k: v for k, v in names.items() if k in _long().columns})
    # prime-rl names only the engine side: its trainer side keeps the canonical name (a
    # preset never reads another framework's names, see test_framework_reads_only_its_names)
    ds = load_dataset([_write(tmp_path, df)], framework=framework)
    assert ds.accounting.tokens_valid == 5
    for canon, src in names.items():
        if src in df.columns:
            assert ds.mapping[canon] == src


@pytest.mark.parametrize("canon", ["train_logprob", "infer_logprob", "entropy", "loss_mask",
                                   "policy_version", "step"])
def test_generic_aliases_autodetected(tmp_path, canon):
    """Each known alias of a canonical column is detected without any option."""
    for alias in S.BY_NAME[canon].aliases:
        df = _long().rename({canon: alias})
        ds = load_dataset([_write(tmp_path, df, f"{alias}.parquet")])
        assert ds.mapping[canon] == alias


def test_column_names_in_another_case_are_matched_with_a_note(tmp_path):
    """'Entropy', or every column in upper case, is read as the canonical column, with a
    note saying the name matched ignoring case; an exact name wins over a case variant;
    two case variants of one name are both left unused, with a note naming them."""
    long = _long()
    want = _valid(load_dataset([_write(tmp_path, long, "l.parquet")]))
    for name, df in (("cap", long.rename({"entropy": "Entropy"})),
                     ("upper", long.rename({c: c.upper() for c in long.columns}))):
        ds = load_dataset([_write(tmp_path, df, f"{name}.parquet")])
        assert _valid(ds).equals(want), name
        assert "entropy <- 'Entropy' (its name matched ignoring case)" in ds.notes or (
            "entropy <- 'ENTROPY' (its name matched ignoring case)" in ds.notes), ds.notes
    both = long.with_columns((pl.col("entropy") * 2).alias("Entropy"))
    ds = load_dataset([_write(tmp_path, both, "both.parquet")])
    assert ds.mapping["entropy"] == "entropy" and _valid(ds).equals(want)
    two = long.rename({"entropy": "Entropy"}).with_columns(pl.col("Entropy").alias("ENTROPY"))
    ds = load_dataset([_write(tmp_path, two, "two.parquet")])
    assert "entropy" not in ds.mapping
    assert ("entropy: 'ENTROPY', 'Entropy' match 'entropy' ignoring case; none is used: map "
            "one with --column entropy=NAME") in ds.notes
    two = long.rename({"train_logprob": "Train_Logprob"}).with_columns(
        pl.col("Train_Logprob").alias("TRAIN_LOGPROB"))
    with pytest.raises(SchemaError, match=r"missing required column\(s\) train_logprob\. "
                       r"'TRAIN_LOGPROB', 'Train_Logprob' match 'train_logprob' ignoring case"):
        load_dataset([_write(tmp_path, two, "twotl.parquet")])


def test_case_variants_follow_the_framework_presets(tmp_path):
    """A name in another case obeys the preset rules of the name it spells: --framework trl
    never reads verl's Old_Log_Probs (refused, saying whose name it is); --framework slime
    reads Rollout_Id as the step and Index as the sequence id (was ambiguous)."""
    long = _long()
    verl = long.rename({"train_logprob": "Old_Log_Probs", "infer_logprob": "Rollout_Log_Probs"})
    with pytest.raises(SchemaError, match=r"'Old_Log_Probs' is \(ignoring case\) the name "
                       r"verl and roll use for train_logprob"):
        load_dataset([_write(tmp_path, verl, "verl.parquet")], framework="trl")
    slime = long.rename({"train_logprob": "Log_Probs", "infer_logprob": "Rollout_Log_Probs",
                         "seq_id": "Index", "step": "Rollout_Id"})
    ds = load_dataset([_write(tmp_path, slime, "slime.parquet")], framework="slime")
    assert ds.mapping["step"] == "Rollout_Id" and ds.mapping["seq_id"] == "Index"
    assert ds.mapping["train_logprob"] == "Log_Probs"


def test_shards_spelling_a_column_in_two_cases_are_refused_as_such(tmp_path):
    """One shard with seq_id (train_logprob), the other with SEQ_ID (TRAIN_LOGPROB): the
    refusal says the files name their columns differently, naming both spellings (it said
    the first file had no sequence id)."""
    for col in ("seq_id", "train_logprob"):
        d = tmp_path / col
        _write(d, _long(), "a.parquet")
        _write(d, _long(seq_id=[7, 7, 7, 8, 8]).rename({col: col.upper()}), "b.parquet")
        with pytest.raises(SchemaError, match=rf"^the input's files name their columns "
                           rf"differently: {col} is '{col}' in .*a\.parquet and "
                           rf"'{col.upper()}' in .*b\.parquet"):
            load_dataset([d])


def test_verl_nested_names(tmp_path):
    """A verl-style nested dump (old_log_probs, rollout_log_probs, entropys, response_mask)."""
    df = pl.DataFrame({
        "seq_id": [0, 1],
        "old_log_probs": [[-0.1, -0.2, -9999.0], [-0.3, -0.4]],
        "rollout_log_probs": [[-0.11, -0.22, 0.0], [-0.31, -0.41]],
        "entropys": [[0.3, 0.2, 0.0], [0.1, 0.5]],
        "response_mask": [[1, 1, 0], [1, 1]],
    })
    ds = load_dataset([_write(tmp_path, df)])
    assert ds.mapping["loss_mask"] == "response_mask"
    assert ds.accounting.tokens_valid == 4
    assert ds.accounting.tokens_unmasked == 1
    assert ds.accounting.excluded == {}  # padding outside the mask is not bad


def test_ambiguous_logprobs_refused_then_mapped(tmp_path):
    """Bare `logprobs` is never guessed; an explicit mapping or --framework resolves it."""
    df = _long().rename({"infer_logprob": "logprobs", "train_logprob": "prox_logp"})
    p = _write(tmp_path, df)
    with pytest.raises(SchemaError, match="ambiguous"):
        load_dataset([p])
    assert load_dataset([p], columns={"infer_logprob": "logprobs"}).mapping["infer_logprob"] == "logprobs"
    assert load_dataset([p], framework="areal").mapping["infer_logprob"] == "logprobs"


def test_trainer_entropy_fallback(tmp_path):
    """With only a trainer-side entropy, it is used and the dataset says so."""
    ds = load_dataset([_write(tmp_path, _long().rename({"entropy": "train_entropy"}))])
    assert ds.entropy_source == "trainer"
    assert ds.has("entropy")


# ------------------------------------------------------------------ exclusions

_BAD_CASES = {
    # reason: (column overrides on row 1 (0-based) of the 5-token file, expected count)
    "non_finite_logprob": {"train_logprob": [-0.1, float("nan"), -0.3, -1.0, float("-inf")]},
    "sentinel_logprob": {"infer_logprob": [-0.12, -9999.0, -0.35, -99999.0, -1.9]},
    "positive_logprob": {"infer_logprob": [-0.12, 1.0, -0.35, -1.1, -1.9]},
    # +1e-7 is fp32 rounding of a near-certain token (kept); +2e-4 is not
    "positive_logprob_beyond_rounding": {"train_logprob": [1e-7, 2e-4, -0.3, 5e-5, -1.9]},
    "zero_placeholder": {"infer_logprob": [-0.12, -0.19, 0.0, -1.1, 0.0]},
    # both sides 0.0: placeholders at an entropy of 1e-3 nats or more (0.5, 2.0), a
    # near-certain token below it (5e-4: an fp32 log-softmax of exactly 0.0 needs H < 2e-6)
    "zero_placeholder_both_sides": {"train_logprob": [0.0, -0.2, -0.3, 0.0, 0.0],
                                    "infer_logprob": [0.0, -0.19, -0.35, 0.0, 0.0],
                                    "entropy": [0.5, 0.4, 0.3, 5e-4, 2.0]},
    "invalid_entropy": {"entropy": [0.5, -0.1, float("nan"), 1.2, 2.0]},
    # an entropy is at most ln(vocabulary size) < 20 nats: 65504 (a float16 max) is garbage
    "invalid_entropy_above_ln_v": {"entropy": [0.5, 65504.0, 0.3, 20.5, 20.0]},
    # -1e-8 is float32 rounding of a near-certain distribution (kept, read as 0); -2e-4 not
    "invalid_entropy_beyond_rounding": {"entropy": [-1e-8, -2e-4, 0.3, -1e-4, 2.0]},
    "negative_version": {"policy_version": [1, -1, 2, 0, 0]},
    # a token without a place in its sequence (a null or negative position column value)
    "invalid_position": {"position": [0, None, 2, -3, 1]},
}
_EXPECTED = {"non_finite_logprob": 2, "sentinel_logprob": 2, "positive_logprob": 1,
             "positive_logprob_beyond_rounding": 1,
             "zero_placeholder": 2, "invalid_entropy": 2, "invalid_entropy_above_ln_v": 2,
             "invalid_entropy_beyond_rounding": 1, "zero_placeholder_both_sides": 2,
             "negative_version": 1, "invalid_position": 2}


@pytest.mark.parametrize("reason", sorted(_BAD_CASES))
def test_each_exclusion_reason_counted(tmp_path, reason):
    """Each kind of bad loss-masked token is counted under its reason and excluded."""
    ds = load_dataset([_write(tmp_path, _long(**_BAD_CASES[reason]))])
    n = _EXPECTED[reason]
    reason = (reason.removesuffix("_above_ln_v").removesuffix("_beyond_rounding")
              .removesuffix("_both_sides"))
    assert dict(ds.accounting.excluded) == {reason: n}
    assert ds.accounting.tokens_valid == 5 - n
    assert _valid(ds).height == 5 - n
    assert ds.accounting.to_dict()["exclusions"] == {reason: n}


def test_entropy_just_below_zero_is_rounding_read_as_zero_and_counted(tmp_path):
    """Entropies in [-1e-4, 0) nats (float32 rounding of a near-certain distribution gives
    -1e-9 to -1e-7) are valid tokens, their entropy read as 0, counted in the accounting
    (JSON) and said in the CLI's note; they were excluded as invalid_entropy with a hint
    about bits or logits, removing exactly the near-certain tokens."""
    from typer.testing import CliRunner

    from entr_diag.cli import app

    p = _write(tmp_path, _long(entropy=[-1e-8, -1e-7, 0.3, -2e-4, 2.0]))
    ds = load_dataset([p])
    acc = ds.accounting
    assert dict(acc.excluded) == {"invalid_entropy": 1} and acc.tokens_valid == 4
    assert acc.tokens_entropy_below_zero == 2
    assert acc.to_dict()["tokens_entropy_below_zero"] == 2
    assert _valid(ds)["entropy"].to_list() == [0.0, 0.0, 0.3, 2.0]
    assert ds.entropy_fine_counts[0] == 2  # (in bin 0, below H_MIN, as read)
    r = CliRunner().invoke(app, ["inspect", str(p)])
    assert ("2 valid token(s) have an entropy just below 0 (down to -0.0001 nats: "
            "floating-point rounding of a near-certain distribution), read as 0") in \
        " ".join(r.stderr.split())
    assert load_dataset([_write(tmp_path, _long(), "ok.parquet")]
                        ).accounting.tokens_entropy_below_zero == 0


def test_null_step_tokens_are_counted_and_warned_about(tmp_path):
    """Valid tokens with a null step are counted (their sequence is keyed apart) and the CLI
    warns about them."""
    from typer.testing import CliRunner

    from entr_diag.cli import app

    p = _write(tmp_path, _long(step=[3, 3, None, 3, 3]))
    ds = load_dataset([p])
    assert ds.accounting.tokens_without_step == 1 and ds.accounting.sequences_total == 3
    assert ds.accounting.to_dict()["tokens_without_step"] == 1
    r = CliRunner().invoke(app, ["inspect", str(p)])
    assert "warning: 1 valid token(s) have a null step:" in " ".join(r.stderr.split())
    assert load_dataset([_write(tmp_path, _long(), "ok.parquet")]).accounting \
        .tokens_without_step == 0
    # a step of -2^63 (the 64-bit minimum, a placeholder) reads as null: said so
    # (helper-48: "null step" on a file without a null)
    p = _write(tmp_path, _long(step=[3, 3, -(2**63), 3, 3]), "min.parquet")
    assert load_dataset([p]).accounting.tokens_without_step == 1
    r = CliRunner().invoke(app, ["inspect", str(p)])
    assert ("warning: 1 valid token(s) have a null step (null in the file, or the 64-bit "
            "minimum -9223372036854775808, a placeholder that reads as null):") in " ".join(
        r.stderr.split()), r.stderr


def test_tokens_without_a_version_are_counted_and_warned_about(tmp_path):
    """Valid tokens with a null policy_version or train_version (or, in a float column, a
    whole value beyond int64, read as null) are in no staleness bucket: counted
    (tokens_without_staleness; the buckets summed with them give every valid token) and
    warned about; without a train_version column there is no staleness to miss."""
    from typer.testing import CliRunner

    from entr_diag.cli import app

    p = _write(tmp_path, _long(policy_version=[1, None, 2, 0, 0]))
    acc = load_dataset([p]).accounting
    assert acc.tokens_without_staleness == 1
    assert sum(acc.staleness.values()) + 1 == acc.tokens_valid == 5
    assert acc.to_dict()["tokens_without_staleness"] == 1
    r = CliRunner().invoke(app, ["inspect", str(p)])
    assert "warning: 1 valid token(s) have no policy_version or train_version" in r.stderr
    p = _write(tmp_path, _long(train_version=[2.0, 2.0, 1e30, 2.0, float("nan")]), "f.parquet")
    assert load_dataset([p]).accounting.tokens_without_staleness == 2
    p = _write(tmp_path, _long(policy_version=[1, None, 2, 0, 0]).drop("train_version"),
               "pv.parquet")
    assert load_dataset([p]).accounting.tokens_without_staleness == 0
    # a version (or step) column of nulls only: not used, as if absent, with a note
    nulls = pl.Series([None] * 5, dtype=pl.Int64)
    p = _write(tmp_path, _long(policy_version=nulls, step=nulls), "allnull.parquet")
    ds = load_dataset([p])
    assert "policy_version" not in ds.mapping and "step" not in ds.mapping
    assert ds.accounting.tokens_without_staleness == 0
    assert "policy_version holds only nulls in every file: not used (as if absent)" \
        in ds.notes
    ok = load_dataset([_write(tmp_path, _long(), "ok.parquet")]).accounting
    assert ok.tokens_without_staleness == 0


def test_step_folders_named_like_verl_are_read_as_the_step(tmp_path):
    """Shards in folders named global_step_N (verl), step_N or step-N without a step
    column: the step is read from the folder, with a note; a step=N folder above wins,
    a file's own step column is the one used, and other names (ckpt_step_3) are no step."""
    run = tmp_path / "run"
    for i, name in enumerate(("global_step_1", "global_step_2", "step_3", "step-4")):
        _write(run, _long(seq_id=[10 * i + 1] * 3 + [10 * i + 2] * 2).drop("step"),
               f"{name}/data.parquet")
    ds = load_dataset([str(run)])
    assert ds.mapping["step"] == "step" and ds.accounting.steps == (1, 2, 3, 4)
    assert any(n.startswith("step <- the folder names (global_step_N") for n in ds.notes)
    two = tmp_path / "two"
    _write(two, _long().drop("step"), "global_step_3/step_1/data.parquet")
    ds = load_dataset([str(two)])
    assert ds.accounting.steps == (1,)
    assert any("1 file(s) lie under several such folders with different numbers" in n
               and n.endswith("the innermost is read") for n in ds.notes)
    top = tmp_path / "top"
    _write(top, _long().drop("step"), "step=7/global_step_1/data.parquet")
    assert load_dataset([str(top)]).accounting.steps == (7,)
    own = tmp_path / "own"
    _write(own, _long(), "global_step_1/data.parquet")  # its step column holds 3
    ds = load_dataset([str(own)])
    assert ds.accounting.steps == (3,)
    assert not any(n.startswith("step <- the folder names") for n in ds.notes)
    other = tmp_path / "other"
    _write(other, _long().drop("step"), "ckpt_step_3/data.parquet")
    assert "step" not in load_dataset([str(other)]).mapping


def test_rows_written_twice_without_a_position_column_are_counted(tmp_path):
    """Without a position column, rows repeating the row before them exactly (both
    logprobs and the entropy, at 0.01 nats or more) are counted and warned about: rows
    written twice in a row, which the numbering by row order cannot show; near-certain
    tokens repeating (H below 0.01) and runs without repeats count none, and with a
    position column the duplicate-position check tells instead."""
    from typer.testing import CliRunner

    from entr_diag.cli import app

    src = Path(__file__).resolve().parents[1] / "entr_diag" / "sample_data" / \
        "sample_run_long.parquet"
    df = pl.read_parquet(src).filter(pl.col("loss_mask")).sort("seq_id", "position")
    twice = pl.int_range(pl.len()) % 10 == 0
    ix = df.with_row_index("_r")
    dup = pl.concat([ix, ix.filter(twice)]).sort("_r", maintain_order=True).drop("_r")
    n = df.filter(twice & (pl.col("entropy") >= 0.01)).height
    p = _write(tmp_path, dup.drop("position"), "dup.parquet")
    acc = load_dataset([p]).accounting
    assert acc.tokens_repeating_row == n > 1000
    assert acc.tokens_row_checked == dup.filter(pl.col("entropy") >= 0.01).height
    assert acc.to_dict()["tokens_repeating_row"] == n
    r = CliRunner().invoke(app, ["inspect", str(p)])
    assert f"warning: {n:,} valid token(s) repeat the row before them in their sequence " \
        "exactly" in " ".join(r.stderr.split())
    ok = load_dataset([_write(tmp_path, df.drop("position"), "ok.parquet")]).accounting
    assert ok.tokens_repeating_row == 0 and ok.tokens_row_checked > 0
    assert ok.repeated_rows_sampled[1] < 10 and ok.repeated_rows_sampled[0] > 1000
    # a fifth of the sequences written twice as a block (A A), and the run written again
    # into a second file re-encoded: rows repeat rows of their sequence, not in a row
    blocks = pl.concat([g if int(g["seq_id"][0]) % 5 else pl.concat([g, g])
                        for g in df.partition_by("seq_id", maintain_order=True)])
    p = _write(tmp_path, blocks.drop("position"), "blocks.parquet")
    acc = load_dataset([p]).accounting
    assert acc.tokens_repeating_row < 20
    sampled, again = acc.repeated_rows_sampled
    share = (blocks.height - df.height) / blocks.height
    assert again >= 10 and again / sampled == pytest.approx(share, abs=0.05)
    r = CliRunner().invoke(app, ["inspect", str(p)])
    assert "of the valid tokens (" in r.stderr and "repeat another row of their sequence" \
        in " ".join(r.stderr.split())
    a = _write(tmp_path, df.drop("position"), "a.parquet")
    df.drop("position").write_parquet(tmp_path / "b.parquet", compression="snappy",
                                      row_group_size=10_000)
    sampled, again = load_dataset([a, tmp_path / "b.parquet"]).accounting.repeated_rows_sampled
    assert again / sampled == pytest.approx(0.5, abs=0.02)
    # columns rounded to 0.01 nats repeat values in consecutive tokens: the rounding
    # warning explains them, no "rows written twice" (its advice would drop real tokens)
    lp3 = pl.col("train_logprob", "infer_logprob", "entropy")
    p = _write(tmp_path, df.drop("position").with_columns(lp3.round(2)), "r2.parquet")
    assert load_dataset([p]).accounting.tokens_repeating_row >= 20
    r = CliRunner().invoke(app, ["inspect", str(p)])
    assert "stored rounded" in r.stderr and "repeat the row before" not in r.stderr
    assert "repeat another row" not in r.stderr
    # with a position column: not checked this way (the positions tell)
    acc = load_dataset([_write(tmp_path, dup, "pos.parquet")]).accounting
    assert acc.tokens_row_checked == 0 and acc.sequences_with_duplicate_positions > 0


def test_padding_with_marker_positions_is_no_duplicate(tmp_path):
    """Rows outside the loss mask (or excluded) with a marker position (-1, null) do not
    make a sequence look duplicated; a copied shard still does."""
    pad = _long(position=[0, 1, 2, -1, -1], loss_mask=[True, True, True, False, False],
                seq_id=[1, 1, 1, 1, 1])
    ds = load_dataset([_write(tmp_path, pad)])
    assert ds.accounting.sequences_with_duplicate_positions == 0
    d = tmp_path / "copies"
    _write(d, _long(), "a.parquet")
    _write(d, _long(), "b.parquet")
    assert load_dataset([d]).accounting.sequences_with_duplicate_positions == 2


def test_hive_default_partition_is_a_null_value(tmp_path):
    """Spark/Hive's step=__HIVE_DEFAULT_PARTITION__ folder is a null step (counted and
    warned about), not a conversion error."""
    _write(tmp_path / "run" / "step=3", _long().drop("step"), "a.parquet")
    _write(tmp_path / "run" / "step=__HIVE_DEFAULT_PARTITION__", _long().drop("step"),
           "b.parquet")
    ds = load_dataset([tmp_path / "run"])
    assert ds.accounting.steps == (3,) and ds.accounting.tokens_without_step == 5


def test_bad_values_outside_mask_ignored(tmp_path):
    """Placeholders on tokens outside the loss mask are neither counted nor kept."""
    df = _long(train_logprob=[-0.1, float("nan"), -0.3, 1.0, -2.0],
               loss_mask=[True, False, True, False, True])
    ds = load_dataset([_write(tmp_path, df)])
    assert ds.accounting.excluded == {}
    assert ds.accounting.tokens_unmasked == 2
    assert ds.accounting.tokens_valid == 3


def test_null_mask_and_empty_sequences(tmp_path):
    """Null loss_mask is an exclusion; sequences with no loss-masked token are counted."""
    df = _long(loss_mask=[True, None, True, False, False])
    ds = load_dataset([_write(tmp_path, df)])
    assert ds.accounting.excluded == {"null_loss_mask": 1}
    assert ds.accounting.sequences_without_masked_tokens == 1
    assert ds.accounting.sequences_valid == 1


@pytest.mark.parametrize("dtype", [pl.Float32, pl.Float64, pl.Int64, pl.UInt8])
def test_numeric_loss_mask_is_0_or_1_and_other_values_are_counted(tmp_path, dtype):
    """A numeric loss mask (float or int 0/1, as torch dumps write it) is accepted; a value
    other than 0 or 1 (a weight, a label, NaN) is counted as invalid_loss_mask, never read
    as true."""
    floats = dtype in (pl.Float32, pl.Float64)
    ok = load_dataset([_write(tmp_path, _long(loss_mask=pl.Series([1, 1, 0, 1, 0], dtype=dtype)),
                              "ok.parquet")])
    assert ok.accounting.tokens_valid == 3 and ok.accounting.tokens_unmasked == 2
    assert ok.accounting.excluded == {}
    odd = [1, 2, 0, 0.5 if floats else 7, float("nan") if floats else 1]
    bad = load_dataset([_write(tmp_path, _long(loss_mask=pl.Series(odd, dtype=dtype)),
                               "bad.parquet")])
    n_bad = 3 if floats else 2
    assert bad.accounting.excluded == {"invalid_loss_mask": n_bad}
    assert bad.accounting.tokens_unmasked == 1
    assert bad.accounting.tokens_valid == 4 - n_bad
    assert _valid(bad)["position"].to_list() == ([0] if floats else [0, 1])


def test_numeric_loss_mask_in_nested_layout(tmp_path):
    """A nested list<float> mask: 0/1 per token, other values counted."""
    df = pl.DataFrame({"seq_id": [0, 1], "train_logprob": [[-0.1, -0.2], [-0.3, -0.4]],
                       "infer_logprob": [[-0.2, -0.1], [-0.3, -0.5]],
                       "response_mask": [[1.0, 0.0], [1.0, 0.25]]})
    ds = load_dataset([_write(tmp_path, df)])
    assert ds.accounting.tokens_valid == 2 and ds.accounting.tokens_unmasked == 1
    assert ds.accounting.excluded == {"invalid_loss_mask": 1}


def test_dictionary_encoded_string_seq_id_is_read(tmp_path):
    """String ids stored dictionary-encoded (a pandas categorical) load like plain strings."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    df = _long(seq_id=["a", "a", "a", "b", "b"])
    plain = _write(tmp_path, df, "plain.parquet")
    t = df.to_arrow()
    t = t.set_column(0, "seq_id", pc.dictionary_encode(t.column("seq_id")))
    assert pa.types.is_dictionary(t.schema.field("seq_id").type)
    pq.write_table(t, tmp_path / "dict.parquet")
    assert pa.types.is_dictionary(pq.read_schema(tmp_path / "dict.parquet").field("seq_id").type)
    a, b = load_dataset([plain]), load_dataset([tmp_path / "dict.parquet"])
    assert _valid(a).equals(_valid(b))
    assert a.accounting.to_dict() == b.accounting.to_dict()


def test_string_view_seq_id_is_read(tmp_path):
    """String ids stored as Arrow string_view (newer writers) load like plain strings: they
    were refused as 'seq_id needs integer or string values' (helper-29 F5)."""
    import pyarrow.parquet as pq

    df = _long(seq_id=["a", "a", "a", "b", "b"])
    plain = _write(tmp_path, df, "plain.parquet")
    t = df.to_arrow()
    t = t.set_column(0, "seq_id", t.column("seq_id").cast(pa.string_view()))
    pq.write_table(t, tmp_path / "view.parquet")
    assert pa.types.is_string_view(pq.read_schema(tmp_path / "view.parquet").field("seq_id").type)
    a, b = load_dataset([plain]), load_dataset([tmp_path / "view.parquet"])
    assert _valid(a).equals(_valid(b))
    assert a.accounting.to_dict() == b.accounting.to_dict()


def test_uint64_seq_ids_above_2_63_are_read(tmp_path):
    """uint64 ids above 2^63 (hashes) load as UInt64; mixed with signed ids that are never
    negative (by their statistics: a writer upgraded to uint64 ids) still as UInt64, with a
    negative one as strings."""
    big = 2**63 + 7
    ids = pl.Series([big, big, big, big + 1, big + 1], dtype=pl.UInt64)
    a = _write(tmp_path, _long(seq_id=ids), "u.parquet")
    ds = load_dataset([a])
    assert ds.seq_id_dtype == pl.UInt64 and ds.accounting.sequences_valid == 2
    assert sorted(set(_valid(ds)["seq_id"].to_list())) == [str(big), str(big + 1)]
    b = _write(tmp_path, _long(seq_id=[5, 5, 5, 6, 6]), "i.parquet")
    mixed = load_dataset([a, b])
    assert mixed.seq_id_dtype == pl.UInt64 and mixed.accounting.sequences_valid == 4
    assert sorted(set(_valid(mixed)["seq_id"].to_list())) == ["5", "6", str(big), str(big + 1)]
    b = _write(tmp_path, _long(seq_id=[5, 5, 5, -6, -6]), "i.parquet")
    mixed = load_dataset([a, b])
    assert mixed.seq_id_dtype == pl.String and mixed.accounting.sequences_valid == 4


def test_long_shard_with_a_nested_shard_lacking_seq_id_and_position(tmp_path):
    """Shards may mix layouts: a nested shard without seq_id / position names its rows
    file:row and numbers tokens by list index, while the long shard keeps its own ids and
    positions; a long shard without any seq_id is refused naming it (was a KeyError)."""
    d = tmp_path / "mixed"
    long = _write(d, _long(position=[5, 6, 7, 0, 1]), "long.parquet")
    nested = pl.DataFrame({"train_logprob": [[-0.1, -0.2, -0.3], [-0.3, -0.1]],
                           "infer_logprob": [[-0.1, -0.25, -0.3], [-0.31, -0.1]]})
    _write(d, nested, "nested.parquet")
    ds = load_dataset([d])
    df = ds.lf.select("seq_id", "position").collect()
    assert df.height == 10 and ds.accounting.sequences_valid == 4
    assert sorted(df.filter(pl.col("seq_id") == "1")["position"].to_list()) == [5, 6, 7]
    assert sorted(df.filter(pl.col("seq_id") == "nested.parquet:0")["position"].to_list()) \
        == [0, 1, 2]
    assert any("all nested" in n for n in ds.notes)
    pl.read_parquet(long).drop("seq_id").write_parquet(long)
    with pytest.raises(SchemaError, match="long.parquet: the long layout"):
        load_dataset([d])


def test_nested_files_sharing_a_name_keep_their_sequences_apart(tmp_path):
    """Nested shards without seq_id name their sequences file:row; two files of one name in
    different folders (per-rank dumps) are named by their path below the input folder, not
    merged into one set of sequences (and flagged as duplicates)."""
    for r in (0, 1):
        (tmp_path / f"r{r}").mkdir()
        pl.DataFrame({"train_logprob": [[-0.1, -0.2], [-0.3]],
                      "infer_logprob": [[-0.1, -0.25], [-0.31]]}).write_parquet(
            tmp_path / f"r{r}" / "part-0.parquet")
    ds = load_dataset([tmp_path])
    assert ds.accounting.sequences_total == 4
    assert ds.accounting.sequences_with_duplicate_positions == 0
    assert sorted(ds.lf.select("seq_id").unique().collect()["seq_id"].to_list()) == [
        "r0/part-0.parquet:0", "r0/part-0.parquet:1", "r1/part-0.parquet:0",
        "r1/part-0.parquet:1"]


def test_integer_logprob_columns_are_read_with_a_warning(tmp_path):
    """Integer-typed logprob (or entropy) columns are read as numbers, with a warning naming
    the column and a file: rounded logprobs make every statistic meaningless."""
    df = _long(train_logprob=[-1, 0, -2, -1, 0])
    p = _write(tmp_path, df.with_columns(pl.col("train_logprob").cast(pl.Int32)))
    ds = load_dataset([p])
    warn = [n for n in ds.notes if n.startswith("warning: train_logprob")]
    assert len(warn) == 1 and str(p) in warn[0] and "integers in 1 of 1 files" in warn[0]
    assert not any(n.startswith("warning:") for n in load_dataset([_write(
        tmp_path, _long(), "float.parquet")]).notes)


def test_byte_copies_among_the_inputs_are_named(tmp_path):
    """A shard copied twice into the input (its tokens count twice) is named in a warning;
    distinct shards of the same shape are not."""
    import shutil

    a = _write(tmp_path / "run", _long(), "a.parquet")
    shutil.copy(a, tmp_path / "run" / "b.parquet")
    _write(tmp_path / "run", _long(train_logprob=[-0.5, -0.2, -0.3, -1.0, -2.0]), "c.parquet")
    warn = [n for n in load_dataset([tmp_path / "run"]).notes if "copies" in n]
    assert len(warn) == 1 and warn[0].startswith(f"warning: {a} and {tmp_path / 'run' / 'b.parquet'}")
    (tmp_path / "run" / "b.parquet").unlink()
    assert not any("copies" in n for n in load_dataset([tmp_path / "run"]).notes)


def test_a_copy_under_a_partition_folder_its_columns_override_is_named(tmp_path):
    """A shard copied under step=7/ while it holds its own step column (the folder's value
    is not read): its tokens are the same, so it is named as a copy; under a folder
    whose value is read (a column the file lacks) it is no copy."""
    import shutil

    a = _write(tmp_path / "run", _long(), "a.parquet")
    (tmp_path / "run" / "step=7").mkdir()
    b = tmp_path / "run" / "step=7" / "a.parquet"
    shutil.copy(a, b)
    warn = [n for n in load_dataset([a, b]).notes if "copies" in n]
    assert len(warn) == 1 and warn[0].startswith(f"warning: {a} and {b} look like copies"), warn
    c = _write(tmp_path / "nostep", _long().drop("step"), "a.parquet")
    (tmp_path / "nostep" / "step=7").mkdir()
    d = tmp_path / "nostep" / "step=7" / "a.parquet"
    shutil.copy(c, d)
    (tmp_path / "nostep" / "step=3").mkdir()
    c3 = tmp_path / "nostep" / "step=3" / "a.parquet"
    shutil.move(c, c3)
    assert not any("copies" in n for n in load_dataset([c3, d]).notes)


def test_fixed_size_list_columns_read_like_lists(tmp_path):
    """A padded [batch, length] tensor dump (pyarrow fixed_size_list, polars Array) loads
    like the same data in variable-length lists; the mask drops the padding."""
    import pyarrow.parquet as pq

    cols = {"old_log_probs": [[-0.1, -0.2, -0.3], [-0.3, -0.1, -9.0]],
            "rollout_log_probs": [[-0.12, -0.25, -0.3], [-0.31, -0.1, -9.0]],
            "response_mask": [[1, 1, 1], [1, 1, 0]]}
    lists = pa.table({k: pa.array(v) for k, v in cols.items()})
    fixed = pa.table({k: pa.array(v, type=pa.list_(pa.float64() if "log" in k else pa.int8(), 3))
                      for k, v in cols.items()})
    assert pa.types.is_fixed_size_list(fixed.schema.field("old_log_probs").type)
    pq.write_table(lists, tmp_path / "lists.parquet")
    pq.write_table(fixed, tmp_path / "fixed.parquet")
    a, b = load_dataset([tmp_path / "lists.parquet"]), load_dataset([tmp_path / "fixed.parquet"])
    assert b.accounting.tokens_valid == 5 and b.accounting.tokens_unmasked == 1
    cols_out = ["position", "train_logprob", "infer_logprob"]
    assert _valid(a).select(cols_out).equals(_valid(b).select(cols_out))


def test_padded_tensor_without_mask_drops_trailing_zero_padding(tmp_path):
    """A padded [batch, length] tensor dumped without its mask pads with exact zeros: the
    trailing all-zero rows are tensor padding (outside the loss mask, counted), not tokens
    at H = 0 with delta = 0; zeros inside a sequence, a null/NaN and a zero on one side only
    are not padding; a file with a mask keeps its mask's word."""
    import pyarrow.parquet as pq

    tl = [[-0.1, 0.0, -0.3, 0.0, 0.0], [-0.3, -0.1, 0.0, 0.0, 0.0], [0.0] * 5,
          [-0.2, -0.1, float("nan"), 0.0, 0.0], [-0.2, -0.1, -0.1, 0.0, -0.2]]
    il = [[-0.1, 0.0, -0.3, 0.0, 0.0], [-0.31, -0.1, -0.2, 0.0, 0.0], [0.0] * 5,
          [-0.2, -0.1, -0.4, 0.0, 0.0], [-0.2, -0.1, -0.1, 0.0, -0.2]]
    h = [[0.5, 0.0, 0.4, 0.0, 0.0], [0.2, 0.1, 0.3, 0.0, 0.0], [0.0] * 5,
         [0.1, 0.2, 0.3, 0.0, 0.0], [0.1, 0.2, 0.3, 0.0, 0.1]]
    t = pa.table({"old_log_probs": pa.array(tl, type=pa.list_(pa.float64(), 5)),
                  "rollout_log_probs": pa.array(il, type=pa.list_(pa.float64(), 5)),
                  "entropys": pa.array(h, type=pa.list_(pa.float64(), 5))})
    pq.write_table(t, tmp_path / "padded.parquet")
    acc = load_dataset([tmp_path / "padded.parquet"]).accounting
    # trailing padding: 2 + 2 + 5 + 2 + 0 rows; the row 2's zero inside is kept
    assert acc.tokens_padding == 11 and acc.tokens_unmasked == 11
    assert acc.tokens_total == 25 and acc.tokens_masked == 14
    # row 0: 3 tokens (a zero inside stays a token); row 1: 3 (one zero side: placeholder);
    # row 3: 3 (NaN: non-finite); row 4: 5
    assert acc.excluded == {"zero_placeholder": 1, "non_finite_logprob": 1}
    assert acc.tokens_valid == 12 and acc.sequences_without_masked_tokens == 1
    assert load_dataset([tmp_path / "padded.parquet"]).accounting.to_dict()["tokens_padding"] == 11
    # left padding (a tensor padded on the left) is padding too
    left = pa.table({k: pa.array([row[::-1] for row in v], type=pa.list_(pa.float64(), 5))
                     for k, v in (("old_log_probs", tl), ("rollout_log_probs", il),
                                  ("entropys", h))})
    pq.write_table(left, tmp_path / "left.parquet")
    acc_left = load_dataset([tmp_path / "left.parquet"]).accounting
    assert acc_left.tokens_padding == 11 and acc_left.tokens_valid == 12
    masked = t.append_column("response_mask", pa.array([[1] * 5] * 5, type=pa.list_(pa.int8(), 5)))
    pq.write_table(masked, tmp_path / "masked.parquet")
    acc = load_dataset([tmp_path / "masked.parquet"]).accounting
    assert acc.tokens_padding == 0 and acc.tokens_unmasked == 0 and acc.tokens_masked == 25


def test_padded_tensor_without_mask_drops_nan_padding(tmp_path):
    """A tensor padded with NaN (numpy's fill) dumped without its mask: a NaN run at a
    row's end in every column is padding (it was counted as non_finite_logprob, 45% of
    the rows, with a corrupt-rows caveat); a NaN inside a row, or on one side only at its
    end, stays non_finite_logprob; a null is not padding."""
    import pyarrow.parquet as pq

    nan = float("nan")
    tl = [[-0.1, -0.5, nan, nan], [-0.3, nan, -0.2, nan], [-0.2, -0.1, -0.4, None]]
    il = [[-0.1, -0.4, nan, nan], [-0.31, -0.2, -0.2, -0.5], [-0.2, -0.1, -0.4, None]]
    h = [[0.5, 0.6, nan, nan], [0.2, 0.9, 0.3, 0.4], [0.1, 0.2, 0.3, None]]
    t = pa.table({"old_log_probs": pa.array(tl, type=pa.list_(pa.float64())),
                  "rollout_log_probs": pa.array(il, type=pa.list_(pa.float64())),
                  "entropys": pa.array(h, type=pa.list_(pa.float64()))})
    pq.write_table(t, tmp_path / "nan.parquet")
    acc = load_dataset([tmp_path / "nan.parquet"]).accounting
    # padding: row 0's two trailing NaN; row 1's NaN inside and its one-sided NaN at the
    # end are tokens (non-finite); row 2's trailing null is a token too
    assert acc.tokens_padding == 2 and acc.tokens_valid == 7, acc
    assert acc.excluded == {"non_finite_logprob": 3}, acc.excluded


def test_padded_tensor_without_mask_drops_minus_one_padding(tmp_path):
    """verl pads rollout_log_probs with -1 and old_log_probs with 0: trailing rows holding
    those pad values are tensor padding too (not zero_placeholder exclusions that read as
    logprobs the engine did not return); a real token holding -1.0 on one side stays."""
    import pyarrow.parquet as pq

    tl = [[-0.1, -0.5, 0.0, 0.0], [-0.3, -1.0, -0.2, 0.0], [-0.2, -0.1, -0.4, -0.3]]
    il = [[-0.1, -0.4, -1.0, -1.0], [-0.31, -1.0, -0.2, -1.0], [-0.2, -0.1, -0.4, -1.0]]
    h = [[0.5, 0.6, 0.0, 0.0], [0.2, 0.9, 0.3, 0.0], [0.1, 0.2, 0.3, 0.9]]
    t = pa.table({"old_log_probs": pa.array(tl, type=pa.list_(pa.float32(), 4)),
                  "rollout_log_probs": pa.array(il, type=pa.list_(pa.float32(), 4)),
                  "entropys": pa.array(h, type=pa.list_(pa.float32(), 4))})
    pq.write_table(t, tmp_path / "verl.parquet")
    acc = load_dataset([tmp_path / "verl.parquet"]).accounting
    # padding: 2 + 1 + 0 rows; row 1's -1.0 on both sides inside is a token (H = 0.9)
    assert acc.tokens_padding == 3 and acc.tokens_valid == 9 and not acc.excluded
    # a row whose old_log_probs list is null: the other lists' pad values still mark its
    # padding (its 2 real tokens are excluded, not its 4 rows; helper-30 F5)
    t2 = pa.table({"old_log_probs": pa.array(tl + [None], type=pa.list_(pa.float32())),
                   "rollout_log_probs": pa.array(il + [[-0.2, -0.3, -1.0, -1.0]],
                                                 type=pa.list_(pa.float32())),
                   "entropys": pa.array(h + [[0.3, 0.4, 0.0, 0.0]],
                                        type=pa.list_(pa.float32()))})
    pq.write_table(t2, tmp_path / "verl_null.parquet")
    acc = load_dataset([tmp_path / "verl_null.parquet"]).accounting
    assert acc.tokens_padding == 5 and acc.excluded == {"non_finite_logprob": 2}


def test_long_file_without_mask_drops_all_zero_padding_rows(tmp_path):
    """A padded tensor flattened to one row per token without its mask (helper-29 F1): rows
    whose entropy is exactly 0 and both logprobs exactly 0 (or -1) are tensor padding,
    counted and outside the mask, not tokens at H = 0 with delta = 0; a zero entropy with a
    logprob that is not a pad value, or a pad logprob at H > 0, stays a token; no entropy
    column or a mapped mask: no row is taken for padding. An unmapped 'mask'-named
    integer column is named in a warning."""
    import pyarrow.parquet as pq

    sid = [0, 0, 0, 0, 1, 1, 1, 1]
    tl = [-0.3, -0.2, 0.0, 0.0, -0.1, -1e-6, 0.0, 0.0]
    il = [-0.3, -0.25, 0.0, -1.0, -0.1, 0.0, 0.0, 0.0]
    h = [0.5, 0.4, 0.0, 0.0, 0.2, 0.0, 0.3, 0.0]
    t = pa.table({"seq_id": sid, "train_logprob": tl, "infer_logprob": il, "entropy": h,
                  "attention_mask": pa.array([1, 1, 0, 0, 1, 1, 1, 0], pa.int8()),
                  "mask_token_id": [50256] * 8})  # (beyond 0/1 by its statistics: no mask)
    pq.write_table(t, tmp_path / "flat.parquet")
    ds = load_dataset([tmp_path / "flat.parquet"])
    acc = ds.accounting
    # padding: rows 2, 3 (0 / -1 at H = 0) and 7; row 5 (train -1e-6) stays a token, row 6
    # (both 0 at H = 0.3) is not padding but a zero placeholder
    assert acc.tokens_padding == 3 and acc.tokens_unmasked == 3
    assert acc.tokens_valid == 4 and acc.tokens_total == 8
    assert acc.excluded == {"zero_placeholder": 1}
    warn = [n for n in ds.notes if n.startswith("warning: no loss mask")]
    assert len(warn) == 1 and "--column loss_mask=attention_mask" in warn[0]
    assert "mask_token_id" not in warn[0]
    mapped = load_dataset([tmp_path / "flat.parquet"], columns={"loss_mask": "attention_mask"})
    assert mapped.accounting.tokens_padding == 0 and mapped.accounting.tokens_valid == 4
    assert not [n for n in mapped.notes if n.startswith("warning: no loss mask")]
    pq.write_table(t.drop_columns(["entropy", "attention_mask"]), tmp_path / "no_h.parquet")
    no_h = load_dataset([tmp_path / "no_h.parquet"])
    assert no_h.accounting.tokens_padding == 0
    assert not [n for n in no_h.notes if n.startswith("warning: no loss mask")]


def _packed(long: pl.DataFrame, per_row: int) -> pl.DataFrame:
    """``long`` (seq_id, position, train/infer logprob, entropy) packed AReaL-style: each
    row holds ``per_row`` whole sequences one after another, with their cu_seqlens."""
    seqs = long["seq_id"].unique(maintain_order=True).to_list()
    rows = []
    for r in range(0, len(seqs), per_row):
        part = long.filter(pl.col("seq_id").is_in(seqs[r:r + per_row]))
        lens = part.group_by("seq_id", maintain_order=True).len()["len"].to_list()
        rows.append({"cu_seqlens": [0, *np.cumsum(lens).tolist()],
                     **{c: part[c].to_list()
                        for c in ("train_logprob", "infer_logprob", "entropy")}})
    return pl.DataFrame(rows)


def test_packed_rows_split_by_cu_seqlens(tmp_path, monkeypatch):
    """A nested file packing several sequences per row (AReaL micro-batches, FlashAttention
    varlen) with a cu_seqlens list (helper-29 F4): each packed sequence is a sequence of
    its own, ids 'row id:index', positions from 0 in each, the same tokens and
    per-sequence results as the unpacked file; a sequence of length 0 holds no token; read
    in chunks too. A cu_seqlens that does not rise from 0 to the row's length is refused."""
    import pyarrow.parquet as pq

    from entr_diag.io import load

    rng = np.random.default_rng(3)
    lens = [5, 3, 7, 1, 4, 6, 2, 8]
    long = pl.DataFrame({
        "seq_id": np.repeat(np.arange(len(lens)), lens),
        "position": np.concatenate([np.arange(n) for n in lens]),
        "train_logprob": -rng.uniform(0.01, 2, sum(lens)),
        "infer_logprob": -rng.uniform(0.01, 2, sum(lens)),
        "entropy": rng.uniform(0.01, 3, sum(lens))})
    packed = _packed(long, 3)
    # a sequence of length 0 in the second row
    cu = packed["cu_seqlens"].to_list()
    cu[1] = [0, 0, *cu[1][1:]]
    packed = packed.with_columns(cu_seqlens=pl.Series(cu))
    path = tmp_path / "packed.parquet"
    pq.write_table(packed.to_arrow(), path, row_group_size=1)
    ds = load_dataset([path])
    assert ds.mapping["cu_seqlens"] == "cu_seqlens"
    assert ds.accounting.sequences_total == len(lens)
    got = _valid(ds)
    # ids: file:row, then the sequence's index in cu_seqlens (row 1: index 0 is empty)
    assert set(got["seq_id"].unique()) == {
        "packed.parquet:0:0", "packed.parquet:0:1", "packed.parquet:0:2",
        "packed.parquet:1:1", "packed.parquet:1:2", "packed.parquet:1:3",
        "packed.parquet:2:0", "packed.parquet:2:1"}
    order = ["packed.parquet:0:0", "packed.parquet:0:1", "packed.parquet:0:2",
             "packed.parquet:1:1", "packed.parquet:1:2", "packed.parquet:1:3",
             "packed.parquet:2:0", "packed.parquet:2:1"]
    ids = pl.DataFrame({"seq_id": order, "orig": list(range(len(lens)))})
    mine = got.join(ids, on="seq_id").sort("orig", "position")
    cols = ["position", "train_logprob", "infer_logprob", "entropy"]
    assert mine.select(cols).equals(long.select(cols))
    monkeypatch.setattr(load, "CHUNK_TOKENS", 10)  # one row group (row) per chunk
    chunked = load_dataset([path])
    assert _valid(chunked).equals(got)
    assert chunked.accounting.sequences_total == len(lens)
    # written from a float tensor: whole values read as the integers they are
    pq.write_table(packed.with_columns(pl.col("cu_seqlens").cast(pl.List(pl.Float64)))
                   .to_arrow(), tmp_path / "floats.parquet")
    assert _valid(load_dataset([tmp_path / "floats.parquet"])).select(cols).equals(
        got.select(cols))
    for bad, why in (([1, 3, 5], "start"), ([0, 6, 5], "fall"), ([0, 3], "end"),
                     ([0, None, 15], "null"), ([0.0, 5.5, 15.0], "frac"),
                     ([0.0, float("nan"), 15.0], "nan")):
        cu2 = [bad, *([float(v) for v in c] if isinstance(bad[1], float) else c
                      for c in cu[1:])]
        pq.write_table(packed.with_columns(cu_seqlens=pl.Series(cu2)).to_arrow(),
                       tmp_path / f"bad_{why}.parquet")
        with pytest.raises(InputError, match=rf"bad_{why}\.parquet: 1 packed row\(s\) have "
                           r"a cu_seqlens \('cu_seqlens'\) that does not split") as e:
            load_dataset([tmp_path / f"bad_{why}.parquet"])
        assert "row 0 (15 tokens, cu_seqlens [" in str(e.value)
    # a null list reads 'null', not '[null]'; with a seq_id column the row is named by it
    pq.write_table(packed.with_columns(cu_seqlens=pl.Series([None, *cu[1:]]),
                                       sample_id=pl.Series([1030, 1031, 1032])).to_arrow(),
                   tmp_path / "bad_nulllist.parquet")
    with pytest.raises(InputError, match=r"e\.g\. seq_id 1030 \(15 tokens, cu_seqlens null\)\."):
        load_dataset([tmp_path / "bad_nulllist.parquet"])
    # a long file's cu_seqlens column splits nothing: not used, said so
    long.with_columns(cu_seqlens=pl.lit(0)).write_parquet(tmp_path / "long.parquet")
    ds = load_dataset([tmp_path / "long.parquet"])
    assert "cu_seqlens" not in ds.mapping and ds.accounting.sequences_total == len(lens)
    assert any(n.startswith("cu_seqlens ('cu_seqlens') not used") for n in ds.notes)


def test_empty_nested_row_counted_as_sequence_without_tokens(tmp_path):
    """A nested row with empty lists holds no token and counts as a sequence without tokens."""
    df = pl.DataFrame({"seq_id": [0, 1], "train_logprob": [[-0.1], []],
                       "infer_logprob": [[-0.2], []]},
                      schema={"seq_id": pl.Int64, "train_logprob": pl.List(pl.Float64),
                              "infer_logprob": pl.List(pl.Float64)})
    ds = load_dataset([_write(tmp_path, df)])
    assert ds.accounting.tokens_total == 1
    assert ds.accounting.sequences_without_masked_tokens == 1


def test_input_never_modified(tmp_path):
    """Loading reads the file only: bytes and mtime are unchanged."""
    p = _write(tmp_path, _long(train_logprob=[-0.1, float("nan"), -0.3, 1.0, -2.0]))
    before = (p.read_bytes(), os.stat(p).st_mtime_ns)
    load_dataset([p]).lf.collect()
    assert (p.read_bytes(), os.stat(p).st_mtime_ns) == before


# ------------------------------------------------------------------ refusals


def test_missing_required_column_lists_existing(tmp_path):
    """A missing required column is named along with the columns that exist."""
    with pytest.raises(SchemaError) as e:
        load_dataset([_write(tmp_path, _long().drop("infer_logprob"))])
    msg = str(e.value)
    assert "infer_logprob" in msg and "train_logprob" in msg and "--column" in msg
    assert "(e.g. --column infer_logprob=my_rollout_logp)" in msg
    # the example names the column that is missing (helper-30 F9)
    with pytest.raises(SchemaError) as e:
        load_dataset([_write(tmp_path, _long().drop("train_logprob"), "t.parquet")])
    assert "(e.g. --column train_logprob=my_trainer_logp)" in str(e.value)


def test_not_parquet_refused(tmp_path):
    """A file that is not Parquet is refused, naming the file."""
    p = tmp_path / "x.parquet"
    p.write_text("seq_id,train_logprob\n1,-0.1\n")
    with pytest.raises(InputError, match=r"x\.parquet.*Parquet"):
        load_dataset([p])
    with pytest.raises(InputError, match="reads Parquet files only"):
        load_dataset([p])


def test_an_input_that_cannot_be_opened_is_named_with_the_reason(tmp_path, monkeypatch):
    """An input file that cannot be opened (no read permission) is refused naming the file
    and the reason, not as 'entr-diag reads Parquet files only' (its format is unknown)."""
    import entr_diag.io.load as L

    p = _write(tmp_path, _long())

    def denied(*a, **k):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(L.pq, "ParquetFile", denied)
    monkeypatch.setattr(L, "open", denied, raising=False)
    with pytest.raises(InputError) as e:
        load_dataset([p])
    assert str(e.value) == f"cannot read {p}: Permission denied."


def test_truncated_parquet_is_called_damaged(tmp_path):
    """A Parquet file cut short is refused as damaged, not as another format."""
    good = _write(tmp_path, _long())
    p = tmp_path / "cut.parquet"
    data = good.read_bytes()
    p.write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError, match=r"cut\.parquet.*starts like a Parquet file but "
                       "cannot be read: truncated, or damaged"):
        load_dataset([p])
    # a file of 0 bytes is said to be empty, not of another format (helper-35)
    empty = tmp_path / "empty.parquet"
    empty.write_bytes(b"")
    with pytest.raises(InputError, match=r"empty\.parquet .*; the file is empty \(0 bytes\): "
                       "cut short, or still being written"):
        load_dataset([empty])


@pytest.mark.parametrize("groups", [1, 3, 70])
def test_a_file_cut_short_behind_its_footer_is_refused_before_reading(tmp_path, groups):
    """A file whose data was cut short (or rewritten) while its footer stayed - the footer
    placing column chunks beyond the end of the file - is refused before any pass, naming
    the file, the column and both sizes; polars' reader had panicked on it, printing five
    Rust backtraces before the error (first and last row groups checked beyond 64)."""
    import struct

    import pyarrow.parquet as pq

    from entr_diag.synth import SynthSpec, generate

    good = tmp_path / "good.parquet"
    pq.write_table(generate(SynthSpec(n_tokens=3000, seed=1)).to_arrow(), good,
                   row_group_size=3000 // groups)
    assert pq.ParquetFile(good).metadata.num_row_groups >= groups
    data = good.read_bytes()
    footer = data[-(struct.unpack("<I", data[-8:-4])[0] + 8):]
    p = tmp_path / "cut.parquet"
    p.write_bytes(data[: (len(data) - len(footer)) // 2] + footer)  # half the data pages
    before = p.read_bytes()
    with pytest.raises(InputError) as e:
        load_dataset([p])
    msg = str(e.value)
    assert msg.startswith(f"cannot read {p}: its footer places column '") and "' at byte " in msg
    assert (f", beyond the {p.stat().st_size - len(footer):,} bytes before the footer: the "
            "file was cut short") in msg
    assert p.read_bytes() == before
    load_dataset([good])  # the whole file reads


def test_duplicate_column_names_refused_naming_file_and_column(tmp_path):
    """Parquet allows two columns of one name; polars cannot read them (even unused): a
    one-line refusal naming the file, the column and how many, from the CLI with exit 2."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from typer.testing import CliRunner

    from entr_diag.cli import app

    good = _write(tmp_path, _long(), name="good.parquet")
    t = pq.read_table(good)
    bad = tmp_path / "dup.parquet"
    pq.write_table(pa.table(t.columns + [t.column("train_logprob")] * 3,
                            names=t.column_names + ["train_logprob", "foo", "foo"]), bad)
    with pytest.raises(InputError, match=r"dup\.parquet: it holds several columns of one name "
                       r"\(2 named 'foo', 2 named 'train_logprob'\)"):
        load_dataset([tmp_path])
    r = CliRunner().invoke(app, ["fit", str(bad)])
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert r.stderr.startswith(f"error: cannot read {bad}: it holds several columns")


def test_file_without_columns_refused_naming_it(tmp_path):
    """A Parquet file with no columns at all (an empty schema) is refused as such, naming
    it (the missing-columns message listed its columns as 'columns: .'); among shards,
    --skip-unreadable leaves it out with a warning."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from typer.testing import CliRunner

    from entr_diag.cli import app

    bad = tmp_path / "shards" / "nocols.parquet"
    bad.parent.mkdir()
    pq.write_table(pa.table({}), bad)
    r = CliRunner().invoke(app, ["fit", str(bad)])
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert r.stderr.startswith(f"error: cannot read {bad}: it holds no columns at all "
                               "(an empty Parquet schema, 0 rows)"), r.stderr
    _write(tmp_path / "shards", _long(), name="good.parquet")
    with pytest.raises(InputError, match=r"nocols\.parquet: it holds no columns.*"
                                         r"--skip-unreadable"):
        load_dataset([tmp_path / "shards"])
    ds = load_dataset([tmp_path / "shards"], skip_unreadable=True)
    assert [p for p, _ in ds.skipped_unreadable] == [str(bad)]


def test_nonexistent_and_empty_dir_refused(tmp_path):
    """A path that does not exist, and a directory with no Parquet file, are refused."""
    with pytest.raises(InputError, match="does not exist"):
        load_dataset([tmp_path / "nope.parquet"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="no Parquet"):
        load_dataset([tmp_path / "empty"])


def test_empty_input_refused(tmp_path):
    """A Parquet file with zero rows is refused as empty."""
    with pytest.raises(InputError, match="empty"):
        load_dataset([_write(tmp_path, _long().head(0))])


def test_ragged_nested_refused_with_seq_ids(tmp_path):
    """Nested rows whose list columns differ in length are refused, naming the seq_ids."""
    df = pl.DataFrame({"seq_id": ["a", "b", "c"],
                       "train_logprob": [[-0.1, -0.2], [-0.3], [-0.1]],
                       "infer_logprob": [[-0.1], [-0.3], [-0.1, -0.2]]})
    with pytest.raises(InputError) as e:
        load_dataset([_write(tmp_path, df)])
    assert "2 nested row(s)" in str(e.value) and "a" in str(e.value) and "c" in str(e.value)


def test_ragged_nested_names_the_culprit_lists(tmp_path):
    """The refusal names the list column(s) whose length differs from the row's other
    lists, with their numbers of rows (not every list column of the file); a source
    name is followed by its canonical column."""
    df = pl.DataFrame({
        "seq_id": [1, 2, 3, 4],
        "train_logprob": [[-0.1, -0.2], [-0.3, -0.1], [-0.1, -0.2], [-0.5]],
        "infer_logprob": [[-0.1, -0.2], [-0.3], [-0.1, -0.2], [-0.5]],
        "rollout_entropy": [[0.1], [0.2, 0.3], [0.4], [0.5]],
        "loss_mask": [[True, True], [True, True], [True, True], [True]],
        "token_id": [[5, 6], [7, 8], [9, 10], [11]],
    })
    with pytest.raises(InputError) as e:
        load_dataset([_write(tmp_path, df)])
    assert str(e.value) == (
        f"{tmp_path / 'x.parquet'}: 3 nested row(s) have per-token lists of different "
        "lengths: 'rollout_entropy' (entropy) in 2 rows and 'infer_logprob' in 1 row differ "
        "from the row's other lists; seq_id(s): 1, 2, 3. Every per-token list of a sequence "
        "must have one entry per token.")
    # train_logprob itself the odd one out; two lists of different lengths: both named
    df = pl.DataFrame({"seq_id": [1], "train_logprob": [[-0.1]],
                       "infer_logprob": [[-0.1, -0.2]], "entropy": [[0.1, 0.2]]})
    with pytest.raises(InputError, match="lengths: 'train_logprob' in 1 row differs from"):
        load_dataset([_write(tmp_path, df)])
    with pytest.raises(InputError, match="'infer_logprob' in 1 row and 'train_logprob' in 1 "
                                         "row differ"):
        load_dataset([_write(tmp_path, df.drop("entropy"))])


def test_ragged_nested_by_one_entry_everywhere_says_so(tmp_path):
    """An engine list one entry longer in every row (a prompt / BOS logprob kept in front):
    the refusal says by how much, against which list; an offset that varies says nothing
    more."""
    df = pl.DataFrame({"seq_id": [1, 2, 3],
                       "train_logprob": [[-0.1, -0.2], [-0.3], [-0.1, -0.2, -0.4]],
                       "infer_logprob": [[-9.0, -0.1, -0.2], [-9.0, -0.3],
                                         [-9.0, -0.1, -0.2, -0.4]],
                       "entropy": [[0.1, 0.2], [0.3], [0.1, 0.2, 0.4]]})
    with pytest.raises(InputError) as e:
        load_dataset([_write(tmp_path, df)])
    assert ("differs from the row's other lists; 'infer_logprob' is 1 entry longer than "
            "'train_logprob' in each of those rows: an extra or missing leading or trailing "
            "entry, such as a prompt / BOS logprob?; seq_id(s): 1, 2, 3.") in str(e.value)
    df = df.with_columns(pl.Series("infer_logprob", [[-9.0, -0.1, -0.2], [-9.0, -8.0, -0.3],
                                                      [-9.0, -0.1, -0.2, -0.4]]))
    with pytest.raises(InputError) as e:
        load_dataset([_write(tmp_path, df)])
    assert "entry longer" not in str(e.value) and "'infer_logprob' in 3 rows" in str(e.value)


def test_null_nested_list_counts_its_tokens_like_null_values(tmp_path):
    """A null per-token list beside present ones holds a null per token, excluded by the
    reason a null value of that column has in the long layout (entropy: invalid_entropy,
    loss mask: null_loss_mask, position: invalid_position, a logprob: non_finite_logprob;
    a null token_id is kept): the same accounting as the long layout with those nulls. A row
    whose lists are all null stays an empty sequence."""
    rows = [  # (column made null, tokens)
        (None, 3), ("entropy", 2), ("loss_mask", 4), ("position", 1), ("token_id", 2),
        ("infer_logprob", 3), ("train_logprob", 2), ("all", 0)]
    recs = []
    for i, (col, n) in enumerate(rows):
        rec = {"seq_id": i, "train_logprob": [-0.1 * (j + 1) for j in range(n)],
               "infer_logprob": [-0.1 * (j + 1) - 0.01 for j in range(n)],
               "entropy": [0.5] * n, "loss_mask": [True] * n, "position": list(range(n)),
               "token_id": list(range(n))}
        for c in rec:
            if c != "seq_id" and col in (c, "all"):
                rec[c] = None
        recs.append(rec)
    nested = pl.DataFrame(recs, schema={
        "seq_id": pl.Int64, "train_logprob": pl.List(pl.Float64),
        "infer_logprob": pl.List(pl.Float64), "entropy": pl.List(pl.Float64),
        "loss_mask": pl.List(pl.Boolean), "position": pl.List(pl.Int64),
        "token_id": pl.List(pl.Int64)})
    ds = load_dataset([_write(tmp_path, nested)])
    acc = ds.accounting
    assert acc.excluded == {"invalid_entropy": 2, "null_loss_mask": 4, "invalid_position": 1,
                            "non_finite_logprob": 5}
    assert acc.tokens_valid == 3 + 2 and acc.sequences_total == 8
    assert acc.sequences_without_masked_tokens == 1  # the empty row
    valid = _valid(ds)
    assert valid.filter(pl.col("seq_id") == "4")["token_id"].null_count() == 2
    # the long layout with the same values (nulls in place of the null lists)
    lists = [c for c in nested.columns if c != "seq_id"]
    long = (nested.filter(pl.col("seq_id") != 7)
            .with_columns(pl.col(c).fill_null(pl.col("train_logprob").list.eval(pl.lit(None)))
                          for c in lists)
            .with_columns(pl.col(c).fill_null(pl.col("infer_logprob").list.eval(pl.lit(None)))
                          for c in lists)
            .explode(lists))
    ds_long = load_dataset([_write(tmp_path, long, "long.parquet")])
    assert ds_long.accounting.excluded == acc.excluded
    assert ds_long.accounting.tokens_valid == acc.tokens_valid


@pytest.mark.parametrize("statistics", [True, False])
def test_uint64_values_too_large_for_an_integer_column_are_counted_over_the_file(
        tmp_path, statistics):
    """A uint64 step holding values above 2^63 - 1 is refused naming the file and column and
    counting those values over the whole file (every row group, with or without Parquet
    statistics), not over one batch of it; small uint64 steps are read."""
    import pyarrow.parquet as pq

    n = 3000
    df = pl.DataFrame({"seq_id": [i // 10 for i in range(n)],
                       "train_logprob": [-0.1] * n, "infer_logprob": [-0.12] * n,
                       "step": pl.Series([2**63 + i if i % 3 == 0 else i for i in range(n)],
                                         dtype=pl.UInt64)})
    p = tmp_path / "x.parquet"
    pq.write_table(df.to_arrow(), p, row_group_size=700, write_statistics=statistics)
    with pytest.raises(SchemaError) as e:
        load_dataset([p])
    assert str(e.value).startswith(
        f"{p}: column 'step' (step) holds 1,000 of its 3,000 values above "
        "9,223,372,036,854,775,807, the largest signed 64-bit integer (up to "
        f"{2**63 + 2997:,}): no step is that large"), str(e.value)
    pq.write_table(df.with_columns(pl.col("step") % 7).to_arrow(), p, row_group_size=700,
                   write_statistics=statistics)
    assert load_dataset([p]).accounting.steps == tuple(range(7))


def test_wrong_type_refused(tmp_path):
    """A logprob column holding strings is refused, naming file, column and type."""
    df = _long().with_columns(pl.col("train_logprob").cast(pl.String))
    p = _write(tmp_path, df)
    with pytest.raises(SchemaError, match="train_logprob.*string") as ei:
        load_dataset([p])
    assert str(ei.value).startswith(f"{p}: ")


def test_long_without_seq_id_refused(tmp_path):
    """The long layout without any sequence id column is refused with the fix."""
    with pytest.raises(SchemaError, match="seq_id"):
        load_dataset([_write(tmp_path, _long().drop("seq_id"))])


def test_bad_column_override(tmp_path):
    """--column naming an unknown canonical column or a missing source is refused."""
    p = _write(tmp_path, _long())
    with pytest.raises(SchemaError, match="not a canonical"):
        load_dataset([p], columns={"logp": "train_logprob"})
    with pytest.raises(SchemaError, match="no column 'zzz'"):
        load_dataset([p], columns={"train_logprob": "zzz"})


def test_unknown_framework(tmp_path):
    """An unknown --framework lists the known ones."""
    with pytest.raises(SchemaError, match="verl"):
        load_dataset([_write(tmp_path, _long())], framework="nope")


def test_delta_is_exact(tmp_path):
    """delta = train_logprob - infer_logprob, in nats, token by token."""
    df = _valid(load_dataset([_write(tmp_path, _long())]))
    for tl, il, d in zip(df["train_logprob"], df["infer_logprob"], df["delta"], strict=True):
        assert math.isclose(d, tl - il)


def test_dirty_synth_counts_match_planted(tmp_path):
    """On a synth run with planted defects, every exclusion count equals the planted count."""
    from entr_diag.synth import SynthSpec, write_synth

    s = write_synth(tmp_path / "d.parquet", SynthSpec(n_tokens=60_000, dirty=True, seed=5))
    ds = load_dataset([tmp_path / "d.parquet"])
    d = s["dirty"]
    assert dict(ds.accounting.excluded) == {
        "non_finite_logprob": d["nan"] + d["null"] + d["neg_inf"],
        "sentinel_logprob": d["floor"],
        "positive_logprob": d["plus_one"],
        "zero_placeholder": d["zero"],
        "invalid_entropy": d["neg_entropy"],
        "negative_version": d["neg_version"],
    }
    assert ds.accounting.tokens_valid == s["valid_tokens"]
    assert ds.accounting.tokens_unmasked == s["masked_tokens"]


def _nucleus_run(n_seq: int = 200, seq_len: int = 50, seed: int = 0) -> pl.DataFrame:
    """Tokens whose engine sampled with top-p 0.9: where the top token holds 90% or more of
    the probability the engine renormalised a nucleus of one token and logged 0.0, while
    the trainer's logprob of that token is ln p_top (-0.105 to 0) plus a little noise."""
    rng = np.random.default_rng(seed)
    n = n_seq * seq_len
    p_top = rng.uniform(0.5, 1.0, n)
    one = p_top >= 0.9
    train = np.log(p_top) + rng.normal(0, 0.002, n)
    infer = np.where(one, 0.0, np.log(p_top) + rng.normal(0, 0.01, n))
    return pl.DataFrame({
        "seq_id": np.arange(n) // seq_len, "position": np.arange(n) % seq_len,
        "step": np.arange(n) // seq_len % 4,
        "train_logprob": np.minimum(train, 0.0), "infer_logprob": np.minimum(infer, 0.0),
        "entropy": np.where(one, 0.0, rng.uniform(0.1, 1.0, n)),
        "loss_mask": np.ones(n, dtype=bool)})


def test_engine_zeros_of_one_token_nuclei_are_valid_tokens(tmp_path):
    """An engine logprob of exactly 0.0 where the trainer's lies between ln 0.5 and -0.05
    (a top-p nucleus of one token) is kept when no such zero has a trainer logprob below
    ln 0.5 (placeholders leave every size): the tokens count as valid, with a note; one
    of them with a trainer logprob below ln 0.5 makes its sequence's zeros placeholders
    (they stay excluded), the other sequences' zeros stay valid."""
    df = _nucleus_run()
    zeros = df.filter((pl.col("infer_logprob") == 0) & (pl.col("train_logprob") < -0.05))
    assert zeros.height >= 100
    ds = load_dataset([_write(tmp_path, df)])
    assert ds.accounting.excluded == {}
    assert ds.accounting.tokens_valid == df.height
    note = [n for n in ds.notes if "one-token nuclei" in n]
    assert len(note) == 1 and f"{zeros.height:,} loss-masked tokens" in note[0]
    # one zero whose trainer logprob says the token held under half the probability
    odd = df.with_columns(pl.when(pl.int_range(pl.len()) == zeros["seq_id"][0] * 50
                                  + zeros["position"][0])
                          .then(-2.0).otherwise(pl.col("train_logprob")).alias("train_logprob"))
    ds = load_dataset([_write(tmp_path, odd, "odd.parquet")])
    in_seq = zeros.filter(pl.col("seq_id") == zeros["seq_id"][0]).height
    assert ds.accounting.excluded == {"zero_placeholder": in_seq}
    assert ds.nucleus_zeros == zeros.height - in_seq
    assert any(f"{in_seq:,} such zeros in 1 sequence(s) that read as placeholders" in n
               for n in ds.notes)


def test_engine_zeros_of_a_sequence_not_computed_beside_nuclei(tmp_path):
    """One sequence whose engine side was not computed (every token 0.0) beside top-p
    nuclei elsewhere: its zeros stay excluded, the nuclei of the others are kept (the rule
    is per sequence: one such sequence turned every nucleus into an exclusion)."""
    df = _nucleus_run()
    df = df.with_columns(pl.when(pl.col("seq_id") == 7).then(0.0)
                         .otherwise(pl.col("infer_logprob")).alias("infer_logprob"))
    nuclei = df.filter((pl.col("seq_id") != 7) & (pl.col("infer_logprob") == 0)
                       & (pl.col("train_logprob") < -0.05)).height
    dead = df.filter((pl.col("seq_id") == 7) & (pl.col("train_logprob") < -0.05)).height
    ds = load_dataset([_write(tmp_path, df)])
    assert ds.accounting.excluded == {"zero_placeholder": dead}
    assert ds.nucleus_zeros == nuclei


def test_minus_one_padding_inside_the_loss_mask_is_excluded(tmp_path):
    """verl's -1 padding of rollout_log_probs let in by the loss mask (the last 5 tokens of
    every sequence): exactly -1.0 far more often than at -0.5, -0.9, -1.1, -2.0, so they
    are excluded as sentinel_logprob with a warning note naming the column (they went in
    as logprobs: alpha 0.19, k 340 times the real one); -1.0 on both sides names both; a
    column rounded to 0.1 nats, which holds -1.0 as often as its neighbours, is left as
    it is."""
    from entr_diag.synth import SynthSpec, write_synth

    p = tmp_path / "run.parquet"
    write_synth(p, SynthSpec(n_tokens=30_000, seed=2))
    df = pl.read_parquet(p)
    last = (pl.col("position") >= pl.col("position").max().over("seq_id") - 4) & pl.col(
        "loss_mask")
    pad = df.with_columns(pl.when(last).then(-1.0).otherwise(pl.col("infer_logprob"))
                          .alias("infer_logprob"))
    n = pad.filter(last).height
    ds = load_dataset([_write(tmp_path, pad, "pad.parquet")])
    assert ds.accounting.excluded.get("sentinel_logprob") == n
    assert ds.accounting.to_dict()["logprob_minus_one"]["infer_logprob"]["tokens"] == n
    note = [x for x in ds.notes if "exactly -1.0" in x]
    assert len(note) == 1 and note[0].startswith(
        f"warning: {n:,} loss-masked tokens have infer_logprob exactly -1.0 (at most 0 at any of -0.5")
    both = pad.with_columns(pl.when(last).then(-1.0).otherwise(pl.col("train_logprob"))
                            .alias("train_logprob"))
    ds = load_dataset([_write(tmp_path, both, "both.parquet")])
    assert ds.accounting.excluded.get("sentinel_logprob") == n
    assert "train_logprob exactly -1.0" in ds.notes[0] and "infer_logprob" in ds.notes[0]
    rounded = df.with_columns(pl.col("train_logprob", "infer_logprob").round(1))
    ds = load_dataset([_write(tmp_path, rounded, "r.parquet")])
    assert "sentinel_logprob" not in ds.accounting.excluded
    assert not any("exactly -1.0" in x for x in ds.notes)
    assert load_dataset([p]).accounting.minus_one["infer_logprob"][0] == 0


def test_minus_one_in_whole_number_logprobs_is_no_padding(tmp_path):
    """A logprob column rounded to whole numbers (float, or an integer dtype) holds -1.0
    about as often as -2.0 and never -0.5, -0.9 or -1.1: read against the most frequent
    control value (not their average, which had flagged 1,710 rounded logprobs of a
    20,000-row run as padding), it is no padding; verl's padding on top of such a column
    (a third of the masked tokens) still is, and the note quotes the largest control count."""
    from entr_diag.synth import SynthSpec, write_synth

    p = tmp_path / "run.parquet"
    write_synth(p, SynthSpec(n_tokens=20_000, seed=3))
    df = pl.read_parquet(p)
    for name, frame in (
            ("float", df.with_columns(pl.col("train_logprob").round(0))),
            ("int", df.with_columns(pl.col("train_logprob").round(0).cast(pl.Int64)))):
        ones = frame.filter(pl.col("loss_mask") & (pl.col("train_logprob") == -1)).height
        twos = frame.filter(pl.col("loss_mask") & (pl.col("train_logprob") == -2)).height
        assert ones >= 5 * (twos / 4 + 1)  # (what the average of the controls had flagged)
        ds = load_dataset([_write(tmp_path, frame, f"{name}.parquet")])
        assert "sentinel_logprob" not in ds.accounting.excluded, name
        assert not any("exactly -1.0" in x for x in ds.notes), name
        assert ds.accounting.minus_one["train_logprob"][1] >= twos * 0.9, name
    third = pl.col("loss_mask") & (pl.col("position") % 3 == 0)
    padded = df.with_columns(pl.when(third).then(-1.0).otherwise(pl.col("train_logprob")
                                                                  .round(0))
                             .alias("train_logprob"))
    ds = load_dataset([_write(tmp_path, padded, "padded.parquet")])
    assert ds.accounting.excluded.get("sentinel_logprob", 0) >= padded.filter(third).height
    note = [x for x in ds.notes if "exactly -1.0" in x]
    most = ds.accounting.minus_one["train_logprob"][1]
    assert len(note) == 1 and f"(at most {most:,} at any of -0.5" in note[0]
    assert ds.accounting.to_dict()["logprob_minus_one"]["train_logprob"] == {
        "tokens": ds.accounting.minus_one["train_logprob"][0], "most_at_a_control": most}


def test_both_logprobs_zero_at_some_rows_are_excluded_with_a_warning(tmp_path):
    """Both logprobs exactly 0.0 on 10% of the rows (above 1e-3 nats): excluded as
    zero_placeholder with a warning saying what they may be (zero-filled on both sides,
    or top-p nuclei truncated on both sides; they read as a unit mistake before)."""
    from entr_diag.synth import SynthSpec, write_synth

    p = tmp_path / "run.parquet"
    write_synth(p, SynthSpec(n_tokens=20_000, seed=5))
    df = pl.read_parquet(p)
    hit = pl.Series(np.random.default_rng(0).random(df.height) < 0.1)
    z = df.with_columns(pl.when(hit).then(0.0).otherwise(pl.col(c)).alias(c)
                        for c in ("train_logprob", "infer_logprob"))
    n = z.filter(hit & pl.col("loss_mask") & (pl.col("entropy") >= 1e-3)).height
    ds = load_dataset([_write(tmp_path, z, "z.parquet")])
    assert ds.accounting.excluded.get("zero_placeholder") == n
    assert ds.notes[0].startswith(f"warning: {n:,} loss-masked tokens have both logprobs "
                                  "exactly 0.0 at an entropy of 0.001 nats or more")


def test_random_engine_zero_placeholders_are_not_read_as_nuclei(tmp_path):
    """Engine logprobs set to 0.0 at 2% of random rows (placeholders): a sequence none of
    whose few zeros has by chance a trainer logprob below ln 0.5 read as holding one-token
    nuclei, and 370 such zeros were kept on a real run (k +51%). Over the run a share of
    such zeros lies below ln 0.5, which real nuclei almost never do: all are excluded,
    with no nucleus note; real nuclei beside a few odd zeros are still kept."""
    rng = np.random.default_rng(1)
    n_seq, seq_len = 400, 50
    n = n_seq * seq_len
    train = -rng.exponential(0.8, n)
    df = pl.DataFrame({
        "seq_id": np.arange(n) // seq_len, "position": np.arange(n) % seq_len,
        "step": np.zeros(n, dtype=np.int64), "train_logprob": train,
        "infer_logprob": np.where(rng.random(n) < 0.02, 0.0,
                                  np.minimum(train + rng.normal(0, 0.01, n), 0.0)),
        "entropy": rng.uniform(0.1, 2.0, n), "loss_mask": np.ones(n, dtype=bool)})
    zeros = df.filter((pl.col("infer_logprob") == 0) & (pl.col("train_logprob") < -0.05))
    ds = load_dataset([_write(tmp_path, df)])
    assert ds.accounting.excluded == {"zero_placeholder": zeros.height}
    assert not ds.nucleus_zeros and not any("one-token nuclei" in x for x in ds.notes)
    # one odd zero among true nuclei: below the share, the nuclei stay
    nuc = _nucleus_run()
    z = nuc.filter((pl.col("infer_logprob") == 0) & (pl.col("train_logprob") < -0.05))
    ds = load_dataset([_write(tmp_path, nuc.with_columns(
        pl.when(pl.int_range(pl.len()) == z["seq_id"][0] * 50 + z["position"][0])
        .then(-2.0).otherwise(pl.col("train_logprob")).alias("train_logprob")), "n.parquet")])
    assert ds.nucleus_zeros > 0.9 * z.height


def test_engine_zeros_as_placeholders_stay_excluded(tmp_path):
    """Zeros where the engine returned no logprob (a whole step written as 0.0) leave
    trainer logprobs of every size: they stay zero_placeholder exclusions, with no note in
    a run without nuclei; beside top-p nuclei in the other steps, those are kept and the
    placeholder step's zeros still excluded."""
    run = _nucleus_run().with_columns(
        pl.when(pl.col("step") == 1).then(pl.col("train_logprob") * 8)
        .otherwise(pl.col("train_logprob")).alias("train_logprob"))
    dead = pl.when(pl.col("step") == 1).then(0.0)
    no_nuclei = run.with_columns(
        dead.otherwise(pl.col("train_logprob") - 0.01).alias("infer_logprob"))
    ds = load_dataset([_write(tmp_path, no_nuclei)])
    placeholders = no_nuclei.filter((pl.col("infer_logprob") == 0)
                                    & (pl.col("train_logprob") < -0.05))
    assert placeholders.height > 1000
    assert ds.accounting.excluded == {"zero_placeholder": placeholders.height}
    assert not any("one-token nuclei" in n for n in ds.notes) and ds.nucleus_zeros == 0
    mixed = run.with_columns(dead.otherwise(pl.col("infer_logprob")).alias("infer_logprob"))
    ds = load_dataset([_write(tmp_path, mixed, "mixed.parquet")])
    step1 = mixed.filter((pl.col("step") == 1) & (pl.col("train_logprob") < -0.05)).height
    nuclei = mixed.filter((pl.col("step") != 1) & (pl.col("infer_logprob") == 0)
                          & (pl.col("train_logprob") < -0.05)).height
    assert ds.accounting.excluded == {"zero_placeholder": step1}
    assert ds.nucleus_zeros == nuclei > 100


def test_integer_columns_written_as_floats_read_their_whole_values(tmp_path):
    """step, versions and position written as float64 (pandas, for an integer column with a
    missing value) are read as integers where whole: NaN and fractional values are null
    (a null step, an invalid position), with a note; another shard's integer step joins
    them."""
    df = _long(step=[0.0, 0.0, 1.0, float("nan"), 2.0], policy_version=[1.0, 1.0, 2.0, 0.0, 0.0],
               position=[0.0, 1.0, 0.0, 1.0, 2.5])
    a = _write(tmp_path, df, "d/a.parquet")
    _write(tmp_path, _long(seq_id=[10, 10, 11, 11, 11]), "d/b.parquet")
    ds = load_dataset([a.parent])
    v = ds.lf.collect()
    assert v.schema["step"] == pl.Int64 and v.schema["policy_version"] == pl.Int64
    assert ds.accounting.excluded == {"invalid_position": 1}
    assert ds.accounting.tokens_without_step == 1
    assert sorted(v.filter(pl.col("seq_id").is_in(["0", "1"]))["step"].drop_nulls().to_list()) == [0, 0, 1]
    note = [n for n in ds.notes if "holds floating-point values" in n]
    assert len(note) == 3 and any(n.startswith("step holds") and "in 1 of 2 files" in n
                                  for n in note)
    # the null-step warning names the fractional value as a cause, also with --quiet
    # (which hides the note)
    from typer.testing import CliRunner

    from entr_diag.cli import app

    r = CliRunner().invoke(app, ["inspect", "--quiet", str(a.parent)])
    assert ("warning: 1 valid token(s) have a null step (null in the file, or a "
            "floating-point step with a fraction, e.g. 1.5, which reads as null") in \
        " ".join(r.stderr.split())


def test_sequence_id_written_as_floats_reads_its_whole_values(tmp_path):
    """A seq_id written as float64 (pandas, for an integer id column with a missing value)
    is read as integers where whole: a NaN or fractional id is a missing_seq_id row, with a
    note (the whole file was refused as 'type double'); 3.0 joins another shard's 3, long
    and nested alike, and a flag or export writes the integer id."""
    df = _long(seq_id=[3.0, 3.0, 4.0, float("nan"), 4.5])
    a = _write(tmp_path, df, "d/a.parquet")
    _write(tmp_path, _long(seq_id=[3, 3, 5, 5, 5], position=[2, 3, 0, 1, 2]), "d/b.parquet")
    ds = load_dataset([a.parent])
    assert ds.accounting.excluded == {"missing_seq_id": 2}
    assert ds.accounting.sequences_valid == 3  # 3 (both files), 4, 5
    v = ds.lf.collect()
    assert sorted(set(v["seq_id"].to_list())) == ["3", "4", "5"]
    assert v.filter(pl.col("seq_id") == "3").height == 4
    assert any(n.startswith("seq_id holds floating-point values in 1 of 2 files") for n in
               ds.notes)
    nested = pl.DataFrame({"seq_id": [7.0, float("nan")],
                           "train_logprob": [[-0.1, -0.2], [-0.3]],
                           "infer_logprob": [[-0.12, -0.19], [-0.31]],
                           "entropy": [[0.5, 0.4], [0.6]]})
    ds = load_dataset([_write(tmp_path, nested, "n.parquet")])
    assert ds.accounting.excluded == {"missing_seq_id": 1}
    assert ds.lf.collect()["seq_id"].to_list() == ["7", "7"]


def test_duplicate_shards_flagged(tmp_path):
    """The same tokens in two shards are counted, and the duplication is reported."""
    d = tmp_path / "dup"
    _write(tmp_path, _long(), "dup/a.parquet")
    _write(tmp_path, _long(), "dup/b.parquet")
    ds = load_dataset([d])
    assert ds.accounting.tokens_valid == 10
    assert ds.accounting.sequences_with_duplicate_positions == 2
    assert load_dataset([d / "a.parquet"]).accounting.sequences_with_duplicate_positions == 0


def test_missing_seq_id_counted(tmp_path):
    """A loss-masked token whose seq_id is null is excluded as missing_seq_id."""
    df = _long().with_columns(pl.Series("seq_id", [1, None, 1, 2, 2], dtype=pl.Int64))
    ds = load_dataset([_write(tmp_path, df)])
    assert dict(ds.accounting.excluded) == {"missing_seq_id": 1}
    assert ds.accounting.tokens_valid == 4
    assert ds.accounting.sequences_total == 2  # (the null id is no sequence)


def test_rows_without_a_seq_id_are_no_sequence(tmp_path):
    """Rows with a null seq_id in two steps, loss-masked or not: sequences_total counts the
    (step, seq_id) keys of the input, not one more per step for the null id (helper-33:
    63 sequences for 61), and a null id's unmasked rows are no sequence without masked
    tokens."""
    n = 60
    sid = pl.Series("seq_id", [None if i in (5, 30, 31, 40) else i // 10 for i in range(n)],
                    dtype=pl.Int64)
    df = pl.DataFrame({"step": [i // 30 for i in range(n)], "seq_id": sid,
                       "train_logprob": [-0.5] * n, "infer_logprob": [-0.45] * n,
                       "entropy": [1.0] * n, "loss_mask": [i != 40 for i in range(n)]})
    acc = load_dataset([_write(tmp_path, df)]).accounting
    assert acc.excluded == {"missing_seq_id": 3} and acc.tokens_unmasked == 1
    assert (acc.sequences_total, acc.sequences_valid, acc.sequences_without_masked_tokens) \
        == (6, 6, 0)


@pytest.mark.parametrize("reason", sorted(_BAD_CASES))
def test_each_exclusion_reason_via_cli(tmp_path, reason):
    """`entr-diag inspect --json` reports each exclusion reason with its exact count."""
    import json

    from typer.testing import CliRunner

    from entr_diag.cli import app

    p = _write(tmp_path, _long(**_BAD_CASES[reason]))
    out = tmp_path / "i.json"
    r = CliRunner().invoke(app, ["inspect", str(p), "--json", str(out), "-q"])
    assert r.exit_code == 0, r.output
    acc = json.loads(out.read_text())["inputs"]["accounting"]
    canon = (reason.removesuffix("_above_ln_v").removesuffix("_beyond_rounding")
             .removesuffix("_both_sides"))
    assert acc["exclusions"] == {canon: _EXPECTED[reason]}
    assert acc["tokens_valid"] == 5 - _EXPECTED[reason]



# ------------------------------------------------------------------ framework presets, ambiguity


def _verl_names() -> pl.DataFrame:
    return _long().rename({"train_logprob": "old_log_probs", "infer_logprob": "rollout_log_probs",
                           "entropy": "entropys", "loss_mask": "response_mask"})


def test_framework_reads_only_its_names(tmp_path):
    """--framework trl never reads verl's names: the logprobs are refused with the names trl
    expects and how to map verl's, and verl's entropy / loss mask are left unused (noted)."""
    p = _write(tmp_path, _verl_names())
    with pytest.raises(SchemaError) as e:
        load_dataset([p], framework="trl")
    msg = str(e.value)
    for w in ("train_logprob", "old_per_token_logps", "--column train_logprob=old_log_probs",
              "sampling_per_token_logps", "--framework verl"):
        assert w in msg, w
    ds = load_dataset([p], framework="trl", columns={"train_logprob": "old_log_probs",
                                                     "infer_logprob": "rollout_log_probs"})
    assert "train_entropy" not in ds.mapping and "loss_mask" not in ds.mapping
    assert any("'entropys' not used as train_entropy (--framework trl)" in n for n in ds.notes)
    assert any("'response_mask' not used as loss_mask" in n for n in ds.notes)
    # verl's own preset still reads all four
    ds = load_dataset([p], framework="verl")
    assert ds.mapping["train_entropy"] == "entropys" and ds.mapping["loss_mask"] == "response_mask"


@pytest.mark.parametrize("framework", sorted(S.FRAMEWORKS))
def test_framework_never_maps_other_frameworks_names(framework):
    """Given every name the other presets use (and only the two canonical logprobs), a
    preset maps none of them."""
    from entr_diag.io.load import resolve_mapping

    own = set(S.FRAMEWORKS[framework].values())
    others = {n for k, p in S.FRAMEWORKS.items() if k != framework for n in p.values()}
    others -= own | set(S.CANONICAL) | {"advantages"}  # the name every framework shares
    for typ in (pa.float64(), pa.int64()):  # (int64: ids and steps fit the id columns)
        available = {n: typ for n in others | {"train_logprob", "infer_logprob"}}
        mapping, _ = resolve_mapping(available, framework=framework)
        assert others, framework
        for canon, src in mapping.items():  # never as the column another preset reads it as
            assert src not in others or not S.users_of(src, canon), (canon, src)


def test_readme_lists_every_framework_preset():
    """The README's table of presets gives each framework's names as schema.py has them."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    rows = {ln.split("|")[1].strip(" `"): ln for ln in readme.splitlines()
            if ln.startswith("| `") and ln.split("|")[1].strip(" `") in S.FRAMEWORKS}
    assert set(rows) == set(S.FRAMEWORKS)
    for fw, preset in S.FRAMEWORKS.items():
        for canon, src in preset.items():
            cell = f"`{src}`" if canon in ("train_logprob", "infer_logprob") else \
                f"{canon} `{src}`"
            assert cell in rows[fw], (fw, canon, src)


def _slime_rows(seq: str = "index") -> pl.DataFrame:
    """A slime-style long dump: 2 rollouts (``rollout_id``, the step) of 3 samples each
    (``seq``: the per-sample id), 2 tokens per sample."""
    n = 12
    return pl.DataFrame({
        seq: [i // 2 for i in range(n)],
        "position": [i % 2 for i in range(n)],
        "rollout_id": [i // 6 for i in range(n)],
        "log_probs": [-0.1 - 0.01 * i for i in range(n)],
        "rollout_log_probs": [-0.11 - 0.01 * i for i in range(n)],
        "loss_masks": [1] * n,
        "entropy": [0.5] * n,
    })


@pytest.mark.parametrize("seq", ["index", "seq_id", "sample_indices"])
def test_slime_rollout_id_is_the_step(tmp_path, seq):
    """--framework slime reads ``rollout_id`` (slime's rollout index, the training step) as
    the step and the sample's id (``index``, ``sample_indices`` or ``seq_id``) as the
    sequence: 6 sequences over 2 steps, not 2 sequences of 6 samples each (with its seq_id
    beside it, not refused as ambiguous)."""
    ds = load_dataset([_write(tmp_path, _slime_rows(seq))], framework="slime")
    assert ds.mapping["seq_id"] == seq and ds.mapping["step"] == "rollout_id"
    acc = ds.accounting
    assert acc.sequences_total == 6 and acc.steps == (0, 1) and acc.tokens_valid == 12
    assert acc.sequences_with_duplicate_positions == 0


def test_rollout_id_stays_a_sequence_id_without_slime(tmp_path):
    """Without --framework slime (and with another framework) ``rollout_id`` is still a
    generic alias of seq_id, with a note that slime reads it as the step; beside a seq_id
    column the refusal names --framework slime."""
    df = _long().rename({"seq_id": "rollout_id"})
    p = _write(tmp_path, df)
    for fw in (None, "verl"):
        ds = load_dataset([p], framework=fw)
        assert ds.mapping["seq_id"] == "rollout_id" and ds.mapping["step"] == "step"
        assert ("seq_id <- 'rollout_id' (--framework slime would read it as step: name the "
                "framework if the dump is slime's)") in ds.notes
        # a generic dump: no slime columns beside it, no warning
        assert not [n for n in ds.notes if n.startswith("warning: seq_id <-")]
    # a slime dump read without --framework slime (log_probs mapped by hand): rollout_id
    # taken for the sequence merges each step's samples: warned, naming slime's columns
    # (helper-29 F3)
    ds = load_dataset([_write(tmp_path, _slime_rows().drop("position"), "s.parquet")],
                      columns={"train_logprob": "log_probs"})
    assert ds.mapping["seq_id"] == "rollout_id" and ds.accounting.sequences_total == 2
    warn = [n for n in ds.notes if n.startswith("warning: seq_id <- 'rollout_id'")]
    assert len(warn) == 1 and "slime's 'index', 'log_probs', 'loss_masks'" in warn[0]
    assert warn[0].endswith("pass --framework slime")
    with pytest.raises(SchemaError, match="--framework slime reads 'rollout_id' as step"):
        load_dataset([_write(tmp_path, _slime_rows("seq_id").rename(
            {"log_probs": "train_logprob", "rollout_log_probs": "infer_logprob"}), "b.parquet")])


def test_two_candidates_for_one_column_refused(tmp_path):
    """Both rollout_log_probs and infer_logprobs (two infer_logprob candidates) are refused,
    naming the column and both candidates; --column or --framework decides."""
    df = _long().rename({"infer_logprob": "rollout_log_probs"}).with_columns(
        infer_logprobs=pl.col("rollout_log_probs") - 0.5)
    p = _write(tmp_path, df)
    with pytest.raises(SchemaError) as e:
        load_dataset([p])
    msg = str(e.value)
    for w in ("ambiguous column infer_logprob", "'rollout_log_probs'", "'infer_logprobs'",
              "--column infer_logprob=NAME", "--framework roll"):
        assert w in msg, w
    ds = load_dataset([p], columns={"infer_logprob": "infer_logprobs"})
    assert ds.mapping["infer_logprob"] == "infer_logprobs"
    assert _valid(ds)["delta"][0] == pytest.approx(-0.1 - (-0.12 - 0.5))
    assert load_dataset([p], framework="roll").mapping["infer_logprob"] == "infer_logprobs"
    assert load_dataset([p], framework="verl").mapping["infer_logprob"] == "rollout_log_probs"


def test_canonical_name_and_alias_refused(tmp_path):
    """A canonical name beside one of its aliases is ambiguous too (step vs global_step)."""
    p = _write(tmp_path, _long(global_step=[9, 9, 9, 9, 9]))
    with pytest.raises(SchemaError, match="ambiguous column step: .*'step' and 'global_step'"):
        load_dataset([p])
    assert load_dataset([p], columns={"step": "global_step"}).mapping["step"] == "global_step"


def test_train_and_inference_entropy_not_ambiguous(tmp_path):
    """A verl-style dump with both a trainer-side (entropys) and an inference-side entropy
    maps them to different canonical columns: no ambiguity."""
    df = _verl_names().with_columns(rollout_entropy=pl.col("entropys") + 0.01)
    ds = load_dataset([_write(tmp_path, df)])
    assert ds.mapping["entropy"] == "rollout_entropy"
    assert ds.mapping["train_entropy"] == "entropys"
    assert ds.entropy_source == "inference"


def test_entropy_train_contradicting_a_mapped_entropy_is_refused(tmp_path):
    """--entropy train with --column entropy=X naming another column than the trainer's
    entropy is refused naming both (it used the trainer's silently); naming the trainer's
    own column, or mapping X as train_entropy, is consistent."""
    df = _verl_names().with_columns(rollout_entropy=pl.col("entropys") + 0.01,
                                    my_entropy=pl.col("entropys") + 0.02)
    p = _write(tmp_path, df)
    with pytest.raises(SchemaError, match=r"--entropy train reads the trainer-side entropy "
                                          r"\('entropys'\), but --column entropy=my_entropy"):
        load_dataset([p], columns={"entropy": "my_entropy"}, entropy="train")
    ds = load_dataset([p], columns={"entropy": "entropys"}, entropy="train")
    assert ds.mapping["entropy"] == "entropys" and ds.entropy_source == "trainer"
    ds = load_dataset([p], columns={"train_entropy": "my_entropy"}, entropy="train")
    assert ds.mapping["entropy"] == "my_entropy" and ds.entropy_source == "trainer"
    ds = load_dataset([p], columns={"entropy": "my_entropy"})
    assert ds.mapping["entropy"] == "my_entropy" and ds.entropy_source == "inference"


def test_bundled_and_synth_dumps_are_unambiguous(tmp_path):
    """The bundled sample runs and `synth` output (long and nested) load without any option."""
    from entr_diag.io.load import bundled_sample_path
    from entr_diag.synth import SynthSpec, write_synth

    paths = [bundled_sample_path(), bundled_sample_path().with_name("sample_run_nested.parquet")]
    for layout in ("long", "nested"):
        p = tmp_path / f"synth_{layout}.parquet"
        write_synth(p, SynthSpec(n_tokens=2_000, seed=0, dirty=True), layout=layout)
        paths.append(p)
    for p in paths:
        assert load_dataset([p]).mapping["infer_logprob"] == "infer_logprob"


def test_override_taking_a_needed_column_explained(tmp_path):
    """--column train_logprob=rollout_log_probs on a verl dump says that the override took the
    column infer_logprob was read from, and what to do."""
    p = _write(tmp_path, _verl_names())
    with pytest.raises(SchemaError) as e:
        load_dataset([p], columns={"train_logprob": "rollout_log_probs"})
    msg = str(e.value)
    for w in ("missing required column(s) infer_logprob",
              "--column train_logprob=rollout_log_probs takes 'rollout_log_probs'",
              "infer_logprob has no source left", "--column infer_logprob=NAME"):
        assert w in msg, w
    with pytest.raises(SchemaError, match="map one source column to two canonical columns"):
        load_dataset([p], columns={"train_logprob": "rollout_log_probs",
                                   "infer_logprob": "rollout_log_probs"})
    # an optional column losing its source to an override is only noted
    ds = load_dataset([p], columns={"entropy": "entropys"})
    assert ds.mapping["entropy"] == "entropys" and "train_entropy" not in ds.mapping
    assert any("train_entropy: 'entropys' is taken by --column entropy=entropys" in n
               for n in ds.notes)
    assert not any(n.startswith("warning: ") for n in ds.notes)


def test_override_taking_a_structural_column_is_warned_about(tmp_path):
    """--column seq_id=position (a mapping mistake) leaves position no column: every
    command warns, naming what is lost, instead of only inspect noting it (the repeated-rows
    warning then said 'the input has no position column', helper-40); an override that
    leaves the column another source is only noted."""
    from typer.testing import CliRunner

    from entr_diag.cli import app

    p = _write(tmp_path, _long())
    ds = load_dataset([p], columns={"seq_id": "position"})
    assert "position" not in ds.mapping
    warn = [n for n in ds.notes if n.startswith("warning: position: 'position' is taken")]
    assert len(warn) == 1 and "tokens are numbered in row order" in warn[0]
    r = CliRunner().invoke(app, ["inspect", "--quiet", str(p), "--column", "seq_id=position"])
    assert ("warning: position: 'position' is taken by --column seq_id=position, so the "
            "input is read without a position column") in " ".join(r.stderr.split())
    ds = load_dataset([p], columns={"seq_id": "step"})
    assert any(n.startswith("warning: step: 'step' is taken by --column seq_id=step")
               and "no per-step tables" in n for n in ds.notes)
    # another spelling of position left: no warning
    q = _write(tmp_path, _long().with_columns(pl.col("position").alias("pos")), "q.parquet")
    ds = load_dataset([q], columns={"seq_id": "position"})
    assert ds.mapping["position"] == "pos"
    assert not any(n.startswith("warning: ") for n in ds.notes)


def test_library_entry_points_take_one_path_and_check_the_seed(tmp_path):
    """load_dataset takes one path as well as a list (a str was read character by
    character); fit_scaling_law refuses a negative seed with a ParameterError; the fit's
    to_dict carries verdict.caveat (None, or the small-sample caveat); verl's
    global_steps is a step column."""
    from entr_diag.errors import ParameterError
    from entr_diag.fit import fit_scaling_law
    from entr_diag.synth import SynthSpec, write_synth

    p = tmp_path / "s.parquet"
    write_synth(p, SynthSpec(n_tokens=30_000, seed=2))
    ds = load_dataset(str(p))
    assert ds.accounting.to_dict() == load_dataset([p]).accounting.to_dict()
    with pytest.raises(ParameterError, match="seed"):
        fit_scaling_law(ds.lf, seed=-1)
    v = fit_scaling_law(load_dataset([p]).lf).to_dict()["verdict"]
    assert "caveat" in v and v["caveat"] is None  # 150 sequences: no small-sample caveat
    g = _write(tmp_path, _long().rename({"step": "global_steps"}), "g.parquet")
    assert load_dataset([g]).mapping["step"] == "global_steps"


def test_shards_spelling_columns_differently_are_named_in_the_refusal(tmp_path):
    """Shards of one input whose columns are named differently (one canonical, one verl's:
    no file holds both names) are refused naming the column, each file's name for it and the
    others so affected, instead of only 'ambiguous column' advice that cannot help; shards
    that share a name and add an alias do not mention it."""
    d = tmp_path / "run"
    d.mkdir()
    _long().write_parquet(d / "a.parquet")
    _long().rename({"step": "global_steps", "train_logprob": "old_log_probs"}).write_parquet(
        d / "b.parquet")
    with pytest.raises(SchemaError) as e:
        load_dataset([d])
    msg = str(e.value)
    assert msg.startswith(f"the input's files name their columns differently: step is 'step' "
                          f"in {d / 'a.parquet'} and 'global_steps' in {d / 'b.parquet'} "
                          "(likewise train_logprob)"), msg
    assert "(Stopped at: " in msg
    both = tmp_path / "both"
    both.mkdir()
    _long().write_parquet(both / "a.parquet")
    _long().with_columns(pl.col("step").alias("global_steps")).write_parquet(both / "b.parquet")
    with pytest.raises(SchemaError) as e:
        load_dataset([both])
    assert "name their columns differently" not in str(e.value)


def test_a_trainer_entropy_holding_only_nulls_counts_as_absent(tmp_path):
    """A train_entropy column whose Parquet statistics show only nulls is not mapped (a
    note says so), so no hint offers --entropy train for it; beside an all-NaN entropy,
    neither is used (no fallback onto the null one) and the tokens stay valid; mapped
    explicitly, the all-NaN entropy's hint only suggests mapping another column."""
    from entr_diag.caveats import exclusion_hint

    p = _write(tmp_path, _long(entropy=[float("nan")] * 5).with_columns(
        pl.lit(None, dtype=pl.Float64).alias("train_entropy")))
    ds = load_dataset([p])
    assert "train_entropy" not in ds.mapping and "entropy" not in ds.mapping
    assert "train_entropy ('train_entropy') holds only nulls in every file: not used (as if " \
           "absent)" in ds.notes
    assert ds.accounting.tokens_valid == 5
    ds = load_dataset([p], columns={"entropy": "entropy"})
    hint = exclusion_hint(ds.accounting.excluded, ds.accounting.tokens_masked, ds.mapping)
    assert "invalid_entropy" in hint and "--entropy train" not in hint


def test_zero_placeholder_hint_names_unmasked_padding(tmp_path):
    """Most tokens excluded as zero_placeholder in a long file without a loss mask: the
    hint names the padding of padded tensors and the --column loss_mask that sets it
    aside, and, without an entropy column, that one would let it be recognised
    (helper-30 F8); with a mask mapped, neither."""
    from entr_diag.caveats import exclusion_hint

    n = 40
    df = pl.DataFrame({"seq_id": [i // 10 for i in range(n)],
                       "train_logprob": [-0.3 if i % 10 < 3 else 0.0 for i in range(n)],
                       "infer_logprob": [-0.31 if i % 10 < 3 else -1.0 for i in range(n)]})
    ds = load_dataset([_write(tmp_path, df)])
    hint = exclusion_hint(ds.accounting.excluded, ds.accounting.tokens_masked, ds.mapping)
    assert hint.startswith("Most are zero_placeholder")
    assert ("or the padding of padded tensors: no loss mask is mapped, so every row counts "
            "as a token; map it with --column loss_mask=NAME (with an entropy column, "
            "padding is recognised and set aside)") in hint
    masked = df.with_columns(loss_mask=pl.lit(True))
    ds = load_dataset([_write(tmp_path, masked, "m.parquet")])
    hint = exclusion_hint(ds.accounting.excluded, ds.accounting.tokens_masked, ds.mapping)
    assert "zero_placeholder" in hint and "padded tensors" not in hint


def test_non_finite_hint_without_a_mask_names_padding_only_when_some_rows_are_valid(tmp_path):
    """A long file whose logprobs are NaN in every row, without a loss mask: the hint says
    a side was not computed, neither padded tensors nor a mask covering padding (no tensor
    is all padding, and no mask is mapped: helper-31 F4); NaN in 60% of the rows: the
    padding of padded tensors is named; with a mask mapped, the mask covering padding."""
    from entr_diag.caveats import exclusion_hint

    n = 40
    nan = float("nan")
    df = pl.DataFrame({"seq_id": [i // 10 for i in range(n)],
                       "train_logprob": [nan] * n, "infer_logprob": [nan] * n})
    ds = load_dataset([_write(tmp_path, df)])
    hint = exclusion_hint(ds.accounting.excluded, ds.accounting.tokens_masked, ds.mapping)
    assert hint.startswith("Most are non_finite_logprob: one side, or both, may not have "
                           "been computed for these tokens (NaN, null or infinite)"), hint
    assert "padd" not in hint and "mask" not in hint, hint
    some = df.with_columns(
        pl.when(pl.int_range(pl.len()) % 10 < 4).then(-0.3).otherwise(nan).alias(c)
        for c in ("train_logprob", "infer_logprob"))
    ds = load_dataset([_write(tmp_path, some, "some.parquet")])
    hint = exclusion_hint(ds.accounting.excluded, ds.accounting.tokens_masked, ds.mapping)
    assert "or the padding of padded tensors: no loss mask is mapped" in hint, hint
    ds = load_dataset([_write(tmp_path, some.with_columns(loss_mask=pl.lit(True)), "m.parquet")])
    hint = exclusion_hint(ds.accounting.excluded, ds.accounting.tokens_masked, ds.mapping)
    assert "or the mask covers padding" in hint and "padded tensors" not in hint, hint
    assert "or it is inverted (true on the prompt" in hint  # (helper-44)


def test_an_entropy_column_without_a_valid_value_counts_as_absent(tmp_path):
    """An entropy column NaN for every loss-masked token (an engine that does not compute
    it) excluded every token; it is not used instead, as if absent (a warning note), and
    the trainer-side entropy takes its place when there is one. Mapped explicitly
    (--column / --entropy infer) it stays, and every token stays excluded."""
    nan = [float("nan")] * 5
    p = _write(tmp_path, _long(entropy=nan), "only.parquet")
    ds = load_dataset([p])
    assert "entropy" not in ds.mapping and ds.accounting.tokens_valid == 5
    assert ds.notes[0] == ("warning: entropy ('entropy') holds no valid value for any "
                           "loss-masked token (5 null or NaN): not used, as if absent")
    # what the values are, by kind
    mixed = _write(tmp_path, _long(entropy=[-1.0, -2.0, float("inf"), 25.0, float("nan")]),
                   "mixed.parquet")
    assert load_dataset([mixed]).notes[0] == (
        "warning: entropy ('entropy') holds no valid value for any loss-masked token (1 null "
        "or NaN, 1 infinite, 2 negative, 1 above 20 nats): not used, as if absent")
    q = _write(tmp_path, _long(entropy=nan, train_entropy=[0.5, 0.4, 0.3, 1.0, 2.0]),
               "train.parquet")
    ds = load_dataset([q])
    assert ds.mapping["entropy"] == "train_entropy" and ds.entropy_source == "trainer"
    assert ds.notes[0].endswith("; using the trainer-side entropy ('train_entropy')")
    assert ds.accounting.tokens_valid == 5
    for kw in ({"columns": {"entropy": "entropy"}}, {"entropy": "infer"}):
        ds = load_dataset([p], **kw)
        assert ds.mapping["entropy"] == "entropy" and ds.accounting.tokens_valid == 0, kw


def test_a_pattern_through_a_bracketed_folder_says_how_to_escape_it(tmp_path, monkeypatch):
    """'dir[x]/*.parquet' matches nothing (the folder's name is a pattern too): the error
    names the folder and its escaped form; the escaped pattern reads it."""
    d = tmp_path / "dir[x]"
    d.mkdir()
    _long().write_parquet(d / "a.parquet")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputError, match=r"^the pattern dir\[x\]/\*\.parquet matches no file: "
                                         r"the folder dir\[x\] exists, .* \(dir\[\[\]x\]\)"):
        load_dataset(["dir[x]/*.parquet"])
    assert load_dataset(["dir[[]x]/*.parquet"]).accounting.tokens_valid == 5
    with pytest.raises(InputError, match=r"^the pattern nope/\*\.parquet matches no file\.$"):
        load_dataset(["nope/*.parquet"])


def test_the_validity_predicate_is_no_exclusion_condition_holding():
    """_valid_expr (what the token frame keeps) is true exactly when no exclusion condition
    holds, a null condition counting as false, on every mix of null, NaN, infinite,
    boundary and ordinary values of every column."""
    import itertools

    import numpy as np

    from entr_diag.io import schema as S
    from entr_diag.io.load import _reason_conditions, _valid_expr

    lp = [None, float("nan"), float("inf"), -float("inf"), 0.0, -0.01, -0.2,
          S.SENTINEL_FLOOR, S.SENTINEL_FLOOR + 1e-9, S.POSITIVE_LOGPROB_TOL,
          S.POSITIVE_LOGPROB_TOL * 1.5, 1.0]
    h = [None, float("nan"), float("inf"), -1e-9, 0.0, 1.0, S.ENTROPY_MAX, S.ENTROPY_MAX + 1]
    rows = list(itertools.product(lp, lp, h))
    n = len(rows)
    rng = np.random.default_rng(0)

    def pick(values):
        return [values[i] for i in rng.integers(0, len(values), n)]

    df = pl.DataFrame({
        "train_logprob": [r[0] for r in rows], "infer_logprob": [r[1] for r in rows],
        "entropy": [r[2] for r in rows],
        "loss_mask": pick([True, False, None, True, True]),
        "_mask_bad": pick([False, False, True, None]),
        "_empty": pick([False, False, True, None]), "_pad": pick([False, False, True, None]),
        "seq_id": pick(["a", "b", None]), "position": pick([0, 3, -1, None]),
        "policy_version": pick([0, 2, -1, None]), "train_version": pick([1, 3, -2, None]),
    }, schema_overrides={"position": pl.Int64, "policy_version": pl.Int64,
                         "train_version": pl.Int64})
    full = {c: c for c in ("loss_mask", "position", "entropy", "policy_version",
                           "train_version", "train_logprob", "infer_logprob", "seq_id")}
    for drop in ((), ("loss_mask",), ("position",), ("entropy",),
                 ("policy_version", "train_version")):
        mapping = {k: v for k, v in full.items() if k not in drop}
        slow = pl.lit(True)
        for _, cond in _reason_conditions(mapping):
            slow = slow & ~cond.fill_null(False)
        got = df.select(fast=_valid_expr(mapping), slow=slow)
        assert got["fast"].null_count() == 0
        assert got["fast"].to_list() == got["slow"].to_list(), drop
        assert 0 < got["fast"].sum() < n  # both kinds of row are there


def test_exclusion_hints_name_a_column_by_its_source_and_a_one_sided_placeholder():
    """A column mapped from another name is named with its source, one read under its own
    name is not repeated; placeholders in one logprob column get that side's hint (it
    returned no value), in both the hint of a mask that does not match the arrays."""
    from entr_diag.caveats import column_named, file_exclusion_warnings

    assert column_named("infer_logprob", {"infer_logprob": "infer_logprob"}) == "infer_logprob"
    assert column_named("infer_logprob", {"infer_logprob": "rollout_log_probs"}) == \
        "infer_logprob ('rollout_log_probs')"
    mapping = {"train_logprob": "old_log_probs", "infer_logprob": "infer_logprob"}
    files = {"sentinel_logprob": {"a.parquet": (60, 100)}}

    def warn(*sides: str) -> str:
        where = {"sentinel_logprob": {"columns": {c: 60 for c in sides}}}
        (w,) = file_exclusion_warnings(files, 3, mapping, where=where)
        return w

    one = warn("infer_logprob")
    assert "infer_logprob holds a placeholder (e.g. -9999) for these tokens" in one
    assert "mask may not match" not in one and "(the placeholder values are in" not in one
    train = warn("train_logprob")
    assert "train_logprob ('old_log_probs') holds a placeholder" in train
    both = warn("train_logprob", "infer_logprob")
    assert "the mask may not match the logprob arrays" in both
    assert "(the placeholder values are in both train_logprob ('old_log_probs') and infer_logprob)" in both


def test_a_nested_shard_written_twice_is_named(tmp_path):
    """Nested files without a seq_id name their rows file:row, so a shard written twice
    (another row-group size and compression: not a byte copy) would count twice unseen:
    the later file is named with the rows it repeats. A file sharing one row with another
    (one response sampled twice) and all-padding rows are no copy."""
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)

    def rows(n: int) -> list[list[float]]:
        return [list(-rng.exponential(1.0, 6)) for _ in range(n)]

    def table(tl: list[list[float]]) -> pa.Table:
        return pa.table({"old_log_probs": pa.array(tl, type=pa.list_(pa.float32(), 6)),
                         "rollout_log_probs": pa.array(tl, type=pa.list_(pa.float32(), 6))})

    a = rows(20)
    pq.write_table(table(a), tmp_path / "a.parquet")
    pq.write_table(table(a[::-1]), tmp_path / "b.parquet", row_group_size=7,
                   compression="gzip")
    pq.write_table(table(rows(19) + [a[3]] + [[0.0] * 6] * 3), tmp_path / "c.parquet")
    ds = load_dataset([tmp_path])
    warned = [n for n in ds.notes if "repeats the rows" in n]
    assert warned == [f"warning: {tmp_path / 'b.parquet'} repeats the rows of "
                      f"{tmp_path / 'a.parquet'} (20 of its 20 rows have their old_log_probs "
                      "list there too, though the files differ in bytes: a shard written "
                      "twice?): without a seq_id column their sequences are named file:row, "
                      "so their tokens count twice; pass one of them"]
    assert ds.accounting.sequences_total == 63
    # a byte copy keeps its own warning, not both
    (tmp_path / "d.parquet").write_bytes((tmp_path / "c.parquet").read_bytes())
    notes = load_dataset([tmp_path]).notes
    assert sum("repeats the rows" in n for n in notes) == 1
    assert any("look like copies of each other" in n and "d.parquet" in n for n in notes)
    # a part of a shard written again under a name sorting BEFORE the original's
    part = tmp_path / "part"
    part.mkdir()
    pq.write_table(table(a), part / "p-1.parquet")
    pq.write_table(table(a[:8]), part / "p-1-retry.parquet", row_group_size=3)
    warned = [n for n in load_dataset([part]).notes if "repeats the rows" in n]
    assert warned and warned[0].startswith(
        f"warning: {part / 'p-1-retry.parquet'} repeats the rows of {part / 'p-1.parquet'} "
        "(8 of its 8 rows")


def test_versions_below_minus_one_are_read_as_version_numbers(tmp_path):
    """Only -1 is the prompt-token marker: versions of -2 or below among the rows that would
    be excluded as negative_version (policy_version = step - lag at the start of an
    asynchronous run, versions offset by -100) make every negative version a version
    number, read again and kept, with a warning note naming the column and the lowest
    value; the staleness is their difference. -1 alone stays excluded."""
    p = _write(tmp_path, _long(policy_version=[-2, -1, 0, -1, 1]))
    ds = load_dataset([p])
    assert ds.accounting.excluded == {} and ds.accounting.tokens_valid == 5
    assert any(n.startswith("warning: 3 loss-masked tokens with valid logprobs have "
                            "policy_version below 0 (from -2), not only -1: read as version "
                            "numbers") for n in ds.notes), ds.notes
    assert _valid(ds)["staleness"].to_list() == [4, 3, 2, 3, 1]
    off = _write(tmp_path, _long(policy_version=[-99, -99, -98, -100, -100],
                                 train_version=[-98] * 5), "off.parquet")
    ds = load_dataset([off])
    assert ds.accounting.tokens_valid == 5
    assert any("policy_version or train_version below 0 (from -100)" in n for n in ds.notes)
    ds = load_dataset([_write(tmp_path, _long(policy_version=[-1, -1, 0, 1, 1]), "m.parquet")])
    assert ds.accounting.excluded == {"negative_version": 2}
    assert not any("read as version numbers" in n for n in ds.notes)
    # a placeholder far below the valid versions (0..2): an unknown version, still excluded
    ds = load_dataset([_write(tmp_path, _long(policy_version=[-9999, 1, 0, 2, 1]), "s.parquet")])
    assert ds.accounting.excluded == {"negative_version": 1}
    assert not any("read as version numbers" in n for n in ds.notes)


def test_fractional_float_seq_ids_are_named_in_the_refusal_hint():
    """A seq_id column of floats with a fraction reads as null: the hint of the
    missing_seq_id exclusion says so, not only 'mostly null'."""
    from entr_diag.caveats import MOSTLY_EXCLUDED_HINTS

    assert "floating-point values with a fraction" in MOSTLY_EXCLUDED_HINTS["missing_seq_id"]


def test_a_per_sequence_entropy_in_a_nested_file_is_not_used(tmp_path):
    """A nested file whose entropy holds one value per row (a per-sequence mean) beside list
    logprobs: it was copied to every token of the row and analysed (alpha = 0.33, no word,
    helper-32 F1). Not used, as if absent, with a warning: fit refuses naming why (exit
    2); a per-token trainer-side entropy list takes its place; a scalar train_entropy
    beside a per-token entropy list is left out alone."""
    from typer.testing import CliRunner

    from entr_diag.cli import app

    base = pl.DataFrame({"seq_id": [1, 2], "train_logprob": [[-0.1, -0.2, -0.3], [-1.0, -2.0]],
                         "infer_logprob": [[-0.12, -0.19, -0.35], [-1.1, -1.9]]})
    p = _write(tmp_path, base.with_columns(entropy=pl.Series([0.4, 1.6])), "mean.parquet")
    ds = load_dataset([p])
    assert "entropy" not in ds.mapping and ds.accounting.tokens_valid == 5
    assert any(n.startswith("warning: entropy ('entropy') holds one value per row, not a list "
                            "of one per token, in 1 nested file(s)") for n in ds.notes), ds.notes
    r = CliRunner().invoke(app, ["fit", str(p), "-q"])
    assert r.exit_code == 2 and r.stderr.startswith(
        f"error: {p}: the entropy column ('entropy') holds one value per sequence row, not a "
        "list of one per token"), r.output
    lists = pl.Series([[0.5, 0.4, 0.3], [1.2, 2.0]])
    q = _write(tmp_path, base.with_columns(entropy=pl.Series([0.4, 1.6]),
                                           train_entropy=lists), "train.parquet")
    ds = load_dataset([q])
    assert ds.mapping["entropy"] == "train_entropy" and ds.entropy_unused is None, ds.mapping
    assert "entropy: using the trainer-side entropy ('train_entropy')" in ds.notes
    assert _valid(ds)["entropy"].to_list() == [0.5, 0.4, 0.3, 1.2, 2.0]
    q = _write(tmp_path, base.with_columns(entropy=lists, train_entropy=pl.Series([0.4, 1.6])),
               "infer.parquet")
    ds = load_dataset([q])
    assert ds.mapping["entropy"] == "entropy" and "train_entropy" not in ds.mapping
    assert _valid(ds)["entropy"].to_list() == [0.5, 0.4, 0.3, 1.2, 2.0]


def test_a_column_of_arrow_null_type_reads_as_holding_no_value(tmp_path):
    """pandas writes a column set to None as Arrow's null type (no statistics either): an
    optional column null-typed in every file is not used, with a note, as a float column
    of nulls is (it stopped every command: 'has type null; advantage needs numeric
    values', helper-42); null-typed in one shard, the other shards' type is read and that
    shard's rows are null; a required column null-typed everywhere is refused naming it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    t = _long().to_arrow()
    n = t.num_rows

    def null(table, col):
        return table.set_column(table.schema.get_field_index(col), col, pa.array([None] * n))

    a = tmp_path / "a.parquet"
    pq.write_table(null(null(t, "policy_version"), "entropy").append_column(
        "advantage", pa.array([None] * n)), a)
    ds = load_dataset([a])
    assert "advantage" not in ds.mapping and "policy_version" not in ds.mapping
    assert "entropy" not in ds.mapping and ds.accounting.tokens_valid == n
    assert any(x.startswith("advantage holds no value in any input file (Arrow type null")
               for x in ds.notes)
    assert any(x.startswith("entropy ('entropy') holds only nulls") for x in ds.notes)
    # one shard null-typed: the other's float type is read
    d = tmp_path / "d"
    d.mkdir()
    pq.write_table(null(t, "entropy"), d / "a.parquet")
    pq.write_table(_long(seq_id=[7, 7, 7, 8, 8]).to_arrow(), d / "b.parquet")
    ds = load_dataset([d])
    assert ds.mapping["entropy"] == "entropy"
    assert ds.accounting.excluded == {"invalid_entropy": n}
    with pytest.raises(SchemaError, match=r"train_logprob holds no value in any input file "
                                          r"\(Arrow type null"):
        load_dataset([_write(tmp_path, pl.from_arrow(null(t, "train_logprob")), "r.parquet")])
    # a long file's null-typed seq_id: said so, not "none of seq_id ... exists" (helper-45)
    sid = tmp_path / "sid.parquet"
    pq.write_table(null(t, "seq_id"), sid)
    with pytest.raises(SchemaError, match=r"needs a sequence id, and seq_id holds no value in "
                                          r"any input file \(Arrow type null"):
        load_dataset([sid])
    # a nested file's null-typed entropy (no list): no value, not "one value per row"
    nested = pa.table({"seq_id": [1, 2], "train_logprob": [[-0.1, -0.2], [-0.3, -0.4]],
                       "infer_logprob": [[-0.11, -0.21], [-0.29, -0.41]],
                       "entropy": pa.array([None, None]),
                       "train_entropy": [[0.5, 0.4], [0.3, 0.6]]})
    pq.write_table(nested, tmp_path / "n.parquet")
    ds = load_dataset([tmp_path / "n.parquet"])
    assert ds.mapping["entropy"] == "train_entropy"
    assert not any("one value per row" in x for x in ds.notes), ds.notes


def test_a_narrow_position_column_that_wraps_is_named(tmp_path):
    """An int16 position column wraps past 32,767 to negative values: its invalid_position
    rows get a warning naming the type and the cause (helper-42: 28% of the tokens excluded
    with no word on the overflow); an int16 column without invalid rows, none."""
    n = 33_000
    df = pl.DataFrame({"seq_id": [1] * n, "position": pl.int_range(n, eager=True),
                       "train_logprob": [-0.5] * n, "infer_logprob": [-0.51] * n,
                       "entropy": [0.7] * n})
    wrapped = df.with_columns(((pl.col("position") + 2**15) % 2**16 - 2**15).cast(pl.Int16))
    ds = load_dataset([_write(tmp_path, wrapped, "w.parquet")])
    assert ds.accounting.excluded == {"invalid_position": n - 32_768}
    warn = [x for x in ds.notes if x.startswith("warning: position is int16 in 1 of 1")]
    assert len(warn) == 1 and "past 32,767 wrap to negative values" in warn[0], ds.notes
    ok = _write(tmp_path, _long().with_columns(pl.col("position").cast(pl.Int16)), "ok.parquet")
    assert not any("wrap" in x for x in load_dataset([ok]).notes)
    # uint8 wraps back to 0: sequences holding a position twice, which the duplicate-
    # position warning put down to copied shards or shared ids (helper-44); a caveat too
    u8 = df.head(600).with_columns((pl.col("position") % 256).cast(pl.UInt8))
    ds = load_dataset([_write(tmp_path, u8, "u8.parquet")])
    assert ds.accounting.sequences_with_duplicate_positions == 1
    warn = [x for x in ds.notes if x.startswith("warning: position is uint8 in 1 of 1")]
    assert len(warn) == 1 and "past 255 wrap back to 0, so the 1 sequence(s)" in warn[0]
    from entr_diag.caveats import position_wrap_caveat

    assert position_wrap_caveat(ds.notes).startswith("caveat: position is uint8 in 1 of 1")
    assert position_wrap_caveat(load_dataset([ok]).notes) is None
    # -1 padding in an int8 column that never reaches 127: invalid positions, no wrap
    # (helper-45: warned as one)
    pad = _long(position=[0, 1, -1, 0, 1]).with_columns(pl.col("position").cast(pl.Int8))
    ds = load_dataset([_write(tmp_path, pad, "pad.parquet")])
    assert ds.accounting.excluded == {"invalid_position": 1}
    assert not any("wrap" in x for x in ds.notes), ds.notes


def test_a_loss_mask_over_a_few_rows_is_warned_about(tmp_path):
    """A loss mask true on under 5% of the rows (an inverted or prompt mask, a mask of the
    first tokens: helper-42's passed silently) is a warning naming the column; the bundled
    run's mask (97%) is not."""
    from typer.testing import CliRunner

    from entr_diag.cli import app

    n_seq, length = 100, 40
    df = pl.DataFrame({"seq_id": np.repeat(np.arange(n_seq), length),
                       "position": np.tile(np.arange(length), n_seq),
                       "train_logprob": -0.5, "infer_logprob": -0.51, "entropy": 0.7,
                       "loss_mask": np.tile(np.arange(length) < 1, n_seq)})
    p = _write(tmp_path, df, "m.parquet")
    r = CliRunner().invoke(app, ["inspect", "--quiet", str(p)])
    assert ("warning: only 2.5% of the 4,000 rows are in the loss mask (100 tokens, 1.0 a "
            "sequence on average): check that 'loss_mask' is the loss mask") in \
        " ".join(r.stderr.split()), r.stderr
    r = CliRunner().invoke(app, ["inspect", "--quiet"])
    assert "are in the loss mask" not in r.stderr
    # long prompts before real responses (40 masked tokens a sequence, 3.8% of the rows):
    # a real layout, no warning (helper-45)
    n_seq, length = 40, 1040
    long = pl.DataFrame({"seq_id": np.repeat(np.arange(n_seq), length),
                         "position": np.tile(np.arange(length), n_seq),
                         "train_logprob": -0.5, "infer_logprob": -0.51, "entropy": 0.7,
                         "loss_mask": np.tile(np.arange(length) >= 1000, n_seq)})
    r = CliRunner().invoke(app, ["inspect", "--quiet", str(_write(tmp_path, long, "l.parquet"))])
    assert r.exit_code == 0 and "are in the loss mask" not in r.stderr, r.stderr


def test_text_columns_where_numbers_are_needed_get_a_conversion_hint(tmp_path):
    """A mask of 'True'/'False' strings, a step of 'global_step_3' strings (pandas writes
    both often) are refused naming the file and column, with how to convert them
    (helper-44: no hint)."""
    mask = _long().with_columns(pl.col("loss_mask").cast(pl.String).alias("loss_mask"))
    # (polars writes 'true' / 'false', pandas 'True' / 'False': the hint reads both;
    # helper-48's lowercase strings did not match df[c] == 'True')
    with pytest.raises(SchemaError, match=r"loss_mask needs boolean or 0/1 numeric values\. "
                                          r"Text is not read as numbers: .*'True' / 'False' "
                                          r"or 'true' / 'false': df\[c\] = "
                                          r"df\[c\]\.str\.lower\(\) == 'true'"):
        load_dataset([_write(tmp_path, mask, "m.parquet")])
    step = _long().with_columns(pl.format("global_step_{}", "step").alias("step"))
    with pytest.raises(SchemaError, match=r"step needs integer values\. Text is not read as "
                                          r"numbers: .*'global_step_3'.*expand=False"):
        load_dataset([_write(tmp_path, step, "s.parquet")])


def test_missing_column_lists_look_alike_names_escaped(tmp_path):
    """A column named like a required one but for a zero-width space and a Cyrillic o
    printed exactly like it in the list of the input's columns (helper-48): names outside
    printable ASCII are escaped, their odd characters named; plain names are as they are."""
    df = _long().rename({"infer_logprob": "infer_l\u043egprob\u200b"})
    with pytest.raises(SchemaError) as e:
        load_dataset([_write(tmp_path, df, "w.parquet")])
    msg = str(e.value)
    assert "'infer_l\\u043egprob\\u200b'" in msg and "\u200b" not in msg, msg
    assert ("(names with characters outside printable ASCII are shown escaped: \\u043e "
            "CYRILLIC SMALL LETTER O, \\u200b ZERO WIDTH SPACE.)") in msg
    assert ", train_logprob," in msg or ", train_logprob." in msg


def test_a_name_with_an_invisible_character_is_warned_about(tmp_path):
    """'entropy' + U+200B (zero-width space) was replaced by the trainer-side entropy with
    a note only (helper-49), and 'global_step' + U+00A0 left the step unmapped in silence:
    both are warned about, naming the odd character and the column they would be; fit
    without any entropy says so in its refusal. A plain name gets no such warning."""
    from typer.testing import CliRunner

    from entr_diag.cli import app

    base = _long().with_columns(pl.col("entropy").alias("train_entropy"))
    p = _write(tmp_path, base.rename({"entropy": "entropy\u200b"}), "e.parquet")
    notes = " ".join(load_dataset([p]).notes)
    assert ("warning: column 'entropy\\u200b' is not read: without its characters outside "
            "printable ASCII (\\u200b ZERO WIDTH SPACE) it is named as entropy is, which is "
            "read from the trainer-side entropy instead") in notes, notes
    p = _write(tmp_path, _long().rename({"step": "global_step\u00a0"}), "s.parquet")
    notes = " ".join(load_dataset([p]).notes)
    assert "column 'global_step\\xa0' is not read" in notes and "as step is, which has no " \
        "column" in notes, notes
    assert not [n for n in load_dataset([_write(tmp_path, _long(), "ok.parquet")]).notes
                if "is not read" in n]
    p = _write(tmp_path, _long().rename({"entropy": "entropy\u200b"}), "none.parquet")
    r = CliRunner().invoke(app, ["fit", str(p), "-q"])
    assert r.exit_code == 2 and "column 'entropy\\u200b' is not read" in " ".join(
        r.stderr.split()), r.output
