"""Every refusal is OpenAI-shaped JSON with the right status, before any generation; never a 500 traceback."""

from __future__ import annotations

import asyncio

import httpx2 as httpx
import openai
import pytest

from tests.server.harness import CONTEXT, serve, tiny_llm


def post(url: str, path: str, body, raw: bool = False) -> httpx.Response:
    kwargs = {"content": body, "headers": {"content-type": "application/json"}} if raw else {"json": body}
    return httpx.post(f"{url}{path}", timeout=60, **kwargs)


def assert_error(resp: httpx.Response, status: int, *words: str, param: str | None = None) -> dict:
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert "Traceback" not in resp.text
    for word in words:
        assert word.lower() in error["message"].lower(), error
    if param is not None:
        assert error["param"] == param, error
    return error


@pytest.mark.parametrize("path", ["/completions", "/chat/completions"])
@pytest.mark.parametrize("body", ['{"model": "tiny", "prompt": ', "not json at all", "\xff\xfe"])
def test_malformed_json_is_a_400(tiny_server, path, body):
    url, _ = tiny_server
    assert_error(post(url, path, body.encode("latin-1"), raw=True), 400, "not valid JSON")


def test_a_body_that_is_not_an_object_is_a_400(tiny_server):
    url, _ = tiny_server
    assert_error(post(url, "/completions", [1, 2]), 400, "JSON object")


@pytest.mark.parametrize("field,value", [
    ("max_tokens", "5"), ("max_tokens", 2.5), ("max_tokens", True), ("max_tokens", 0), ("temperature", "hot"),
    ("temperature", -0.5), ("top_p", 0), ("top_p", 1.5), ("seed", "abc"), ("seed", -3), ("stop", 7),
    ("stream", "yes"), ("prompt", {"text": "hi"}), ("top_k", -5),
])
def test_wrong_types_and_values_name_the_field(tiny_server, field, value):
    url, _ = tiny_server
    body = {"model": "tiny", "prompt": "t1 t2", field: value}
    error = assert_error(post(url, "/completions", body), 400, field)
    assert error["param"].split(".")[0] == field


def test_missing_required_fields_are_named(tiny_server):
    url, _ = tiny_server
    assert_error(post(url, "/completions", {"model": "tiny"}), 400, "prompt", param="prompt")
    assert_error(post(url, "/chat/completions", {"model": "tiny", "messages": []}), 400, "messages")
    assert_error(post(url, "/chat/completions", {"model": "tiny", "messages": [{"role": "robot", "content": "x"}]}),
                 400, "messages.0.role")


@pytest.mark.parametrize("field,value", [("echo", True), ("best_of", 3), ("suffix", "x")])
def test_openai_fields_specdec_lacks_are_refused_by_name(client, field, value):
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model="tiny", prompt="t1", max_tokens=3, **{field: value})
    assert refused.value.body["param"] == field and "not supported" in refused.value.body["message"]


def test_fields_refused_before_the_sampling_controls_are_accepted_now(client):
    """frequency_penalty, presence_penalty, n, logprobs and logit_bias were 400s; now they work, and so do the
    extensions min_p, repetition_penalty, min_tokens and stop_token_ids."""
    out = client.completions.create(model="tiny", prompt="t1 t2", max_tokens=4, frequency_penalty=0.5,
                                    presence_penalty=1.0, n=2, logprobs=3, logit_bias={"5": 10}, temperature=0.7,
                                    extra_body={"min_p": 0.1, "repetition_penalty": 1.2, "min_tokens": 2,
                                                "stop_token_ids": [9]})
    assert [c.index for c in out.choices] == [0, 1]
    assert all(len(c.logprobs.tokens) == len(c.text.split()) for c in out.choices)
    chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=3,
                                          logprobs=True, top_logprobs=2, n=2, presence_penalty=0.3)
    assert len(chat.choices) == 2 and all(len(c.logprobs.content) == 3 for c in chat.choices)


@pytest.mark.parametrize("field,value,param", [
    ("frequency_penalty", 3, "frequency_penalty"), ("presence_penalty", "1", "presence_penalty"),
    ("n", 0, "n"), ("logprobs", 50, "logprobs"), ("logit_bias", {"abc": 1}, "logit_bias"),
    ("logit_bias", {"5": 500}, "logit_bias"), ("logit_bias", {"999": 1}, "logit_bias"), ("min_p", 2, "min_p"),
    ("repetition_penalty", 0, "repetition_penalty"), ("min_tokens", -1, "min_tokens"),
    ("stop_token_ids", [500], "stop_token_ids"),
])
def test_bad_sampling_controls_are_400s_naming_the_field(tiny_server, field, value, param):
    url, _ = tiny_server
    error = assert_error(post(url, "/completions", {"model": "tiny", "prompt": "t1 t2", field: value}), 400, field)
    assert error["param"].split(".")[0] == param


def test_top_logprobs_without_logprobs_is_a_400(tiny_server):
    url, _ = tiny_server
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}
    assert_error(post(url, "/chat/completions", body), 400, "top_logprobs", param="top_logprobs")


def test_openai_defaults_of_unimplemented_fields_are_accepted(client):
    out = client.completions.create(model="tiny", prompt="t1", max_tokens=3, n=1, frequency_penalty=0,
                                    presence_penalty=0.0, logit_bias={}, echo=False)
    assert out.usage.completion_tokens == 3


def test_unknown_fields_are_refused_by_name(tiny_server):
    url, _ = tiny_server
    assert_error(post(url, "/completions", {"model": "tiny", "prompt": "t1", "mirostat": 2}), 400, "mirostat",
                 param="mirostat")
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]}
    assert_error(post(url, "/chat/completions", chat), 400, "tools", param="tools")


def test_unknown_model_is_a_404(client):
    with pytest.raises(openai.NotFoundError) as refused:
        client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    assert refused.value.body["code"] == "model_not_found" and "tiny" in refused.value.body["message"]


def test_unknown_route_is_an_openai_shaped_404(tiny_server):
    url, _ = tiny_server
    assert_error(httpx.get(f"{url}/engines"), 404, "not found")


def test_prompts_over_the_context_are_a_400_even_when_streaming(client):
    words = " ".join(f"t{i % 60}" for i in range(CONTEXT + 10))
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as refused:
            client.completions.create(model="tiny", prompt=words, max_tokens=4, stream=stream)
        assert refused.value.body["code"] == "context_length_exceeded"
        assert "context" in refused.value.body["message"]
    with pytest.raises(openai.BadRequestError) as refused:  # far too long to be worth tokenizing
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x" * 10**6}])
    assert refused.value.body["code"] == "context_length_exceeded" and refused.value.body["param"] == "messages"


def test_bad_token_ids_and_empty_prompts_are_400s(client):
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model="tiny", prompt=[1, 2, 10_000], max_tokens=3)
    assert "vocabulary" in refused.value.body["message"]
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model="tiny", prompt="", max_tokens=3)
    assert "empty" in refused.value.body["message"]
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model="tiny", prompt=["t1", "t2"], max_tokens=3)
    assert refused.value.body["param"] == "prompt"


def test_a_full_waiting_queue_is_a_503_with_retry_after():
    with serve(tiny_llm(max_num_seqs=4), max_waiting=2) as (url, server):
        server.engine.pause()  # nothing is admitted, so accepted requests stay waiting
        body = {"model": "tiny", "prompt": "t1 t2", "max_tokens": 4, "temperature": 0}

        async def main():
            async with httpx.AsyncClient(base_url=url, timeout=60) as http:
                waiting = [asyncio.ensure_future(http.post("/completions", json=body)) for _ in range(2)]
                while server.engine.num_waiting < 2:
                    await asyncio.sleep(0.01)
                refused = await http.post("/completions", json=body)
                server.engine.resume()
                return refused, [await w for w in waiting]

        refused, served = asyncio.run(main())
    error = assert_error(refused, 503, "waiting")
    assert error["code"] == "overloaded" and int(refused.headers["retry-after"]) >= 1
    assert [r.status_code for r in served] == [200, 200]
