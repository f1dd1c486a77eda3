"""A read-only suffix index over a corpus of the target's own answers, for `suffix:corpus=...`.

Suffix decoding drafts from text seen before: the request's own prompt and output, and earlier requests'
outputs. A corpus built by `specdec data build` (the target's greedy answers to thousands of prompts) is text
this very model wrote, so its continuations are what the model tends to say next, in any request. Indexed
once when the drafter is built and never evicted, it is a third source beside the per-request and global tries.

It is a suffix array (`suffix_array.py`), not a trie: 8 bytes a token (9 MB for the 1.1M-token default corpus)
where a Python trie 12 deep took 1.5 GB. `max_tokens` bounds what is read.
"""

from __future__ import annotations

from pathlib import Path

from specdec.drafters.suffix_array import CorpusSuffixArray
from specdec.errors import ConfigError
from specdec.models.loader import LoadedModel
from specdec.training.corpus_store import (RECORDS, check_matches, default_corpus_dir, iter_records, read_manifest,
                                           tokenizer_fingerprint)


def corpus_folder(spec: str, target: LoadedModel) -> Path:
    """`default` is where `specdec data build` writes for this target; anything else is a folder path."""
    if spec == "default":
        return default_corpus_dir(Path(target.source).name)
    return Path(spec).expanduser()


def load_corpus_index(folder: Path, target: LoadedModel, match_depth: int, max_tokens: int) -> CorpusSuffixArray:
    """Index the answers (`token_ids`) of a corpus folder, in file order, up to `max_tokens` tokens, for matches
    of up to `match_depth` tokens.

    The corpus must have been written for this target's tokenizer (its ids would be noise otherwise); a
    missing or empty corpus is an error naming the command that builds one, so that a typo is not silently
    a plain suffix drafter.
    """
    build = f"build one with `specdec data build --out {folder}`"
    if not (folder / RECORDS).is_file():
        raise ConfigError(f"suffix corpus {folder} has no {RECORDS}; {build}")
    manifest = read_manifest(folder)
    vocab = target.model.config.vocab_size
    check_matches(manifest, vocab, tokenizer_fingerprint(target.tokenizer, vocab), folder)
    answers: list[list[int]] = []
    tokens = 0
    for record in iter_records(folder):
        ids = record.get("token_ids") or []
        if tokens + len(ids) > max_tokens:
            break
        answers.append(ids)
        tokens += len(ids)
    if not tokens:
        raise ConfigError(f"suffix corpus {folder} holds no answers yet; {build}")
    return CorpusSuffixArray.build(answers, match_depth)
