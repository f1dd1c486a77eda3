"""`specdec generate`: one prompt streamed to stdout with a stats line on stderr, or a JSONL batch.

Every option is checked before the model loads (sampling values, engine sizes, the drafter's options, the tree,
the batch files), so a typo costs no load. Heavy imports (torch, the engine) happen only once the input is good.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Optional

import typer

from specdec.cli.common import console, err_console, fail, note
from specdec.cli.records import output_record
from specdec.errors import SpecdecError

# Colours for --show-acceptance, by how many tokens the target step emitted (1 = nothing accepted).
STEP_COLOURS = ["white", "green", "cyan", "blue", "magenta", "yellow", "red"]


def generate(
    prompt: Optional[str] = typer.Argument(None, help="The prompt (a user message for chat models)."),
    target: str = typer.Option("smollm2-135m", help="Alias, HF folder, .gguf file, hub id, or dummy:SHAPE."),
    device: str = typer.Option("cpu", help="cpu or cuda[:N]."),
    dtype: str = typer.Option("float32", help="float32, bfloat16 or float16."),
    quantize: Optional[str] = typer.Option(
        None, help="int8, int7 or int4 weights, int8 activations, on CPU (int7: faster tree verification on AVX2)."),
    drafter: str = typer.Option("suffix", help="Drafter spec (see above), e.g. ngram or ngram:n=3,k=8; none for "
                                               "plain decode."),
    tree: Optional[str] = typer.Option(None, help="Tree spec (see above), e.g. chain:k=5."),
    max_new_tokens: int = typer.Option(128, help="Most tokens to generate."),
    temperature: float = typer.Option(0.0, help="0 = greedy."),
    top_p: float = typer.Option(1.0, help="Nucleus sampling mass (1 = off)."),
    top_k: int = typer.Option(0, help="Top-k sampling (0 = off)."),
    seed: Optional[int] = typer.Option(None, help="Seed for reproducible sampling (0 to 2**64 - 1)."),
    stop: list[str] = typer.Option([], help="Stop string (repeatable)."),
    repetition_penalty: float = typer.Option(1.0, help="Divide (multiply, if negative) the logits of tokens "
                                                       "already in the prompt or output (1 = off)."),
    frequency_penalty: float = typer.Option(0.0, help="Subtract this times a token's count in the output, -2..2."),
    presence_penalty: float = typer.Option(0.0, help="Subtract this from tokens already in the output, -2..2."),
    min_p: float = typer.Option(0.0, help="Drop tokens less likely than MIN_P times the most likely (0 = off)."),
    logit_bias: list[str] = typer.Option([], help="TOKEN_ID=BIAS added to that token's logit, -100..100 "
                                                  "(repeatable)."),
    stop_token_id: list[int] = typer.Option([], help="A token id that ends generation like EOS (repeatable)."),
    min_new_tokens: int = typer.Option(0, help="No EOS, stop token or stop string before this many tokens."),
    logprobs: Optional[int] = typer.Option(None, help="Report each token's logprob and the N most likely "
                                                      "alternatives (0-20; printed with --json)."),
    n: int = typer.Option(1, "--n", help="Samples of the prompt, each with its own seed stream."),
    chat: bool = typer.Option(True, help="Apply the model's chat template to the prompt."),
    show_acceptance: bool = typer.Option(False, help="Colour tokens by the target step that accepted them."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of streaming text."),
    prompts_file: Optional[Path] = typer.Option(None, help="Batch mode: JSONL with a 'prompt' field per line."),
    output: Optional[Path] = typer.Option(None, help="Batch mode: the JSONL results file (default: stdout)."),
    resume: bool = typer.Option(False, help="Batch mode: keep the results already in --output and run only "
                                            "the prompts they lack."),
    overwrite: bool = typer.Option(False, help="Batch mode: replace an --output that already holds results."),
    max_concurrency: int = typer.Option(16, help="Batch mode: most requests running at once."),
    threads: Optional[int] = typer.Option(None, help="CPU threads (default: all cores but one)."),
    adaptive: bool = typer.Option(True, help="Size each sequence's tree every step for the most goodput "
                                             "(--no-adaptive drafts the full tree every step)."),
    prefix_caching: bool = typer.Option(True, help="Reuse the K/V of prompt prefixes already computed."),
    acceptance: str = typer.Option("lossless", help="lossless, or typical (Medusa's rule: faster, LOSSY; "
                                                    "sampled requests only)."),
    max_tree_nodes: int = typer.Option(128, help="Most nodes in one draft tree (the root counted)."),
    kv_cache_tokens: int = typer.Option(32768, help="KV cache capacity in tokens, over all running requests."),
    kv_cache_dtype: str = typer.Option("auto", help="K/V cache precision: auto (the model's own), float32, or "
                                                    "bfloat16 (half the memory; on CPU needs AMX-BF16 or "
                                                    "AVX512-BF16, where tree rows get cheaper)."),
) -> None:
    """Generate text, streaming tokens as they are produced, then print one stats line (on stderr).

Drafters (--drafter): none, ngram[:n=3,k=8,branches=1], draft (the shipped distilled draft), draft:MODEL,
draft:layers=N (early-exit self-draft), medusa[:PATH], eagle[:PATH], eagle3[:PATH], oracle:alpha=0.8.

Trees (--tree, with any drafter but none): chain:k=5, static:NAME (tree-8, tree-16, tree-32, medusa-8 ...) or
static:FILE (JSON {"choices": [[0], [0, 0], ...]}), dynamic:depth=6,topk=8,budget=60.

Batch mode (--prompts-file in.jsonl): one JSON object with a "prompt" (and optionally an "id") per line. Each
result is written as one JSON line the moment it finishes (to --output, else stdout), so an interrupted run
keeps what finished and --resume finishes the rest; a bad line or prompt becomes an error record.
    """
    from specdec.config import EngineConfig, SamplingParams
    from specdec.validation import check_text

    try:
        job = None
        if prompts_file is None:
            if prompt is None:
                fail("give a PROMPT or --prompts-file")
            if output is not None or resume or overwrite:
                fail("--output, --resume and --overwrite go with --prompts-file")
            check_text(prompt)
        else:
            if prompt is not None:
                fail("give a PROMPT or --prompts-file, not both")
            from specdec.cli.batch import open_job

            job = open_job(prompts_file, output, resume=resume, overwrite=overwrite)
        params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
                                seed=seed, stop=tuple(stop), repetition_penalty=repetition_penalty,
                                frequency_penalty=frequency_penalty, presence_penalty=presence_penalty, min_p=min_p,
                                logit_bias=parse_logit_bias(logit_bias), stop_token_ids=tuple(stop_token_id),
                                min_new_tokens=min_new_tokens, logprobs=logprobs, n=n)
        if job is not None and n > 1:
            fail("--n is for one prompt; batch mode generates one sample per record")
        config = EngineConfig(max_num_seqs=max_concurrency, adaptive_speculation=adaptive,
                              enable_prefix_caching=prefix_caching, acceptance=acceptance,
                              max_tree_nodes=max_tree_nodes, kv_cache_tokens=kv_cache_tokens,
                              kv_cache_dtype=kv_cache_dtype,
                              max_num_batched_tokens=max(2048, max_tree_nodes))
        llm = load_llm(target, device, dtype, quantize, drafter, tree, config, threads)
        if job is not None:
            from specdec.cli.batch import run_batch

            code = run_batch(llm, job, params, chat)
            if code:
                raise typer.Exit(code)
        elif as_json:
            out = llm.generate([prompt], params, chat=chat)[0]
            record = output_record(out)
            if out.samples:
                record["samples"] = [output_record(s) for s in out.samples]
            print(json.dumps(record, ensure_ascii=False))
        elif n > 1:
            for out in llm.generate([prompt], params, chat=chat)[0].samples:
                err_console.print(f"[dim]--- sample {out.sample_index + 1} of {n} ---[/]")
                sys.stdout.write(out.text + "\n")
                sys.stdout.flush()
                note(stats_line(out))
        else:
            _stream(llm, prompt, params, chat, show_acceptance)
    except SpecdecError as exc:
        fail(str(exc))


def parse_logit_bias(items: list[str]) -> dict[int, float]:
    """`["50256=-100", "13=2.5"]` -> {50256: -100.0, 13: 2.5}; the values are checked by SamplingParams."""
    bias: dict[int, float] = {}
    for item in items:
        token, sep, value = item.partition("=")
        try:
            if not sep:
                raise ValueError
            bias[int(token)] = float(value)
        except ValueError:
            fail(f"--logit-bias takes TOKEN_ID=BIAS (e.g. 13=2.5), got {item!r}")
    return bias


def load_llm(target: str, device: str, dtype: str, quantize: str | None, drafter: str, tree: str | None,
             engine_config: Any, threads: int | None) -> Any:
    """Check every option, fetch or convert the model if needed (its own progress bars), then load it.

    The spinner covers only the load: a conversion's bars and a spinner on one terminal draw over each other.
    """
    from specdec.validation import check_llm_args

    check_llm_args(target=target, device=device, dtype=dtype, drafter=drafter, tree=tree, quantize=quantize,
                   engine_config=engine_config, show_progress=True, num_threads=threads)
    from specdec.api import LLM
    from specdec.models.loader import resolve_target

    source = target if target.startswith("dummy:") else str(resolve_target(target, show_progress=True))
    with err_console.status(f"loading {target}..."):
        return LLM(target=source, device=device, dtype=dtype, quantize=quantize, drafter=drafter, tree=tree,
                   engine_config=engine_config, show_progress=False, num_threads=threads)


def stats_line(final: Any) -> str:
    """One line of numbers that mean something: no speed or tau when there were no decode steps to time."""
    m = final.metrics
    parts = [f"{m.num_generated} token{'' if m.num_generated == 1 else 's'}"]
    if m.tokens_per_second > 0:
        parts.append(f"{m.tokens_per_second:.1f} tok/s")
    parts.append(f"TTFT {m.ttft_s * 1000:.0f} ms")
    if m.target_steps:
        parts.append(f"tau {m.mean_accepted_tokens:.2f} over {m.target_steps} target "
                     f"step{'' if m.target_steps == 1 else 's'}")
    parts.append(f"finish: {final.finish_reason}")
    return ", ".join(parts)


def _stream(llm: Any, prompt: str, params: Any, chat: bool, show_acceptance: bool) -> None:
    final, ids = None, []
    proposers: dict[str, str] = {}  # hybrid trees: proposer name -> colour
    for delta in llm.stream([prompt], params, chat=chat):
        ids += delta.token_ids
        if show_acceptance and delta.text and any(delta.sources):
            _print_by_source(llm.tokenizer, ids, delta, proposers)
        elif show_acceptance and delta.text:
            _print_step(llm.tokenizer, ids, delta)
        elif delta.text:
            sys.stdout.write(delta.text)  # raw text: a console would hard-wrap it at its width
            sys.stdout.flush()
        if delta.finished:
            final = delta.output
    sys.stdout.write("\n")
    sys.stdout.flush()
    if final is None:
        return
    note(stats_line(final))
    m = final.metrics
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


def _print_step(tokenizer: Any, ids: list[int], delta: Any) -> None:
    """One target step's text: accepted drafted tokens in the step's colour, the bonus token underlined."""
    colour = STEP_COLOURS[min(delta.step_tokens, len(STEP_COLOURS)) - 1]
    bonus = tokenizer.decode(ids, skip_special_tokens=True)[len(tokenizer.decode(ids[:-1], skip_special_tokens=True)):]
    drafted = delta.text[: len(delta.text) - len(bonus)] if bonus and delta.text.endswith(bonus) else delta.text
    console.print(drafted, style=colour, end="", markup=False, soft_wrap=True)
    if drafted != delta.text:
        console.print(bonus, style=f"{colour} underline", end="", markup=False, soft_wrap=True)


def _print_by_source(tokenizer: Any, ids: list[int], delta: Any, proposers: dict[str, str]) -> None:
    """A hybrid step's tokens, each coloured by the drafter(s) that proposed it; the target's own tokens plain."""
    start = len(ids) - len(delta.token_ids)
    before = tokenizer.decode(ids[:start], skip_special_tokens=True)
    for i, source in enumerate(delta.sources):
        text = tokenizer.decode(ids[: start + i + 1], skip_special_tokens=True)
        piece, before = text[len(before):], text
        if source and source not in proposers:
            proposers[source] = STEP_COLOURS[1 + len(proposers) % (len(STEP_COLOURS) - 1)]
        console.print(piece, style=proposers.get(source, "white"), end="", markup=False, soft_wrap=True)
