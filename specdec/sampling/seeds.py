"""`n` samples of one prompt: one request per sample, each with its own seed stream.

Sample 0 keeps the request's seed, so `n=1` and the first of `n` samples are the same request. Sample i > 0
seeds from (seed, i) through SplitMix64's finaliser, so the streams of one seed do not overlap the streams of
a neighbouring seed (seed + 1 would otherwise be sample 1 of seed). Unseeded samples stay unseeded (each
draws fresh entropy).
"""

from __future__ import annotations

from dataclasses import replace

from specdec.config import SEED_LIMIT, SamplingParams

_MASK = SEED_LIMIT - 1


def sample_seed(seed: int | None, index: int) -> int | None:
    """The seed of sample `index` of a request seeded with `seed`."""
    if seed is None or index == 0:
        return seed
    z = (seed + index * 0x9E3779B97F4A7C15) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def per_sample(params: SamplingParams) -> list[SamplingParams]:
    """`params` with `n` samples -> `n` single-sample params, each with its own seed."""
    if params.n == 1:
        return [params]
    return [replace(params, n=1, seed=sample_seed(params.seed, i)) for i in range(params.n)]
