"""Raw acceptance counts gathered from verify steps, and the rates derived from them.

Every rate in a report (tau, alpha by depth, acceptance by sibling rank) is a ratio of integer counts kept
here, so reports can be merged across prompts or categories exactly, re-checked by hand, and saved without
losing anything.

Words:
* a *step* is one target pass for one sequence; it emits its accepted drafted tokens plus one bonus token;
* a node at depth d is *offered* when the accepted path reached its parent (at depth d-1);
* the *rank* of a node is its position among its parent's children (`TokenTree.children`), which is the order
  the drafter put them in: rank 0 is the drafter's first choice.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from specdec.tree.token_tree import TokenTree
from specdec.verifier.result import VerifyResult


@dataclass
class AcceptanceStats:
    steps: int = 0  # verify steps (target passes, per sequence)
    tokens: int = 0  # tokens those steps emitted, the bonus included (tau's numerator)
    drafted_nodes: int = 0  # drafted tree nodes proposed over all steps (the root not counted)
    accepted_hist: list[int] = field(default_factory=list)  # [a] steps that accepted exactly a drafted tokens
    # [d-1]: steps whose accepted path reached a node at depth d-1 that had children (a depth-d offer) ...
    depth_offered: list[int] = field(default_factory=list)
    depth_accepted: list[int] = field(default_factory=list)  # ... and that accepted one of those children
    # [d-1][r]: times a rank-r child was offered under an accepted depth-(d-1) node, and times it was accepted
    rank_offered: list[list[int]] = field(default_factory=list)
    rank_accepted: list[list[int]] = field(default_factory=list)
    requests: int = 0
    generated_tokens: int = 0  # tokens returned to the user (stops may cut a step's last tokens)
    draft_time_s: float = 0.0  # summed over requests (a batched step counts once per request in it)
    verify_time_s: float = 0.0

    # ---------------------------------------------------------------------------------------- gathering
    def observe(self, tree: TokenTree, result: VerifyResult) -> None:
        """Count one verify step."""
        accepted = result.accepted_nodes
        drafts = len(accepted) - 1
        self.steps += 1
        self.tokens += len(result.tokens)
        self.drafted_nodes += len(tree) - 1
        _bump(self.accepted_hist, drafts)
        on_path = set(accepted)
        for d, node in enumerate(accepted, start=1):  # `node` is at depth d-1; its children are at depth d
            kids = tree.children[node]
            if not kids:
                continue
            _bump(self.depth_offered, d - 1)
            took = d < len(accepted)
            if took:
                _bump(self.depth_accepted, d - 1)
            while len(self.rank_offered) < d:
                self.rank_offered.append([])
                self.rank_accepted.append([])
            for rank, child in enumerate(kids):
                _bump(self.rank_offered[d - 1], rank)
                if child in on_path:
                    _bump(self.rank_accepted[d - 1], rank)
                else:
                    _bump(self.rank_accepted[d - 1], rank, 0)
        while len(self.depth_accepted) < len(self.depth_offered):
            self.depth_accepted.append(0)

    def add_request(self, num_generated: int, draft_time_s: float, verify_time_s: float) -> None:
        self.requests += 1
        self.generated_tokens += num_generated
        self.draft_time_s += draft_time_s
        self.verify_time_s += verify_time_s

    def merge(self, other: "AcceptanceStats") -> "AcceptanceStats":
        """The counts of both, as if gathered together."""
        out = AcceptanceStats.from_dict(self.to_dict())
        out.steps += other.steps
        out.tokens += other.tokens
        out.drafted_nodes += other.drafted_nodes
        _add(out.accepted_hist, other.accepted_hist)
        _add(out.depth_offered, other.depth_offered)
        _add(out.depth_accepted, other.depth_accepted)
        for mine, theirs in ((out.rank_offered, other.rank_offered), (out.rank_accepted, other.rank_accepted)):
            while len(mine) < len(theirs):
                mine.append([])
            for row, extra in zip(mine, theirs):
                _add(row, extra)
        out.requests += other.requests
        out.generated_tokens += other.generated_tokens
        out.draft_time_s += other.draft_time_s
        out.verify_time_s += other.verify_time_s
        return out

    # ------------------------------------------------------------------------------------------- rates
    @property
    def tau(self) -> float:
        """Mean tokens emitted per target step, the bonus counted (1.0 = no speculation)."""
        return self.tokens / self.steps if self.steps else 0.0

    @property
    def mean_accepted(self) -> float:
        """Mean drafted tokens accepted per step (tau - 1)."""
        return sum(a * n for a, n in enumerate(self.accepted_hist)) / self.steps if self.steps else 0.0

    @property
    def alpha_by_depth(self) -> list[float]:
        """[d-1]: P(a depth-d node is accepted | the path reached depth d-1 and the tree offered children there)."""
        return [a / o if o else 0.0 for a, o in zip(self.depth_accepted, self.depth_offered)]

    @property
    def acceptance_by_rank(self) -> list[list[float]]:
        """[d-1][r]: P(the rank-r child is accepted | its parent at depth d-1 was, and the tree offered it)."""
        return [[a / o if o else 0.0 for a, o in zip(acc, off)]
                for acc, off in zip(self.rank_accepted, self.rank_offered)]

    @property
    def mean_tree_nodes(self) -> float:
        return self.drafted_nodes / self.steps if self.steps else 0.0

    @property
    def draft_fraction(self) -> float:
        """Share of draft time in draft + verify time."""
        total = self.draft_time_s + self.verify_time_s
        return self.draft_time_s / total if total > 0 else 0.0

    def summary(self) -> dict[str, Any]:
        """The derived rates, for people reading a JSON file (never read back: the counts are the truth)."""
        return {
            "tau": self.tau, "mean_accepted": self.mean_accepted, "alpha_by_depth": self.alpha_by_depth,
            "acceptance_by_rank": self.acceptance_by_rank, "mean_tree_nodes": self.mean_tree_nodes,
            "draft_fraction": self.draft_fraction,
        }

    # ------------------------------------------------------------------------------------------------ io
    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_dict(data: dict[str, Any]) -> "AcceptanceStats":
        known = AcceptanceStats.__dataclass_fields__
        out = AcceptanceStats(**{k: v for k, v in data.items() if k in known})
        out.accepted_hist = list(out.accepted_hist)
        out.depth_offered, out.depth_accepted = list(out.depth_offered), list(out.depth_accepted)
        out.rank_offered = [list(r) for r in out.rank_offered]
        out.rank_accepted = [list(r) for r in out.rank_accepted]
        return out


def _bump(counts: list[int], index: int, by: int = 1) -> None:
    while len(counts) <= index:
        counts.append(0)
    counts[index] += by


def _add(into: list[int], extra: list[int]) -> None:
    while len(into) < len(extra):
        into.append(0)
    for i, value in enumerate(extra):
        into[i] += value
