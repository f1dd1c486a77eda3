"""`specdec train medusa`: self-distil Medusa heads for a target (see `specdec.training.medusa`).

Point `--prompts` at any JSONL file of `{"prompt": ...}` records to train on your own prompts, or `--corpus` at a
`corpus.pt` that an earlier `specdec train draft|medusa` run wrote, to skip generating the answers again.
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from specdec.errors import SpecdecError
from specdec.cli.common import CORPUS, corpus_setting, console, err_console, fail

_LABELS = {"generate": "generating answers (tokens)", "features": "target features (answers)",
           "train": "training the heads (steps)", "eval": "held-out tau (drafters)"}


def medusa(
    target: str = typer.Option("smollm2-135m", help="The target (alias, HF folder, .gguf)."),
    prompts: Optional[Path] = typer.Option(None, help="JSONL prompt file; default: the package's training corpus."),
    corpus: Optional[List[Path]] = CORPUS,
    out: Path = typer.Option(..., help="Run folder: checkpoints, and the heads in OUT/heads."),
    heads: int = typer.Option(4, help="Medusa heads (head i predicts the token i + 2 ahead)."),
    layers: int = typer.Option(1, help="ResBlocks per head."),
    max_prompts: int = typer.Option(512, help="Prompts to answer (or answers of --corpus to use)."),
    new_tokens: int = typer.Option(64, help="Greedy answer length per prompt."),
    steps: int = typer.Option(200, help="Optimizer steps."),
    batch_size: int = typer.Option(8, help="Answers per step."),
    lr: float = typer.Option(1e-3, help="Peak AdamW learning rate (warm-up, then cosine to a tenth)."),
    val_prompts: int = typer.Option(16, help="Answers held out of training for the accuracy metrics."),
    seed: int = typer.Option(0, help="Seed for the prompt order and the batches."),
    bf16: bool = typer.Option(False, help="bf16 autocast for the feature pass and the training matmuls."),
    vocab: int = typer.Option(0, help="Score only the N most frequent target tokens (what `medusa:vocab=N` "
                                      "drafts with, the heads' default when N > 0); 0 = the full vocabulary."),
    device: str = typer.Option("cpu", help="cpu for small targets, cuda for large ones."),
    published: bool = typer.Option(False, help="Also write OUT/published: the published Medusa layout, with "
                                               "each head's own projection (a copy of the LM head)."),
    threads: Optional[int] = typer.Option(None, help="torch CPU threads (default: torch's choice)."),
    resume: bool = typer.Option(False, help="Continue the run in --out from its last checkpoint."),
    eval_per_category: int = typer.Option(2, help="Held-out bench prompts per category for the final tau "
                                                  "(0 = skip)."),
) -> None:
    """Self-distil Medusa heads for the target; writes OUT/heads (config, bf16 ResBlocks, README)."""
    import torch

    from specdec.training.medusa import MedusaConfig

    try:
        if threads:
            torch.set_num_threads(threads)
        cfg = MedusaConfig(
            target=target, prompts=str(prompts) if prompts else None, corpus=corpus_setting(corpus),
            heads=heads, layers=layers, max_prompts=max_prompts, new_tokens=new_tokens, steps=steps,
            batch_size=batch_size, lr=lr, val_prompts=val_prompts, seed=seed, bf16=bf16, device=device,
            vocab=vocab,
        )
        _run(cfg, out, resume, eval_per_category, published, threads)
    except SpecdecError as exc:
        fail(str(exc))


def _run(cfg, out: Path, resume: bool, eval_per_category: int, published: bool, threads: int | None) -> None:
    import json
    import time

    from specdec.drafters.heads.medusa_heads import save_heads
    from specdec.data import heldout_prompts
    from specdec.training.common import measure_tau
    from specdec.training.medusa import render_readme, run_medusa
    from specdec.training.progress import load_target, stage_bars

    started = time.perf_counter()
    loaded = load_target(cfg.target, cfg.device, err_console)
    with stage_bars(err_console, _LABELS) as (bars, progress):
        heads, meta = run_medusa(cfg, out, resume=resume, loaded=loaded, progress=progress, log=bars.console.print)
        meta["command"] = cfg.command(out, threads, published)
        folder = out / "heads"
        save_heads(heads, folder, {"base_model": cfg.target, "format": "specdec-medusa"})
        if published:
            save_heads(heads, out / "published", {"base_model_name_or_path": cfg.target},
                       projection=loaded.model.lm_head.weight)
        meta["seconds"]["invocation"] = round(time.perf_counter() - started, 1)
        prompts = heldout_prompts(eval_per_category) if eval_per_category > 0 else []
        if prompts:
            start = time.perf_counter()
            mine = f"medusa:{folder.resolve()},vocab={cfg.vocab}"  # the metadata is written below
            specs = [("ngram", None), (mine, "chain:k=4"), (mine, "dynamic:depth=4,topk=4,budget=16")]
            rows = []
            for i, (spec, tree) in enumerate(specs):
                progress("eval", i, len(specs), {})
                result = measure_tau(loaded, spec, tree, prompts, cfg.new_tokens)
                rows.append(f"held-out tau ({len(prompts)} prompts of bench split test, {eval_per_category} per "
                            f"category, {cfg.new_tokens} new tokens, greedy): "
                            f"`{spec.split(':')[0]}` tree `{tree or 'default'}` **{result['tau']:.3f}**")
            progress("eval", len(specs), len(specs), {})
            meta["heldout"] = rows
            meta["seconds"]["eval"] = round(time.perf_counter() - start, 1)
    (folder / "specdec_medusa.json").write_text(json.dumps(meta, indent=2) + "\n")
    (folder / "README.md").write_text(render_readme(meta))
    console.print(f"Medusa heads written to {folder}")
    for row in meta.get("heldout", []):
        console.print(row)
