"""Scored proposals: a drafter's tree with its own guess at how likely each node is to be accepted.

Hybrid trees rank several drafters' nodes against one budget by these scores, and the engine's node planner
(`SpeculationPlanner.plan_nodes`) verifies only the nodes whose calibrated probability pays for their row.
A drafter that can score its nodes implements `propose_scored`; any other drafter's nodes get one flat score,
and the calibration (per depth) learns the rest from what the verifier accepts.
"""

from __future__ import annotations

from specdec.drafters.base import Drafter
from specdec.drafters.hybrid_merge import ScoredTree
from specdec.engine.sequence import Sequence
from specdec.tree.spec import TreeKind, TreeSpec
from specdec.tree.token_tree import TokenTree

FLAT_SCORE = 0.5  # raw score for drafters that offer no scores of their own


def scored_proposals(drafter: Drafter, seqs: list[Sequence], spec: TreeSpec) -> list[ScoredTree]:
    """`drafter`'s trees for `seqs` in the shape of `spec`, each node with a raw score.

    Chains and dynamic trees say how deep and how large a proposal may be, which every drafter can follow; a
    static template belongs to the drafter it was made for, so another drafter proposes its own shape, cut to
    the spec's depth."""
    own = spec if spec.kind in (TreeKind.CHAIN, TreeKind.DYNAMIC) else drafter.default_tree().limited(spec.depth)
    scored = getattr(drafter, "propose_scored", None)  # a lookup: a runtime Protocol check cost 15 us a call
    if scored is not None:
        return scored(seqs, own)
    return [flat_scored(tree) for tree in drafter.propose(seqs, own)]


def flat_scored(tree: TokenTree) -> ScoredTree:
    """`tree` with the flat raw score on every node: for a drafter that makes no claim per node."""
    parents = tree.parent_list
    return ScoredTree(tree.token_list, parents, [0.0] + [FLAT_SCORE] * (len(parents) - 1))
