"""Prompts seen again with a feature-reading drafter: its features of prefix-cached blocks kept, or recomputed.

    OMP_NUM_THREADS=1 python bench/prefix_features_ab.py --scenario chat [--split test] [--drafters eagle]
    OMP_NUM_THREADS=1 python bench/prefix_features_ab.py --scenario repeat --concurrency 4

A chat's second turn resends the first turn and its answer; the engine's prefix cache skips the target forward
over those blocks, and with it the features an EAGLE predictor reads there. `eagle` keeps the features of every
block it saw (specdec/drafters/prefix_features.py); before, it recomputed the whole history with a dense target
forward each turn. Two scenarios, each with plain decode, each drafter, and each drafter with its store turned
off (`prefix_features = None`: every cached prefix recomputed, the old behaviour), interleaved prompt by prompt
on one loaded int8 target, one thread, greedy; it prints tok/s and the ratio to plain:

* `chat`: the bench prompts' conversations of `--category`, turn by turn (as `specdec bench` runs them: each
  later turn follows the method's own previous reply);
* `repeat`: every category's prompts of the split, `--concurrency` at a time (one `generate` call each group),
  the whole list twice: the second pass finds every prompt in the prefix cache (a benchmark loop, retries,
  many users sending one system prompt). Only the second pass is timed.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specdec import LLM  # noqa: E402
from specdec.benchmarks.suite import encode_messages  # noqa: E402
from specdec.config import SamplingParams  # noqa: E402
from specdec.data import bench_prompts  # noqa: E402


def chat(llm: LLM, prompt: dict, params: SamplingParams) -> tuple[int, float]:
    """Every turn of one conversation; (tokens generated, seconds)."""
    messages, tokens, seconds = [], 0, 0.0
    for turn in prompt.get("turns") or [prompt["prompt"]]:
        messages.append({"role": "user", "content": turn})
        ids = encode_messages(llm, messages)
        start = time.perf_counter()
        out = llm.generate([ids], params, chat=False)[0]
        seconds += time.perf_counter() - start
        tokens += len(out.token_ids)
        messages.append({"role": "assistant", "content": llm.tokenizer.decode(out.token_ids, skip_special_tokens=True)})
    return tokens, seconds


def repeat(llm: LLM, prompts: list[dict], params: SamplingParams) -> tuple[int, float]:
    """One group of prompts in one call: (tokens generated, seconds)."""
    start = time.perf_counter()
    outs = llm.generate([p["prompt"] for p in prompts], params)
    return sum(len(o.token_ids) for o in outs), time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scenario", choices=("chat", "repeat"), default="chat")
    parser.add_argument("--concurrency", type=int, default=4, help="requests a group (repeat)")
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--split", default="test")
    parser.add_argument("--category", default="conversation")
    parser.add_argument("--drafters", default="eagle", help="';'-separated feature-reading drafters")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(1)
    base = LLM(args.target, quantize="int8", show_progress=False, num_threads=1)
    methods = {"none": LLM.from_loaded(base.loaded, quantize="int8")}
    for drafter in args.drafters.split(";"):
        methods[drafter] = LLM.from_loaded(base.loaded, drafter=drafter, quantize="int8")
        off = methods[f"{drafter} (features recomputed)"] = LLM.from_loaded(base.loaded, drafter=drafter,
                                                                            quantize="int8")
        off.drafter.prefix_features = None
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=0.0)
    for llm in methods.values():  # warm-up
        llm.generate(["Hello"], SamplingParams(max_new_tokens=8))
    totals = {name: [0, 0.0] for name in methods}
    if args.scenario == "chat":
        prompts = bench_prompts([args.category], args.split)
        groups = [[p] for p in prompts] * args.rounds
        run = lambda llm, group: chat(llm, group[0], params)  # noqa: E731
        what = (f"{len(prompts)} {args.split} prompts of {args.category} x {args.rounds} rounds, every turn, "
                f"{args.max_new_tokens} new tokens a turn")
    else:
        prompts = bench_prompts(None, args.split)
        groups = [prompts[i: i + args.concurrency] for i in range(0, len(prompts), args.concurrency)]
        for group in groups:  # the first pass, untimed: every prompt's blocks go into the prefix cache
            for llm in methods.values():
                llm.generate([p["prompt"] for p in group], params)
        groups = groups * args.rounds
        run = lambda llm, group: repeat(llm, group, params)  # noqa: E731
        what = (f"{len(prompts)} {args.split} prompts seen before, {args.concurrency} at a time, x {args.rounds} "
                f"rounds, {args.max_new_tokens} new tokens")
    for group in groups:
        for name, llm in methods.items():
            tokens, seconds = run(llm, group)
            totals[name][0] += tokens
            totals[name][1] += seconds
    print(f"{what}, int8, one thread")
    print("| method | tok/s | over plain |\n|---|---|---|")
    plain = totals["none"][0] / totals["none"][1]
    for name, (tokens, seconds) in totals.items():
        print(f"| {name} | {tokens / seconds:.1f} | {tokens / seconds / plain:.2f}x |")


if __name__ == "__main__":
    main()
