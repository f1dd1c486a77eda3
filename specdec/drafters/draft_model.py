"""`draft[:<model>|layers=N][,k=5]`: a small llama-family model drafts for the target.

* `draft:<model>`: any model our loaders read that shares the target's tokenizer, with its own paged cache.
* `draft:layers=N`: an early-exit self-draft: the target's first N layers, final norm and LM head (no extra
  weights at all; its K/V for those layers live in the drafter's own cache).
* `draft`: the default draft for the target: the shipped distilled 2-layer draft for `smollm2-135m` (early-exit self-draft when none is shipped).

Chains: k sequential draft steps, batched across sequences. At temperature > 0 each token is *sampled* from the
draft distribution (after the request's own temperature/top-k/top-p), and that distribution rides along in the
tree so the verifier's rejection sampling stays lossless. Trees (`static`/`dynamic`): each depth expands the
best frontier nodes by cumulative draft log-probability (EAGLE-2 style) and keeps the top `budget` nodes
overall; these children are deterministic (top-k), which the verifier treats as one-hot proposals, so trees
are lossless at any temperature too.

State: the drafter's cache holds the sequence's committed tokens. Each `propose` first feeds the tokens the
target accepted since the last step (one varlen forward), then drafts, then truncates its cache back to the
committed length. Accepted tokens are re-fed next step, which on a CPU costs about what one row costs.
"""

from __future__ import annotations

import torch
from torch import Tensor

from specdec.config import EngineConfig
from specdec.drafters.base import DrafterContext
from specdec.drafters.registry import int_arg, register, reject_unknown
from specdec.errors import ConfigError
from specdec.kvcache import BlockTable
from specdec.models.llama import LlamaModel
from specdec.engine.runner import Chunk, ModelRunner
from specdec.sampling import sample, target_probs
from specdec.engine.sequence import Sequence
from specdec.tree.token_tree import TokenTree
from specdec.tree.spec import TreeSpec, chain
from specdec.verifier.result import VerifyResult

DEFAULT_EARLY_EXIT_LAYERS = 6


class DraftModelDrafter:
    name = "draft"
    needs_hidden_states = False

    def __init__(self, model: LlamaModel, engine: EngineConfig, k: int = 5, num_layers: int | None = None) -> None:
        self.k = k
        spare = engine.max_num_seqs * (-(-engine.max_tree_nodes // engine.block_size) + 1)
        self.runner = ModelRunner.create(model, engine.num_blocks + spare, engine.block_size, num_layers)

    def default_tree(self) -> TreeSpec:
        return chain(self.k)

    def start(self, seqs: list[Sequence]) -> None:
        pass

    def commit(self, seqs: list[Sequence], results: list[VerifyResult]) -> None:
        pass  # the cache was already rolled back to the committed prefix in `propose`

    def release(self, seqs: list[Sequence]) -> None:
        for seq in seqs:
            table = seq.drafter_state.pop("draft_table", None)
            if table is not None:
                self.runner.cache.free(table)

    def propose(self, seqs: list[Sequence], spec: TreeSpec) -> list[TokenTree]:
        tables = [seq.drafter_state.setdefault("draft_table", BlockTable()) for seq in seqs]
        committed = [seq.num_tokens for seq in seqs]
        catch_up = [
            Chunk(table, seq.token_ids[table.length:], list(range(table.length, seq.num_tokens)), None, "last")
            for seq, table in zip(seqs, tables)
        ]
        root_logits = [out.logits[0] for out in self.runner.run(catch_up)]
        if spec.depth == 0:
            trees = [TokenTree.chain([seq.last_token]) for seq in seqs]
        elif spec.kind == "chain":
            trees = self._chains(seqs, tables, root_logits, spec.depth)
        else:
            trees = self._trees(seqs, tables, root_logits, spec)
        for table, length in zip(tables, committed):
            self.runner.cache.truncate(table, length)
        return trees

    def _chains(self, seqs: list[Sequence], tables: list[BlockTable], logits: list[Tensor], depth: int) -> list[TokenTree]:
        drafted: list[list[int]] = [[] for _ in seqs]
        probs: list[list[Tensor]] = [[] for _ in seqs]
        for d in range(depth):
            for i, seq in enumerate(seqs):
                if seq.params.greedy:
                    drafted[i].append(int(logits[i].argmax()))
                else:
                    q = target_probs(logits[i][None], seq.params)[0]
                    drafted[i].append(sample(q, seq.generator))
                    probs[i].append(q)
            if d + 1 < depth:
                steps = [Chunk(t, [drafted[i][-1]], [t.length], None, "last") for i, t in enumerate(tables)]
                logits = [out.logits[0] for out in self.runner.run(steps)]
        trees = []
        for i, seq in enumerate(seqs):
            rows = None
            if probs[i]:
                rows = torch.cat([torch.zeros_like(probs[i][0])[None], torch.stack(probs[i])])
            trees.append(TokenTree.chain([seq.last_token] + drafted[i], rows))
        return trees

    def _trees(self, seqs: list[Sequence], tables: list[BlockTable], root_logits: list[Tensor],
               spec: TreeSpec) -> list[TokenTree]:
        """Grow every sequence's tree depth by depth, one batched draft forward per depth. Each depth re-feeds
        the partial tree as new tokens (our attention sees the prefix plus a mask among the new tokens)."""
        growths = [_TreeGrowth(seq.last_token) for seq in seqs]
        frontier_logits = [logits[None] for logits in root_logits]
        prefixes = [table.length for table in tables]
        for depth in range(1, spec.depth + 1):
            active = []
            for i, growth in enumerate(growths):
                if growth.done:
                    continue
                growth.expand(frontier_logits[i], spec)
                growth.done = not growth.frontier or depth == spec.depth or growth.size >= spec.budget
                if not growth.done:
                    active.append(i)
            if not active:
                break
            outs = self.runner.run([growths[i].chunk(tables[i], prefixes[i]) for i in active])
            for i, out in zip(active, outs):
                self.runner.cache.truncate(tables[i], prefixes[i])
                frontier_logits[i] = out.logits[[node - 1 for node in growths[i].frontier]]
        return [growth.tree(spec) for growth in growths]


class _TreeGrowth:
    """One sequence's tree while it grows: nodes, parents and cumulative draft log-probabilities."""

    def __init__(self, root: int) -> None:
        self.tokens, self.parents, self.scores = [root], [-1], [0.0]
        self.frontier = [0]
        self.done = False

    @property
    def size(self) -> int:
        return len(self.tokens) - 1

    def expand(self, frontier_logits: Tensor, spec: TreeSpec) -> None:
        """Add the best children of the frontier: EAGLE-2's top-k by cumulative log-probability for dynamic
        trees, the listed ranks for static ones."""
        logp = torch.log_softmax(frontier_logits.float(), dim=-1)
        top = logp.topk(min(spec.topk, logp.shape[-1]), dim=-1)
        candidates = []
        for row, node in enumerate(self.frontier):
            for value, token in zip(top.values[row].tolist(), top.indices[row].tolist()):
                candidates.append((self.scores[node] + value, node, token))
        candidates.sort(key=lambda c: -c[0])
        limit = spec.topk if spec.kind == "dynamic" else len(candidates)
        self.frontier = []
        for score, parent, token in candidates[:limit]:
            if spec.kind == "static" and not _in_static(spec, self.tokens, self.parents, parent, token, top):
                continue
            if self.size >= spec.budget:
                break
            self.frontier.append(len(self.tokens))
            self.tokens.append(token)
            self.parents.append(parent)
            self.scores.append(score)

    def chunk(self, table: BlockTable, prefix: int) -> Chunk:
        """The drafted nodes as new tokens after the committed prefix (the root is its last token)."""
        tree = TokenTree.from_parents(self.tokens, self.parents)
        return Chunk(table, self.tokens[1:], (tree.depth[1:] + prefix - 1).tolist(), tree.ancestor_mask[1:, 1:], "all")

    def tree(self, spec: TreeSpec) -> TokenTree:
        """The `budget` best nodes overall (an ancestor never scores below its descendant, so this is a tree)."""
        order = sorted(range(len(self.tokens)), key=lambda i: self.scores[i], reverse=True)[: spec.budget + 1]
        return _subtree(self.tokens, self.parents, sorted(order))


def _in_static(spec: TreeSpec, tokens: list[int], parents: list[int], parent: int, token: int, top) -> bool:
    """Whether adding `token` under `parent` follows the static choice list (ranks by draft probability)."""
    path = []
    node = parent
    while node > 0:
        siblings = [i for i, p in enumerate(parents) if p == parents[node]]
        path.append(siblings.index(node))
        node = parents[node]
    rank = sum(1 for i, p in enumerate(parents) if p == parent)
    return tuple(reversed(path)) + (rank,) in set(spec.choices)


def _subtree(tokens: list[int], parents: list[int], keep: list[int]) -> TokenTree:
    keep_set = set(keep)
    kept = [i for i in keep if i == 0 or parents[i] in keep_set]
    index = {old: new for new, old in enumerate(kept)}
    return TokenTree.from_parents([tokens[i] for i in kept], [-1] + [index[parents[i]] for i in kept[1:]])


@register("draft")
def _build(args: dict[str, str], ctx: DrafterContext) -> DraftModelDrafter:
    k = int_arg(args, "k", 5)
    layers = args.pop("layers", None)
    model_ref = args.pop("", None)
    reject_unknown("draft", args)
    target: LlamaModel = ctx.target.model
    if model_ref is not None and layers is not None:
        raise ConfigError("draft option layers= picks an early-exit draft; it cannot go with a draft model "
                          f"('{model_ref}')")
    if model_ref is None and layers is None:
        from specdec.drafters.heads.draft_folder import shipped_draft_dir

        shipped = shipped_draft_dir(ctx.target.source)
        if shipped is not None:
            return DraftModelDrafter(_layers_only_draft(shipped, ctx), ctx.engine, k=k)
    if model_ref is None:
        n = DEFAULT_EARLY_EXIT_LAYERS if layers is None else _layers(layers, target.config.num_layers)
        return DraftModelDrafter(target, ctx.engine, k=k, num_layers=n)
    from specdec.drafters.heads.draft_folder import is_draft_folder

    if is_draft_folder(model_ref):
        from pathlib import Path

        return DraftModelDrafter(_layers_only_draft(Path(model_ref).expanduser(), ctx), ctx.engine, k=k)
    from specdec.models.loader import load_model

    draft = load_model(model_ref, ctx.device, ctx.dtype, show_progress=True)
    check_same_tokenizer(ctx.target.tokenizer, draft.tokenizer, model_ref)
    if ctx.quantize == "int8":
        from specdec.models.quant import quantize_int8_

        quantize_int8_(draft.model)
    return DraftModelDrafter(draft.model, ctx.engine, k=k)


def _layers_only_draft(folder: "Path", ctx: DrafterContext) -> LlamaModel:
    """A draft of decoder layers only (shipped or `specdec train draft`), on the target's embedding and head.

    int8: only the draft's own linears are quantized. Its LM head is the target's module: already int8 when the
    target was quantized (and then left alone), and a float head that `quantize_int8_` meets is replaced in
    the draft only, by a copy, so the target's head and the shared embedding are never changed.
    """
    from specdec.drafters.heads.draft_folder import load_draft_folder

    draft = load_draft_folder(folder, ctx.target)
    if ctx.quantize == "int8":
        from specdec.models.quant import quantize_int8_

        quantize_int8_(draft)
    return draft


def _layers(raw: str, total: int) -> int:
    try:
        n = int(raw)
    except ValueError:
        raise ConfigError(f"draft option layers must be an integer, got '{raw}'") from None
    if not 1 <= n < total:
        raise ConfigError(f"draft option layers must be between 1 and {total - 1} for this target, got {n}")
    return n


def check_same_tokenizer(target_tok, draft_tok, name: str) -> None:
    """A draft must speak the target's token ids, or every proposal is garbage."""
    same = len(target_tok) == len(draft_tok)
    if same and hasattr(target_tok, "get_vocab") and hasattr(draft_tok, "get_vocab"):
        same = target_tok.get_vocab() == draft_tok.get_vocab()
    if not same:
        raise ConfigError(f"draft model '{name}' does not share the target's tokenizer "
                          f"(vocabularies of {len(draft_tok)} vs {len(target_tok)} tokens differ)")
