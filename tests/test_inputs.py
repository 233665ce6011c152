"""What the input paths resolve to, and what is said about files and columns left out."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from typer.testing import CliRunner

from entr_diag.cli import app
from entr_diag.errors import InputError
from entr_diag.gates import DEFAULT_PANEL
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


def test_directory_walk_skips_files_in_hidden_and_underscore_folders(tmp_path):
    """Parquet files in a folder under the searched one whose name starts with '.' or '_'
    (a writer's .staging/, a crashed Spark job's _temporary/) are skipped like hidden files
    and reported; the searched folder's own name (or its parents') does not count; a glob
    or an explicit path still reads them."""
    root = tmp_path / "_runs" / ".cache" / "run"  # hidden names above the searched folder
    a = _shard(root / "step=1" / "part-0.parquet")
    staging = _shard(root / ".staging" / "part-0.parquet", seq=10)
    temp = _shard(root / "_temporary" / "0" / "task_1" / "part-0.parquet", seq=20)
    (root / "_temporary" / "0" / "rows.csv").write_text("a\n1\n")  # not a warned-of file
    skipped: list[Path] = []
    others: list[Path] = []
    assert resolve_paths([root], skipped=skipped, others=others) == [a]
    assert sorted(skipped) == sorted([staging, temp]) and others == []
    assert resolve_paths([temp]) == [temp]
    assert resolve_paths([str(root / "_temporary" / "**" / "*.parquet")]) == [temp]
    r = runner.invoke(app, ["inspect", str(root)])
    assert r.exit_code == 0, r.output
    notes = [ln for ln in r.stderr.splitlines() if "skipped" in ln]
    assert notes and notes[0].startswith("note: skipped 2 Parquet file(s)"), r.stderr
    assert "folders holding them" in r.stderr
    # a folder holding nothing but a _temporary/ copy is refused, naming it
    only = tmp_path / "only_temp"
    t2 = _shard(only / "_temporary" / "part-0.parquet")
    with pytest.raises(InputError, match=r"except 1 skipped hidden or _-prefixed") as e:
        resolve_paths([only])
    assert str(t2) in str(e.value)


def test_a_pattern_matching_folders_searches_them(tmp_path, monkeypatch):
    """A quoted glob matching folders ('runs/step*') searches them as the shell's expansion
    would have passed them (it said 'matches no file'); files it matches too are read once;
    hidden files in those folders are skipped and reported; folders holding no Parquet
    file are refused naming what they hold."""
    monkeypatch.chdir(tmp_path)
    a = _shard(Path("runs/step1/part-0.parquet"))
    b = _shard(Path("runs/step2/part-0.parquet"), seq=10)
    tmp = _shard(Path("runs/step2/_temporary/part-0.parquet"), seq=20)
    _shard(Path("runs/other/part-0.parquet"), seq=30)
    skipped: list[Path] = []
    walked: set[Path] = set()
    assert resolve_paths(["runs/step*"], skipped=skipped, walked=walked) == [a, b]
    assert skipped == [tmp] and walked == {a, b}
    # a recursive pattern matching the folders and their files: each file once, unreported
    repeated: list[Path] = []
    skipped = []
    got = resolve_paths(["runs/step*/**"], repeated=repeated, skipped=skipped)
    assert sorted(got) == sorted([a, b, tmp]) and repeated == [] and skipped == []
    r = runner.invoke(app, ["inspect", "runs/step*"])
    assert r.exit_code == 0 and "Traceback" not in r.output, r.output
    Path("csv/step1").mkdir(parents=True)
    Path("csv/step1/rows.csv").write_text("a\n1\n")
    with pytest.raises(InputError, match=r"^the pattern csv/step\* matches only folders, and "
                                         r"they hold no Parquet files .*1 data file\(s\) of "
                                         r"another format \(\.csv\)"):
        resolve_paths(["csv/step*"])


def test_directory_holding_only_other_formats_names_them(tmp_path):
    """A folder without Parquet files but with CSV (or other data) files says so, naming
    one and their formats, instead of a bare 'holds no Parquet files'."""
    d = tmp_path / "csvs"
    d.mkdir()
    (d / "step1.csv").write_text("seq_id\n1\n")
    (d / "step2.jsonl.gz").write_bytes(b"")
    (d / "notes.txt").write_text("x")  # not a data file: not named
    with pytest.raises(InputError) as e:
        resolve_paths([d])
    msg = str(e.value)
    assert "holds no Parquet files" in msg
    assert "2 data file(s) of another format (.csv, .jsonl.gz)" in msg
    assert str(d / "step1.csv") in msg and "notes.txt" not in msg
    r = runner.invoke(app, ["fit", str(d)])
    assert r.exit_code == 2 and "step1.csv" in r.stderr and "Traceback" not in r.output


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
    with pytest.raises(InputError, match=r"holds no Parquet files "
                                         r"\(\*\.parquet, \*\.pq, \*\.parq\)\.$"):
        resolve_paths([tmp_path / "empty"])


def test_no_parquet_message_lists_exactly_the_names_a_walk_reads(tmp_path):
    """The names a folder without Parquet is said to lack are the ones a directory walk
    reads (any case), and no other."""
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError) as e:
        resolve_paths([tmp_path / "empty"])
    listed = re.search(r"holds no Parquet files \((.*)\)", str(e.value)).group(1).split(", ")
    want = set()
    for i, ext in enumerate((".parquet", ".pq", ".parq", ".pqt", ".prq", ".parquet.bak")):
        for name in (f"f{i}{ext}", f"g{i}{ext.upper()}"):
            _shard(tmp_path / "walk" / name, seq=10 * i)
            if f"*{ext}" in listed:
                want.add(name)
    assert {f.name for f in resolve_paths([tmp_path / "walk"])} == want


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


# ------------------------------------------------------------------ names holding [ * ?


def test_paths_with_glob_characters_are_read_literally(tmp_path):
    """An existing file or folder whose name holds '[' (``run[1].parquet``, a folder holding
    ``rank[0].parquet``, a folder ``dir[x]``) is read as named, not taken for a polars glob
    that matches nothing; a pattern given by the user still expands (to such files too)."""
    import json

    one = _shard(tmp_path / "run[1].parquet")
    inner = _shard(tmp_path / "brdir" / "rank[0].parquet", seq=5)
    _shard(tmp_path / "brdir" / "other.parquet", seq=9)
    folder = _shard(tmp_path / "dir[x]" / "a.parquet", seq=20)
    for path, files in [(one, 1), (tmp_path / "brdir", 2), (tmp_path / "dir[x]", 1),
                        (folder, 1), (tmp_path / "*" / "rank*.parquet", 1)]:
        js = tmp_path / "i.json"
        r = runner.invoke(app, ["inspect", str(path), "--json", str(js), "-q"])
        assert r.exit_code == 0, (path, r.output)
        doc = json.loads(js.read_text())["inputs"]
        assert len(doc["files"]) == files and doc["accounting"]["tokens_valid"] == 4 * files
    assert resolve_paths([str(tmp_path / "*" / "rank*.parquet")]) == [inner]
    assert resolve_paths([str(tmp_path / "run[[]1].parquet")]) == [one]  # [[] escapes '['


def test_flag_output_named_with_a_bracket_is_counted(tmp_path):
    """``flag -o 'noise[1].parquet'`` counts the tokens it wrote by reading that very file
    back (not a polars glob matching nothing)."""
    from entr_diag.synth import SynthSpec, write_synth

    p = tmp_path / "run.parquet"
    write_synth(p, SynthSpec(n_tokens=40_000, seed=2, noise_share=0.1))
    out = tmp_path / "noise[1].parquet"
    r = runner.invoke(app, ["flag", str(p), "-o", str(out), "--n-boot", "200", "-q"])
    assert r.exit_code == 0, r.output
    n = pl.read_parquet(out, glob=False).height
    assert n > 0 and r.stdout.startswith(f"{n:,} low-entropy noise tokens"), r.stdout


def test_empty_input_path_is_refused_not_read_as_the_current_directory(tmp_path,
                                                                        monkeypatch):
    """An empty path ('') is refused, by the commands and the library, instead of being
    read as the current directory; '.' still reads it."""
    from entr_diag.io import load_dataset

    _shard(tmp_path / "a.parquet")
    monkeypatch.chdir(tmp_path)
    for args in (["inspect", ""], ["inspect", "a.parquet", ""]):
        r = runner.invoke(app, args)
        assert r.exit_code == 2, r.output
        assert r.stderr.startswith("error: empty input path ('')") and len(
            r.stderr.splitlines()) == 1, r.stderr
    for paths in ([""], "", ["a.parquet", ""]):
        with pytest.raises(InputError, match=r"^empty input path \(''\)"):
            load_dataset(paths)
    assert resolve_paths(["."]) == [Path("a.parquet")]


def test_empty_output_path_is_refused_naming_the_option_before_any_input_is_read(
        tmp_path, monkeypatch):
    """An empty output path ('') is refused naming its option (exit 2, one line), before
    the input is read (here a missing file), instead of 'is a directory' for '.'."""
    monkeypatch.chdir(tmp_path)
    for cmd, opt in (("report", "-o"), ("report", "--json"), ("flag", "-o"), ("fit", "--json"),
                     ("compare", "--export"), ("compare", "--json"), ("inspect", "--json")):
        r = runner.invoke(app, [cmd, "missing.parquet", opt, ""])
        name = "--output" if opt == "-o" else opt
        assert r.exit_code == 2, r.output
        assert r.stderr == f"error: empty output path for {name}: give a file name.\n", r.stderr
    r = runner.invoke(app, ["synth", "-o", ""])
    assert r.exit_code == 2 and r.stderr.startswith("error: empty output path for --output")
    r = runner.invoke(app, ["fit", "missing.parquet", "--json", "."])
    assert r.exit_code == 2 and "names a directory" in r.stderr, r.stderr
    (tmp_path / "out").mkdir()
    r = runner.invoke(app, ["fit", "missing.parquet", "--json", "out"])
    # (worded as for 'out/', helper-31 F5: two phrasings for one mistake; with its hint too,
    # helper-38)
    assert r.exit_code == 2 and r.stderr == (
        "error: --json out: names a directory; give a file name in it (out/FILE). See "
        "'entr-diag fit --help'.\n"), r.stderr
    r = runner.invoke(app, ["report", "missing.parquet", "-o", "out"])
    assert r.exit_code == 2 and r.stderr.endswith(" See 'entr-diag report --help'.\n")


def test_output_path_ending_in_a_slash_is_refused_not_written_as_a_file(tmp_path, monkeypatch):
    """An output typed with a trailing slash names a directory: refused naming the option and
    the path as typed (exit 2), whether the directory exists or not (Path('new/') drops
    the slash: 'new/' was written as a FILE named new)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "out").mkdir()
    for cmd, opt in (("report", "-o"), ("fit", "--json"), ("compare", "--export"),
                     ("flag", "-o"), ("synth", "-o")):
        for typed in ("out/", "new/", "new/.."):
            args = [cmd, opt, typed] if cmd == "synth" else [cmd, "missing.parquet", opt, typed]
            r = runner.invoke(app, args)
            name = "--output" if opt == "-o" else opt
            assert r.exit_code == 2, (args, r.output)
            assert r.stderr.startswith(f"error: {name} {typed}: names a directory; give a "
                                       "file name in it"), r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_output_file_name_of_blank_space_is_refused(tmp_path, monkeypatch):
    """An output whose file name is only blank space (`-o ' '`), or starts or ends with it
    (a stray space in quotes), is refused naming the option (exit 2) and nothing is
    written (a file named ' ' was written)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "out").mkdir()
    for cmd, opt in (("report", "-o"), ("fit", "--json"), ("compare", "--export"),
                     ("flag", "-o"), ("synth", "-o")):
        for typed, why in ((" ", "is only blank space"), ("out/  ", "is only blank space"),
                           ("run.html ", "starts or ends with blank space"),
                           (" run.json", "starts or ends with blank space")):
            args = [cmd, opt, typed]  # (the bundled run as input)
            r = runner.invoke(app, args)
            name = "--output" if opt == "-o" else opt
            assert r.exit_code == 2, (args, r.output)
            assert r.stderr.startswith(f"error: {name} {typed}: the file name "), r.stderr
            assert why in r.stderr, r.stderr
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["out"]
    r = runner.invoke(app, ["fit", "-q", "--json", "a b.json"])  # spaces inside: fine
    assert r.exit_code == 0 and (tmp_path / "a b.json").is_file(), r.output


def test_sequence_id_mapped_to_another_column_is_named_as_taken_not_missing(tmp_path):
    """--column entropy=seq_id takes the only sequence id: the refusal says that seq_id is
    mapped to entropy by --column and to map the sequence id explicitly (was 'none of
    seq_id, ... exists' though it exists)."""
    f = _shard(tmp_path / "a.parquet")
    r = runner.invoke(app, ["fit", str(f), "--column", "entropy=seq_id"])
    assert r.exit_code == 2, r.output
    assert r.stderr == (
        f"error: {f}: the long layout (one row per token) needs a sequence id column; "
        "'seq_id' is mapped to entropy by --column entropy=seq_id, so no sequence id is "
        "left. Map the sequence id explicitly with --column seq_id=NAME (sequence-level "
        "resampling and gates need it), and entropy to a column of its own.\n"), r.stderr
    r = runner.invoke(app, ["fit", str(_shard(tmp_path / "b" / "b.parquet", seq_id=True))])
    assert r.exit_code == 2 and "none of seq_id, sequence_id" in r.stderr, r.stderr


def test_entropy_train_is_suggested_only_when_a_trainer_entropy_exists(tmp_path):
    """Without an entropy, the refusal (fit) and the 'ENTR unavailable' line (compare)
    suggest --entropy train only when the input has a trainer-side entropy holding values
    (was suggested for a dump without any entropy column)."""
    f = _shard(tmp_path / "none" / "a.parquet", entropys=True)
    for cmd in ("fit", "compare"):
        r = runner.invoke(app, [cmd, str(f), "-q", "--n-boot", "100"])
        out = r.stderr if cmd == "fit" else r.stdout
        assert "map one with --column entropy=NAME" in out, (r.exit_code, out)
        assert "--entropy train" not in r.output, r.output
    g = tmp_path / "both" / "a.parquet"
    g.parent.mkdir()
    pl.read_parquet(f).with_columns(entropy=pl.lit(None, pl.Float32),
                                    train_entropy=pl.lit(0.5)).write_parquet(g)
    r = runner.invoke(app, ["fit", str(g), "--entropy", "infer", "-q"])
    assert r.exit_code == 2, r.output
    assert r.stderr.endswith("map one with --column entropy=NAME (or --entropy train for the "
                             "trainer-side entropy 'train_entropy').\n"), r.stderr


def test_pipe_input_is_refused_as_a_pipe_not_as_missing(tmp_path):
    """A named pipe (like /dev/stdin under `cat f | entr-diag fit /dev/stdin`) is refused
    saying that Parquet cannot be read from a pipe and to save it to a file, not that the
    input does not exist; no reader blocks on it."""
    import os

    fifo = tmp_path / "in.parquet"
    os.mkfifo(fifo)
    with pytest.raises(InputError, match=r"input .*in\.parquet is a pipe or device, not a file: "
                                         "Parquet cannot be read from a pipe or stdin"):
        resolve_paths([fifo])
    r = runner.invoke(app, ["fit", str(fifo)])
    assert r.exit_code == 2, r.output
    assert len(r.stderr.splitlines()) == 1 and "save it to a file first" in r.stderr
    assert "does not exist" not in r.stderr


# ------------------------------------------------------------------ columns some files lack


def _canonical_shards(d: Path, n: int, lacking: dict[int, str]) -> list[Path]:
    """``n`` long-layout shards with canonical column names; shard ``i`` lacks the column
    ``lacking[i]``."""
    out = []
    for i in range(n):
        df = pl.DataFrame({
            "seq_id": [10 * i + 1] * 3 + [10 * i + 2] * 3,
            "train_logprob": [-0.1, -0.2, -1.0, -2.0, -0.5, -0.05],
            "infer_logprob": [-0.12, -0.19, -1.1, -1.9, -0.45, -0.06],
            "entropy": [0.5, 0.4, 1.2, 2.0, 0.9, 0.1],
        })
        if i in lacking:
            df = df.drop(lacking[i])
        d.mkdir(parents=True, exist_ok=True)
        df.write_parquet(d / f"part-{i}.parquet")
        out.append(d / f"part-{i}.parquet")
    return out


@pytest.mark.parametrize("cmd", [["fit"], ["compare"], ["report", "-o", "{out}/r.html"],
                                 ["flag", "-o", "{out}/n.parquet"]])
def test_entropy_missing_from_some_shards_is_named(tmp_path, cmd):
    """When 1 of 4 shards lacks the entropy column, the refusal says it is missing from
    1 of 4 files (naming it) and was therefore not used, not that the input has none."""
    files = _canonical_shards(tmp_path / "shards", 4, {2: "entropy"})
    args = [a.replace("{out}", str(tmp_path)) for a in cmd]
    r = runner.invoke(app, [args[0], str(tmp_path / "shards"), *args[1:], "-q"])
    assert r.exit_code == 2, r.output
    msg = r.stderr.strip()
    assert msg.startswith("error: the entropy column ('entropy') is missing from 1 of 4 input "
                          f"files (e.g. {files[2]}), so it was not used"), msg
    assert "Pass only the files that have it" in msg and "has no entropy column" not in msg
    assert len(msg.splitlines()) == 1 and "Traceback" not in r.output
    # the files that have it get past the check (this tiny input then has too few tokens)
    r = runner.invoke(app, ["fit", *map(str, files[:2] + files[3:]), "-q"])
    assert "entropy column" not in r.stderr and "entropy bin" in r.stderr, r.output
    # inspect, which reads such an input, says it in a warning, kept with --quiet (a note
    # had been: helper-48)
    r = runner.invoke(app, ["inspect", str(tmp_path / "shards"), "-q"])
    assert r.exit_code == 0, r.output
    assert (f"warning: entropy ('entropy') is missing from 1 of 4 files (e.g. {files[2]}): "
            "not used in any file: the scaling law, its noise regime and the ENTR gate would "
            "be unavailable, so fit, flag, compare and report refuse the input; pass only "
            "the files that have it") in " ".join(r.stderr.split()), r.stderr


def test_entropy_missing_from_every_file_keeps_the_plain_message(tmp_path):
    """Without an entropy column in any file the message says the input has none, naming
    the input: the folder and its number of files, or the one file."""
    files = _canonical_shards(tmp_path / "shards", 2, {0: "entropy", 1: "entropy"})
    r = runner.invoke(app, ["fit", str(tmp_path / "shards"), "-q"])
    assert r.exit_code == 2, r.output
    assert r.stderr.startswith(f"error: {tmp_path / 'shards'} (2 files): the input has no "
                               "entropy column, so the scaling law and the ENTR gate are "
                               "unavailable; map one with --column entropy=NAME"), r.stderr
    r = runner.invoke(app, ["fit", str(files[0]), "-q"])
    assert r.exit_code == 2, r.output
    assert r.stderr.startswith(f"error: {files[0]}: the input has no entropy column"), r.stderr


def _no_entropy_run(tmp_path: Path) -> Path:
    """A synthetic run of 20,000 tokens without its entropy column."""
    from entr_diag.synth import SynthSpec, write_synth

    p = tmp_path / "noent.parquet"
    write_synth(p, SynthSpec(n_tokens=20_000, seed=1))
    pl.read_parquet(p).drop("entropy").write_parquet(p)
    return p


def test_compare_and_report_on_identical_logprobs(tmp_path):
    """A bitwise on-policy run (train_logprob == infer_logprob): no law to fit, but the
    gates are compared (every one keeps everything, the matched band at c = 0)."""
    import json

    from entr_diag.synth import SynthSpec, write_synth

    p = tmp_path / "same.parquet"
    write_synth(p, SynthSpec(n_tokens=20_000, seed=1))
    pl.read_parquet(p).with_columns(pl.col("infer_logprob").alias("train_logprob")
                                    ).write_parquet(p)
    js = tmp_path / "c.json"
    r = runner.invoke(app, ["compare", str(p), "--json", str(js), "-q"])
    assert r.exit_code == 0, r.output
    assert "is 0 for every token" in re.sub(r"\s+", " ", r.stdout)
    cmp = json.loads(js.read_text())["compare"]
    assert all(g["kept_tokens"] == cmp["n_tokens"] for g in cmp["gates"])
    assert cmp["matched"]["c"] == 0
    r = runner.invoke(app, ["report", str(p), "-o", str(tmp_path / "r.html"), "-q"])
    assert r.exit_code == 0, r.output


def test_both_logprob_columns_zero_filled_are_refused_by_every_command(tmp_path):
    """Both logprob columns exactly 0.0 on every loss-masked row (neither side recorded,
    not a bitwise on-policy run: both sides 0.0 at an entropy of 1e-3 nats or more are
    zero placeholders): fit, compare and report refuse with exit 2 naming both columns
    and the row count (compare compared the gates, every one keeping everything), and
    report writes no file; identical nonzero columns are compared."""
    from entr_diag.synth import SynthSpec, write_synth

    p = tmp_path / "zeros.parquet"
    write_synth(p, SynthSpec(n_tokens=20_000, seed=1))
    df = pl.read_parquet(p).with_columns(pl.lit(0.0).alias("train_logprob"),
                                         pl.lit(0.0).alias("infer_logprob"))
    df.write_parquet(p)
    n = int(df["loss_mask"].cast(pl.Boolean).sum())
    out = tmp_path / "r.html"
    for args in (["fit"], ["compare"], ["report", "-o", str(out)]):
        r = runner.invoke(app, [*args, str(p), "-q"])
        assert r.exit_code == 2, (args, r.output)
        err = r.stderr.replace("\n", " ")
        assert err.startswith(f"error: {p}: train_logprob and infer_logprob are both exactly "
                              f"0.0 on every one of the {n:,} loss-masked rows: neither "
                              "side's logprobs were recorded"), err
    assert not out.exists()
    # ... and at an entropy of 0 too, where both sides 0.0 are kept as near-certain tokens
    # (helper-44: compare and report then compared the gates at exit 0)
    df.with_columns(pl.lit(0.0).alias("entropy")).write_parquet(p)
    for args in (["compare"], ["report", "-o", str(out)]):
        r = runner.invoke(app, [*args, str(p), "-q"])
        assert r.exit_code == 2, (args, r.output)
        assert "are both exactly 0.0 on every one of the" in r.stderr.replace("\n", " ")
    assert not out.exists()
    write_synth(p, SynthSpec(n_tokens=20_000, seed=1))
    pl.read_parquet(p).with_columns(pl.col("infer_logprob").alias("train_logprob")
                                    ).write_parquet(p)
    r = runner.invoke(app, ["compare", str(p), "-q"])
    assert r.exit_code == 0, r.output
    assert "is 0 for every token" in re.sub(r"\s+", " ", r.stdout)


def test_an_all_null_entropy_column_counts_as_absent(tmp_path):
    """An engine that writes the entropy column but fills it with nulls: the column is not
    used (a note), so compare compares the gates that need no entropy as without the column
    (it refused: every token excluded as invalid_entropy) and fit's refusal says the column
    holds only nulls; a column with some values is used (its nulls excluded)."""
    import json

    p = _no_entropy_run(tmp_path)
    df = pl.read_parquet(p)
    df.with_columns(pl.lit(None, dtype=pl.Float64).alias("entropy")).write_parquet(p)
    js = tmp_path / "c.json"
    r = runner.invoke(app, ["compare", str(p), "--json", str(js), "-q"])
    assert r.exit_code == 0, r.output
    assert [u["name"] for u in json.loads(js.read_text())["compare"]["unavailable"]] == ["entr"]
    r = runner.invoke(app, ["fit", str(p), "-q"])
    assert r.exit_code == 2
    assert f"{p}: the entropy column ('entropy') holds only nulls" in r.stderr.replace("\n", "")
    df.with_columns(pl.when(pl.int_range(pl.len()) < 10).then(0.5).otherwise(None)
                    .alias("entropy")).write_parquet(p)
    r = runner.invoke(app, ["inspect", str(p), "--json", str(js)])
    acc = json.loads(js.read_text())["inputs"]["accounting"]
    assert acc["exclusions"]["invalid_entropy"] > 0 and "only nulls" not in r.stderr


def test_all_null_inference_entropy_falls_back_to_the_trainer_entropy(tmp_path):
    """verl's ``rollout_entropy`` all null beside a filled ``entropys``: the inference-side
    column counts as absent, so the trainer-side entropy is used (a note names both), as
    without the column; ``--entropy infer`` still refuses, saying it holds only nulls; when
    the trainer-side entropy holds only nulls too, the refusal names it."""
    import json

    from entr_diag.synth import SynthSpec, write_synth

    p = tmp_path / "verl.parquet"
    write_synth(p, SynthSpec(n_tokens=20_000, seed=1))
    df = pl.read_parquet(p).rename({"train_logprob": "old_log_probs",
                                    "infer_logprob": "rollout_log_probs",
                                    "entropy": "entropys"})
    df = df.with_columns(pl.lit(None, dtype=pl.Float32).alias("rollout_entropy"))
    df.write_parquet(p)
    js = tmp_path / "f.json"
    r = runner.invoke(app, ["fit", str(p), "--framework", "verl", "--n-boot", "200",
                            "--json", str(js)])
    assert r.exit_code == 0, r.output
    note = ("note: entropy: the inference-side entropy ('rollout_entropy') holds only nulls in "
            "every file, as if absent: using the trainer-side entropy ('entropys')")
    assert note in r.stderr.replace("\n", " "), r.stderr
    inputs = json.loads(js.read_text())["inputs"]
    assert inputs["entropy_source"] == "trainer" and inputs["mapping"]["entropy"] == "entropys"
    assert "entropy <- 'rollout_entropy'" not in inputs["mapping_notes"]
    r = runner.invoke(app, ["fit", str(p), "--framework", "verl", "--entropy", "infer", "-q"])
    assert r.exit_code == 2 and "('rollout_entropy') holds only nulls" in r.stderr, r.output
    df.with_columns(pl.lit(None, dtype=pl.Float32).alias("entropys")).write_parquet(p)
    r = runner.invoke(app, ["fit", str(p), "--framework", "verl", "-q"])
    assert r.exit_code == 2, r.output
    # both sides null: the trainer's counts as absent, the inference side's is named
    assert f"{p}: the entropy column ('rollout_entropy') holds only nulls" in r.stderr, r.stderr
    assert "--entropy train" not in r.stderr


def test_report_without_any_entropy_holds_the_rest_of_the_post_mortem(tmp_path):
    """A dump without entropy (engines rarely return it): ``report`` still writes the
    metrics, forensics, profiles and the comparison of the gates that need no entropy, says
    why the law and ENTR are missing (stdout, JSON ``unavailable``, HTML), exit 0; ``fit``
    still refuses (exit 2)."""
    import html as html_lib
    import json

    p = _no_entropy_run(tmp_path)
    out, js = tmp_path / "r.html", tmp_path / "r.json"
    r = runner.invoke(app, ["report", str(p), "-o", str(out), "--json", str(js), "-q"])
    assert r.exit_code == 0, r.output
    assert f"No scaling law: {p}: the input has no entropy column" in r.stdout
    doc = json.loads(js.read_text())
    assert doc["fit"] is None and "entropy" in doc["unavailable"]
    cmp = doc["compare"]  # the panel compared, ENTR named unavailable, as by `compare`
    assert [u["name"] for u in cmp["unavailable"]] == ["entr"]
    assert {g["name"] for g in cmp["gates"]} >= {"fixed", "icepop", "tis", "m2po"}
    assert all(0 < g["kept_share"] <= 1 for g in cmp["gates"])
    assert doc["metrics"]["overall"]["tokens"] > 0 and doc["forensics"]["checks"]
    html = out.read_text()
    assert f"unavailable: no fit result: {html_lib.escape(str(p))}: the input has no entropy " \
        "column" in html
    assert "Agreement with ENTR</h3>" in html and "unavailable: ENTR is unavailable: the token " \
        "frame has no entropy column" in html
    assert "unavailable: no mismatch metrics" not in html and "no per-step metrics" not in html
    assert "without an entropy column the tokens are ranked by their squared log-ratio" in html
    assert "the tokens ENTR would reject first" not in html
    r = runner.invoke(app, ["fit", str(p), "-q"])
    assert r.exit_code == 2 and "has no entropy column" in r.stderr


def test_compare_without_entropy_compares_the_other_gates(tmp_path):
    """compare on a dump without entropy: the gates that need none are compared (exit 0);
    ENTR is marked unavailable with the reason in the table, the JSON (``unavailable``, as
    report's, and ``compare.unavailable``) and the export (an all-null keep column, the
    reason in the file's metadata). Asking only for ENTR is refused with one line."""
    import json

    import pyarrow.parquet as pq

    p = _no_entropy_run(tmp_path)
    js, ex = tmp_path / "c.json", tmp_path / "c.parquet"
    r = runner.invoke(app, ["compare", str(p), "--json", str(js), "--export", str(ex), "-q"])
    assert r.exit_code == 0, r.output
    out = re.sub(r"\s+", " ", r.stdout)
    assert f"ENTR unavailable: {p}: the input has no entropy column" in out
    assert "entr tau=4 eps=0.01 (unavailable)" in out and "fixed c=0.6931" in out
    doc = json.loads(js.read_text())
    assert doc["fit"] is None and doc["unavailable"].startswith(f"{p}: the input has no entropy")
    cmp = doc["compare"]
    assert [u["spec"] for u in cmp["unavailable"]] == ["entr:tau=4,eps=0.01"]
    assert cmp["matched"] is None and "tau" not in cmp["sweep"]
    assert len(cmp["gates"]) == len(DEFAULT_PANEL) and all(g["kept_tokens"] > 0
                                                     for g in cmp["gates"])
    dec = pl.read_parquet(ex)
    assert dec["keep[entr:tau=4,eps=0.01]"].null_count() == dec.height == cmp["n_tokens"]
    assert dec["keep[fixed:c=0.6931471805599453]"].sum() == cmp["gates"][0]["kept_tokens"]
    meta = pq.read_metadata(ex).metadata
    assert meta[b"entr_diag.unavailable"].decode() == doc["unavailable"]
    r = runner.invoke(app, ["compare", str(p), "--gate", "entr:tau=2", "-q"])
    assert r.exit_code == 2, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {p}: the input has no entropy")
    assert "the only gate asked for" in lines[0]
    r = runner.invoke(app, ["compare", str(p), "--gate", "entr:tau=2", "--gate", "mis", "-q"])
    assert r.exit_code == 0 and "entr tau=2 eps=0.01 (unavailable)" in r.stdout


@pytest.mark.parametrize("case", ["one_sequence", "few_sequences"])
def test_report_on_an_input_too_small_for_the_law(tmp_path, case):
    """An input too small to fit the law (40 tokens of one sequence; six short sequences in
    three files): report writes the HTML and the JSON with the law marked unavailable and
    why, naming the input, and the gates compared without the law's categories, exit 0; so
    does compare; fit still refuses (exit 2) with one line naming the input."""
    import html as html_lib
    import json

    import numpy as np

    if case == "one_sequence":
        rng = np.random.default_rng(0)
        infer = -rng.exponential(0.5, 40)
        p = tmp_path / "one.parquet"
        pl.DataFrame({"seq_id": [7] * 40, "infer_logprob": infer,
                      "train_logprob": infer + rng.normal(0, 0.05, 40).clip(max=-infer),
                      "entropy": rng.uniform(0.01, 2.0, 40)}).write_parquet(p)
        arg, where, why = str(p), str(p), "one sequence block"
    else:
        _canonical_shards(tmp_path / "shards", 3, {})
        arg, where, why = str(tmp_path / "shards"), f"{tmp_path / 'shards'} (3 files)", \
            "enough tokens (need 3 bins"
    out, js = tmp_path / "r.html", tmp_path / "r.json"
    r = runner.invoke(app, ["report", arg, "-o", str(out), "--json", str(js), "-q"])
    assert r.exit_code == 0, r.output
    doc = json.loads(js.read_text())
    # the gates are compared without the law's categories (ENTR needs no law)
    assert doc["fit"] is None and doc["compare"]["unavailable"] == []
    assert doc["compare"]["gates"][0]["name"] == "entr"
    assert doc["compare"]["n_exploration"] is None and doc["compare"]["n_noise"] is None
    assert doc["unavailable"].startswith(f"{where}: ") and why in doc["unavailable"]
    assert f"No scaling law: {doc['unavailable']}" in r.stdout.replace("\n", " ")
    if case == "one_sequence":  # the column that keys the sequences is named
        assert ("(the valid tokens form 1 sequence, keyed by step and seq_id: one value "
                "for every row?)") in doc["unavailable"]
    assert doc["metrics"]["overall"]["tokens"] > 0 and doc["forensics"]["checks"]
    assert f"Scaling law: not fitted: {html_lib.escape(doc['unavailable'])}" in out.read_text()
    # the gates' n/a reasons say why there is no law, not "law_k not given"
    reasons = doc["compare"]["null_reasons"]
    assert set(reasons) == {"noise_admitted", "exploration_discarded"}
    for t in (*reasons.values(), *(doc["compare"]["definitions"][k]
                                   for k in ("noise_token", "law_scale_token"))):
        assert "no scaling law could be fitted (" in t and why in t and "given" not in t, t
    r = runner.invoke(app, ["compare", arg, "--json", str(js), "-q"])
    assert r.exit_code == 0, r.output
    cmp_doc = json.loads(js.read_text())
    assert cmp_doc["fit"] is None and cmp_doc["unavailable"].startswith(f"{where}: ")
    assert why in cmp_doc["unavailable"] and cmp_doc["compare"]["gates"][0]["name"] == "entr"
    assert cmp_doc["compare"]["gates"] == doc["compare"]["gates"]  # as in the report
    assert "No scaling law: " in r.stdout and "ENTR unavailable" not in r.stdout
    assert cmp_doc["compare"]["null_reasons"] == reasons
    text = " ".join(r.stdout.split())
    # both n/a metrics share their cause: told once, with each one's consequence
    assert ("n/a noise admitted and exploration discarded: no scaling law could be fitted ("
            in text) and "n/a exploration discarded:" not in text, text
    assert "there is no entropy breakpoint H*, so no noise to admit; the law's scale is " \
        "undefined." in text
    assert "law_k" not in text and "given" not in text
    r = runner.invoke(app, ["fit", arg, "-q"])
    assert r.exit_code == 2, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {where}: ") and why in lines[0]


# ------------------------------------------------------------------ partition values


@pytest.mark.parametrize("folders", [["step=abc", "step=def"], ["step=1", "step=abc"]])
def test_non_integer_partition_value_names_the_folder(tmp_path, folders):
    """Folders ``step=abc/`` giving the step a value that is not an integer are refused
    naming the first such folder, its files and how many such files and folders there are
    (not a bare 'column step has type string'; with integer folders too, not a cast error
    while reading)."""
    for i, folder in enumerate(folders):
        _shard(tmp_path / "run" / folder / "a.parquet", seq=10 * i)
    _shard(tmp_path / "run" / "step=abc" / "b.parquet", seq=100)
    r = runner.invoke(app, ["inspect", str(tmp_path / "run"), "-q"])
    assert r.exit_code == 2, r.output
    more = "; 3 files in 2 such folders in all" if folders[0] == "step=abc" else ""
    assert r.stderr == (
        f"error: column 'step' (step) comes from the partition folder "
        f"{tmp_path / 'run' / 'step=abc'} (2 files{more}) whose value 'abc' is not an "
        "integer; step needs integer values: name the folders step=<integer> (e.g. step=3) "
        "or move the files out of them.\n"), r.stderr
    # a key that is not mapped may hold anything (date=2024-01-01, rank=a)
    (tmp_path / "run").rename(tmp_path / "run2")
    for p in (tmp_path / "run2").rglob("*.parquet"):
        q = tmp_path / "ok" / p.parent.name.replace("step", "rank") / p.name
        q.parent.mkdir(parents=True, exist_ok=True)
        p.rename(q)
    r = runner.invoke(app, ["inspect", str(tmp_path / "ok"), "-q"])
    assert r.exit_code == 0, r.output


def test_partition_value_contradicted_by_the_files_column_is_noted(tmp_path):
    """``step=4/`` holding a file whose step column says 5: the column is used and a note
    says so; an agreeing file (``step=05`` with 5: same integer) gives no note."""
    from entr_diag.io import load_dataset

    for folder, step in (("step=3", 3), ("step=05", 5), ("step=4", 5), ("step=6", 7)):
        p = _shard(tmp_path / "run" / folder / "a.parquet", seq=step)
        pl.read_parquet(p).with_columns(pl.lit(step).alias("step")).write_parquet(p)
    ds = load_dataset([tmp_path / "run"])
    notes = [n for n in ds.notes if "partition folder" in n]
    assert len(notes) == 1
    assert "step=4" in notes[0] and "holds 5" in notes[0] and "1 more file" in notes[0]
    assert ds.accounting.steps == (3, 5, 7)
    r = runner.invoke(app, ["inspect", str(tmp_path / "run" / "step=3")])
    assert r.exit_code == 0 and "partition folder" not in r.stderr
    r = runner.invoke(app, ["inspect", str(tmp_path / "run")])
    assert r.exit_code == 0 and "the path says step=4" in r.stderr


# ------------------------------------------------------------------ mostly excluded


def test_mostly_excluded_tokens_are_warned_about_with_what_it_means(tmp_path):
    """Probabilities in the logprob columns exclude almost every token as positive_logprob:
    a warning says so and what it usually means, naming the columns, beside the count; a
    run with a few bad rows gets no such warning."""
    p = _shard(tmp_path / "probs.parquet")
    df = pl.read_parquet(p)
    pl.concat([df.with_columns(pl.col("old_log_probs", "rollout_log_probs").exp()
                               .name.keep()).with_columns(pl.lit(i, pl.Int64).alias("seq_id"))
               for i in range(9)] + [df.with_columns(pl.col("seq_id").cast(pl.Int64))]
              ).write_parquet(p)
    r = runner.invoke(app, ["inspect", str(p)])
    assert "warning: 90.0% of the loss-masked tokens are excluded" in r.stderr
    err = " ".join(r.stderr.split())
    assert ("both train_logprob ('old_log_probs') and infer_logprob "
            "('rollout_log_probs') may hold probabilities rather than log-probabilities") in err
    ok = runner.invoke(app, ["inspect", str(_shard(tmp_path / "ok.parquet"))])
    assert ok.exit_code == 0 and "are excluded" not in ok.stderr


def test_mostly_excluded_over_several_reasons_is_warned_about(tmp_path):
    """Most loss-masked tokens excluded over several reasons, none of which alone excludes
    most (nulls in every column): the warning (also with --quiet) and the verdict's caveat
    give the total share and the largest reasons with their counts (there was none: no one
    reason had a hint); a minor hinted reason does not stand for all of them."""
    import json

    from entr_diag.synth import SynthSpec, write_synth

    p = tmp_path / "nulls.parquet"
    write_synth(p, SynthSpec(n_tokens=30_000, seed=3))
    df = pl.read_parquet(p)
    rng = np.random.default_rng(0)
    cols = ["loss_mask", "seq_id", "position", "train_logprob"]
    df.with_columns(pl.when(pl.Series(rng.random(df.height) < 0.3)).then(None)
                    .otherwise(pl.col(c)).alias(c) for c in cols).write_parquet(p)
    js = tmp_path / "f.json"
    r = runner.invoke(app, ["fit", str(p), "-q", "--n-boot", "100", "--json", str(js)])
    assert r.exit_code == 0, r.output
    acc = json.loads(js.read_text())["inputs"]["accounting"]
    masked = acc["tokens_masked"]
    out = masked - acc["tokens_valid"]
    assert out > masked / 2 and max(acc["exclusions"].values()) < masked / 2
    share = f"{out / masked:.1%} of the loss-masked tokens are excluded (null_loss_mask "
    err = " ".join(r.stderr.split())
    assert f"warning: {share}" in err and "No one reason explains most of them" in err
    caveat = json.loads(js.read_text())["verdict"]["caveat"]
    assert f"caveat: {share}" in caveat
    top = max(acc["exclusions"], key=acc["exclusions"].get)
    assert f"{top} {acc['exclusions'][top]:,}" in caveat


def test_mostly_excluded_caveat_reaches_the_verdict_even_quiet(tmp_path):
    """The excluded-tokens caveat is part of the verdict (terminal, JSON verdict.caveat,
    HTML), also with --quiet, and the corrupt-rows finding names the column problem instead
    of blaming a few rows: here probabilities in a third of the sequences. When they are
    in most rows, every analysing command refuses (exit 2, one error paragraph leading with
    the exclusions: the tokens left are the probabilities at or below 1e-4, not a sample;
    they ran on them with a warning); inspect still shows the accounting."""
    import json

    from entr_diag.synth import SynthSpec, write_synth

    p = tmp_path / "probs.parquet"
    write_synth(p, SynthSpec(n_tokens=60_000, seed=2))
    good = pl.read_parquet(p)
    third = pl.col("seq_id").cast(pl.String).hash() % 3 == 0
    lp = pl.col("train_logprob", "infer_logprob")
    good.with_columns(pl.when(third).then(lp.exp()).otherwise(lp)).write_parquet(p)
    js = tmp_path / "f.json"
    r = runner.invoke(app, ["fit", str(p), "-q", "--json", str(js)])
    assert r.exit_code == 0, r.output
    doc = json.loads(js.read_text())
    caveat = doc["verdict"]["caveat"]
    assert re.search(r"caveat: 3\d\.\d% of the loss-masked tokens are excluded", caveat)
    named = "both train_logprob and infer_logprob may hold probabilities"
    assert named in caveat and "probabilities rather" in " ".join(r.stdout.split())
    found = [f for f in doc["forensics"]["findings"] if f["kind"] == "corrupt_rows"]
    assert found and re.match(r"3\d\.\d% of the loss-masked tokens are invalid",
                              found[0]["title"]), found
    assert named in found[0]["message"]
    out = tmp_path / "r.html"
    r = runner.invoke(app, ["report", str(p), "-q", "-o", str(out)])
    assert r.exit_code == 0 and "of the loss-masked tokens are excluded" in out.read_text()
    # probabilities in every row: refused, but by inspect
    good.with_columns(lp.exp()).write_parquet(p)
    for cmd in (["fit"], ["compare"], ["report", "-o", str(out)], ["flag", "-o",
                                                                   str(tmp_path / "n.pq")]):
        r = runner.invoke(app, [*cmd, str(p), "-q"])
        assert r.exit_code == 2 and r.stderr.count("\n") == 1, (cmd, r.output)
        err = " ".join(r.stderr.split())
        assert re.match(rf"error: {re.escape(str(p))}: [\d,]+ of the [\d,]+ loss-masked "
                        r"tokens \(9\d\.\d%\) were excluded \(positive_logprob [\d,]+\): "
                        + named, err), err
        assert "token(s) left are not analysed: " in err
    assert runner.invoke(app, ["inspect", str(p)]).exit_code == 0


# ------------------------------------------------------------------ our own outputs


def test_own_parquet_outputs_are_skipped_in_directory_searches(tmp_path):
    """flag / compare --export write a marker into their Parquet metadata; a later run on
    the folder skips those files (they are not shards of the dump) and says so; named
    explicitly they are read; a folder holding only them is refused with that reason."""
    from entr_diag.io import load_dataset
    from entr_diag.synth import SynthSpec, write_synth

    d = tmp_path / "run"
    d.mkdir()
    write_synth(d / "dump.parquet", SynthSpec(n_tokens=30_000, seed=3))
    alone = load_dataset([d]).accounting.to_dict()
    for args in (["flag", "-o", str(d / "noise.parquet")],
                 ["compare", "--export", str(d / "decisions.parquet")]):
        r = runner.invoke(app, [args[0], str(d / "dump.parquet"), *args[1:], "-q"])
        assert r.exit_code == 0, r.output
    ds = load_dataset([d])
    assert [f.path.name for f in ds.files] == ["dump.parquet"]
    assert ds.accounting.to_dict() == alone
    assert any("skipped 2 file(s) written by entr-diag" in n for n in ds.notes)
    assert load_dataset([d / "noise.parquet"]).accounting.tokens_valid > 0
    (d / "dump.parquet").unlink()
    r = runner.invoke(app, ["inspect", str(d)])
    assert r.exit_code == 2 and "holds only 2 file(s) written by entr-diag" in r.stderr


def test_shards_are_read_in_natural_order(tmp_path):
    """part-9 is read before part-10 (numbers in names compared as numbers), in directory
    walks and globs: a sequence continuing from one shard into the next, without a
    position column, is numbered in the order it was written."""
    from entr_diag.io import load_dataset

    d = tmp_path / "run"
    d.mkdir()
    for i in range(12):  # one sequence cut into 12 shards of 2 tokens
        pl.DataFrame({"seq_id": [7, 7], "train_logprob": [-0.1 * (2 * i + 1), -0.1 * (2 * i + 2)],
                      "infer_logprob": [-0.1, -0.1]}).write_parquet(d / f"part-{i}.parquet")
    assert [p.name for p in resolve_paths([d])][8:11] == ["part-8.parquet", "part-9.parquet",
                                                         "part-10.parquet"]
    for src in (d, str(d / "part-*.parquet")):
        got = load_dataset([src]).lf.sort("position").collect()["train_logprob"].to_list()
        assert got == pytest.approx([-0.1 * k for k in range(1, 25)])


@pytest.mark.parametrize("reason", list(__import__("entr_diag.io.schema", fromlist=["x"])
                                         .EXCLUSION_REASONS))
def test_every_reason_that_can_exclude_most_tokens_has_a_hint(reason):
    """A reason excluding most loss-masked tokens always comes with what it usually means."""
    from entr_diag.caveats import exclusion_caveat

    c = exclusion_caveat({reason: 60}, 100, 40)
    assert c is not None and f"Most are {reason}: " in c


@pytest.mark.parametrize("empty", ["nan", "null without statistics"])
def test_entropy_without_values_is_named_as_such_in_the_exclusion_hint(tmp_path, empty):
    """An entropy column entirely NaN, or null without Parquet statistics (so not dropped
    as all-null), excludes every token as invalid_entropy: the hint says the column holds
    no value (null or NaN) and suggests --entropy train when a trainer-side entropy exists
    (was 'may hold something else (e.g. bits, logits...)' only)."""
    import pyarrow.parquet as pq

    value = float("nan") if empty == "nan" else None
    df = pl.read_parquet(_shard(tmp_path / "src.parquet")).with_columns(
        entropy=pl.lit(value, pl.Float64))
    for train, fix in ((True, "use the trainer-side entropy ('entropys') with --entropy "
                              "train, or map another with --column entropy=NAME.\n"),
                       (False, "; map another with --column entropy=NAME.\n")):
        f = tmp_path / f"{train}" / "a.parquet"
        f.parent.mkdir()
        pq.write_table((df if train else df.drop("entropys")).to_arrow(), f,
                       write_statistics=False)
        # (mapped explicitly: chosen automatically, it would count as absent)
        r = runner.invoke(app, ["fit", str(f), "-q", "--column", "entropy=entropy"])
        assert r.exit_code == 2, r.output
        assert "Most are invalid_entropy: the entropy column ('entropy') holds no value (null "\
               "or NaN) for these tokens, or no entropy in nats" in r.stderr, r.stderr
        # then what the values are
        assert r.stderr.endswith(fix[:-2] + " (the values: 4 null or NaN).\n"), r.stderr


def test_positive_logprobs_get_their_hint_from_one_percent_of_the_tokens():
    """Probabilities in a logprob column are never a rounding matter: from 1% of the
    loss-masked tokens (one shard of two written as probabilities excluded 49.7% and said
    nothing) the caveat names them with their share; other reasons keep the majority rule."""
    from entr_diag.caveats import exclusion_caveat

    c = exclusion_caveat({"positive_logprob": 500, "invalid_entropy": 20}, 10_000, 9_480)
    assert c is not None and "5.0% are positive_logprob: " in c and "probabilities" in c
    assert exclusion_caveat({"positive_logprob": 50}, 10_000, 9_950) is None  # 0.5%
    assert exclusion_caveat({"non_finite_logprob": 4_000}, 10_000, 6_000) is None
    # an entropy without value for 5% of the tokens (one shard of two without it) too
    c = exclusion_caveat({"invalid_entropy": 4_000}, 10_000, 6_000,
                         {"entropy": "entropy", "train_entropy": "entropys"})
    assert "40.0% are invalid_entropy: " in c and "--entropy train" in c
    assert exclusion_caveat({"invalid_entropy": 400}, 10_000, 9_600) is None
    assert "Most are invalid_entropy" in exclusion_caveat({"invalid_entropy": 6_000}, 10_000,
                                                          4_000)


def test_compare_runs_without_an_entropy_column_that_holds_no_valid_value(tmp_path):
    """An all-NaN entropy column (no trainer-side one) no longer excludes every token and
    stops compare: the entropy-free gates are compared over all tokens, ENTR is unavailable
    with the column named, and fit refuses naming it (one error line, exit 2)."""
    from typer.testing import CliRunner

    from entr_diag.cli import app

    src = Path(__file__).resolve().parents[1] / "entr_diag" / "sample_data" / \
        "sample_run_long.parquet"
    p = tmp_path / "nan.parquet"
    pl.read_parquet(src).drop("train_entropy").with_columns(
        pl.lit(float("nan")).alias("entropy")).write_parquet(p)
    js = tmp_path / "c.json"
    r = CliRunner().invoke(app, ["compare", str(p), "--n-boot", "100", "--json", str(js)])
    assert r.exit_code == 0, r.output
    err = " ".join(r.stderr.split())
    assert "warning: entropy ('entropy') holds no valid value" in err
    # the JSON's reasons name the column and why (they said "no entropy column")
    why = ("the entropy column ('entropy') holds no valid value for any loss-masked token "
           "(155,478 null or NaN)")
    doc = json.loads(js.read_text())["compare"]
    assert doc["unavailable"][0]["reason"].startswith(why + ", and ENTR's score")
    assert doc["null_reasons"]["noise_admitted"] == (
        why + ": no low-entropy noise regime can be located")
    assert doc["null_reasons"]["exploration_discarded"].startswith(why + ": ")
    assert "Gates on 155,478 tokens" in r.stdout
    assert "the entropy column ('entropy') holds no valid value for any loss-masked token" \
        in " ".join(r.stdout.split())
    r = CliRunner().invoke(app, ["fit", str(p), "-q"])
    assert r.exit_code == 2 and r.stderr.count("\n") == 1
    assert "holds no valid value for any loss-masked token" in r.stderr


def test_fit_names_both_entropy_columns_when_neither_holds_a_valid_value(tmp_path):
    """Both the engine's and the trainer's entropy columns all NaN: fit's refusal names
    both (it named the first only, though the loader had tried and dropped both)."""
    from typer.testing import CliRunner

    from entr_diag.cli import app

    src = Path(__file__).resolve().parents[1] / "entr_diag" / "sample_data" / \
        "sample_run_long.parquet"
    p = tmp_path / "nan2.parquet"
    pl.read_parquet(src).with_columns(pl.lit(float("nan")).alias("entropy"),
                                      pl.lit(float("nan")).alias("train_entropy")
                                      ).write_parquet(p)
    r = CliRunner().invoke(app, ["fit", str(p), "-q"])
    assert r.exit_code == 2
    assert ("the entropy columns ('entropy' and 'train_entropy') hold no valid value for "
            "any loss-masked token (155,478 null or NaN each)") in " ".join(r.stderr.split())
    js = tmp_path / "c.json"  # compare's reasons name both
    r = CliRunner().invoke(app, ["compare", str(p), "-q", "--json", str(js)])
    assert r.exit_code == 0, r.output
    assert json.loads(js.read_text())["compare"]["unavailable"][0]["reason"].startswith(
        "the entropy column ('entropy') holds no valid value for any loss-masked token "
        "(155,478 null or NaN); the entropy column ('train_entropy') holds no valid value "
        "for any loss-masked token (155,478 null or NaN), and ENTR's score")
    # an entropy column of nulls only, and none at all
    for frame, why in ((pl.read_parquet(src).drop("train_entropy").with_columns(
            pl.lit(None, dtype=pl.Float32).alias("entropy")),
            "the entropy column ('entropy') holds only nulls"),
            (pl.read_parquet(src).drop("train_entropy", "entropy"),
             "the token frame has no entropy column")):
        frame.write_parquet(p)
        r = CliRunner().invoke(app, ["compare", str(p), "-q", "--json", str(js)])
        assert r.exit_code == 0, r.output
        doc = json.loads(js.read_text())["compare"]
        assert doc["unavailable"][0]["reason"].startswith(why + ", and ENTR's score")
        assert doc["null_reasons"]["noise_admitted"].startswith(why + ": ")


def test_a_shard_with_an_empty_schema_says_so(tmp_path):
    """A Parquet file with no column among shards: the refusal says it has none (it ended
    'this file has: .'), and how to leave it out."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from typer.testing import CliRunner

    from entr_diag.cli import app
    from entr_diag.synth import SynthSpec, write_synth

    write_synth(tmp_path / "a.parquet", SynthSpec(n_tokens=5_000, seed=0))
    pq.write_table(pa.table({}), tmp_path / "b.parquet")
    r = CliRunner().invoke(app, ["fit", str(tmp_path), "-q"])
    assert r.exit_code == 2
    assert r.stderr.startswith(f"error: cannot read {tmp_path / 'b.parquet'}: it holds no "
                               "columns at all (an empty Parquet schema, 0 rows)"), r.stderr
    assert "--skip-unreadable" in r.stderr


def test_inspect_of_an_input_with_every_token_excluded_says_why(tmp_path):
    """`inspect` of an input whose every loss-masked token is excluded (all engine logprobs
    null) exits 0, as it describes the data, with the same warning, even with --quiet, as
    the other commands' refusal: the reasons and the hint (helper-40: only 'nothing to
    analyse', no warning, JSON warnings empty)."""
    from entr_diag.synth import SynthSpec, write_synth

    p = tmp_path / "run.parquet"
    write_synth(p, SynthSpec(n_tokens=3_000, seed=1))
    nulls = tmp_path / "nulls.parquet"
    pl.read_parquet(p).with_columns(pl.lit(None, pl.Float64).alias("infer_logprob")).write_parquet(
        nulls)
    out = tmp_path / "i.json"
    r = CliRunner().invoke(app, ["inspect", str(nulls), "--quiet", "--json", str(out)])
    assert r.exit_code == 0, r.output
    warned = [w for w in r.stderr.splitlines()
              if w.startswith("warning: ") and "0 valid loss-masked tokens: all " in w]
    assert len(warned) == 1 and "non_finite_logprob" in warned[0], r.stderr
    assert any("0 valid loss-masked tokens: all " in w
               for w in json.loads(out.read_text())["warnings"])
    r = CliRunner().invoke(app, ["fit", str(nulls), "--quiet"])
    assert r.exit_code == 2 and r.stderr.startswith("error: ") and "warning:" not in r.stderr
    assert warned[0].removeprefix("warning: ") in r.stderr
    # no loss-masked token at all (helper-41): the same, with fit's sentence
    unmasked = tmp_path / "unmasked.parquet"
    pl.read_parquet(p).with_columns(pl.lit(False).alias("loss_mask")).write_parquet(unmasked)
    r = CliRunner().invoke(app, ["inspect", str(unmasked), "--quiet"])
    assert r.exit_code == 0 and "warning: " in r.stderr and "no loss-masked token: all " in (
        r.stderr), r.stderr
    f = CliRunner().invoke(app, ["fit", str(unmasked), "--quiet"])
    assert f.exit_code == 2 and f.stderr.removeprefix("error: ") in r.stderr
