"""One timed generate call, the unit every method of the bench suite (ours and transformers) reports."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Run:
    """One generate call (or the sum of a conversation's turns) by one method."""

    tokens: list[int]  # generated token ids (the EOS that stopped a turn included)
    seconds: float  # wall time of the call(s), prefill included
    decoded: int  # tokens counted by tau's numerator
    steps: int  # target forwards counted by tau's denominator
    proposed: list[int] = field(default_factory=list)  # [d] target steps whose tree reached depth d+1 (ours only)
    accepted: list[int] = field(default_factory=list)  # [d] of those, steps that accepted a token at depth d+1
    draft_seconds: float = 0.0  # of `seconds`, the drafter's own work (proposing and its bookkeeping; ours only)

    def __add__(self, other: "Run") -> "Run":
        return Run(self.tokens + other.tokens, self.seconds + other.seconds, self.decoded + other.decoded,
                   self.steps + other.steps, add_lists(self.proposed, other.proposed),
                   add_lists(self.accepted, other.accepted), self.draft_seconds + other.draft_seconds)


def add_lists(a: list[int], b: list[int]) -> list[int]:
    """Element-wise sum of two per-depth count lists of any lengths."""
    return [(a[i] if i < len(a) else 0) + (b[i] if i < len(b) else 0) for i in range(max(len(a), len(b)))]


def acceptance_by_depth(runs: list[Run]) -> list[float]:
    """Pooled alpha_d = steps that accepted depth d / steps whose tree reached depth d (the engine's definition,
    RequestMetrics.acceptance_by_depth, summed over runs before dividing)."""
    proposed: list[int] = []
    accepted: list[int] = []
    for run in runs:
        proposed, accepted = add_lists(proposed, run.proposed), add_lists(accepted, run.accepted)
    return [a / p if p else 0.0 for a, p in zip(accepted, proposed)]


class DepthCounter:
    """An engine step observer counting, per depth, the trees that reached it and the steps that accepted it."""

    def __init__(self) -> None:
        self.proposed: list[int] = []
        self.accepted: list[int] = []

    def __call__(self, seq, tree, result) -> None:
        depth = int(tree.depth.max())
        self.proposed = add_lists(self.proposed, [1] * depth)
        self.accepted = add_lists(self.accepted, [1] * min(result.num_accepted_drafts, depth))


def parse_methods(text: str) -> list[tuple[str, str | None]]:
    """`"ngram|chain:k=5;draft"` -> [("ngram", "chain:k=5"), ("draft", None)]: methods separated by ';',
    a '|' between a drafter spec and its tree spec."""
    parsed = []
    for method in filter(None, (m.strip() for m in text.split(";"))):
        drafter, _, tree = method.partition("|")
        parsed.append((drafter.strip(), tree.strip() or None))
    return parsed
