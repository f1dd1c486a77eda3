"""What the depth plan promised against what its steps delivered, by chosen depth, at batch 1.

    OMP_NUM_THREADS=1 python bench/plan_accuracy.py [--drafter draft] [--split test] [--per-category 2]
        [--max-new-tokens 128]

`draft` and `medusa` run below plain decode at batch 1 (0.93x in the bench suite) while the plan keeps choosing
to speculate: its goodput estimate says a step pays. This wraps the planner (int8 target, one thread, greedy)
and groups the steps of one request at a time by the depth the plan chose, with, for each depth: how many
steps; the drafted tokens the plan expected accepted (its per-depth estimates summed) and how many were; the
target forward's price on the step-cost curve and its measured time; the drafting's price and measured time;
and the step's wall time (plan to next plan) with what lies outside the forward and the drafting, which no
price covers. Tokens per millisecond of wall time, against depth 0's, is what each depth really earned.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specdec import LLM, SamplingParams  # noqa: E402
from specdec.data import CATEGORIES, bench_prompts  # noqa: E402
from specdec.engine import planner as planner_module  # noqa: E402

Planner = planner_module.SpeculationPlanner


class StepRecorder:
    """Wraps the planner's plan and observations; one record per decode step of a lone request."""

    def __init__(self) -> None:
        self.steps: list[dict] = []
        self.current: dict | None = None

    def install(self) -> None:
        plan, forward, draft, step = Planner.plan, Planner.observe_forward, Planner.observe_draft, Planner.observe_step
        recorder = self

        def traced_plan(self, seqs, spec, prefill_tokens=0, closed=False, waiting_left=0):
            now = time.perf_counter()
            recorder.close(now)
            depths = plan(self, seqs, spec, prefill_tokens, closed, waiting_left)
            cost = self._decode_cost(prefill_tokens)
            if cost is not None and len(seqs) == 1 and not prefill_tokens:
                depth = depths[0]
                betas = self._blend(seqs[0], self._prior(spec.depth))
                draft_price = self.draft_cost.predict(1) * depth if depth and self.draft_cost.known else 0.0
                recorder.current = dict(start=now, depth=depth, expected=sum(betas[:depth]),
                                        forward_price=cost.predict(1 + spec.nodes_within(depth)),
                                        draft_price=draft_price, draft=0.0)
            return depths

        def traced_forward(self, tokens, seconds, prefill_tokens=0):
            if recorder.current is not None and not prefill_tokens:
                recorder.current["forward"] = seconds
            return forward(self, tokens, seconds, prefill_tokens)

        def traced_draft(self, depth, seconds, num_seqs=1):
            if recorder.current is not None:
                recorder.current["draft"] = seconds
            return draft(self, depth, seconds, num_seqs)

        def traced_step(self, tree_depth, accepted):
            if recorder.current is not None:
                recorder.current["accepted"] = accepted
            return step(self, tree_depth, accepted)

        Planner.plan, Planner.observe_forward = traced_plan, traced_forward
        Planner.observe_draft, Planner.observe_step = traced_draft, traced_step

    def close(self, now: float) -> None:
        """The step begun at the last plan ends here."""
        step, self.current = self.current, None
        if step is not None and "forward" in step and "accepted" in step:
            step["wall"] = now - step.pop("start")
            self.steps.append(step)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--drafter", default="draft")
    parser.add_argument("--split", default="test")
    parser.add_argument("--per-category", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    args = parser.parse_args()
    torch.set_num_threads(1)
    recorder = StepRecorder()
    recorder.install()
    llm = LLM("smollm2-135m", drafter=args.drafter, quantize="int8", show_progress=False, num_threads=1)
    params = SamplingParams(max_new_tokens=args.max_new_tokens)
    llm.generate(["Hello"], SamplingParams(max_new_tokens=8))  # warm-up
    recorder.steps.clear()
    for prompt in [p["prompt"] for c in CATEGORIES for p in bench_prompts([c], args.split)[: args.per_category]]:
        llm.generate([prompt], params)
        recorder.current = None  # its last step has no next plan to end it
    by_depth: dict[int, list[dict]] = defaultdict(list)
    for step in recorder.steps:
        by_depth[step["depth"]].append(step)

    def mean(rows: list[dict], key) -> float:
        return statistics.mean(key(r) for r in rows)

    plain = by_depth.get(0)
    plain_rate = len(plain) / sum(r["wall"] for r in plain) if plain else None
    print(f"{args.drafter}, {args.split} prompts ({args.per_category} per category), greedy, int8, one thread, "
          f"{args.max_new_tokens} new tokens; ms are means per step")
    print("| depth | steps | expected accepted | accepted | forward price | forward | drafting price | drafting | "
          "wall | outside | tokens per ms vs depth 0 |\n|---|---|---|---|---|---|---|---|---|---|---|")
    for depth, rows in sorted(by_depth.items()):
        rate = sum(1 + r["accepted"] for r in rows) / sum(r["wall"] for r in rows)
        print(f"| {depth} | {len(rows)} | {mean(rows, lambda r: r['expected']):.2f} | "
              f"{mean(rows, lambda r: r['accepted']):.2f} | {mean(rows, lambda r: r['forward_price']) * 1e3:.2f} | "
              f"{mean(rows, lambda r: r['forward']) * 1e3:.2f} | {mean(rows, lambda r: r['draft_price']) * 1e3:.2f} | "
              f"{mean(rows, lambda r: r['draft']) * 1e3:.2f} | {mean(rows, lambda r: r['wall']) * 1e3:.2f} | "
              f"{mean(rows, lambda r: r['wall'] - r['forward'] - r['draft']) * 1e3:.2f} | "
              f"{f'{rate / plain_rate:.2f}x' if plain_rate else '-'} |")


if __name__ == "__main__":
    main()
