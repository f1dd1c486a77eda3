"""The default model behind the server: its chat template, real text, streaming equal to the whole reply."""

from __future__ import annotations

import openai
import pytest

from specdec.api import LLM
from tests.server.harness import serve, wait_idle

pytestmark = pytest.mark.slow


def test_default_model_chats_through_the_openai_client(default_model):
    llm = LLM.from_loaded(default_model, drafter="ngram")
    with serve(llm, model_name="smollm2-135m") as (url, server):
        client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=300)
        messages = [{"role": "user", "content": "What is the capital of France?"}]
        whole = client.chat.completions.create(model="smollm2-135m", messages=messages, max_tokens=16, temperature=0)
        assert "Paris" in whole.choices[0].message.content
        assert whole.usage.prompt_tokens > 10  # the chat template's system and role tokens came with it
        streamed = "".join(chunk.choices[0].delta.content or "" for chunk in client.chat.completions.create(
            model="smollm2-135m", messages=messages, max_tokens=16, temperature=0, stream=True) if chunk.choices)
        assert streamed == whole.choices[0].message.content
        wait_idle(server)
        pool = llm.engine.runner.cache.pool
        assert pool.num_free == pool.num_blocks
