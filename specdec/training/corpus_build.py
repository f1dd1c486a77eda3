"""Building the training corpus (`specdec data build`): which prompts, and the target's own answers to them.

Prompts are the first human turns of ShareGPT (`sharegpt.py`) plus the package's training prompts, and on
request grounded prompts made from ShareGPT replies (`grounded.py`), never a bench prompt, deduplicated, shuffled once by the seed (so a partial corpus is a fair sample of the whole)
and cut where they would not fit. Answers come from the target through our engine with continuous batching,
`chunk` requests at a time; each finished request is appended to the store at once (`corpus_store.py`), so a
build can stop anywhere and resume where it stopped.

Greedy by default: the heads are trained and measured for greedy decoding, so the contexts they learn from
should be the ones greedy decoding produces (the loss's labels are the target's distribution at every
position either way); greedy answers are also reproducible, so a resumed build writes what an uninterrupted
one would have.
"""

from __future__ import annotations

import random
import time
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from specdec.training.corpus_store import CorpusStore

# (prompt token ids of a chunk) -> (index in the chunk, answer ids, finish reason) as each request finishes
GenerateFn = Callable[[list[list[int]]], Iterator[tuple[int, list[int], str | None]]]
BuildProgress = Callable[[int, int, int, float], None]  # (records done, records total, answer tokens, seconds)


@dataclass(frozen=True)
class PromptItem:
    id: str
    text: str


@dataclass
class PromptStats:
    sharegpt: int = 0
    train: int = 0
    grounded: int = 0
    bench_dropped: int = 0
    duplicates: int = 0
    too_long: int = 0
    kept: int = 0
    notes: list[str] = field(default_factory=list)


def _key(text: str) -> str:
    return " ".join(text.split()).lower()


def collect_prompts(sharegpt: list[tuple[str, str]], train: list[dict], bench: list[str], seed: int,
                    stats: PromptStats | None = None, grounded: list[PromptItem] = ()) -> list[PromptItem]:
    """Our training prompts, ShareGPT's first turns and any grounded prompts (`grounded.py`), minus every bench
    prompt and every repeat (compared with whitespace and case folded), shuffled by `seed`."""
    stats = stats if stats is not None else PromptStats()
    banned = {_key(text) for text in bench}
    seen: set[str] = set()
    ids: set[str] = set()
    items: list[PromptItem] = []
    sources = [(f"train:{r.get('id', n)}", r["prompt"], "train") for n, r in enumerate(train)]
    sources += [(f"sharegpt:{cid}", text, "sharegpt") for cid, text in sharegpt]
    sources += [(item.id, item.text, "grounded") for item in grounded]
    for record_id, text, source in sources:
        setattr(stats, source, getattr(stats, source) + 1)
        key = _key(text)
        if key in banned:
            stats.bench_dropped += 1
            continue
        if key in seen:
            stats.duplicates += 1
            continue
        seen.add(key)
        while record_id in ids:  # ShareGPT ids repeat across split conversations
            record_id += "+"
        ids.add(record_id)
        items.append(PromptItem(record_id, text))
    random.Random(seed).shuffle(items)
    return items


def encode_prompts(items: list[PromptItem], encode: Callable[[str], list[int]], max_prompt_tokens: int,
                   context: int, new_tokens: int, stats: PromptStats | None = None,
                   skip: set[str] = frozenset()) -> list[tuple[str, list[int]]]:
    """`(id, prompt ids)` for every prompt that fits: at most `max_prompt_tokens`, and room for the answer in
    the model's context. Items in `skip` (already answered) are left out without encoding them."""
    stats = stats if stats is not None else PromptStats()
    out = []
    for item in items:
        if item.id in skip:
            continue
        ids = encode(item.text)
        if len(ids) > max_prompt_tokens or len(ids) + new_tokens > context:
            stats.too_long += 1
            continue
        out.append((item.id, ids))
    stats.kept = len(out)
    return out


def build_corpus(store: CorpusStore, prompts: list[tuple[str, list[int]]], generate: GenerateFn,
                 chunk: int = 64, target_tokens: int = 0, progress: BuildProgress | None = None) -> int:
    """Answer every prompt not yet in the store, `chunk` at a time, appending each answer as it finishes.

    Stops early once the store holds `target_tokens` answer tokens (0: answer everything). Returns the
    records written by this call."""
    todo = [(rid, ids) for rid, ids in prompts if rid not in store.done]
    total = len(store.done) + len(todo)
    written, start = 0, time.perf_counter()
    if progress:
        progress(len(store.done), total, store.tokens, 0.0)
    for first in range(0, len(todo), chunk):
        if target_tokens and store.tokens >= target_tokens:
            break
        batch = todo[first: first + chunk]
        for index, token_ids, finish in generate([ids for _, ids in batch]):
            rid, ids = batch[index]
            store.append(rid, ids, list(token_ids), finish)
            written += 1
            if progress:
                progress(len(store.done), total, store.tokens, time.perf_counter() - start)
    return written


def engine_generator(llm: Any, new_tokens: int, temperature: float = 0.0, seed: int = 0) -> GenerateFn:
    """Answers from our engine: the whole chunk submitted at once, so it batches them continuously. Sampled
    answers get a seed per prompt (from the run's seed and the prompt ids), so they do not depend on which
    chunk or run produced them."""
    from specdec.config import SamplingParams

    def generate(batch: list[list[int]]) -> Iterator[tuple[int, list[int], str | None]]:
        params = [SamplingParams(max_new_tokens=new_tokens, temperature=temperature,
                                 seed=(zlib.crc32(bytes(str(ids), "ascii")) ^ seed) if temperature else None)
                  for ids in batch]
        for delta in llm.stream(batch, params, chat=False):
            if delta.finished and delta.output is not None:
                yield delta.index, list(delta.output.token_ids), delta.output.finish_reason

    return generate
