"""CUDA graphs of small steps (engine/cuda_graphs.py): the padding a bucket adds never reaches real data.

On CPU: bucketing, and what `_Buffers.load` leaves in the padding after a larger step of the same bucket (pad
tokens must write the scratch slot, pad sequences must have no tokens or, decoding, one). On a GPU (skipped
elsewhere; `bench/gpu_session.sh` runs them): the same steps through a graphed and an eager runner give the
same logits and the same K/V cache, and greedy generation with graphs equals generation without them.
"""

from __future__ import annotations

import pytest
import torch

from specdec.engine.cuda_graphs import StepShape, _Buffers, bucket
from specdec.engine.runner import Chunk, ModelRunner, pack
from specdec.kvcache import BlockTable, PagedKVCache
from specdec.tree.token_tree import TokenTree

CPU = torch.device("cpu")
BS = 4
TREE = TokenTree.from_parents([5, 6, 7, 8, 9], [-1, 0, 0, 1, 2])
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_buckets_are_powers_of_two_with_a_floor():
    assert [bucket(n) for n in (1, 2, 3, 4, 5, 17)] == [1, 2, 4, 4, 8, 32]
    assert bucket(3, 16) == 16 and bucket(17, 16) == 32


def _filled(cache: PagedKVCache, n: int) -> BlockTable:
    table = BlockTable()
    assert cache.append(table, n) is not None
    return table


def test_step_shapes_by_kind():
    cache = PagedKVCache(1, 32, BS, kv_heads=1, head_dim=2, scratch=True)
    a, b, c = (_filled(cache, n) for n in (3, 6, 5))
    decode = pack(cache, [Chunk(t, [1], [t.length]) for t in (a, b, c)], CPU)
    assert StepShape.of(decode.ctx, 3) == StepShape("decode", 4, 4, 0)
    causal = pack(cache, [Chunk(a, [1, 2, 3], [4, 5, 6])], CPU)
    assert StepShape.of(causal.ctx, 3) == StepShape("causal", 1, 16, 0)
    tree = pack(cache, [Chunk(b, TREE.tokens.tolist(), TREE.positions(b.length).tolist(), TREE.ancestor_mask)
                        for _ in range(1)] + [Chunk(c, [4] * 40, list(range(c.length, c.length + 40)))], CPU)
    assert StepShape.of(tree.ctx, 45) == StepShape("tree", 2, 64, 2)


def test_scratch_block_lies_past_the_pool():
    cache = PagedKVCache(1, 8, BS, kv_heads=1, head_dim=2, scratch=True)
    assert cache.layers[0][0].shape[0] == 9 and cache.scratch_slot == 8 * BS
    assert cache.pool.num_free == 8
    assert PagedKVCache(1, 8, BS, kv_heads=1, head_dim=2).scratch_slot is None


def test_load_resets_what_a_larger_step_left_in_the_padding():
    cache = PagedKVCache(1, 32, BS, kv_heads=1, head_dim=2, scratch=True)
    tables = [_filled(cache, n) for n in (3, 6, 5, 2)]
    big = pack(cache, [Chunk(t, [7, 8, 9], [t.length, t.length + 1, t.length + 2]) for t in tables[:3]], CPU)
    small = pack(cache, [Chunk(tables[3], [1, 2], [2, 3])], CPU)
    shape = StepShape("causal", 4, 16, 0)
    buffers = _Buffers(shape, width=8, scratch_slot=cache.scratch_slot, device=CPU)
    buffers.load(big.tokens, big.positions, big.ctx)
    assert buffers.starts.tolist() == [0, 3, 6, 9, 9]
    buffers.load(small.tokens, small.positions, small.ctx)
    assert buffers.slots[:2].tolist() == small.ctx.slot_mapping.tolist()
    assert set(buffers.slots[2:].tolist()) == {cache.scratch_slot}  # never a slot the big step wrote
    assert buffers.starts.tolist() == [0, 2, 2, 2, 2]  # pad sequences own no tokens
    assert buffers.prefix_lens[0].item() == small.ctx.prefix_lens[0].item()


def test_decode_padding_reads_one_token_per_pad_sequence():
    cache = PagedKVCache(1, 32, BS, kv_heads=1, head_dim=2, scratch=True)
    tables = [_filled(cache, n) for n in (3, 9, 5)]
    three = pack(cache, [Chunk(t, [1], [t.length]) for t in tables], CPU)
    one = pack(cache, [Chunk(tables[0], [1], [tables[0].length])], CPU)
    buffers = _Buffers(StepShape("decode", 4, 4, 0), width=8, scratch_slot=cache.scratch_slot, device=CPU)
    buffers.load(three.tokens, three.positions, three.ctx)
    buffers.load(one.tokens, one.positions, one.ctx)
    assert buffers.seq_lens.tolist() == [tables[0].length, 1, 1, 1]
    assert set(buffers.slots[1:].tolist()) == {cache.scratch_slot}


# ------------------------------------------------------------------------------------------------------ GPU
@pytest.fixture(scope="module")
def gpu_model():
    from specdec.models.loader import load_model

    return load_model("dummy:tiny-llama", "cuda", "float32", show_progress=False).model


def _steps(tables: list[BlockTable]) -> list[list[Chunk]]:
    """Prefill (eager), then a decode of 3, a tree, a tree beside a chain, a decode of 1, a 40-token chain."""
    prompt = [list(range(3 + 5 * i, 3 + 5 * i + 20 + 7 * i)) for i in range(len(tables))]
    steps = [[Chunk(t, p, list(range(len(p))), None, "none") for t, p in zip(tables, prompt)]]

    def at(t: BlockTable, tokens: list[int], mask=None) -> Chunk:
        return Chunk(t, tokens, [t.length + k for k in range(len(tokens))] if mask is None
                     else TREE.positions(t.length).tolist(), mask)

    steps.append(lambda: [at(t, [11]) for t in tables])
    steps.append(lambda: [at(tables[0], TREE.tokens.tolist(), TREE.ancestor_mask)])
    steps.append(lambda: [at(tables[1], TREE.tokens.tolist(), TREE.ancestor_mask), at(tables[2], [4, 5, 6])])
    steps.append(lambda: [at(tables[2], [12])])
    steps.append(lambda: [at(tables[0], list(range(40)))])
    return steps


@cuda
def test_graphed_steps_match_eager_logits_and_cache(gpu_model):
    runners = [ModelRunner.create(gpu_model, 64, 16, graph_tokens=64), ModelRunner.create(gpu_model, 64, 16)]
    assert runners[0].graphs is not None and runners[1].graphs is None
    tables = [[BlockTable() for _ in range(3)] for _ in runners]
    plans = [_steps(t) for t in tables]
    for index in range(len(plans[0])):
        outs = []
        for runner, plan in zip(runners, plans):
            step = plan[index]
            outs.append(runner.run(step if isinstance(step, list) else step()))
        for graphed, eager in zip(*outs):
            if eager.logits is not None:
                torch.testing.assert_close(graphed.logits, eager.logits, atol=1e-4, rtol=1e-4)
        for t_graph, t_eager in zip(*tables):
            for layer in range(len(runners[0].cache.layers)):
                k_g, v_g = runners[0].cache.gather(t_graph, layer)
                k_e, v_e = runners[1].cache.gather(t_eager, layer)
                torch.testing.assert_close(k_g, k_e, atol=1e-5, rtol=1e-5)
                torch.testing.assert_close(v_g, v_e, atol=1e-5, rtol=1e-5)
    assert len(runners[0].graphs.graphs) >= 4  # decode x2 buckets, tree, causal: replayed, not eager


@cuda
@pytest.mark.parametrize("drafter", ["none", "ngram", "oracle:alpha=0.8"])
def test_greedy_generation_with_graphs_equals_without(drafter):
    from specdec import LLM, EngineConfig, SamplingParams
    from specdec.drafters.oracle import prepare_oracle

    prompts = [[5, 9, 14, 3, 5, 9, 14, 3, 7] * 3, list(range(40, 90)), [2, 3] * 12]
    params = SamplingParams(max_new_tokens=40, ignore_eos=True)
    outputs = []
    for tokens in (256, 0):
        llm = LLM("dummy:tiny-llama", device="cuda", dtype="float32", drafter=drafter, show_progress=False,
                  engine_config=EngineConfig(cuda_graph_tokens=tokens, kv_cache_tokens=4096))
        if drafter.startswith("oracle"):
            prepare_oracle(llm, prompts, 40)
        outputs.append([o.token_ids for o in llm.generate(prompts, params, chat=False)])
    assert outputs[0] == outputs[1]


@pytest.mark.parametrize("value", [-1, 2.5, True, "256"])
def test_engine_config_refuses_a_bad_graph_size(value):
    from specdec.config import EngineConfig
    from specdec.errors import ConfigError

    with pytest.raises(ConfigError, match="cuda_graph_tokens"):
        EngineConfig(cuda_graph_tokens=value)


def test_no_graphs_on_cpu_or_when_switched_off():
    from specdec.models.loader import load_model

    model = load_model("dummy:tiny-llama", "cpu", "float32", show_progress=False).model
    runner = ModelRunner.create(model, 16, 16, graph_tokens=256)
    assert runner.graphs is None and runner.cache.scratch_slot is None
    assert runner.cache.layers[0][0].shape[0] == 16


def test_a_failed_capture_warns_once_and_leaves_that_shape_eager():
    """A capture that fails (here: no CUDA at all) must not fail the request: that shape runs eagerly from then
    on, with one warning."""
    from specdec.engine.cuda_graphs import CudaGraphs
    from specdec.models.loader import load_model

    model = load_model("dummy:tiny-llama", "cpu", "float32", show_progress=False).model
    cache = PagedKVCache(len(model.layers), 16, 16, model.config.num_kv_heads, model.config.head_dim, scratch=True)
    graphs = CudaGraphs(model, cache, max_tokens=64)
    table = _filled(cache, 5)
    step = pack(cache, [Chunk(table, [1], [5])], CPU)
    with pytest.warns(RuntimeWarning, match="CUDA graph capture failed"):
        assert graphs.forward(step.tokens, step.positions, step.ctx) is None
    assert list(graphs.graphs.values()) == [None]
    assert graphs.forward(step.tokens, step.positions, step.ctx) is None  # no second warning, no second try
