"""`specdec data recycle`: a warm Token Recycling matrix, learned by answering many prompts with the target.

The recycle drafter writes the target's top-k after every verified token into its matrix (`recycle_matrix.py`).
Here the engine answers our training prompts (and, if asked, ShareGPT first turns; never a bench prompt) with
that drafter, so the matrix ends up holding what a server would have learned from that traffic; then it is
saved (`recycle_store.py`) and the drafter starts from it (`recycle:warm=...`; the shipped one by default).

The engine drafts a chain of one (`chain:k=1`) with the planner off: every step verifies two rows a sequence,
so every answer token *and* one guess after it are recycled, at a fraction of a wide tree's compute. Answers
are greedy, like the corpus (`corpus_build.py`), so a rebuild with the same options writes the same matrix.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specdec.training.corpus_build import BuildProgress, build_corpus, engine_generator

BUILD_TREE = "chain:k=1"


class AnswerTally:
    """What `build_corpus` needs of a store when the answers themselves are not kept: which prompts are done
    and how many answer tokens there are (the matrix is the product)."""

    def __init__(self) -> None:
        self.done: set[str] = set()
        self.tokens = 0

    def append(self, record_id: str, prompt_ids: list[int], answer_ids: list[int], finish: str | None) -> None:
        self.done.add(record_id)
        self.tokens += len(answer_ids)


def learn_matrix(llm: Any, prompts: list[tuple[str, list[int]]], new_tokens: int, concurrency: int,
                 target_tokens: int = 0, progress: BuildProgress | None = None) -> AnswerTally:
    """Answer `prompts` (record id, prompt token ids; chat template applied) with `llm`, whose drafter must
    be `recycle`, `concurrency` at a time, until `target_tokens` answer tokens (0: all)."""
    tally = AnswerTally()
    generate = engine_generator(llm, new_tokens)
    build_corpus(tally, prompts, generate, concurrency, target_tokens, progress)  # type: ignore[arg-type]
    return tally


def save_learned(llm: Any, out: Path, info: dict) -> dict:
    """Save `llm`'s recycle matrix to `out` with how it was built; returns the counts it reports."""
    from specdec.drafters.recycle_store import save_matrix
    from specdec.training.corpus_store import tokenizer_fingerprint

    vocab = llm.model.config.vocab_size
    return save_matrix(llm.drafter.matrix, out, tokenizer_fingerprint(llm.tokenizer, vocab), info)
