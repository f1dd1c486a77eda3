"""`hybrid:<a>+<b>[+...]`: one tree from several drafters, e.g. `hybrid:suffix+recycle`, `hybrid:ngram+draft`.

Retrieval drafters (suffix, ngram) are right rarely but then for many tokens; Token Recycling and model drafters
are right often for a token or two. One tree can hold both kinds of guesses for the price of its node budget.
Every part proposes a scored tree (its own default shape, cut to the spec's depth); the trees merge into one
trie where shared prefixes cost one node (`hybrid_merge.py`), and the `budget` nodes most likely to be
accepted are kept. "Most likely" comes from an online calibration per proposer set, depth and raw-score bin
(`calibration.py`): it starts from each drafter's own claim and moves to what the verifier accepts, so the
budget drifts to whichever drafter is earning it on this workload.

Each node remembers who proposed it (`TokenTree.source`, a bitmask over the parts); the engine counts accepted
tokens per proposer for metrics and `--show-acceptance`. The merged tree is deterministic given the parts'
trees, so it is a one-hot proposal to the verifier: lossless at any temperature, whatever the parts are.
"""

from __future__ import annotations

import torch
from torch import Tensor

from specdec.drafters.base import Drafter, DrafterContext
from specdec.drafters.calibration import AcceptanceCalibration
from specdec.drafters.hybrid_merge import MergedTree, ScoredTree, merge_trees, observe_verification
from specdec.drafters.registry import build_drafter, register_raw
from specdec.engine.sequence import Sequence
from specdec.errors import ConfigError
from specdec.tree.spec import TreeSpec
from specdec.tree.token_tree import TokenTree
from specdec.verifier.result import VerifyResult

STATE_KEY = "hybrid"
FLAT_SCORE = 0.5  # raw score for parts that offer no scores of their own (calibration learns the rest)
DEFAULT_BUDGET = 8
DEFAULT_DEPTH = 8


class HybridDrafter:
    name = "hybrid"
    observes_verification = True

    def __init__(self, parts: list[tuple[str, Drafter]], budget: int = DEFAULT_BUDGET,
                 depth: int = DEFAULT_DEPTH) -> None:
        if len(parts) < 2:
            raise ConfigError("a hybrid drafter needs at least two parts, e.g. hybrid:suffix+recycle")
        featured = [d for _, d in parts if d.needs_hidden_states]
        if len(featured) > 1:
            raise ConfigError("a hybrid drafter can hold at most one drafter that reads the target's features")
        self.parts = parts
        self.calibration = AcceptanceCalibration()
        self.needs_hidden_states = bool(featured)
        self._featured = featured[0] if featured else None
        self.feature_layers: tuple[int, ...] = tuple(getattr(self._featured, "feature_layers", ()) or ())
        self._budget, self._depth = budget, depth
        self._seeded = [d for _, d in parts if getattr(d, "wants_prefill_logits", False)]
        self.wants_prefill_logits = bool(self._seeded)
        # source_names[mask] names the parts that proposed a node (mask bit i = part i)
        self.source_names = [""] + ["+".join(n for i, (n, _) in enumerate(parts) if mask >> i & 1)
                                    for mask in range(1, 1 << len(parts))]

    def default_tree(self) -> TreeSpec:
        return TreeSpec("dynamic", depth=self._depth, topk=4, budget=self._budget)

    # ----------------------------------------------------------------------------------------- proposals
    def propose(self, seqs: list[Sequence], spec: TreeSpec) -> list[TokenTree]:
        if not seqs:
            return []
        proposals = [self._scored(drafter, seqs, spec) for _, drafter in self.parts]
        trees = []
        for i, seq in enumerate(seqs):
            merged = merge_trees([p[i] for p in proposals], self.calibration, spec.budget, spec.depth)
            seq.drafter_state[STATE_KEY] = merged
            trees.append(TokenTree.from_parents(merged.tokens, merged.parents,
                                                source=torch.tensor(merged.sources, dtype=torch.int64)))
        return trees

    @staticmethod
    def _scored(drafter: Drafter, seqs: list[Sequence], spec: TreeSpec) -> list[ScoredTree]:
        own = drafter.default_tree().limited(spec.depth)
        scored = getattr(drafter, "propose_scored", None)
        if scored is not None:
            return scored(seqs, own)
        out = []
        for tree in drafter.propose(seqs, own):
            parents = tree.parent_list
            out.append(ScoredTree(tree.tokens.tolist(), parents, [0.0] + [FLAT_SCORE] * (len(parents) - 1)))
        return out

    # --------------------------------------------------------------------------------------- observation
    def observe_verified(self, seqs: list[Sequence], trees: list[TokenTree], logits: list[Tensor],
                         results: list[VerifyResult]) -> None:
        for seq, tree, result in zip(seqs, trees, results):
            merged: MergedTree | None = seq.drafter_state.pop(STATE_KEY, None)
            if merged is None:
                continue
            # The engine may cut the tree to a depth (planner, context end): the verified tree is then the
            # merged nodes up to its deepest depth, in order.
            deepest = int(tree.depth.max())
            kept = [i for i, d in enumerate(merged.depths) if d <= deepest]
            if len(kept) != len(tree):
                continue
            observe_verification(merged, [kept[a] for a in result.accepted_nodes], self.calibration, kept)
        for _, drafter in self.parts:
            if getattr(drafter, "observes_verification", False):
                drafter.observe_verified(seqs, trees, logits, results)

    def observe_prefill_logits(self, seq: Sequence, start: int, logits: Tensor | None) -> None:
        for drafter in self._seeded:
            drafter.observe_prefill_logits(seq, start, logits)

    def observe_prefill(self, seq: Sequence, start: int, features: Tensor) -> None:
        if self._featured is not None:
            self._featured.observe_prefill(seq, start, features)

    def start(self, seqs: list[Sequence]) -> None:
        for _, drafter in self.parts:
            drafter.start(seqs)

    def commit(self, seqs: list[Sequence], results: list[VerifyResult]) -> None:
        for _, drafter in self.parts:
            drafter.commit(seqs, results)

    def release(self, seqs: list[Sequence]) -> None:
        for seq in seqs:
            seq.drafter_state.pop(STATE_KEY, None)
        for _, drafter in self.parts:
            drafter.release(seqs)


@register_raw("hybrid")
def _build(text: str, ctx: DrafterContext) -> HybridDrafter:
    specs = [s.strip() for s in text.split("+") if s.strip()]
    if len(specs) < 2:
        raise ConfigError("hybrid needs two or more drafters joined by '+', e.g. hybrid:suffix+recycle")
    parts = []
    for spec in specs:
        if spec.split(":")[0].strip().lower() == "hybrid":
            raise ConfigError("a hybrid drafter cannot contain another hybrid")
        drafter = build_drafter(spec, ctx)
        parts.append((drafter.name, drafter))
    names = [n for n, _ in parts]
    if len(set(names)) != len(names):
        raise ConfigError(f"hybrid parts must be different drafters, got {'+'.join(names)}")
    return HybridDrafter(parts)
