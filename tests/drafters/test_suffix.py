"""Suffix decoding through the engine: lossless greedy output, per-request tries that only follow committed
tokens, finished outputs in the global trie, nothing left on a sequence when it is released."""

from __future__ import annotations

import pytest

from specdec.config import SamplingParams
from specdec.drafters.suffix import SuffixDrafter
from specdec.drafters.none import NoDrafter
from specdec.tree.spec import TreeSpec, chain
from tests.helpers import run_all, tiny_engine, tiny_model

VOCAB = 24


@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=9, vocab=VOCAB, sharpness=2.0)


def outputs(model, drafter, tree, prompts, new_tokens=40):
    # Full trees every step: on a tiny model the planner may rightly find drafting not worth its time.
    engine = tiny_engine(model, drafter, tree, adaptive_speculation=False)
    seqs = [engine.add_request(p, SamplingParams(max_new_tokens=new_tokens, ignore_eos=True)) for p in prompts]
    run_all(engine)
    assert engine.runner.cache.num_free_blocks == engine.runner.cache.pool.num_blocks
    return seqs


PROMPTS = [[1, 2, 3, 4, 5, 1, 2, 3], [9, 8, 7, 9, 8], [4, 4, 4, 4], [1, 2, 3, 4, 5, 1, 2, 3]]


@pytest.mark.parametrize("tree", [chain(5), TreeSpec("dynamic", depth=5, topk=3, budget=8)])
def test_suffix_output_equals_plain_greedy(model, tree):
    plain = [s.output_ids for s in outputs(model, NoDrafter(), chain(0), PROMPTS)]
    drafter = SuffixDrafter(depth=12)
    seqs = outputs(model, drafter, tree, PROMPTS)
    assert [s.output_ids for s in seqs] == plain
    assert sum(s.metrics.accepted_drafts for s in seqs) > 0
    assert all(s.drafter_state.peek(drafter) is None for s in seqs), "a finished request kept its trie"
    assert drafter.index.num_requests == len(PROMPTS), "finished outputs were not handed to the global trie"


def test_the_request_trie_holds_exactly_the_committed_tokens(model):
    drafter = SuffixDrafter(depth=8, use_global=False)
    engine = tiny_engine(model, drafter, chain(4), adaptive_speculation=False)
    seq = engine.add_request([1, 2, 3, 1, 2], SamplingParams(max_new_tokens=30, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
        state = seq.drafter_state.peek(drafter)
        if state is not None and not seq.is_finished:
            trie = state.trie
            indexed = trie._seqs[0]
            assert indexed == seq.token_ids[: len(indexed)], "the trie indexed something that was not committed"
    assert drafter.index is None


def test_global_trie_feeds_later_requests():
    """A second request repeating an earlier output is drafted from the global trie alone."""
    model = tiny_model(seed=9, vocab=VOCAB, sharpness=2.0)
    drafter = SuffixDrafter(depth=12, factor=4.0)
    first = outputs(model, drafter, chain(6), [[5, 6, 7]], new_tokens=30)[0]
    again = outputs(model, drafter, chain(6), [[5, 6, 7]], new_tokens=30)[0]
    assert again.output_ids == first.output_ids
    assert again.metrics.accepted_drafts > first.metrics.accepted_drafts


def test_preempted_requests_drop_their_trie_and_do_not_enter_the_global_one(model):
    drafter = SuffixDrafter(depth=8)
    engine = tiny_engine(model, drafter, chain(4), adaptive_speculation=False)
    seq = engine.add_request([1, 2, 3, 1, 2], SamplingParams(max_new_tokens=30, ignore_eos=True))
    engine.step()
    engine.step()
    assert seq.drafter_state.peek(drafter) is not None
    drafter.release([seq])  # what the engine does on preemption: the sequence is not finished
    assert seq.drafter_state.peek(drafter) is None and drafter.index.num_requests == 0
    run_all(engine)  # rebuilt from the tokens when it runs again
    assert drafter.index.num_requests == 1
