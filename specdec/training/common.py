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
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from specdec.errors import ConfigError
from specdec.models.llama import LlamaModel

CORPUS_FILE = "corpus.pt"
TEACHER_FILE = "teacher.pt"
CHECKPOINT_FILE = "checkpoint.pt"

Progress = Callable[[str, int, int, dict], None]  # (stage, done, total, fields) -> None


def _no_progress(stage: str, done: int, total: int, fields: dict) -> None:
    pass


@dataclass
class Corpus:
    """Prompts (token ids, chat template applied) and the target's greedy answers."""

    prompt_ids: list[list[int]] = field(default_factory=list)
    response_ids: list[list[int]] = field(default_factory=list)
    seconds: float = 0.0  # wall time spent producing it, summed over resumed runs

    @property
    def num_tokens(self) -> int:
        return sum(map(len, self.prompt_ids)) + sum(map(len, self.response_ids))


@dataclass
class Teacher:
    """Per sequence: the target's top-k next-token log-probs at each response position (the position of the
    last prompt token through the one before the last response token)."""

    ids: list[Tensor] = field(default_factory=list)  # [R_i, k] int32
    logp: list[Tensor] = field(default_factory=list)  # [R_i, k] float32, log-probs over the full vocabulary
    seconds: float = 0.0


# ------------------------------------------------------------------------------------------ dense forward
def dense_forward(model: LlamaModel, ids: Tensor, capture: dict[int, Tensor] | None = None) -> Tensor:
    """Final-norm hidden states [B, T, H] of a right-padded batch [B, T], causal attention, positions 0..T-1.

    The same modules as the engine's paged forward, without a cache: padding sits after every real token, so
    causal attention never lets a real token see it. If `capture` holds layer indices as keys, their values are
    replaced by the residual stream entering those layers (EAGLE-3's fused features).
    """
    c = model.config
    batch, length = ids.shape
    positions = torch.arange(length, device=ids.device).repeat(batch)
    x = model.embed_tokens(ids)
    for index, layer in enumerate(model.layers):
        if capture is not None and index in capture:
            capture[index] = x
        attn = layer.self_attn
        q, k, v = attn.qkv_proj(layer.input_layernorm(x)).split([c.q_size, c.kv_size, c.kv_size], dim=-1)
        q, k = model.rope(positions, q.reshape(-1, c.num_heads, c.head_dim), k.reshape(-1, c.num_kv_heads, c.head_dim))
        q = q.view(batch, length, c.num_heads, c.head_dim).transpose(1, 2)
        k = k.view(batch, length, c.num_kv_heads, c.head_dim).transpose(1, 2)
        v = v.view(batch, length, c.num_kv_heads, c.head_dim).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=attn.scale,
                                             enable_gqa=c.num_heads != c.num_kv_heads)
        x = x + attn.o_proj(out.transpose(1, 2).reshape(batch, length, c.q_size))
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    return model.norm(x)


def _batch(corpus: Corpus, indices: list[int], device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
    """Padded ids [B, T] and the (row, column) of every response-predicting position, sequence by sequence."""
    seqs = [corpus.prompt_ids[i] + corpus.response_ids[i] for i in indices]
    length = max(map(len, seqs))
    ids = torch.zeros(len(seqs), length, dtype=torch.int64)
    rows, cols = [], []
    for b, (i, seq) in enumerate(zip(indices, seqs)):
        ids[b, : len(seq)] = torch.tensor(seq)
        start = len(corpus.prompt_ids[i]) - 1
        n = len(corpus.response_ids[i])
        rows.extend([b] * n)
        cols.extend(range(start, start + n))
    return ids.to(device), torch.tensor(rows, device=device), torch.tensor(cols, device=device)


# --------------------------------------------------------------------------------------------- stage 1
def generate_corpus(llm: Any, prompts: list[str], new_tokens: int, path: Path, resume: Corpus | None = None,
                    chunk: int = 64, progress: Progress = _no_progress) -> Corpus:
    """Greedy answers of the target, `chunk` prompts at a time through the engine, saved after each chunk."""
    from specdec.config import SamplingParams

    corpus = resume or Corpus()
    params = SamplingParams(max_new_tokens=new_tokens)
    total = len(prompts) * new_tokens
    done = len(corpus.response_ids) * new_tokens
    progress("generate", done, total, {})
    while len(corpus.response_ids) < len(prompts):
        start = time.perf_counter()
        batch = prompts[len(corpus.response_ids): len(corpus.response_ids) + chunk]
        outputs: dict[int, Any] = {}
        for delta in llm.stream(batch, params, chat=True):
            done += len(delta.token_ids)
            if delta.finished:
                outputs[delta.index] = delta.output
                done += new_tokens - len(delta.output.token_ids)  # stopped early (EOS)
            progress("generate", done, total, {})
        for i in range(len(batch)):
            corpus.prompt_ids.append(list(outputs[i].prompt_token_ids))
            corpus.response_ids.append(list(outputs[i].token_ids))
        corpus.seconds += time.perf_counter() - start
        save_atomic(asdict(corpus), path)
    return corpus


def obtain_corpus(cfg: Any, loaded: Any, out: Path, resume: bool, progress: Progress, min_size: int) -> Corpus:
    """The corpus a feature-drafter trainer learns from: `cfg.corpus` reused (e.g. `specdec train draft`'s, so
    the target answers each prompt once for every trainer), else generated into OUT (and resumed from there).

    `cfg` needs `corpus`, `max_prompts`, `new_tokens` and what `prompt_texts` reads.
    """
    from specdec.api import LLM
    from specdec.config import EngineConfig

    if cfg.corpus:
        source = Path(cfg.corpus).expanduser()
        if not source.is_file():
            raise ConfigError(f"--corpus {source} does not exist")
        corpus = load_corpus(source)
        corpus = Corpus(corpus.prompt_ids[: cfg.max_prompts], corpus.response_ids[: cfg.max_prompts], corpus.seconds)
        vocab = loaded.model.config.vocab_size
        top = max((max(p + r) for p, r in zip(corpus.prompt_ids, corpus.response_ids) if p + r), default=0)
        if top >= vocab:
            raise ConfigError(f"corpus {source} holds token id {top}, beyond the target's vocabulary of {vocab}: "
                              "it was made for another target")
    else:
        path = out / CORPUS_FILE
        texts = prompt_texts(cfg)
        corpus = load_corpus(path) if resume and path.is_file() else None
        if corpus is None or len(corpus.response_ids) < len(texts):
            llm = LLM.from_loaded(loaded, engine_config=EngineConfig(max_num_seqs=64))
            corpus = generate_corpus(llm, texts, cfg.new_tokens, path, corpus, progress=progress)
    if len(corpus.response_ids) < min_size:
        raise ConfigError(f"{len(corpus.response_ids)} answers are too few: training needs at least --val-prompts "
                          f"+ --batch-size ({min_size})")
    return corpus


# --------------------------------------------------------------------------------------------- stage 2
@torch.inference_mode()
def teacher_topk(target: LlamaModel, corpus: Corpus, topk: int, path: Path, resume: Teacher | None = None,
                 batch_tokens: int = 4096, bf16: bool = False, progress: Progress = _no_progress) -> Teacher:
    """The target's top-k log-probs at every response position, saved every few batches."""
    teacher = resume or Teacher()
    n = len(corpus.response_ids)
    start_index = len(teacher.ids)
    last_save = time.perf_counter()
    progress("teacher", start_index, n, {})
    index = start_index
    while index < n:
        start = time.perf_counter()
        indices = [index]
        longest = len(corpus.prompt_ids[index]) + len(corpus.response_ids[index])
        while index + len(indices) < n:
            nxt = index + len(indices)
            longer = max(longest, len(corpus.prompt_ids[nxt]) + len(corpus.response_ids[nxt]))
            if longer * (len(indices) + 1) > batch_tokens:
                break
            indices.append(nxt)
            longest = longer
        ids, rows, cols = _batch(corpus, indices, target.device)
        with torch.autocast(target.device.type, dtype=torch.bfloat16, enabled=bf16):
            hidden = dense_forward(target, ids)[rows, cols]
            logits = target.lm_head(hidden)
        logp = torch.log_softmax(logits.float(), dim=-1)
        top = logp.topk(topk, dim=-1)
        counts = [len(corpus.response_ids[i]) for i in indices]
        teacher.ids.extend(t.to("cpu", torch.int32) for t in top.indices.split(counts))
        teacher.logp.extend(t.to("cpu", torch.float32) for t in top.values.split(counts))
        index += len(indices)
        teacher.seconds += time.perf_counter() - start
        progress("teacher", index, n, {})
        if index == n or time.perf_counter() - last_save > 60:
            save_atomic(asdict(teacher), path)
            last_save = time.perf_counter()
    return teacher


# --------------------------------------------------------------------------------------------- stage 3
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


def coarse_kl(draft_logits: Tensor, teacher_ids: Tensor, teacher_logp: Tensor) -> Tensor:
    """Per-position KL(teacher || draft) over the teacher's top-k tokens plus one bucket for all others. [N]"""
    logq_all = torch.log_softmax(draft_logits.float(), dim=-1)
    logq = logq_all.gather(1, teacher_ids.long())
    logp = teacher_logp
    p = logp.exp()
    p_rest = (1 - p.sum(-1)).clamp_min(1e-8)
    q_rest_log = torch.log1p(-logq.exp().sum(-1).clamp(max=1 - 1e-6))
    return (p * (logp - logq)).sum(-1) + p_rest * (p_rest.log() - q_rest_log)


@dataclass(frozen=True)
class TrainSettings:
    steps: int
    batch_size: int = 16  # sequences per step (~1,000 response positions at 64 new tokens)
    lr: float = 1e-3
    warmup: int = 20
    weight_decay: float = 0.0
    seed: int = 0
    checkpoint_every: int = 25
    bf16: bool = False  # autocast the draft's matmuls (the LM head dominates: 28M of its 35M MACs per token)


@dataclass
class TrainState:
    step: int = 0
    seconds: float = 0.0
    history: list[dict] = field(default_factory=list)  # {"step", "loss", "val_kl", "val_top1"} at checkpoints


def lr_at(step: int, s: TrainSettings) -> float:
    """Linear warm-up, then cosine decay to a tenth of the peak."""
    if step < s.warmup:
        return s.lr * (step + 1) / s.warmup
    frac = (step - s.warmup) / max(1, s.steps - s.warmup)
    return s.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def batch_indices(step: int, train: list[int], s: TrainSettings) -> list[int]:
    """The sequences of step `step`: epoch-wise permutations seeded by (seed, epoch), so a resumed run
    draws exactly the batches the uninterrupted run would have."""
    per_epoch = max(1, len(train) // s.batch_size)
    epoch, k = divmod(step, per_epoch)
    order = torch.randperm(len(train), generator=torch.Generator().manual_seed(s.seed * 100_003 + epoch))
    return [train[int(i)] for i in order[k * s.batch_size: (k + 1) * s.batch_size]]


def optimise(optimizer: torch.optim.Optimizer, params: list[Tensor], s: TrainSettings, state: Any, train: list[int],
             batch_loss: Callable[[list[int]], Tensor], checkpoint: Callable[[dict], dict],
             snapshot: Callable[[], dict], path: Path, progress: Progress = _no_progress) -> None:
    """The training loop every trainer shares: warm-up/cosine learning rate, resumable batches, gradient
    clipping, and every `checkpoint_every` steps `checkpoint(fields)` (evaluates, appends to `state.history`,
    returns the fields to show) and a saved checkpoint (`state`, `snapshot()`, the optimizer) at `path`.

    `state` is a dataclass with `step`, `seconds` and `history`; evaluation time counts, saving does not.
    """
    recent: list[float] = []
    progress("train", state.step, s.steps, {})
    while state.step < s.steps:
        start = time.perf_counter()
        for group in optimizer.param_groups:
            group["lr"] = lr_at(state.step, s)
        loss = batch_loss(batch_indices(state.step, train, s))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        state.step += 1
        recent = (recent + [loss.item()])[-s.checkpoint_every:]
        state.seconds += time.perf_counter() - start
        fields: dict[str, Any] = {"loss": sum(recent) / len(recent)}
        if state.step % s.checkpoint_every == 0 or state.step == s.steps:
            start = time.perf_counter()
            fields = checkpoint(fields)
            state.seconds += time.perf_counter() - start
            save_atomic({"state": asdict(state), **snapshot(), "optimizer": optimizer.state_dict()}, path)
        progress("train", state.step, s.steps, fields)


def train_draft(draft: LlamaModel, corpus: Corpus, teacher: Teacher, train: list[int], val: list[int],
                s: TrainSettings, path: Path, state: TrainState | None = None,
                progress: Progress = _no_progress) -> TrainState:
    """AdamW on the coarse KL; checkpoints (weights, optimizer, step, history) every `checkpoint_every` steps."""
    params = trainable_parameters(draft)
    for p in params.values():
        p.requires_grad_(True)
    optimizer = torch.optim.AdamW(params.values(), lr=s.lr, betas=(0.9, 0.95), weight_decay=s.weight_decay)
    state = state or TrainState()
    if state.step:
        load_checkpoint_into(path, draft, optimizer)
    def checkpoint(fields: dict) -> dict:
        fields.update(evaluate(draft, corpus, teacher, val, s.bf16))
        state.history.append({"step": state.step, **fields})
        return fields

    optimise(optimizer, list(params.values()), s, state, train,
             lambda batch: _loss(draft, corpus, teacher, batch, s.bf16).mean(), checkpoint,
             lambda: {"params": {k: p.detach() for k, p in params.items()}}, path, progress)
    for p in params.values():
        p.requires_grad_(False)
    return state


def _loss(draft: LlamaModel, corpus: Corpus, teacher: Teacher, indices: list[int], bf16: bool) -> Tensor:
    ids, rows, cols = _batch(corpus, indices, draft.device)
    with torch.autocast(draft.device.type, dtype=torch.bfloat16, enabled=bf16):
        logits = draft.lm_head(dense_forward(draft, ids)[rows, cols])
    t_ids = torch.cat([teacher.ids[i] for i in indices]).to(draft.device)
    t_logp = torch.cat([teacher.logp[i] for i in indices]).to(draft.device)
    return coarse_kl(logits, t_ids, t_logp)


@torch.no_grad()
def evaluate(draft: LlamaModel, corpus: Corpus, teacher: Teacher, val: list[int], bf16: bool = False,
             batch_size: int = 16) -> dict[str, float]:
    """Held-out KL and top-1 agreement (draft argmax == target argmax: what greedy acceptance needs)."""
    kl_sum, agree, count = 0.0, 0, 0
    for b in range(0, len(val), batch_size):
        indices = val[b: b + batch_size]
        ids, rows, cols = _batch(corpus, indices, draft.device)
        with torch.autocast(draft.device.type, dtype=torch.bfloat16, enabled=bf16):
            logits = draft.lm_head(dense_forward(draft, ids)[rows, cols]).float()
        t_ids = torch.cat([teacher.ids[i] for i in indices]).to(draft.device)
        t_logp = torch.cat([teacher.logp[i] for i in indices]).to(draft.device)
        kl_sum += float(coarse_kl(logits, t_ids, t_logp).sum())
        agree += int((logits.argmax(-1) == t_ids[:, 0].long()).sum())
        count += len(rows)
    return {"val_kl": kl_sum / max(1, count), "val_top1": agree / max(1, count)}


# -------------------------------------------------------------------------------------------- files
def save_atomic(obj: Any, path: Path) -> None:
    """torch.save through a temporary file, so an interrupted run never leaves a truncated checkpoint."""
    tmp = path.with_name(path.name + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def load_corpus(path: Path) -> Corpus:
    return Corpus(**torch.load(path, weights_only=True))


def load_teacher(path: Path) -> Teacher:
    return Teacher(**torch.load(path, weights_only=True))


def load_train_state(path: Path) -> TrainState:
    return TrainState(**torch.load(path, weights_only=True)["state"])


def load_checkpoint_into(path: Path, draft: LlamaModel, optimizer: torch.optim.Optimizer | None = None) -> None:
    saved = torch.load(path, weights_only=True)
    params = trainable_parameters(draft)
    with torch.no_grad():
        for name, tensor in saved["params"].items():
            params[name].copy_(tensor)
    if optimizer is not None:
        optimizer.load_state_dict(saved["optimizer"])


# ------------------------------------------------------------------------------------------- a whole run
@dataclass(frozen=True)
class DistillConfig:
    """Everything that decides what a run produces (`run.json` in the run folder; `--resume` must match)."""

    target: str = "smollm2-135m"
    prompts: str | None = None  # JSONL prompt file; None = the package's training corpus
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

    def command(self, out: Path, threads: int | None) -> str:
        """The `specdec train draft` command line that reproduces this run."""
        d = DistillConfig()
        parts = ["specdec train draft", f"--target {self.target}"]
        if self.prompts:
            parts.append(f"--prompts {self.prompts}")
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
        parts += [f"--threads {threads}"] if threads else []
        return " ".join(parts)


def prompt_texts(cfg: DistillConfig) -> list[str]:
    """The run's prompts: the corpus shuffled with the seed (files are sorted by category), then cut."""
    from specdec.data import load_prompts, train_prompts

    records = load_prompts(cfg.prompts) if cfg.prompts else train_prompts()
    order = torch.randperm(len(records), generator=torch.Generator().manual_seed(cfg.seed)).tolist()
    texts = [records[i]["prompt"] for i in order][: cfg.max_prompts]
    if len(texts) < cfg.val_prompts + cfg.batch_size:
        raise ConfigError(f"{len(texts)} prompts are too few: training needs at least --val-prompts "
                          f"({cfg.val_prompts}) + --batch-size ({cfg.batch_size})")
    return texts


def check_run_folder(out: Path, cfg: DistillConfig, resume: bool) -> None:
    """Refuse to mix two runs in one folder: a new run needs an empty one, a resumed run the same settings."""
    import json

    run_file = out / "run.json"
    if run_file.is_file():
        if not resume:
            raise ConfigError(f"{out} already holds a run; pass --resume to continue it or choose another --out")
        saved = json.loads(run_file.read_text())
        mine = json.loads(json.dumps(asdict(cfg)))
        changed = sorted(k for k in set(saved) | set(mine) if saved.get(k) != mine.get(k))
        if changed:
            detail = ", ".join(f"{k}: {saved.get(k)!r} -> {mine.get(k)!r}" for k in changed)
            raise ConfigError(f"--resume with other settings than the run in {out} ({detail})")
    out.mkdir(parents=True, exist_ok=True)
    run_file.write_text(json.dumps(asdict(cfg), indent=2) + "\n")


def run_distillation(cfg: DistillConfig, out: Path, resume: bool = False, loaded: Any = None,
                     progress: Progress = _no_progress, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Corpus -> teacher -> training -> the draft folder `out/draft`; returns the numbers for its README."""
    from specdec.api import LLM
    from specdec.config import EngineConfig
    from specdec.drafters.heads.draft_folder import write_draft_folder
    from specdec.models.loader import load_model

    torch.manual_seed(cfg.seed)
    check_run_folder(out, cfg, resume)
    texts = prompt_texts(cfg)
    if loaded is None:
        loaded = load_model(cfg.target, "cpu", "float32", show_progress=True)
    target = loaded.model
    if cfg.layers < 1 or cfg.layers >= target.config.num_layers:
        raise ConfigError(f"--layers must be between 1 and {target.config.num_layers - 1}, got {cfg.layers}")

    corpus_path, teacher_path, ckpt_path = out / CORPUS_FILE, out / TEACHER_FILE, out / CHECKPOINT_FILE
    corpus = load_corpus(corpus_path) if resume and corpus_path.is_file() else None
    if corpus is None or len(corpus.response_ids) < len(texts):
        llm = LLM.from_loaded(loaded, engine_config=EngineConfig(max_num_seqs=64))
        corpus = generate_corpus(llm, texts, cfg.new_tokens, corpus_path, corpus, progress=progress)
    log(f"corpus: {len(texts)} prompts, {corpus.num_tokens} tokens "
        f"({sum(map(len, corpus.response_ids))} generated) in {corpus.seconds:.0f} s")

    teacher = load_teacher(teacher_path) if resume and teacher_path.is_file() else None
    if teacher is None or len(teacher.ids) < len(texts):
        teacher = teacher_topk(target, corpus, cfg.topk, teacher_path, teacher, bf16=cfg.teacher_bf16,
                               progress=progress)
    log(f"teacher: top-{cfg.topk} log-probs at {sum(len(t) for t in teacher.ids)} positions "
        f"in {teacher.seconds:.0f} s")

    n = len(texts)
    train, val = list(range(n - cfg.val_prompts)), list(range(n - cfg.val_prompts, n))
    settings = TrainSettings(steps=cfg.steps, batch_size=cfg.batch_size, lr=cfg.lr, seed=cfg.seed,
                             bf16=cfg.train_bf16)
    draft = init_draft(target, cfg.layers, cfg.init_from)
    state = load_train_state(ckpt_path) if resume and ckpt_path.is_file() else None
    if state is None:
        start = time.perf_counter()
        initial = evaluate(draft, corpus, teacher, val, cfg.train_bf16)
        state = TrainState(seconds=time.perf_counter() - start, history=[{"step": 0, **initial}])
    state = train_draft(draft, corpus, teacher, train, val, settings, ckpt_path, state, progress=progress)
    final = state.history[-1]
    log(f"train: {state.step} steps in {state.seconds:.0f} s; loss {final.get('loss', float('nan')):.3f}, "
        f"held-out KL {final['val_kl']:.3f}, top-1 agreement {final['val_top1']:.3f}")

    meta = {
        "target": cfg.target,
        "command": cfg.command(out, torch.get_num_threads()),
        "settings": asdict(cfg),
        "init_from": list(cfg.init_from or range(cfg.layers)),
        "corpus": {"prompts": n, "train_prompts": len(train), "held_out_prompts": len(val),
                   "tokens": corpus.num_tokens, "generated_tokens": sum(map(len, corpus.response_ids)),
                   "source": cfg.prompts or "specdec/data/train_prompts.jsonl"},
        "seconds": {"generate": round(corpus.seconds, 1), "teacher": round(teacher.seconds, 1),
                    "train": round(state.seconds, 1),
                    "total": round(corpus.seconds + teacher.seconds + state.seconds, 1)},
        "threads": torch.get_num_threads(),
        "history": state.history,
        "final": final,
    }
    write_draft_folder(draft, out / "draft", meta)
    return meta


def measure_tau(loaded: Any, drafter: str, tree: str | None, prompts: list[str], new_tokens: int) -> dict[str, float]:
    """Greedy mean tokens per target step (the bonus token counted) over `prompts`, with `tree` (None: the
    drafter's default). Adaptive speculation is off: tau measures the drafter on full trees, not the planner's
    choices."""
    from specdec.api import LLM
    from specdec.config import EngineConfig, SamplingParams

    llm = LLM.from_loaded(loaded, drafter=drafter, tree=tree, quantize=loaded.quantized,
                          engine_config=EngineConfig(adaptive_speculation=False))
    outputs = llm.generate(prompts, SamplingParams(max_new_tokens=new_tokens))
    tokens = sum(sum(o.metrics.accepted_per_step) for o in outputs)
    steps = sum(o.metrics.target_steps for o in outputs)
    return {"tau": tokens / steps if steps else 0.0, "steps": steps, "tokens": tokens}


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
        f"{cfg['topk']} next-token log-probs (plus one bucket for the rest) at every answer position.",
        "",
        "Made with (one CPU thread: `OMP_NUM_THREADS=1`):",
        "",
        "```",
        meta["command"],
        "```",
        "",
        f"- corpus: {c['prompts']} prompts from `{c['source']}` ({c['train_prompts']} trained on, "
        f"{c['held_out_prompts']} held out), {c['tokens']} tokens, of which {c['generated_tokens']} are the "
        f"target's greedy answers ({cfg['new_tokens']} new tokens at most, chat template)",
        f"- wall time ({meta['threads']} thread): generation {s['generate']:.0f} s, target distributions "
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
