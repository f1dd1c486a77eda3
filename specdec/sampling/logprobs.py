"""Log-probabilities of generated tokens under the distribution they were drawn from.

The distribution is the processed one (penalties, logit_bias, min_new_tokens, then temperature, top-k, min_p,
top-p): for a speculative step it is the row of the node each emitted token follows, so logprobs equal plain
decoding's, whatever the drafter and whether the token was an accepted draft, a residual or a bonus sample.
At temperature 0 the distribution sampled from is one-hot, so the logprobs are those of the processed logits'
softmax at temperature 1 (what OpenAI and vLLM report for greedy requests). Tokens of probability 0 (cut by
top-k, top-p or min_p) are left out of the top alternatives.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from specdec.config import SamplingParams
from specdec.sampling.distribution import target_probs


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token's log-probability and the most likely alternatives at its position."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...]  # (token id, logprob), most likely first; `params.logprobs` of them


def log_distribution(processed: Tensor, params: SamplingParams) -> Tensor:
    """`processed [M, V]` logits -> log-probabilities `[M, V]` (float32, -inf for impossible tokens)."""
    if params.greedy:
        return torch.log_softmax(processed.float(), dim=-1)
    return torch.log(target_probs(processed, params))


def token_logprobs(processed: Tensor, tokens: list[int], params: SamplingParams) -> list[TokenLogprob]:
    """Row j of `processed` is the distribution `tokens[j]` was drawn from."""
    logp = log_distribution(processed, params)
    chosen = logp[torch.arange(len(tokens)), torch.tensor(tokens, dtype=torch.int64)].tolist()
    k = params.logprobs or 0
    tops: list[list[tuple[int, float]]] = [[] for _ in tokens]
    if k:
        values, ids = logp.topk(min(k, logp.shape[-1]), dim=-1)
        for j, (vs, ts) in enumerate(zip(values.tolist(), ids.tolist())):
            tops[j] = [(t, v) for t, v in zip(ts, vs) if v != float("-inf")]
    return [TokenLogprob(t, c, tuple(top)) for t, c, top in zip(tokens, chosen, tops)]
