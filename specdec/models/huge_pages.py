"""A model's weights moved onto 2 MiB pages (Linux transparent huge pages), where the system allows it.

Why: a CPU decode step reads every weight once, 135 MB for the int8 default target, and each 4 KiB page of it
costs a TLB miss and a page walk, and stops the hardware prefetchers, which do not cross pages: 33,000 of them a
step. Under the usual `madvise` policy of Linux (`/sys/kernel/mm/transparent_hugepage/enabled`), the heap that
torch allocates a model's many sub-2 MiB tensors from never gets huge pages. Moved into one mapping advised
MADV_HUGEPAGE, the same weights cost 512 times fewer pages (bench/huge_pages_ab.py measures the step both ways:
1.27-1.37x faster plain decode for SmolLM2-135M, whose matrices are a few hundred kilobytes each; nothing for
Qwen2.5-Coder-1.5B, whose megabyte-long matrices already streamed near the bandwidth bound).

The weights move once, at load, before anything caches their addresses: every storage is copied into the
arena and each tensor that used it points at the copy (`Tensor.set_`), so parameters, buffers and tied weights
keep their identity and sharing, and every value its bits. The K/V cache stays on the lazily touched mapping of
specdec/kvcache/paged_cache.py: advised memory is faulted in 2 MiB at a time and, on a fragmented machine, each
fault may stall in compaction mid-request, which a load pays once but a cache would pay while serving.

Not Linux, not a CPU model, or no MADV_HUGEPAGE in this Python: nothing moves. `SPECDEC_HUGE_PAGES=0` turns it off.
"""

from __future__ import annotations

import mmap
import os

import torch
from torch import Tensor, nn

HUGE_PAGE = 2 << 20
ALIGN = 64  # every storage starts on its own cache line (and at any element size's multiple)
MIN_BYTES = HUGE_PAGE  # smaller modules stay put: less than a huge page's worth gains nothing
# Storage addresses of the arenas made so far: tensors already in one are not moved again (a later call on a
# model that gained tensors, by quantization or a second LLM around it, moves only those). An address freed
# and reused by a new allocation would only keep that tensor where it is.
_ARENAS: set[int] = set()


THP_POLICY = "/sys/kernel/mm/transparent_hugepage/enabled"  # "always [madvise] never": the bracket is in force


def supported() -> bool:
    """Whether weights can be moved onto advised huge pages in this process: Linux with transparent huge pages
    not set to `never` (where the move would copy for nothing), and not turned off by SPECDEC_HUGE_PAGES=0."""
    if os.environ.get("SPECDEC_HUGE_PAGES", "") == "0" or not hasattr(mmap, "MADV_HUGEPAGE"):
        return False
    try:
        with open(THP_POLICY) as policy:
            return "[never]" not in policy.read()
    except OSError:  # no such file: a kernel without transparent huge pages, or not Linux
        return False


def huge_page_bytes(nbytes: int) -> Tensor:
    """`nbytes` zero bytes (uint8) starting on a 2 MiB boundary of an anonymous mapping advised MADV_HUGEPAGE.

    The mapping lives as long as the tensor or any view of it (torch.frombuffer keeps the buffer alive)."""
    mapping = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        mapping.madvise(mmap.MADV_HUGEPAGE)
    except OSError:  # a kernel that refuses the advice: ordinary pages, still one mapping
        pass
    whole = torch.frombuffer(mapping, dtype=torch.uint8)
    start = -whole.data_ptr() % HUGE_PAGE
    return whole[start:start + nbytes]


def _streamed(module: nn.Module) -> set[int]:
    """ids of the tensors a step reads whole: every parameter and buffer but an embedding's (one row a token is
    read; a weight tied to an LM head is streamed by the head, which holds it too) and those a module names
    in `cold_tensors()` (QLinear's 4-channel tiles where the kernels read its 16-channel blocks)."""
    hot: set[int] = set()
    for sub in module.modules():
        if isinstance(sub, nn.Embedding):
            continue
        cold = set(sub.cold_tensors()) if hasattr(sub, "cold_tensors") else set()
        for name, tensor in (*sub.named_parameters(recurse=False), *sub.named_buffers(recurse=False)):
            if name not in cold and tensor is not None:
                hot.add(id(tensor))
    return hot


def _storages(module: nn.Module) -> dict[int, list[Tensor]]:
    """The module's CPU parameters and buffers grouped by the storage they live in (by its address), for the
    storages that hold a streamed tensor (`_streamed`)."""
    groups: dict[int, list[Tensor]] = {}
    seen: set[int] = set()
    for tensor in (*module.parameters(), *module.buffers()):
        storage = tensor.untyped_storage()
        if (tensor.device.type != "cpu" or id(tensor) in seen or storage.nbytes() == 0
                or storage.data_ptr() in _ARENAS):
            continue
        seen.add(id(tensor))
        groups.setdefault(storage.data_ptr(), []).append(tensor)
    hot = _streamed(module)
    return {ptr: tensors for ptr, tensors in groups.items() if any(id(t) in hot for t in tensors)}


@torch.no_grad()
def move_to_huge_pages(module: nn.Module) -> int:
    """Copy the CPU parameters and buffers a step streams (`_streamed`) into one huge-page arena; returns the
    bytes moved (0 if unsupported or under MIN_BYTES). Tensors keep their objects, so plans that hold them (the
    fast path's LayerWeights) follow; call it at load all the same, before anything could copy an address."""
    if not supported():
        return 0
    groups = _storages(module)
    sizes = {ptr: -(-tensors[0].untyped_storage().nbytes() // ALIGN) * ALIGN for ptr, tensors in groups.items()}
    total = sum(sizes.values())
    if not total or total < MIN_BYTES:
        return 0
    arena = huge_page_bytes(total)
    _ARENAS.add(arena.untyped_storage().data_ptr())
    offset = 0
    for ptr, tensors in groups.items():
        old = tensors[0].untyped_storage()
        arena[offset:offset + old.nbytes()].copy_(torch.empty(0, dtype=torch.uint8).set_(old))
        storage = arena.untyped_storage()
        for tensor in tensors:
            size = tensor.element_size()
            tensor.set_(storage, (arena.storage_offset() + offset) // size + tensor.storage_offset(), tensor.shape,
                        tensor.stride())
        offset += sizes[ptr]
    return total
