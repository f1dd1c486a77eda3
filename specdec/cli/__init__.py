"""`specdec` command line (typer): one small module per command group."""

from specdec.cli.app import main

__all__ = ["main"]
