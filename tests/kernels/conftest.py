"""Shared fixtures for kernel tests: the Triton interpreter switch and a builder of random paged-attention cases.

`TRITON_INTERPRET=1` must be set before any `@triton.jit` runs (Triton picks interpreter or compiler when a
kernel is decorated, i.e. when `specdec.kernels.triton` is imported), so it is set at the top of this file.
"""

from __future__ import annotations

import os
import sys

os.environ["TRITON_INTERPRET"] = "1"

from dataclasses import dataclass  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from torch import Tensor  # noqa: E402

from specdec.kernels import reference  # noqa: E402

_kernels = sys.modules.get("specdec.kernels.triton.attention")
if _kernels is not None and type(_kernels._attention_kernel).__name__ != "InterpretedFunction":
    # pragma: no cover - only when something imported the kernels first, without the interpreter
    raise RuntimeError("specdec.kernels.triton was imported before TRITON_INTERPRET=1; set it in a root conftest")


@dataclass(frozen=True)
class PagedCase:
    """One random attention step over a paged cache. Unused cache slots and padding table entries are NaN."""

    q: Tensor  # [T, q_heads, head_dim]
    k_cache: Tensor  # [num_blocks, block_size, kv_heads, head_dim]
    v_cache: Tensor
    block_tables: Tensor  # [B, max_blocks] int32, shuffled blocks; padding points at a NaN block
    prefix_lens: Tensor  # [B] int32
    query_start_loc: Tensor  # [B + 1] int32
    tree_mask: Tensor | None  # [T, W] int32, or None for causal
    scale: float

    def args(self) -> tuple:
        return (self.q, self.k_cache, self.v_cache, self.block_tables, self.prefix_lens, self.query_start_loc,
                self.tree_mask, self.scale)  # fmt: skip

    def upcast(self) -> "PagedCase":
        """The same case in float64, for the oracle."""
        return PagedCase(self.q.double(), self.k_cache.double(), self.v_cache.double(), self.block_tables,
                         self.prefix_lens, self.query_start_loc, self.tree_mask, self.scale)  # fmt: skip


def parents_for(shape: str, n: int, gen: torch.Generator) -> list[int]:
    """Parent array of an n-node draft tree: `chain`, `star` (all children of the root) or `random`."""
    if shape == "chain":
        return [-1] + list(range(n - 1))
    if shape == "star":
        return [-1] + [0] * (n - 1)
    return [-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, n)]


def ancestor_mask(parents: list[int]) -> Tensor:
    """bool `[n, n]`: node i sees node j iff j is i or an ancestor of i (parents precede children)."""
    n = len(parents)
    mask = torch.zeros(n, n, dtype=torch.bool)
    for i, parent in enumerate(parents):
        if parent >= 0:
            mask[i] = mask[parent]
        mask[i, i] = True
    return mask


def build_case(
    seed: int,
    prefix_lens: list[int],
    new_lens: list[int],
    *,
    kv_heads: int = 1,
    group: int = 1,
    head_dim: int = 32,
    page: int = 8,
    dtype: torch.dtype = torch.float32,
    tree: str | None = None,  # None (causal), "chain", "star", "random"
    strided_q: bool = False,
) -> PagedCase:
    """A fresh random case: blocks drawn in shuffled order from a pool with spares, so block tables are
    non-contiguous; K/V written through `reference.write_kv` at every position `< prefix + new`; the rest NaN,
    block 0 included, so no output may depend on a slot its sequence does not own."""
    gen = torch.Generator().manual_seed(seed)
    need = [-(-(p + n) // page) for p, n in zip(prefix_lens, new_lens)]
    num_blocks = sum(need) + 3
    order = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()
    nan_block = 0  # never written; table padding points here, and so would a kernel that pads with slot 0
    width = max(need) + 1
    tables = torch.full((len(need), width), nan_block, dtype=torch.int32)
    for b, count in enumerate(need):
        tables[b, :count] = torch.tensor([order.pop() for _ in range(count)], dtype=torch.int32)

    shape = (num_blocks, page, kv_heads, head_dim)
    k_cache = torch.full(shape, float("nan"), dtype=dtype)
    v_cache = torch.full(shape, float("nan"), dtype=dtype)
    for b, (p, n) in enumerate(zip(prefix_lens, new_lens)):
        pos = torch.arange(p + n)
        slots = tables[b, pos // page].long() * page + pos % page
        k = torch.randn(p + n, kv_heads, head_dim, generator=gen)
        v = torch.randn(p + n, kv_heads, head_dim, generator=gen)
        reference.write_kv(k, v, k_cache, v_cache, slots)

    total = sum(new_lens)
    q_heads = kv_heads * group
    if strided_q:  # q as a slice of a fused projection, as a model would pass it
        q = torch.randn(total, q_heads + 2, head_dim, generator=gen).to(dtype)[:, 1 : q_heads + 1]
    else:
        q = torch.randn(total, q_heads, head_dim, generator=gen).to(dtype)
    starts = torch.tensor([0] + new_lens, dtype=torch.int32).cumsum(0).to(torch.int32)

    tree_mask = None
    if tree is not None:
        widest = max(max(new_lens), 1)
        dense = torch.zeros(total, widest, dtype=torch.bool)
        for b, n in enumerate(new_lens):
            if n:
                dense[starts[b] : starts[b] + n, :n] = ancestor_mask(parents_for(tree, n, gen))
        tree_mask = reference.pack_tree_mask(dense)
    return PagedCase(q, k_cache, v_cache, tables, torch.tensor(prefix_lens, dtype=torch.int32), starts,
                     tree_mask, head_dim**-0.5)  # fmt: skip


def nan_empty(shape, *, dtype: torch.dtype, device: torch.device | str) -> Tensor:
    """`torch.empty` stand-in that poisons every buffer, so an element no program wrote shows up as NaN."""
    return torch.full(shape, float("nan"), dtype=dtype, device=device)


@pytest.fixture
def make_case():
    return build_case


@pytest.fixture
def nan_alloc():
    return nan_empty
