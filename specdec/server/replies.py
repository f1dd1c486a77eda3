"""Response bodies of one request, completions or chat, in OpenAI's shapes: one choice per sample (`n`), with
logprobs when asked for, and specdec's extension (drafter, tau, acceptance) per response."""

from __future__ import annotations

import time
from typing import Any

from specdec.engine.outputs import RequestOutput
from specdec.server.logprobs import chat_logprobs, completion_logprobs


class Reply:
    def __init__(self, kind: str, request_id: str, model: str, drafter: str, n: int = 1) -> None:
        self.kind, self.id, self.model, self.drafter, self.n = kind, request_id, model, drafter, n
        self.created = int(time.time())
        self.chat = kind == "chat.completion"
        self.text_offset = [0] * n  # completions' logprobs: characters streamed before each choice's next token

    def _head(self, object_: str) -> dict:
        return {"id": self.id, "object": object_, "created": self.created, "model": self.model}

    def _logprobs(self, logprobs: Any, texts: dict[int, str], index: int) -> dict | None:
        if logprobs is None:
            return None
        if self.chat:
            return chat_logprobs(logprobs, texts)
        body = completion_logprobs(logprobs, texts, self.text_offset[index])
        self.text_offset[index] += sum(len(t) for t in body["tokens"])
        return body

    def whole(self, outs: list[RequestOutput]) -> dict:
        choices = []
        for index, out in enumerate(outs):
            logprobs = self._logprobs(out.logprobs, out.token_texts, index)
            if self.chat:
                choices.append({"index": index, "message": {"role": "assistant", "content": out.text},
                                "finish_reason": finish(out), "logprobs": logprobs})
            else:
                choices.append({"index": index, "text": out.text, "finish_reason": finish(out), "logprobs": logprobs})
        return {**self._head(self.kind), "choices": choices, "usage": usage(outs), "specdec": self.extension(outs[0])}

    def chunk(self, index: int, text: str, num_tokens: int | None, out: RequestOutput | None, logprobs: tuple = (),
              role: bool = False) -> dict:
        finish_reason = finish(out) if out is not None else None
        lp = self._logprobs(logprobs[0], logprobs[1], index) if logprobs else None
        if self.chat:
            delta = {"role": "assistant", "content": ""} if role else ({"content": text} if text else {})
            choice = {"index": index, "delta": delta, "finish_reason": finish_reason, "logprobs": lp}
        else:
            choice = {"index": index, "text": text, "finish_reason": finish_reason, "logprobs": lp}
        body = {**self._head("chat.completion.chunk" if self.chat else "text_completion"), "choices": [choice]}
        if num_tokens is not None:
            body["specdec"] = {"num_tokens": num_tokens}
        if out is not None:
            body["usage"] = usage([out])
            body["specdec"] = {"num_tokens": num_tokens, **self.extension(out)}
        return body

    def usage_chunk(self, outs: list[RequestOutput]) -> dict:
        head = self._head("chat.completion.chunk" if self.chat else "text_completion")
        return {**head, "choices": [], "usage": usage(outs)}

    def extension(self, out: RequestOutput) -> dict:
        m = out.metrics
        return {"drafter": self.drafter, "tau": m.mean_accepted_tokens, "acceptance_by_depth": m.acceptance_by_depth,
                "target_steps": m.target_steps, "engine_ttft_s": m.ttft_s,
                "decode_tokens_per_second": m.tokens_per_second, "cached_prompt_tokens": m.cached_prompt_tokens,
                "preemptions": m.preemptions}


def finish(out: RequestOutput) -> str:
    return "length" if out.finish_reason == "length" else "stop"


def usage(outs: list[RequestOutput]) -> dict:
    """The prompt once, the completions of every sample."""
    prompt, completion = len(outs[0].prompt_token_ids), sum(len(o.token_ids) for o in outs)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
