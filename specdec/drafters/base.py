"""The drafter protocol: what every proposer of token trees offers the engine.

The engine calls, per step: `propose` for the running sequences, one target pass, then `commit` with what the
verifier accepted so the drafter can advance or roll back its own state. Drafters never touch the target's
KV cache and never see the acceptance rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch

from specdec.config import EngineConfig
from specdec.engine.sequence import Sequence
from specdec.tree.token_tree import TokenTree
from specdec.tree.spec import TreeSpec
from specdec.verifier.result import VerifyResult


@runtime_checkable
class Drafter(Protocol):
    name: str
    needs_hidden_states: bool

    def default_tree(self) -> TreeSpec:
        """The tree shape used when the user names none."""
        ...

    def start(self, seqs: list[Sequence]) -> None:
        """Set up per-sequence state for newly admitted sequences."""
        ...

    def propose(self, seqs: list[Sequence], spec: TreeSpec) -> list[TokenTree]:
        """One tree per sequence, rooted at its last token, within `spec`'s node budget."""
        ...

    def commit(self, seqs: list[Sequence], results: list[VerifyResult]) -> None:
        """Advance or roll back the drafter's own state after verification."""
        ...

    def release(self, seqs: list[Sequence]) -> None:
        """Free per-sequence state (finished, aborted or preempted sequences)."""
        ...


class FeatureDrafter(Protocol):
    """A drafter that reads the target's features (Medusa, EAGLE): `needs_hidden_states = True`.

    The engine then asks the target pass for features and hands them over twice:
    * after each prefill chunk, `observe_prefill(seq, start, features)` with the features of prompt positions
      `start .. start + n - 1` (a preempted sequence is released and observed again from 0);
    * after each verify step, in `VerifyResult.hidden`: the features at the accepted nodes (root first).
    Features are the final-norm hidden states `[n, H]`, or, if the drafter sets `feature_layers` (EAGLE-3),
    the residual streams entering those target layers, concatenated `[n, len(feature_layers) * H]`.
    """

    feature_layers: tuple[int, ...]

    def observe_prefill(self, seq: Sequence, start: int, features: torch.Tensor) -> None:
        ...


@dataclass
class DrafterContext:
    """What a drafter factory may use to build itself."""

    target: Any  # specdec.models.LoadedModel
    engine: EngineConfig
    device: torch.device
    dtype: torch.dtype
    quantize: str | None


class StatelessDrafter:
    """Base for drafters that keep no per-sequence state (n-gram, none)."""

    needs_hidden_states = False

    def start(self, seqs: list[Sequence]) -> None:
        pass

    def commit(self, seqs: list[Sequence], results: list[VerifyResult]) -> None:
        pass

    def release(self, seqs: list[Sequence]) -> None:
        pass
