"""What do extra query rows cost in the CPU paged attention? One layer of SmolLM2-135M's shape, by rows and keys.

    OMP_NUM_THREADS=1 python bench/attention_rows.py                      # the kernels this checkout builds
    OMP_NUM_THREADS=1 python bench/attention_rows.py --library old.so --library new.so --rounds 4
    OMP_NUM_THREADS=1 python bench/attention_rows.py --cache float32,bfloat16 --rows 1,4,7,12 --contexts 256,1024
    OMP_NUM_THREADS=1 python bench/attention_rows.py --cold --rows 1,4,8 --contexts 256,1024   # K/V from memory

One sequence's rows (a decode row, or the nodes of a star tree: each sees the committed keys, the root and
itself) against a committed prefix of `--contexts` keys in a paged fp32 cache, 9 query heads over 3 KV heads of
64, one thread: microseconds per call, best of `--repeats` timings of `--calls` calls. With `--library` (a
built `specdec_cpu_*.so`, as under ~/.cache/specdec/kernels) each library runs in its own process, the
libraries interleaved round by round so that drift on a shared machine hits them alike; the table gives each
one's best round. `--cache` names the K/V cache precisions to time (bfloat16: the AMX tiles' kernel,
attention_amx.cpp, where the CPU has AMX-BF16), each a row of the table.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import torch

HEADS, KV_HEADS, HEAD_DIM, PAGE = 9, 3, 64, 16


COLD_POOL = 4096  # pages in the cold cache's pool, the block table's pages scattered over it
COLD_FLUSH = 8 << 20  # float32 elements written before each cold call: 32 MiB


def time_calls(attention, rows: int, context: int, calls: int, repeats: int,
               cache: torch.dtype = torch.float32, cold: bool = False) -> float:
    """Microseconds per call of `attention` for `rows` query rows over `context` committed keys. `cold`: each
    call timed alone after 32 MiB of writes, its pages scattered over a pool of 4,096, as in the engine, where
    the linears between two layers' attention push that layer's K and V out of the caches (the median call)."""
    gen = torch.Generator().manual_seed(0)
    blocks = (context + rows + PAGE - 1) // PAGE
    pool = max(blocks, COLD_POOL) if cold else blocks
    k_cache = torch.randn(pool, PAGE, KV_HEADS, HEAD_DIM, generator=gen).to(cache)
    v_cache = torch.randn(pool, PAGE, KV_HEADS, HEAD_DIM, generator=gen).to(cache)
    q = torch.randn(rows, HEADS, HEAD_DIM, generator=gen)
    pages = torch.randperm(pool, generator=gen)[:blocks] if cold else torch.arange(blocks)
    table = pages.to(torch.int32)[None]
    prefix = torch.tensor([context], dtype=torch.int32)
    starts = torch.tensor([0, rows], dtype=torch.int32)
    mask = torch.tensor([[1 | (1 << r)] for r in range(rows)], dtype=torch.int32) if rows > 1 else None
    args = (q, k_cache, v_cache, table, prefix, starts, mask, HEAD_DIM ** -0.5)
    for _ in range(10):
        attention(*args)
    if cold:
        junk = torch.zeros(COLD_FLUSH)
        times = []
        for _ in range(repeats * min(calls, 40)):
            junk.add_(1.0)
            start = time.perf_counter()
            attention(*args)
            times.append(time.perf_counter() - start)
        return sorted(times)[len(times) // 2] * 1e6
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            attention(*args)
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
    return best


def measure(library: str | None, rows: list[int], contexts: list[int], calls: int, repeats: int,
            cache: torch.dtype = torch.float32, cold: bool = False) -> dict:
    torch.set_num_threads(1)
    if library:
        torch.ops.load_library(library)
    else:
        from specdec.kernels import cpu

        if not cpu.available():
            raise SystemExit("the compiled CPU kernels are not available here")
    attention = torch.ops.specdec_cpu.paged_attention
    return {f"{c}x{r}": time_calls(attention, r, c, calls, repeats, cache, cold) for c in contexts for r in rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,4,9")
    parser.add_argument("--contexts", default="64,256,512")
    parser.add_argument("--library", action="append", default=[], help="a built kernel library (repeatable)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cache", default="float32", help="comma list of K/V cache dtypes")
    parser.add_argument("--cold", action="store_true", help="time each call after flushing the caches (as in the "
                        "engine, where a layer's K/V arrive from memory)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    rows = [int(x) for x in args.rows.split(",")]
    contexts = [int(x) for x in args.contexts.split(",")]
    if args.worker or not args.library:
        if args.worker:
            print(json.dumps(measure(args.library[0], rows, contexts, args.calls, args.repeats,
                                     getattr(torch, args.cache), args.cold)))
            return
        results = {f"this checkout, {name} cache": measure(None, rows, contexts, args.calls, args.repeats,
                                                            getattr(torch, name), args.cold)
                   for name in args.cache.split(",")}
    else:
        results: dict[str, dict] = {}
        caches = args.cache.split(",")
        for _ in range(args.rounds):
            for cache in caches:
                for library in args.library:
                    out = subprocess.run([sys.executable, __file__, "--worker", "--library", library, "--rows",
                                          args.rows, "--contexts", args.contexts, "--calls", str(args.calls),
                                          "--repeats", str(args.repeats), "--cache", cache]
                                         + (["--cold"] if args.cold else []),
                                         check=True, capture_output=True, text=True)
                    got = json.loads(out.stdout)
                    best = results.setdefault(library if len(caches) == 1 else f"{library}, {cache} cache", got)
                    for key, value in got.items():
                        best[key] = min(best[key], value)
    keys = [f"{c}x{r}" for c in contexts for r in rows]
    print("| kernels | " + " | ".join(f"{k.split('x')[0]} keys, {k.split('x')[1]} rows (us)" for k in keys) + " |")
    print("|---|" + "---|" * len(keys))
    for name, result in results.items():
        print(f"| {name} | " + " | ".join(f"{result[k]:.1f}" for k in keys) + " |")


if __name__ == "__main__":
    main()
