"""The engine-loop thread: requests from coroutines join the running batch, aborts free blocks, overload is
refused, and streamed text is cut only where it is final."""

from __future__ import annotations

import asyncio
import time

import pytest

from specdec.api import LLM
from specdec.config import SamplingParams
from specdec.engine.async_engine import AsyncEngine, EngineDeadError, OverloadedError
from specdec.errors import PromptTooLongError
from specdec.models.loader import LoadedModel
from specdec.models.tokenizer import ByteTokenizer
from tests.helpers import tiny_model
from tests.server.harness import tiny_llm

GREEDY = SamplingParams(max_new_tokens=12, temperature=0.0)


def make(max_waiting: int = 64, **config) -> tuple[AsyncEngine, object]:
    llm = tiny_llm(**config)
    engine = AsyncEngine(llm.engine, llm.encode, max_waiting)
    engine.start()
    return engine, llm


def blocks_in_use(engine: AsyncEngine) -> int:
    pool = engine.engine.runner.cache.pool
    return pool.num_blocks - pool.num_free


def byte_engine() -> AsyncEngine:
    """A tiny random model over a byte tokenizer: its output is full of half and invalid UTF-8 characters."""
    loaded = LoadedModel(tiny_model(11, vocab=300), ByteTokenizer(300), "tiny-bytes")
    llm = LLM.from_loaded(loaded)
    engine = AsyncEngine(llm.engine, llm.encode)
    engine.start()
    return engine


async def pieces(engine: AsyncEngine, params: SamplingParams) -> tuple[list[str], str]:
    deltas = [d async for d in await engine.submit([40, 41, 42], params, chat=False)]
    return [d.text for d in deltas], deltas[-1].output.text


def test_streamed_pieces_add_up_to_the_final_text_through_multibyte_characters():
    engine = byte_engine()
    try:
        sent, final = asyncio.run(pieces(engine, SamplingParams(max_new_tokens=80, temperature=0.0)))
    finally:
        engine.shutdown()
    assert any(ord(c) > 127 for c in final)  # the output really has multi-byte characters (or U+FFFD)
    assert "".join(sent) == final


def test_no_piece_of_a_stop_string_is_streamed_before_the_cut():
    engine = byte_engine()
    try:
        _, free = asyncio.run(pieces(engine, SamplingParams(max_new_tokens=80, temperature=0.0)))
        stop = free[len(free) // 2: len(free) // 2 + 3]
        sent, final = asyncio.run(pieces(engine, SamplingParams(max_new_tokens=80, temperature=0.0, stop=(stop,))))
    finally:
        engine.shutdown()
    assert final == free[: free.index(stop)]
    assert "".join(sent) == final


def test_concurrent_submits_match_the_engine_run_alone():
    engine, llm = make()
    prompts = [[3 + i, 7, 9 + i] for i in range(6)]
    alone = [llm.generate([p], GREEDY, chat=False)[0].token_ids for p in prompts]  # before the thread runs any

    async def main():
        streams = [await engine.submit(p, GREEDY, chat=False) for p in prompts]
        return await asyncio.gather(*(s.result() for s in streams))

    try:
        outs = asyncio.run(main())
    finally:
        engine.shutdown()
    assert [o.token_ids for o in outs] == alone
    assert blocks_in_use(engine) == 0


def test_a_request_joins_a_batch_already_running():
    engine, _ = make()

    async def main():
        long = await engine.submit([5, 6, 7], SamplingParams(max_new_tokens=120, temperature=0.0), chat=False)
        it = long.__aiter__()
        await it.__anext__()  # the long request is decoding
        short = [d async for d in await engine.submit([8, 9], GREEDY, chat=False)]
        return short, [d async for d in it]

    try:
        short, rest = asyncio.run(main())
    finally:
        engine.shutdown()
    assert short[-1].output.finish_reason == "length" and rest[-1].output.finish_reason == "length"
    assert short[-1].time < rest[-1].time  # the short one finished while the long one still decoded beside it
    assert rest[-1].output.metrics.target_steps == 119  # one decode step per token: the long one never paused


def test_leaving_a_stream_aborts_it_and_frees_its_blocks():
    engine, _ = make()

    async def main():
        stream = await engine.submit([5, 6, 7], SamplingParams(max_new_tokens=200, temperature=0.0), chat=False)
        async for _ in stream:
            break
        for _ in range(500):
            if not engine._live and blocks_in_use(engine) == 0:
                return True
            await asyncio.sleep(0.01)
        return False

    try:
        freed = asyncio.run(main())
    finally:
        engine.shutdown()
    assert freed
    assert not engine.engine.has_unfinished()


def test_a_full_waiting_queue_refuses_with_retry_after():
    engine, _ = make(max_waiting=2)
    engine.pause()

    async def main():
        first = asyncio.ensure_future(engine.submit([5], GREEDY, chat=False))
        second = asyncio.ensure_future(engine.submit([6], GREEDY, chat=False))
        await asyncio.sleep(0.2)  # both are taken and wait for a step, which the pause holds back
        with pytest.raises(OverloadedError) as refused:
            await engine.submit([7], GREEDY, chat=False)
        engine.resume()
        outs = [await (await s).result() for s in (first, second)]
        return refused.value, outs

    try:
        refused, outs = asyncio.run(main())
    finally:
        engine.shutdown()
    assert refused.retry_after_s >= 1
    assert all(len(o.token_ids) == GREEDY.max_new_tokens for o in outs)


def test_a_prompt_over_the_context_is_refused_at_submit():
    engine, _ = make()
    try:
        with pytest.raises(PromptTooLongError):
            asyncio.run(engine.submit(list(range(1, 60)) * 5, GREEDY, chat=False))
    finally:
        engine.shutdown()


def test_an_engine_bug_fails_its_requests_and_the_loop_serves_on():
    engine, _ = make()
    real_step = engine.engine.step
    calls = {"n": 0}

    def failing_once():
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("planted bug")
        return real_step()

    engine.engine.step = failing_once

    async def main():
        doomed = await engine.submit([5, 6], GREEDY, chat=False)
        with pytest.raises(EngineDeadError):
            await doomed.result()
        return await (await engine.submit([5, 6], GREEDY, chat=False)).result()

    try:
        after = asyncio.run(main())
    finally:
        engine.shutdown()
    assert len(after.token_ids) == GREEDY.max_new_tokens
    assert blocks_in_use(engine) == 0


def test_a_caller_whose_event_loop_closed_has_its_request_aborted():
    engine, _ = make()

    async def submit_and_leave():
        return await engine.submit([5, 6, 7], SamplingParams(max_new_tokens=200, temperature=0.0), chat=False)

    try:
        kept = asyncio.run(submit_and_leave())  # never iterated; its loop is closed now
        deadline = 500
        while (engine._live or blocks_in_use(engine)) and deadline:
            time.sleep(0.01)
            deadline -= 1
        assert not engine._live and blocks_in_use(engine) == 0
        assert engine._thread.is_alive()  # the engine thread survived the closed loop
        assert kept is not None
    finally:
        engine.shutdown()
