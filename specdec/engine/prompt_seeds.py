"""Prompt rows for drafters that learn from the target's logits, computed at a sequence's first draft.

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

import torch
from torch import Tensor, nn

from specdec.drafters.base import Drafter
from specdec.engine.sequence import Sequence


class PromptSeeds:
    def __init__(self, drafter: Drafter, lm_head: nn.Module) -> None:
        self.drafter = drafter
        self.lm_head = lm_head
        self.deferred = drafter.prefill_logit_rows > 0 and not drafter.feature_layers
        self._pending: dict[int, list[tuple[int, Tensor]]] = {}  # seq_id -> (first position, hidden rows)
        self._offered: set[int] = set()  # sequences with kept rows that have been drafted for once

    def needs_hidden(self, has_prefills: bool) -> bool:
        """Does this forward have to return hidden states for the seeds (beyond what the drafter reads)?"""
        return self.deferred and has_prefills

    def keep(self, seq: Sequence, start: int, hidden: Tensor) -> None:
        """Hidden states `[n, H]` of prompt positions `start ..`, for the logits of the sequence's first draft."""
        if hidden.shape[0]:
            self._pending.setdefault(seq.seq_id, []).append((start, hidden.clone()))

    def hand_over(self, seqs: list[Sequence]) -> None:
        """Compute the kept rows' logits in one LM-head call and give them to the drafter (then forget them),
        for the sequences among `seqs` about to be drafted for the second time or later.

        Not at the first draft: under load the planner drafts for a sequence now and then only to re-measure
        acceptance (exploration), and seeding each such sequence cost `recycle` 4-5% of throughput at 16
        requests at once (0.96x of plain decode with seeds, 1.00x without). At batch 1 the seeds arrive
        one step later."""
        waiting = []
        for seq in seqs:
            if seq.seq_id not in self._pending:
                continue
            if seq.seq_id not in self._offered:  # its first draft: not yet
                self._offered.add(seq.seq_id)
                continue
            self._offered.discard(seq.seq_id)
            waiting.append((seq, self._pending.pop(seq.seq_id)))
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
            self._offered.discard(seq.seq_id)

    def __len__(self) -> int:
        return len(self._pending)
