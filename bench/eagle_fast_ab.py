"""EAGLE's draft forward by path, in one process: drafting ms per target step, tau and end-to-end tok/s.

    OMP_NUM_THREADS=1 python bench/eagle_fast_ab.py [--methods "eagle|chain:k=4;hybrid:suffix+eagle|chain:k=3"]
                                                   [--split test] [--per-category 2] [--tokens 128] [--rounds 2]
                                                   [--paths module,one-call]

Paths (`specdec/drafters/heads/eagle_fast.py`): `module` (the predictor's torch module, about forty ops),
`kernels` (the compiled kernels called one by one from Python) and `one-call` (the whole layer in one kernel
call, `eagle_layer`; what ships). The ratio column is each path's tok/s over the first path's.

int8 default target, greedy, batch 1, one thread. Each round runs every method once with the module path and
once with the kernel path (which goes first alternates), on the same prompts. With `--adaptive` off (the
default) every step drafts the full tree, so drafting per step is the price of the tree's depths; the outputs
of both paths are plain decode's either way (greedy speculation is lossless). Plain decode runs once a round
too: a chain's drafting per depth is reported against its step (the first depth also carries the catch-up of
the tokens the last step accepted).
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time

import torch

from specdec.api import LLM
from specdec.config import EngineConfig, SamplingParams
from specdec.data import bench_prompts
from specdec.drafters.heads import eagle_fast


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--methods", default="eagle|chain:k=4;hybrid:suffix+eagle|chain:k=3")
    parser.add_argument("--split", default="test")
    parser.add_argument("--per-category", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--adaptive", action="store_true", help="let the planner choose depths, as generate does")
    parser.add_argument("--paths", default="module,one-call", help="comma list of module, kernels, one-call")
    args = parser.parse_args()
    torch.set_num_threads(1)
    prompts, seen = [], {}
    for record in bench_prompts(split=args.split):
        if seen.setdefault(record["category"], 0) < args.per_category:
            seen[record["category"]] += 1
            prompts.append(record["prompt"])
    llm = LLM("smollm2-135m", quantize="int8", show_progress=False, num_threads=1,
              engine_config=EngineConfig(adaptive_speculation=args.adaptive))
    params = SamplingParams(max_new_tokens=args.tokens)
    paths = args.paths.split(",")
    if not paths or not set(paths) <= set(PATHS):
        raise SystemExit(f"--paths takes a comma list of {', '.join(PATHS)}")
    real = (eagle_fast.applies, eagle_fast._one_call_weights)
    totals: dict[tuple[str, str], list[float]] = {}
    plain = [0.0, 0.0]  # seconds and target steps of plain decode, the price a depth is compared with
    for round_index in range(args.rounds):
        llm.use("none")
        for prompt in prompts:
            start = time.perf_counter()
            out = llm.generate([prompt], params)[0]
            plain[0] += time.perf_counter() - start
            plain[1] += out.metrics.target_steps
        for spec in args.methods.split(";"):
            drafter, _, tree = spec.partition("|")
            for path in paths if round_index % 2 == 0 else paths[::-1]:
                use_path(path, real)
                llm.use(drafter, tree or None)
                total = totals.setdefault((spec, path), [0.0, 0.0, 0.0, 0.0])
                for prompt in prompts:
                    start = time.perf_counter()
                    out = llm.generate([prompt], params)[0]
                    total[0] += time.perf_counter() - start
                    total[1] += len(out.token_ids)
                    total[2] += out.metrics.target_steps
                    total[3] += out.metrics.draft_time_s
    use_path("one-call", real)
    step_ms = 1e3 * plain[0] / plain[1]
    print(f"`OMP_NUM_THREADS=1 {shlex.join(['python', 'bench/eagle_fast_ab.py'] + sys.argv[1:])}`\n")
    print(f"{len(prompts)} {args.split} prompts x {args.rounds} rounds, {args.tokens} new tokens, int8, greedy, "
          f"batch 1; a plain step (prefill included) {step_ms:.2f} ms\n")
    print(f"| method | path | drafting ms/step | per depth, of a plain step | tau | tok/s | tok/s over {paths[0]} |")
    print("|---|---|---|---|---|---|---|")
    for spec in args.methods.split(";"):
        first = totals[(spec, paths[0])]
        tree = spec.partition("|")[2]
        depth = int(tree.split("=")[1]) if tree.startswith("chain:k=") else None
        for path in paths:
            seconds, tokens, steps, draft = totals[(spec, path)]
            ratio = (tokens / seconds) / (first[1] / first[0])
            per_depth = f"{1e5 * draft / steps / depth / step_ms:.1f}%" if depth else "-"
            print(f"| `{spec.replace('|', chr(92) + '|')}` | {path} | {1e3 * draft / steps:.2f} | {per_depth} "
                  f"| {tokens / steps:.3f} | {tokens / seconds:.1f} | {ratio:.3f}x |")


PATHS = ("module", "kernels", "one-call")


def use_path(path: str, real: tuple) -> None:
    """Route EAGLE's draft forward through `path` (`real`: eagle_fast's own `applies` and `_one_call_weights`)."""
    applies, one_call = real
    eagle_fast.applies = applies if path != "module" else (lambda *a: False)
    eagle_fast._one_call_weights = one_call if path == "one-call" else (lambda predictor: None)


if __name__ == "__main__":
    main()
