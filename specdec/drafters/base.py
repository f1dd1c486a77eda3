"""The drafter protocol: every hook the engine calls on a proposer of token trees, and nothing else.

Per step the engine calls `propose` for the decoding sequences, runs one target pass over every tree, verifies,
then calls `commit` with what the verifier accepted so the drafter can advance or roll back its own state.
After each prefill chunk it calls `observe_prefill` (with the target's features when `needs_features`).
`release` frees a sequence's drafter state when it finishes, is aborted or is preempted. Drafters never touch
the target's KV cache and never see the acceptance rule.

Per-sequence state lives in `seq.drafter_state`, one typed slot per drafter object (`slot`/`peek`/`drop`), so
a hybrid of several drafters keeps each one's state apart without string keys.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol, TypeVar, runtime_checkable

import torch
from torch import Tensor, nn

from specdec.config import EngineConfig
from specdec.engine.sequence import Sequence
from specdec.models.loader import LoadedModel
from specdec.tree.spec import TreeSpec
from specdec.tree.token_tree import TokenTree
from specdec.verifier.result import VerifyResult

State = TypeVar("State")


@runtime_checkable
class Drafter(Protocol):
    name: str
    # Feature drafters (Medusa, EAGLE) read the target's features. The engine then asks the target pass for them
    # and hands them over after each prefill chunk (`observe_prefill`) and, for the accepted nodes of each verify
    # step, in `VerifyResult.hidden`. Features are the final-norm hidden states `[n, H]`, or, when
    # `feature_layers` names target layers (EAGLE-3), the residual streams entering them, concatenated
    # `[n, len(feature_layers) * H]`.
    needs_features: bool
    feature_layers: tuple[int, ...]
    # Model-free drafters that learn from the target (Token Recycling) read the verify pass's logits at every
    # tree node (`observe_verified`), and optionally the logits of the prompt's last `prefill_logit_rows`
    # positions (`observe_prefill_logits`; each costs an LM-head row). A tree built by several drafters carries
    # `TokenTree.source`, an index into `source_names` (hybrid), so metrics can say who proposed each accepted
    # token.
    observes_verification: bool
    prefill_logit_rows: int
    source_names: tuple[str, ...]
    # Drafters whose proposals cost next to nothing (suffix, n-gram, Token Recycling: lookups, no model call)
    # propose for every sequence first; then the planner verifies only the nodes whose calibrated chance of
    # acceptance pays for their row (`SpeculationPlanner.plan_nodes`). Model drafters are planned by depth
    # before they draft, since their drafting is what costs.
    plans_by_node: bool

    def default_tree(self) -> TreeSpec:
        """The tree shape used when the user names none."""
        ...

    def propose(self, seqs: list[Sequence], spec: TreeSpec) -> list[TokenTree]:
        """One tree per sequence, rooted at its last token, within `spec`'s node budget."""
        ...

    def observe_prefill(self, seq: Sequence, start: int, features: Tensor | None) -> None:
        """A prefill chunk of prompt positions `start ..` ran; `features` are the target's for those positions
        (None unless `needs_features`). A preempted sequence is released and observed again from 0."""
        ...

    def observe_prefill_logits(self, seq: Sequence, start: int, logits: Tensor | None) -> None:
        """Logits of prompt positions `start ..` (the last rows of a prefill chunk, within the prompt's last
        `prefill_logit_rows` positions)."""
        ...

    def observe_verified(self, seqs: list[Sequence], trees: list[TokenTree], logits: list[Tensor],
                         results: list[VerifyResult]) -> None:
        """The target's logits at every node of each verified tree (if `observes_verification`)."""
        ...

    def commit(self, seqs: list[Sequence], results: list[VerifyResult]) -> None:
        """Advance or roll back the drafter's own state after verification."""
        ...

    def release(self, seqs: list[Sequence]) -> None:
        """Free per-sequence state (finished, aborted or preempted sequences)."""
        ...

    def weights(self) -> list[nn.Module]:
        """The modules whose weights the drafter reads every step (moved onto huge pages at load)."""
        ...


@dataclass(frozen=True)
class DrafterContext:
    """What a drafter factory may use to build itself."""

    target: LoadedModel
    engine: EngineConfig
    device: torch.device
    dtype: torch.dtype
    quantize: str | None


class DrafterBase:
    """Defaults for the hooks a drafter does not need: no features, nothing to observe or commit, and
    `release` drops the drafter's slot (override `free` to give back resources the state holds)."""

    name = "drafter"
    needs_features = False
    feature_layers: tuple[int, ...] = ()
    observes_verification = False
    prefill_logit_rows = 0
    source_names: tuple[str, ...] = ()
    plans_by_node = False

    def observe_prefill(self, seq: Sequence, start: int, features: Tensor | None) -> None:
        pass

    def observe_prefill_logits(self, seq: Sequence, start: int, logits: Tensor | None) -> None:
        pass

    def observe_verified(self, seqs: list[Sequence], trees: list[TokenTree], logits: list[Tensor],
                         results: list[VerifyResult]) -> None:
        pass

    def commit(self, seqs: list[Sequence], results: list[VerifyResult]) -> None:
        pass

    def release(self, seqs: list[Sequence]) -> None:
        for seq in seqs:
            state = seq.drafter_state.drop(self)
            if state is not None:
                self.free(state)

    def free(self, state: object) -> None:
        """Give back what one sequence's state holds (blocks of a drafter's own cache, say)."""

    def weights(self) -> list[nn.Module]:
        """The modules whose weights this drafter reads every step (the LLM moves them onto huge pages:
        specdec/models/huge_pages.py); none for drafters without a model."""
        return []

    def slot(self, seq: Sequence, make: Callable[[], State]) -> State:
        """This drafter's state for `seq`, made on first use."""
        return seq.drafter_state.get(self, make)
