"""Repetition, frequency and presence penalties on rows of logits, given what came before each row.

Definitions (as Hugging Face's and OpenAI's): the repetition penalty r divides a positive logit and multiplies
a negative one for every token already in the prompt or the output; the frequency penalty subtracts
`f * count` and the presence penalty `p * (count > 0)`, counting the output only (the prompt is the user's
text, not a repetition by the model), as vLLM does.
"""

from __future__ import annotations

import torch
from torch import Tensor

from specdec.config import SamplingParams
from specdec.sampling.history import RowHistory


def apply_penalties(logits: Tensor, history: RowHistory, params: SamplingParams) -> Tensor:
    """`logits [N, V]` float32 -> penalised logits (a new tensor). Only the history's columns can change, so
    those are taken out, penalised and put back: the same operations on each of them as over the whole row."""
    r, f, p = params.repetition_penalty, params.frequency_penalty, params.presence_penalty
    if r == 1.0 and not f and not p:
        return logits
    sub = logits.index_select(1, history.ids)
    if r != 1.0:
        penalised = torch.where(sub > 0, sub / r, sub * r)
        sub = torch.where(history.seen, penalised, sub)
    if f:
        sub = sub - f * history.output_counts
    if p:
        sub = sub - p * (history.output_counts > 0).float()
    return logits.index_copy(1, history.ids, sub)
