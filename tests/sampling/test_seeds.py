"""n samples: one request per sample, each with its own seed stream; sample 0 is the request itself."""

from __future__ import annotations

from specdec.config import SamplingParams
from specdec.sampling.seeds import per_sample, sample_seed


def test_sample_zero_keeps_the_seed_and_the_rest_get_distinct_seeds():
    seeds = [p.seed for p in per_sample(SamplingParams(seed=7, n=4))]
    assert seeds[0] == 7 and len(set(seeds)) == 4
    assert all(0 <= s < 2**64 for s in seeds)


def test_neighbouring_seeds_do_not_share_streams():
    a = {sample_seed(7, i) for i in range(64)}
    b = {sample_seed(8, i) for i in range(64)}
    assert not a & b


def test_unseeded_samples_stay_unseeded_and_n_is_one_each():
    samples = per_sample(SamplingParams(n=3, temperature=0.5))
    assert [p.seed for p in samples] == [None] * 3 and all(p.n == 1 for p in samples)
    assert per_sample(SamplingParams()) == [SamplingParams()]
