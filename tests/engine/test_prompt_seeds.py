"""PromptSeeds: kept prompt rows reach the drafter at a sequence's second draft, at most a step's cap at a time,
each row once, as the LM head's logits of the hidden states the prefill kept."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch import nn

from specdec.engine.prompt_seeds import PromptSeeds

HIDDEN, VOCAB, ROWS = 8, 11, 16


class Receiver:
    """The drafter side: which rows of which sequence arrived, and their logits."""

    prefill_logit_rows = ROWS
    feature_layers: list[int] = []

    def __init__(self) -> None:
        self.got: list[tuple[int, int, torch.Tensor]] = []  # (seq_id, first position, logits)

    def observe_prefill_logits(self, seq, start: int, logits: torch.Tensor) -> None:
        self.got.append((seq.seq_id, start, logits))


def seeds_for(count: int) -> tuple[PromptSeeds, Receiver, nn.Linear, list, dict[int, torch.Tensor]]:
    torch.manual_seed(0)
    receiver, head = Receiver(), nn.Linear(HIDDEN, VOCAB, bias=False)
    seeds = PromptSeeds(receiver, head)
    seqs = [SimpleNamespace(seq_id=i) for i in range(count)]
    kept = {}
    for seq in seqs:
        kept[seq.seq_id] = torch.randn(ROWS, HIDDEN)
        seeds.keep(seq, 100, kept[seq.seq_id][:10])  # two prefill chunks' rows, positions 100-109 and 110-115
        seeds.keep(seq, 110, kept[seq.seq_id][10:])
    return seeds, receiver, head, seqs, kept


def test_seeds_wait_for_the_second_draft_and_arrive_whole():
    seeds, receiver, head, seqs, kept = seeds_for(2)
    seeds.hand_over(seqs)
    assert receiver.got == [] and len(seeds) == 2  # a first draft (an exploration, under load): nothing yet
    seeds.hand_over(seqs)
    assert len(seeds) == 0
    assert [(i, start, logits.shape[0]) for i, start, logits in receiver.got] == [(0, 100, 10), (0, 110, 6),
                                                                               (1, 100, 10), (1, 110, 6)]
    with torch.no_grad():
        for i, start, logits in receiver.got:
            torch.testing.assert_close(logits, head(kept[i][start - 100: start - 100 + logits.shape[0]]))


def test_a_steps_seed_rows_stay_within_its_cap_and_none_is_lost():
    """Five sequences at their second draft with a cap of 40 rows: two sequences' 32 rows a call (a third
    would make 48), the rest at later drafts; a cap below one sequence's rows still seeds one."""
    seeds, receiver, _, seqs, _ = seeds_for(5)
    seeds.hand_over(seqs, max_rows=40)  # first drafts
    per_call = []
    for _ in range(3):
        before = len(receiver.got)
        seeds.hand_over(seqs, max_rows=40)
        per_call.append(sorted({i for i, _, _ in receiver.got[before:]}))
    assert per_call == [[0, 1], [2, 3], [4]]
    assert len(seeds) == 0
    seeds, receiver, _, seqs, _ = seeds_for(3)
    seeds.hand_over(seqs, max_rows=1)
    seeds.hand_over(seqs, max_rows=1)
    assert {i for i, _, _ in receiver.got} == {0} and len(seeds) == 2
    rows = sum(logits.shape[0] for _, _, logits in receiver.got)
    assert rows == ROWS  # the first sequence gets all of its rows, not a cut
