"""The OpenAI-compatible HTTP API over `AsyncEngine`.

    POST /v1/completions        text or token-id prompt, streaming (SSE, `data: [DONE]`) or not
    POST /v1/chat/completions   messages through the model's chat template
    GET  /v1/models             the one model this server serves
    GET  /health                liveness, with the batch and KV occupancy
    GET  /metrics               Prometheus text format (specdec.server.metrics)

A request is validated and accepted by the engine (prompt encoded, context and KV capacity checked) before
the response starts, so every refusal is a proper status code, even for streams. A client that goes away
aborts its request: Starlette cancels a stream's generator on disconnect, and a non-streaming request
watches for the disconnect itself.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from specdec.api import LLM
from specdec.engine.async_engine import AsyncEngine, RequestDelta, RequestStream
from specdec.engine.outputs import RequestOutput
from specdec.errors import ConfigError, PromptTooLongError, SpecdecError
from specdec.server import errors
from specdec.server.errors import APIError
from specdec.server.metrics import ServerMetrics
from specdec.sampling.seeds import per_sample
from specdec.server.protocol import ChatCompletionRequest, CompletionRequest, parse
from specdec.server.replies import Reply

# A prompt with more characters than this many per context token cannot fit; refuse it before tokenizing it
# on the engine thread (BPE tokens of ordinary text average 3-5 characters).
MAX_CHARS_PER_TOKEN = 32
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
PARAM_FOR_FIELD = {"max_new_tokens": "max_tokens", "min_new_tokens": "min_tokens"}  # SamplingParams -> API names


class OpenAIServer:
    """Everything one server instance owns: the LLM, its engine thread, its metrics, the FastAPI app."""

    def __init__(self, llm: LLM, model_name: str | None = None, max_waiting: int = 256) -> None:
        self.llm = llm
        self.model_name = model_name or llm.target
        self.max_len = llm.model.config.max_position
        self.vocab = llm.model.config.vocab_size
        self.engine = AsyncEngine(llm.engine, self._encode, max_waiting)
        self.metrics = ServerMetrics(lambda: self.engine.stats)
        llm.engine.step_observers.append(self.metrics.observe_step)
        self.engine.on_finish.append(self.metrics.observe_finish)
        self.created = int(time.time())
        self.app = self._build()

    # ----------------------------------------------------------------------------------------------- app
    def _build(self) -> FastAPI:
        @asynccontextmanager
        async def lifespan(_: FastAPI):
            self.engine.start()
            yield
            self.engine.shutdown()

        app = FastAPI(title="specdec", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
        errors.install(app)
        app.add_api_route("/health", self.health, methods=["GET"])
        app.add_api_route("/metrics", self.prometheus, methods=["GET"])
        app.add_api_route("/v1/models", self.models, methods=["GET"])
        app.add_api_route("/v1/completions", self.completions, methods=["POST"])
        app.add_api_route("/v1/chat/completions", self.chat_completions, methods=["POST"])
        return StatusCounter(app, self.metrics)  # type: ignore[return-value]

    async def health(self) -> dict:
        s = self.engine.stats
        return {"status": "ok", "running": s.running, "waiting": self.engine.num_waiting,
                "kv_blocks_used": s.kv_blocks_used, "kv_blocks_total": s.kv_blocks_total}

    async def prometheus(self) -> Response:
        return PlainTextResponse(self.metrics.render(), media_type="text/plain; version=0.0.4")

    async def models(self) -> dict:
        return {"object": "list", "data": [{
            "id": self.model_name, "object": "model", "created": self.created, "owned_by": "specdec",
            "max_model_len": self.max_len,
            "specdec": {"drafter": self.llm.drafter_spec, "tree": self.llm.tree_spec.describe(),
                        "quantize": self.llm.quantize},
        }]}

    async def completions(self, request: Request) -> Response:
        req: CompletionRequest = parse(CompletionRequest, await _json(request))
        self._check_model(req.model)
        max_tokens = req.max_tokens or COMPLETIONS_DEFAULT_MAX_TOKENS
        return await self._serve(request, req, req.single_prompt(), False, max_tokens, "prompt", "text_completion")

    async def chat_completions(self, request: Request) -> Response:
        req: ChatCompletionRequest = parse(ChatCompletionRequest, await _json(request))
        self._check_model(req.model)
        if req.max_tokens is not None and req.max_completion_tokens is not None:
            raise APIError(400, "give max_tokens or max_completion_tokens, not both", param="max_completion_tokens")
        max_tokens = req.max_completion_tokens or req.max_tokens or self.max_len
        messages = [m.as_template_message() for m in req.messages]
        return await self._serve(request, req, messages, True, max_tokens, "messages", "chat.completion")

    def _check_model(self, model: str) -> None:
        if model != self.model_name:
            raise APIError(404, f"the model '{model}' does not exist; this server serves '{self.model_name}'",
                           param="model", code="model_not_found")

    # ---------------------------------------------------------------------------------------- generation
    async def _serve(self, request: Request, req: Any, prompt: Any, chat: bool, max_tokens: int, prompt_param: str,
                     kind: str) -> Response:
        try:
            params = req.sampling_params(max_tokens)
        except ConfigError as exc:
            raise APIError(400, str(exc), param=PARAM_FOR_FIELD.get(exc.field, exc.field), code="invalid_value") from None
        streams: list[RequestStream] = []
        try:  # n samples: n requests, each with its own seed; the later ones reuse the first's prompt blocks
            for one in per_sample(params):
                streams.append(await self.engine.submit(prompt, one, chat, streams[0] if streams else None))
        except SpecdecError as exc:
            for stream in streams:
                stream.abort()
            raise errors.from_specdec(exc, prompt_param) from None
        self.metrics.prompt_tokens.inc(streams[0].prompt_tokens * len(streams))
        reply = Reply(kind, f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}", self.model_name,
                      self.llm.drafter_spec, len(streams))
        if req.stream:
            return StreamingResponse(self._events(streams, reply, req.include_usage), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        outputs = await self._collect(request, streams)
        return JSONResponse(reply.whole(outputs))

    async def _deltas(self, stream: RequestStream) -> AsyncIterator[RequestDelta]:
        """The request's deltas, recording TTFT and per-token latency on the way."""
        last = None
        async for delta in stream:
            if delta.num_tokens:
                if last is None:  # the prefill's token
                    self.metrics.ttft.observe(delta.time - stream.submitted)
                else:
                    per_token = (delta.time - last) / delta.num_tokens
                    for _ in range(delta.num_tokens):
                        self.metrics.itl.observe(per_token)
                last = delta.time
            if delta.output is not None:
                self.metrics.e2e.observe(delta.time - stream.submitted)
            yield delta

    async def _merged(self, streams: list[RequestStream]) -> AsyncIterator[tuple[int, RequestDelta]]:
        """(sample index, delta) from every stream, in the order they arrive."""
        if len(streams) == 1:
            async for delta in self._deltas(streams[0]):
                yield 0, delta
            return
        queue: asyncio.Queue = asyncio.Queue()

        async def pump(index: int, stream: RequestStream) -> None:
            try:
                async for delta in self._deltas(stream):
                    queue.put_nowait((index, delta, None))
            except SpecdecError as exc:
                queue.put_nowait((index, None, exc))
                return
            queue.put_nowait((index, None, None))

        tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
        try:
            left = len(streams)
            while left:
                index, delta, error = await queue.get()
                if error is not None:
                    raise error
                if delta is None:
                    left -= 1
                else:
                    yield index, delta
        finally:
            for task in tasks:
                task.cancel()

    async def _events(self, streams: list[RequestStream], reply: Reply, include_usage: bool) -> AsyncIterator[str]:
        finals: dict[int, RequestOutput] = {}
        try:
            if reply.chat:
                for index in range(len(streams)):
                    yield _sse(reply.chunk(index, "", None, None, role=True))
            async for index, delta in self._merged(streams):
                if delta.output is not None:
                    finals[index] = delta.output
                    yield _sse(reply.chunk(index, delta.text, delta.num_tokens, delta.output, delta.logprobs))
                elif delta.text or delta.logprobs:
                    yield _sse(reply.chunk(index, delta.text, delta.num_tokens, None, delta.logprobs))
            if include_usage:
                yield _sse(reply.usage_chunk([finals[i] for i in sorted(finals)]))
            yield "data: [DONE]\n\n"
        except SpecdecError as exc:  # the engine failed mid-stream: tell the client in the stream's own terms
            yield _sse(errors.from_specdec(exc).body())
            yield "data: [DONE]\n\n"
        finally:
            for stream in streams:
                stream.abort()  # no-op when finished; frees the blocks when the client left mid-stream

    async def _collect(self, request: Request, streams: list[RequestStream]) -> list[RequestOutput]:
        async def run() -> list[RequestOutput]:
            outputs: dict[int, RequestOutput] = {}
            async for index, delta in self._merged(streams):
                if delta.output is not None:
                    outputs[index] = delta.output
            if len(outputs) < len(streams):
                raise APIError(500, "the request ended without output", "server_error")
            return [outputs[i] for i in range(len(streams))]

        work = asyncio.ensure_future(run())
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not work.done():  # the client left: stop generating for it
                work.cancel()
                for stream in streams:
                    stream.abort()
        if work.cancelled():
            raise APIError(499, "the client closed the connection", code="client_closed_request")
        try:
            return work.result()
        except SpecdecError as exc:
            raise errors.from_specdec(exc) from None

    # ------------------------------------------------------------------------------------------ encoding
    def _encode(self, prompt: Any, chat: bool) -> list[int]:
        """Token ids for a prompt, on the engine thread; refuses what cannot fit before tokenizing it."""
        chars = sum(len(m["content"]) for m in prompt) if chat else len(prompt) if isinstance(prompt, str) else 0
        if chars > MAX_CHARS_PER_TOKEN * self.max_len:
            raise PromptTooLongError(f"the prompt has {chars} characters, far more than the model's context of "
                                     f"{self.max_len} tokens can hold")
        ids = self.llm.encode(prompt, chat=chat)
        bad = next((t for t in ids if not 0 <= t < self.vocab), None)
        if bad is not None:
            raise ConfigError(f"prompt: token id {bad} is outside the vocabulary (0..{self.vocab - 1})")
        return ids


class StatusCounter:
    """Pure ASGI middleware counting responses by endpoint and status (BaseHTTPMiddleware would buffer
    streams and hide client disconnects from them)."""

    def __init__(self, app: FastAPI, metrics: ServerMetrics) -> None:
        self.app, self.metrics = app, metrics
        self.state = app.state
        self.router = app.router

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        endpoint = path if path in ("/v1/completions", "/v1/chat/completions", "/v1/models", "/health",
                                    "/metrics") else "other"

        async def counting_send(message) -> None:
            if message["type"] == "http.response.start":
                self.metrics.requests.labels(endpoint, str(message["status"])).inc()
            await send(message)

        await self.app(scope, receive, counting_send)


def _sse(body: dict) -> str:
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"


async def _json(request: Request) -> Any:
    raw = await request.body()
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise APIError(400, f"the request body is not valid JSON ({exc})", code="invalid_json") from None


async def _disconnected(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def create_app(llm: LLM, model_name: str | None = None, max_waiting: int = 256) -> OpenAIServer:
    """A server for `llm`: run `server.app` with any ASGI server (the engine thread starts with the app)."""
    return OpenAIServer(llm, model_name, max_waiting)
