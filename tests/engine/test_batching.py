"""Continuous batching: a request's greedy output must not depend on what runs beside it, even when the KV
cache is so small that sequences are preempted and recomputed; and every block must come back."""

from __future__ import annotations

import random

import pytest

from specdec.config import SamplingParams
from specdec.drafters.draft_model import DraftModelDrafter
from specdec.drafters.hybrid import HybridDrafter
from specdec.drafters.ngram import NgramDrafter
from specdec.drafters.none import NoDrafter
from specdec.drafters.recycle import RecycleDrafter
from specdec.drafters.suffix import SuffixDrafter
from specdec.config import EngineConfig
from specdec.tree.spec import TreeSpec, chain
from tests.helpers import run_all, tiny_engine, tiny_model

VOCAB = 64


@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=11, vocab=VOCAB, sharpness=0.5)


def make_requests(n: int, seed: int) -> list[tuple[list[int], SamplingParams]]:
    """Random lengths and budgets; half the prompts start with one of three shared "system prompts", so the
    prefix cache both hits and gets evicted under the tight KV budget."""
    rng = random.Random(seed)
    systems = [[rng.randrange(8) for _ in range(rng.randint(5, 14))] for _ in range(3)]
    requests = []
    for _ in range(n):
        prompt = [rng.randrange(8) for _ in range(rng.randint(1, 30))]  # small alphabet: n-grams repeat
        if rng.random() < 0.5:
            prompt = rng.choice(systems) + prompt
        requests.append((prompt, SamplingParams(max_new_tokens=rng.randint(1, 24), ignore_eos=True)))
    return requests


def drafters(model):
    return {
        "none": (lambda: NoDrafter(), chain(0)),
        "ngram": (lambda: NgramDrafter(n=2, k=4), chain(4)),
        "ngram-tree": (lambda: NgramDrafter(n=2, k=3, branches=3), TreeSpec("dynamic", depth=3, topk=3, budget=8)),
        "draft": (lambda: DraftModelDrafter(model, EngineConfig(kv_cache_tokens=4096, block_size=4), k=3,
                                            num_layers=1), chain(3)),
        "recycle": (lambda: RecycleDrafter(VOCAB, k=4), TreeSpec("dynamic", depth=3, topk=3, budget=6)),
        "suffix": (lambda: SuffixDrafter(depth=8), TreeSpec("dynamic", depth=4, topk=3, budget=6)),
        "hybrid": (lambda: HybridDrafter([("suffix", SuffixDrafter(depth=8)), ("recycle", RecycleDrafter(VOCAB, k=4))]),
                   TreeSpec("dynamic", depth=4, topk=3, budget=6)),
    }


def alone(model, prompt, params) -> list[int]:
    engine = tiny_engine(model, NoDrafter(), chain(0), kv_cache_tokens=512, block_size=4)
    seq = engine.add_request(prompt, params)
    run_all(engine)
    return seq.output_ids


@pytest.fixture(scope="module")
def requests_and_expected(model):
    requests = make_requests(200, seed=5)
    return requests, [alone(model, p, s) for p, s in requests]


@pytest.mark.parametrize("name", ["none", "ngram", "ngram-tree", "draft", "recycle", "suffix", "hybrid"])
def test_outputs_under_preemption_equal_each_request_alone(model, requests_and_expected, name):
    requests, expected = requests_and_expected
    make_drafter, tree = drafters(model)[name]
    # 160 tokens of KV for 200 requests of up to 68 tokens each: preemption is certain. Adaptive speculation and
    # prefix caching are on (the defaults), so tree depths vary from step to step and blocks are shared.
    engine = tiny_engine(model, make_drafter(), tree, kv_cache_tokens=160, block_size=4, max_num_seqs=16,
                         max_num_batched_tokens=64, prefill_chunk=16, max_tree_nodes=16)
    seqs = [engine.add_request(p, s) for p, s in requests]
    run_all(engine)
    assert sum(s.metrics.preemptions for s in seqs) > 0, "the KV budget was meant to force preemption"
    assert sum(s.metrics.cached_prompt_tokens for s in seqs) > 0, "shared prompt starts were meant to hit the cache"
    if name != "none":
        assert sum(s.metrics.accepted_drafts for s in seqs) > 0, "nothing was ever accepted: speculation untested"
    for seq, want in zip(seqs, expected):
        assert seq.output_ids == want
        assert seq.finish_reason == "length"
        assert not seq.drafter_state, "a finished request kept drafter state"
    assert engine.runner.cache.num_free_blocks == engine.runner.cache.pool.num_blocks


def test_chunked_prefill_gives_the_same_logits_as_one_prefill(model):
    from specdec.kvcache import BlockTable
    from specdec.engine.runner import Chunk, ModelRunner, Rows
    import torch

    prompt = list(range(40))
    one = ModelRunner.create(model, 32, 4)
    whole = one.run([Chunk(BlockTable(), prompt, list(range(40)), None, Rows.ALL)])[0].logits
    chunked = ModelRunner.create(model, 32, 4)
    table, parts, start = BlockTable(), [], 0
    for n in (7, 1, 16, 16):
        parts.append(chunked.run([Chunk(table, prompt[start:start + n], list(range(start, start + n)), None,
                                        "all")])[0].logits)
        start += n
    torch.testing.assert_close(torch.cat(parts), whole, atol=1e-5, rtol=1e-5)


def test_seeded_sampling_is_reproducible_whatever_runs_beside_it(model):
    params = SamplingParams(max_new_tokens=12, temperature=1.0, seed=1234, ignore_eos=True)
    prompt = [1, 2, 3, 4]
    engine = tiny_engine(model, NgramDrafter(n=2, k=3), chain(3), kv_cache_tokens=2048, block_size=4)
    seq = engine.add_request(prompt, params)
    run_all(engine)
    crowd = tiny_engine(model, NgramDrafter(n=2, k=3), chain(3), kv_cache_tokens=2048, block_size=4)
    others = [crowd.add_request([5, 6, 7, i % 8], SamplingParams(max_new_tokens=9, temperature=0.9, seed=i))
              for i in range(10)]
    twin = crowd.add_request(prompt, params)
    run_all(crowd)
    assert twin.output_ids == seq.output_ids
    assert len({tuple(o.output_ids) for o in others}) > 1


def test_abort_frees_blocks_at_once(model):
    engine = tiny_engine(model, NoDrafter(), chain(0), kv_cache_tokens=256, block_size=4)
    seq = engine.add_request(list(range(20)), SamplingParams(max_new_tokens=50, ignore_eos=True))
    engine.step()
    engine.step()
    assert engine.runner.cache.num_free_blocks < engine.runner.cache.pool.num_blocks
    engine.abort(seq.seq_id)
    assert seq.finish_reason == "abort"
    assert engine.runner.cache.num_free_blocks == engine.runner.cache.pool.num_blocks
    assert not engine.has_unfinished()


def test_stop_string_ends_the_request_and_frees_blocks(model):
    engine = tiny_engine(model, NoDrafter(), chain(0), kv_cache_tokens=256, block_size=4)
    free_run = engine.add_request([1, 2, 3], SamplingParams(max_new_tokens=10, ignore_eos=True))
    run_all(engine)
    stop = " ".join(map(str, free_run.output_ids[3:5]))  # NoTokenizer renders ids joined by spaces
    seq = engine.add_request([1, 2, 3], SamplingParams(max_new_tokens=10, ignore_eos=True, stop=(stop,)))
    run_all(engine)
    assert seq.finish_reason == "stop"
    assert len(seq.output_ids) < 10
    assert stop not in engine.output_text(seq)
    assert engine.runner.cache.num_free_blocks == engine.runner.cache.pool.num_blocks


def test_the_engine_forgets_every_finished_or_aborted_request(model):
    """A long-lived engine (a server, a library loop) must not keep every request it ever ran."""
    engine = tiny_engine(model, NgramDrafter(), chain(3))
    seqs = [engine.add_request(prompt, params) for prompt, params in make_requests(4, seed=3)]
    engine.abort(seqs[0].seq_id)  # still waiting
    assert seqs[0].finish_reason == "abort"
    run_all(engine)
    assert all(seq.is_finished for seq in seqs) and not engine.sequences
