"""Prompt seed rows at the prefill (as before `specdec/engine/prompt_seeds.py`) against at the first draft, in
closed batches, interleaved in one process:

    OMP_NUM_THREADS=1 python bench/ab_prompt_seeds.py [--requests 64] [--repeats 3]

Methods ending in `:old` seed at the prefill and never treat the planner as idle; the others run as shipped.
Prints each method's output tok/s over plain decode's in the same repeat.
"""

from __future__ import annotations

import argparse
import time

from specdec.api import LLM
from specdec.config import EngineConfig, SamplingParams
from specdec.data import bench_prompts
from specdec.engine.planner import SpeculationPlanner

METHODS = ("none", "recycle:old", "recycle", "hybrid:suffix+recycle:old", "hybrid:suffix+recycle")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    args = parser.parse_args()
    prompts = [p["prompt"] for p in bench_prompts(split="test")] + [p["prompt"] for p in bench_prompts(split="dev")]
    llm = LLM("smollm2-135m", quantize="int8", show_progress=False, num_threads=1,
              engine_config=EngineConfig(max_num_seqs=64))
    params = SamplingParams(max_new_tokens=args.max_new_tokens)
    llm.generate(prompts[-4:], params)  # warm-up
    shipped_idle = SpeculationPlanner.idle
    speed: dict[str, list[float]] = {m: [] for m in METHODS}
    for _ in range(args.repeats):
        for method in METHODS:
            old = method.endswith(":old")
            llm.use(method.removesuffix(":old"), None)
            SpeculationPlanner.idle = property(lambda self: False) if old else shipped_idle
            llm.engine.seeds.deferred = not old
            start = time.perf_counter()
            outs = llm.generate(prompts[: args.requests], params)
            speed[method].append(sum(len(o.token_ids) for o in outs) / (time.perf_counter() - start))
    SpeculationPlanner.idle = shipped_idle
    for method in METHODS:
        ratios = [a / b for a, b in zip(speed[method], speed["none"])]
        print(f"{method:28s} " + " ".join(f"{r:.3f}" for r in ratios) + f"  mean {sum(ratios) / len(ratios):.3f}")


if __name__ == "__main__":
    main()
