"""Request bodies of the OpenAI completions and chat endpoints, and the sampling parameters they map to.

Parsing is strict: a string where a number belongs is a 400, not a silent conversion, and a field specdec does
not implement is a 400 naming it, never ignored. OpenAI fields that specdec does not implement are accepted
only at their neutral value (`best_of=1`, `echo=false`, ...), so clients that always send defaults work.

Mapped onto SamplingParams (exact under every drafter): `n`, `frequency_penalty`, `presence_penalty`,
`logit_bias` (token-id strings -> bias), `logprobs` (completions: how many alternatives; chat: on/off, with
`top_logprobs` alternatives). Extensions beyond OpenAI's fields: `top_k`, `ignore_eos`, `min_p`,
`repetition_penalty`, `min_tokens` and `stop_token_ids` (vLLM's names).
"""

from __future__ import annotations

from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from specdec.config import MAX_LOGPROBS, MAX_N, SamplingParams
from specdec.server.errors import APIError, from_validation

# Field -> the values that mean "off". Anything else is refused until the sampling issue implements the field.
NEUTRAL: dict[str, tuple] = {
    "best_of": (None, 1),
    "echo": (None, False),
    "suffix": (None, ""),
    "tools": (None, []),
    "tool_choice": (None, "none"),
    "parallel_tool_calls": (None, False),
    "response_format": (None, {"type": "text"}),
    "functions": (None, []),
    "function_call": (None, "none"),
}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(_Strict):
    include_usage: bool = False


class _Sampling(_Strict):
    model: str
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1)  # extension; 0 or -1 = off
    seed: int | None = Field(None, ge=0)
    stop: Union[str, list[str], None] = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None  # metadata only
    ignore_eos: bool = False  # extension
    n: int | None = Field(None, ge=1, le=MAX_N)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    logit_bias: dict[str, float] | None = None
    repetition_penalty: float | None = Field(None, gt=0, le=100)  # extension
    min_p: float | None = Field(None, ge=0, le=1)  # extension
    min_tokens: int | None = Field(None, ge=0)  # extension (vLLM's name)
    stop_token_ids: list[int] | None = None  # extension (vLLM's name)

    def check_unsupported(self) -> None:
        for name, neutral in NEUTRAL.items():
            if name in type(self).model_fields:
                value = getattr(self, name)
                if not any(value == v and type(value) is type(v) for v in neutral):
                    raise APIError(400, f"'{name}' is not supported by specdec yet (send it unset or "
                                        f"{neutral[1]!r})", param=name, code="unsupported_parameter")

    def stop_strings(self) -> tuple[str, ...]:
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        if not all(stop):
            raise APIError(400, "stop: stop strings must not be empty", param="stop", code="invalid_value")
        return stop

    def num_logprobs(self) -> int | None:
        """How many alternatives per token to report, or None for no logprobs."""
        raise NotImplementedError

    def bias(self) -> dict[int, float]:
        bias = {}
        for key, value in (self.logit_bias or {}).items():
            if not key.isdigit():
                raise APIError(400, f"logit_bias: keys must be token ids, got {key!r}", param="logit_bias",
                               code="invalid_value")
            bias[int(key)] = value
        return bias

    def sampling_params(self, max_tokens: int) -> SamplingParams:
        top_k = self.top_k if self.top_k and self.top_k > 0 else 0
        return SamplingParams(max_new_tokens=max_tokens, temperature=1.0 if self.temperature is None else self.temperature,
                              top_k=top_k, top_p=1.0 if self.top_p is None else self.top_p, seed=self.seed,
                              stop=self.stop_strings(), ignore_eos=self.ignore_eos,
                              repetition_penalty=1.0 if self.repetition_penalty is None else self.repetition_penalty,
                              frequency_penalty=self.frequency_penalty or 0.0,
                              presence_penalty=self.presence_penalty or 0.0, min_p=self.min_p or 0.0,
                              logit_bias=self.bias(), stop_token_ids=tuple(self.stop_token_ids or ()),
                              min_new_tokens=min(self.min_tokens or 0, max_tokens), logprobs=self.num_logprobs(),
                              n=self.n or 1)

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionRequest(_Sampling):
    prompt: Union[str, list[int], list[str], list[list[int]]]
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)  # alternatives per token (OpenAI allows 5)
    echo: Any = None
    best_of: Any = None
    suffix: Any = None

    def num_logprobs(self) -> int | None:
        return self.logprobs

    def single_prompt(self) -> str | list[int]:
        prompt = self.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            if len(prompt) != 1:
                raise APIError(400, f"prompt: {len(prompt)} prompts in one request are not supported; send one "
                                    "request per prompt", param="prompt", code="unsupported_parameter")
            prompt = prompt[0]
        return prompt


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant"]
    content: Union[str, list[TextPart]]
    name: str | None = None

    def as_template_message(self) -> dict:
        text = self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)
        return {"role": "system" if self.role == "developer" else self.role, "content": text}


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    tools: Any = None
    tool_choice: Any = None
    parallel_tool_calls: Any = None
    response_format: Any = None
    functions: Any = None
    function_call: Any = None

    def num_logprobs(self) -> int | None:
        if self.top_logprobs is not None and not self.logprobs:
            raise APIError(400, "top_logprobs needs logprobs: true", param="top_logprobs", code="invalid_value")
        return (self.top_logprobs or 0) if self.logprobs else None


def parse(model: type[_Strict], body: Any) -> Any:
    """Validate a decoded JSON body, or raise the 400 naming the first bad field."""
    if not isinstance(body, dict):
        raise APIError(400, f"the request body must be a JSON object, got {type(body).__name__}", code="invalid_json")
    try:
        request = model.model_validate(body)
    except ValidationError as exc:
        raise from_validation(exc) from None
    request.check_unsupported()
    return request
