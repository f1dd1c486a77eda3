"""Node planning against the depth plan, interleaved per prompt group in one process (issue 12's A/B).

    python bench/node_planning_ab.py --split dev --methods "none;suffix|chain:k=3;ngram|chain:k=4;recycle" --per-category 2 --batch 1 --new-tokens 128
    python bench/node_planning_ab.py --split test --methods "none;suffix|chain:k=3;ngram|chain:k=3;recycle" --per-category 6 --batch 12 --new-tokens 64

Each drafter runs twice, each time with its own engine and planner: once with the depth plan (the default) and
once with node planning (`nodes=1`). Every group of `--batch` prompts runs through every variant back to back,
so the ratios compare runs seconds apart. With `--batch` above 1 each group is a closed batch (`ignore_eos`).
Greedy outputs are checked against plain decode's (`mismatches`). Prints tok/s, the ratio to plain decode and
tau per variant; node/depth of one drafter is the A/B.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specdec import LLM, SamplingParams  # noqa: E402
from specdec.data import bench_prompts  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--split", default="dev")
    parser.add_argument("--methods", default="none;suffix|chain:k=3;ngram|chain:k=4;recycle")
    parser.add_argument("--per-category", type=int, default=2)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--new-tokens", type=int, default=128)
    args = parser.parse_args()
    llm = LLM("smollm2-135m", quantize="int8", show_progress=False, num_threads=1)
    by_category: dict[str, list[str]] = {}
    for p in bench_prompts(split=args.split):
        by_category.setdefault(p["category"], []).append(p["prompt"])
    prompts = [p for ps in by_category.values() for p in ps[: args.per_category]]
    params = SamplingParams(max_new_tokens=args.new_tokens, ignore_eos=args.batch > 1)
    variants = {}
    for method in args.methods.split(";"):
        drafter, _, tree = method.partition("|")
        for mode in ("depth", "node") if drafter != "none" else ("-",):
            spec = drafter if mode != "node" else drafter + (",nodes=1" if ":" in drafter else ":nodes=1")
            llm.use(spec, tree or None)
            variants[(method, mode)] = (llm.drafter, llm.engine)
    totals = {key: [0.0, 0, 0, 0] for key in variants}  # seconds, tokens, target steps, mismatching groups
    for start in range(0, len(prompts), args.batch):
        group = prompts[start: start + args.batch]
        plain = None
        for key, (drafter, engine) in variants.items():
            llm.drafter, llm.engine = drafter, engine
            t0 = time.perf_counter()
            outs = llm.generate(group, params)
            total = totals[key]
            total[0] += time.perf_counter() - t0
            total[1] += sum(len(o.token_ids) for o in outs)
            total[2] += sum(o.metrics.target_steps for o in outs)
            ids = [o.token_ids for o in outs]
            if key[0] == "none":
                plain = ids
            elif ids != plain:
                total[3] += 1
    base = totals[("none", "-")][1] / totals[("none", "-")][0]
    for (method, mode), (seconds, tokens, steps, bad) in totals.items():
        rate = tokens / seconds
        print(f"{method:40s} {mode:5s} {rate:6.1f} tok/s  {rate / base:.3f}x  tau {tokens / max(steps, 1):.2f}"
              f"  mismatches {bad}")


if __name__ == "__main__":
    main()
