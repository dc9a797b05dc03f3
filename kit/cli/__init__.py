"""``zerokit`` (also ``python -m kit``): parse, call kit, print. No logic of its own.

Every subcommand takes ``--json`` and then prints exactly one JSON object on stdout. Exit 0 on
success, 2 on invalid input with one line on stderr naming the field and what is allowed. Each module
of this package registers one command group (``register(subparsers)``); they share ``kit.cli.args``.
Heavy dependencies are imported inside the command functions, so ``zerokit estimate`` and ``zerokit
plan`` never import torch or deepspeed (tests/test_layout.py checks).
"""

from __future__ import annotations

import argparse
import sys

from pydantic import ValidationError

from kit.cli import checkpoint, demo, estimate, launch, monitor, preflight, run, tune
from kit.cli import explain as explain_command
from kit.cli.args import UsageError
from kit.schema import one_line_error

#: the command groups, in the order ``zerokit --help`` lists them
GROUPS = (estimate, explain_command, run, tune, demo, launch, preflight, checkpoint, monitor)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="zerokit", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for group in GROUPS:
        group.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args) or 0
    except (UsageError, ValidationError, ValueError) as error:
        print(f"zerokit {args.command}: {one_line_error(error)}", file=sys.stderr)
        return 2
    except FileNotFoundError as error:
        print(f"zerokit {args.command}: {error.filename or error}: file not found", file=sys.stderr)
        return 2
