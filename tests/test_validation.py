"""Bad input through the library (issue 18): every case raises a `ConfigError` with a message, never an
IndexError, TypeError, AttributeError or RuntimeError from deep inside, and a failed `use()` changes nothing."""

from __future__ import annotations

import json

import pytest

from specdec import LLM, EngineConfig, SamplingParams
from specdec.errors import ConfigError, SpecdecError
from specdec.models.loader import load_model


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM.from_loaded(load_model("dummy:tiny-llama", show_progress=False))


@pytest.mark.parametrize("ids, words", [([1, 2, 999999], "token id 999999 is outside"), ([1, -1], "token id -1"),
                                        ([512], "token id 512"), ([True, 2], "a prompt must be")])
def test_token_ids_outside_the_vocabulary_are_refused(llm, ids, words):
    with pytest.raises(ConfigError, match=words):
        llm.generate([ids], SamplingParams(max_new_tokens=2))


@pytest.mark.parametrize("call, words", [
    (lambda llm: llm.generate(None), "no prompts given"),
    (lambda llm: llm.generate([]), "no prompts given"),
    (lambda llm: llm.generate(["a"], "x"), "params must be a SamplingParams"),
    (lambda llm: llm.generate(["a"], [SamplingParams(), SamplingParams()]), "2 sampling params for 1 prompts"),
    (lambda llm: llm.generate(["a"], ["x"]), "params must be SamplingParams"),
    (lambda llm: llm.generate(42), "prompts must be"),
    (lambda llm: llm.generate([4.0]), "a prompt must be text"),
    (lambda llm: llm.generate([[1, "a"]]), "a prompt must be text"),
    (lambda llm: llm.generate([[]]), "a prompt is empty"),
    (lambda llm: llm.generate("caf\udcff"), "not valid UTF-8 text: it holds the byte 0xff"),
    (lambda llm: llm.generate("a", chat="yes"), "chat must be True or False"),
])
def test_bad_prompts_and_params_are_config_errors(llm, call, words):
    with pytest.raises(ConfigError, match=words):
        call(llm)


@pytest.mark.parametrize("messages, words", [
    ([{"role": "user"}], "needs a 'content' string"),
    ([{"content": "hi"}], "needs a 'role' string"),
    ([{"role": "user", "content": 3}], "needs a 'content' string"),
    ([{"role": "user", "content": "x\udc80"}], "chat message 0 is not valid UTF-8"),
])
def test_malformed_chat_messages_are_config_errors(default_llm, messages, words):
    """Issue 18: a message without content was a jinja error."""
    with pytest.raises(ConfigError, match=words):
        default_llm.generate([messages], SamplingParams(max_new_tokens=1))


@pytest.mark.parametrize("kwargs, words", [
    ({"target": None}, "target must be"), ({"target": 123}, "target must be"), ({"target": ""}, "target must be"),
    ({"num_threads": -1}, "num_threads must be"), ({"num_threads": 2.5}, "num_threads must be"),
    ({"device": 3}, "device must be a string"), ({"dtype": "float8"}, "unknown dtype"),
    ({"quantize": "int3"}, "unknown quantization"), ({"engine_config": {}}, "engine_config must be"),
    ({"drafter": None}, "drafter must be"), ({"tree": 5}, "tree must be"),
    ({"drafter": "ngram:k=1000"}, "up to 1001 nodes"), ({"drafter": "none", "tree": "chain:k=2"}, "drafts nothing"),
    ({"drafter": "nope"}, "unknown drafter"), ({"show_progress": "no"}, "show_progress"),
])
def test_bad_llm_arguments_fail_before_the_model_loads(kwargs, words, monkeypatch):
    import specdec.api

    def no_load(*args, **kwargs):
        raise AssertionError("the model was loaded before the arguments were checked")

    monkeypatch.setattr(specdec.api, "load_model", no_load)
    with pytest.raises(ConfigError, match=words):
        LLM(**{"target": "dummy:tiny-llama", **kwargs})


@pytest.mark.parametrize("kwargs, words", [
    ({"seed": 2**70}, "seed must be an integer from 0 to 2\\*\\*64 - 1"), ({"seed": -1}, "seed"),
    ({"seed": 1.0}, "seed"), ({"stop": 5}, "stop must be a string or a list"), ({"stop": [""]}, "non-empty"),
    ({"stop": ["a", None]}, "non-empty strings"), ({"max_new_tokens": True}, "max_new_tokens"),
    ({"temperature": float("nan")}, "temperature"), ({"temperature": 10**400}, "temperature"),
    ({"ignore_eos": 1}, "ignore_eos"), ({"top_k": -1}, "top_k"),
])
def test_sampling_params_refuse_bad_values_by_name(kwargs, words):
    with pytest.raises(ConfigError, match=words) as err:
        SamplingParams(**kwargs)
    assert err.value.field == next(iter(kwargs))


def test_stop_none_means_no_stop_strings():
    assert SamplingParams(stop=None).stop == () and SamplingParams(stop="x").stop == ("x",)
    assert SamplingParams(stop=["a", "b"]).stop == ("a", "b")


@pytest.mark.parametrize("kwargs", [{"enable_prefix_caching": "yes"}, {"typical_threshold": 2.0},
                                    {"typical_alpha": -1}, {"block_size": 0},
                                    {"max_tree_nodes": 4096}])
def test_engine_config_refuses_bad_values(kwargs):
    with pytest.raises(ConfigError):
        EngineConfig(**kwargs)


def test_a_kv_cache_larger_than_memory_is_refused_before_allocation():
    loaded = load_model("dummy:tiny-llama", show_progress=False)
    with pytest.raises(ConfigError, match="lower kv_cache_tokens"):
        LLM.from_loaded(loaded, engine_config=EngineConfig(kv_cache_tokens=10**13))


def test_a_failed_use_changes_nothing(llm):
    """Issue 18: after use('ngram', 'chain:k=-1') failed, drafter_spec said ngram but the old drafter ran."""
    llm.use("none")
    before = (llm.drafter_spec, llm.drafter, llm.tree_spec, llm.engine)
    for drafter, tree in [("ngram", "chain:k=-1"), ("ngram", "spiral"), ("ngram:k=1000", None), ("nope", None),
                          ("ngram", "dynamic:depth=3,topk=2,budget=1000")]:
        with pytest.raises(SpecdecError):
            llm.use(drafter, tree)
        assert (llm.drafter_spec, llm.drafter, llm.tree_spec, llm.engine) == before
    assert llm.generate([[5, 6, 7]], SamplingParams(max_new_tokens=3))[0].finish_reason == "length"


def test_check_reports_what_generate_would_refuse(llm):
    assert llm.check([5, 6, 7]) == [5, 6, 7]
    with pytest.raises(SpecdecError, match="context"):
        llm.check([7] * 1100)
    with pytest.raises(SpecdecError, match="empty"):
        llm.check("", chat=False)


def test_a_bad_prompt_among_good_ones_runs_nothing(llm):
    """All requests are checked before any is added, so no request runs or holds KV blocks."""
    free = llm.engine.runner.cache.num_free_blocks
    with pytest.raises(SpecdecError, match="context"):
        llm.generate([[5, 6], [7] * 1100], SamplingParams(max_new_tokens=2))
    assert llm.engine.runner.cache.num_free_blocks == free and not llm.engine.has_unfinished()


def test_static_tree_files_are_strict(tmp_path):
    from specdec.tree.spec import parse_tree_spec

    def tree_file(data) -> str:
        path = tmp_path / "t.json"
        path.write_text(json.dumps(data))
        return f"static:{path}"

    with pytest.raises(ConfigError, match="ranks are integers"):
        parse_tree_spec(tree_file({"choices": [[0], [0.7]]}))  # was silently rank 0
    with pytest.raises(ConfigError, match="ranks are integers"):
        parse_tree_spec(tree_file([[0], [True]]))
    with pytest.raises(ConfigError, match="'parents'"):
        parse_tree_spec(tree_file({"choices": [[0]], "parents": [-1, 0]}))  # was silently ignored
    with pytest.raises(ConfigError, match="nodes=5"):
        parse_tree_spec(tree_file({"choices": [[0], [0, 0]], "nodes": 5}))
    with pytest.raises(ConfigError, match="no \"choices\""):
        parse_tree_spec(tree_file({"note": "x"}))
    spec = parse_tree_spec(tree_file({"choices": [[0], [0, 0]], "nodes": 2, "depth": 2, "note": "metadata is fine"}))
    assert spec.budget == 2


def test_chain_k_zero_is_refused_as_a_spec_but_plain_decode_still_uses_chain_0():
    from specdec.tree.spec import chain, parse_tree_spec

    with pytest.raises(ConfigError, match="drafts nothing"):
        parse_tree_spec("chain:k=0")
    assert chain(0).max_nodes == 1


def test_huge_tree_sizes_parse_without_looping_over_them():
    from specdec.tree.spec import parse_tree_spec

    big = str(10**30)
    spec = parse_tree_spec(f"dynamic:depth={big},topk=1,budget={big}")
    assert spec.nodes_within(10**40) == 10**30 and spec.limited(5).budget == 5
    assert parse_tree_spec(f"dynamic:depth=40,topk={big},budget=60").nodes_within(40) == 60
    with pytest.raises(ConfigError, match="cannot reach depth"):
        parse_tree_spec("dynamic:depth=70,topk=8,budget=60")
