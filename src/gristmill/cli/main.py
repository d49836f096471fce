"""Entry point of the ``gristmill`` console command.

Every error the command reports is one line on stderr, ``gristmill <command>: <message>``,
with exit status 2 for a usage error (an option's value) and 1 for a failure (an error
raised while the command runs); ``GRISTMILL_TRACEBACK=1`` shows a failure's traceback
instead.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from gristmill.cli import bench, profile_command
from gristmill.cli.common import DEMO_FORMATS, INSPECT_FORMATS, TRACEBACK_VARIABLE, describe

_EPILOG = (
    "Errors are one line on stderr (exit status 2: a usage error, 1: a failure). Set "
    f"{TRACEBACK_VARIABLE}=1 to see the traceback of a failure instead."
)


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line: ``gristmill demo: <message>``."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message}\n")


class _AtLeast(argparse.Action):
    """An int option with a lower bound (``minimum=``); a smaller value is a usage error."""

    def __init__(self, *args: Any, minimum: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.minimum = minimum

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        if values < self.minimum:
            parser.error(f"{option_string} must be at least {self.minimum}, got {values}")
        setattr(namespace, self.dest, values)


def _version() -> str:
    try:
        return importlib.metadata.version("gristmill")
    except importlib.metadata.PackageNotFoundError:  # a source tree that is not installed
        from gristmill import __version__

        return __version__


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="gristmill",
        description="Fast, deterministic, resumable data loading.",
        epilog=_EPILOG,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser(
        "demo",
        help="run a multi-stage pipeline on synthetic data, checkpoint and resume it",
        epilog=_EPILOG,
    )
    _add_count(demo, "--records", minimum=1, default=4096, help="synthetic records (4096)")
    _add_count(demo, "--batch-size", minimum=1, default=64, help="batch size (64)")
    _add_count(
        demo, "--threads", minimum=0, default=4, help="ReadOptions.num_threads (4; 0: inline)"
    )
    _add_count(demo, "--seed", minimum=0, default=2026, help="pipeline seed (2026)")
    demo.add_argument(
        "--format",
        choices=DEMO_FORMATS,
        default="auto",
        help="where the records live: auto (a TFRecord, Parquet or ArrayRecord file if that "
        "extra is installed, else memory), memory, tfrecord, parquet, array_record",
    )
    _add_inspect(commands)
    profile_command.add_parser(commands)
    bench.add_parser(commands)
    return parser


def _add_count(
    parser: argparse.ArgumentParser, option: str, *, minimum: int, default: int, help: str
) -> None:
    """An int option of at least ``minimum``."""
    parser.add_argument(
        option, type=int, action=_AtLeast, minimum=minimum, default=default, help=help
    )


def _add_inspect(commands: Any) -> None:
    inspect = commands.add_parser(
        "inspect",
        help="describe ArrayRecord, Parquet and TFRecord files: format, counts, sizes, "
        "schema and the first records",
        description="Describes each file: its format, record count and sizes, the schema "
        "(Parquet) or what the records are (tf.train.Example features, a pickle, a .npy "
        "array, bytes), and its first records. Every file is read whole, so damage anywhere "
        "is reported in one line with exit status 1: the file and the record's offset or "
        "index (TFRecord, ArrayRecord) or the row group and column (Parquet: every page "
        "decoded, its checksum verified where the writer wrote one).",
        epilog=_EPILOG,
    )
    inspect.add_argument(
        "paths",
        nargs="+",
        metavar="PATH",
        help="files or glob patterns (quoted, e.g. 'data/train-*'; expanded here, sorted; a "
        "pattern skips the .gmidx index files TFRecordDataSource writes)",
    )
    _add_count(inspect, "--records", minimum=0, default=3, help="records to show of each file (3)")
    inspect.add_argument(
        "--quick",
        action="store_true",
        help="read only the footer and the records shown, not the whole file: faster on a "
        "large file, but damage further on is not found (the output says so)",
    )
    inspect.add_argument(
        "--format",
        choices=INSPECT_FORMATS,
        default="auto",
        help="the files' format: auto (by the name: .tfrecord, .tfrecords, .parquet, "
        ".array_record, also sharded as NAME-00000-of-00008; else by the first bytes)",
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the command; returns the process exit code."""
    args = _parser().parse_args(argv)
    name = f"gristmill {args.command}"
    try:
        return _run(args)
    except BrokenPipeError:
        # Whoever read our output stopped (``| head``): nothing to report. Later writes (the
        # interpreter's flush at exit) go nowhere instead of failing again.
        with contextlib.suppress(OSError, ValueError):  # ValueError: stdout is not a file
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except (Exception, KeyboardInterrupt) as error:
        if os.environ.get(TRACEBACK_VARIABLE) == "1":
            raise
        text = "interrupted" if isinstance(error, KeyboardInterrupt) else describe(error)
        print(f"{name}: {text}", file=sys.stderr)
        return 130 if isinstance(error, KeyboardInterrupt) else 1


def _run(args: argparse.Namespace) -> int:
    if args.command == "demo":
        from gristmill.cli.demo import run_demo

        if args.records < 2 * args.batch_size:
            print(
                f"gristmill demo: --records must be at least 2 x --batch-size "
                f"({2 * args.batch_size}), got {args.records}",
                file=sys.stderr,
            )
            return 2
        ok = run_demo(
            records=args.records,
            batch_size=args.batch_size,
            threads=args.threads,
            seed=args.seed,
            file_format=args.format,
        )
        return 0 if ok else 1
    if args.command == "inspect":
        from gristmill.cli.inspect import run_inspect

        return run_inspect(
            args.paths, records=args.records, file_format=args.format, quick=args.quick
        )
    if args.command == "profile":
        return profile_command.run(args)
    if args.command == "bench":
        return bench.run(args.arguments)
    return 2  # pragma: no cover - argparse rejects unknown commands


if __name__ == "__main__":
    sys.exit(main())
