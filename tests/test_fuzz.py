"""Fuzz pass over the public surfaces (issue 18): SamplingParams, EngineConfig, tree specs, drafter specs,
prompt inputs and token-id inputs. Every input either works or raises `SpecdecError` with a message; no other
exception escapes. Derandomized, so CI runs the same examples every time."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specdec import LLM, EngineConfig, SamplingParams
from specdec.errors import SpecdecError
from specdec.models.loader import load_model

FUZZ = settings(max_examples=300, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
SLOW_FUZZ = settings(FUZZ, max_examples=60)

# Values a caller might pass anywhere: wrong types, edge numbers, huge ints, NaN, odd text.
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(min_value=-2**80, max_value=2**80),
    st.sampled_from([0, 1, -1, 2**63, 2**64 - 1, 2**64, 10**400]), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8), st.binary(max_size=4),
)
anything = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4), st.tuples(inner, inner),
                                                         st.dictionaries(st.text(max_size=5), inner, max_size=3)),
                        max_leaves=8)


def works_or_says_why(call) -> None:
    try:
        call()
    except SpecdecError as exc:
        assert str(exc).strip(), f"{type(exc).__name__} without a message"


@pytest.fixture(scope="module")
def tiny_loaded():
    return load_model("dummy:tiny-llama", show_progress=False)


@pytest.fixture(scope="module")
def tiny(tiny_loaded) -> LLM:
    return LLM.from_loaded(tiny_loaded)


@FUZZ
@given(st.dictionaries(st.sampled_from(["max_new_tokens", "temperature", "top_k", "top_p", "seed", "stop",
                                        "ignore_eos"]), anything, max_size=7))
def test_sampling_params(kwargs):
    works_or_says_why(lambda: SamplingParams(**kwargs))


@FUZZ
@given(st.dictionaries(st.sampled_from(["block_size", "kv_cache_tokens", "max_num_seqs", "max_num_batched_tokens",
                                        "max_tree_nodes", "prefill_chunk", "enable_prefix_caching",
                                        "adaptive_speculation", "acceptance", "typical_threshold", "typical_alpha"]),
                       anything, max_size=11))
def test_engine_config(kwargs):
    works_or_says_why(lambda: EngineConfig(**kwargs))


sizes = st.one_of(st.integers(min_value=-2, max_value=4096), st.sampled_from([2**31, 10**7, 10**12]))


@SLOW_FUZZ
@given(st.fixed_dictionaries({}, optional={
    "block_size": sizes, "kv_cache_tokens": sizes, "max_num_seqs": sizes, "max_num_batched_tokens": sizes,
    "max_tree_nodes": sizes, "prefill_chunk": sizes, "enable_prefix_caching": st.booleans(),
    "adaptive_speculation": st.booleans(), "acceptance": st.sampled_from(["lossless", "typical", "x"])}),
       st.sampled_from(["none", "ngram", "ngram:k=3"]))
def test_engine_configs_that_construct_also_run(tiny_loaded, kwargs, drafter):
    """A config that constructs must give an engine that runs, or refuse the request with a message."""
    def run():
        llm = LLM.from_loaded(tiny_loaded, drafter, engine_config=EngineConfig(**kwargs))
        llm.generate([[5, 6, 7, 5, 6, 7], [9] * 40], SamplingParams(max_new_tokens=4))

    works_or_says_why(run)


def _spec_text(names: list[str], keys: list[str]):
    """Spec strings near the grammar (`name:key=value,...`) as well as arbitrary text."""
    value = st.one_of(st.integers(min_value=-10, max_value=10**30).map(str), st.text(max_size=6),
                      st.sampled_from(["", "0", "1", "1.5", "-0", "1e9", "NaN", "tree-16", "/", ".", "~", "a/b",
                                       str(10**30), str(2**63)]))
    item = st.one_of(st.builds(lambda k, v: f"{k}={v}", st.sampled_from(keys) | st.text(max_size=4), value), value)
    structured = st.builds(lambda n, items: n + (":" + ",".join(items) if items else ""),
                           st.sampled_from(names) | st.text(max_size=6), st.lists(item, max_size=4))
    return st.one_of(structured, st.text(max_size=30))


@FUZZ
@given(_spec_text(["chain", "static", "dynamic", "Chain", " dynamic "], ["k", "depth", "topk", "budget", "name",
                                                                         "file", ""]),
       st.one_of(st.none(), st.integers(min_value=-3, max_value=10**6)))
def test_tree_specs(text, max_nodes):
    from specdec.tree.spec import parse_tree_spec

    def parse():
        spec = parse_tree_spec(text, max_nodes)
        for depth in (0, 1, spec.depth, 10**9):  # what the planner asks of a parsed spec
            spec.nodes_within(depth)
            spec.limited(depth)

    works_or_says_why(parse)


@SLOW_FUZZ
@given(_spec_text(["none", "ngram", "draft", "medusa", "eagle", "eagle3", "oracle", "NGRAM"],
                  ["n", "k", "branches", "layers", "alpha", "cost", "seed", ""]),
       st.one_of(st.none(), _spec_text(["chain", "dynamic", "static"], ["k", "depth", "topk", "budget"])))
def test_drafter_specs(tiny, monkeypatch, drafter, tree):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # a spec naming "owner/name" must not reach for the hub
    before = (tiny.drafter_spec, tiny.engine)

    def switch():
        try:
            tiny.use(drafter, tree)
        except SpecdecError:
            assert (tiny.drafter_spec, tiny.engine) == before  # a failed switch changes nothing
            raise
        tiny.generate([[5, 6, 7, 5, 6]], SamplingParams(max_new_tokens=3))

    works_or_says_why(switch)
    tiny.use("none")


prompt_like = st.one_of(
    st.text(max_size=40),  # includes lone surrogates, NUL, control characters
    st.lists(st.integers(min_value=-5, max_value=600), max_size=12),
    st.lists(st.dictionaries(st.sampled_from(["role", "content", "name"]), anything, max_size=3), max_size=3),
    anything,
)


@SLOW_FUZZ
@given(st.one_of(prompt_like, st.lists(prompt_like, max_size=3)), st.one_of(st.none(), anything),
       st.one_of(st.booleans(), anything))
def test_prompt_and_params_inputs_to_generate(tiny, prompts, params, chat):
    works_or_says_why(lambda: tiny.generate(prompts, params if params is not None else SamplingParams(max_new_tokens=2),
                                            chat=chat))
    assert not tiny.engine.has_unfinished()


@FUZZ
@given(st.lists(st.one_of(st.integers(), st.integers(min_value=-2, max_value=520), st.booleans()), max_size=16))
def test_token_id_inputs(tiny, ids):
    works_or_says_why(lambda: tiny.generate([ids], SamplingParams(max_new_tokens=1)))


@FUZZ
@given(st.one_of(st.text(max_size=60), st.lists(st.dictionaries(st.sampled_from(["role", "content"]),
                                                                st.one_of(st.text(max_size=20), anything),
                                                                max_size=2), max_size=3)),
       st.booleans())
def test_text_and_chat_inputs_to_the_real_tokenizer(default_llm, prompt, chat):
    works_or_says_why(lambda: default_llm.encode(prompt, chat=chat))
