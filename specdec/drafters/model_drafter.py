"""What every model-backed drafter shares: its own paged KV cache, catch-up, the chain and tree loops over one
forward function, and rollback by truncate.

A draft model and an EAGLE predictor differ only in what one forward reads and returns, so each subclass gives
three small pieces and this class does the rest:

* `_catch_up(seqs)`: the rows each sequence's cache lacks since the last step (committed tokens for a draft
  model; (feature, token) pairs for EAGLE). Their forward's last output row is the root's.
* `_forward(feeds)`: one batched forward over every feed's new rows, appended to the drafter's own cache;
  returns per feed the output rows it asked for (`Feed.outputs` trailing rows, or all).
* `_logits(outputs)`: draft logits `[R, V']` for output rows, with the draft-id -> target-id map when the
  drafter's vocabulary is reduced (None for the full vocabulary).

Chains feed one token per depth (the cache is causal). Trees re-feed the whole partial tree each depth with its
ancestor mask (attention masks only among new tokens) and read the frontier's outputs; `tree.growth` decides
which candidates become nodes. After drafting, the cache is truncated back to the committed rows, so a
rejected draft leaves nothing behind.

At temperature > 0 chains *sample* each token from the draft distribution (after the request's own
temperature/top-k/min_p/top-p) and pass that distribution on, so rejection sampling stays lossless. Trees are
top-k, deterministic (the verifier treats them as one-hot proposals), unless `sampled_trees` is set: then a
sampled request's tree draws each node's children without replacement from the draft distribution and passes
those rows on (`specdec.tree.sampled`). Lossless either way; greedy requests always get top-k trees. Option
`draft_temp=` draws a sampled request's draft tokens at a multiple of its temperature (sharper below 1).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from specdec.config import EngineConfig
from specdec.drafters.base import DrafterBase
from specdec.drafters.hybrid_merge import ScoredTree
from specdec.drafters.registry import float_arg
from specdec.drafters.scored import flat_scored
from specdec.engine.sequence import Sequence
from specdec.errors import ConfigError
from specdec.kvcache import BlockTable, PagedKVCache
from specdec.sampling import sample, target_probs
from specdec.tree.growth import TreeGrowth
from specdec.tree.sampled import SampledGrowth
from specdec.tree.spec import TreeKind, TreeSpec
from specdec.tree.token_tree import TokenTree


@dataclass
class Feed:
    """New rows of one sequence for one draft forward."""

    table: BlockTable  # the sequence's table in the drafter's own cache
    tokens: list[int]
    positions: list[int]
    inputs: Tensor | None = None  # [n, F] per-row inputs besides the token (EAGLE: the parent's features)
    mask: Tensor | None = None  # [n, n] visibility among the new rows; None = causal
    outputs: int | None = None  # trailing rows whose outputs are needed (None = all)


TREE_MODES = ("sampled", "sampled-fixed", "topk")
DEFAULT_TREE_MODE = "topk"


def sampled_trees_option(args: dict[str, str]) -> str:
    """The `trees=` drafter option: `sampled` (stochastic trees at T > 0, each depth's nodes given to the
    likeliest paths), `sampled-fixed` (stochastic, fixed widths per depth) or `topk` (one-hot trees)."""
    mode = args.pop("trees", DEFAULT_TREE_MODE)
    if mode not in TREE_MODES:
        raise ConfigError(f"drafter option trees must be 'sampled' (children drawn from the draft distribution at "
                          f"T > 0), 'sampled-fixed' (the same, fixed widths per depth) or 'topk' (deterministic "
                          f"top-k children), got '{mode}'")
    return mode


def draft_temperature_option(args: dict[str, str]) -> float:
    """The `draft_temp=` drafter option: sampled requests draw the draft's tokens at this multiple of their own
    temperature (1 = the same; below 1 sharper, towards the one-hot top-k choice). Any q is exact as long as
    the verifier is handed the q the token was drawn from; what it changes is how often the draws are accepted."""
    return float_arg(args, "draft_temp", 1.0, 0.05, 4.0)


def sampling_options(args: dict[str, str]) -> tuple[str, float]:
    """How a model drafter draws for sampled requests: its `trees=` mode and `draft_temp=` (set them with
    `ModelDrafter.set_sampling`)."""
    return sampled_trees_option(args), draft_temperature_option(args)


def spare_blocks(engine: EngineConfig) -> int:
    """Blocks a drafter's own cache needs beyond the target's: every running sequence's draft tree."""
    return engine.max_num_seqs * (-(-engine.max_tree_nodes // engine.block_size) + 1)


class ModelDrafter(DrafterBase):
    """Base of drafters that run a model of their own. Subclasses set `self.cache` and the three hooks."""

    cache: PagedKVCache
    feeds_parent_outputs = False  # EAGLE: a node's input row is its parent's output
    tree_mode = DEFAULT_TREE_MODE  # one of TREE_MODES (option `trees=`)
    draft_temperature = 1.0  # option `draft_temp=`: sampled requests draw at this multiple of their temperature

    def set_sampling(self, options: tuple[str, float]) -> None:
        """Apply `sampling_options`: the tree mode and the draft temperature."""
        self.tree_mode, self.draft_temperature = options

    @property
    def sampled_trees(self) -> bool:
        """Sampled requests get children drawn from q without replacement (else top-k, one-hot)."""
        return self.tree_mode != "topk"

    # ----------------------------------------------------------------------------------------- hooks
    def _catch_up(self, seqs: list[Sequence]) -> list[Feed]:
        raise NotImplementedError

    def _forward(self, feeds: list[Feed]) -> list[Tensor]:
        raise NotImplementedError

    def _logits(self, outputs: Tensor) -> tuple[Tensor, Tensor | None]:
        raise NotImplementedError

    # ------------------------------------------------------------------------------------------ state
    def table(self, seq: Sequence) -> BlockTable:
        """`seq`'s table in the drafter's own cache (a subclass with richer state overrides this)."""
        return self.slot(seq, BlockTable)

    def free(self, state: object) -> None:
        table = state if isinstance(state, BlockTable) else getattr(state, "table", None)
        if table is not None:
            self.cache.free(table)

    # --------------------------------------------------------------------------------------- drafting
    def propose(self, seqs: list[Sequence], spec: TreeSpec) -> list[TokenTree]:
        return [tree for tree, _ in self._propose(seqs, spec)]

    def propose_scored(self, seqs: list[Sequence], spec: TreeSpec) -> list[ScoredTree]:
        """The same trees for a hybrid, each node with its raw score: its draft probability given its parent in
        a top-k tree, which the hybrid's calibration bins (without it every node of this drafter looked alike,
        a top-1 guess at 0.8 beside a third one at 0.05); the flat score in chains and sampled trees, which
        compute no probability per node."""
        return [ScoredTree(tree.token_list, tree.parent_list, probs) if probs is not None else flat_scored(tree)
                for tree, probs in self._propose(seqs, spec)]

    @torch.inference_mode()
    def _propose(self, seqs: list[Sequence], spec: TreeSpec) -> list[tuple[TokenTree, list[float] | None]]:
        """Each sequence's tree, with its nodes' draft probabilities given their parents where the tree computed
        them (top-k trees), else None."""
        feeds = self._catch_up(seqs)
        outs = self._forward(feeds)
        root = outs[0][-1:] if len(outs) == 1 else torch.cat([out[-1:] for out in outs])  # [B, X]: each root's output
        tables = [feed.table for feed in feeds]
        committed = [table.length for table in tables]
        if spec.depth == 0:
            trees = [(TokenTree.chain([seq.last_token]), None) for seq in seqs]
        elif spec.kind is TreeKind.CHAIN:
            trees = [(tree, None) for tree in self._chains(seqs, tables, root, spec.depth)]
        else:
            trees = self._split_trees(seqs, tables, root, spec)
        for table, length in zip(tables, committed):
            self.cache.truncate(table, length)
        return trees

    def _pick(self, seqs: list[Sequence], outputs: Tensor) -> tuple[list[int], list[Tensor | None]]:
        """One token per sequence: the draft's argmax for greedy requests (one batched argmax), a sample from
        the processed draft distribution for sampled ones (returned too, for rejection sampling)."""
        logits, ids = self._logits(outputs)
        tokens = logits.argmax(-1)
        if ids is not None:
            tokens = ids[tokens]
        picked, probs = tokens.tolist(), [None] * len(seqs)
        for i, seq in enumerate(seqs):
            if not seq.params.greedy:
                q = self._draft_q(logits[i: i + 1], ids, seq)[0]
                picked[i] = sample(q, seq.generator)
                probs[i] = q
        return picked, probs

    def _draft_q(self, logits: Tensor, ids: Tensor | None, seq: Sequence) -> Tensor:
        """What a sampled request's draft tokens are drawn from (and what the verifier is told they were): the
        request's processed distribution of the draft logits, at `draft_temperature` times its temperature.
        A reduced vocabulary's distribution is taken over its own tokens, then placed in the target's (a token
        outside it has probability 0 either way): the softmax and top-p over 4,096 columns, not 49,152."""
        if self.draft_temperature != 1.0:
            logits = logits.float() / self.draft_temperature
        q = target_probs(logits, seq.params)
        if ids is None:
            return q
        full = torch.zeros((q.shape[0], self.vocab_size), dtype=q.dtype, device=q.device)
        full[:, ids] = q
        return full

    @property
    def vocab_size(self) -> int:
        raise NotImplementedError

    def _chains(self, seqs: list[Sequence], tables: list[BlockTable], outputs: Tensor, depth: int) -> list[TokenTree]:
        drafted: list[list[int]] = [[] for _ in seqs]
        probs: list[list[Tensor]] = [[] for _ in seqs]
        for d in range(depth):
            tokens, rows = self._pick(seqs, outputs)
            for i, (token, q) in enumerate(zip(tokens, rows)):
                drafted[i].append(token)
                if q is not None:
                    probs[i].append(q)
            if d + 1 < depth:
                feeds = [Feed(table, [tokens[i]], [table.length],
                              outputs[i: i + 1] if self.feeds_parent_outputs else None, outputs=1)
                         for i, table in enumerate(tables)]
                outputs = torch.cat([out[-1:] for out in self._forward(feeds)])
        trees = []
        for i, seq in enumerate(seqs):
            rows = torch.cat([torch.zeros_like(probs[i][0])[None], torch.stack(probs[i])]) if probs[i] else None
            trees.append(TokenTree.chain([seq.last_token] + drafted[i], rows))
        return trees

    def _split_trees(self, seqs: list[Sequence], tables: list[BlockTable], root: Tensor,
                     spec: TreeSpec) -> list[tuple[TokenTree, list[float] | None]]:
        """Top-k trees for greedy requests (with their nodes' probabilities); with `sampled_trees`, stochastic
        trees for sampled ones (None)."""
        sampled = [i for i, seq in enumerate(seqs) if self.sampled_trees and not seq.params.greedy]
        if not sampled:
            return self._trees(seqs, tables, root, spec)
        topk = [i for i in range(len(seqs)) if i not in set(sampled)]
        trees: list[tuple[TokenTree, list[float] | None] | None] = [None] * len(seqs)
        for group, grow in ((topk, self._trees), (sampled, self._sampled_trees)):
            if group:
                made = grow([seqs[i] for i in group], [tables[i] for i in group], root[torch.tensor(group)], spec)
                for i, tree in zip(group, made):
                    trees[i] = tree
        return trees  # type: ignore[return-value]

    def _trees(self, seqs: list[Sequence], tables: list[BlockTable], root: Tensor,
               spec: TreeSpec) -> list[tuple[TokenTree, list[float]]]:
        """Top-k trees (`tree.growth` picks the candidates), grown depth by depth, each with its nodes' draft
        probabilities given their parents (`TreeGrowth.scored_tree`)."""
        growths = [TreeGrowth(seq.last_token, spec) for seq in seqs]

        def expand(logits: Tensor, ids: Tensor | None, members: list[tuple[int, int, int]]) -> None:
            top = torch.log_softmax(logits.float(), dim=-1).topk(min(spec.topk, logits.shape[-1]), dim=-1)
            top_ids = ids[top.indices] if ids is not None else top.indices
            for i, start, n in members:
                growths[i].expand(top.values[start: start + n], top_ids[start: start + n])

        self._grow(growths, tables, root, expand)
        return [g.scored_tree() for g in growths]

    def _sampled_trees(self, seqs: list[Sequence], tables: list[BlockTable], root: Tensor,
                       spec: TreeSpec) -> list[tuple[TokenTree, None]]:
        """Stochastic trees: children drawn without replacement from the processed draft distribution."""
        adaptive = self.tree_mode != "sampled-fixed"
        growths = [SampledGrowth(seq.last_token, spec, adaptive) for seq in seqs]

        def expand(logits: Tensor, ids: Tensor | None, members: list[tuple[int, int, int]]) -> None:
            for i, start, n in members:
                q = self._draft_q(logits[start: start + n], ids, seqs[i])
                growths[i].expand(q, seqs[i].generator)

        self._grow(growths, tables, root, expand)
        return [(g.tree(), None) for g in growths]

    def _grow(self, growths: list, tables: list[BlockTable], root: Tensor, expand) -> None:
        """Grow every sequence's tree depth by depth: one batched draft forward per depth. `expand(logits, ids,
        members)` adds children under each member's frontier; members are (sequence, first row, rows)."""
        node_out = [root[i: i + 1] for i in range(len(growths))]  # per sequence: outputs of its nodes so far
        frontier = root
        active = [i for i in range(len(growths)) if not growths[i].done]
        while active:
            logits, ids = self._logits(frontier)
            members, row = [], 0
            for i in active:
                n = len(growths[i].frontier)
                members.append((i, row, n))
                row += n
            expand(logits, ids, members)
            active = [i for i in active if not growths[i].done]
            if not active:
                break
            feeds = [self._tree_feed(growths[i], tables[i], node_out[i]) for i in active]
            prefixes = [feed.table.length for feed in feeds]
            rows = []
            for i, feed, prefix, out in zip(active, feeds, prefixes, self._forward(feeds)):
                self.cache.truncate(feed.table, prefix)
                if self.feeds_parent_outputs:  # every node's output, root first
                    node_out[i] = torch.cat([node_out[i][:1], out])
                    rows.append(node_out[i][growths[i].frontier])
                else:  # the frontier is the newest nodes: the feed's last rows
                    rows.append(out[-len(growths[i].frontier):])
            frontier = torch.cat(rows)

    def _tree_feed(self, growth: TreeGrowth | SampledGrowth, table: BlockTable, node_out: Tensor) -> Feed:
        """The drafted nodes so far as new rows after the committed ones (the root is the last committed row)."""
        tree = growth.partial()
        inputs = None
        if self.feeds_parent_outputs:
            inputs = node_out[tree.parents[1:]]
        return Feed(table, tree.token_list[1:], (tree.depth[1:] + table.length - 1).tolist(), inputs,
                    tree.ancestor_mask[1:, 1:], outputs=None if self.feeds_parent_outputs else len(growth.frontier))
