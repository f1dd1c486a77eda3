"""Reduced-vocabulary draft heads: draft id j is target id ids[j], the reduced logits are the full head's logits
at those ids, the ranking is by frequency, and the drafters built with vocab=N propose target ids."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from specdec.drafters.heads.reduced_vocab import (VOCAB_DIR, draft_vocab, ranking_of, read_ranking, reduced_from,
                                                  token_counts, write_ranking)
from specdec.errors import ConfigError
from specdec.models.loader import build_model
from tests.helpers import tiny_config


def _model(tied: bool):
    config = replace(tiny_config(32), tie_embeddings=tied)
    return build_model(config, None, torch.float32, torch.device("cpu"), seed=3)


def test_ranking_is_by_frequency_then_id(tmp_path: Path):
    counts = token_counts([[5, 5, 5, 2, 2, 7], [2, 9]], vocab_size=12)
    assert counts.tolist()[:10] == [0, 0, 3, 0, 0, 3, 0, 1, 0, 1]
    assert ranking_of(counts).tolist()[:4] == [2, 5, 7, 9]  # 2 and 5 tie: the smaller id first
    path = tmp_path / "ranking.safetensors"
    write_ranking(counts, path)
    assert draft_vocab(None, 3, 12, path).tolist() == [2, 5, 7]
    with pytest.raises(ConfigError, match="between 1 and"):
        draft_vocab(None, 13, 12, path)


@pytest.mark.parametrize("tied", [True, False])
def test_draft_id_maps_to_the_right_target_id(tied: bool):
    target = _model(tied)
    ids = torch.tensor([30, 4, 17, 9])
    head = reduced_from(target, ids)
    assert head.ids.tolist() == [4, 9, 17, 30]  # ascending, so d2t = ids - arange is the published offset
    hidden = torch.randn(5, target.config.hidden_size)
    full = target.lm_head(hidden)
    assert torch.allclose(head(hidden), full[:, head.ids], atol=1e-6)
    # the best draft id, mapped back, is the best target id among the reduced ones
    best = head.ids[head(hidden).argmax(-1)]
    assert torch.equal(best, head.ids[full[:, head.ids].argmax(-1)])


def test_int8_target_head_rows_are_its_float_rows():
    from specdec.drafters.heads.reduced_vocab import head_rows
    from specdec.models.quant import quantize_int8_

    target = _model(tied=False)
    weight = target.lm_head.weight.detach().clone()
    quantize_int8_(target)
    ids = torch.tensor([1, 8, 31])
    rows = head_rows(target, ids)
    assert rows.shape == (3, target.config.hidden_size)
    assert torch.allclose(rows, weight[ids], atol=weight.abs().max().item() / 100)


@pytest.mark.skipif(not (VOCAB_DIR / "smollm2-135m.safetensors").is_file(), reason="no shipped ranking")
@pytest.mark.parametrize("spec", ["eagle:vocab=512", "medusa:vocab=512", "draft:vocab=512"])
def test_reduced_drafters_propose_only_target_ids_of_the_draft_vocabulary(default_llm, spec):
    from specdec.config import SamplingParams

    allowed = set(read_ranking(VOCAB_DIR / "smollm2-135m.safetensors", 49152)[:512].tolist())
    default_llm.use(spec, "dynamic:depth=3,topk=3,budget=6")
    seen: list[int] = []
    original = default_llm.engine.drafter.propose

    def spy(seqs, tree_spec):
        trees = original(seqs, tree_spec)
        for tree in trees:
            seen.extend(tree.token_list[1:])
        return trees

    default_llm.engine.drafter.propose = spy
    try:
        default_llm.generate(["Tell me about the moon."], SamplingParams(max_new_tokens=12, ignore_eos=True))
    finally:
        default_llm.use("none")
    assert seen and set(seen) <= allowed


@pytest.mark.skipif(not (VOCAB_DIR / "smollm2-135m.safetensors").is_file(), reason="no shipped ranking")
@pytest.mark.parametrize("level", ["avx2", "avx512", "amx"])
def test_shipped_heads_default_to_their_recorded_vocabulary_and_a_tree_for_the_row_price(
        default_llm, monkeypatch, level):
    """The shipped `draft`, `medusa` and `eagle` take the draft vocabulary their metadata records (4,096 tokens),
    and a narrow tree where verified rows are dear; an explicit option still wins."""
    from specdec.kernels import cpu as cpu_kernels
    from specdec.tree.spec import parse_tree_spec

    monkeypatch.setattr(cpu_kernels, "flat_verified_rows", lambda: level == "amx")
    monkeypatch.setattr(cpu_kernels, "blocked_weights", lambda: level == "avx512")
    dear = level != "amx"
    import torch

    expected = "flat" if not dear else "blocked" if level == "avx512" else "costly"
    assert cpu_kernels.by_row_price("costly", "blocked", "flat", torch.device("cpu")) == expected
    assert cpu_kernels.by_row_price("costly", "blocked", "flat", torch.device("cuda")) == "flat"  # GPU drafters

    def draft_ids(llm):  # the target ids of the drafter's reduced head (None: the full vocabulary)
        drafter = llm.engine.drafter
        return drafter.reduced.ids if drafter.name == "eagle" and drafter.reduced is not None else getattr(
            drafter, "ids", None)

    defaults = {"draft": ("chain:k=1", "chain:k=5"),
                "medusa": ("dynamic:depth=2,topk=2,budget=2", "static:medusa-8"),
                "eagle": ("chain:k=2", "dynamic:depth=5,topk=3,budget=7")}
    try:
        for name, (dear_tree, flat_tree) in defaults.items():
            default_llm.use(name)
            assert draft_ids(default_llm) is not None and draft_ids(default_llm).shape[0] == 4096, name
            assert default_llm.engine.drafter.default_tree() == parse_tree_spec(dear_tree if dear else flat_tree)
            default_llm.use(f"{name}:vocab=0")
            assert draft_ids(default_llm) is None, name
        default_llm.use("draft:k=3")
        assert default_llm.engine.drafter.default_tree() == parse_tree_spec("chain:k=3")
    finally:
        default_llm.use("none")
