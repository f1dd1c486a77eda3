"""The command line that reruns a bench script with the arguments it ran with, for its results file.

Every committed result carries the command that produced it. Twelve scripts used to spell that command each
their own way, and some spellings did not rerun: a value with a space or a semicolon unquoted (`--methods
none;suffix` ends the command at the semicolon), one quoted with `'...'` broken by a quote inside it, and
`store_true` flags either written as `--flag True` (which argparse refuses) or left out by hand. Here the
parser itself says how each option is spelled, so the line parses back to the same arguments
(tests/benchmarks/test_command.py holds it to that).
"""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Iterable


def command_line(script: str, parser: argparse.ArgumentParser, args: argparse.Namespace,
                 skip: Iterable[str] = (), env: str = "") -> str:
    """`[env] python <script> --option value ...` for every option of `parser` in `args` (but `skip`'s
    destinations): values shell-quoted, flags written only where they differ from their default, repeatable
    options once per value, options left at None left out."""
    words = ([env] if env else []) + ["python", script]
    skipped = set(skip)
    # argparse has no public list of its actions; `_actions` has been the same since Python 3.2.
    for action in parser._actions:
        if (not action.option_strings or action.dest in skipped or action.help == argparse.SUPPRESS
                or action.dest not in vars(args)):
            continue
        value = getattr(args, action.dest)
        option = next((o for o in action.option_strings if o.startswith("--")), action.option_strings[0])
        if isinstance(action, argparse.BooleanOptionalAction):
            if value is not None:
                words.append(option if value else "--no-" + option[2:])
        elif isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
            if value != action.default:
                words.append(option)
        elif isinstance(action, argparse._AppendAction):
            for item in value or ():
                words += [option, shlex.quote(str(item))]
        elif value is not None:
            words += [option, shlex.quote(str(value))]
    return " ".join(words)
