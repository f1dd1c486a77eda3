"""Stochastic trees (children drawn from the draft distribution) against one-hot top-k trees at T > 0.

Mean accepted tokens per target step (tau, the bonus token counted) for the `draft` and `eagle` drafters on
the default model, at T=0.7, on the bench prompts of the test split (the package's own prompts), with the full
tree drafted every step. Both tree kinds are measured in one process on the same prompts and seeds, all
prompts batched; only tau is compared (with the full tree every step it does not depend on timing or load).

    python bench/sampled_trees.py [--prompts 12] [--tokens 48] [--temperature 0.7 --temperature 1.0]
                                  [--tree dynamic:depth=4,topk=4,budget=12] [--out bench/results/x.md]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from specdec.api import LLM
from specdec.config import EngineConfig, SamplingParams
from specdec.data import bench_prompts
from specdec.models.loader import load_model


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=12)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--temperature", type=float, action="append", default=None)
    parser.add_argument("--tree", action="append", default=None)
    parser.add_argument("--drafters", default="draft,eagle")
    parser.add_argument("--out", default=None, help="also write the table as markdown here")
    args = parser.parse_args()
    temperatures = args.temperature or [0.7]
    torch.set_num_threads(1)
    trees = args.tree or ["dynamic:depth=4,topk=4,budget=12", "dynamic:depth=5,topk=8,budget=20"]
    prompts = [p["prompt"] for p in bench_prompts(split="test")]
    step = max(1, len(prompts) // args.prompts)
    prompts = prompts[::step][: args.prompts]
    loaded = load_model("smollm2-135m", show_progress=False)
    config = EngineConfig(adaptive_speculation=False, max_num_seqs=len(prompts))
    llm = LLM.from_loaded(loaded, engine_config=config)
    header = (f"{len(prompts)} prompts (test split), {args.tokens} new tokens; tau = tokens per target step, "
              "the full tree drafted every step")
    print(header)
    lines = [f"`{' '.join(['python bench/sampled_trees.py'] + sys.argv[1:])}`", "", header, "",
             "| drafter | tree | T | one-hot tau | sampled tau | ratio |", "|---|---|---|---|---|---|"]
    for temperature in temperatures:
        params = [SamplingParams(max_new_tokens=args.tokens, temperature=temperature, seed=1000 + i,
                                 ignore_eos=True) for i in range(len(prompts))]
        for drafter in args.drafters.split(","):
            for tree in trees:
                tau = {}
                for mode in ("topk", "sampled"):  # the same prompts and seeds; tau does not depend on timing
                    llm.use(f"{drafter}:trees={mode}", tree)
                    outs = llm.generate(prompts, params)
                    tau[mode] = sum(o.metrics.mean_accepted_tokens for o in outs) / len(outs)
                ratio = tau["sampled"] / tau["topk"]
                print(f"{drafter:6s} {tree:34s} T={temperature}  one-hot tau {tau['topk']:.3f}  sampled tau "
                      f"{tau['sampled']:.3f}  ratio {ratio:.3f}", flush=True)
                lines.append(f"| {drafter} | `{tree}` | {temperature} | {tau['topk']:.3f} | {tau['sampled']:.3f} "
                             f"| {ratio:.3f} |")
                if args.out:
                    Path(args.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
