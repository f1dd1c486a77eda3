"""A feature-reading drafter keeps the target's features of prefix-cached blocks: a request whose prompt the
cache already holds gets them back exactly, with no dense recomputation, and the store stays within its bound."""

from __future__ import annotations

import pytest
import torch

import specdec.drafters.eagle as eagle_module
from specdec.config import EngineConfig, SamplingParams
from specdec.drafters.eagle import EagleDrafter
from specdec.drafters.prefix_features import FeatureLog, PrefixFeatureStore
from specdec.kvcache import BlockTable
from specdec.engine.runner import Chunk, ModelRunner, Rows
from specdec.tree.spec import parse_tree_spec
from tests.drafters.test_eagle import feature_layers, random_predictor
from tests.helpers import run_all, tiny_engine, tiny_model

BS = 4


def named(*entry_ids: int) -> BlockTable:
    """A table whose leading blocks the prefix cache has named with these entry ids."""
    return BlockTable(cached=[(hash(i), i) for i in entry_ids])


def rows(start: int, n: int) -> torch.Tensor:
    return torch.arange(start, start + n, dtype=torch.float32)[:, None].repeat(1, 3)


def test_a_block_is_stored_once_the_prefix_cache_names_it_and_comes_back_whole():
    store = PrefixFeatureStore(BS, max_blocks=8)
    log = FeatureLog(store)
    table = BlockTable()
    log.add(0, rows(0, 6), table)  # a prefill chunk: its blocks are not named yet
    assert len(store) == 0
    table.cached = named(11, 12).cached  # named after the chunk; the next features flush the first block
    log.add(6, rows(6, 1), table)
    assert len(store) == 1  # positions 4 .. 7 are not all known yet
    log.add(7, rows(7, 2), table)
    assert len(store) == 2
    torch.testing.assert_close(store.lookup(table, 8), rows(0, 8), rtol=0, atol=0)
    assert store.lookup(table, 6) is None  # not a whole number of blocks
    assert store.lookup(named(11, 13), 8) is None  # another chain after the first block
    assert store.lookup(named(11), 8) is None  # more blocks than the table holds


def test_a_gap_in_the_features_stops_the_log_and_stores_nothing_wrong():
    store = PrefixFeatureStore(BS, max_blocks=8)
    log = FeatureLog(store)
    table = named(1, 2, 3)
    log.add(0, rows(0, 3), table)
    log.add(4, rows(4, 8), table)  # position 3 never came
    assert len(store) == 0 and log.broken
    log.add(3, rows(3, 9), table)
    assert len(store) == 0


def test_the_store_keeps_the_most_recently_used_blocks_within_its_bound():
    store = PrefixFeatureStore(BS, max_blocks=3)
    for entry in range(1, 6):
        store.put(entry, rows(entry, BS))
        assert len(store) <= 3
    assert store.lookup(named(1), BS) is None and store.lookup(named(2), BS) is None
    assert store.lookup(named(3), BS) is not None  # used now: the next put evicts 4, not 3
    store.put(6, rows(6, BS))
    assert store.lookup(named(3), BS) is not None and store.lookup(named(4), BS) is None


def _eagle_engine(version: int, prefix_caching: bool = True, kv_cache_tokens: int = 4096):
    target = tiny_model(seed=5, vocab=32, sharpness=3.0)
    config = dict(enable_prefix_caching=prefix_caching, kv_cache_tokens=kv_cache_tokens)
    drafter = EagleDrafter(random_predictor(target, version, seed=2), target, EngineConfig(**config),
                           feature_layers=feature_layers(version))
    tree = parse_tree_spec("dynamic:depth=3,topk=2,budget=4")
    return target, drafter, tiny_engine(target, drafter, tree, adaptive_speculation=False, **config)


@pytest.mark.parametrize("version", [1, 3])
def test_a_prompt_seen_before_gets_its_features_from_the_store_not_a_dense_forward(version, monkeypatch):
    target, drafter, engine = _eagle_engine(version)
    prompt = [(5 * i + 3) % 32 for i in range(37)]
    params = SamplingParams(max_new_tokens=9, ignore_eos=True)
    first = engine.add_request(prompt, params)
    run_all(engine)
    seen = {}  # what the drafter was handed for the second request's cached prefix

    def no_dense(*args, **kwargs):
        raise AssertionError("the features of a prefix this drafter saw were computed again")

    monkeypatch.setattr(eagle_module, "dense_forward", no_dense)
    observe = drafter.observe_prefill

    def spy(seq, start, features):
        if start:
            seen["prefix"] = drafter._prefix_features(seq, start)
        observe(seq, start, features)

    monkeypatch.setattr(drafter, "observe_prefill", spy)
    second = engine.add_request(prompt, params)
    run_all(engine)
    assert second.metrics.cached_prompt_tokens == 32
    assert second.output_ids == first.output_ids
    # The target's features at those positions (a float linear's sums may group differently by row count).
    ids = list(prompt[:32])
    expect = ModelRunner.create(target, 64, 16).run([Chunk(BlockTable(), ids, list(range(32)), None, Rows.NONE)],
                                                   return_hidden=True,
                                                   capture_layers=feature_layers(version))[0].hidden
    torch.testing.assert_close(seen["prefix"], expect, rtol=1e-5, atol=1e-5)


def test_without_prefix_caching_the_drafter_keeps_no_features():
    _, drafter, engine = _eagle_engine(1, prefix_caching=False)
    engine.add_request(list(range(30)), SamplingParams(max_new_tokens=6, ignore_eos=True))
    run_all(engine)
    assert drafter.prefix_features is None


def test_the_drafter_store_is_bounded_by_the_kv_pool_after_many_requests():
    _, drafter, engine = _eagle_engine(1, kv_cache_tokens=256)  # 16 blocks; the requests fill 36
    config = engine.config
    params = SamplingParams(max_new_tokens=5, ignore_eos=True)
    for r in range(12):
        engine.add_request([(r * 7 + 11 * i) % 32 for i in range(40)], params)
    run_all(engine)
    assert len(drafter.prefix_features) == config.num_blocks
