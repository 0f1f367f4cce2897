"""The `dflash-serve` command: one entry point, one subcommand per job.

Each subcommand lives in its own module and registers itself through `register(subparsers)`;
this module only wires them together, so `dflash-serve --help` lists what is installed.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from dflash_ops import __version__
from dflash_ops.cli import unknown_options
from dflash_ops.errors import UserError

Handler = Callable[[argparse.Namespace], int]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dflash-serve",
        description=(
            "Serve Qwen3.8-Flash-Next with DFlash2 speculative decoding on vLLM 0.33.0: "
            "plan the block size, render the chart, run the sidecar, benchmark, and run "
            "the whole stack locally on CPU."
        ),
    )
    parser.add_argument("--version", action="version", version=f"dflash-serve {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for register in _subcommand_registrars():
        register(subparsers)
    return parser


def _subcommand_registrars() -> list[
    Callable[[argparse._SubParsersAction[argparse.ArgumentParser]], None]
]:
    # Imported lazily so `--help` and `--version` stay fast and a subcommand's heavy imports
    # (torch, vLLM) only happen when that subcommand runs.
    from dflash_ops.cli import bench, local, patches, plan, preflight, render, sidecar

    return [
        plan.register,
        render.register,
        sidecar.register,
        bench.register,
        local.register,
        patches.register,
        preflight.register,
    ]


def parse_words(parser: argparse.ArgumentParser, words: list[str]) -> argparse.Namespace:
    """The command line as the CLI reads it: an unknown option named by the (sub)command that
    was given it, then argparse (both exit 2 with a usage line on bad input)."""
    unknown = unknown_options.find(parser, words)
    if unknown is not None:
        reader, message = unknown
        reader.error(message)
    return parser.parse_args(words)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    words = sys.argv[1:] if argv is None else list(argv)
    args = parse_words(parser, words)
    handler: Handler | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 0
    try:
        return handler(args)
    except UserError as err:
        print(f"dflash-serve {args.command}: error: {err}", file=sys.stderr)
        return err.exit_status
    except KeyboardInterrupt:
        print(f"\ndflash-serve {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
