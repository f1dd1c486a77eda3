"""`suffix[:k=,depth=24,factor=1,offset=0,min_prob=0.1,global=1,global_nodes=200000,corpus=,corpus_depth=12,
corpus_tokens=2000000,nodes=0]`: suffix decoding (Oliaro et al., NeurIPS 2025; ArcticInference; in vLLM and SGLang).

Two counted suffix tries (`suffix_index.py`): one per request over its prompt and the output so far, and one
global trie over earlier requests' outputs (bounded to `global_nodes` nodes, oldest requests evicted first).
Each step, the context's longest suffixes are matched in both and a tree is grown from the matched node by
frequency-weighted expansion; its size adapts to the match (`factor * match_len + offset` nodes, within the
tree spec's budget) and nodes below `min_prob` are dropped. The better-scoring of the two trees is proposed
(the score is the expected number of accepted tokens under the trie's counts). No model call: the drafting
cost is a few hundred dictionary steps. The default tree is a dynamic tree of 8 nodes (`DEFAULT_TREE`);
option `k=N` makes it a chain of N tokens, and `--tree` any other shape.

`corpus=<folder>` (or `corpus=default`, where `specdec data build` writes for this target) adds a third,
read-only index over a corpus of the target's own answers (`suffix_corpus.py`: a suffix array matching up to
`corpus_depth` tokens, built when the drafter is); its draft competes with the other two on the same score,
and may run as deep as the tree spec allows, however long the match.

Per-request state is the request's trie and how many of its tokens it has indexed; it only ever grows with
committed tokens (never with drafts), so a rejected draft leaves nothing to undo. A preempted request drops
its trie and rebuilds it from its tokens when it runs again; a finished one hands its output to the global
trie. Proposals are deterministic (one-hot to the verifier): lossless at any temperature.
"""

from __future__ import annotations

from dataclasses import dataclass

from specdec.drafters.base import DrafterBase, DrafterContext
from specdec.drafters.hybrid_merge import ScoredTree
from specdec.drafters.registry import float_arg, int_arg, node_planning_arg, register, reject_unknown
from specdec.drafters.suffix_array import CorpusSuffixArray
from specdec.drafters.suffix_corpus import corpus_folder, load_corpus_index
from specdec.drafters.suffix_index import GlobalSuffixIndex, SuffixDraft, SuffixTrie
from specdec.engine.sequence import Sequence
from specdec.tree.spec import TreeKind, TreeSpec, chain, parse_tree_spec
from specdec.tree.token_tree import TokenTree

LOCAL = 0  # the request's own sequence id inside its trie
# The default tree: a dynamic tree of 8 nodes up to 8 deep (option k=N asks for a chain of N instead). While a
# verified row cost 10-15% of a step (AVX2 linears), a chain of 3 won; with AVX-512 VNNI a tree of 8 rows costs
# about 1.3x one row, and the tree beats the chain on the dev split (bench/results/suite_dev_suffix_tree, README)
# and on the test split (1.40x against 1.33x, bench/results/suite).
DEFAULT_TREE = "dynamic:depth=8,topk=4,budget=8"


@dataclass
class SuffixState:
    """One request's trie over its prompt and committed output."""

    trie: SuffixTrie


class SuffixDrafter(DrafterBase):
    name = "suffix"

    def __init__(self, depth: int = 24, factor: float = 1.0, offset: float = 0.0, min_prob: float = 0.1,
                 use_global: bool = True, global_nodes: int = 200_000, default_chain: int | None = None,
                 corpus: CorpusSuffixArray | None = None) -> None:
        self.depth = depth
        self.corpus = corpus
        self.factor, self.offset, self.min_prob = factor, offset, min_prob
        self.index = GlobalSuffixIndex(depth, global_nodes) if use_global else None
        self.default_chain = default_chain  # None: DEFAULT_TREE

    def default_tree(self) -> TreeSpec:
        return chain(self.default_chain) if self.default_chain else parse_tree_spec(DEFAULT_TREE)

    # ------------------------------------------------------------------------------------------- state
    def _state(self, seq: Sequence) -> SuffixState:
        state = self.slot(seq, lambda: SuffixState(SuffixTrie(self.depth)))
        tokens = seq.token_ids
        indexed = state.trie.length(LOCAL)
        if indexed < len(tokens):  # catch up on committed tokens (the whole prompt, the first time)
            state.trie.extend(LOCAL, tokens[indexed:])
        return state

    # commit: nothing (DrafterBase); the trie catches up on committed tokens lazily, at the next proposal

    def release(self, seqs: list[Sequence]) -> None:
        for seq in seqs:
            seq.drafter_state.drop(self)
            if self.index is not None and seq.is_finished and seq.output_ids:
                self.index.add(list(seq.output_ids))

    def reset(self) -> None:
        if self.index is not None:
            self.index.reset()

    # ----------------------------------------------------------------------------------------- proposals
    def draft(self, seq: Sequence, spec: TreeSpec) -> SuffixDraft:
        """The better-scoring of the request's own and the global trie's drafts."""
        state = self._state(seq)
        tokens = seq.token_ids
        branching = 1 if spec.kind is TreeKind.CHAIN else 0
        depth = min(spec.depth, self.depth - 1)
        best = state.trie.speculate(tokens, spec.budget, depth, self.factor, self.offset, self.min_prob,
                                    branching, seq_id=LOCAL)
        others = []
        if self.index is not None and self.index.num_requests:
            others.append(self.index.trie.speculate(tokens, spec.budget, depth, self.factor, self.offset,
                                                    self.min_prob, branching))
        if self.corpus is not None:  # not bounded by the tries' depth: a long match can draft a long chain
            others.append(self.corpus.speculate(tokens, spec.budget, spec.depth, self.factor, self.offset,
                                                self.min_prob, branching))
        for other in others:
            if other.score > best.score:
                best = other
        return best

    def propose(self, seqs: list[Sequence], spec: TreeSpec) -> list[TokenTree]:
        trees = []
        for seq in seqs:
            d = self.draft(seq, spec) if spec.budget > 0 and spec.depth > 0 else SuffixDraft()
            trees.append(TokenTree.from_parents([seq.last_token] + d.tokens, [-1] + [p + 1 for p in d.parents]))
        return trees

    def propose_scored(self, seqs: list[Sequence], spec: TreeSpec) -> list[ScoredTree]:
        """Trees with each node's conditional probability under the trie counts as its raw score, shrunk by
        the evidence behind it (`c / (n + 1)` for c of n occurrences): a continuation seen once is a guess,
        seen nine times in nine it is nearly sure, and the calibration that ranks nodes should see them apart."""
        out = []
        for seq in seqs:
            d = self.draft(seq, spec) if spec.budget > 0 and spec.depth > 0 else SuffixDraft()
            scores = [p / (d.probs[q] if q >= 0 else 1.0) * n / (n + 1)
                      for p, q, n in zip(d.probs, d.parents, d.support)]
            out.append(ScoredTree([seq.last_token] + d.tokens, [-1] + [p + 1 for p in d.parents], [0.0] + scores))
        return out


@register("suffix")
def _build(args: dict[str, str], ctx: DrafterContext) -> SuffixDrafter:
    drafter = SuffixDrafter(
        depth=int_arg(args, "depth", 24, minimum=2),
        factor=float_arg(args, "factor", 1.0, 0.0, 64.0),
        offset=float_arg(args, "offset", 0.0, 0.0, 64.0),
        min_prob=float_arg(args, "min_prob", 0.1, 0.0, 1.0),
        use_global=bool(int_arg(args, "global", 1, minimum=0)),
        global_nodes=int_arg(args, "global_nodes", 200_000, minimum=64),
        default_chain=int_arg(args, "k", 0) or None,
    )
    corpus = args.pop("corpus", None)
    corpus_depth = int_arg(args, "corpus_depth", 12, minimum=2)
    corpus_tokens = int_arg(args, "corpus_tokens", 2_000_000, minimum=1)
    drafter.plans_by_node = node_planning_arg(args)
    reject_unknown("suffix", args)
    if corpus:
        drafter.corpus = load_corpus_index(corpus_folder(corpus, ctx.target), ctx.target, corpus_depth,
                                           corpus_tokens)
    return drafter
