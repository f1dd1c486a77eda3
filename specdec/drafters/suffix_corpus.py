"""A read-only suffix trie over a corpus of the target's own answers, for `suffix:corpus=...`.

Suffix decoding drafts from text seen before: the request's own prompt and output, and earlier requests'
outputs. A corpus built by `specdec data build` (the target's greedy answers to thousands of prompts) is text
this very model wrote, so its continuations are what the model tends to say next, in any request. Indexed
once when the drafter is built and never evicted, it is a third trie beside the per-request and global ones.

Memory is the limit: a Python trie node costs about 250 bytes, and a corpus of N tokens indexed to depth d has
up to N * d nodes (467k tokens at depth 12: 3.0M nodes, 0.8 GB). `max_tokens` bounds what is read.
"""

from __future__ import annotations

from pathlib import Path

from specdec.drafters.suffix_index import SuffixTrie
from specdec.errors import ConfigError
from specdec.models.loader import LoadedModel
from specdec.training.corpus_store import (RECORDS, check_matches, default_corpus_dir, iter_records, read_manifest,
                                           tokenizer_fingerprint)


def corpus_folder(spec: str, target: LoadedModel) -> Path:
    """`default` is where `specdec data build` writes for this target; anything else is a folder path."""
    if spec == "default":
        return default_corpus_dir(Path(target.source).name)
    return Path(spec).expanduser()


def load_corpus_trie(folder: Path, target: LoadedModel, depth: int, max_tokens: int) -> SuffixTrie:
    """Index the answers (`token_ids`) of a corpus folder, in file order, up to `max_tokens` tokens.

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
    trie = SuffixTrie(depth)
    tokens = 0
    for record in iter_records(folder):
        ids = record.get("token_ids") or []
        if tokens + len(ids) > max_tokens:
            break
        trie.add_permanent(ids)
        tokens += len(ids)
    if not tokens:
        raise ConfigError(f"suffix corpus {folder} holds no answers yet; {build}")
    trie.freeze()
    return trie
