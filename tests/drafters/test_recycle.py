"""Token Recycling through the engine: what the matrix holds after a step is the top-k of the target's logits at
every verified node, computed again here with a plain dense forward per node."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specdec.config import SamplingParams
from specdec.drafters.recycle import RecycleDrafter, _joined_rows
from specdec.engine.runner import Chunk, ModelRunner
from specdec.kvcache import BlockTable
from specdec.tree.spec import TreeSpec, chain, parse_tree_spec
from tests.helpers import run_all, tiny_engine, tiny_model

VOCAB = 32


@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=5, vocab=VOCAB, sharpness=2.0)


def dense_next_logits(model, context: list[int]) -> torch.Tensor:
    runner = ModelRunner.create(model, num_blocks=64, block_size=8)
    return runner.run([Chunk(BlockTable(), context, list(range(len(context))), None, "last")])[0].logits[0]


class Recording(RecycleDrafter):
    """The real drafter, remembering each step's verified trees and the context they grew from."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.steps: list[tuple[list[int], object, object]] = []

    def observe_verified(self, seqs, trees, logits, results) -> None:
        for seq, tree, result in zip(seqs, trees, results):
            self.steps.append((list(seq.token_ids), tree, result))
        super().observe_verified(seqs, trees, logits, results)


@pytest.mark.parametrize("tree", [TreeSpec("dynamic", depth=3, topk=3, budget=6), chain(3),
                                  parse_tree_spec("static:tree-8")])
def test_matrix_holds_the_top_k_of_each_verified_nodes_logits(model, tree):
    drafter = Recording(VOCAB, k=4)
    engine = tiny_engine(model, drafter, tree, adaptive_speculation=False)
    seq = engine.add_request([1, 2, 3, 1, 2], SamplingParams(max_new_tokens=30, ignore_eos=True))
    checked = 0
    while engine.has_unfinished():
        before = len(drafter.steps)
        engine.step()
        for context, verified, result in drafter.steps[before:]:
            tokens = verified.tokens.tolist()
            paths: list[list[int]] = []
            for i, parent in enumerate(verified.parent_list):
                paths.append((paths[parent] if parent >= 0 else []) + [tokens[i]])
            on_path = set(result.accepted_nodes)
            last_writer = {}  # token -> the node whose row it keeps: the accepted path's, else the last one
            for i in [n for n in range(len(tokens)) if n not in on_path] + result.accepted_nodes:
                last_writer[tokens[i]] = i
            for token, node in last_writer.items():
                ref = dense_next_logits(model, context + paths[node][1:])
                want = torch.sort(ref, descending=True, stable=True).indices[:4].numpy()
                np.testing.assert_array_equal(drafter.matrix.table[token], want)
                probs = torch.softmax(ref, dim=-1)[want.tolist()].numpy()
                np.testing.assert_allclose(drafter.matrix.probs[token], probs, rtol=1e-4, atol=1e-6)
                checked += 1
    assert checked > 20
    assert sum(len(t) > 1 for _, t, _ in drafter.steps) >= 3, "the matrix never drafted anything"
    assert seq.metrics.accepted_drafts > 0


def test_recycle_output_equals_plain_greedy_and_keeps_no_sequence_state(model):
    prompts = [[1, 2, 3, 1, 2], [7, 7, 7], [4, 9, 4, 9, 4]]
    plain = tiny_engine(model, RecycleDrafter(VOCAB, k=4), chain(0))
    want = [plain.add_request(p, SamplingParams(max_new_tokens=40, ignore_eos=True)) for p in prompts]
    run_all(plain)
    drafter = RecycleDrafter(VOCAB, k=4)
    engine = tiny_engine(model, drafter, drafter.default_tree())
    got = [engine.add_request(p, SamplingParams(max_new_tokens=40, ignore_eos=True)) for p in prompts]
    run_all(engine)
    assert [s.output_ids for s in got] == [s.output_ids for s in want]
    assert sum(s.metrics.accepted_drafts for s in got) > 0
    assert all(not s.drafter_state for s in got)
    assert (drafter.matrix.table >= 0).any()
    drafter.reset()
    assert (drafter.matrix.table < 0).all() and (drafter.matrix.pair_keys < 0).all()
    assert drafter.matrix.nbytes == VOCAB * 4 * 8 + 2 ** 16 * (8 + 4 * 8)  # the memory bound: fixed at build time


def test_prefill_seeds_each_prompt_tokens_row_with_the_logits_at_its_position(model):
    drafter = RecycleDrafter(VOCAB, k=4)
    # chunked: seeding must follow the chunks; the planner off, so that every step drafts whatever the clock
    # says (with it on, a loaded machine made the timed planner skip a draft and the seeds wait a step longer)
    engine = tiny_engine(model, drafter, chain(3), prefill_chunk=4, adaptive_speculation=False)
    prompt = [5, 1, 7, 2, 9, 3, 8, 6, 4, 10]
    engine.add_request(prompt, SamplingParams(max_new_tokens=12, ignore_eos=True))
    while not any(s.output_ids for s in engine.sequences.values()):
        engine.step()
    assert (drafter.matrix.table < 0).all()  # the seed rows wait past the prefill (PromptSeeds) ...
    engine.step()  # ... and past the first draft (an exploratory one, under load) ...
    assert len(engine.seeds) == 1
    engine.step()  # ... to the second
    assert len(engine.seeds) == 0
    for i, token in enumerate(prompt):
        want = torch.sort(dense_next_logits(model, prompt[: i + 1]), descending=True, stable=True).indices[:4]
        np.testing.assert_array_equal(drafter.matrix.table[token], want.numpy())
        if i:
            succ, _ = drafter.matrix.rows(np.array([prompt[i - 1]]), np.array([token]))
            np.testing.assert_array_equal(succ[0], want.numpy())
    unseeded = RecycleDrafter(VOCAB, k=4, seed=0)
    engine = tiny_engine(model, unseeded, chain(3))
    engine.add_request(prompt, SamplingParams(max_new_tokens=1, ignore_eos=True))
    run_all(engine)
    assert (unseeded.matrix.table < 0).all()


def test_seeding_reads_only_the_prompts_last_rows(model):
    """`seed=3`: the LM head runs for the prompt's last three positions only, across chunk boundaries."""

    class SeedRecording(RecycleDrafter):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self.seeded: list[int] = []  # prompt positions whose logits came to the drafter

        def observe_prefill_logits(self, seq, start, logits) -> None:
            self.seeded.extend(range(start, start + logits.shape[0]))
            super().observe_prefill_logits(seq, start, logits)

    drafter = SeedRecording(VOCAB, k=4, seed=3)
    engine = tiny_engine(model, drafter, chain(3), prefill_chunk=4)  # positions 7 | 8 9 lie in two chunks
    prompt = [5, 1, 7, 2, 9, 3, 8, 6, 4, 10]
    engine.add_request(prompt, SamplingParams(max_new_tokens=8, ignore_eos=True))  # two drafts at least
    run_all(engine)
    assert sorted(drafter.seeded) == [7, 8, 9]
    for i in (7, 8, 9):
        want = torch.sort(dense_next_logits(model, prompt[: i + 1]), descending=True, stable=True).indices[:4]
        np.testing.assert_array_equal(drafter.matrix.table[prompt[i]], want.numpy())


def test_an_idle_planner_seeds_no_prompt_rows_and_reads_no_verified_logits(model):
    """While the planner keeps speculation off (a server at saturation), the engine does not pay for what only
    speculation uses: the prompt's seed rows (LM-head rows) and the top-k of every verified row."""
    from specdec.config import EngineConfig
    from specdec.engine.engine import Engine
    from specdec.engine.planner import IDLE_AFTER, SpeculationPlanner
    from tests.engine.test_planner import seq as planned_seq
    from tests.helpers import NoTokenizer

    class DearRows(SpeculationPlanner):
        """Keeps the prices it was given (the tiny model's real steps would make rows look cheap)."""

        def observe_forward(self, tokens: int, seconds: float, prefill_tokens: int = 0) -> None:
            pass

    planner = DearRows()
    for n in (1, 2, 4, 8, 16, 64):
        SpeculationPlanner.observe_forward(planner, n, 0.02 * n - 0.01)  # each extra row dearer than a step
    for _ in range(IDLE_AFTER):
        planner.plan([planned_seq(0, [3, 1, 0], [10] * 3)], chain(3))
    assert planner.idle
    drafter = Recording(VOCAB, k=4)
    engine = Engine(model, NoTokenizer(), EngineConfig(adaptive_speculation=True), drafter, chain(3), planner=planner)
    prompt = [5, 1, 7, 2, 9, 3, 8, 6, 4, 10]
    engine.add_request(prompt, SamplingParams(max_new_tokens=6, ignore_eos=True))
    run_all(engine)
    assert (drafter.matrix.table < 0).all()  # never drafted for: never seeded (PromptSeeds)
    assert drafter.steps == []
    assert len(engine.seeds) == 0  # the finished sequence's kept rows are gone


def test_joined_rows_is_a_view_only_of_consecutive_slices_of_one_buffer():
    """The batch's top-k runs in one call only where the sequences' logits are consecutive rows of one tensor."""
    buffer = torch.randn(9, VOCAB)
    parts = [buffer[0:1], buffer[1:4], buffer[4:5]]
    joined = _joined_rows(parts)
    assert joined is not None and joined.data_ptr() == buffer.data_ptr()
    assert torch.equal(joined, buffer[:5])
    assert _joined_rows([buffer[0:1], buffer[2:4]]) is None  # a gap
    assert _joined_rows([buffer[1:4], buffer[0:1]]) is None  # out of order
    assert _joined_rows([buffer[0:1], buffer[1:4].clone()]) is None  # another buffer
    assert _joined_rows([buffer[0:2, :5], buffer[2:4, :5]]) is None  # not whole rows


def test_recycling_a_batch_in_one_call_writes_what_one_call_per_sequence_writes():
    from types import SimpleNamespace

    from specdec.tree.token_tree import TokenTree
    from specdec.verifier.result import VerifyResult

    gen = torch.Generator().manual_seed(3)
    buffer = torch.randn(7, VOCAB, generator=gen)
    seqs = [SimpleNamespace(output_ids=[4, 9], token_ids=[1, 4, 9]), SimpleNamespace(output_ids=[], token_ids=[2, 6])]
    trees = [TokenTree.from_parents([9, 3, 5, 8], [-1, 0, 0, 1]), TokenTree.from_parents([6, 1, 2], [-1, 0, 1])]
    results = [VerifyResult([0, 1, 3], [3, 8, 0], 0), VerifyResult([0], [7], 7)]
    joined, apart = RecycleDrafter(VOCAB, k=4), RecycleDrafter(VOCAB, k=4)
    joined.observe_verified(seqs, trees, [buffer[0:4], buffer[4:7]], results)
    apart.observe_verified(seqs, trees, [buffer[0:4].clone(), buffer[4:7].clone()], results)
    for name in ("table", "probs", "pair_keys", "pair_table", "pair_probs"):
        np.testing.assert_array_equal(getattr(joined.matrix, name), getattr(apart.matrix, name))
    assert (joined.matrix.table[[9, 3, 8, 6]] >= 0).all()


def test_the_default_tree_follows_the_price_of_a_verified_row(monkeypatch):
    """A chain of 2 where every verified row costs (AVX2), a 4-node tree where the int8 linears take a few rows
    for little more than one (VNNI blocks), the 8-node best-first tree where they are flat (AMX); a tree the user
    names wins either way."""
    from specdec.drafters import recycle
    from specdec.kernels import cpu

    monkeypatch.setattr(cpu, "flat_verified_rows", lambda: False)
    monkeypatch.setattr(cpu, "blocked_weights", lambda: False)
    assert RecycleDrafter(64).default_tree() == chain(2)
    monkeypatch.setattr(cpu, "blocked_weights", lambda: True)
    assert RecycleDrafter(64).default_tree() == parse_tree_spec(recycle.VNNI_ROWS_TREE) != chain(2)
    monkeypatch.setattr(cpu, "flat_verified_rows", lambda: True)
    assert RecycleDrafter(64).default_tree() == parse_tree_spec(recycle.FLAT_ROWS_TREE)
    assert RecycleDrafter(64, tree="chain:k=3").default_tree() == chain(3)
