"""Logits -> the distribution a row samples from (temperature, top-k, min_p, top-p), and seeded draws.

The verifier must accept against the distribution the user asked for: temperature, top-k, min_p and top-p are
applied to the *target* logits before any acceptance test (forgetting this makes speculative sampling silently
different from plain sampling). Penalties and logit biases, which depend on the tokens before each row, are
applied earlier, by `specdec.sampling.processors`; this module only sees rows of already-processed logits.

Order: temperature, top-k (on the logits), softmax, min_p (drop tokens below `min_p` times the most likely
token's probability), top-p on what is left, renormalised. top-k and min_p are both relative to the best
token, so their order does not matter; min_p before top-p matches vLLM and llama.cpp.
"""

from __future__ import annotations

import torch
from torch import Tensor

from specdec.config import SamplingParams


def target_probs(logits: Tensor, params: SamplingParams) -> Tensor:
    """Rows of logits `[N, V]` -> the distribution each row samples from under `params` (float32)."""
    logits = logits.float()
    if params.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    logits = logits / params.temperature
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = logits.topk(params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.min_p > 0.0:
        probs = _min_p(probs, params.min_p)
    if params.top_p < 1.0:
        probs = _top_p(probs, params.top_p)
    return probs


def _min_p(probs: Tensor, min_p: float) -> Tensor:
    """Keep the tokens whose probability is at least `min_p` times the row's largest (the argmax always stays)."""
    floor = probs.amax(-1, keepdim=True) * min_p
    kept = probs.masked_fill(probs < floor, 0.0)
    return kept / kept.sum(-1, keepdim=True)


def _top_p(probs: Tensor, top_p: float) -> Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches top_p (at least one), renormalised."""
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    mass_before = sorted_probs.cumsum(-1) - sorted_probs
    sorted_probs = sorted_probs.masked_fill(mass_before >= top_p, 0.0)
    kept = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
    return kept / kept.sum(-1, keepdim=True)


def sample(probs: Tensor, generator: torch.Generator | None) -> int:
    """One token from a distribution `[V]`."""
    return int(torch.multinomial(probs, 1, generator=generator).item())


def uniform(generator: torch.Generator | None, device: torch.device) -> float:
    return float(torch.rand((), generator=generator, device=device).item())


def make_generator(seed: int | None, device: torch.device) -> torch.Generator:
    """A per-request generator, so a seeded request samples the same tokens whatever runs beside it."""
    generator = torch.Generator(device=device)
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    return generator
