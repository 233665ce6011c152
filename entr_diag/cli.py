"""The ``entr-diag`` command line: parse options, call the library, render its results.

No statistic is computed here. Library errors (:class:`~entr_diag.errors.EntrDiagError`)
become one paragraph on stderr and exit code 2; results go to stdout (tables) or files.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import sys
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated

import polars as pl
import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    Progress,
    ProgressColumn,
    SpinnerColumn,
    Task,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.text import Text
from typer.core import TyperCommand, TyperGroup

from entr_diag import __version__
from entr_diag.aggregate import DEFAULT_BINS
from entr_diag.errors import EntrDiagError, FitError, ParameterError

#: click's exception classes, found through typer's public BadParameter (typer vendors click
#: in recent versions, so ``import click`` may not be the click typer raises from)
_ClickException = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")


def _given_value(args: list[str], opts: list[str]) -> str | None:
    """The last value given on the command line to an option spelled ``opts``."""
    value = None
    for i, a in enumerate(args):
        for o in opts:
            if a == o and i + 1 < len(args):
                value = args[i + 1]
            elif o.startswith("--") and a.startswith(o + "="):
                value = a[len(o) + 1:]
    return value


def _usage_message(e, args: list[str]) -> str:
    """One sentence for a command-line usage error of click/typer (a bad option value, an
    unknown option or command, a missing option), naming the option and the bad value."""
    name = type(e).__name__
    param = getattr(e, "param", None)
    ctx = getattr(e, "ctx", None)
    see = f" See '{ctx.command_path} --help'." if ctx is not None else ""
    if name == "BadParameter" and param is not None and getattr(param, "opts", None):
        opts = [*param.opts, *getattr(param, "secondary_opts", [])]
        opt = max(opts, key=len)
        value = _given_value(args, opts)
        lo = getattr(param, "min", getattr(getattr(param, "type", None), "min", None))
        hi = getattr(param, "max", getattr(getattr(param, "type", None), "max", None))
        if lo is not None and hi is not None:
            bounds = f"{lo} to {hi:,}"
        else:
            bounds = f">= {lo}" if lo is not None else f"<= {hi}" if hi is not None else ""
        try:
            x = float(value) if value is not None else math.nan
        except ValueError:
            x = math.nan
        if (lo is not None and x < lo) or (hi is not None and x > hi):
            why = f"out of range ({bounds})"
        else:  # not a number of the right kind: pydantic's first clause, e.g. "should be a
            # valid integer"; click's message otherwise
            why = str(getattr(e, "message", "") or e.format_message())
            why = why.replace("Input should be", "must be").split(",")[0].rstrip(".")
            why = why[:1].lower() + why[1:] + (f" ({bounds})" if bounds else "")
        shown = f" {value}" if value is not None else ""
        return f"{opt}{shown}: {why}.{see}"
    msg = e.format_message().strip().rstrip(".")
    end = "" if msg.endswith(("?", "!")) else "."  # ("Did you mean 'fit'?")
    hint = ""
    if name == "NoSuchOption":  # a file named like an option: '-dash.parquet'
        opt = getattr(e, "option_name", "") or ""
        dashed = [a for a in args if a.startswith(opt) and a != opt] if opt else []
        named = dashed[0] if dashed else opt
        if named and ("." in named or "/" in named):
            hint = (f" A file named '{named}'? Put -- before the file names "
                    f"(entr-diag ... -- {named}) or write it as ./{named}.")
    return f"{msg[:1].lower() + msg[1:]}{end}{hint}{see}"


def _plain_flags(params: list) -> list:
    """``params`` with the boolean flags (``--quiet``, ``--help``, ``--dirty/--no-dirty``...)
    given an empty metavar: typer's help would show their type as ``<bool>``, though a flag
    takes no value; and the arguments named by a metavar (``PATH``) without their Python
    type beside it (``<list[str]>``)."""
    for p in params:
        if getattr(p, "is_flag", False) and p.metavar is None:
            p.metavar = ""
        elif getattr(p, "param_type_name", "") == "argument" and p.metavar:
            p.display_type_rich = lambda ctx: None
    return params


_UsageError = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")


def _repeated_option(params: list, args: list[str]) -> str | None:
    """The refusal when an option that takes one value (not a flag, not repeatable:
    ``--json``, ``--tau``...) is given more than once in ``args`` (click would keep the
    last silently: ``--json a.json --json b.json`` writes only b.json), else None."""
    for p in params:
        opts = [*getattr(p, "opts", ())]
        if (getattr(p, "param_type_name", "") != "option" or p.multiple or p.is_flag
                or p.count):
            continue
        seen, i = [], 0
        while i < len(args) and args[i] != "--":
            a = args[i]
            if a in opts:
                seen.append(args[i + 1] if i + 1 < len(args) else "")
                i += 2
                continue
            long = next((o for o in opts if o.startswith("--") and a.startswith(o + "=")), None)
            if long:
                seen.append(a[len(long) + 1:])
            i += 1
        if len(seen) > 1:
            opt = max(opts, key=len)
            return (f"option {opt} is given {len(seen)} times ({', '.join(seen)}); it takes "
                    "one value: give it once")
    return None


#: the command being run (e.g. 'entr-diag report'), for the '--help' hint of a refusal raised
#: in its body as in a usage error (:func:`_check_output`)
_COMMAND_PATH: list[str] = []


class _Command(TyperCommand):
    """An ``entr-diag`` command: its help shows flags without a value type; an option that
    takes one value, given twice, is refused (:func:`_repeated_option`)."""

    def get_params(self, ctx) -> list:
        return _plain_flags(super().get_params(ctx))

    def parse_args(self, ctx, args: list[str]) -> list[str]:
        _COMMAND_PATH[:] = [ctx.command_path]
        why = _repeated_option(self.get_params(ctx), list(args))
        if why:
            raise _UsageError(why, ctx=ctx)
        return super().parse_args(ctx, args)


class _Group(TyperGroup):
    """The ``entr-diag`` command group: click/typer usage errors (bad option values, unknown
    options or commands, missing options) print one plain ``error: ...`` line on stderr and
    exit with code 2, like every other refusal, instead of a usage block and a boxed panel.
    Its help, like its commands' (:class:`_Command`), shows flags without a value type."""

    def get_params(self, ctx) -> list:
        return _plain_flags(super().get_params(ctx))

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        argv = list(sys.argv[1:] if args is None else args)
        try:
            rv = super().main(argv, prog_name, complete_var, standalone_mode=False, **extra)
        except _ClickException as e:
            if type(e).__name__ != "NoArgsIsHelpError":  # that one has printed the help
                stderr.print(f"[bold red]error:[/bold red] {escape(_usage_message(e, argv))}",
                             soft_wrap=True)
            sys.exit(e.exit_code)
        sys.exit(rv if isinstance(rv, int) else 0)


app = typer.Typer(
    cls=_Group,
    name="entr-diag",
    help=(
        "Offline diagnostic for train-inference log-ratio mismatch in asynchronous RL "
        "rollout logs (arXiv:2607.22186, ENTR/ESTR). With no PATHS, every command uses the "
        "bundled sample run."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
    rich_markup_mode="rich",
)

class _Stdout(Console):
    """The results console: its first print ends the progress bar (on stderr), so that on a
    terminal no frame of the bar is left in or between the result tables, and prints the
    notes held until then (:class:`_Notes`). A failure to write the tables other than their
    reader leaving (which rich handles: exit 1, quietly), e.g. stdout redirected to a full
    device, is an output failure naming the stream (exit 1), not bad input."""

    def print(self, *args, **kwargs) -> None:  # type: ignore[override]
        _phases.end()
        _notes.flush()
        try:
            super().print(*args, **kwargs)
        except OSError as e:
            from entr_diag.atomic import reader_left

            reader_left("stderr" if self.stderr else "stdout", why=e.strerror or str(e))


stdout = _Stdout(highlight=False, soft_wrap=False, emoji=False)
if not stdout.is_terminal:  # piped or redirected: wide enough for the bin tables
    stdout = _Stdout(highlight=False, soft_wrap=False, emoji=False, width=120)
stderr = Console(stderr=True, highlight=False, emoji=False)
if not stderr.is_terminal:  # a log file: one line per message, no hard wraps
    stderr = Console(stderr=True, highlight=False, emoji=False, soft_wrap=True)
#: the tables when stdout carries an output (``--json -``): on stderr, as wide as on a
#: redirected stdout when stderr is not a terminal (80 columns cut every number to "0.0…")
stderr_tables = _Stdout(stderr=True, highlight=False, soft_wrap=False, emoji=False,
                        **({} if stderr.is_terminal else {"width": 120}))

# ----------------------------------------------------------------- shared options

Paths = Annotated[
    list[str] | None,
    typer.Argument(
        help="Parquet files, directories (recursive) or globs. Default: the bundled sample run.",
        show_default=False, metavar="PATH",
        parser=str,  # the strings as typed: Path("") would be ".", the current directory
    ),
]
ColumnOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--column", "-c", metavar="CANONICAL=SOURCE",
        help="Map a source column to a canonical one (repeatable), e.g. "
        "--column entropy=entropys (verl's name).",
    ),
]
FrameworkOpt = Annotated[
    str | None,
    typer.Option(help="Use a framework's column names: verl, slime, areal, openrlhf, trl, "
                 "nemo-rl, roll, skyrl, prime-rl."),
]
LayoutOpt = Annotated[
    str, typer.Option(help="auto (detect per file), long (row per token) or nested (row per sequence).")
]
EntropyOpt = Annotated[
    str, typer.Option(help="Which entropy: auto (inference-side, else trainer-side), infer, train.")
]
_GATE_HELP = ("A gate to compare (repeatable), e.g. fixed:c=0.5, icepop:low=0.5,high=5, mis, "
              "areal:cap=5, tis:cap=2, seq-is, seq-tis:cap=2, geo-rs, k3, veto, m2po, entr:tau=4. "
              "Default: the panel.")


def _output_path(value) -> Path | str:
    """An output option's value as typed: a Path, or ``''`` kept apart (``Path('')`` would be
    ``.``, the current directory) for :func:`_check_output` to refuse naming the option."""
    text = str(value)
    if text.endswith(("/", "/.", "/..")) or text in (".", ".."):
        # Path() would drop the slash and a missing 'out/' would become a file named out
        raise typer.BadParameter(f"names a directory; give a file name in it "
                                 f"({text.rstrip('/') or ''}/FILE)")
    name = text.rsplit("/", 1)[-1]
    if name and (not name.strip() or name != name.strip()):
        # `-o ' '` or a stray quoted space: a file nobody could find by its name
        raise typer.BadParameter(f"the file name {name!r} " + (
            "is only blank space" if not name.strip() else
            "starts or ends with blank space") + "; give a file name without it")
    return "" if text == "" else Path(value)


JsonOpt = Annotated[Path | None, typer.Option("--json", parser=_output_path, metavar="FILE", help="Also write the results as JSON to this file ('-': to stdout, the tables then go to stderr).")]
SkipUnreadableOpt = Annotated[bool, typer.Option(
    "--skip-unreadable",
    help="Leave out input files that cannot be read as Parquet (truncated, empty, another "
         "format) with a warning, instead of refusing the input.")]
SeqIdPerFileOpt = Annotated[bool, typer.Option(
    "--seq-id-per-file",
    help="The seq_ids are local to each input file (per-rank indices restarting in each "
         "file): key sequences by (file, step, seq_id), so that equal ids in two files "
         "never merge.")]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="No progress or notes on stderr (warnings still print).")]
def _float_as_typed(value) -> float:
    """A float option's value; one written as a finite number too large for a float
    (``1e400``) is refused as that, not read as ``inf`` (and then echoed as ``inf``)."""
    text = str(value).strip()
    try:
        v = float(text)
    except ValueError:
        raise typer.BadParameter("must be a valid number") from None
    if math.isinf(v) and text.lower().lstrip("+-") not in ("inf", "infinity"):
        raise typer.BadParameter("too large for a float (it would read as infinity)")
    return v


TauOpt = Annotated[float, typer.Option(parser=_float_as_typed, metavar="FLOAT",
                                       help="ENTR budget tau: keep iff delta^2/(H+eps) <= tau.")]
EpsOpt = Annotated[float, typer.Option(parser=_float_as_typed, metavar="FLOAT",
                                       help="ENTR entropy offset eps (nats).")]
BinsOpt = Annotated[int, typer.Option(min=3, max=500, help="Number of entropy bins (3 to 500).")]
BinEdgesOpt = Annotated[str, typer.Option(help="Entropy bin edges: quantile or log.")]
BootOpt = Annotated[int, typer.Option(min=100, max=100_000, help="Bootstrap resamples (sequences, never tokens; 100 to 100000).")]
SeedOpt = Annotated[int, typer.Option(min=0, help="Seed of the bootstrap (>= 0).")]
MisalignedOpt = Annotated[
    bool, typer.Option("--allow-misaligned",
                       help="Analyse even when the two logprob columns look shifted by 1 to 3 tokens (in every sequence or in some).")
]


def _parse_columns(items: list[str] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items or []:
        if "=" not in item:
            raise ParameterError(
                f"--column {item}: expected CANONICAL=SOURCE, e.g. --column infer_logprob=rollout_log_probs."
            )
        canon, src = (part.strip() for part in item.split("=", 1))
        if canon in out and out[canon] != src:
            raise ParameterError(
                f"--column {canon}={out[canon]} and --column {canon}={src}: {canon} is mapped "
                "twice; give one source column."
            )
        out[canon] = src
    return out


class _RowsColumn(ProgressColumn):
    """``1.2/4.9M tokens`` (valid loss-masked tokens read) during a pass over the tokens;
    ``3.1/5.0M rows`` (token rows read, masked or not) while the input is read; nothing
    otherwise."""

    def render(self, task: Task) -> Text:
        done = int(task.completed)
        unit = task.fields.get("unit", "tokens")
        if task.total is None:
            if not done:
                return Text("")
            return Text(f"{done / 1e6:.1f}M {unit}" if done >= 1_000_000 else f"{done:,} {unit}")
        total = int(task.total)
        if total >= 1_000_000:
            return Text(f"{done / 1e6:.1f}/{total / 1e6:.1f}M {unit}")
        return Text(f"{done:,}/{total:,} {unit}")


class _Phases:
    """A rich progress bar on stderr: the current phase of a command (reading input, fit,
    gates, ...) and, during a pass over the tokens, the rows read so far out of the rows
    expected (advanced batch by batch through :func:`entr_diag.passes.progress_hook`).

    Shown only when stderr is a terminal and ``--quiet`` is not given; transient, so it
    leaves nothing behind in a log.
    """

    def __init__(self) -> None:
        self.bar: Progress | None = None
        self.task: TaskID | None = None

    def begin(self, quiet: bool) -> None:
        if quiet or not stderr.is_terminal:
            return
        from rich.table import Column

        # on a narrow terminal the phase's description gives way (cut with "…"), never the
        # rows read and their total
        self.bar = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}",
                       table_column=Column(ratio=1, no_wrap=True, overflow="ellipsis")),
            BarColumn(bar_width=24 if stderr.width >= 110 else 10),
            _RowsColumn(), TimeElapsedColumn(), console=stderr, transient=True,
            expand=stderr.width < 110,
        )
        self.bar.start()
        self.task = self.bar.add_task("starting", total=None)

    def phase(self, message: str, rows: int | None) -> None:
        if self.bar is not None:  # a new task: rich's reset cannot clear a known total
            if self.task is not None:
                self.bar.remove_task(self.task)
            self.task = self.bar.add_task(message, total=rows)

    def advance(self, rows: int) -> None:
        if self.bar is not None and self.task is not None:
            self.bar.advance(self.task, rows)

    def expect(self, rows: int) -> None:
        """A pass over the input's rows begins: a phase without a known total (reading
        the input) gets ``rows`` (input token rows, masked or not) as its total."""
        if self.bar is not None and self.task is not None:
            task = self.bar.tasks[[t.id for t in self.bar.tasks].index(self.task)]
            if task.total is None:
                self.bar.update(self.task, total=rows, unit="rows")

    def end(self) -> None:
        if self.bar is not None:
            self.bar.stop()
        self.bar = None


_phases = _Phases()


class _Notes:
    """The notes and warnings a command prints on stderr (the accounting line, skipped
    files, columns not used...), held from the start of the command until its first output
    (:meth:`flush`: a JSON or other file written, a table printed). A refusal, however late
    it is found (after a pass over the tokens, say), drops them (:meth:`drop`): it prints
    one ``error: ...`` line and nothing else. Outside a command they print at once."""

    def __init__(self) -> None:
        self.held: list[tuple[str, dict]] | None = None

    def hold(self) -> None:
        self.held = []

    def add(self, text: str, **kwargs) -> None:
        """Print ``text`` (rich markup) on stderr, or hold it until :meth:`flush`."""
        if self.held is None:
            stderr.print(text, **kwargs)
        else:
            self.held.append((text, kwargs))

    def flush(self) -> None:
        held, self.held = self.held or [], None
        for text, kwargs in held:
            stderr.print(text, **kwargs)

    def drop(self) -> None:
        self.held = None

    def discard(self, part: str) -> None:
        """Leave out the held notes whose text holds ``part`` (one a later finding
        explains otherwise)."""
        if self.held is not None:
            self.held = [(t, kw) for t, kw in self.held if part not in t]

    def warnings(self) -> list[str]:
        """The ``warning:`` lines held so far, as plain text without the prefix: for the
        JSON (``warnings``) and the HTML report, where a reader who never saw stderr
        looks (copied shards, duplicated sequences, swapped versions, ...)."""
        from rich.text import Text

        out = []
        for text, _kw in self.held or []:
            plain = Text.from_markup(text).plain
            if plain.startswith("warning: "):
                out.append(plain.removeprefix("warning: "))
        return out


_notes = _Notes()


@contextlib.contextmanager
def _errors(quiet: bool = True) -> Iterator[None]:
    """Run a command body: a progress bar on stderr; library and input errors become one
    paragraph on stderr and exit code 2 (exit code 1 when an output's reader left early:
    :class:`~entr_diag.errors.OutputClosedError`)."""
    from entr_diag.errors import OutputClosedError
    from entr_diag.passes import progress_hook

    _phases.begin(quiet)
    _notes.hold()
    try:
        with progress_hook(_phases.advance if _phases.bar is not None else None,
                           _phases.expect if _phases.bar is not None else None):
            yield
    except EntrDiagError as e:
        _phases.end()
        _notes.drop()
        if isinstance(e, OutputClosedError):
            _let_stdout_go()
        if str(e):  # an OutputClosedError for stdout alone says nothing, as the tables
            stderr.print(f"[bold red]error:[/bold red] {escape(_one_line(str(e)))}",
                         soft_wrap=True)
        raise typer.Exit(e.exit_code) from None
    except (pl.exceptions.PolarsError, pl.exceptions.PanicException) as e:
        _phases.end()
        _notes.drop()
        # (the loader names the file of a read or cast failure itself: a polars error that
        # gets here came from the analysis, a damaged file its metadata hides, or a bug)
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        stderr.print(f"[bold red]error:[/bold red] polars failed ({type(e).__name__}: "
                     f"{escape(msg[:300])}). If every input file reads with "
                     "polars.read_parquet, this is a bug of entr-diag: please report it "
                     "with the command.", soft_wrap=True)
        raise typer.Exit(2) from None
    except OSError as e:
        _phases.end()
        _notes.drop()
        stderr.print(f"[bold red]error:[/bold red] {escape(_one_line(str(e)))}",
                     soft_wrap=True)
        raise typer.Exit(2) from None
    else:
        _notes.flush()
    finally:
        _phases.end()
        _notes.drop()  # interrupted: left unsaid


def _let_stdout_go() -> None:
    """An output's reader left, or writing it failed (exit 1): when that was stdout's,
    point stdout at /dev/null, as rich does when the tables' reader leaves, so that the
    interpreter's last flush of what is still buffered for it does not fail again at exit
    (a broken pipe, a full device)."""
    import os

    try:
        sys.stdout.flush()
    except (OSError, ValueError):
        with contextlib.suppress(OSError, ValueError):  # no real stdout (e.g. a test runner)
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


@contextlib.contextmanager
def _status(message: str, quiet: bool, rows: int | None = None) -> Iterator[None]:
    """One phase of the command, named on the progress bar; ``rows``: the rows its pass
    reads (None: unknown, a spinner and a count)."""
    if not quiet:
        _phases.phase(message, rows)
    yield


def _to_stdout(path: Path | None) -> bool:
    """``--json -``: the JSON goes to stdout."""
    return path is not None and str(path) == "-"


def _is_stdout(path: Path | None) -> bool:
    """``path`` is ``-`` or names this process's stdout (``/dev/stdout``, the file or pipe
    stdout is redirected to)."""
    import os

    if path is None:
        return False
    if _to_stdout(path):
        return True
    try:
        out = os.fstat(sys.stdout.fileno())
    except (OSError, ValueError):  # no real stdout (e.g. captured by a test runner)
        return False
    return _file_identity(path) == ("inode", out.st_dev, out.st_ino)


def _names_stdout(path: Path | None) -> bool:
    """``path`` is ``-`` or reaches this process's stdout through its descriptor's link
    (``/dev/stdout``, ``/dev/fd/1``, ``/proc/self/fd/1``, or a symlink to one): it names the
    stream itself, whatever the stream is connected to (a file, a pipe, /dev/null, a tty).
    Each link of the path is compared by (device, inode) with the descriptor's link."""
    import os
    import stat

    if path is None or _to_stdout(path):
        return path is not None
    try:
        fd = sys.stdout.fileno()
    except (OSError, ValueError):  # no real stdout (e.g. captured by a test runner)
        return False
    links = set()
    for link in (f"/proc/self/fd/{fd}", f"/dev/fd/{fd}"):
        with contextlib.suppress(OSError):
            st = os.lstat(link)
            links.add((st.st_dev, st.st_ino))
    p = os.path.abspath(path)
    for _ in range(40):  # symlink hops, as many as the kernel follows
        try:
            st = os.lstat(p)
        except OSError:
            return False
        if (st.st_dev, st.st_ino) in links:
            return True
        if not stat.S_ISLNK(st.st_mode):
            return False
        p = os.path.join(os.path.dirname(p), os.readlink(p))
    return False


def _tables(*outputs: Path | None) -> Console:
    """Where a command prints its tables: stdout, or stderr when one of its outputs (the
    JSON with ``--json -``, or an output naming /dev/stdout) takes stdout."""
    return stderr_tables if any(_is_stdout(p) for p in outputs) else stdout


def _foreign_parquet(path: Path) -> str | None:
    """Why ``path`` must not be replaced by an output, or None: it is an existing regular
    file holding Parquet (``PAR1`` at its start) that entr-diag did not write (no
    :data:`~entr_diag.io.load.OUTPUT_MARK` nor synth mark in its metadata; a synth run is
    refused after the inputs are checked, :func:`_refuse_overwriting_inputs`), a rollout
    dump; or one whose footer cannot be read (a damaged dump, or one still being written:
    no output of entr-diag is ever left so, they are written atomically)."""
    if not _starts_as_parquet(path):
        return None
    import pyarrow.parquet as pq

    from entr_diag.io.load import OUTPUT_MARK
    from entr_diag.synth import SYNTH_METADATA_KEY

    try:
        md = pq.read_metadata(path).metadata or {}  # (the file's key-value metadata)
    except Exception as exc:  # noqa: BLE001 (any reader error: not a file entr-diag wrote)
        return ("starts as a Parquet file but its footer cannot be read (a damaged dump, "
                f"or one still being written: {str(exc).splitlines()[0][:120]})")
    if OUTPUT_MARK.encode() in md or SYNTH_METADATA_KEY in md:
        return None  # (a synth run: :func:`_synthetic_run`, after the inputs are checked)
    return "is a Parquet file entr-diag did not write (a rollout dump?)"


def _synthetic_run(path: Path) -> bool:
    """True when ``path`` is a Parquet file ``synth`` wrote (its metadata key): a data set,
    which only ``synth -o`` replaces."""
    if not _starts_as_parquet(path):
        return False
    import pyarrow.parquet as pq

    from entr_diag.synth import SYNTH_METADATA_KEY

    try:
        return SYNTH_METADATA_KEY in (pq.read_metadata(path).metadata or {})
    except Exception:  # noqa: BLE001 (unreadable: _check_output said why)
        return False


def _one_line(text: str) -> str:
    """An error message on one line (:func:`entr_diag.report.terminal.one_line`)."""
    from entr_diag.report.terminal import one_line

    return one_line(text)


def _starts_as_parquet(path: Path) -> bool:
    """True when ``path`` is an existing regular file beginning with ``PAR1`` (False when
    it cannot be read: the output checks that follow say what is wrong)."""
    try:
        if not path.is_file():
            return False
        with open(path, "rb") as fh:
            return fh.read(4) == b"PAR1"
    except OSError:
        return False


def _check_output(path: Path | None, what: str) -> None:
    """Refuse, before any work, an output path that cannot be written. (One naming an input,
    or an existing Parquet file entr-diag did not write, is refused by
    :func:`_refuse_overwriting_inputs`, which runs next: an input is named as an input.)"""
    if path is None or (what == "--json" and _to_stdout(path)):
        return
    if str(path) == "":  # typed as '' (see _output_path), never taken for the directory '.'
        raise ParameterError(f"empty output path for {what}: give a file name.")
    from entr_diag.errors import InputError

    if _to_stdout(path):
        raise InputError(f"{what} -: give a file name ('-' means stdout only for --json; "
                         "/dev/stdout writes there).")

    from entr_diag.atomic import output_target

    try:  # (a name longer than the file system allows fails its stat)
        if path.is_dir():  # (as for 'dir/', a usage error: the same sentence and hint)
            see = f" See '{_COMMAND_PATH[0]} --help'." if _COMMAND_PATH else ""
            raise InputError(f"{what} {path}: names a directory; give a file name in it "
                             f"({str(path).rstrip('/')}/FILE).{see}")
        target, atomic = output_target(path, what)
    except OSError as e:
        raise InputError(f"cannot write {what} {path}: {e.strerror or e}.") from None
    if not atomic:  # a device, FIFO or socket: written straight through
        return
    parent = target.parent
    if not parent.is_dir():
        why = "is a file, not a directory" if parent.exists() else "does not exist"
        raise InputError(f"cannot write {what} {path}: {parent} {why}.")
    import tempfile

    try:  # a real write test (os.access says yes to root everywhere)
        with tempfile.TemporaryFile(dir=parent):
            pass
    except OSError as e:  # (the file is written beside its target, then renamed over it)
        raise InputError(f"cannot write {what} {path}: no new file can be made in {parent} "
                         f"({e.strerror or e}).") from None


def _note_parquet_suffix(path: Path | None, what: str, quiet: bool) -> None:
    """A note when a Parquet output's file name (not a device or FIFO) ends in another
    suffix than .parquet / .pq / .parq (``-o noise.csv``): it is written as Parquet all
    the same, and a later directory scan would not read it as input."""
    from entr_diag.atomic import output_target
    from entr_diag.io.load import PARQUET_SUFFIXES

    if quiet or path is None or str(path) == "" or path.suffix.lower() in PARQUET_SUFFIXES:
        return
    try:
        if not output_target(path)[1]:  # a device or FIFO: its name says nothing
            return
    except OSError:
        return
    _notes.add(f"note: {what} {escape(str(path))} is written as Parquet, whatever its "
               "suffix says (name it .parquet for other tools, and for entr-diag to read "
               "it from a folder).")


def _file_identity(path: Path) -> tuple:
    """What a path names: the (device, inode) of an existing file (through symlinks and hard
    links), else the path with symlinks resolved."""
    import os

    try:
        st = os.stat(path)
    except OSError:
        return ("path", os.path.realpath(path))
    return ("inode", st.st_dev, st.st_ino)


def _glob_matches(pattern: str, path: str) -> bool:
    """Whether ``glob.glob(pattern, recursive=True)`` lists the absolute path ``path`` when
    that file exists (``*`` and ``**`` skip names starting with '.', as glob does)."""
    import fnmatch
    import glob
    import os

    pat = Path(os.path.normpath(os.path.join(glob.escape(os.getcwd()), pattern))).parts
    parts = Path(path).parts

    def match(i: int, j: int) -> bool:
        if i == len(pat):
            return j == len(parts)
        if pat[i] == "**":
            for k in range(j, len(parts) + 1):
                if match(i + 1, k):
                    return True
                if k < len(parts) and parts[k].startswith("."):
                    return False
            return False
        if j == len(parts) or (parts[j].startswith(".") and not pat[i].startswith(".")):
            return False
        return fnmatch.fnmatchcase(parts[j], pat[i]) and match(i + 1, j + 1)

    return match(0, 0)


def _defaulted(ctx: typer.Context, name: str) -> tuple[str, ...]:
    """``("--NAME",)`` when the option ``name`` was not given (its default is used), else
    ``()``: for :func:`_refuse_overwriting_inputs` to say "the default --output" (``report
    .`` writes entr-diag-report.html into the current directory unless told otherwise)."""
    source = ctx.get_parameter_source(name)
    return (f"--{name}",) if source is not None and source.name == "DEFAULT" else ()


def _refuse_overwriting_inputs(paths, outputs: dict[str, Path | None],
                               defaults: tuple[str, ...] = ()) -> None:
    """Input files are never modified, nor added to: an output naming an input file (also
    through a symlink or hard link), lying inside an input directory or matching an input
    glob is refused (a later run over the same input would read it), and so is one naming
    an existing Parquet file entr-diag did not write (a dump named by a typo, or a damaged
    one: :func:`_foreign_parquet`) or a run ``synth`` wrote (a data set: only ``synth -o``
    replaces it); so are two outputs
    naming the same file (except a character device such as /dev/null) and two outputs
    into stdout (two naming stdout itself, ``-`` or ``/dev/stdout``, even when stdout is
    /dev/null or a terminal). Checked before any data is read. ``defaults``: the outputs
    the user did not name (their default paths), which a refusal calls "the default"."""
    import os
    import stat

    from entr_diag.errors import InputError
    from entr_diag.io.load import PARQUET_SUFFIXES, bundled_sample_path, resolve_paths

    to_stdout = [what for what, path in outputs.items() if path is not None and _is_stdout(path)]
    try:
        into_device = stat.S_ISCHR(os.fstat(sys.stdout.fileno()).st_mode)  # /dev/null, a tty
    except (OSError, ValueError):
        into_device = False
    # stdout on a device: outputs naming that device (-o /dev/null) may share it, but two
    # naming stdout itself (--json - and -o /dev/stdout) are refused wherever it goes
    if len(to_stdout) > 1 and (not into_device
                               or sum(_names_stdout(outputs[w]) for w in to_stdout) > 1):
        raise ParameterError(f"{' and '.join(to_stdout)} both write to stdout; send one of "
                             "them to a file.")
    given = {what: path for what, path in outputs.items()
             if path is not None and not (what == "--json" and _to_stdout(path))}
    seen: dict[tuple, str] = {}
    for what, path in given.items():
        key = _file_identity(path)
        with contextlib.suppress(OSError):
            if stat.S_ISCHR(os.stat(path).st_mode):
                continue  # /dev/null, a terminal: two outputs may both go there
        if key in seen:
            raise InputError(
                f"{seen[key]} and {what} name the same file ({path}); give each output its "
                "own path."
            )
        seen[key] = what
    files = resolve_paths([str(p) for p in paths]) if paths else [bundled_sample_path()]
    inputs = {_file_identity(f) for f in files}
    for what, path in given.items():
        if _file_identity(path) in inputs:
            raise InputError(
                f"{what} {path} is one of the input files; entr-diag never overwrites its "
                "input. Choose another output path."
            )
        forms = {os.path.abspath(path), os.path.realpath(path)}
        for raw in map(str, paths or []):
            if Path(raw).is_dir():
                dirs = {os.path.abspath(raw), os.path.realpath(raw)}
                if any(Path(f).is_relative_to(d) for f in forms for d in dirs):
                    read = (f"a later run over {raw} would read it as input, and "
                            if Path(path).suffix.lower() in PARQUET_SUFFIXES else "")
                    default = what in defaults
                    raise InputError(
                        f"{'the default ' if default else ''}{what} {path} lies inside the "
                        f"input directory {raw}: {read}entr-diag writes nothing into its "
                        f"input. Choose a path outside it"
                        f"{f' (give {what} PATH)' if default else ''}."
                    )
            elif not Path(raw).exists() and any(ch in raw for ch in "*?["):
                if any(_glob_matches(raw, f) for f in forms):
                    raise InputError(
                        f"{what} {path} matches the input pattern {raw}: a later run with "
                        "the same pattern would read it as input. Choose a path the pattern "
                        "does not match."
                    )
    for what, path in given.items():  # a dump named by a typo, not one of the inputs
        why = _foreign_parquet(Path(path)) if str(path) != "" else None
        if why:
            raise ParameterError(f"{what} {path} exists and {why}: not overwritten; remove "
                                 "it first or give another name.")
    for what, path in given.items():  # a data set too, though not this command's input
        if _synthetic_run(Path(path)):
            raise ParameterError(
                f"{what} {path} exists and is a synthetic run written by entr-diag synth (a "
                "data set, not an output of this command): not overwritten; remove it first "
                "or give another name.")


def _where(ds) -> str:
    """The input as refusals name it: its one file, else the folder holding its files and
    their number (``dumps (12 files)``): :func:`~entr_diag.io.load.inputs_named`."""
    from entr_diag.io.load import inputs_named

    return inputs_named([f.path for f in ds.files])


def _require_tokens(ds) -> None:
    """Stop with the reason when no valid loss-masked token is left to analyse, or when
    more than half of the loss-masked tokens are ``positive_logprob`` (but +1.0
    placeholders), or more than half of those whose value in one logprob column can tell
    (not within 1e-4 of 0, ``Accounting.tokens_near_zero``): a logprob column then holds
    probabilities, negative log-likelihoods or an offset, and the tokens left are the rows
    whose wrong values happen to lie at or below 1e-4 nats (a biased remainder with the
    same mistake), not a sample to analyse."""
    from entr_diag.errors import InputError

    acc = ds.accounting
    where = _where(ds)
    n_pos = acc.excluded.get("positive_logprob", 0)
    at = (acc.excluded_where or {}).get("positive_logprob") or {}
    ones = int(at.get("ones") or 0)
    # (a column's share among the tokens whose value can tell: a near-certain token's
    # logprob, within 1e-4 of 0, reads the same negated; a peaked run is mostly those)
    near = getattr(acc, "tokens_near_zero", None) or {}
    telling = max((n / (acc.tokens_masked - near.get(c, 0))
                   for c, n in (at.get("columns") or {}).items()
                   if acc.tokens_masked > near.get(c, 0)), default=0.0)
    left = at.get("valid_left") or {}
    if left and ones <= n_pos / 2 and acc.tokens_valid > 0 and not (
            n_pos > acc.tokens_masked / 2 or telling > 0.5):
        # files of probabilities among others: their rows at or below 1e-4 pass as
        # logprobs near 0 and would enter every result (0.24% of a run flipped its verdict)
        from entr_diag.caveats import files_listed

        n_left = sum(left.values())
        raise InputError(
            f"{where}: {n_pos:,} loss-masked tokens were excluded as positive_logprob, "
            f"and the {n_left:,} valid token(s) left in the files that hold them ("
            + files_listed(left, len(ds.files)) + ") are probably probabilities too (at "
            "most 1e-4, which pass as log-probabilities near 0 nats): they would distort "
            "every result (a few hundred such tokens read as a noise regime and alpha 4 on "
            "a run whose other files give alpha 1). Leave those files out (analyse the "
            "others on their own), or convert the column (the log of each probability).")
    if (acc.tokens_valid > 0 and (n_pos > acc.tokens_masked / 2 or telling > 0.5)
            and ones <= n_pos / 2):
        from entr_diag.caveats import exclusion_lead

        lead = exclusion_lead(acc.excluded, acc.tokens_masked, acc.tokens_valid, ds.mapping,
                              acc.excluded_where)
        if not lead:  # most of the tokens whose value can tell, not most of all
            from entr_diag.caveats import exclusion_hint

            lead = (f"{n_pos:,} of the {acc.tokens_masked:,} loss-masked tokens were "
                    f"excluded as positive_logprob, {telling:.1%} of those whose logprob is "
                    "not within 1e-4 of 0 (the others, near-certain tokens, read the same "
                    "either way): " + exclusion_hint(acc.excluded, acc.tokens_masked,
                                                     ds.mapping, acc.excluded_where))
        raise InputError(
            f"{where}: {lead} The {acc.tokens_valid:,} token(s) left are not analysed: "
            "they are rows whose wrong values happen to lie at or below 1e-4 nats, or "
            "other files' rows, the minority of the input. Fix the column, or analyse the "
            "files without the mistake on their own (`entr-diag inspect` lists the "
            "exclusions and where they are).")
    if acc.tokens_valid > 0:
        return
    if acc.tokens_total == 0:  # (nested rows whose per-token lists are all empty)
        rows = sum(f.rows for f in ds.files)
        nested = sum(f.rows for f in ds.files if f.layout == "nested")
        raise InputError(
            f"{where}: no token at all: " + (
                f"the per-token lists of all {nested:,} nested rows are empty (or null)"
                if nested == rows else f"its {rows:,} rows hold none")
            + "; check that the dump wrote the token columns.")
    if acc.tokens_masked == 0:
        raise InputError(
            f"{where}: no loss-masked token: all {acc.tokens_total:,} tokens have loss_mask "
            f"false ('{ds.mapping.get('loss_mask')}'). Check the loss-mask column or map "
            "another one with --column loss_mask=NAME."
        )
    raise InputError(f"{where}: {_all_excluded(ds)}")


def _all_excluded(ds) -> str:
    """Why an input with loss-masked tokens has no valid one: the count, each exclusion
    reason with its tokens and meaning, and the hint of the dominant reason."""
    from entr_diag.io.schema import EXCLUSION_REASONS

    acc = ds.accounting
    reasons = "; ".join(f"{r}: {n:,} ({EXCLUSION_REASONS.get(r, '')})"
                        for r, n in acc.excluded.items())
    from entr_diag.caveats import exclusion_hint

    hint = exclusion_hint(acc.excluded, acc.tokens_masked, ds.mapping, acc.excluded_where)
    return (f"0 valid loss-masked tokens: all {acc.tokens_masked:,} loss-masked tokens "
            f"were excluded. {reasons}.{' ' + hint if hint else ''}")


def _load(paths, column, framework, layout, entropy, quiet, *, analyse: bool = True,
          skip_unreadable: bool = False, seq_id_per_file: bool = False):
    from entr_diag.io import load_dataset
    from entr_diag.io.load import resolve_paths


    skipped: list[Path] = []
    repeated: list[Path] = []
    others: list[Path] = []
    if paths:
        with contextlib.suppress(EntrDiagError):  # (load_dataset says what is wrong)
            resolve_paths([str(p) for p in paths], skipped=skipped, repeated=repeated,
                          others=others)
        if quiet:
            skipped, repeated = [], []
    if others:  # e.g. a step dumped as CSV beside the Parquet shards: its tokens are missing
        from entr_diag.io.load import data_kind

        kinds = sorted({data_kind(q) for q in others})
        _notes.add(
            f"[yellow]warning:[/yellow] {len(others):,} file(s) in input directories are not "
            f"Parquet ({', '.join(kinds[:6])}{', ...' if len(kinds) > 6 else ''}) and were "
            "not read, e.g. "
            f"{escape(str(others[0]))}: if they hold tokens (a step dumped in another "
            "format), those tokens are missing from every result; convert them to Parquet "
            "to include them.")
    if repeated:
        _notes.add(
            f"note: {len(repeated):,} input file(s) named more than once (or matched again "
            f"by a glob or a directory) are read once, e.g. {escape(str(repeated[0]))}."
        )
    if skipped:
        _notes.add(
            f"note: skipped {len(skipped):,} Parquet file(s) in input directories whose names, "
            f"or the names of folders holding them, start with '.' or '_' (hidden, temporary "
            f"or metadata files, e.g. a Spark _temporary/ folder), e.g. "
            f"{escape(str(skipped[0]))}: pass them explicitly to read them."
        )
    with _status("reading input...", quiet):
        ds = load_dataset(
            [str(p) for p in paths] if paths else None,
            columns=_parse_columns(column),
            framework=framework,
            layout=layout,
            entropy=entropy,
            skip_unreadable=skip_unreadable,
            seq_id_per_file=seq_id_per_file,
        )
    if ds.bundled and not quiet:
        _notes.add("no input given: using the bundled sample run "
                   f"({escape(str(ds.files[0].path))})")
    # (integer-typed logprobs or entropy first: they explain the -1.0 and 0.0 warnings)
    for note in sorted(ds.notes, key=lambda n: " holds integers " not in n):
        # warnings even with --quiet (it hides progress and notes)
        if note.startswith("warning: "):
            _notes.add("[yellow]warning:[/yellow] " + escape(note.removeprefix("warning: ")))
        elif not quiet and ("missing from" in note or "not used" in note
                            or "trainer-side" in note or "partition folder" in note
                            or "continue from one file" in note
                            or "written by entr-diag" in note
                            or "one-token nuclei" in note
                            or "holds floating-point values" in note):
            _notes.add(f"note: {escape(note)}")
    dup = ds.accounting.sequences_with_duplicate_positions
    if dup:
        from entr_diag.caveats import files_listed
        from entr_diag.io.load import unkeyed_partitions

        where = files_listed(ds.accounting.duplicate_position_files, len(ds.files))
        # (copied files: --seq-id-per-file would hide their repeats, not count them once)
        copied = any(n.startswith("warning: ") and (" look like copies of each other " in n
                                                    or " repeats the rows of " in n)
                     for n in ds.notes)
        _notes.add(
            f"[yellow]warning:[/yellow] {dup:,} sequence(s) hold more tokens than positions"
            + (f" ({escape(where)})" if where else "") + ": the "
            "same (step, seq_id, position) appears more than once (e.g. one dump copied into two "
            "shards, whose tokens then count twice; or a seq_id shared by several sequences, "
            "such as a prompt or group id like verl's uid, or a per-rank index restarting in "
            "each file, which merges them into one)"
            + escape(unkeyed_partitions([f.hive for f in ds.files], ds.mapping))
            + ("; if the seq_ids restart in each file, pass --seq-id-per-file"
               if len(ds.files) > 1 and not ds.seq_id_per_file and not copied else
               "; the input holds copied files (see that warning): pass one of each"
               if copied else "") + "."
        )
    from entr_diag.caveats import separate_blocks

    split = separate_blocks(ds.accounting, len(ds.files))
    if split is not None:
        keys, blocks, rows = split
        _notes.add(
            f"[yellow]warning:[/yellow] {keys:,} sequence(s) have their rows in several "
            f"separate blocks ({blocks:,} blocks of {rows / blocks:,.0f} rows on average, "
            "other sequences' rows between them) and the input has no position column: "
            "probably different sequences sharing a seq_id ("
            + ("e.g. a per-rank sample index restarting in each step), which are numbered "
               "and analysed as one sequence; give them globally unique ids"
               if "step" in ds.mapping else
               "e.g. a per-step sample index without a step column), which are numbered and "
               "analysed as one sequence; map a step column (--column step=NAME) or a "
               "globally unique id")
            + ", or dump a position column.")
    acct = ds.accounting
    per = acct.tokens_masked / max(acct.sequences_total, 1)
    if ("loss_mask" in ds.mapping and acct.tokens_total >= MASKED_SHARE_MIN_ROWS
            and 0 < acct.tokens_masked < MASKED_SHARE_WARN * acct.tokens_total
            and per < MASKED_PER_SEQUENCE_MAX):
        _notes.add(
            f"[yellow]warning:[/yellow] only {acct.tokens_masked / acct.tokens_total:.1%} of "
            f"the {acct.tokens_total:,} rows are in the loss mask ({acct.tokens_masked:,} "
            f"tokens, {per:,.1f} a sequence on average): check that "
            f"{escape(repr(ds.mapping['loss_mask']))} is the loss mask over the response "
            "tokens, not its inverse, the prompt mask or a mask of a few special tokens.")
    nostep = ds.accounting.tokens_without_step
    if nostep:
        floats = any(n.split(" ", 1)[0] == "step" and " holds floating-point values " in n
                     for n in ds.notes)
        # (the accounting marks a null step with the int64 minimum: a step of that value,
        # a placeholder, counts as null too; one more read of the step column, only here;
        # helper-48's file of steps 0..3 with -2^63 read "null steps")
        lowest = (ds.raw.select(pl.col("step").cast(pl.Int64, strict=False).min())
                  .collect(engine="streaming").item()
                  if not floats and "step" in ds.mapping else None)
        i64min = lowest is not None and lowest == -(2**63)
        _notes.add(
            f"[yellow]warning:[/yellow] {nostep:,} valid token(s) have a null step"
            + (" (null in the file, or a floating-point step with a fraction, e.g. 1.5, "
               "which reads as null: the step column holds floats)" if floats else "")
            + (" (null in the file, or the 64-bit minimum -9223372036854775808, a "
               "placeholder that reads as null)" if i64min else "")
            + ": their sequences are keyed (null, seq_id), apart from any tokens of the "
            "same seq_id that have a step, and they count in no step's row of the per-step "
            "tables."
        )
    rep, checked = ds.accounting.tokens_repeating_row, ds.accounting.tokens_row_checked
    from entr_diag.io.load import (
        REPEAT_ANY_MIN_SAMPLED,
        REPEAT_ANY_MIN_SHARE,
        REPEAT_H_MIN,
        REPEAT_MIN_SHARE,
        REPEAT_MIN_TOKENS,
        REPEAT_SAMPLE,
    )

    sampled, again = ds.accounting.repeated_rows_sampled
    if rep >= REPEAT_MIN_TOKENS and rep >= REPEAT_MIN_SHARE * checked:
        _notes.add(
            f"[yellow]warning:[/yellow] {rep:,} valid token(s) repeat the row before them "
            "in their sequence exactly (train_logprob, infer_logprob and entropy, at an "
            f"entropy of {REPEAT_H_MIN:g} nats or more, where real runs never do): rows "
            "written twice in a row, which count twice in every result; the input has no "
            "position column to tell them apart: drop the repeated rows, or dump a "
            "position column.")
    elif again >= REPEAT_ANY_MIN_SAMPLED and again >= REPEAT_ANY_MIN_SHARE * sampled:
        _notes.add(
            f"[yellow]warning:[/yellow] about {again / sampled:.1%} of the valid tokens "
            f"({again:,} of {sampled:,} sampled by hash, 1 in {REPEAT_SAMPLE}) repeat another "
            "row of their sequence exactly (train_logprob, infer_logprob and entropy, at an "
            f"entropy of {REPEAT_H_MIN:g} nats or more): sequences or shards written twice "
            "(e.g. a dump re-encoded into a second file), whose tokens count twice in every "
            "result; the input has no position column to tell them apart: drop the "
            "copies, or dump a position column.")
    nostale = ds.accounting.tokens_without_staleness
    if nostale:
        _notes.add(
            f"[yellow]warning:[/yellow] {nostale:,} valid token(s) have no policy_version "
            "or train_version (null; in a float column also NaN, fractional or beyond the "
            "64-bit integer range): they are in no staleness bucket (the staleness tables "
            "and checks leave them out; the fit, metrics and gates keep them).")
    ahead = sum(n for s, n in (ds.accounting.staleness or {}).items() if s < 0)
    if ahead:
        from entr_diag.caveats import files_listed

        where = files_listed(ds.accounting.negative_staleness_files, len(ds.files))
        _notes.add(
            f"[yellow]warning:[/yellow] {ahead:,} valid token(s) have policy_version > "
            "train_version (negative staleness)"
            + (f", {escape(where)}" if where else "")
            + ": a rollout cannot come from a policy newer "
            "than the one trained on it, so the two version columns are probably swapped or "
            "mis-mapped (check --column policy_version=... / train_version=...); staleness "
            "results treat them as their own buckets."
        )
    if analyse:
        _require_tokens(ds)
    acc = ds.accounting
    if not quiet:
        from entr_diag.io.schema import ENTROPY_NEG_TOL

        _notes.add(
            f"{acc.tokens_valid:,} valid loss-masked tokens of {acc.tokens_total:,} rows; "
            f"{acc.tokens_masked - acc.tokens_valid:,} excluded"
            + (": " + ", ".join(f"{k} {v:,}" for k, v in acc.excluded.items()) if acc.excluded else "")
            + (f"; {acc.tokens_padding:,} rows of tensor padding ignored (no loss mask: "
               + ("leading or trailing rows whose logprobs and entropy are exactly 0 or -1, "
                  "or NaN"
                  if "long" not in ds.layouts else
                  "rows whose entropy is exactly 0 and logprobs exactly 0 or -1")
               + ")" if acc.tokens_padding else "")
            + (f"; {acc.tokens_entropy_below_zero:,} valid token(s) have an entropy just "
               f"below 0 (down to -{ENTROPY_NEG_TOL:g} nats: floating-point rounding of a "
               "near-certain distribution), read as 0"
               if acc.tokens_entropy_below_zero else "")
        )
    from entr_diag.caveats import exclusion_caveat

    caveat = exclusion_caveat(acc.excluded, acc.tokens_masked, acc.tokens_valid, ds.mapping,
                              acc.excluded_where)
    if caveat:
        _notes.add("[yellow]warning:[/yellow] " + escape(caveat.removeprefix("caveat: ")))
    elif not acc.tokens_valid:  # (inspect: the others refuse it, with this sentence)
        from entr_diag.errors import InputError

        try:
            _require_tokens(ds)
        except InputError as e:
            _notes.add("[yellow]warning:[/yellow] " + escape(str(e)))
    if acc.starved_files:  # files contributing (almost) nothing: a wrong mask?
        from entr_diag.caveats import starved_files_warning

        _notes.add("[yellow]warning:[/yellow] "
                   + escape(starved_files_warning(acc.starved_files, len(ds.files)) or ""))
    if acc.file_exclusions:  # a shard broken on its own, too small for the above
        from entr_diag.caveats import file_exclusion_warnings, hinted_reason

        for w in file_exclusion_warnings(
                acc.file_exclusions, len(ds.files), ds.mapping,
                skip=hinted_reason(acc.excluded, acc.tokens_masked, ds.mapping),
                where=acc.excluded_where):
            _notes.add("[yellow]warning:[/yellow] " + escape(w))
    if acc.identical_logprobs:  # trainer logprobs copied from the rollout's in some part
        from entr_diag.caveats import identical_logprobs_warning

        _notes.add("[yellow]warning:[/yellow] " + escape(identical_logprobs_warning(
            acc.identical_logprobs, len(ds.files), ds.mapping) or ""))
    return ds


def _identical_note(ds) -> None:
    """For ``inspect``: a ``warning:`` line when train_logprob equals infer_logprob exactly
    on every valid token (delta = 0: a bitwise on-policy run), which ``fit`` and ``flag``
    refuse and ``compare`` and ``report`` say beside their gates (helper-48: ``inspect``
    said nothing)."""
    acc = ds.accounting
    if not (acc.tokens_valid and acc.tokens_identical == acc.tokens_valid):
        return
    from entr_diag.caveats import ALL_IDENTICAL_CAUSES, column_named

    _notes.add("[yellow]warning:[/yellow] " + escape(
        f"{column_named('train_logprob', ds.mapping)} equals "
        f"{column_named('infer_logprob', ds.mapping)} exactly on every valid token "
        f"({acc.tokens_valid:,}): delta = 0, there is no mismatch to analyse "
        f"({ALL_IDENTICAL_CAUSES}). `fit` and `flag` refuse such an input; "
        "`compare` and `report` show every gate keeping every token, without a law."))


def _misaligned_caveat(f) -> str:
    """The caveat (and warning) of a shift let through by --allow-misaligned: the finding's
    title and the input files holding the shifted sequences (when it names them)."""
    from entr_diag.caveats import files_listed

    ev = f.evidence or {}
    where = files_listed(ev.get("files") or {}, int(ev.get("input_files") or 1))
    return (f"caveat: {f.title}{f' ({where})' if where else ''} and --allow-misaligned went "
            "on: every log-ratio of the shifted sequences is wrong, and the fitted law, the "
            "noise regime and the gate counts with them.")


def _check_alignment(ds, finding, allow: bool) -> None:
    """Stop (exit 2) when train and inference logprobs look shifted by one token
    (``finding``: the result of the off-by-one check, computed in the command's pass); the
    refusal names the input (:func:`_where`)."""
    from entr_diag.errors import InputError

    f = finding
    if f is None:
        return
    if allow:
        _notes.add("[yellow]warning:[/yellow] "
                   + escape(_misaligned_caveat(f).removeprefix("caveat: ")))
        return
    from entr_diag.caveats import exclusion_lead

    acc = ds.accounting
    lead = exclusion_lead(acc.excluded, acc.tokens_masked, acc.tokens_valid, ds.mapping,
                          acc.excluded_where)
    if lead:  # the exclusions, not the few tokens left, are what to fix first
        lead += (f" On the {acc.tokens_valid:,} tokens left, which the shift test reads, "
                 f"{f.title[:1].lower()}{f.title[1:]}")
    raise InputError(
        f"{_where(ds)}: {lead or f.title}. {_alignment_numbers(f)} Check: {f.check} Pass "
        "--allow-misaligned to analyse the input anyway."
    )


def _sig(x, corr: bool = False) -> str:
    """A number of the alignment evidence: a mean |difference| with its 4 significant digits
    (trailing zeros kept, so 0.9996 never shows as 1), exact 0 as 0; a correlation with 4
    decimals (1.0000 means at least 0.99995)."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "n/a"
    if corr:
        return f"{x:.4f}"
    return "0" if x == 0 else f"{x:#.4g}".rstrip(".")


def _alignment_numbers(f) -> str:
    """The misalignment finding's explanation with its numbers at 4 significant digits,
    built from its evidence (the finding's own message rounds them to 3)."""
    ev = f.evidence
    lag = ev.get("likely_shift")
    if lag not in (-1, 1) or ev.get("partial"):  # the finding's own message (lags 2, 3; some
        return f.message                         # sequences only) quotes its numbers
    side = "minus1" if lag == -1 else "plus1"
    mad_l, mad_0 = ev.get(f"mean_abs_diff_lag_{side}"), ev.get("mean_abs_diff_lag0")
    marker = ": mean |difference|"
    why = f.message.split(marker)[0] if marker in f.message else \
        f"train_logprob[t] agrees with infer_logprob[t{lag:+d}]"
    if mad_l == 0:
        how = "identical values"
    elif mad_l and mad_0:
        ratio = mad_0 / mad_l
        how = f"{ratio:,.0f}" if ratio >= 100 else f"{ratio:.3g}"
        how += " times smaller than at lag 0"
    else:
        how = ""
    return (
        f"{why}: mean |train_logprob[t] - infer_logprob[t{lag:+d}]| = {_sig(mad_l)}"
        + (f" ({how})" if how else "")
        + f" against {_sig(mad_0)} at lag 0, correlation "
        f"{_sig(ev.get(f'corr_lag_{side}'), True)} against {_sig(ev.get('corr_lag0'), True)}, over {ev.get('tokens_compared', 0):,} token "
        f"pairs. Every ratio computed from these columns is wrong. Likely shift: {lag:+d} token."
    )


def _fit_dict(fit_res, ds, findings=None, rounded=None, file_units=None,
              zero_prefix=None, misaligned=None, gates: bool = False,
              entropy_alignment=None, storage=None, file_scale=None) -> dict:
    """The fit's ``to_dict()`` with ``verdict.caveat``, shown beside the verdict in the
    terminal, JSON and HTML: the mostly-excluded, integer-column, unit-mistake and (with
    the forensics' ``findings``) impossible-logprob caveats, the rounded-logprob caveat
    (``rounded``: ``_fit``'s, column -> step, also kept as ``rounded_logprobs``), the
    bf16 / fp16 storage caveat (``storage``: ``_fit``'s, also kept as
    ``storage_precision``), the unit-mistake-in-some-files caveat (``file_units``: ``_fit``'s, also kept as
    ``units_by_file``), the caveat of files whose mismatch is many times the others'
    (``file_scale``: ``_fit``'s, also kept as ``mismatch_by_file``), the zero-prefix caveat (``zero_prefix``: ``_fit``'s, also kept
    as ``zero_prefix``), the caveat of each other forensic finding at warning or critical
    severity (:func:`~entr_diag.caveats.findings_caveats`), then the small-sample,
    interval, bend, zero-entropy and influence caveats (None when none applies); first of all ``misaligned`` (``_fit``'s: the caveat of a shift let through by
    --allow-misaligned), then the entropy-shift caveat (``entropy_alignment``: ``_fit``'s,
    kept as ``entropy_alignment``; a shift makes the verdict not assessable). ``findings``: a Findings, or its ``to_dict()`` shape
    (``{"findings": [...]}``, e.g. ``compare``'s, with its own implausible-logprob
    finding); ``gates``: for ``compare`` (:func:`~entr_diag.caveats.findings_caveats`)."""
    from entr_diag.caveats import (
        across_files_caveat,
        catastrophic_caveat,
        curvature_caveat,
        duplicates_caveat,
        entropy_shift_caveat,
        exclusion_caveat,
        file_exclusions_caveat,
        file_scale_caveat,
        file_units_caveat,
        findings_caveats,
        forensics_summary,
        identical_logprobs_caveat,
        implausible_caveat,
        influence_caveat,
        integer_caveat,
        interval_caveat,
        position_wrap_caveat,
        rounding_caveat,
        separate_blocks_caveat,
        small_sample_caveat,
        starved_caveat,
        storage_caveat,
        units_caveat,
        unreadable_caveat,
        zero_entropy_caveat,
        zero_prefix_caveat,
    )

    acc = ds.accounting
    fd = fit_res.to_dict()
    fdict = (None if findings is None else findings if isinstance(findings, dict)
             else findings.to_dict())
    shown_units = _shown_units(fd.get("units"), misaligned or _entropy_shifted(
        entropy_alignment) or _mask_unsampled(fdict), file_units, _scale_seen(ds))
    # what is wrong with the data first (it explains the statistical caveats after it)
    parts = [misaligned, entropy_shift_caveat(entropy_alignment, ds.mapping),
             integer_caveat(ds.notes),
             unreadable_caveat(getattr(ds, "skipped_unreadable", ()), len(ds.files)),
             exclusion_caveat(acc.excluded, acc.tokens_masked, acc.tokens_valid, ds.mapping,
                              acc.excluded_where),
             file_exclusions_caveat(acc, len(ds.files), ds.mapping),
             position_wrap_caveat(ds.notes),
             duplicates_caveat(acc, len(ds.files)), across_files_caveat(acc, len(ds.files)),
             separate_blocks_caveat(acc, len(ds.files)),
             starved_caveat(acc, len(ds.files)),
             identical_logprobs_caveat(acc, len(ds.files), ds.mapping),
             rounding_caveat(rounded, ds.mapping, acc.excluded.get("zero_placeholder", 0)),
             storage_caveat(storage, ds.mapping),
             zero_prefix_caveat(zero_prefix, ds.mapping),
             units_caveat(shown_units, ds.mapping),
             file_units_caveat(file_units, len(ds.files), ds.mapping),
             file_scale_caveat(file_scale, len(ds.files)),
             implausible_caveat(fdict), catastrophic_caveat(fd),
             *findings_caveats(fdict, gates),
             small_sample_caveat(fd, acc.sequences_valid), interval_caveat(fd),
             curvature_caveat(fd), zero_entropy_caveat(fd), influence_caveat(fd)]
    caveats = [p for p in parts if p]
    void = _void_verdict(ds.notes, rounded, entropy_alignment, shown_units, ds.mapping,
                         acc.excluded_where, acc.tokens_masked, fdict)
    fd["verdict"] = {**fd["verdict"], "caveat": "\n".join(caveats) or None, "caveats": caveats,
                     # (None: the command ran no forensics, e.g. compare)
                     "forensics": forensics_summary(fdict, void)}
    fd["verdict"]["assessable"] = void is None
    fd["verdict"]["not_assessable"] = void  # (why, or None)
    if void:  # the caveat says the verdict means nothing: so does the verdict, up front
        fd["verdict"]["text"] = (f"not assessable ({void}: see the caveat); as computed: "
                                 + fd["verdict"]["text"])
    fd["rounded_logprobs"] = dict(rounded) if rounded else None  # (or {"by_file": ...})
    fd["zero_prefix"] = dict(zero_prefix) if zero_prefix else None
    # (None: no logprob column stored in bf16 / fp16, or not checked)
    fd["storage_precision"] = dict(storage) if storage else None
    fd["identical_logprobs"] = (dict(acc.identical_logprobs) if acc.identical_logprobs
                                else None)  # (also in inputs.accounting)
    # (None: not checked, no entropy column or logprobs shifted; else its status and numbers)
    fd["entropy_alignment"] = dict(entropy_alignment) if entropy_alignment else None
    fd["units_by_file"] = ([{"file": f, **c.to_dict()} for f, c in file_units]
                           if file_units else None)
    # (None: one file, or none far from the others)
    fd["mismatch_by_file"] = list(file_scale) if file_scale else None
    return fd


#: a logprob rounding step (nats) from which the verdict is not assessable: a real run's
#: typical |delta| is 0.001 to 0.1 nats, so most log-ratios read as 0 or the step
VOID_ROUNDING_STEP = 0.1
#: the verdict is not assessable when this share of the loss-masked tokens or more is
#: excluded as invalid_entropy (helper-42: an entropy scaled by 1e6 left 0.8% of the tokens,
#: those near 0, and a verdict "alpha = 2.07" was drawn on them)
VOID_INVALID_ENTROPY_SHARE: float = 0.5
#: a warning when fewer than this share of the rows are in the loss mask (helper-42: a mask
#: true on the first 5 tokens of each sequence, 1.6% of the rows, passed silently; real
#: dumps with the prompt rows hold 20% to 90% response tokens)
MASKED_SHARE_WARN: float = 0.05
#: ... of an input of at least this many rows
MASKED_SHARE_MIN_ROWS: int = 1000
#: ... when its sequences hold fewer loss-masked tokens than this on average (helper-45:
#: 2,500-token prompts before 96-token responses, 3.6% of the rows, are a real layout)
MASKED_PER_SEQUENCE_MAX: float = 16.0


#: ... or this share when the entropies above 20 nats read as a column multiplied by a
#: constant (:func:`~entr_diag.caveats.entropy_scale_seen`): the scale, not chance, cut
#: the top of the entropy range off
VOID_SCALED_OUT_SHARE: float = 0.01


def _void_verdict(notes, rounded, entropy_alignment=None, units=None,
                  mapping=None, excluded_where=None, masked: int = 0,
                  findings=None) -> str | None:
    """Why the law's verdict cannot be read at all, else None: a logprob or entropy column
    stored as integers (:func:`~entr_diag.caveats.integer_columns`), VOID_INVALID_ENTROPY_SHARE
    or more of the ``masked`` loss-masked tokens excluded as invalid_entropy for an entropy
    out of range (negative, infinite or above 20 nats: ``excluded_where``, the accounting's
    kinds of invalid entropy; the tokens left are those the fault left in range; null or
    NaN entropies, missing at random, leave a sample of the run), VOID_SCALED_OUT_SHARE
    of them above 20 nats for a column multiplied by a constant, logprobs stored
    rounded (pooled over the input) to VOID_ROUNDING_STEP nats or coarser, an entropy
    column shifted against the logprobs or holding the surprisal (``entropy_alignment``:
    :meth:`~entr_diag.forensics.EntropyAlignment.to_dict`, status ``shifted`` or
    ``surprisal``), a logprob column holding another token's logprob (``units``'
    ``other_token``), or one logprob column alone in log10 or log2 (``units``: the units
    check as the caveat reads it, :func:`_shown_units`; its ``likely_mistake`` one of the
    one-sided :data:`~entr_diag.caveats.UNIT_SIGNATURES`), which makes delta a difference
    of two units, or impossible logprobs (at or below -50 nats) carrying half of sum
    delta^2 or more (``findings``, the forensics' ``to_dict()``, or compare's implausible
    check: the ``implausible_logprobs`` finding at critical severity): a law or a noise
    regime read from it describes the unit mistake, or the impossible values. Their caveats
    say so; the verdict's text then leads with it (a verdict "law holds" followed by a
    caveat that it is meaningless read as a pass)."""
    from entr_diag.caveats import (
        UNIT_SIGNATURES,
        about,
        column_named,
        entropy_scale_seen,
        integer_columns,
    )

    ints = integer_columns(notes)
    if ints:
        return f"{' and '.join(ints)} {'holds' if len(ints) == 1 else 'hold'} integers"
    bad_h = _out_of_range(excluded_where, masked)
    scale = entropy_scale_seen((excluded_where or {}).get("invalid_entropy"))
    if bad_h >= VOID_INVALID_ENTROPY_SHARE:
        # (an entropy scaled by 1e6, or overflowing float16: the few tokens left are those
        # the fault left in range, not a sample of the run)
        return (f"{bad_h:.1%} of the loss-masked tokens have an entropy out of "
                "range (invalid_entropy: negative, infinite or above 20 nats), and the law "
                "would rest on the few the fault left in range"
                + ("" if scale is None else
                   f"; the column looks multiplied by about {about(scale)}"))
    if scale is not None and bad_h >= VOID_SCALED_OUT_SHARE:
        # (helper-48: an entropy x8 put 12.6% of the tokens above 20 nats, the top of the
        # entropy range, and the verdict went from "does not hold" to "holds approximately")
        return (f"the entropy column looks multiplied by about {about(scale)}, which puts "
                f"{bad_h:.1%} of the loss-masked tokens above 20 nats (invalid_entropy): "
                "the law would rest on the rest, the top of the entropy range cut off")
    ea = entropy_alignment or {}
    if ea.get("status") == "surprisal":
        return "the entropy column holds the sampled token's surprisal, not an entropy"
    if ea.get("status") == "unrelated":
        return "the entropy column does not follow the tokens, whose surprisal it does not rank with"
    if ea.get("status") == "shifted" and ea.get("best_lag") is not None:
        k = abs(int(ea["best_lag"]))
        return (f"the entropy column looks shifted by {k} token{'s' if k > 1 else ''} against "
                "the logprobs" + (" in some input files" if ea.get("files") else "")
                + (" in some steps" if ea.get("steps") else ""))
    other = (units or {}).get("other_token")
    if other in ("infer_logprob", "train_logprob"):  # delta compares two different tokens
        return (f"{column_named(other, mapping or {})} does not look like the logprob of the "
                "sampled token: delta compares two different tokens")
    key = (units or {}).get("likely_mistake")
    if key in UNIT_SIGNATURES and key.startswith(("infer_", "train_")):  # one side only
        canon, unit, *_ = UNIT_SIGNATURES[key]
        return (f"{column_named(canon[0], mapping or {})} probably holds {unit}, not nats, "
                "and the other logprob column nats: delta mixes two units")
    for f in (findings or {}).get("findings", ()):
        if f.get("kind") == "implausible_logprobs" and f.get("severity") == "critical":
            # (helper-40 B: its caveat said "the law describes them" beside a verdict read
            # as any other)
            return f"{f['title']}: the law describes them, not the mismatch"
    coarse = {c: step for c, step in (rounded or {}).items()
              if c != "by_file" and isinstance(step, (int, float))
              and step >= VOID_ROUNDING_STEP}
    if coarse:
        by_step: dict[float, list[str]] = {}
        for c, step in coarse.items():
            by_step.setdefault(step, []).append(c)
        return "logprobs stored rounded to " + ", ".join(
            f"{step:g} nats ({' and '.join(cs)})" for step, cs in by_step.items())
    return None


def _out_of_range(excluded_where, masked: int) -> float:
    """The share of the ``masked`` loss-masked tokens excluded as invalid_entropy for an
    entropy out of range (negative, infinite or above 20 nats; not null or NaN), from the
    accounting's ``excluded_where`` (0.0 when not located)."""
    kinds = ((excluded_where or {}).get("invalid_entropy") or {}).get("kinds") or {}
    bad_h = sum(int(n) for k, n in kinds.items() if k != "null or NaN")
    return bad_h / masked if masked else 0.0


def _void_share(ds) -> float:
    """:func:`_out_of_range` of ``ds``'s accounting when it voids the verdict
    (VOID_INVALID_ENTROPY_SHARE or more), else 0.0."""
    share = _out_of_range(ds.accounting.excluded_where, ds.accounting.tokens_masked)
    return share if share >= VOID_INVALID_ENTROPY_SHARE else 0.0


def _entropy_shifted(entropy_alignment) -> bool:
    """True when ``entropy_alignment`` (``_fit``'s, or an EntropyAlignment's ``to_dict()``)
    says the entropy column is not each token's own: shifted, the surprisal itself, or
    unrelated to the tokens."""
    return bool(entropy_alignment) and entropy_alignment.get("status") in (
        "shifted", "surprisal", "unrelated")


def _mask_unsampled(findings) -> bool:
    """Whether ``findings`` (a Findings or its ``to_dict()``; None: no forensics) hold an
    ``unsampled_tokens`` or ``mask_start_surprisal`` finding located in the loss mask
    (evidence ``cause``: the prompt in the mask, a mask shifted by one): tokens the engine
    did not sample, whose surprisal
    also lifts the units check's surprisal / entropy ratio. Spread ones may be the
    temperature or truncated entropy that the units check names: its story stands."""
    if findings is None:
        return False
    fs = findings.get("findings", ()) if isinstance(findings, dict) else [
        f.to_dict() for f in findings.findings]
    return any(f.get("kind") in ("unsampled_tokens", "mask_start_surprisal") and (
        f.get("evidence") or {}).get(
        "cause") in ("prompt_in_mask", "mask_shifted_by_one") for f in fs)


def _scale_seen(ds) -> bool:
    """Whether the entropies ``ds``'s accounting excluded above 20 nats read as an entropy
    column multiplied by a constant (:func:`~entr_diag.caveats.entropy_scale_seen`; its
    exclusion warning names the factor)."""
    from entr_diag.caveats import entropy_scale_seen

    where = ds.accounting.excluded_where or {}
    return entropy_scale_seen(where.get("invalid_entropy")) is not None


def _shown_units(units: dict | None, misaligned, file_units=None,
                 scaled: bool = False) -> dict | None:
    """The units check as its warning and caveat read it: with a shift let through
    (``misaligned``; or an entropy column shifted against the logprobs, which pairs each
    surprisal with a neighbour's entropy; or tokens in the loss mask the engine did not
    sample, :func:`_mask_unsampled`, whose surprisal is no sample's), or a unit mistake in some input files only (``file_units``), no
    entropy mismatch (the shift, or the files in another unit, explain the pooled
    surprisal / entropy gap: no second story, e.g. a temperature beside a shard in bits);
    with ``file_units``, no pooled unit mistake either (the files do not share it: it is
    the mix's, e.g. half the shards' infer_logprob in log10 read as train_logprob in
    log2); no entropy scale then either. With ``scaled`` (:func:`_scale_seen`: the
    exclusion warning names an entropy column multiplied by a constant), no entropy
    mismatch: the scale explains it."""
    if not units:
        return units
    if scaled and not (misaligned or file_units):  # (the scale explains the mismatch)
        return {**units, "entropy_mismatch": False}
    if not (misaligned or file_units):
        return units
    out = {**units, "entropy_mismatch": False, "entropy_scale": None}
    if file_units and units.get("likely_mistake"):
        out["likely_mistake"] = None
    return out


def _implausible_note(finding) -> dict | None:
    """The implausible-logprob finding (the forensics', or for ``compare``, which runs none,
    :class:`~entr_diag.forensics.ImplausiblePlan`'s) as a dict, None when no token was
    flagged; at warning or critical severity (they carry 1% or more of sum delta^2) also a
    ``warning:`` line (stderr, and JSON ``warnings``), worded as the verdict's caveat."""
    if finding is None:
        return None
    from entr_diag.caveats import implausible_caveat

    f = finding.to_dict()
    caveat = implausible_caveat({"findings": [f]})
    if caveat:
        _notes.add("[yellow]warning:[/yellow] " + escape(caveat.removeprefix("caveat: ")))
    return f


def _critical_notes(findings) -> None:
    """A ``warning:`` line for each critical finding of ``inspect``'s forensics (besides the
    impossible-logprob one, :func:`_implausible_note`), naming the input files when the
    finding does: a pipeline reading stderr or the JSON ``warnings`` sees them (a shift
    makes fit, flag, compare and report refuse the input)."""
    from entr_diag.caveats import files_listed

    for f in findings.findings:
        if f.severity != "critical" or f.kind == "implausible_logprobs":
            continue
        ev = f.evidence or {}
        where = files_listed(ev.get("files") or {}, int(ev.get("input_files") or 1))
        then = (": fit, flag, compare and report refuse this input (unless --allow-misaligned)"
                if f.kind == "misalignment" else "")
        _notes.add("[yellow]warning:[/yellow] "
                   + escape(f"{f.title}{f' ({where})' if where else ''}{then}."))


def _forensics(ds, quiet: bool):
    """The mismatch forensics (for ``inspect``) and the checks on the shift test's sampled
    sequences (:func:`_sample_checks`): (Findings, rounded, zero_prefix, storage)."""
    from entr_diag.forensics import forensics_plan
    from entr_diag.passes import run_pass

    with _status("running mismatch forensics...", quiet):
        plan = forensics_plan(ds)
        if plan.accumulators:
            run_pass(ds.lf, plan.accumulators)
        findings = plan.finish(entropy_out_of_range=_void_share(ds))
    rounded, zero_prefix, ent, storage = _sample_checks(ds, getattr(plan, "misalign", None))
    _inspect_units(ds, plan, findings, ent)
    return findings, rounded, zero_prefix, storage


def _inspect_units(ds, plan, findings, entropy_align) -> None:
    """For ``inspect``: a ``warning:`` line when the units check, read on the forensic
    entropy bins (:func:`~entr_diag.forensics.units_from_tables`), names a unit mistake
    (entropy in bits or log10, logprobs in log10 or log2) or an entropy column scaled by a
    constant; its other readings (an entropy of another distribution, another token's
    logprob) are left to ``fit``, which reads them on the law's bins (helper-48: an entropy
    in bits got no word from ``inspect``). Not with logprobs or entropy shifted, or tokens
    the engine did not sample in the mask, which move the ratio too."""
    from entr_diag.caveats import units_caveat
    from entr_diag.forensics import units_from_tables

    shift = findings.by_kind("misalignment")
    misaligned = shift is not None and shift.severity == "critical"
    if misaligned or _entropy_shifted(entropy_align) or _mask_unsampled(findings):
        return
    units = units_from_tables(plan.ctx)
    if units is None or not (units.likely_mistake or units.entropy_scale):
        return
    d = {**units.to_dict(), "other_token": None, "unrelated": False,
         "entropy_mismatch": False}
    caveat = units_caveat(d, ds.mapping)
    if caveat:
        _notes.add("[yellow]warning:[/yellow] " + escape(
            caveat.removeprefix("caveat: ") + " (inspect reads this on its forensic entropy "
            "bins; `fit` reads it on the law's)"))


def _write_stdout(text: str) -> None:
    """Write ``text`` to stdout in full, or raise :class:`BrokenPipeError` when its reader
    leaves before the end. ``os.write`` in a loop: a reader leaving during Python's write of a
    large str (``| head -c 10`` on a 200 kB JSON) made the write return the pipe's 64 kB as
    if all was written, and the command exit 0 on a cut JSON."""
    import io
    import os

    sys.stdout.flush()
    try:
        fd = sys.stdout.fileno()
    except (io.UnsupportedOperation, AttributeError, ValueError):  # no real stdout (tests)
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    view = memoryview(text.encode(sys.stdout.encoding or "utf-8"))
    while view:
        view = view[os.write(fd, view):]


class _ClosedLater:
    """Around a run's outputs (``with closed, together():``): an output whose reader left
    before its end (:class:`~entr_diag.errors.OutputClosedError`, e.g. a FIFO read by
    ``head -c 100``) is kept, not raised, so that the command's remaining lines (the
    verdict, the tables, the other outputs' ``wrote``) still print; :meth:`done` then
    raises it (exit 1)."""

    error: Exception | None = None

    def __enter__(self) -> _ClosedLater:
        return self

    def __exit__(self, kind: type | None, e: BaseException | None, tb: object) -> bool:
        from entr_diag.errors import OutputClosedError

        if isinstance(e, OutputClosedError):
            self.error = e
            return True
        return False

    def done(self) -> None:
        if self.error is not None:
            raise self.error


def _write_json(path: Path | None, doc: dict, quiet: bool) -> None:
    if path is None:
        return
    _notes.flush()  # an output: the notes held so far come first
    from entr_diag.atomic import reader_left, when_written

    if _to_stdout(path):
        from entr_diag.report.json_report import dumps

        try:
            _write_stdout(dumps(doc))
        except BrokenPipeError:  # the reader left (| head): exit 1 quietly, as the tables
            reader_left("stdout", quiet=True)  # do, after the run's other outputs
        except OSError as e:  # e.g. a full device: named, exit 1, after the other outputs
            reader_left("stdout", why=e.strerror or str(e))
        return
    from entr_diag.report.json_report import write_json

    write_json(path, doc)
    if not quiet:  # said once it is in place (with the run's other outputs)
        when_written(path, lambda: stderr.print(f"wrote {path}", markup=False))


def _json_output(path: Path | None, doc: dict, quiet: bool) -> _ClosedLater:
    """Write the JSON output of a command that prints its tables after it; an output whose
    reader left or whose device is full (a FIFO read by ``head -c``, ``/dev/full``) is
    kept, so that the tables still print: call ``done()`` on the result after them (exit 1
    then, as the README says: after every other output)."""
    from entr_diag.atomic import together

    closed = _ClosedLater()
    with closed, together():
        _write_json(path, doc, quiet)
    return closed


def _version_callback(value: bool) -> None:
    if value:
        print(f"entr-diag {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version_callback, is_eager=True,
                           help="Print the version and exit.")
    ] = False,
) -> None:
    """Diagnose train-inference log-ratio mismatch in rollout logs."""


# ----------------------------------------------------------------- inspect


@app.command(cls=_Command)
def inspect(
    paths: Paths = None,
    column: ColumnOpt = None,
    framework: FrameworkOpt = None,
    layout: LayoutOpt = "auto",
    entropy: EntropyOpt = "auto",
    skip_unreadable: SkipUnreadableOpt = False,
    seq_id_per_file: SeqIdPerFileOpt = False,
    json_path: JsonOpt = None,
    quiet: QuietOpt = False,
) -> None:
    """Files, layout, column mapping, token accounting and what analyses the data allow.

    Example: entr-diag inspect dumps/ --framework verl --json inspect.json
    """
    from entr_diag.report.json_report import envelope
    from entr_diag.report.terminal import render_inspect

    with _errors(quiet):
        from entr_diag.report.terminal_findings import render_findings

        _check_output(json_path, "--json")
        _refuse_overwriting_inputs(paths, {"--json": json_path})
        ds = _load(paths, column, framework, layout, entropy, quiet, analyse=False,
                   skip_unreadable=skip_unreadable, seq_id_per_file=seq_id_per_file)
        desc = ds.describe()
        findings = rounded = zero_prefix = storage = None
        if ds.accounting.tokens_valid:
            findings, rounded, zero_prefix, storage = _forensics(ds, quiet)
            _implausible_note(findings.by_kind("implausible_logprobs"))
            _critical_notes(findings)
            _identical_note(ds)
        warnings = _notes.warnings()
        closed = _json_output(json_path, envelope(
            "inspect", desc, {"layout": layout, "entropy": entropy, "framework": framework,
                              "skip_unreadable": skip_unreadable,
                              "seq_id_per_file": seq_id_per_file},
            forensics=None if findings is None else findings.to_dict(), warnings=warnings,
            rounded_logprobs=rounded, zero_prefix=zero_prefix,
            storage_precision=storage), quiet)
        out = _tables(json_path)
        render_inspect(desc, out)
        if findings is not None:
            render_findings(findings, out)
        else:
            out.print("no valid loss-masked token: nothing to analyse.")
        closed.done()


# ----------------------------------------------------------------- fit


#: Parquet file metadata of a ``compare --export`` whose ENTR column is all null: why
UNAVAILABLE_MARK = "entr_diag.unavailable"


def _output_mark(command: str) -> dict[str, str]:
    """Parquet file metadata marking an entr-diag output (directory walks skip it)."""
    from entr_diag.io.load import OUTPUT_MARK

    return {OUTPUT_MARK: f"entr-diag {__version__} {command}"}


def _dropped(ds, canon: str):
    """The loader's note that it dropped ``canon`` because some files lack it (``CANON
    ('SRC') is missing from N of M files (e.g. FILE): not used``, the entropy's a
    ``warning:`` going on `` in any file: ...``), as a regex match, or
    None when no file has the column."""
    import re

    pattern = (rf"(?:warning: )?{re.escape(canon)} \('(?P<src>.*)'\) is missing from "
               r"(?P<n>\d+) of (?P<m>\d+) files \(e\.g\. (?P<file>.*?)\): not used"
               r"(?: in any file: .*)?")
    for note in ds.notes:
        m = re.fullmatch(pattern, note)
        if m:
            return m
    return None


def _no_column(ds, canon: str, consequence: str, fix: str) -> str:
    """The message for a missing ``canon`` column: when the loader dropped it because some
    files lack it, or it holds no valid value or only nulls, say so and how to proceed;
    else that the input has none."""
    m = _dropped(ds, canon)
    if m:
        return (
            f"the {canon} column ('{m['src']}') is missing from {m['n']} of {m['m']} "
            f"input files (e.g. {m['file']}), so it was not used, and without it "
            f"{consequence}. Pass only the files that have it, or {fix}."
        )
    bad = [n for n in ds.notes if n.startswith(f"warning: {canon} (")
           and " holds no valid value " in n]
    if bad:  # the column is there, without one usable value: dropped by the loader (the
        # entropy: each candidate tried, e.g. 'entropy' and then 'train_entropy')
        srcs = " and ".join(f"'{n.split(chr(39))[1]}'" for n in bad)
        whats = [n.split(" token (", 1)[1].split("): ", 1)[0] if " token (" in n else ""
                 for n in bad]
        what = whats[0] + (" each" if len(bad) > 1 else "") if len(set(whats)) == 1 else ""
        return (f"{_where(ds)}: the {canon} column{'s' if len(bad) > 1 else ''} ({srcs}) "
                f"{'hold' if len(bad) > 1 else 'holds'} no valid value for any "
                f"loss-masked token{f' ({what})' if what else ''}, so {consequence}; {fix}.")
    per_row = next((n for n in ds.notes if n.startswith(f"warning: {canon} (")
                    and " holds one value per row, " in n), None)
    if per_row:  # a nested file's per-sequence value: dropped by the loader
        return (f"{_where(ds)}: the {canon} column ('{per_row.split(chr(39))[1]}') holds one "
                "value per sequence row, not a list of one per token (a per-sequence value is "
                f"no token's entropy), so {consequence}; {fix}.")
    nulls = next((n for n in ds.notes if n.startswith(f"{canon} (") and "holds only nulls" in n),
                 None)
    if nulls:  # the column is there, all null: dropped by the loader
        src = nulls.split("'")[1]
        return (f"{_where(ds)}: the {canon} column ('{src}') holds only nulls, so "
                f"{consequence}; {fix}.")
    cases = next((n for n in ds.notes if n.startswith(f"{canon}: ") and " ignoring case; " in n),
                 None)
    if cases:  # several columns spell its name in other cases
        return (f"{_where(ds)}: the input has no {canon} column ({cases.split(': ', 1)[1]}), "
                f"so {consequence}.")
    near = next((n for n in ds.notes if n.startswith("warning: column ")
                 and f" it is named as {canon} is, " in n), None)
    if near:  # its name with an invisible character (the warning is dropped with the error)
        return (f"{_where(ds)}: the input has no {canon} column, so {consequence}: "
                + near.removeprefix("warning: ") + ".")
    return f"{_where(ds)}: the input has no {canon} column, so {consequence}; {fix}."


def _check_fit_options(eps, tau, n_boot, bins) -> None:
    """:func:`entr_diag.fit.check_fit_parameters`, its refusal naming the option (``--tau
    0: tau must be ...``), as a bad value of any other option is named."""
    from entr_diag.fit import check_fit_parameters

    try:
        check_fit_parameters(eps, tau, n_boot, bins)
    except ParameterError as e:
        msg = str(e)
        name = msg.split(" ", 1)[0]
        given = {"eps": eps, "tau": tau, "n_boot": n_boot, "bins": bins}
        if name in given:
            raise ParameterError(f"--{name.replace('_', '-')} {given[name]:g}: {msg}") from None
        raise


def _check_bin_edges(bin_edges: str) -> None:
    """Refuse an unknown --bin-edges before any data is read."""
    if bin_edges not in ("quantile", "log"):
        raise ParameterError(f"--bin-edges {bin_edges}: expected quantile or log.")


#: the forensic checks ``compare`` runs in its first pass: those whose findings distort the
#: law its token categories (noise admitted, exploration discarded) rest on, and that cost
#: no pass of their own (the sequence-outlier tables, the corrupt-rows raw pass and the
#: implausible-logprob check's listing are left to ``fit`` and ``report``; ``compare`` has
#: its own implausible-logprob count)
COMPARE_CHECKS: tuple[str, ...] = ("misalignment", "one_sided_temperature",
                                   "truncated_sampling", "drift", "staleness")

_NO_ENTROPY = "the scaling law and the ENTR gate are unavailable"
_MAP_ENTROPY = "map one with --column entropy=NAME"


def _map_entropy(ds) -> str:
    """How to give the input an entropy: map a column; and ``--entropy train`` only when it
    has a trainer-side entropy column that holds values (not dropped, not all null)."""
    train = ds.mapping.get("train_entropy")
    if train and not any(f"('{train}') holds only nulls" in n for n in ds.notes):
        return _MAP_ENTROPY + f" (or --entropy train for the trainer-side entropy '{train}')"
    return _MAP_ENTROPY


def _fit_refusal(ds, e: FitError, optional: bool) -> str:
    """The fit's refusal (too few tokens or sequences, ...) naming the input: raised again
    (exit 2) unless ``optional``; else returned, as the reason the law is unavailable."""
    msg = f"{_where(ds)}: {_why_no_fit(ds, e)}."
    if not optional:
        raise FitError(msg) from None
    return msg


def _why_no_fit(ds, e: FitError | str) -> str:
    """The fit's refusal as a phrase: first letter lower case, no final period. When the
    exclusions removed most loss-masked tokens it leads with them (how many, why, what that
    usually means: :func:`~entr_diag.caveats.exclusion_lead`) instead of advising more
    tokens: the few left are not the problem."""
    from entr_diag.caveats import exclusion_lead
    from entr_diag.fit import MORE_DATA

    msg = str(e).rstrip(".")
    why = f"{msg[:1].lower()}{msg[1:]}"
    acc = ds.accounting
    if "one sequence block" in msg:  # which column made them one sequence
        from entr_diag.caveats import column_named

        why += (f" (the valid tokens form {acc.sequences_valid:,} sequence"
                f"{'' if acc.sequences_valid == 1 else 's'}, keyed by step and "
                f"{column_named('seq_id', ds.mapping)}: one value for every row?)")
    lead = exclusion_lead(acc.excluded, acc.tokens_masked, acc.tokens_valid, ds.mapping,
                          acc.excluded_where)
    if not lead:
        return why
    return (f"{lead} The law cannot be fitted on the {acc.tokens_valid:,} tokens left: "
            + why.removesuffix(f"; {MORE_DATA}"))


def _import_meanwhile(module: str) -> None:
    """Import ``module`` on a worker thread while this one goes on (scipy.stats takes 0.5 s
    of Python; the alignment check that follows the pass is mostly polars, which releases
    the GIL). A later import of the module waits for this one. Not a daemon thread: an
    import is never cut short at exit."""
    import importlib
    import threading

    def target() -> None:
        with contextlib.suppress(Exception):  # the later import raises it where it is used
            importlib.import_module(module)

    if module not in sys.modules:
        threading.Thread(target=target, name=f"import {module}").start()


def _sample_checks(ds, align) -> tuple[dict | None, dict | None, dict | None, dict | None]:
    """The checks on the shift test's sampled sequences (``align``: its MisalignmentPlan
    after the pass, or None), each with a ``warning:`` line when it finds something:
    logprobs stored rounded (:func:`~entr_diag.forensics.rounded_logprobs`, pooled, else
    per input file; not for an integer-typed column, which has its own warning),
    sequences beginning with exact zeros (:func:`~entr_diag.forensics.zero_prefixes`) and
    an entropy column shifted against the logprobs
    (:func:`~entr_diag.forensics.entropy_alignment`; not judged when the logprobs are
    shifted against each other), and logprobs stored in bf16 or fp16
    (:func:`~entr_diag.forensics.storage_precision`, a warning when the rounding distorts
    the law). Returns (rounded, zero_prefix, entropy_alignment, storage): None for nothing
    found, entropy_alignment None when it was not checked (else its ``to_dict()``,
    whatever its status)."""
    if align is None:
        return None, None, None, None
    rounded = align.rounding()  # logprobs stored rounded (the sample tells)
    if not rounded:  # ... in some files only
        by_file = align.rounding_by_file()
        rounded = {"by_file": by_file, "input_files": len(ds.files)} if by_file else None
    from entr_diag.caveats import integer_columns, storage_caveat

    # an integer-typed column has its own warning (integer_caveat): judged by neither check
    ints = {c.split(" ", 1)[0] for c in integer_columns(ds.notes)}
    if rounded and "by_file" not in rounded:
        rounded = {c: step for c, step in rounded.items() if c not in ints} or None
    if rounded:  # equal values in consecutive tokens are the rounding's, not rows written
        _notes.discard("repeat the row before them")  # twice (a repeated row's warning)
        _notes.discard("repeat another row of their sequence")
        from entr_diag.caveats import rounding_caveat

        # engine zeros read as one-token nuclei are, in a rounded engine column, logprobs
        # rounded to 0: the rounding explains them (the nucleus note would contradict it)
        nuclei = ds.nucleus_zeros if "infer_logprob" in rounded else 0
        if nuclei:
            _notes.discard("one-token nuclei of top-p / top-k")
        _notes.add("[yellow]warning:[/yellow] " + escape(rounding_caveat(
            rounded, ds.mapping, ds.accounting.excluded.get("zero_placeholder", 0),
            nucleus_zeros=nuclei,
        ).removeprefix("caveat: ")))
    # logprobs stored in bf16 / fp16 (not judged for a column rounded to a decimal step
    # or integer-typed: the warnings above cover it)
    skip = ints | set(rounded if rounded and "by_file" not in rounded else ())
    storage = align.storage(tuple(skip))
    caveat = storage_caveat(storage, ds.mapping)
    if caveat:
        _notes.add("[yellow]warning:[/yellow] " + escape(caveat.removeprefix("caveat: ")))
    zero_prefix = align.zero_prefix()
    if zero_prefix:  # the loss mask covering the prompt, written as zeros
        from entr_diag.caveats import zero_prefix_caveat

        _notes.add("[yellow]warning:[/yellow] " + escape(
            zero_prefix_caveat(zero_prefix, ds.mapping).removeprefix("caveat: ")))
    ent = align.entropy_alignment()
    if ent is not None and ent.status == "unrelated" and _void_share(ds):
        # the test read only the entropies left in range, those of the tokens the fault
        # left there (an entropy x1000: the near-zero ones), whose ranks say nothing of
        # the column: its exclusion, which voids the verdict, is the story
        ent = dataclasses.replace(ent, status="cannot_tell", reason=(
            f"{ent.reason}; but {_void_share(ds):.1%} "
            "of the loss-masked tokens have an entropy out of range, and the test read "
            "only the few left in range, whose ranks say nothing of the column"))
    ent_d = None if ent is None else ent.to_dict()
    if ent is not None and _entropy_shifted(ent_d):  # no entropy of its own
        from entr_diag.caveats import entropy_shift_caveat

        _notes.add("[yellow]warning:[/yellow] " + escape(
            (entropy_shift_caveat(ent_d, ds.mapping) or "").removeprefix("caveat: ")))
    return rounded, zero_prefix, ent_d, storage


def _fit(ds, bins, bin_edges, eps, tau, n_boot, seed, quiet, *, allow_misaligned: bool,
         full: bool = True, forensics: bool | tuple[str, ...] = False,
         profiles: bool = False,
         entropy_optional: bool = False, law_optional: bool = False, gates=None,
         implausible: bool = False):
    """The scaling-law fit (with ``full``: its strata and the mismatch metrics; with
    ``forensics`` / ``profiles``: those too), the off-by-one alignment check and, given
    ``gates`` (a function returning a ComparePlan, :func:`_gate_plan`; called once the
    entropy column is checked), the gate comparison's first pass, all in ONE pass over
    the tokens: every analysis contributes accumulators to
    :func:`entr_diag.passes.run_pass`. A misaligned input stops the command after the pass
    (exit 2) unless ``allow_misaligned``.

    An input without an entropy column raises ParameterError unless ``entropy_optional``
    (and no input file has one: then the files lacking it are the mistake); an input the
    law cannot be fitted on (too few tokens or sequences, ...) raises FitError unless
    ``law_optional``; both refusals name the input.

    Returns a dict with keys ``fit`` (FitResult, or None: no entropy column, or the fit
    failed and ``law_optional``), ``unavailable`` (None, or why the fit failed, naming the
    input), ``no_fit`` (the same reason as a phrase, without the input), ``metrics``,
    ``findings`` (None when not asked for), ``profiles``: the unfinished ProfilesPlan
    (its version-switch follow-up pass is shared with the gate comparison's second pass;
    call ``finish()`` after), ``gates``: the ComparePlan after its first pass (None
    without ``gates``), ``implausible``: with ``implausible`` and without ``forensics``, the
    unfinished :class:`~entr_diag.forensics.ImplausiblePlan` (its follow-up joins a later
    pass; call ``finish()`` after), else None, ``file_units``: the input files whose own units check names a
    mistake the pooled one does not, ``[(file, UnitsCheck)]`` or None
    (:class:`~entr_diag.fit.FileUnitsPlan`), and ``rounded``: the logprob columns stored
    rounded, column ->
    step in nats (:func:`~entr_diag.forensics.rounded_logprobs` on the shift test's
    sample; None when none is, and for an integer-typed column, which has its own
    warning), ``zero_prefix``: sequences beginning with exact-zero logprobs and entropy
    (:func:`~entr_diag.forensics.zero_prefixes` on the same sample; None when none).
    """
    from entr_diag.fit import fit_plan
    from entr_diag.passes import run_pass

    plans: dict = {}
    unavailable = no_fit = None
    if ds.has("entropy"):
        try:
            plans["fit"] = fit_plan(ds.lf, bins=bins, bin_edges=bin_edges, eps=eps, tau=tau,
                                    n_boot=n_boot, seed=seed, with_strata=full,
                                    fine_counts=ds.entropy_fine_counts,
                                    step_range=ds.step_range,
                                    staleness_unit=_staleness_unit(ds))
        except FitError as e:
            unavailable, no_fit = _fit_refusal(ds, e, law_optional), _why_no_fit(ds, e)
    elif not entropy_optional or _dropped(ds, "entropy"):  # some files have it: to fix
        raise ParameterError(_no_column(ds, "entropy", _NO_ENTROPY, _map_entropy(ds)))
    if "fit" in plans and len(ds.files) > 1:  # a unit mistake in some files only
        from entr_diag.fit import FileUnitsPlan

        plans["file_units"] = FileUnitsPlan(plans["fit"], [str(f.path) for f in ds.files])
    if full:
        from entr_diag.metrics import metrics_plan

        plans["metrics"] = metrics_plan(ds.lf)
    if forensics:
        from entr_diag.forensics import forensics_plan

        plans["findings"] = forensics_plan(ds, None if forensics is True else forensics)
        align = plans["findings"].misalign
    else:
        from entr_diag.forensics import misalignment_plan

        align = plans["alignment"] = misalignment_plan(ds)
    if profiles:
        from entr_diag.profiles import profiles_plan

        plans["profiles"] = profiles_plan(ds.lf, eps=eps)
    if implausible and forensics is not True and "implausible_logprobs" not in (
            forensics or ()):
        from entr_diag.forensics import ImplausiblePlan

        plans["implausible"] = ImplausiblePlan(ds)
    gate_plan = gates() if gates is not None else None
    what = ", ".join([{"findings": "forensics"}.get(k, k) for k in plans
                      if k not in ("alignment", "file_units", "implausible")]
                     + (["gates"] if gate_plan is not None else []))
    with _status(f"one pass ({what})", quiet, rows=ds.accounting.tokens_valid):
        run_pass(ds.lf, [a for p in plans.values() for a in p.accumulators]
                 + (gate_plan.accumulators if gate_plan is not None else []))
    if "fit" in plans or forensics:  # their robust statistics; meanwhile the alignment check
        _import_meanwhile("scipy.stats")
    misaligned = None
    if align is not None:
        misaligned = align.finish()  # (None: aligned; else refused unless allowed)
        _check_alignment(ds, misaligned, allow_misaligned)
    rounded, zero_prefix, entropy_align, storage = _sample_checks(ds, align)
    with _status("fitting...", quiet):
        out = {}
        for k, p in plans.items():
            if k == "file_units":  # after the fit: the pooled units check
                continue
            try:
                if k == "findings":  # the staleness check reads the law regime only
                    fr = out.get("fit")
                    bp = fr.breakpoint if fr is not None else None
                    units = fr.units if fr is not None else None
                    out[k] = p.finish(h_star=None if bp is None else bp.h_star,
                                      other_token=None if units is None else units.other_token,
                                      unit_mistake=None if units is None
                                      else units.likely_mistake,
                                      units_checked=units is not None,
                                      entropy_shifted=_entropy_shifted(entropy_align),
                                      entropy_out_of_range=_void_share(ds))
                else:
                    out[k] = p if k in ("profiles", "implausible") else p.finish()
            except FitError as e:
                if k != "fit":
                    raise
                unavailable, no_fit = _fit_refusal(ds, e, law_optional), _why_no_fit(ds, e)
    if out.get("findings") is not None:  # impossible logprobs that bias the fit: a warning
        _implausible_note(out["findings"].by_kind("implausible_logprobs"))  # (as compare's)
    file_units = None  # a unit mistake in some input files only
    file_scale = None  # files whose mismatch is many times the others'
    if out.get("fit") is not None and "file_units" in plans:
        units = out["fit"].units
        file_units = plans["file_units"].finish(units)
        named = {f for f, _c in file_units}  # (their own unit or token explains them)
        file_scale = [o for o in plans["file_units"].scale_outliers() if o["file"] not in named]
    if out.get("fit") is not None and out["fit"].units is not None:  # a unit mistake?
        from entr_diag.caveats import units_caveat

        caveat = units_caveat(_shown_units(out["fit"].units.to_dict(),
                                           misaligned or _entropy_shifted(entropy_align)
                                           or _mask_unsampled(out.get("findings")),
                                           file_units, _scale_seen(ds)), ds.mapping)
        if caveat:
            _notes.add("[yellow]warning:[/yellow] " + escape(caveat.removeprefix("caveat: ")))
    if file_units:  # ... in some input files only
        from entr_diag.caveats import file_units_caveat

        _notes.add("[yellow]warning:[/yellow] " + escape(file_units_caveat(
            file_units, len(ds.files), ds.mapping).removeprefix("caveat: ")))
    if file_scale:
        from entr_diag.caveats import file_scale_caveat

        _notes.add("[yellow]warning:[/yellow] " + escape(file_scale_caveat(
            file_scale, len(ds.files)).removeprefix("caveat: ")))
    return {"unavailable": unavailable, "no_fit": no_fit, "gates": gate_plan, "rounded": rounded,
            "zero_prefix": zero_prefix, "entropy_alignment": entropy_align,
            "storage": storage,
            "misaligned": None if misaligned is None else _misaligned_caveat(misaligned),
            "file_units": file_units or None, "file_scale": file_scale or None,
            **{k: out.get(k) for k in ("fit", "metrics", "findings", "profiles",
                                       "implausible")}}


@app.command(cls=_Command)
def fit(
    paths: Paths = None,
    bins: BinsOpt = DEFAULT_BINS,
    bin_edges: BinEdgesOpt = "quantile",
    eps: EpsOpt = 0.01,
    tau: TauOpt = 4.0,
    n_boot: BootOpt = 1000,
    seed: SeedOpt = 0,
    column: ColumnOpt = None,
    framework: FrameworkOpt = None,
    layout: LayoutOpt = "auto",
    entropy: EntropyOpt = "auto",
    skip_unreadable: SkipUnreadableOpt = False,
    seq_id_per_file: SeqIdPerFileOpt = False,
    allow_misaligned: MisalignedOpt = False,
    json_path: JsonOpt = None,
    quiet: QuietOpt = False,
) -> None:
    """Fit E\\[delta^2 | H] ~ k*H, locate the low-entropy noise regime, and log mismatch metrics.

    Example: entr-diag fit logs.parquet --bins 30 --json fit.json
    """
    from entr_diag.report.json_report import envelope
    from entr_diag.report.terminal_findings import render_findings
    from entr_diag.report.terminal_fit import render_fit

    with _errors(quiet):
        _check_fit_options(eps, tau, n_boot, bins)
        _check_bin_edges(bin_edges)
        _check_output(json_path, "--json")
        _refuse_overwriting_inputs(paths, {"--json": json_path})
        ds = _load(paths, column, framework, layout, entropy, quiet,
                   skip_unreadable=skip_unreadable, seq_id_per_file=seq_id_per_file)
        a = _fit(ds, bins, bin_edges, eps, tau, n_boot, seed, quiet,
                 allow_misaligned=allow_misaligned, forensics=True)
        fit_res, metrics, findings = a["fit"], a["metrics"], a["findings"]
        params = {"bins": bins, "bin_edges": bin_edges, "eps": eps, "tau": tau,
                  "n_boot": n_boot, "seed": seed, "layout": layout, "entropy": entropy,
                  "framework": framework, "skip_unreadable": skip_unreadable,
                  "seq_id_per_file": seq_id_per_file}
        fd = _fit_dict(fit_res, ds, findings, a["rounded"], a["file_units"], a["zero_prefix"],
                       a["misaligned"], entropy_alignment=a["entropy_alignment"], storage=a["storage"], file_scale=a["file_scale"])
        caveat = fd["verdict"]["caveat"]
        params.update(fd.pop("parameters", {}))
        closed = _json_output(json_path, envelope("fit", ds.describe(), params, **fd,
                                                  metrics=metrics.to_dict(),
                                                  forensics=findings.to_dict(),
                                                  warnings=_notes.warnings()), quiet)
        from entr_diag.caveats import truncation_metrics_note

        render_fit(fit_res, metrics, _tables(json_path), caveat=caveat,
                   verdict=fd["verdict"]["text"], forensics=fd["verdict"]["forensics"],
                   metrics_note=truncation_metrics_note(findings.to_dict()))
        render_findings(findings, _tables(json_path), show_checks=False)
        closed.done()


@app.command(cls=_Command)
def flag(
    ctx: typer.Context,
    paths: Paths = None,
    output: Annotated[Path, typer.Option("--output", "-o", parser=_output_path, metavar="FILE", help="Parquet file for the flagged tokens.")] = Path("noise.parquet"),
    bins: BinsOpt = DEFAULT_BINS,
    bin_edges: BinEdgesOpt = "quantile",
    eps: EpsOpt = 0.01,
    tau: TauOpt = 4.0,
    n_boot: BootOpt = 1000,
    seed: SeedOpt = 0,
    column: ColumnOpt = None,
    framework: FrameworkOpt = None,
    layout: LayoutOpt = "auto",
    entropy: EntropyOpt = "auto",
    skip_unreadable: SkipUnreadableOpt = False,
    seq_id_per_file: SeqIdPerFileOpt = False,
    allow_misaligned: MisalignedOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Write the low-entropy noise tokens (H < H* and delta^2/(H+eps) > tau) to Parquet.

    Example: entr-diag flag logs.parquet -o noise.parquet
    """
    import os

    from entr_diag.atomic import output_target, write_with
    from entr_diag.regime import flagged_tokens

    with _errors(quiet):
        _check_fit_options(eps, tau, n_boot, bins)
        _check_bin_edges(bin_edges)
        _check_output(output, "--output")
        _refuse_overwriting_inputs(paths, {"--output": output}, _defaulted(ctx, "output"))
        _note_parquet_suffix(output, "--output", quiet)
        ds = _load(paths, column, framework, layout, entropy, quiet,
                   skip_unreadable=skip_unreadable, seq_id_per_file=seq_id_per_file)
        a = _fit(ds, bins, bin_edges, eps, tau, n_boot, seed, quiet, full=False,
                 allow_misaligned=allow_misaligned)
        res = a["fit"]
        bp = res.to_dict().get("breakpoint")
        h_star = None if bp is None else bp["h_star"]
        # a verdict that is not assessable (integer logprobs, a shifted entropy column, most
        # entropies out of range...): its H* and the tokens below it describe the fault
        void = _fit_dict(res, ds, None, a["rounded"], a["file_units"], a["zero_prefix"],
                         a["misaligned"], entropy_alignment=a["entropy_alignment"],
                         storage=a["storage"], file_scale=a["file_scale"]
                         )["verdict"]["not_assessable"]
        _notes.flush()  # the output begins: the notes held so far come first
        # always written (empty, same columns, when there is no break): a stale file from an
        # earlier run must never pass for this run's result
        lf = flagged_tokens(_with_file(ds), h_star=h_star, tau=tau, eps=eps).with_columns(
            pl.col("seq_id").cast(ds.seq_id_dtype))
        # what made this file, so that a saved one can be traced back to its run
        meta = {**_output_mark("flag"), "entr_diag.parameters": json.dumps({
            "h_star": h_star, "tau": tau, "eps": eps, "bins": bins, "bin_edges": bin_edges,
            "seed": seed, "n_boot": n_boot, "inputs": [str(f.path) for f in ds.files],
            "skipped_unreadable": [p for p, _why in ds.skipped_unreadable],
            "seq_id_per_file": seq_id_per_file,
            # (the inputs as given: relative ones are read from here; helper-44)
            "working_directory": os.getcwd(),
            "assessable": void is None, "not_assessable": void})}
        write_with(output, lambda dest: lf.sink_parquet(dest, compression="zstd",
                                                         metadata=meta))
        out = _tables(output)  # stderr when the Parquet goes to stdout
        not_ok = ("" if void is None else
                  f" The verdict is not assessable ({void}): a noise regime read from this "
                  "input describes that fault, not the mismatch; see `entr-diag fit`.")
        if h_star is None:
            reason = (res.to_dict().get("regime") or {}).get("breakpoint_search", {}).get("reason", "")
            out.print("no low-entropy noise regime was found in this run, so no token is "
                      f"flagged; wrote an empty {output}"
                      + (f" ({reason})." if reason else ".")
                      + (not_ok or " See `entr-diag fit`."),
                      soft_wrap=True, markup=False)
            return
        if output_target(output)[1]:
            n = pl.scan_parquet(output, glob=False).select(pl.len()).collect().item()
        else:  # written to a device or a pipe: nothing to read back
            n = lf.select(pl.len()).collect().item()
        from entr_diag.caveats import entropy_text, entropy_unit

        units = res.to_dict().get("units")
        unit = entropy_unit(units)
        nats = None if unit is None else f"{h_star * unit[1]:.4g}"
        out.print(f"{n:,} low-entropy noise tokens (H < H* = "
                  f"{entropy_text(f'{h_star:.4g}', '', units, nats)} and "
                  f"delta^2/(H+{eps:g}) > {tau:g}) written to {output}" + (
                      f".{not_ok}" if not_ok else ""), soft_wrap=True, markup=False)


# ----------------------------------------------------------------- compare


def _parse_sweep(items: list[str] | None) -> dict[str, object]:
    import numpy as np

    out: dict[str, object] = {}
    for item in items or []:
        try:
            name, rng = item.split("=", 1)
            name = name.strip()
            parts = rng.split(":")
            lo, hi = float(parts[0]), float(parts[1])
            n = int(parts[2]) if len(parts) > 2 else 25
            if (name not in ("tau", "c") or not (0 < lo < hi) or not math.isfinite(hi)
                    or not 2 <= n <= 512 or len(parts) > 3):
                raise ValueError
        except (ValueError, IndexError):
            raise ParameterError(
                f"--sweep {item}: expected tau=LO:HI[:N] or c=LO:HI[:N] with 0 < LO < HI and N "
                "a whole number from 2 to 512, e.g. --sweep tau=0.5:16 (log-spaced, N points, "
                "default 25)."
            ) from None
        if name in out:
            raise ParameterError(f"--sweep {item}: a {name} sweep is already given; give one "
                                 f"per budget (tau and c).")
        out[name] = np.geomspace(lo, hi, n)
    return out


def _gates(gate: list[str] | None, tau: float, eps: float, quiet: bool = True):
    """Parse --gate specs (before any data is read): (ENTR spec, panel). At most one ENTR
    gate; its tau / eps, when the spec leaves them out (``--gate entr``), are --tau / --eps;
    a gate given twice is compared once; an ENTR gate whose tau / eps differ from --tau /
    --eps is noted (those still define the noise tokens)."""
    from entr_diag.gates import DEFAULT_PANEL, EntrGate, parse_gate_spec

    _check_fit_options(eps, tau, 1000, None)  # --tau / --eps named as fit names them
    # (an ENTR parameter the spec leaves out: --tau / --eps)
    panel = ([parse_gate_spec(g, {"tau": tau, "eps": eps}) for g in gate] if gate
             else list(DEFAULT_PANEL))
    unique = list(dict.fromkeys(panel))  # gate specs are frozen dataclasses: equal = same
    if len(unique) < len(panel) and not quiet:
        _notes.add(f"note: {len(panel) - len(unique)} --gate spec(s) repeat an earlier one: "
                   "each gate is compared once.")
    entr_specs = [g for g in unique if isinstance(g, EntrGate)]
    if len(entr_specs) > 1:
        raise ParameterError(
            f"--gate: {len(entr_specs)} ENTR gates ({', '.join(g.spec() for g in entr_specs)}); "
            "compare one at a time (or sweep tau with --sweep tau=LO:HI).")
    entr = entr_specs[0] if entr_specs else EntrGate(tau=tau, eps=eps)
    if entr_specs and (entr.tau, entr.eps) != (tau, eps) and not quiet:
        _notes.add(f"note: the ENTR gate runs as --gate {entr.spec()}; --tau {tau:g} and "
                   f"--eps {eps:g} still define the noise tokens (H < H* and "
                   "delta^2/(H+eps) > tau).")
    return entr, [g for g in unique if not isinstance(g, EntrGate)]


def _with_file(ds) -> pl.LazyFrame:
    """``ds.lf`` with a ``file`` column (each row's input file path, an Enum) when the input
    has several files, for the outputs that join back to the dump (``flag -o``, ``compare
    --export``): (seq_id, position, step) alone repeats when ids restart in each file."""
    from entr_diag.passes import FILE_INDEX

    if len(ds.files) < 2:
        return ds.lf
    names = [str(f.path) for f in ds.files]  # (distinct: each input file is read once)
    return ds.lf.with_columns(pl.col(FILE_INDEX).replace_strict(
        list(range(len(names))), names, return_dtype=pl.Enum(names)).alias("file"))


def _gate_plan(ds, entr, panel, sweeps):
    """The gate comparison's plan (:class:`~entr_diag.compare.ComparePlan`) before the fit:
    its first pass needs no law, so it runs in the fit's pass (``_fit(..., gates=lambda:
    _gate_plan(...))``); :func:`_compare` sets the law and runs the second."""
    import numpy as np

    from entr_diag.compare import compare_plan

    n_h = ds.accounting.excluded.get("invalid_entropy", 0)
    seq_gates = list(dict.fromkeys(g.name for g in panel
                                   if getattr(g, "level", "") == "sequence"))
    if n_h and seq_gates:  # tokens with valid logprobs, outside the analysis
        _notes.add(
            f"note: {n_h:,} loss-masked token(s) excluded as invalid_entropy (no usable "
            "entropy; their logprobs valid) enter the sequence gates' statistics "
            f"({escape(', '.join(seq_gates))}: ratio sums, means, the veto's minimum), as "
            "verl and slime count them, but no kept count: the tables count analysed "
            "tokens only.")
    return compare_plan(
        ds.lf, entr=entr, panel=panel,
        sweep_tau=sweeps.get("tau", np.geomspace(0.5, 16, 25)),
        sweep_c=sweeps.get("c", np.geomspace(0.02, 2.0, 25)),
        staleness_unit=_staleness_unit(ds), no_entropy=ds.entropy_unused,
        unscored=ds.unscored(),
    )


def _staleness_unit(ds) -> int:
    """The unit of lag of the input's staleness buckets, from the accounting's staleness
    values (:func:`~entr_diag.aggregate.staleness_unit`; 1 without version columns)."""
    from entr_diag.aggregate import staleness_unit

    return staleness_unit(ds.accounting.staleness)


def _compare(ds, fit_res, plan, quiet, *, with_plans=(), no_fit=None):
    """The gate comparison after its first pass (run with the fit, :func:`_gate_plan`):
    the fitted law set on ``plan``, then its second pass over the tokens, shared with the
    follow-up accumulators of ``with_plans`` (plans whose ``finish`` the caller calls
    afterwards). ``fit_res`` None: no law and no noise regime, because the fit failed
    (``no_fit`` says why) or the input has no entropy (and ENTR is unavailable)."""
    import numpy as np

    from entr_diag.passes import run_pass

    law: dict = {}
    if fit_res is not None:
        fd = fit_res.to_dict()
        bp = fd.get("breakpoint")
        power = fd["laws"]["power"]
        edges = np.array([b["h_lo"] for b in fd["bins"]] + [fd["bins"][-1]["h_hi"]]) if fd.get("bins") and "h_lo" in fd["bins"][0] else None
        law = {"h_star": None if bp is None else bp["h_star"], "law_k": power.get("k"),
               "law_alpha": power.get("alpha", 1.0) or 1.0,
               "flag_tau": fd["parameters"].get("tau", 4.0),
               "flag_eps": fd["parameters"].get("eps", 0.01), "entropy_edges": edges}
        from entr_diag.caveats import entropy_unit

        unit = entropy_unit(fd.get("units"))  # (an entropy column read as bits: said so)
        if unit is not None:
            law["entropy_unit"] = unit[0]
    plan.set_law(**law, no_fit=no_fit)
    rows = ds.accounting.tokens_valid
    second = plan.followup() + [a for p in with_plans for a in p.followup()]
    with _status("gates, second pass", quiet, rows=rows):
        run_pass(ds.lf, second)
    return plan.finish()


@app.command(cls=_Command)
def compare(
    paths: Paths = None,
    tau: TauOpt = 4.0,
    eps: EpsOpt = 0.01,
    gate: Annotated[
        list[str] | None,
        typer.Option("--gate", "-g", metavar="SPEC",
                     help=_GATE_HELP),
    ] = None,
    sweep: Annotated[
        list[str] | None,
        typer.Option(metavar="tau|c=LO:HI[:N]",
                     help="Sweep a budget in one pass: tau=LO:HI[:N] or c=LO:HI[:N] (repeatable)."),
    ] = None,
    export: Annotated[Path | None, typer.Option(parser=_output_path, metavar="FILE", help="Write per-token keep/drop of each gate to this Parquet file.")] = None,
    bins: BinsOpt = DEFAULT_BINS,
    bin_edges: BinEdgesOpt = "quantile",
    n_boot: BootOpt = 200,
    seed: SeedOpt = 0,
    column: ColumnOpt = None,
    framework: FrameworkOpt = None,
    layout: LayoutOpt = "auto",
    entropy: EntropyOpt = "auto",
    skip_unreadable: SkipUnreadableOpt = False,
    seq_id_per_file: SeqIdPerFileOpt = False,
    allow_misaligned: MisalignedOpt = False,
    json_path: JsonOpt = None,
    quiet: QuietOpt = False,
) -> None:
    """Simulate which tokens ENTR and fixed / framework gates keep, and where they differ.

    Example: entr-diag compare logs.parquet --tau 4 --gate fixed:c=0.5 --sweep tau=0.5:16
    """
    from entr_diag.report.json_report import envelope
    from entr_diag.report.terminal_compare import render_compare

    with _errors(quiet):
        sweeps = _parse_sweep(sweep)
        entr, panel = _gates(gate, tau, eps, quiet)
        _check_bin_edges(bin_edges)
        _check_output(json_path, "--json")
        _check_output(export, "--export")
        _note_parquet_suffix(export, "--export", quiet)
        _refuse_overwriting_inputs(paths, {"--json": json_path, "--export": export})
        _check_fit_options(eps, tau, n_boot, bins)
        ds = _load(paths, column, framework, layout, entropy, quiet,
                   skip_unreadable=skip_unreadable, seq_id_per_file=seq_id_per_file)
        if not ds.has("entropy") and not panel:  # only ENTR asked for: it needs entropy
            raise ParameterError(_no_column(
                ds, "entropy", _NO_ENTROPY + ", and the ENTR gate is the only gate asked for "
                "(--gate)", _map_entropy(ds) + ", or add gates that need no entropy (e.g. --gate "
                "fixed:c=0.5)"))
        a = _fit(ds, bins, bin_edges, eps, tau, n_boot, seed, quiet, full=False,
                 allow_misaligned=allow_misaligned, entropy_optional=True, law_optional=True,
                 gates=lambda: _gate_plan(ds, entr, panel, sweeps), implausible=True,
                 forensics=COMPARE_CHECKS)
        fit_res = a["fit"]
        no_entr = no_law = None  # no entropy column: the gates that need none are compared
        if a["unavailable"]:  # too little data for the law: the gates need none
            no_law = (f"{a['unavailable']} The scaling law is therefore unavailable (the "
                      "gates are compared without its token categories: noise admitted and "
                      "exploration discarded)")
        elif fit_res is None:
            no_entr = _no_column(ds, "entropy", _NO_ENTROPY + " (the gates that need no entropy "
                                 "are compared)", _map_entropy(ds))
        res = _compare(ds, fit_res, a["gates"], quiet, no_fit=a["no_fit"],
                       with_plans=[a["implausible"]])
        implausible = _implausible_note(a["implausible"].finish())
        params = {"tau": tau, "eps": eps, "gates": gate or "default panel",
                  "sweep": {k: list(v) for k, v in sweeps.items()}, "bins": bins,
                  "bin_edges": bin_edges, "n_boot": n_boot, "seed": seed, "layout": layout,
                  "entropy": entropy, "framework": framework,
                  "skip_unreadable": skip_unreadable,
                  "seq_id_per_file": seq_id_per_file}
        from entr_diag.atomic import together

        warnings = _notes.warnings()
        _notes.flush()  # the outputs begin: the notes held so far come first
        closed = _ClosedLater()  # a FIFO's reader left: the tables still follow
        found = ([] if a["findings"] is None else a["findings"].to_dict()["findings"]) + (
            [] if implausible is None else [implausible])
        fd = None if fit_res is None else _fit_dict(
            fit_res, ds, {"findings": found},
            rounded=a["rounded"], file_units=a["file_units"],
            zero_prefix=a["zero_prefix"], misaligned=a["misaligned"], gates=True,
            entropy_alignment=a["entropy_alignment"], storage=a["storage"], file_scale=a["file_scale"])
        with closed, together():  # the JSON and the export replace earlier ones together
            _write_json(json_path, envelope(
                "compare", ds.describe(), params, compare=res.to_dict(),
                warnings=warnings, implausible_logprobs=implausible, fit=fd,
                forensics=None if a["findings"] is None else a["findings"].to_dict(),
                **({"unavailable": no_entr or no_law} if no_entr or no_law else {})), quiet)
            if export is not None:
                from entr_diag.atomic import when_written, write_with
                from entr_diag.compare import export_frame

                lf = export_frame(_with_file(ds), res, ds.unscored()).with_columns(
                    pl.col("seq_id").cast(ds.seq_id_dtype))
                meta = {**_output_mark("compare --export"),
                        **({UNAVAILABLE_MARK: no_entr} if no_entr else {})}
                write_with(export, lambda dest: lf.sink_parquet(
                    dest, compression="zstd", metadata=meta))
                if not quiet:
                    when_written(export, lambda: stderr.print(f"wrote {export}", markup=False))
        out = _tables(json_path, export)
        if no_entr:
            out.print(f"ENTR unavailable: {no_entr}", soft_wrap=True, markup=False)
        if no_law:
            out.print(f"No scaling law: {no_law}", soft_wrap=True, markup=False)
        render_compare(res, out)
        if fd is not None and fd["verdict"].get("caveat"):  # the law's data caveats, as fit
            out.print(fd["verdict"]["caveat"], soft_wrap=True, markup=False)
        closed.done()


# ----------------------------------------------------------------- report


@app.command(cls=_Command)
def report(
    ctx: typer.Context,
    paths: Paths = None,
    output: Annotated[Path, typer.Option("--output", "-o", parser=_output_path, metavar="FILE", help="HTML file to write.")] = Path("entr-diag-report.html"),
    tau: TauOpt = 4.0,
    eps: EpsOpt = 0.01,
    gate: Annotated[list[str] | None, typer.Option("--gate", "-g", metavar="SPEC", help=_GATE_HELP)] = None,
    bins: BinsOpt = DEFAULT_BINS,
    bin_edges: BinEdgesOpt = "quantile",
    n_boot: BootOpt = 1000,
    seed: SeedOpt = 0,
    column: ColumnOpt = None,
    framework: FrameworkOpt = None,
    layout: LayoutOpt = "auto",
    entropy: EntropyOpt = "auto",
    skip_unreadable: SkipUnreadableOpt = False,
    seq_id_per_file: SeqIdPerFileOpt = False,
    allow_misaligned: MisalignedOpt = False,
    json_path: JsonOpt = None,
    quiet: QuietOpt = False,
) -> None:
    """Write a self-contained HTML post-mortem of the run (plotly, no network needed).

    Example: entr-diag report logs.parquet -o run.html --json run.json
    """
    from entr_diag.report.html_report import build_report_html
    from entr_diag.report.json_report import envelope, sanitize

    with _errors(quiet):
        entr, panel = _gates(gate, tau, eps, quiet)
        _check_bin_edges(bin_edges)
        _check_output(output, "--output")
        _check_output(json_path, "--json")
        _refuse_overwriting_inputs(paths, {"--output": output, "--json": json_path},
                                   _defaulted(ctx, "output"))
        _check_fit_options(eps, tau, n_boot, bins)
        ds = _load(paths, column, framework, layout, entropy, quiet,
                   skip_unreadable=skip_unreadable, seq_id_per_file=seq_id_per_file)
        # without the law (or entropy) the gates are still compared: no law-scale / noise
        # categories, and without entropy no ENTR
        a = _fit(ds, bins, bin_edges, eps, tau, n_boot, seed, quiet,
                 allow_misaligned=allow_misaligned, forensics=True, profiles=True,
                 entropy_optional=True, law_optional=True,
                 gates=(lambda: _gate_plan(ds, entr, panel, {}))
                 if ds.has("entropy") or panel else None)
        fit_res, metrics, findings = a["fit"], a["metrics"], a["findings"]
        no_law = None
        # no entropy column, or too little data for the law: the rest of the post-mortem
        # still holds
        if a["unavailable"]:
            no_law = (f"{a['unavailable']} The scaling law is therefore unavailable (the "
                      "report holds the mismatch metrics, the gate comparison without the "
                      "law's token categories, forensics and profiles).")
        elif fit_res is None:
            no_law = _no_column(ds, "entropy", _NO_ENTROPY + " (the report holds the mismatch "
                                "metrics, the gates that need no entropy, forensics and "
                                "profiles)", _map_entropy(ds))
        cmp_res = (_compare(ds, fit_res, a["gates"], quiet, with_plans=[a["profiles"]],
                            no_fit=a["no_fit"])
                   if a["gates"] is not None else None)
        prof = a["profiles"].finish().to_dict()
        params = {"tau": tau, "eps": eps, "gates": gate or "default panel", "bins": bins,
                  "bin_edges": bin_edges, "n_boot": n_boot, "seed": seed, "layout": layout,
                  "entropy": entropy, "framework": framework,
                  "skip_unreadable": skip_unreadable,
                  "seq_id_per_file": seq_id_per_file}
        desc = ds.describe()
        summary = {
            "tool_version": __version__,
            "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "inputs": {
                "files": [f["path"] for f in desc["files"]],
                "layout": desc["layout"],
                "tokens_total": desc["accounting"]["tokens_total"],
                "tokens_valid": desc["accounting"]["tokens_valid"],
                "sequences": desc["accounting"]["sequences_valid"],
                "bundled_sample": desc["bundled_sample"],
            },
            "mapping": desc["mapping"],
            "exclusions": desc["accounting"]["exclusions"],
            "accounting": desc["accounting"],
            "entropy_source": desc["entropy_source"],
            "parameters": params,
            "unavailable": no_law,
            "warnings": _notes.warnings(),
        }
        doc = envelope("report", desc, params,
                       fit=None if fit_res is None else _fit_dict(
                           fit_res, ds, findings, a["rounded"], a["file_units"],
                           a["zero_prefix"], a["misaligned"],
                           entropy_alignment=a["entropy_alignment"], storage=a["storage"], file_scale=a["file_scale"]),
                       metrics=metrics.to_dict(),
                       compare=None if cmp_res is None else cmp_res.to_dict(), profiles=prof,
                       forensics=findings.to_dict(), warnings=summary["warnings"],
                       **({"unavailable": no_law} if no_law else {}))
        html = build_report_html(summary=sanitize(summary), fit=doc["fit"], metrics=doc["metrics"],
                                 compare=doc["compare"], profiles=doc["profiles"],
                                 findings=doc["forensics"])
        from entr_diag.atomic import together, when_written, write_text

        _notes.flush()  # the outputs begin: the notes held so far come first
        out = _tables(json_path, output)
        closed = _ClosedLater()  # a FIFO's reader left: the verdict still follows
        with closed, together():  # the report and its JSON replace earlier ones together
            write_text(output, html)
            when_written(output, lambda: out.print(
                f"wrote {output} ({len(html.encode()) / 1e6:.1f} MB)", markup=False))
            _write_json(json_path, doc, quiet)
        if no_law:
            out.print(f"No scaling law: {no_law}", soft_wrap=True, markup=False)
        verdict = (doc["fit"] or {}).get("verdict") or {}
        if verdict.get("text"):
            out.print(verdict["text"], soft_wrap=True, markup=False)
        if verdict.get("caveat"):
            out.print(verdict["caveat"], style="yellow", soft_wrap=True, markup=False)
        closed.done()


# ----------------------------------------------------------------- synth


#: bytes per token of a synthetic run as ``synth`` writes it (zstd Parquet; 28.6 measured
#: for the long layout at 5M to 50M tokens, less for the nested one): a lower bound, so
#: that :func:`_check_synth_space` refuses only a run that cannot fit
_SYNTH_MIN_BYTES_PER_TOKEN: int = 20


def _check_synth_space(target: Path, tokens: int) -> None:
    """Refuse (:class:`ParameterError`, exit 2), before writing, a ``--tokens`` whose file
    could not fit in the free space of the output's file system: at least
    :data:`_SYNTH_MIN_BYTES_PER_TOKEN` bytes per token (``--tokens 1000000000000000`` would
    otherwise write for days before the disk fills)."""
    import shutil

    try:
        free = shutil.disk_usage(target.parent).free
    except OSError:  # (the write itself reports what is wrong)
        return
    need = tokens * _SYNTH_MIN_BYTES_PER_TOKEN
    if need > free:
        raise ParameterError(
            f"--tokens {tokens:,} needs at least {_size(need)} of disk, and {target.parent} "
            f"has {_size(free)} free; ask for fewer tokens (about "
            f"{free // _SYNTH_MIN_BYTES_PER_TOKEN:,} at most).")


def _size(n: int) -> str:
    """``n`` bytes as a short decimal size (``"28 GB"``)."""
    for unit in ("B", "kB", "MB", "GB", "TB", "PB"):
        if n < 1000 or unit == "PB":
            return f"{n:,.0f} {unit}" if n >= 100 else f"{n:.3g} {unit}"
        n /= 1000
    return ""  # pragma: no cover


@app.command(cls=_Command)
def synth(
    output: Annotated[Path, typer.Option("--output", "-o", parser=_output_path, metavar="FILE", help="Parquet file to write.")],
    tokens: Annotated[int, typer.Option(help="Number of tokens (>= 1).")] = 200_000,
    seed: Annotated[int, typer.Option(help="Random seed (>= 0).")] = 0,
    k: Annotated[float, typer.Option(help="Planted law scale: E\\[delta^2|H] = k H^alpha (> 0).")] = 0.02,
    alpha: Annotated[float, typer.Option(help="Planted law exponent, in (0, 4].")] = 1.0,
    h_star: Annotated[float | None, typer.Option(help="Planted breakpoint H* in nats, below 4 (0 = no noise regime).")] = 0.03,
    noise_share: Annotated[float, typer.Option(help="Share of tokens below H* that are noise, in [0, 1].")] = 0.3,
    layout: Annotated[str, typer.Option(help="long or nested.")] = "long",
    dirty: Annotated[bool, typer.Option(help="Add realistic invalid rows (NaN, sentinels, ...).")] = False,
    quiet: QuietOpt = False,
) -> None:
    """Write a seeded synthetic run with a planted scaling law and noise regime.

    Example: entr-diag synth -o synth.parquet --tokens 5000000 --seed 1
    """
    import json

    from entr_diag.synth import SynthSpec, write_synth

    with _errors(quiet):
        if tokens <= 0:
            raise ParameterError(f"--tokens must be positive (got {tokens}).")
        if layout not in ("long", "nested"):
            raise ParameterError(f"--layout must be long or nested (got {layout}).")
        _check_output(output, "--output")  # (a foreign file: its own check, below)
        from entr_diag.atomic import output_target

        target, atomic = output_target(output)
        if not atomic:  # write_synth renames a finished file into place
            raise ParameterError(f"--output {output}: synth writes a regular file, not a "
                                 "device, FIFO or socket; give a file name.")
        from entr_diag.synth import is_synth_output

        if target.exists() and not is_synth_output(target):  # (a real dump, by a typo)
            raise ParameterError(f"--output {output} exists and is no run written by entr-diag "
                                 "synth: not overwritten; remove it first or give another "
                                 "name.")
        _check_synth_space(target, tokens)
        if h_star is not None and not (h_star >= 0 and math.isfinite(h_star)):
            raise ParameterError(f"--h-star must be a finite number of nats >= 0 (0: no noise "
                                 f"regime), got {h_star!r}.")
        try:
            spec = SynthSpec(n_tokens=tokens, seed=seed, k=k, alpha=alpha,
                             h_star=None if not h_star else h_star, noise_share=noise_share,
                             dirty=dirty)
        except ParameterError as e:  # the spec's field names, said as the options
            import re

            msg = str(e).removeprefix("SynthSpec: ")
            for field, opt in (("n_tokens", "tokens"), ("h_star", "h-star"),
                               ("noise_share", "noise-share"), ("seed", "seed"),
                               ("alpha", "alpha"), ("k", "k")):
                msg = re.sub(rf"\b{field}\b(?! = )", f"--{opt}", msg, count=1)
            raise ParameterError(msg) from None
        with _status(f"writing {tokens:,} tokens...", quiet):
            try:
                summary = write_synth(target, spec, layout=layout)  # a symlink stays
            except OSError as e:  # a full disk, a quota...: name the file
                from entr_diag.errors import InputError

                raise InputError(f"cannot write {output}: {e.strerror or e}.") from None
        from entr_diag.report.json_report import sanitize

        if not quiet:  # stdout holds the ground-truth JSON only (pipe it to jq)
            stderr.print(f"wrote {output}", markup=False)
        stdout.print(json.dumps(sanitize(summary), indent=2), markup=False)


class _Terminated(BaseException):
    """Raised by the SIGTERM handler: unwinds like Ctrl-C (temporary output files are
    removed on the way out), then :func:`main` exits with 143 (128 + SIGTERM), quietly."""


def _on_sigterm(signum, frame) -> None:
    import signal

    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut the cleanup
    raise _Terminated


#: glibc's ``M_TOP_PAD`` parameter of ``mallopt`` (malloc.h)
_M_TOP_PAD: int = -2
#: bytes of free memory glibc keeps at the top of the heap when it grows or trims it
#: (:func:`_tune_malloc`)
MALLOC_TOP_PAD: int = 256 << 20


def _tune_malloc() -> bool:
    """On glibc, ``mallopt(M_TOP_PAD, MALLOC_TOP_PAD)``: the heap keeps 256 MB of padding
    when it grows or shrinks. A pass allocates numpy temporaries of a few MB per batch of
    500k tokens and frees them; with glibc's default padding (128 kB) each batch grows the
    heap, faults its pages in and trims them again: 2.5 to 3.8 CPU s of system time at 50M
    tokens (``compare``), of which this saves about half, without raising the peak RSS
    (``benchmarks/bench.py``). Not done when the user set ``MALLOC_TOP_PAD_`` or off glibc;
    returns whether it was done. Only the command-line entry point calls it (importing the
    package changes nothing in the importing process)."""
    import os
    import platform

    if "MALLOC_TOP_PAD_" in os.environ or platform.libc_ver()[0] != "glibc":
        return False
    import ctypes

    try:
        return bool(ctypes.CDLL(None).mallopt(_M_TOP_PAD, MALLOC_TOP_PAD))
    except (OSError, AttributeError):  # pragma: no cover - a libc without mallopt
        return False


def main() -> None:
    """Console-script entry point."""
    import signal

    _tune_malloc()
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        app()
    except KeyboardInterrupt:  # pragma: no cover
        sys.exit(130)
    except _Terminated:
        sys.exit(143)
