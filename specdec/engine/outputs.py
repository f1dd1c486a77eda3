"""What a finished (or streaming) request gives back to the user."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Callable

from specdec.engine.sequence import Sequence
from specdec.sampling.logprobs import TokenLogprob


@dataclass(frozen=True)
class RequestMetrics:
    target_steps: int  # target passes (verify steps) that produced this request's tokens; prefill not counted
    mean_accepted_tokens: float  # tau: tokens emitted per target step, the bonus token counted (1.0 = plain)
    acceptance_by_depth: list[float]  # alpha_d: P(a node at depth d accepted | the tree reached depth d)
    ttft_s: float  # time to first token
    tokens_per_second: float  # generated tokens / time from first token to finish (decode speed)
    num_generated: int
    draft_time_s: float
    verify_time_s: float
    preemptions: int = 0
    cached_prompt_tokens: int = 0
    accepted_per_step: list[int] = field(default_factory=list)
    accepted_by_source: dict[str, int] = field(default_factory=dict)  # accepted drafted tokens per proposer

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class RequestOutput:
    request_id: int
    prompt_token_ids: list[int]
    text: str
    token_ids: list[int]  # generated tokens only
    finish_reason: str | None  # "stop" (EOS or a stop string), "length", "abort", or None while running
    metrics: RequestMetrics
    # per generated token, under the processed distribution it was drawn from; None unless params.logprobs is set
    logprobs: list[TokenLogprob] | None = None
    sample_index: int = 0  # which of the prompt's `n` samples this is
    samples: tuple["RequestOutput", ...] = ()  # with n > 1: every sample (this one first); () when n == 1
    token_texts: dict[int, str] = field(default_factory=dict)  # with logprobs: the text of every token they name

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


def output_of(seq: Sequence, text: str, now: float, sample_index: int = 0,
              token_text: Callable[[int], str] | None = None) -> RequestOutput:
    """One sequence's output as the user sees it (the text comes from the engine's detokenizer). `token_text`
    names the tokens of the logprobs; it runs on the thread that owns the tokenizer."""
    texts = {}
    if token_text is not None and seq.params.logprobs is not None:
        ids = {lp.token_id for lp in seq.logprobs} | {t for lp in seq.logprobs for t, _ in lp.top}
        texts = {t: token_text(t) for t in sorted(ids)}
    return RequestOutput(
        request_id=seq.seq_id,
        prompt_token_ids=list(seq.prompt_ids),
        text=text,
        token_ids=list(seq.output_ids),
        finish_reason=seq.finish_reason,
        metrics=metrics_of(seq, now),
        logprobs=list(seq.logprobs) if seq.params.logprobs is not None else None,
        sample_index=sample_index,
        token_texts=texts,
    )


def metrics_of(seq: Sequence, now: float) -> RequestMetrics:
    m = seq.metrics
    steps = len(m.step_accepts)
    decoded = sum(m.step_accepts)
    first = m.first_token_time
    end = m.finish_time or now
    # The first token comes from the prefill; decode speed counts the tokens after it over the time after it.
    span = (end - first) if first is not None else 0.0
    alphas = [a / p if p else 0.0 for a, p in zip(m.accepted_by_depth, m.proposed_by_depth)]
    return RequestMetrics(
        target_steps=steps,
        mean_accepted_tokens=decoded / steps if steps else 0.0,
        acceptance_by_depth=alphas,
        ttft_s=(first - m.arrival_time) if first is not None else 0.0,
        tokens_per_second=(len(seq.output_ids) - 1) / span if span > 0 and len(seq.output_ids) > 1 else 0.0,
        num_generated=len(seq.output_ids),
        draft_time_s=m.draft_time_s,
        verify_time_s=m.verify_time_s,
        preemptions=m.preemptions,
        cached_prompt_tokens=m.cached_prompt_tokens,
        accepted_per_step=list(m.step_accepts),
        accepted_by_source=dict(m.accepted_by_source),
    )
