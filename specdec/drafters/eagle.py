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
engine reuses a cached prompt prefix, the target computes no features there: the drafter keeps every full block's
features it has seen by prefix-cache entry (`prefix_features.py`) and recomputes only what it never saw.
Steps the engine's adaptive planner runs without drafting only add to the buffer; the next propose catches up. Each
`propose` first feeds the pending pairs (one batched forward whose last rows also give depth 1), then
drafts, then truncates its cache back to the committed pairs: rollback is a truncate.

One predictor forward per depth, batched over sequences; chains, trees and rollback are `ModelDrafter`'s
(model_drafter.py): this file gives it the pair feeding and the predictor's forward. Trees re-feed the partial
tree each depth, which costs layer rows but no extra LM-head rows: logits are taken for the frontier only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor, nn

from specdec.config import EngineConfig
from specdec.drafters.base import DrafterContext
from specdec.drafters.heads import eagle_fast
from specdec.drafters.heads.draft_folder import alias_of
from specdec.drafters.heads.eagle_checkpoint import default_feature_layers, load_eagle
from specdec.drafters.heads.eagle_model import EaglePredictor, paged_attend
from specdec.drafters.heads.reduced_vocab import ReducedHead, draft_vocab, reduced_from
from specdec.drafters.prefix_features import FeatureLog, PrefixFeatureStore
from specdec.drafters.model_drafter import Feed, ModelDrafter, sampling_options, spare_blocks
from specdec.drafters.registry import int_arg, register, reject_unknown
from specdec.engine.runner import Chunk, pack
from specdec.engine.sequence import Sequence
from specdec.errors import ConfigError
from specdec.kernels import cpu as cpu_kernels
from specdec.kvcache import BlockTable, PagedKVCache
from specdec.models.dense import dense_forward
from specdec.models.llama import LlamaModel
from specdec.models.quant import quantize_drafter_int8_
from specdec.models.split_input import SplitInputLinear
from specdec.tree.spec import TreeSpec, chain, dynamic
from specdec.verifier.result import VerifyResult

ASSETS_DIR = Path(__file__).resolve().parents[1] / "assets"
# Chosen on the default target with int8 when the shipped weights were trained (on a CPU with AMX, where a
# verified row costs little): a small dynamic tree beats EAGLE-2's GPU default (depth 6, top-8, 60 nodes). Its
# held-out tau comes from `bench/heldout_tau.py` (bench/results/heldout_tau.md).
DEFAULT_TREE = dynamic(depth=5, topk=3, budget=7)
# Where a verified row is dear (AVX2, AVX-512 VNNI), a chain of two: on a Zen 4 core, dev split with the planner
# on, two runs each, `chain:k=2` 1.28x and 1.28x of int8 plain decode, against 1.18x for DEFAULT_TREE and
# 1.24-1.26x for chains of 1 and 3 and 2- to 4-node trees (bench/results/suite_zen4_stop43/README.md).
DEAR_ROWS_TREE = chain(2)


@dataclass
class _State:
    table: BlockTable = field(default_factory=BlockTable)  # one cache entry per committed pair (f_t, x_{t+1})
    pending: Tensor | None = None  # [m, F] target features of positions table.length .. table.length + m - 1
    log: FeatureLog | None = None  # the features seen, block by block into the drafter's prefix store


class EagleDrafter(ModelDrafter):
    needs_features = True
    feeds_parent_outputs = True

    def __init__(self, predictor: EaglePredictor, target: LlamaModel, engine: EngineConfig, name: str = "eagle",
                 feature_layers: tuple[int, ...] = (), tree: TreeSpec | None = None,
                 reduced: ReducedHead | None = None) -> None:
        self.name = name
        self.predictor = predictor
        self.reduced = reduced  # EAGLE-1/2 with vocab=N: the target head's rows of the N most frequent tokens
        self.target = target
        self.feature_layers = tuple(feature_layers)
        if tree is None:  # the default for the price of a verified row here
            tree = cpu_kernels.by_row_price(DEAR_ROWS_TREE, DEAR_ROWS_TREE, DEFAULT_TREE, target.device)
        self._tree = tree
        c = predictor.config.layer
        self.cache = PagedKVCache(1, engine.num_blocks + spare_blocks(engine), engine.block_size, c.num_kv_heads,
                                  c.head_dim, dtype=target.dtype, device=target.device)
        self.num_features = len(self.feature_layers) or 1
        # Features of prefix-cached blocks, which the target does not compute again (prefix_features.py)
        self.prefix_features = (PrefixFeatureStore(engine.block_size, engine.num_blocks)
                                if engine.enable_prefix_caching else None)

    def default_tree(self) -> TreeSpec:
        return self._tree

    def weights(self) -> list[nn.Module]:
        return [self.predictor] + ([self.reduced] if self.reduced is not None else [])

    @property
    def vocab_size(self) -> int:
        return self.predictor.config.layer.vocab_size

    # ------------------------------------------------------------------------------------------- state
    def state(self, seq: Sequence) -> _State:
        state = self.slot(seq, _State)
        if state.pending is None:
            width = self.num_features * self.predictor.config.hidden_size
            state.pending = torch.zeros(0, width, dtype=self.target.dtype, device=self.target.device)
            state.log = FeatureLog(self.prefix_features) if self.prefix_features is not None else None
        return state

    def table(self, seq: Sequence) -> BlockTable:
        return self.state(seq).table

    def observe_prefill(self, seq: Sequence, start: int, features: Tensor | None) -> None:
        state = self.state(seq)
        known = state.table.length + state.pending.shape[0]
        if start < known:  # already seen (a re-observed chunk): keep what we have
            features, start = features[known - start:], known
        if start > known:  # the engine reused cached K/V for a shared prefix: the target never ran there
            features = torch.cat([self._prefix_features(seq, start)[known:].to(features.dtype), features])
        if features.shape[0]:
            self._append(seq, state, known, features)

    def _append(self, seq: Sequence, state: _State, start: int, features: Tensor) -> None:
        """Target features of positions `start ..` (the next ones this sequence lacks) join the pending ones."""
        features = features.to(state.pending.dtype)
        state.pending = torch.cat([state.pending, features])
        if state.log is not None:
            state.log.add(start, features, seq.table)

    @torch.inference_mode()
    def _prefix_features(self, seq: Sequence, length: int) -> Tensor:
        """Target features `[length, F]` of a prefix whose K/V the engine took from its prefix cache.

        The engine skips the target forward over a cached prefix (a shared system prompt, the history a chat
        client sends again, say), so no features come for it: the store has them where this drafter saw those
        blocks before, else a dense forward recomputes them."""
        stored = self.prefix_features.lookup(seq.table, length) if self.prefix_features is not None else None
        if stored is not None:
            return stored
        ids = torch.tensor([seq.token_ids[:length]], dtype=torch.int64, device=self.target.device)
        capture = {i: None for i in self.feature_layers} if self.feature_layers else None
        hidden = dense_forward(self.target, ids, capture)[0]
        if capture:
            hidden = torch.cat([capture[i][0] for i in self.feature_layers], dim=-1)
        return hidden

    def commit(self, seqs: list[Sequence], results: list[VerifyResult]) -> None:
        for seq, result in zip(seqs, results):
            if result.hidden is None:
                raise RuntimeError("EAGLE needs the target's features; the engine gave none")
            state = self.state(seq)
            self._append(seq, state, state.table.length + state.pending.shape[0], result.hidden)

    # ----------------------------------------------------------------------------------------- forward
    def _catch_up(self, seqs: list[Sequence]) -> list[Feed]:
        """The committed pairs not yet in the cache: (f_t, x_{t+1}) for t = table.length .. n-2."""
        feeds = []
        for seq in seqs:
            state = self.state(seq)
            start, end = state.table.length, seq.num_tokens - 1
            if end <= start:
                raise RuntimeError(f"EAGLE drafter out of step: {seq.num_tokens} tokens, {start} pairs cached")
            features = state.pending[: end - start]
            if features.shape[0] < end - start:  # never observed (should not happen): zeros
                missing = torch.zeros(end - start - features.shape[0], features.shape[-1], dtype=features.dtype,
                                      device=features.device)
                features = torch.cat([features, missing])
            state.pending = state.pending[end - start:]
            feeds.append(Feed(state.table, seq.token_ids[start + 1: end + 1], list(range(start, end)), features))
        return feeds

    def _forward(self, feeds: list[Feed]) -> list[Tensor]:
        """Append every feed's rows to the cache and run one predictor forward; hidden `[n_i, H]` per feed."""
        device = self.target.device
        packed = pack(self.cache, [Chunk(f.table, f.tokens, f.positions, f.mask) for f in feeds], device)
        embeds = self.target.embed_tokens(packed.tokens)
        features = (feeds[0].inputs if len(feeds) == 1 else torch.cat([feed.inputs for feed in feeds])).to(embeds.dtype)
        layer_cache = self.cache.layers[0]
        if eagle_fast.applies(self.predictor, embeds, layer_cache[0]):  # one kernel call, not ~40 torch ops
            hidden = eagle_fast.forward(self.predictor, embeds, features, packed.positions, packed.ctx, layer_cache)
        else:
            hidden = self.predictor(embeds, features, packed.positions,
                                    paged_attend(packed.ctx, layer_cache, self.predictor.scale))
        return [hidden] if len(feeds) == 1 else list(hidden.split([len(f.tokens) for f in feeds]))

    def _logits(self, outputs: Tensor) -> tuple[Tensor, Tensor | None]:
        """Draft logits `[R, V']` and the draft-id -> target-id map (None when V' is the target vocabulary)."""
        if self.reduced is not None:
            return self.reduced(outputs).float(), self.reduced.ids
        ids = self.predictor.draft_to_target if self.predictor.config.version == 3 else None
        return self.predictor.logits(outputs, self.target.lm_head), ids


# ------------------------------------------------------------------------------------------------ factory
def shipped_eagle_dir(target_source: str, kind: str = "eagle") -> Path | None:
    """The packaged EAGLE folder (`kind` "eagle" or "eagle3") for a target, or None."""
    alias = alias_of(target_source)
    if alias is None:
        return None
    folder = ASSETS_DIR / kind / alias
    return folder if (folder / "config.json").is_file() else None


def build_eagle(args: dict[str, str], ctx: DrafterContext, kind: str) -> EagleDrafter:
    ref = args.pop("", None)
    vocab = int_arg(args, "vocab", -1, minimum=0)  # -1: the checkpoint's own choice (metadata), 0: full
    sampling = sampling_options(args)
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
    version = 3 if kind.endswith("3") else 1
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
    reduced = None
    if vocab == -1:
        vocab = int(meta.get("draft_vocab", 0)) if version == 1 else 0
    if vocab and version == 3:
        raise ConfigError("eagle3 checkpoints carry their own draft vocabulary (d2t); the vocab= option is for "
                          "eagle, medusa and draft")
    if vocab:
        reduced = reduced_from(target, draft_vocab(alias_of(ctx.target.source), vocab, target.config.vocab_size))
        reduced.to(ctx.device, ctx.dtype)
    if ctx.quantize == "int8":
        if version == 1:  # the embedding and the feature each get their own int8 scale (split_input.py)
            width = predictor.config.hidden_size
            predictor.fc = SplitInputLinear.from_linear(predictor.fc, (width, predictor.fc.in_features - width))
        quantize_drafter_int8_(predictor)
        if reduced is not None:
            quantize_drafter_int8_(reduced)
    drafter = EagleDrafter(predictor, target, ctx.engine, name=kind, feature_layers=layers, reduced=reduced)
    drafter.set_sampling(sampling)
    return drafter


@register("eagle")
def _build_eagle(args: dict[str, str], ctx: DrafterContext) -> EagleDrafter:
    return build_eagle(args, ctx, "eagle")


@register("eagle3")
def _build_eagle3(args: dict[str, str], ctx: DrafterContext) -> EagleDrafter:
    return build_eagle(args, ctx, "eagle3")
