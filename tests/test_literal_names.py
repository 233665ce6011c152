"""CLI: names from the user (paths, folders, column names) print exactly as given, never
read as rich markup: a ``[/i]`` does not crash a command, a ``[x]`` is not dropped."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

from entr_diag.cli import app

runner = CliRunner()
#: an input folder, an output folder and a column, each with a closing tag that matches
#: nothing (rich: MarkupError) and an opening tag (rich: silently removed)
IN_DIR = "in[x] [/i]"
OUT_DIR = "out[/i] [x] ü"
COLUMN = "lp[/b][x]"
#: an opening tag alone: no crash, but rich drops it from what it prints
TAG_DIR = "only[x]"


@pytest.fixture(scope="module")
def names(tmp_path_factory) -> Path:
    """A folder holding a synthetic run with a noise regime, its inference logprob column
    renamed to COLUMN, and an empty output folder, both with brackets in their names."""
    from entr_diag.synth import SynthSpec, write_synth

    root = tmp_path_factory.mktemp("names")
    src = root / "run.parquet"
    write_synth(src, SynthSpec(n_tokens=20_000, seed=3, noise_share=0.1))
    (root / IN_DIR).mkdir(parents=True)
    (root / OUT_DIR).mkdir(parents=True)
    (root / TAG_DIR).mkdir()
    shutil.copy(src, root / IN_DIR / "run.parquet")
    shutil.copy(src, root / TAG_DIR / "run.parquet")
    pl.read_parquet(src).rename({"infer_logprob": COLUMN}).write_parquet(root / "col.parquet")
    src.unlink()
    return root


def _run(names: Path, monkeypatch, *args: str):
    """Run the CLI in ``names`` (relative paths print as given): exit 0, no traceback."""
    monkeypatch.chdir(names)
    r = runner.invoke(app, list(args))
    assert r.exit_code == 0, (args, r.output, r.exception)
    assert "Traceback" not in r.output and "MarkupError" not in r.output
    return r


def test_inspect_prints_folder_and_column_names_literally(names, monkeypatch):
    """inspect lists a file in a folder named with brackets, and a column mapped from a
    name with brackets, exactly as they are named."""
    r = _run(names, monkeypatch, "inspect", IN_DIR)
    assert f"{IN_DIR}/run.parquet" in r.stdout
    r = _run(names, monkeypatch, "inspect", "col.parquet", "--column",
             f"infer_logprob={COLUMN}")
    assert COLUMN in r.stdout


def test_an_opening_tag_in_a_name_is_kept(names, monkeypatch):
    """A ``[x]`` in a folder name is printed, not swallowed as a style tag: in inspect's
    file table and in report's `wrote` line."""
    r = _run(names, monkeypatch, "inspect", TAG_DIR)
    assert f"{TAG_DIR}/run.parquet" in r.stdout
    r = _run(names, monkeypatch, "report", TAG_DIR, "--n-boot", "100", "-o",
             f"{TAG_DIR}.html")
    assert f"wrote {TAG_DIR}.html (" in r.stdout


def test_compare_table_cells_are_literal():
    """The compare tables print a cell such as a gate label as is, brackets included."""
    from io import StringIO

    from rich.console import Console

    from entr_diag.report.terminal_compare import _table

    console = Console(file=StringIO(), width=100, color_system=None)
    console.print(_table("t", ["gate [/i]", "kept"], [["fixed[x] [/i]", "1"]]))
    text = console.file.getvalue()
    assert "fixed[x] [/i]" in text and "gate [/i]" in text


def test_fit_names_its_json_and_column_literally(names, monkeypatch):
    """fit --json into a folder named with brackets says `wrote` with the path as given."""
    out = f"{OUT_DIR}/fit.json"
    r = _run(names, monkeypatch, "fit", "col.parquet", "--column", f"infer_logprob={COLUMN}",
             "--n-boot", "100", "--json", out)
    assert f"wrote {out}" in r.stderr
    assert json.loads((names / out).read_text())["schema_version"]


def test_compare_names_its_outputs_literally(names, monkeypatch):
    """compare --json and --export into a folder named with brackets: both `wrote` lines
    name the paths as given."""
    out, export = f"{OUT_DIR}/compare.json", f"{OUT_DIR}/keep.parquet"
    r = _run(names, monkeypatch, "compare", IN_DIR, "--n-boot", "100", "--json", out,
             "--export", export)
    assert f"wrote {out}" in r.stderr and f"wrote {export}" in r.stderr


def test_report_names_its_outputs_literally(names, monkeypatch):
    """report's HTML (on stdout) and JSON (on stderr) `wrote` lines name the paths as given."""
    html, js = f"{OUT_DIR}/r.html", f"{OUT_DIR}/r.json"
    r = _run(names, monkeypatch, "report", IN_DIR, "--n-boot", "100", "-o", html,
             "--json", js)
    assert f"wrote {html} (" in r.stdout
    assert f"wrote {js}" in r.stderr
    assert (names / html).stat().st_size > 0


def test_flag_names_its_parquet_literally(names, monkeypatch):
    """flag says how many tokens it wrote and where, with the path as given."""
    out = f"{OUT_DIR}/noise.parquet"
    r = _run(names, monkeypatch, "flag", IN_DIR, "--n-boot", "100", "-o", out)
    n = pl.read_parquet(names / out, glob=False).height
    assert n > 0
    assert f"{n:,} low-entropy noise tokens" in r.stdout and f"written to {out}" in r.stdout


def test_synth_names_its_parquet_literally(names, monkeypatch):
    """synth writes the file, says `wrote` with the path as given, and its ground-truth
    JSON on stdout holds the path unaltered."""
    out = f"{OUT_DIR}/s.parquet"
    r = _run(names, monkeypatch, "synth", "-o", out, "--tokens", "5000")
    assert f"wrote {out}" in r.stderr
    assert json.loads(r.stdout)["path"].endswith(out)


def test_an_error_naming_a_file_with_a_line_break_stays_one_line(tmp_path):
    """A file name holding a line break (or a carriage return) made the refusal two lines;
    it is written as Python's repr writes it, the message one line (helper-35)."""
    bad = tmp_path / "bad\nname\r.parquet"
    pl.DataFrame({"seq_id": [1], "train_logprob": [-0.1]}).write_parquet(bad)
    r = runner.invoke(app, ["fit", str(bad), "-q"])
    assert r.exit_code == 2 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith(f"error: {tmp_path}/bad\\nname\\r.parquet: missing required"), \
        r.stderr
