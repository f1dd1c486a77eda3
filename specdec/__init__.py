"""specdec: a speculative-decoding-first LLM generation engine.

    from specdec import LLM, SamplingParams
    llm = LLM("smollm2-135m", drafter="ngram", tree="chain:k=5")
    print(llm.generate(["Summarise: ..."], SamplingParams(max_new_tokens=64))[0].text)
"""

from specdec.api import LLM, StreamDelta
from specdec.config import EngineConfig, SamplingParams
from specdec.errors import SpecdecError
from specdec.engine.outputs import RequestMetrics, RequestOutput
from specdec.tree.token_tree import TokenTree
from specdec.tree.spec import TreeSpec, parse_tree_spec

__all__ = [
    "LLM", "EngineConfig", "RequestMetrics", "RequestOutput", "SamplingParams", "SpecdecError", "StreamDelta",
    "TokenTree", "TreeSpec", "parse_tree_spec",
]
__version__ = "0.1.0"
