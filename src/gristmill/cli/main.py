"""Entry point of the ``gristmill`` console command."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from gristmill.cli import profile

DEMO_FORMATS = ("auto", "memory", "tfrecord", "parquet", "array_record")
"""Where ``gristmill demo`` keeps its records (see ``cli/demo_files.py``)."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gristmill", description="Fast, deterministic, resumable data loading."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser(
        "demo", help="run a multi-stage pipeline on synthetic data, checkpoint and resume it"
    )
    demo.add_argument("--records", type=int, default=4096, help="synthetic records (4096)")
    demo.add_argument("--batch-size", type=int, default=64, help="batch size (64)")
    demo.add_argument("--threads", type=int, default=4, help="ReadOptions.num_threads (4)")
    demo.add_argument("--seed", type=int, default=2026, help="pipeline seed (2026)")
    demo.add_argument(
        "--format",
        choices=DEMO_FORMATS,
        default="auto",
        help="where the records live: auto (a TFRecord, Parquet or ArrayRecord file if that "
        "extra is installed, else memory), memory, tfrecord, parquet, array_record",
    )
    profile.add_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the command; returns the process exit code."""
    args = _parser().parse_args(argv)
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
    if args.command == "profile":
        return profile.run(args)
    return 2  # pragma: no cover - argparse rejects unknown commands


if __name__ == "__main__":
    sys.exit(main())
