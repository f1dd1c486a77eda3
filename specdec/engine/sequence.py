"""One request's state as it moves through the engine.

Invariant while a sequence decodes: the KV cache holds every token but the last (`table.length ==
len(token_ids) - 1`). The last token is the *root* of the next draft tree: its K/V is computed in the same
target pass that verifies the tree, so a step never needs a separate pass to catch the cache up. The committed
length is the block table's length: there is no second counter to keep in step with it.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Callable, TypeVar

import torch

from specdec.config import SamplingParams
from specdec.engine.stopping import TextState
from specdec.kvcache import BlockTable
from specdec.sampling.logprobs import TokenLogprob

State = TypeVar("State")


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class SequenceMetrics:
    arrival_time: float = field(default_factory=time.perf_counter)
    first_token_time: float | None = None
    finish_time: float | None = None
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


class DrafterSlots:
    """Per-sequence drafter state: one slot per drafter object, each holding that drafter's own typed state."""

    def __init__(self) -> None:
        self._slots: dict[int, tuple[object, object]] = {}  # id(drafter) -> (drafter, state)

    def get(self, owner: object, make: Callable[[], State]) -> State:
        entry = self._slots.get(id(owner))
        if entry is None:
            entry = self._slots[id(owner)] = (owner, make())
        return entry[1]  # type: ignore[return-value]

    def peek(self, owner: object) -> object | None:
        entry = self._slots.get(id(owner))
        return None if entry is None else entry[1]

    def drop(self, owner: object) -> object | None:
        entry = self._slots.pop(id(owner), None)
        return None if entry is None else entry[1]

    def __len__(self) -> int:
        return len(self._slots)


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
    metrics: SequenceMetrics = field(default_factory=SequenceMetrics)
    drafter_state: DrafterSlots = field(default_factory=DrafterSlots)  # owned by the drafters
    text: TextState | None = None  # output text, decoded incrementally (made by the engine)
    logprobs: list[TokenLogprob] = field(default_factory=list)  # one per output token when params.logprobs is set
    prefix_leader: "Sequence | None" = None  # a sibling sample whose prompt prefill this one waits for

    @property
    def num_computed(self) -> int:
        """Tokens whose K/V is in the target's cache."""
        return self.table.length

    @property
    def token_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def last_token(self) -> int:
        return self.output_ids[-1] if self.output_ids else self.prompt_ids[-1]

    @property
    def is_finished(self) -> bool:
        return self.status is Status.FINISHED
