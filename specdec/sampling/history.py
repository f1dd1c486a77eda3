"""What came before each row of logits: token counts per tree node, built from the path (vectorised).

A tree node's row predicts the token after that node, so the context of row i is the committed tokens (the
prompt, the output so far, whose last token is the tree's root) plus the drafted tokens on the path from the
root down to node i. Penalties computed from the committed tokens alone would differ from plain decoding as
soon as a path repeats a token; computed from the node's path they equal it, row for row.

Counts come from one scatter over the ancestor mask: row i gets +1 at the token of every non-root node on its
path (node i included), on top of the committed counts. No Python loop over nodes.

Only the tokens that occur (in the prompt, the output or the tree) have a history, so the counts are kept for
those columns alone (`ids`), not for the whole vocabulary: a penalty changes no other logit. Dense `[N, V]`
counts, masks and selects cost a tree step of the default model about a millisecond (10% of it); over the few
hundred tokens that occur, a few microseconds.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from specdec.tree.token_tree import TokenTree


@dataclass(frozen=True)
class RowHistory:
    """The tokens before each row of one sequence's logits, as the penalties need them, over the columns `ids`
    (every token that occurs before some row; any other token's count is 0 and it is seen nowhere)."""

    ids: Tensor  # [M] int64, ascending: the vocabulary ids of the columns below
    output_counts: Tensor  # [N, M] float32: count of each token in the output up to the row (frequency/presence)
    seen: Tensor  # [N, M] bool: token occurs in the prompt or the output up to the row (repetition penalty)
    generated: Tensor  # [N] int64: tokens generated before the token this row predicts (min_new_tokens)


def row_history(prompt_ids: list[int], output_ids: list[int], tree: TokenTree | None, vocab: int,
                device: torch.device) -> RowHistory:
    """Histories of the rows of one sequence: one row (`tree=None`, the prefill's last row) or one per node."""
    prompt = torch.tensor(prompt_ids, dtype=torch.int64)
    output = torch.tensor(output_ids, dtype=torch.int64)
    path = tree.tokens[1:].to(torch.int64).cpu() if tree is not None else output[:0]
    ids = torch.unique(torch.cat([prompt, output, path]))  # sorted
    out = torch.bincount(torch.searchsorted(ids, output), minlength=ids.numel()).float().to(device)
    in_prompt = torch.zeros(ids.numel(), dtype=torch.bool, device=device)
    in_prompt[torch.searchsorted(ids, prompt).to(device)] = True
    ids = ids.to(device)
    if tree is None:
        return RowHistory(ids, out[None], (in_prompt | (out > 0))[None],
                          torch.tensor([len(output_ids)], dtype=torch.int64, device=device))
    counts = out.repeat(len(tree), 1)
    rows, nodes = tree.ancestor_mask[:, 1:].nonzero(as_tuple=True)  # node nodes+1 lies on row's path
    if rows.numel():
        columns = torch.searchsorted(ids, tree.tokens[nodes + 1].to(device=device, dtype=torch.int64))
        counts.index_put_((rows.to(device), columns), torch.ones(rows.shape[0], device=device), accumulate=True)
    generated = tree.depth.to(device) + len(output_ids)
    return RowHistory(ids, counts, in_prompt[None] | (counts > 0), generated)
