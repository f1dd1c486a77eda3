"""Where a batch-1 target step's time goes on a GPU: torch.profiler over the runner's decode and tree steps.

    python bench/gpu_step_profile.py                          # dummy:llama-3-8b, bf16, cuda
    python bench/gpu_step_profile.py --device cpu --target dummy:tiny-llama --dtype float32   # smoke test

bench/gpu_check.py's end-to-end row showed a decode step of dummy:llama-3-8b on an H200 taking 45 ms, where
reading 16 GB of weights takes under 4 ms: the step is bound by the host, not the chip. This prints, for a
decode step and a 64-node tree step (the same calls `ModelRunner.run` makes in the engine): wall time per step,
the GPU's busy time per step (the sum of its kernels), and the operators with the most host time, so the
overhead can be attacked where it is. With `--graph` (CUDA only), each step's model forward is also captured
once in a CUDA graph and replayed: the time a step would take with the host's launch work gone, and the largest
difference between the replayed and the eager logits (the forward must not depend on host values that change).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # a bare checkout: the GPU machine has no install

from specdec.engine.runner import Chunk, ModelRunner, pack  # noqa: E402
from specdec.kvcache import BlockTable  # noqa: E402
from specdec.models.loader import load_model  # noqa: E402
from specdec.tree.token_tree import TokenTree  # noqa: E402


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def graph_replay(runner: ModelRunner, chunk: Chunk, context: int, steps: int) -> dict:
    """Capture the model forward of one packed step in a CUDA graph, replay it `steps` times: ms per replay and
    the max |replayed - eager| logit. The cache keeps the step's slots only while this runs."""
    device = runner.device
    packed = pack(runner.cache, [chunk], device)
    rows = torch.arange(len(chunk.tokens), dtype=torch.int64, device=device)

    def forward() -> torch.Tensor:
        return runner.model(packed.tokens, packed.positions, packed.ctx, runner.cache.layers, logits_rows=rows).logits

    try:
        eager = forward().clone()
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):  # warm-up off the default stream, as capture requires
            for _ in range(3):
                forward()
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = forward()
        graph.replay()
        _sync(device)
        diff = (captured.float() - eager.float()).abs().max().item()
        started = time.perf_counter()
        for _ in range(steps):
            graph.replay()
        _sync(device)
        return {"graph_ms": (time.perf_counter() - started) * 1e3 / steps, "graph_max_abs_diff": diff}
    except Exception as error:  # a capture failure is a finding, not a crash of the whole check
        return {"graph_error": f"{type(error).__name__}: {error}"[:300]}
    finally:
        runner.cache.truncate(chunk.table, context)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="dummy:llama-3-8b")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--top", type=int, default=25, help="operators listed per table")
    parser.add_argument("--graph", action="store_true", help="also replay each step's forward as a CUDA graph")
    parser.add_argument("--out", type=Path, default=None, help="JSON of the timings (optional)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    loaded = load_model(args.target, device, args.dtype, show_progress=False)
    vocab = loaded.model.config.vocab_size
    runner = ModelRunner.create(loaded.model, num_blocks=(args.context + 2 * args.nodes) // 16 + 8, block_size=16)
    rng = random.Random(0)
    table = BlockTable()
    prompt = [rng.randrange(vocab) for _ in range(args.context)]
    runner.run([Chunk(table, prompt, list(range(args.context)), None, "none")])
    parents = [-1] + [rng.randrange(i) for i in range(1, args.nodes)]
    tree = TokenTree.from_parents([rng.randrange(vocab) for _ in range(args.nodes)], parents)
    positions = tree.positions(args.context).tolist()
    chunks = {"decode": Chunk(table, [prompt[-1]], [args.context], None, "all"),
              f"tree{args.nodes}": Chunk(table, tree.tokens.tolist(), positions, tree.ancestor_mask, "all")}
    steps = {name: (lambda chunk=chunk: runner.run([chunk])) for name, chunk in chunks.items()}
    report: dict[str, dict] = {"target": args.target, "device": str(device), "dtype": args.dtype}
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    for name, step in steps.items():
        for _ in range(3):  # warm-up: compilation, allocator
            step()
            runner.cache.truncate(table, args.context)
        _sync(device)
        started = time.perf_counter()
        for _ in range(args.steps):
            step()
            runner.cache.truncate(table, args.context)
        _sync(device)
        wall_ms = (time.perf_counter() - started) * 1e3 / args.steps
        with profile(activities=activities) as prof:
            for _ in range(args.steps):
                step()
                runner.cache.truncate(table, args.context)
            _sync(device)
        events = prof.key_averages()
        # The kernels themselves (device-side events), not the aten operators that also carry their time.
        device_us = sum(e.self_device_time_total for e in events if e.device_type == DeviceType.CUDA)
        launches = sum(e.count for e in events if e.key.startswith(("cudaLaunchKernel", "cuLaunchKernel")))
        busy_ms = device_us / 1e3 / args.steps
        report[name] = {"wall_ms": wall_ms, "device_busy_ms": busy_ms, "launches_per_step": launches / args.steps}
        print(f"\n== {name}: {wall_ms:.2f} ms per step (unprofiled), device busy {busy_ms:.2f} ms, "
              f"{launches / args.steps:.0f} kernel launches per step")
        print(events.table(sort_by="self_cpu_time_total", row_limit=args.top, max_name_column_width=60))
        if device.type == "cuda":
            print(events.table(sort_by="self_device_time_total", row_limit=12, max_name_column_width=60))
        if args.graph and device.type == "cuda":
            report[name].update(graph_replay(runner, chunks[name], args.context, args.steps))
            print(f"   CUDA graph replay of the forward: {report[name]}")
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
