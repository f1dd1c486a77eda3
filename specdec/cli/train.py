"""`specdec train draft|medusa|eagle|eagle3`: the training command group (`train_app`, added to the main CLI by
`specdec.cli.app`). `draft` lives here; the Medusa and EAGLE trainers have a module each.

Also runnable alone: `python -m specdec.cli.train draft --out runs/draft`.
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from specdec.cli import train_eagle, train_medusa
from specdec.cli.common import CORPUS, corpus_setting, console, err_console, fail
from specdec.errors import ConfigError, SpecdecError

train_app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                        rich_markup_mode=None, help="Train drafters for a target (self-distillation).")


@train_app.callback()
def _group() -> None:
    """Train drafters for a target (self-distillation)."""


_LABELS = {"generate": "generating answers (tokens)", "teacher": "target distributions (answers)",
           "train": "training the draft (steps)", "eval": "held-out tau (drafters)"}


@train_app.command("draft")
def draft(
    target: str = typer.Option("smollm2-135m", help="The target to distill from (alias, HF folder, .gguf)."),
    prompts: Optional[Path] = typer.Option(None, help="JSONL prompt file; default: the package's training corpus."),
    corpus: Optional[List[Path]] = CORPUS,
    out: Path = typer.Option(..., help="Run folder: checkpoints, and the draft folder in OUT/draft."),
    layers: int = typer.Option(2, help="Decoder layers of the draft."),
    init_from: Optional[str] = typer.Option(None, help="Target layers to copy into the draft, e.g. 0,1 "
                                                       "(default: the first LAYERS)."),
    max_prompts: int = typer.Option(512, help="Prompts to answer (taken from the corpus shuffled by --seed), or "
                                              "answers of --corpus to use."),
    new_tokens: int = typer.Option(64, help="Greedy answer length per prompt."),
    steps: int = typer.Option(300, help="Optimizer steps."),
    batch_size: int = typer.Option(16, help="Answers per step."),
    lr: float = typer.Option(1e-3, help="Peak AdamW learning rate (warm-up, then cosine to a tenth)."),
    topk: int = typer.Option(32, help="Target log-probs kept per position."),
    val_prompts: int = typer.Option(24, help="Answers held out of training for the checkpoint metrics."),
    seed: int = typer.Option(0, help="Seed for the prompt order, batches and initialisation."),
    teacher_bf16: bool = typer.Option(False, help="bf16 autocast for the target's dense pass (fast on CPUs "
                                                  "with AVX-512 bf16; ~98% top-1 agreement with fp32)."),
    train_bf16: bool = typer.Option(False, help="bf16 autocast for the draft's matmuls while training."),
    vocab: int = typer.Option(0, help="Train through the head rows of the N most frequent target tokens (what "
                                      "`draft:vocab=N` drafts with, the folder's default when N > 0); 0 = all."),
    threads: Optional[int] = typer.Option(None, help="torch CPU threads (default: torch's choice)."),
    resume: bool = typer.Option(False, help="Continue the run in --out from its last checkpoint."),
    eval_per_category: int = typer.Option(2, help="Held-out bench prompts per category for the final tau "
                                                  "(0 = skip)."),
) -> None:
    """Distill a small draft model from the target; writes OUT/draft (config, bf16 weights, README)."""
    import torch

    from specdec.training.draft import DistillConfig

    try:
        if threads:
            torch.set_num_threads(threads)
        cfg = DistillConfig(
            target=target, prompts=str(prompts) if prompts else None, corpus=corpus_setting(corpus),
            layers=layers,
            init_from=_layer_list(init_from), max_prompts=max_prompts, new_tokens=new_tokens, steps=steps,
            batch_size=batch_size, lr=lr, topk=topk, val_prompts=val_prompts, seed=seed,
            teacher_bf16=teacher_bf16, train_bf16=train_bf16, vocab=vocab,
        )
        _check(cfg)
        _run(cfg, out, resume, eval_per_category)
    except SpecdecError as exc:
        fail(str(exc))


def _layer_list(raw: str | None) -> tuple[int, ...] | None:
    if raw is None:
        return None
    try:
        return tuple(int(x) for x in raw.split(","))
    except ValueError:
        raise ConfigError(f"--init-from must be comma-separated layer numbers, got '{raw}'") from None


def _check(cfg) -> None:
    for name in ("layers", "max_prompts", "new_tokens", "steps", "batch_size", "topk", "val_prompts"):
        if getattr(cfg, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(cfg, name)}")
    if not cfg.lr > 0:
        raise ConfigError(f"--lr must be positive, got {cfg.lr}")
    if cfg.vocab < 0:
        raise ConfigError(f"--vocab must be 0 (the full vocabulary) or a number of tokens, got {cfg.vocab}")


def _run(cfg, out: Path, resume: bool, eval_per_category: int) -> None:
    import json
    import time

    from specdec.drafters.draft_model import DEFAULT_EARLY_EXIT_LAYERS
    from specdec.training.draft import heldout_tau, render_readme, run_distillation
    from specdec.training.progress import load_target, stage_bars

    started = time.perf_counter()
    loaded = load_target(cfg.target, "cpu", err_console)
    with stage_bars(err_console, _LABELS) as (bars, progress):
        meta = run_distillation(cfg, out, resume=resume, loaded=loaded, progress=progress, log=bars.console.print)
        # Wall time of this invocation up to the written draft, the target's loading included (a resumed run
        # counts only its own part here; meta["seconds"]["total"] sums the stages over every run).
        meta["seconds"]["invocation"] = round(time.perf_counter() - started, 1)
        folder = out / "draft"
        if eval_per_category > 0:
            prompts = _eval_prompts(eval_per_category)
            if prompts:
                start = time.perf_counter()
                specs = [f"draft:layers={DEFAULT_EARLY_EXIT_LAYERS}", f"draft:{folder.resolve()}"]
                taus = heldout_tau(loaded, specs, prompts, cfg.new_tokens, k=4, progress=progress)
                meta["heldout"] = {
                    "prompts": len(prompts), "split": "test", "per_category": eval_per_category,
                    "new_tokens": cfg.new_tokens, "tree": "chain:k=4", "greedy": True,
                    "tau_early_exit": round(taus[specs[0]], 3), "tau_distilled": round(taus[specs[1]], 3),
                    "early_exit_spec": specs[0], "seconds": round(time.perf_counter() - start, 1),
                }
    (folder / "specdec_draft.json").write_text(json.dumps(meta, indent=2) + "\n")
    (folder / "README.md").write_text(render_readme(meta))
    console.print(f"draft written to {folder}")
    if "heldout" in meta:
        h = meta["heldout"]
        console.print(f"held-out tau (k=4, greedy, {h['prompts']} prompts): early exit {h['tau_early_exit']:.3f}, "
                      f"distilled {h['tau_distilled']:.3f}")


def _eval_prompts(per_category: int) -> list[str]:
    from specdec.data import heldout_prompts

    prompts = heldout_prompts(per_category)
    if not prompts:
        err_console.print("[yellow]skipping the held-out tau: no bench prompts in this installation[/]")
    return prompts


train_app.command("medusa")(train_medusa.medusa)
train_app.command("eagle")(train_eagle.command("eagle"))
train_app.command("eagle3")(train_eagle.command("eagle3"))

if __name__ == "__main__":
    train_app()
