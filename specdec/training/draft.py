"""Self-distillation of a small draft model from its target (`specdec train draft`).

Three stages, each checkpointed into the run folder so that `--resume` continues where a run stopped:

1. corpus:  the target answers training prompts (chat template, greedy), batched through our engine.
2. teacher: one dense causal forward of the target over every prompt + response gives its next-token
            distribution at each response position; the top-k log-probabilities are kept (k=32: ~8 KB per
            64-token answer instead of 12 MB of full log-probs).
3. train:   the draft (a few decoder layers initialised from target layers, the target's final norm, and the
            target's embedding and tied LM head, frozen and shared) learns KL(target || draft) on those
            positions, teacher-forced, with a plain dense forward (SDPA, causal); no paged cache is needed to
            train, and the weights are the very modules the engine runs.

The KL is taken over k+1 outcomes: the teacher's top-k tokens and "any other token" (the rest of both
distributions lumped together). That is an exact KL of a coarsened distribution, so it is zero only when the
draft matches the teacher on the top-k, and unlike renormalising the top-k it does not let the draft put
mass on tokens the target considers unlikely.

With `--vocab N` the draft is trained through the target head's rows of the N most frequent target tokens
(what `draft:vocab=N` drafts with, and the folder's default then): the teacher's top-k tokens outside the N join
the "any other token" bucket, which the reduced head cannot spread mass into, so the KL still compares two
distributions over the same k'+1 outcomes. Training through the head it will draft with matters: a draft fitted
to the full head and cut to 4,096 rows afterwards renormalises over those rows at run time, which it never saw.
The head is a tenth of a 2-layer draft's training arithmetic over 49,152 rows; over 4,096, a fortieth.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from torch import Tensor

from specdec.drafters.heads.reduced_vocab import (
    OUTSIDE, check_vocab_option, reduced_from, target_to_draft, training_draft_ids,
)
from specdec.errors import ConfigError
from specdec.models.dense import dense_forward
from specdec.models.llama import LlamaModel
from specdec.training.common import (
    CHECKPOINT_FILE, TEACHER_FILE, Corpus, Progress, Teacher, TrainSettings, TrainState, _batch, _no_progress,
    check_run_folder, corpus_sources, load_teacher, load_train_state, measure_tau, obtain_corpus, optimise,
    prompt_texts, start_run_folder, teacher_topk,
)


def init_draft(target: LlamaModel, layers: int, init_from: tuple[int, ...] | None = None) -> LlamaModel:
    """A `layers`-layer draft whose layers are copies of target layers `init_from` (default: the first
    `layers`), with the target's final norm and the target's own embedding and LM head.

    Why the first layers: they expect the raw embeddings the draft is fed. Measured on SmolLM2 (24 steps on 48
    answers, held-out top-1 agreement): layers (0, 1) 0.14, (0, 15) 0.13, (0, 29) 0.10; the last layer
    expects a residual stream 29 layers deep, and with it the untrained draft's KL is 65 nats instead of 15."""
    from dataclasses import replace

    from specdec.drafters.heads.draft_folder import share_target_head
    from specdec.models.loader import build_model

    total = target.config.num_layers
    init_from = tuple(init_from) if init_from is not None else tuple(range(layers))
    if len(init_from) != layers or not all(0 <= i < total for i in init_from):
        raise ConfigError(f"init layers {init_from} must name {layers} target layers between 0 and {total - 1}")
    config = replace(target.config, num_layers=layers, tie_embeddings=True)  # the head is shared, never owned
    weights = {"embed_tokens.weight": target.embed_tokens.weight, "norm.weight": target.norm.weight.detach().clone()}
    for mine, theirs in enumerate(init_from):
        for name, tensor in target.layers[theirs].state_dict().items():
            weights[f"layers.{mine}.{name}"] = tensor.detach().clone()
    draft = build_model(config, weights, torch.float32, target.device)
    share_target_head(draft, target)
    return draft


def trainable_parameters(draft: LlamaModel) -> dict[str, torch.nn.Parameter]:
    """The draft's own weights: decoder layers and final norm (never the shared embedding and head)."""
    return {name: p for name, p in draft.named_parameters() if name.startswith(("layers.", "norm."))}


@dataclass
class TrainHead:
    """What the draft is scored through while training: the target's head (`to_draft` None), or its rows of a
    reduced vocabulary, with the map from target ids to the head's columns (OUTSIDE where a token has none)."""

    module: torch.nn.Module
    to_draft: Tensor | None = None
    ids: Tensor | None = None  # [N] the target id of each column

    @staticmethod
    def of(target: LlamaModel, target_name: str, vocab: int, answers: list[list[int]]) -> "TrainHead":
        if not vocab:
            return TrainHead(target.lm_head)
        ids = training_draft_ids(target_name, vocab, answers, target.config.vocab_size)
        head = reduced_from(target, ids)
        head.requires_grad_(False)
        return TrainHead(head, target_to_draft(head.ids, target.config.vocab_size).to(head.ids.device), head.ids)

    def target_ids(self, columns: Tensor) -> Tensor:
        """The target ids of head columns (an argmax, say)."""
        return columns if self.ids is None else self.ids[columns]


def coarse_kl(draft_logits: Tensor, teacher_ids: Tensor, teacher_logp: Tensor,
              to_draft: Tensor | None = None) -> Tensor:
    """Per-position KL(teacher || draft) over the teacher's top-k tokens plus one bucket for all others. [N]
    With `to_draft` (a reduced head's columns), top-k tokens outside the head count in the bucket."""
    logq_all = torch.log_softmax(draft_logits.float(), dim=-1)
    columns = teacher_ids.long() if to_draft is None else to_draft[teacher_ids.long()]
    outside = columns == OUTSIDE
    logq = logq_all.gather(1, columns.clamp_min(0)).masked_fill(outside, 0.0)
    p = teacher_logp.exp().masked_fill(outside, 0.0)
    q = logq.exp().masked_fill(outside, 0.0)
    p_rest = (1 - p.sum(-1)).clamp_min(1e-8)
    q_rest_log = torch.log1p(-q.sum(-1).clamp(max=1 - 1e-6))
    return (p * (teacher_logp - logq)).sum(-1) + p_rest * (p_rest.log() - q_rest_log)


def train_draft(draft: LlamaModel, corpus: Corpus, teacher: Teacher, train: list[int], val: list[int],
                s: TrainSettings, path: Path, state: TrainState | None = None,
                progress: Progress = _no_progress, head: TrainHead | None = None) -> TrainState:
    """AdamW on the coarse KL; checkpoints (weights, optimizer, step, history) every `checkpoint_every` steps."""
    params = trainable_parameters(draft)
    for p in params.values():
        p.requires_grad_(True)
    optimizer = torch.optim.AdamW(params.values(), lr=s.lr, betas=(0.9, 0.95), weight_decay=s.weight_decay)
    head = head or TrainHead(draft.lm_head)
    state = state or TrainState()
    if state.step:
        load_checkpoint_into(path, draft, optimizer)
    def checkpoint(fields: dict) -> dict:
        fields.update(evaluate(draft, corpus, teacher, val, s.bf16, head=head))
        state.history.append({"step": state.step, **fields})
        return fields

    optimise(optimizer, list(params.values()), s, state, train,
             lambda batch: _loss(draft, corpus, teacher, batch, s.bf16, head).mean(), checkpoint,
             lambda: {"params": {k: p.detach() for k, p in params.items()}}, path, progress)
    for p in params.values():
        p.requires_grad_(False)
    return state


def _loss(draft: LlamaModel, corpus: Corpus, teacher: Teacher, indices: list[int], bf16: bool,
          head: TrainHead) -> Tensor:
    ids, rows, cols = _batch(corpus, indices, draft.device)
    with torch.autocast(draft.device.type, dtype=torch.bfloat16, enabled=bf16):
        logits = head.module(dense_forward(draft, ids)[rows, cols])
    t_ids = torch.cat([teacher.ids[i] for i in indices]).to(draft.device)
    t_logp = torch.cat([teacher.logp[i] for i in indices]).to(draft.device)
    return coarse_kl(logits, t_ids, t_logp, head.to_draft)


@torch.no_grad()
def evaluate(draft: LlamaModel, corpus: Corpus, teacher: Teacher, val: list[int], bf16: bool = False,
             batch_size: int = 16, head: TrainHead | None = None) -> dict[str, float]:
    """Held-out KL and top-1 agreement (draft argmax == target argmax: what greedy acceptance needs)."""
    head = head or TrainHead(draft.lm_head)
    kl_sum, agree, count = 0.0, 0, 0
    for b in range(0, len(val), batch_size):
        indices = val[b: b + batch_size]
        ids, rows, cols = _batch(corpus, indices, draft.device)
        with torch.autocast(draft.device.type, dtype=torch.bfloat16, enabled=bf16):
            logits = head.module(dense_forward(draft, ids)[rows, cols]).float()
        t_ids = torch.cat([teacher.ids[i] for i in indices]).to(draft.device)
        t_logp = torch.cat([teacher.logp[i] for i in indices]).to(draft.device)
        kl_sum += float(coarse_kl(logits, t_ids, t_logp, head.to_draft).sum())
        agree += int((head.target_ids(logits.argmax(-1)) == t_ids[:, 0].long()).sum())
        count += len(rows)
    return {"val_kl": kl_sum / max(1, count), "val_top1": agree / max(1, count)}


def load_checkpoint_into(path: Path, draft: LlamaModel, optimizer: torch.optim.Optimizer | None = None) -> None:
    saved = torch.load(path, weights_only=True)
    params = trainable_parameters(draft)
    with torch.no_grad():
        for name, tensor in saved["params"].items():
            params[name].copy_(tensor)
    if optimizer is not None:
        optimizer.load_state_dict(saved["optimizer"])


@dataclass(frozen=True)
class DistillConfig:
    """Everything that decides what a run produces (`run.json` in the run folder; `--resume` must match)."""

    target: str = "smollm2-135m"
    prompts: str | None = None  # JSONL prompt file; None = the package's training corpus
    corpus: str | list[str] | None = None  # existing corpora (`specdec data build` folders, corpus.pt): no generation
    layers: int = 2
    init_from: tuple[int, ...] | None = None  # target layers to copy; None = the first `layers`
    max_prompts: int = 512
    new_tokens: int = 64
    steps: int = 300
    batch_size: int = 16
    lr: float = 1e-3
    topk: int = 32
    val_prompts: int = 24  # held out of training, for the KL / top-1 agreement printed at checkpoints
    seed: int = 0
    teacher_bf16: bool = False
    train_bf16: bool = False
    vocab: int = 0  # train through the N most frequent target tokens' head rows (`draft:vocab=N`); 0 = all

    def command(self, out: Path, threads: int | None) -> str:
        """The `specdec train draft` command line that reproduces this run."""
        d = DistillConfig()
        parts = ["specdec train draft", f"--target {self.target}"]
        if self.prompts:
            parts.append(f"--prompts {self.prompts}")
        parts += [f"--corpus {source}" for source in corpus_sources(self.corpus)]
        parts += [f"--out {out}", f"--layers {self.layers}"]
        if self.init_from is not None:
            parts.append("--init-from " + ",".join(map(str, self.init_from)))
        parts += [f"--max-prompts {self.max_prompts}", f"--new-tokens {self.new_tokens}", f"--steps {self.steps}"]
        for name, flag in (("batch_size", "--batch-size"), ("lr", "--lr"), ("topk", "--topk"),
                           ("val_prompts", "--val-prompts")):
            if getattr(self, name) != getattr(d, name):
                parts.append(f"{flag} {getattr(self, name)}")
        parts.append(f"--seed {self.seed}")
        parts += ["--teacher-bf16"] if self.teacher_bf16 else []
        parts += ["--train-bf16"] if self.train_bf16 else []
        parts += [f"--vocab {self.vocab}"] if self.vocab else []
        parts += [f"--threads {threads}"] if threads else []
        return " ".join(parts)


def run_distillation(cfg: DistillConfig, out: Path, resume: bool = False, loaded: Any = None,
                     progress: Progress = _no_progress, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Corpus -> teacher -> training -> the draft folder `out/draft`; returns the numbers for its README."""
    from specdec.drafters.heads.draft_folder import write_draft_folder
    from specdec.models.loader import load_model

    torch.manual_seed(cfg.seed)
    check_run_folder(out, cfg, resume)
    if not cfg.corpus:
        prompt_texts(cfg)  # too few prompts: said before the model loads
    if loaded is None:
        loaded = load_model(cfg.target, "cpu", "float32", show_progress=True)
    target = loaded.model
    if cfg.layers < 1 or cfg.layers >= target.config.num_layers:
        raise ConfigError(f"--layers must be between 1 and {target.config.num_layers - 1}, got {cfg.layers}")
    check_vocab_option(cfg.vocab, target.config.vocab_size)
    start_run_folder(out, cfg)

    teacher_path, ckpt_path = out / TEACHER_FILE, out / CHECKPOINT_FILE
    corpus = obtain_corpus(cfg, loaded, out, resume, progress, cfg.val_prompts + cfg.batch_size)
    n = len(corpus.response_ids)
    log(f"corpus: {n} answers, {corpus.num_tokens} tokens ({sum(map(len, corpus.response_ids))} generated)"
        + (f", reused from {', '.join(corpus_sources(cfg.corpus))}" if cfg.corpus else f" in {corpus.seconds:.0f} s"))

    teacher = load_teacher(teacher_path) if resume and teacher_path.is_file() else None
    if teacher is None or len(teacher.ids) < n:
        teacher = teacher_topk(target, corpus, cfg.topk, teacher_path, teacher, bf16=cfg.teacher_bf16,
                               progress=progress)
    log(f"teacher: top-{cfg.topk} log-probs at {sum(len(t) for t in teacher.ids)} positions "
        f"in {teacher.seconds:.0f} s")

    train, val = list(range(n - cfg.val_prompts)), list(range(n - cfg.val_prompts, n))
    settings = TrainSettings(steps=cfg.steps, batch_size=cfg.batch_size, lr=cfg.lr, seed=cfg.seed,
                             bf16=cfg.train_bf16)
    draft = init_draft(target, cfg.layers, cfg.init_from)
    head = TrainHead.of(target, cfg.target, cfg.vocab, corpus.response_ids)
    state = load_train_state(ckpt_path) if resume and ckpt_path.is_file() else None
    if state is None:
        start = time.perf_counter()
        initial = evaluate(draft, corpus, teacher, val, cfg.train_bf16, head=head)
        state = TrainState(seconds=time.perf_counter() - start, history=[{"step": 0, **initial}])
    state = train_draft(draft, corpus, teacher, train, val, settings, ckpt_path, state, progress=progress, head=head)
    final = state.history[-1]
    log(f"train: {state.step} steps in {state.seconds:.0f} s; loss {final.get('loss', float('nan')):.3f}, "
        f"held-out KL {final['val_kl']:.3f}, top-1 agreement {final['val_top1']:.3f}")

    generated = 0.0 if cfg.corpus else round(corpus.seconds, 1)  # a reused corpus was made by another command
    meta = {
        "target": cfg.target,
        "command": cfg.command(out, torch.get_num_threads()),
        "settings": asdict(cfg),
        "init_from": list(cfg.init_from or range(cfg.layers)),
        "corpus": {"prompts": n, "train_prompts": len(train), "held_out_prompts": len(val),
                   "tokens": corpus.num_tokens, "generated_tokens": sum(map(len, corpus.response_ids)),
                   "source": cfg.corpus or cfg.prompts or "specdec/data/train_prompts.jsonl"},
        "seconds": {"generate": generated, "teacher": round(teacher.seconds, 1), "train": round(state.seconds, 1),
                    "total": round(generated + teacher.seconds + state.seconds, 1)},
        "threads": torch.get_num_threads(),
        # the ids the head was trained over, so the folder drafts over them (`reduced_vocab.recorded_draft_ids`)
        **({"draft_vocab": cfg.vocab, "draft_ids": head.ids.tolist()} if cfg.vocab else {}),
        "history": state.history,
        "final": final,
    }
    write_draft_folder(draft, out / "draft", meta)
    return meta


def heldout_tau(loaded: Any, drafters: list[str], prompts: list[str], new_tokens: int = 64, k: int = 4,
                progress: Progress = _no_progress) -> dict[str, float]:
    """`measure_tau` of each drafter with a chain of k."""
    taus = {}
    for i, spec in enumerate(drafters):
        progress("eval", i, len(drafters), {"drafter": spec})
        taus[spec] = measure_tau(loaded, spec, f"chain:k={k}", prompts, new_tokens)["tau"]
    progress("eval", len(drafters), len(drafters), {})
    return taus


def render_readme(meta: dict[str, Any]) -> str:
    """The shipped folder's README: what it is, the exact command, and the numbers of the run."""
    c, s, f = meta["corpus"], meta["seconds"], meta["final"]
    cfg = meta["settings"]
    lines = [
        f"# Distilled draft for `{meta['target']}`",
        "",
        f"A {cfg['layers']}-layer draft model (decoder layers + final norm only, bf16) for speculative decoding "
        f"with `drafter=\"draft\"`. It reuses the target's embedding and tied LM head, so it loads only on top "
        f"of `{meta['target']}`. Its layers started as copies of target layers {meta['init_from']} and were "
        "trained on KL(target || draft) over the target's top-"
        f"{cfg['topk']} next-token log-probs (plus one bucket for the rest) at every answer position."
        + (f" It was trained through the target head's rows of the {meta['draft_vocab']} most frequent target "
           f"tokens (`--vocab {meta['draft_vocab']}`; the ids are in `specdec_draft.json` `draft_ids`), and drafts "
           f"over them by default (`draft:vocab=0` for the full head)." if meta.get("draft_vocab") else ""),
        "",
        f"Made with ({meta['threads']} CPU thread{'s' if meta['threads'] > 1 else ''}):",
        "",
        "```",
        meta["command"],
        "```",
        "",
        f"- corpus: {c['prompts']} prompts from `{c['source']}` ({c['train_prompts']} trained on, "
        f"{c['held_out_prompts']} held out), {c['tokens']} tokens, of which {c['generated_tokens']} are the "
        "target's greedy answers" + ("" if cfg.get("corpus") else
                                     f" ({cfg['new_tokens']} new tokens at most, chat template)"),
        f"- wall time ({meta['threads']} thread{'s' if meta['threads'] > 1 else ''}): generation {s['generate']:.0f} s, target distributions "
        f"{s['teacher']:.0f} s, training {s['train']:.0f} s; total {s['total']:.0f} s ({s['total'] / 60:.1f} min)"
        + (f"; the whole command, model loading included, {s['invocation']:.0f} s" if "invocation" in s else ""),
        f"- final training loss (mean over the last checkpoint interval) {f.get('loss', float('nan')):.3f} nats; "
        f"held-out answers: KL {f['val_kl']:.3f} nats, top-1 agreement with the target {f['val_top1']:.3f}",
    ]
    h = meta.get("heldout")
    if h:
        lines += [
            f"- held-out tau (mean tokens per target step, bonus counted; greedy, `{h['tree']}`, "
            f"{h['prompts']} prompts of `specdec/data/prompts` split `{h['split']}`, {h['per_category']} per category, "
            f"{h['new_tokens']} new tokens): distilled **{h['tau_distilled']:.3f}** vs early-exit "
            f"(`{h['early_exit_spec']}`) {h['tau_early_exit']:.3f}",
        ]
    lines += ["", "Checkpoints (step, mean loss, held-out KL, held-out top-1):", ""]
    for row in meta["history"]:
        loss = f"{row['loss']:.3f}" if "loss" in row else "-"
        lines.append(f"- {row['step']}: {loss}, {row['val_kl']:.3f}, {row['val_top1']:.3f}")
    return "\n".join(lines) + "\n"
