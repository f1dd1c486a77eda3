"""User-facing settings: how to sample one request, and how to size the engine.

Both validate on construction, so a bad value fails where it was written, with a message naming the field,
instead of deep inside a step (an overflowing seed, a `stop=None`, a string where a number belongs). Every
error is a `ConfigError` whose `field` names the setting, so the CLI can name its own flag instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from specdec.errors import ConfigError

SEED_LIMIT = 2**64  # torch generators take seeds in [0, 2**64)


@dataclass(frozen=True)
class SamplingParams:
    """How one request is decoded. `temperature=0` is greedy; `seed` makes sampling reproducible."""

    max_new_tokens: int = 128
    temperature: float = 0.0
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "stop", _stop_tuple(self.stop))
        _check(_is_int(self.max_new_tokens) and self.max_new_tokens >= 1,
               f"max_new_tokens must be a positive integer, got {self.max_new_tokens!r}", "max_new_tokens")
        _check(_is_number(self.temperature) and 0 <= self.temperature <= 100,
               f"temperature must be a number between 0 and 100, got {self.temperature!r}", "temperature")
        _check(_is_int(self.top_k) and self.top_k >= 0, f"top_k must be an integer >= 0 (0 = off), got {self.top_k!r}",
               "top_k")
        _check(_is_number(self.top_p) and 0 < self.top_p <= 1, f"top_p must be a number in (0, 1], got {self.top_p!r}",
               "top_p")
        _check(self.seed is None or (_is_int(self.seed) and 0 <= self.seed < SEED_LIMIT),
               f"seed must be an integer from 0 to 2**64 - 1, got {self.seed!r}", "seed")
        _check(isinstance(self.ignore_eos, bool), f"ignore_eos must be True or False, got {self.ignore_eos!r}",
               "ignore_eos")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass(frozen=True)
class EngineConfig:
    """How big the engine is. Defaults suit one CPU user; servers raise `max_num_seqs` and the KV budget."""

    block_size: int = 16
    kv_cache_tokens: int = 32768  # KV capacity in tokens across all sequences (rounded up to blocks)
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048  # per step: prefill-chunk tokens + tree nodes
    max_tree_nodes: int = 128
    prefill_chunk: int = 512
    enable_prefix_caching: bool = True
    # Choose each sequence's tree depth every step for the most goodput (0 = plain decode when speculation
    # does not pay); False drafts the full tree every step (acceptance experiments want that).
    adaptive_speculation: bool = True
    # "lossless" (rejection sampling; the output follows the target exactly) or "typical" (Medusa's typical
    # acceptance: accepts any draft token the target finds plausible enough; lossy, opt-in, sampled requests only)
    acceptance: str = "lossless"
    typical_threshold: float = 0.09  # epsilon: accept if p(token) > min(epsilon, delta * exp(-entropy))
    typical_alpha: float = 0.3  # delta

    def __post_init__(self) -> None:
        for name in ("block_size", "kv_cache_tokens", "max_num_seqs", "max_num_batched_tokens", "max_tree_nodes",
                     "prefill_chunk"):
            value = getattr(self, name)
            _check(_is_int(value) and value > 0, f"{name} must be a positive integer, got {value!r}", name)
        for name in ("enable_prefix_caching", "adaptive_speculation"):
            value = getattr(self, name)
            _check(isinstance(value, bool), f"{name} must be True or False, got {value!r}", name)
        _check(self.acceptance in ("lossless", "typical"),
               f"acceptance must be 'lossless' or 'typical', got {self.acceptance!r}", "acceptance")
        _check(_is_number(self.typical_threshold) and 0 <= self.typical_threshold <= 1,
               f"typical_threshold must be a number in [0, 1], got {self.typical_threshold!r}", "typical_threshold")
        _check(_is_number(self.typical_alpha) and self.typical_alpha >= 0,
               f"typical_alpha must be a number >= 0, got {self.typical_alpha!r}", "typical_alpha")
        _check(self.max_tree_nodes <= self.max_num_batched_tokens,
               f"max_tree_nodes ({self.max_tree_nodes}) cannot exceed max_num_batched_tokens "
               f"({self.max_num_batched_tokens})", "max_tree_nodes")

    @property
    def num_blocks(self) -> int:
        return -(-self.kv_cache_tokens // self.block_size)


def _stop_tuple(stop: object) -> tuple[str, ...]:
    """`None`, one string, or an iterable of strings -> a tuple of non-empty strings."""
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = (stop,)
    elif isinstance(stop, (list, tuple, set, frozenset)):
        stop = tuple(stop)
    else:
        raise ConfigError(f"stop must be a string or a list of strings, got {type(stop).__name__}", field="stop")
    _check(all(isinstance(s, str) and s for s in stop), f"stop strings must be non-empty strings, got {stop!r}",
           "stop")
    return stop


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return isinstance(value, int) or math.isfinite(value)  # math.isfinite(10**400) would overflow


def _check(ok: bool, message: str, name: str) -> None:
    if not ok:
        raise ConfigError(message, field=name)
