"""Self-distillation of EAGLE predictors (`specdec train eagle|eagle3`).

Stages, each saved in the run folder so `--resume` continues where a run stopped:

1. corpus:   the target's greedy answers to training prompts (`common.generate_corpus`), or an existing
             `corpus.pt` given with `--corpus` (the draft trainer's corpus serves as is).
2. features: one dense target pass over every prompt + answer (`features.record_features`): final-norm hidden
             states (EAGLE-1/2) or the residual streams entering layers 2, N//2, N-3 (EAGLE-3), in bf16; for
             EAGLE-3 also the target's argmax at every position (its training labels and draft vocabulary).
             Saved in slices of 200 sequences (`features/`), so a long recording resumes mid-way.
3. train:    teacher-forced over every position t of every sequence, the pair (f_t, x_{t+1}):
             * EAGLE-1/2 (the published objective): smooth-L1 regression of h_t onto f_{t+1} (weight 1.0)
               plus cross-entropy of head(h_t) against the target's distribution softmax(head(f_{t+1}))
               (weight 0.1). No feature noise (the paper's U(-0.1, 0.1) augmentation is left out).
             * EAGLE-3 (training-time test, simplified): `ttt_steps` unrolled steps. Step 0 reads target
               features; step j reads the predictor's own step j-1 output of the previous position, as
               drafting does at depth j+1, and attends to the target-feature entries up to t-j plus its own
               chain's entries at t-j+1..t (the paper's diagonal masks). Each step's loss is cross-entropy
               against the target's distribution over the draft vocabulary (soft labels, from the recorded
               final hidden states and the head's rows of those tokens; positions whose target argmax is
               outside the draft vocabulary masked), weighted 0.8^j. The draft vocabulary is the `draft_vocab`
               most frequent target argmax tokens of the training sequences.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from specdec.drafters.heads.eagle_checkpoint import default_feature_layers, write_eagle
from specdec.drafters.heads.eagle_model import EagleConfig, EaglePredictor
from specdec.errors import ConfigError
from specdec.models.llama import LlamaModel
from specdec.training.common import (Corpus, Progress, TrainSettings, _no_progress, check_run_folder,
                                            corpus_sources, optimise, save_atomic, start_run_folder)

FEATURES_FILE = "features.pt"  # one file for the whole corpus: run folders from before sharding
FEATURES_DIR = "features"  # the slices `record_in_shards` writes
SHARD_SEQUENCES = 200  # about 45k tokens of the default corpus, three minutes on one thread
CHECKPOINT_FILE = "checkpoint.pt"
STEP_WEIGHT = 0.8  # weight of unrolled step j is 0.8^j (EAGLE-3's training-time test, EAGLE-1/2's --unroll)


@dataclass(frozen=True)
class EagleTrainConfig:
    """Everything that decides what a run produces (`run.json`; `--resume` must match)."""

    kind: str = "eagle"  # "eagle" (EAGLE-1/2) or "eagle3"
    target: str = "smollm2-135m"
    prompts: str | None = None  # JSONL prompt file; None = the package's training corpus
    corpus: str | list[str] | None = None  # existing corpora to reuse instead of generating answers (mixed)
    max_prompts: int = 512
    new_tokens: int = 64
    steps: int = 300
    batch_size: int = 8  # sequences per step
    lr: float = 1e-3
    val_prompts: int = 16
    seed: int = 0
    draft_vocab: int = 8192  # EAGLE-3 only
    ttt_steps: int = 3  # EAGLE-3 only
    ce_fraction: float = 1.0  # EAGLE-1/2: share of positions whose token loss is computed (the LM head is the
    #                           cost of training on a CPU; regression always uses every position)
    ce_weight: float = 0.1  # EAGLE-1/2: weight of the token loss (regression weighs 1.0), as published
    init_from: str | None = None  # an EAGLE checkpoint folder of the same kind to start from (fine-tuning)
    vocab: int = 0  # EAGLE-1/2: the token loss over the N most frequent target tokens only, as the drafter then
    #                 drafts with `eagle:vocab=N` (the default it ships with); 0 = the full vocabulary
    teacher_bf16: bool = False  # bf16 autocast for the target's feature pass
    train_bf16: bool = False  # bf16 autocast for the predictor (and the frozen head) while training
    unroll: int = 1  # EAGLE-1/2: passes per batch, each after the first on the predictor's own features
    topk_loss: int = 0  # EAGLE-1/2: K of HASS's top-K distillation term (0: off), see `TokenLoss`
    topk_weight: float = 1.0  # its weight

    @property
    def token_loss(self) -> "TokenLoss":
        return TokenLoss(self.ce_fraction, self.ce_weight, self.topk_loss, self.topk_weight)

    @property
    def version(self) -> int:
        return 3 if self.kind == "eagle3" else 1

    @property
    def unrolled_steps(self) -> int:
        """Passes of the loss per batch: EAGLE-3's training-time test, or EAGLE-1/2's unroll."""
        return self.ttt_steps if self.version == 3 else self.unroll

    def command(self, out: Path, published: bool = False) -> str:
        parts = [f"specdec train {self.kind}", f"--target {self.target}"]
        parts += [f"--prompts {self.prompts}"] if self.prompts else []
        parts += [f"--corpus {source}" for source in corpus_sources(self.corpus)]
        parts.append(f"--out {out}")
        parts += [f"--init-from {self.init_from}"] if self.init_from else []
        for name in ("max_prompts", "new_tokens", "steps", "batch_size", "lr", "val_prompts", "seed"):
            parts.append(f"--{name.replace('_', '-')} {getattr(self, name)}")
        if self.version == 1 and self.ce_fraction != 1.0:
            parts.append(f"--ce-fraction {self.ce_fraction}")
        if self.version == 1 and self.ce_weight != 0.1:
            parts.append(f"--ce-weight {self.ce_weight}")
        if self.version == 1 and self.vocab:
            parts.append(f"--vocab {self.vocab}")
        if self.version == 1 and self.unroll != 1:
            parts.append(f"--unroll {self.unroll}")
        if self.version == 1 and self.topk_loss:
            parts.append(f"--topk-loss {self.topk_loss} --topk-weight {self.topk_weight}")
        if self.version == 3:
            parts += [f"--draft-vocab {self.draft_vocab}", f"--ttt-steps {self.ttt_steps}"]
        parts += ["--teacher-bf16"] if self.teacher_bf16 else []
        parts += ["--train-bf16"] if self.train_bf16 else []
        parts += ["--published"] if published else []
        return " ".join(parts)


@dataclass(frozen=True)
class TokenLoss:
    """How an EAGLE-1/2 predictor's token loss is weighed against its feature regression (weight 1.0).

    `ce_weight` scales the cross-entropy against the target's whole next-token distribution. `topk` > 0 adds
    HASS's top-K distillation term (Zhang et al., 2024), `-sum over the target's K likeliest tokens of p log q`
    times `topk_weight`: the same soft labels cut to the tokens a tree drafts from, so the predictor's capacity
    goes to ranking those rather than to the distribution's tail, which no draft ever proposes.
    `ce_fraction` < 1 computes both on a fixed stride of the positions (the head is a CPU run's cost)."""

    ce_fraction: float = 1.0
    ce_weight: float = 0.1
    topk: int = 0
    topk_weight: float = 1.0


@dataclass
class TrainState:
    step: int = 0
    seconds: float = 0.0
    history: list[dict] = field(default_factory=list)  # {"step", "loss", "val_top1", ...} at checkpoints


# ------------------------------------------------------------------------------------------------ model
def init_predictor(target: LlamaModel, version: int, draft_ids: Tensor | None = None, seed: int = 0) -> EaglePredictor:
    """A fresh predictor shaped like one target layer, on the target's device, in fp32.

    EAGLE-1/2: fc starts as the identity on the feature half (h_t starts near f_t, a fair first guess of f_{t+1})
    with a small random embedding half. EAGLE-3: the norms start at one, the reduced head as the target's head
    rows of the draft vocabulary (normed input, as the target's own head reads it)."""
    torch.manual_seed(seed)
    layer = replace(target.config, num_layers=1, tie_embeddings=False)
    h = layer.hidden_size
    config = EagleConfig(layer=layer, version=version, fc_bias=version == 1,
                         draft_vocab=len(draft_ids) if draft_ids is not None else 0,
                         num_features=3 if version == 3 else 1)
    model = EaglePredictor(config, target.device).to(target.device, torch.float32)
    with torch.no_grad():
        if version == 1:
            model.fc.weight[:, h:].copy_(torch.eye(h))
            model.fc.weight[:, :h].mul_(0.1)
            model.fc.bias.zero_()
        else:
            model.lm_head.weight.copy_(target.lm_head.weight[draft_ids.to(target.device)].float())
            model.norm.weight.copy_(target.norm.weight.float())
            model.draft_to_target = draft_ids.to(target.device)
    return model


def trainable(model: EaglePredictor) -> dict[str, torch.nn.Parameter]:
    return dict(model.named_parameters())


class DenseAttention:
    """Attention for teacher-forced training over a padded batch `[B, T]`, step after unrolled step.

    Step 0 is causal over its own keys. Step j (training-time test) attends to step-0 keys at positions <= t-j
    and to step i's key at position t-j+i for i = 1..j: exactly what the query sees at draft depth j+1."""

    def __init__(self, batch: int, length: int, config) -> None:
        self.batch, self.length, self.c = batch, length, config
        self.keys: list[Tensor] = []
        self.values: list[Tensor] = []

    def __call__(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        b, t, c = self.batch, self.length, self.c
        q = q.view(b, t, c.num_heads, c.head_dim).transpose(1, 2)
        self.keys.append(k.view(b, t, c.num_kv_heads, c.head_dim).transpose(1, 2))
        self.values.append(v.view(b, t, c.num_kv_heads, c.head_dim).transpose(1, 2))
        gqa = c.num_heads != c.num_kv_heads
        j = len(self.keys) - 1
        if j == 0:
            out = F.scaled_dot_product_attention(q, self.keys[0], self.values[0], is_causal=True, enable_gqa=gqa)
        else:
            mask = ttt_mask(t, j, q.device)
            out = F.scaled_dot_product_attention(q, torch.cat(self.keys, 2), torch.cat(self.values, 2),
                                                 attn_mask=mask, enable_gqa=gqa)
        return out.transpose(1, 2).reshape(b * t, -1)


def ttt_mask(length: int, step: int, device: torch.device | str = "cpu") -> Tensor:
    """`[T, (step + 1) T]` bool: query t of unrolled step `step` sees step-0 keys <= t-step, and key t-step+i
    of step i (1 <= i <= step)."""
    ones = torch.ones(length, length, dtype=torch.bool, device=device)
    blocks = [ones.tril(-step)]
    for i in range(1, step + 1):
        blocks.append(ones.tril(i - step).triu(i - step))  # key == t - (step - i)
    return torch.cat(blocks, dim=1)


# ------------------------------------------------------------------------------------------------ data
@dataclass
class EagleData:
    """Per sequence: token ids, features `[T, F]` (bf16), final hidden `[T, H]` (EAGLE-1/2) and labels."""

    ids: list[Tensor]
    features: list[Tensor]
    hidden: list[Tensor]
    labels: list[Tensor]  # [T] int64 target argmax after each position (EAGLE-3), else empty


def record(target: LlamaModel, corpus: Corpus, version: int, bf16: bool = False,
           progress: Progress = _no_progress) -> dict[str, Any]:
    """Target features (and EAGLE-3 labels) for every corpus sequence; a dict that `torch.save` stores."""
    from specdec.training.features import record_features

    layers = default_feature_layers(target.config.num_layers) if version == 3 else ()
    start = time.perf_counter()
    with torch.autocast(target.device.type, dtype=torch.bfloat16, enabled=bf16):
        feats = record_features(target, corpus, capture_layers=layers, progress=progress)
    out: dict[str, Any] = {"hidden": feats.hidden, "layers": list(layers), "labels": []}
    if version == 3:
        out["features"] = [torch.cat([feats.layers[i][n] for i in layers], dim=-1) for n in range(len(feats.hidden))]
        with torch.inference_mode():
            for n, hidden in enumerate(feats.hidden):
                out["labels"].append(target.lm_head(hidden.to(target.device, target.dtype)).argmax(-1).cpu())
                progress("labels", n + 1, len(feats.hidden), {})
        # the final hidden states stay: they give the soft labels (`_soft_labels`), 1/4 of what is stored
    out["seconds"] = time.perf_counter() - start
    return out


def record_in_shards(target: LlamaModel, corpus: Corpus, version: int, bf16: bool, out: Path, resume: bool,
                     progress: Progress = _no_progress) -> dict[str, Any]:
    """`record` over the corpus in slices of `SHARD_SEQUENCES`, each saved as it finishes under `out/features/`.

    The whole default corpus takes over two hours on one thread, longer than one sitting: with `--resume` a run
    keeps the slices already recorded and records only the rest. (A run folder from before sharding, with one
    `features.pt`, is read as it is.)"""
    single = out / FEATURES_FILE
    if resume and single.is_file():
        return torch.load(single, weights_only=True)
    folder = out / FEATURES_DIR
    folder.mkdir(exist_ok=True)
    n = len(corpus.response_ids)
    merged: dict[str, Any] = {"hidden": [], "labels": [], "layers": [], "seconds": 0.0}
    for start in range(0, n, SHARD_SEQUENCES):
        stop = min(start + SHARD_SEQUENCES, n)
        path = folder / f"{start:06d}-{stop:06d}.pt"
        if resume and path.is_file():
            shard = torch.load(path, weights_only=True)
        else:
            part = Corpus(prompt_ids=corpus.prompt_ids[start:stop], response_ids=corpus.response_ids[start:stop])

            def overall(stage: str, done: int, total: int, fields: dict, start: int = start) -> None:
                progress(stage, start + done, n, fields)

            shard = record(target, part, version, bf16, overall)
            save_atomic(shard, path)
        merged["layers"] = shard["layers"]
        merged["seconds"] += shard["seconds"]
        for key in ("hidden", "labels", "features"):
            if key in shard:
                merged.setdefault(key, []).extend(shard[key])
    return merged


def choose_draft_vocab(labels: list[Tensor], size: int, vocab: int) -> Tensor:
    """The `size` most frequent target argmax tokens, ascending (so d2t offsets are non-negative)."""
    counts = torch.bincount(torch.cat(labels).long(), minlength=vocab)
    size = min(size, vocab)
    return counts.topk(size).indices.sort().values


def start_from(model: EaglePredictor, folder: Path, target: LlamaModel) -> None:
    """Copy a trained checkpoint's weights into a fresh predictor of the same shape (fine-tuning)."""
    from specdec.drafters.heads.eagle_checkpoint import load_eagle

    trained, _ = load_eagle(folder, target.config, target.device, torch.float32)
    if trained.config != model.config:
        raise ConfigError(f"--init-from {folder}: its shape ({trained.config.version}, draft vocabulary "
                          f"{trained.config.draft_vocab}) differs from this run's")
    model.load_state_dict(trained.state_dict())


def reduced_rows(cfg: EagleTrainConfig, target: LlamaModel, answers: list[list[int]]) -> Tensor:
    """The target head's rows `[N, H]` of the draft vocabulary the drafter will use (`training_draft_ids`)."""
    from specdec.drafters.heads.reduced_vocab import head_rows, training_draft_ids

    return head_rows(target, training_draft_ids(cfg.target, cfg.vocab, answers, target.config.vocab_size)).detach()


def _padded(seqs: list[Tensor], device: torch.device, dtype: torch.dtype | None = None) -> Tensor:
    length = max(s.shape[0] for s in seqs)
    out = torch.zeros((len(seqs), length) + tuple(seqs[0].shape[1:]), dtype=dtype or seqs[0].dtype, device=device)
    for b, s in enumerate(seqs):
        out[b, : s.shape[0]] = s.to(device, out.dtype)
    return out


# ------------------------------------------------------------------------------------------------ losses
def eagle_loss(model: EaglePredictor, target: LlamaModel, data: EagleData, indices: list[int],
               ttt_steps: int = 3, bf16: bool = False, token_loss: TokenLoss = TokenLoss(),
               head: Tensor | None = None) -> tuple[Tensor, dict[str, float]]:
    """The training loss of one batch of sequences, and its top-1 agreement (per unrolled step for EAGLE-3)."""
    device = model.device
    ids = _padded([data.ids[i] for i in indices], device)  # [B, T]
    lengths = torch.tensor([data.ids[i].shape[0] for i in indices], device=device)
    b, t = ids.shape[0], ids.shape[1] - 1  # pairs t = 0 .. T-2
    valid = torch.arange(t, device=device)[None] < (lengths[:, None] - 1)  # [B, T-1]: pair t has x_{t+1}
    feats = _padded([data.features[i] for i in indices], device, torch.float32)[:, :-1]
    embeds = target.embed_tokens(ids[:, 1:]).float().reshape(b * t, -1)
    positions = torch.arange(t, device=device).repeat(b)
    attend = DenseAttention(b, t, model.config.layer)
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
        out = model(embeds, feats.reshape(b * t, -1), positions, attend)
        if model.config.version == 1:
            loss, metrics = _eagle1_loss(model, target, data, indices, out.float(), valid, token_loss, head)
            # Unrolled passes (`ttt_steps` > 1): a drafted depth d >= 2 reads the predictor's own feature from
            # depth d - 1, never the target's, so later passes feed each pair the previous pass's prediction
            # for the pair before it and learn to predict from it (EAGLE-3's training-time test, here on the
            # EAGLE-1/2 predictor, whose targets are unchanged: the next true feature and token distribution).
            for j in range(1, ttt_steps):
                out = model(embeds, _fed_back(out, b, t), positions, attend)
                later = valid & (torch.arange(t, device=device)[None] >= j)
                step_loss, step_metrics = _eagle1_loss(model, target, data, indices, out.float(), later,
                                                       token_loss, head)
                loss = loss + step_loss * STEP_WEIGHT**j
                metrics[f"top1_{j}"] = step_metrics["top1_0"]
            return loss, metrics
        losses, metrics = [], {}
        labels = _padded([data.labels[i] for i in indices], device)[:, 1:]  # target argmax after x_{t+1}
        soft = _soft_labels(model, target, data, indices, b, t)
        to_draft = torch.full((model.config.layer.vocab_size,), -1, dtype=torch.int64, device=device)
        to_draft[model.draft_to_target] = torch.arange(model.config.draft_vocab, device=device)
        draft_labels = to_draft[labels.long()]
        for j in range(ttt_steps):
            if j:
                out = model(embeds, _fed_back(out.float(), b, t), positions, attend)
            mask = (valid & (draft_labels >= 0) & (torch.arange(t, device=device)[None] >= j)).reshape(-1)
            logits = model.logits(out[mask], target.lm_head)
            target_ids = draft_labels.reshape(-1)[mask]
            if soft is None:
                loss = F.cross_entropy(logits, target_ids)
            else:
                loss = -(soft[mask] * torch.log_softmax(logits.float(), dim=-1)).sum(-1).mean()
            losses.append(loss * STEP_WEIGHT**j)
            metrics[f"top1_{j}"] = float((logits.argmax(-1) == target_ids).float().mean())
    return sum(losses), metrics


def _fed_back(out: Tensor, b: int, t: int) -> Tensor:
    """The next unrolled pass's input features `[B*T, H]`: for each pair, the previous pass's output for the
    pair before it (zeros for a sequence's first pair), as a deeper draft reads its parent's prediction."""
    prev = out.view(b, t, -1)
    return torch.cat([torch.zeros_like(prev[:, :1]), prev[:, :-1]], dim=1).reshape(b * t, -1)


@torch.no_grad()
def _soft_labels(model: EaglePredictor, target: LlamaModel, data: EagleData, indices: list[int],
                 b: int, t: int) -> Tensor | None:
    """EAGLE-3's soft labels: the target's next-token distribution after x_{t+1}, over the draft vocabulary
    (its head's rows of those tokens, renormalised: what the draft can propose), `[B*(T-1), N]`; None for
    features recorded without final hidden states (hard argmax labels then)."""
    from specdec.drafters.heads.reduced_vocab import head_rows

    if not data.hidden or any(data.hidden[i].numel() == 0 for i in indices):
        return None
    nxt = _padded([data.hidden[i] for i in indices], model.device, torch.float32)[:, 1:]
    rows = head_rows(target, model.draft_to_target).to(model.device)
    return torch.softmax(nxt.reshape(b * t, -1) @ rows.T, dim=-1)


def _eagle1_loss(model: EaglePredictor, target: LlamaModel, data: EagleData, indices: list[int], out: Tensor,
                 valid: Tensor, token_loss: TokenLoss = TokenLoss(),
                 head: Tensor | None = None) -> tuple[Tensor, dict[str, float]]:
    """Regression onto f_{t+1} plus cross-entropy against the target's next-token distribution; with `head`
    (the target head's rows `[N, H]` of a reduced vocabulary) both distributions are over those N tokens:
    what the reduced drafter ranks, at a fraction of the full head's cost."""
    def logits_of(x: Tensor) -> Tensor:
        return x @ head.T if head is not None else target.lm_head(x)

    device = out.device
    nxt = _padded([data.hidden[i] for i in indices], device, torch.float32)[:, 1:]  # f_{t+1}
    mask = valid.reshape(-1)
    pred, goal = out[mask], nxt.reshape(-1, nxt.shape[-1])[mask]
    regression = F.smooth_l1_loss(pred, goal, reduction="none").mean(-1).mean()
    if token_loss.ce_fraction < 1.0:  # a fixed stride through the batch's positions (deterministic, resume-safe)
        stride = max(1, round(1 / token_loss.ce_fraction))
        pred, goal = pred[indices[0] % stride:: stride], goal[indices[0] % stride:: stride]
    with torch.no_grad():
        target_logits = logits_of(goal).float()
        p = torch.softmax(target_logits, dim=-1)
    logq = torch.log_softmax(logits_of(pred).float(), dim=-1)
    ce = -(p * logq).sum(-1).mean()
    agree = float((logq.argmax(-1) == target_logits.argmax(-1)).float().mean())
    loss = regression + token_loss.ce_weight * ce
    metrics = {"regression": float(regression.detach()), "ce": float(ce.detach()), "top1_0": agree}
    if token_loss.topk:
        top_p, top_ids = p.topk(min(token_loss.topk, p.shape[-1]), dim=-1)
        topk = -(top_p * logq.gather(-1, top_ids)).sum(-1).mean()
        loss = loss + token_loss.topk_weight * topk
        metrics["topk"] = float(topk.detach())
    return loss, metrics


# ------------------------------------------------------------------------------------------------ training
def train_predictor(model: EaglePredictor, target: LlamaModel, data: EagleData, train: list[int], val: list[int],
                    settings: TrainSettings, ttt_steps: int, path: Path, state: TrainState | None = None,
                    progress: Progress = _no_progress, token_loss: TokenLoss = TokenLoss(),
                    head: Tensor | None = None) -> TrainState:
    """AdamW on `eagle_loss`; checkpoints (weights, optimizer, step, history) every `checkpoint_every` steps."""
    params = trainable(model)
    model.train().requires_grad_(True)
    optimizer = torch.optim.AdamW(params.values(), lr=settings.lr, betas=(0.9, 0.95))
    state = state or TrainState()
    if state.step:
        saved = torch.load(path, weights_only=True)
        model.load_state_dict(saved["params"], strict=False)
        optimizer.load_state_dict(saved["optimizer"])
    def checkpoint(fields: dict) -> dict:
        fields.update(evaluate(model, target, data, val, ttt_steps, head=head))
        state.history.append({"step": state.step, **fields})
        return fields

    def batch_loss(batch: list[int]) -> Tensor:
        return eagle_loss(model, target, data, batch, ttt_steps, settings.bf16, token_loss, head)[0]

    optimise(optimizer, list(params.values()), settings, state, train, batch_loss, checkpoint,
             lambda: {"params": model.state_dict()}, path, progress)
    model.eval().requires_grad_(False)
    return state


@torch.no_grad()
def evaluate(model: EaglePredictor, target: LlamaModel, data: EagleData, val: list[int], ttt_steps: int = 3,
             batch_size: int = 8, head: Tensor | None = None) -> dict[str, float]:
    """Held-out loss and top-1 agreement with the target (step 0 = depth 1), averaged over batches."""
    was_training = model.training
    model.eval()
    sums: dict[str, float] = {}
    batches = [val[i: i + batch_size] for i in range(0, len(val), batch_size)]
    for indices in batches:
        loss, metrics = eagle_loss(model, target, data, indices, ttt_steps, head=head)
        for key, value in {"loss": float(loss.detach()), **metrics}.items():
            sums[f"val_{key}"] = sums.get(f"val_{key}", 0.0) + value / len(batches)
    model.train(was_training)
    return sums


# ------------------------------------------------------------------------------------------------ a whole run
def run_eagle_training(cfg: EagleTrainConfig, out: Path, resume: bool = False, loaded: Any = None,
                       published: bool = False, progress: Progress = _no_progress,
                       log: Callable[[str], None] = print) -> dict[str, Any]:
    """Corpus -> features -> training -> the checkpoint folder `out/<kind>`; returns its metadata."""
    from specdec.models.loader import load_model

    if cfg.kind not in ("eagle", "eagle3"):
        raise ConfigError(f"unknown EAGLE kind '{cfg.kind}'; use eagle or eagle3")
    torch.manual_seed(cfg.seed)
    check_run_folder(out, cfg, resume)
    if loaded is None:
        loaded = load_model(cfg.target, "cpu", "float32", show_progress=True)
    target = loaded.model
    start_run_folder(out, cfg)

    from specdec.training.common import obtain_corpus

    corpus = obtain_corpus(cfg, loaded, out, resume, progress, cfg.val_prompts + cfg.batch_size)
    n = len(corpus.response_ids)
    log(f"corpus: {n} sequences, {corpus.num_tokens} tokens ({sum(map(len, corpus.response_ids))} generated)"
        + (f", reused from {', '.join(corpus_sources(cfg.corpus))}" if cfg.corpus else f" in {corpus.seconds:.0f} s"))

    recorded = record_in_shards(target, corpus, cfg.version, cfg.teacher_bf16, out, resume, progress)
    log(f"features: {corpus.num_tokens} positions in {recorded['seconds']:.0f} s")
    data = EagleData(ids=[torch.tensor(p + r) for p, r in zip(corpus.prompt_ids, corpus.response_ids)],
                     features=recorded.get("features") or recorded["hidden"], hidden=recorded["hidden"],
                     labels=recorded["labels"])

    train, val = list(range(n - cfg.val_prompts)), list(range(n - cfg.val_prompts, n))
    draft_ids = None
    if cfg.version == 3:
        draft_ids = choose_draft_vocab([data.labels[i] for i in train], cfg.draft_vocab, target.config.vocab_size)
    model = init_predictor(target, cfg.version, draft_ids, cfg.seed)
    if cfg.init_from:
        start_from(model, Path(cfg.init_from).expanduser(), target)
    head = None
    if cfg.version == 1 and cfg.vocab:
        head = reduced_rows(cfg, target, [corpus.response_ids[i] for i in train])
    settings = TrainSettings(steps=cfg.steps, batch_size=cfg.batch_size, lr=cfg.lr, seed=cfg.seed,
                             bf16=cfg.train_bf16)
    ckpt = out / CHECKPOINT_FILE
    state = TrainState(**torch.load(ckpt, weights_only=True)["state"]) if resume and ckpt.is_file() else None
    if state is None:
        start = time.perf_counter()
        state = TrainState(history=[{"step": 0, **evaluate(model, target, data, val, cfg.unrolled_steps, head=head)}])
        state.seconds = time.perf_counter() - start
    state = train_predictor(model, target, data, train, val, settings, cfg.unrolled_steps, ckpt, state, progress,
                            cfg.token_loss, head)
    final = state.history[-1]
    log(f"train: {state.step} steps in {state.seconds:.0f} s; held-out top-1 {final.get('val_top1_0', 0):.3f}")
    meta = {
        "target": cfg.target, "kind": cfg.kind, "version": cfg.version,
        "feature_layers": list(recorded["layers"]),
        "command": cfg.command(out, published),
        "settings": asdict(cfg),
        "corpus": {"sequences": n, "train": len(train), "held_out": len(val), "tokens": corpus.num_tokens,
                   "generated_tokens": sum(map(len, corpus.response_ids)),
                   "source": cfg.corpus or cfg.prompts or "specdec/data/train_prompts.jsonl"},
        "seconds": {"generate": round(corpus.seconds, 1), "features": round(recorded["seconds"], 1),
                    "train": round(state.seconds, 1)},
        "threads": torch.get_num_threads(),
        "history": state.history,
        "final": final,
    }
    if head is not None:
        meta["draft_vocab"] = cfg.vocab  # the drafter's default: eagle means eagle:vocab=N with this head
    folder = out / cfg.kind
    write_eagle(model, folder, meta)
    if published:
        write_eagle(model, out / f"{cfg.kind}-published", meta, published=True)
    return meta
