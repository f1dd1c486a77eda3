"""EAGLE drafters: published checkpoints load, trees stay in budget, greedy output is the target's, and the
drafter's KV rollback leaves what a fresh drafter would build."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from specdec.config import EngineConfig, SamplingParams
from specdec.drafters.base import DrafterContext
from specdec.drafters.eagle import DEFAULT_TREE, EagleDrafter, build_eagle
from specdec.drafters.heads.eagle_checkpoint import expected_shapes, load_eagle, published_tensors
from specdec.drafters.heads.eagle_model import EagleConfig
from specdec.drafters.model_drafter import ModelDrafter
from specdec.drafters.scored import FLAT_SCORE
from specdec.drafters.prefix_features import PrefixFeatureStore
from specdec.errors import ConfigError, ModelLoadError
from specdec.kernels import cpu as cpu_kernels
from specdec.kvcache import BlockTable
from specdec.models.dummy import DUMMY_SHAPES, dummy_config
from specdec.models.loader import LoadedModel
from specdec.models.split_input import SplitInputLinear
from specdec.engine.runner import Chunk, ModelRunner, Rows
from specdec.sampling import make_generator
from specdec.engine.sequence import Sequence
from specdec.tree.spec import TreeKind, chain, parse_tree_spec
from specdec.tree.token_tree import TokenTree
from specdec.training.eagle import init_predictor
from tests.helpers import run_all, tiny_engine, tiny_model

DYNAMIC = parse_tree_spec("dynamic:depth=4,topk=3,budget=7")


def random_predictor(target, version: int, seed: int = 0):
    """A predictor with random weights everywhere (no identity start), as a stand-in for a trained one."""
    draft_ids = torch.arange(0, target.config.vocab_size, 2) if version == 3 else None
    model = init_predictor(target, version, draft_ids, seed)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * (0.3 if p.ndim > 1 else 0.1) + (1.0 if p.ndim == 1 else 0))
    return model.eval().requires_grad_(False)


def feature_layers(version: int) -> tuple[int, ...]:
    return (1, 1, 0) if version == 3 else ()


# ------------------------------------------------------------------------------------------------- loaders
def published_checkpoint(folder, shape: str, version: int, fmt: str, draft_vocab: int = 96) -> dict:
    """Random tensors under the published names, shapes from a real config; returns them."""
    raw = dict(DUMMY_SHAPES[shape], num_hidden_layers=1)
    target = dummy_config(shape)
    if version == 3:
        raw = dict(raw, architectures=["LlamaForCausalLMEagle3"], draft_vocab_size=draft_vocab)
    config = EagleConfig(layer=target, version=version, fc_bias=version == 1,
                         draft_vocab=draft_vocab if version == 3 else 0, num_features=3 if version == 3 else 1)
    gen = torch.Generator().manual_seed(1)
    tensors = {k: torch.randn(s, generator=gen) for k, s in expected_shapes(config).items()}
    tensors["embed_tokens.weight"] = torch.randn(target.vocab_size, target.hidden_size)  # ignored, as published
    if version == 3:
        ids = torch.randperm(target.vocab_size, generator=gen)[:draft_vocab].sort().values
        tensors["d2t"] = ids - torch.arange(draft_vocab)
        tensors["t2d"] = torch.zeros(target.vocab_size, dtype=torch.bool)
        tensors["t2d"][ids] = True
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(raw))
    if fmt == "safetensors":
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"))
    else:
        torch.save(tensors, folder / "pytorch_model.bin")
    return tensors


@pytest.mark.parametrize("shape,fmt", [("tiny-llama", "safetensors"), ("tiny-qwen2", "bin")])
@pytest.mark.parametrize("version", [1, 3])
def test_loader_round_trips_a_published_checkpoint(tmp_path, shape, fmt, version):
    tensors = published_checkpoint(tmp_path, shape, version, fmt)
    model, _ = load_eagle(tmp_path, dummy_config(shape), torch.device("cpu"), torch.float32)
    assert model.config.version == version
    assert model.config.layer.qkv_bias == (shape == "tiny-qwen2")
    for name, tensor in published_tensors(model).items():
        torch.testing.assert_close(tensor, tensors[name], msg=name)
    if version == 3:
        expected = torch.arange(model.config.draft_vocab) + tensors["d2t"]
        assert torch.equal(model.draft_to_target, expected)
        assert bool(tensors["t2d"][model.draft_to_target].all())


@pytest.mark.parametrize("version", [1, 3])
def test_loader_rejects_bad_checkpoints_clearly(tmp_path, version):
    tensors = published_checkpoint(tmp_path / "ok", "tiny-llama", version, "safetensors")
    prefix = "midlayer." if version == 3 else "layers.0."
    bad = dict(tensors)
    bad[f"{prefix}mlp.down_proj.weight"] = torch.zeros(3, 3)
    folder = tmp_path / "shape"
    folder.mkdir()
    (folder / "config.json").write_text((tmp_path / "ok" / "config.json").read_text())
    save_file({k: v.contiguous() for k, v in bad.items()}, str(folder / "model.safetensors"))
    with pytest.raises(ModelLoadError, match="down_proj.weight has shape"):
        load_eagle(folder, dummy_config("tiny-llama"), torch.device("cpu"), torch.float32)
    del bad[f"{prefix}mlp.down_proj.weight"], bad["fc.weight"]
    save_file({k: v.contiguous() for k, v in bad.items()}, str(folder / "model.safetensors"))
    with pytest.raises(ModelLoadError, match="lacks"):
        load_eagle(folder, dummy_config("tiny-llama"), torch.device("cpu"), torch.float32)
    other = dummy_config("smollm2-135m")  # wrong hidden size for this checkpoint
    with pytest.raises(ConfigError, match="hidden_size"):
        load_eagle(tmp_path / "ok", other, torch.device("cpu"), torch.float32)
    with pytest.raises(ModelLoadError, match="no config.json"):
        load_eagle(tmp_path / "missing", other, torch.device("cpu"), torch.float32)


def test_spec_without_weights_for_another_target_is_a_config_error():
    model = tiny_model(seed=0, vocab=32)
    ctx = DrafterContext(LoadedModel(model, None, "dummy:tiny"), EngineConfig(), model.device, model.dtype, None)
    with pytest.raises(ConfigError, match="no eagle weights are shipped"):
        build_eagle({}, ctx, "eagle")


def test_wrong_version_is_a_config_error(tmp_path):
    from specdec.models.loader import build_model

    published_checkpoint(tmp_path, "tiny-llama", 3, "safetensors")

    model = build_model(dummy_config("tiny-llama"), None, torch.float32, torch.device("cpu"))
    ctx = DrafterContext(LoadedModel(model, None, "dummy:tiny-llama"), EngineConfig(), model.device, model.dtype, None)
    with pytest.raises(ConfigError, match="eagle3:"):
        build_eagle({"": str(tmp_path)}, ctx, "eagle")


@pytest.mark.skipif(not cpu_kernels.available(), reason="the int8 drafter linears need the compiled kernels")
@pytest.mark.parametrize("version,parts", [(1, 2), (3, 1)])
def test_int8_build_gives_each_input_stream_of_fc_its_own_linear(tmp_path, version, parts):
    """EAGLE-1/2's fc reads [embedding ; feature] (entries a hundredth of the feature's): with an int8 target
    each half becomes its own int8 linear (its own activation scale). EAGLE-3's fc stays one int8 linear (the
    cut measured no better, split_input.py)."""
    from specdec.models.loader import build_model

    published_checkpoint(tmp_path, "tiny-llama", version, "safetensors")
    model = build_model(dummy_config("tiny-llama"), None, torch.float32, torch.device("cpu"))
    ctx = DrafterContext(LoadedModel(model, None, "dummy:tiny-llama"), EngineConfig(), model.device, model.dtype,
                         "int8")
    fc = build_eagle({"": str(tmp_path)}, ctx, "eagle3" if version == 3 else "eagle").predictor.fc
    fc_parts = list(fc.parts) if isinstance(fc, SplitInputLinear) else [fc]
    assert len(fc_parts) == parts
    assert not any(isinstance(part, torch.nn.Linear) for part in fc_parts)  # each an int8 linear
    if parts > 1:
        assert fc.widths == (model.config.hidden_size,) * parts


# --------------------------------------------------------------------------------------------- drafting
@pytest.mark.parametrize("version", [1, 3])
@pytest.mark.parametrize("spec", [chain(4), DYNAMIC, parse_tree_spec("static:tree-8")], ids=["chain", "dynamic", "static"])
def test_trees_are_valid_and_within_budget_and_greedy_matches_plain(version, spec):
    target = tiny_model(seed=3, vocab=32, sharpness=3.0)
    prompts = [[1, 2, 3, 4, 5, 6], [7, 8, 9]]
    params = SamplingParams(max_new_tokens=24, ignore_eos=True)
    plain = tiny_engine(target, EagleDrafter(random_predictor(target, version), target, EngineConfig(),
                                             feature_layers=feature_layers(version)), chain(0))
    plain_seqs = [plain.add_request(p, params) for p in prompts]
    run_all(plain)
    drafter = EagleDrafter(random_predictor(target, version), target, EngineConfig(),
                           feature_layers=feature_layers(version))
    engine = tiny_engine(target, drafter, spec)
    trees = []
    engine.step_observers.append(lambda seq, tree, result: trees.append((seq.output_ids[-1:], tree)))
    seqs = [engine.add_request(p, params) for p in prompts]
    run_all(engine)
    assert trees
    for _, tree in trees:
        assert len(tree) <= spec.budget + 1
        assert int(tree.depth.max()) <= spec.depth
        assert tree.draft_probs is None  # greedy chains and top-k trees are one-hot proposals
    assert [s.output_ids for s in seqs] == [s.output_ids for s in plain_seqs]
    assert drafter.cache.num_free_blocks == drafter.cache.pool.num_blocks


@pytest.mark.parametrize("spec", [DYNAMIC, chain(3)], ids=["dynamic", "chain"])
def test_scored_proposals_carry_each_nodes_draft_probability(spec):
    """What a hybrid ranks EAGLE's nodes by: in a top-k tree, each node's draft probability given its parent
    (the root's children: the softmax of the root's draft logits); in a chain, which computes none, the flat
    score. The trees are the ones `propose` makes, so greedy output still equals plain decode's."""
    target = tiny_model(seed=3, vocab=32, sharpness=3.0)
    params = SamplingParams(max_new_tokens=16, ignore_eos=True)
    plain = tiny_engine(target, EagleDrafter(random_predictor(target, 1), target, EngineConfig()), chain(0))
    expected = plain.add_request([1, 2, 3, 4, 5, 6], params)
    run_all(plain)
    drafter = EagleDrafter(random_predictor(target, 1), target, EngineConfig())
    scored, roots = [], []
    real_logits = drafter._logits

    def logits(outputs):
        out = real_logits(outputs)
        roots.append(out)
        return out

    def propose(seqs, spec):
        roots.clear()
        made = ModelDrafter.propose_scored(drafter, seqs, spec)
        scored.append((made[0], roots[0] if roots else None))
        return [TokenTree.from_parents(tree.tokens, tree.parents) for tree in made]

    drafter._logits, drafter.propose = logits, propose
    engine = tiny_engine(target, drafter, spec, adaptive_speculation=False)
    seq = engine.add_request([1, 2, 3, 4, 5, 6], params)
    run_all(engine)
    assert seq.output_ids == expected.output_ids and scored
    for tree, (root_logits, ids) in scored:
        assert tree.scores[0] == 0.0 and len(tree.scores) == len(tree.tokens)
        if spec.kind is TreeKind.CHAIN:
            assert tree.scores[1:] == [FLAT_SCORE] * (len(tree.tokens) - 1)
            continue
        probs = torch.softmax(root_logits[0].float(), dim=-1)
        draft_id = {int(t): i for i, t in enumerate(ids)} if ids is not None else None
        for node, (token, parent) in enumerate(zip(tree.tokens, tree.parents)):
            siblings = [tree.scores[i] for i, p in enumerate(tree.parents) if p == parent and i]
            assert node == 0 or (0.0 < tree.scores[node] <= 1.0 and sum(siblings) <= 1.0 + 1e-5)
            if parent == 0:
                index = draft_id[token] if draft_id is not None else token
                assert tree.scores[node] == pytest.approx(float(probs[index]), rel=1e-4)


def test_sampled_chains_carry_their_draft_distribution():
    target = tiny_model(seed=4, vocab=32)
    drafter = EagleDrafter(random_predictor(target, 3), target, EngineConfig(), feature_layers=feature_layers(3))
    engine = tiny_engine(target, drafter, chain(3))
    trees = []
    engine.step_observers.append(lambda seq, tree, result: trees.append(tree))
    engine.add_request([1, 2, 3], SamplingParams(max_new_tokens=12, temperature=0.9, seed=5, ignore_eos=True))
    run_all(engine)
    for tree in trees:
        probs = tree.draft_probs
        assert probs is not None and probs.shape == (4, 32)
        torch.testing.assert_close(probs[1:].sum(-1), torch.ones(3))
        odd = probs[1:, 1::2]  # the draft vocabulary of `random_predictor` holds even ids only
        assert float(odd.abs().sum()) == 0.0
        assert all(int(t) % 2 == 0 for t in tree.tokens[1:])


@pytest.mark.parametrize("version", [1, 3])
@pytest.mark.parametrize("shared_prefix", [False, "stored", "recomputed"])
def test_kv_rollback_matches_a_fresh_drafter(version, shared_prefix):
    """After several verify/commit steps (and, with a prefix-cache hit, features the drafter kept from the first
    request or had to recompute), the drafter's cache and proposals equal those of a fresh drafter given the
    committed prefix at once."""
    target = tiny_model(seed=5, vocab=32, sharpness=3.0)
    predictor = random_predictor(target, version, seed=2)
    layers = feature_layers(version)
    drafter = EagleDrafter(predictor, target, EngineConfig(), feature_layers=layers)
    engine = tiny_engine(target, drafter, DYNAMIC, adaptive_speculation=False)
    prompt = [3, 1, 4, 1, 5, 9, 2]
    if shared_prefix:  # a first request leaves a full 16-token block of its prompt in the prefix cache
        prompt = [(7 * i) % 32 for i in range(20)]
        engine.add_request(prompt[:18], SamplingParams(max_new_tokens=2, ignore_eos=True))
        run_all(engine)
        assert len(drafter.prefix_features) == 1
        if shared_prefix == "recomputed":  # the store lost the block: a dense forward over the prefix instead
            drafter.prefix_features = PrefixFeatureStore(16, 8)
    seq = engine.add_request(prompt, SamplingParams(max_new_tokens=40, ignore_eos=True))
    for _ in range(7):
        engine.step()
    assert seq.metrics.cached_prompt_tokens == (16 if shared_prefix else 0)
    assert not seq.is_finished and len(seq.output_ids) > 6
    tree = drafter.propose([seq], DYNAMIC)[0]

    fresh = EagleDrafter(predictor, target, EngineConfig(), feature_layers=layers)
    copy = Sequence(99, list(seq.prompt_ids), seq.params, make_generator(None, torch.device("cpu")))
    copy.output_ids = list(seq.output_ids)
    ids = copy.token_ids[:-1]
    features = ModelRunner.create(target, 64, 16).run([Chunk(BlockTable(), ids, list(range(len(ids))), None, Rows.NONE)],
                                                     return_hidden=True, capture_layers=layers)[0].hidden
    fresh.observe_prefill(copy, 0, features)
    again = fresh.propose([copy], DYNAMIC)[0]

    assert tree.tokens.tolist() == again.tokens.tolist()
    assert tree.parents.tolist() == again.parents.tolist()
    mine, theirs = drafter.table(seq), fresh.table(copy)
    assert mine.length == theirs.length == seq.num_tokens - 1
    for a, b in zip(drafter.cache.gather(mine, 0), fresh.cache.gather(theirs, 0)):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


# ---------------------------------------------------------------------------------- the shipped predictor
@pytest.mark.parametrize("tree", ["chain:k=4", "dynamic:depth=4,topk=4,budget=10"])
def test_shipped_eagle_greedy_equals_plain_on_the_default_model(default_model, tree):
    from specdec.api import LLM
    from specdec.drafters.eagle import shipped_eagle_dir
    from tests.engine.greedy_check import assert_same_or_near_tie

    assert shipped_eagle_dir(default_model.source) is not None, "no EAGLE weights shipped for the default model"
    # Without the adaptive planner every step drafts, so the acceptance check below measures the predictor.
    llm = LLM.from_loaded(default_model, engine_config=EngineConfig(kv_cache_tokens=4096, adaptive_speculation=False))
    prompts = ["Explain how photosynthesis works.", "Write a Python function that reverses a string."]
    params = SamplingParams(max_new_tokens=24, ignore_eos=True)
    plain = [o.token_ids for o in llm.generate(prompts, params)]
    llm.use("eagle", tree)
    outs = llm.generate(prompts, params)
    taus = [o.metrics.mean_accepted_tokens for o in outs]
    for prompt, base, out in zip(prompts, plain, outs):
        assert len(out.token_ids) == 24
        assert_same_or_near_tie(llm, prompt, base, out.token_ids)
        llm.use("eagle", tree)
    assert sum(taus) / len(taus) > 1.15, f"the shipped predictor should get drafts accepted (tau {taus})"
    cache = llm.engine.drafter.cache
    assert cache.num_free_blocks == cache.pool.num_blocks


def test_default_tree_is_dynamic_and_fits():
    assert DEFAULT_TREE.kind is TreeKind.DYNAMIC and DEFAULT_TREE.max_nodes <= EngineConfig().max_tree_nodes
