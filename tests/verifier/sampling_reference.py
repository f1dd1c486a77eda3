"""An exact reference for every sampling control, written apart from specdec.sampling: float64, Python loops
over the history of each context, a dense forward of the tiny target (no paged cache, no trees).

Order, as specdec documents it: logit_bias, min_new_tokens masking, repetition / frequency / presence
penalties, then temperature, top-k, softmax, min_p, top-p. Frequency and presence count the output only;
repetition counts the prompt and the output.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter

import torch
from torch import Tensor

from specdec.config import SamplingParams
from specdec.models.dense import dense_forward
from tests.verifier import lossless as L


def reference_logits(row: Tensor, params: SamplingParams, prompt: list[int], output: list[int]) -> Tensor:
    """One row of raw logits `[V]` -> processed logits (float64) for the context prompt + output. The tiny
    target has no EOS, so min_new_tokens holds back the stop token ids only."""
    z = row.double().clone()
    stop_ids = params.stop_token_ids
    for token, bias in params.logit_bias:
        z[token] += bias
    if len(output) < params.min_new_tokens:
        for token in stop_ids:
            z[token] = -math.inf
    r = params.repetition_penalty
    for token in set(prompt) | set(output):
        z[token] = z[token] / r if z[token] > 0 else z[token] * r
    for token, count in Counter(output).items():
        z[token] -= params.frequency_penalty * count + params.presence_penalty
    return z


def reference_distribution(z: Tensor, params: SamplingParams) -> Tensor:
    """Processed logits `[V]` float64 -> the distribution sampled from (temperature, top-k, min_p, top-p)."""
    z = z / params.temperature
    if params.top_k and params.top_k < z.shape[-1]:
        kth = z.sort(descending=True).values[params.top_k - 1]
        z = torch.where(z >= kth, z, torch.full_like(z, -math.inf))
    p = torch.exp(z - z.max())
    p = p / p.sum()
    if params.min_p:
        p = torch.where(p >= params.min_p * p.max(), p, torch.zeros_like(p))
        p = p / p.sum()
    if params.top_p < 1.0:
        ranked, order = p.sort(descending=True)
        before = ranked.cumsum(0) - ranked
        kept = torch.where(before < params.top_p, ranked, torch.zeros_like(ranked))
        p = torch.zeros_like(p).scatter(0, order, kept)
        p = p / p.sum()
    return p


def reference_logprobs(z: Tensor, params: SamplingParams) -> Tensor:
    """What logprobs report: log of the distribution sampled from; at T=0 the processed logits' log-softmax."""
    if params.greedy:
        return z - torch.logsumexp(z, 0)
    return torch.log(reference_distribution(z, params))


@torch.inference_mode()
def target_rows(target, contexts: list[list[int]]) -> Tensor:
    """Next-token logits after each context (all of one length), float64 `[M, V]`."""
    return target.lm_head(dense_forward(target, torch.tensor(contexts))[:, -1]).double()


@torch.inference_mode()
def greedy_reference(target, prompt: list[int], params: SamplingParams) -> list[int]:
    """Plain greedy decoding with every control, one dense forward per token."""
    out: list[int] = []
    while len(out) < params.max_new_tokens:
        z = reference_logits(target_rows(target, [prompt + out])[0], params, prompt, out)
        out.append(int(z.argmax()))
        if out[-1] in params.stop_token_ids and len(out) > params.min_new_tokens:
            break
    return out


@torch.inference_mode()
def exact_joint(target, params: SamplingParams, horizon: int = L.HORIZON) -> Tensor:
    """P(t1, ..., t_horizon) from L.PROMPT, float64 `[V] * horizon`, each context's row processed with its own
    history."""
    joint = torch.ones((), dtype=torch.float64)
    for k in range(horizon):
        outputs = [list(c) for c in itertools.product(range(L.VOCAB), repeat=k)]
        rows = target_rows(target, [L.PROMPT + c for c in outputs])
        step = torch.stack([reference_distribution(reference_logits(row, params, L.PROMPT, c), params)
                            for row, c in zip(rows, outputs)])
        joint = joint.unsqueeze(-1) * step.view(*([L.VOCAB] * k), L.VOCAB)
    return joint
