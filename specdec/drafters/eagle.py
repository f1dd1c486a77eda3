"""`eagle[:<path>]` and `eagle3[:<path>]`: EAGLE predictors draft from the target's own features.

With no path and the default target, the weights shipped in `specdec/assets/eagle[3]/<target>/` are used
(trained with `specdec train eagle|eagle3`). A path may hold our format or a published EAGLE checkpoint
(see `eagle_checkpoint.py`).

Positions. The predictor's input at position t is (f_t, x_{t+1}): the target's feature after token t and the
token that followed. While a sequence decodes, its tokens are x_0..x_{n-1} (x_{n-1}, the root, is the bonus
token of the last step) and the target has given features f_0..f_{n-2}: the root's feature comes with the
next verification. So every committed pair t <= n-2 is known, the last one being (f_{n-2}, root); its output
h_{n-2} guesses f_{n-1} and its logits give the depth-1 candidates. A node at depth d >= 2 is fed as the pair
(its parent's output h, its own token) at position n-2+d.

State per sequence: the drafter's own paged KV cache holds the committed pairs, and a buffer holds the
features not yet fed (prompt features from `observe_prefill`, accepted-node features from `commit`). When the
engine reuses a cached prompt prefix, the target computes no features there, and the drafter recomputes them.
Steps the engine's adaptive planner runs without drafting only add to the buffer; the next propose catches up. Each
`propose` first feeds the pending pairs (one batched forward whose last rows also give depth 1), then
drafts, then truncates its cache back to the committed pairs: rollback is a truncate.

One predictor forward per depth, batched over sequences. Chains are fed incrementally (the cache is causal).
Trees re-feed the whole partial tree each depth with its ancestor mask (our attention masks only among new
tokens), which costs layer rows but no extra LM-head rows: logits are taken for the frontier only.
At temperature > 0 chains sample from the draft distribution and pass it on for rejection sampling; tree
nodes are top-k, deterministic, and the verifier treats them as one-hot proposals: lossless either way.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from specdec.config import EngineConfig
from specdec.drafters.base import DrafterContext
from specdec.drafters.heads.eagle_checkpoint import default_feature_layers, load_eagle
from specdec.drafters.heads.eagle_model import EaglePredictor, paged_attend
from specdec.tree.growth import TreeGrowth
from specdec.drafters.registry import register, reject_unknown
from specdec.errors import ConfigError, OutOfBlocksError
from specdec.kvcache import BlockTable, PagedKVCache
from specdec.models.context import AttentionContext
from specdec.models.llama import LlamaModel
from specdec.sampling import sample, target_probs
from specdec.engine.sequence import Sequence
from specdec.tree.token_tree import TokenTree
from specdec.tree.spec import TreeSpec
from specdec.verifier.result import VerifyResult

ASSETS_DIR = Path(__file__).resolve().parents[1] / "assets"
# Measured on the default target with int8 (see specdec/assets/eagle/smollm2-135m/README.md): on a CPU a
# verification row is not free, so a small dynamic tree beats EAGLE-2's GPU default (depth 6, top-8, 60 nodes).
DEFAULT_TREE = TreeSpec("dynamic", depth=5, topk=3, budget=7)


@dataclass
class _State:
    table: BlockTable  # the drafter's cache: one entry per committed pair (f_t, x_{t+1}), t < table.length
    pending: Tensor  # [m, F] target features of positions table.length .. table.length + m - 1


@dataclass
class _Feed:
    table: BlockTable
    tokens: list[int]
    features: Tensor  # [n, F]
    positions: list[int]
    mask: Tensor | None = None  # [n, n] visibility among the new rows; None = causal


class EagleDrafter:
    needs_hidden_states = True

    def __init__(self, predictor: EaglePredictor, target: LlamaModel, engine: EngineConfig, name: str = "eagle",
                 feature_layers: tuple[int, ...] = (), tree: TreeSpec = DEFAULT_TREE) -> None:
        self.name = name
        self.predictor = predictor
        self.target = target
        self.feature_layers = tuple(feature_layers)
        self._tree = tree
        c = predictor.config.layer
        spare = engine.max_num_seqs * (-(-engine.max_tree_nodes // engine.block_size) + 1)
        self.cache = PagedKVCache(1, engine.num_blocks + spare, engine.block_size, c.num_kv_heads, c.head_dim,
                                  dtype=target.dtype, device=target.device)
        self.num_features = len(self.feature_layers) or 1
        self._prefix_memo: dict[tuple[int, ...], Tensor] = {}

    def default_tree(self) -> TreeSpec:
        return self._tree

    # ------------------------------------------------------------------------------------------- state
    def _state(self, seq: Sequence) -> _State:
        state = seq.drafter_state.get("eagle")
        if state is None:
            width = self.num_features * self.predictor.config.hidden_size
            state = _State(BlockTable(), torch.zeros(0, width, dtype=self.target.dtype, device=self.target.device))
            seq.drafter_state["eagle"] = state
        return state

    def start(self, seqs: list[Sequence]) -> None:
        for seq in seqs:
            self._state(seq)

    def observe_prefill(self, seq: Sequence, start: int, features: Tensor) -> None:
        state = self._state(seq)
        known = state.table.length + state.pending.shape[0]
        if start < known:  # already seen (a re-observed chunk): keep what we have
            features, start = features[known - start:], known
        if start > known:  # the engine reused cached K/V for a shared prefix: the target never ran there
            features = torch.cat([self._prefix_features(seq.token_ids[:start])[known:].to(features.dtype), features])
        if features.shape[0]:
            state.pending = torch.cat([state.pending, features.to(state.pending.dtype)])

    @torch.inference_mode()
    def _prefix_features(self, tokens: list[int]) -> Tensor:
        """Target features `[len(tokens), F]` for a prefix whose K/V the engine took from its prefix cache.

        The engine skips the target forward over a cached prefix (a shared system prompt, say), so no features
        come for it; a dense forward recomputes them. The last few prefixes are remembered, since requests
        that share a cached prefix usually share it with many others."""
        from specdec.training.common import dense_forward

        key = tuple(tokens)
        if key not in self._prefix_memo:
            ids = torch.tensor([tokens], dtype=torch.int64, device=self.target.device)
            capture = {i: None for i in self.feature_layers} if self.feature_layers else None
            hidden = dense_forward(self.target, ids, capture)[0]
            if capture:
                hidden = torch.cat([capture[i][0] for i in self.feature_layers], dim=-1)
            if len(self._prefix_memo) >= 8:
                self._prefix_memo.pop(next(iter(self._prefix_memo)))
            self._prefix_memo[key] = hidden
        return self._prefix_memo[key]

    def commit(self, seqs: list[Sequence], results: list[VerifyResult]) -> None:
        for seq, result in zip(seqs, results):
            if result.hidden is None:
                raise RuntimeError("EAGLE needs the target's features; the engine gave none")
            state = self._state(seq)
            state.pending = torch.cat([state.pending, result.hidden.to(state.pending.dtype)])

    def release(self, seqs: list[Sequence]) -> None:
        for seq in seqs:
            state = seq.drafter_state.pop("eagle", None)
            if state is not None:
                self.cache.free(state.table)

    # ----------------------------------------------------------------------------------------- drafting
    @torch.inference_mode()
    def propose(self, seqs: list[Sequence], spec: TreeSpec) -> list[TokenTree]:
        states = [self._state(seq) for seq in seqs]
        feeds = [self._catch_up(seq, state) for seq, state in zip(seqs, states)]
        root_hidden = torch.cat([h[-1:] for h in self._forward(feeds)])  # [B, H]
        committed = [state.table.length for state in states]
        if spec.depth == 0:
            trees = [TokenTree.chain([seq.last_token]) for seq in seqs]
        elif spec.kind == "chain":
            trees = self._chains(seqs, states, root_hidden, spec.depth)
        else:
            trees = self._trees(seqs, states, root_hidden, spec)
        for state, length in zip(states, committed):
            self.cache.truncate(state.table, length)
        return trees

    def _catch_up(self, seq: Sequence, state: _State) -> _Feed:
        """The committed pairs not yet in the cache: (f_t, x_{t+1}) for t = table.length .. n-2."""
        start, end = state.table.length, seq.num_tokens - 1
        if end <= start:
            raise RuntimeError(f"EAGLE drafter out of step: {seq.num_tokens} tokens, {start} pairs cached")
        features = state.pending[: end - start]
        if features.shape[0] < end - start:  # never observed (should not happen): zeros
            missing = torch.zeros(end - start - features.shape[0], features.shape[-1], dtype=features.dtype,
                                  device=features.device)
            features = torch.cat([features, missing])
        state.pending = state.pending[end - start:]
        return _Feed(state.table, seq.token_ids[start + 1: end + 1], features, list(range(start, end)))

    def _forward(self, feeds: list[_Feed]) -> list[Tensor]:
        """Append every feed's rows to the cache and run one predictor forward; hidden `[n_i, H]` per feed."""
        prefixes, counts, slots, tokens, positions = [], [], [], [], []
        for feed in feeds:
            prefixes.append(feed.table.length)
            new = self.cache.append(feed.table, len(feed.tokens))
            if new is None:
                raise OutOfBlocksError("the EAGLE drafter's KV cache is full; raise kv_cache_tokens")
            counts.append(len(feed.tokens))
            slots += new
            tokens += feed.tokens
            positions += feed.positions
        device = self.target.device
        masks = [feed.mask for feed in feeds]
        ctx = AttentionContext.build([f.table.blocks for f in feeds], prefixes, counts, slots, device,
                                     masks if any(m is not None for m in masks) else None)
        embeds = self.target.embed_tokens(torch.tensor(tokens, dtype=torch.int64, device=device))
        features = torch.cat([feed.features for feed in feeds]).to(embeds.dtype)
        hidden = self.predictor(embeds, features, torch.tensor(positions, dtype=torch.int64, device=device),
                                paged_attend(ctx, self.cache.layers[0], self.predictor.scale))
        return list(hidden.split(counts))

    def _logits(self, hidden: Tensor) -> tuple[Tensor, Tensor | None]:
        """Draft logits `[R, V']` and the draft-id -> target-id map (None when V' is the target vocabulary)."""
        ids = self.predictor.draft_to_target if self.predictor.config.version == 3 else None
        return self.predictor.logits(hidden, self.target.lm_head), ids

    def _chains(self, seqs: list[Sequence], states: list[_State], hidden: Tensor, depth: int) -> list[TokenTree]:
        drafted: list[list[int]] = [[] for _ in seqs]
        probs: list[list[Tensor]] = [[] for _ in seqs]
        for d in range(depth):
            logits, ids = self._logits(hidden)
            for i, seq in enumerate(seqs):
                if seq.params.greedy:
                    j = int(logits[i].argmax())
                    drafted[i].append(int(ids[j]) if ids is not None else j)
                else:
                    q = target_probs(self._full_vocab(logits[i: i + 1], ids), seq.params)[0]
                    drafted[i].append(sample(q, seq.generator))
                    probs[i].append(q)
            if d + 1 < depth:
                feeds = [_Feed(s.table, [drafted[i][-1]], hidden[i: i + 1], [s.table.length])
                         for i, s in enumerate(states)]
                hidden = torch.cat(self._forward(feeds))
        trees = []
        for i, seq in enumerate(seqs):
            rows = torch.cat([torch.zeros_like(probs[i][0])[None], torch.stack(probs[i])]) if probs[i] else None
            trees.append(TokenTree.chain([seq.last_token] + drafted[i], rows))
        return trees

    def _full_vocab(self, logits: Tensor, ids: Tensor | None) -> Tensor:
        if ids is None:
            return logits
        full = torch.full((logits.shape[0], self.predictor.config.layer.vocab_size), float("-inf"),
                          device=logits.device)
        full[:, ids] = logits
        return full

    def _trees(self, seqs: list[Sequence], states: list[_State], root_hidden: Tensor,
               spec: TreeSpec) -> list[TokenTree]:
        growths = [TreeGrowth(seq.last_token, spec) for seq in seqs]
        node_hidden = [root_hidden[i: i + 1] for i in range(len(seqs))]  # per sequence: [nodes, H]
        frontier_hidden = root_hidden
        active = list(range(len(seqs)))
        while active:
            logits, ids = self._logits(frontier_hidden)
            top = torch.log_softmax(logits, dim=-1).topk(min(spec.topk, logits.shape[-1]), dim=-1)
            top_ids = ids[top.indices] if ids is not None else top.indices
            row = 0
            for i in active:
                n = len(growths[i].frontier)
                growths[i].expand(top.values[row: row + n], top_ids[row: row + n])
                row += n
            active = [i for i in active if not growths[i].done]
            if not active:
                break
            feeds = []
            for i in active:
                g, table = growths[i], states[i].table
                tree = TokenTree.from_parents(g.tokens, g.parents)
                nodes = g.feed_nodes()
                parents = torch.tensor([g.parents[j] for j in nodes], device=root_hidden.device)
                feeds.append(_Feed(table, [g.tokens[j] for j in nodes], node_hidden[i][parents],
                                   (tree.depth[1:] + table.length - 1).tolist(), tree.ancestor_mask[1:, 1:]))
            prefixes = [f.table.length for f in feeds]
            outs = self._forward(feeds)
            rows = []
            for i, feed, prefix, out in zip(active, feeds, prefixes, outs):
                self.cache.truncate(feed.table, prefix)
                node_hidden[i] = torch.cat([node_hidden[i][:1], out])
                rows.append(node_hidden[i][growths[i].frontier])
            frontier_hidden = torch.cat(rows)
        return [g.tree() for g in growths]


# ------------------------------------------------------------------------------------------------ factory
def shipped_eagle_dir(target_source: str, kind: str = "eagle") -> Path | None:
    """The packaged EAGLE folder (`kind` "eagle" or "eagle3") for a target, or None."""
    from specdec.drafters.heads.draft_folder import _alias_of

    alias = _alias_of(target_source)
    if alias is None:
        return None
    folder = ASSETS_DIR / kind / alias
    return folder if (folder / "config.json").is_file() else None


def build_eagle(args: dict[str, str], ctx: DrafterContext, kind: str) -> EagleDrafter:
    ref = args.pop("", None)
    reject_unknown(kind, args)
    target: LlamaModel = ctx.target.model
    if ref is None:
        folder = shipped_eagle_dir(ctx.target.source, kind)
        if folder is None:
            raise ConfigError(f"no {kind} weights are shipped for this target ({ctx.target.source}); give a "
                              f"checkpoint folder ({kind}:<path>) or train one: specdec train {kind} --out DIR")
    else:
        folder = Path(ref).expanduser()
    predictor, meta = load_eagle(folder, target.config, ctx.device, ctx.dtype)
    version = 3 if kind == "eagle3" else 1
    if predictor.config.version != version:
        other = "eagle3" if predictor.config.version == 3 else "eagle"
        raise ConfigError(f"{folder} is an EAGLE-{predictor.config.version if version == 1 else '1/2'} "
                          f"checkpoint; use the drafter {other}:{folder}")
    layers: tuple[int, ...] = ()
    if version == 3:
        n = target.config.num_layers
        layers = tuple(int(i) for i in meta.get("feature_layers") or default_feature_layers(n))
        if len(layers) != 3 or not all(0 <= i < n for i in layers):
            raise ConfigError(f"EAGLE-3 feature layers {layers} do not fit a target of {n} layers")
    if ctx.quantize == "int8":
        from specdec.models.quant import quantize_int8_

        quantize_int8_(predictor)
    return EagleDrafter(predictor, target, ctx.engine, name=kind, feature_layers=layers)


@register("eagle")
def _build_eagle(args: dict[str, str], ctx: DrafterContext) -> EagleDrafter:
    return build_eagle(args, ctx, "eagle")


@register("eagle3")
def _build_eagle3(args: dict[str, str], ctx: DrafterContext) -> EagleDrafter:
    return build_eagle(args, ctx, "eagle3")
