"""Random attention inputs at benchmark sizes for bench/gpu_check.py: a paged cache ("world") per (context,
batch), random draft trees, the dense equivalent for the SDPA baseline, and the bytes a kernel must move."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from specdec.kernels import reference

MAX_NEW = 128  # room after each prefix for the largest tree


@dataclass(frozen=True)
class Shapes:
    """Attention geometry, dtype and the sweep (contexts x batches x tree sizes; decode is always added)."""

    q_heads: int
    kv_heads: int
    head_dim: int
    page: int
    dtype: torch.dtype
    contexts: tuple[int, ...]
    batches: tuple[int, ...]
    trees: tuple[int, ...]
    tiny: bool

    @classmethod
    def llama3_8b(cls) -> "Shapes":
        return cls(32, 8, 128, 16, torch.bfloat16, (1024, 8192, 32768), (1, 8, 32), (8, 32, 64, 128), False)

    @classmethod
    def tiny_cpu(cls) -> "Shapes":
        """fp32: the Triton interpreter computes bf16 dots wrongly. Tree 33 spans two mask words."""
        return cls(8, 2, 32, 8, torch.float32, (40, 100), (1, 3), (4, 33), True)


@dataclass(frozen=True)
class World:
    """`batch` sequences of about `ctx` committed tokens in one paged cache with shuffled blocks; every position
    up to `prefix + MAX_NEW` holds random K/V, so any step of up to MAX_NEW new tokens is already "written"."""

    shapes: Shapes
    ctx: int
    batch: int
    k_cache: Tensor  # [num_blocks, page, kv_heads, head_dim]
    v_cache: Tensor
    block_tables: Tensor  # [B, max_blocks] int32
    prefix: Tensor  # [B] int32
    scale: float

    def queries(self, n: int) -> Tensor:  # [B * n, q_heads, head_dim]
        s = self.shapes
        return torch.randn(self.batch * n, s.q_heads, s.head_dim, device=self.k_cache.device).to(s.dtype)

    def starts(self, n: int) -> Tensor:  # [B + 1] int32
        return (torch.arange(self.batch + 1, device=self.k_cache.device) * n).to(torch.int32)

    def dense(self, q: Tensor, n: int, packed: Tensor | None) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
        """q `[B, Hq, n, D]`, K/V gathered and expanded to q heads `[B, Hq, L, D]`, bool mask `[B, 1, n, L]`
        (None when every query sees every key: decode over equal lengths)."""
        s, device = self.shapes, q.device
        lengths = (self.prefix + n).tolist()
        longest = max(lengths)
        group = s.q_heads // s.kv_heads
        keys = torch.zeros(self.batch, longest, s.kv_heads, s.head_dim, dtype=s.dtype, device=device)
        values = torch.zeros_like(keys)
        mask = torch.zeros(self.batch, 1, n, longest, dtype=torch.bool, device=device)
        for b, length in enumerate(lengths):
            pos = torch.arange(length, device=device)
            slots = self.block_tables[b, pos // s.page].long() * s.page + pos % s.page
            keys[b, :length] = self.k_cache.view(-1, s.kv_heads, s.head_dim)[slots]
            values[b, :length] = self.v_cache.view(-1, s.kv_heads, s.head_dim)[slots]
            prefix = length - n
            mask[b, 0, :, :prefix] = True
            if packed is None:
                mask[b, 0, :, prefix:length] = torch.ones(n, n, dtype=torch.bool, device=device).tril()
            else:
                mask[b, 0, :, prefix:length] = reference.unpack_tree_mask(packed[b * n : (b + 1) * n], n)
        keys = keys.transpose(1, 2).repeat_interleave(group, dim=1)
        values = values.transpose(1, 2).repeat_interleave(group, dim=1)
        dense_q = q.view(self.batch, n, s.q_heads, s.head_dim).transpose(1, 2)
        return dense_q, keys, values, (None if bool(mask.all()) else mask)


def make_world(shapes: Shapes, ctx: int, batch: int, device: torch.device, seed: int, ragged: bool = True) -> World:
    """A fresh world; `ragged` shortens all but the first sequence by up to two pages (varlen prefixes that end
    mid-block)."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    prefix = torch.full((batch,), ctx, dtype=torch.int32)
    if ragged and batch > 1:
        prefix[1:] -= torch.randint(0, 2 * shapes.page, (batch - 1,), generator=gen, dtype=torch.int32)
    per_seq = -(-(ctx + MAX_NEW) // shapes.page)
    num_blocks = batch * per_seq + 4
    tables = torch.randperm(num_blocks, generator=gen)[: batch * per_seq].view(batch, per_seq).to(torch.int32)
    cache_shape = (num_blocks, shapes.page, shapes.kv_heads, shapes.head_dim)
    torch.manual_seed(seed)
    k_cache = torch.randn(cache_shape, device=device, dtype=shapes.dtype)
    v_cache = torch.randn(cache_shape, device=device, dtype=shapes.dtype)
    return World(shapes, ctx, batch, k_cache, v_cache, tables.to(device), prefix.to(device), shapes.head_dim**-0.5)


def tree_mask(batch: int, nodes: int, device: torch.device, seed: int = 0) -> Tensor:
    """Packed ancestor masks `[batch * nodes, W]` of random trees (node i's parent uniform in [0, i))."""
    gen = torch.Generator(device="cpu").manual_seed(seed + nodes)
    parents = (torch.rand(batch, nodes, generator=gen) * torch.arange(nodes)).long()
    seen = torch.zeros(batch, nodes, nodes, dtype=torch.bool)
    rows = torch.arange(batch)
    for i in range(nodes):
        if i:
            seen[:, i] = seen[rows, parents[:, i]]
        seen[:, i, i] = True
    return reference.pack_tree_mask(seen.view(batch * nodes, nodes)).to(device)


def bytes_moved(world: World, n: int) -> int:
    """The fewest bytes a step must move: each sequence's K and V read once, q read and out written once."""
    s = world.shapes
    elem = torch.finfo(s.dtype).bits // 8
    kv = int((world.prefix + n).sum()) * s.kv_heads * s.head_dim * 2 * elem
    return kv + 2 * world.batch * n * s.q_heads * s.head_dim * elem
