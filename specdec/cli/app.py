"""`specdec` command line: one typer app, one small module per command group.

    generate   specdec.cli.generate (single prompt; batch mode in specdec.cli.batch)
    models     specdec.cli.models
    bench      specdec.cli.bench
    data       specdec.cli.data (build: the training corpus)
    train      specdec.cli.train (draft; medusa and eagle in train_medusa / train_eagle)

A new command group is a module with its command function(s) and one registration line in `_register`.
User errors (`SpecdecError`) become one red line and exit code 2; only bugs show a traceback. Command modules
import torch and the engine inside their functions, so `--help`, `models` and early errors start fast.
"""

from __future__ import annotations

import os
import sys

import typer

from specdec.cli.common import fail
from specdec.errors import SpecdecError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  rich_markup_mode=None,  # plain help wraps spec lists instead of cutting them with "..."
                  help="specdec: speculative-decoding-first LLM generation.")


def _register() -> None:
    from specdec.cli import bench, data, generate, models, serve, train

    app.command()(generate.generate)
    app.command()(serve.serve)
    app.command()(models.models)
    app.command()(bench.bench)
    app.add_typer(data.data_app, name="data", help="Training corpora: the target's own answers to many prompts.")
    app.add_typer(train.train_app, name="train", help="Train drafters for a target (self-distillation).")


_register()


def main() -> None:
    """The `specdec` console script."""
    for stream in (sys.stdout, sys.stderr):  # never die on a character the terminal's encoding lacks
        try:
            stream.reconfigure(errors="backslashreplace")
        except (AttributeError, ValueError):
            pass
    try:
        app()
    except SpecdecError as exc:  # errors raised outside a command's own handler
        try:
            fail(str(exc))
        except typer.Exit as done:
            sys.exit(done.exit_code)
    except BrokenPipeError:  # `specdec generate ... | head`: the reader left; exit quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        sys.exit(1)


if __name__ == "__main__":
    main()
