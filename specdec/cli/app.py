"""`specdec` command line: generate (streaming, live stats), models, bench.

User errors (`SpecdecError`) become one red line and exit code 2; only bugs show a traceback.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from specdec.errors import SpecdecError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="specdec: speculative-decoding-first LLM generation.")
console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)

# Colours for --show-acceptance, by how many tokens the target step emitted (1 = nothing accepted).
STEP_COLOURS = ["white", "green", "cyan", "blue", "magenta", "yellow", "red"]


def fail(message: str) -> None:
    err_console.print(f"[bold red]error:[/] {message}", soft_wrap=True)
    raise typer.Exit(2)


@app.command()
def generate(
    prompt: Optional[str] = typer.Argument(None, help="The prompt (a user message for chat models)."),
    target: str = typer.Option("smollm2-135m", help="Alias, HF folder, .gguf file, hub id, or dummy:<shape>."),
    device: str = typer.Option("cpu", help="cpu or cuda[:N]."),
    dtype: str = typer.Option("float32", help="float32, bfloat16 or float16."),
    quantize: Optional[str] = typer.Option(None, help="int8: dynamic W8A8 linears on CPU."),
    drafter: str = typer.Option("none", help="none, ngram[:n=3,k=8,branches=1], recycle, suffix, "
                                             "hybrid:suffix+recycle, draft[:<model>|layers=N], ..."),
    tree: Optional[str] = typer.Option(None, help="chain:k=5, static:<name|file>, dynamic:depth=6,topk=8,budget=60."),
    max_new_tokens: int = typer.Option(128, help="Most tokens to generate."),
    temperature: float = typer.Option(0.0, help="0 = greedy."),
    top_p: float = typer.Option(1.0, help="Nucleus sampling mass (1 = off)."),
    top_k: int = typer.Option(0, help="Top-k sampling (0 = off)."),
    seed: Optional[int] = typer.Option(None, help="Seed for reproducible sampling."),
    stop: list[str] = typer.Option([], help="Stop string (repeatable)."),
    chat: bool = typer.Option(True, help="Apply the model's chat template to the prompt."),
    show_acceptance: bool = typer.Option(False, help="Colour tokens by the target step that accepted them."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of streaming text."),
    prompts_file: Optional[Path] = typer.Option(None, help="JSONL with a 'prompt' field per line (batch mode)."),
    output: Optional[Path] = typer.Option(None, help="Where batch mode writes its JSONL results."),
    max_concurrency: int = typer.Option(16, help="Batch mode: most requests running at once."),
    threads: Optional[int] = typer.Option(None, help="CPU threads (default: all cores but one)."),
    adaptive: bool = typer.Option(True, help="Size each sequence's tree every step for the most goodput "
                                             "(--no-adaptive drafts the full tree every step)."),
    prefix_caching: bool = typer.Option(True, help="Reuse the K/V of prompt prefixes already computed."),
    acceptance: str = typer.Option("lossless", help="lossless, or typical (Medusa's rule: faster, LOSSY; "
                                                    "sampled requests only)."),
) -> None:
    """Generate text, streaming tokens as they are produced, then print one stats line."""
    from specdec.config import EngineConfig, SamplingParams

    try:
        params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
                                seed=seed, stop=tuple(stop))
        if prompts_file is None and prompt is None:
            fail("give a PROMPT or --prompts-file")
        if threads is not None and threads < 1:
            fail("--threads must be at least 1")
        config = EngineConfig(max_num_seqs=max_concurrency, adaptive_speculation=adaptive,
                              enable_prefix_caching=prefix_caching, acceptance=acceptance)
        llm = _load(target, device, dtype, quantize, drafter, tree, config, threads)
        if prompts_file is not None:
            from specdec.cli.batch import run_batch

            run_batch(llm, prompts_file, output, params, chat, console)
        elif as_json:
            out = llm.generate([prompt], params, chat=chat)[0]
            print(json.dumps({"text": out.text, "token_ids": out.token_ids, "finish_reason": out.finish_reason,
                              "metrics": out.metrics.to_dict()}))
        else:
            _stream(llm, prompt, params, chat, show_acceptance)
    except SpecdecError as exc:
        fail(str(exc))


def _load(target, device, dtype, quantize, drafter, tree, engine_config, threads):
    from specdec.api import LLM

    with err_console.status(f"loading {target}..."):
        return LLM(target=target, device=device, dtype=dtype, quantize=quantize, drafter=drafter, tree=tree,
                   engine_config=engine_config, show_progress=True, num_threads=threads)


def _stream(llm, prompt: str, params, chat: bool, show_acceptance: bool) -> None:
    final, ids = None, []
    proposers: dict[str, str] = {}  # hybrid trees: proposer name -> colour
    for delta in llm.stream([prompt], params, chat=chat):
        ids += delta.token_ids
        if show_acceptance and delta.text and any(delta.sources):
            _print_by_source(llm.tokenizer, ids, delta, proposers)
        elif show_acceptance and delta.text:
            _print_step(llm.tokenizer, ids, delta)
        else:
            console.print(delta.text, end="", markup=False)
        if delta.finished:
            final = delta.output
    console.print()
    if final is None:
        return
    m = final.metrics
    stats = (f"{m.num_generated} tokens, {m.tokens_per_second:.1f} tok/s, TTFT {m.ttft_s * 1000:.0f} ms, "
             f"tau {m.mean_accepted_tokens:.2f} over {m.target_steps} target steps, finish: {final.finish_reason}")
    err_console.print(f"[dim]{stats}[/]")
    if show_acceptance and m.accepted_by_source:
        counts = ", ".join(f"{name} {n}" for name, n in sorted(m.accepted_by_source.items(), key=lambda kv: -kv[1]))
        err_console.print(f"[dim]accepted drafted tokens by proposer: {counts}[/]")
    if show_acceptance and proposers:
        legend = " ".join(f"[{c}]{name}[/]" for name, c in proposers.items())
        err_console.print(f"[dim]colour = the drafter(s) that proposed the token:[/] {legend} [dim](plain: the target's "
                          "own token)[/]")
    elif show_acceptance:
        legend = " ".join(f"[{c}]{i + 1}[/]" for i, c in enumerate(STEP_COLOURS))
        err_console.print(f"[dim]colour = tokens emitted by one target step:[/] {legend} "
                          "[dim](underlined: the step's bonus token, sampled from the target)[/]")


def _print_step(tokenizer, ids: list[int], delta) -> None:
    """One target step's text: accepted drafted tokens in the step's colour, the bonus token underlined."""
    colour = STEP_COLOURS[min(delta.step_tokens, len(STEP_COLOURS)) - 1]
    bonus = tokenizer.decode(ids, skip_special_tokens=True)[len(tokenizer.decode(ids[:-1], skip_special_tokens=True)):]
    drafted = delta.text[: len(delta.text) - len(bonus)] if bonus and delta.text.endswith(bonus) else delta.text
    console.print(drafted, style=colour, end="", markup=False)
    if drafted != delta.text:
        console.print(bonus, style=f"{colour} underline", end="", markup=False)


def _print_by_source(tokenizer, ids: list[int], delta, proposers: dict[str, str]) -> None:
    """A hybrid step's tokens, each coloured by the drafter(s) that proposed it; the target's own tokens plain."""
    start = len(ids) - len(delta.token_ids)
    before = tokenizer.decode(ids[:start], skip_special_tokens=True)
    for i, source in enumerate(delta.sources):
        text = tokenizer.decode(ids[: start + i + 1], skip_special_tokens=True)
        piece, before = text[len(before):], text
        if source and source not in proposers:
            proposers[source] = STEP_COLOURS[1 + len(proposers) % (len(STEP_COLOURS) - 1)]
        console.print(piece, style=proposers.get(source, "white"), end="", markup=False)


@app.command()
def models() -> None:
    """List the default-model aliases and the models converted in the cache."""
    from rich.table import Table

    from specdec.models import registry

    table = Table(title="aliases")
    table.add_column("name")
    table.add_column("description")
    table.add_column("cached")
    cached = {m["name"]: m for m in registry.list_cached_models()}
    for name, alias in registry.ALIASES.items():
        table.add_row(name, alias.description, "yes" if name in cached else "no")
    console.print(table)
    if cached:
        listing = Table(title=f"cache: {registry.cache_root()}")
        for col in ("name", "path", "size"):
            listing.add_column(col)
        for m in cached.values():
            listing.add_row(str(m["name"]), str(m["path"]), f"{m.get('size_bytes', m.get('size', 0)) / 1e6:.0f} MB")
        console.print(listing)


@app.command()
def bench(
    target: str = typer.Option("smollm2-135m", help="Target model (dummy:<shape> targets run without peers)."),
    device: str = typer.Option("cpu", help="cpu or cuda[:N]."),
    dtype: Optional[str] = typer.Option(None, help="Our dtype (default: float32 on CPU, bfloat16 on CUDA)."),
    quantize: Optional[str] = typer.Option(None, help="int8 for our engine; transformers stays fp32."),
    drafter: Optional[str] = typer.Option(None, help="One drafter spec against plain decode (e.g. oracle:alpha=0.8)."),
    methods: Optional[str] = typer.Option(None, help="'drafter|tree;...' (default: every registered drafter)."),
    peers: Optional[str] = typer.Option(None, help="Transformers peers: generate,prompt-lookup,assisted."),
    no_peers: bool = typer.Option(False, "--no-peers", help="Run our methods only."),
    threads: int = typer.Option(1, help="CPU threads for both engines."),
    max_new_tokens: Optional[int] = typer.Option(None, help="New tokens per turn (default 64; --quick 16)."),
    prompts_per_category: Optional[int] = typer.Option(None, help="Prompts per category (default 2; --quick 1)."),
    categories: Optional[str] = typer.Option(None, help="Comma-separated (default: Spec-Bench's six)."),
    split: str = typer.Option("test", help="Prompt split: test or dev."),
    out: Optional[Path] = typer.Option(None, help="Output folder (default runs/bench-suite under the working directory)."),
    quick: bool = typer.Option(False, help="CI size: 1 prompt per category, 16 tokens, none + ngram, 2 peers."),
    kv_cache_tokens: Optional[int] = typer.Option(None, help="KV cache per method's engine (default: the engine's; "
                                                           "smaller lets many methods share a small machine)."),
) -> None:
    """Bench suite: our plain decode and drafters vs transformers, per Spec-Bench category (code in bench/)."""
    suite = _bench_suite()
    try:
        options = suite.resolve_options(**{k: v for k, v in locals().items() if k != "suite"})
        suite.run_suite(options, console)
    except SpecdecError as exc:
        fail(str(exc))


def _bench_suite():
    """The suite lives in the package (`specdec.benchmarks`); only its optional peers need the bench extra."""
    from specdec.benchmarks import suite

    return suite


def _add_subcommands() -> None:
    from specdec.cli.train import train_app

    app.add_typer(train_app, name="train", help="Train draft models for a target (self-distillation).")


_add_subcommands()


def main() -> None:
    try:
        app()
    except SpecdecError as exc:  # errors raised outside a command's own handler
        err_console.print(f"[bold red]error:[/] {exc}")
        sys.exit(2)


if __name__ == "__main__":
    main()
