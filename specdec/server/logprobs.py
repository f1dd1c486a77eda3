"""Logprobs in OpenAI's two shapes: the completions API's parallel lists, and the chat API's `content` list.

The values are specdec's (`specdec.sampling.logprobs`): each token's log-probability under the processed
distribution it was drawn from, and the most likely alternatives there; a token is named by its own text.
"""

from __future__ import annotations

from typing import Any


def completion_logprobs(logprobs: Any, texts: dict[int, str], offset: int = 0) -> dict:
    """`{"tokens", "token_logprobs", "top_logprobs", "text_offset"}`; `offset`: characters before the first."""
    tokens, values, tops, offsets = [], [], [], []
    for lp in logprobs:
        text = texts.get(lp.token_id, "")
        tokens.append(text)
        values.append(lp.logprob)
        tops.append({texts.get(t, ""): v for t, v in lp.top})
        offsets.append(offset)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}


def chat_logprobs(logprobs: Any, texts: dict[int, str]) -> dict:
    """`{"content": [{"token", "logprob", "bytes", "top_logprobs"}], "refusal": None}`."""

    def entry(token: int, value: float) -> dict:
        text = texts.get(token, "")
        return {"token": text, "logprob": value, "bytes": list(text.encode("utf-8"))}

    content = [{**entry(lp.token_id, lp.logprob), "top_logprobs": [entry(t, v) for t, v in lp.top]}
               for lp in logprobs]
    return {"content": content, "refusal": None}
