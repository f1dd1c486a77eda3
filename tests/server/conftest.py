"""One tiny-model server for the API tests of this folder (each test leaves the engine idle)."""

from __future__ import annotations

import openai
import pytest

from tests.server.harness import serve, tiny_llm, wait_idle


@pytest.fixture(scope="module")
def tiny_server():
    with serve(tiny_llm(max_num_seqs=128)) as (url, server):
        yield url, server


@pytest.fixture
def client(tiny_server):
    url, server = tiny_server
    yield openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=60)
    wait_idle(server)


@pytest.fixture
def aclient(tiny_server):
    url, _ = tiny_server
    return openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0, timeout=120)
