"""Commit and rollback of tree verification must leave exactly the K/V a plain decode would have left."""

from __future__ import annotations

import random

import torch

from specdec.config import SamplingParams
from specdec.drafters.ngram import NgramDrafter
from specdec.engine.runner import Chunk, ModelRunner, Rows
from specdec.kvcache import BlockTable
from specdec.tree.spec import chain
from specdec.tree.token_tree import TokenTree
from tests.helpers import tiny_engine, tiny_model


def random_tree(rng: random.Random, root: int, vocab: int) -> TokenTree:
    n = rng.randint(1, 12)
    parents = [-1] + [rng.randrange(i) for i in range(1, n)]
    return TokenTree.from_parents([root] + [rng.randrange(vocab) for _ in range(n - 1)], parents)


def test_rollback_restores_plain_decode_kv():
    model = tiny_model(seed=3, vocab=64)
    rng = random.Random(0)
    runner = ModelRunner.create(model, num_blocks=64, block_size=4)
    table = BlockTable()
    tokens = [rng.randrange(64) for _ in range(9)]
    runner.run([Chunk(table, tokens[:-1], list(range(len(tokens) - 1)), None, Rows.NONE)])  # prefill but the root
    for _ in range(25):
        tree = random_tree(rng, tokens[-1], 64)
        prefix = table.length
        mask = None if tree.is_chain else tree.ancestor_mask
        runner.run([Chunk(table, tree.tokens.tolist(), tree.positions(prefix).tolist(), mask, Rows.ALL)])
        leaf = rng.randrange(len(tree))  # accept the path from the root to a random node
        path = [leaf]
        while tree.parent_list[path[-1]] >= 0:
            path.append(tree.parent_list[path[-1]])
        path.reverse()
        runner.commit_path(table, prefix, path)
        tokens += [int(tree.tokens[i]) for i in path[1:]] + [rng.randrange(64)]  # accepted drafts + a bonus
        assert table.length == len(tokens) - 1
    plain = ModelRunner.create(model, num_blocks=64, block_size=4)
    plain_table = BlockTable()
    plain.run([Chunk(plain_table, tokens[:-1], list(range(len(tokens) - 1)), None, Rows.NONE)])
    for layer in range(model.config.num_layers):
        for got, want in zip(runner.cache.gather(table, layer), plain.cache.gather(plain_table, layer)):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    runner.cache.free(table)
    assert runner.cache.num_free_blocks == runner.cache.pool.num_blocks


def test_rollback_without_compaction_would_be_caught():
    """The same check fails if the accepted path is not compacted (only truncated): the test has teeth."""
    model = tiny_model(seed=3, vocab=64)
    runner = ModelRunner.create(model, num_blocks=16, block_size=4)
    table = BlockTable()
    tokens = [5, 6, 7, 8]
    runner.run([Chunk(table, tokens[:-1], [0, 1, 2], None, Rows.NONE)])
    tree = TokenTree.from_parents([8, 10, 11, 12], [-1, 0, 0, 2])  # accept 0 -> 2 -> 3 (nodes 2, 3 move)
    prefix = table.length
    runner.run([Chunk(table, tree.tokens.tolist(), tree.positions(prefix).tolist(), tree.ancestor_mask, Rows.ALL)])
    runner.cache.truncate(table, prefix + 3)  # the bug: no compaction
    plain = ModelRunner.create(model, num_blocks=16, block_size=4)
    plain_table = BlockTable()
    committed = tokens + [11, 12]
    plain.run([Chunk(plain_table, committed, list(range(len(committed))), None, Rows.NONE)])
    got, want = runner.cache.gather(table, 0)[0], plain.cache.gather(plain_table, 0)[0]
    assert not torch.allclose(got, want, atol=1e-5)


def test_after_every_step_the_cache_holds_every_token_but_the_last():
    """The decoding invariant: a verify step commits the K/V of the root and of every accepted node, so the
    cache ends one token short of the sequence (the bonus token is the next root). An engine that committed
    less would still emit the right tokens, by prefilling the rest again next step, only slower; this is the
    test that notices."""
    model = tiny_model(seed=3, vocab=16, sharpness=1.0)
    engine = tiny_engine(model, NgramDrafter(n=2, k=4), chain(4), adaptive_speculation=False, block_size=4)
    prompt = [1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2]  # repeats, so the n-gram drafter is often right
    seqs = [engine.add_request(prompt[i:], SamplingParams(max_new_tokens=24, ignore_eos=True)) for i in range(4)]
    checked = 0
    while engine.has_unfinished():
        for seq in engine.step():
            if not seq.is_finished:
                assert seq.table.length == seq.num_tokens - 1, (
                    f"after a step the cache holds {seq.table.length} of {seq.num_tokens} tokens")
                checked += 1
    assert checked > 10 and sum(s.metrics.accepted_drafts for s in seqs) > 0
