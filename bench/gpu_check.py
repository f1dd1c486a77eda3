"""One-command check of the Triton kernels on a GPU: copy bandwidth, correctness at real sizes, timing.

    python bench/gpu_check.py                      # one H200: under 8 minutes, bf16, llama-3-8b attention
    python bench/gpu_check.py --device cpu --tiny  # the same code on CPU (Triton interpreter, fp32), < 60 s

The script is a list of *sections*, functions `(Setup, rows so far) -> rows`, run in order; a new check is one
more function appended to SECTIONS. Every row is a flat dict with a `section` key. The JSON (all rows) goes to
bench/results/gpu_check_<device>.json, a compact table is printed last, and the exit status is 1 when any
correctness row failed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a bare checkout (the GPU machine has no editable install)

from bench.kernel_inputs import Shapes, World, bytes_moved, make_world, tree_mask  # noqa: E402

REL_TOL = {torch.bfloat16: 2e-2, torch.float16: 5e-3, torch.float32: 1e-4}  # ||out - ref|| / ||ref||


@dataclass(frozen=True)
class Setup:
    device: torch.device
    shapes: Shapes
    reps: int  # timed repetitions per measurement (median reported)
    budget_s: float  # correctness and timing skip the remaining cases past this wall time
    started: float  # time.perf_counter() at start


Section = Callable[[Setup, list[dict]], list[dict]]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_ms(fn: Callable[[], object], setup: Setup, flush: torch.Tensor | None = None) -> float:
    """Median time of `fn` after one warm-up call (compilation). On CUDA, events around each call, and the L2
    is flushed before each so repeated calls are not served from cache; on CPU, a host clock."""
    fn()
    sync(setup.device)
    times = []
    for _ in range(setup.reps):
        if flush is not None:
            flush.zero_()
        if setup.device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def copy_bandwidth(setup: Setup, rows: list[dict]) -> list[dict]:
    """Device copy bandwidth (bytes read + written per second): the ceiling the attention timings are read
    against, since attention over a long context is bound by reading K/V."""
    nbytes = (64 << 20) if setup.shapes.tiny else (4 << 30)
    src = torch.randn(nbytes // 4, device=setup.device)
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src), setup)
    return [{"section": "bandwidth", "case": f"copy {nbytes >> 20} MiB", "ms": ms, "GB/s": 2 * nbytes / ms / 1e6}]


def _cases(shapes: Shapes):
    """(context, batch, tree nodes or None for decode), small first so a tight budget still covers sizes."""
    for ctx in shapes.contexts:
        for batch in shapes.batches:
            for nodes in (*shapes.trees, None):
                yield ctx, batch, nodes


def _label(ctx: int, batch: int, nodes: int | None) -> str:
    return f"ctx={ctx} B={batch} " + ("decode" if nodes is None else f"tree={nodes}")


def _over_budget(setup: Setup, share: float) -> bool:
    """True once the run has used `share` of its time budget (correctness stops at half, timing at all)."""
    return time.perf_counter() - setup.started > share * setup.budget_s


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    diff = out.float() - ref.float()
    return (diff.norm() / ref.float().norm().clamp_min(1e-30)).item(), diff.abs().max().item()


def correctness(setup: Setup, rows: list[dict]) -> list[dict]:
    """Every Triton kernel against the torch reference (fp32 upcast) on random data, shuffled block tables,
    varying prefix lengths; kernel outputs come from a NaN-filling allocator so unwritten rows fail."""
    from specdec.kernels import reference
    from specdec.kernels import triton as tk
    from specdec.kernels.triton.attention import AttentionTuning, attention

    def nan_alloc(shape, *, dtype, device):
        return torch.full(shape, float("nan"), dtype=dtype, device=device)

    result, world, tol = [], None, REL_TOL[setup.shapes.dtype]
    for ctx, batch, nodes in _cases(setup.shapes):
        row = {"section": "correctness", "case": _label(ctx, batch, nodes)}
        if _over_budget(setup, 0.5):
            result.append({**row, "skipped": "time budget"})
            continue
        if world is None or (world.ctx, world.batch) != (ctx, batch):
            world = None  # free the previous one first
            world = make_world(setup.shapes, ctx, batch, setup.device, seed=ctx + batch)
        n = 1 if nodes is None else nodes
        q, mask = world.queries(n), None if nodes is None else tree_mask(batch, nodes, setup.device)
        if nodes is None:
            out = tk.decode_attention(q, world.k_cache, world.v_cache, world.block_tables, world.prefix + 1, world.scale)
        else:
            args = (world.block_tables, world.prefix, world.starts(n), mask, world.scale)
            out = attention(q, world.k_cache, world.v_cache, *args, tuning=AttentionTuning(), alloc=nan_alloc)
        ref = _reference(reference, world, q, n, mask)
        sync(setup.device)
        rel, worst = _rel_err(out, ref)
        name = "decode_attention" if nodes is None else "paged_attention"
        result.append({**row, "kernel": name, "rel_err": rel, "max_abs": worst, "passed": rel < tol})
    result.extend(_kv_ops_rows(setup, reference, tk))
    return result


def _reference(reference, world: World, q: torch.Tensor, n: int, mask: torch.Tensor | None) -> torch.Tensor:
    """The reference in fp32, one sequence per call: the padded batched reference would hold a
    [B, Hq, n, L] fp32 score tensor (17 GB at B=32, 32k, 128 nodes) if SDPA falls back to its math kernel."""
    wide_k, wide_v = world.k_cache.float(), world.v_cache.float()
    starts = torch.tensor([0, n], dtype=torch.int32, device=q.device)
    parts = []
    for b in range(world.batch):
        rows = slice(b * n, (b + 1) * n)
        args = (world.block_tables[b : b + 1], world.prefix[b : b + 1], starts, None if mask is None else mask[rows])
        parts.append(reference.paged_attention(q[rows].float(), wide_k, wide_v, *args, world.scale))
    return torch.cat(parts)


def _kv_ops_rows(setup: Setup, reference, tk) -> list[dict]:
    """write_kv and an overlapping copy_kv_slots (a shifted run of slots) must match the reference exactly."""
    shapes, gen = setup.shapes, torch.Generator(device=setup.device).manual_seed(5)
    cache_shape = (256, shapes.page, shapes.kv_heads, shapes.head_dim)
    k_cache = torch.randn(cache_shape, device=setup.device, generator=gen).to(shapes.dtype)
    v_cache = torch.randn(cache_shape, device=setup.device, generator=gen).to(shapes.dtype)
    tokens = 64 if shapes.tiny else 2048
    k = torch.randn(tokens, shapes.kv_heads, shapes.head_dim, device=setup.device, generator=gen)
    v = torch.randn_like(k)
    slots = torch.randperm(256 * shapes.page, device=setup.device, generator=gen)[:tokens]
    rows = []
    for name in ("write_kv", "copy_kv_slots"):
        ours, theirs = (k_cache.clone(), v_cache.clone()), (k_cache.clone(), v_cache.clone())
        if name == "write_kv":
            tk.write_kv(k, v, *ours, slots)
            reference.write_kv(k, v, *theirs, slots)
        else:
            src = torch.arange(tokens, device=setup.device) + 7
            tk.copy_kv_slots(*ours, src, src - 5)
            reference.copy_kv_slots(*theirs, src, src - 5)
        sync(setup.device)
        same = all(torch.equal(a, b) for a, b in zip(ours, theirs))
        rows.append({"section": "correctness", "case": f"{tokens} rows", "kernel": name, "passed": same})
    return rows


def timing(setup: Setup, rows: list[dict]) -> list[dict]:
    """Triton attention vs torch SDPA with an explicit dense mask on K/V gathered and expanded to the q heads
    beforehand (untimed; expanded because SDPA's mask-taking memory-efficient kernel has no GQA, and
    `enable_gqa` with a mask falls back to the math kernel), and flash-attn decode when importable. `frac_bw`
    is achieved bytes/s (the fewest bytes: K/V read once + q + out) over the measured copy bandwidth."""
    from specdec.kernels import triton as tk

    copy_gbps = next((r["GB/s"] for r in rows if r["section"] == "bandwidth"), float("nan"))
    flush = torch.empty(256 << 18, dtype=torch.float32, device=setup.device) if setup.device.type == "cuda" else None
    try:
        from flash_attn import flash_attn_func  # type: ignore[import-not-found]
    except ImportError:
        flash_attn_func = None
    result, world = [], None
    for ctx, batch, nodes in _cases(setup.shapes):
        row = {"section": "timing", "case": _label(ctx, batch, nodes)}
        if _over_budget(setup, 1.0):
            result.append({**row, "skipped": "time budget"})
            continue
        if world is None or (world.ctx, world.batch) != (ctx, batch):
            world = None
            world = make_world(setup.shapes, ctx, batch, setup.device, seed=ctx * batch, ragged=False)
        n = 1 if nodes is None else nodes
        q, starts = world.queries(n), world.starts(n)
        mask = None if nodes is None else tree_mask(batch, nodes, setup.device)
        if nodes is None:
            ms = median_ms(lambda: tk.decode_attention(q, world.k_cache, world.v_cache, world.block_tables,
                                                       world.prefix + 1, world.scale), setup, flush)  # fmt: skip
        else:
            ms = median_ms(lambda: tk.paged_attention(q, world.k_cache, world.v_cache, world.block_tables,
                                                      world.prefix, starts, mask, world.scale), setup, flush)  # fmt: skip
        dense_q, dense_k, dense_v, dense_mask = world.dense(q, n, mask)
        sdpa = torch.nn.functional.scaled_dot_product_attention
        sdpa_ms = median_ms(lambda: sdpa(dense_q, dense_k, dense_v, attn_mask=dense_mask, scale=world.scale),
                            setup, flush)  # fmt: skip
        gbps = bytes_moved(world, n) / ms / 1e6
        row.update(triton_ms=ms, sdpa_ms=sdpa_ms, speedup=sdpa_ms / ms, **{"GB/s": gbps, "frac_bw": gbps / copy_gbps})
        if flash_attn_func is not None and nodes is None and (world.prefix == world.prefix[0]).all():
            fa_q, fa_k, fa_v = (t.transpose(1, 2) for t in (dense_q, dense_k, dense_v))
            row["flash_attn_ms"] = median_ms(lambda: flash_attn_func(fa_q, fa_k, fa_v, causal=True), setup, flush)
        result.append(row)
        del dense_q, dense_k, dense_v, dense_mask
    return result


from bench.gpu_end_to_end import end_to_end  # noqa: E402  (a section that needs the helpers above)

SECTIONS: tuple[Section, ...] = (copy_bandwidth, correctness, timing, end_to_end)


def print_table(rows: list[dict]) -> None:
    """One small table per section, columns = the keys its rows use."""
    def fmt(value: object) -> str:
        return f"{value:.3g}" if isinstance(value, float) else str(value)

    for section in dict.fromkeys(r["section"] for r in rows):
        part = [r for r in rows if r["section"] == section]
        keys = [k for k in dict.fromkeys(k for r in part for k in r) if k != "section"]
        cells = [[fmt(r.get(k, "")) for k in keys] for r in part]
        widths = [max(len(k), *(len(c[i]) for c in cells)) for i, k in enumerate(keys)]
        print(f"\n[{section}]")
        print("  ".join(k.ljust(w) for k, w in zip(keys, widths)))
        for c in cells:
            print("  ".join(v.ljust(w) for v, w in zip(c, widths)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu (Triton interpreter)")
    parser.add_argument("--tiny", action="store_true", help="tiny shapes, fp32: a smoke test of the code path")
    parser.add_argument("--reps", type=int, default=None, help="timed repetitions (default 20, tiny 2)")
    parser.add_argument("--budget-s", type=float, default=None, help="wall-time budget (default 420, tiny 50)")
    parser.add_argument("--out", type=Path, default=None, help="JSON path (default bench/results/gpu_check_<device>.json)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cpu":
        if not args.tiny:
            print("--device cpu runs the Triton interpreter: add --tiny", file=sys.stderr)
            return 2
        os.environ["TRITON_INTERPRET"] = "1"  # before specdec.kernels.triton is first imported, in a section
    elif not torch.cuda.is_available():
        print("no CUDA device: run with --device cpu --tiny", file=sys.stderr)
        return 2
    shapes = Shapes.tiny_cpu() if args.tiny else Shapes.llama3_8b()
    setup = Setup(device, shapes, args.reps or (2 if args.tiny else 20), args.budget_s or (50.0 if args.tiny else 420.0),
                  time.perf_counter())  # fmt: skip
    rows: list[dict] = []
    for section in SECTIONS:
        rows.extend(section(setup, rows))
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    out = args.out or ROOT / "bench" / "results" / f"gpu_check_{device.type}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"device": name, "torch": torch.__version__, "dtype": str(shapes.dtype), "wall_s": time.perf_counter() - setup.started}
    out.write_text(json.dumps({**meta, "rows": rows}, indent=1))
    print_table(rows)
    failed = [r["case"] for r in rows if r.get("passed") is False]
    print(f"\n{name}: {len(rows)} rows, {len(failed)} failed, {meta['wall_s']:.0f} s -> {out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
