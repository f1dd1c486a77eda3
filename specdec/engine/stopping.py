"""Stopping and output text: an incremental detokenizer, and EOS / length / stop-string checks on new text only.

Decoding the whole output at every step costs O(n) per step, O(n^2) per request. Instead each step decodes a
short window: the tokens since the last clean boundary (`prefix_offset`), and emits the text past what that
window already gave (`read_offset`), as vLLM and transformers' streamers do. Text ending in U+FFFD (half of a
multi-byte character) is held back until the next token completes it. Stop strings are searched for in the new
text plus the `longest stop - 1` characters before it, so a stop string split across steps is still found.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specdec.config import SamplingParams


@dataclass
class TextState:
    """One request's output text so far."""

    text: str = ""  # decoded text of output_ids[:read_offset]
    prefix_offset: int = 0  # window start: tokens before it never change the text again
    read_offset: int = 0  # tokens already turned into `text`
    end: int | None = None  # where a matched stop string starts: the user's text is text[:end]
    checked: int = 0  # characters of `text` already searched for stop strings

    def visible(self, stops: tuple[str, ...], finished: bool) -> str:
        """The text a user may see now: up to a matched stop string, and, while running, short of the last
        `longest stop - 1` characters (they may yet start a stop string)."""
        if self.end is not None:
            return self.text[: self.end]
        if finished or not stops:
            return self.text
        return self.text[: max(0, len(self.text) - max(len(s) for s in stops) + 1)]


@dataclass
class StopRules:
    """What ends a request, shared by every sequence of one engine."""

    tokenizer: Any
    eos_ids: frozenset[int]
    max_len: int  # the model's context

    def decode(self, state: TextState, output_ids: list[int], final: bool = False) -> str:
        """Advance `state` over the new tokens; returns the text they added. `final` flushes held-back text."""
        if state.read_offset >= len(output_ids):
            return ""
        before = self.tokenizer.decode(output_ids[state.prefix_offset: state.read_offset], skip_special_tokens=True)
        after = self.tokenizer.decode(output_ids[state.prefix_offset:], skip_special_tokens=True)
        if after.endswith("\ufffd") and not final:
            return ""
        new = after[len(before):] if after.startswith(before) else after
        state.text += new
        state.prefix_offset, state.read_offset = state.read_offset, len(output_ids)
        return new

    def append(self, state: TextState, output_ids: list[int], tokens: list[int], params: SamplingParams,
               prompt_len: int) -> tuple[int, str | None]:
        """Add `tokens` to `output_ids` up to the first stop; returns (tokens kept, finish reason or None).

        Every token is checked on its own, stop strings included, as plain decoding checks them: a speculative
        step that accepted tokens past the one completing a stop string keeps none of them, so its output is
        plain decoding's token for token.
        """
        kept = 0
        for token in tokens:
            output_ids.append(token)
            kept += 1
            reason = None
            early = len(output_ids) <= params.min_new_tokens  # this token is among the first min_new_tokens
            if (token in self.eos_ids and not params.ignore_eos or token in params.stop_token_ids) and not early:
                reason = "stop"
            elif len(output_ids) >= params.max_new_tokens or prompt_len + len(output_ids) >= self.max_len:
                reason = "length"
            if params.stop:
                self.decode(state, output_ids, final=reason is not None)
                if early and reason is None:  # min_new_tokens: stop strings count only once they end later
                    state.checked = len(state.text)
                elif self._hit_stop_string(state, params.stop):
                    reason = "stop"
            if reason is not None:
                return kept, reason
        return kept, None

    def finish(self, state: TextState, output_ids: list[int]) -> None:
        self.decode(state, output_ids, final=True)

    @staticmethod
    def _hit_stop_string(state: TextState, stops: tuple[str, ...]) -> bool:
        checked = state.checked
        state.checked = len(state.text)
        # each stop string is searched from where an occurrence ending in the new text could start
        hits = [i for i in (state.text.find(s, max(0, checked - len(s) + 1)) for s in stops) if i >= 0]
        if not hits:
            return False
        state.end = min(hits)
        return True
