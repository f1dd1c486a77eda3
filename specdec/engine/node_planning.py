"""Node planning: lookup drafters draft for every sequence first; the planner verifies the nodes that pay.

A drafter whose proposals cost next to nothing (suffix, n-gram, Token Recycling: `Drafter.plans_by_node`) can
show the planner its whole tree before anything is decided. Each node's raw score (a suffix count ratio, a
recycled probability; a flat score for drafters without one) is calibrated online into P(accepted | parent
accepted) per depth and score bin, so each node has an estimated probability of lying on the accepted path,
and `SpeculationPlanner.plan_nodes` keeps, across the batch, the nodes whose rows pay for themselves. At
batch 1 on this CPU that is nearly every node; at batch 12 only near-certain ones. The depth plan, which
model drafters keep (their drafting is what costs), can only say how deep a sequence's history says to go.

Drafting itself is priced too (`SpeculationPlanner.should_draft`): where recent drafted steps at this batch
size won less goodput than drafting costs, the step runs as plain decode, with a drafted step now and then to
measure again. That is what keeps a lookup drafter at plain decode's speed under saturation.
"""

from __future__ import annotations

import time

from specdec.drafters.base import Drafter
from specdec.drafters.hybrid_merge import MergedTree, merge_trees, observe_verification
from specdec.drafters.scored import scored_proposals
from specdec.engine.planner import SpeculationPlanner, is_pinned
from specdec.engine.sequence import Sequence
from specdec.tree.spec import TreeSpec
from specdec.tree.token_tree import TokenTree
from specdec.verifier.result import VerifyResult

PINNED_PROB = 0.5  # what a pinned tree's nodes are priced at beside the ranked ones (they are verified anyway)


class NodePlannedDrafting:
    def __init__(self, drafter: Drafter, spec: TreeSpec, planner: SpeculationPlanner) -> None:
        self.drafter, self.spec, self.planner = drafter, spec, planner
        self._ranked: dict[int, tuple[MergedTree, int]] = {}  # seq id -> its ranked draft, nodes verified
        self._drafted: tuple[int, float] | None = None  # this step drafted: (sequences, seconds proposing)

    def trees(self, seqs: list[Sequence], prefill_tokens: int) -> list[TokenTree]:
        """This step's tree per sequence: the best prefix of its ranked draft that the plan verifies.

        A pinned (seeded sampled) sequence verifies its drafter's tree exactly as proposed: ranking would make
        the tree's shape, and so the request's output, depend on what the calibration learnt from others."""
        if not self.planner.should_draft(seqs, prefill_tokens):
            return [TokenTree.chain([seq.last_token]) for seq in seqs]
        spec, calibration = self.spec, self.planner.calibration
        start = time.perf_counter()
        pinned = [is_pinned(seq) for seq in seqs]
        ranked = iter([merge_trees([scored], calibration, spec.budget, spec.depth) for scored in
                       scored_proposals(self.drafter, [s for s, pin in zip(seqs, pinned) if not pin], spec)])
        fixed = iter(self.drafter.propose([s for s, pin in zip(seqs, pinned) if pin], spec))
        drafts: list[MergedTree | TokenTree] = [next(fixed) if pin else next(ranked) for pin in pinned]
        self._drafted = len(seqs), time.perf_counter() - start
        probs = [[PINNED_PROB] * (len(d) - 1) if isinstance(d, TokenTree) else d.probs[1:] for d in drafts]
        counts = self.planner.plan_nodes(seqs, probs, prefill_tokens)
        trees = []
        for seq, draft, count in zip(seqs, drafts, counts):
            if isinstance(draft, TokenTree):
                trees.append(draft)
                continue
            self._ranked[seq.seq_id] = draft, count
            trees.append(TokenTree.from_parents(draft.tokens[: count + 1], draft.parents[: count + 1]))
        return trees

    def observe(self, seqs: list[Sequence], trees: list[TokenTree], results: list[VerifyResult],
                after_seconds: float) -> None:
        """After verification: the step's drafting cost and measured gain for the drafting decision, and which
        verified nodes were accepted for the calibration (skipped for a tree the context's end cut, whose nodes
        no longer line up with the ranked ones).

        The drafting cost is the proposal plus the drafter's reading of the verified step (`after_seconds`:
        Token Recycling's top-k of every verified row, the tries' updates), which a plain step skips once the
        planner is idle. It is no small part: at 16 requests at once `hybrid:suffix+recycle`'s reading of a
        drafted step took about as long as its proposing, 1-2 ms each of a 31-45 ms step (`python
        bench/step_log.py --level 16`), so priced without it drafting looked about half as dear as it was."""
        if self._drafted is not None:
            drafting, seconds = self._drafted
            self._drafted = None
            self.planner.observe_draft(1, seconds + after_seconds, drafting)
            self.planner.observe_gain(len(trees), sum(len(tree) - 1 for tree in trees),
                                      sum(result.num_accepted_drafts for result in results),
                                      pinned=any(map(is_pinned, seqs)))
        calibration = self.planner.calibration
        for seq, tree, result in zip(seqs, trees, results):
            ranked, count = self._ranked.pop(seq.seq_id, (None, 0))
            if ranked is not None and len(tree) == count + 1:
                observe_verification(ranked, result.accepted_nodes, calibration, list(range(1, count + 1)))
