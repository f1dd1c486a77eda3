"""100 concurrent streaming clients, a third of them leaving mid-stream: nothing lost, nothing truncated,
nothing leaked."""

from __future__ import annotations

import asyncio
import re

import httpx2 as httpx
import openai

from tests.server.harness import wait_idle

CLIENTS = 100


def prompt(i: int) -> str:
    return " ".join(f"t{(i * 7 + j * 3) % 64}" for j in range(3 + i % 5))


def max_tokens(i: int) -> int:
    return 160 if i % 3 == 0 else 8 + i % 17  # the leavers ask for many tokens, so they leave mid-stream


async def one_client(client: openai.AsyncOpenAI, i: int) -> tuple[str, str | None, int]:
    stream = await client.completions.create(model="tiny", prompt=prompt(i), max_tokens=max_tokens(i),
                                             temperature=0, stream=True)
    text, finish, chunks = "", None, 0
    async for chunk in stream:
        chunks += 1
        for choice in chunk.choices:
            text += choice.text
            finish = choice.finish_reason or finish
        if i % 3 == 0 and chunks == 3:
            await stream.close()  # the client disconnects mid-stream
            return text, None, chunks
    return text, finish, chunks


def test_hundred_streams_with_a_third_disconnecting(tiny_server):
    url, server = tiny_server
    pool = server.engine.engine.runner.cache.pool
    aborted_before = finished_count(url, "abort")

    async def load():
        client = openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0, timeout=300)
        return await asyncio.gather(*(one_client(client, i) for i in range(CLIENTS)))

    results = asyncio.run(load())
    wait_idle(server)
    assert pool.num_free == pool.num_blocks  # every KV block is free again

    leavers = [i for i in range(CLIENTS) if i % 3 == 0]
    aborted = finished_count(url, "abort") - aborted_before
    assert aborted >= len(leavers) // 2, aborted  # the server really stopped generating for those who left

    alone = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=60)
    for i, (text, finish, _) in enumerate(results):
        if i % 3 == 0:
            continue
        reference = alone.completions.create(model="tiny", prompt=prompt(i), max_tokens=max_tokens(i),
                                             temperature=0).choices[0]
        assert finish == reference.finish_reason == "length", i
        assert len(text.split()) == max_tokens(i), i  # complete: not one token lost
        assert text == reference.text, i  # and the same as the request alone
    wait_idle(server)
    assert pool.num_free == pool.num_blocks
    assert not server.engine.engine.sequences  # and the engine holds no finished request (a server runs for weeks)


def finished_count(url: str, reason: str) -> float:
    text = httpx.get(url.removesuffix("/v1") + "/metrics").text
    match = re.search(rf'specdec_request_finish_total{{reason="{reason}"}} ([0-9.e+]+)', text)
    return float(match.group(1)) if match else 0.0
