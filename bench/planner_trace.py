"""What the depth plan sees, request by request: its acceptance estimates, step-cost prices and chosen depths.

    OMP_NUM_THREADS=1 python bench/planner_trace.py [--drafter recycle] [--temperature 0.7] [--top-p 0.9]

Unseeded sampled requests at T > 0 sometimes leave the planner at depth 0 for whole requests (tau 1.00) where
full trees gain (bench/results/sampled_speed/README.md). This wraps `SpeculationPlanner.plan` and prints, after
each dev prompt (one per category, 128 new tokens, int8, one thread): the request's tau, how many of its plans
chose depth 0, and at its last plan the blended per-depth acceptance estimates (beta) and the predicted step
time for 1, 3 and 5 tokens (ms), i.e. the inputs that decide between depth 0 and a tree.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specdec import LLM, SamplingParams  # noqa: E402
from specdec.data import CATEGORIES, bench_prompts  # noqa: E402
from specdec.engine import planner as planner_module  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--drafter", default="recycle")
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--top-p", type=float, default=0.9)
    args = parser.parse_args()
    torch.set_num_threads(1)
    plans: list[tuple[int, list[float] | None, list[float] | None]] = []
    plan = planner_module.SpeculationPlanner.plan

    def traced(self, seqs, spec, prefill_tokens=0, closed=False, waiting_left=0):
        depths = plan(self, seqs, spec, prefill_tokens, closed, waiting_left)
        cost = self._decode_cost(prefill_tokens)
        betas = self._blend(seqs[0], self._prior(spec.depth)) if cost else None
        prices = [cost.predict(n) * 1e3 for n in (1, 3, 5)] if cost else None
        plans.append((depths[0], betas, prices))
        return depths

    planner_module.SpeculationPlanner.plan = traced
    llm = LLM("smollm2-135m", drafter=args.drafter, quantize="int8", show_progress=False, num_threads=1)
    params = SamplingParams(max_new_tokens=128, temperature=args.temperature, top_p=args.top_p)
    print(f"{args.drafter}, T={args.temperature}, top-p {args.top_p}, unseeded, dev prompts one per category")
    print("| prompt | tau | plans | depth 0 | last betas | last price 1/3/5 tokens (ms) |\n|---|---|---|---|---|---|")
    for c in CATEGORIES:
        prompt = bench_prompts([c], "dev")[0]
        out = llm.generate([prompt["prompt"]], params)[0]
        _, betas, prices = plans[-1] if plans else (0, None, None)
        show = (lambda xs: " ".join(f"{x:.2f}" for x in xs) if xs else "-")  # noqa: E731
        print(f"| {prompt['id']} | {out.metrics.mean_accepted_tokens:.2f} | {len(plans)} | "
              f"{sum(1 for d, _, _ in plans if d == 0)} | {show(betas)} | {show(prices)} |")
        plans.clear()


if __name__ == "__main__":
    main()
