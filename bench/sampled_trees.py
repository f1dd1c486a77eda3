"""Stochastic trees (children drawn from the draft distribution) against one-hot top-k trees at T > 0.

Mean accepted tokens per target step (tau, the bonus token counted) for the `draft` and `eagle` drafters on
the default model (int8), at T=0.7, for one-hot trees (`trees=topk`), stochastic trees with fixed widths per
depth (`trees=sampled-fixed`) and stochastic trees whose depths' nodes go to the likeliest paths
(`trees=sampled`), on the bench prompts of the test split (the package's own prompts), with the full
tree drafted every step. All modes are measured in one process on the same prompts and seeds, all
prompts batched; only tau is compared (with the full tree every step it does not depend on timing or load).

    python bench/sampled_trees.py [--prompts 12] [--tokens 48] [--temperature 0.7 --temperature 1.0]
                                  [--tree dynamic:depth=4,topk=4,budget=12] [--out bench/results/x.md]
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

import torch

from specdec.api import LLM
from specdec.config import EngineConfig, SamplingParams
from specdec.data import bench_prompts
from specdec.spec_strings import with_options


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=12)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--temperature", type=float, action="append", default=None)
    parser.add_argument("--tree", action="append", default=None)
    parser.add_argument("--drafters", default="draft,eagle")
    parser.add_argument("--quantize", default="int8", help="int8 (the default target's bench setting) or none")
    parser.add_argument("--modes", default="trees=topk;trees=sampled-fixed;trees=sampled",
                        help="drafter options to compare, ';'-separated (first = baseline)")
    parser.add_argument("--out", default=None, help="also write the table as markdown here")
    args = parser.parse_args()
    temperatures = args.temperature or [0.7]
    torch.set_num_threads(1)
    trees = args.tree or ["dynamic:depth=4,topk=4,budget=12", "dynamic:depth=5,topk=8,budget=20"]
    prompts = [p["prompt"] for p in bench_prompts(split="test")]
    step = max(1, len(prompts) // args.prompts)
    prompts = prompts[::step][: args.prompts]
    config = EngineConfig(adaptive_speculation=False, max_num_seqs=len(prompts))
    llm = LLM("smollm2-135m", quantize=None if args.quantize == "none" else args.quantize, engine_config=config,
              show_progress=False, num_threads=1)
    modes = args.modes.split(";")
    header = (f"{len(prompts)} prompts (test split), {args.tokens} new tokens; tau = tokens per target step, "
              "the full tree drafted every step")
    print(header)
    lines = [f"`{shlex.join(['python', 'bench/sampled_trees.py'] + sys.argv[1:])}`", "", header, "",
             "| drafter | tree | T | " + " | ".join(f"`{m}` tau" for m in modes)
             + " | " + " | ".join(f"{m} vs {modes[0]}" for m in modes[1:]) + " |",
             "|---" * (3 + 2 * len(modes) - 1) + "|"]
    for temperature in temperatures:
        params = [SamplingParams(max_new_tokens=args.tokens, temperature=temperature, seed=1000 + i,
                                 ignore_eos=True) for i in range(len(prompts))]
        for drafter in args.drafters.split(","):
            for tree in trees:
                tau = {}
                for mode in modes:  # the same prompts and seeds; tau does not depend on timing
                    llm.use(with_options(drafter, mode), tree)
                    outs = llm.generate(prompts, params)
                    tau[mode] = sum(o.metrics.mean_accepted_tokens for o in outs) / len(outs)
                ratios = [tau[m] / tau[modes[0]] for m in modes[1:]]
                print(f"{drafter:6s} {tree:34s} T={temperature}  " + "  ".join(f"{m} {tau[m]:.3f}" for m in modes)
                      + "  ratios " + " ".join(f"{r:.3f}" for r in ratios), flush=True)
                lines.append(f"| {drafter} | `{tree}` | {temperature} | " + " | ".join(f"{tau[m]:.3f}" for m in modes)
                             + " | " + " | ".join(f"{r:.3f}" for r in ratios) + " |")
                if args.out:
                    Path(args.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
