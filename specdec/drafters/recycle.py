"""`recycle[:k=8,tree=<template>,min_prob=0]`: Token Recycling (Luo et al., 2024), speculation from the target's
own discarded logits.

Each verify pass computes the target's logits at every tree node; the top-k of each node's row is written into
the adjacency matrix row of that node's token, with the probabilities the target gave them
(`recycle_matrix.py`), and the next tree is grown from that matrix, from the root, with no model call:

* a dynamic tree spec (the default, `dynamic:depth=6,topk=4,budget=8`) grows best-first on the recycled
  probabilities: the `budget` paths whose product of probabilities is highest, at most `topk` children per
  node, none below `min_prob`. The budget goes where the target was sure last time;
* a static spec (`tree=<name|file>`, or `--tree static:...`) expands a fixed template of ranks level by
  level with vectorised lookups (the paper's method); `chain:k=N` follows rank 0.

The matrix belongs to the drafter, i.e. to the engine: it persists across requests (what one request taught
helps the next), costs `V * k * 8` bytes (3 MiB for SmolLM2 at k = 8), and keeps no per-sequence state at all,
so rollback and preemption leave nothing behind. `reset()` forgets it. Proposals are deterministic, i.e.
one-hot to the verifier: lossless at any temperature.
"""

from __future__ import annotations

import torch
from torch import Tensor

from specdec.drafters.base import DrafterContext
from specdec.drafters.hybrid_merge import ScoredTree
from specdec.drafters.recycle_matrix import AdjacencyMatrix, TemplateLayout, template_layout
from specdec.drafters.registry import float_arg, int_arg, register, reject_unknown
from specdec.engine.sequence import Sequence
from specdec.tree.spec import TreeSpec, parse_tree_spec
from specdec.tree.token_tree import TokenTree
from specdec.verifier.result import VerifyResult

DEFAULT_TREE = "dynamic:depth=6,topk=4,budget=8"


class RecycleDrafter:
    name = "recycle"
    needs_hidden_states = False
    observes_verification = True  # the engine hands over the logits of every verified node

    def __init__(self, vocab_size: int, k: int = 8, tree: str = DEFAULT_TREE, min_prob: float = 0.0) -> None:
        self.matrix = AdjacencyMatrix(vocab_size, k)
        self.min_prob = min_prob
        self._default = parse_tree_spec(tree if ":" in tree else f"static:{tree}")

    def default_tree(self) -> TreeSpec:
        return self._default

    def reset(self) -> None:
        self.matrix.reset()

    # ----------------------------------------------------------------------------------------- proposals
    def propose(self, seqs: list[Sequence], spec: TreeSpec) -> list[TokenTree]:
        return [TokenTree.from_parents(tokens, parents) for tokens, parents, _ in self._expand(seqs, spec)]

    def propose_scored(self, seqs: list[Sequence], spec: TreeSpec) -> list[ScoredTree]:
        """The same trees with each node's recycled target probability as its raw score (for hybrid trees)."""
        return [ScoredTree(tokens, parents, scores) for tokens, parents, scores in self._expand(seqs, spec)]

    def _expand(self, seqs: list[Sequence], spec: TreeSpec) -> list[tuple[list[int], list[int], list[float]]]:
        if spec.kind == "dynamic":  # best-first on the recycled probabilities
            return [self.matrix.expand_best_first(seq.last_token, spec.budget, spec.depth, self.min_prob,
                                                  spec.topk) for seq in seqs]
        layout = self._layout(spec)
        out = []
        for seq in seqs:
            tokens, parents = self.matrix.expand(seq.last_token, layout, spec.depth)
            out.append((tokens, parents, [0.0] + [self._prob_of(tokens[p], t)
                                                  for t, p in zip(tokens[1:], parents[1:])]))
        return out

    def _prob_of(self, parent_token: int, token: int) -> float:
        row = self.matrix.table[parent_token]
        hit = (row == token).nonzero()[0]
        return float(self.matrix.probs[parent_token, hit[0]]) if hit.size else 0.0

    def _layout(self, spec: TreeSpec) -> TemplateLayout:
        if spec.kind == "static":
            return template_layout(spec.choices)
        return template_layout(tuple((0,) * d for d in range(1, spec.depth + 1)))

    # --------------------------------------------------------------------------------------- observation
    def observe_verified(self, seqs: list[Sequence], trees: list[TokenTree], logits: list[Tensor],
                         results: list[VerifyResult]) -> None:
        """Recycle every verified row into the matrix, the accepted path last (its context really happened)."""
        tokens, rows = [], []
        for tree, row_logits, result in zip(trees, logits, results):
            accepted = result.accepted_nodes
            on_path = set(accepted)
            order = [i for i in range(len(tree)) if i not in on_path] + accepted
            index = torch.tensor(order, dtype=torch.int64)
            tokens.append(tree.tokens[index])
            rows.append(row_logits[index])
        if tokens:
            self.matrix.update(torch.cat(tokens), torch.cat(rows))

    def start(self, seqs: list[Sequence]) -> None:
        pass

    def commit(self, seqs: list[Sequence], results: list[VerifyResult]) -> None:
        pass  # no per-sequence state: the matrix is shared, and updated in observe_verified

    def release(self, seqs: list[Sequence]) -> None:
        pass


@register("recycle")
def _build(args: dict[str, str], ctx: DrafterContext) -> RecycleDrafter:
    k = int_arg(args, "k", 8)
    tree = args.pop("tree", DEFAULT_TREE)
    min_prob = float_arg(args, "min_prob", 0.0, 0.0, 1.0)
    reject_unknown("recycle", args)
    return RecycleDrafter(ctx.target.model.config.vocab_size, k, tree, min_prob)
