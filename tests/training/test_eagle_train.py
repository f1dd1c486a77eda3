"""EAGLE training: the losses fall on a tiny model, the unrolled attention masks are the draft-time ones, and
what the trainer writes (ours and the published layout) loads back as the same predictor."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from specdec.drafters.heads.eagle_checkpoint import load_eagle
from specdec.training.common import Corpus, TrainSettings
from specdec.training import eagle
from specdec.training.eagle import (EagleData, choose_draft_vocab, eagle_loss, evaluate, init_predictor, record,
                                    record_in_shards, train_predictor, ttt_mask)
from tests.helpers import tiny_model

VOCAB = 32


def tiny_corpus() -> Corpus:
    """24 short sequences that follow simple, learnable patterns."""
    gen = torch.Generator().manual_seed(0)
    prompts, answers = [], []
    for _ in range(24):
        start, step = torch.randint(0, VOCAB, (2,), generator=gen).tolist()
        seq = [(start + i * (step % 5 + 1)) % VOCAB for i in range(18)]
        prompts.append(seq[:6])
        answers.append(seq[6:])
    return Corpus(prompts, answers)


def tiny_data(version: int) -> tuple[torch.nn.Module, EagleData]:
    """A tiny target and its features over the tiny corpus."""
    target = tiny_model(seed=7, vocab=VOCAB, sharpness=3.0)
    corpus = tiny_corpus()
    recorded = record(target, corpus, version)
    ids = [torch.tensor(p + a) for p, a in zip(corpus.prompt_ids, corpus.response_ids)]
    return target, EagleData(ids, recorded.get("features") or recorded["hidden"], recorded["hidden"],
                             recorded["labels"])


@pytest.mark.parametrize("version", [1, 3])
def test_training_loss_falls_on_a_tiny_model(tmp_path: Path, version: int):
    torch.manual_seed(0)
    target, data = tiny_data(version)
    draft_ids = choose_draft_vocab(data.labels, 24, VOCAB) if version == 3 else None
    model = init_predictor(target, version, draft_ids, seed=0)
    train, val = list(range(20)), list(range(20, 24))
    before = evaluate(model, target, data, train, ttt_steps=2)["val_loss"]
    settings = TrainSettings(steps=40, batch_size=4, lr=3e-3, warmup=5, checkpoint_every=20)
    state = train_predictor(model, target, data, train, val, settings, 2, tmp_path / "ckpt.pt")
    after = evaluate(model, target, data, train, ttt_steps=2)["val_loss"]
    assert state.step == 40 and [h["step"] for h in state.history] == [20, 40]
    assert after < 0.7 * before, f"loss {before:.3f} -> {after:.3f}"


def test_resume_continues_the_same_run(tmp_path: Path):
    target, data = tiny_data(1)
    train, val = list(range(20)), list(range(20, 24))
    settings = TrainSettings(steps=6, batch_size=4, lr=3e-3, warmup=2, checkpoint_every=3)
    whole = init_predictor(target, 1, seed=0)
    train_predictor(whole, target, data, train, val, settings, 1, tmp_path / "a.pt")
    half = init_predictor(target, 1, seed=0)
    state = train_predictor(half, target, data, train, val, TrainSettings(**{**settings.__dict__, "steps": 3}), 1,
                            tmp_path / "b.pt")
    resumed = init_predictor(target, 1, seed=0)
    train_predictor(resumed, target, data, train, val, settings, 1, tmp_path / "b.pt", state)
    for (name, a), b in zip(whole.state_dict().items(), resumed.state_dict().values()):
        torch.testing.assert_close(a, b, msg=name)


@pytest.mark.parametrize("version", [1, 3])
def test_features_recorded_in_slices_resume_where_they_stopped(tmp_path: Path, monkeypatch, version: int):
    """Slices already on disk are read, not recorded again, and the merged features equal one whole pass."""
    target, corpus = tiny_model(seed=7, vocab=VOCAB, sharpness=3.0), tiny_corpus()
    whole = record(target, corpus, version)
    monkeypatch.setattr(eagle, "SHARD_SEQUENCES", 10)
    record_in_shards(target, corpus, version, False, tmp_path, resume=False)
    slices = sorted(p.name for p in (tmp_path / eagle.FEATURES_DIR).iterdir())
    assert slices == ["000000-000010.pt", "000010-000020.pt", "000020-000024.pt"]
    (tmp_path / eagle.FEATURES_DIR / slices[1]).unlink()  # interrupted before the second slice was saved
    recorded_sizes = []
    real_record = eagle.record
    monkeypatch.setattr(eagle, "record", lambda t, part, *a: recorded_sizes.append(len(part.response_ids))
                        or real_record(t, part, *a))
    resumed = record_in_shards(target, corpus, version, False, tmp_path, resume=True)
    assert recorded_sizes == [10]
    assert resumed["layers"] == whole["layers"]
    for key in ("hidden", "labels", "features"):
        assert len(resumed.get(key, [])) == len(whole.get(key, []))
        for a, b in zip(resumed.get(key, []), whole.get(key, [])):
            torch.testing.assert_close(a, b, msg=key)


def test_ttt_mask_sees_the_committed_prefix_and_its_own_chain():
    mask = ttt_mask(6, 2)  # query t at unrolled step 2 (draft depth 3)
    assert mask.shape == (6, 18)
    t = 4
    assert mask[t, :6].nonzero().flatten().tolist() == [0, 1, 2]  # step-0 (target-feature) keys <= t-2
    assert mask[t, 6:12].nonzero().flatten().tolist() == [3]  # step 1 of its chain, at t-1
    assert mask[t, 12:].nonzero().flatten().tolist() == [4]  # itself
    assert bool(mask.any(-1).all())  # every query sees at least itself: no empty softmax


def test_eagle3_soft_labels_are_the_target_distribution_after_the_next_token():
    """Each pair's soft label is a distribution over the draft vocabulary whose argmax is the recorded hard
    label wherever that label is in the draft vocabulary: the same position, the same target."""
    from specdec.training.eagle import _soft_labels

    target, data = tiny_data(3)
    draft_ids = choose_draft_vocab(data.labels, 24, VOCAB)
    model = init_predictor(target, 3, draft_ids, seed=0)
    batch = [0, 1, 2]
    t = max(data.ids[i].shape[0] for i in batch) - 1
    soft = _soft_labels(model, target, data, batch, len(batch), t)
    assert soft is not None and soft.shape == (len(batch) * t, 24)
    torch.testing.assert_close(soft.sum(-1), torch.ones(len(batch) * t))
    for row, i in enumerate(batch):
        labels = data.labels[i][1:]
        for pos, label in enumerate(labels.tolist()):
            if label in draft_ids.tolist():
                assert int(draft_ids[soft[row * t + pos].argmax()]) == label
    hard = EagleData(data.ids, data.features, [], data.labels)  # features recorded before soft labels
    assert _soft_labels(model, target, hard, batch, len(batch), t) is None
    assert torch.isfinite(eagle_loss(model, target, hard, batch, 2)[0])


@pytest.mark.parametrize("version", [1, 3])
def test_written_checkpoints_load_back(tmp_path: Path, version: int):
    from specdec.drafters.heads.eagle_checkpoint import write_eagle

    target, data = tiny_data(version)
    draft_ids = choose_draft_vocab(data.labels, 24, VOCAB) if version == 3 else None
    model = init_predictor(target, version, draft_ids, seed=1)
    write_eagle(model, tmp_path / "ours", {"version": version}, dtype=torch.float32)
    write_eagle(model, tmp_path / "published", {}, published=True)
    assert (tmp_path / "published" / "pytorch_model.bin").is_file()
    for folder, tol in (("ours", 0.0), ("published", 2e-3)):
        loaded, meta = load_eagle(tmp_path / folder, target.config, torch.device("cpu"), torch.float32)
        batch = [0, 1]
        a = eagle_loss(model, target, data, batch, 2)[0]
        b = eagle_loss(loaded, target, data, batch, 2)[0]
        torch.testing.assert_close(a, b, atol=tol + 1e-5, rtol=tol + 1e-5)
        if version == 3:
            assert torch.equal(loaded.draft_to_target, model.draft_to_target)
    assert meta == {}


def test_reduced_vocabulary_token_loss_trains_on_the_head_rows_only(tmp_path: Path):
    """EAGLE-1/2 with a reduced vocabulary: the token loss reads only the given head rows (a row swap changes
    nothing outside them), and training on it still lowers the loss."""
    torch.manual_seed(0)
    target, data = tiny_data(1)
    ids = torch.tensor([0, 3, 5, 8, 11, 13, 16, 21])
    head = target.lm_head.weight.detach()[ids].clone()
    model = init_predictor(target, 1, seed=0)
    train, val = list(range(20)), list(range(20, 24))
    _, reduced = eagle_loss(model, target, data, train[:4], 1, head=head)
    _, full = eagle_loss(model, target, data, train[:4], 1)
    assert reduced["ce"] != full["ce"]  # it really is another distribution
    with torch.no_grad():  # rows outside the reduced vocabulary do not enter its loss
        target.lm_head.weight[1].mul_(5.0)
    assert eagle_loss(model, target, data, train[:4], 1, head=head)[1]["ce"] == pytest.approx(reduced["ce"])
    before = evaluate(model, target, data, train, ttt_steps=1, head=head)["val_loss"]
    settings = TrainSettings(steps=30, batch_size=4, lr=3e-3, warmup=5, checkpoint_every=15)
    train_predictor(model, target, data, train, val, settings, 1, tmp_path / "ckpt.pt", head=head)
    after = evaluate(model, target, data, train, ttt_steps=1, head=head)["val_loss"]
    assert after < 0.7 * before, f"loss {before:.3f} -> {after:.3f}"


def test_eagle1_unrolled_pass_reads_the_predictors_own_features():
    """`--unroll 2` on EAGLE-1/2: the second pass feeds pair t the first pass's prediction for pair t - 1 (what
    a depth-2 draft reads), attends as a depth-2 draft does, and its loss is added at weight 0.8; a pass fed the
    target's true features instead gives another loss."""
    target, data = tiny_data(1)
    model = init_predictor(target, 1, seed=0)
    batch = [0, 1, 2, 3]
    one, _ = eagle_loss(model, target, data, batch, 1)
    two, metrics = eagle_loss(model, target, data, batch, 2)
    assert "top1_1" in metrics

    ids = eagle._padded([data.ids[i] for i in batch], model.device)
    lengths = torch.tensor([data.ids[i].shape[0] for i in batch])
    b, t = ids.shape[0], ids.shape[1] - 1
    valid = torch.arange(t)[None] < (lengths[:, None] - 1)
    feats = eagle._padded([data.features[i] for i in batch], model.device, torch.float32)[:, :-1]
    embeds = target.embed_tokens(ids[:, 1:]).float().reshape(b * t, -1)
    positions = torch.arange(t).repeat(b)
    attend = eagle.DenseAttention(b, t, model.config.layer)
    first = model(embeds, feats.reshape(b * t, -1), positions, attend).view(b, t, -1)
    shifted = torch.cat([torch.zeros_like(first[:, :1]), first[:, :-1]], dim=1)
    second = model(embeds, shifted.reshape(b * t, -1), positions, attend).float()
    later = valid & (torch.arange(t)[None] >= 1)
    expected = one + eagle.STEP_WEIGHT * eagle._eagle1_loss(model, target, data, batch, second, later)[0]
    torch.testing.assert_close(two, expected)

    attend = eagle.DenseAttention(b, t, model.config.layer)
    model(embeds, feats.reshape(b * t, -1), positions, attend)
    teacher = model(embeds, feats.reshape(b * t, -1), positions, attend).float()
    forced = one + eagle.STEP_WEIGHT * eagle._eagle1_loss(model, target, data, batch, teacher, later)[0]
    assert not torch.allclose(two, forced)


def test_topk_distillation_term_is_the_soft_cross_entropy_cut_to_the_targets_likeliest_tokens():
    """HASS's top-K term (`TokenLoss.topk`): with K the whole vocabulary it is the soft cross-entropy itself
    (so a loss of ce 0 + top-K 1 equals ce 1), and with a small K it is smaller, as it drops the tail."""
    torch.manual_seed(0)
    target, data = tiny_data(1)
    model = init_predictor(target, 1, seed=0)
    batch = [0, 1, 2, 3]
    plain, plain_metrics = eagle_loss(model, target, data, batch, 1, token_loss=eagle.TokenLoss(ce_weight=1.0))
    whole, whole_metrics = eagle_loss(model, target, data, batch, 1,
                                      token_loss=eagle.TokenLoss(ce_weight=0.0, topk=VOCAB, topk_weight=1.0))
    assert float(whole) == pytest.approx(float(plain), rel=1e-5)
    assert whole_metrics["topk"] == pytest.approx(plain_metrics["ce"], rel=1e-5)
    _, cut = eagle_loss(model, target, data, batch, 1, token_loss=eagle.TokenLoss(ce_weight=0.0, topk=3))
    assert 0 < cut["topk"] < whole_metrics["topk"]


def test_a_run_made_before_a_setting_existed_resumes_with_its_default(tmp_path: Path):
    """run.json files written before `topk_loss` existed still resume; a really changed setting is refused."""
    import json

    from specdec.errors import ConfigError
    from specdec.training.common import check_run_folder

    cfg = eagle.EagleTrainConfig(steps=10)
    saved = {k: v for k, v in json.loads(json.dumps(eagle.asdict(cfg))).items() if not k.startswith("topk")}
    (tmp_path / "run.json").write_text(json.dumps(saved))
    check_run_folder(tmp_path, cfg, resume=True)
    with pytest.raises(ConfigError, match="topk_loss"):
        check_run_folder(tmp_path, eagle.EagleTrainConfig(steps=10, topk_loss=10), resume=True)


@pytest.mark.parametrize("kind, args, message", [
    ("eagle", ["--topk-loss", "-1"], "must not be negative"),
    ("eagle3", ["--topk-loss", "10"], "EAGLE-1/2"),
])
def test_cli_refuses_a_topk_loss_it_cannot_apply_in_one_line(tmp_path: Path, kind: str, args: list[str], message: str):
    from typer.testing import CliRunner

    from specdec.cli.train import train_app

    result = CliRunner().invoke(train_app, [kind, "--target", "dummy:tiny-llama", "--out", str(tmp_path / "run"),
                                            *args])
    assert result.exit_code != 0
    assert message in result.output and "Traceback" not in result.output
    assert not (tmp_path / "run").exists()  # refused before anything is written
