"""The draft-model drafter (ModelDrafter over a small model's forward): its own cache rolls back to the committed
tokens after every proposal, catches up on what the target accepted, drafts chains and trees within the spec,
passes the draft distribution on for sampled chains, frees its blocks on release, and never changes greedy
output."""

from __future__ import annotations

import pytest
import torch

from specdec.config import EngineConfig, SamplingParams
from specdec.drafters.draft_model import DraftModelDrafter
from specdec.drafters.none import NoDrafter
from specdec.engine.runner import Chunk, ModelRunner, Rows
from specdec.engine.sequence import Sequence
from specdec.kvcache import BlockTable
from specdec.sampling import target_probs
from specdec.tree.spec import chain, dynamic, parse_tree_spec
from tests.helpers import run_all, tiny_engine, tiny_model

VOCAB = 32
BS = 4
CONFIG = EngineConfig(kv_cache_tokens=1024, block_size=BS)
DYNAMIC = dynamic(depth=3, topk=3, budget=7)
STATIC = parse_tree_spec("static:tree-8")
SPECS = [chain(4), DYNAMIC, STATIC]
SPEC_IDS = ["chain", "dynamic", "static"]
GREEDY = SamplingParams(max_new_tokens=64, ignore_eos=True)


@pytest.fixture(scope="module")
def target():
    return tiny_model(seed=3, vocab=VOCAB, sharpness=3.0)


@pytest.fixture(scope="module")
def draft():
    return tiny_model(seed=4, vocab=VOCAB, sharpness=3.0)


def make_seq(prompt: list[int], output: list[int], params: SamplingParams = GREEDY, seed: int = 0) -> Sequence:
    seq = Sequence(seed, list(prompt), params, torch.Generator().manual_seed(seed))
    seq.output_ids = list(output)
    return seq


def check_committed(drafter: DraftModelDrafter, seqs: list[Sequence]) -> None:
    """The drafter's cache holds each sequence's tokens (the root too: its row fed the first draft), no more."""
    used = 0
    for seq in seqs:
        table = drafter.table(seq)
        assert table.length == seq.num_tokens
        assert len(table.blocks) == -(-table.length // BS)
        used += len(table.blocks)
    assert drafter.cache.num_free_blocks == drafter.cache.pool.num_blocks - used


def greedy_continuation(model, tokens: list[int], n: int) -> list[int]:
    """The model's own greedy decode after `tokens`, one token per forward."""
    runner = ModelRunner.create(model, num_blocks=64, block_size=BS)
    table = BlockTable()
    out = runner.run([Chunk(table, tokens, list(range(len(tokens))), None, Rows.LAST)])[0].logits
    drafted = []
    for _ in range(n):
        drafted.append(int(out[-1].argmax()))
        out = runner.run([Chunk(table, drafted[-1:], [table.length], None, Rows.LAST)])[0].logits
    return drafted


# ----------------------------------------------------------------------------------------------- the cache
@pytest.mark.parametrize("spec", SPECS, ids=SPEC_IDS)
def test_cache_is_back_at_the_committed_length_after_every_propose(draft, spec):
    drafter = DraftModelDrafter(draft, CONFIG, k=4)
    seqs = [make_seq([1, 2, 3, 4, 5, 6, 7], [8]), make_seq([9, 10], [11], seed=1)]
    for step in range(4):
        trees = drafter.propose(seqs, spec)
        check_committed(drafter, seqs)
        for seq, tree in zip(seqs, trees):  # accept the first drafted token (when there is one) and a bonus
            seq.output_ids += tree.token_list[1:2] + [(step * 5 + seq.seq_id) % VOCAB]


@pytest.mark.parametrize("spec", SPECS, ids=SPEC_IDS)
def test_catch_up_after_several_accepted_tokens_equals_a_fresh_drafter(draft, spec):
    drafter = DraftModelDrafter(draft, CONFIG, k=4)
    seq = make_seq([5, 4, 3, 2, 1], [7])
    tree = drafter.propose([seq], spec)[0]
    seq.output_ids += [tree.token_list[i] for i in tree.paths[0][1:]]  # a whole drafted path is accepted
    seq.output_ids += [12, 13]  # and tokens the draft did not propose
    assert seq.num_tokens - drafter.table(seq).length >= 3
    tree = drafter.propose([seq], spec)[0]

    fresh = DraftModelDrafter(draft, CONFIG, k=4)
    copy = make_seq(seq.prompt_ids, seq.output_ids)
    again = fresh.propose([copy], spec)[0]
    assert tree.token_list == again.token_list and tree.parent_list == again.parent_list
    mine, theirs = drafter.table(seq), fresh.table(copy)
    assert mine.length == theirs.length == seq.num_tokens
    for layer in range(draft.config.num_layers):
        for a, b in zip(drafter.cache.gather(mine, layer), fresh.cache.gather(theirs, layer)):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_release_frees_every_block_of_its_cache(draft):
    drafter = DraftModelDrafter(draft, CONFIG, k=4)
    seqs = [make_seq(list(range(1, 11)), [3]), make_seq([2, 2], [2], seed=1)]
    drafter.propose(seqs, DYNAMIC)
    assert drafter.cache.num_free_blocks < drafter.cache.pool.num_blocks
    drafter.release(seqs[:1])
    check_committed(drafter, seqs[1:])
    drafter.release(seqs[1:] + [make_seq([1], [1], seed=2)])  # a sequence it never saw is harmless
    assert drafter.cache.num_free_blocks == drafter.cache.pool.num_blocks
    assert all(len(seq.drafter_state) == 0 for seq in seqs)


# ------------------------------------------------------------------------------------------------ proposals
@pytest.mark.parametrize("spec", SPECS, ids=SPEC_IDS)
def test_proposals_are_rooted_at_the_last_token_and_stay_within_the_spec(draft, spec):
    drafter = DraftModelDrafter(draft, CONFIG, k=4)
    seqs = [make_seq([1, 2, 3], [4]), make_seq([6, 5, 4, 3, 2, 1], [0], seed=1)]
    for seq, tree in zip(seqs, drafter.propose(seqs, spec)):
        assert tree.token_list[0] == seq.last_token
        assert 1 < len(tree) <= spec.budget + 1
        assert int(tree.depth.max()) <= spec.depth
        assert tree.draft_probs is None  # greedy chains and top-k trees are one-hot proposals
        if spec.kind.value == "chain":
            assert tree.is_chain and len(tree) == spec.depth + 1
        if spec is STATIC:  # every choice path exists (the vocabulary is wider than the tree)
            assert sorted(tree.depth.tolist()[1:]) == sorted(len(c) for c in spec.choices)
    (root_only,) = DraftModelDrafter(draft, CONFIG, k=4).propose(seqs[:1], chain(0))
    assert root_only.token_list == [seqs[0].last_token]


def test_greedy_chain_is_the_draft_models_own_greedy_decode(draft):
    drafter = DraftModelDrafter(draft, CONFIG, k=5)
    seqs = [make_seq([3, 1, 4, 1, 5, 9, 2, 6], [5]), make_seq([2, 7], [1], seed=1)]
    for _ in range(2):  # the second time after a catch-up
        trees = drafter.propose(seqs, chain(5))
        for seq, tree in zip(seqs, trees):
            assert tree.token_list[1:] == greedy_continuation(draft, seq.token_ids, 5)
            seq.output_ids += tree.token_list[1:3]


def test_sampled_chains_carry_the_processed_draft_distribution():
    """Each drafted token is drawn from the draft's distribution after the tokens before it, processed by the
    request's temperature and top-k, and that very distribution rides along for rejection sampling."""
    draft = tiny_model(seed=4, vocab=VOCAB, sharpness=0.5)  # flat enough that seeds draw different chains
    params = SamplingParams(max_new_tokens=64, temperature=0.8, top_k=6, seed=1)
    drafter = DraftModelDrafter(draft, CONFIG, k=4)
    seqs = [make_seq([1, 2, 3, 4], [5], params, seed=s) for s in range(8)]
    trees = drafter.propose(seqs, chain(4))
    runner = ModelRunner.create(draft, num_blocks=64, block_size=BS)
    for seq, tree in zip(seqs, trees):
        probs = tree.draft_probs
        assert probs is not None and probs.shape == (5, VOCAB)
        assert float(probs[0].abs().sum()) == 0.0  # the root was not drawn
        torch.testing.assert_close(probs[1:].sum(-1), torch.ones(4))
        drafted = tree.token_list[1:]
        for d in range(1, 5):
            assert probs[d, drafted[d - 1]] > 0, "a drafted token the draft could not draw"
            assert int((probs[d] > 0).sum()) <= 6  # the request's top-k applies to the draft too
            context = seq.token_ids + drafted[: d - 1]
            logits = runner.run([Chunk(BlockTable(), context, list(range(len(context))), None, Rows.LAST)])[0].logits
            torch.testing.assert_close(probs[d], target_probs(logits, params)[0], atol=1e-5, rtol=1e-5)
    assert len({tuple(t.token_list) for t in trees}) > 1, "eight seeds drew the very same chain"


# ------------------------------------------------------------------------------------------------ engine
@pytest.mark.parametrize("spec", SPECS, ids=SPEC_IDS)
@pytest.mark.parametrize("which", ["other-model", "early-exit"])
def test_greedy_output_through_the_engine_equals_plain_greedy(target, draft, spec, which):
    prompts = [[1, 2, 3, 4, 5, 6], [7, 8, 9], list(range(10, 30))]
    params = SamplingParams(max_new_tokens=20, ignore_eos=True)
    plain = tiny_engine(target, NoDrafter(), chain(0), kv_cache_tokens=1024, block_size=BS)
    plain_seqs = [plain.add_request(p, params) for p in prompts]
    run_all(plain)
    drafter = (DraftModelDrafter(draft, CONFIG, k=4) if which == "other-model"
               else DraftModelDrafter(target, CONFIG, k=4, num_layers=1))
    engine = tiny_engine(target, drafter, spec, kv_cache_tokens=1024, block_size=BS, adaptive_speculation=False)
    seqs = [engine.add_request(p, params) for p in prompts]
    run_all(engine)
    assert [s.output_ids for s in seqs] == [s.output_ids for s in plain_seqs]
    assert drafter.cache.num_free_blocks == drafter.cache.pool.num_blocks


def test_the_target_as_its_own_draft_gets_every_draft_accepted(target):
    """A draft equal to the target proposes exactly the target's greedy tokens, but only if its cache caught up
    on every accepted token: each step but the last emits all k drafts plus the bonus."""
    drafter = DraftModelDrafter(target, CONFIG, k=4)
    engine = tiny_engine(target, drafter, chain(4), kv_cache_tokens=1024, block_size=BS, adaptive_speculation=False)
    seq = engine.add_request([1, 2, 3, 4, 5], SamplingParams(max_new_tokens=31, ignore_eos=True))
    run_all(engine)
    assert seq.metrics.step_accepts == [5] * 6


# --------------------------------------------------------------------------------------------- precision
def _context(quantize: str | None, source: str = "tiny", model=None):
    from types import SimpleNamespace

    from specdec.drafters.base import DrafterContext

    target = SimpleNamespace(source=source, model=model, tokenizer=None)
    return DrafterContext(target, CONFIG, torch.device("cpu"), torch.float32, quantize)


@pytest.mark.parametrize("spec,message", [
    ("draft:quantize=int5", "quantize must be int8 or int4"),
    ("draft:layers=1,quantize=int4", "an early-exit draft runs at the target's"),
])
def test_bad_draft_precision_is_one_clear_error(target, spec, message):
    from specdec.drafters.registry import build_drafter
    from specdec.errors import ConfigError

    with pytest.raises(ConfigError, match=message):
        build_drafter(spec, _context("int8", model=target))
    with pytest.raises(ConfigError, match="needs a quantized target" if "int4" in spec else message):
        build_drafter(spec, _context(None, model=target))


def test_registered_draft_goes_int4_with_a_cut_head_only_where_its_alias_and_the_kernels_allow(monkeypatch):
    from specdec.drafters.draft_model import default_draft_precision
    from specdec.kernels import cpu

    monkeypatch.setattr(cpu, "available", lambda: True)
    for level, expected in [("amx", ("int4", 32768)), ("avx512", ("int4", 32768)), ("avx2", ("int8", 0)),
                            ("scalar", ("int8", 0))]:  # no VNNI int4 tiles below avx512
        monkeypatch.setattr(cpu, "isa", lambda *_, level=level: level)
        assert default_draft_precision(_context("int8", "qwen2.5-coder-1.5b")) == expected, level
        assert default_draft_precision(_context("int8", "smollm2-135m")) == ("int8", 0)  # its alias keeps int8
        assert default_draft_precision(_context(None, "qwen2.5-coder-1.5b")) == (None, 0)  # a float target
    monkeypatch.setattr(cpu, "available", lambda: False)
    assert default_draft_precision(_context("int8", "qwen2.5-coder-1.5b")) == ("int8", 0)


def test_an_int8_twin_runs_the_passes_of_five_rows_or_more_and_writes_the_same_cache(draft, target):
    """A twin (an int4 draft's int8 layers) takes a prompt or a long catch-up; one-row drafting stays on the
    draft itself. Here the twin is another model, so whichever ran shows in the cache it wrote."""
    from specdec.drafters.draft_model import TWIN_ROWS

    calls = []
    twin_forward = target.forward
    drafter = DraftModelDrafter(draft, CONFIG, k=3, twin=target)
    try:
        target.forward = lambda *a, **kw: calls.append(a[0].shape[0]) or twin_forward(*a, **kw)
        seq = make_seq(list(range(1, 9)), [9])  # 9 tokens to catch up on: a twin pass
        drafter.propose([seq], chain(3))
        assert calls == [seq.num_tokens] and calls[0] >= TWIN_ROWS
        seq.output_ids += [10, 11]  # 2 accepted tokens to catch up on: the draft's own pass
        drafter.propose([seq], chain(3))
        assert len(calls) == 1
    finally:
        del target.forward
    assert drafter.runner.model is draft
    alone = make_seq(list(range(1, 9)), [9])
    fresh = DraftModelDrafter(target, CONFIG, k=3)  # the twin's model alone
    fresh.propose([alone], chain(3))
    for layer in range(draft.config.num_layers):  # the first 9 positions' K and V are the twin's
        pairs = zip(drafter.cache.gather(drafter.table(seq), layer), fresh.cache.gather(fresh.table(alone), layer))
        for mine, theirs in pairs:
            torch.testing.assert_close(mine[:9], theirs[:9], atol=1e-6, rtol=1e-6)
