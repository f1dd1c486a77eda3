"""`none`: no drafting. Every tree is just the root, so plain decode runs through the same step as speculation."""

from __future__ import annotations

from specdec.drafters.base import DrafterBase, DrafterContext
from specdec.drafters.registry import register, reject_unknown
from specdec.engine.sequence import Sequence
from specdec.tree.token_tree import TokenTree
from specdec.tree.spec import TreeSpec, chain


class NoDrafter(DrafterBase):
    name = "none"

    def default_tree(self) -> TreeSpec:
        return chain(0)

    def propose(self, seqs: list[Sequence], spec: TreeSpec) -> list[TokenTree]:
        return [TokenTree.chain([seq.last_token]) for seq in seqs]


@register("none")
def _build(args: dict[str, str], ctx: DrafterContext) -> NoDrafter:
    reject_unknown("none", args)
    return NoDrafter()
