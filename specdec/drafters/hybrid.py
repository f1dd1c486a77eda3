"""`hybrid:<a>+<b>[+...][+min_prob=P]`: one tree from several drafters, e.g. `hybrid:suffix+recycle`.

Retrieval drafters (suffix, ngram) are right rarely but then for many tokens; Token Recycling and model drafters
are right often for a token or two. One tree can hold both kinds of guesses for the price of its node budget.
Every part proposes a scored tree (its own default shape, cut to the spec's depth); the trees merge into one
trie where shared prefixes cost one node (`hybrid_merge.py`), and the `budget` nodes most likely to be
accepted are kept. "Most likely" comes from an online calibration per proposer set, depth and raw-score bin
(`calibration.py`): it starts from each drafter's own claim and moves to what the verifier accepts, so the
budget drifts to whichever drafter is earning it on this workload. With `+min_prob=P`, a node whose estimated
probability of being on the accepted path is below P stays out even with budget left (its row may cost more
than the token it is unlikely to add).

Each node remembers who proposed it (`TokenTree.source`, a bitmask over the parts); the engine counts accepted
tokens per proposer for metrics and `--show-acceptance`. The merged tree is deterministic given the parts'
trees, so it is a one-hot proposal to the verifier: lossless at any temperature, whatever the parts are.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from specdec.drafters.base import Drafter, DrafterBase, DrafterContext
from specdec.drafters.calibration import AcceptanceCalibration
from specdec.drafters.hybrid_merge import MergedTree, merge_trees, observe_verification
from specdec.drafters.registry import build_drafter, float_arg, int_arg, register_raw
from specdec.drafters.scored import scored_proposals
from specdec.engine.sequence import Sequence
from specdec.errors import ConfigError
from specdec.kernels import cpu as cpu_kernels
from specdec.spec_strings import parse_spec
from specdec.tree.spec import TreeSpec, chain, dynamic
from specdec.tree.token_tree import TokenTree
from specdec.verifier.result import VerifyResult

# A three-node tree by default: on this CPU every verified row costs (issue 14). hybrid:suffix+recycle gave 1.17x
# on the test split with it, 0.92x with the 8-node tree it used to default to.
DEFAULT_TREE = chain(3)
# Where the int8 linears take up to 16 rows for the price of one (AMX, `cpu.flat_verified_rows`), a 6-node tree
# pays more than the chain: 1.50-1.56x against 1.44-1.49x on the dev split in two runs, where it was chosen, and
# 1.45-1.49x against 1.40-1.43x on the test split (bench/results/suite_amx_dev, suite_amx).
FLAT_ROWS_TREE = dynamic(depth=6, topk=4, budget=6)
# Where the int8 linears read blocks of 16 channels with VNNI (AVX-512 without AMX: `cpu.blocked_weights`), 6 rows
# cost the linears 1.05x one row but attention still pays for each: a 4-node tree edges the chain, 1.46x against
# 1.43x over seven and six dev-split runs on a Zen 4 EPYC (the 6-node tree 1.32-1.44x), 1.39x against 1.35x on
# the test split (tau 1.94 against 1.73; bench/results/suite_zen4_trees/).
VNNI_ROWS_TREE = dynamic(depth=4, topk=3, budget=4)
# Options a part takes inside a hybrid unless its spec gives them. Recycle's prompt seed rows (LM-head rows) buy it
# tau alone (dev split, batch 1: 1.41 against 1.30 without), but next to suffix, which copies from the prompt
# itself, hybrid:suffix+recycle reached tau 1.70 with them and 1.67 without, for 7.3% against 6.4% of a step
# spent drafting (1.24x and 1.28x of plain), and 0.99x against 1.05x of plain at 16 requests at once
# (bench/results/recycle_seed_rows/hybrid/).
PART_DEFAULTS = {"recycle": {"seed": "0"}}
# With `min_prob`, the calibration's standard errors of optimism (AcceptanceCalibration.optimism): a node kind it
# rates below the cut is never verified, so without a bonus for little evidence it would never learn better.
# Chosen on the dev split (2.0 against 1.0, two runs each; bench/results/hybrid_min_prob/README.md).
CUT_OPTIMISM = 2.0


@dataclass
class _State:
    merged: MergedTree | None = None  # the last proposal, until its verification is observed


class HybridDrafter(DrafterBase):
    name = "hybrid"
    observes_verification = True

    def __init__(self, parts: list[tuple[str, Drafter]], depths: list[int | None] | None = None,
                 min_prob: float = 0.0) -> None:
        """`depths[i]` caps how deep part i drafts (`hybrid:suffix+eagle:depth=2`); None: the tree's depth.
        `min_prob` (`hybrid:suffix+recycle+min_prob=0.1`): nodes whose estimated probability of being on the
        accepted path is lower stay out of the tree even with budget left.

        Off by default: at 0.1 on a Zen 4 EPYC, where a 4-node tree's rows cost about 5% of a step each, steps
        got 7% cheaper and accepted 5-7% fewer tokens, as the calibration never saw the nodes left out; with the
        cut's optimism (CUT_OPTIMISM) acceptance held, but speed stayed within the runs' spread of no cut (-0.02
        to +0.04 in two test runs; bench/results/hybrid_min_prob/)."""
        if len(parts) < 2:
            raise ConfigError("a hybrid drafter needs at least two parts, e.g. hybrid:suffix+recycle")
        featured = [d for _, d in parts if d.needs_features]
        if len(featured) > 1:
            raise ConfigError("a hybrid drafter can hold at most one drafter that reads the target's features")
        self.parts = parts
        self.depths = list(depths) if depths is not None else [None] * len(parts)
        self.min_prob = min_prob
        # nodes left out are never verified: with a cut, rate the little-tried kinds up until they have been
        self.calibration = AcceptanceCalibration(optimism=CUT_OPTIMISM if min_prob > 0.0 else 0.0)
        self.needs_features = bool(featured)
        self._featured = featured[0] if featured else None
        self.feature_layers = tuple(self._featured.feature_layers) if self._featured is not None else ()
        self._seeded = [d for _, d in parts if d.prefill_logit_rows]
        self.prefill_logit_rows = max((d.prefill_logit_rows for d in self._seeded), default=0)
        # source_names[mask] names the parts that proposed a node (mask bit i = part i)
        self.source_names = ("",) + tuple("+".join(n for i, (n, _) in enumerate(parts) if mask >> i & 1)
                                          for mask in range(1, 1 << len(parts)))

    def default_tree(self) -> TreeSpec:
        return cpu_kernels.by_row_price(DEFAULT_TREE, VNNI_ROWS_TREE, FLAT_ROWS_TREE)

    def weights(self) -> list[nn.Module]:
        return [module for _, part in self.parts for module in part.weights()]

    # ----------------------------------------------------------------------------------------- proposals
    def propose(self, seqs: list[Sequence], spec: TreeSpec) -> list[TokenTree]:
        if not seqs:
            return []
        proposals = [scored_proposals(drafter, seqs, spec if cap is None else spec.limited(cap))
                     for (_, drafter), cap in zip(self.parts, self.depths)]
        trees = []
        for i, seq in enumerate(seqs):
            merged = merge_trees([p[i] for p in proposals], self.calibration, spec.budget, spec.depth, self.min_prob)
            self.slot(seq, _State).merged = merged
            trees.append(TokenTree.from_parents(merged.tokens, merged.parents,
                                                source=torch.tensor(merged.sources, dtype=torch.int64)))
        return trees

    # --------------------------------------------------------------------------------------- observation
    def observe_verified(self, seqs: list[Sequence], trees: list[TokenTree], logits: list[Tensor],
                         results: list[VerifyResult]) -> None:
        for seq, tree, result in zip(seqs, trees, results):
            state = self.slot(seq, _State)
            merged, state.merged = state.merged, None
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
            if drafter.observes_verification:
                drafter.observe_verified(seqs, trees, logits, results)

    def observe_prefill_logits(self, seq: Sequence, start: int, logits: Tensor | None) -> None:
        for drafter in self._seeded:
            drafter.observe_prefill_logits(seq, start, logits)

    def observe_prefill(self, seq: Sequence, start: int, features: Tensor | None) -> None:
        for _, drafter in self.parts:
            drafter.observe_prefill(seq, start, features if drafter is self._featured else None)

    def commit(self, seqs: list[Sequence], results: list[VerifyResult]) -> None:
        for _, drafter in self.parts:
            drafter.commit(seqs, results)

    def release(self, seqs: list[Sequence]) -> None:
        for seq in seqs:
            seq.drafter_state.drop(self)
        for _, drafter in self.parts:
            drafter.release(seqs)


@register_raw("hybrid")
def _build(text: str, ctx: DrafterContext) -> HybridDrafter:
    segments = [s.strip() for s in text.split("+") if s.strip()]
    # a segment whose name holds "=" is an option of the hybrid itself (`hybrid:suffix+recycle+min_prob=0.1`)
    specs = [s for s in segments if "=" not in s.split(":")[0]]
    options: dict[str, str] = {}
    for segment in segments:
        if "=" in segment.split(":")[0]:
            key, _, value = segment.partition("=")
            if key.strip() in options:
                raise ConfigError(f"hybrid option {key.strip()} given twice")
            options[key.strip()] = value.strip()
    min_prob = float_arg(options, "min_prob", 0.0, 0.0, 1.0)
    if options:
        raise ConfigError(f"unknown hybrid option(s) {', '.join(sorted(options))}; the hybrid takes min_prob=P "
                          "(each part takes its own options after its name, e.g. hybrid:suffix+eagle:depth=1)")
    if len(specs) < 2:
        raise ConfigError("hybrid needs two or more drafters joined by '+', e.g. hybrid:suffix+recycle")
    parts, depths = [], []
    for spec in specs:
        if spec.split(":")[0].strip().lower() == "hybrid":
            raise ConfigError("a hybrid drafter cannot contain another hybrid")
        spec, depth = _part_depth(spec)
        drafter = build_drafter(_with_part_defaults(spec), ctx)
        parts.append((drafter.name, drafter))
        depths.append(depth)
    names = [n for n, _ in parts]
    if len(set(names)) != len(names):
        raise ConfigError(f"hybrid parts must be different drafters, got {'+'.join(names)}")
    return HybridDrafter(parts, depths, min_prob)


def _part_depth(spec: str) -> tuple[str, int | None]:
    """A part's `depth=N` option, which the hybrid keeps (the part drafts no deeper than N), and the part's spec
    without it. A model drafter pays a forward per depth while a lookup drafter's deep paths are free: in
    `hybrid:suffix+eagle:depth=2` suffix may fill the tree's deeper levels and EAGLE drafts two."""
    name, args = parse_spec(spec, what="drafter")
    if "depth" not in args:
        return spec, None
    items = spec.partition(":")[2].split(",")
    kept = [item for item in items if item.partition("=")[0].strip() != "depth"]
    if len(items) - len(kept) > 1:
        raise ConfigError(f"hybrid part '{spec}': depth given twice")
    return (f"{name}:{','.join(kept)}" if kept else name), int_arg(args, "depth", 0, minimum=1)


def _with_part_defaults(spec: str) -> str:
    """The part's spec with the PART_DEFAULTS its own options leave unset appended."""
    name, args = parse_spec(spec, what="drafter")
    extra = [f"{key}={value}" for key, value in PART_DEFAULTS.get(name, {}).items() if key not in args]
    if not extra:
        return spec
    return spec + ("," if ":" in spec else ":") + ",".join(extra)
