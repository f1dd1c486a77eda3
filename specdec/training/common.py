"""What every trainer shares: the corpus the target writes, its teacher distribution, one optimisation loop with
checkpoints, run folders, and tau measurement.

`specdec train draft|medusa|eagle|eagle3` (training/draft.py, medusa.py, eagle.py) each add their own model
and loss on top of these pieces.
"""

from __future__ import annotations

import math
import os
import random
import time
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Callable

import torch
from torch import Tensor

from specdec.errors import ConfigError
from specdec.models.dense import dense_forward
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


def corpus_sources(corpus: str | list[str] | None) -> list[str]:
    """A trainer config's `corpus` as a list: none, one, or several (`--corpus` repeated) to train on together."""
    if not corpus:
        return []
    return [corpus] if isinstance(corpus, str) else list(corpus)


def read_corpus(source: str, loaded: Any) -> Corpus:
    """One `--corpus`: a `specdec data build` folder (its training records) or a corpus.pt of an earlier run."""
    path = Path(source).expanduser()
    if path.is_dir():
        return corpus_from_store(path, loaded)
    if not path.is_file():
        raise ConfigError(f"--corpus {path} does not exist")
    return load_corpus(path)


def mixed_corpus(parts: list[Corpus], seed: int = 0) -> Corpus:
    """Several corpora as one, their sequences shuffled together (fixed seed), so that a `--max-prompts` cut, the
    batches and the held-out tail draw from all of them in proportion."""
    if len(parts) == 1:
        return parts[0]
    pairs = [pair for part in parts for pair in zip(part.prompt_ids, part.response_ids)]
    random.Random(seed).shuffle(pairs)
    return Corpus([p for p, _ in pairs], [r for _, r in pairs], sum(part.seconds for part in parts))


def obtain_corpus(cfg: Any, loaded: Any, out: Path, resume: bool, progress: Progress, min_size: int) -> Corpus:
    """The corpus a feature-drafter trainer learns from: `cfg.corpus` reused (one source or several, mixed; e.g.
    `specdec train draft`'s, so the target answers each prompt once for every trainer), else generated into OUT
    (and resumed from there).

    `cfg` needs `corpus`, `max_prompts`, `new_tokens` and what `prompt_texts` reads.
    """
    from specdec.api import LLM
    from specdec.config import EngineConfig

    sources = corpus_sources(cfg.corpus)
    if sources:
        corpus = mixed_corpus([read_corpus(source, loaded) for source in sources])
        corpus = Corpus(corpus.prompt_ids[: cfg.max_prompts], corpus.response_ids[: cfg.max_prompts], corpus.seconds)
        vocab = loaded.model.config.vocab_size
        top = max((max(p + r) for p, r in zip(corpus.prompt_ids, corpus.response_ids) if p + r), default=0)
        if top >= vocab:
            raise ConfigError(f"corpus {', '.join(sources)} holds token id {top}, beyond the target's vocabulary of "
                              f"{vocab}: it was made for another target")
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
        # copy=True: a view would carry the whole batch's storage into the file (`asdict` deep-copies each
        # sequence's view with all of it), which made the teacher file several times the size of its numbers
        teacher.logp.extend(t.to("cpu", torch.float32, copy=True) for t in top.values.split(counts))
        index += len(indices)
        teacher.seconds += time.perf_counter() - start
        progress("teacher", index, n, {})
        if index == n or time.perf_counter() - last_save > 60:
            save_atomic(asdict(teacher), path)
            last_save = time.perf_counter()
    return teacher


# --------------------------------------------------------------------------------------------- stage 3






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








# -------------------------------------------------------------------------------------------- files
def save_atomic(obj: Any, path: Path) -> None:
    """torch.save through a temporary file, so an interrupted run never leaves a truncated checkpoint."""
    tmp = path.with_name(path.name + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def load_corpus(path: Path) -> Corpus:
    return Corpus(**torch.load(path, weights_only=True))


def corpus_from_store(folder: Path, loaded: Any) -> Corpus:
    """The training records of a `specdec data build` corpus (every 10th record stays held out), after
    checking it was written with this target's tokenizer."""
    from specdec.training.corpus_store import is_held_out, load_records, tokenizer_fingerprint

    vocab = loaded.model.config.vocab_size
    records = load_records(folder, vocab, tokenizer_fingerprint(loaded.tokenizer, vocab))
    kept = [r for i, r in enumerate(records) if not is_held_out(i)]
    return Corpus([r["prompt_ids"] for r in kept], [r["token_ids"] for r in kept])


def load_teacher(path: Path) -> Teacher:
    return Teacher(**torch.load(path, weights_only=True))


def load_train_state(path: Path) -> TrainState:
    return TrainState(**torch.load(path, weights_only=True)["state"])




# ------------------------------------------------------------------------------------------- a whole run




def prompt_texts(cfg: Any) -> list[str]:
    """The run's prompts: the corpus shuffled with the seed (files are sorted by category), then cut."""
    from specdec.data import load_prompts, train_prompts

    records = load_prompts(cfg.prompts) if cfg.prompts else train_prompts()
    order = torch.randperm(len(records), generator=torch.Generator().manual_seed(cfg.seed)).tolist()
    texts = [records[i]["prompt"] for i in order][: cfg.max_prompts]
    if len(texts) < cfg.val_prompts + cfg.batch_size:
        raise ConfigError(f"{len(texts)} prompts are too few: training needs at least --val-prompts "
                          f"({cfg.val_prompts}) + --batch-size ({cfg.batch_size})")
    return texts


def check_run_folder(out: Path, cfg: Any, resume: bool) -> None:
    """Refuse to mix two runs in one folder: a new run needs an empty one, a resumed run the same settings.
    Checked before the target loads; `start_run_folder` writes the run's settings once the settings that need
    the target (its vocabulary, its layers) have been checked too, so that a refused run leaves no folder."""
    import json

    run_file = out / "run.json"
    if run_file.is_file():
        if not resume:
            raise ConfigError(f"{out} already holds a run; pass --resume to continue it or choose another --out")
        saved = json.loads(run_file.read_text())
        for f in fields(cfg):  # a setting added after the run was made: the run had its default
            if f.name not in saved and f.default is not MISSING:
                saved[f.name] = json.loads(json.dumps(f.default))
        mine = json.loads(json.dumps(asdict(cfg)))
        changed = sorted(k for k in set(saved) | set(mine) if saved.get(k) != mine.get(k))
        if changed:
            detail = ", ".join(f"{k}: {saved.get(k)!r} -> {mine.get(k)!r}" for k in changed)
            raise ConfigError(f"--resume with other settings than the run in {out} ({detail})")


def start_run_folder(out: Path, cfg: Any) -> None:
    """Create the run folder and record the run's settings (`check_run_folder` compares a resumed run with them)."""
    import json

    out.mkdir(parents=True, exist_ok=True)
    (out / "run.json").write_text(json.dumps(asdict(cfg), indent=2) + "\n")




def measure_tau(loaded: Any, drafter: str, tree: str | None, prompts: list[str], new_tokens: int,
                kv_cache_dtype: str = "auto") -> dict[str, float]:
    """Greedy mean tokens per target step (the bonus token counted) over `prompts`, with `tree` (None: the
    drafter's default) and the target's K/V cache in `kv_cache_dtype` (EngineConfig's). Adaptive speculation is
    off: tau measures the drafter on full trees, not the planner's choices."""
    from specdec.api import LLM
    from specdec.config import EngineConfig, SamplingParams

    llm = LLM.from_loaded(loaded, drafter=drafter, tree=tree, quantize=loaded.quantized,
                          engine_config=EngineConfig(adaptive_speculation=False, kv_cache_dtype=kv_cache_dtype))
    outputs = llm.generate(prompts, SamplingParams(max_new_tokens=new_tokens))
    tokens = sum(sum(o.metrics.accepted_per_step) for o in outputs)
    steps = sum(o.metrics.target_steps for o in outputs)
    return {"tau": tokens / steps if steps else 0.0, "steps": steps, "tokens": tokens}




