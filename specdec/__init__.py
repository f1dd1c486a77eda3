"""specdec: a speculative-decoding-first LLM generation engine.

    from specdec import LLM, SamplingParams
    llm = LLM("smollm2-135m", drafter="ngram", tree="chain:k=5")
    print(llm.generate(["Summarise: ..."], SamplingParams(max_new_tokens=64))[0].text)

The public names are imported on first use (PEP 562), so `import specdec` (and the CLI's `--help`, `models`
and every error caught before the model loads) does not pay for importing torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "LLM": "specdec.api", "StreamDelta": "specdec.api",
    "EngineConfig": "specdec.config", "SamplingParams": "specdec.config",
    "SpecdecError": "specdec.errors",
    "RequestMetrics": "specdec.engine.outputs", "RequestOutput": "specdec.engine.outputs",
    "TokenTree": "specdec.tree.token_tree",
    "TreeSpec": "specdec.tree.spec", "parse_tree_spec": "specdec.tree.spec",
}  # fmt: skip

__all__ = sorted(_EXPORTS)
__version__ = "0.1.0"

if TYPE_CHECKING:
    from specdec.api import LLM, StreamDelta
    from specdec.config import EngineConfig, SamplingParams
    from specdec.engine.outputs import RequestMetrics, RequestOutput
    from specdec.errors import SpecdecError
    from specdec.tree.spec import TreeSpec, parse_tree_spec
    from specdec.tree.token_tree import TokenTree


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'specdec' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
