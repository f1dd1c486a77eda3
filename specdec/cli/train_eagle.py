"""`specdec train eagle|eagle3`: self-distil an EAGLE predictor for a target (see `specdec.training.eagle`).

Any JSONL prompt file works (`--prompts FILE.jsonl`, one `{"prompt": "..."}` per line), or an existing corpus of
the target's answers (`--corpus RUN/corpus.pt`, e.g. from `specdec train draft`), which skips generation.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import List, Optional

import typer

from specdec.cli.common import CORPUS, corpus_setting, console, err_console, fail
from specdec.errors import ConfigError, SpecdecError

_LABELS = {"generate": "generating answers (tokens)", "features": "target features (sequences)",
           "labels": "target labels (sequences)", "train": "training the predictor (steps)"}


def command(kind: str):
    """The `specdec train eagle` (or `eagle3`) command function."""

    def command(
        target: str = typer.Option("smollm2-135m", help="The target (alias, HF folder, .gguf)."),
        prompts: Optional[Path] = typer.Option(None, help="JSONL prompt file; default: the package's corpus."),
        corpus: Optional[List[Path]] = CORPUS,
        out: Path = typer.Option(..., help=f"Run folder: checkpoints, and the predictor in OUT/{kind}."),
        max_prompts: int = typer.Option(512, help="Prompts (or corpus sequences) to use."),
        new_tokens: int = typer.Option(64, help="Greedy answer length per prompt (when generating)."),
        steps: int = typer.Option(300, help="Optimizer steps."),
        batch_size: int = typer.Option(8, help="Sequences per step."),
        lr: float = typer.Option(1e-3, help="Peak AdamW learning rate (warm-up, then cosine to a tenth)."),
        val_prompts: int = typer.Option(16, help="Sequences held out for the checkpoint metrics."),
        seed: int = typer.Option(0, help="Seed for the prompt order, batches and initialisation."),
        draft_vocab: int = typer.Option(8192, help="EAGLE-3: size of the reduced draft vocabulary."),
        ttt_steps: int = typer.Option(3, help="EAGLE-3: unrolled steps of the training-time test."),
        ce_fraction: float = typer.Option(1.0, help="EAGLE-1/2: share of positions given the token loss "
                                                    "(the LM head dominates CPU training cost)."),
        ce_weight: float = typer.Option(0.1, help="EAGLE-1/2: weight of the token loss (regression: 1.0)."),
        init_from: Optional[Path] = typer.Option(None, help="Start from this checkpoint folder (fine-tune)."),
        vocab: int = typer.Option(0, help="EAGLE-1/2: token loss over the N most frequent target tokens, and the "
                                          "drafter's default vocab=N (0: the full vocabulary)."),
        unroll: int = typer.Option(1, help="EAGLE-1/2: passes per batch, each after the first on the predictor's "
                                           "own features, as deeper drafts read them (training-time test)."),
        topk_loss: int = typer.Option(0, help="EAGLE-1/2: add HASS's top-K distillation term over the target's K "
                                              "likeliest tokens (0: off)."),
        topk_weight: float = typer.Option(1.0, help="EAGLE-1/2: weight of the top-K term."),
        teacher_bf16: bool = typer.Option(False, help="bf16 autocast for the target's feature pass."),
        train_bf16: bool = typer.Option(False, help="bf16 autocast while training."),
        device: str = typer.Option("cpu", help="cpu or cuda[:N]."),
        threads: Optional[int] = typer.Option(None, help="torch CPU threads."),
        resume: bool = typer.Option(False, help="Continue the run in --out from its last checkpoint."),
        published: bool = typer.Option(False, help=f"Also write the published EAGLE layout to OUT/{kind}-published."),
    ) -> None:
        from specdec.training.eagle import EagleTrainConfig

        try:
            import torch

            if threads:
                torch.set_num_threads(threads)
            cfg = EagleTrainConfig(kind=kind, target=target, prompts=str(prompts) if prompts else None,
                                   corpus=corpus_setting(corpus), max_prompts=max_prompts,
                                   new_tokens=new_tokens, steps=steps, batch_size=batch_size, lr=lr,
                                   val_prompts=val_prompts, seed=seed, draft_vocab=draft_vocab, ttt_steps=ttt_steps,
                                   ce_fraction=ce_fraction, ce_weight=ce_weight, vocab=vocab,
                                   init_from=str(init_from) if init_from else None, teacher_bf16=teacher_bf16,
                                   train_bf16=train_bf16, unroll=unroll, topk_loss=topk_loss,
                                   topk_weight=topk_weight)
            for name in ("max_prompts", "new_tokens", "steps", "batch_size", "val_prompts", "draft_vocab", "ttt_steps",
                         "unroll"):
                if getattr(cfg, name) < 1:
                    raise ConfigError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(cfg, name)}")
            if vocab < 0:
                raise ConfigError(f"--vocab must be 0 (full) or a token count, got {vocab}")
            if topk_loss < 0 or topk_weight < 0:
                raise ConfigError(f"--topk-loss and --topk-weight must not be negative, got {topk_loss} and "
                                  f"{topk_weight}")
            if topk_loss and kind == "eagle3":
                raise ConfigError("--topk-loss is an EAGLE-1/2 (`specdec train eagle`) option; EAGLE-3 learns the "
                                  "target's distribution over its draft vocabulary as soft labels")
            if not 0 < ce_fraction <= 1:
                raise ConfigError(f"--ce-fraction must be in (0, 1], got {ce_fraction}")
            if not lr > 0:
                raise ConfigError(f"--lr must be positive, got {lr}")
            _run(cfg, out, resume, published, device)
        except SpecdecError as exc:
            fail(str(exc))

    command.__doc__ = (f"Self-distil an {'EAGLE-3' if kind == 'eagle3' else 'EAGLE-1/2'} predictor; writes "
                       f"OUT/{kind} (config, bf16 weights, metadata).")
    return command


def _run(cfg, out: Path, resume: bool, published: bool, device: str) -> None:
    from specdec.models.loader import parse_device
    from specdec.training.eagle import run_eagle_training
    from specdec.training.progress import load_target, stage_bars

    started = time.perf_counter()
    loaded = load_target(cfg.target, parse_device(device), err_console)
    with stage_bars(err_console, _LABELS) as (bars, progress):
        meta = run_eagle_training(cfg, out, resume=resume, loaded=loaded, published=published, progress=progress,
                                  log=bars.console.print)
    console.print(f"{cfg.kind} predictor written to {out / cfg.kind} in {time.perf_counter() - started:.0f} s "
                  f"(held-out top-1 {meta['final'].get('val_top1_0', 0):.3f})")
