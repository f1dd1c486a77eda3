"""The OpenAI endpoints through the real `openai` client: shapes, streaming, stop strings, seeds, speculation."""

from __future__ import annotations

import asyncio

import httpx2 as httpx
import openai

from tests.server.harness import serve, tiny_llm

CHAT = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "name three colours"}]


def stream_text(chunks, chat: bool) -> tuple[str, list]:
    text, finals = "", []
    for chunk in chunks:
        for choice in chunk.choices:
            text += (choice.delta.content or "") if chat else choice.text
            if choice.finish_reason:
                finals.append(chunk)
    return text, finals


def test_completion_has_text_usage_and_the_specdec_extension(client):
    out = client.completions.create(model="tiny", prompt="hello there world", max_tokens=9, temperature=0)
    assert out.object == "text_completion" and out.model == "tiny"
    assert len(out.choices) == 1 and out.choices[0].finish_reason == "length"
    assert len(out.choices[0].text.split()) == 9  # one word per token
    assert (out.usage.prompt_tokens, out.usage.completion_tokens, out.usage.total_tokens) == (3, 9, 12)
    ext = out.model_extra["specdec"]
    assert ext["drafter"] == "none" and ext["tau"] == 1.0 and ext["target_steps"] == 8


def test_token_id_prompts_are_accepted(client):
    by_text = client.completions.create(model="tiny", prompt="t3 t4 t5", max_tokens=5, temperature=0)
    by_ids = client.completions.create(model="tiny", prompt=[3, 4, 5], max_tokens=5, temperature=0)
    assert by_ids.choices[0].text == by_text.choices[0].text


def test_streamed_completion_equals_the_whole_one(client):
    whole = client.completions.create(model="tiny", prompt="t1 t2 t3 t4", max_tokens=20, temperature=0)
    text, finals = stream_text(client.completions.create(model="tiny", prompt="t1 t2 t3 t4", max_tokens=20,
                                                         temperature=0, stream=True), chat=False)
    assert text == whole.choices[0].text
    assert len(finals) == 1 and finals[0].usage.completion_tokens == 20


def test_chat_uses_the_template_and_streams_the_same_text(client):
    whole = client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=12, temperature=0)
    assert whole.object == "chat.completion" and whole.choices[0].message.role == "assistant"
    # the template renders "system be brief user name three colours assistant": 8 words
    assert whole.usage.prompt_tokens == 8
    chunks = list(client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=12, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text, _ = stream_text(chunks, chat=True)
    assert text == whole.choices[0].message.content
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12  # include_usage: a last chunk


def test_stop_strings_cut_the_text_the_same_way_streamed_or_not(client):
    free = client.completions.create(model="tiny", prompt="t9 t8 t7", max_tokens=16, temperature=0).choices[0].text
    words = free.split()
    stop = " " + " ".join(words[4:6])  # two words from the middle
    whole = client.completions.create(model="tiny", prompt="t9 t8 t7", max_tokens=16, temperature=0, stop=[stop])
    assert whole.choices[0].finish_reason == "stop"
    assert whole.choices[0].text == free[: free.index(stop)]
    text, _ = stream_text(client.completions.create(model="tiny", prompt="t9 t8 t7", max_tokens=16, temperature=0,
                                                    stop=stop, stream=True), chat=False)
    assert text == whole.choices[0].text  # no piece of the stop string leaked out before it was recognised


def test_a_seeded_request_gives_the_same_text_alone_and_under_load(client, aclient):
    kwargs = dict(model="tiny", prompt="t20 t21", max_tokens=24, temperature=1.0, top_p=0.95, seed=1234)
    alone = client.completions.create(**kwargs).choices[0].text
    other = client.completions.create(**{**kwargs, "seed": 99}).choices[0].text
    assert other != alone  # the seed matters (else this test could not fail)

    async def loaded():
        noise = [aclient.completions.create(model="tiny", prompt=f"t{i} t{i + 1} t{i + 2}", max_tokens=30,
                                            temperature=1.0) for i in range(12)]
        results = await asyncio.gather(aclient.completions.create(**kwargs), *noise)
        return results[0].choices[0].text

    assert asyncio.run(loaded()) == alone


def test_models_health_and_metrics(client, tiny_server):
    url, _ = tiny_server
    assert [m.id for m in client.models.list().data] == ["tiny"]
    root = url.removesuffix("/v1")
    health = httpx.get(f"{root}/health").json()
    assert health["status"] == "ok" and health["kv_blocks_total"] > 0
    client.completions.create(model="tiny", prompt="t1", max_tokens=4, temperature=0)
    text = httpx.get(f"{root}/metrics").text
    for name in ("specdec_requests_total", "specdec_request_finish_total", "specdec_prompt_tokens_total",
                 "specdec_generation_tokens_total", "specdec_time_to_first_token_seconds_bucket",
                 "specdec_inter_token_latency_seconds_bucket", "specdec_num_requests_running",
                 "specdec_num_requests_waiting", "specdec_kv_blocks_used", "specdec_spec_planned_depth_bucket",
                 "specdec_spec_mean_accepted_tokens"):
        assert name in text, name
    assert 'specdec_requests_total{endpoint="/v1/completions",status="200"}' in text


def test_speculative_server_gives_plain_greedy_output_and_counts_acceptance():
    prompts = ["t1 t2 t3 t1 t2 t3 t1 t2", "t5 t6 t5 t6 t5 t6", "t10 t11 t12"]
    texts = {}
    for drafter in ("none", "ngram"):
        llm = tiny_llm(drafter, "chain:k=4" if drafter == "ngram" else None, adaptive_speculation=False)
        with serve(llm) as (url, _):
            c = openai.OpenAI(base_url=url, api_key="unused", max_retries=0)
            outs = [c.completions.create(model="tiny", prompt=p, max_tokens=40, temperature=0) for p in prompts]
            texts[drafter] = [o.choices[0].text for o in outs]
            metrics = httpx.get(url.removesuffix("/v1") + "/metrics").text
        if drafter == "ngram":
            taus = [o.model_extra["specdec"]["tau"] for o in outs]
            assert max(taus) > 1.0  # something was accepted, so the equality below is about speculation
            assert 'specdec_spec_drafted_tokens_total{position="1"}' in metrics
    assert texts["ngram"] == texts["none"]


def test_n_samples_are_choices_with_their_own_seed_streams(client):
    kwargs = dict(model="tiny", prompt="t20 t21", max_tokens=12, temperature=1.0, seed=77)
    two = client.completions.create(n=2, **kwargs)
    one = client.completions.create(**kwargs)
    assert [c.index for c in two.choices] == [0, 1]
    assert two.choices[0].text == one.choices[0].text  # sample 0 is the request itself
    assert two.choices[1].text != two.choices[0].text
    assert two.usage.completion_tokens == 24 and two.usage.prompt_tokens == 2
    texts = {0: "", 1: ""}
    for chunk in client.completions.create(n=2, stream=True, **kwargs):
        for choice in chunk.choices:
            texts[choice.index] += choice.text
    assert [texts[0], texts[1]] == [c.text for c in two.choices]


def test_logprobs_name_each_token_streamed_or_not(client):
    kwargs = dict(model="tiny", prompt="t3 t4 t5", max_tokens=10, temperature=0, frequency_penalty=0.4)
    whole = client.completions.create(logprobs=2, **kwargs)
    lp = whole.choices[0].logprobs
    assert "".join(lp.tokens) == whole.choices[0].text
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    for token, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert value <= 0 and len(top) == 2
        assert max(top, key=top.get) == token  # greedy: the chosen token is the most likely one
    streamed_tokens, streamed_values = [], []
    for chunk in client.completions.create(logprobs=2, stream=True, **kwargs):
        for choice in chunk.choices:
            if choice.logprobs is not None:
                streamed_tokens += choice.logprobs.tokens
                streamed_values += choice.logprobs.token_logprobs
    assert streamed_tokens == lp.tokens and streamed_values == lp.token_logprobs
    chat = client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=6, temperature=0, logprobs=True,
                                          top_logprobs=3)
    content = chat.choices[0].logprobs.content
    assert "".join(c.token for c in content) == chat.choices[0].message.content
    assert all(len(c.top_logprobs) == 3 and c.top_logprobs[0].token == c.token for c in content)


def test_logit_bias_and_penalties_change_the_output(client):
    kwargs = dict(model="tiny", prompt="t1 t2 t3", max_tokens=30, temperature=0)
    plain = client.completions.create(**kwargs).choices[0].text.split()
    biased = client.completions.create(logit_bias={"7": 100}, **kwargs).choices[0].text
    assert biased == " t7" * 30
    assert len(set(plain)) < 10  # the tiny model loops on its own
    penalised = client.completions.create(extra_body={"repetition_penalty": 2.0}, **kwargs).choices[0].text.split()
    assert len(set(penalised)) == 30  # a strong repetition penalty breaks the loop here


def test_speculative_server_with_penalties_and_logprobs_gives_plain_output():
    prompts = ["t1 t2 t3 t1 t2 t3 t1 t2", "t5 t6 t5 t6 t5 t6"]
    kwargs = dict(model="tiny", max_tokens=30, temperature=0, frequency_penalty=0.3, logprobs=1,
                  extra_body={"repetition_penalty": 1.3})
    results = {}
    for drafter in ("none", "ngram"):
        llm = tiny_llm(drafter, "chain:k=4" if drafter == "ngram" else None, adaptive_speculation=False)
        with serve(llm) as (url, _):
            c = openai.OpenAI(base_url=url, api_key="unused", max_retries=0)
            outs = [c.completions.create(prompt=p, **kwargs) for p in prompts]
        results[drafter] = [(o.choices[0].text, o.choices[0].logprobs.token_logprobs) for o in outs]
        if drafter == "ngram":
            assert max(o.model_extra["specdec"]["tau"] for o in outs) > 1.0
    for (text, values), (plain_text, plain_values) in zip(results["ngram"], results["none"]):
        assert text == plain_text
        assert all(abs(a - b) < 1e-4 for a, b in zip(values, plain_values))
