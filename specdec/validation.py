"""Checks of what users hand the library, run before any slow work (the model load, a generation step).

Each check raises a `ConfigError` whose message says what was wrong and what is accepted, so no bad value
travels into torch or the tokenizer to come back as an `IndexError`, a `TypeError` or an overflow. The LLM
facade (`specdec.api`) and the CLI call these; they import no torch at module level.
"""

from __future__ import annotations

import os
from typing import Any

from specdec.config import WEIGHT_BITS, EngineConfig, SamplingParams
from specdec.errors import ConfigError

QUANTIZATIONS = (None, "none", *WEIGHT_BITS)
MAX_THREADS = 1024


def check_llm_args(*, target: Any, device: Any, dtype: Any, drafter: Any, tree: Any, quantize: Any,
                   engine_config: Any, show_progress: Any, num_threads: Any) -> None:
    """Everything `LLM(...)` takes, checked before the model loads (drafter options and tree included)."""
    if not isinstance(target, str) or not target.strip():
        raise ConfigError(f"target must be a model alias, folder, .gguf file, hub id or dummy:<shape>, "
                          f"got {target!r}", field="target")
    from specdec.models.loader import parse_device, parse_dtype

    torch_device = parse_device(_plain(device, "device"))
    parse_dtype(_plain(dtype, "dtype"))
    check_quantize(quantize, torch_device.type)
    if engine_config is not None and not isinstance(engine_config, EngineConfig):
        raise ConfigError(f"engine_config must be an EngineConfig, got {type(engine_config).__name__}",
                          field="engine_config")
    if not isinstance(show_progress, bool):
        raise ConfigError(f"show_progress must be True or False, got {show_progress!r}", field="show_progress")
    if num_threads is not None and not (_is_int(num_threads) and 1 <= num_threads <= MAX_THREADS):
        raise ConfigError(f"num_threads must be an integer from 1 to {MAX_THREADS} (or None for the default), "
                          f"got {num_threads!r}", field="num_threads")
    check_drafter_and_tree(drafter, tree, engine_config or EngineConfig(), quantize)


def check_quantize(quantize: Any, device_type: str = "cpu") -> None:
    if quantize not in QUANTIZATIONS:
        raise ConfigError(f"unknown quantization {quantize!r}; choose int8, int7, int4 or none", field="quantize")
    if quantize in WEIGHT_BITS and device_type != "cpu":
        raise ConfigError(f"{quantize} quantization uses CPU kernels; on CUDA use bfloat16 instead",
                          field="quantize")


def check_drafter_and_tree(drafter: Any, tree: Any, config: EngineConfig, quantize: Any = None) -> None:
    """Parse the tree and the drafter's options without a model: what can be known before loading is checked."""
    if not isinstance(drafter, str) or not drafter.strip():
        raise ConfigError(f"drafter must be a spec string such as 'none', 'ngram' or 'ngram:n=3,k=8', got "
                          f"{drafter!r}", field="drafter")
    if tree is not None and not isinstance(tree, str):
        raise ConfigError(f"tree must be a spec string such as 'chain:k=5' (or None), got {tree!r}", field="tree")
    from specdec.spec_strings import parse_spec
    from specdec.tree.spec import parse_tree_spec

    name, _ = parse_spec(drafter, what="drafter")
    spec = parse_tree_spec(tree, config.max_tree_nodes) if tree else None
    if name == "none" and tree:
        raise ConfigError(f"drafter 'none' drafts nothing, so tree '{tree}' would have no effect; leave the tree "
                          "out, or pick a drafter (ngram, draft, medusa, eagle, ...)", field="tree")
    default = probe_drafter(drafter, config, quantize)
    if spec is None and default is not None:
        check_tree_size(default, config, f"drafter '{drafter}' drafts trees of")


def check_tree_size(spec: Any, config: EngineConfig, what: str) -> None:
    if spec.max_nodes > config.max_tree_nodes:
        raise ConfigError(f"{what} up to {spec.max_nodes} nodes, more than max_tree_nodes={config.max_tree_nodes}; "
                          "draft fewer tokens (e.g. a smaller k) or raise max_tree_nodes", field="max_tree_nodes")


class _ModelNeeded(BaseException):
    """Raised by the probe's stand-in model: the factory got past its option checks. A BaseException, so a
    factory's own `except Exception` cannot swallow it."""


class _NoModel:
    def __getattr__(self, name: str) -> Any:
        raise _ModelNeeded


def probe_drafter(spec: str, config: EngineConfig, quantize: Any = None) -> Any:
    """Run the drafter's factory against a stand-in for the target that stops the factory at its first touch.

    Factories check their options before they touch the model, so this finds unknown drafters, unknown
    options and bad values before a model loads. Returns the drafter's default tree when the factory
    finished without the model (n-gram, none), else None (the rest is checked when the drafter is built).
    """
    import torch

    from specdec.drafters.base import DrafterContext
    from specdec.drafters.registry import build_drafter

    ctx = DrafterContext(_NoModel(), config, torch.device("cpu"), torch.float32, quantize)
    try:
        drafter = build_drafter(spec, ctx)
    except _ModelNeeded:
        return None
    try:
        return drafter.default_tree()
    except _ModelNeeded:
        return None


# --------------------------------------------------------------------------------------------------- prompts
def prompt_kind(prompt: Any) -> str:
    """'text', 'ids' or 'messages', or a ConfigError saying what a prompt may be."""
    if isinstance(prompt, str):
        return "text"
    if isinstance(prompt, (list, tuple)) and prompt:
        if all(_is_int(t) for t in prompt):
            return "ids"
        if all(isinstance(m, dict) for m in prompt):
            return "messages"
    if isinstance(prompt, (list, tuple)) and not prompt:
        raise ConfigError("a prompt is empty: give text, token ids or chat messages")
    raise ConfigError(f"a prompt must be text, a list of token ids or a list of chat messages "
                      f"({{'role': ..., 'content': ...}}), got {_describe(prompt)}")


def check_text(text: str, what: str = "the prompt") -> None:
    """Text must encode as UTF-8: a prompt read with the wrong encoding holds lone surrogates."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        ch = text[exc.start]
        byte = ord(ch) - 0xDC00 if 0xDC80 <= ord(ch) <= 0xDCFF else None
        held = f"the byte 0x{byte:02x}" if byte is not None else f"the unpaired surrogate U+{ord(ch):04X}"
        raise ConfigError(f"{what} is not valid UTF-8 text: it holds {held} at character {exc.start}; "
                          "pass UTF-8 text (re-encode the input, or decode it with errors='replace')") from None


def check_token_ids(ids: list[int], vocab_size: int) -> None:
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise ConfigError(f"token id {bad[0]} is outside the model's vocabulary (0 to {vocab_size - 1})"
                          + (f", and {len(bad) - 1} more" if len(bad) > 1 else ""))


def check_messages(messages: list[dict]) -> None:
    for i, message in enumerate(messages):
        role, content = message.get("role"), message.get("content")
        if not isinstance(role, str) or not role:
            raise ConfigError(f"chat message {i} needs a 'role' string ('system', 'user' or 'assistant'), "
                              f"got {_describe(role)}")
        if not isinstance(content, str):
            raise ConfigError(f"chat message {i} needs a 'content' string, got {_describe(content)}")
        check_text(content, f"chat message {i}")


def prompts_list(prompts: Any) -> list:
    """One prompt or a list of prompts -> a non-empty list of prompts."""
    if prompts is None:
        raise ConfigError("no prompts given (got None); pass text, token ids, chat messages, or a list of them")
    if isinstance(prompts, str):
        return [prompts]
    if isinstance(prompts, (list, tuple)) and prompts and all(_is_int(t) for t in prompts):
        return [list(prompts)]  # one prompt of token ids
    if isinstance(prompts, (list, tuple)) and prompts and all(isinstance(m, dict) for m in prompts):
        return [list(prompts)]  # one chat conversation
    if isinstance(prompts, (dict, bytes, bytearray)) or not hasattr(prompts, "__iter__"):
        raise ConfigError(f"prompts must be text, token ids, chat messages, or a list of them, got "
                          f"{_describe(prompts)}")
    listed = list(prompts)
    if not listed:
        raise ConfigError("no prompts given (an empty list)")
    return listed


def params_list(params: Any, n: int) -> list[SamplingParams]:
    if params is None:
        return [SamplingParams()] * n
    if isinstance(params, SamplingParams):
        return [params] * n
    if isinstance(params, (str, bytes, dict)) or not hasattr(params, "__iter__"):
        raise ConfigError(f"params must be a SamplingParams or a list of them (one per prompt), got "
                          f"{_describe(params)}")
    listed = list(params)
    if not all(isinstance(p, SamplingParams) for p in listed):
        bad = next(p for p in listed if not isinstance(p, SamplingParams))
        raise ConfigError(f"params must be SamplingParams, got {_describe(bad)} in the list")
    if len(listed) != n:
        raise ConfigError(f"got {len(listed)} sampling params for {n} prompts")
    return listed


# ---------------------------------------------------------------------------------------------- resources
def check_kv_cache_dtype(model: Any, config: EngineConfig) -> None:
    """A bfloat16 cache on CPU needs the AMX tiles' attention: the torch reference would serve it, but without
    the fixed reduction order per row that keeps greedy speculative output equal to plain output. For the same
    reason a float32 cache is refused where the model's own is float64 (an int8 model on a CPU without the
    compiled kernels attends in float64 so that a row's result does not depend on its batch)."""
    if model.device.type != "cpu":
        return
    import torch

    from specdec.kernels import cpu as cpu_kernels

    if config.kv_cache_dtype == "float32" and model.kv_cache_dtype == torch.float64:
        raise ConfigError("kv_cache_dtype='float32' needs the compiled CPU kernels for this model: without them "
                          "its attention runs in float64, so that speculative output equals plain output; use "
                          "'auto'", field="kv_cache_dtype")
    if config.kv_cache_dtype != "bfloat16":
        return

    if model.dtype != torch.float32 or not cpu_kernels.bf16_attention():
        raise ConfigError(f"kv_cache_dtype='bfloat16' on CPU needs a float32 or int8 model and a CPU with AMX-BF16 "
                          f"or AVX512-BF16 (this one runs the kernels at level {cpu_kernels.isa()!r}); use 'auto'",
                          field="kv_cache_dtype")


def check_kv_cache_fits(model: Any, config: EngineConfig) -> None:
    """Refuse a KV cache larger than the device's memory before allocating it (an allocation that large fails
    with an allocator RuntimeError on CUDA, and on the CPU maps lazily and gets the process killed later)."""
    import torch

    c = model.config
    dtype = model.cache_dtype(config.kv_cache_dtype)
    need = 2 * c.num_layers * config.num_blocks * config.block_size * c.num_kv_heads * c.head_dim
    need *= torch.empty((), dtype=dtype).element_size()
    device = model.device
    if device.type == "cuda":
        have, what = torch.cuda.mem_get_info(device)[0], "free GPU memory"
    else:
        try:
            have, what = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "this machine's memory"
        except (ValueError, OSError, AttributeError):
            return
    if need > have:
        raise ConfigError(f"a KV cache of {config.num_blocks * config.block_size:,} tokens needs {need / 2**30:.1f} "
                          f"GiB, more than {what} ({have / 2**30:.1f} GiB); lower kv_cache_tokens",
                          field="kv_cache_tokens")


def _plain(value: Any, name: str) -> Any:
    import torch

    if isinstance(value, str) or (name == "device" and isinstance(value, torch.device)) or (
            name == "dtype" and isinstance(value, torch.dtype)):
        return value
    raise ConfigError(f"{name} must be a string, got {_describe(value)}", field=name)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _describe(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:60] + '...' if len(text) > 60 else text}"
