"""Does a model drafter pay inside a hybrid if it drafts only the first depth or two? Interleaved speed.

    OMP_NUM_THREADS=1 python bench/hybrid_part_depth.py [--split dev] [--per-category 2]
        [--methods "none;hybrid:suffix+recycle;hybrid:suffix+recycle+eagle@1"]

`<hybrid>@N` runs the hybrid with its `eagle` part limited to depth N (the lookup parts keep the tree's depth):
EAGLE's depth-1 guess is its most accurate and each depth costs a predictor call, so a shallow EAGLE beside
lookups that extend deeper might win more than it costs. The limit is patched in for the experiment (the hybrid
has no per-part depth option). One int8 target, one thread, greedy, 128 new tokens; every prompt runs through
every method in turn; the table gives tok/s, the ratio to the first method and tau.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specdec import LLM, SamplingParams  # noqa: E402
from specdec.data import CATEGORIES, bench_prompts  # noqa: E402
from bench.generate_totals import GenerateTotals  # noqa: E402
from specdec.drafters import hybrid as hybrid_module  # noqa: E402

LIMIT: dict[str, int] = {}  # part name -> deepest depth it drafts


def limited_proposals(real):
    def proposals(drafter, seqs, spec):
        depth = LIMIT.get(drafter.name)
        return real(drafter, seqs, spec.limited(min(depth, spec.depth)) if depth else spec)
    return proposals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--methods", default="none;hybrid:suffix+recycle;hybrid:suffix+recycle+eagle@1;"
                                             "hybrid:suffix+recycle+eagle@2")
    parser.add_argument("--split", default="dev")
    parser.add_argument("--per-category", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(1)
    hybrid_module.scored_proposals = limited_proposals(hybrid_module.scored_proposals)
    llm = LLM("smollm2-135m", quantize="int8", show_progress=False, num_threads=1)
    methods = args.methods.split(";")
    prompts = [p["prompt"] for c in CATEGORIES if c != "code"
               for p in bench_prompts([c], args.split)[: args.per_category]]
    params = SamplingParams(max_new_tokens=128, temperature=0.0)

    def use(method: str) -> None:
        spec, _, depth = method.partition("@")
        LIMIT.clear()
        if depth:
            LIMIT["eagle"] = int(depth)
        llm.use(spec)

    for method in methods:  # warm-up
        use(method)
        llm.generate([prompts[0]], params)
    totals = GenerateTotals(methods)
    for prompt in prompts:
        for method in methods:
            use(method)
            totals.timed(method, llm, prompt, params)
    print(f"{len(prompts)} {args.split} prompts (code left out, as the suite does), greedy, 128 new tokens, int8, "
          "one thread")
    print(totals.table())


if __name__ == "__main__":
    main()
