"""The on-disk training corpus: a folder with `manifest.json` (which target and tokenizer wrote it, and how)
and `records.jsonl` (one finished answer per line, appended and flushed as each request finishes).

    {"id": "sharegpt:QWJhYvA_0", "prompt_ids": [...], "token_ids": [...], "finish": "length"}

Why JSONL and not one `torch.save`: a build runs for hours and is interrupted; every finished answer must
survive, and a resumed build must neither redo nor repeat one. An interruption can leave at most one partial
last line, which `open_store` cuts off before appending. Token ids only mean something for one tokenizer,
so every reader checks the manifest's tokenizer fingerprint against the target first.
"""

from __future__ import annotations

import hashlib
import json
import weakref
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterator

from specdec.errors import ConfigError

MANIFEST = "manifest.json"
RECORDS = "records.jsonl"
FORMAT = 1
_PROBE = "The quick brown fox jumps over 13 lazy dogs.\n def f(x): return x**2  # café, 東京"


def is_held_out(index: int) -> bool:
    """Every 10th record (by position in the file) is held out of training and of the token ranking, for
    measurements that must not have seen it (coverage, held-out tau on the corpus's own prompts)."""
    return index % 10 == 0


def default_corpus_dir(target: str) -> Path:
    """Where `specdec data build` writes by default: outside any repository, in the user's cache."""
    from specdec.models.cache import cache_root

    name = Path(target).name if ("/" in target or target.endswith(".gguf")) else target
    return cache_root() / "corpora" / name


# Fingerprints by tokenizer object, then (vocab_size, the tokenizer's length): hashing a 49k-entry table takes
# ~150 ms, and `LLM.use` builds a Token Recycling drafter (which checks its warm matrix) at every switch. The
# length is in the key so that tokens added to a tokenizer after its first fingerprint give a new one.
_FINGERPRINTS: "weakref.WeakKeyDictionary[Any, dict[tuple[int, int], str]]" = weakref.WeakKeyDictionary()


def tokenizer_fingerprint(tokenizer: Any, vocab_size: int) -> str:
    """A hash of the token -> id table (or, for tokenizers without one, of a probe text's encoding) and the
    model's vocabulary size: two targets share it only when their token ids mean the same text."""
    try:
        known = _FINGERPRINTS.setdefault(tokenizer, {})
    except TypeError:  # not weakly referenceable: computed every time
        known = {}
    key = (vocab_size, len(tokenizer) if hasattr(tokenizer, "__len__") else -1)
    if key not in known:
        known[key] = _fingerprint(tokenizer, vocab_size)
    return known[key]


def _fingerprint(tokenizer: Any, vocab_size: int) -> str:
    digest = hashlib.sha256(f"vocab_size={vocab_size}\n".encode())
    get_vocab = getattr(tokenizer, "get_vocab", None)
    if callable(get_vocab):
        digest.update(json.dumps(sorted(get_vocab().items()), ensure_ascii=False).encode())
    else:
        digest.update(json.dumps(tokenizer.encode(_PROBE)).encode())
    return digest.hexdigest()


@dataclass(frozen=True)
class Manifest:
    """What decides a corpus's content; a resumed build must match it field for field."""

    target: str
    vocab_size: int
    tokenizer_sha256: str
    new_tokens: int
    temperature: float
    seed: int
    max_prompt_tokens: int
    format: int = FORMAT


def check_matches(manifest: Manifest, vocab_size: int, fingerprint: str, where: Path) -> None:
    """Refuse a corpus written for another vocabulary or tokenizer (its token ids would be noise)."""
    if manifest.vocab_size != vocab_size or manifest.tokenizer_sha256 != fingerprint:
        raise ConfigError(f"corpus {where} was written for another tokenizer ({manifest.target}, vocabulary "
                          f"{manifest.vocab_size}); this target's vocabulary is {vocab_size}"
                          + (" with different tokens" if manifest.vocab_size == vocab_size else "")
                          + ": build a corpus for this target with `specdec data build --out NEW_DIR`")


def read_manifest(folder: Path) -> Manifest:
    path = Path(folder) / MANIFEST
    if not path.is_file():
        raise ConfigError(f"{folder} is not a specdec corpus (no {MANIFEST}); build one with `specdec data build`")
    try:
        return Manifest(**json.loads(path.read_text()))
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None


def iter_records(folder: Path) -> Iterator[dict]:
    """The complete records of a corpus, in file order (a partial last line is skipped)."""
    path = Path(folder) / RECORDS
    if not path.is_file():
        return
    with path.open("rb") as f:
        for raw in f:
            if not raw.endswith(b"\n"):
                return  # cut off by an interruption; open_store trims it
            yield json.loads(raw)


class CorpusStore:
    """Appends finished records to `records.jsonl`, one flushed line each."""

    def __init__(self, folder: Path, manifest: Manifest, done: set[str], tokens: int) -> None:
        self.folder, self.manifest, self.done, self.tokens = Path(folder), manifest, done, tokens
        self._file = (self.folder / RECORDS).open("ab")

    def append(self, record_id: str, prompt_ids: list[int], token_ids: list[int], finish: str | None) -> None:
        if record_id in self.done:
            return
        line = json.dumps({"id": record_id, "prompt_ids": prompt_ids, "token_ids": token_ids, "finish": finish},
                          separators=(",", ":"))
        self._file.write(line.encode() + b"\n")
        self._file.flush()
        self.done.add(record_id)
        self.tokens += len(token_ids)

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> "CorpusStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_store(folder: Path, manifest: Manifest) -> CorpusStore:
    """A new corpus in `folder`, or the one already there when its manifest matches (resume)."""
    folder = Path(folder).expanduser()
    if (folder / MANIFEST).is_file():
        saved = read_manifest(folder)
        check_matches(saved, manifest.vocab_size, manifest.tokenizer_sha256, folder)
        if saved != manifest:
            changed = [f"{k}: {v!r} -> {asdict(manifest)[k]!r}" for k, v in asdict(saved).items()
                       if asdict(manifest)[k] != v]
            raise ConfigError(f"corpus {folder} was built with other settings ({', '.join(changed)}); resume "
                              "with the same settings or choose another --out")
    else:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / MANIFEST).write_text(json.dumps(asdict(manifest), indent=2) + "\n")
    _trim_partial_line(folder / RECORDS)
    done, tokens = set(), 0
    for record in iter_records(folder):
        done.add(record["id"])
        tokens += len(record["token_ids"])
    return CorpusStore(folder, manifest, done, tokens)


def _trim_partial_line(path: Path) -> None:
    """Cut a last line that an interruption left without its newline."""
    if not path.is_file() or path.stat().st_size == 0:
        return
    with path.open("rb+") as f:
        data = f.read()
        if data.endswith(b"\n"):
            return
        f.truncate(data.rfind(b"\n") + 1)


def load_records(folder: Path, vocab_size: int, fingerprint: str) -> list[dict]:
    """Every record of a corpus, after checking it was written for this tokenizer."""
    folder = Path(folder).expanduser()
    check_matches(read_manifest(folder), vocab_size, fingerprint, folder)
    return list(iter_records(folder))
