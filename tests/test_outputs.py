"""Where outputs go: devices, FIFOs and symlinks; temporary files on SIGTERM."""

from __future__ import annotations

import io
import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from typer.testing import CliRunner

from entr_diag.atomic import output_target, write_text
from entr_diag.cli import app

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def run_file(tmp_path_factory) -> Path:
    from entr_diag.synth import SynthSpec, write_synth

    p = tmp_path_factory.mktemp("synth") / "run.parquet"
    write_synth(p, SynthSpec(n_tokens=20_000, seed=3, noise_share=0.1))
    return p


@pytest.fixture
def dev_null():
    """/dev/null, checked to be a character device before and after the test (and put
    back if a test broke it, so one failure cannot take the machine's /dev/null along)."""
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    yield "/dev/null"
    ok = stat.S_ISCHR(os.stat("/dev/null").st_mode)
    if not ok and os.geteuid() == 0:
        os.unlink("/dev/null")
        os.mknod("/dev/null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        os.chmod("/dev/null", 0o666)
    assert ok, "/dev/null was replaced by a regular file"


@pytest.fixture
def dev_stdout():
    """/dev/stdout, checked to be the symlink to /proc/self/fd/1 before and after the test
    (and put back if a test replaced it)."""
    assert os.readlink("/dev/stdout") == "/proc/self/fd/1"
    yield "/dev/stdout"
    ok = os.path.islink("/dev/stdout")
    if not ok and os.geteuid() == 0:
        os.unlink("/dev/stdout")
        os.symlink("/proc/self/fd/1", "/dev/stdout")
    assert ok, "/dev/stdout was replaced by a regular file"


class _FifoReader:
    """A FIFO in ``directory`` with a thread reading everything written to it."""

    def __init__(self, directory: Path, name: str = "out.fifo") -> None:
        self.path = directory / name
        os.mkfifo(self.path)
        self.data = b""
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        with open(self.path, "rb") as f:
            self.data = f.read()

    def result(self) -> bytes:
        self.thread.join(30)
        assert not self.thread.is_alive(), "nothing was written to the FIFO"
        assert stat.S_ISFIFO(os.lstat(self.path).st_mode)
        return self.data


# ------------------------------------------------------------------ output_target


def test_symlink_loop_as_output_is_refused(tmp_path):
    """An output path that is a symlink loop is refused naming the option (exit 2) and left
    as it is (it was replaced by a regular file)."""
    from entr_diag.errors import InputError

    loop = tmp_path / "loop.json"
    loop.symlink_to(loop)
    for args in (["fit", "-q", "--json", str(loop)], ["report", "-q", "-o", str(loop)],
                 ["synth", "-q", "-o", str(loop)]):
        r = runner.invoke(app, args)
        name = "--json" if "--json" in args else "--output"
        assert r.exit_code == 2, r.output
        assert r.stderr.startswith(f"error: cannot write {name} {loop}: it is a symlink loop")
        assert loop.is_symlink() and os.readlink(loop) == str(loop)
    with pytest.raises(InputError, match="symlink loop"):
        output_target(loop)


def test_output_target_kinds(tmp_path):
    """Regular files and new paths are written atomically (symlinks resolved); devices,
    FIFOs and open-descriptor paths straight through."""
    real = tmp_path / "real.json"
    link = tmp_path / "link.json"
    link.symlink_to(real)
    assert output_target(tmp_path / "new.json") == (tmp_path / "new.json", True)
    assert output_target(link) == (real, True)  # dangling: written at its target
    real.write_text("{}")
    assert output_target(link) == (real, True)
    os.mkfifo(tmp_path / "f")
    for special in ("/dev/null", "/dev/stdout", "/dev/stderr", "/proc/self/fd/1",
                    "/dev/fd/2", str(tmp_path / "f")):
        assert output_target(special) == (Path(special), False), special


def test_write_text_to_fifo_and_symlink(tmp_path):
    """write_text streams into a FIFO and replaces a symlink's target, not the link."""
    reader = _FifoReader(tmp_path)
    write_text(reader.path, "hello\n")
    assert reader.result() == b"hello\n"
    real = tmp_path / "sub" / "real.txt"
    real.parent.mkdir()
    real.write_text("old")
    link = tmp_path / "link.txt"
    link.symlink_to(Path("sub") / "real.txt")
    write_text(link, "new")
    assert link.is_symlink() and os.readlink(link) == str(Path("sub") / "real.txt")
    assert real.read_text() == "new"
    assert sorted(p.name for p in real.parent.iterdir()) == ["real.txt"]  # no temp left


# ------------------------------------------------------------------ commands


def test_outputs_to_dev_null_stay_a_device(run_file, dev_null):
    """report -o, flag -o, fit/report --json and compare --export to /dev/null write
    through it: it is still a character device afterwards."""
    for args in (["report", "-o", dev_null, "--json", dev_null, "--n-boot", "100"],
                 ["flag", "-o", dev_null, "--n-boot", "100"],
                 ["fit", "--json", dev_null, "--n-boot", "100"],
                 ["compare", "--export", dev_null, "--n-boot", "100"]):
        r = runner.invoke(app, [args[0], str(run_file), *args[1:], "-q"])
        assert r.exit_code == 0, (args, r.output)
        assert stat.S_ISCHR(os.stat(dev_null).st_mode), args


def test_flag_counts_tokens_written_to_a_device(run_file, tmp_path, dev_null):
    """flag reports the same token count whether it writes a file or /dev/null."""
    out = tmp_path / "noise.parquet"
    r1 = runner.invoke(app, ["flag", str(run_file), "-o", str(out), "--n-boot", "100", "-q"])
    r2 = runner.invoke(app, ["flag", str(run_file), "-o", dev_null, "--n-boot", "100", "-q"])
    assert r1.exit_code == r2.exit_code == 0, r1.output + r2.output
    n = pl.read_parquet(out).height
    assert n > 0
    assert f"{n:,} low-entropy noise tokens" in r1.stdout
    assert f"{n:,} low-entropy noise tokens" in r2.stdout and "/dev/null" in r2.stdout


def test_json_and_parquet_into_fifos(run_file, tmp_path):
    """--json and --export into FIFOs: the readers receive the whole document; the FIFOs
    stay FIFOs."""
    j = _FifoReader(tmp_path, "fit.fifo")
    r = runner.invoke(app, ["fit", str(run_file), "--json", str(j.path), "--n-boot", "100", "-q"])
    assert r.exit_code == 0, r.output
    doc = json.loads(j.result())
    assert doc["command"] == "fit"
    e = _FifoReader(tmp_path, "dec.fifo")
    r = runner.invoke(app, ["compare", str(run_file), "--export", str(e.path),
                            "--n-boot", "100", "-q"])
    assert r.exit_code == 0, r.output
    df = pl.read_parquet(io.BytesIO(e.result()))
    assert df.height > 0 and "seq_id" in df.columns


def test_json_to_dev_stdout_in_a_pipe(run_file, dev_stdout):
    """--json /dev/stdout writes the JSON into the pipe (subprocess: stdout is a pipe)."""
    p = subprocess.run(
        [sys.executable, "-m", "entr_diag", "inspect", str(run_file), "--json", dev_stdout,
         "-q"], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("{") and '"command": "inspect"' in p.stdout


def test_symlink_output_is_followed(run_file, tmp_path):
    """--json and -o through a symlink: the link stays, its target gets the output and no
    temporary file is left beside either."""
    (tmp_path / "out").mkdir()
    link = tmp_path / "fit.json"
    link.symlink_to(tmp_path / "out" / "fit.json")  # dangling at first
    hlink = tmp_path / "run.html"
    (tmp_path / "out" / "run.html").write_text("old report")
    hlink.symlink_to(tmp_path / "out" / "run.html")
    for _ in range(2):  # creates the JSON target, then replaces it
        r = runner.invoke(app, ["report", str(run_file), "--json", str(link), "-o", str(hlink),
                                "--n-boot", "100", "-q"])
        assert r.exit_code == 0, r.output
        assert link.is_symlink() and hlink.is_symlink()
        assert json.loads((tmp_path / "out" / "fit.json").read_text())["command"] == "report"
        assert (tmp_path / "out" / "run.html").read_text().startswith("<!")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fit.json", "out", "run.html"]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["fit.json", "run.html"]


def test_symlink_to_input_and_to_other_output_refused(run_file, tmp_path):
    """A symlink (or hard link) naming an input, or two outputs reaching one file, are
    refused before any work; two outputs to /dev/null are not."""
    inp = tmp_path / "in.parquet"
    inp.write_bytes(run_file.read_bytes())
    before = inp.read_bytes()
    (tmp_path / "to_in.json").symlink_to(inp)
    os.link(inp, tmp_path / "hard.parquet")
    for out in ("to_in.json", "hard.parquet"):
        r = runner.invoke(app, ["fit", str(inp), "--json", str(tmp_path / out), "-q"])
        assert r.exit_code == 2 and "never overwrites" in r.stderr, r.output
    assert inp.read_bytes() == before and (tmp_path / "to_in.json").is_symlink()
    (tmp_path / "a.json").symlink_to(tmp_path / "b.html")
    r = runner.invoke(app, ["report", str(inp), "-o", str(tmp_path / "b.html"),
                            "--json", str(tmp_path / "a.json"), "-q"])
    assert r.exit_code == 2 and "name the same file" in r.stderr, r.output
    assert not (tmp_path / "b.html").exists()


def test_synth_refuses_a_device_and_follows_a_symlink(tmp_path, dev_null):
    """synth writes regular files only: a device is refused (exit 2), a symlink followed."""
    r = runner.invoke(app, ["synth", "-o", dev_null, "--tokens", "2000", "-q"])
    assert r.exit_code == 2 and "regular file" in r.stderr, r.output
    link = tmp_path / "s.parquet"
    link.symlink_to(tmp_path / "real.parquet")
    r = runner.invoke(app, ["synth", "-o", str(link), "--tokens", "2000", "-q"])
    assert r.exit_code == 0, r.output
    assert link.is_symlink() and pl.read_parquet(tmp_path / "real.parquet").height > 0


def test_an_output_through_a_missing_folder_and_dotdot_never_replaces_the_input(
        tmp_path, run_file, monkeypatch):
    """'nosuch/../in.parquet' (a missing folder, then '..') and a dangling symlink pointing
    there: the kernel cannot open them, and they were resolved by text onto the input,
    which was replaced (exit 0). Refused, naming the missing folder; the input unchanged."""
    import hashlib
    import shutil

    monkeypatch.chdir(tmp_path)
    inp = tmp_path / "in.parquet"
    shutil.copy(run_file, inp)
    before = hashlib.sha256(inp.read_bytes()).hexdigest()
    (tmp_path / "out.json").symlink_to("nosuch/../in.parquet")
    for args in (["fit", "in.parquet", "--json", "nosuch/../in.parquet"],
                 ["flag", "in.parquet", "-o", "nosuch/../in.parquet"],
                 ["report", "in.parquet", "-o", "nosuch/../in.parquet"],
                 ["compare", "in.parquet", "--export", "nosuch/../in.parquet"],
                 ["fit", "in.parquet", "--json", "out.json"]):
        r = runner.invoke(app, [*args, "-q"])
        assert r.exit_code == 2, (args, r.output)
        assert "nosuch/.. does not exist" in r.stderr, r.stderr
        assert hashlib.sha256(inp.read_bytes()).hexdigest() == before, args
    # (a folder that exists, then '..': the input, named as such)
    (tmp_path / "d").mkdir()
    r = runner.invoke(app, ["fit", "in.parquet", "--json", "d/../in.parquet", "-q"])
    assert r.exit_code == 2 and "is one of the input files" in r.stderr, r.stderr


def test_synth_overwrites_only_its_own_runs(tmp_path, run_file):
    """synth over an existing file that it did not write (a real dump, a text file) is
    refused, exit 2, the file unchanged; over a run it wrote (marked in the Parquet
    metadata), through a symlink too, it writes the new run."""
    import hashlib

    from entr_diag.synth import is_synth_output

    dump = tmp_path / "dump.parquet"
    pl.read_parquet(run_file).write_parquet(dump)  # (no synth marker: a dump's copy)
    assert is_synth_output(run_file) and not is_synth_output(dump)
    notes = tmp_path / "notes.txt"
    notes.write_text("keep me")
    for f in (dump, notes):
        before = hashlib.sha256(f.read_bytes()).hexdigest()
        r = runner.invoke(app, ["synth", "-o", str(f), "--tokens", "2000", "-q"])
        assert r.exit_code == 2, r.output
        assert r.stderr == (f"error: --output {f} exists and is no run written by entr-diag "
                            "synth: not overwritten; remove it first or give another name.\n")
        assert hashlib.sha256(f.read_bytes()).hexdigest() == before
    out = tmp_path / "s.parquet"
    for n in ("2000", "3000"):
        r = runner.invoke(app, ["synth", "-o", str(out), "--tokens", n, "-q"])
        assert r.exit_code == 0 and is_synth_output(out), r.output
    link = tmp_path / "link.parquet"
    link.symlink_to(out)
    r = runner.invoke(app, ["synth", "-o", str(link), "--tokens", "2000", "-q"])
    assert r.exit_code == 0 and link.is_symlink(), r.output


# ------------------------------------------------------------------ signals

_BLOCKING_WRITE = """
import os, sys, time
from pathlib import Path
import numpy as np
import polars as pl

def slow_sink(self, path, *args, **kwargs):  # half a file, then wait for the signal
    Path(path).write_bytes(b"partial")
    Path(os.environ["MARKER"]).write_text(str(path))
    time.sleep(60)

pl.LazyFrame.sink_parquet = slow_sink
from entr_diag.cli import main
sys.argv = ["entr-diag", *sys.argv[1:]]
main()
"""


@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signal_while_writing_removes_the_temp_file(run_file, tmp_path, sig, code):
    """SIGTERM (like SIGINT) during an output write removes the temporary file and exits
    quietly with 128 + the signal number; nothing is left in the output directory."""
    script = tmp_path / "block.py"
    script.write_text(_BLOCKING_WRITE)
    marker = tmp_path / "marker"
    out_dir = tmp_path / "d"
    out_dir.mkdir()
    p = subprocess.Popen(
        [sys.executable, str(script), "compare", str(run_file), "--export",
         str(out_dir / "dec.parquet"), "--n-boot", "100", "-q"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), "MARKER": str(marker)},
        start_new_session=True,  # SIGINT not ignored as in a background job
    )
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert p.poll() is None, p.communicate()
            assert time.monotonic() < deadline, "the write never started"
            time.sleep(0.05)
        tmp = Path(marker.read_text())
        assert tmp.exists() and tmp.parent == out_dir and tmp.name.startswith(".dec.parquet.")
        p.send_signal(sig)
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == code, err
    assert "Traceback" not in err and "error" not in err
    assert list(out_dir.iterdir()) == []


# ------------------------------------------------------------------ outputs among inputs


@pytest.mark.parametrize("inp,out,why", [
    ("shards", "shards/noise.parquet", "inside the input directory"),
    ("shards/", "shards/sub/deep.json", "inside the input directory"),
    ("link", "shards/x.json", "inside the input directory"),  # the dir through a symlink
    ("shards", "outlink.json", "inside the input directory"),  # a link into the dir
    ("shards/*.parquet", "shards/n.parquet", "matches the input pattern"),
    ("shards/**/*.parquet", "shards/sub/n.parquet", "matches the input pattern"),
    ("sh*/s?b/[a-c].parquet", "shards/sub/c.parquet", "matches the input pattern"),
])
@pytest.mark.parametrize("opt", [["flag", "-o"], ["fit", "--json"], ["compare", "--export"],
                                  ["report", "--output"]])
def test_output_inside_input_directory_or_glob_refused(run_file, tmp_path, monkeypatch,
                                                       inp, out, why, opt):
    """An output inside an input directory (recursively) or matching an input glob is
    refused (exit 2) before any data is read, and nothing is written."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "shards" / "sub").mkdir(parents=True)
    for name in ("shards/a.parquet", "shards/sub/b.parquet"):
        (tmp_path / name).write_bytes(run_file.read_bytes())
    (tmp_path / "link").symlink_to("shards")
    (tmp_path / "outlink.json").symlink_to("shards/sub/new.json")
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))

    def no_read(*a, **k):
        raise AssertionError("data read")

    monkeypatch.setattr("entr_diag.io.load_dataset", no_read)
    r = runner.invoke(app, [opt[0], inp, opt[1], out, "-q"])
    assert r.exit_code == 2, r.output
    assert why in r.stderr and out in r.stderr and inp in r.stderr
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


@pytest.mark.parametrize("cmd,default", [("report", "entr-diag-report.html"),
                                         ("flag", "noise.parquet")])
def test_default_output_inside_the_input_directory_says_it_is_the_default(
        run_file, tmp_path, monkeypatch, cmd, default):
    """`report .` / `flag .` without -o: the refusal says the path is the default one and
    how to give another; only a Parquet output is said to be read by a later run."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.parquet").write_bytes(run_file.read_bytes())
    r = runner.invoke(app, [cmd, ".", "-q"])
    err = " ".join(r.stderr.split())
    assert r.exit_code == 2
    assert err.startswith(f"error: the default --output {default} lies inside the input "
                          "directory .:"), err
    assert "(give --output PATH)" in err
    assert ("would read it as input" in err) == default.endswith(".parquet")
    r = runner.invoke(app, [cmd, ".", "-q", "-o", default])  # named: not "the default"
    assert r.exit_code == 2 and "the default" not in r.stderr


def test_output_beside_an_input_glob_it_does_not_match_is_allowed(run_file, tmp_path,
                                                                  monkeypatch):
    """An output next to the inputs that the input glob does not match (another suffix,
    a hidden name, another directory level) is written."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "shards").mkdir()
    (tmp_path / "shards" / "a.parquet").write_bytes(run_file.read_bytes())
    for out in ("shards/fit.json", "shards/.fit.parquet", "fit.parquet"):
        r = runner.invoke(app, ["fit", "shards/*.parquet", "--json", out, "--n-boot", "100",
                                "-q"])
        assert r.exit_code == 0, (out, r.output)
        assert json.loads((tmp_path / out).read_text())["command"] == "fit"


def test_a_full_disk_is_named_as_a_write_failure(run_file, tmp_path, monkeypatch):
    """A full disk while writing says which output could not be written (was reported as
    'cannot read the input', or an errno without a path), exit 2, no temp file left; an
    earlier output stays as it was."""
    import errno

    import polars as pl

    def full_sink(self, path, *a, **k):
        Path(path).write_bytes(b"partial")
        raise pl.exceptions.ComputeError("failed to write: No space left on device (os error 28)")

    out = tmp_path / "flags.parquet"
    out.write_bytes(b"earlier run")
    monkeypatch.setattr(pl.LazyFrame, "sink_parquet", full_sink)
    r = runner.invoke(app, ["flag", str(run_file), "-o", str(out), "-q"])
    assert r.exit_code == 2, r.output
    assert r.stderr.strip() == f"error: cannot write {out}: No space left on device."
    assert out.read_bytes() == b"earlier run" and sorted(tmp_path.iterdir()) == [out]

    def full_write(self, *a, **k):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(Path, "write_text", full_write)
    html = tmp_path / "r.html"
    r = runner.invoke(app, ["report", str(run_file), "-o", str(html), "-q"])
    assert r.exit_code == 2 and f"cannot write {html}: No space left on device" in r.stderr
    assert not html.exists() and sorted(tmp_path.iterdir()) == [out]


@pytest.mark.parametrize("cmd", [["inspect"], ["fit"], ["compare"], ["report", "-o", "{d}/r.html"]])
def test_json_dash_writes_pure_json_to_stdout(run_file, tmp_path, monkeypatch, cmd):
    """``--json -`` writes the JSON document to stdout (pipeable into jq) and the tables to
    stderr; no file named '-' appears."""
    import json

    monkeypatch.chdir(tmp_path)
    args = [a.replace("{d}", str(tmp_path)) for a in cmd]
    r = runner.invoke(app, [args[0], str(run_file), *args[1:], "--json", "-", "-q"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["command"] == args[0]
    assert r.stderr.strip() and not (tmp_path / "-").exists()
    # stderr is not a terminal here: the tables are as wide as on a redirected stdout (80
    # columns cut every number of the bin and gate tables to "0.0…")
    assert "…" not in r.stderr


def test_json_dash_into_a_closed_pipe_exits_1_quietly(run_file):
    """``--json - | true``: the reader is gone before the JSON is written; exit 1 without an
    error message, as for the tables (the README's exit codes); a full stdout is named
    (exit 1 too: an output failure, not bad input), after the tables (on stderr under
    ``--json -``), as compare does."""
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "entr_diag", "fit", str(run_file), "--json", "-", "-q"]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.stdout is not None
    p.stdout.close()  # long before the fit writes anything
    err = p.stderr.read() if p.stderr else b""
    assert p.wait(timeout=120) == 1 and b"error" not in err, err
    if os.path.exists("/dev/full"):
        with open("/dev/full", "w") as full:
            r = subprocess.run(cmd, stdout=full, stderr=subprocess.PIPE, timeout=120)
        assert r.returncode == 1, r.stderr
        assert r.stderr.startswith(b"Verdict: ")
        assert r.stderr.endswith(b"\nerror: cannot write stdout: No space left on device.\n")
        assert r.stderr.count(b"error:") == 1


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_tables_into_a_full_stdout_exit_1_naming_stdout(run_file, tmp_path):
    """``entr-diag fit > /dev/full``: writing the tables fails with ENOSPC; one error line
    naming stdout and exit 1 (an output failure, as when its reader leaves; was exit 2 with
    a bare '[Errno 28]'), nothing else on stderr (no 'Exception ignored' at exit). With
    ``report -o FILE --json -`` the report is still written (as for a closed pipe)."""
    base = [sys.executable, "-m", "entr_diag"]
    with open("/dev/full", "w") as full:
        r = subprocess.run([*base, "fit", str(run_file), "--n-boot", "100", "-q"], stdout=full,
                           stderr=subprocess.PIPE, timeout=120)
        assert r.returncode == 1, r.stderr
        assert r.stderr == b"error: cannot write stdout: No space left on device.\n"
        out = tmp_path / "r.html"
        r = subprocess.run([*base, "report", str(run_file), "--n-boot", "100", "-q", "-o",
                            str(out), "--json", "-"], stdout=full, stderr=subprocess.PIPE,
                           timeout=120)
    assert r.returncode == 1, r.stderr
    lines = r.stderr.decode().splitlines()  # --json - takes stdout: the verdict goes to stderr
    assert lines[0].startswith(f"wrote {out} (") and len(lines) == 3, lines
    assert lines[-1] == ("error: cannot write stdout: No space left on device; every other "
                         "output was written.")
    assert out.stat().st_size > 100_000


def test_json_dash_whose_reader_leaves_midway_exits_1(run_file, tmp_path):
    """``--json - | head -c 10`` on a JSON larger than a pipe holds (64 kB): the reader
    leaves during the write; exit 1, not 0 on a JSON cut at 64 kB (Python's write of the
    large str returned as if complete); the report beside it is written."""
    import subprocess
    import sys

    out = tmp_path / "r.html"
    cmd = [sys.executable, "-m", "entr_diag", "report", str(run_file), "-o", str(out),
           "--json", "-", "-q"]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.stdout is not None and p.stderr is not None
    assert p.stdout.read(10) == b'{\n  "schem'
    p.stdout.close()
    err = p.stderr.read()
    assert p.wait(timeout=120) == 1 and b"error" not in err, err
    assert out.stat().st_size > 100_000
    full = subprocess.run(cmd, capture_output=True, timeout=120)
    assert full.returncode == 0 and len(full.stdout) > 65_536  # larger than a pipe holds


def test_dash_and_dev_stdout_as_output_paths(run_file, tmp_path, monkeypatch):
    """'-' is stdout only for --json: ``-o -`` is refused (it made a file named '-'); an
    output to /dev/stdout gets stdout to itself (the tables go to stderr), and two outputs
    into stdout are refused."""
    import subprocess
    import sys

    monkeypatch.chdir(tmp_path)
    for args in (["report", str(run_file), "-o", "-"], ["flag", str(run_file), "-o", "-"],
                 ["compare", str(run_file), "--export", "-"], ["synth", "-o", "-"]):
        r = runner.invoke(app, [*args, "-q"])
        assert r.exit_code == 2 and "give a file name ('-' means stdout only for --json" \
            in r.stderr, (args, r.output)
    assert not (tmp_path / "-").exists()
    base = [sys.executable, "-m", "entr_diag", "report", str(run_file), "-q", "-o", "/dev/stdout"]
    with open(tmp_path / "r.html", "w") as out:
        r = subprocess.run(base, stdout=out, stderr=subprocess.PIPE, timeout=120)
    assert r.returncode == 0 and b"wrote /dev/stdout" in r.stderr
    html = (tmp_path / "r.html").read_text()
    assert html.startswith("<!DOCTYPE html>") and html.rstrip().endswith("</html>")
    with open(tmp_path / "both.txt", "w") as out:
        r = subprocess.run([*base, "--json", "-"], stdout=out, stderr=subprocess.PIPE,
                           timeout=120)
    assert r.returncode == 2 and b"--output and --json both write to stdout" in r.stderr


def test_two_outputs_naming_stdout_are_refused_when_stdout_is_dev_null(run_file, tmp_path,
                                                                       dev_null, dev_stdout):
    """With stdout on /dev/null (a device), two outputs naming stdout itself (``--json -``
    and ``-o /dev/stdout``, or a symlink to it) are refused as into a file or a pipe; an
    output naming /dev/null beside ``--json -`` is not."""
    base = [sys.executable, "-m", "entr_diag", "report", str(run_file), "-q"]
    (tmp_path / "link.json").symlink_to(dev_stdout)
    for outs in (["-o", dev_stdout, "--json", "-"],
                 ["-o", dev_stdout, "--json", str(tmp_path / "link.json")]):
        r = subprocess.run([*base, *outs], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                           timeout=120)
        assert r.returncode == 2, (outs, r.stderr)
        assert r.stderr == b"error: --output and --json both write to stdout; send one of " \
            b"them to a file.\n", r.stderr
    r = subprocess.run([*base, "-o", dev_null, "--json", "-"], stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, timeout=120)
    assert r.returncode == 0 and b"wrote /dev/null" in r.stderr, r.stderr


def test_synth_on_a_full_disk_names_the_file(tmp_path, monkeypatch):
    """synth's writer failing (a full disk) names the output, exit 2, nothing left behind."""
    import errno

    import pyarrow.parquet as pq

    def full(self, *a, **k):
        raise OSError(errno.ENOSPC, "Error writing bytes to file")

    monkeypatch.setattr(pq.ParquetWriter, "write_table", full)
    out = tmp_path / "s.parquet"
    r = runner.invoke(app, ["synth", "-o", str(out), "--tokens", "1000", "-q"])
    assert r.exit_code == 2 and f"cannot write {out}: " in r.stderr
    assert list(tmp_path.iterdir()) == []


def test_outputs_of_one_run_replace_earlier_ones_together(run_file, tmp_path, monkeypatch):
    """A report and its JSON replace an earlier pair together or not at all: an interrupt
    (or error) after the HTML was written leaves both earlier files as they were, and no
    temporary file (was: a new HTML beside a stale JSON)."""
    from entr_diag import atomic

    html, js = tmp_path / "r.html", tmp_path / "r.json"
    html.write_text("old html")
    js.write_text("old json")

    def interrupted(path, doc):
        raise KeyboardInterrupt

    monkeypatch.setattr("entr_diag.report.json_report.write_json", interrupted)
    r = runner.invoke(app, ["report", str(run_file), "-o", str(html), "--json", str(js), "-q"])
    assert r.exit_code != 0
    assert html.read_text() == "old html" and js.read_text() == "old json"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.html", "r.json"]
    monkeypatch.undo()
    with atomic.together():  # both renamed at the end of the block
        atomic.write_text(html, "new html")
        assert html.read_text() == "old html"
        atomic.write_text(js, "new json")
    assert html.read_text() == "new html" and js.read_text() == "new json"


def test_a_failed_rename_puts_the_outputs_renamed_before_it_back(run_file, tmp_path,
                                                                 monkeypatch):
    """The JSON's rename fails after the HTML's (an immutable target: EPERM): the HTML is
    put back as it was and a new third output removed, no hard link or temporary file is
    left, and the refusal says no output was replaced (it left a new HTML beside a stale
    JSON and said nothing of it, helper-32 F2)."""
    import errno

    from entr_diag import atomic

    html, js, new = tmp_path / "r.html", tmp_path / "r.json", tmp_path / "n.txt"
    html.write_text("old html")
    js.write_text("old json")
    real = os.replace

    def replace(src, dst):
        if Path(dst).name == "r.json" and ".tmp" in str(src):
            raise PermissionError(errno.EPERM, "Operation not permitted")
        return real(src, dst)

    monkeypatch.setattr(atomic.os, "replace", replace)
    r = runner.invoke(app, ["report", str(run_file), "-o", str(html), "--json", str(js), "-q"])
    assert r.exit_code == 2, r.output
    assert r.stderr == (f"error: cannot write {js}: Operation not permitted; no output was "
                        "replaced.\n"), r.stderr
    assert html.read_text() == "old html" and js.read_text() == "old json"
    with pytest.raises(atomic.InputError, match="no output was replaced"), atomic.together():
        atomic.write_text(new, "new")
        atomic.write_text(html, "new html")
        atomic.write_text(js, "new json")
    assert not new.exists() and html.read_text() == "old html"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.html", "r.json"]


def test_json_floats_keep_twelve_significant_digits():
    """Floats are written with 12 significant digits: a sum whose last bit depends on the
    order threads added its parts gives the same document; NaN/inf stay null."""
    from entr_diag.report.json_report import dumps, sanitize

    a = sum([0.1, 0.2, 0.3])  # 0.6000000000000001
    b = sum([0.3, 0.2, 0.1])  # 0.6
    assert a != b and sanitize(a) == sanitize(b) == 0.6
    assert sanitize({"x": [1 / 3, np.float32(2.5), float("nan")]}) == {
        "x": [0.333333333333, 2.5, None]}
    assert sanitize(123456789.123456789) == 123456789.123 and sanitize(7) == 7
    assert dumps({"v": a}) == dumps({"v": b})


# ------------------------------------------------------------------ readers that leave


def _closed_stdout_run(args: list[str], cwd: Path) -> tuple[int, str]:
    """Run ``entr-diag ARGS -q`` with its stdout a pipe whose reader is gone before anything
    is written (as ``| head -c 0``); returns (exit code, stderr)."""
    p = subprocess.Popen([sys.executable, "-m", "entr_diag", *args, "-q"], cwd=cwd,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.stdout is not None and p.stderr is not None
    p.stdout.close()
    err = p.stderr.read()
    return p.wait(timeout=120), err


@pytest.mark.parametrize("args,closed,written", [
    (["report", "-o", "/dev/stdout", "--json", "r.json"], "/dev/stdout", ["r.json"]),
    (["compare", "--export", "/dev/stdout", "--json", "c.json"], "/dev/stdout", ["c.json"]),
    (["flag", "-o", "/dev/stdout"], "/dev/stdout", []),
    (["report", "-o", "r.html", "--json", "-"], None, ["r.html"]),
    (["compare", "--export", "c.parquet", "--json", "-"], None, ["c.parquet"]),
])
def test_an_output_into_a_closed_stdout_exits_1_after_the_others(run_file, tmp_path,
                                                                 dev_stdout, args, closed,
                                                                 written):
    """An output into stdout whose reader is gone (``| head``): exit 1, every other output
    written, and for an output named by path (/dev/stdout) one line naming it, never blaming
    the input (was: exit 2, 'cannot read the input: ... Broken pipe' or 'cannot write
    /dev/stdout', and the other outputs missing; with ``--json -`` the others were missing
    too); report's lines (wrote, verdict) and compare's tables, on stderr, still print
    before it."""
    code, err = _closed_stdout_run([args[0], str(run_file), *args[1:], "--n-boot", "100"],
                                   tmp_path)
    assert code == 1, err
    assert "Traceback" not in err and "input" not in err
    lines = err.splitlines()
    errors = [x for x in lines if x.startswith("error:")]
    if args[0] == "report":  # its lines still print (on stderr: stdout carries an output)
        assert lines[0].startswith(("law ", "wrote r.html (")), err
        assert any(x.startswith("law ") for x in lines), err
    elif args[0] == "compare":  # so do its tables
        assert lines[0].startswith("Gates on "), err
    else:
        assert len(lines) == len(errors), err
    if closed is None:  # stdout itself, as for the tables: no error line
        assert errors == []
    else:
        assert errors == lines[-1:], err
        assert err.endswith(".\n") and lines[-1].startswith(
            f"error: cannot write {closed}: its reader closed it before the end (broken pipe)")
        assert ("every other output was written" in err) == bool(written), err
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(written)
    for name in written:
        if name.endswith(".json"):
            assert json.loads((tmp_path / name).read_text())["command"] == args[0]
        elif name.endswith(".parquet"):
            assert pl.read_parquet(tmp_path / name).height > 0
        else:
            assert (tmp_path / name).read_text().rstrip().endswith("</html>")


def _run_into_a_leaving_reader(tmp_path: Path, args: list[str], outputs: dict[str, str],
                               into: str) -> tuple[subprocess.CompletedProcess, dict[str, Path]]:
    """Run ``entr-diag ARGS`` with its ``outputs`` (option -> file name in ``tmp_path``),
    the one of option ``into`` a FIFO whose reader reads 10 bytes and leaves (as ``head -c
    10 FIFO``). Checks exit 1, one error naming the FIFO and no ``wrote`` for it; returns
    the result and the paths by option."""
    paths = {opt: tmp_path / name for opt, name in outputs.items()}
    fifo = paths[into] = tmp_path / "out.fifo"
    os.mkfifo(fifo)

    def read_a_little() -> None:
        with open(fifo, "rb") as f:
            f.read(10)

    reader = threading.Thread(target=read_a_little, daemon=True)
    reader.start()
    opts = [str(x) for opt, path in paths.items() for x in (opt, path)]
    r = subprocess.run([sys.executable, "-m", "entr_diag", *args, *opts, "--n-boot", "100"],
                       capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    reader.join(10)
    assert r.returncode == 1, r.stderr
    assert f"error: cannot write {fifo}: its reader closed it before the end" in r.stderr
    assert f"wrote {fifo}" not in r.stderr + r.stdout
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    return r, paths


@pytest.mark.parametrize("into_fifo", ["-o", "--json"])
def test_a_fifo_whose_reader_leaves_is_named_and_the_rest_written(run_file, tmp_path,
                                                                  into_fifo):
    """A report output into a FIFO whose reader reads a little and leaves: exit 1, the
    error names the FIFO, the other output is written and said to be (``wrote`` only for
    it), and the verdict is still printed on stdout (was: no line on stdout at all)."""
    r, paths = _run_into_a_leaving_reader(tmp_path, ["report", str(run_file)],
                                          {"-o": "r.html", "--json": "r.json"}, into_fifo)
    html, js = paths["-o"], paths["--json"]
    if into_fifo == "-o":
        assert f"wrote {js}" in r.stderr
        assert json.loads(js.read_text())["command"] == "report"
    else:
        assert r.stdout.startswith(f"wrote {html} (")
        assert html.read_text().rstrip().endswith("</html>")
    verdict = r.stdout.splitlines()[-1]
    assert verdict.startswith("law "), r.stdout


@pytest.mark.parametrize("into_fifo", ["--json", "--export"])
def test_compare_into_a_fifo_whose_reader_leaves_still_prints_its_tables(run_file, tmp_path,
                                                                        into_fifo):
    """compare with its JSON or its export in a FIFO whose reader leaves: exit 1, the error
    names the FIFO, the other output is written and said to be, and the gate tables are
    still printed on stdout (were not printed at all)."""
    r, paths = _run_into_a_leaving_reader(tmp_path, ["compare", str(run_file)],
                                          {"--json": "c.json", "--export": "c.parquet"},
                                          into_fifo)
    other = paths["--export" if into_fifo == "--json" else "--json"]
    assert f"wrote {other}" in r.stderr and other.stat().st_size > 0
    assert "Gates on " in r.stdout and "Matched budget" in r.stdout, r.stdout


def test_a_failed_group_never_says_it_wrote(run_file, tmp_path, monkeypatch):
    """'wrote FILE' is said once the outputs of a run are in place: when the export fails
    (a full disk), the JSON written before it is not renamed into place, and not announced
    (was: 'wrote c.json' on stderr, and no c.json)."""
    def full_sink(self, path, *a, **k):
        raise pl.exceptions.ComputeError("failed to write: No space left on device (os error 28)")

    monkeypatch.setattr(pl.LazyFrame, "sink_parquet", full_sink)
    js, ex = tmp_path / "c.json", tmp_path / "c.parquet"
    r = runner.invoke(app, ["compare", str(run_file), "--json", str(js), "--export", str(ex),
                            "--n-boot", "100"])
    assert r.exit_code == 2, r.output
    assert f"cannot write {ex}: No space left on device" in r.stderr
    assert "wrote" not in r.stderr and list(tmp_path.iterdir()) == []


def test_atomic_outputs_whose_reader_left(tmp_path):
    """Library level: a write into a pipe whose reader is gone raises OutputClosedError
    (exit code 1) naming it; within together(), the other outputs are still written and
    announced, and the error is raised at the end."""
    from entr_diag import atomic
    from entr_diag.errors import OutputClosedError

    r, w = os.pipe()
    os.close(r)
    pipe = f"/proc/self/fd/{w}"
    try:
        with pytest.raises(OutputClosedError) as e:
            atomic.write_text(pipe, "x" * 100_000)
        assert e.value.exit_code == 1
        assert str(e.value).startswith(f"cannot write {pipe}: its reader closed it")
        said = []
        with pytest.raises(OutputClosedError) as e:
            with atomic.together():
                atomic.write_text(pipe, "x")
                atomic.when_written(pipe, lambda: said.append(pipe))
                atomic.write_with(tmp_path / "b.txt", lambda p: Path(p).write_text("b"))
                atomic.when_written(tmp_path / "b.txt", lambda: said.append("b"))
        assert "every other output was written" in str(e.value)
        assert (tmp_path / "b.txt").read_text() == "b" and said == ["b"]
    finally:
        os.close(w)


def test_flag_to_dev_stdout_says_its_count_on_stderr(run_file, tmp_path, dev_stdout):
    """``flag -o /dev/stdout > FILE``: FILE holds the flagged tokens' Parquet alone; the
    count goes to stderr like other commands' tables (was: printed on stdout, over the
    beginning of the Parquet file)."""
    out = tmp_path / "flags.parquet"
    with open(out, "wb") as f:
        r = subprocess.run([sys.executable, "-m", "entr_diag", "flag", str(run_file), "-o",
                            dev_stdout, "--n-boot", "100", "-q"], stdout=f,
                           stderr=subprocess.PIPE, text=True, timeout=120,
                           env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr
    n = pl.read_parquet(out).height
    assert n > 0 and f"{n:,} low-entropy noise tokens" in r.stderr


# ------------------------------------------------------------------ a FIFO without a reader


@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
@pytest.mark.parametrize("cmd", [["flag", "-o"], ["compare", "--json", "c.json", "--export"],
                                 ["fit", "--json"]])
def test_an_output_into_a_fifo_without_reader_is_interruptible(run_file, tmp_path, sig,
                                                                code, cmd):
    """An output into a FIFO nobody reads waits for a reader, but SIGTERM and Ctrl-C end
    the wait: exit 143 / 130, quietly, the FIFO left a FIFO and no other output written
    (was: a Parquet output waited in the FIFO's open on a polars worker thread, past both
    signals, forever; and polars' SIGINT handler, installed with SA_RESTART, had the kernel
    restart any blocking open of a FIFO after Ctrl-C, so that the JSON waited past it too)."""
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    p = subprocess.Popen(
        [sys.executable, "-m", "entr_diag", cmd[0], str(run_file), *cmd[1:], str(fifo),
         "--n-boot", "100"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
        start_new_session=True)  # SIGINT not ignored as in a background job
    assert p.stderr is not None
    try:
        # the accounting line is held until the outputs begin: then the FIFO is opened
        first = p.stderr.readline()
        assert "valid loss-masked tokens" in first, first + p.communicate()[1]
        time.sleep(1)
        assert p.poll() is None, p.communicate()
        p.send_signal(sig)
        _, err = p.communicate(timeout=15)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert p.returncode == code, err
    assert "Traceback" not in err and "error" not in err
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert [x.name for x in tmp_path.iterdir()] == ["out.fifo"]


def test_flag_into_a_fifo_with_a_reader_delivers_the_whole_parquet(run_file, tmp_path):
    """With a reader on the FIFO, ``flag -o FIFO`` sends it the same tokens a file gets."""
    reader = _FifoReader(tmp_path, "flags.fifo")
    r = subprocess.run([sys.executable, "-m", "entr_diag", "flag", str(run_file), "-o",
                        str(reader.path), "--n-boot", "100", "-q"], capture_output=True,
                       text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr
    got = pl.read_parquet(io.BytesIO(reader.result()))
    out = tmp_path / "flags.parquet"
    r = runner.invoke(app, ["flag", str(run_file), "-o", str(out), "--n-boot", "100", "-q"])
    assert r.exit_code == 0, r.output
    assert got.height > 0 and got.equals(pl.read_parquet(out))


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_a_full_device_named_as_an_output_is_like_a_full_stdout(run_file, tmp_path):
    """`-o /dev/full` (a device that is full) does not stop the other outputs: they are
    written, the verdict printed, then one error line naming it and exit 1, as for a full
    stdout (was exit 2 with nothing written)."""
    j = tmp_path / "r.json"
    r = runner.invoke(app, ["report", str(run_file), "-o", "/dev/full", "--json", str(j),
                            "-q", "--n-boot", "100"])
    assert r.exit_code == 1, r.output
    assert json.loads(j.read_text())["command"] == "report"
    assert r.stderr.strip() == ("error: cannot write /dev/full: No space left on device; "
                                "every other output was written.")
    assert "Traceback" not in r.output and "law" in r.stdout
    r = runner.invoke(app, ["flag", str(run_file), "-o", "/dev/full", "-q"])
    assert r.exit_code == 1 and "cannot write /dev/full: No space left on device" in r.stderr


def test_a_parquet_output_named_otherwise_gets_a_note(run_file, tmp_path):
    """flag -o x.csv / compare --export x.txt write Parquet whatever the suffix: a note says
    so (not with --quiet, nor for .parquet or a device)."""
    for args in (["flag", "--output", str(tmp_path / "n.csv")],
                 ["compare", "--export", str(tmp_path / "d.txt")]):
        r = runner.invoke(app, [args[0], str(run_file), *args[1:], "--n-boot", "100"])
        assert r.exit_code == 0, r.output
        assert f"note: {args[1]} {args[2]} is written as Parquet" in " ".join(r.stderr.split())
        assert Path(args[2]).read_bytes()[:4] == b"PAR1"
        r = runner.invoke(app, [args[0], str(run_file), *args[1:], "--n-boot", "100", "-q"])
        assert "written as Parquet" not in r.stderr
    r = runner.invoke(app, ["flag", str(run_file), "-o", str(tmp_path / "n.parquet"),
                            "--n-boot", "100"])
    assert r.exit_code == 0 and "written as Parquet" not in r.stderr


def test_an_output_whose_parent_is_a_file_says_so(tmp_path):
    """-o notes.txt/run.html: the parent is a file, not a missing directory."""
    from typer.testing import CliRunner

    from entr_diag.cli import app

    f = tmp_path / "notes.txt"
    f.write_text("x")
    r = CliRunner().invoke(app, ["fit", "--json", str(f / "fit.json"), "-q"])
    assert r.exit_code == 2
    assert f"{f} is a file, not a directory." in " ".join(r.output.split())
    r = CliRunner().invoke(app, ["fit", "--json", str(tmp_path / "no" / "fit.json"), "-q"])
    assert r.exit_code == 2 and "does not exist" in r.output


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
@pytest.mark.parametrize("command", ["fit", "inspect"])
def test_a_failed_json_output_still_prints_the_tables(run_file, command):
    """fit and inspect with ``--json /dev/full``: exit 1 with one error naming the JSON
    output, after the tables, which are still printed on stdout (were not printed at all:
    the README's exit 1 comes after every other output), as compare does."""
    extra = ["--n-boot", "100"] if command == "fit" else []
    r = subprocess.run([sys.executable, "-m", "entr_diag", command, str(run_file), "-q",
                        "--json", "/dev/full", *extra], capture_output=True, text=True,
                       timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 1, r.stderr
    assert r.stderr == "error: cannot write /dev/full: No space left on device.\n"
    first = {"fit": "Verdict: ", "inspect": "1 file(s), layout long"}[command]
    assert r.stdout.startswith(first), r.stdout[:300]
    assert "Mismatch forensics" in r.stdout


def test_thresholds_re_applied_to_tokens_keep_every_digit(run_file, tmp_path):
    """The matched band's c is one token's |delta|: rounded to 12 digits, |delta| <= c kept
    one token fewer than the JSON said (helper-32 F6). c and the gates' parameters keep
    every digit (as the specs do); other floats keep 12."""
    from entr_diag.io import load_dataset
    from entr_diag.report.json_report import dumps, sanitize

    x = 0.43944695591926575
    doc = {"matched": {"c": x, "v": x}, "c": x, "gate": {"params": {"c": x, "n": 3}}}
    assert json.loads(dumps(sanitize(doc))) == {
        "matched": {"c": x, "v": 0.439446955919}, "c": 0.439446955919,
        "gate": {"params": {"c": x, "n": 3}}}
    assert sanitize({"params": {"c": float("inf")}}) == {"params": {"c": None}}
    assert all(type(v) is float for v in (sanitize(doc)["matched"]["c"],))  # (plain floats)
    js = tmp_path / "c.json"
    r = runner.invoke(app, ["compare", str(run_file), "--json", str(js), "-q",
                                 "--gate", "fixed:c=log2", "--gate", "mis"])
    assert r.exit_code == 0, r.output
    cmp = json.loads(js.read_text())["compare"]
    m = cmp["matched"]
    assert m["c"] == m["fixed"]["params"]["c"] == float(m["fixed"]["spec"].split("=")[1])
    delta = load_dataset([run_file]).lf.select("delta").collect()["delta"]
    assert int((delta.abs() <= m["c"]).sum()) == m["fixed"]["kept_tokens"]
    fixed = next(g for g in cmp["gates"] if g["name"] == "fixed")
    assert fixed["params"]["c"] == 0.6931471805599453
