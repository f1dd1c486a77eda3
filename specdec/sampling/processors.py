"""Target logits -> the logits each row samples (or takes the argmax) from: the controls that depend on the
tokens before a row.

Order, as vLLM's: `logit_bias` is added, then EOS and stop tokens are masked out of rows that come before
`min_new_tokens`, then the penalties are applied; temperature, top-k, min_p and top-p follow in
`specdec.sampling.distribution`. Every row of a tree gets its own history (`specdec.sampling.history`), so the
verifier accepts against exactly the distribution plain decoding would sample from at that node.
"""

from __future__ import annotations

import torch
from torch import Tensor

from specdec.config import SamplingParams
from specdec.sampling.history import RowHistory, row_history
from specdec.sampling.penalties import apply_penalties
from specdec.tree.token_tree import TokenTree


def process_logits(logits: Tensor, params: SamplingParams, history: RowHistory, stop_ids: frozenset[int]) -> Tensor:
    """`logits [N, V]` -> float32 processed logits. `stop_ids`: the tokens `min_new_tokens` holds back (EOS
    unless ignored, and the request's stop token ids)."""
    logits = logits.float()
    vocab = logits.shape[-1]
    if params.logit_bias:
        ids = torch.tensor([t for t, _ in params.logit_bias], dtype=torch.int64, device=logits.device)
        bias = torch.tensor([b for _, b in params.logit_bias], dtype=torch.float32, device=logits.device)
        logits = logits.clone()
        logits[:, ids] += bias
    if params.min_new_tokens and stop_ids:
        early = history.generated < params.min_new_tokens  # [N]
        if bool(early.any()):
            ids = torch.tensor(sorted(t for t in stop_ids if t < vocab), dtype=torch.int64, device=logits.device)
            mask = torch.zeros_like(logits, dtype=torch.bool)
            mask[:, ids] = True
            logits = logits.masked_fill(mask & early[:, None], float("-inf"))
    return apply_penalties(logits, history, params)


def held_back(params: SamplingParams, eos_ids: frozenset[int]) -> frozenset[int]:
    """The tokens that end a request, which `min_new_tokens` keeps from being generated early."""
    ids = set(params.stop_token_ids)
    if not params.ignore_eos:
        ids |= eos_ids
    return frozenset(ids)


def processed_rows(logits: Tensor, params: SamplingParams, prompt_ids: list[int], output_ids: list[int],
                   tree: TokenTree | None, eos_ids: frozenset[int]) -> Tensor:
    """One sequence's rows, processed: a tree's rows (one per node), or the prefill's last row (`tree=None`)."""
    if not params.penalised:
        return logits.float()
    history = row_history(prompt_ids, output_ids, tree, logits.shape[-1], logits.device)
    return process_logits(logits, params, history, held_back(params, eos_ids))
