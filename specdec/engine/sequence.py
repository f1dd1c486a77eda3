"""One request's state as it moves through the engine.

Invariant while a sequence decodes: the KV cache holds every token but the last (`table.length ==
len(token_ids) - 1`). The last token is the *root* of the next draft tree: its K/V is computed in the same
target pass that verifies the tree, so a step never needs a separate pass to catch the cache up.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

import torch

from specdec.config import SamplingParams
from specdec.kvcache import BlockTable


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class SequenceMetrics:
    arrival_time: float = field(default_factory=time.perf_counter)
    first_token_time: float | None = None
    finish_time: float | None = None
    target_steps: int = 0  # verify passes this sequence took part in
    accepted_drafts: int = 0  # drafted tokens accepted, over all steps
    accepted_by_depth: list[int] = field(default_factory=list)  # [d] steps that accepted a node at depth d+1
    proposed_by_depth: list[int] = field(default_factory=list)  # [d] steps whose tree reached depth d+1
    draft_time_s: float = 0.0
    verify_time_s: float = 0.0
    preemptions: int = 0
    cached_prompt_tokens: int = 0
    step_accepts: list[int] = field(default_factory=list)  # tokens emitted per step (for colouring / histograms)
    accepted_by_source: dict[str, int] = field(default_factory=dict)  # accepted drafted tokens per proposer
    source_of: dict[int, str] = field(default_factory=dict)  # output index -> proposer, for multi-drafter trees


@dataclass(eq=False)
class Sequence:
    seq_id: int
    prompt_ids: list[int]
    params: SamplingParams
    generator: torch.Generator
    output_ids: list[int] = field(default_factory=list)
    table: BlockTable = field(default_factory=BlockTable)
    status: Status = Status.WAITING
    finish_reason: str | None = None
    num_computed: int = 0  # prompt tokens whose K/V is in the cache (prefill progress)
    metrics: SequenceMetrics = field(default_factory=SequenceMetrics)
    drafter_state: dict = field(default_factory=dict)  # owned by the drafter (its cache table, history, ...)
    stop_checked_len: int = 0  # output characters already searched for stop strings
    text_end: int | None = None  # where a matched stop string starts in the output text

    @property
    def token_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def is_prefilling(self) -> bool:
        return not self.output_ids

    @property
    def last_token(self) -> int:
        return self.output_ids[-1] if self.output_ids else self.prompt_ids[-1]

    @property
    def is_finished(self) -> bool:
        return self.status is Status.FINISHED
