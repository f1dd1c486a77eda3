"""Speculation in a closed batch: every request at once, nobody waiting behind them (the serving bench's burst).

    python bench/closed_batch.py [--requests 24] [--max-num-seqs 64] [--methods "none;suffix;ngram|chain:k=3"]

All requests go through `LLM.generate` together, on the int8 default target with one thread. Each method runs
`--repeats` times, interleaved with the others. The bench reports output tok/s against the first method, tau,
and how many target forwards the batch took.

A closed batch ends with its slowest sequence. If speculation leaves the slowest one as slow as before, it
saves no forwards, and its extra verified rows only make some of them wider. With `--max-num-seqs` below
`--requests`, the rest wait in the queue, and a sequence that finishes early lets the next request start.
"""

from __future__ import annotations

import argparse
import time

from specdec.api import LLM
from specdec.config import EngineConfig, SamplingParams
from specdec.data import bench_prompts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=24)
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--methods", default="none;suffix;ngram|chain:k=3",
                        help="'drafter|tree;...' (first = baseline)")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    prompts = [p["prompt"] for p in bench_prompts(split="test")][: args.requests]
    llm = LLM("smollm2-135m", quantize="int8", show_progress=False, num_threads=1,
              engine_config=EngineConfig(max_num_seqs=args.max_num_seqs))
    params = SamplingParams(max_new_tokens=args.max_new_tokens)
    methods = args.methods.split(";")
    llm.generate(prompts[:4], params)  # warm-up
    speed: dict[str, list[float]] = {m: [] for m in methods}
    for repeat in range(args.repeats):
        for method in methods:
            drafter, _, tree = method.partition("|")
            llm.use(drafter, tree or None)
            forwards = 0
            run = llm.engine.runner.run

            def counted(*a, **k):
                nonlocal forwards
                forwards += 1
                return run(*a, **k)

            llm.engine.runner.run = counted
            start = time.perf_counter()
            outs = llm.generate(prompts, params)
            seconds = time.perf_counter() - start
            del llm.engine.runner.run  # back to the class's method
            tokens = sum(len(o.token_ids) for o in outs)
            tau = sum(o.metrics.mean_accepted_tokens for o in outs) / len(outs)
            speed[method].append(tokens / seconds)
            print(f"run {repeat}  {method:24s} {tokens / seconds:6.1f} tok/s  tau {tau:.2f}  "
                  f"{forwards} target forwards", flush=True)
    base = sum(speed[methods[0]])
    print(f"{len(prompts)} requests at once, max_num_seqs {args.max_num_seqs}, {args.max_new_tokens} new tokens:")
    for method in methods:
        print(f"  {method:24s} {sum(speed[method]) / base:.3f}x of {methods[0]}")


if __name__ == "__main__":
    main()
