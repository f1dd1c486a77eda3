"""Sampling: per-node logits processing (penalties, logit_bias, min_new_tokens), the processed distribution
(temperature, top-k, min_p, top-p), logprobs, and seeded draws. Shared by the verifier, the engine and drafters."""

from specdec.sampling.distribution import make_generator, sample, target_probs, uniform

__all__ = ["make_generator", "sample", "target_probs", "uniform"]
