"""Prompt sets: the bench prompts in `specdec/data/prompts/` and the draft-head training corpus.

Prompt files are JSON Lines (UTF-8, one JSON object per line). Every object needs a non-empty string
`"prompt"`; the bench files also carry `"id"`, `"category"`, `"split"` (`"dev"` or `"test"`) and, for
multi-turn conversations, `"turns"` (a list of user messages whose first element is the prompt).

    load_prompts(path)                         # any JSONL prompt file, validated
    bench_prompts(["math", "code"], "dev")     # the repo's bench prompts, filtered
    train_prompts()                            # specdec/data/train_prompts.jsonl (self-distillation)
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from specdec.errors import ConfigError, SpecdecError

BENCH_DIR = Path(__file__).resolve().parent / "prompts"
TRAIN_PROMPTS_PATH = Path(__file__).resolve().parent / "train_prompts.jsonl"
CATEGORIES = ("conversation", "translation", "summarization", "qa", "math", "rag", "code")
SPLITS = ("dev", "test")

__all__ = [
    "BENCH_DIR", "CATEGORIES", "SPLITS", "TRAIN_PROMPTS_PATH", "PromptFileError", "PromptFileNotFoundError",
    "bench_prompts", "heldout_prompts", "load_prompts", "scan_prompts", "train_prompts",
]


class PromptFileNotFoundError(SpecdecError, FileNotFoundError):
    """A prompt file does not exist."""


class PromptFileError(ConfigError):
    """A prompt file exists but its content is not valid (a `ValueError`)."""


def load_prompts(path: str | Path) -> list[dict]:
    """Read a JSONL prompt file and return its records in file order.

    Blank lines are skipped. Raises `PromptFileNotFoundError` (naming the path) when the file is missing, and
    `PromptFileError` naming the file and line number when a line is not UTF-8, not a JSON object, lacks a
    non-empty string `"prompt"`, has a malformed `"turns"`, or repeats an earlier `"id"`.
    """
    records = []
    for _, record, error in scan_prompts(path):
        if error is not None:
            raise error
        records.append(record)
    return records


def scan_prompts(path: str | Path) -> Iterator[tuple[int, dict | None, PromptFileError | None]]:
    """`(line number, record, None)` for each good line and `(line number, None, error)` for each bad one.

    What batch generation reads: a malformed line becomes an error of its own while every other line runs.
    The file itself must exist and be a file (checked before the first line is yielded).
    """
    p = Path(path)
    if not p.exists():
        raise PromptFileNotFoundError(f"prompt file not found: {p}")
    if not p.is_file():
        raise PromptFileError(f"{p} is not a file; expected a JSONL prompt file (one JSON object per line)")
    try:
        handle = p.open("rb")
    except OSError as e:
        raise PromptFileError(f"cannot read prompt file {p}: {e.strerror or e}") from None
    return _scan(p, handle)


def _scan(p: Path, handle) -> Iterator[tuple[int, dict | None, PromptFileError | None]]:
    ids: dict[str, int] = {}
    with handle as f:
        for lineno, raw in enumerate(f, 1):
            try:
                record = _parse_line(raw, lineno, f"{p}, line {lineno}", ids)
            except PromptFileError as error:
                yield lineno, None, error
                continue
            if record is not None:
                yield lineno, record, None


def _parse_line(raw: bytes, lineno: int, where: str, ids: dict) -> dict | None:
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise PromptFileError(f"{where}: not valid UTF-8 ({e.reason})") from None
    if lineno == 1:
        line = line.removeprefix("\ufeff")
    if not line.strip():
        return None
    try:
        rec = json.loads(line)
    except (json.JSONDecodeError, RecursionError) as e:
        msg = f"{e.msg} at column {e.colno}" if isinstance(e, json.JSONDecodeError) else "nested too deeply"
        raise PromptFileError(f"{where}: malformed JSON ({msg})") from None
    if not isinstance(rec, dict):
        raise PromptFileError(f"{where}: expected a JSON object, got {type(rec).__name__}")
    if "prompt" not in rec:
        raise PromptFileError(f"{where}: missing required field \"prompt\"")
    if not isinstance(rec["prompt"], str) or not rec["prompt"].strip():
        raise PromptFileError(f"{where}: field \"prompt\" must be a non-empty string")
    turns = rec.get("turns")
    if turns is not None and (
        not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t.strip() for t in turns)
    ):
        raise PromptFileError(f"{where}: field \"turns\" must be a non-empty list of non-empty strings")
    if "id" in rec:
        if not isinstance(rec["id"], (str, int)) or isinstance(rec["id"], bool):
            raise PromptFileError(f"{where}: field \"id\" must be a string or an integer")
        if rec["id"] in ids:
            raise PromptFileError(f"{where}: duplicate id {rec['id']!r} (first used on line {ids[rec['id']]})")
        ids[rec["id"]] = lineno
    return rec


def bench_prompts(
    categories: list[str] | None = None, split: str | None = None, *, directory: str | Path | None = None
) -> list[dict]:
    """Load the bench prompts, category by category in the given order (default: all of `CATEGORIES`).

    `split` keeps only `"dev"` or only `"test"` prompts (default: both). `directory` points at another
    folder laid out like `specdec/data/prompts/` (one `<category>.jsonl` per category); it defaults to `BENCH_DIR`.
    """
    root = Path(directory) if directory is not None else BENCH_DIR
    if split is not None and split not in SPLITS:
        raise ConfigError(f"unknown split {split!r}; use one of {', '.join(SPLITS)} (or None for both)")
    if categories is None:
        categories = list(CATEGORIES)
    elif isinstance(categories, str):
        categories = [categories]
    unknown = [c for c in categories if not (root / f"{c}.jsonl").is_file()]
    if unknown:
        available = sorted(f.stem for f in root.glob("*.jsonl")) if root.is_dir() else []
        raise PromptFileNotFoundError(
            f"no prompt file for categor{'y' if len(unknown) == 1 else 'ies'} {', '.join(map(repr, unknown))} "
            f"in {root}; available: {', '.join(available) or 'none'}"
        )
    out: list[dict] = []
    for category in categories:
        for rec in load_prompts(root / f"{category}.jsonl"):
            if split is None or rec.get("split") == split:
                out.append(rec)
    return out


def train_prompts(categories: list[str] | None = None) -> list[dict]:
    """Load the self-distillation corpus `specdec/data/train_prompts.jsonl`, optionally by category."""
    records = load_prompts(TRAIN_PROMPTS_PATH)
    if categories is None:
        return records
    wanted = set(categories)
    return [r for r in records if r.get("category") in wanted]


def heldout_prompts(per_category: int) -> list[str]:
    """The first `per_category` test-split bench prompts of every category: what trainers measure held-out tau
    on (never trained on). Empty when this installation has no bench prompts."""
    try:
        records = bench_prompts(split="test")
    except SpecdecError:
        return []
    chosen: list[str] = []
    for category in CATEGORIES:
        chosen += [r["prompt"] for r in records if r.get("category") == category][:per_category]
    return chosen
