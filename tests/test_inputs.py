"""What the input paths resolve to, and what is said about files and columns left out."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

from entr_diag.cli import app
from entr_diag.errors import InputError
from entr_diag.io.load import resolve_paths

runner = CliRunner()


def _shard(path: Path, seq: int = 1, **drop) -> Path:
    """A tiny long-layout shard (verl names) with two sequences; ``drop``: columns left out."""
    df = pl.DataFrame({
        "seq_id": [seq, seq, seq + 1, seq + 1],
        "old_log_probs": [-0.1, -0.2, -1.0, -2.0],
        "rollout_log_probs": [-0.12, -0.19, -1.1, -1.9],
        "entropys": [0.5, 0.4, 1.2, 2.0],
        "response_mask": [1, 1, 1, 1],
    }).drop([c for c, yes in drop.items() if yes])
    path.parent.mkdir(parents=True, exist_ok=True)
    df.write_parquet(path)
    return path


# ------------------------------------------------------------------ hidden files in walks


def test_directory_walk_skips_hidden_and_underscore_files_and_reports_them(tmp_path):
    """A directory walk skips Parquet files named '.x' or '_x' (and lists them in
    ``skipped``); a glob or an explicit file includes them."""
    d = tmp_path / "shards"
    a = _shard(d / "a.parquet")
    tmp = _shard(d / "_tmp.parquet")
    dot = _shard(d / "sub" / ".b.parquet")
    (d / "_SUCCESS").write_text("")  # not a Parquet name: not counted as skipped
    (d / ".a.parquet.crc").write_text("")
    skipped: list[Path] = []
    assert resolve_paths([d], skipped=skipped) == [a]
    assert sorted(skipped) == sorted([tmp, dot])
    assert resolve_paths([str(d / "*.parquet")]) == [tmp, a]
    assert resolve_paths([tmp, dot]) == [tmp, dot]


def test_directory_with_only_skipped_files_says_so(tmp_path):
    """A directory holding only _-prefixed Parquet files is refused with a message that
    names them, not 'holds no Parquet files'."""
    d = tmp_path / "only"
    f = _shard(d / "_rollouts_step0.parquet")
    with pytest.raises(InputError) as e:
        resolve_paths([d])
    msg = str(e.value)
    assert "except 1 skipped hidden or _-prefixed file(s)" in msg
    assert str(f) in msg and "pass them explicitly" in msg
    r = runner.invoke(app, ["inspect", str(d)])
    assert r.exit_code == 2 and "_rollouts_step0.parquet" in r.stderr, r.output
    assert "Traceback" not in r.output
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match=r"holds no Parquet files \(\*\.parquet, \*\.pq\)\.$"):
        resolve_paths([tmp_path / "empty"])


def test_skipped_files_noted_on_stderr(tmp_path):
    """A command over a directory says on stderr how many files it skipped, with one
    example; --quiet silences it; nothing is said when nothing is skipped."""
    d = tmp_path / "shards"
    _shard(d / "a.parquet")
    r = runner.invoke(app, ["inspect", str(d)])
    assert r.exit_code == 0 and "skipped" not in r.stderr, r.output
    _shard(d / "_tmp.parquet", seq=10)
    _shard(d / ".old.parquet", seq=20)
    r = runner.invoke(app, ["inspect", str(d)])
    assert r.exit_code == 0, r.output
    notes = [ln for ln in r.stderr.splitlines() if "skipped" in ln]
    assert len(notes) == 1 and notes[0].startswith("note: skipped 2 Parquet file(s)"), r.stderr
    assert str(d / ".old.parquet") in notes[0]
    r = runner.invoke(app, ["inspect", str(d), "-q"])
    assert r.exit_code == 0 and r.stderr == "", r.stderr
