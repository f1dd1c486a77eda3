"""Self-distillation of Medusa heads (`specdec train medusa`).

Stages, each saved in the run folder so that `--resume` continues where a run stopped:

1. corpus:   the target's greedy answers to the prompts, through our engine (`common.generate_corpus`),
             or an existing `corpus.pt` (`--corpus`).
2. features: one dense forward of the target over every prompt + answer (`features.record_features`); only the
             rows the heads read at run time are kept: the last prompt position and every answer position.
3. train:    head i at row t learns the token at t + i + 2 by cross-entropy, weighted 0.8^i as in the Medusa
             paper. The answers are the target's own greedy tokens, so these labels are exactly the target's
             argmax: the token greedy verification will accept. The LM head is the target's, frozen and shared;
             only the ResBlocks train (zero-initialised: an untrained head is the target's next-token head).
             With `--vocab N` the heads score only the N most frequent target tokens (the rows of the target's
             head that `medusa:vocab=N` drafts with): training costs a fraction of the full head's, and the
             heads learn to rank exactly the tokens they may propose. A label outside the N is left out of the
             loss and counted as a miss in the accuracy (no head can draft it).

The held-out answers also give each head's top-k accuracy, from which `best_choice_paths` builds the static trees that
maximise the expected accepted length for a node budget (Medusa's own recipe for its choice lists).
"""

from __future__ import annotations

import heapq
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from specdec.drafters.heads.medusa_heads import MedusaHeads
from specdec.drafters.heads.reduced_vocab import OUTSIDE, check_vocab_option, target_to_draft
from specdec.errors import ConfigError
from specdec.training.common import (
    Corpus, Progress, TrainSettings, _no_progress, check_run_folder, corpus_sources, optimise, save_atomic,
    start_run_folder,
)

FEATURES_FILE = "features.pt"
CHECKPOINT_FILE = "medusa_checkpoint.pt"
HEAD_DECAY = 0.8  # loss weight of head i is HEAD_DECAY ** i
TOPK_EVAL = 10  # ranks kept in the per-head accuracy table


@dataclass(frozen=True)
class MedusaConfig:
    """Everything that decides what a run produces (`run.json`; `--resume` must match)."""

    target: str = "smollm2-135m"
    prompts: str | None = None  # JSONL prompt file; None = the package's training corpus
    corpus: str | list[str] | None = None  # existing corpora (skips generation; several are mixed)
    heads: int = 4
    layers: int = 1
    max_prompts: int = 512
    new_tokens: int = 64
    steps: int = 200
    batch_size: int = 8  # answers per step (~500 rows x heads through the LM head)
    lr: float = 1e-3
    val_prompts: int = 16
    seed: int = 0
    bf16: bool = False  # bf16 autocast for the feature pass and the heads' training matmuls
    device: str = "cpu"
    vocab: int = 0  # the heads score the N most frequent target tokens (`medusa:vocab=N`); 0 = the full vocabulary

    def command(self, out: Path, threads: int | None, published: bool = False) -> str:
        d = MedusaConfig()
        parts = ["specdec train medusa", f"--target {self.target}"]
        parts += [f"--prompts {self.prompts}"] if self.prompts else []
        parts += [f"--corpus {source}" for source in corpus_sources(self.corpus)]
        parts.append(f"--out {out}")
        for name in ("heads", "layers", "max_prompts", "new_tokens", "steps", "batch_size", "lr", "val_prompts",
                     "vocab"):
            if getattr(self, name) != getattr(d, name):
                parts.append(f"--{name.replace('_', '-')} {getattr(self, name)}")
        parts.append(f"--seed {self.seed}")
        parts += ["--bf16"] if self.bf16 else []
        parts += [f"--device {self.device}"] if self.device != "cpu" else []
        parts += ["--published"] if published else []
        parts += [f"--threads {threads}"] if threads else []
        return " ".join(parts)


@dataclass
class HeadFeatures:
    """Per answer: the hidden rows the heads read (last prompt position .. last answer position) and the tokens
    from the first answer token on (row r's head i label is `labels[r + i + 1]`)."""

    hidden: list[Tensor] = field(default_factory=list)  # [R_i, H] bf16
    labels: list[Tensor] = field(default_factory=list)  # [R_i] int64
    seconds: float = 0.0


@dataclass
class MedusaState:
    step: int = 0
    seconds: float = 0.0
    history: list[dict] = field(default_factory=list)  # {"step", "loss", "val_top1": [per head]} at checkpoints


# ---------------------------------------------------------------------------------------------- features
def head_features(target: Any, corpus: Corpus, bf16: bool = False, progress: Progress = _no_progress) -> HeadFeatures:
    """The target's final hidden states at the rows a Medusa head reads, for every answer."""
    from specdec.training.features import record_features

    with torch.autocast(target.device.type, dtype=torch.bfloat16, enabled=bf16):
        feats = record_features(target, corpus, progress=progress)
    out = HeadFeatures(seconds=feats.seconds)
    for hidden, prompt, answer in zip(feats.hidden, corpus.prompt_ids, corpus.response_ids):
        start = len(prompt) - 1
        out.hidden.append(hidden[start: start + len(answer)].clone())  # a copy: a view would save the whole storage
        out.labels.append(torch.tensor(answer, dtype=torch.int64))
    return out


def in_draft_ids(feats: HeadFeatures, ids: Tensor, vocab_size: int) -> HeadFeatures:
    """The same features with labels as draft ids (position in ascending `ids`; OUTSIDE where not among them)."""
    to_draft = target_to_draft(ids, vocab_size)
    return HeadFeatures(feats.hidden, [to_draft[labels] for labels in feats.labels], feats.seconds)


def head_batch(feats: HeadFeatures, indices: list[int], num_heads: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """Rows [N, H] and labels [N, K] (-100 where the answer ends before the head's target token)."""
    rows, labels = [], []
    for i in indices:
        hidden, answer = feats.hidden[i], feats.labels[i]
        n = hidden.shape[0]
        padded = torch.full((n + num_heads + 1,), -100, dtype=torch.int64)
        padded[: answer.shape[0]] = answer
        # row r predicts answer[r] with the target's head; Medusa head k predicts answer[r + k + 1]
        labels.append(torch.stack([padded[k + 1: k + 1 + n] for k in range(num_heads)], dim=1))
        rows.append(hidden)
    return torch.cat(rows).to(device, torch.float32), torch.cat(labels).to(device)


def head_losses(heads: MedusaHeads, rows: Tensor, labels: Tensor, bf16: bool = False) -> Tensor:
    """[K] mean cross-entropy of each head (labels -1, outside a reduced vocabulary, left out)."""
    with torch.autocast(rows.device.type, dtype=torch.bfloat16, enabled=bf16):
        logits = heads(rows)  # [N, K, V]
    k = logits.shape[1]
    labels = labels.masked_fill(labels == OUTSIDE, -100)
    losses = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="none",
                             ignore_index=-100).view(-1, k)
    valid = (labels != -100).float()
    return (losses * valid).sum(0) / valid.sum(0).clamp_min(1.0)


# ------------------------------------------------------------------------------------------------ train
def train_heads(heads: MedusaHeads, feats: HeadFeatures, train: list[int], val: list[int], s: TrainSettings,
                path: Path, state: MedusaState | None = None, bf16: bool = False,
                progress: Progress = _no_progress) -> MedusaState:
    """AdamW on the weighted per-head cross-entropy; checkpoints every `s.checkpoint_every` steps."""
    params = [heads.weight, heads.bias]
    for p in params:
        p.requires_grad_(True)
    optimizer = torch.optim.AdamW(params, lr=s.lr, betas=(0.9, 0.95), weight_decay=s.weight_decay)
    state = state or MedusaState()
    if state.step:
        saved = torch.load(path, weights_only=True)
        with torch.no_grad():
            heads.weight.copy_(saved["weight"])
            heads.bias.copy_(saved["bias"])
        optimizer.load_state_dict(saved["optimizer"])
    weights = torch.tensor([HEAD_DECAY ** i for i in range(heads.num_heads)], device=heads.weight.device)
    device = heads.weight.device

    def batch_loss(batch: list[int]) -> Tensor:
        rows, labels = head_batch(feats, batch, heads.num_heads, device)
        return (head_losses(heads, rows, labels, bf16) * weights).sum()

    def checkpoint(fields: dict) -> dict:
        acc = head_accuracy(heads, feats, val)
        state.history.append({"step": state.step, "loss": fields["loss"], "val_top1": [a[0] for a in acc]})
        return {**fields, "val_top1": acc[0][0]}

    optimise(optimizer, params, s, state, train, batch_loss, checkpoint,
             lambda: {"weight": heads.weight.detach(), "bias": heads.bias.detach()}, path, progress)
    for p in params:
        p.requires_grad_(False)
    return state


@torch.no_grad()
def head_accuracy(heads: MedusaHeads, feats: HeadFeatures, val: list[int], topk: int = TOPK_EVAL,
                  batch_size: int = 8) -> list[list[float]]:
    """acc[k][r]: how often head k's rank-r token is the target's token, on held-out answers (a token outside a
    reduced vocabulary counts as a miss: no head can propose it)."""
    hits = torch.zeros(heads.num_heads, topk)
    counts = torch.zeros(heads.num_heads)
    for b in range(0, len(val), batch_size):
        rows, labels = head_batch(feats, val[b: b + batch_size], heads.num_heads, heads.weight.device)
        logits = heads(rows)
        top = logits.topk(min(topk, logits.shape[-1]), dim=-1).indices.cpu()  # [N, K, r]
        labels = labels.cpu()
        valid = labels != -100
        hits[:, : top.shape[-1]] += ((top == labels[..., None]) & valid[..., None]).sum(0).float()
        counts += valid.sum(0).float()
    return (hits / counts.clamp_min(1)[:, None]).tolist()


def best_choice_paths(acc: list[list[float]], nodes: int) -> tuple[list[tuple[int, ...]], float]:
    """The `nodes` choice paths of highest expected acceptance, and the expected tokens per step (bonus counted).

    A path is accepted when every head along it is right, taken as independent: its value is the product of
    `acc[depth][rank]`. Values never grow along a path, so adding the best paths first always yields a tree.
    """
    chosen: list[tuple[int, ...]] = []
    tau = 1.0
    heap = [(-acc[0][0], (0,))]
    seen = {(0,)}
    while heap and len(chosen) < nodes:
        neg, path = heapq.heappop(heap)
        chosen.append(path)
        tau += -neg
        d, r = len(path) - 1, path[-1]
        candidates = []
        if r + 1 < len(acc[d]):
            candidates.append((neg / max(acc[d][r], 1e-9) * acc[d][r + 1], path[:-1] + (r + 1,)))
        if d + 1 < len(acc):
            candidates.append((neg * acc[d + 1][0], path + (0,)))
        for value, nxt in candidates:
            if nxt not in seen:
                seen.add(nxt)
                heapq.heappush(heap, (value, nxt))
    return sorted(chosen, key=lambda c: (len(c), c)), tau


# ------------------------------------------------------------------------------------------ a whole run
def run_medusa(cfg: MedusaConfig, out: Path, resume: bool = False, loaded: Any = None,
               progress: Progress = _no_progress, log: Callable[[str], None] = print) -> tuple[MedusaHeads, dict]:
    """Corpus -> features -> training; returns the trained heads and the numbers for their README."""
    from specdec.models.loader import load_model
    from specdec.training.common import obtain_corpus

    if min(cfg.heads, cfg.layers, cfg.steps, cfg.batch_size, cfg.max_prompts, cfg.new_tokens, cfg.val_prompts) < 1:
        raise ConfigError("--heads, --layers, --steps, --batch-size, --max-prompts, --new-tokens and "
                          "--val-prompts must all be at least 1")
    if not cfg.lr > 0:
        raise ConfigError(f"--lr must be positive, got {cfg.lr}")
    torch.manual_seed(cfg.seed)
    check_run_folder(out, cfg, resume)
    if loaded is None:
        loaded = load_model(cfg.target, cfg.device, "float32", show_progress=True)
    target = loaded.model
    check_vocab_option(cfg.vocab, target.config.vocab_size)
    start_run_folder(out, cfg)
    corpus = obtain_corpus(cfg, loaded, out, resume, progress, cfg.val_prompts + cfg.batch_size)
    n = len(corpus.response_ids)
    log(f"corpus: {n} answers, {corpus.num_tokens} tokens ({sum(map(len, corpus.response_ids))} generated)"
        + (f", reused from {', '.join(corpus_sources(cfg.corpus))}" if cfg.corpus else f" in {corpus.seconds:.0f} s"))

    feats_path = out / FEATURES_FILE
    feats = HeadFeatures(**torch.load(feats_path, weights_only=True)) if resume and feats_path.is_file() else None
    if feats is None:
        feats = head_features(target, corpus, cfg.bf16, progress)
        save_atomic(asdict(feats), feats_path)
    log(f"features: {sum(h.shape[0] for h in feats.hidden)} rows in {feats.seconds:.0f} s")

    train, val = list(range(n - cfg.val_prompts)), list(range(n - cfg.val_prompts, n))
    settings = TrainSettings(steps=cfg.steps, batch_size=cfg.batch_size, lr=cfg.lr, seed=cfg.seed,
                             warmup=min(20, max(1, cfg.steps // 10)))
    c = target.config
    for p in target.parameters():
        p.requires_grad_(False)
    lm_head = target.lm_head
    if cfg.vocab:
        from specdec.drafters.heads.reduced_vocab import reduced_from, training_draft_ids

        ids = training_draft_ids(cfg.target, cfg.vocab, corpus.response_ids, c.vocab_size)
        lm_head = reduced_from(target, ids)
        feats = in_draft_ids(feats, ids, c.vocab_size)
    heads = MedusaHeads(cfg.heads, cfg.layers, c.hidden_size, c.vocab_size, lm_head).to(target.device)
    ckpt = out / CHECKPOINT_FILE
    state = MedusaState(**torch.load(ckpt, weights_only=True)["state"]) if resume and ckpt.is_file() else None
    if state is None:
        state = MedusaState(history=[{"step": 0, "val_top1": [a[0] for a in head_accuracy(heads, feats, val)]}])
    state = train_heads(heads, feats, train, val, settings, ckpt, state, cfg.bf16, progress)
    acc = head_accuracy(heads, feats, val)
    log(f"train: {state.step} steps in {state.seconds:.0f} s; held-out top-1 per head "
        + ", ".join(f"{a[0]:.3f}" for a in acc))
    trees = {size: best_choice_paths(acc, size) for size in (5, 8, 16, 32, 64)}
    meta = {
        "target": cfg.target,
        "draft_vocab": cfg.vocab,
        "settings": asdict(cfg),
        "corpus": {"answers": n, "train_answers": len(train), "held_out_answers": len(val),
                   "tokens": corpus.num_tokens, "generated_tokens": sum(map(len, corpus.response_ids)),
                   "source": cfg.corpus or cfg.prompts or "specdec/data/train_prompts.jsonl"},
        "seconds": {"generate": 0.0 if cfg.corpus else round(corpus.seconds, 1), "features": round(feats.seconds, 1),
                    "train": round(state.seconds, 1)},
        "threads": torch.get_num_threads(),
        "history": state.history,
        "heldout_accuracy": [[round(a, 4) for a in row] for row in acc],
        "trees": {str(k): {"choices": [list(p) for p in v[0]], "expected_tau": round(v[1], 3)}
                  for k, v in trees.items()},
    }
    return heads, meta


def render_readme(meta: dict[str, Any]) -> str:
    """The heads folder's README: what it is, the exact command, and the numbers of the run."""
    cfg, c, s = meta["settings"], meta["corpus"], meta["seconds"]
    last = meta["history"][-1]
    lines = [
        f"# Medusa heads for `{meta['target']}`",
        "",
        f"{cfg['heads']} Medusa heads of {cfg['layers']} ResBlock(s) each (bf16), for `drafter=\"medusa\"`. Head i "
        "reads the target's final hidden state and predicts the token i + 2 ahead through the target's own LM "
        "head (frozen, shared, not stored here), so the folder holds only the ResBlocks "
        "(`{i}.{j}.linear.weight/bias`, the published Medusa key layout without the `{i}.{L}.weight` projections).",
        *([""] + [f"The heads score only the {meta['draft_vocab']} most frequent target tokens (the target head's "
                  f"rows of `specdec/assets/vocab/`'s ranking), so `medusa` with these heads means `medusa:vocab="
                  f"{meta['draft_vocab']}` (`specdec_medusa.json` `draft_vocab`); `medusa:vocab=0` scores the full "
                  "vocabulary."] if meta.get("draft_vocab") else []),
        "",
        f"Made with ({meta['threads']} CPU thread(s): `OMP_NUM_THREADS={meta['threads']}`):",
        "",
        "```",
        meta["command"],
        "```",
        "",
        f"- corpus: {c['answers']} answers ({c['train_answers']} trained on, {c['held_out_answers']} held out), "
        f"{c['tokens']} tokens, of which {c['generated_tokens']} are the target's greedy answers "
        + (f"({cfg['new_tokens']} new tokens at most, chat template)" if not cfg.get("corpus")
           else "(as long as the corpus holds them)")
        + f"; source `{c['source']}`",
        f"- wall time ({meta['threads']} thread(s)): features {s['features']:.0f} s, training {s['train']:.0f} s"
        + (f", generation {s['generate']:.0f} s" if s.get("generate") else "")
        + (f"; the whole command, model loading included, {s['invocation']:.0f} s" if "invocation" in s else ""),
        f"- held-out top-1 accuracy per head (token t+2, t+3, ...): "
        + ", ".join(f"{row[0]:.3f}" for row in meta["heldout_accuracy"])
        + f"; top-5: " + ", ".join(f"{sum(row[:5]):.3f}" for row in meta["heldout_accuracy"]),
        "- final training loss (weighted sum over heads, mean of the last checkpoint interval) "
        f"{last.get('loss', float('nan')):.3f}",
    ]
    for entry in meta.get("heldout", []):
        lines.append(f"- {entry}")
    lines += ["", "Trees from the held-out accuracy (`specdec.training.medusa.best_choice_paths`), expected tau:", ""]
    for size, t in meta["trees"].items():
        lines.append(f"- {size} nodes: {t['expected_tau']:.3f}")
    lines += ["", "Checkpoints (step, loss, held-out top-1 per head):", ""]
    for row in meta["history"]:
        loss = f"{row['loss']:.3f}" if "loss" in row else "-"
        lines.append(f"- {row['step']}: {loss}, " + ", ".join(f"{a:.3f}" for a in row["val_top1"]))
    return "\n".join(lines) + "\n"
