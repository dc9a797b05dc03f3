"""``zerokit`` (also ``python -m kit``): parse, call kit, print. No logic of its own.

Every subcommand takes ``--json`` and then prints exactly one JSON object on stdout. Exit 0 on
success, 2 on invalid input with one line on stderr naming the field and what is allowed. Each module
of this package registers one command group (``register(subparsers)``); they share ``kit.cli.args``.
Heavy dependencies are imported inside the command functions, so ``zerokit estimate`` and ``zerokit
plan`` never import torch or deepspeed (tests/test_layout.py checks).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from pydantic import ValidationError

from kit.cli.args import UsageError
from kit.schema import one_line_error

#: the command groups (modules of this package), in the order ``zerokit --help`` lists them
GROUPS = (
    "estimate", "plan", "explain", "run", "tune", "demo", "launch", "preflight", "calibrate", "checkpoint",
    "monitor", "published",
)  # fmt: skip
#: the group that registers each command, so that a command imports only its own group (``zerokit
#: estimate`` starts in a fraction of ``import torch``, tests/bench/bench_estimate.py)
COMMANDS = {
    "estimate": "estimate", "plan": "plan", "explain": "explain", "run": "run", "tune": "tune",
    "demo": "demo", "hostfile": "launch", "launch-cmd": "launch", "doctor": "preflight",
    "commtest": "preflight", "calibrate": "calibrate", "checkpoint": "checkpoint", "monitor": "monitor",
    "published": "published",
}  # fmt: skip


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """Every command's parser, or only the group of ``command`` (one of ``COMMANDS``)."""
    parser = argparse.ArgumentParser(prog="zerokit", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for group in (COMMANDS[command],) if command in COMMANDS else GROUPS:
        importlib.import_module(f"kit.cli.{group}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(argv[0] if argv else None).parse_args(argv)
    try:
        return args.func(args) or 0
    except (UsageError, ValidationError, ValueError) as error:
        print(f"zerokit {args.command}: {one_line_error(error)}", file=sys.stderr)
        return 2
    except FileNotFoundError as error:
        print(f"zerokit {args.command}: {error.filename or error}: file not found", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader went away (zerokit plan --json | head): stop quietly, as cat does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing left to flush at exit
        return 141  # 128 + SIGPIPE, what a shell reports for a tool the pipe's signal ended
