"""Torch reference kernels: the CPU production path and the oracle every Triton kernel is tested against.

Conventions shared by all kernels (the Triton versions in `specdec/kernels/triton/` take the same arguments):

* The paged cache of one layer is two tensors `[num_blocks, block_size, kv_heads, head_dim]`. A *slot* is
  `block * block_size + offset`; a sequence's token at position `p` lives in slot
  `block_tables[b, p // block_size] * block_size + p % block_size`.
* A step's *new tokens* (a prefill chunk, one decode token, or the nodes of a draft tree) are flattened across
  sequences: sequence `b` owns rows `query_start_loc[b]:query_start_loc[b + 1]`. Their K/V are written into the
  cache (`write_kv`) *before* attention runs, at positions `prefix_lens[b] + i` for new token `i`.
* Query `i` of sequence `b` sees the whole committed prefix (positions `< prefix_lens[b]`) and new token `j` iff
  `tree_mask` allows it: bit `j % 32` of word `j // 32` of row `query_start_loc[b] + i`. `tree_mask=None` means
  causal (`j <= i`), which serves prefill and plain decode.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor
import torch.nn.functional as F

_BITS = torch.arange(32, dtype=torch.int32)
# Rows whose max |x| is below this are scaled as if it were this (as specdec.models.quant does): no 0/0.
_MIN_ROW_SCALE = 1e-30


def write_kv(
    k: Tensor,  # [T, kv_heads, head_dim]
    v: Tensor,  # [T, kv_heads, head_dim]
    k_cache: Tensor,  # [num_blocks, block_size, kv_heads, head_dim]
    v_cache: Tensor,  # [num_blocks, block_size, kv_heads, head_dim]
    slot_mapping: Tensor,  # [T] int64; slot of each new token
) -> None:
    """Scatter new tokens' K/V into their cache slots (in place)."""
    kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    k_cache.view(-1, kv_heads, head_dim).index_copy_(0, slot_mapping, k.to(k_cache.dtype))
    v_cache.view(-1, kv_heads, head_dim).index_copy_(0, slot_mapping, v.to(v_cache.dtype))


def copy_kv_slots(
    k_cache: Tensor,  # [num_blocks, block_size, kv_heads, head_dim]
    v_cache: Tensor,
    src_slots: Tensor,  # [M] int64
    dst_slots: Tensor,  # [M] int64
) -> None:
    """Copy K/V rows between slots (in place): the compaction step of tree rollback.

    Sources are read before any destination is written, so overlapping moves are safe.
    """
    kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    for cache in (k_cache, v_cache):
        flat = cache.view(-1, kv_heads, head_dim)
        flat.index_copy_(0, dst_slots, flat.index_select(0, src_slots))


def unpack_tree_mask(words: Tensor, n: int) -> Tensor:
    """Bit-packed rows `[R, W] int32` -> bool `[R, n]`."""
    bits = (words.unsqueeze(-1) >> _BITS.to(words.device)) & 1  # [R, W, 32]
    return bits.reshape(words.shape[0], -1)[:, :n].bool()


def pack_tree_mask(mask: Tensor) -> Tensor:
    """bool `[R, n]` -> bit-packed `[R, ceil(n / 32)] int32` (the inverse of `unpack_tree_mask`): bit j of word w
    is column 32 w + j, as the little-endian bytes of numpy's packbits read as int32 (one pass, where the
    shifted sum in torch cost 20 us a step)."""
    rows, n = mask.shape
    width = (n + 31) // 32
    packed = np.packbits(mask.cpu().numpy(), axis=1, bitorder="little")  # [R, ceil(n / 8)] uint8
    words = np.zeros((rows, width * 4), dtype=np.uint8)
    words[:, : packed.shape[1]] = packed
    return torch.from_numpy(words.view("<i4")).to(mask.device)


def gather_kv(cache: Tensor, block_table: Tensor, length: int) -> Tensor:
    """The first `length` positions of one sequence, `[length, kv_heads, head_dim]`, read through its blocks."""
    block_size = cache.shape[1]
    num_blocks = (length + block_size - 1) // block_size
    return cache[block_table[:num_blocks].long()].flatten(0, 1)[:length]


def paged_attention(
    q: Tensor,  # [T, q_heads, head_dim]
    k_cache: Tensor,  # [num_blocks, block_size, kv_heads, head_dim]
    v_cache: Tensor,  # [num_blocks, block_size, kv_heads, head_dim]
    block_tables: Tensor,  # [B, max_blocks] int32
    prefix_lens: Tensor,  # [B] int32; committed tokens before this step's new tokens
    query_start_loc: Tensor,  # [B + 1] int32
    tree_mask: Tensor | None,  # [T, W] int32 bit-packed, or None for causal
    scale: float,
    workspace: dict | None = None,  # reused across the layers of one forward pass (reference only)
) -> Tensor:  # [T, q_heads, head_dim]
    """Attention of every new token over its sequence's paged prefix plus the new tokens it may see.

    One function serves prefill chunks, decode steps and tree verification, because all three are
    "new tokens over a paged prefix" that differ only in the mask among the new tokens. The batch is padded
    to its longest sequence and run as one SDPA call: on a CPU, one call over a padded batch is much cheaper
    than a Python loop of small calls. The gather indices and the mask depend only on the metadata, so they
    are built once per forward pass and kept in `workspace` for the other layers.
    """
    groups = workspace.get("groups") if workspace is not None else None
    if groups is None:
        groups = _group_plans(block_tables, prefix_lens, query_start_loc, tree_mask, k_cache.shape[1])
        if workspace is not None:
            workspace["groups"] = groups
    if len(groups) == 1 and groups[0][0] is None:
        return _attend(q, k_cache, v_cache, groups[0][1], scale)
    out = torch.empty_like(q)
    for rows, plan in groups:
        out[rows] = _attend(q[rows], k_cache, v_cache, plan, scale)
    return out


DECODE_LIKE = 16  # sequences with at most this many new tokens (decodes, trees) are batched by size class


def _size_class(n: int) -> int:
    """1, 2-4, 5-8, 9-16 new tokens: a one-token decode is never padded to a tree's width."""
    return 0 if n == 1 else (n - 1).bit_length()


def _group_plans(block_tables: Tensor, prefix_lens: Tensor, query_start_loc: Tensor, tree_mask: Tensor | None,
                 block_size: int) -> list[tuple[Tensor | None, tuple]]:
    """Split a mixed batch so padding stays cheap: decodes and small trees in a few size classes, each long
    prefill chunk alone.

    Padding every sequence to the longest one's new tokens would make 63 one-token decodes cost as much as 63
    copies of a 512-token prefill chunk, or 6 copies of themselves beside one 6-node tree. Returns (query rows
    or None for all rows, plan) per group.
    """
    counts = (query_start_loc[1:] - query_start_loc[:-1]).tolist()
    classes: dict[int, list[int]] = {}
    for b, n in enumerate(counts):
        classes.setdefault(_size_class(n) if n <= DECODE_LIKE else -1 - b, []).append(b)
    if len(classes) == 1:
        return [(None, _plan(block_tables, prefix_lens, query_start_loc, tree_mask, block_size))]
    starts = query_start_loc.tolist()
    groups = list(classes.values())
    plans = []
    for members in groups:
        rows = torch.cat([torch.arange(starts[b], starts[b + 1]) for b in members]).to(query_start_loc.device)
        local = torch.tensor([0] + [counts[b] for b in members], dtype=torch.int64).cumsum(0)
        index = torch.tensor(members, dtype=torch.int64, device=block_tables.device)
        plans.append((rows, _plan(block_tables[index], prefix_lens[index], local.to(query_start_loc.device),
                                  tree_mask[rows] if tree_mask is not None else None, block_size)))
    return plans


def _attend(q: Tensor, k_cache: Tensor, v_cache: Tensor, plan: tuple, scale: float) -> Tensor:
    slots, key_padding, mask, query_rows, query_valid = plan
    kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    keys = k_cache.view(-1, kv_heads, head_dim)[slots]  # [B, L, Hkv, D]
    values = v_cache.view(-1, kv_heads, head_dim)[slots]
    if key_padding is not None:  # padded positions read slot 0: zero them so stale non-finite values cannot leak
        keys = keys.masked_fill(key_padding, 0)
        values = values.masked_fill(key_padding, 0)
    keys, values = keys.transpose(1, 2), values.transpose(1, 2)  # [B, Hkv, L, D]
    queries = (q[query_rows] if query_rows is not None else q[None]).transpose(1, 2)  # [B, Hq, n, D]
    out = F.scaled_dot_product_attention(
        queries.to(keys.dtype), keys, values, attn_mask=mask, scale=scale, enable_gqa=q.shape[1] != kv_heads
    ).transpose(1, 2)  # [B, n, Hq, D]
    out = out[query_valid] if query_valid is not None else out[0]
    return out.to(q.dtype)


def _plan(block_tables: Tensor, prefix_lens: Tensor, query_start_loc: Tensor, tree_mask: Tensor | None,
          block_size: int) -> tuple[Tensor, Tensor | None, Tensor | None, Tensor | None, Tensor | None]:
    """Gather slots `[B, L]`, padded key positions `[B, L, 1, 1]` (None without padding), visibility
    `[B, 1, n, L]` (None when everything is visible), and where each padded query row comes from (None for a
    single sequence, whose rows need no padding)."""
    device = block_tables.device
    num_seqs = prefix_lens.shape[0]
    counts = (query_start_loc[1:] - query_start_loc[:-1]).long()  # [B]
    totals = prefix_lens.long() + counts  # [B] keys per sequence
    n_max, l_max = int(counts.max()), int(totals.max())
    pos = torch.arange(l_max, device=device)
    key_valid = pos[None, :] < totals[:, None]  # [B, L]
    blocks = block_tables.long().gather(1, (pos // block_size).clamp(max=block_tables.shape[1] - 1).expand(num_seqs, -1))
    slots = torch.where(key_valid, blocks * block_size + pos % block_size, 0)
    key_padding = None if num_seqs == 1 else ~key_valid[:, :, None, None]
    if num_seqs == 1 and n_max == 1:
        return slots, None, None, None, None  # one decode query sees its whole context
    rows = torch.arange(n_max, device=device)
    query_valid = rows[None, :] < counts[:, None]  # [B, n]
    flat = torch.where(query_valid, query_start_loc[:-1, None].long() + rows[None, :], 0)
    new_index = pos[None, None, :] - prefix_lens.long()[:, None, None]  # key's index among the new tokens
    if tree_mask is None:
        among_new = new_index <= rows[None, :, None]
    else:
        bits = unpack_tree_mask(tree_mask, tree_mask.shape[1] * 32)[flat]  # [B, n, W*32]
        among_new = bits.gather(2, new_index.clamp(0, bits.shape[2] - 1).expand(-1, n_max, -1))
    mask = (new_index < 0) | among_new
    mask &= key_valid[:, None, :]
    mask |= ~query_valid[:, :, None]  # padding rows see everything (then dropped), so softmax stays finite
    if num_seqs == 1:
        return slots, None, mask[:, None], None, None
    return slots, key_padding, mask[:, None], flat, query_valid


def decode_attention(
    q: Tensor,  # [B, q_heads, head_dim]; one query per sequence
    k_cache: Tensor,  # [num_blocks, block_size, kv_heads, head_dim]
    v_cache: Tensor,
    block_tables: Tensor,  # [B, max_blocks] int32
    seq_lens: Tensor,  # [B] int32; tokens to attend to, the query's own (already written) token included
    scale: float,
    workspace: dict | None = None,
) -> Tensor:  # [B, q_heads, head_dim]
    """One query per sequence over its whole paged context: the plain-decode special case."""
    starts = torch.arange(q.shape[0] + 1, dtype=torch.int32, device=q.device)
    return paged_attention(q, k_cache, v_cache, block_tables, seq_lens - 1, starts, None, scale, workspace)


# ---- the elementwise steps of a decode layer (the compiled CPU kernels fuse each into one pass) ---------------
# A producer returns its output row h in the form its consumer takes (`mode`):
FLOAT = 0  # [h [T, H]]: for a float linear
ROWSCALE = 1  # [h / max|h|, max|h| [T, 1]]: for Int8DynamicLinear (fbgemm), which quantizes rows in [-1, 1] on a
# fixed grid; its output row must be multiplied back by max|h| (the next step's `scale`)
Q8 = 2  # [q int8 [T, H], s [T, 1], gsum [T, H / 32]]: for QLinear: q = round(h * 127 / max|h|), s = max|h| / 127,
# gsum = sums of q over each group of 32 (the offset term of int4 weights)
GROUP = 32


def to_form(h: Tensor, mode: int) -> list[Tensor]:
    """Float rows `[T, H]` in the form `mode` names (see FLOAT, ROWSCALE, Q8)."""
    if mode == FLOAT:
        return [h]
    flat = h.reshape(h.shape[0], -1).float()
    m = flat.abs().amax(1, keepdim=True).clamp_min(_MIN_ROW_SCALE)
    if mode == ROWSCALE:
        return [flat / m, m]
    if mode != Q8 or flat.shape[1] % GROUP:
        raise ValueError(f"unknown form {mode}, or a q8 width {flat.shape[1]} not divisible by {GROUP}")
    q = torch.round(flat * (127.0 / m)).clamp_(-127, 127).to(torch.int8)
    gsum = q.view(q.shape[0], -1, GROUP).sum(-1, dtype=torch.int32).float()
    return [q, m / 127.0, gsum]


def quantize(x: Tensor, mode: int) -> list[Tensor]:
    """Rows of `x` (flattened to `[T, H]`) in form ROWSCALE or Q8: the input of an int8 linear."""
    if mode not in (ROWSCALE, Q8):
        raise ValueError("quantize: mode must be ROWSCALE or Q8")
    return to_form(x.reshape(x.shape[0], -1), mode)


def rms_norm(
    x: Tensor,  # [T, H]; updated in place when `residual` is given
    weight: Tensor,  # [H]
    eps: float,
    mode: int = FLOAT,
    residual: Tensor | None = None,  # [T, H] added to x first (the previous sublayer's output)
    residual_scale: Tensor | None = None,  # [T, 1] multiplies `residual` (the row scale of an int8 linear's output)
) -> list[Tensor]:
    """`weight * (x * rsqrt(mean(x^2) + eps))` in fp32 after the residual update, in form `mode`."""
    if residual is not None:
        x.add_(residual * residual_scale if residual_scale is not None else residual)
    x32 = x.float()
    h = (weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps))).to(x.dtype)
    return to_form(h, mode)


def silu_mul(gate_up: Tensor, scale: Tensor | None = None, mode: int = FLOAT) -> list[Tensor]:
    """`[gate | up]` (times its row scale) -> `silu(gate) * up`, in form `mode`."""
    gu = gate_up if scale is None else gate_up * scale
    gate, up = gu.chunk(2, dim=-1)
    return to_form(F.silu(gate) * up, mode)


TILE = 4  # output channels per weight tile


def pack_q8(w: Tensor) -> Tensor:
    """int8 weights `[N, K]` -> the kernel's tiles `[ceil(N / 4) * 4, K]`: four channels at a time, their 32
    weights of each step of 32 inputs side by side (one sequential stream per tile); padding channels are 0."""
    n, k = w.shape
    n_pad = -(-n // TILE) * TILE
    padded = torch.zeros(n_pad, k, dtype=w.dtype)
    padded[:n] = w
    return padded.view(n_pad // TILE, TILE, k // GROUP, GROUP).permute(0, 2, 1, 3).reshape(n_pad, k).contiguous()


def unpack_q8(tiles: Tensor, n: int) -> Tensor:
    n_pad, k = tiles.shape
    return tiles.view(n_pad // TILE, k // GROUP, TILE, GROUP).permute(0, 2, 1, 3).reshape(n_pad, k)[:n]


def pack_q4(w: Tensor, d: Tensor) -> tuple[Tensor, Tensor]:
    """4-bit weights `[N, K / 2]` and their scales `[N, K / 32]` -> tiles `[ceil(N / 4) * 4, K / 2]` (per group,
    the four channels' 16 bytes side by side) and `[ceil(N / 4) * 4, K / 32]` (per group, four scales)."""
    n, half = w.shape
    n_pad, groups = -(-n // TILE) * TILE, d.shape[1]
    wp = torch.zeros(n_pad, half, dtype=w.dtype)
    wp[:n] = w
    dp = torch.zeros(n_pad, groups, dtype=d.dtype)
    dp[:n] = d
    wt = wp.view(n_pad // TILE, TILE, groups, 16).permute(0, 2, 1, 3).reshape(n_pad, half).contiguous()
    return wt, dp.view(n_pad // TILE, TILE, groups).permute(0, 2, 1).reshape(n_pad, groups).contiguous()


def unpack_q4(w_tiles: Tensor, d_tiles: Tensor, n: int) -> tuple[Tensor, Tensor]:
    n_pad, half = w_tiles.shape
    groups = d_tiles.shape[1]
    w = w_tiles.view(n_pad // TILE, groups, TILE, 16).permute(0, 2, 1, 3).reshape(n_pad, half)[:n]
    d = d_tiles.view(n_pad // TILE, groups, TILE).permute(0, 2, 1).reshape(n_pad, groups)[:n]
    return w, d


AMX_BLOCK, AMX_CHUNK = 16, 64  # output channels and inputs of one AMX weight block (a B tile)


def pack_q8_blocks(tiles: Tensor, n: int) -> Tensor:
    """`pack_q8` tiles of int8 weights W `[N, K]` -> the copy in blocks of 16 channels, flat `[ceil(N / 16) * 16 *
    K]`: per block of 16 channels, per step of 64 inputs (in order), a tile of 16 rows of 64 bytes whose row i
    holds inputs 4i .. 4i + 3 of each of the 16 channels (tdpbssd's B operand for the AMX kernel; for the VNNI
    kernel, one register of 16 channels' 4 weights a line). Padding channels are 0. K must be a multiple of
    64."""
    k = tiles.shape[1]
    if k % AMX_CHUNK:
        raise ValueError(f"the blocked layout needs K divisible by {AMX_CHUNK}, got {k}")
    blocks = -(-n // AMX_BLOCK)
    w = torch.zeros(blocks * AMX_BLOCK, k, dtype=torch.int8)
    w[:n] = unpack_q8(tiles, n)
    # [block, channel, step, row i, 4] -> [block, step, row i, channel, 4]
    w = w.view(blocks, AMX_BLOCK, k // AMX_CHUNK, AMX_CHUNK // 4, 4).permute(0, 2, 3, 1, 4)
    return w.reshape(-1).contiguous()


def linear_q8(q: Tensor, s: Tensor, w: Tensor, w_scale: Tensor, bias: Tensor | None = None,
              weight_bits: int = 8, w_blocks: Tensor | None = None) -> Tensor:
    """int8 rows `q [T, K]` (x ~ q * s) times int8 weights (`pack_q8` tiles of W ~ w * w_scale[:, None]): the
    exact integer dot, then `acc * (s * w_scale) + bias` in float32, the compiled kernel's rounding step for step.
    `weight_bits=7` promises weights in [-63, 63] (the compiled kernel's faster AVX2 path relies on it). `w_blocks`
    (`pack_q8_blocks` of the same weights, for the compiled kernel's AMX and VNNI paths) changes nothing here."""
    w = unpack_q8(w, w_scale.numel())
    if weight_bits == 7 and w.abs().max() > 63:
        raise ValueError("weight_bits=7 needs weights in [-63, 63]")
    acc = (q.long() @ w.long().T).float()
    y = acc * (s * w_scale[None, :])
    return y if bias is None else y + bias


def linear_q4(q: Tensor, s: Tensor, gsum: Tensor, w: Tensor, d: Tensor, m_t: Tensor, bias: Tensor | None = None) -> Tensor:
    """int8 rows times 4-bit weights, `w [N, K / 2]` two values a byte (byte j of a group of 32: value j low,
    value j + 16 high) with W = d q + m per group, `d [N, K / 32]` and `m_t [K / 32, N]` (float16). Float steps
    in float64 (the kernel's order differs: compare with a tolerance). `w` and `d` are `pack_q4` tiles."""
    w, d = unpack_q4(w, d, m_t.shape[1])
    m = m_t.T
    n, groups = w.shape[0], d.shape[1]
    lo, hi = (w & 0x0F).long(), (w >> 4).long()
    w4 = torch.cat([lo.view(n, groups, 16), hi.view(n, groups, 16)], dim=-1)  # [N, G, 32]
    isum = torch.einsum("tgk,ngk->tng", q.long().view(q.shape[0], groups, GROUP), w4).double()
    acc = (isum * d.double()[None]).sum(-1) + gsum.double() @ m.double().T
    y = (s.double() * acc).float()
    return y if bias is None else y + bias


def rope_kv(
    qkv: Tensor,  # [T, (q_heads + 2 kv_heads) * D]: one fused q/k/v projection output per token
    scale: Tensor | None,  # [T, 1] row scale of that output, or None
    bias: Tensor | None,  # [(q_heads + 2 kv_heads) * D] added after the scale, or None
    positions: Tensor,  # [T] int64
    cos: Tensor,  # [max_position, D] (rotate-half layout: the two halves hold the same angles)
    sin: Tensor,
    k_cache: Tensor,  # [num_blocks, block_size, kv_heads, D], written in place
    v_cache: Tensor,
    slot_mapping: Tensor,  # [T] int64
    q_heads: int,
    kv_heads: int,
) -> Tensor:  # [T, q_heads, D] rotated queries
    """Rotary embedding of q and k by each token's position; k and v go into their cache slots."""
    y = qkv if scale is None else qkv * scale
    if bias is not None:
        y = y + bias
    d = k_cache.shape[3]
    q, k, v = y.split([q_heads * d, kv_heads * d, kv_heads * d], dim=-1)
    c, s = cos[positions].unsqueeze(1), sin[positions].unsqueeze(1)
    q, k, v = q.reshape(-1, q_heads, d), k.reshape(-1, kv_heads, d), v.reshape(-1, kv_heads, d)
    q = q * c + _rotate_half(q) * s
    k = k * c + _rotate_half(k) * s
    write_kv(k, v, k_cache, v_cache, slot_mapping)
    return q


def _rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def top_k_probs(logits: Tensor, k: int) -> list[Tensor]:
    """The `k` largest logits of each row `[N, V]` as softmax probabilities `[N, k]` float32 and their indices
    `[N, k]` int64, largest first (equal logits in index order)."""
    top = torch.sort(logits.float(), dim=-1, descending=True, stable=True)
    values, indices = top.values[:, :k], top.indices[:, :k]
    return [torch.exp(values - torch.logsumexp(logits.float(), dim=-1, keepdim=True)), indices]


def argmax_rows(logits: Tensor) -> Tensor:
    """Each row's index of its largest logit `[N]` int64 (the first, on ties): greedy verification's read; -1 for
    a row holding NaN or +Inf (the read is also verification's check of the logits; -Inf rules a token out)."""
    return torch.where((logits < float("inf")).all(-1), logits.argmax(-1), -1)
