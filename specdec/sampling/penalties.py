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
    """`logits [N, V]` float32 -> penalised logits (a new tensor)."""
    r = params.repetition_penalty
    if r != 1.0:
        penalised = torch.where(logits > 0, logits / r, logits * r)
        logits = torch.where(history.seen, penalised, logits)
    if params.frequency_penalty:
        logits = logits - params.frequency_penalty * history.output_counts
    if params.presence_penalty:
        logits = logits - params.presence_penalty * (history.output_counts > 0).float()
    return logits
