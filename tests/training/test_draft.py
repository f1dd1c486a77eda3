"""Self-distillation of a draft model: the loss falls, a resumed run equals an uninterrupted one, and a
layers-only draft folder loads on top of its target (or fails naming what is wrong)."""

from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import load_file, save_file

from specdec.config import SamplingParams
from specdec.drafters.heads.draft_folder import is_draft_folder, load_draft_folder, write_draft_folder
from specdec.errors import ConfigError, ModelLoadError
from specdec.models.loader import LoadedModel, load_model
from specdec.models.dense import dense_forward
from specdec.training.common import Corpus, TrainSettings, load_train_state, teacher_topk
from specdec.training.draft import (
    DistillConfig, evaluate, init_draft, run_distillation, trainable_parameters, train_draft,
)
from tests.helpers import NoTokenizer, skip_unless_ci, tiny_model

VOCAB = 16


def tiny_corpus(n: int = 12, seed: int = 0) -> Corpus:
    gen = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, VOCAB, (int(torch.randint(3, 7, (1,), generator=gen)),), generator=gen).tolist()
               for _ in range(n)]
    answers = [torch.randint(0, VOCAB, (8,), generator=gen).tolist() for _ in range(n)]
    return Corpus(prompts, answers)


def strong_tiny_target() -> torch.nn.Module:
    """A tiny random target whose layers matter (tiny_model's 0.02-scale layers barely change its output)."""
    target = tiny_model(0, vocab=VOCAB, sharpness=3.0)
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, p in target.layers.named_parameters():
            if not name.endswith("norm.weight"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    return target


@pytest.fixture
def tiny_run(tmp_path):
    target = strong_tiny_target()
    corpus = tiny_corpus()
    teacher = teacher_topk(target, corpus, topk=4, path=tmp_path / "teacher.pt")
    return target, corpus, teacher


def test_dense_forward_matches_the_engine_forward():
    from specdec.kvcache import BlockTable
    from specdec.engine.runner import Chunk, ModelRunner, Rows

    model = tiny_model(1, vocab=VOCAB)
    ids = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(0))
    dense = model.lm_head(dense_forward(model, ids))
    runner = ModelRunner.create(model, 16, 4)
    for b in range(2):
        out = runner.run([Chunk(BlockTable(), ids[b].tolist(), list(range(9)), None, Rows.ALL)])[0]
        torch.testing.assert_close(out.logits, dense[b], atol=1e-5, rtol=1e-5)


def test_training_loss_falls_on_a_tiny_target(tiny_run, tmp_path):
    target, corpus, teacher = tiny_run
    draft = init_draft(target, layers=1)
    everything = list(range(len(corpus.response_ids)))
    before = evaluate(draft, corpus, teacher, everything)["val_kl"]
    settings = TrainSettings(steps=30, batch_size=4, lr=1e-2, warmup=3, checkpoint_every=10)
    train_draft(draft, corpus, teacher, everything, everything, settings, tmp_path / "ckpt.pt")
    after = evaluate(draft, corpus, teacher, everything)["val_kl"]
    assert after < 0.5 * before, (before, after)
    # the shared embedding and LM head are the target's and were not trained
    assert draft.embed_tokens is target.embed_tokens and draft.lm_head is target.lm_head
    assert not any(p.requires_grad for p in target.parameters())


def test_resumed_training_equals_uninterrupted_training(tiny_run, tmp_path):
    target, corpus, teacher = tiny_run
    train, val = list(range(10)), [10, 11]
    settings = TrainSettings(steps=6, batch_size=4, lr=1e-2, warmup=2, checkpoint_every=3)

    straight = init_draft(target, layers=1)
    train_draft(straight, corpus, teacher, train, val, settings, tmp_path / "a.pt")

    class Interrupted(Exception):
        pass

    def stop_after_first_checkpoint(stage, done, total, fields):
        if done == 3:
            raise Interrupted

    interrupted = init_draft(target, layers=1)
    with pytest.raises(Interrupted):
        train_draft(interrupted, corpus, teacher, train, val, settings, tmp_path / "b.pt",
                    progress=stop_after_first_checkpoint)
    state = load_train_state(tmp_path / "b.pt")
    assert state.step == 3
    resumed = init_draft(target, layers=1)  # fresh weights: everything must come from the checkpoint
    train_draft(resumed, corpus, teacher, train, val, settings, tmp_path / "b.pt", state)
    for name, p in trainable_parameters(straight).items():
        assert torch.equal(p, trainable_parameters(resumed)[name]), name


def _folder(tmp_path, target):
    draft = init_draft(target, layers=1)
    folder = tmp_path / "draft"
    write_draft_folder(draft, folder, {"target": "tiny"}, dtype=torch.float32)
    return draft, folder


def test_a_written_folder_loads_on_the_target_and_computes_the_same_logits(tmp_path):
    target = tiny_model(0, vocab=VOCAB)
    draft, folder = _folder(tmp_path, target)
    assert is_draft_folder(folder)
    loaded = load_draft_folder(folder, LoadedModel(target, NoTokenizer(), "tiny"))
    assert loaded.embed_tokens is target.embed_tokens and loaded.config.num_layers == 1
    ids = torch.arange(VOCAB)[None]
    torch.testing.assert_close(loaded.lm_head(dense_forward(loaded, ids)), draft.lm_head(dense_forward(draft, ids)))


def test_a_folder_missing_a_tensor_is_refused_naming_the_file_and_tensor(tmp_path):
    target = tiny_model(0, vocab=VOCAB)
    _, folder = _folder(tmp_path, target)
    weights = load_file(str(folder / "model.safetensors"))
    del weights["model.layers.0.mlp.down_proj.weight"]
    save_file(weights, str(folder / "model.safetensors"))
    with pytest.raises(ModelLoadError, match=r"model\.safetensors.*model\.layers\.0\.mlp\.down_proj\.weight"):
        load_draft_folder(folder, LoadedModel(target, NoTokenizer(), "tiny"))


def test_a_folder_for_another_hidden_size_is_refused_naming_the_config(tmp_path):
    target = tiny_model(0, vocab=VOCAB)
    _, folder = _folder(tmp_path, target)
    config = json.loads((folder / "config.json").read_text())
    config["hidden_size"] = 48
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match=r"config\.json: hidden_size is 48, but the target's is 32"):
        load_draft_folder(folder, LoadedModel(target, NoTokenizer(), "tiny"))


def test_int8_draft_leaves_the_targets_embedding_and_head_alone(tmp_path):
    from specdec.drafters.base import DrafterContext
    from specdec.drafters.draft_model import _layers_only_draft
    from specdec.config import EngineConfig
    from specdec.models.quant import Int8DynamicLinear, quantize_int8_

    target = tiny_model(0, vocab=VOCAB)
    _, folder = _folder(tmp_path, target)
    quantize_int8_(target)
    embedding = target.embed_tokens.weight.clone()
    head = target.lm_head
    ctx = DrafterContext(LoadedModel(target, NoTokenizer(), "tiny"), EngineConfig(), target.device, target.dtype, "int8")
    draft = _layers_only_draft(folder, ctx)
    # the draft's own linears take the target's int8 kernels where they are built (fbgemm's elsewhere)
    from specdec.kernels import cpu
    from specdec.models.qlinear import QLinear

    assert isinstance(draft.layers[0].mlp.down_proj, QLinear if cpu.available() else Int8DynamicLinear)
    assert draft.lm_head is head and target.lm_head is head
    assert torch.equal(target.embed_tokens.weight, embedding)


def test_a_whole_run_on_a_dummy_target_writes_a_draft_the_engine_can_use(tmp_path):
    from specdec.api import LLM

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"prompt number {i} " * 2}) + "\n" for i in range(10)))
    loaded = load_model("dummy:tiny-llama", show_progress=False)
    cfg = DistillConfig(target="dummy:tiny-llama", prompts=str(prompts), layers=1, max_prompts=10, new_tokens=6,
                        steps=3, batch_size=4, val_prompts=2)
    meta = run_distillation(cfg, tmp_path / "run", loaded=loaded, log=lambda _: None)
    assert meta["corpus"]["prompts"] == 10 and len(meta["history"]) == 2  # step 0 and the last checkpoint
    with pytest.raises(ConfigError, match="--resume"):
        run_distillation(cfg, tmp_path / "run", loaded=loaded, log=lambda _: None)
    with pytest.raises(ConfigError, match="steps"):
        run_distillation(DistillConfig(**{**cfg.__dict__, "steps": 5}), tmp_path / "run", resume=True, loaded=loaded,
                         log=lambda _: None)
    again = run_distillation(cfg, tmp_path / "run", resume=True, loaded=loaded, log=lambda _: None)
    assert again["final"] == meta["final"]
    # another run on the same answers (`--corpus`): nothing generated again, the source recorded
    reused = DistillConfig(**{**cfg.__dict__, "prompts": None, "corpus": str(tmp_path / "run" / "corpus.pt")})
    other = run_distillation(reused, tmp_path / "run2", loaded=loaded, log=lambda _: None)
    assert other["corpus"]["generated_tokens"] == meta["corpus"]["generated_tokens"]
    assert other["seconds"]["generate"] == 0.0 and f"--corpus {reused.corpus}" in other["command"]

    params = SamplingParams(max_new_tokens=8)
    plain = LLM.from_loaded(loaded).generate(["hello"], params, chat=False)[0].token_ids
    llm = LLM.from_loaded(loaded, drafter=f"draft:{tmp_path / 'run' / 'draft'}", tree="chain:k=3")
    assert llm.drafter.runner.model.config.num_layers == 1
    assert llm.generate(["hello"], params, chat=False)[0].token_ids == plain


@pytest.mark.slow
def test_plain_draft_uses_the_shipped_distilled_draft_for_the_default_model(default_model):
    from specdec.api import LLM
    from specdec.drafters.heads.draft_folder import shipped_draft_dir

    if shipped_draft_dir("smollm2-135m") is None:
        skip_unless_ci("no shipped draft for smollm2-135m in this checkout")
    assert shipped_draft_dir(default_model.source) == shipped_draft_dir("smollm2-135m")
    llm = LLM.from_loaded(default_model, drafter="draft", tree="chain:k=4")
    runner = llm.drafter.runner
    assert runner.num_layers is None and runner.model.config.num_layers == 2
    assert runner.model.embed_tokens is default_model.model.embed_tokens
    early = LLM.from_loaded(default_model, drafter="draft:layers=6", tree="chain:k=4")
    assert early.drafter.runner.num_layers == 6


def test_coarse_kl_over_a_reduced_head_is_the_kl_of_the_coarsened_distributions():
    """Top-k tokens outside the head join the rest bucket; with every token inside it is the full-head KL."""
    from specdec.drafters.heads.reduced_vocab import target_to_draft
    from specdec.training.draft import coarse_kl

    gen = torch.Generator().manual_seed(0)
    logits, teacher = torch.randn(5, 40, generator=gen), torch.randn(5, 40, generator=gen).log_softmax(-1)
    logp, ids = teacher.topk(8)
    assert torch.allclose(coarse_kl(logits, ids, logp, target_to_draft(torch.arange(40), 40)),
                          coarse_kl(logits, ids, logp))
    kept = torch.arange(0, 40, 3)
    got = coarse_kl(logits[:, kept], ids, logp, target_to_draft(kept, 40))
    for r in range(5):
        q = logits[r, kept].softmax(-1).double()
        inside = [(j, lp) for j, lp in zip(ids[r].tolist(), logp[r].double().tolist()) if j % 3 == 0]
        p_in = sum(math.exp(lp) for _, lp in inside)
        q_in = sum(float(q[j // 3]) for j, _ in inside)
        want = sum(math.exp(lp) * (lp - math.log(q[j // 3])) for j, lp in inside)
        want += (1 - p_in) * (math.log(1 - p_in) - math.log(1 - q_in))
        assert abs(float(got[r]) - want) < 1e-4, (r, float(got[r]), want)


def test_a_run_over_a_reduced_vocabulary_writes_a_draft_that_drafts_over_it(tmp_path):
    from specdec.api import LLM

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"prompt number {i} " * 2}) + "\n" for i in range(10)))
    loaded = load_model("dummy:tiny-llama", show_progress=False)
    cfg = DistillConfig(target="dummy:tiny-llama", prompts=str(prompts), layers=1, max_prompts=10, new_tokens=6,
                        steps=2, batch_size=4, val_prompts=2, vocab=24)
    meta = run_distillation(cfg, tmp_path / "run", loaded=loaded, log=lambda _: None)
    ids = meta["draft_ids"]
    assert meta["draft_vocab"] == 24 and len(ids) == 24 and ids == sorted(set(ids)) and "--vocab 24" in meta["command"]
    folder = tmp_path / "run" / "draft"
    assert json.loads((folder / "specdec_draft.json").read_text())["draft_ids"] == ids
    params = SamplingParams(max_new_tokens=8)
    plain = LLM.from_loaded(loaded).generate(["hello"], params, chat=False)[0].token_ids
    llm = LLM.from_loaded(loaded, drafter=f"draft:{folder}", tree="chain:k=3")
    assert llm.drafter.ids.tolist() == ids  # the folder's own vocabulary, though no ranking ships for the target
    assert llm.generate(["hello"], params, chat=False)[0].token_ids == plain
    with pytest.raises(ConfigError, match="vocab"):
        run_distillation(DistillConfig(**{**cfg.__dict__, "vocab": 10 ** 9}), tmp_path / "run3", loaded=loaded,
                         log=lambda _: None)
    meta_file = folder / "specdec_draft.json"
    meta_file.write_text(json.dumps({**json.loads(meta_file.read_text()), "draft_ids": [10 ** 9] * 24}))
    with pytest.raises(ConfigError, match=r"specdec_draft\.json is not a readable.*draft_ids must be target ids"):
        LLM.from_loaded(loaded, drafter=f"draft:{folder}", tree="chain:k=3")


def test_the_teacher_keeps_each_sequence_in_storage_of_its_own(tiny_run):
    """A view of the batch's top-k would drag the whole batch into the file once per sequence."""
    _, corpus, teacher = tiny_run
    assert len(teacher.logp) == len(corpus.response_ids)
    for logp, ids in zip(teacher.logp, teacher.ids):
        assert logp.untyped_storage().nbytes() == logp.numel() * logp.element_size()
        assert ids.untyped_storage().nbytes() == ids.numel() * ids.element_size()
