"""The ``memwal`` command: SQL over a merged MemWAL table, inspect it, verify its layout.

Usage::

    memwal sql URI "SELECT category, count(*) FROM t GROUP BY category"
    memwal sql URI "SELECT * FROM t" --format arrow --output rows.arrows
    memwal inspect URI [--json]
    memwal verify URI [--json] [--keys]

The merged table is registered as ``t`` and under its folder name
(``/data/events`` -> ``events``). Every subcommand takes ``--storage-option
KEY=VALUE`` (repeatable; the keys pylance takes); ``sql`` and ``inspect`` take
``--consistency strong|eventual`` and ``--on-missing-generation recover|error|skip``
(see :func:`memwal_query.open_table`).

Exit codes: 0 success; 1 error (one line ``memwal: error: ...`` on stderr, never a
traceback; a wrong command line too); 2 ``verify`` found problems.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import stat
import sys
import threading
from collections.abc import Sequence
from typing import IO, TYPE_CHECKING, Any, NoReturn

from memwal_query.terminal_text import shown

if TYPE_CHECKING:
    import pyarrow as pa

    from memwal_query.table import Table

__all__ = ["ProgressBar", "main", "build_parser", "parse_storage_options"]

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_PROBLEMS = 2
EXIT_INTERRUPTED = 130
_PRETTY_MAX_ROWS = 1000


def parse_storage_options(items: Sequence[str] | None) -> dict[str, str]:
    """Turn repeated ``KEY=VALUE`` arguments into a dict.

    Raises:
        InvalidArgumentError: An item has no ``=`` or an empty key.

    Example:
        >>> parse_storage_options(["aws_region=eu-west-1", "allow_http=true"])
        {'aws_region': 'eu-west-1', 'allow_http': 'true'}
    """
    from memwal_query.errors import InvalidArgumentError

    out: dict[str, str] = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            msg = f"--storage-option needs KEY=VALUE, got {item!r}"
            raise InvalidArgumentError(msg)
        out[key.strip()] = value
    return out


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line error and exit code 1 (2 is ``verify``'s "problems found")."""

    def error(self, message: str) -> NoReturn:
        self.exit(1, f"memwal: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``memwal`` (subcommands ``sql``, ``inspect``, ``verify``)."""
    p = _Parser(
        prog="memwal",
        description="SQL over LSM-merged Lance MemWAL tables (DataFusion); inspect and verify them.",
    )
    p.add_argument("--version", action="version", version=f"memwal {_version()}")
    sub = p.add_subparsers(dest="command", required=True, metavar="{sql,inspect,verify}")

    def common(sp: argparse.ArgumentParser, consistency: bool) -> None:
        sp.add_argument("uri", help="table URI: a local path or s3://bucket/path")
        sp.add_argument(
            "--storage-option",
            "-s",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="object store option (repeatable), e.g. aws_region=eu-west-1",
        )
        if consistency:
            sp.add_argument(
                "--consistency",
                choices=("strong", "eventual"),
                default="strong",
                help="strong (default): also replay every region's WAL tail; eventual: flushed generations only",
            )
            sp.add_argument(
                "--on-missing-generation",
                choices=("recover", "error", "skip"),
                default="recover",
                help="an unmerged generation that cannot be read: recover (default) rebuilds it from the WAL or "
                "fails; error always fails; skip rebuilds it or leaves its rows out",
            )

    sql = sub.add_parser("sql", help="run SQL over the merged table (registered as t and as its folder name)")
    common(sql, True)
    sql.add_argument("query", help='SQL, e.g. "SELECT count(*) FROM t"')
    sql.add_argument(
        "--format",
        "-f",
        choices=("pretty", "csv", "json", "arrow"),
        default="pretty",
        help=(
            "pretty (default) text table; csv (nested values as JSON text, binary as base64); json (an array of "
            "objects; binary as base64, NaN and infinities as strings); arrow (Arrow IPC stream: every value exactly)"
        ),
    )
    sql.add_argument("--output", "-o", metavar="FILE", help="write the result to FILE instead of stdout")
    sql.add_argument(
        "--max-rows",
        type=int,
        default=_PRETTY_MAX_ROWS,
        metavar="N",
        help=f"pretty format: rows shown (default {_PRETTY_MAX_ROWS}); other formats write every row",
    )

    insp = sub.add_parser("inspect", help="regions, spec values, generations, WAL tail, index catch-up")
    common(insp, True)
    insp.add_argument("--json", action="store_true", help="machine-readable output")

    ver = sub.add_parser("verify", help="check the layout; exit code 2 when problems are found")
    common(ver, False)
    ver.add_argument("--json", action="store_true", help="machine-readable output")
    ver.add_argument(
        "--keys", action="store_true", help="also check that no primary key repeats in the base (reads every key)"
    )
    return p


def _version() -> str:
    from memwal_query import __version__

    return __version__


# --------------------------------------------------------------------------- #
# Progress (only on a terminal)
# --------------------------------------------------------------------------- #


class ProgressBar:
    """A one-line progress bar on stderr, drawn only when stderr is a terminal."""

    def __init__(self, label: str, stream: IO[str] | None = None) -> None:
        self._stream = stream if stream is not None else sys.stderr
        self._label = label
        self._on = bool(getattr(self._stream, "isatty", lambda: False)())
        self._drawn = False
        self._stopped = False
        self._lock = threading.Lock()
        if self._on:
            from memwal_query.cli_ticker import track

            track(self)  # wiped by stop_all() on Ctrl-C

    def __call__(self, done: int, total: int, what: str) -> None:
        if not self._on or total <= 1:
            return
        width = 30
        filled = int(width * done / total)
        bar = "#" * filled + "-" * (width - filled)
        with self._lock:
            if self._stopped:  # wiped (Ctrl-C): the command may still run on its thread
                return
            self._stream.write(f"\r{self._label} [{bar}] {done}/{total} {what[:8]}")
            self._stream.flush()
            self._drawn = True

    def stop(self) -> None:
        """Wipe the bar and draw no more (idempotent)."""
        with self._lock:
            self._stopped = True
            if self._drawn:
                self._stream.write("\r\x1b[K")
                self._stream.flush()
                self._drawn = False
        from memwal_query.cli_ticker import untrack

        untrack(self)


# --------------------------------------------------------------------------- #
# sql
# --------------------------------------------------------------------------- #


def _folder_name(uri: str) -> str:
    return uri.rstrip("/").rsplit("/", 1)[-1]


def _open(args: argparse.Namespace) -> Table:
    import memwal_query as mq

    try:
        return mq.open_table(
            args.uri,
            storage_options=parse_storage_options(args.storage_option),
            consistency=args.consistency,
            on_missing_generation=args.on_missing_generation,
        )
    except mq.TableNotFoundError as err:
        query = getattr(args, "query", None)
        if isinstance(query, str) and " " in args.uri and " " not in query:  # memwal sql "SELECT 1" data/t
            raise mq.TableNotFoundError(f"{err} (the table comes first: memwal sql TABLE QUERY)") from err
        raise


_NOT_A_QUERY = re.compile(r"(?:DDL|DML|Statement) not supported: (\w+)")


def _run_query(table: Table, query: str) -> pa.RecordBatchReader:
    import datafusion
    import pyarrow as pa

    from memwal_query.engine_errors import engine_error
    from memwal_query.errors import InvalidArgumentError, MemWalError
    from memwal_query.planner.predicates import sql_name

    ctx = datafusion.SessionContext()
    table.register(ctx, "t")
    name = _folder_name(table.uri)
    if name and name != "t":
        table.register(ctx, sql_name(name))  # also FROM <folder>, quoted where SQL needs it (events.lance)
    # Queries only: a CREATE TABLE, INSERT or SET ran and printed an empty table, and nothing
    # outlives the command.
    queries_only = datafusion.SQLOptions().with_allow_ddl(False).with_allow_dml(False).with_allow_statements(False)
    try:
        df = ctx.sql_with_options(query, queries_only)
        return pa.RecordBatchReader.from_stream(df)
    except MemWalError:
        raise
    except Exception as err:  # DataFusion raises plain exceptions for SQL errors
        refused = _NOT_A_QUERY.search(str(err))
        if refused:
            kind = refused.group(1)
            msg = f"memwal sql runs one query (SELECT, WITH, EXPLAIN ...), not {kind}: nothing outlives the command"
            raise InvalidArgumentError(msg) from err
        failed = engine_error(err)
        quoted = sql_name(name) if name else ""
        if quoted.startswith('"') and f"table 'datafusion.public.{name.lower()}' not found" in str(failed):
            failed = InvalidArgumentError(f"{failed} (the table is t, or {quoted} quoted)")
        raise failed from err


def _part_path(output: str) -> tuple[str, str]:
    """Where ``memwal sql -o output`` writes, and the file it renames that onto: beside a regular
    file (a link's target; or a new path); ``output`` itself for anything else (a device, a pipe)."""
    real = os.path.realpath(output)
    try:
        regular = stat.S_ISREG(os.stat(real).st_mode)
    except FileNotFoundError:
        regular = True
    except OSError:
        regular = False
    return (f"{real}.{os.getpid()}.part", real) if regular else (output, output)


def _cmd_sql(args: argparse.Namespace) -> int:
    from memwal_query.cli_output import write_arrow, write_csv, write_json, write_pretty
    from memwal_query.cli_ticker import Ticker, ticking
    from memwal_query.errors import InvalidArgumentError

    if args.max_rows < 0:
        raise InvalidArgumentError(f"--max-rows must be >= 0, got {args.max_rows}")
    if args.format == "arrow" and not args.output and sys.stdout.isatty():
        raise InvalidArgumentError("refusing to write an Arrow IPC stream to a terminal: use --output FILE or a pipe")
    table = _open(args)
    ticker = Ticker()  # elapsed time on a terminal until the first rows
    reader = ticking(_run_query(table, args.query), ticker)
    binary = args.format in ("arrow", "csv")
    # a file is written next to --output and renamed to it once every row is: a query failing
    # while it runs leaves an existing file as it was, and no file of headers alone (a device,
    # a pipe, /dev/stdout are written as they are: a rename would replace them)
    part, target = _part_path(args.output) if args.output else ("", "")
    if args.output:
        mode, encoding = ("wb", None) if binary else ("w", "utf-8")
        try:
            try:
                fh: Any = open(part, mode, encoding=encoding)  # noqa: SIM115
            except PermissionError:  # a file one may write in a folder one may not: written in place
                if part == target:
                    raise
                part = target
                fh = open(target, mode, encoding=encoding)  # noqa: SIM115
        except OSError as err:
            raise InvalidArgumentError(f"cannot write {args.output}: {err.strerror or err}") from err
    else:
        fh = sys.stdout.buffer if binary else sys.stdout
    written = False
    try:
        if args.format == "pretty":
            write_pretty(reader, fh, args.max_rows)
        elif args.format == "csv":
            write_csv(reader, fh)
        elif args.format == "json":
            write_json(reader, fh)
        else:
            write_arrow(reader, fh)
        fh.flush()
        written = True
    finally:
        ticker.stop()
        if args.output:
            with contextlib.nullcontext() if written else contextlib.suppress(OSError):
                fh.close()  # failing, it would hide what failed first
                if part != target and written:
                    os.replace(part, target)
                elif part != target:
                    os.remove(part)
    return EXIT_OK


# --------------------------------------------------------------------------- #
# inspect
# --------------------------------------------------------------------------- #


def _cmd_inspect(args: argparse.Namespace) -> int:
    from memwal_query.cli_inspect import inspect_text
    from memwal_query.display import describe_table, json_value

    d = describe_table(_open(args))
    if args.json:
        sys.stdout.write(json.dumps(d, indent=2, default=json_value) + "\n")
    else:
        sys.stdout.write(inspect_text(d) + "\n")
    return EXIT_OK


# --------------------------------------------------------------------------- #
# verify
# --------------------------------------------------------------------------- #


def _cmd_verify(args: argparse.Namespace) -> int:
    from memwal_query.verify import verify_table

    bar = ProgressBar("verifying")
    try:
        report = verify_table(
            args.uri, storage_options=parse_storage_options(args.storage_option), progress=bar, check_keys=args.keys
        )
    finally:
        bar.stop()
    if args.json:
        sys.stdout.write(report.to_json() + "\n")
    else:
        for p in report.problems:
            sys.stdout.write(f"problem: {shown(str(p), backslash=False)}\n")
        for w in report.warnings:
            sys.stdout.write(f"warning: {shown(str(w), backslash=False)}\n")
        sys.stdout.write(report.summary() + "\n")
    return EXIT_OK if report.ok else EXIT_PROBLEMS


# --------------------------------------------------------------------------- #
# main
# --------------------------------------------------------------------------- #


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``memwal`` console script.

    Args:
        argv: Arguments without the program name (default: ``sys.argv[1:]``).

    Returns:
        The exit code: 0 ok, 1 error, 2 problems found by ``verify``.
    """
    args = build_parser().parse_args(argv)
    from memwal_query.errors import InvalidArgumentError, MemWalError
    from memwal_query.interrupt import interruptibly

    commands = {"sql": _cmd_sql, "inspect": _cmd_inspect, "verify": _cmd_verify}
    try:
        if sys.stdout is None and not getattr(args, "output", None):  # started with `>&-`
            raise InvalidArgumentError(
                "standard output is closed: nowhere to write" + (" (--output FILE)" if args.command == "sql" else "")
            )
        # on a worker thread: a Ctrl-C is seen at once (the process then ends, see run())
        code = interruptibly(lambda: commands[args.command](args), wait=False)
        if sys.stdout is not None:
            sys.stdout.flush()  # a full disk fails here, not in the interpreter's own flush at exit
        return code
    except MemWalError as err:
        _say(f"error: {' '.join(str(err).split()) or type(err).__name__}")
        return EXIT_ERROR
    except BrokenPipeError:
        # The reader went away (`memwal sql ... | head`): not an error.
        _drop_stdout()
        return EXIT_OK
    except OSError as err:  # writing the results (the query's own failures are MemWalErrors)
        _say(f"error: cannot write the results: {err.strerror or err}")
        _drop_stdout()
        return EXIT_ERROR
    except KeyboardInterrupt:
        from memwal_query.cli_ticker import stop_all

        stop_all()  # the query may still be ending on its thread: wipe its ticker line first
        _say("interrupted")
        return EXIT_INTERRUPTED


def run() -> NoReturn:
    """The ``memwal`` console script: :func:`main`, then an exit that a Ctrl-C cannot turn into
    a traceback. Interrupted, the process ends at once (scans still running in DataFusion's
    threads are not waited for); otherwise a Ctrl-C while the exit waits for them ends it
    with 130 too."""
    code = main()
    if code == EXIT_INTERRUPTED:
        os._exit(code)
    signal.signal(signal.SIGINT, lambda *_: os._exit(EXIT_INTERRUPTED))
    sys.exit(code)


def _say(text: str) -> None:
    """One line on stderr (names and values in it escaped), if there is a stderr."""
    if sys.stderr is not None:
        sys.stderr.write(f"memwal: {shown(text, backslash=False)}\n")
        sys.stderr.flush()


def _drop_stdout() -> None:
    """Point stdout at the null device: what is left in its buffer goes nowhere at exit."""
    if sys.stdout is None:
        return
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


if __name__ == "__main__":
    run()
