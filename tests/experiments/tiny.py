"""A tiny random target behind the LLM API, for the experiment tests."""

from __future__ import annotations

from specdec.models.loader import LoadedModel
from specdec.models.tokenizer import ByteTokenizer
from tests.helpers import tiny_model

VOCAB = 300  # a byte tokenizer needs >= 260 ids; the prompts are token ids anyway


def tiny_loaded(seed: int = 3) -> LoadedModel:
    """Sharp next-token distributions (a random LM head), so greedy argmaxes are never near ties."""
    return LoadedModel(tiny_model(seed, vocab=VOCAB), ByteTokenizer(VOCAB), "tiny")


def id_prompts(n: int, length: int = 6, start: int = 10) -> list[list[int]]:
    """`n` distinct prompts of token ids."""
    return [[start + (7 * i + 3 * j) % 200 for j in range(length)] for i in range(n)]
