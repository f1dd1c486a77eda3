"""One engine-loop thread serving many callers: the engine under the HTTP server.

The engine is not thread-safe and a step cannot be interrupted, so one thread owns it and everything else
talks to that thread through an inbox:

    coroutine ── submit ──► inbox ──► engine thread: encode, add_request ─► step ─► deltas ──► per-request queue
    coroutine ── abort ───► inbox ──► engine thread: engine.abort (blocks freed before the next step)

Requests that arrive while a step runs join the batch at the next step. Encoding (chat template, tokenizer)
also runs on the engine thread, because the engine thread decodes with the same tokenizer and a fast tokenizer
is not safe to share between threads. Results travel back with `loop.call_soon_threadsafe`, so a caller only
ever touches asyncio objects of its own loop.

A bounded waiting queue keeps overload cheap: `submit` refuses with `OverloadedError` (the server's 503) when
`max_waiting` requests already wait for a batch slot, instead of queueing work that would time out anyway.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable

from specdec.config import SamplingParams
from specdec.engine.engine import Engine
from specdec.engine.outputs import RequestOutput, output_of
from specdec.engine.sequence import Sequence
from specdec.errors import SpecdecError

log = logging.getLogger("specdec.async_engine")


class OverloadedError(SpecdecError):
    """The waiting queue is full; the caller should retry later (HTTP 503 with Retry-After)."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class EngineDeadError(SpecdecError):
    """The engine loop hit a bug while running this request (the server's 500, without a traceback)."""


@dataclass(frozen=True)
class RequestDelta:
    """New output of one request since its previous delta."""

    text: str  # text that is now final (never part of a stop string, never half a character)
    num_tokens: int  # tokens generated since the previous delta (they may carry no text yet)
    time: float  # perf_counter when the engine step that produced this delta ended
    output: RequestOutput | None = None  # set on the last delta: the whole result, with metrics
    logprobs: tuple = ()  # with params.logprobs: (the new tokens' TokenLogprobs, {token id: its text})


@dataclass(frozen=True)
class EngineStats:
    """A snapshot the engine thread publishes after each step (read by /metrics and /health)."""

    running: int = 0
    waiting: int = 0
    kv_blocks_used: int = 0
    kv_blocks_total: int = 0
    steps: int = 0


class TextDeltas:
    """Turns a request's growing visible text into the pieces a stream sends: the one place text is cut.

    `Engine.output_text` decodes only new tokens (engine/stopping.py) and already holds back what is not final:
    half a multi-byte character, and the last `longest stop - 1` characters while they could still start a
    stop string. So the visible text only grows, and each piece is what it gained since the last one.
    """

    def __init__(self) -> None:
        self.sent = ""

    def __call__(self, text: str) -> str:
        if len(text) <= len(self.sent) or not text.startswith(self.sent):
            if not text.startswith(self.sent):  # the engine took back visible text: never send a contradiction
                log.warning("visible text shrank; a streamed piece was withheld")
            return ""
        piece, self.sent = text[len(self.sent):], text
        return piece


@dataclass(eq=False)
class _Request:
    prompt: Any
    params: SamplingParams
    chat: bool
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)  # RequestDelta, or an exception to raise
    accepted: asyncio.Future | None = None  # set when the engine took the request (or refused it)
    seq: Sequence | None = None
    deltas: TextDeltas | None = None
    sent_tokens: int = 0
    aborted: bool = False
    submitted: float = field(default_factory=time.perf_counter)
    leader: Sequence | None = None  # a sibling sample whose prompt blocks this one reuses

    def reply(self, item: Any) -> bool:
        """Hand an item to the caller's loop; False when that loop is gone (the caller can never read it)."""
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:  # the event loop was closed
            return False
        return True

    def settle(self, error: BaseException | None) -> None:
        def done() -> None:
            if self.accepted is None or self.accepted.done():
                return
            if error is None:
                self.accepted.set_result(None)
            else:
                self.accepted.set_exception(error)

        try:
            self.loop.call_soon_threadsafe(done)
        except RuntimeError:  # the event loop was closed
            pass


class RequestStream:
    """A caller's handle on one request: iterate it for deltas; `abort()` (or leaving early) frees its blocks."""

    def __init__(self, engine: "AsyncEngine", request: _Request) -> None:
        self._engine = engine
        self._request = request
        self.prompt_tokens = len(request.seq.prompt_ids) if request.seq is not None else 0
        self.submitted = request.submitted  # perf_counter when `submit` was called

    async def __aiter__(self) -> AsyncIterator[RequestDelta]:
        try:
            while True:
                item = await self._request.queue.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if item.output is not None:
                    return
        finally:  # the consumer stopped early (client disconnect, cancellation): free the request's blocks
            self.abort()

    async def result(self) -> RequestOutput:
        """Wait for the whole output (non-streaming requests)."""
        async for delta in self:
            if delta.output is not None:
                return delta.output
        raise EngineDeadError("the request ended without an output")

    def abort(self) -> None:
        self._engine._abort(self._request)


class AsyncEngine:
    """Owns an `Engine` on its own thread; `submit` from any coroutine of any event loop."""

    def __init__(self, engine: Engine, encode: Callable[[Any, bool], list[int]], max_waiting: int = 256,
                 retry_after_s: int = 1) -> None:
        if max_waiting < 0:
            raise ValueError("max_waiting must be >= 0")
        self.engine = engine
        self.encode = encode
        self.max_waiting = max_waiting
        self.retry_after_s = retry_after_s
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._live: dict[int, _Request] = {}  # seq_id -> request, owned by the engine thread
        self._pending = 0  # submitted, not yet taken from the inbox (guarded by _lock, like `stats`)
        self._lock = threading.Lock()
        self._resume = threading.Event()
        self._resume.set()
        self._stopping = False
        self._thread: threading.Thread | None = None
        pool = engine.runner.cache.pool
        self.stats = EngineStats(kv_blocks_total=pool.num_blocks)
        self.on_finish: list[Callable[[RequestOutput], None]] = []  # called on the engine thread

    # ------------------------------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="specdec-engine", daemon=True)
            self._thread.start()

    def shutdown(self, timeout: float = 30.0) -> None:
        """Abort everything still running and stop the engine thread."""
        self._stopping = True
        self._resume.set()
        self._inbox.put(None)
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def pause(self) -> None:
        """Hold the loop before its next step (new requests queue up); for tests and draining."""
        self._resume.clear()

    def resume(self) -> None:
        self._resume.set()

    @property
    def num_waiting(self) -> int:
        with self._lock:
            return self._pending + self.stats.waiting

    # ------------------------------------------------------------------------------------------- callers
    async def submit(self, prompt: Any, params: SamplingParams, chat: bool = True,
                     share_prefix_with: RequestStream | None = None) -> RequestStream:
        """Queue a request; returns once the engine accepted it (bad prompts raise `SpecdecError` here).
        `share_prefix_with`: an accepted request of the same prompt (another of its n samples), whose prompt
        blocks this one reuses through the prefix cache."""
        loop = asyncio.get_running_loop()
        request = _Request(prompt, params, chat, loop)
        if share_prefix_with is not None:
            request.leader = share_prefix_with._request.seq
        request.accepted = loop.create_future()
        with self._lock:
            if self._stopping:
                raise OverloadedError("the server is shutting down", self.retry_after_s)
            if self._pending + self.stats.waiting >= self.max_waiting:
                raise OverloadedError(f"{self.max_waiting} requests are already waiting; retry later",
                                      self.retry_after_s)
            self._pending += 1
        self._inbox.put(("add", request))
        try:
            await request.accepted
        except asyncio.CancelledError:
            self._abort(request)
            raise
        return RequestStream(self, request)

    def _abort(self, request: _Request) -> None:
        if not request.aborted:
            request.aborted = True
            self._inbox.put(("abort", request))

    # ------------------------------------------------------------------------------------ engine thread
    def _loop(self) -> None:
        while not self._stopping:
            if not self.engine.has_unfinished():
                self._handle(self._inbox.get())  # idle: sleep until a request (or shutdown) arrives
            self._drain()
            self._resume.wait()
            if self._stopping or not self.engine.has_unfinished():
                self._publish()
                continue
            try:
                touched = self.engine.step()
            except Exception as exc:  # a bug: fail the running requests, keep serving the next ones
                log.exception("engine step failed")
                self._fail_live(EngineDeadError(f"internal engine error ({type(exc).__name__}); the request "
                                                "was aborted"))
                continue
            now = time.perf_counter()
            for seq in touched:
                request = self._live.get(seq.seq_id)
                if request is not None:
                    self._deliver(request, seq, now)
            self._publish(stepped=True)
        error = OverloadedError("the server is shutting down", self.retry_after_s)
        self._fail_live(error)
        self._refuse_inbox(error)

    def _drain(self) -> None:
        """Take everything in the inbox: new requests join this step's batch, aborts free blocks before it."""
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return
            self._handle(item)

    def _handle(self, item: tuple[str, _Request] | None) -> None:
        if item is None:  # shutdown's wake-up
            return
        kind, request = item
        if kind == "add":
            with self._lock:
                self._pending -= 1
            if request.aborted:  # the caller left before its request was taken
                return
            try:
                ids = self.encode(request.prompt, request.chat)
                seq = self.engine.add_request(ids, request.params, share_prefix_with=request.leader)
            except SpecdecError as exc:
                request.settle(exc)
                return
            except Exception as exc:  # a tokenizer or template bug: refuse this request, keep serving
                log.exception("could not add a request")
                request.settle(EngineDeadError(f"could not encode the prompt ({type(exc).__name__}: {exc})"))
                return
            request.seq = seq
            request.deltas = TextDeltas()
            self._live[seq.seq_id] = request
            request.settle(None)
            self._publish()
        elif kind == "abort" and request.seq is not None and request.seq.seq_id in self._live:
            self.engine.abort(request.seq.seq_id)
            self._forget(request, time.perf_counter())

    def _deliver(self, request: _Request, seq: Sequence, now: float) -> None:
        text = request.deltas(self.engine.output_text(seq))
        n = len(seq.output_ids) - request.sent_tokens
        logprobs: tuple = ()
        if seq.params.logprobs is not None:  # the new tokens' logprobs, named on this (the tokenizer's) thread
            new = seq.logprobs[request.sent_tokens:]
            ids = {lp.token_id for lp in new} | {t for lp in new for t, _ in lp.top}
            logprobs = (tuple(new), {t: self.engine.token_text(t) for t in ids})
        request.sent_tokens = len(seq.output_ids)
        if seq.is_finished:
            request.reply(RequestDelta(text, n, now, self._forget(request, now), logprobs))
        elif (text or n) and not request.reply(RequestDelta(text, n, now, logprobs=logprobs)):
            self.engine.abort(seq.seq_id)  # its caller's event loop is gone: nobody will read the rest
            self._forget(request, now)

    def _forget(self, request: _Request, now: float) -> RequestOutput:
        """Drop a finished or aborted request from every table (the engine keeps no finished sequences)."""
        seq = request.seq
        self._live.pop(seq.seq_id, None)
        output = output_of(seq, self.engine.output_text(seq), now, token_text=self.engine.token_text)
        for callback in self.on_finish:
            try:
                callback(output)
            except Exception:
                log.exception("on_finish callback failed")
        return output

    def _fail_live(self, error: SpecdecError) -> None:
        """Fail and abort the requests in the engine (those queued in the inbox took no part in a failed step)."""
        for request in list(self._live.values()):
            if not request.seq.is_finished:
                try:
                    self.engine.abort(request.seq.seq_id)
                except Exception:
                    log.exception("abort after an engine error failed")
            self._live.pop(request.seq.seq_id, None)
            self.engine.sequences.pop(request.seq.seq_id, None)
            request.reply(error)
        self._publish()

    def _refuse_inbox(self, error: SpecdecError) -> None:
        """At shutdown: refuse the requests not yet taken."""
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return
            if item is not None and item[0] == "add":
                with self._lock:
                    self._pending -= 1
                item[1].settle(error)

    def _publish(self, stepped: bool = False) -> None:
        scheduler, pool = self.engine.scheduler, self.engine.runner.cache.pool
        with self._lock:
            self.stats = EngineStats(len(scheduler.running), len(scheduler.waiting), pool.num_blocks - pool.num_free,
                                     pool.num_blocks, self.stats.steps + int(stepped))
