"""Medusa heads: checkpoints in the published layout load (or fail saying why), trees stay within their budget,
greedy output is unchanged, and the drafter's one-vector state after a commit equals a fresh run's."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from specdec.api import LLM
from specdec.config import EngineConfig, SamplingParams
from specdec.drafters.base import DrafterContext
from specdec.drafters.medusa import MedusaDrafter
from specdec.tree.growth import best_first_tree
from specdec.drafters.heads.medusa_heads import MedusaHeads, load_heads, save_heads
from specdec.drafters.registry import build_drafter
from specdec.errors import ConfigError, ModelLoadError
from specdec.models.dummy import DUMMY_SHAPES
from specdec.models.loader import LoadedModel
from specdec.tree.spec import BUILTIN_TREES, chain, parse_tree_spec
from tests.helpers import NoTokenizer, run_all, tiny_engine, tiny_model

SHAPE = DUMMY_SHAPES["tiny-llama"]
H, V = SHAPE["hidden_size"], SHAPE["vocab_size"]


def published_tensors(heads: int, layers: int, seed: int = 0, projections: bool = True) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for i in range(heads):
        for j in range(layers):
            out[f"{i}.{j}.linear.weight"] = torch.randn(H, H, generator=gen) * 0.1
            out[f"{i}.{j}.linear.bias"] = torch.randn(H, generator=gen) * 0.1
        if projections:
            out[f"{i}.{layers}.weight"] = torch.randn(V, H, generator=gen) * 0.1
    return out


def write_published(folder, tensors, heads: int, layers: int, fmt: str = "safetensors") -> None:
    folder.mkdir(parents=True, exist_ok=True)
    if fmt == "safetensors":
        save_file(tensors, str(folder / "medusa_lm_head.safetensors"))
    else:
        torch.save(tensors, folder / "medusa_lm_head.pt")
    (folder / "config.json").write_text(json.dumps({"medusa_num_heads": heads, "medusa_num_layers": layers,
                                                    "base_model_name_or_path": "tiny-llama"}))


def reference_logits(tensors, hidden: torch.Tensor, heads: int, layers: int) -> torch.Tensor:
    """Medusa's definition, written out per head: ResBlocks x + SiLU(W x + b), then the head's projection."""
    out = []
    for i in range(heads):
        x = hidden
        for j in range(layers):
            x = x + torch.nn.functional.silu(x @ tensors[f"{i}.{j}.linear.weight"].T + tensors[f"{i}.{j}.linear.bias"])
        out.append(x @ tensors[f"{i}.{layers}.weight"].T)
    return torch.stack(out, dim=1)


@pytest.mark.parametrize("fmt", ["safetensors", "pt"])
def test_published_checkpoint_round_trips(tmp_path, fmt):
    tensors = published_tensors(heads=3, layers=2)
    write_published(tmp_path, tensors, 3, 2, fmt)
    heads = load_heads(tmp_path, H, V, lm_head=torch.nn.Linear(H, V, bias=False))
    assert (heads.num_heads, heads.num_layers) == (3, 2)
    hidden = torch.randn(5, H)
    torch.testing.assert_close(heads(hidden), reference_logits(tensors, hidden, 3, 2), rtol=1e-5, atol=1e-5)
    # written back in the published layout, it reads the same again
    save_heads(heads, tmp_path / "again", dtype=torch.float32, pt=fmt == "pt")
    again = load_heads(tmp_path / "again", H, V, lm_head=None)
    torch.testing.assert_close(again(hidden), heads(hidden))


def test_heads_without_projections_use_the_target_lm_head(tmp_path):
    tensors = published_tensors(heads=2, layers=1, projections=False)
    write_published(tmp_path, tensors, 2, 1)
    lm_head = torch.nn.Linear(H, V, bias=False)
    heads = load_heads(tmp_path, H, V, lm_head)
    assert heads.projections is None and heads.lm_head is lm_head
    hidden = torch.randn(4, H)
    shared = {f"{i}.1.weight": lm_head.weight.detach() for i in range(2)}
    expected = reference_logits({**tensors, **shared}, hidden, 2, 1)
    torch.testing.assert_close(heads(hidden), expected, rtol=1e-5, atol=1e-5)
    assert not any(k.endswith(".1.weight") for k in heads.state_tensors())  # the shared head is never saved


def test_projections_equal_to_the_target_head_are_shared(tmp_path):
    lm_head = torch.nn.Linear(H, V, bias=False)
    tensors = published_tensors(heads=2, layers=1, projections=False)
    tensors.update({f"{i}.1.weight": lm_head.weight.detach().clone() for i in range(2)})
    write_published(tmp_path, tensors, 2, 1)
    assert load_heads(tmp_path, H, V, lm_head).projections is None


@pytest.mark.parametrize("change, message", [
    (lambda t: t.update({"0.0.linear.weight": torch.zeros(H + 1, H + 1)}), "shape"),
    (lambda t: t.update({"1.1.weight": torch.zeros(V + 3, H)}), "shape"),
    (lambda t: t.pop("1.0.linear.bias"), "lacks 1.0.linear.bias"),
    (lambda t: t.pop("0.1.weight"), "only some heads have a projection"),
    (lambda t: t.update({"2.0.linear.weight": torch.zeros(H, H)}), "unexpected"),
])
def test_mismatched_checkpoints_fail_clearly(tmp_path, change, message):
    tensors = published_tensors(heads=2, layers=1)
    change(tensors)
    write_published(tmp_path, tensors, 2, 1)
    with pytest.raises(ModelLoadError, match=message):
        load_heads(tmp_path, H, V, torch.nn.Linear(H, V, bias=False))


def test_missing_or_unreadable_files_fail_clearly(tmp_path):
    with pytest.raises(ModelLoadError, match="no Medusa heads"):
        load_heads(tmp_path / "nowhere", H, V, None)
    with pytest.raises(ModelLoadError, match="holds no Medusa weights"):
        load_heads(tmp_path, H, V, None)
    (tmp_path / "medusa_lm_head.safetensors").write_bytes(b"not a checkpoint")
    with pytest.raises(ModelLoadError, match="cannot read"):
        load_heads(tmp_path, H, V, None)
    write_published(tmp_path, published_tensors(1, 1), 1, 1)
    (tmp_path / "config.json").write_text(json.dumps({"medusa_num_heads": 1}))
    with pytest.raises(ModelLoadError, match="medusa_num_layers"):
        load_heads(tmp_path, H, V, None)


def test_no_shipped_heads_for_other_targets():
    model = tiny_model(0)
    ctx = DrafterContext(LoadedModel(model, NoTokenizer(), "dummy:tiny"), EngineConfig(), model.device,
                         torch.float32, None)
    with pytest.raises(ConfigError, match="ships no Medusa heads"):
        build_drafter("medusa", ctx)


# ------------------------------------------------------------------------------------------------ trees
def random_heads(model, num_heads: int = 3, seed: int = 0) -> MedusaHeads:
    c = model.config
    heads = MedusaHeads(num_heads, 1, c.hidden_size, c.vocab_size, model.lm_head)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        heads.weight.copy_(torch.randn(heads.weight.shape, generator=gen) * 0.5)
        heads.bias.copy_(torch.randn(heads.bias.shape, generator=gen) * 0.5)
    return heads.eval()


@pytest.mark.parametrize("tree", ["chain:k=5", "static:medusa-8", "static:tree-16", "static:chain-5",
                                  "dynamic:depth=6,topk=3,budget=10", "dynamic:depth=2,topk=8,budget=40"])
def test_trees_are_valid_and_within_budget(tree):
    model = tiny_model(1)
    drafter = MedusaDrafter(random_heads(model))
    spec = parse_tree_spec(tree)
    seen = []
    engine = tiny_engine(model, drafter, spec, adaptive_speculation=False)
    original = drafter.propose

    def spy(seqs, spec):
        trees = original(seqs, spec)
        seen.extend(zip(seqs, trees))
        return trees

    drafter.propose = spy
    for seed in range(2):
        engine.add_request([seed + 1, 3, 5, 7], SamplingParams(max_new_tokens=10))
    run_all(engine)
    assert seen
    for seq, t in seen:
        assert len(t) - 1 <= spec.budget
        assert int(t.depth.max()) <= min(spec.depth, drafter.heads.num_heads)
        for kids in t.children:
            tokens = [int(t.tokens[k]) for k in kids]
            assert len(tokens) == len(set(tokens))  # siblings are distinct candidates
    assert any(len(t) > 1 for _, t in seen)


def test_best_first_tree_keeps_the_highest_scoring_paths():
    values = [[-0.1, -1.0], [-0.2, -3.0], [-0.5, -0.6]]  # log-probs of ranks 0, 1 for heads 0..2
    tokens = [[10, 11], [20, 21], [30, 31]]
    tree = best_first_tree(5, values, tokens, budget=4)
    # scores: 10:-0.1, 10-20:-0.3, 10-20-30:-0.8, 10-20-31:-0.9, 11:-1.0 -> the best four
    paths = {tuple(int(tree.tokens[i]) for i in p[1:]) for p in tree.paths}
    assert paths == {(10, 20, 30), (10, 20, 31)}
    assert len(tree) == 5


def test_state_after_commit_matches_a_fresh_run():
    """Rollback is one vector: after a step, the heads read the feature of the last accepted node. A fresh
    engine prefilling the committed prefix reaches the same feature and proposes the same tree."""
    model = tiny_model(2)
    heads = random_heads(model, seed=3)
    spec = parse_tree_spec("static:medusa-8")
    engine = tiny_engine(model, MedusaDrafter(heads), spec, adaptive_speculation=False)
    seq = engine.add_request([1, 2, 3, 4, 5], SamplingParams(max_new_tokens=20))
    while len(seq.output_ids) < 6:
        engine.step()
    assert not seq.is_finished
    fresh_drafter = MedusaDrafter(heads)
    fresh = tiny_engine(model, fresh_drafter, spec, adaptive_speculation=False)
    other = fresh.add_request(seq.token_ids[:-1], SamplingParams(max_new_tokens=5))
    fresh.step()  # prefill: the first output token comes from the last prompt row
    assert other.output_ids == [seq.token_ids[-1]]
    torch.testing.assert_close(fresh_drafter.hidden_of(other), engine.drafter.hidden_of(seq), rtol=1e-4, atol=1e-5)
    mine = engine.drafter.propose([seq], spec)[0]
    theirs = fresh_drafter.propose([other], spec)[0]
    assert mine.tokens.tolist() == theirs.tokens.tolist()
    assert mine.parents.tolist() == theirs.parents.tolist()
    engine.drafter.release([seq])
    assert engine.drafter.hidden_of(seq) is None


def test_builtin_medusa_trees_are_valid():
    for name in (n for n in BUILTIN_TREES if n.startswith("medusa-")):
        spec = parse_tree_spec(f"static:{name}")
        assert spec.budget == int(name.split("-")[1])


# ----------------------------------------------------------------------------------- the default model
def test_greedy_output_is_unchanged_with_the_shipped_heads(default_llm, default_model):
    prompts = ["Give three tips for staying healthy.", "Write a Python function that reverses a string."]
    params = SamplingParams(max_new_tokens=24)
    default_llm.use("none")
    plain = [o.token_ids for o in default_llm.generate(prompts, params)]
    # the full tree every step (no adaptive depth), so that every step exercises the heads
    medusa = LLM.from_loaded(default_model, drafter="medusa", engine_config=EngineConfig(adaptive_speculation=False))
    outs = medusa.generate(prompts, params)
    assert [o.token_ids for o in outs] == plain
    steps = sum(o.metrics.target_steps for o in outs)
    assert sum(len(o.token_ids) for o in outs) / steps > 1.3  # trained heads get drafts accepted
