"""Sampled decoding speed at batch 1: plain decode and drafters at a temperature (and top-p), interleaved.

    OMP_NUM_THREADS=1 python bench/sampled_speed.py [--methods "none;hybrid:suffix+recycle;eagle;recycle"]
        [--temperature 0.7] [--top-p 0.9] [--repetition-penalty 1.0] [--frequency-penalty 0.0]
        [--split dev] [--per-category 1] [--max-new-tokens 128] [--unseeded]

`specdec bench` measures greedy decoding; users of a chat API mostly sample. One int8 target, one thread; each
prompt runs through every method in turn (seed = the prompt's index, so every method samples from the same
seeded stream), and the table gives tok/s over all prompts, the ratio to the first method and tau (tokens per
target step). A seeded request always verifies its drafter's whole tree (the planner may not shape it, or its
output would depend on what runs beside it); `--unseeded` sends no seed, so the planner sizes every tree.
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--methods", default="none;hybrid:suffix+recycle;eagle;recycle")
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--top-p", type=float, default=0.9)
    parser.add_argument("--repetition-penalty", type=float, default=1.0)
    parser.add_argument("--frequency-penalty", type=float, default=0.0)
    parser.add_argument("--unseeded", action="store_true", help="no seeds: the planner sizes the trees")
    parser.add_argument("--split", default="dev")
    parser.add_argument("--per-category", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    args = parser.parse_args()
    torch.set_num_threads(1)
    base = LLM(args.target, quantize="int8", show_progress=False, num_threads=1)
    methods = args.methods.split(";")
    llms = {m: LLM.from_loaded(base.loaded, drafter=m, quantize="int8") for m in methods}
    prompts = [p["prompt"] for c in CATEGORIES for p in bench_prompts([c], args.split)[: args.per_category]]
    for llm in llms.values():  # warm-up
        llm.generate(["Hello"], SamplingParams(max_new_tokens=8, temperature=args.temperature, seed=0))
    totals = GenerateTotals(methods)
    for i, prompt in enumerate(prompts):
        for m, llm in llms.items():
            params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                                    top_p=args.top_p, repetition_penalty=args.repetition_penalty,
                                    frequency_penalty=args.frequency_penalty,
                                    seed=None if args.unseeded else i)
            totals.timed(m, llm, prompt, params)
    print(f"{len(prompts)} {args.split} prompts, T={args.temperature}, top-p {args.top_p}, repetition penalty "
          f"{args.repetition_penalty}, frequency penalty {args.frequency_penalty}, up to {args.max_new_tokens} new "
          f"tokens, int8, one thread{', unseeded' if args.unseeded else ''}")
    print(totals.table())


if __name__ == "__main__":
    main()
