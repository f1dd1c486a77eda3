"""Medusa self-distillation: labels line up with the heads' offsets, the loss falls, a run writes heads the
drafter loads, resume restores the checkpoint, and trees follow the measured accuracy."""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

from specdec.drafters.heads.medusa_heads import MedusaHeads, load_heads, save_heads
from specdec.errors import ConfigError
from specdec.models.loader import LoadedModel
from specdec.training.common import Corpus, TrainSettings, save_atomic
from specdec.training.medusa import (
    HeadFeatures, MedusaConfig, head_accuracy, head_batch, head_features, head_losses, best_choice_paths,
    in_draft_ids, run_medusa, train_heads,
)
from tests.helpers import NoTokenizer, tiny_model

VOCAB = 16


def tiny_corpus(n: int = 12, seed: int = 0) -> Corpus:
    """Answers that follow a rule the heads can learn (each token is the previous one + 1, mod VOCAB)."""
    gen = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, VOCAB, (4,), generator=gen).tolist() for _ in range(n)]
    answers = [[(p[-1] + 1 + i) % VOCAB for i in range(10)] for p in prompts]
    return Corpus(prompts, answers)


def test_labels_are_the_tokens_two_and_more_ahead():
    feats = HeadFeatures(hidden=[torch.zeros(4, 8)], labels=[torch.tensor([10, 11, 12, 13])])
    rows, labels = head_batch(feats, [0], num_heads=2, device=torch.device("cpu"))
    assert rows.shape == (4, 8)
    # row 0 is the last prompt position: the target's head gives answer[0]; Medusa head k gives answer[k + 1]
    assert labels.tolist() == [[11, 12], [12, 13], [13, -100], [-100, -100]]


def test_loss_falls_within_a_few_steps(tmp_path):
    model = tiny_model(0, vocab=VOCAB, sharpness=3.0)
    corpus = tiny_corpus()
    feats = head_features(model, corpus)
    c = model.config
    heads = MedusaHeads(3, 1, c.hidden_size, c.vocab_size, model.lm_head)
    for p in model.parameters():
        p.requires_grad_(False)
    everything = list(range(len(corpus.prompt_ids)))
    rows, labels = head_batch(feats, everything, 3, torch.device("cpu"))
    before = head_losses(heads, rows, labels).detach()
    s = TrainSettings(steps=30, batch_size=4, lr=3e-2, warmup=2, checkpoint_every=10)
    state = train_heads(heads, feats, everything[:-2], everything[-2:], s, tmp_path / "ckpt.pt")
    after = head_losses(heads, rows, labels).detach()
    assert state.step == 30 and len(state.history) == 3
    assert (after < 0.7 * before).all(), (before, after)
    assert not heads.weight.requires_grad and model.lm_head.weight.grad is None  # the target stays frozen


def tiny_run(tmp_path, **settings) -> tuple:
    """A tiny target, loaded, and a run config over a saved tiny corpus (`settings` override the defaults)."""
    model = tiny_model(1, vocab=VOCAB, sharpness=3.0)
    corpus_path = tmp_path / "corpus.pt"
    save_atomic(vars(tiny_corpus()), corpus_path)
    cfg = MedusaConfig(**{"target": "dummy:tiny", "corpus": str(corpus_path), "heads": 2, "steps": 6,
                          "batch_size": 4, "lr": 1e-2, "val_prompts": 2, **settings})
    return model, LoadedModel(model, NoTokenizer(), "dummy:tiny"), cfg


def test_a_run_writes_heads_that_load_and_resume_restores_them(tmp_path):
    model, loaded, cfg = tiny_run(tmp_path)
    heads, meta = run_medusa(cfg, tmp_path / "run", loaded=loaded, log=lambda _: None)
    assert meta["corpus"]["answers"] == 12 and len(meta["heldout_accuracy"]) == 2
    assert heads.weight.abs().sum() > 0
    save_heads(heads, tmp_path / "heads", dtype=torch.float32)
    again = load_heads(tmp_path / "heads", model.config.hidden_size, VOCAB, model.lm_head)
    hidden = torch.randn(3, model.config.hidden_size)
    torch.testing.assert_close(again(hidden), heads(hidden))
    resumed, _ = run_medusa(cfg, tmp_path / "run", resume=True, loaded=loaded, log=lambda _: None)
    torch.testing.assert_close(resumed.weight, heads.weight)
    with pytest.raises(ConfigError, match="already holds a run"):
        run_medusa(cfg, tmp_path / "run", loaded=loaded, log=lambda _: None)


def test_reduced_vocabulary_labels_are_draft_ids_and_outside_tokens_count_as_misses():
    feats = HeadFeatures(hidden=[torch.zeros(4, 8)], labels=[torch.tensor([10, 11, 12, 13])])
    mapped = in_draft_ids(feats, torch.tensor([3, 11, 13]), VOCAB)
    assert mapped.labels[0].tolist() == [-1, 1, -1, 2]  # 11 -> draft id 1, 13 -> 2, the rest outside
    _, labels = head_batch(mapped, [0], num_heads=2, device=torch.device("cpu"))
    assert labels.tolist() == [[1, -1], [-1, 2], [2, -100], [-100, -100]]

    model = tiny_model(2, vocab=VOCAB, sharpness=3.0)
    ids = torch.tensor([1, 2, 3, 5, 8])
    from specdec.drafters.heads.reduced_vocab import reduced_from

    heads = MedusaHeads(1, 1, model.config.hidden_size, VOCAB, reduced_from(model, ids))
    rows = torch.randn(6, model.config.hidden_size)
    assert heads(rows).shape == (6, 1, 5)
    inside, outside = torch.tensor([[0], [4], [2]]), torch.tensor([[-1], [-1], [-1]])
    # a label outside the draft vocabulary adds nothing to the loss (a head that cannot propose it is not
    # pushed anywhere by it) ...
    torch.testing.assert_close(head_losses(heads, rows[:3], inside), head_losses(
        heads, rows, torch.cat([inside, outside])))
    # ... but is a miss for the accuracy: with every head's top-5 being the whole draft vocabulary, exactly the
    # labels inside it are hits
    hidden = [torch.randn(4, model.config.hidden_size)]
    feats = in_draft_ids(HeadFeatures(hidden=hidden, labels=[torch.tensor([0, 2, 7, 8])]), ids, VOCAB)
    acc = head_accuracy(heads, feats, [0], topk=5)
    assert sum(acc[0]) == pytest.approx(2 / 3)  # rows 0 .. 2 have labels 2 (inside), 7 (outside), 8 (inside)


def test_a_run_with_a_reduced_vocabulary_records_it_and_the_drafter_defaults_to_it(tmp_path):
    from specdec.drafters.heads.reduced_vocab import recorded_draft_vocab

    model, loaded, cfg = tiny_run(tmp_path, steps=4, vocab=6)
    heads, meta = run_medusa(cfg, tmp_path / "run", loaded=loaded, log=lambda _: None)
    assert meta["draft_vocab"] == 6 and "--vocab 6" in cfg.command(tmp_path / "run", None)
    assert heads(torch.randn(2, model.config.hidden_size)).shape == (2, 2, 6)
    meta_name = "specdec_medusa.json"
    assert recorded_draft_vocab(tmp_path, meta_name) == 0  # no metadata: the full vocabulary
    (tmp_path / meta_name).write_text('{"draft_vocab": 6}')
    assert recorded_draft_vocab(tmp_path, meta_name) == 6
    assert recorded_draft_vocab(tmp_path / "medusa_lm_head.safetensors", meta_name) == 6
    (tmp_path / meta_name).write_text('{"draft_vocab": "many"}')
    with pytest.raises(ConfigError, match="not a readable drafter metadata file"):
        recorded_draft_vocab(tmp_path, meta_name)
    with pytest.raises(ConfigError, match="--vocab must be"):
        run_medusa(MedusaConfig(target="dummy:tiny", corpus=cfg.corpus, vocab=VOCAB + 1), tmp_path / "r2",
                   loaded=loaded, log=lambda _: None)
    assert not (tmp_path / "r2").exists()  # refused before the run folder is made: the same --out works next time


def test_optimal_tree_follows_the_accuracy_table():
    acc = [[0.6, 0.2, 0.1], [0.5, 0.1, 0.05]]
    choices, tau = best_choice_paths(acc, 3)
    # values: (0,) .6, (0,0) .3, (1,) .2, (0,1) .06, (2,) .1
    assert choices == [(0,), (1,), (0, 0)]
    assert tau == pytest.approx(1 + 0.6 + 0.3 + 0.2)


def test_cli_reports_a_missing_corpus_in_one_line(tmp_path):
    from specdec.cli.train import train_app

    result = CliRunner().invoke(train_app, ["medusa", "--target", "dummy:tiny-llama", "--corpus",
                                            str(tmp_path / "missing.pt"), "--out", str(tmp_path / "run")])
    assert result.exit_code == 2
    assert "does not exist" in result.output
