"""Compiled CPU kernels: batch-invariant paged attention and the fused elementwise steps of a decode layer.

Why C++: a decode step of a small model on CPU is mostly fixed per-op cost (dispatch, allocation, Python),
not arithmetic: about 80 torch ops per layer, each a few microseconds, around four matmuls. These kernels do
the same work in ten calls per layer (tests/kernels/test_cpu_kernels.py holds each against its torch
reference in specdec/kernels/reference.py). And the attention kernel has a fixed reduction order per query
row, which no BLAS-backed torch op promises, so a row gives the same bits alone, batched or as a tree node in
float32 (the int8 contract used to need float64 attention for that).

They are compiled on first use with torch's C++ extension builder (a C++ compiler and ninja are needed; the
build takes about a minute and is cached under `$SPECDEC_CACHE/kernels`, default `~/.cache/specdec`). Without
a compiler, or with `SPECDEC_CPU_KERNELS=0`, `available()` is False and the engine uses the torch reference.
Arguments and meaning are those of the reference functions of the same names.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TypeVar

import torch
from torch import Tensor

from specdec.kernels.reference import copy_kv_slots, write_kv  # index copies: one torch op each already

T = TypeVar("T")

__all__ = ["argmax_rows", "available", "bf16_attention", "blocked_weights", "by_row_price", "copy_kv_layers",
           "copy_kv_slots", "decode_attention", "decode_layers", "flat_verified_rows", "isa", "linear_q4", "linear_q8",
           "paged_attention", "quantize", "recycle_best_first", "recycle_expand", "recycle_write", "rms_norm",
           "rope_kv", "silu_mul", "top_k_probs", "write_kv"]
SOURCES = ("attention.cpp", "attention_amx.cpp", "attention_bf16.cpp", "forward.cpp", "fused.cpp", "isa.cpp",
           "kv_copy.cpp", "logit_rows.cpp", "qlinear.cpp", "qlinear_amx.cpp", "qlinear_vnni.cpp", "recycle_matrix.cpp")
HEADERS = ("amx_tiles.h", "attention_bf16.h", "attention_rows.h", "bf16_lists.h", "isa.h", "ops.h",
           "qlinear_amx.h", "qlinear_vnni.h", "vec.h", "vec16.h")
_HERE = Path(__file__).resolve().parent


def available() -> bool:
    """Whether the compiled kernels serve (building them on the first call of a process if needed)."""
    return os.environ.get("SPECDEC_CPU_KERNELS", "") != "0" and _loaded()


@functools.lru_cache(maxsize=None)
def _loaded() -> bool:
    try:
        _build()
    except Exception as exc:  # no compiler, no ninja, a failed build: the torch reference serves instead
        warnings.warn(f"specdec: compiled CPU kernels unavailable, using the slower torch reference ({exc})",
                      RuntimeWarning, stacklevel=2)
        return False
    return True


def _build() -> None:
    # torch's builder warns about CUDA at import ("No CUDA runtime is found") even for a CPU-only build.
    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
    from torch.utils import cpp_extension

    name, build, flags = _build_folder()
    build.mkdir(parents=True, exist_ok=True)
    # The one slow start: on a terminal, say so rather than sit silent for a minute (not in pipes, whose
    # readers parse stderr line by line).
    if not (build / f"{name}.so").exists() and sys.stderr.isatty():
        print("specdec: compiling the CPU kernels (once per install, about a minute)...", file=sys.stderr, flush=True)
    with _builder_lock(build):
        cpp_extension.load(name, [str(_HERE / s) for s in SOURCES], extra_cflags=flags,
                           extra_include_paths=[str(_HERE)], build_directory=str(build), is_python_module=False,
                           verbose=False)


def _build_folder() -> tuple[str, Path, list[str]]:
    """The library's name, its build folder and the compiler flags for this CPU and these sources."""
    capability = torch.backends.cpu.get_cpu_capability()  # "AVX2", "AVX512", "DEFAULT", ...
    flags = ["-O3", "-ffp-contract=off"]  # every FMA is explicit (vec.h): one rounding rule for every row
    if capability.startswith("AVX"):  # AVX512 machines run the AVX2 build: one tested code path on x86
        flags += ["-mavx2", "-mfma", "-mf16c"]
    # One build folder per checkout and source version: two checkouts (or versions) of specdec never rebuild
    # over each other's objects (ninja tracks the sources' paths), or load each other's kernels.
    digest = hashlib.sha256(f"{' '.join(flags)}\n{_HERE}".encode())
    for source in (*SOURCES, *HEADERS):
        digest.update((_HERE / source).read_bytes())
    name = f"specdec_cpu_{capability.lower()}_{digest.hexdigest()[:12]}"
    # $SPECDEC_CACHE as specdec.models.registry.cache_root reads it (kernels sit below models: no import).
    root = Path(os.environ.get("SPECDEC_CACHE") or Path.home() / ".cache" / "specdec").expanduser()
    return name, root / "kernels" / f"torch-{torch.__version__}" / name, flags


@contextlib.contextmanager
def _builder_lock(build: Path) -> Iterator[None]:
    """One builder at a time per build folder, under a lock the OS drops when its holder dies.

    torch's builder guards the folder with a lock *file* and waits, forever, while one exists: a build killed
    part way (Ctrl-C on the first run) leaves it behind, and every later process hangs. Here every builder first
    takes an flock on a file of ours, which a killed process cannot keep; holding it, no live builder can hold
    torch's lock file, so one that exists is a dead builder's and goes. Where there is no flock (not POSIX, or a
    file system that refuses it), torch's own lock serves alone."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    with open(build / "specdec-builder.lock", "w") as guard:
        try:
            fcntl.flock(guard, fcntl.LOCK_EX)
        except OSError:  # e.g. ENOLCK on some network file systems: without a lock of ours, a lock file may
            pass  # be a live builder's, so it stays
        else:
            (build / "lock").unlink(missing_ok=True)
        yield  # closing `guard` drops the flock


def paged_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, block_tables: Tensor, prefix_lens: Tensor,
                    query_start_loc: Tensor, tree_mask: Tensor | None, scale: float,
                    workspace: dict | None = None) -> Tensor:
    """float32 only; `workspace` is accepted for the reference's signature and unused."""
    return torch.ops.specdec_cpu.paged_attention(q.contiguous(), k_cache, v_cache, block_tables, prefix_lens, query_start_loc,
                                                 tree_mask, scale)


def decode_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, block_tables: Tensor, seq_lens: Tensor,
                     scale: float, workspace: dict | None = None) -> Tensor:
    starts = torch.arange(q.shape[0] + 1, dtype=torch.int32)
    return paged_attention(q, k_cache, v_cache, block_tables, seq_lens - 1, starts, None, scale)


def copy_kv_layers(k_caches: list[Tensor], v_caches: list[Tensor], src_slots: Tensor, dst_slots: Tensor) -> None:
    """`copy_kv_slots` in every layer, in one call (kv_copy.cpp)."""
    torch.ops.specdec_cpu.copy_kv_layers(k_caches, v_caches, src_slots, dst_slots)


def argmax_rows(logits: Tensor) -> Tensor:
    return torch.ops.specdec_cpu.argmax_rows(logits)


def top_k_probs(logits: Tensor, k: int) -> list[Tensor]:
    return torch.ops.specdec_cpu.top_k_probs(logits, k)


def recycle_write(arrays: tuple[Tensor, ...], pair_bits: int, tokens: Tensor, prev: Tensor, rows: Tensor,
                  succ: Tensor, succ_probs: Tensor) -> None:
    """Token Recycling's matrix `arrays` (table, probs, pair_keys, pair_table, pair_probs) written in place
    (recycle_matrix.cpp; the reference is `AdjacencyMatrix.write`)."""
    torch.ops.specdec_cpu.recycle_write(*arrays, pair_bits, tokens, prev, rows, succ, succ_probs)


def recycle_expand(arrays: tuple[Tensor, ...], pair_bits: int, roots: Tensor, prevs: Tensor, parents: Tensor,
                   ranks: Tensor, count: int) -> list[Tensor]:
    """A static template filled from every root at once (the reference is `AdjacencyMatrix.expand`)."""
    return torch.ops.specdec_cpu.recycle_expand(*arrays, pair_bits, roots, prevs, parents, ranks, count)


def recycle_best_first(arrays: tuple[Tensor, ...], pair_bits: int, roots: Tensor, prevs: Tensor, budget: int,
                       max_depth: int, min_prob: float, width: int) -> list[Tensor]:
    """Every root's best-first tree at once (the reference is `AdjacencyMatrix.expand_best_first`)."""
    return torch.ops.specdec_cpu.recycle_best_first(*arrays, pair_bits, roots, prevs, budget, max_depth, min_prob,
                                                    width)


def rms_norm(x: Tensor, weight: Tensor, eps: float, mode: int = 0, residual: Tensor | None = None,
             residual_scale: Tensor | None = None) -> list[Tensor]:
    return torch.ops.specdec_cpu.rms_norm(x, weight, eps, mode, residual, residual_scale)


def silu_mul(gate_up: Tensor, scale: Tensor | None = None, mode: int = 0) -> list[Tensor]:
    return torch.ops.specdec_cpu.silu_mul(gate_up, scale, mode)


def quantize(x: Tensor, mode: int) -> list[Tensor]:
    return torch.ops.specdec_cpu.quantize(x, mode)


def linear_q8(q: Tensor, s: Tensor, w: Tensor, w_scale: Tensor, bias: Tensor | None = None,
              weight_bits: int = 8, w_blocks: Tensor | None = None) -> Tensor:
    return torch.ops.specdec_cpu.linear_q8(q, s, w, w_scale, bias, weight_bits, w_blocks)


def isa(request: str = "") -> str:
    """The instruction set the kernels run on: "amx" where the CPU has AMX-INT8 and AVX-512 (the int8 linears
    multiply tiles of up to 16 rows at once, on weights `QLinear` packed for it at load: a tree's rows cost
    no more arithmetic than one row's), "avx512" where it has AVX-512 F/BW/DQ/VL/VNNI (the int8 linears' VNNI
    tiles, four times fewer instructions a product, and attention's three-heads-at-a-time blocks: what makes
    extra verified rows cheap), else "avx2". `request` "avx2", "avx512" or "amx" chooses that level, or the best
    below it the CPU has, for A/B runs and tests; SPECDEC_CPU_ISA does the same for a whole process (set before
    loading a model, "avx2" or "avx512" also skips the AMX copy of its weights). Every level gives the same
    bits over a float32 K/V cache (the default). Over a bfloat16 one (`kv_cache_dtype="bfloat16"`) the AMX tiles
    and the AVX512-BF16 dot products each give their own, so the text then depends on which one the CPU has.
    Without the compiled kernels (`available()` False) it is "none"."""
    if not available():
        return "none"
    return torch.ops.specdec_cpu.isa(request)


def bf16_attention() -> bool:
    """Whether the kernels take a bfloat16 K/V cache: AMX-BF16 at the "amx" level (attention_amx.cpp, where a
    tree's verified rows cost attention next to nothing: tiles of 16 query heads), or AVX512-BF16 at the
    "avx512" level (attention_bf16.cpp: half the instructions of the float32 kernel per query and key). Either
    way the cache's traffic halves; elsewhere a bfloat16 cache runs the torch reference."""
    return available() and isa() in ("amx", "avx512") and bool(torch.ops.specdec_cpu.bf16_attention())


def flat_verified_rows() -> bool:
    """Whether extra verified rows cost the int8 linears next to nothing here: the kernels run at the "amx" level
    (up to 16 rows for the price of one). Drafters whose best tree depends on that price read it."""
    return available() and isa() == "amx"


def blocked_weights() -> bool:
    """Whether `QLinear` packs a second copy of its int8 weights in blocks of 16 channels
    (`reference.pack_q8_blocks`): at the "amx" level for its tiles, at "avx512" for the VNNI kernel that holds
    16 channels in a register's lanes (qlinear_vnni.cpp), one more byte a weight either way."""
    return available() and isa() in ("amx", "avx512")


def by_row_price(costly: T, blocked: T, flat: T, device: torch.device | None = None) -> T:
    """The one of three choices (a drafter's default tree) that suits the price of an extra verified row here:
    `flat` at the "amx" level (`flat_verified_rows`), `blocked` at "avx512" (`blocked_weights`: a few rows for
    little more than one), `costly` elsewhere. A drafter that runs on another `device` (a GPU) gets `flat`: the
    CPU's instruction set says nothing about its rows' price there."""
    if device is not None and device.type != "cpu":
        return flat
    return flat if flat_verified_rows() else blocked if blocked_weights() else costly


def linear_q4(q: Tensor, s: Tensor, gsum: Tensor, w: Tensor, d: Tensor, m_t: Tensor, bias: Tensor | None = None) -> Tensor:
    return torch.ops.specdec_cpu.linear_q4(q, s, gsum, w, d, m_t, bias)


def rope_kv(qkv: Tensor, scale: Tensor | None, bias: Tensor | None, positions: Tensor, cos: Tensor, sin: Tensor,
            k_cache: Tensor, v_cache: Tensor, slot_mapping: Tensor, q_heads: int, kv_heads: int) -> Tensor:
    return torch.ops.specdec_cpu.rope_kv(qkv, scale, bias, positions, cos, sin, k_cache, v_cache, slot_mapping,
                                         q_heads, kv_heads)


def decode_layers(x: Tensor, positions: Tensor, slot_mapping: Tensor, block_tables: Tensor, prefix_lens: Tensor,
                  query_start_loc: Tensor, tree_mask: Tensor | None, cos: Tensor, sin: Tensor,
                  k_caches: list[Tensor], v_caches: list[Tensor], weights: object, final_norm: Tensor, q_heads: int,
                  kv_heads: int, eps: float, scale: float, timings: Tensor | None = None) -> Tensor:
    """Every decoder layer (as many as `k_caches`) and the final norm in one call (forward.cpp); `x` (the
    embeddings) is updated in place into the residual stream, and the final-norm hidden states are returned.
    `weights` comes from `layer_weights`. `timings` [3] float64 accumulates seconds in linears, attention and
    the rest (bench/profile_step.py)."""
    return torch.ops.specdec_cpu.decode_layers(x, positions, slot_mapping, block_tables, prefix_lens, query_start_loc,
                                               tree_mask, cos, sin, k_caches, v_caches, weights, final_norm, q_heads,
                                               kv_heads, eps, scale, timings)


def eagle_layer(embeds: Tensor, features: Tensor, positions: Tensor, ctx: object, cache: tuple[Tensor, Tensor],
                rope: object, weights: object, q_heads: int, kv_heads: int, eps: float, scale: float) -> Tensor:
    """The EAGLE-1/2 predictor's layer in one call (forward.cpp): hidden `[T, H]` of the rows `embeds`,
    `features`, their K/V written into `cache` at `ctx`'s slots. `weights` as eagle_fast builds it."""
    return torch.ops.specdec_cpu.eagle_layer(embeds, features, positions, ctx.slot_mapping, ctx.block_tables,
                                             ctx.prefix_lens, ctx.query_start_loc, ctx.tree_mask, rope.cos, rope.sin,
                                             cache[0], cache[1], weights, q_heads, kv_heads, eps, scale)


def layer_weights(params: list[Tensor | None], kinds: list[int]) -> object:
    """The decoder layers' weights held on the C++ side for decode_layers: per layer the two norm weights, then
    (a, b, c, bias) for qkv, o, gate_up and down, with `kinds` their formats (0 float weight; 8 and 4 QLinear)."""
    return torch.classes.specdec_cpu.LayerWeights(params, kinds)
