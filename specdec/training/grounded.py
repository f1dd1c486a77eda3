"""Grounded prompts for the training corpus: summaries, answers from retrieved documents and translations of
ShareGPT replies (`specdec data build --grounded N`).

Why: ShareGPT's first turns are short requests whose answers the target writes from scratch, while much of
what people ask a small model to do is grounded in a text they give it: summarise these notes, answer from
these search results, translate this paragraph. There the answer copies and rephrases the prompt, a pattern a
drafter trained on first turns alone has rarely seen: the shipped EAGLE head agreed with the target on 0.68 of
held-out ShareGPT positions but accepted its depth-1 guess at only 0.26 of summarisation steps on the test
prompts. The texts here are the first replies of ShareGPT conversations (varied topics and styles; the package's
own training prompts of these kinds come from a handful of templates). They are context only: the target
answers every grounded prompt itself, so no reply is ever a label.

Each prompt is one of three kinds, in turn, each with several wordings so that no single template dominates:

* `summary`: one reply and an instruction to summarise it (before or after the text);
* `retrieval`: a reply's paragraphs as numbered documents, mixed with paragraphs of other replies, and the
  conversation's own question, to be answered from the documents;
* `translation`: one to three sentences of a reply, to translate into a European language.

Replies with code, tables or too little or too much prose are skipped. Deterministic for a seed.
"""

from __future__ import annotations

import random
import re

from specdec.training.corpus_build import PromptItem

KINDS = ("summary", "retrieval", "translation")
MIN_WORDS, MAX_WORDS = 60, 400  # a reply to summarise or to split into documents
MAX_QUESTION_WORDS = 60
LANGUAGES = ("French", "German", "Spanish", "Italian", "Portuguese", "Dutch")

SUMMARY_BEFORE = (
    "Summarize the following text in a few sentences.",
    "Write a brief summary of this text.",
    "What are the main points of the text below? Answer in a short paragraph.",
    "Summarize this text in three bullet points.",
)
SUMMARY_AFTER = (
    "Give a short summary of the text above for someone who has not read it.",
    "Summarize the text above in two or three sentences.",
    "What is the text above about? Summarize its key points briefly.",
)
RETRIEVAL_HEADERS = ("Retrieved documents:", "Search results:", "Context:")
RETRIEVAL_INSTRUCTIONS = (
    "Using the retrieved documents, answer the question.",
    "Answer the question using only the documents above. Quote them where it helps.",
    "Answer based on the search results. If they do not contain the answer, say so.",
    "Use the context to answer the question in a few sentences.",
)
TRANSLATION_WORDINGS = (
    "Translate the following English text into {lang}:\n\n{text}",
    "Please translate into {lang}:\n{text}",
    "How would you say this in {lang}?\n\n{text}",
    "Translate to {lang}: {text}",
)

_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")
_LIST_ITEM = re.compile(r"(^|\s)(\d+[.)]|[-*•])(\s|$)")


def is_prose(text: str) -> bool:
    """English prose without code or tables: mostly ASCII letters and no code fences, markup or pipes."""
    if any(mark in text for mark in "`|<{"):
        return False
    ascii_letters = sum(c.isascii() and c.isalpha() for c in text)
    letters = sum(c.isalpha() for c in text)
    return letters > 0 and ascii_letters / letters > 0.97


def paragraphs(text: str) -> list[str]:
    return [" ".join(p.split()) for p in re.split(r"\n\s*\n", text) if p.strip()]


def summary_prompt(reply: str, rng: random.Random) -> str:
    if rng.random() < 0.5:
        return f"{rng.choice(SUMMARY_BEFORE)}\n\n{reply}"
    return f"{reply}\n\n{rng.choice(SUMMARY_AFTER)}"


def retrieval_prompt(question: str, reply: str, others: list[str], rng: random.Random) -> str:
    """The reply's paragraphs (at most four) and one or two paragraphs of other replies as numbered documents,
    shuffled, then the question."""
    docs = paragraphs(reply)[:4] + [rng.choice(paragraphs(other)) for other in others]
    rng.shuffle(docs)
    listed = "\n\n".join(f"[{i}] {doc}" for i, doc in enumerate(docs, 1))
    header, instruction = rng.choice(RETRIEVAL_HEADERS), rng.choice(RETRIEVAL_INSTRUCTIONS)
    return f"{header}\n\n{listed}\n\nQuestion: {question}\n\n{instruction}"


def translation_prompt(reply: str, rng: random.Random) -> str | None:
    """One to three consecutive sentences of one of the reply's plain paragraphs (not a list item nor a heading;
    12-70 words), or None if it has none."""
    spans = []
    for paragraph in paragraphs(reply):
        if _LIST_ITEM.match(paragraph) or not paragraph.endswith((".", "!", "?")):
            continue
        sentences = [" ".join(s.split()) for s in _SENTENCE.split(paragraph) if s.strip()]
        if any(_LIST_ITEM.search(s) for s in sentences):
            continue
        spans += [sentences[i: i + n] for n in (1, 2, 3) for i in range(len(sentences) - n + 1)]
    spans = [s for s in spans if 12 <= sum(len(x.split()) for x in s) <= 70]
    if not spans:
        return None
    wording = rng.choice(TRANSLATION_WORDINGS)
    return wording.format(lang=rng.choice(LANGUAGES), text=" ".join(rng.choice(spans)))


def grounded_prompts(exchanges: list[tuple[str, str, str]], count: int, seed: int = 0) -> list[PromptItem]:
    """Up to `count` grounded prompts, the three kinds in turn, from ShareGPT first exchanges
    (`sharegpt.first_exchanges`); ids `grounded:<kind>:<conversation id>`."""
    rng = random.Random(seed)
    usable = [(cid, ask, reply) for cid, ask, reply in exchanges
              if is_prose(reply) and MIN_WORDS <= len(reply.split()) <= MAX_WORDS]
    rng.shuffle(usable)
    items: list[PromptItem] = []
    for n, (cid, ask, reply) in enumerate(usable):
        if len(items) >= count:
            break
        kind = KINDS[len(items) % len(KINDS)]
        if kind == "summary":
            text = summary_prompt(reply, rng)
        elif kind == "retrieval":
            if len(ask.split()) > MAX_QUESTION_WORDS or not is_prose(ask):
                continue
            picks = [(n + 1 + rng.randrange(len(usable) - 1)) % len(usable) for _ in range(rng.randint(1, 2))]
            others = [usable[i][2] for i in picks]
            text = retrieval_prompt(ask, reply, others, rng)
        else:
            text = translation_prompt(reply, rng)
            if text is None:
                continue
        items.append(PromptItem(f"grounded:{kind}:{cid}", text))
    return items
