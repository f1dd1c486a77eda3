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
MAX_LOGPROBS = 20  # top logprobs per token, as OpenAI allows
MAX_N = 128  # samples per prompt
PENALTY_LIMIT = 2.0  # OpenAI's range for frequency and presence penalties: [-2, 2]
BIAS_LIMIT = 100.0  # OpenAI's range for logit_bias values: [-100, 100]
# The CPU weight formats `quantize` names, by weight bits (activations are int8 in all of them). int7 is int8
# storage on a 7-bit grid: as exact, and ~1.3x faster at the 2-8 rows of tree verification on AVX2, where the
# 8-bit products need one more vector op (specdec/kernels/cpu/qlinear.cpp).
WEIGHT_BITS = {"int8": 8, "int7": 7, "int4": 4}


@dataclass(frozen=True)
class SamplingParams:
    """How one request is decoded. `temperature=0` is greedy; `seed` makes sampling reproducible.

    Every control holds under speculation: penalties, `logit_bias` and `min_new_tokens` are applied at each
    tree node from the committed tokens plus that node's ancestors, so greedy output equals plain greedy output
    and sampled output follows the processed distribution exactly, whatever the drafter.

    - `repetition_penalty` (CTRL / Hugging Face): a token already in the prompt or the output has its logit
      divided by it when positive, multiplied when negative (1 = off).
    - `frequency_penalty`, `presence_penalty` (OpenAI): subtract `frequency * count` and `presence * (count > 0)`
      from the logit of each token by its count in the output so far (0 = off).
    - `min_p`: after temperature, drop tokens less likely than `min_p` times the most likely one (0 = off).
    - `logit_bias`: token id -> value added to its logit before everything else ({} = off).
    - `stop_token_ids`: tokens that end the request like EOS (kept in `token_ids`, finish reason "stop").
    - `min_new_tokens`: EOS and stop tokens are impossible (and stop strings unchecked) before this many tokens.
    - `logprobs`: None = off; k >= 0 returns each generated token's log-probability under the processed
      distribution and the k most likely alternatives (at temperature 0: the penalised, biased logits' softmax).
    - `n`: samples of one prompt, each with its own seed stream (sample i > 0 seeds from `seed` and i).
    """

    max_new_tokens: int = 128
    temperature: float = 0.0
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    repetition_penalty: float = 1.0  # 1 = off
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    min_p: float = 0.0  # 0 = off
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias) pairs, sorted; a dict is accepted
    stop_token_ids: tuple[int, ...] = ()
    min_new_tokens: int = 0
    logprobs: int | None = None  # None = off
    n: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "stop", _stop_tuple(self.stop))
        object.__setattr__(self, "logit_bias", _bias_pairs(self.logit_bias))
        object.__setattr__(self, "stop_token_ids", _token_tuple(self.stop_token_ids))
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
        _check(_is_number(self.repetition_penalty) and 0 < self.repetition_penalty <= 100,
               f"repetition_penalty must be a number in (0, 100] (1 = off), got {self.repetition_penalty!r}",
               "repetition_penalty")
        for name in ("frequency_penalty", "presence_penalty"):
            value = getattr(self, name)
            _check(_is_number(value) and -PENALTY_LIMIT <= value <= PENALTY_LIMIT,
                   f"{name} must be a number from -2 to 2 (0 = off), got {value!r}", name)
        _check(_is_number(self.min_p) and 0 <= self.min_p <= 1,
               f"min_p must be a number in [0, 1] (0 = off), got {self.min_p!r}", "min_p")
        _check(_is_int(self.min_new_tokens) and 0 <= self.min_new_tokens <= self.max_new_tokens,
               f"min_new_tokens must be an integer from 0 to max_new_tokens ({self.max_new_tokens}), got "
               f"{self.min_new_tokens!r}", "min_new_tokens")
        _check(self.logprobs is None or (_is_int(self.logprobs) and 0 <= self.logprobs <= MAX_LOGPROBS),
               f"logprobs must be None (off) or an integer from 0 to {MAX_LOGPROBS} (how many top alternatives "
               f"to return per token), got {self.logprobs!r}", "logprobs")
        _check(_is_int(self.n) and 1 <= self.n <= MAX_N, f"n must be an integer from 1 to {MAX_N}, got {self.n!r}",
               "n")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def penalised(self) -> bool:
        """Whether any control depends on the tokens before a row (so each tree node needs its own row)."""
        return (self.repetition_penalty != 1.0 or self.frequency_penalty != 0.0 or self.presence_penalty != 0.0
                or bool(self.logit_bias) or self.min_new_tokens > 0)

    @property
    def bias(self) -> dict[int, float]:
        return dict(self.logit_bias)


KV_CACHE_DTYPES = ("auto", "float32", "bfloat16")


@dataclass(frozen=True)
class EngineConfig:
    """How big the engine is. Defaults suit one CPU user; servers raise `max_num_seqs` and the KV budget."""

    block_size: int = 16
    kv_cache_tokens: int = 32768  # KV capacity in tokens across all sequences (rounded up to blocks)
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048  # per step: prefill-chunk tokens + tree nodes
    max_tree_nodes: int = 128
    prefill_chunk: int = 512
    # Prefill tokens in a step that also decodes (0: only the limits above). Each stalls every decoding
    # sequence's next token; a server trades a little time to first token for steady inter-token latency.
    prefill_tokens_while_decoding: int = 0
    enable_prefix_caching: bool = True
    # Choose each sequence's tree depth every step for the most goodput (0 = plain decode when speculation
    # does not pay); False drafts the full tree every step (acceptance experiments want that).
    adaptive_speculation: bool = True
    # "lossless" (rejection sampling; the output follows the target exactly) or "typical" (Medusa's typical
    # acceptance: accepts any draft token the target finds plausible enough; lossy, opt-in, sampled requests only)
    acceptance: str = "lossless"
    typical_threshold: float = 0.09  # epsilon: accept if p(token) > min(epsilon, delta * exp(-entropy))
    typical_alpha: float = 0.3  # delta
    # The target's K/V cache precision: "auto" (the model's own: float32 for a CPU float32 or int8 model) or
    # "bfloat16" (half the cache memory and traffic; on CPU, attention on AMX tiles, where a tree's extra rows
    # cost attention next to nothing, or with AVX512-BF16 dot products, where they cost about half; it needs
    # one of the two there). Greedy speculative output still equals plain
    # output at either precision: only the model's numbers change, as with any precision choice.
    kv_cache_dtype: str = "auto"
    # On a GPU, steps of up to this many new tokens (decodes, tree verifications) replay CUDA graphs captured
    # per shape bucket instead of launching each kernel from Python (engine/cuda_graphs.py); 0: always eager.
    cuda_graph_tokens: int = 256

    def __post_init__(self) -> None:
        for name in ("block_size", "kv_cache_tokens", "max_num_seqs", "max_num_batched_tokens", "max_tree_nodes",
                     "prefill_chunk"):
            value = getattr(self, name)
            _check(_is_int(value) and value > 0, f"{name} must be a positive integer, got {value!r}", name)
        value = self.prefill_tokens_while_decoding
        _check(_is_int(value) and value >= 0, f"prefill_tokens_while_decoding must be an integer >= 0 (0: no cap), "
               f"got {value!r}", "prefill_tokens_while_decoding")
        value = self.cuda_graph_tokens
        _check(_is_int(value) and value >= 0, f"cuda_graph_tokens must be an integer >= 0 (0: no CUDA graphs), "
               f"got {value!r}", "cuda_graph_tokens")
        for name in ("enable_prefix_caching", "adaptive_speculation"):
            value = getattr(self, name)
            _check(isinstance(value, bool), f"{name} must be True or False, got {value!r}", name)
        _check(self.acceptance in ("lossless", "typical"),
               f"acceptance must be 'lossless' or 'typical', got {self.acceptance!r}", "acceptance")
        _check(_is_number(self.typical_threshold) and 0 <= self.typical_threshold <= 1,
               f"typical_threshold must be a number in [0, 1], got {self.typical_threshold!r}", "typical_threshold")
        _check(_is_number(self.typical_alpha) and self.typical_alpha >= 0,
               f"typical_alpha must be a number >= 0, got {self.typical_alpha!r}", "typical_alpha")
        _check(self.kv_cache_dtype in KV_CACHE_DTYPES,
               f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, got {self.kv_cache_dtype!r}",
               "kv_cache_dtype")
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


def _bias_pairs(bias: object) -> tuple[tuple[int, float], ...]:
    """A dict (or pairs) of token id -> bias -> sorted (int, float) pairs, each checked."""
    if bias is None:
        return ()
    if isinstance(bias, dict):
        items = list(bias.items())
    elif isinstance(bias, (list, tuple)) and all(isinstance(p, (list, tuple)) and len(p) == 2 for p in bias):
        items = [tuple(p) for p in bias]
    else:
        raise ConfigError(f"logit_bias must be a dict of token id -> bias, got {type(bias).__name__}",
                          field="logit_bias")
    for token, value in items:
        _check(_is_int(token) and token >= 0, f"logit_bias keys must be token ids (integers >= 0), got {token!r}",
               "logit_bias")
        _check(_is_number(value) and -BIAS_LIMIT <= value <= BIAS_LIMIT,
               f"logit_bias values must be numbers from -100 to 100, got {value!r} for token {token}", "logit_bias")
    _check(len({t for t, _ in items}) == len(items), "logit_bias names a token twice", "logit_bias")
    return tuple(sorted((int(t), float(v)) for t, v in items))


def _token_tuple(ids: object) -> tuple[int, ...]:
    if ids is None:
        return ()
    if isinstance(ids, (str, bytes)) or not isinstance(ids, (list, tuple, set, frozenset)):
        raise ConfigError(f"stop_token_ids must be a list of token ids, got {type(ids).__name__}",
                          field="stop_token_ids")
    ids = tuple(ids)
    _check(all(_is_int(t) and t >= 0 for t in ids), f"stop_token_ids must be token ids (integers >= 0), got {ids!r}",
           "stop_token_ids")
    return ids


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return isinstance(value, int) or math.isfinite(value)  # math.isfinite(10**400) would overflow


def _check(ok: bool, message: str, name: str) -> None:
    if not ok:
        raise ConfigError(message, field=name)
