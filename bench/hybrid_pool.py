"""Is a hybrid's tau limited by how it picks its nodes, or by what its parts propose? Offline, per step.

    OMP_NUM_THREADS=1 python bench/hybrid_pool.py --methods "hybrid:suffix+eagle:depth=1;hybrid:suffix+recycle"

Every step of a hybrid merges its parts' proposals into one trie (the pool) and keeps the `budget` nodes the
calibration rates most likely to be accepted. Each method generates greedily for the prompts (int8 target, one
thread; tau does not depend on timing), and every step's pool is recorded beside the tree it verified. Once a
prompt's output is known, each step's continuation is known too, so for every step this gives:

* `verified`: how far the continuation follows the tree the step verified (what the engine accepted);
* `best of pool, N nodes`: how far it follows the best path of the pool that N nodes can hold (a path of depth
  d takes d nodes): what a perfect choice of N nodes among the same proposals would have accepted;
* `pool`: how far it follows the pool with no budget at all.

If `verified` is close to `best of pool` at the tree's budget, better ranking cannot help: only better
proposals can. A second table splits the verified nodes by who proposed them and their depth, with the share
of each kind the verifier accepted: where rows are dear, a kind accepted rarely is a kind to cut.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specdec import LLM, SamplingParams  # noqa: E402
from specdec.data import CATEGORIES, bench_prompts  # noqa: E402
from specdec.drafters import hybrid  # noqa: E402
from specdec.drafters.hybrid_merge import MergedTree  # noqa: E402

POOL_BUDGET = 10_000  # "no budget": every node of every part's proposal


@dataclass
class Step:
    seq: object  # the Sequence (its tokens are read once the prompt is done)
    position: int  # tokens before this step's first drafted one
    merged: MergedTree  # the tree the hybrid proposed
    pool: MergedTree  # every proposed node, ranked the same way
    verified: list[int] = field(default_factory=list)  # merged nodes the engine verified (planner cuts)
    accepted: list[int] = field(default_factory=list)  # of those, the accepted ones


class Recorder:
    """Patches the hybrid to record each step's pool, verified nodes and accepted nodes."""

    def __init__(self) -> None:
        self.steps: list[Step] = []
        self._pending: dict[int, Step] = {}
        real_merge, real_propose, real_observe = (hybrid.merge_trees, hybrid.HybridDrafter.propose,
                                                  hybrid.HybridDrafter.observe_verified)
        current: list = []

        def merge(proposals, calibration, budget, depth, min_prob=0.0):
            merged = real_merge(proposals, calibration, budget, depth, min_prob)
            seq = current[0]
            step = Step(seq, seq.num_tokens, merged, real_merge(proposals, calibration, POOL_BUDGET, depth, 0.0))
            self._pending[seq.seq_id] = step
            self.steps.append(step)
            return merged

        def propose(drafter, seqs, spec):
            out = []
            for seq in seqs:  # one at a time, so that `merge` knows whose pool it is
                current[:] = [seq]
                out += real_propose(drafter, [seq], spec)
            return out

        def observe(drafter, seqs, trees, logits, results):
            for seq, tree, result in zip(seqs, trees, results):
                step = self._pending.pop(seq.seq_id, None)
                if step is None:
                    continue
                deepest = int(tree.depth.max())
                kept = [i for i, d in enumerate(step.merged.depths) if d <= deepest]
                if len(kept) == len(tree):  # else the context's end cut the tree: leave the step unverified
                    step.verified = kept[1:]
                    step.accepted = [kept[a] for a in result.accepted_nodes if a]
            return real_observe(drafter, seqs, trees, logits, results)

        hybrid.merge_trees = merge
        hybrid.HybridDrafter.propose = propose
        hybrid.HybridDrafter.observe_verified = observe


def followed(tree: MergedTree, continuation: list[int]) -> list[int]:
    """The depth of each pool node on the path the continuation follows, deepest last (empty: none)."""
    children: dict[int, dict[int, int]] = collections.defaultdict(dict)
    for i in range(1, len(tree.tokens)):
        children[tree.parents[i]][tree.tokens[i]] = i
    node, path = 0, []
    for token in continuation:
        node = children[node].get(token, -1)
        if node < 0:
            break
        path.append(node)
    return path


def summarize(steps: list[Step], budgets: list[int], part_names: list[str]) -> tuple[dict, dict]:
    totals: collections.Counter = collections.Counter()
    kinds: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    for step in steps:
        if not step.verified:
            continue
        full = step.seq.prompt_ids + step.seq.output_ids
        continuation = full[step.position: step.position + 64]
        totals["steps"] += 1
        verified = set(step.verified)  # a depth cut of the merged tree: its followed path's verified nodes lead
        totals["verified"] += len(list(itertools.takewhile(verified.__contains__, followed(step.merged, continuation))))
        depth = len(followed(step.pool, continuation))
        totals["pool"] += depth
        for budget in budgets:
            totals[f"best{budget}"] += min(depth, budget)
        totals["pool_nodes"] += len(step.pool.tokens) - 1
        totals["verified_nodes"] += len(step.verified)
        accepted = set(step.accepted)
        for node in step.verified:
            mask, node_depth = step.merged.sources[node], step.merged.depths[node]
            who = "+".join(name for i, name in enumerate(part_names) if mask >> i & 1)
            entry = kinds[f"{who}, depth {min(node_depth, 3)}{'+' if node_depth >= 3 else ''}"]
            entry[0] += 1
            entry[1] += node in accepted
    return totals, dict(kinds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", default="hybrid:suffix+eagle:depth=1;hybrid:suffix+recycle")
    parser.add_argument("--split", default="dev")
    parser.add_argument("--per-category", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--budgets", default="2,3,4,6,8", help="node budgets for the best-of-pool columns")
    args = parser.parse_args()
    torch.set_num_threads(1)
    budgets = [int(b) for b in args.budgets.split(",")]
    recorder = Recorder()
    llm = LLM("smollm2-135m", quantize="int8", show_progress=False, num_threads=1)
    prompts = [p["prompt"] for c in CATEGORIES if c != "code"
               for p in bench_prompts([c], args.split)[: args.per_category]]
    params = SamplingParams(max_new_tokens=args.new_tokens, temperature=0.0)
    rows, kind_rows = [], []
    for method in args.methods.split(";"):
        llm.use(method)
        names = [name for name, _ in llm.engine.drafter.parts]
        llm.generate(prompts[:1], SamplingParams(max_new_tokens=8))  # warm-up
        recorder.steps.clear()
        for prompt in prompts:
            llm.generate([prompt], params)
        totals, kinds = summarize(recorder.steps, budgets, names)
        n = max(totals["steps"], 1)
        rows.append(f"| `{method}` ({llm.tree_spec.describe()}) | {totals['steps']} | "
                    f"{1 + totals['verified'] / n:.3f} | "
                    + " | ".join(f"{1 + totals[f'best{b}'] / n:.3f}" for b in budgets)
                    + f" | {1 + totals['pool'] / n:.3f} | {totals['verified_nodes'] / n:.2f} | "
                      f"{totals['pool_nodes'] / n:.2f} |")
        for kind, (verified, accepted) in sorted(kinds.items()):
            kind_rows.append(f"| `{method}` | {kind} | {verified / n:.2f} | {accepted / max(verified, 1):.2f} |")
        print(rows[-1], flush=True)
    print(f"\n{len(prompts)} {args.split} prompts, {args.new_tokens} new tokens, int8 target, greedy; tau per "
          "step: 1 + the tokens the continuation follows\n")
    print("| method (tree) | steps | verified | " + " | ".join(f"best of pool, {b} nodes" for b in budgets)
          + " | pool | nodes verified a step | nodes in the pool a step |")
    print("|---|---|---|" + "---|" * len(budgets) + "---|---|---|")
    print("\n".join(rows))
    print("\n| method | verified nodes, by proposer and depth | a step | accepted |\n|---|---|---|---|")
    print("\n".join(kind_rows))


if __name__ == "__main__":
    main()
