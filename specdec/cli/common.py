"""What every command shares: the two consoles, and how a user error becomes one red line.

Data goes to stdout (generated text, JSON, JSONL records) and everything else (progress, stats, errors) to
stderr, so `specdec generate ... > out.jsonl` captures exactly the data.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import List, NoReturn, Optional

import typer
from rich.console import Console

console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False, soft_wrap=True)

# The library names its settings as fields (`max_num_seqs`); the CLI's errors name the flag a user types.
FLAG_FOR_FIELD = {
    "max_new_tokens": "--max-new-tokens", "top_p": "--top-p", "top_k": "--top-k", "max_num_seqs": "--max-concurrency",
    "max_tree_nodes": "--max-tree-nodes", "kv_cache_tokens": "--kv-cache-tokens",
    "kv_cache_dtype": "--kv-cache-dtype", "num_threads": "--threads",
    "prompts_per_category": "--prompts-per-category", "repetition_penalty": "--repetition-penalty",
    "frequency_penalty": "--frequency-penalty", "presence_penalty": "--presence-penalty", "min_p": "--min-p",
    "logit_bias": "--logit-bias", "stop_token_ids": "--stop-token-id", "min_new_tokens": "--min-new-tokens",
}  # fmt: skip
_FIELD = re.compile(r"\b(" + "|".join(FLAG_FOR_FIELD) + r")\b")

# The trainers' --corpus: repeat it to train on several corpora mixed (e.g. a `specdec data build` corpus and one
# built with `--only-grounded`).
CORPUS: Optional[List[Path]] = typer.Option(None, help="Reuse a corpus instead of generating one: a `specdec data "
                                                       "build` folder or an earlier run's corpus.pt; repeat it to "
                                                       "mix several.")


def corpus_setting(corpus: Optional[List[Path]]) -> str | list[str] | None:
    """--corpus as a trainer config holds it: None, one path, or a list of several."""
    paths = [str(path) for path in corpus or ()]
    return paths[0] if len(paths) == 1 else (paths or None)


EXIT_USAGE = 2  # a user error: bad input, a bad file, a model that cannot load
EXIT_PARTIAL = 1  # batch mode: some records failed (each has an error record)
EXIT_INTERRUPTED = 130  # Ctrl-C


def cli_message(message: str) -> str:
    """A library message with its field names replaced by the CLI's flags."""
    return _FIELD.sub(lambda m: FLAG_FOR_FIELD[m.group(1)], message)


def fail(message: str, code: int = EXIT_USAGE) -> NoReturn:
    from rich.text import Text

    err_console.print(Text("error: ", style="bold red") + Text(cli_message(str(message))))
    raise typer.Exit(code)


def note(message: str) -> None:
    err_console.print(message, style="dim", markup=False)
