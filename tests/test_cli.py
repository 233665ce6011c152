"""CLI: entry points, inspect, JSON conventions and every refusal path with exit code 2."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from typer.testing import CliRunner

import entr_diag
from entr_diag.cli import app

runner = CliRunner()
README = Path(__file__).resolve().parents[1] / "README.md"


def _file(tmp_path: Path, name: str = "x.parquet", **over) -> Path:
    base = {
        "seq_id": [1, 1, 2, 2],
        "old_log_probs": [-0.1, -0.2, -1.0, -2.0],
        "rollout_log_probs": [-0.12, -0.19, -1.1, -1.9],
        "entropys": [0.5, 0.4, 1.2, 2.0],
        "response_mask": [1, 1, 1, 0],
    }
    base.update(over)
    p = tmp_path / name
    pl.DataFrame(base).write_parquet(p)
    return p


def test_installed_version_matches():
    """The installed distribution's version is the package's __version__."""
    assert entr_diag.__version__ == version("entr-diag")


def test_version_flag_and_module_entry_point():
    """`entr-diag --version` and `python -m entr_diag --version` print the version."""
    r = runner.invoke(app, ["--version"])
    assert r.exit_code == 0 and entr_diag.__version__ in r.stdout
    out = subprocess.run([sys.executable, "-m", "entr_diag", "--version"], capture_output=True,
                         text=True, check=True)
    assert entr_diag.__version__ in out.stdout


def test_every_command_documented_in_readme():
    """Each CLI command appears in README.md as `entr-diag <command>`."""
    text = README.read_text()
    for cmd in app.registered_commands:
        name = cmd.name or cmd.callback.__name__
        assert f"entr-diag {name}" in text, name


def test_every_command_help_has_example():
    """Every command's help ends with an example invocation."""
    for cmd in app.registered_commands:
        name = cmd.name or cmd.callback.__name__
        r = runner.invoke(app, [name, "--help"])
        assert r.exit_code == 0
        assert "Example: entr-diag" in r.stdout, name


def _help_pages() -> dict[str, str]:
    """The --help output of the root command and of every command."""
    pages = {"": runner.invoke(app, ["--help"]).stdout}
    for cmd in app.registered_commands:
        name = cmd.name or cmd.callback.__name__
        pages[name] = runner.invoke(app, [name, "--help"]).stdout
    return pages


def test_help_shows_flags_without_a_value_type():
    """No help page shows a flag's type (`<bool>`), nor an option's Python type
    (`<list[str]>` for --sweep), nor an argument's (`<list[str]>` beside PATH); the flags
    themselves are still listed."""
    for name, page in _help_pages().items():
        assert "<bool>" not in page and "<list[" not in page, (name, page)
        assert "--help" in page, name
    pages = _help_pages()
    assert "--quiet" in pages["fit"] and "--allow-misaligned" in pages["report"]
    assert "--no-dirty" in pages["synth"] and "tau|c=LO:HI[:N]" in pages["compare"]


def test_help_texts_survive_rich_markup():
    """Every help text renders as written: a bracket such as E[delta^2|H] is not eaten as
    rich markup (the help is rendered in rich markup mode)."""
    from rich.text import Text
    from typer.main import get_command

    group = get_command(app)
    for name, cmd in group.commands.items():
        texts = [cmd.help or ""] + [getattr(p, "help", None) or "" for p in cmd.params]
        for t in texts:
            assert Text.from_markup(t).plain == t.replace("\\[", "["), (name, t)

def test_inspect_bundled_sample_says_so():
    """With no path, inspect uses the bundled sample run and says so on stderr."""
    r = runner.invoke(app, ["inspect"])
    assert r.exit_code == 0, r.output
    assert "bundled sample run" in r.stderr
    assert "Token accounting" in r.stdout


def test_inspect_json(tmp_path):
    """inspect --json writes a versioned document with accounting and mapping."""
    p = _file(tmp_path, old_log_probs=[-0.1, float("nan"), -1.0, -2.0])
    out = tmp_path / "i.json"
    r = runner.invoke(app, ["inspect", str(p), "--json", str(out), "-q"])
    assert r.exit_code == 0, r.output
    doc = json.loads(out.read_text())
    assert doc["schema_version"] and doc["tool_version"] == entr_diag.__version__
    assert doc["inputs"]["accounting"]["exclusions"] == {"non_finite_logprob": 1}
    assert doc["inputs"]["accounting"]["tokens_valid"] == 2
    assert doc["inputs"]["mapping"]["infer_logprob"] == "rollout_log_probs"
    # paths as given, with the directory relative ones were read from (helper-44)
    assert doc["inputs"]["files"][0]["path"] == str(p)
    assert doc["inputs"]["working_directory"] == os.getcwd()


def test_inspect_directory_of_shards(tmp_path):
    """inspect on a directory reads every shard."""
    d = tmp_path / "shards"
    d.mkdir()
    _file(d, "a.parquet")
    _file(d, "b.parquet", seq_id=[3, 3, 4, 4])
    r = runner.invoke(app, ["inspect", str(d)])
    assert r.exit_code == 0, r.output
    assert "2 file(s)" in r.stdout


REFUSALS = [
    # (make args, key words expected in the message)
    (lambda t: [str(t / "missing.parquet")], ["does not exist"]),
    (lambda t: [str(_file(t).parent / "nope" / "*.parquet")], ["matches no file"]),
    (lambda t: [_write_text(t / "a.parquet", "not parquet")], ["Parquet"]),
    (lambda t: [str(_file(t, old_log_probs=["a", "b", "c", "d"]))], ["train_logprob", "type"]),
    (lambda t: [str(_drop(t, "rollout_log_probs"))], ["missing required", "infer_logprob"]),
    (lambda t: [str(_ragged(t))], ["different lengths", "s1"]),
    (lambda t: [str(_empty(t))], ["empty"]),
    (lambda t: [str(_file(t)), "--column", "nonsense"], ["CANONICAL=SOURCE"]),
    (lambda t: [str(_file(t)), "--framework", "nope"], ["unknown framework"]),
    (lambda t: [str(_file(t)), "-c", "infer_logprob=a", "-c", "infer_logprob=b"],
     ["--column infer_logprob=a and --column infer_logprob=b", "mapped twice"]),
    (lambda t: [str(_file(t, infer_logprobs=[-0.1, -0.2, -1.0, -2.0]))],
     ["ambiguous column infer_logprob", "'rollout_log_probs' and 'infer_logprobs'",
      "--column infer_logprob=NAME"]),
    (lambda t: [str(_file(t)), "--framework", "trl"],
     ["'old_log_probs' is the name verl and roll use for train_logprob",
      "--column train_logprob=old_log_probs"]),
    (lambda t: [str(_file(t)), "-c", "train_logprob=rollout_log_probs"],
     ["takes 'rollout_log_probs'", "infer_logprob has no source left"]),
    (lambda t: [str(_file(t)), "--layout", "nested"], ["layout nested"]),
]


def _write_text(p: Path, text: str) -> str:
    p.write_text(text)
    return str(p)


def _drop(t: Path, col: str) -> Path:
    p = _file(t)
    pl.read_parquet(p).drop(col).write_parquet(t / "dropped.parquet")
    return t / "dropped.parquet"


def _ragged(t: Path) -> Path:
    p = t / "ragged.parquet"
    pl.DataFrame({"seq_id": ["s0", "s1"], "train_logprob": [[-0.1, -0.2], [-0.3]],
                  "infer_logprob": [[-0.1, -0.2], [-0.3, -0.1]]}).write_parquet(p)
    return p


def _empty(t: Path) -> Path:
    p = t / "empty.parquet"
    pl.read_parquet(_file(t)).head(0).write_parquet(p)
    return p


@pytest.mark.parametrize("case", range(len(REFUSALS)))
def test_inspect_refusals_exit_2(tmp_path, case):
    """Bad input stops with one clear message on stderr, exit code 2, no traceback."""
    make, words = REFUSALS[case]
    r = runner.invoke(app, ["inspect", *make(tmp_path)])
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output
    msg = re.sub(r"\s+", " ", r.stderr)
    for w in words:
        assert w in msg, (w, msg)


USAGE_ERRORS = [
    # (args, words the one line must hold)
    (["fit", "--bins", "0"], ["--bins 0", "out of range (3 to 500)"]),
    (["fit", "--bins=501"], ["--bins 501", "out of range (3 to 500)"]),
    (["compare", "--n-boot", "-1"], ["--n-boot -1", "out of range (100 to 100,000)"]),
    (["report", "--seed", "-5"], ["--seed -5", "out of range (>= 0)"]),
    (["fit", "--bins", "abc"], ["--bins abc", "must be a valid integer"]),
    (["fit", "--tau", "x"], ["--tau x", "must be a valid number"]),
    (["fit", "--bogus"], ["no such option: --bogus"]),
    (["nosuchcmd"], ["no such command 'nosuchcmd'"]),
    (["synth"], ["missing option '--output'"]),
    (["fit", "--bin-edges", "foo"], ["--bin-edges foo: expected quantile or log"]),
    (["report", "--bin-edges", "foo"], ["--bin-edges foo: expected quantile or log"]),
    (["inspect", "--layout", "foo"], ["--layout must be one of auto, long, nested, not 'foo'"]),
    # click keeps the last of a repeated one-value option silently: refused
    (["fit", "x.parquet", "--json", "a.json", "--json=b.json"],
     ["option --json is given 2 times (a.json, b.json); it takes one value"]),
    (["compare", "x.parquet", "--tau", "4", "-q", "--tau", "5"],
     ["option --tau is given 2 times (4, 5)"]),
]


@pytest.mark.parametrize("case", range(len(USAGE_ERRORS)))
def test_usage_errors_one_plain_line(case):
    """A click/typer usage error (option bound, bad value, unknown option or command, missing
    option) is one plain `error: ...` line on stderr naming the option and value, exit 2."""
    args, words = USAGE_ERRORS[case]
    r = runner.invoke(app, args)
    assert r.exit_code == 2, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert "Usage:" not in r.output and "\u256d" not in r.output  # no usage block, no panel
    for w in words:
        assert w in lines[0], (w, lines[0])
    assert r.stdout == ""


def test_repeatable_options_and_flags_may_repeat(tmp_path):
    """Only one-value options are refused when repeated: --gate and --column take several,
    and a flag given twice is still the flag."""
    from entr_diag.synth import SynthSpec, write_synth

    p = tmp_path / "t.parquet"
    write_synth(p, SynthSpec(n_tokens=20_000, seed=3))
    r = runner.invoke(app, ["compare", str(p), "-q", "-q", "--gate", "fixed:c=0.5",
                            "--gate", "icepop", "--column", "entropy=entropy",
                            "--column", "seq_id=seq_id", "--n-boot", "100"])
    assert r.exit_code == 0, r.output
    assert "fixed c=0.5" in r.stdout and "icepop" in r.stdout


def test_usage_error_subprocess_and_help_still_work():
    """As a real process a bound error is one line with exit 2, and --help still prints the
    help with exit 0."""
    out = subprocess.run([sys.executable, "-m", "entr_diag", "fit", "--bins", "0"],
                         capture_output=True, text=True)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip().startswith("error: --bins 0") and len(out.stderr.splitlines()) == 1
    out = subprocess.run([sys.executable, "-m", "entr_diag", "fit", "--help"],
                         capture_output=True, text=True)
    assert out.returncode == 0 and "Usage:" in out.stdout and "--bins" in out.stdout


def test_cli_subprocess_no_traceback(tmp_path):
    """Run as a real process: exit code 2 and no traceback for a non-Parquet file."""
    p = tmp_path / "bad.parquet"
    p.write_bytes(b"\x00" * 100)
    out = subprocess.run([sys.executable, "-m", "entr_diag", "inspect", str(p)],
                         capture_output=True, text=True)
    assert out.returncode == 2
    assert "Traceback" not in out.stderr and "bad.parquet" in out.stderr


# ------------------------------------------------------------------ analysis commands


@pytest.fixture(scope="module")
def synth_file(tmp_path_factory) -> Path:
    from entr_diag.synth import SynthSpec, write_synth

    p = tmp_path_factory.mktemp("synth") / "run.parquet"
    write_synth(p, SynthSpec(n_tokens=40_000, seed=2, noise_share=0.1))
    return p


def test_fit_json_and_flag(synth_file, tmp_path):
    """fit writes versioned JSON with laws and breakpoint; flag writes the noise tokens."""
    out = tmp_path / "fit.json"
    r = runner.invoke(app, ["fit", str(synth_file), "--n-boot", "200", "--json", str(out), "-q"])
    assert r.exit_code == 0, r.output
    doc = json.loads(out.read_text())
    assert doc["command"] == "fit" and doc["breakpoint"]["h_star"] > 0
    assert doc["laws"]["power"]["alpha_ci"][0] <= 1.0 <= doc["laws"]["power"]["alpha_ci"][1] + 0.05
    assert "NaN" not in out.read_text()
    noise = tmp_path / "noise.parquet"
    r = runner.invoke(app, ["flag", str(synth_file), "-o", str(noise), "--n-boot", "200", "-q"])
    assert r.exit_code == 0, r.output
    df = pl.read_parquet(noise)
    assert df.height > 0 and df["seq_id"].dtype == pl.Int64  # joinable to the input
    assert (df["entropy"] < doc["breakpoint"]["h_star"] * 1.0001).all()
    # the file says what made it: H*, tau, eps and the inputs
    import pyarrow.parquet as pq

    meta = pq.read_metadata(noise).metadata
    made = json.loads(meta[b"entr_diag.parameters"])
    assert made["h_star"] == pytest.approx(doc["breakpoint"]["h_star"], rel=0.01)
    assert (made["tau"], made["eps"], made["inputs"]) == (4.0, 0.01, [str(synth_file)])
    assert made["working_directory"] == os.getcwd()  # (relative inputs traced back)
    assert made["assessable"] is True and made["not_assessable"] is None
    assert "not assessable" not in r.stdout
    assert doc["verdict"]["assessable"] is True and doc["verdict"]["not_assessable"] is None


def test_flag_says_when_the_verdict_is_not_assessable(synth_file, tmp_path):
    """Logprobs stored rounded to 0.1 nats make the verdict not assessable; flag, which
    read H* from the same fit, wrote its tokens (or an empty file) as a noise regime with
    no word of it. It now says so on stdout and in the file's metadata, with the reason
    fit gives (JSON verdict.not_assessable)."""
    p = tmp_path / "r1.parquet"
    pl.read_parquet(synth_file).with_columns(
        pl.col("train_logprob", "infer_logprob").round(1)).write_parquet(p)
    js = tmp_path / "f.json"
    r = runner.invoke(app, ["fit", str(p), "--n-boot", "100", "--json", str(js), "-q"])
    why = json.loads(js.read_text())["verdict"]["not_assessable"]
    assert r.exit_code == 0 and why.startswith("logprobs stored rounded to 0.1 nats"), why
    noise = tmp_path / "noise.parquet"
    r = runner.invoke(app, ["flag", str(p), "-o", str(noise), "--n-boot", "100", "-q"])
    assert r.exit_code == 0, r.output
    out = " ".join(r.stdout.split())
    assert (f"The verdict is not assessable ({why}): a noise regime read from this input "
            "describes that fault, not the mismatch; see `entr-diag fit`.") in out, out
    import pyarrow.parquet as pq

    made = json.loads(pq.read_metadata(noise).metadata[b"entr_diag.parameters"])
    assert made["assessable"] is False and made["not_assessable"] == why


@pytest.mark.parametrize("args", [
    ["flag", "{in}", "-o", "{in}"],
    ["report", "{in}", "-o", "{in}"],
    ["fit", "{in}", "--json", "{in}"],
    ["compare", "{in}", "--export", "{in}"],
])
def test_output_never_overwrites_input(synth_file, tmp_path, args):
    """An output path naming an input file is refused (exit 2) and the input is unchanged."""
    p = tmp_path / "in.parquet"
    p.write_bytes(synth_file.read_bytes())
    before = p.read_bytes()
    r = runner.invoke(app, [a.replace("{in}", str(p)) for a in args] + ["-q"])
    assert r.exit_code == 2, r.output
    assert "never overwrites" in r.stderr
    assert p.read_bytes() == before


@pytest.mark.parametrize("args,words", [
    (["fit", "--seed", "-1"], ["seed"]),
    (["fit", "--bins", "2"], ["bins"]),
    (["fit", "--n-boot", "5"], ["n-boot"]),
    (["compare", "--sweep", "tau=1"], ["--sweep", "LO:HI"]),
    (["compare", "--sweep", "c=0.05:2:100000"], ["512"]),
    (["compare", "--gate", "nope"], ["gate"]),
    (["compare", "--tau", "0"], ["--tau"]),
    (["report", "-o", "/nonexistent-dir/x.html"], ["does not exist"]),
    (["fit", "--json", "/nonexistent-dir/x.json"], ["does not exist"]),
])
def test_bad_options_refused_before_reading(args, words):
    """Bad options and unwritable outputs are refused with exit 2 before any data is read."""
    r = runner.invoke(app, args)
    assert r.exit_code == 2, r.output
    text = re.sub(r"\s+", " ", r.output + (r.stderr or ""))
    assert "Traceback" not in text
    for w in words:
        assert w in text, (w, text)


def test_all_tokens_masked_out(tmp_path):
    """A dump whose loss mask is false everywhere stops with that reason, exit 2."""
    p = _file(tmp_path, response_mask=[0, 0, 0, 0])
    r = runner.invoke(app, ["fit", str(p)])
    assert r.exit_code == 2
    assert "no loss-masked token" in re.sub(r"\s+", " ", r.stderr)


def test_nested_file_whose_lists_are_all_empty(tmp_path):
    """A nested file whose per-token lists are all empty holds no token: said so, naming the
    rows (it said 'all 0 tokens have loss_mask false'), exit 2, for every command."""
    f = tmp_path / "empty_lists.parquet"
    empty = pl.Series([[], []], dtype=pl.List(pl.Float64))
    pl.DataFrame({"seq_id": [1, 2], "train_logprob": empty, "infer_logprob": empty,
                  "entropy": empty, "loss_mask": pl.Series([[], []], dtype=pl.List(pl.Boolean))}
                 ).write_parquet(f)
    for cmd in ("fit", "compare", "report"):
        r = runner.invoke(app, [cmd, str(f), "-q"] + (["-o", str(tmp_path / "r.html")]
                                                      if cmd == "report" else []))
        assert r.exit_code == 2, r.output
        assert r.stderr.startswith(f"error: {f}: no token at all: the per-token lists of all 2 "
                                   "nested rows are empty (or null)"), r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty_lists.parquet"]


def test_probabilities_instead_of_logprobs(tmp_path):
    """Positive 'logprobs' (probabilities) are excluded and the error says what they look
    like, naming the columns."""
    p = _file(tmp_path, old_log_probs=[0.9, 0.8, 0.5, 0.4], rollout_log_probs=[0.9, 0.7, 0.5, 0.3])
    r = runner.invoke(app, ["fit", str(p)])
    assert r.exit_code == 2
    msg = re.sub(r"\s+", " ", r.stderr)
    assert "positive_logprob: 3" in msg and "probabilities" in msg
    assert ("both train_logprob ('old_log_probs') and infer_logprob "
            "('rollout_log_probs') may hold probabilities") in msg
    assert "input files" not in msg  # one input file: no file to name


def _shards(tmp_path: Path, n: int, bad: dict[int, dict], tokens: int = 400) -> Path:
    """``n`` shards of the bundled sample's first rows, shard i changed by ``bad[i]``
    (column -> expression)."""
    from entr_diag.io.load import bundled_sample_path

    df = pl.read_parquet(bundled_sample_path()).head(n * tokens)
    d = tmp_path / "shards"
    d.mkdir()
    for i in range(n):
        part = df[i * tokens:(i + 1) * tokens]
        if i in bad:
            part = part.with_columns(**bad[i])
        part.write_parquet(d / f"part-{i}.parquet")
    return d


def test_probabilities_in_one_shard_name_the_column_and_the_shard(tmp_path):
    """One shard of four with the trainer's column in probabilities: inspect's warning
    names that column alone and that shard, and the JSON accounting says the same; fit
    refuses (exit 2): the shard's 5 probabilities below 1e-4 would pass as logprobs near 0
    and distort every result (it analysed them with the warning)."""
    # five loss-masked probabilities below 1e-4: they pass as log-probabilities near 0
    tiny = pl.col("loss_mask") & (pl.col("loss_mask").cast(pl.Int64).cum_sum() <= 5)
    d = _shards(tmp_path, 4, {2: {"train_logprob": pl.when(tiny).then(1e-6)
                                  .otherwise(pl.col("train_logprob").exp())}})
    j = tmp_path / "fit.json"
    r = runner.invoke(app, ["fit", str(d), "-q"])
    assert r.exit_code == 2 and r.stderr.count("\n") == 1, r.output
    assert ("the 5 valid token(s) left in the files that hold them (all in "
            f"{d / 'part-2.parquet'}, 1 of the 4 input files) are probably probabilities too"
            in " ".join(r.stderr.split())) and "Leave those files out" in r.stderr
    r = runner.invoke(app, ["inspect", str(d), "--json", str(j)])
    msg = re.sub(r"\s+", " ", r.stderr)
    assert ("positive_logprob: train_logprob may hold probabilities"
            in msg), msg
    assert "infer_logprob may" not in msg and "both" not in msg
    assert f"these rows are all in {d / 'part-2.parquet'}, 1 of the 4 input files" in msg
    where = json.loads(j.read_text())["inputs"]["accounting"]["exclusions_where"]
    n = where["positive_logprob"]["columns"]["train_logprob"]
    assert where["positive_logprob"] == {"columns": {"train_logprob": n},
                                         "files": {str(d / "part-2.parquet"): n},
                                         "valid_left": {str(d / "part-2.parquet"): 5},
                                         "input_files": 4}
    assert (f"the 5 valid tokens left in {d / 'part-2.parquet'} are probably probabilities "
            "too") in msg and "leave that file out" in msg
    doc = json.loads(j.read_text())
    assert n == doc["inputs"]["accounting"]["exclusions"]["positive_logprob"]
    # the corrupt-rows finding: a quarter of the tokens is not "most", nor placeholders
    corrupt = next(f for f in doc["forensics"]["findings"] if f["kind"] == "corrupt_rows")
    assert re.match(r"2\d\.\d% of the loss-masked tokens are invalid \(positive_logprob\)",
                    corrupt["title"]), corrupt["title"]
    assert "or probabilities" in corrupt["message"]


def test_exclusions_in_several_shards_list_the_largest(tmp_path):
    """Sentinel values on the inference side of four shards of five: the three with most
    rows are named with their counts, and how many more."""
    bad = {i: {"infer_logprob": pl.when(pl.int_range(pl.len()) < 80 * (i + 1))
               .then(-1e4).otherwise(pl.col("infer_logprob"))} for i in range(1, 5)}
    d = _shards(tmp_path, 5, bad)
    r = runner.invoke(app, ["inspect", str(d)])
    msg = re.sub(r"\s+", " ", r.stderr + r.stdout)
    assert ("infer_logprob holds a placeholder (e.g. -9999) for these tokens: that side "
            "returned no logprob for them" in msg and "(these rows are in 4 of the 5" in msg)
    names = [str(d / f"part-{i}.parquet") for i in (4, 3, 2)]
    assert re.search(r"in 4 of the 5 input files: " + re.escape(names[0]) + r" \([\d,]+\), "
                     + re.escape(names[1]) + r" \([\d,]+\), " + re.escape(names[2])
                     + r" \([\d,]+\) and 1 more", msg), msg


def test_loss_mask_missing_in_one_shard(tmp_path):
    """A shard without a loss mask counts all its tokens; the other shard keeps its mask."""
    d = tmp_path / "mix"
    d.mkdir()
    _file(d, "a.parquet")  # 1 unmasked token
    pl.read_parquet(_file(tmp_path, "b.parquet", seq_id=[7, 7, 8, 8])).drop(
        "response_mask").write_parquet(d / "b.parquet")
    from entr_diag.io import load_dataset

    ds = load_dataset([d])
    assert ds.accounting.tokens_unmasked == 1
    assert ds.accounting.tokens_valid == 7
    assert any("every token of those files" in n for n in ds.notes)


def test_verl_entropys_is_trainer_side(tmp_path):
    """verl's `entropys` comes from the actor forward pass: reported as trainer-side entropy."""
    r = runner.invoke(app, ["inspect", str(_file(tmp_path)), "-q"])
    assert r.exit_code == 0
    assert "trainer-side" in r.stdout


def test_misaligned_logprobs_stop_unless_allowed(synth_file, tmp_path):
    """Logprob columns shifted by one token stop fit, compare, flag and report with exit 2
    naming the shift, before writing anything; --allow-misaligned goes on."""
    df = pl.read_parquet(synth_file).sort("seq_id", "position")
    df = df.with_columns(pl.col("infer_logprob").shift(1).over("seq_id")).drop_nulls("infer_logprob")
    p = tmp_path / "shifted.parquet"
    df.write_parquet(p)
    r = runner.invoke(app, ["fit", str(p), "--n-boot", "100"])
    assert r.exit_code == 2, r.output
    msg = re.sub(r"\s+", " ", r.stderr)
    assert "shift" in msg.lower() and "--allow-misaligned" in msg
    assert msg.startswith(f"error: {p}: ")  # names the input (a folder of shards: its files)
    r = runner.invoke(app, ["fit", str(p), "--n-boot", "100", "--allow-misaligned", "-q"])
    assert r.exit_code == 0, r.output
    for cmd in (["compare"], ["flag", "-o", str(tmp_path / "n.parquet")],
                ["report", "-o", str(tmp_path / "r.html")]):
        r = runner.invoke(app, [*cmd, str(p), "--n-boot", "100", "-q"])
        assert r.exit_code == 2 and "--allow-misaligned" in r.stderr, cmd
        assert not (tmp_path / "r.html").exists() and not (tmp_path / "n.parquet").exists()
    r = runner.invoke(app, ["flag", str(p), "-o", str(tmp_path / "n.parquet"), "--n-boot", "100",
                            "--allow-misaligned", "-q"])
    assert r.exit_code == 0, r.output


def _late_refusal_inputs(synth: Path, tmp: Path) -> dict[str, list[str]]:
    """Inputs that pass reading (notes and the accounting line are due) but are refused
    later: (name -> the paths to give)."""
    df = pl.read_parquet(synth).sort("seq_id", "position")
    shifted = df.with_columns(pl.col("infer_logprob").shift(1).over("seq_id")).drop_nulls(
        "infer_logprob")
    one_seq = df.filter(pl.col("seq_id") == df["seq_id"][0])
    files = {"shifted": shifted, "no_entropy": df.drop("entropy")}
    out = {}
    for name, frame in files.items():
        frame.write_parquet(tmp / f"{name}.parquet")
        out[name] = [str(tmp / f"{name}.parquet")]
    mixed = tmp / "mixed"  # one shard without entropy: a note, then the refusal
    mixed.mkdir()
    df.head(20_000).write_parquet(mixed / "a.parquet")
    df.tail(20_000).drop("entropy").write_parquet(mixed / "b.parquet")
    twice = tmp / "twice"  # one sequence copied into two shards: a warning, then the refusal
    twice.mkdir()
    for n in ("a", "b"):
        one_seq.write_parquet(twice / f"{n}.parquet")
    return {**out, "mixed": [str(mixed)], "twice": [str(twice)]}


@pytest.mark.parametrize("case", ["shifted", "no_entropy", "mixed", "twice"])
def test_refusal_after_reading_is_one_error_line(synth_file, tmp_path, case):
    """A refusal found after the input was read (misaligned columns, no entropy, too few
    sequences) prints one `error:` line on stderr: not the accounting line, the notes or
    the warnings that a successful run prints before its results."""
    paths = _late_refusal_inputs(synth_file, tmp_path)[case]
    r = runner.invoke(app, ["fit", *paths, "--n-boot", "100"])
    assert r.exit_code == 2, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert r.stdout == ""


def test_notes_before_an_early_refusal_are_dropped(synth_file, tmp_path):
    """Notes due before a refusal (a repeated --gate; a skipped '_' file in the input folder)
    are not printed: the refusal is its one error line."""
    d = tmp_path / "d"
    d.mkdir()
    pl.read_parquet(synth_file).write_parquet(d / "_hidden.parquet")
    (d / "bad.parquet").write_bytes(b"junk")
    for args in (["compare", "--gate", "mis", "--gate", "mis", "--json",
                  str(tmp_path / "no" / "x.json")], ["fit", str(d)]):
        r = runner.invoke(app, args)
        assert r.exit_code == 2, r.output
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr


def test_successful_run_prints_its_notes_first(synth_file, tmp_path):
    """A successful run still prints its notes and the accounting line on stderr, before
    the 'wrote' line of its first output."""
    d = tmp_path / "d"
    d.mkdir()
    pl.read_parquet(synth_file).write_parquet(d / "a.parquet")
    pl.DataFrame({"x": [1]}).write_parquet(d / "_meta.parquet")  # skipped: a note
    out = tmp_path / "fit.json"
    r = runner.invoke(app, ["fit", str(d), "--n-boot", "100", "--json", str(out)])
    assert r.exit_code == 0, r.output
    lines = r.stderr.strip().splitlines()
    assert lines[0].startswith("note: skipped 1 Parquet file(s)"), lines
    assert "valid loss-masked tokens of" in lines[1] and lines[-1] == f"wrote {out}", lines


def test_other_data_files_in_an_input_directory_are_named(synth_file, tmp_path):
    """A step dumped as CSV (or gzipped JSON lines) beside the Parquet shards is not read:
    a warning names it, also with --quiet (its tokens are missing from every result); a
    README or a hidden file is not named."""
    d = tmp_path / "d"
    d.mkdir()
    pl.read_parquet(synth_file).write_parquet(d / "a.parquet")
    pl.read_parquet(synth_file).head(100).write_csv(d / "step6.csv")
    (d / "step7.jsonl.gz").write_bytes(b"")
    (d / "README.md").write_text("dump")
    (d / ".step8.csv").write_text("x")
    (d / "config.json").write_text("{}")  # configs and checkpoints beside a dump: not named
    (d / "optimizer.pt").write_bytes(b"")
    (d / ".cache").mkdir()
    (d / ".cache" / "x.jsonl").write_text("{}")
    (d / "_temporary").mkdir()
    (d / "_temporary" / "part.CSV").write_text("a")
    out = tmp_path / "fit.json"
    r = runner.invoke(app, ["fit", str(d), "--n-boot", "100", "-q", "--json", str(out)])
    assert r.exit_code == 0, r.output
    warn = [ln for ln in r.stderr.splitlines() if "are not Parquet" in ln]
    assert len(warn) == 1 and warn[0].startswith("warning: 2 file(s) in input directories")
    assert "(.csv, .jsonl.gz)" in warn[0] and "step6.csv" in warn[0]
    assert any("are not Parquet" in w for w in json.loads(out.read_text())["warnings"])


def test_where_gates_disagree_is_the_joint_cell_of_the_exported_decisions(synth_file,
                                                                          tmp_path):
    """compare's 'where they disagree' cell (JSON where_only_entr_keeps /
    where_only_other_keeps) is the (entropy bin, p bin) cell holding the most such tokens,
    recomputed from --export's per-token decisions: not the pair of the two marginal
    modes, which can name a cell holding none of them."""
    js, ex = tmp_path / "c.json", tmp_path / "x.parquet"
    r = runner.invoke(app, ["compare", str(synth_file), "-q", "--n-boot", "100", "--json",
                            str(js), "--export", str(ex)])
    assert r.exit_code == 0, r.output
    c = json.loads(js.read_text())["compare"]
    e_edges, p_edges = c["entropy_edges"], c["p_edges"]
    tok = pl.read_parquet(synth_file).filter(pl.col("loss_mask")).select(
        "seq_id", "position", "step", "entropy", "infer_logprob")
    dec = pl.read_parquet(ex).join(tok, on=["seq_id", "position", "step"])
    eb = np.clip(np.searchsorted(e_edges[1:-1], dec["entropy"].to_numpy(), "right"), 0,
                 len(e_edges) - 2)
    pb = np.clip(np.searchsorted(p_edges[1:-1], np.exp(dec["infer_logprob"].to_numpy()),
                                 "right"), 0, len(p_edges) - 2)
    entr = dec[[col for col in dec.columns if col.startswith("keep[entr")][0]]
    checked = 0
    for g in c["gates"]:
        a = g.get("agreement_vs_entr")
        if not a or not (a["only_entr_keeps"] or a["only_other_keeps"]):
            continue
        col = f"keep[{g['spec']}]" if "spec" in g else None
        if col not in dec.columns:
            continue
        keep = dec[col]
        for key, mask in (("only_entr_keeps", entr & ~keep), ("only_other_keeps", ~entr & keep)):
            m = mask.to_numpy()
            if not m.any():
                assert a[f"where_{key}"] is None
                continue
            counts = np.zeros((len(e_edges) - 1, len(p_edges) - 1))
            np.add.at(counts, (eb[m], pb[m]), 1)
            i, j = np.unravel_index(int(np.argmax(counts)), counts.shape)
            assert a[f"where_{key}"] == [a["by_entropy"]["keys"][i], a["by_p"]["keys"][j]]
            checked += 1
    assert checked >= 3


def test_flag_without_break_writes_empty_file(tmp_path):
    """With no noise regime, flag replaces any earlier output by an empty file (0 rows)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from entr_diag.io.load import OUTPUT_MARK

    out = tmp_path / "noise.parquet"  # an earlier output (entr-diag's mark in its metadata)
    pq.write_table(pa.table({"stale": [1, 2, 3]}).replace_schema_metadata(
        {OUTPUT_MARK: "entr-diag flag"}), out)
    r = runner.invoke(app, ["flag", "-o", str(out), "--n-boot", "100", "-q"])
    assert r.exit_code == 0, r.output
    df = pl.read_parquet(out)
    assert df.height == 0 and "score" in df.columns and "stale" not in df.columns


def test_output_checks_before_reading(tmp_path):
    """Refusing an output naming the input happens before any data is read (no accounting)."""
    p = _file(tmp_path)
    r = runner.invoke(app, ["flag", str(p), "-o", str(p)])
    assert r.exit_code == 2
    assert "valid loss-masked tokens" not in r.stderr and (
        "never overwrites" in r.stderr or "entr-diag did not write" in r.stderr)


def test_progress_bar_counts_rows_on_a_terminal(monkeypatch, tmp_path):
    """On a terminal, the progress bar names each phase and counts the rows of each pass
    over the tokens (batch by batch); with --quiet it stays silent."""
    import io

    from rich.console import Console

    import entr_diag.cli as cli
    import entr_diag.passes as passes

    seen: list[str] = []
    advanced: dict[str, list[int]] = {}
    real_phase, real_advance = cli._Phases.phase, cli._Phases.advance

    def phase(self, message, rows):
        seen.append(f"{message}|{rows}")
        real_phase(self, message, rows)

    def advance(self, rows):  # rows counted per phase
        advanced.setdefault(seen[-1] if seen else "", []).append(rows)
        real_advance(self, rows)

    real_expect = cli._Phases.expect
    expected: dict[str, int] = {}

    def expect(self, rows):
        expected[seen[-1]] = rows
        real_expect(self, rows)

    buf = io.StringIO()
    monkeypatch.setattr(cli, "stderr", Console(file=buf, force_terminal=True, width=100))
    monkeypatch.setattr(cli._Phases, "phase", phase)
    monkeypatch.setattr(cli._Phases, "advance", advance)
    monkeypatch.setattr(cli._Phases, "expect", expect)
    real_run = passes.run_pass
    monkeypatch.setattr(passes, "run_pass",
                        lambda lf, accs, chunk_size=20_000: real_run(lf, accs, chunk_size=chunk_size))
    r = CliRunner().invoke(app, ["fit", "--json", str(tmp_path / "f.json")])
    assert r.exit_code == 0, r.output
    valid = json.loads((tmp_path / "f.json").read_text())["inputs"]["accounting"]["tokens_valid"]
    passes_ = [s for s in seen if not s.endswith("|None")]
    assert passes_ == [f"one pass (fit, metrics, forensics)|{valid}"]
    done = advanced[passes_[0]]
    assert sum(done) == valid and len(done) >= 5 and max(done) <= 20_000
    total = json.loads((tmp_path / "f.json").read_text())["inputs"]["accounting"]["tokens_total"]
    assert sum(advanced["reading input...|None"]) == total  # every token row, masked or not
    assert expected["reading input...|None"] == total  # the bar's total, from the metadata
    assert "rows" in buf.getvalue() and "tokens" in buf.getvalue()
    assert "rows" in buf.getvalue()
    seen.clear()
    r = CliRunner().invoke(app, ["fit", "--quiet", "--json", str(tmp_path / "g.json")])
    assert r.exit_code == 0 and seen == []


def test_quiet_hides_notes_and_progress_but_not_warnings(tmp_path):
    """--quiet hides the notes (accounting line, bundled-sample line) but the data-quality
    warnings still print: duplicated rows, byte copies of a file, most tokens excluded,
    --allow-misaligned going on."""
    import shutil

    import numpy as np

    rng = np.random.default_rng(3)
    n_seq, length = 40, 50
    infer = -rng.exponential(0.7, n_seq * length)
    df = pl.DataFrame({"seq_id": np.repeat(np.arange(n_seq), length),
                       "position": np.tile(np.arange(length), n_seq), "infer_logprob": infer,
                       "train_logprob": infer - np.abs(rng.normal(0, 0.01, n_seq * length)),
                       "entropy": rng.exponential(0.5, n_seq * length)})
    d = tmp_path / "d"
    d.mkdir()
    df.write_parquet(d / "a.parquet")
    shutil.copy(d / "a.parquet", d / "b.parquet")
    r = runner.invoke(app, ["fit", str(d), "--n-boot", "100", "-q"])
    assert r.exit_code == 0, r.output
    err = " ".join(r.stderr.split())
    assert "look like copies of each other" in err and "hold more tokens than positions" in err
    assert "valid loss-masked tokens" not in err and "note:" not in err
    # copies: no advice to pass --seq-id-per-file, which would hide their repeats (helper-44)
    assert "pass --seq-id-per-file" not in err
    assert "the input holds copied files (see that warning): pass one of each." in err
    # probabilities on 3 rows of 4: the mostly-excluded warning
    p = tmp_path / "probs.parquet"
    df.with_columns(pl.when(pl.col("position") % 4 > 0).then(pl.col("infer_logprob").exp())
                    .otherwise(pl.col("infer_logprob"))).write_parquet(p)
    r = runner.invoke(app, ["inspect", str(p), "-q"])
    assert r.exit_code == 0 and "% of the loss-masked tokens are excluded, the results" in \
        " ".join(r.stderr.split())
    # shifted by a token, analysed anyway
    df.with_columns(pl.col("infer_logprob").shift(1).over("seq_id")).drop_nulls().write_parquet(p)
    js = tmp_path / "mis.json"
    r = runner.invoke(app, ["fit", str(p), "--n-boot", "100", "--allow-misaligned", "-q",
                            "--json", str(js)])
    assert r.exit_code == 0 and "and --allow-misaligned went on: every log-ratio" in \
        " ".join(r.stderr.split())
    # ... and the verdict's caveat says so first (it was null)
    assert json.loads(js.read_text())["verdict"]["caveat"].startswith(
        "caveat: Logprob columns look shifted by")
    r = runner.invoke(app, ["fit", "--n-boot", "100", "-q"])  # bundled run: nothing to warn
    assert r.exit_code == 0 and r.stderr == ""


def test_entropy_in_bits_is_warned_about_and_reaches_the_verdict(synth_file, tmp_path):
    """Entropy stored in bits: the sampled tokens' mean surprisal is ln 2 times their
    entropy. fit warns on stderr (also with --quiet) naming the column, the caveat joins
    the verdict (terminal, JSON, and compare's and the report's JSON), and the ratio is in
    the JSON's ``units``; the same run in nats (with its noise regime) warns of nothing."""
    import math

    js = tmp_path / "f.json"
    r = runner.invoke(app, ["fit", str(synth_file), "--n-boot", "100", "-q", "--json", str(js)])
    assert r.exit_code == 0 and r.stderr == "", r.output
    doc = json.loads(js.read_text())
    assert doc["units"]["likely_mistake"] is None and "bits" not in (doc["verdict"]["caveat"] or "")
    assert doc["units"]["ratio_binned"] == pytest.approx(1.0, abs=0.05)
    assert re.search(r"noise regime below H\* = [0-9.]+ nats \[", doc["verdict"]["text"])
    assert "Entropy bins (H in nats;" in r.stdout
    p = tmp_path / "bits.parquet"
    pl.read_parquet(synth_file).with_columns(pl.col("entropy") / math.log(2)).write_parquet(p)
    r = runner.invoke(app, ["fit", str(p), "--n-boot", "100", "-q", "--json", str(js)])
    assert r.exit_code == 0, r.output
    err = " ".join(r.stderr.split())
    assert err.startswith("warning: entropy probably holds bits (log base 2), "
                          "not nats: the sampled tokens' surprisal (-infer_logprob) averages "
                          "0.6"), err
    assert "multiply the column by ln 2" in err
    doc = json.loads(js.read_text())
    assert doc["units"]["likely_mistake"] == "entropy_bits"
    assert doc["units"]["ratio_binned"] == pytest.approx(math.log(2), rel=0.05)
    assert "entropy probably holds bits" in doc["verdict"]["caveat"]
    assert "probably holds bits" in " ".join(r.stdout.split())
    # H* as the column reads (bits), said so, and in nats beside it
    h = doc["breakpoint"]["h_star"]
    lo, hi = doc["breakpoint"]["h_star_ci"]
    assert (f"noise regime below H* = {h:.2g} [{lo:.2g}, {hi:.2g}] in the entropy column's "
            f"unit (probably bits; {h * math.log(2):.2g} nats)") in doc["verdict"]["text"]
    out = " ".join(r.stdout.split())
    assert "Entropy bins (H in the entropy column's unit, probably bits, not nats;" in out
    assert f"Breakpoint: H* = {h:.3g} [" in out and f"(probably bits; {h * math.log(2):.3g} [" in out
    assert "Laws fitted on " in out and "in the entropy column's unit, probably bits)" in out
    r = runner.invoke(app, ["compare", str(p), "--n-boot", "100", "-q", "--json", str(js)])
    assert r.exit_code == 0 and "probably holds bits" in r.stderr
    doc = json.loads(js.read_text())
    fit = doc["fit"]
    assert fit["units"]["likely_mistake"] == "entropy_bits"
    assert "probably holds bits" in fit["verdict"]["caveat"]
    assert doc["compare"]["parameters"]["entropy_unit"] == "bits"
    assert (f"H < H* = {h:.4g} in the entropy column's unit (probably bits)"
            in doc["compare"]["definitions"]["noise_token"])
    out = " ".join(r.stdout.split())
    assert "entropy (probably bits)" in out and "entropy (nats)" not in out
    flagged = tmp_path / "noise.parquet"
    r = runner.invoke(app, ["flag", str(p), "--n-boot", "100", "-q", "-o", str(flagged)])
    assert r.exit_code == 0, r.output
    assert (f"(H < H* = {h:.4g} in the entropy column's unit (probably bits; "
            f"{h * math.log(2):.4g} nats)") in " ".join(r.stdout.split())


def test_entropy_in_bits_names_its_unit_where_no_break_and_a_bend_are_read(tmp_path):
    """The bundled run with its entropy in bits has no low-entropy break (the bins below
    the best split lie below the law) and bins that bend: the verdict's and the
    Breakpoint line's split entropy and the bend caveat's ranges are named in the column's
    unit (probably bits), not labelled nats; the same run in nats says nats."""
    import math

    LONG = str(Path(__file__).resolve().parents[1] / "entr_diag" / "sample_data"
               / "sample_run_long.parquet")
    p = tmp_path / "bits.parquet"
    pl.read_parquet(LONG).with_columns(pl.col("entropy") / math.log(2)).write_parquet(p)
    for path, bits in ((LONG, False), (p, True)):
        js = tmp_path / "f.json"
        r = runner.invoke(app, ["fit", str(path), "--n-boot", "100", "-q", "--json", str(js)])
        assert r.exit_code == 0, r.output
        doc = json.loads(js.read_text())
        search = doc["regime"]["breakpoint_search"]
        assert doc["breakpoint"] is None and search["reason"].startswith(
            "the bins below the best split (H < ")
        h = search["split_h"]
        said = (f"(H < {h:.3g} in the entropy column's unit (probably bits; "
                f"{h * math.log(2):.3g} nats))" if bits else f"(H < {h:.3g} nats)")
        assert said in search["reason"] and said in doc["verdict"]["text"]
        out = " ".join(r.stdout.split())
        assert f"Breakpoint: none (the bins below the best split {said}" in out
        lo, hi = doc["laws"]["power"]["curvature"]["low_range"]
        bend = [c for c in doc["verdict"]["caveats"] if "bend in log-log" in c]
        unit = "in the entropy column's unit (probably bits)" if bits else "nats"
        assert len(bend) == 1 and f"over H {lo:.3g}-{hi:.3g} {unit} (the lowest" in bend[0]
        assert ("nats (the lowest" in bend[0]) is not bits


def test_versions_counted_in_thousands_keep_their_staleness_buckets(synth_file, tmp_path):
    """policy_version and train_version counted in 1000s: fit's staleness strata and
    compare's keep rate by staleness count lags of 1000 versions (labels in versions, the
    unit in the JSON parameters), the same tokens per bucket as the run in versions."""
    p = tmp_path / "v1000.parquet"
    pl.read_parquet(synth_file).with_columns(
        pl.col("policy_version") * 1000, pl.col("train_version") * 1000).write_parquet(p)
    docs = {}
    for name, path in (("raw", synth_file), ("big", p)):
        js = tmp_path / f"{name}.json"
        r = runner.invoke(app, ["compare", str(path), "--n-boot", "100", "-q", "--json",
                                str(js)])
        assert r.exit_code == 0, r.output
        docs[name] = json.loads(js.read_text())
        said = "staleness: the buckets count lags of 1,000 versions" in " ".join(r.stdout.split())
        assert said == (name == "big")
    raw, big = docs["raw"], docs["big"]
    assert big["fit"]["parameters"]["staleness_unit"] == 1000
    assert big["compare"]["parameters"]["staleness_unit"] == 1000
    assert raw["compare"]["parameters"]["staleness_unit"] == 1
    scale = {"0": "0", "1": "1000", "2-3": "2000-3000", "4-7": "4000-7000", "8+": "8000+"}
    sr, sb = raw["compare"]["gates"][0]["keep_by_staleness"], big["compare"]["gates"][0][
        "keep_by_staleness"]
    assert [scale[k] for k in sr["keys"]] == sb["keys"] and sr["n"] == sb["n"]
    assert sum(sb["n"][1:]) > 0  # (stale tokens, not all in 8000+)
    fr = [(scale[s["label"]], s["tokens"]) for s in raw["fit"]["strata"]["staleness"]]
    assert fr == [(s["label"], s["tokens"]) for s in big["fit"]["strata"]["staleness"]]
    const = tmp_path / "const.parquet"  # every token one lag (of 1000 versions) stale
    pl.read_parquet(synth_file).with_columns(
        (pl.col("train_version") * 1000).alias("policy_version"),
        (pl.col("train_version") * 1000 + 1000).alias("train_version")).write_parquet(const)
    js = tmp_path / "const.json"
    r = runner.invoke(app, ["fit", str(const), "--n-boot", "100", "-q", "--json", str(js)])
    assert r.exit_code == 0, r.output
    st = json.loads(js.read_text())["strata"]["staleness"]
    assert [s["label"] for s in st] == ["1000"]

def test_tiny_run_fits_without_a_breakpoint_search(tmp_path):
    """A run too small for the finer breakpoint bins (400 tokens) is fitted and says why no
    breakpoint was searched, instead of crashing."""
    import numpy as np

    rng = np.random.default_rng(0)
    n = 400
    h = rng.exponential(0.5, n)
    infer = -rng.exponential(0.5, n)
    df = pl.DataFrame({"seq_id": np.repeat(np.arange(10), 40), "infer_logprob": infer,
                       "train_logprob": np.minimum(infer + rng.normal(0, 0.3, n), 0.0),
                       "entropy": h})
    p = tmp_path / "tiny.parquet"
    df.write_parquet(p)
    r = runner.invoke(app, ["fit", str(p), "--n-boot", "100", "-q", "--json", str(tmp_path / "f.json")])
    assert r.exit_code == 0, r.output
    bp = json.loads((tmp_path / "f.json").read_text())
    assert bp["breakpoint"] is None and "breakpoint needs at least 4" in r.stdout


def test_run_with_no_full_entropy_bin_says_so_in_a_sentence(tmp_path):
    """91 tokens of 7 sequences in 30 bins: no bin holds enough tokens, said as such (not
    'only 0 bin(s)') with the advice; in 3 bins the law is fitted and no breakpoint bin
    qualifies, said the same way."""
    import numpy as np

    rng = np.random.default_rng(0)
    n = 91
    infer = -rng.exponential(0.5, n)
    p = tmp_path / "tiny.parquet"
    pl.DataFrame({"seq_id": np.arange(n) % 7, "infer_logprob": infer,
                  "train_logprob": np.minimum(infer + rng.normal(0, 0.05, n), 0.0),
                  "entropy": rng.uniform(0.01, 2.0, n)}).write_parquet(p)
    r = runner.invoke(app, ["fit", str(p), "-q"])
    assert r.exit_code == 2, r.output
    assert r.stderr.startswith(f"error: {p}: no entropy bin holds enough tokens (need 3 bins")
    assert "give more tokens or sequences, or fewer bins." in r.stderr
    assert "only 0" not in r.stderr
    r = runner.invoke(app, ["fit", str(p), "--bins", "3", "--n-boot", "100", "-q"])
    assert r.exit_code == 0, r.output
    assert "Breakpoint: none (none of the finer breakpoint bins holds >= 10 tokens" in r.stdout
    assert "only 0" not in r.stdout


def test_law_refused_after_most_tokens_were_excluded_leads_with_the_exclusions(tmp_path):
    """Probabilities stored in the logprob columns: all but a few tokens are excluded as
    positive_logprob. fit and compare refuse the few left (the probabilities at most 1e-4),
    leading with the exclusions and their probable cause, not with advice to give more
    tokens. Spread over reasons without a dominant one, the tokens left are too few for
    the law: fit's refusal and compare's 'No scaling law:' line name the counts."""
    import numpy as np

    rng = np.random.default_rng(0)
    n = 3000
    infer = -rng.exponential(0.5, n)
    infer[:2960] = np.exp(infer[:2960])  # probabilities (> 1e-4) on most rows
    p = tmp_path / "probs.parquet"
    pl.DataFrame({"seq_id": np.arange(n) // 30, "infer_logprob": infer,
                  "train_logprob": infer - np.abs(rng.normal(0, 0.001, n)),
                  "entropy": rng.uniform(0.01, 2.0, n)}).write_parquet(p)
    r = runner.invoke(app, ["fit", str(p), "-q"])
    assert r.exit_code == 2, r.output
    msg = " ".join(r.stderr.split())
    assert msg.startswith(f"error: {p}: 2,960 of the 3,000 loss-masked tokens (98.7%) were "
                          "excluded (positive_logprob 2,960): both train_logprob "
                          "and infer_logprob may hold "
                          "probabilities rather than log-probabilities"), msg
    assert "The 40 token(s) left are not analysed: " in msg and "give more tokens" not in msg
    r = runner.invoke(app, ["compare", str(p), "-q"])  # (it compared the 40 tokens)
    assert r.exit_code == 2 and " ".join(r.stderr.split()) == msg, r.output
    # no dominant reason: the counts, and where to look, without the advice
    infer[:1500] = -5000.0  # sentinel_logprob (probabilities get their hint from 1%)
    infer[1500:2960] = np.nan
    pl.DataFrame({"seq_id": np.arange(n) // 30, "infer_logprob": infer,
                  "train_logprob": infer, "entropy": rng.uniform(0.01, 2.0, n)}
                 ).write_parquet(p)
    r = runner.invoke(app, ["fit", str(p), "-q"])
    msg = " ".join(r.stderr.split())
    assert r.exit_code == 2 and ("(98.7%) were excluded (sentinel_logprob 1,500, "
                                 "non_finite_logprob 1,460): see `entr-diag inspect`") in msg, msg
    assert "give more tokens" not in msg
    r = runner.invoke(app, ["compare", str(p), "-q"])
    assert r.exit_code == 0, r.output
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("No scaling law:"))
    assert "(sentinel_logprob 1,500, non_finite_logprob 1,460)" in line
    assert "give more" not in line


def test_exact_off_by_one_stops_with_the_shift(tmp_path):
    """train_logprob[t] == infer_logprob[t-1] exactly (no noise) is the clearest shift: exit
    2 naming it, not a division by zero; --allow-misaligned goes on."""
    import numpy as np

    rng = np.random.default_rng(1)
    n_seq, length = 40, 60
    infer = -rng.exponential(0.7, n_seq * length)
    df = pl.DataFrame({"seq_id": np.repeat(np.arange(n_seq), length),
                       "position": np.tile(np.arange(length), n_seq),
                       "infer_logprob": infer, "entropy": rng.exponential(0.5, n_seq * length)})
    df = df.with_columns(pl.col("infer_logprob").shift(1).over("seq_id").alias("train_logprob")
                         ).drop_nulls()
    p = tmp_path / "shifted.parquet"
    df.write_parquet(p)
    r = runner.invoke(app, ["fit", str(p), "--n-boot", "100", "-q"])
    assert r.exit_code == 2, r.output
    msg = re.sub(r"\s+", " ", r.stderr)
    assert "shifted by -1 token" in msg
    out = tmp_path / "i.json"
    assert runner.invoke(app, ["inspect", str(p), "-q", "--json", str(out)]).exit_code == 0
    ev = next(f["evidence"] for f in json.loads(out.read_text())["forensics"]["findings"]
              if f["kind"] == "misalignment")
    # the numbers at 4 significant digits (4 decimals for correlations), never rounded to 0/1
    assert (f"infer_logprob[t-1]| = 0 (identical values) against "
            f"{ev['mean_abs_diff_lag0']:#.4g} at lag 0, correlation 1.0000 against "
            f"{ev['corr_lag0']:.4f}, over {ev['tokens_compared']:,} token pairs") in msg
    assert "Likely shift: -1 token." in msg
    r = runner.invoke(app, ["fit", str(p), "--n-boot", "100", "-q", "--allow-misaligned"])
    assert r.exit_code == 0, r.output


def test_alignment_numbers_keep_their_digits():
    """The off-by-one message shows 4 significant digits: 0.9996 is not "1", a correlation
    of 0.99996 is not "1.0", an exact 0 stays 0."""
    from types import SimpleNamespace

    from entr_diag.cli import _alignment_numbers

    f = SimpleNamespace(message="train_logprob[t] agrees with X: mean |difference| 0.000412 "
                        "at lag +1 vs 1 at lag 0", evidence={
                            "likely_shift": 1, "mean_abs_diff_lag_plus1": 0.0004121,
                            "mean_abs_diff_lag0": 0.9996, "corr_lag_plus1": 0.99996,
                            "corr_lag0": 0.01234, "tokens_compared": 12345})
    text = _alignment_numbers(f)
    assert text.startswith("train_logprob[t] agrees with X: mean |train_logprob[t] - "
                           "infer_logprob[t+1]| = 0.0004121 (2,426 times smaller")
    assert "against 0.9996 at lag 0, correlation 1.0000 against 0.0123, over 12,345" in text
    assert "vs 1 at lag 0" not in text


def test_small_sample_caveat_threshold():
    """The caveat appears below 30 bootstrap units (non-empty sequence blocks) and names the
    sequences; at 30 there is none."""
    from entr_diag.caveats import MIN_BOOTSTRAP_UNITS, small_sample_caveat

    assert MIN_BOOTSTRAP_UNITS == 30
    fit = {"parameters": {"blocks_nonempty": 29}}
    assert small_sample_caveat(fit, 29).startswith("caveat: only 29 sequences to resample")
    assert "only 29 independent sequence blocks (of 31 sequences: the bootstrap resamples " \
        "blocks of sequences grouped by a hash of their key" in small_sample_caveat(fit, 31)
    assert small_sample_caveat({"parameters": {"blocks_nonempty": 30}}, 30) is None


def test_few_sequences_verdict_has_caveat(synth_file, tmp_path):
    """A run of 3 long sequences gets its verdict with a caveat line in fit's terminal output,
    in verdict.caveat of the JSON and under the report's verdict (stdout and HTML); the
    bundled sample run (hundreds of sequences) gets none of it (its one caveat: its bins
    bend)."""
    df = pl.read_parquet(synth_file).sort("seq_id", "position")
    df = df.with_columns(pl.col("seq_id") % 3, pl.lit(1).alias("step")).with_columns(
        pl.int_range(pl.len()).over("seq_id").alias("position"))
    p = tmp_path / "three.parquet"
    df.write_parquet(p)
    out = tmp_path / "fit.json"
    r = runner.invoke(app, ["fit", str(p), "--n-boot", "100", "-q", "--json", str(out)])
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert lines[0].startswith("Verdict: ")
    assert lines[1].startswith("caveat: only 3 sequences to resample (fewer than 30)")
    assert json.loads(out.read_text())["verdict"]["caveat"] == lines[1]
    html, rj = tmp_path / "r.html", tmp_path / "r.json"
    r = runner.invoke(app, ["report", str(p), "--n-boot", "100", "-q", "-o", str(html),
                            "--json", str(rj)])
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines()[-1] == lines[1]
    assert json.loads(rj.read_text())["fit"]["verdict"]["caveat"] == lines[1]
    assert f'<p class="caveat">{lines[1]}</p>' in html.read_text()
    r = runner.invoke(app, ["fit", "--n-boot", "100", "-q", "--json", str(out)])
    assert r.exit_code == 0 and "only 3 sequences" not in r.stdout
    (cav,) = json.loads(out.read_text())["verdict"]["caveats"]
    assert cav.startswith("caveat: the law's bins bend in log-log space")


def test_report_streams_as_documented(tmp_path):
    """report (as the README shows it): notes on stderr; the file written and the verdict on
    stdout, nothing else."""
    r = runner.invoke(app, ["report", "-o", str(tmp_path / "run.html"), "--n-boot", "100"])
    assert r.exit_code == 0, r.output
    assert r.stderr.startswith("no input given: using the bundled sample run")
    assert "valid loss-masked tokens of" in r.stderr
    out = r.stdout.splitlines()
    assert out[0].startswith(f"wrote {tmp_path / 'run.html'} (")
    assert out[1].startswith("law ")
    # then the verdict's caveats, one a line (the bundled run's: its bins bend)
    assert len(out) == 3 and out[2].startswith("caveat: the law's bins bend")


def test_two_outputs_with_one_path_are_refused(tmp_path):
    """Two outputs naming the same file are refused before any work (exit 2)."""
    same = tmp_path / "same.out"
    for args in (["report", "-o", str(same), "--json", str(same)],
                 ["compare", "--export", str(same), "--json", str(same)]):
        r = runner.invoke(app, [*args, "-q"])
        assert r.exit_code == 2 and "name the same file" in r.stderr, args
        assert not same.exists()


@pytest.mark.parametrize("cmd", [["fit"], ["flag", "-o", "noise.parquet"]])
@pytest.mark.parametrize("bad", [["--tau", "0"], ["--tau", "nan"], ["--eps", "-1"]])
def test_fit_and_flag_check_tau_and_eps_before_reading(cmd, bad, tmp_path, monkeypatch):
    """fit and flag refuse a bad --tau / --eps before reading any data (exit 2)."""
    import entr_diag.io

    def no_read(*a, **k):
        raise AssertionError("data read before the parameters were checked")

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(entr_diag.io, "load_dataset", no_read)
    r = runner.invoke(app, [*cmd, *bad, "-q"])
    assert r.exit_code == 2 and "must be" in r.stderr, r.output


def test_positive_logprobs_read_as_nll_probabilities_or_an_offset(synth_file, tmp_path):
    """Positive logprob values: negative log-likelihoods (values above 1, which no
    probability is) are told to be negated, not converted from probabilities; real
    probabilities keep the probability hint; a column shifted up by 0.3 nats is not said
    to leave its thousands of valid tokens as 'probabilities' (they are negative logprobs:
    only those at 0 or above can be probabilities of at most 1e-4). Each excludes most
    tokens as positive_logprob: refused (exit 2), as the tokens left are not a sample."""
    df = pl.read_parquet(synth_file)
    lp = ("train_logprob", "infer_logprob")
    cases = {
        "nll_both": (df.with_columns(-pl.col(*lp)), 2, "Negate the columns"),
        "nll_infer": (df.with_columns(-pl.col("infer_logprob")), 2, "Negate the column."),
        "prob": (df.with_columns(pl.col("infer_logprob").exp()), 2,
                 "may hold probabilities rather than log-probabilities"),
        "shift": (df.with_columns(pl.col("infer_logprob") + 0.3), 2,
                  "may hold probabilities rather than log-probabilities"),
    }
    for name, (d, code, text) in cases.items():
        src = tmp_path / f"{name}.parquet"
        d.write_parquet(src)
        r = runner.invoke(app, ["fit", str(src), "--n-boot", "100", "-q"])
        assert r.exit_code == code, (name, r.output)
        assert text in r.stderr, (name, r.stderr)
        if name.startswith("nll"):
            assert "values above 1" in r.stderr and "may hold probabilities" not in r.stderr
        if name == "prob":  # one column named, not both
            assert "infer_logprob may hold" in r.stderr and "both" not in r.stderr, r.stderr
        if name == "shift":  # the valid tokens left are negative logprobs but a few
            import re

            m = re.search(r"the ([\d,]+) valid tokens? left", r.stderr)
            assert m is None or int(m.group(1).replace(",", "")) < 100, r.stderr
    # probabilities in train_logprob, 30 positive rounding values in infer_logprob: the
    # train column is named, the 30 others counted (helper-31 F1: "both ... may hold")
    d = df.with_columns(pl.col("train_logprob").exp(),
                        pl.when(pl.int_range(pl.len()) < 30).then(1e-3)
                        .otherwise(pl.col("infer_logprob")).alias("infer_logprob"))
    d.write_parquet(src := tmp_path / "prob_few.parquet")
    r = runner.invoke(app, ["fit", str(src), "-q"])
    err = " ".join(r.stderr.split())
    assert r.exit_code == 2 and "train_logprob may hold probabilities" in err, err
    assert "both" not in err and "in 30 of these rows, infer_logprob too" in err, err


def test_a_shift_refusal_after_mostly_excluded_tokens_leads_with_the_exclusions(tmp_path):
    """Shifted columns (train_logprob[t] = infer_logprob[t-1]) in a run whose trainer
    logprobs are NaN in 60% of the sequences: the refusal (exit 2) leads with the
    exclusions, then the shift on the tokens left; it said only that the columns look
    shifted. A trainer column of negative log-likelihoods whose confident tokens were
    clamped to -1e-7 (they pass as logprobs once negated; the shift test on them read a
    shift) is refused for the exclusions alone, with their hint (negate the column)."""
    rng = np.random.default_rng(0)
    n_seq, n_pos = 300, 100
    n = n_seq * n_pos
    h = np.exp(rng.uniform(np.log(1e-4), np.log(4), n))
    infer = -rng.exponential(h)
    seq = np.repeat(np.arange(n_seq), n_pos)
    shifted = np.where(np.arange(n) % n_pos == 0, -0.5, np.roll(infer, 1))
    shifted[seq < 180] = np.nan
    p = tmp_path / "shift.parquet"
    frame = {"seq_id": seq, "position": np.tile(np.arange(n_pos), n_seq),
             "step": seq // 30, "infer_logprob": infer, "entropy": h}
    pl.DataFrame({**frame, "train_logprob": shifted}).write_parquet(p)
    r = runner.invoke(app, ["fit", str(p), "-q"])
    assert r.exit_code == 2, r.output
    err = " ".join(r.stderr.split())
    assert err.startswith(f"error: {p}: 18,000 of the 30,000 loss-masked tokens (60.0%) "
                          "were excluded (non_finite_logprob 18,000): "), err
    assert err.index("were excluded") < err.index("On the 12,000 tokens left") < err.index(
        "look shifted by")
    train = np.minimum(infer + rng.normal(0, np.sqrt(0.02 * h)), -1e-7)
    p = tmp_path / "nll.parquet"
    pl.DataFrame({**frame, "train_logprob": -train}).write_parquet(p)
    r = runner.invoke(app, ["fit", str(p), "-q"])
    assert r.exit_code == 2, r.output
    err = " ".join(r.stderr.split())
    assert re.match(rf"error: {re.escape(str(p))}: [\d,]+ of the 30,000 loss-masked tokens "
                    r"\([\d.]+%\) were excluded \(positive_logprob [\d,]+\): ", err), err
    assert "Negate the column" in err and "shifted" not in err


def test_logprob_columns_of_different_tokens_are_named(synth_file, tmp_path):
    """train_logprob joined from other rows (the rows of the trainer's dump misordered):
    each column still reads as a sampled token's logprob, no unit or other-token signature
    matches, but the two barely correlate within the entropy bins: a warning and a caveat
    say they do not hold the same tokens' logprobs (the run got a verdict with k 10^4 times
    the real one and no word); the intact run: none."""
    df = pl.read_parquet(synth_file).sort("seq_id", "position")
    moved = df["train_logprob"].shift(997, fill_value=-1.0)  # (another sequence's rows)
    src = tmp_path / "moved.parquet"
    df.with_columns(moved.alias("train_logprob")).write_parquet(src)
    out = tmp_path / "f.json"
    r = runner.invoke(app, ["fit", str(src), "--n-boot", "100", "-q", "--json", str(out)])
    assert r.exit_code == 0, r.output
    units = json.loads(out.read_text())["units"]
    assert units["unrelated"] is True and units["within_bin_corr"] < 0.5
    assert units["other_token"] is None and units["likely_mistake"] is None
    assert "warning: train_logprob and infer_logprob barely correlate" in r.stderr
    cav = [c for c in json.loads(out.read_text())["verdict"]["caveats"]
           if "barely correlate" in c]
    assert len(cav) == 1 and "do not hold the logprobs of the same tokens" in cav[0]
    r = runner.invoke(app, ["fit", str(synth_file), "--n-boot", "100", "-q", "--json",
                            str(out)])
    units = json.loads(out.read_text())["units"]
    assert units["unrelated"] is False and units["within_bin_corr"] > 0.9
    assert "barely correlate" not in r.stderr


def test_a_large_share_of_zero_entropy_tokens_is_a_caveat(synth_file, tmp_path):
    """A third of the tokens at H = 0 (one-token top-p nuclei) lie below the law's range:
    a caveat gives their share, count and mean delta^2 (the bins table's first row); the
    synthetic run without them (its few tokens below 1e-6 nats) gets none."""
    from entr_diag.caveats import zero_entropy_caveat

    df = pl.read_parquet(synth_file)
    src = tmp_path / "h0.parquet"
    df.with_columns(pl.when(pl.col("position") % 3 == 0).then(0.0)
                    .otherwise(pl.col("entropy")).alias("entropy")).write_parquet(src)
    out = tmp_path / "f.json"
    r = runner.invoke(app, ["fit", str(src), "--n-boot", "100", "-q", "--json", str(out)])
    assert r.exit_code == 0, r.output
    fd = json.loads(out.read_text())
    first = fd["bins"][0]
    assert first["h_hi"] == 1e-6 and not first["in_fit"]
    total = sum(b["tokens"] for b in fd["bins"])
    (cav,) = [c for c in fd["verdict"]["caveats"] if "below 1e-06 nats" in c]
    assert cav.startswith(f"caveat: {first['tokens'] / total:.1%} of the tokens "
                          f"({first['tokens']:,}) have an entropy below 1e-06 nats")
    assert f"their mean delta^2 is {first['mean_delta2']:.3g}" in cav
    # (a low sampling temperature among the causes: helper-34 F8)
    assert "sharpened further by a low sampling temperature" in cav
    assert cav in " ".join(r.stdout.split())
    r = runner.invoke(app, ["fit", str(synth_file), "--n-boot", "100", "-q", "--json",
                            str(out)])
    assert zero_entropy_caveat(json.loads(out.read_text())) is None


def test_an_input_link_to_nothing_is_named_as_such(tmp_path, monkeypatch):
    """A symbolic link loop or a dangling link as input: the error says which (it said the
    input does not exist, while a link loop as an output was named as one)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "loop_a").symlink_to("loop_b")
    (tmp_path / "loop_b").symlink_to("loop_a")
    (tmp_path / "dangling").symlink_to("nowhere.parquet")
    r = runner.invoke(app, ["fit", "loop_a", "-q"])
    assert r.exit_code == 2 and "error: input loop_a is a symbolic link loop." in r.stderr
    r = runner.invoke(app, ["fit", "dangling", "-q"])
    assert r.exit_code == 2 and ("error: input dangling is a symbolic link to "
                                 "nowhere.parquet, which does not exist.") in r.stderr
    r = runner.invoke(app, ["fit", "nosuch.parquet", "-q"])
    assert r.exit_code == 2 and "error: input nosuch.parquet does not exist." in r.stderr


def test_a_shard_link_to_nothing_in_a_folder_is_refused_or_skipped(tmp_path, synth_file):
    """A Parquet-named link to nothing inside an input folder (a shard on an unmounted
    volume, a link loop) was skipped without a word, the run analysed without its tokens:
    it is now read, so it is refused naming the link and its target, or left out with
    --skip-unreadable and a warning."""
    import shutil

    d = tmp_path / "run"
    d.mkdir()
    shutil.copy(synth_file, d / "part-0.parquet")
    (d / "part-1.parquet").symlink_to("/nonexistent/part-1.parquet")
    (d / "part-2.parquet").symlink_to("part-2.parquet")
    for given in (d, d / "*.parquet"):  # the folder, or a quoted glob
        r = runner.invoke(app, ["fit", str(given), "-q"])
        assert r.exit_code == 2, r.output
        assert (f"error: cannot read {d / 'part-1.parquet'}: it is a symbolic link to "
                "/nonexistent/part-1.parquet, which does not exist.") in r.stderr.replace(
                    "\n", "")
    (d / "part-1.parquet").unlink()
    r = runner.invoke(app, ["fit", str(d), "-q"])
    assert r.exit_code == 2, r.output
    assert f"cannot read {d / 'part-2.parquet'}: it is a symbolic link loop." in r.stderr
    out = tmp_path / "f.json"
    r = runner.invoke(app, ["fit", str(d), "-q", "--skip-unreadable", "--n-boot", "100",
                            "--json", str(out)])
    assert r.exit_code == 0, r.output
    assert "1 input file(s) left out, unreadable as Parquet" in r.stderr.replace("\n", " ")
    [skip] = json.loads(out.read_text())["inputs"]["skipped_unreadable"]
    assert skip["path"] == str(d / "part-2.parquet")
    assert skip["reason"].endswith("it is a symbolic link loop.")


def test_an_input_folder_with_a_folder_it_cannot_list(tmp_path, synth_file, monkeypatch):
    """A folder under the input folder that cannot be listed (another user's, mode 000):
    the refusal names it and says how to go on (it was a bare '[Errno 13] Permission
    denied: ...'); an entry that cannot be examined and is no Parquet name (a link into a
    folder this user may not enter) is passed over, as any non-Parquet entry."""
    import os
    import shutil

    import entr_diag.io.load as L

    d = tmp_path / "run"
    (d / "locked").mkdir(parents=True)
    shutil.copy(synth_file, d / "part-0.parquet")
    walk = os.walk

    def walk_denied(top, onerror=None, **kw):
        for root, dirs, files in walk(top, onerror=onerror, **kw):
            if "locked" in dirs and onerror is not None:
                dirs.remove("locked")
                onerror(PermissionError(13, "Permission denied", os.path.join(root, "locked")))
            yield root, dirs, files

    monkeypatch.setattr(L.os, "walk", walk_denied)
    r = runner.invoke(app, ["fit", str(d), "-q"])
    assert r.exit_code == 2, r.output
    assert (f"error: cannot search the input folder {d}: its folder {d / 'locked'} cannot be "
            "listed (Permission denied)") in r.stderr.replace("\n", "")
    assert f"'{d / '*.parquet'}'" in r.stderr.replace("\n", "")
    monkeypatch.setattr(L.os, "walk", walk)
    (d / "locked").rmdir()
    is_file = Path.is_file

    def denied(self):
        if self.name == "other":
            raise PermissionError(13, "Permission denied", str(self))
        return is_file(self)

    (d / "other").write_text("x")
    monkeypatch.setattr(Path, "is_file", denied)
    r = runner.invoke(app, ["fit", str(d), "-q", "--n-boot", "100"])
    assert r.exit_code == 0, r.output


def test_a_file_named_like_an_option_gets_a_hint(tmp_path, monkeypatch):
    """'-dash.parquet' reads as option -d: the error says how to name such a file; an
    unknown option that is no file name gets no hint."""
    monkeypatch.chdir(tmp_path)
    r = runner.invoke(app, ["fit", "-dash.parquet", "-q"])
    assert r.exit_code == 2
    assert ("A file named '-dash.parquet'? Put -- before the file names (entr-diag ... -- "
            "-dash.parquet) or write it as ./-dash.parquet.") in r.stderr, r.stderr
    r = runner.invoke(app, ["fit", "--bogus", "-q"])
    assert r.exit_code == 2 and "no such option: --bogus" in r.stderr
    assert "A file named" not in r.stderr


@pytest.mark.parametrize("cmd", ["fit", "compare", "report", "flag"])
@pytest.mark.parametrize("opt,text", [("--tau", "1e400"), ("--eps", "-1e999")])
def test_a_float_option_too_large_for_a_float_is_named_as_typed(cmd, opt, text, tmp_path,
                                                               monkeypatch):
    """--tau 1e400 is refused as too large for a float, echoing 1e400 (it read as inf and
    was refused as "--tau inf"); an inf written as such is refused as not finite."""
    monkeypatch.chdir(tmp_path)
    r = runner.invoke(app, [cmd, opt, text, "-q"])
    assert r.exit_code == 2, r.output
    assert f"error: {opt} {text}: too large for a float" in r.stderr, r.stderr
    r = runner.invoke(app, [cmd, opt, "inf", "-q"])
    assert r.exit_code == 2 and f"{opt} inf: " in r.stderr and "finite" in r.stderr, r.stderr


def test_inspect_all_masked_allows_nothing(tmp_path):
    """With no valid loss-masked token, inspect lists every analysis as unavailable (as fit
    then refuses it) and prints no 'None' step range."""
    p = _file(tmp_path, response_mask=[0, 0, 0, 0])
    r = runner.invoke(app, ["inspect", str(p), "-q", "--json", str(tmp_path / "i.json")])
    assert r.exit_code == 0, r.output
    assert "None" not in r.stdout
    caps = json.loads((tmp_path / "i.json").read_text())["inputs"]["capabilities"]
    assert caps and all(v == "no valid loss-masked token" for v in caps.values())


@pytest.mark.parametrize("command", ["fit", "compare", "report"])
def test_bootstrap_too_large_refused_before_reading(tmp_path, command):
    """--bins 500 with --n-boot 100000 would hold 0.8 GB bootstrap matrices (and take
    hours): refused with exit 2 naming the largest n_boot at those bins, before reading."""
    args = [command, "--bins", "500", "--n-boot", "100000"]
    if command == "report":
        args += ["-o", str(tmp_path / "r.html")]
    r = runner.invoke(app, args)
    assert r.exit_code == 2
    assert "n_boot = 20000 at 500 bins" in r.stderr
    assert "valid loss-masked tokens" not in r.stderr  # nothing was read
    from entr_diag.errors import ParameterError
    from entr_diag.fit import check_fit_parameters

    check_fit_parameters(0.01, 4.0, 20_000, 500)  # the largest allowed passes the check
    with pytest.raises(ParameterError):
        check_fit_parameters(0.01, 4.0, 20_001, 500)


@pytest.mark.parametrize("quiet", [False, True])
def test_synth_stdout_is_the_ground_truth_json(tmp_path, quiet):
    """synth's stdout is its ground-truth JSON only (the 'wrote' line goes to stderr, and not
    at all with --quiet): `entr-diag synth ... | jq` works."""
    out = tmp_path / "s.parquet"
    r = runner.invoke(app, ["synth", "-o", str(out), "--tokens", "3000",
                            *(["--quiet"] if quiet else [])])
    assert r.exit_code == 0, r.output
    truth = json.loads(r.stdout)
    assert truth["tokens"] == 3000 and out.exists()
    assert ("wrote" in r.stderr) is (not quiet)


def test_negative_staleness_is_warned(tmp_path):
    """policy_version > train_version (versions swapped) is named in a warning with the
    token count; consistent versions give no such warning."""
    p = _file(tmp_path, policy_version=[3, 3, 1, 1], train_version=[1, 1, 1, 1])
    r = runner.invoke(app, ["inspect", str(p)])
    assert r.exit_code == 0, r.output
    assert "2 valid token(s) have policy_version > train_version" in r.stderr
    ok = _file(tmp_path, "ok.parquet", policy_version=[1, 1, 1, 1], train_version=[3, 3, 1, 1])
    r = runner.invoke(app, ["inspect", str(ok)])
    assert r.exit_code == 0 and "policy_version > train_version" not in r.stderr


def test_progress_bar_ends_before_results_are_printed(monkeypatch, tmp_path):
    """On a terminal the (transient) bar is stopped before the first result line goes to
    stdout: no frame of it is left glued to the tables."""
    import io

    from rich.console import Console

    import entr_diag.cli as cli

    events: list[str] = []
    real_end, real_print = cli._Phases.end, Console.print

    def end(self):
        if self.bar is not None:
            events.append("bar stopped")
        real_end(self)

    def console_print(self, *a, **k):
        if isinstance(self, cli._Stdout):
            events.append("result printed")
        real_print(self, *a, **k)

    monkeypatch.setattr(cli, "stderr", Console(file=io.StringIO(), force_terminal=True))
    monkeypatch.setattr(cli._Phases, "end", end)
    monkeypatch.setattr(Console, "print", console_print)
    r = CliRunner().invoke(app, ["fit", "--json", str(tmp_path / "f.json")])
    assert r.exit_code == 0, r.output
    assert "result printed" in events
    assert events.index("bar stopped") < events.index("result printed")


def test_gate_options_that_conflict_are_noted_or_refused(tmp_path):
    """An ENTR --gate whose tau differs from --tau is noted (--tau still defines the noise
    tokens); a repeated gate is compared once, with a note; two ENTR gates are refused."""
    js = tmp_path / "c.json"
    r = runner.invoke(app, ["compare", "--tau", "2", "--gate", "entr:tau=8,eps=0.1",
                            "--gate", "fixed:c=0.5", "--gate", "fixed:c=0.5", "--json", str(js)])
    assert r.exit_code == 0, r.output
    assert "note: the ENTR gate runs as --gate entr:tau=8,eps=0.1; --tau 2" in r.stderr
    assert "1 --gate spec(s) repeat an earlier one" in r.stderr
    specs = [g["spec"] for g in json.loads(js.read_text())["compare"]["gates"]]
    assert specs.count("fixed:c=0.5") == 1, specs
    r = runner.invoke(app, ["compare", "--gate", "entr:tau=8", "--gate", "entr:tau=2", "-q"])
    assert r.exit_code == 2 and "2 ENTR gates" in r.stderr
    # a bare 'entr', or one leaving eps out, takes --tau / --eps (it ran at tau 4, eps 0.01
    # beside --tau 2: helper-32 F4); no note then
    for spec, want in (("entr", "entr:tau=2,eps=0.05"), ("estr:tau=3", "entr:tau=3,eps=0.05")):
        r = runner.invoke(app, ["compare", "--tau", "2", "--eps", "0.05", "--gate", spec,
                                "--gate", "fixed", "--json", str(js)])
        assert r.exit_code == 0, r.output
        specs = [g["spec"] for g in json.loads(js.read_text())["compare"]["gates"]]
        assert want in specs, specs
        assert ("the ENTR gate runs as" in r.stderr) == (spec != "entr"), r.stderr


def test_a_repeated_sweep_is_refused():
    """Two --sweep tau=... would keep only the last one: refused, exit 2."""
    r = runner.invoke(app, ["compare", "--sweep", "tau=1:4:3", "--sweep", "tau=2:8:3", "-q"])
    assert r.exit_code == 2 and "a tau sweep is already given" in r.stderr


def test_every_command_records_the_input_options_in_its_parameters(tmp_path):
    """fit, compare and report JSON parameters all name layout, entropy and framework."""
    for cmd in (["fit"], ["compare"], ["report", "-o", str(tmp_path / "r.html")]):
        js = tmp_path / f"{cmd[0]}.json"
        r = runner.invoke(app, [*cmd, "--json", str(js), "-q"])
        assert r.exit_code == 0, r.output
        params = json.loads(js.read_text())["parameters"]
        assert {"layout", "entropy", "framework"} <= set(params), (cmd[0], params)


@pytest.mark.parametrize("args,start", [(["--noise-share", "2"], "error: --noise-share must"),
                                        (["--k", "0"], "error: --k must"),
                                        (["--h-star", "10"], "error: --h-star must"),
                                        (["--h-star", "-1"], "error: --h-star must be a "
                                         "finite number of nats >= 0 (0: no noise regime)")])
def test_synth_errors_name_the_options(tmp_path, args, start):
    """synth's refusals speak of its options (--noise-share), not the spec's fields (nor of
    Python's None)."""
    r = runner.invoke(app, ["synth", "-o", str(tmp_path / "x.parquet"), *args, "-q"])
    assert r.exit_code == 2 and r.stderr.startswith(start), r.stderr
    assert "SynthSpec" not in r.stderr and "None" not in r.stderr


@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_subnormal_entropies_raise_no_numpy_warning(synth_file, tmp_path):
    """Float64 entropies of 5e-324 (subnormal) in every 300th token: fit runs without a raw
    numpy RuntimeWarning (the units check divided by their bin's subnormal sum of H)."""
    df = pl.read_parquet(synth_file).with_columns(
        pl.when(pl.int_range(pl.len()) % 300 == 2).then(5e-324).otherwise(pl.col("entropy"))
        .alias("entropy"))
    f = tmp_path / "sub.parquet"
    df.write_parquet(f)
    r = runner.invoke(app, ["fit", str(f), "-q"])
    assert r.exit_code == 0 and r.exception is None, (r.exception, r.stderr)
    assert "Warning" not in r.stderr
    # entropies of exactly 0 with --eps 0: z^2 = delta^2 / 0, no raw warning either
    z = tmp_path / "zero.parquet"
    df.with_columns(pl.when(pl.int_range(pl.len()) % 20 == 0).then(0.0)
                    .otherwise(pl.col("entropy")).alias("entropy")).write_parquet(z)
    r = runner.invoke(app, ["fit", str(z), "--eps", "0", "-q"])
    assert r.exit_code == 0 and r.exception is None, (r.exception, r.stderr)


def test_synth_refuses_a_run_that_cannot_fit_on_the_disk(tmp_path, monkeypatch):
    """--tokens beyond the output file system's free space (at 20 bytes per token, below
    what synth writes) is refused before writing, naming the need and the free space; a
    run that fits is written."""
    import shutil
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(10**9, 0, 1_000_000))
    out = tmp_path / "x.parquet"
    r = runner.invoke(app, ["synth", "-o", str(out), "--tokens", "60000", "-q"])
    assert r.exit_code == 2, r.output
    assert r.stderr == (f"error: --tokens 60,000 needs at least 1.2 MB of disk, and {tmp_path} "
                        "has 1 MB free; ask for fewer tokens (about 50,000 at most).\n")
    assert list(tmp_path.iterdir()) == []
    r = runner.invoke(app, ["synth", "-o", str(out), "--tokens", "30000", "-q"])
    assert r.exit_code == 0 and out.exists(), r.output


def test_an_output_folder_refusing_new_files_is_named(tmp_path, monkeypatch):
    """When no file can be made beside the output (a read-only folder, /proc), the error
    says so, naming the folder and the reason (it read 'No such file or directory' for
    -o /proc/version)."""
    import tempfile

    def refuse(*a, **k):
        raise FileNotFoundError(2, "No such file or directory")

    monkeypatch.setattr(tempfile, "TemporaryFile", refuse)
    out = tmp_path / "r.html"
    r = runner.invoke(app, ["report", "-o", str(out), "-q"])
    assert r.exit_code == 2, r.output
    assert r.stderr == (f"error: cannot write --output {out}: no new file can be made in "
                        f"{tmp_path} (No such file or directory).\n")


def test_an_output_name_too_long_for_the_file_system_is_named(tmp_path):
    """A file name longer than the file system allows: one error line naming the output,
    not a raw [Errno 36]."""
    out = tmp_path / ("a" * 300 + ".json")
    r = runner.invoke(app, ["fit", "--json", str(out), "-q"])
    assert r.exit_code == 2 and r.stderr.startswith(f"error: cannot write --json {out}: ")
    assert "Errno" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_duplicate_warning_names_partition_folders_outside_the_sequence_key(synth_file, tmp_path):
    """Per-rank folders (rank=0/, rank=1/) whose seq_ids restart in each folder merge their
    sequences (the key is (step, seq_id)): the duplicate warning says which partition key is
    not in the sequence key and what to do; without partition folders it does not."""
    df = pl.read_parquet(synth_file)
    for r in (0, 1):
        (tmp_path / f"rank={r}").mkdir()
        df.with_columns(pl.col("train_logprob") * (1 + r / 100)).write_parquet(
            tmp_path / f"rank={r}" / "part.parquet")
    r = runner.invoke(app, ["inspect", str(tmp_path)])
    msg = re.sub(r"\s+", " ", r.stderr)
    assert r.exit_code == 0 and "hold more tokens than positions" in msg
    assert "partitioned by rank, which is not part of the sequence key (step, seq_id)" in msg
    (tmp_path / "flat").mkdir()
    for i in (0, 1):
        df.with_columns(pl.col("train_logprob") * (1 + i / 100)).write_parquet(
            tmp_path / "flat" / f"p{i}.parquet")
    r = runner.invoke(app, ["inspect", str(tmp_path / "flat")])
    msg = re.sub(r"\s+", " ", r.stderr)
    assert "hold more tokens than positions" in msg and "partitioned by" not in msg
    # without a position column the rows are numbered on across the folders (no duplicate
    # positions): the warning comes with the numbering note
    for r_ in (0, 1):
        p = tmp_path / f"rank={r_}" / "part.parquet"
        pl.read_parquet(p).drop("position").write_parquet(p)
    r = runner.invoke(app, ["inspect", str(tmp_path), "--layout", "long"])
    msg = re.sub(r"\s+", " ", r.stderr)
    assert r.exit_code == 0 and "warning: " in msg and "continue from one file" in msg
    assert "partitioned by rank, which is not part of the sequence key" in msg


def test_integer_logprob_columns_put_a_caveat_beside_the_verdict(synth_file, tmp_path):
    """Rounded (integer-typed) logprobs: besides the loader's warning, the verdict carries a
    caveat (terminal, JSON verdict.caveat) - a reader of the JSON alone sees it."""
    p = tmp_path / "int.parquet"
    pl.read_parquet(synth_file).with_columns(
        pl.col("train_logprob", "infer_logprob").round(0).cast(pl.Int32)).write_parquet(p)
    js = tmp_path / "f.json"
    r = runner.invoke(app, ["fit", str(p), "--n-boot", "100", "--json", str(js)])
    assert r.exit_code == 0, r.output
    cav = json.loads(js.read_text())["verdict"]["caveat"]
    assert "train_logprob and infer_logprob hold integers" \
        in cav and "meaningless" in cav
    assert "hold integers" in re.sub(r"\s+", " ", r.stdout)
    # the integers come first, on stderr and among the caveats: the -1.0 padding and
    # zero-placeholder readings of the rounded values follow them (helper-28 F2)
    warns = [w for w in re.sub(r"\s+", " ", r.stderr).split("warning: ")[1:]]
    assert len(warns) > 2 and all("holds integers" in w for w in warns[:2]), warns
    assert json.loads(js.read_text())["verdict"]["caveats"][0].startswith(
        "caveat: train_logprob and infer_logprob hold integers")
    # one caveat for them: not also "stored rounded" (to 1 nat)
    assert "stored rounded" not in cav and "stored rounded" not in r.stderr
    # the verdict itself leads with it (it read "law holds", the caveat "meaningless")
    v = json.loads(js.read_text())["verdict"]
    assert v["assessable"] is False
    assert v["text"].startswith("not assessable (train_logprob and infer_logprob hold "
                                "integers: see the caveat); as computed: law ")
    assert f"Verdict: {v['text']}" in re.sub(r"\s+", " ", r.stdout)
    # floats rounded to 0.1 nats: the same; to 0.01 (next test) the verdict stands
    pl.read_parquet(synth_file).with_columns(
        pl.col("train_logprob", "infer_logprob").round(1)).write_parquet(p)
    r = runner.invoke(app, ["report", str(p), "--n-boot", "100", "--json", str(js),
                            "-o", str(tmp_path / "r.html")])
    assert r.exit_code == 0, r.output
    v = json.loads(js.read_text())["fit"]["verdict"]
    assert v["assessable"] is False and v["text"].startswith(
        "not assessable (logprobs stored rounded to 0.1 nats (train_logprob and "
        "infer_logprob): see the caveat)"), v["text"]
    assert "not assessable (logprobs stored rounded" in (tmp_path / "r.html").read_text()


def test_most_entropies_invalid_make_the_verdict_not_assessable(synth_file, tmp_path):
    """An entropy column scaled by 1e6 leaves in range (<= 20 nats) only the tokens near 0:
    99% excluded as invalid_entropy (here 95%, out of range at random), and a verdict read
    from the rest (helper-42: 'alpha =
    2.07, k = 4.32e-18' at exit 0) is not assessable, saying why; a few invalid entropies
    leave it assessable."""
    p = tmp_path / "big.parquet"
    df = pl.read_parquet(synth_file)
    df.with_columns(pl.when(pl.int_range(pl.len()) % 20 != 0).then(pl.col("entropy") * 1e9)
                    .otherwise(pl.col("entropy")).alias("entropy")).write_parquet(p)
    js = tmp_path / "f.json"
    r = runner.invoke(app, ["fit", str(p), "--n-boot", "100", "--json", str(js), "-q"])
    assert r.exit_code == 0, r.output
    v = json.loads(js.read_text())["verdict"]
    assert v["assessable"] is False and v["text"].startswith("not assessable (")
    assert "of the loss-masked tokens have an entropy out of range (invalid_entropy" in v["text"]
    # NaN entropies on most tokens, missing at random: the rest is a sample of the run
    # (helper-45: entropy NaN on odd steps was not assessable, alpha 0.97 against 0.99)
    nan = tmp_path / "nan.parquet"
    df.with_columns(pl.when(pl.int_range(pl.len()) % 20 != 0).then(float("nan"))
                    .otherwise(pl.col("entropy")).alias("entropy")).write_parquet(nan)
    r = runner.invoke(app, ["fit", str(nan), "--n-boot", "100", "--json", str(js), "-q"])
    assert r.exit_code == 0, r.output
    assert json.loads(js.read_text())["verdict"]["assessable"] is True
    few = tmp_path / "few.parquet"
    df.with_columns(pl.when(pl.int_range(pl.len()) % 50 == 0).then(-1.0)
                    .otherwise(pl.col("entropy")).alias("entropy")).write_parquet(few)
    r = runner.invoke(app, ["fit", str(few), "--n-boot", "100", "--json", str(js), "-q"])
    doc = json.loads(js.read_text())
    assert r.exit_code == 0 and doc["inputs"]["accounting"]["exclusions"]["invalid_entropy"] > 0
    assert doc["verdict"]["assessable"] is True


@pytest.mark.parametrize("factor", [10.0, 1000.0])
def test_an_entropy_scaled_by_a_constant_is_named_with_its_factor(tmp_path, factor):
    """The bundled run's entropy x10 or x1000 (a sum over ranks, a logging scale). Over
    the rows it puts above 20 nats, the sampled tokens' mean surprisal is 1/c of their
    mean 'entropy' (E[-log mu(y) | H] = H): the exclusion warning names the factor, and
    x1000 (86% excluded) voids the verdict saying so. x1000 had read 'the entropy column
    does not follow the tokens' (per-sequence means, shuffled rows): the alignment test
    read only the near-zero entropies left in range (helper-45, helper-46); x10 had got
    the temperature-or-truncation story of an entropy mismatch."""
    LONG = Path(__file__).resolve().parents[1] / "entr_diag" / "sample_data" / \
        "sample_run_long.parquet"
    p = tmp_path / "scaled.parquet"
    pl.read_parquet(LONG).with_columns(pl.col("entropy") * factor).write_parquet(p)
    js = tmp_path / "f.json"
    r = runner.invoke(app, ["fit", str(p), "--n-boot", "100", "--json", str(js)])
    assert r.exit_code == 0, r.output
    doc = json.loads(js.read_text())
    err = re.sub(r"\s+", " ", r.stderr)
    m = re.search(r"entropy looks multiplied by about ([\d,.]+): on the ", err)
    assert m and float(m[1].replace(",", "")) == pytest.approx(factor, rel=0.02), err
    said = m[1]
    ar = doc["inputs"]["accounting"]["exclusions_where"]["invalid_entropy"]["above_range"]
    assert ar["mean_entropy"] / ar["mean_surprisal"] == pytest.approx(factor, rel=0.02)
    assert "do not describe one sampling distribution" not in err
    assert "does not follow the tokens" not in err
    assert doc["entropy_alignment"]["status"] != "unrelated"
    v = doc["verdict"]
    if factor == 1000:
        assert v["assessable"] is False and (
            f"; the column looks multiplied by about {said}: see the caveat" in v["text"])
        # the entropy bins hold only true entropies below 0.02 nats, where bf16 rounding
        # biases delta negative: no truncated-sampling story (it had read a warning)
        tr = doc["forensics"]["checks"]["truncated_sampling"]
        assert tr["status"] == "cannot_tell" and "out of range" in tr["reason"], tr
        assert "truncated_sampling" not in v["caveat"]
    else:  # 20% out of range: the scale cut the top of the entropy range off (helper-48:
        # x8 turned "does not hold" into "holds approximately"); the bins name it too
        assert v["assessable"] is False and v["text"].startswith(
            f"not assessable (the entropy column looks multiplied by about {said}, which "
            "puts 20.3% of the loss-masked tokens above 20 nats (invalid_entropy): the law "
            "would rest on the rest, the top of the entropy range cut off: see the caveat)")
        assert doc["units"]["entropy_scale"] == pytest.approx(10, rel=0.03)
        assert "warning: entropy looks multiplied by about 10.1: the sampled tokens' " \
            "surprisal" in err


def test_values_above_range_that_are_no_scaled_entropy_name_no_factor(tmp_path):
    """An entropy column holding values above 20 nats that do not follow the surprisal
    (e.g. logits, here uniform noise in 20..60) names no scale factor."""
    LONG = Path(__file__).resolve().parents[1] / "entr_diag" / "sample_data" / \
        "sample_run_long.parquet"
    p = tmp_path / "noise.parquet"
    df = pl.read_parquet(LONG)
    noise = np.random.default_rng(0).uniform(20, 60, df.height)
    df.with_columns(pl.Series("entropy", noise, dtype=pl.Float32)).write_parquet(p)
    r = runner.invoke(app, ["inspect", str(p)])
    assert r.exit_code in (0, 2), r.output
    assert "looks multiplied by" not in r.output


def test_rounded_float_logprobs_put_a_caveat_beside_the_verdict(synth_file, tmp_path):
    """Logprobs stored as floats rounded to 0.01 nats: a warning, a verdict caveat naming
    the columns and the step, and rounded_logprobs in the JSON of fit, compare and report;
    none on the full-precision file."""
    p = tmp_path / "r2.parquet"
    pl.read_parquet(synth_file).with_columns(
        pl.col("infer_logprob").round(2)).write_parquet(p)
    for cmd in ("fit", "compare", "report"):
        js = tmp_path / f"{cmd}.json"
        extra = ["-o", str(tmp_path / "r.html")] if cmd == "report" else []
        r = runner.invoke(app, [cmd, str(p), "--n-boot", "100", "--json", str(js), *extra])
        assert r.exit_code == 0, r.output
        doc = json.loads(js.read_text())
        fd = doc if cmd == "fit" else doc["fit"]
        assert fd["rounded_logprobs"] == {"infer_logprob": 0.01}, cmd
        assert fd["verdict"]["assessable"] is True
        assert not fd["verdict"]["text"].startswith("not assessable")
        assert ("the logprobs are stored rounded (infer_logprob to 0.01 "
                "nats)") in fd["verdict"]["caveat"]
        err = re.sub(r"\s+", " ", r.stderr)
        assert "warning: the logprobs are stored rounded" in err
        # engine logprobs rounded to 0.0: the rounding explains them, not truncated sampling
        assert ("engine zero(s) kept as valid tokens, which would otherwise read as one-token "
                "nuclei of top-p / top-k sampling, are probably such logprobs rounded to 0") in err
        assert "the engine renormalised the kept token" not in err, cmd
    js = tmp_path / "clean.json"
    r = runner.invoke(app, ["fit", str(synth_file), "--n-boot", "100", "--json", str(js)])
    doc = json.loads(js.read_text())
    assert doc["rounded_logprobs"] is None and "stored rounded" not in r.output


def test_entropy_missing_in_one_shard_names_the_shard(tmp_path):
    """A shard written without entropy values (NaN): invalid_entropy names it, and no
    logprob column."""
    d = _shards(tmp_path, 2, {1: {"entropy": pl.lit(float("nan"))}})
    r = runner.invoke(app, ["fit", str(d)])
    msg = re.sub(r"\s+", " ", r.stderr)
    assert "invalid_entropy" in msg and "--entropy train" in msg
    assert (f"(the values: 400 null or NaN; these rows are all in {d / 'part-1.parquet'}, "
            "1 of the 2 input files)") in msg, msg
    assert "the values are in" not in msg


def test_plus_one_sentinels_are_not_called_probabilities_left(tmp_path):
    """A shard whose loss-masked trainer logprobs are mostly +1.0 sentinels: excluded as
    positive_logprob and located, but its other tokens are not claimed to be probabilities
    (a constant +1.0 is a placeholder, not a probability)."""
    mostly = pl.int_range(pl.len()) % 10 != 0
    d = _shards(tmp_path, 2, {1: {"train_logprob": pl.when(mostly).then(1.0)
                                  .otherwise(pl.col("train_logprob"))}})
    j = tmp_path / "fit.json"
    r = runner.invoke(app, ["fit", str(d), "--json", str(j), "-q"])
    msg = re.sub(r"\s+", " ", r.stderr)
    assert f"these rows are all in {d / 'part-1.parquet'}" in msg, msg
    assert "probably probabilities too" not in msg
    where = json.loads(j.read_text())["inputs"]["accounting"]["exclusions_where"]
    assert where["positive_logprob"]["valid_left"] == {}


def test_a_weight_column_as_the_mask_in_one_shard_gets_its_hint(tmp_path):
    """A loss weight (0.5) as the mask in one shard of four excludes a quarter of the
    tokens as invalid_loss_mask: the warning says what it means and names the shard (was
    the accounting line only: the hint needed more than half)."""
    d = _shards(tmp_path, 4, {1: {"loss_mask": pl.lit(0.5)}})
    for i in (0, 2, 3):  # the same column type in every shard
        f = d / f"part-{i}.parquet"
        pl.read_parquet(f).with_columns(pl.col("loss_mask").cast(pl.Float64)).write_parquet(f)
    r = runner.invoke(app, ["fit", str(d), "-q"])
    msg = re.sub(r"\s+", " ", r.stderr)
    assert "are invalid_loss_mask: the mask column holds weights or labels" in msg, msg
    assert f"these rows are all in {d / 'part-1.parquet'}, 1 of the 4 input files" in msg


def test_a_mistyped_command_ends_its_suggestion_once():
    r = runner.invoke(app, ["fitt"])
    assert r.exit_code == 2 and "Did you mean 'fit'? See" in r.stderr


def _split(src: Path, d: Path, n: int, change: dict[int, dict]) -> Path:
    """``src`` cut into ``n`` shards by step (whole sequences), shard i changed by
    ``change[i]`` (column -> expression)."""
    df = pl.read_parquet(src)
    steps = sorted(df["step"].unique().to_list())
    d.mkdir()
    for i in range(n):
        part = df.filter(pl.col("step").is_in(steps[i::n]))
        if i in change:
            part = part.with_columns(**change[i])
        part.write_parquet(d / f"part-{i}.parquet")
    return d


def _on_rows(col: str, value: float, rows) -> dict:
    """A ``_split`` change setting ``col`` to ``value`` on the rows whose index ``i`` (in
    the shard) satisfies ``rows(i)``, a polars expression of ``i``."""
    return {col: pl.when(rows(pl.int_range(pl.len()))).then(value).otherwise(pl.col(col))}


def _run_json(cmd: str, path, js: Path, *extra: str):
    """``cmd`` on ``path`` with --n-boot 100 --json ``js`` -q: (result, the JSON)."""
    r = runner.invoke(app, [cmd, str(path), "--n-boot", "100", "--json", str(js), "-q",
                            *extra])
    return r, (json.loads(js.read_text()) if js.exists() else None)


@pytest.fixture(scope="module")
def synth_big(tmp_path_factory) -> Path:
    """A run of 100k tokens: four shards of 25k, above the per-file units check's minimum."""
    from entr_diag.synth import SynthSpec, write_synth

    p = tmp_path_factory.mktemp("synth_big") / "run.parquet"
    write_synth(p, SynthSpec(n_tokens=100_000, seed=3, noise_share=0.1))
    return p


@pytest.mark.parametrize("col,expr,unit", [
    ("entropy", pl.col("entropy") / math.log(2), "bits (log base 2)"),
    ("infer_logprob", pl.col("infer_logprob") / math.log(10), "log10 values"),
])
def test_a_unit_mistake_in_one_shard_names_the_shard(synth_big, tmp_path, col, expr, unit):
    """One shard of four in another unit (entropy in bits, the engine's logprobs in log10):
    the pooled units check stays near 1, the per-file one names the shard, the column and
    the unit (warning, verdict caveat, JSON units_by_file); every shard in it: the pooled
    check says it, the per-file one nothing more."""
    d = _split(synth_big, tmp_path / "one", 4, {1: {col: expr}})
    js = tmp_path / "f.json"
    r = runner.invoke(app, ["fit", str(d), "--n-boot", "100", "--json", str(js), "-q"])
    assert r.exit_code == 0, r.output
    msg = re.sub(r"\s+", " ", r.stderr)
    assert (f"warning: 1 of the 4 input files looks written in another unit than the others: "
            f"in {d / 'part-1.parquet'} (") in msg, msg
    assert f"{col} probably holds {unit}, not nats" in msg
    doc = json.loads(js.read_text())
    (only,) = doc["units_by_file"]
    assert only["file"] == str(d / "part-1.parquet") and only["likely_mistake"]
    assert doc["units"]["likely_mistake"] is None
    assert "looks written in another unit" in doc["verdict"]["caveat"]
    # one shard of two: the pooled check's gap is the mix, which it read as a temperature or
    # top-p (entropy in bits) or as train_logprob in log2 (infer_logprob in log10): was a
    # second warning, contradicting the per-file one, which now says it alone
    half = _split(synth_big, tmp_path / "half", 2, {1: {col: expr}})
    r = runner.invoke(app, ["fit", str(half), "--n-boot", "100", "--json", str(js), "-q"])
    doc = json.loads(js.read_text())
    assert doc["units"]["entropy_mismatch"] or doc["units"]["likely_mistake"], doc["units"]
    (only,) = doc["units_by_file"]
    assert only["file"] == str(half / "part-1.parquet")
    assert r.stderr.count("warning:") == 1, r.stderr
    assert f"{col} probably holds {unit}, not nats" in re.sub(r"\s+", " ", r.stderr)
    caveat = doc["verdict"]["caveat"]
    assert caveat.count("probably holds") == 1 and "another unit than the others" in caveat
    assert "do not describe one sampling distribution" not in caveat
    every = _split(synth_big, tmp_path / "all", 4, {i: {col: expr} for i in range(4)})
    r = runner.invoke(app, ["fit", str(every), "--n-boot", "100", "--json", str(js), "-q"])
    doc = json.loads(js.read_text())
    assert doc["units"]["likely_mistake"] and doc["units_by_file"] is None
    assert "another unit than the others" not in r.stderr


def test_an_entropy_mismatch_in_one_shard_names_the_shard(synth_big, tmp_path):
    """One shard of four (30k tokens) whose entropy is of a flatter distribution (here a
    temperature of 0.5 left out: 1 + 0.25 H times the sampling one, bending with H; read
    per bin 0.37 to 0.9), or 1.8 times it at every entropy (a constant scale): the pooled
    check reads near 1 and said nothing (helper-34 F1); the per-file check names the shard
    and what its entropy is."""
    for name, expr, what, key in (
            ("bent", pl.col("entropy") * (1 + 0.25 * pl.col("entropy")),
             "to hold an entropy of another distribution than the one that sampled",
             "entropy_mismatch"),
            ("scaled", pl.col("entropy") * 1.8, "to hold an entropy scaled by a constant",
             "entropy_scale")):
        d = _split(synth_big, tmp_path / name, 4, {0: {"entropy": expr}})
        js = tmp_path / "f.json"
        r = runner.invoke(app, ["fit", str(d), "--n-boot", "100", "--json", str(js), "-q"])
        assert r.exit_code == 0, r.output
        msg = re.sub(r"\s+", " ", r.stderr)
        assert (f"warning: 1 of the 4 input files looks {what}, unlike the others: in "
                f"{d / 'part-0.parquet'} (") in msg, (name, msg)
        doc = json.loads(js.read_text())
        assert not doc["units"]["entropy_mismatch"] and not doc["units"]["entropy_scale"]
        (only,) = doc["units_by_file"]
        assert only["file"] == str(d / "part-0.parquet") and only[key], only
    assert only["entropy_scale"] == pytest.approx(1.8, rel=0.05)


def test_shards_in_one_unit_get_no_per_file_warning(synth_big, synth_file, tmp_path):
    """No per-file warning on shards in one unit; none on shards below the per-file
    minimum of tokens (their ratios scatter), even with one in bits."""
    d = _split(synth_big, tmp_path / "ok", 4, {})
    js = tmp_path / "f.json"
    r = runner.invoke(app, ["fit", str(d), "--n-boot", "100", "--json", str(js), "-q"])
    assert r.exit_code == 0 and "another unit" not in r.output
    assert json.loads(js.read_text())["units_by_file"] is None
    small = _split(synth_file, tmp_path / "small", 4,
                   {1: {"entropy": pl.col("entropy") / math.log(2)}})  # 10k tokens each
    r = runner.invoke(app, ["fit", str(small), "--n-boot", "100", "--json", str(js), "-q"])
    assert r.exit_code == 0 and "another unit" not in r.output


@pytest.mark.parametrize("args,start", [
    (["--tau", "0"], "error: --tau 0: tau must be a finite number > 0"),
    (["--eps", "-1"], "error: --eps -1: eps must be a finite number >= 0"),
    (["--tau", "nan"], "error: --tau nan: tau must be a finite number > 0"),
])
def test_a_bad_fit_parameter_names_its_option(args, start):
    """The fit parameters checked after parsing name their option in the refusal, as any
    other bad option value does (was 'tau must be ...' alone; compare and report said
    '--tau 0.0 --eps 0.01: ...', naming both)."""
    for cmd in ("fit", "flag", "compare", "report"):
        r = runner.invoke(app, [cmd, *args])
        assert r.exit_code == 2 and r.stderr.startswith(start), (cmd, r.stderr)
        assert r.stderr.count("\n") == 1, r.stderr  # one line


def test_rounded_logprobs_in_one_shard_name_the_shard(synth_file, tmp_path):
    """Logprobs rounded to 0.01 in one shard of four: the pooled sample is not 90% on the
    grid, the shard's own is: the warning, the caveat and rounded_logprobs name it; every
    shard rounded: the pooled check, not the per-file one."""
    two = {c: pl.col(c).round(2) for c in ("train_logprob", "infer_logprob")}
    d = _split(synth_file, tmp_path / "one", 4, {2: two})
    js = tmp_path / "f.json"
    r = runner.invoke(app, ["fit", str(d), "--n-boot", "100", "--json", str(js), "-q"])
    assert r.exit_code == 0, r.output
    shard = str(d / "part-2.parquet")
    assert (f"warning: the logprobs of 1 of the 4 input files are stored rounded (in {shard}: "
            "train_logprob to 0.01 nats") in re.sub(r"\s+", " ", r.stderr)
    doc = json.loads(js.read_text())
    assert doc["rounded_logprobs"] == {"by_file": {shard: {"train_logprob": 0.01,
                                                           "infer_logprob": 0.01}},
                                       "input_files": 4}
    # logprobs rounded to 0.0 next to one that is not read as zero placeholders: said
    zp = doc["inputs"]["accounting"]["exclusions"].get("zero_placeholder", 0)
    assert zp > 0 and (f"({zp:,} row(s) excluded as zero_placeholder, 0.0 on one side or both, are "
                       "probably such logprobs rounded to 0)") in doc["verdict"]["caveat"]
    every = _split(synth_file, tmp_path / "all", 4, {i: two for i in range(4)})
    r = runner.invoke(app, ["fit", str(every), "--n-boot", "100", "--json", str(js), "-q"])
    assert json.loads(js.read_text())["rounded_logprobs"] == {"train_logprob": 0.01,
                                                              "infer_logprob": 0.01}
    ok = _split(synth_file, tmp_path / "ok", 4, {})
    r = runner.invoke(app, ["fit", str(ok), "--n-boot", "100", "--json", str(js), "-q"])
    assert json.loads(js.read_text())["rounded_logprobs"] is None


def test_versions_swapped_in_one_shard_name_the_shard(synth_file, tmp_path):
    """policy_version and train_version swapped in one shard of four: the negative-staleness
    warning names the shard; the JSON accounting counts its tokens by file."""
    swap = {"policy_version": pl.col("train_version"), "train_version": pl.col("policy_version")}
    d = _split(synth_file, tmp_path / "sw", 4, {3: swap})
    js = tmp_path / "f.json"
    r = runner.invoke(app, ["fit", str(d), "--n-boot", "100", "--json", str(js)])
    msg = re.sub(r"\s+", " ", r.stderr)
    shard = str(d / "part-3.parquet")
    assert (f"have policy_version > train_version (negative staleness), all in {shard}, 1 of "
            "the 4 input files:") in msg, msg
    acc = json.loads(js.read_text())["inputs"]["accounting"]
    ahead = sum(n for s, n in acc["staleness_tokens"].items() if int(s) < 0)
    assert acc["negative_staleness_files"] == {shard: ahead} and ahead > 0


def test_warnings_reach_the_json_and_the_html(synth_file, tmp_path):
    """The stderr warnings about the data (here: versions swapped in one shard) are in the
    JSON of fit, compare and report (``warnings``) and in the HTML report, for a reader
    who never saw stderr; a clean run has an empty list."""
    swap = {"policy_version": pl.col("train_version"), "train_version": pl.col("policy_version")}
    d = _split(synth_file, tmp_path / "sw", 4, {3: swap})
    for cmd in ("fit", "compare", "report"):
        js = tmp_path / f"{cmd}.json"
        extra = ["-o", str(tmp_path / "r.html")] if cmd == "report" else []
        r = runner.invoke(app, [cmd, str(d), "--n-boot", "100", "--json", str(js), "-q",
                                *extra])
        assert r.exit_code == 0, r.output
        (w,) = [w for w in json.loads(js.read_text())["warnings"] if "negative staleness" in w]
        assert w in " ".join(r.stderr.split())
    assert "negative staleness" in (tmp_path / "r.html").read_text()
    js = tmp_path / "clean.json"
    runner.invoke(app, ["fit", str(synth_file), "--n-boot", "100", "--json", str(js), "-q"])
    assert json.loads(js.read_text())["warnings"] == []


def test_impossible_logprobs_in_one_shard_name_the_shard(synth_file, tmp_path):
    """-300 placeholders in one shard of four: the implausible-logprob finding and the
    verdict caveat name that shard (evidence files / input_files)."""
    ph = _on_rows("infer_logprob", -300.0, lambda i: i % 50 == 0)
    d = _split(synth_file, tmp_path / "ph", 4, {2: ph})
    js = tmp_path / "f.json"
    r, doc = _run_json("fit", d, js)
    assert r.exit_code == 0, r.output
    (f,) = [x for x in doc["forensics"]["findings"] if x["kind"] == "implausible_logprobs"]
    shard = str(d / "part-2.parquet")
    assert f["evidence"]["files"] == {shard: f["evidence"]["tokens_flagged"]}
    assert f"They are all in {shard}, 1 of the 4 input files." in f["message"]
    assert (f"(the impossible values are in infer_logprob; all in {shard}, 1 of the 4 input files)"
            in doc["verdict"]["caveat"])


def test_malloc_tuning_only_on_glibc_and_never_over_the_users_setting(monkeypatch):
    """The entry point pads glibc's heap (M_TOP_PAD) unless MALLOC_TOP_PAD_ is set (the
    user's tuning wins) or the C library is not glibc."""
    import platform

    from entr_diag import cli

    monkeypatch.setenv("MALLOC_TOP_PAD_", "131072")
    assert cli._tune_malloc() is False
    monkeypatch.delenv("MALLOC_TOP_PAD_")
    monkeypatch.setattr(platform, "libc_ver", lambda *a, **k: ("musl", "1.2"))
    assert cli._tune_malloc() is False
    monkeypatch.undo()
    if platform.libc_ver()[0] == "glibc":
        monkeypatch.delenv("MALLOC_TOP_PAD_", raising=False)
        assert cli._tune_malloc() is True


def test_a_shift_in_one_shard_names_the_shard(synth_file, tmp_path):
    """Logprobs shifted by one token in one shard of four: the refusal (and, with
    --allow-misaligned, the finding's evidence) names that shard."""
    shift = {"infer_logprob": pl.col("infer_logprob").shift(1).over("seq_id", order_by="position")
             .fill_null(-0.5)}
    d = _split(synth_file, tmp_path / "sh", 4, {2: shift})
    shard = str(d / "part-2.parquet")
    r = runner.invoke(app, ["fit", str(d), "--n-boot", "100", "-q"])
    assert r.exit_code == 2 and "shifted by +1 token" in r.stderr, r.stderr
    assert f"They are all in {shard}, 1 of the 4 input files." in r.stderr
    js = tmp_path / "f.json"
    r = runner.invoke(app, ["fit", str(d), "--n-boot", "100", "--allow-misaligned",
                            "--json", str(js), "-q"])
    assert r.exit_code == 0, r.output
    (f,) = [x for x in json.loads(js.read_text())["forensics"]["findings"]
            if x["kind"] == "misalignment"]
    assert set(f["evidence"]["files"]) == {shard} and f["evidence"]["input_files"] == 4
    assert f["evidence"]["files"][shard] == f["evidence"]["shifted_sequences"]


def test_duplicated_positions_name_the_files_holding_them(synth_file, tmp_path):
    """A shard written twice (another row-group size: not byte-identical, so the copy
    check does not fire) among three: the duplicate-position warning and the accounting
    name both files with their sequences; a sequence written twice within one shard names
    that shard alone."""
    d = _split(synth_file, tmp_path / "dup", 3, {})
    pl.read_parquet(d / "part-1.parquet").write_parquet(d / "part-1-copy.parquet",
                                                        row_group_size=5000)
    js = tmp_path / "f.json"
    r = runner.invoke(app, ["fit", str(d), "--n-boot", "100", "--json", str(js), "-q"])
    assert r.exit_code == 0, r.output
    acc = json.loads(js.read_text())["inputs"]["accounting"]
    n = acc["sequences_with_duplicate_positions"]
    a, b = str(d / "part-1-copy.parquet"), str(d / "part-1.parquet")
    assert n > 0 and acc["duplicate_position_files"] == {a: n, b: n}
    assert (f"caveat: {n:,} sequence(s) hold the same (step, seq_id, position) more than once "
            f"(in 2 of the 4 input files:") in json.loads(js.read_text())["verdict"]["caveat"]
    assert f"hold more tokens than positions (in 2 of the 4 input files: {a} ({n:,}), {b} " \
           f"({n:,}))" in r.stderr.replace("\n", " "), r.stderr
    (d / "part-1-copy.parquet").unlink()
    part = pl.read_parquet(d / "part-2.parquet")
    pl.concat([part, part.head(50)]).write_parquet(d / "part-2.parquet")
    r = runner.invoke(app, ["fit", str(d), "--n-boot", "100", "--json", str(js), "-q"])
    acc = json.loads(js.read_text())["inputs"]["accounting"]
    c = str(d / "part-2.parquet")
    assert acc["duplicate_position_files"] == {c: acc["sequences_with_duplicate_positions"]}
    assert f"(all in {c}, 1 of the 3 input files)" in r.stderr.replace("\n", " ")
    single = tmp_path / "one.parquet"
    pl.concat([part, part.head(50)]).write_parquet(single)
    r = runner.invoke(app, ["fit", str(single), "--n-boot", "100", "--json", str(js), "-q"])
    acc = json.loads(js.read_text())["inputs"]["accounting"]
    assert acc["sequences_with_duplicate_positions"] > 0
    assert "duplicate_position_files" not in acc and "input files" not in r.stderr


def test_placeholders_are_not_taken_for_rounded_logprobs(synth_file, tmp_path):
    """A shard whose infer_logprob is mostly -300.0 placeholders (whole numbers): the
    implausible-logprob caveat names it; the rounding check, which ignores impossible
    values, does not call it rounded (it did: 95% of its values on the 1-nat grid)."""
    ph = _on_rows("infer_logprob", -300.0, lambda i: i % 20 != 0)
    d = _split(synth_file, tmp_path / "ph", 4, {2: ph})
    js = tmp_path / "f.json"
    r, doc = _run_json("fit", d, js)
    assert r.exit_code == 0, r.output
    assert doc["rounded_logprobs"] is None and "stored rounded" not in r.stderr
    assert "impossible logprob" in doc["verdict"]["caveat"]


def test_compare_reports_impossible_logprobs_as_fit_does(synth_file, tmp_path):
    """compare runs the implausible-logprob check outside its forensics: -300 placeholders
    in one shard reach its verdict caveat, a warning line and the JSON
    (implausible_logprobs), with the numbers
    fit's forensics give; a clean input gets none (and no per-bin totals pass)."""
    ph = _on_rows("infer_logprob", -300.0, lambda i: i % 50 == 0)
    d = _split(synth_file, tmp_path / "ph", 4, {2: ph})
    fj, cj = tmp_path / "f.json", tmp_path / "c.json"
    runner.invoke(app, ["fit", str(d), "--n-boot", "100", "--json", str(fj), "-q"])
    r = runner.invoke(app, ["compare", str(d), "--n-boot", "100", "--json", str(cj), "-q"])
    assert r.exit_code == 0, r.output
    fdoc = json.loads(fj.read_text())
    (ff,) = [x for x in fdoc["forensics"]["findings"] if x["kind"] == "implausible_logprobs"]
    # fit warns too (it only showed the finding and the caveat)
    assert sum("impossible logprob" in w for w in fdoc["warnings"]) == 1
    doc = json.loads(cj.read_text())
    cf = doc["implausible_logprobs"]
    assert cf["severity"] == ff["severity"] == "critical" and cf["title"] == ff["title"]
    # critical (half of sum delta^2 or more): the verdict is not assessable, in both
    # (helper-40 B: "the law describes them" beside a verdict read as any other)
    for v in (fdoc["verdict"], doc["fit"]["verdict"]):
        assert v["assessable"] is False and v["text"].startswith(
            f"not assessable ({ff['title']}: the law describes them, not the mismatch: see "
            "the caveat); as computed: "), v["text"]
    for k in ("tokens_flagged", "files", "k_without_flagged", "delta2_share_flagged"):
        assert cf["evidence"][k] == pytest.approx(ff["evidence"][k], rel=1e-6), k
    shard = str(d / "part-2.parquet")
    assert (f"(the impossible values are in infer_logprob; all in {shard}, 1 of the 4 input files)"
            in doc["fit"]["verdict"]["caveat"])
    assert any("impossible logprob" in w for w in doc["warnings"])
    assert "warning: " in r.stderr and "impossible logprob" in r.stderr
    # the caveats are on stdout too, after the tables (as fit prints them beside its
    # verdict); the spikes the placeholders make at steps 2 and 6 are fit's drift warning
    assert all(c in " ".join(r.stdout.split()) for c in doc["fit"]["verdict"]["caveats"])
    from entr_diag.cli import COMPARE_CHECKS

    def warned(d: dict) -> set[str]:
        return {f["kind"] for f in d["forensics"]["findings"]
                if f["severity"] != "info" and f["kind"] in COMPARE_CHECKS}

    assert warned(doc) == warned(fdoc) == {"drift"}
    r = runner.invoke(app, ["compare", str(synth_file), "--n-boot", "100", "--json", str(cj),
                            "-q"])
    doc = json.loads(cj.read_text())
    assert doc["implausible_logprobs"] is None and "impossible" not in str(doc["fit"]["verdict"])
    assert "caveat:" not in r.stdout


def test_compare_caveats_a_law_distorted_by_engine_truncation(synth_file, tmp_path):
    """An engine-side top-p renormalisation (log Z = 0.08 H added to infer_logprob) makes
    delta one-sided: compare runs the truncated-sampling check in its first pass and prints
    fit's caveat, saying that its noise / exploration categories rest on that law, with
    the finding's numbers equal to fit's; the JSON holds the five checks compare runs."""
    import polars as pl

    from entr_diag.cli import COMPARE_CHECKS

    il = pl.col("infer_logprob")
    g = pl.min_horizontal(0.08 * pl.col("entropy"), -il * 0.99)
    src = tmp_path / "topp.parquet"
    pl.read_parquet(synth_file).with_columns((il + g).alias("infer_logprob")).write_parquet(src)
    fj, cj = tmp_path / "f.json", tmp_path / "c.json"
    r = runner.invoke(app, ["fit", str(src), "--n-boot", "100", "--json", str(fj), "-q"])
    # the metrics table says what its numbers measure then (not engine noise)
    out = " ".join(r.stdout.split())
    assert ("The engine samples from a truncated support (top-p / top-k / min-p; the "
            "truncated_sampling finding): these metrics measure that support difference") in out
    assert out.index("clamp log-ratios") < out.index("truncated support") < out.index(
        "Mismatch forensics")
    r = runner.invoke(app, ["fit", str(synth_file), "--n-boot", "100", "-q"])
    assert "truncated support" not in r.stdout
    r = runner.invoke(app, ["compare", str(src), "--n-boot", "100", "--json", str(cj), "-q"])
    assert r.exit_code == 0, r.output
    (ff,) = [f for f in json.loads(fj.read_text())["forensics"]["findings"]
             if f["kind"] == "truncated_sampling"]
    doc = json.loads(cj.read_text())
    assert list(doc["forensics"]["checks"]) == list(COMPARE_CHECKS)
    (cf,) = [f for f in doc["forensics"]["findings"] if f["kind"] == "truncated_sampling"]
    assert cf["severity"] == ff["severity"] == "warning"
    assert cf["evidence"]["k_debiased"] == pytest.approx(ff["evidence"]["k_debiased"])
    (line,) = [c for c in doc["fit"]["verdict"]["caveats"] if "[truncated_sampling]" in c]
    assert "noise admitted and exploration discarded rest on that law" in line
    assert line in " ".join(r.stdout.split())
    # the clean run: every check runs, no finding above info, no caveat
    r = runner.invoke(app, ["compare", str(synth_file), "--n-boot", "100", "--json", str(cj),
                            "-q"])
    doc = json.loads(cj.read_text())
    assert list(doc["forensics"]["checks"]) == list(COMPARE_CHECKS)
    assert all(f["severity"] == "info" for f in doc["forensics"]["findings"])
    assert "caveat:" not in r.stdout


def test_implausible_plan_adds_no_pass_work_on_a_clean_input(synth_file):
    """ImplausiblePlan's follow-up (the per-bin totals) is asked for only when the pass
    found a token at or below -50 nats."""
    from entr_diag.forensics import ImplausiblePlan
    from entr_diag.io.load import load_dataset
    from entr_diag.passes import run_pass

    ds = load_dataset([str(synth_file)])
    plan = ImplausiblePlan(ds)
    run_pass(ds.lf, plan.accumulators)
    assert not plan.flagged() and plan.followup() == [] and plan.finish() is None


def _zero_prefix(frac: float) -> dict:
    """Columns setting train_logprob, infer_logprob and entropy to exactly 0.0 on the first
    ``frac`` of each sequence's tokens (a loss mask covering the prompt, written as zeros)."""
    first = (pl.col("position") - pl.col("position").min().over("step", "seq_id")
             < pl.len().over("step", "seq_id") * frac)
    return {c: pl.when(first).then(0.0).otherwise(pl.col(c))
            for c in ("train_logprob", "infer_logprob", "entropy")}


def test_a_mask_covering_the_prompt_as_zeros_is_warned_about(synth_file, tmp_path):
    """Sequences that begin with exact-zero triples (train = infer = H = 0.0): a warning,
    the verdict's caveat and JSON zero_prefix, naming the shard when one of four has them;
    the clean input has none."""
    d = _split(synth_file, tmp_path / "zp", 4, {1: _zero_prefix(0.15)})
    js = tmp_path / "f.json"
    for cmd in ("fit", "compare"):
        r = runner.invoke(app, [cmd, str(d), "--n-boot", "100", "--json", str(js), "-q"])
        assert r.exit_code == 0, r.output
        doc = json.loads(js.read_text())
        fd = doc if cmd == "fit" else doc["fit"]
        zp = fd["zero_prefix"]
        shard = str(d / "part-1.parquet")
        assert zp["files"] == {shard: zp["sequences"]} and zp["input_files"] == 4
        assert zp["sequences"] >= 0.9 * zp["sequences_sampled"]
        assert 0.12 < zp["tokens"] / zp["tokens_sampled"] < 0.2
        assert (f"in {shard} (1 of the 4 input files), {zp['sequences']:,} of its "
                f"{zp['sequences_sampled']:,} sampled sequences" in fd["verdict"]["caveat"])
        assert "the loss mask probably covers the prompt" in r.stderr.replace("\n", " ")
        assert any("loss mask probably covers the prompt" in w for w in doc["warnings"])
    r = runner.invoke(app, ["fit", str(synth_file), "--n-boot", "100", "--json", str(js), "-q"])
    assert json.loads(js.read_text())["zero_prefix"] is None


def test_zero_prefixes_needs_a_prefix_not_scattered_zeros():
    """Exact-zero triples scattered inside sequences (near-certain tokens), or a prefix in
    too few sequences, are not a zero prefix; a two-token prefix in most sequences is."""
    import numpy as np

    from entr_diag.forensics import zero_prefixes

    rng = np.random.default_rng(1)
    n_seq, n_tok = 100, 30
    k = np.repeat(np.arange(n_seq, dtype=np.uint64), n_tok)
    pos = np.tile(np.arange(n_tok), n_seq)
    lp = -rng.exponential(1.0, n_seq * n_tok)
    h = rng.exponential(1.0, n_seq * n_tok)

    def frame(zero: np.ndarray) -> pl.DataFrame:
        return pl.DataFrame({"seq_key": k, "position": pos,
                             "train_logprob": np.where(zero, 0.0, lp),
                             "infer_logprob": np.where(zero, 0.0, lp * 1.01),
                             "entropy": np.where(zero, 0.0, h)}).sample(fraction=1.0, seed=2)

    scattered = (pos % 7 == 3)  # every sequence, never at its start
    assert zero_prefixes(frame(scattered)) is None
    few = (pos < 3) & (k < 4)  # 4 of 100 sequences
    assert zero_prefixes(frame(few)) is None
    most = (pos < 2) & (k % 10 != 0)  # rows shuffled: the prefix is by position
    zp = zero_prefixes(frame(most))
    assert zp is not None and zp["sequences"] == 90 and zp["tokens"] == 180
    assert zp["median_length"] == 2 and zp["whole_sequences"] == 0


def test_a_small_shard_broken_on_its_own_is_named(synth_file, tmp_path):
    """One shard of eight with infer_logprob -9999 throughout (sentinel_logprob: 12% of
    the tokens, below the pooled warning's half) and one with a NaN entropy column while
    another reason leads the pooled warning: each such shard is named in a warning with
    its counts and what the reason means; the JSON accounting lists them."""
    d = _split(synth_file, tmp_path / "sm", 8, {
        3: {"infer_logprob": pl.lit(-9999.0)},
        5: {"entropy": pl.lit(float("nan"))},
        6: {"loss_mask": pl.col("loss_mask").cast(pl.Float64) * 0.7},
    })
    js = tmp_path / "f.json"
    r, doc = _run_json("fit", d, js)
    assert r.exit_code == 0, r.output
    acc = doc["inputs"]["accounting"]
    mostly = acc["file_exclusions"]
    p3, p5, p6 = (str(d / f"part-{i}.parquet") for i in (3, 5, 6))
    assert set(mostly) == {"sentinel_logprob", "invalid_entropy", "invalid_loss_mask"}
    z = mostly["sentinel_logprob"][p3]
    assert set(mostly["sentinel_logprob"]) == {p3} and z["excluded"] == z["loss_masked"]
    assert z["excluded"] == acc["exclusions"]["sentinel_logprob"]
    e = mostly["invalid_entropy"][p5]
    assert e["excluded"] == e["loss_masked"] == acc["exclusions"]["invalid_entropy"]
    err = " ".join(r.stderr.split())
    assert (f"1 of the 8 input files loses most of its loss-masked rows to sentinel_logprob "
            f"({p3}: {z['excluded']:,} of {z['loss_masked']:,} rows): infer_logprob holds a "
            "placeholder (e.g. -9999) for these tokens: that side returned no logprob" in err), err
    # which column holds them (one more read, as for the pooled warning): a placeholder on
    # one side is that side's, not a shifted mask (the hint for both sides)
    assert "padding values inside the loss mask" not in err
    assert acc["exclusions_where"]["sentinel_logprob"]["files"] == {p3: z["excluded"]}
    assert f"loses most of its loss-masked rows to invalid_entropy ({p5}:" in err
    # the reason the pooled warning explains (naming its files) is not repeated
    assert "rows to invalid_loss_mask" not in err and p6 in err
    assert sum("loses most" in w for w in doc["warnings"]) == 2


@pytest.mark.parametrize("col", ["train_logprob", "infer_logprob"])
def test_placeholders_do_not_read_as_a_unit_mistake(synth_big, tmp_path, col):
    """-300 placeholders on 0.2% of one shard's tokens moved sum(train) / sum(infer) by
    1.4x or 0.43x: the units check (pooled and per file) called the column log2 or log10.
    It leaves tokens with an impossible logprob out: the same numbers as without them."""
    ph = _on_rows(col, -300.0, lambda i: i % 500 == 7)
    d = _split(synth_big, tmp_path / "ph", 4, {2: ph})
    clean = _split(synth_big, tmp_path / "clean", 4, {})
    js, jc = tmp_path / "f.json", tmp_path / "c.json"
    r = runner.invoke(app, ["fit", str(d), "--n-boot", "100", "--json", str(js), "-q"])
    runner.invoke(app, ["fit", str(clean), "--n-boot", "100", "--json", str(jc), "-q"])
    assert r.exit_code == 0, r.output
    u, uc = (json.loads(p.read_text()) for p in (js, jc))
    assert u["units"]["likely_mistake"] is None and u["units_by_file"] is None
    assert "another unit" not in r.stderr and "log2" not in r.stderr and "log10" not in r.stderr
    n_ph = 25_000 // 500  # about: the shard's tokens / 500
    assert uc["units"]["tokens"] - u["units"]["tokens"] == pytest.approx(n_ph, abs=n_ph)
    assert u["units"]["train_over_infer"] == pytest.approx(uc["units"]["train_over_infer"],
                                                           rel=2e-3)
    assert "impossible logprob" in u["verdict"]["caveat"]


@pytest.mark.parametrize("mask", ["inverted", "false"])
def test_a_shard_whose_mask_drops_it_is_named(synth_file, tmp_path, mask):
    """One shard of four with its loss mask inverted (or all false): its rows fall outside
    the mask (the few masked ones are excluded), so it contributes no valid token; a
    warning names it with its counts (it said nothing: 0.5% excluded overall), JSON
    accounting.starved_files. A probability shard (rows excluded, not outside the mask)
    is left to the exclusion warnings."""
    m = ~pl.col("loss_mask") if mask == "inverted" else pl.lit(False)
    d = _split(synth_file, tmp_path / "m", 4, {2: {"loss_mask": m}})
    js = tmp_path / "f.json"
    r = runner.invoke(app, ["fit", str(d), "--n-boot", "100", "--json", str(js), "-q"])
    assert r.exit_code == 0, r.output
    acc = json.loads(js.read_text())["inputs"]["accounting"]
    shard = str(d / "part-2.parquet")
    st = acc["starved_files"]
    assert set(st) == {shard} and st[shard]["valid"] == 0
    doc = json.loads(js.read_text())
    assert "contribute no or few valid tokens" in doc["verdict"]["caveat"]
    # its few masked rows' exclusions are not warned about apart: the mask explains them
    assert "loss-masked rows to" not in " ".join(r.stderr.split())
    assert shard not in str(doc["inputs"]["accounting"].get("file_exclusions") or {})
    rows = pl.read_parquet(d / "part-2.parquet").height
    assert st[shard]["rows"] == rows
    assert st[shard]["outside_mask"] + sum(st[shard]["excluded"].values()) == rows
    err = " ".join(r.stderr.split())
    assert ("1 of the 4 input files contributes no valid tokens, where the other files' rows "
            "are" in err and f"({shard}: 0 valid of {rows:,} rows, "
            f"{st[shard]['outside_mask']:,} outside the loss mask" in err), err
    p = _split(synth_file, tmp_path / "p", 4,
               {2: {c: pl.col(c).exp() for c in ("train_logprob", "infer_logprob")}})
    r = runner.invoke(app, ["inspect", str(p), "--json", str(js), "-q"])
    acc = json.loads(js.read_text())["inputs"]["accounting"]
    assert "starved_files" not in acc and "contribute" not in r.stderr


def test_tiny_and_empty_shards_raise_no_false_alarm(synth_file, tmp_path):
    """Two empty shards of one writer are byte-identical but hold no token to count twice:
    not "copies"; a 3-row shard all outside the loss mask (one prompt-only sample) is too
    small to suggest an inverted mask (helper-29 F9). A 400-row shard with its mask
    inverted still is named."""
    d = _split(synth_file, tmp_path / "t", 2, {})
    df = pl.read_parquet(d / "part-0.parquet")
    for i in (2, 3):
        df.head(0).write_parquet(d / f"part-{i}.parquet")
    # (steps of their own: sequences first seen in another file are that file's)
    df.head(3).with_columns(loss_mask=pl.lit(False), step=pl.col("step") + 1000).write_parquet(
        d / "part-4.parquet")
    js = tmp_path / "f.json"
    r = runner.invoke(app, ["fit", str(d), "--n-boot", "100", "--json", str(js), "-q"])
    assert r.exit_code == 0, r.output
    err = " ".join(r.stderr.split())
    assert "copies of each other" not in err and "may be inverted" not in err, err
    doc = json.loads(js.read_text())
    assert "starved_files" not in doc["inputs"]["accounting"]
    assert "contribute no or few" not in (doc["verdict"].get("caveat") or "")
    df.head(400).with_columns(loss_mask=pl.lit(False), step=pl.col("step") + 1000
                              ).write_parquet(d / "part-4.parquet")
    r = runner.invoke(app, ["fit", str(d), "--n-boot", "100", "--json", str(js), "-q"])
    assert r.exit_code == 0, r.output
    assert set(json.loads(js.read_text())["inputs"]["accounting"]["starved_files"]) == {
        str(d / "part-4.parquet")}


@pytest.mark.parametrize("with_position", [True, False])
def test_seq_id_per_file_keys_restarting_rank_ids_apart(synth_file, tmp_path, with_position):
    """Per-rank shards whose seq_ids restart in each file (0, 1, ... in every rank) merge
    into one sequence per id (helper-29 F2): the warning names --seq-id-per-file, which
    keys sequences by (file, step, seq_id): as many sequences as the shards hold, ids
    read 'file:id', no warning, and the sequence gates see the real sequences (their keep
    rate equals that of the same tokens with globally unique ids)."""
    df = pl.read_parquet(synth_file)
    df = df.filter(pl.col("step") < 2)
    seqs = df.select("step", "seq_id").unique(maintain_order=True).with_row_index("k")
    df = df.join(seqs, on=["step", "seq_id"], maintain_order="left")
    d = tmp_path / "ranks"
    d.mkdir()
    for r in range(3):  # rank r holds sequences k % 3 == r, numbered 0.. in its file
        part = df.filter(pl.col("k") % 3 == r).with_columns(
            seq_id=(pl.col("k") // 3).cast(pl.Int64))
        if not with_position:
            part = part.drop("position")
        part.drop("k").write_parquet(d / f"rank{r}.parquet")
    uniq = tmp_path / "uniq.parquet"
    df.with_columns(seq_id=pl.col("k").cast(pl.Int64)).drop("k").write_parquet(uniq)
    gate = ["--gate", "seq-is:upper=2,lower=0.5"]
    js, ju = tmp_path / "c.json", tmp_path / "u.json"
    r = runner.invoke(app, ["compare", str(d), *gate, "--json", str(js), "-q"])
    assert r.exit_code == 0, r.output
    merged = json.loads(js.read_text())
    assert merged["inputs"]["accounting"]["sequences_total"] < seqs.height
    assert "--seq-id-per-file" in " ".join(r.stderr.split())
    r = runner.invoke(app, ["compare", str(d), *gate, "--seq-id-per-file", "--json", str(js),
                            "-q"])
    assert r.exit_code == 0, r.output
    err = " ".join(r.stderr.split())
    assert "more tokens than positions" not in err and "continue from one file" not in err
    per = json.loads(js.read_text())
    assert per["inputs"]["accounting"]["sequences_total"] == seqs.height
    # ids 'FILE:ID', FILE the input path as the outputs' file column spells it
    from entr_diag.io import load_dataset

    ids = load_dataset([d], seq_id_per_file=True).lf.select("seq_id").unique().collect()
    assert set(ids["seq_id"].str.extract(r"^(.*):\d+$").unique()) == {
        str(d / f"rank{r}.parquet") for r in range(3)}
    assert per["parameters"]["seq_id_per_file"] is True
    r = runner.invoke(app, ["compare", str(uniq), *gate, "--json", str(ju), "-q"])
    assert r.exit_code == 0, r.output
    ref = json.loads(ju.read_text())

    def keep(doc):
        return [g["kept_share"] for g in doc["compare"]["gates"] if g["name"] == "seq-is"]

    assert keep(per) == pytest.approx(keep(ref), rel=1e-12) and keep(per) != keep(merged)


def test_inspect_lists_the_columns_no_canonical_column_reads(synth_file, tmp_path):
    """inspect names the input's columns that nothing reads (JSON inputs.unused_columns,
    and a line under the mapping table): a mask or id the name heuristics missed is seen
    (helper-29 F1); none on the bundled sample run, whose every column is mapped."""
    p = tmp_path / "extra.parquet"
    pl.read_parquet(synth_file).drop("is_noise").rename({"loss_mask": "mask"}).with_columns(
        batch_idx=pl.lit(3)).write_parquet(p)
    js = tmp_path / "i.json"
    r = runner.invoke(app, ["inspect", str(p), "--json", str(js)])
    assert r.exit_code == 0, r.output
    assert json.loads(js.read_text())["inputs"]["unused_columns"] == ["batch_idx", "mask"]
    out = " ".join(r.stdout.split())
    assert "columns not used (2; --column CANONICAL=SOURCE maps one): 'batch_idx', 'mask'" in out
    assert "--column loss_mask=mask" in " ".join(r.stderr.split())
    r = runner.invoke(app, ["inspect", "--json", str(js), "-q"])
    assert r.exit_code == 0 and json.loads(js.read_text())["inputs"]["unused_columns"] == []
    assert "columns not used" not in r.stdout


_COPIED = {"train_logprob": pl.col("infer_logprob")}  # trainer logprobs not recomputed


def test_a_shard_with_identical_logprobs_is_named(synth_file, tmp_path):
    """One shard of four whose train_logprob is a copy of infer_logprob (delta == 0 on every
    token; the others have real mismatch): fit, compare and report warn naming the shard
    with its counts, the verdict has a caveat, JSON identical_logprobs lists it (it said
    nothing and the law's k read the shard's share low)."""
    d = _split(synth_file, tmp_path / "s", 4, {2: _COPIED})
    shard = str(d / "part-2.parquet")
    js = tmp_path / "f.json"
    r, doc = _run_json("fit", d, js)
    assert r.exit_code == 0, r.output
    acc = doc["inputs"]["accounting"]
    ident = acc["identical_logprobs"]
    n = ident["files"][0]["tokens"]
    assert ident["files"] == [{"file": shard, "tokens": n, "identical": n}] and n > 5000
    assert ident["steps"] == [] and ident["tokens"] == n and ident["others_share"] == 0
    assert ident["tokens_valid"] == acc["tokens_valid"] and acc["tokens_identical"] == n
    assert doc["identical_logprobs"] == ident
    err = " ".join(r.stderr.split())
    share = f"{n / acc['tokens_valid']:.0%}"
    assert (f"warning: train_logprob equals infer_logprob exactly (delta = 0) on {n:,} of the "
            f"{acc['tokens_valid']:,} valid tokens ({share}), concentrated in "
            f"1 of the 4 input files ({shard}: {n:,} of {n:,} tokens)" in err), err
    assert "pass only the other files" in err and f"k reads about {share} low" in err
    assert (f"caveat: train_logprob equals infer_logprob exactly on {share} of the valid "
            f"tokens, in 1 of the 4 input files ({shard}" in doc["verdict"]["caveat"])
    r, doc = _run_json("compare", d, js)
    assert r.exit_code == 0, r.output
    assert doc["inputs"]["accounting"]["identical_logprobs"] == ident
    assert shard in " ".join(r.stderr.split()) and "equals infer_logprob" in r.stderr
    assert any("equals infer_logprob" in w for w in doc["warnings"])
    r = runner.invoke(app, ["report", str(d), "-o", str(tmp_path / "r.html"), "-q"])
    assert r.exit_code == 0 and "equals infer_logprob" in r.stderr, r.output


def test_identical_logprobs_over_some_steps_are_named_as_steps(synth_file, tmp_path):
    """train_logprob copied from infer_logprob from step 7 on in one file: the warning names
    the steps as a range, JSON lists them, and the drift check's reason says it leaves them
    out (it said 'clear' over the other steps only)."""
    p = tmp_path / "steps.parquet"
    pl.read_parquet(synth_file).with_columns(
        train_logprob=pl.when(pl.col("step") >= 7).then(pl.col("infer_logprob"))
        .otherwise(pl.col("train_logprob"))).write_parquet(p)
    r, doc = _run_json("fit", p, tmp_path / "f.json")
    assert r.exit_code == 0, r.output
    ident = doc["inputs"]["accounting"]["identical_logprobs"]
    assert ident["files"] == [] and [s["step"] for s in ident["steps"]] == [7, 8, 9]
    assert all(s["identical"] == s["tokens"] > 0 for s in ident["steps"])
    n = sum(s["tokens"] for s in ident["steps"])
    err = " ".join(r.stderr.split())
    assert f"concentrated in steps 7-9 ({n:,} of {n:,} tokens)" in err, err
    assert "drop those steps from the input" in err
    assert "in steps 7-9" in doc["verdict"]["caveat"]
    drift = doc["forensics"]["checks"]["drift"]["reason"]
    assert "steps 7-9 left out: delta is exactly 0 on every token there" in drift, drift
    # copied on half the rows of those steps only: named as well (real runs: 0.49% at most)
    pl.read_parquet(synth_file).with_columns(
        train_logprob=pl.when((pl.col("step") >= 7) & (pl.col("position") % 2 == 0))
        .then(pl.col("infer_logprob")).otherwise(pl.col("train_logprob"))).write_parquet(p)
    r, doc = _run_json("fit", p, tmp_path / "f.json")
    ident = doc["inputs"]["accounting"]["identical_logprobs"]
    assert [s["step"] for s in ident["steps"]] == [7, 8, 9]
    assert all(0.3 < s["identical"] / s["tokens"] < 0.7 for s in ident["steps"])
    assert "concentrated in steps 7-9" in " ".join(r.stderr.split())
    # copied on half of the steps or more (the median step's share is a copy's: none stood
    # out, and bf16 storage took the blame; helper-49): named as well
    steps = pl.read_parquet(synth_file)["step"]
    half = int(steps.min()) + (int(steps.max()) - int(steps.min())) // 3
    pl.read_parquet(synth_file).with_columns(
        train_logprob=pl.when(pl.col("step") >= half).then(pl.col("infer_logprob"))
        .otherwise(pl.col("train_logprob"))).write_parquet(p)
    r, doc = _run_json("fit", p, tmp_path / "f.json")
    ident = doc["inputs"]["accounting"]["identical_logprobs"]
    named = [s["step"] for s in ident["steps"]]
    assert named == sorted(set(steps.filter(steps >= half).to_list())), named
    assert len(named) > len(set(steps.to_list())) / 2


def test_identical_logprobs_silent_on_a_clean_run_and_a_whole_identical_one(synth_file,
                                                                            tmp_path):
    """No warning and JSON identical_logprobs null on a run with real mismatch everywhere;
    a run identical throughout (a bitwise on-policy run) keeps its own handling: fit
    refuses ('is 0 for every token'), compare compares the gates, neither warns; inspect,
    which shows no law, warns."""
    js = tmp_path / "f.json"
    r, doc = _run_json("fit", synth_file, js)
    assert r.exit_code == 0, r.output
    assert doc["identical_logprobs"] is None
    assert doc["inputs"]["accounting"]["identical_logprobs"] is None
    assert "equals infer_logprob" not in r.stderr
    assert "left out" not in doc["forensics"]["checks"]["drift"]["reason"]
    same = tmp_path / "same.parquet"
    pl.read_parquet(synth_file).with_columns(**_COPIED).write_parquet(same)
    r, _ = _run_json("fit", same, tmp_path / "g.json")
    assert r.exit_code == 2 and "is 0 for every token" in " ".join(r.output.split())
    assert "equals infer_logprob" not in r.stderr
    r, doc = _run_json("compare", same, js)
    assert r.exit_code == 0, r.output
    acc = doc["inputs"]["accounting"]
    assert acc["identical_logprobs"] is None and acc["tokens_identical"] == acc["tokens_valid"]
    assert "equals infer_logprob" not in r.stderr
    # inspect, which prints no law, warns that fit refuses it (helper-48); not on the
    # clean run
    for path, warned in ((same, True), (synth_file, False)):
        r = runner.invoke(app, ["inspect", str(path), "--json", str(js), "-q"])
        assert r.exit_code == 0, r.output
        doc = json.loads(js.read_text())
        said = ("warning: train_logprob equals infer_logprob exactly on every valid token "
                f"({doc['inputs']['accounting']['tokens_valid']:,}): delta = 0, there is no "
                "mismatch to analyse")
        assert (said in " ".join(r.stderr.split())) is warned
        assert any(w.startswith(said[9:]) for w in doc["warnings"]) is warned


def test_identical_logprobs_scattered_through_the_run_name_no_step(tmp_path):
    """Logprobs dumped in bf16 on both sides are equal on about 17% of the tokens all
    through the run: small steps scatter above 20% by chance, and were named as copied;
    a step is named only at 3 times the median step's share. A step copied outright
    beside that baseline is still named."""
    rng = np.random.default_rng(0)
    n_seq, seq_len = 640, 40
    n = n_seq * seq_len
    train = -rng.exponential(0.7, n)
    same = rng.random(n) < 0.17
    step = np.arange(n) // seq_len // 10  # 64 steps of 400 tokens
    df = pl.DataFrame({"seq_id": np.arange(n) // seq_len, "position": np.arange(n) % seq_len,
                       "step": step, "train_logprob": train,
                       "infer_logprob": np.where(same, train,
                                                 np.minimum(train + rng.normal(0, 0.02, n),
                                                            0.0)),
                       "entropy": rng.uniform(0.05, 3.0, n)})
    p = tmp_path / "bf16.parquet"
    df.write_parquet(p)
    shares = df.group_by("step").agg((pl.col("train_logprob") == pl.col("infer_logprob"))
                                     .mean().alias("s"))["s"]
    assert shares.max() > 0.2  # (some steps scatter above the fixed share)
    r, doc = _run_json("fit", p, tmp_path / "f.json")
    assert r.exit_code == 0, r.output
    assert doc["inputs"]["accounting"]["identical_logprobs"] is None
    assert "equals infer_logprob" not in r.stderr
    df.with_columns(pl.when(pl.col("step") == 30).then(pl.col("train_logprob"))
                    .otherwise(pl.col("infer_logprob")).alias("infer_logprob")).write_parquet(p)
    r, doc = _run_json("fit", p, tmp_path / "f.json")
    assert [s["step"] for s in doc["inputs"]["accounting"]["identical_logprobs"]["steps"]] \
        == [30]


def test_step_ranges():
    """Steps read as ranges of consecutive values."""
    from entr_diag.caveats import step_ranges

    assert step_ranges([15, 16, 17, 18, 19]) == "15-19"
    assert step_ranges([7, 3, 5, 6]) == "3, 5-7"
    assert step_ranges(range(0, 20, 2)).endswith("and 4 more ranges")


def test_sequences_split_over_many_files_count_in_each(synth_file, tmp_path):
    """The same sequences in three files (seq_ids restarting per rank file): the
    duplicate-position warning counts them in every file holding them, not only the
    lowest and highest."""
    d = tmp_path / "ranks"
    d.mkdir()
    df = pl.read_parquet(synth_file)
    for i in range(3):
        df.write_parquet(d / f"rank-{i}.parquet", row_group_size=4000 + 1000 * i)
    js = tmp_path / "f.json"
    r = runner.invoke(app, ["fit", str(d), "--n-boot", "100", "--json", str(js), "-q"])
    acc = json.loads(js.read_text())["inputs"]["accounting"]
    n = acc["sequences_with_duplicate_positions"]
    assert n > 0 and acc["duplicate_position_files"] == {
        str(d / f"rank-{i}.parquet"): n for i in range(3)}, r.stderr


def test_inspect_warns_as_fit_does_and_writes_the_warnings(synth_file, tmp_path):
    """inspect runs the checks on the shift test's sample (rounded logprobs, sequences
    beginning with exact zeros) and the impossible-logprob warning, and its JSON holds the
    warnings (it had no `warnings` key)."""
    ph = _on_rows("infer_logprob", -300.0, lambda i: i % 50 == 0)
    two = {c: pl.col(c).round(2) for c in ("train_logprob", "infer_logprob")}
    d = _split(synth_file, tmp_path / "i", 4, {1: _zero_prefix(0.15), 2: ph, 3: two})
    js = tmp_path / "i.json"
    r = runner.invoke(app, ["inspect", str(d), "--json", str(js), "-q"])
    assert r.exit_code == 0, r.output
    doc = json.loads(js.read_text())
    w = " ".join(doc["warnings"])
    assert "stored rounded" in w and "impossible logprob" in w and "covers the prompt" in w
    assert set(doc["rounded_logprobs"]["by_file"]) == {str(d / "part-3.parquet")}
    assert set(doc["zero_prefix"]["files"]) == {str(d / "part-1.parquet")}
    assert all(x in " ".join(r.stderr.split()) for x in ("stored rounded", "covers the prompt"))
    r = runner.invoke(app, ["inspect", str(synth_file), "--json", str(js), "-q"])
    doc = json.loads(js.read_text())
    assert doc["warnings"] == [] and doc["zero_prefix"] is None
    # a shift (critical: fit refuses it) is a warning too, naming the shard
    shift = {"infer_logprob": pl.col("infer_logprob").shift(1).over(
        "seq_id", order_by="position").fill_null(-0.5)}
    s = _split(synth_file, tmp_path / "s", 4, {2: shift})
    r = runner.invoke(app, ["inspect", str(s), "--json", str(js), "-q"])
    w = json.loads(js.read_text())["warnings"]
    assert any(x.startswith("Logprob columns look shifted by +1 token") and
               f"(all in {s / 'part-2.parquet'}, 1 of the 4 input files): fit, flag, compare and "
               "report refuse this input (unless --allow-misaligned)." in x for x in w), w


def test_plus_one_placeholders_are_not_called_probabilities(synth_file, tmp_path):
    """infer_logprob +1.0 on 30% of one shard's rows (a placeholder): the warning says
    so; a shard of probabilities is still called probabilities."""
    p1 = _on_rows("infer_logprob", 1.0, lambda i: i % 10 < 3)
    d = _split(synth_file, tmp_path / "p1", 2, {1: p1})
    r = runner.invoke(app, ["fit", str(d), "--n-boot", "100", "-q"])
    err = " ".join(r.stderr.split())
    assert ("infer_logprob holds +1.0 where it has no value (every one of "
            "these rows is exactly 1.0: a placeholder, not probabilities)" in err), err
    assert "may hold probabilities" not in err
    pr = _split(synth_file, tmp_path / "pr", 2, {1: {"infer_logprob": pl.col("infer_logprob")
                                                      .exp()}})
    r = runner.invoke(app, ["fit", str(pr), "--n-boot", "100", "-q"])
    assert "may hold probabilities" in " ".join(r.stderr.split())


def test_corrupt_rows_in_one_shard_name_the_shard(synth_file, tmp_path):
    """NaN suffixes (the last 40% of every sequence, inference side) in one shard of four:
    the corrupt-rows finding names the shard (evidence files / input_files)."""
    rel = (pl.col("position") - pl.col("position").min().over("step", "seq_id")
           >= pl.len().over("step", "seq_id") * 0.6)
    nan = {"infer_logprob": pl.when(rel).then(float("nan")).otherwise(pl.col("infer_logprob"))}
    d = _split(synth_file, tmp_path / "nan", 4, {2: nan})
    js = tmp_path / "f.json"
    r = runner.invoke(app, ["fit", str(d), "--n-boot", "100", "--json", str(js), "-q"])
    assert r.exit_code == 0, r.output
    (f,) = [x for x in json.loads(js.read_text())["forensics"]["findings"]
            if x["kind"] == "corrupt_rows"]
    shard = str(d / "part-2.parquet")
    assert f["evidence"]["files"] == {shard: f["evidence"]["sequences_with_nonfinite_suffix"]}
    assert f"Those sequences are all in {shard}, 1 of the 4 input files." in f["message"]


def test_duplicated_rows_inside_a_gappy_mask_are_counted(synth_file, tmp_path):
    """A loss mask with a gap inside every sequence (masked-out tool output) and 3% of the
    rows written twice, next to themselves: every sequence holding a duplicated valid
    token counts (the count compared valid tokens with the position span, which the gap
    leaves room in); the gap alone, or the rows shuffled across chunks, count none."""
    df = pl.read_parquet(synth_file)
    gap = (pl.col("position") - pl.col("position").min().over("step", "seq_id")).is_between(5, 40)
    df = df.with_columns(loss_mask=pl.col("loss_mask") & ~gap)
    dup = df.sample(fraction=0.03, seed=1)
    p = tmp_path / "dup.parquet"
    pl.concat([df, dup]).sort("step", "seq_id", "position").write_parquet(p)
    want = dup.filter(pl.col("loss_mask")).select(pl.struct("step", "seq_id").n_unique()).item()
    js = tmp_path / "i.json"
    runner.invoke(app, ["inspect", str(p), "--json", str(js), "-q"])
    assert json.loads(js.read_text())["inputs"]["accounting"][
        "sequences_with_duplicate_positions"] == want
    g = tmp_path / "gap.parquet"
    df.sample(fraction=1.0, shuffle=True, seed=3).write_parquet(g, row_group_size=3000)
    runner.invoke(app, ["inspect", str(g), "--json", str(js), "-q"])
    assert json.loads(js.read_text())["inputs"]["accounting"][
        "sequences_with_duplicate_positions"] == 0


def test_prompt_zeros_before_short_answers_are_not_taken_for_a_shift(synth_file, tmp_path):
    """20 rows of exact zeros (the prompt under the loss mask) before every sequence, a third
    of which keep only 2 response tokens: next to so few tokens the zeros favoured lag +1
    and fit refused the input as shifted, hiding the zero-prefix warning. The shift test
    leaves tokens whose logprobs are both exactly 0.0 out."""
    df = pl.read_parquet(synth_file)
    k = ["step", "seq_id"]
    rel = pl.col("position") - pl.col("position").min().over(k)
    short = pl.col("seq_id").hash(seed=1) % 3 == 0
    df = df.filter(~short | (rel < 2)).with_columns(pl.col("position") + 20)
    pre = (df.group_by(k).agg(pl.col("position").min().alias("p0"),
                              pl.all().exclude("position").first())
           .with_columns(pl.int_ranges(0, 20).alias("_r")).explode("_r")
           .with_columns((pl.col("p0") - 20 + pl.col("_r")).alias("position"),
                         *(pl.lit(0.0).alias(c)
                           for c in ("train_logprob", "infer_logprob", "entropy")),
                         pl.lit(True).alias("loss_mask"))
           .drop("p0", "_r"))
    p = tmp_path / "pz.parquet"
    pl.concat([df, pre.select(df.columns)]).sort(*k, "position").write_parquet(p)
    js = tmp_path / "f.json"
    r = runner.invoke(app, ["fit", str(p), "--n-boot", "100", "--json", str(js), "-q"])
    assert r.exit_code == 0, r.stderr
    assert "covers the prompt" in " ".join(r.stderr.split())
    assert json.loads(js.read_text())["zero_prefix"]["median_length"] == 20


@pytest.mark.parametrize("col,why", [("infer_logprob", "not requested from the engine"),
                                     ("train_logprob", "not written to the dump")])
def test_a_zero_filled_logprob_column_is_refused(synth_file, tmp_path, col, why):
    """A logprob column exactly 0.0 on every loss-masked row (that side never computed)
    is refused naming it and the row count, exit 2, in every command that reads the
    tokens (fit ran on the rows whose other side is above -0.05 and read truncated
    sampling); one real value left in it, and the run is analysed (the zeros excluded
    as zero_placeholder)."""
    df = pl.read_parquet(synth_file)
    src = tmp_path / "zero.parquet"
    df.with_columns(pl.lit(0.0).alias(col)).write_parquet(src)
    masked = int(df["loss_mask"].cast(pl.Int64).sum())
    for cmd in (["fit"], ["compare"], ["report", "-o", str(tmp_path / "r.html")],
                ["inspect"]):
        r = runner.invoke(app, [*cmd, str(src), "--n-boot", "100", "-q"]
                          if cmd[0] != "inspect" else [*cmd, str(src), "-q"])
        assert r.exit_code == 2, (cmd, r.output)
        assert (f"error: {src}: {col} is exactly 0.0 on every one of the {masked:,} "
                "loss-masked rows") in r.stderr, r.stderr
        assert why in r.stderr
    assert not (tmp_path / "r.html").exists()
    first = (pl.col("seq_id") == pl.col("seq_id").min()) & pl.col("loss_mask")
    df.with_columns(pl.when(first).then(pl.col(col)).otherwise(0.0).alias(col)).write_parquet(src)
    r = runner.invoke(app, ["fit", str(src), "--n-boot", "100", "-q"])
    assert r.exit_code == 0, r.output


def test_zero_placeholders_on_a_third_of_one_shard_are_named(synth_file, tmp_path):
    """infer_logprob 0.0 on 60% of one shard's rows: a third of its masked rows are
    excluded as zero_placeholder (below half, and far below the pooled share): the
    per-file warning names the shard from 20% on, and says that zeros next to a
    near-zero trainer logprob stay valid."""
    z = _on_rows("infer_logprob", 0.0, lambda i: i % 5 < 3)
    d = _split(synth_file, tmp_path / "z", 5, {2: z})
    js = tmp_path / "f.json"
    r = runner.invoke(app, ["fit", str(d), "--n-boot", "100", "--json", str(js), "-q"])
    acc = json.loads(js.read_text())["inputs"]["accounting"]
    shard = str(d / "part-2.parquet")
    e = acc["file_exclusions"]["zero_placeholder"][shard]
    assert 0.2 <= e["excluded"] / e["loss_masked"] < 0.5
    err = " ".join(r.stderr.split())
    assert (f"1 of the 5 input files loses {e['excluded'] / e['loss_masked']:.0%} of its "
            f"loss-masked rows to zero_placeholder ({shard}:" in err), err
    assert "stay valid" in err
    # ... and the verdict's caveat says the results rest on the rest
    assert (f"(zero_placeholder: all in {shard}, 1 of the 5 input files): the results rest on "
            "their other rows") in json.loads(js.read_text())["verdict"]["caveat"]


def test_several_caveats_are_one_line_each(synth_file, tmp_path):
    """A shard of -9999 placeholders and a copied shard: two data caveats, each its own
    `caveat:` line in the terminal, its own item of verdict.caveats in the JSON (caveat:
    the lines joined by newlines) and its own paragraph in the HTML report."""
    d = _split(synth_file, tmp_path / "two", 4, {1: {"infer_logprob": pl.lit(-9999.0)}})
    (d / "part-3.parquet").write_bytes((d / "part-2.parquet").read_bytes())
    js = tmp_path / "f.json"
    r, doc = _run_json("fit", d, js)
    assert r.exit_code == 0, r.output
    caveats = doc["verdict"]["caveats"]
    assert len(caveats) >= 2 and all(c.startswith("caveat: ") for c in caveats)
    assert doc["verdict"]["caveat"] == "\n".join(caveats)
    assert any("sentinel_logprob" in c for c in caveats)
    assert any("more than once" in c for c in caveats)
    lines = [ln for ln in r.stdout.splitlines() if "caveat:" in ln]
    assert len(lines) == len(caveats) and all(ln.startswith("caveat: ") for ln in lines)
    html = tmp_path / "r.html"
    r = runner.invoke(app, ["report", str(d), "--n-boot", "100", "-q", "-o", str(html)])
    assert r.exit_code == 0, r.output
    assert html.read_text().count('<p class="caveat">caveat: ') == len(caveats)


@pytest.mark.parametrize("side", ["infer_logprob", "train_logprob"])
def test_a_step_with_one_side_written_as_zeros_is_no_shift(side, tmp_path):
    """One shard of eight whose engine (or trainer) logprobs are all 0.0 (not computed
    that step): its near-certain tokens stay valid beside the zeros, which must not pass
    for a shifted alignment. The shard is named for its zero_placeholder rows, exit 0."""
    from entr_diag.io.load import bundled_sample_path

    src = tmp_path / "src.parquet"
    pl.read_parquet(bundled_sample_path()).write_parquet(src)
    d = _split(src, tmp_path / "z", 8, {6: {side: pl.lit(0.0)}})
    r = runner.invoke(app, ["fit", str(d), "--n-boot", "100", "-q"])
    assert r.exit_code == 0, r.output
    err = " ".join(r.stderr.split())
    assert "shifted" not in err
    assert (f"loses most of its loss-masked rows to zero_placeholder ({d / 'part-6.parquet'}"
            in err), err


def test_a_panic_of_the_parquet_reader_names_the_file(tmp_path, monkeypatch):
    """Damaged data pages behind a valid footer made polars' reader panic (a
    PanicException, which is no Exception): every command stops with one error line
    naming the file, exit 2, no traceback; a panic outside a pass over the input reads as
    polars failing, also exit 2."""
    from entr_diag.io.load import bundled_sample_path

    p = tmp_path / "run.parquet"
    pl.read_parquet(bundled_sample_path()).write_parquet(p)
    real = pl.collect_all
    calls = {"n": 0}

    def panicking(*a, **k):  # the first chunk's read panics, as on a damaged page
        calls["n"] += 1
        raise pl.exceptions.PanicException("assertion `left == right` failed")

    monkeypatch.setattr(pl, "collect_all", panicking)
    for cmd in ("inspect", "fit", "compare"):
        r = runner.invoke(app, [cmd, str(p), "-q"])
        assert r.exit_code == 2, (cmd, r.output)
        err = " ".join(r.stderr.split())
        assert err.startswith(f"error: cannot read {p}"), err
        assert "the Parquet reader failed on its data pages (polars panicked: assertion" in err
        assert "Traceback" not in r.output
    assert calls["n"] >= 3
    monkeypatch.setattr(pl, "collect_all", real)

    def panics(*a, **k):
        raise pl.exceptions.PanicException("index out of bounds")

    from entr_diag import cli as cli_mod

    monkeypatch.setattr(cli_mod, "_load", panics)
    r = runner.invoke(app, ["fit", str(p), "-q"])
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert " ".join(r.stderr.split()).startswith(
        "error: polars failed (PanicException: index out of bounds).")

def test_skip_unreadable_leaves_out_a_truncated_shard(tmp_path):
    """A shard cut short by a killed writer refuses the input, saying how to go on; with
    --skip-unreadable every command leaves it out with a warning, the verdict's caveat and
    JSON inputs.skipped_unreadable; an input left without a readable file is refused."""
    from entr_diag.io.load import bundled_sample_path

    d = tmp_path / "run"
    d.mkdir()
    df = pl.read_parquet(bundled_sample_path())
    n = df.height // 3
    for i in range(3):
        df[i * n:(i + 1) * n].write_parquet(d / f"part-{i}.parquet")
    bad = d / "part-2.parquet"
    bad.write_bytes(bad.read_bytes()[: bad.stat().st_size // 2])
    r = runner.invoke(app, ["fit", str(d), "-q"])
    assert r.exit_code == 2 and str(bad) in r.stderr
    assert "--skip-unreadable leaves out" in " ".join(r.stderr.split())
    for cmd in ("fit", "compare", "report", "inspect"):
        js = tmp_path / f"{cmd}.json"
        extra = ["-o", str(tmp_path / "r.html")] if cmd == "report" else []
        r = runner.invoke(app, [cmd, str(d), "-q", "--skip-unreadable", "--json", str(js),
                                *extra])
        assert r.exit_code == 0, (cmd, r.output)
        err = " ".join(r.stderr.split())
        assert ("warning: 1 input file(s) left out, unreadable as Parquet (--skip-unreadable): "
                f"cannot read {bad}") in err, cmd
        doc = json.loads(js.read_text())
        inputs = doc["inputs"]
        assert [s["path"] for s in inputs["skipped_unreadable"]] == [str(bad)], cmd
        assert len(inputs["files"]) == 2, cmd
        if cmd != "inspect":
            fit = doc if cmd == "fit" else doc["fit"]
            assert fit["verdict"]["caveats"][0].startswith(
                "caveat: 1 input file(s) were left out, unreadable as Parquet"), cmd
    noise = tmp_path / "noise.parquet"  # flag's output records what it left out
    r = runner.invoke(app, ["flag", str(d), "-q", "--skip-unreadable", "-o", str(noise)])
    assert r.exit_code == 0 and "left out, unreadable as Parquet" in r.stderr
    import pyarrow.parquet as pq

    made = json.loads(pq.read_metadata(noise).metadata[b"entr_diag.parameters"])
    assert made["skipped_unreadable"] == [str(bad)] and len(made["inputs"]) == 2
    r = runner.invoke(app, ["fit", str(bad), "-q", "--skip-unreadable"])
    assert r.exit_code == 2 and "no input file can be read as Parquet" in r.stderr


def test_a_file_named_twice_is_read_once_with_a_note(tmp_path):
    """The same file given twice, or matched again by a glob, is read once, and a note says
    so; a single compare table says 1 sequence, not '1 sequences'."""
    from entr_diag.io.load import bundled_sample_path, resolve_paths

    src = tmp_path / "run.parquet"
    pl.read_parquet(bundled_sample_path()).head(2000).write_parquet(src)
    repeated: list[Path] = []
    assert resolve_paths([src, str(tmp_path / "*.parquet")], repeated=repeated) == [src]
    assert repeated == [src]
    # a hard link and a symlink to it are the same file (were read twice: every token
    # counted twice, with a copies warning)
    other = tmp_path / "other"
    other.mkdir()
    os.link(src, other / "hard.parquet")
    (other / "soft.parquet").symlink_to(src)
    repeated = []
    assert resolve_paths([other / "hard.parquet", src, other / "soft.parquet"],
                         repeated=repeated) == [other / "hard.parquet"]
    assert repeated == [src, other / "soft.parquet"]
    r = runner.invoke(app, ["inspect", str(src), str(src)])
    assert r.exit_code == 0, r.output
    assert "note: 1 input file(s) named more than once" in " ".join(r.stderr.split())
    one = tmp_path / "one.parquet"
    pl.read_parquet(src).filter(pl.col("seq_id") == pl.col("seq_id").first()).write_parquet(one)
    r = runner.invoke(app, ["compare", str(one), "-q"])
    assert "/ 1 sequence (" in r.stdout, r.output


def test_ctrl_c_while_the_cli_loads_exits_130_quietly(monkeypatch):
    """The console script (entr_diag._entry) catches a Ctrl-C during the imports of the
    CLI (half a second of polars, rich, typer) and exits 130, no traceback."""
    import builtins
    import sys as _sys

    from entr_diag import _entry

    real = builtins.__import__

    def interrupted(name, *a, **k):
        if name == "entr_diag.cli":
            raise KeyboardInterrupt
        return real(name, *a, **k)

    monkeypatch.delitem(_sys.modules, "entr_diag.cli", raising=False)
    monkeypatch.setattr(builtins, "__import__", interrupted)
    with pytest.raises(SystemExit) as ei:
        _entry.main()
    assert ei.value.code == 130


def test_progress_bar_at_80_columns_keeps_the_counts(monkeypatch):
    """On an 80-column terminal the phase's description is cut ('…'), never the rows read
    and their total (they were cut to '972,008/…')."""
    import io

    from rich.console import Console

    import entr_diag.cli as cli

    buf = io.StringIO()
    monkeypatch.setattr(cli, "stderr", Console(file=buf, force_terminal=True, width=80))
    ph = cli._Phases()
    ph.begin(quiet=False)
    ph.phase("one pass (fit, metrics, forensics, profiles, gates)", 48_600_000)
    ph.advance(12_500_000)
    ph.bar.refresh()
    line = ph.bar.make_tasks_table(ph.bar.tasks)
    ph.bar.stop()
    out = io.StringIO()
    Console(file=out, width=80, color_system=None).print(line)
    text = out.getvalue()
    assert "12.5/48.6M tokens" in text and "one pass (fit, metrics" in text


def test_a_polars_failure_in_the_analysis_is_not_called_an_unreadable_input(monkeypatch):
    """A polars error the loader did not name (the analysis, or a bug: a threshold search
    once divided a subnormal width to NaN) reads 'polars failed' with the error's type and
    where to report it, one line and exit 2; it read 'cannot read the input', blaming the
    data."""
    import polars as pl

    import entr_diag.fit as fit_mod

    def boom(*a, **k):
        raise pl.exceptions.InvalidOperationError("conversion from `f64` to `i32` failed")

    monkeypatch.setattr(fit_mod, "fit_plan", boom)
    r = CliRunner().invoke(app, ["fit", "-q"])
    assert r.exit_code == 2
    err = " ".join(r.output.split())
    assert "error: polars failed (InvalidOperationError: conversion from `f64` to `i32` " \
           "failed)" in err and "bug of entr-diag" in err
    assert "cannot read the input" not in err and "Traceback" not in r.output


def test_inspect_all_masked_says_why_it_counts_no_step(tmp_path):
    """Rows carrying steps 3 and 4, every one outside the loss mask: 'steps: 0' says that
    steps are counted over the valid tokens, of which there are none."""
    p = tmp_path / "masked.parquet"
    pl.DataFrame({"seq_id": [1, 1, 2, 2], "position": [0, 1, 0, 1], "step": [3, 3, 4, 4],
                  "train_logprob": [-1.0, -2.0, -1.0, -2.0],
                  "infer_logprob": [-1.0, -2.0, -1.0, -2.0], "entropy": [1.0] * 4,
                  "loss_mask": [False] * 4}).write_parquet(p)
    r = runner.invoke(app, ["inspect", str(p), "-q"])
    assert r.exit_code == 0, r.output
    assert "steps: 0 (steps are counted over the valid tokens: this input has none)" in " ".join(
        r.stdout.split())


def _entropy_shifted(df: pl.DataFrame, k: int) -> pl.DataFrame:
    """``df`` with entropy[t] replaced by the entropy of token t + k of its sequence (the
    last k tokens, or the first, keep their own): the dump's ``entropys[:, 1:]`` slip."""
    df = df.sort("step", "seq_id", "position")
    moved = pl.col("entropy").shift(-k).over("step", "seq_id")
    return df.with_columns(pl.coalesce(moved, pl.col("entropy")).alias("entropy"))


def test_entropy_column_shifted_by_one_is_named_beside_the_verdict(synth_file, tmp_path):
    """An entropy column off by one token against the logprobs (the logprobs aligned) read
    'law does not hold: alpha = 0.00' with a caveat blaming temperature / top-p; it is
    named, with its direction, in a warning, a caveat, the JSON, and the verdict leads
    with 'not assessable'; fit and compare alike, both directions."""
    base = pl.read_parquet(synth_file)
    for cmd, k, lag in (("fit", 1, -1), ("compare", -1, 1)):
        p = tmp_path / f"shift{k}.parquet"
        _entropy_shifted(base, k).write_parquet(p)
        js = tmp_path / f"{cmd}.json"
        r = runner.invoke(app, [cmd, str(p), "--n-boot", "100", "--json", str(js)])
        assert r.exit_code == 0, r.output  # a warning, not a refusal
        err = re.sub(r"\s+", " ", r.stderr)
        assert ("warning: the entropy column looks shifted by 1 token against the logprobs: "
                f"entropy[t] holds the entropy of token t{k:+d} (the surprisal "
                f"-infer_logprob[t] ranks with entropy[t{lag:+d}] at rank correlation") in err
        assert "entropys[:, 1:] vs [:, :-1]" in err
        # the units check's story (a temperature or truncation) is the shift's consequence
        assert "do not describe one sampling distribution" not in err
        doc = json.loads(js.read_text())
        fd = doc if cmd == "fit" else doc["fit"]
        ea = fd["entropy_alignment"]
        assert ea["status"] == "shifted" and ea["best_lag"] == lag, ea
        assert ea["entropy_offset"] == k and ea["lags_tested"] == [-3, -2, -1, 0, 1, 2, 3]
        assert ea["gap_vs_lag0"][str(lag)] > 0.3 and min(ea["gap_halves"]) > 0.3
        assert ea["rank_corr"][str(lag)] > 0.5 > abs(ea["rank_corr"]["0"]) + 0.3
        v = fd["verdict"]
        assert v["assessable"] is False
        assert v["text"].startswith("not assessable (the entropy column looks shifted by 1 "
                                    "token against the logprobs: see the caveat); as "
                                    "computed: "), v["text"]
        assert v["caveats"][0].startswith("caveat: the entropy column looks shifted by 1 token")
        assert not any("sampling distribution" in c for c in v["caveats"])


def test_entropy_shift_by_two_in_one_input_file_is_named(synth_file, tmp_path):
    """A shift in one of two input files (e.g. steps dumped by another code version) is
    found on that file's sampled tokens and names it; the report shows it too."""
    base = pl.read_parquet(synth_file).sort("step", "seq_id", "position")
    d = tmp_path / "run"
    d.mkdir()
    base.filter(pl.col("step") < 5).write_parquet(d / "a.parquet")
    _entropy_shifted(base.filter(pl.col("step") >= 5), 2).write_parquet(d / "b.parquet")
    js = tmp_path / "r.json"
    r = runner.invoke(app, ["report", str(d), "--n-boot", "100", "--json", str(js),
                            "-o", str(tmp_path / "r.html")])
    assert r.exit_code == 0, r.output
    ea = json.loads(js.read_text())["fit"]["entropy_alignment"]
    assert ea["status"] == "shifted" and ea["best_lag"] == -2, ea
    assert list(ea["files"].values()) == [-2] and next(iter(ea["files"])).endswith("b.parquet")
    err = re.sub(r"\s+", " ", r.stderr)
    assert "looks shifted by 2 tokens against the logprobs in 1 of the 2 input files" in err
    assert "entropy[t] holds the entropy of token t+2" in err
    assert "not assessable (the entropy column looks shifted by 2 tokens" in (
        tmp_path / "r.html").read_text()


def test_an_entropy_shift_in_some_steps_only_is_named_with_them(tmp_path):
    """The entropy column shifted by one token from step 12 on in one file (a dump slip
    after a resume), the logprobs untouched: the pooled and per-file tests read no shift,
    the step blocks do; the warning names the steps, the verdict is not assessable, JSON
    entropy_alignment.steps lists them (the drift check had blamed a mismatch jump at
    step 12 on the engine)."""
    src = Path(__file__).resolve().parents[1] / "entr_diag" / "sample_data" / \
        "sample_run_long.parquet"
    key = ["step", "seq_id"]
    p = tmp_path / "late.parquet"
    pl.read_parquet(src).sort(*key, "position").with_columns(
        pl.when(pl.col("step") >= 12).then(pl.col("entropy").shift(1).over(key))
        .otherwise(pl.col("entropy")).alias("entropy")).drop_nulls("entropy").write_parquet(p)
    js = tmp_path / "f.json"
    r = runner.invoke(app, ["fit", str(p), "--n-boot", "100", "--json", str(js)])
    assert r.exit_code == 0, r.output
    fd = json.loads(js.read_text())
    ea = fd["entropy_alignment"]
    assert ea["status"] == "shifted" and ea["best_lag"] == 1
    assert ea["steps"] == [12, 13, 14, 15], ea
    err = " ".join(r.stderr.split())
    assert ("the entropy column looks shifted by 1 token against the logprobs in steps "
            "12-15") in err, err
    assert fd["verdict"]["text"].startswith("not assessable (the entropy column looks shifted "
                                            "by 1 token against the logprobs in some steps")


def test_an_entropy_column_holding_the_surprisal_is_named(synth_file, tmp_path):
    """An entropy column that holds -infer_logprob (the sampled token's surprisal, a
    mapping or dump slip) read as 'law holds': a warning, the caveat, a verdict led by
    'not assessable' and JSON entropy_alignment status 'surprisal' (fit and compare)."""
    p = tmp_path / "sur.parquet"
    pl.read_parquet(synth_file).with_columns(entropy=-pl.col("infer_logprob")).write_parquet(p)
    js = tmp_path / "f.json"
    for cmd in ("fit", "compare"):
        r = runner.invoke(app, [cmd, str(p), "--n-boot", "100", "--json", str(js)])
        assert r.exit_code == 0, r.output
        doc = json.loads(js.read_text())
        fd = doc if cmd == "fit" else doc["fit"]
        ea = fd["entropy_alignment"]
        assert ea["status"] == "surprisal" and ea["surprisal_column"] == "infer_logprob"
        assert ea["surprisal_share"] > 0.99
        err = " ".join(r.stderr.split())
        assert ("warning: the entropy column equals the sampled token's surprisal "
                "-infer_logprob on 100% of the sampled tokens") in err, err
        assert fd["verdict"]["assessable"] is False and fd["verdict"]["text"].startswith(
            "not assessable (the entropy column holds the sampled token's surprisal")
        assert "holds -logprob of the sampled token" in fd["verdict"]["caveat"]


def test_aligned_entropy_stays_silent(synth_file, tmp_path):
    """An aligned run says nothing of the entropy's alignment (JSON: no_shift, with its
    numbers), nor does a run whose logprobs are shifted against each other (the
    off-by-one check reports that; the entropy is not judged then: null)."""
    js = tmp_path / "fit.json"
    r = runner.invoke(app, ["fit", str(synth_file), "--n-boot", "100", "--json", str(js)])
    assert r.exit_code == 0, r.output
    assert "entropy column looks shifted" not in r.stderr
    fd = json.loads(js.read_text())
    ea = fd["entropy_alignment"]
    assert ea["status"] == "no_shift" and ea["best_lag"] is None, ea
    assert ea["rank_corr"]["0"] > 0.3 and max(ea["gap_vs_lag0"].values()) < -0.2
    assert fd["verdict"]["assessable"] is True
    assert ea["surprisal_column"] is None and "holds -logprob" not in r.stderr
    p = tmp_path / "lp.parquet"
    pl.read_parquet(synth_file).sort("step", "seq_id", "position").with_columns(
        pl.coalesce(pl.col("infer_logprob").shift(1).over("step", "seq_id"),
                    pl.col("infer_logprob"))).write_parquet(p)
    r = runner.invoke(app, ["fit", str(p), "--n-boot", "100", "--allow-misaligned",
                            "--json", str(js)])
    assert r.exit_code == 0, r.output
    assert "entropy column looks shifted" not in r.stderr
    assert json.loads(js.read_text())["entropy_alignment"] is None


def test_sequence_gates_count_tokens_without_entropy(tmp_path):
    """Tokens with valid logprobs but no usable entropy (invalid_entropy) are left out of
    the analysis, but verl and slime (reading no entropy) count them in their sequence
    statistics: a catastrophic ratio (e^-12) on a NaN-entropy token in 30 sequences makes
    veto, seq-is and k3 drop exactly those 30, as a polars computation over every
    loss-masked token says (they kept all 1536 before); the export's decisions agree with
    the counts; a note says so (JSON
    ``parameters.unscored_tokens_in_sequence_gates``); no kept count includes them; a
    panel without sequence gates, or a run without such tokens, gets no note."""
    src = Path(__file__).resolve().parents[1] / "entr_diag" / "sample_data" / \
        "sample_run_long.parquet"
    df = pl.read_parquet(src).drop("train_entropy")
    first = pl.col("loss_mask") & (pl.col("position") == pl.col("position").filter(
        pl.col("loss_mask")).min().over("step", "seq_id"))
    hit = df.select("step", "seq_id").unique(maintain_order=True).head(30).with_columns(
        _hit=pl.lit(True))
    df = (df.join(hit, on=["step", "seq_id"], how="left")
          .with_columns(_t=first & pl.col("_hit").fill_null(False)))
    assert df["_t"].sum() == 30
    df = df.with_columns(
        pl.when("_t").then(float("nan")).otherwise(pl.col("entropy")).alias("entropy"),
        pl.when("_t").then(pl.col("infer_logprob") - 12).otherwise(pl.col("train_logprob"))
        .alias("train_logprob")).drop("_hit", "_t")
    p = tmp_path / "some_nan.parquet"
    df.write_parquet(p)
    per = (df.filter("loss_mask")
           .with_columns(d=pl.col("train_logprob") - pl.col("infer_logprob"))
           .group_by("step", "seq_id")
           .agg(s=pl.col("d").sum(), m=pl.col("d").mean(), mn=pl.col("d").min(),
                k3=(pl.col("d").exp() - 1 - pl.col("d")).mean()))
    want = {"veto": per.filter(pl.col("mn") >= math.log(1e-4)).height,
            "seq-is": per.filter(pl.col("s").is_between(math.log(0.5), math.log(2))).height,
            "k3": per.filter(pl.col("k3") <= 0.01).height,
            "geo-rs": per.filter(pl.col("m").is_between(math.log(0.999),
                                                        math.log(1.001))).height}
    assert want["veto"] == per.height - 30
    js, ex = tmp_path / "c.json", tmp_path / "d.parquet"
    r = runner.invoke(app, ["compare", str(p), "--n-boot", "100", "--json", str(js),
                            "--export", str(ex)])
    assert r.exit_code == 0, r.output
    said = ("note: 30 loss-masked token(s) excluded as invalid_entropy (no usable entropy; "
            "their logprobs valid) enter the sequence gates' statistics (seq-is, seq-tis, "
            "geo-rs, k3, veto: ratio sums, means, the veto's minimum)")
    assert said in " ".join(r.stderr.split()), r.stderr
    c = json.loads(js.read_text())["compare"]
    assert c["parameters"]["unscored_tokens_in_sequence_gates"] == 30
    assert c["n_tokens"] == df.filter("loss_mask").height - 30
    gates = {g["spec"].split(":")[0]: g for g in c["gates"]}
    for name, n in want.items():
        assert gates[name]["kept_sequences"] == n, (name, gates[name])
    assert gates["fixed"]["kept_sequences"] == per.height  # (a token gate: unchanged)
    dec = pl.read_parquet(ex)
    assert dec.height == c["n_tokens"]
    for g in c["gates"]:
        assert int(dec[f"keep[{g['spec']}]"].sum()) == g["kept_tokens"], g["spec"]
    r = runner.invoke(app, ["report", str(p), "-q", "--n-boot", "100", "-o",
                            str(tmp_path / "r.html")])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["compare", str(p), "--n-boot", "100", "--gate", "fixed",
                            "--gate", "icepop", "--json", str(js)])
    assert r.exit_code == 0 and "enter the sequence gates" not in r.stderr, r.output
    assert json.loads(js.read_text())["compare"]["parameters"][
        "unscored_tokens_in_sequence_gates"] == 0
    r = runner.invoke(app, ["compare", str(src), "--n-boot", "100", "--json", str(js)])
    assert r.exit_code == 0 and "invalid_entropy" not in r.stderr, r.output
    assert json.loads(js.read_text())["compare"]["parameters"][
        "unscored_tokens_in_sequence_gates"] is None


def test_negated_logprobs_of_a_peaked_run_are_refused(tmp_path):
    """A peaked run (85% near-certain tokens, logprobs within 1e-4 of 0) whose trainer
    column is negated: only 15% of the tokens are excluded as positive_logprob, but all
    of those whose value can tell; fit refuses (exit 2) naming that share and the hint
    (negate the column) instead of fitting the near-certain remainder; the same run with
    the column right is analysed."""
    src = Path(__file__).resolve().parents[1] / "entr_diag" / "sample_data" / \
        "sample_run_long.parquet"
    rng = np.random.default_rng(0)
    df = pl.read_parquet(src).drop("train_entropy")
    sure = pl.Series(rng.random(df.height) < 0.85)
    peaked = df.with_columns(
        pl.when(sure).then(-1e-6).otherwise(pl.col(c)).alias(c)
        for c in ("train_logprob", "infer_logprob")
    ).with_columns(pl.when(sure).then(1e-5).otherwise(pl.col("entropy")).alias("entropy"))
    ok = tmp_path / "ok.parquet"
    peaked.write_parquet(ok)
    r = runner.invoke(app, ["fit", str(ok), "-q", "--n-boot", "100"])
    assert r.exit_code == 0, r.output
    bad = tmp_path / "neg.parquet"
    peaked.with_columns(-pl.col("train_logprob")).write_parquet(bad)
    r = runner.invoke(app, ["fit", str(bad), "-q"])
    assert r.exit_code == 2, r.output
    err = " ".join(r.stderr.split())
    assert re.match(rf"error: {re.escape(str(bad))}: [\d,]+ of the [\d,]+ loss-masked tokens "
                    r"were excluded as positive_logprob, 100\.0% of those whose logprob is "
                    "not within 1e-4 of 0", err), err
    assert "Negate the column" in err and "token(s) left are not analysed" in err


def test_outputs_never_replace_a_parquet_file_entr_diag_did_not_write(tmp_path):
    """An output naming an existing Parquet file entr-diag did not write (a rollout dump
    named by a typo, not an input of the run) is refused before any work (exit 2), the
    file unchanged: flag -o, compare --export, report -o and --json alike; entr-diag's own
    earlier outputs are replaced as before."""
    import hashlib

    src = Path(__file__).resolve().parents[1] / "entr_diag" / "sample_data" / \
        "sample_run_long.parquet"
    dump = tmp_path / "step4.parquet"
    dump.write_bytes(src.read_bytes())
    md5 = hashlib.md5(dump.read_bytes()).hexdigest()
    for cmd, opt in ((["flag"], "-o"), (["compare"], "--export"), (["report"], "-o"),
                     (["fit"], "--json")):
        r = runner.invoke(app, [*cmd, opt, str(dump), "-q"])
        assert r.exit_code == 2 and r.stderr.startswith(
            f"error: {opt.replace('-o', '--output') if opt == '-o' else opt} {dump} exists "
            "and is a Parquet file entr-diag did not write"), (cmd, r.output)
        # the dump as the input too: named as the input (helper-31 F2: it read "a Parquet
        # file entr-diag did not write", the output check ran before the input check)
        r = runner.invoke(app, [*cmd, str(dump), opt, str(dump), "-q"])
        assert r.exit_code == 2 and "is one of the input files" in r.stderr, (cmd, r.output)
    assert hashlib.md5(dump.read_bytes()).hexdigest() == md5
    own = tmp_path / "noise.parquet"
    for _ in range(2):
        r = runner.invoke(app, ["flag", "-o", str(own), "-q", "--n-boot", "100"])
        assert r.exit_code == 0, r.output


def test_outputs_never_replace_a_synthetic_run(synth_file, tmp_path):
    """A run synth wrote is a data set: flag -o and compare --export refuse to replace it
    (helper-30 F3: flag replaced a 300k-token run), synth -o may; an earlier flag output
    is replaced as before."""
    import hashlib

    run = tmp_path / "run.parquet"
    run.write_bytes(synth_file.read_bytes())
    md5 = hashlib.md5(run.read_bytes()).hexdigest()
    for args in (["flag", str(synth_file), "-o", str(run)],
                 ["compare", str(synth_file), "--export", str(run)]):
        r = runner.invoke(app, [*args, "-q", "--n-boot", "100"])
        what = "--output" if "-o" in args else "--export"
        assert r.exit_code == 2 and r.stderr.startswith(
            f"error: {what} {run} exists and is a synthetic run written by entr-diag synth"), \
            r.output
    assert hashlib.md5(run.read_bytes()).hexdigest() == md5
    out = tmp_path / "noise.parquet"
    for _ in range(2):  # its own output: replaced
        r = runner.invoke(app, ["flag", str(synth_file), "-o", str(out), "-q", "--n-boot", "100"])
        assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["synth", "-o", str(run), "--tokens", "3000", "-q"])
    assert r.exit_code == 0, r.output


def test_outputs_never_replace_a_damaged_parquet_file(tmp_path):
    """A file that starts as Parquet but whose footer cannot be read (a dump cut short by a
    crash, or one still being written) is not replaced by an output either: exit 2 naming
    the unreadable footer, the file unchanged."""
    import hashlib

    src = Path(__file__).resolve().parents[1] / "entr_diag" / "sample_data" / \
        "sample_run_long.parquet"
    data = src.read_bytes()
    for name, body in (("cut.parquet", data[: len(data) // 2]), ("magic.bin", b"PAR1junk")):
        dump = tmp_path / name
        dump.write_bytes(body)
        md5 = hashlib.md5(body).hexdigest()
        for cmd, opt in (("flag", "-o"), ("fit", "--json")):
            r = runner.invoke(app, [cmd, opt, str(dump), "-q"])
            what = "--output" if opt == "-o" else opt
            assert r.exit_code == 2 and r.stderr.startswith(
                f"error: {what} {dump} exists and starts as a Parquet file but its footer "
                "cannot be read"), r.output
        assert hashlib.md5(dump.read_bytes()).hexdigest() == md5
    text = tmp_path / "notes.txt"  # (not Parquet: replaced as any other output path)
    text.write_text("PAR")
    r = runner.invoke(app, ["fit", "--json", str(text), "-q", "--n-boot", "100"])
    assert r.exit_code == 0, r.output


def test_version_minus_one_on_a_few_percent_of_tokens_is_warned_about(tmp_path):
    """Tokens excluded as negative_version (version -1, with valid logprobs) get a warning
    and a caveat from 1% of the loss-masked tokens (they were only in the accounting line),
    saying -1 may be a real version; versions below -1 are read as version numbers."""
    src = Path(__file__).resolve().parents[1] / "entr_diag" / "sample_data" / \
        "sample_run_long.parquet"
    df = pl.read_parquet(src)
    p = tmp_path / "v.parquet"
    df.with_columns(pl.when(pl.col("step") == 0).then(-1).otherwise(pl.col("policy_version"))
                    .alias("policy_version")).write_parquet(p)
    js = tmp_path / "f.json"
    r = runner.invoke(app, ["fit", str(p), "-q", "--n-boot", "100", "--json", str(js)])
    assert r.exit_code == 0, r.output
    err = " ".join(r.stderr.split())
    assert "are negative_version: a version of -1 marks prompt tokens (AReaL numbers them " \
           "so)" in err, err
    assert "-1 is a real version" in json.loads(js.read_text())["verdict"]["caveat"]
    df.with_columns(pl.when(pl.col("step") == 0).then(-2).otherwise(pl.col("policy_version"))
                    .alias("policy_version")).write_parquet(p)
    r = runner.invoke(app, ["fit", str(p), "-q", "--n-boot", "100", "--json", str(js)])
    assert r.exit_code == 0 and "read as version numbers" in r.stderr, r.output
    assert json.loads(js.read_text())["inputs"]["accounting"]["exclusions"] == {}


def test_catastrophic_tokens_get_a_caveat_with_the_law_without_them(tmp_path):
    """0.1% of the bundled run's tokens with a log-ratio of -13 nats (a ratio below 1e-4)
    take the law: the verdict's caveats name them, their share of sum delta^2 and the
    verdict without them (JSON ``catastrophic``), which reads as the clean run's."""
    src = Path(__file__).resolve().parents[1] / "entr_diag" / "sample_data" / \
        "sample_run_long.parquet"
    p, js = tmp_path / "cat.parquet", tmp_path / "f.json"
    pl.read_parquet(src).with_columns(
        pl.when(pl.int_range(pl.len()) % 1000 == 3).then(pl.col("infer_logprob") - 13.0)
        .otherwise(pl.col("train_logprob")).alias("train_logprob")).write_parquet(p)
    r = runner.invoke(app, ["fit", str(p), "--n-boot", "100", "--json", str(js)])
    assert r.exit_code == 0, r.output
    doc = json.loads(js.read_text())
    c = doc["catastrophic"]
    assert c["tokens"] > 100 and c["delta2_share"] > 0.5
    said = [x for x in doc["verdict"]["caveats"] if "catastrophic log-ratio" in x]
    assert said and c['verdict'] in said[0]
    assert "catastrophic log-ratio" in " ".join(r.stdout.split())
    r = runner.invoke(app, ["fit", str(src), "--n-boot", "100", "--json", str(js)])
    assert json.loads(js.read_text())["catastrophic"] is None


def test_seq_ids_reused_across_steps_without_step_or_position_are_warned_about(tmp_path):
    """No step and no position column, seq_id a per-step sample index: each id names one
    sequence per step, in separate blocks of the file, and is read as one sequence. A
    warning and a caveat say so (JSON accounting.sequences_in_separate_blocks); the same
    rows with a step column, or shuffled token by token (interleaved logging, regrouped),
    get neither."""
    src = Path(__file__).resolve().parents[1] / "entr_diag" / "sample_data" / \
        "sample_run_long.parquet"
    df = pl.read_parquet(src).drop("position")
    local = df.select("step", "seq_id").unique(maintain_order=True).with_columns(
        local=pl.int_range(pl.len()).over("step"))
    df = df.join(local, on=["step", "seq_id"], how="left", maintain_order="left")
    p, js = tmp_path / "local.parquet", tmp_path / "f.json"
    df.with_columns(seq_id=pl.col("local")).drop("local", "step").write_parquet(p)
    r = runner.invoke(app, ["fit", str(p), "-q", "--n-boot", "100", "--json", str(js)])
    assert r.exit_code == 0, r.output
    doc = json.loads(js.read_text())
    sep = doc["inputs"]["accounting"]["sequences_in_separate_blocks"]
    n_ids = df["local"].n_unique()
    assert sep["sequences"] == n_ids and sep["rows"] > 0.9 * df.height, sep
    err = " ".join(r.stderr.split())
    assert (f"warning: {sep['sequences']:,} sequence(s) have their rows in several separate "
            "blocks") in err and "sharing a seq_id" in err
    assert any("several separate blocks" in c for c in doc["verdict"]["caveats"])
    for ok in (df.with_columns(seq_id=pl.col("local")).drop("local"),
               df.drop("local").sample(fraction=1.0, shuffle=True, seed=3)):
        ok.write_parquet(p)
        r = runner.invoke(app, ["fit", str(p), "-q", "--n-boot", "100", "--json", str(js)])
        assert r.exit_code == 0 and "separate blocks" not in r.stderr, r.output


def test_outputs_name_each_rows_file_when_there_are_several(tmp_path):
    """Per-rank files whose seq_ids restart in each file: (seq_id, position, step) repeats,
    so flag -o and compare --export carry each row's input file (``file``), which makes
    the join back to the dump one-to-one; one input file gets no such column."""
    src = Path(__file__).resolve().parents[1] / "entr_diag" / "sample_data" / \
        "sample_run_long.parquet"
    df = pl.read_parquet(src)
    d = tmp_path / "ranks"
    d.mkdir()
    ids = df.select("step", "seq_id").unique(maintain_order=True).with_columns(
        rank=pl.int_range(pl.len()) % 2, local=pl.int_range(pl.len()) // 2)
    df = df.join(ids, on=["step", "seq_id"], maintain_order="left")
    for r in range(2):
        (df.filter(pl.col("rank") == r).with_columns(seq_id=pl.col("local"))
         .drop("rank", "local").write_parquet(d / f"rank{r}.parquet"))
    ex, fl = tmp_path / "ex.parquet", tmp_path / "fl.parquet"
    r = runner.invoke(app, ["compare", str(d), "-q", "--n-boot", "100", "--export", str(ex)])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["flag", str(d), "-q", "--n-boot", "100", "-o", str(fl)])
    assert r.exit_code == 0, r.output
    key = ["seq_id", "position", "step"]
    assert "file" in pl.read_parquet(fl).columns  # (no break in this run: no row)
    for out in (pl.read_parquet(ex),):
        assert out.select(key).is_duplicated().any()  # (the ids restart)
        assert not out.select(*key, "file").is_duplicated().any()
        assert set(out["file"].cast(pl.String)) <= {str(d / "rank0.parquet"),
                                                     str(d / "rank1.parquet")}
    dec = pl.read_parquet(ex)
    dump = pl.concat([pl.read_parquet(d / f"rank{r}.parquet").with_columns(
        file=pl.lit(str(d / f"rank{r}.parquet"))) for r in range(2)]).filter("loss_mask")
    joined = dump.join(dec.with_columns(pl.col("file").cast(pl.String)),
                       on=[*key, "file"], how="inner")
    assert joined.height == dec.height == dump.height
    r = runner.invoke(app, ["compare", str(src), "-q", "--n-boot", "100", "--export", str(ex)])
    assert r.exit_code == 0 and "file" not in pl.read_parquet(ex).columns


def test_a_shard_whose_mismatch_is_far_larger_than_the_others_is_named(tmp_path):
    """One shard of four whose log-ratios are 6 times the others' (a node sampling at another
    temperature: 2,500 times in helper-34's run) moved the pooled law while every pooled
    check read clear (the sequence-outlier check took its quarter of the sequences for a
    broad tail). The shard is named, with its factor, in a warning, the verdict's caveats
    and JSON mismatch_by_file; the clean shards alone name none."""
    d = _shards(tmp_path, 4, {3: {"train_logprob": pl.min_horizontal(
        pl.col("infer_logprob") + 6 * (pl.col("train_logprob") - pl.col("infer_logprob")),
        pl.lit(0.0))}}, tokens=20_000)
    js = tmp_path / "f.json"
    r = runner.invoke(app, ["fit", str(d), "--json", str(js), "--n-boot", "200"])
    assert r.exit_code == 0, r.output
    err = " ".join(r.stderr.split())
    assert ("warning: 1 of the 4 input files shows a mismatch far larger than the other files' "
            f"at the same entropy (mean delta^2, the median over the entropy bins): "
            f"{d / 'part-3.parquet'} (") in err, err
    doc = json.loads(js.read_text())
    (only,) = doc["mismatch_by_file"]
    assert only["file"] == str(d / "part-3.parquet") and 20 < only["ratio"] < 50, only
    assert any("far larger than the other files'" in c for c in doc["verdict"]["caveats"])
    clean = tmp_path / "clean"
    clean.mkdir()
    for i in range(3):
        (clean / f"part-{i}.parquet").write_bytes((d / f"part-{i}.parquet").read_bytes())
    r = runner.invoke(app, ["fit", str(clean), "--json", str(js), "--n-boot", "200", "-q"])
    assert r.exit_code == 0 and json.loads(js.read_text())["mismatch_by_file"] is None


def test_a_mask_over_the_prompt_is_named_not_read_as_an_entropy_mismatch(tmp_path):
    """A loss mask taking in each sequence's first 15% (teacher-forced prompt tokens of
    surprisal 8 nats at every entropy): the unsampled-tokens finding names the prompt
    (warning, verdict caveat); the units check's surprisal / entropy gap, which those tokens
    make, is not told as a truncated or sharper entropy (helper-34 F2), though its numbers
    stay in the JSON."""
    from entr_diag.synth import SynthSpec, generate

    il, tl = pl.col("infer_logprob"), pl.col("train_logprob")
    df = generate(SynthSpec(n_tokens=40_000, seed=5, h_star=None))
    prompt = (pl.col("position") < 0.15 * pl.len().over("seq_id")) & pl.col("loss_mask")
    df = df.with_columns(pl.when(prompt).then(pl.lit(-8.0)).otherwise(il).alias("infer_logprob"),
                         pl.when(prompt).then(-8.0 + tl - il).otherwise(tl).alias("train_logprob"))
    p = tmp_path / "prompt.parquet"
    df.write_parquet(p)
    r, doc = _run_json("fit", p, tmp_path / "f.json")
    assert r.exit_code == 0, r.output
    (f,) = [f for f in doc["forensics"]["findings"] if f["kind"] == "unsampled_tokens"]
    assert f["severity"] in ("warning", "critical") and "prompt" in f["title"], f["title"]
    assert doc["units"]["entropy_mismatch"], doc["units"]
    caveat = doc["verdict"]["caveat"]
    assert "[unsampled_tokens]" in caveat
    assert "do not describe one sampling distribution" not in caveat + r.stderr
    summary = doc["verdict"]["forensics"]
    assert summary.startswith("Forensics: ") and f"{f['severity']} (unsampled_tokens" in summary
    assert summary.endswith("see the caveats and the findings."), summary
    assert f["evidence"]["cause"] == "prompt_in_mask"
    # spread unsampled tokens (e.g. a temperature the logs leave out) leave its story alone
    from entr_diag.cli import _mask_unsampled

    spread = {"findings": [{**f, "evidence": {**f["evidence"], "cause": "spread"}}]}
    assert _mask_unsampled(doc["forensics"]) and not _mask_unsampled(spread)


def test_the_verdict_says_when_the_forensics_found_no_cause(tmp_path):
    """On the bundled run (law does not hold, nothing above info), a line under the verdict
    and its caveat says that no known cause of mismatch was found, with the checks' tally
    (helper-34 F7: the headline stood alone); the same in the JSON and the HTML report."""
    js = tmp_path / "f.json"
    r = runner.invoke(app, ["fit", "--n-boot", "100", "--json", str(js)])
    assert r.exit_code == 0, r.output
    summary = json.loads(js.read_text())["verdict"]["forensics"]
    assert summary.startswith("Forensics: no known cause of mismatch found (") and re.search(
        r"\((\d+) of (\d+) checks clear; info only: staleness, trainer_noise_floor\)\.$",
        summary), summary
    lines = r.stdout.splitlines()
    at = lines.index(summary)
    assert lines[at - 1].startswith("caveat: the law's bins bend") and lines[at - 2].startswith(
        "Verdict: law does not hold")
    html = tmp_path / "r.html"
    r = runner.invoke(app, ["report", "--n-boot", "100", "-o", str(html), "-q"])
    assert r.exit_code == 0, r.output
    assert f"<p>{summary}</p>" in html.read_text()


def test_the_forensics_line_beside_a_void_verdict_and_in_compare(tmp_path):
    """Beside a verdict made not assessable (engine logprobs in log10), the forensics line
    says no cause was found besides the caveat's, not 'no known cause' (helper-37 6);
    compare, which runs no forensics of its own, has none (it read '0 of 0 checks clear',
    helper-37 5); two findings of a severity are counted in the plural."""
    from entr_diag.caveats import forensics_summary
    from entr_diag.synth import SynthSpec, generate

    df = generate(SynthSpec(n_tokens=20_000, seed=2, h_star=None))
    p = tmp_path / "log10.parquet"
    df.with_columns(pl.col("infer_logprob") / math.log(10)).write_parquet(p)
    r, doc = _run_json("fit", p, tmp_path / "f.json")
    assert r.exit_code == 0, r.output
    assert doc["verdict"]["text"].startswith("not assessable (")
    assert doc["verdict"]["forensics"].startswith(
        "Forensics: no cause of mismatch found besides the caveat's (infer_logprob"), doc[
        "verdict"]["forensics"]
    r, doc = _run_json("compare", p, tmp_path / "c.json")
    assert r.exit_code == 0, r.output
    assert doc["fit"]["verdict"]["forensics"] is None
    two = {"findings": [{"kind": "drift", "severity": "warning"},
                        {"kind": "staleness", "severity": "warning"}],
           "checks": {"drift": {"status": "found"}, "staleness": {"status": "found"}}}
    assert forensics_summary(two) == ("Forensics: 2 warnings (drift, staleness): see the "
                                      "caveats and the findings.")


@pytest.mark.parametrize("cols, fix", [(("infer_logprob",), "convert the column"),
                                       (("train_logprob", "infer_logprob"),
                                        "convert the columns")])
def test_probabilities_left_valid_say_which_columns_to_convert(tmp_path, cols, fix):
    """Probabilities in one logprob column or both: the valid tokens left (p <= 1e-4 pass
    as logprobs near 0) are told to convert the column, or the columns (helper-48: 'the
    column' for both)."""
    LONG = Path(__file__).resolve().parents[1] / "entr_diag" / "sample_data" / \
        "sample_run_long.parquet"
    p = tmp_path / "probs.parquet"
    pl.read_parquet(LONG).with_columns(pl.col(*cols).exp()).write_parquet(p)
    r = runner.invoke(app, ["inspect", str(p), "-q"])
    msg = " ".join(r.stderr.split())
    assert f"distort the results: {fix} (the log of each probability)" in msg, msg


@pytest.mark.parametrize("expr, said", [
    (pl.col("entropy") / math.log(2), "entropy probably holds bits (log base 2), not nats"),
    (pl.col("entropy") * 2, "entropy looks multiplied by about 2:"),
    (pl.col("entropy"), None)])
def test_inspect_reads_the_units_check_on_its_forensic_bins(tmp_path, expr, said):
    """inspect runs the units check on its forensic entropy bins and warns of a unit
    mistake or a scaled entropy, as fit does (helper-48: an entropy in bits got no word
    from inspect); the bundled run in nats gets none."""
    LONG = Path(__file__).resolve().parents[1] / "entr_diag" / "sample_data" / \
        "sample_run_long.parquet"
    p = tmp_path / "u.parquet"
    pl.read_parquet(LONG).with_columns(expr.alias("entropy")).write_parquet(p)
    js = tmp_path / "i.json"
    r = runner.invoke(app, ["inspect", str(p), "-q", "--json", str(js)])
    assert r.exit_code == 0, r.output
    err = " ".join(r.stderr.split())
    warned = [w for w in json.loads(js.read_text())["warnings"]
              if "inspect reads this on its forensic entropy bins" in w]
    if said is None:
        assert not warned and "forensic entropy bins" not in err
    else:
        assert f"warning: {said}" in err and len(warned) == 1, err
        assert warned[0].startswith(said) and warned[0].endswith(
            "(inspect reads this on its forensic entropy bins; `fit` reads it on the law's)")


def test_inspect_table_escapes_a_line_break_in_a_file_name(tmp_path):
    """A file name holding a newline printed as two rows of inspect's file table (helper-49);
    it is written \\n there, as the error lines write it."""
    LONG = Path(__file__).resolve().parents[1] / "entr_diag" / "sample_data" / \
        "sample_run_long.parquet"
    p = tmp_path / "a\nb.parquet"
    p.write_bytes(LONG.read_bytes())
    r = runner.invoke(app, ["inspect", str(p), "-q"], env={"COLUMNS": "400"})
    assert r.exit_code == 0, r.output
    shown = str(tmp_path / "a\\nb.parquet")
    assert any(shown in line and "long" in line for line in r.stdout.splitlines()), r.stdout
