"""`suffix:corpus=...`: a read-only index over the target's own answers drafts what followed in them, keeps the
output lossless, is bounded by `corpus_tokens`, and refuses a corpus that is missing, empty or written for
another tokenizer."""

from __future__ import annotations

from pathlib import Path

import pytest

from specdec.config import SamplingParams
from specdec.drafters.none import NoDrafter
from specdec.drafters.suffix import SuffixDrafter
from specdec.drafters.suffix_corpus import load_corpus_index
from specdec.drafters.suffix_index import SuffixTrie
from specdec.errors import ConfigError
from specdec.models.loader import LoadedModel
from specdec.training.corpus_store import Manifest, open_store, tokenizer_fingerprint
from specdec.tree.spec import chain
from tests.helpers import NoTokenizer, run_all, tiny_engine, tiny_model

VOCAB = 24
PROMPT = [3, 1, 4, 1, 5]


class VocabTokenizer(NoTokenizer):
    """Enough of a tokenizer for the corpus fingerprint: a token -> id table."""

    def get_vocab(self) -> dict[str, int]:
        return {f"<{i}>": i for i in range(VOCAB)}


@pytest.fixture(scope="module")
def target() -> LoadedModel:
    return LoadedModel(tiny_model(seed=21, vocab=VOCAB, sharpness=2.0), VocabTokenizer(), "tiny")


def write_corpus(folder: Path, target: LoadedModel, answers: list[list[int]], vocab: int = VOCAB) -> Path:
    """A corpus written the way `specdec data build` writes one (its own store)."""
    fingerprint = tokenizer_fingerprint(target.tokenizer, vocab)
    manifest = Manifest(target="tiny", vocab_size=vocab, tokenizer_sha256=fingerprint, new_tokens=64, temperature=0.0,
                        seed=0, max_prompt_tokens=64)
    with open_store(folder, manifest) as store:
        for i, ids in enumerate(answers):
            store.append(f"r{i}", [1], ids, "length")
    return folder


def generate(target: LoadedModel, drafter, tree, new_tokens: int = 40):
    engine = tiny_engine(target.model, drafter, tree, adaptive_speculation=False)
    seq = engine.add_request(PROMPT, SamplingParams(max_new_tokens=new_tokens, ignore_eos=True))
    run_all(engine)
    assert engine.runner.cache.num_free_blocks == engine.runner.cache.pool.num_blocks
    return seq


def test_the_corpus_drafts_the_targets_own_answer_and_output_stays_plain(target, tmp_path):
    plain = generate(target, NoDrafter(), chain(0)).output_ids
    folder = write_corpus(tmp_path / "corpus", target, [[7, 7, 2], list(plain), [9, 8, 7, 6]])
    corpus = load_corpus_index(folder, target, match_depth=12, max_tokens=10_000)
    without = generate(target, SuffixDrafter(depth=12, use_global=False), chain(6))
    with_corpus = generate(target, SuffixDrafter(depth=12, use_global=False, corpus=corpus), chain(6))
    assert with_corpus.output_ids == without.output_ids == plain
    # the request's own trie only knows the prompt and what it has written so far; the corpus knows the answer
    # from its first token on, so drafts are accepted from the first verify step, and fewer steps are needed
    first, alone = with_corpus.metrics.step_accepts, without.metrics.step_accepts
    assert first[0] > alone[0] == 1 and len(first) < len(alone), (first, alone)


def test_the_corpus_counts_equal_indexing_each_answer_as_a_sequence(target, tmp_path):
    answers = [[1, 2, 3, 1, 2], [2, 3, 1], [5, 5, 5, 5]]
    corpus = load_corpus_index(write_corpus(tmp_path / "c", target, answers), target, match_depth=4, max_tokens=100)
    reference = SuffixTrie(4)
    for i, ids in enumerate(answers):
        reference.extend(i, ids)
        reference.close(i)
    for pattern in ([1], [2, 3], [1, 2], [2, 3, 1], [5, 5, 5], [3, 1, 2], [4]):
        assert corpus.count(pattern) == reference.count(pattern), pattern
    assert corpus.num_tokens == sum(map(len, answers))


def test_corpus_tokens_bounds_what_is_read(target, tmp_path):
    folder = write_corpus(tmp_path / "c", target, [[1, 2, 3, 4]] * 5)
    assert load_corpus_index(folder, target, match_depth=4, max_tokens=9).count([1]) == 2  # two whole answers fit
    assert load_corpus_index(folder, target, match_depth=4, max_tokens=20).count([1]) == 5


def test_a_missing_empty_or_foreign_corpus_is_refused(target, tmp_path):
    with pytest.raises(ConfigError, match="specdec data build"):
        load_corpus_index(tmp_path / "nowhere", target, match_depth=4, max_tokens=100)
    with pytest.raises(ConfigError, match="holds no answers"):
        load_corpus_index(write_corpus(tmp_path / "empty", target, []), target, match_depth=4, max_tokens=100)
    foreign = write_corpus(tmp_path / "foreign", target, [[1, 2, 3]], vocab=VOCAB + 8)
    with pytest.raises(ConfigError, match="another tokenizer"):
        load_corpus_index(foreign, target, match_depth=4, max_tokens=100)
