"""`recycle[:k=8,tree=<template>,min_prob=0,pairs=16,seed=16,warm=default,nodes=0]`: Token Recycling (Luo et al.,
2024), speculation from the target's own discarded logits.

Each verify pass computes the target's logits at every tree node; the top-k of each node's row is written into
the adjacency matrix row of that node's token, with the probabilities the target gave them
(`recycle_matrix.py`), and the next tree is grown from that matrix, from the root, with no model call:

* a dynamic tree spec (`dynamic:depth=6,topk=4,budget=8`, say) grows best-first on the recycled
  probabilities: the `budget` paths whose product of probabilities is highest, at most `topk` children per
  node, none below `min_prob`. The budget goes where the target was sure last time;
* a static spec (`tree=<name|file>`, or `--tree static:...`) expands a fixed template of ranks level by
  level with vectorised lookups (the paper's method); `chain:k=N` follows rank 0 (the default, `chain:k=2`).

The matrix belongs to the drafter, i.e. to the engine: it persists across requests (what one request taught
helps the next), costs `V * k * 8` bytes (3 MiB for SmolLM2 at k = 8), and keeps no per-sequence state at all,
so rollback and preemption leave nothing behind. It starts *warm* (`warm=default`): from the matrix shipped
for the target, which `specdec data recycle` learned by answering our training prompts (`recycle_store.py`);
`warm=<file>` reads another, `warm=none` starts empty. `reset()` returns to the start. Proposals are
deterministic, i.e. one-hot to the verifier: lossless at any temperature.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from specdec.drafters.base import DrafterBase, DrafterContext
from specdec.drafters.hybrid_merge import ScoredTree
from specdec.drafters.heads.draft_folder import alias_of
from specdec.drafters.recycle_matrix import AdjacencyMatrix, TemplateLayout, template_layout
from specdec.drafters.recycle_store import load_matrix, shipped_matrix
from specdec.drafters.registry import float_arg, int_arg, node_planning_arg, register, reject_unknown
from specdec.engine.sequence import Sequence
from specdec.errors import ConfigError
from specdec.kernels import cpu as cpu_kernels
from specdec.training.corpus_store import tokenizer_fingerprint
from specdec.tree.spec import TreeKind, TreeSpec, choices_of, parse_tree_spec
from specdec.tree.token_tree import TokenTree
from specdec.verifier.result import VerifyResult

# A chain of 2: on this CPU every verified row costs (issue 14). On the dev split, 1.10x overall against 0.78x
# for the 8-node best-first tree and 0.88x for a chain of 3; on the test split 1.08x against 0.87x.
DEFAULT_TREE = "chain:k=2"
# Where the int8 linears take up to 16 rows for the price of one (AMX, `cpu.flat_verified_rows`), the 8-node
# best-first tree pays: 1.37x against 1.29x for the chain on the dev split, where it was chosen, and 1.33-1.36x
# against 1.25-1.27x on the test split (bench/results/suite_amx_dev_recycle, suite_amx).
FLAT_ROWS_TREE = "dynamic:depth=6,topk=4,budget=8"
# Where the int8 linears read blocks of 16 channels with VNNI (AVX-512 without AMX: `cpu.blocked_weights`), a
# 4-node tree edges the chain: 1.32x / 1.28x / 1.26x against 1.26x / 1.25x / 1.24x in three dev-split runs on a
# Zen 4 EPYC, 1.27x against 1.26x on the test split, tau 1.67-1.73 against 1.48 (bench/results/suite_zen4_trees/).
VNNI_ROWS_TREE = "dynamic:depth=4,topk=2,budget=4"
# The matrix is seeded from the logits at the prompt's last `seed` positions. Every seeded row is an LM-head row
# (0.6 ms on the default model): seeding a whole 300-token prompt costs 8 plain steps, and 12 such prompts at
# once cost recycle a fifth of its throughput at batch 12 (0.78x of plain decode). The engine computes them at
# the sequence's second draft, not at its prefill (`specdec/engine/prompt_seeds.py`): never, under a load where
# the planner drafts for it at most once (an exploration). 16 rows, not 64: on the dev split at batch 1 (int8,
# AVX2) both reach tau 1.41 (no seeds: 1.30), and at 16 requests at once 64 rows a request cost 5% of throughput
# (bench/results/recycle_seed_rows/).
DEFAULT_SEED_ROWS = 16
DEFAULT_PAIR_BITS = 16  # 65536 pair rows: 4.7 MiB beside the 3 MiB of single rows at k = 8


class RecycleDrafter(DrafterBase):
    name = "recycle"
    observes_verification = True  # the engine hands over the logits of every verified node

    def __init__(self, vocab_size: int, k: int = 8, tree: str | None = None, min_prob: float = 0.0,
                 pair_bits: int = DEFAULT_PAIR_BITS, seed: int = DEFAULT_SEED_ROWS) -> None:
        self.matrix = AdjacencyMatrix(vocab_size, k, pair_bits)
        self.min_prob = min_prob
        self.prefill_logit_rows = seed  # seed the matrix from the prompt's last rows (an LM-head row each)
        if tree is None:  # the default for the price of a verified row here
            tree = cpu_kernels.by_row_price(DEFAULT_TREE, VNNI_ROWS_TREE, FLAT_ROWS_TREE)
        self._default = parse_tree_spec(tree if ":" in tree else f"static:{tree}")
        self._start: dict[str, np.ndarray] | None = None  # the warm start's rows (`warm_from`), for `reset`
        self.warm_source: Path | None = None

    def default_tree(self) -> TreeSpec:
        return self._default

    def warm_from(self, path: Path, fingerprint: str) -> dict:
        """Start from a saved matrix (built for the tokenizer `fingerprint`); returns the file's metadata."""
        self.matrix.reset()
        meta = load_matrix(self.matrix, path, fingerprint)
        self._start, self.warm_source = self.matrix.seen(), path
        return meta

    def reset(self) -> None:
        """Forget what was learned since the start (the warm matrix, if any, stays)."""
        self.matrix.reset()
        if self._start is not None:
            self.matrix.restore(**self._start)

    # ----------------------------------------------------------------------------------------- proposals
    def propose(self, seqs: list[Sequence], spec: TreeSpec) -> list[TokenTree]:
        return [TokenTree.from_parents(tokens, parents) for tokens, parents, _ in self._expand(seqs, spec, False)]

    def propose_scored(self, seqs: list[Sequence], spec: TreeSpec) -> list[ScoredTree]:
        """The same trees with each node's recycled target probability as its raw score (for hybrid trees)."""
        return [ScoredTree(tokens, parents, scores) for tokens, parents, scores in self._expand(seqs, spec)]

    def _expand(self, seqs: list[Sequence], spec: TreeSpec,
                scored: bool = True) -> list[tuple[list[int], list[int], list[float]]]:
        """Each sequence's tree from the matrix: tokens, parents and each node's recycled probability (only
        hybrid trees and node planning read them; `scored` False lets the reference skip them)."""
        prevs = [_before_last(seq) for seq in seqs]
        if spec.kind is TreeKind.DYNAMIC:  # best-first on the recycled probabilities
            return self.matrix.expand_best_first_many([seq.last_token for seq in seqs], prevs, spec.budget,
                                                      spec.depth, self.min_prob, spec.topk)
        layout = self._layout(spec)
        if scored or self.matrix.uses_kernels():  # the compiled expansion scores for free
            return self.matrix.expand_many([seq.last_token for seq in seqs], prevs, layout, spec.depth)
        return [(*self.matrix.expand(seq.last_token, layout, spec.depth, prev), [])
                for seq, prev in zip(seqs, prevs)]

    def _layout(self, spec: TreeSpec) -> TemplateLayout:
        return template_layout(choices_of(spec))

    # --------------------------------------------------------------------------------------- observation
    def observe_prefill_logits(self, seq: Sequence, start: int, logits: Tensor | None) -> None:
        """Seed the matrix with the prompt: row `prompt[i]` gets the top-k the target computed at position i."""
        if logits is None or not logits.shape[0]:
            return
        ids = seq.token_ids
        n = logits.shape[0]
        tokens = torch.tensor(ids[start: start + n], dtype=torch.int64)
        prev = torch.tensor(([ids[start - 1]] if start else [-1]) + ids[start: start + n - 1], dtype=torch.int64)
        self.matrix.update(tokens, logits, prev)

    def observe_verified(self, seqs: list[Sequence], trees: list[TokenTree], logits: list[Tensor],
                         results: list[VerifyResult]) -> None:
        """Recycle every verified row into the matrix, the accepted path last (its context really happened)."""
        if not seqs:
            return
        # Each row's top-k straight from the verify pass's logits, then put in order (k numbers a row: the rows
        # of logits themselves, 200 KB each, are never gathered). One kernel call for the whole batch where the
        # rows lie in one buffer, as the runner's slices do: at 64 one-row sequences a call per sequence cost
        # 8.6 ms a step, against 4.1 ms for the top-k itself.
        joined = _joined_rows(logits)
        tops = [self.matrix.top(rows) for rows in ([joined] if joined is not None else logits)]
        top_probs = tops[0][0] if len(tops) == 1 else torch.cat([probs for probs, _ in tops])
        top_ids = tops[0][1] if len(tops) == 1 else torch.cat([ids for _, ids in tops])
        # Then each tree's rows in order, the accepted path last, as plain lists: a step writes a handful.
        tokens, prevs, rows, base = [], [], [], 0
        for seq, tree, result in zip(seqs, trees, results):
            node_tokens, parents = tree.tokens.tolist(), tree.parents.tolist()
            on_path = set(result.accepted_nodes)
            order = [i for i in range(len(node_tokens)) if i not in on_path] + list(result.accepted_nodes)
            before = [_before_last(seq)] + [node_tokens[p] for p in parents[1:]]
            tokens += [node_tokens[i] for i in order]
            prevs += [before[i] for i in order]
            rows += [base + i for i in order]
            base += len(node_tokens)
        self.matrix.write_rows(tokens, prevs, rows, top_ids, top_probs)

    # no per-sequence state: the matrix is shared, and updated in observe_verified (commit/release: DrafterBase)


def _joined_rows(parts: list[Tensor]) -> Tensor | None:
    """`parts` as one `[N, V]` tensor without a copy when they are consecutive row ranges of one buffer, in
    order (the runner slices each chunk's logits out of the forward's), else None."""
    first = parts[0]
    if first.dim() != 2:
        return None
    storage, row_bytes = first.untyped_storage().data_ptr(), first.shape[1] * first.element_size()
    at = first.data_ptr()
    for part in parts:
        if (part.dim() != 2 or not part.is_contiguous() or part.dtype != first.dtype or part.shape[1] != first.shape[1]
                or part.untyped_storage().data_ptr() != storage or part.data_ptr() != at):
            return None
        at += part.shape[0] * row_bytes
    return first.as_strided((sum(int(part.shape[0]) for part in parts), first.shape[1]), (first.shape[1], 1))


def _before_last(seq: Sequence) -> int:
    """The token before the sequence's last one (-1 for a one-token sequence): the root's pair context."""
    if len(seq.output_ids) >= 2:
        return seq.output_ids[-2]
    ids = seq.token_ids
    return ids[-2] if len(ids) >= 2 else -1


@register("recycle")
def _build(args: dict[str, str], ctx: DrafterContext) -> RecycleDrafter:
    k = int_arg(args, "k", 8)
    tree = args.pop("tree", None)
    min_prob = float_arg(args, "min_prob", 0.0, 0.0, 1.0)
    pair_bits = int_arg(args, "pairs", DEFAULT_PAIR_BITS, minimum=0)
    seed = int_arg(args, "seed", DEFAULT_SEED_ROWS, minimum=0)
    warm = args.pop("warm", "default")
    plans_by_node = node_planning_arg(args)
    reject_unknown("recycle", args)
    if pair_bits > 24:
        raise ConfigError(f"recycle option pairs is log2 of the pair table's rows, at most 24; got {pair_bits}")
    named = None if warm in ("default", "none") else Path(warm).expanduser()
    if named is not None and not named.is_file():
        raise ConfigError(f"recycle option warm={warm}: no such file; build one with `specdec data recycle --out "
                          f"{warm}`, or use warm=default (the matrix shipped for the target) or warm=none")
    drafter = RecycleDrafter(ctx.target.model.config.vocab_size, k, tree, min_prob, pair_bits, seed)
    drafter.plans_by_node = plans_by_node
    path = named or (shipped_matrix(alias_of(ctx.target.source)) if warm == "default" else None)
    if path is not None:
        vocab = ctx.target.model.config.vocab_size
        drafter.warm_from(path, tokenizer_fingerprint(ctx.target.tokenizer, vocab))
    return drafter
