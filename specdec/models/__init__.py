"""Model runner: our llama-family implementation and the loaders that feed it.

Names are imported on first use, so `specdec.models.registry` (the `specdec models` listing, the cache) and
`specdec.models.tokenizer` load without torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "AttentionContext": "specdec.models.context", "ForwardOutput": "specdec.models.llama",
    "LlamaModel": "specdec.models.llama", "LoadedModel": "specdec.models.loader",
    "ModelConfig": "specdec.models.config", "load_model": "specdec.models.loader",
}  # fmt: skip
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'specdec.models' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
