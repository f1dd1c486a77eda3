"""Prompt rows for drafters that learn from the target's logits, computed when a sequence is drafted for again.

Token Recycling seeds its adjacency matrix from the logits at the prompt's last `prefill_logit_rows`
positions (`Drafter.observe_prefill_logits`). Each such row is an LM-head row, and computing them during the
prefill paid for drafts that, under load, never came: at 64 requests at once the planner speculated on 7 of
51 steps, yet seeding 64 rows a request cost `recycle` a tenth of plain decode's throughput (the LM head ran
for 4,100 prompt rows beside 2,900 generated ones). So the prefill keeps only the final-norm hidden states of
those rows (a view of what the forward computes anyway), and the LM head runs over them just before the
drafter's second proposal for the sequence (`hand_over`). A sequence the planner drafts for at most once is
never seeded, and what the drafter learns is the same, only later.

Drafters that capture target layers (EAGLE-3 in a hybrid) get other features from the forward; for them the
prefill computes the logits at once, as before.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from specdec.drafters.base import Drafter
from specdec.engine.sequence import Sequence


@dataclass
class _Kept:
    """One sequence's kept prompt rows: (first position, hidden states) per prefill chunk."""

    parts: list[tuple[int, Tensor]] = field(default_factory=list)
    offered: bool = False  # drafted for once already: the rows go at the next draft

    @property
    def rows(self) -> int:
        return sum(hidden.shape[0] for _, hidden in self.parts)


class PromptSeeds:
    def __init__(self, drafter: Drafter, lm_head: nn.Module) -> None:
        self.drafter = drafter
        self.lm_head = lm_head
        self.deferred = drafter.prefill_logit_rows > 0 and not drafter.feature_layers
        self._pending: dict[int, _Kept] = {}  # by seq_id

    def needs_hidden(self, has_prefills: bool) -> bool:
        """Does this forward have to return hidden states for the seeds (beyond what the drafter reads)?"""
        return self.deferred and has_prefills

    def keep(self, seq: Sequence, start: int, hidden: Tensor) -> None:
        """Hidden states `[n, H]` of prompt positions `start ..`, for the logits of the sequence's first draft."""
        if hidden.shape[0]:
            self._pending.setdefault(seq.seq_id, _Kept()).parts.append((start, hidden.clone()))

    def hand_over(self, seqs: list[Sequence], max_rows: int = 0) -> None:
        """Compute the kept rows' logits in one LM-head call and give them to the drafter (then forget them),
        for the sequences among `seqs` about to be drafted for the second time or later.

        Not at the first draft: under load the planner drafts for a sequence now and then only to re-measure
        acceptance (exploration), and seeding each such sequence cost `recycle` 4-5% of throughput at 16
        requests at once (0.96x of plain decode with seeds, 1.00x without). At batch 1 the seeds arrive
        one step later.

        `max_rows` (0: no limit) caps the LM-head rows of one call, past the first sequence's: where the
        planner decides (depth or node planning) the engine passes the step's batch width, so seeding never
        costs such a step more LM-head rows than it decodes (with adaptive speculation off it passes none). At
        64 requests at once the planner's first plans drafted for 36 sequences together, and their 576 seed
        rows took 0.8 s, more than two whole steps; a sequence over the cap keeps its rows for a later
        draft (at batch 1 nothing changes: the first sequence always gets all of its rows)."""
        waiting, rows = [], 0
        for seq in seqs:
            kept = self._pending.get(seq.seq_id)
            if kept is None:
                continue
            if not kept.offered:  # its first draft: not yet
                kept.offered = True
                continue
            if max_rows and waiting and rows + kept.rows > max_rows:  # over this step's cap: at a later draft
                continue
            rows += kept.rows
            waiting.append((seq, self._pending.pop(seq.seq_id).parts))
        if not waiting:
            return
        with torch.inference_mode():
            logits = self.lm_head(torch.cat([h for _, parts in waiting for _, h in parts])).float()
        row = 0
        for seq, parts in waiting:
            for start, hidden in parts:
                self.drafter.observe_prefill_logits(seq, start, logits[row: row + hidden.shape[0]])
                row += hidden.shape[0]

    def forget(self, seqs: list[Sequence]) -> None:
        """A finished or preempted sequence's rows (a preempted one is prefilled, and kept, again)."""
        for seq in seqs:
            self._pending.pop(seq.seq_id, None)

    def __len__(self) -> int:
        return len(self._pending)
