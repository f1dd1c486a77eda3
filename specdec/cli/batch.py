"""Batch mode of `specdec generate --prompts-file in.jsonl --output out.jsonl`: many requests through the
continuous-batching loop, with a live progress bar (requests done, output tok/s, live tau, prompt tokens served
from the prefix cache)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from specdec.config import SamplingParams
from specdec.data import load_prompts
from specdec.errors import ConfigError


def read_prompts(path: Path) -> list[str]:
    prompts = [record["prompt"] for record in load_prompts(path)]
    if not prompts:
        raise ConfigError(f"{path} holds no prompts")
    return prompts


def run_batch(llm, prompts_file: Path, output: Path | None, params: SamplingParams, chat: bool,
              console: Console) -> None:
    prompts = read_prompts(prompts_file)
    results: list[dict | None] = [None] * len(prompts)
    generated = steps = cached = 0
    start = time.perf_counter()
    columns = (TextColumn("[bold]generating"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[rate]:.1f} tok/s  tau {task.fields[tau]:.2f}  "
                          "prefix cache {task.fields[cached]} tok"), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task("requests", total=len(prompts), rate=0.0, tau=0.0, cached=0)
        for delta in llm.stream(prompts, params, chat=chat):
            generated += len(delta.token_ids)
            steps += 1 if delta.token_ids else 0
            if delta.finished and delta.output is not None:
                out = delta.output
                cached += out.metrics.cached_prompt_tokens
                results[delta.index] = {"index": delta.index, "prompt": prompts[delta.index], "text": out.text,
                                        "token_ids": out.token_ids, "finish_reason": out.finish_reason,
                                        "metrics": out.metrics.to_dict()}
                progress.advance(task)
            elapsed = max(time.perf_counter() - start, 1e-9)
            progress.update(task, rate=generated / elapsed, tau=generated / max(steps, 1), cached=cached)
    lines = "\n".join(json.dumps(r) for r in results if r is not None) + "\n"
    if output is None:
        console.print(lines, end="", markup=False)
    else:
        output.write_text(lines)
        console.print(f"[dim]wrote {len(prompts)} results to {output}[/]")
