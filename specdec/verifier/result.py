"""What verification decided for one sequence in one step."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor


@dataclass(frozen=True)
class VerifyResult:
    accepted_nodes: list[int]  # tree node indices from the root (0) along the accepted path
    tokens: list[int]  # tokens emitted this step: the accepted drafted tokens, then the bonus token
    bonus_token: int  # sampled from the target after the last accepted node (or, on rejection, from the residual)
    hidden: Tensor | None = None  # [len(accepted_nodes), H] target hidden states, for feature drafters

    @property
    def num_accepted_drafts(self) -> int:
        return len(self.accepted_nodes) - 1
