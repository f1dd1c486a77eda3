"""Token Recycling from a warm matrix against an empty one, each request on a fresh drafter.

    OMP_NUM_THREADS=1 python bench/recycle_warm.py --split test --per-category 2 --new-tokens 128

A new `specdec generate` process builds its drafter once, for one request: the shipped warm matrix
(`specdec/assets/recycle/`) is then all the drafter knows at its first step. So here every request gets a
drafter built anew (`LLM.use`), as such a process would; the bench suite, by contrast, runs a category's prompts
one after another on one drafter, which learns as it goes. Methods run interleaved prompt by prompt, greedy,
int8, batch 1, the planner on (as `specdec generate` runs), one thread; each method's tok/s is over the same
prompts' plain decode. Writes bench/results/recycle_warm/<split>.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from specdec.api import LLM
from specdec.config import EngineConfig, SamplingParams
from specdec.data import CATEGORIES, bench_prompts

RESULTS = Path(__file__).resolve().parent / "results" / "recycle_warm"
METHODS = "none;recycle:warm=none;recycle;hybrid:suffix+recycle:warm=none;hybrid:suffix+recycle"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--split", default="test", choices=("dev", "test"))
    parser.add_argument("--per-category", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--methods", default=METHODS, help="';'-separated 'drafter[|tree]' specs, 'none' first")
    parser.add_argument("--no-adaptive", action="store_true", help="planner off: every step verifies the full tree "
                                                                     "(tau of the drafter alone)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    methods = args.methods.split(";")
    records = bench_prompts(split=args.split)
    prompts = [(c, r["prompt"]) for c in CATEGORIES
               for r in [r for r in records if r["category"] == c][: args.per_category]]
    llm = LLM("smollm2-135m", quantize="int8", show_progress=False, num_threads=1,
              engine_config=EngineConfig(adaptive_speculation=not args.no_adaptive))
    params = SamplingParams(max_new_tokens=args.new_tokens)
    llm.generate(["Warm up."], SamplingParams(max_new_tokens=8))
    totals = {m: {"seconds": 0.0, "tokens": 0, "accepted": 0, "steps": 0, "same": 0} for m in methods}
    for n, (category, prompt) in enumerate(prompts):
        reference = None
        for method in methods:
            drafter, _, tree = method.partition("|")
            llm.use(drafter, tree or None)  # a fresh drafter: what a new process starts from
            start = time.perf_counter()
            out = llm.generate([prompt], params)[0]
            seconds = time.perf_counter() - start
            t = totals[method]
            t["seconds"] += seconds
            t["tokens"] += len(out.token_ids)
            t["accepted"] += sum(out.metrics.accepted_per_step)
            t["steps"] += out.metrics.target_steps
            reference = out.token_ids if reference is None else reference
            t["same"] += out.token_ids == reference
        print(f"{n + 1}/{len(prompts)} {category}", flush=True)
    plain = totals[methods[0]]
    rows = []
    for method in methods:
        t = totals[method]
        speed = t["tokens"] / t["seconds"]
        rows.append({"method": method, "tok_s": round(speed, 2),
                     "speedup": round(speed / (plain["tokens"] / plain["seconds"]), 3),
                     "tau": round(t["accepted"] / max(1, t["steps"]), 3),
                     "same_as_plain": f"{t['same']}/{len(prompts)}"})
    command = (f"OMP_NUM_THREADS=1 python bench/recycle_warm.py --split {args.split} --per-category "
               f"{args.per_category} --new-tokens {args.new_tokens} --methods '{args.methods}'"
               + (" --no-adaptive" if args.no_adaptive else ""))
    lines = [f"Command: `{command}`", "", f"{len(prompts)} {args.split} prompts, each method on a fresh drafter per "
             f"request, interleaved; {time.strftime('%Y-%m-%d %H:%M')}.", "",
             f"| method | tok/s | over plain | tau (planner {'off' if args.no_adaptive else 'on'}) | same output as "
             "plain |", "|---|---|---|---|---|"]
    lines += [f"| {r['method']} | {r['tok_s']} | {r['speedup']:.2f}x | {r['tau']:.2f} | {r['same_as_plain']} |"
              for r in rows]
    out = args.out or RESULTS / (args.split + ("_full_trees" if args.no_adaptive else ""))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    out.with_suffix(".json").write_text(json.dumps({"command": command, "rows": rows}, indent=1) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
