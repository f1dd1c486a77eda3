"""A real server on 127.0.0.1 for the tests: uvicorn in a thread, around a tiny random model or the default one.

The tiny model's tokenizer spells token i as " t<i>", so text equality is token equality, and it has a chat
template, so the chat endpoint runs on it too.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import zlib
from typing import Iterator

import uvicorn

from specdec.api import LLM
from specdec.config import EngineConfig
from specdec.models.loader import LoadedModel
from specdec.server import OpenAIServer
from tests.helpers import tiny_model

VOCAB = 64
CONTEXT = 256  # tests.helpers.tiny_config's max_position_embeddings


class WordTokenizer:
    """Token i <-> the word 't<i>'; other words hash to a token. Decoding is prefix-stable, one word per id."""

    eos_token_id = None
    chat_template = "role: content pairs"  # apply_chat_template below renders it

    def __init__(self, vocab: int) -> None:
        self.vocab = vocab

    def _word(self, word: str) -> int:
        if word[:1] == "t" and word[1:].isdigit() and int(word[1:]) < self.vocab:
            return int(word[1:])
        return zlib.crc32(word.encode()) % self.vocab

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [self._word(w) for w in text.split()]

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return "".join(f" t{i}" for i in ids)

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True) -> str:
        text = " ".join(f"{m['role']} {m['content']}" for m in messages)
        return text + (" assistant" if add_generation_prompt else "")


def tiny_llm(drafter: str = "none", tree: str | None = None, seed: int = 5, **config) -> LLM:
    loaded = LoadedModel(tiny_model(seed, vocab=VOCAB), WordTokenizer(VOCAB), "tiny")
    return LLM.from_loaded(loaded, drafter, tree, engine_config=EngineConfig(**config))


@contextlib.contextmanager
def serve(llm: LLM, model_name: str = "tiny", max_waiting: int = 256) -> Iterator[tuple[str, OpenAIServer]]:
    """Run a server for `llm` on a free port of 127.0.0.1; yields (base_url, server)."""
    server = OpenAIServer(llm, model_name, max_waiting)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(server.app, log_level="warning", lifespan="on", timeout_graceful_shutdown=5)
    runner = uvicorn.Server(config)
    thread = threading.Thread(target=runner.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not runner.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the test server did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}/v1", server
    finally:
        runner.should_exit = True
        thread.join(30)
        sock.close()


def wait_idle(server: OpenAIServer, timeout: float = 30.0) -> None:
    """Until the engine has no request left (aborts travel through the engine thread's inbox)."""
    deadline = time.monotonic() + timeout
    while server.engine.num_waiting or server.engine.stats.running or server.engine._live:
        if time.monotonic() > deadline:
            raise AssertionError("the engine did not go idle")
        time.sleep(0.01)
