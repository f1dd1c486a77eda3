"""How much can stochastic trees gain over one-hot top-k trees at T > 0? An upper bound, measured.

At a node given k children, the one-hot rule (draw x ~ p, accept if x is a child) accepts with probability
p(S) for the set S of children: for the top-k children of the drafter's q that is `onehot = p(topk(q))`.
No lossless rule can do better on a fixed S (the emitted token is distributed as p). Children drawn at random
(from q without replacement, at any draft temperature) are accepted, by any lossless rule, with probability at
most `sum_x min(p(x), pi(x))`, pi(x) being the chance that x is drawn among the k (the emitted token must equal
a drawn child; the two events' joint probability is at most the smaller of their probabilities). With
sum pi = k and pi <= 1, that is also at most `oracle = p(topk(p))`, whatever the drafter does.

This script runs the default model at T=0.7 with one-hot trees and, at the root of every verified tree, takes
the target's processed distribution p and the drafter's root logits, and reports, for k = 1..4 children:
the one-hot acceptance, the stochastic bound for q drawn at several multiples of the request's temperature
(pi estimated from `--draws` Gumbel top-k draws over q's `--support` likeliest tokens, the rest one item),
and the oracle bound. If the stochastic bound is not well above the one-hot acceptance at every width, no
stochastic tree drawn from this q can raise tau much over the one-hot tree of the same shape.

    python bench/sampled_tree_bound.py [--prompts 48] [--tokens 64] [--out bench/results/sampled_tree_bound.md]
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections import defaultdict
from pathlib import Path

import torch
from torch import Tensor

import specdec.engine.engine as engine_module
from specdec.api import LLM
from specdec.config import EngineConfig, SamplingParams
from specdec.data import bench_prompts
from specdec.drafters.model_drafter import ModelDrafter
from specdec.sampling import target_probs
from specdec.spec_strings import with_options

WIDTHS = (1, 2, 3, 4)


class RootStats:
    """Running sums of the acceptance quantities over every recorded root."""

    def __init__(self, draft_temps: list[float], draws: int, support: int) -> None:
        self.draft_temps, self.draws, self.support = draft_temps, draws, support
        self.sums: dict[str, float] = defaultdict(float)
        self.roots = 0
        self.generator = torch.Generator().manual_seed(0)

    def add(self, p: Tensor, draft_logits: Tensor, params: SamplingParams) -> None:
        self.roots += 1
        top_q = draft_logits.topk(max(WIDTHS)).indices
        top_p = p.topk(max(WIDTHS)).values.cumsum(0)
        for k in WIDTHS:
            self.sums[f"onehot{k}"] += float(p[top_q[:k]].sum())
            self.sums[f"oracle{k}"] += float(top_p[k - 1])
        for t in self.draft_temps:
            q = target_probs((draft_logits.float() / t)[None], params)[0]
            inclusion = self._inclusion(q)
            for k in WIDTHS:
                bound = torch.minimum(p, inclusion[k - 1]).sum()
                self.sums[f"bound{k}@{t}"] += float(bound)

    def _inclusion(self, q: Tensor) -> list[Tensor]:
        """pi(x) for k = 1..4 draws without replacement from q (Monte Carlo, Gumbel top-k), as [V] rows. The
        tokens outside q's `support` likeliest are one item, their pi spread in proportion to q over them."""
        values, index = q.topk(min(self.support, q.numel()))
        rest = float(q.sum() - values.sum())
        weights = torch.cat([values, torch.tensor([max(rest, 0.0)])])
        logw = weights.clamp_min(1e-30).log().masked_fill(weights <= 0, float("-inf"))
        gumbel = -torch.log(-torch.log(torch.rand(self.draws, weights.numel(), generator=self.generator)
                                       .clamp(1e-12, 1 - 1e-12)))
        order = (logw + gumbel).topk(max(WIDTHS), dim=-1).indices  # [draws, 4]
        rows = []
        counts = torch.zeros(weights.numel())
        outside = torch.ones_like(q, dtype=torch.bool)
        outside[index] = False
        spread = torch.where(outside, q, torch.zeros_like(q))
        spread = spread / spread.sum() if rest > 0 else spread
        for k in WIDTHS:
            counts += torch.bincount(order[:, k - 1], minlength=weights.numel()).float()
            pi = torch.zeros_like(q)
            pi[index] = counts[:-1] / self.draws
            pi = pi + spread * float(counts[-1] / self.draws)  # the tail item's expected draws, spread over it
            rows.append(pi)
        return rows



def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=48)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--drafters", default="eagle,draft")
    parser.add_argument("--tree", default="dynamic:depth=4,topk=4,budget=12")
    parser.add_argument("--draft-temps", default="0.5,0.7,1.0,1.5,2.0",
                        help="multiples of the request's temperature that q is drawn at")
    parser.add_argument("--draws", type=int, default=4096)
    parser.add_argument("--support", type=int, default=512)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    draft_temps = [float(t) for t in args.draft_temps.split(",")]
    prompts = [p["prompt"] for p in bench_prompts(split="test")]
    step = max(1, len(prompts) // args.prompts)
    prompts = prompts[::step][: args.prompts]
    params = [SamplingParams(max_new_tokens=args.tokens, temperature=args.temperature, seed=1000 + i,
                             ignore_eos=True) for i in range(len(prompts))]
    llm = LLM("smollm2-135m", quantize="int8", show_progress=False, num_threads=1,
              engine_config=EngineConfig(adaptive_speculation=False, max_num_seqs=len(prompts)))

    roots: dict[int, Tensor] = {}  # id(tree) -> the drafter's root logits (full vocabulary)
    original_trees = ModelDrafter._trees

    def recording_trees(self, seqs, tables, root, spec):
        logits, ids = self._logits(root)
        full = self._full_vocab(logits.float(), ids)
        trees = original_trees(self, seqs, tables, root, spec)
        for (tree, _), row in zip(trees, full):
            roots[id(tree)] = row
        return trees

    original_rule = engine_module.sampled_rule
    stats: RootStats | None = None

    def recording_rule(rule, config):
        verify = original_rule(rule, config)

        def wrapped(tree, logits, params, gen):
            row = roots.pop(id(tree), None)
            if row is not None and stats is not None:
                stats.add(target_probs(logits[:1], params)[0], row, params)
            return verify(tree, logits, params, gen)

        return wrapped

    ModelDrafter._trees = recording_trees
    engine_module.sampled_rule = recording_rule
    command = shlex.join(["python", "bench/sampled_tree_bound.py"] + sys.argv[1:])
    lines = [f"`{command}`", "",
             f"{len(prompts)} test prompts, {args.tokens} new tokens, T={args.temperature}, one-hot trees "
             f"`{args.tree}`; at the root of every verified tree, the chance of accepting one of k children:", "",
             "| drafter | roots | k | one-hot p(topk q) | stochastic bound, best draft temp (at) | "
             "bound / one-hot | oracle p(topk p) | oracle / one-hot |",
             "|---|---|---|---|---|---|---|---|"]
    for drafter in args.drafters.split(","):
        stats = RootStats(draft_temps, args.draws, args.support)
        llm.use(with_options(drafter, "trees=topk"), args.tree)
        outs = llm.generate(prompts, params)
        tau = sum(o.metrics.mean_accepted_tokens for o in outs) / len(outs)
        n = stats.roots
        for k in WIDTHS:
            onehot = stats.sums[f"onehot{k}"] / n
            best_t = max(draft_temps, key=lambda t: stats.sums[f"bound{k}@{t}"])
            bound = stats.sums[f"bound{k}@{best_t}"] / n
            oracle = stats.sums[f"oracle{k}"] / n
            all_t = " ".join(f"{t}:{stats.sums[f'bound{k}@{t}'] / n:.3f}" for t in draft_temps)
            print(f"{drafter} tau {tau:.3f} roots {n} k={k} onehot {onehot:.3f} bound {all_t} oracle {oracle:.3f}",
                  flush=True)
            lines.append(f"| {drafter} | {n} | {k} | {onehot:.3f} | {bound:.3f} ({best_t}) | {bound / onehot:.3f} "
                         f"| {oracle:.3f} | {oracle / onehot:.3f} |")
        if args.out:
            Path(args.out).write_text("\n".join(lines) + "\n")
    ModelDrafter._trees = original_trees
    engine_module.sampled_rule = original_rule


if __name__ == "__main__":
    main()
