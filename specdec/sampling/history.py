"""What came before each row of logits: token counts per tree node, built from the path (vectorised).

A tree node's row predicts the token after that node, so the context of row i is the committed tokens (the
prompt, the output so far, whose last token is the tree's root) plus the drafted tokens on the path from the
root down to node i. Penalties computed from the committed tokens alone would differ from plain decoding as
soon as a path repeats a token; computed from the node's path they equal it, row for row.

Counts come from one scatter over the ancestor mask: row i gets +1 at the token of every non-root node on its
path (node i included), on top of the committed counts. No Python loop over nodes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from specdec.tree.token_tree import TokenTree


@dataclass(frozen=True)
class RowHistory:
    """The tokens before each row of one sequence's logits, as the penalties need them."""

    output_counts: Tensor  # [N, V] float32: count of each token in the output up to the row (frequency/presence)
    seen: Tensor  # [N, V] bool: token occurs in the prompt or the output up to the row (repetition penalty)
    generated: Tensor  # [N] int64: tokens generated before the token this row predicts (min_new_tokens)


def row_history(prompt_ids: list[int], output_ids: list[int], tree: TokenTree | None, vocab: int,
                device: torch.device) -> RowHistory:
    """Histories of the rows of one sequence: one row (`tree=None`, the prefill's last row) or one per node."""
    out = torch.bincount(torch.tensor(output_ids, dtype=torch.int64), minlength=vocab).float().to(device)
    prompt = torch.zeros(vocab, dtype=torch.bool, device=device)
    prompt[torch.tensor(prompt_ids, dtype=torch.int64, device=device)] = True
    if tree is None:
        return RowHistory(out[None], (prompt | (out > 0))[None],
                          torch.tensor([len(output_ids)], dtype=torch.int64, device=device))
    counts = out.repeat(len(tree), 1)
    rows, nodes = tree.ancestor_mask[:, 1:].nonzero(as_tuple=True)  # node nodes+1 lies on row's path
    if rows.numel():
        tokens = tree.tokens[nodes + 1]
        counts.index_put_((rows.to(device), tokens.to(device)), torch.ones(rows.shape[0], device=device),
                          accumulate=True)
    generated = tree.depth.to(device) + len(output_ids)
    return RowHistory(counts, prompt[None] | (counts > 0), generated)
