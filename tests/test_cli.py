"""CLI: entry points, inspect, JSON conventions and every refusal path with exit code 2."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

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


def test_cli_subprocess_no_traceback(tmp_path):
    """Run as a real process: exit code 2 and no traceback for a non-Parquet file."""
    p = tmp_path / "bad.parquet"
    p.write_bytes(b"\x00" * 100)
    out = subprocess.run([sys.executable, "-m", "entr_diag", "inspect", str(p)],
                         capture_output=True, text=True)
    assert out.returncode == 2
    assert "Traceback" not in out.stderr and "bad.parquet" in out.stderr
