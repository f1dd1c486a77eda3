"""`medusa[:<path>]`: Medusa heads propose a tree from the target's last hidden state, at almost no cost.

Which hidden state. After a step the sequence ends with the bonus token, which the target's LM head produced from
the hidden state of the last accepted node (position t). That bonus token is the next tree's root (t + 1), and
Medusa head i at position t predicts token t + i + 2, so heads 0..K-1 fill depths 1..K below the root. After
prefill the same holds with t = the last prompt position and the first output token as the root. So the whole
per-sequence state is one vector: the feature of the last accepted node (`VerifyResult.hidden[-1]`), or of the
last prompt position. Rollback is free: each commit simply replaces it.

Trees. The heads' distributions do not depend on the parent (every head reads the same hidden state), so the
tree is a product of per-depth candidate lists: a static choice path `(r1, r2, ...)` is "rank r1 of head 0,
then rank r2 of head 1, ...". `dynamic:depth,topk,budget` keeps the `budget` paths of highest summed head
log-probability (best-first; a child never scores above its parent, so the result is a tree). Proposals are
deterministic top-k, which the verifier treats as one-hot proposals: lossless at any temperature.

Without a path, the heads shipped for the target are used (`specdec/assets/medusa/<alias>/`). Option `vocab=N`
scores only the N most frequent target tokens (the target head's rows of them); without it, heads trained that way
(`specdec train medusa --vocab N`, recorded in their `specdec_medusa.json`) use their own N, others the full
vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from specdec.drafters.base import DrafterBase, DrafterContext
from specdec.drafters.heads.medusa_heads import MedusaHeads, load_heads, shipped_heads_dir
from specdec.drafters.heads.draft_folder import alias_of
from specdec.drafters.heads.reduced_vocab import draft_vocab, recorded_draft_vocab, reduced_from
from specdec.drafters.registry import int_arg, register, reject_unknown
from specdec.engine.sequence import Sequence
from specdec.errors import ConfigError
from specdec.kernels import cpu as cpu_kernels
from specdec.models.quant import quantize_drafter_int8_
from specdec.tree.growth import per_depth_trees
from specdec.tree.spec import TreeSpec, parse_tree_spec
from specdec.tree.token_tree import TokenTree
from specdec.verifier.result import VerifyResult

META_FILE = "specdec_medusa.json"
# Default trees by the price of a verified row (`cpu_kernels.by_row_price`). Where rows are dear (AVX2, AVX-512
# VNNI) two nodes: on a Zen 4 core with the heads of the 0.70M-token corpus, dev split with the planner on,
# `dynamic:depth=2,topk=2,budget=2` ran at 1.11x of int8 plain decode, chains of 1-2 and 3-node trees at
# 1.09-1.10x, and `static:medusa-8` (six candidates at depth 1) at 0.96x. Where rows are nearly free (AMX) the
# 8-node tree chosen when the first heads were trained on such a CPU.
NARROW_TREE = "dynamic:depth=2,topk=2,budget=2"
FLAT_ROWS_TREE = "static:medusa-8"


@dataclass
class _State:
    hidden: Tensor  # [H] the target's feature at the last accepted node (or the last prompt position)


class MedusaDrafter(DrafterBase):
    name = "medusa"
    needs_features = True

    def __init__(self, heads: MedusaHeads, ids: Tensor | None = None) -> None:
        self.heads = heads
        self.ids = ids  # [N] target id of each draft id when the heads score a reduced vocabulary (vocab=N)

    def weights(self) -> list[nn.Module]:
        return [self.heads, *(m for m in self.heads._shared if isinstance(m, nn.Module))]

    def default_tree(self) -> TreeSpec:
        return parse_tree_spec(cpu_kernels.by_row_price(NARROW_TREE, NARROW_TREE, FLAT_ROWS_TREE,
                                                        self.heads.weight.device))

    # ------------------------------------------------------------------------------------------- state
    def hidden_of(self, seq: Sequence) -> Tensor | None:
        """The feature the heads read for `seq` (None before its prompt was seen or after release)."""
        state = seq.drafter_state.peek(self)
        return state.hidden if isinstance(state, _State) else None

    def _set(self, seq: Sequence, hidden: Tensor) -> None:
        self.slot(seq, lambda: _State(hidden)).hidden = hidden.detach().clone()

    def observe_prefill(self, seq: Sequence, start: int, features: Tensor | None) -> None:
        if features is not None and features.shape[0]:
            self._set(seq, features[-1])

    def commit(self, seqs: list[Sequence], results: list[VerifyResult]) -> None:
        for seq, result in zip(seqs, results):
            if result.hidden is not None and result.hidden.shape[0]:
                self._set(seq, result.hidden[-1])

    # ----------------------------------------------------------------------------------------- propose
    @torch.no_grad()
    def propose(self, seqs: list[Sequence], spec: TreeSpec) -> list[TokenTree]:
        hidden = [self.hidden_of(seq) for seq in seqs]
        ready = [i for i, h in enumerate(hidden) if h is not None]
        trees = [TokenTree.chain([seq.last_token]) for seq in seqs]
        depth = min(spec.depth, self.heads.num_heads)
        if not ready or depth == 0 or spec.budget == 0:
            return trees
        stacked = torch.stack([hidden[i] for i in ready])
        logp = torch.log_softmax(self.heads(stacked, depth).float(), dim=-1)  # [B, D, V'], one call for all
        # over a reduced vocabulary, ranked there and mapped back to target ids (the other tokens impossible)
        for i, tree in zip(ready, per_depth_trees([seqs[i].last_token for i in ready], logp, spec, self.ids)):
            trees[i] = tree
        return trees


@register("medusa")
def _build(args: dict[str, str], ctx: DrafterContext) -> MedusaDrafter:
    ref = args.pop("", None)
    vocab = int_arg(args, "vocab", -1, minimum=0)  # -1: the heads' own choice (specdec_medusa.json), 0: full
    reject_unknown("medusa", args)
    target = ctx.target.model
    if ref is None:
        shipped = shipped_heads_dir(ctx.target.source)
        if shipped is None:
            raise ConfigError(f"specdec ships no Medusa heads for target '{ctx.target.source}'; train some with "
                              "`specdec train medusa --target ... --out DIR` and use drafter 'medusa:DIR/heads'")
        ref = str(shipped)
    if vocab == -1:
        vocab = recorded_draft_vocab(Path(ref).expanduser(), META_FILE)
    c = target.config
    heads = load_heads(Path(ref), c.hidden_size, c.vocab_size, target.lm_head, ctx.device,
                       torch.float32 if ctx.dtype == torch.float32 or ctx.quantize else ctx.dtype)
    if ctx.quantize == "int8":  # the ResBlocks as int8 linears, as an EAGLE head's are
        quantize_drafter_int8_(heads.as_linears())
    if not vocab:
        return MedusaDrafter(heads)
    ids = draft_vocab(alias_of(ctx.target.source), vocab, c.vocab_size).to(ctx.device)
    if heads.projections is not None:  # their own projections: keep the rows of the draft vocabulary
        heads.projections = torch.nn.Parameter(heads.projections[:, ids].contiguous(), requires_grad=False)
    else:
        reduced = reduced_from(target, ids).to(ctx.device, heads.weight.dtype)
        if ctx.quantize == "int8":
            quantize_drafter_int8_(reduced)
        heads._shared[0] = reduced
    return MedusaDrafter(heads, ids)
