"""Does the adaptive planner cost speed at batch 1? Every method planned and with full trees, in one run.

    OMP_NUM_THREADS=1 python bench/planner_ab.py --split test --out bench/results/planner_ab_zen4.md

The bench suite's own path (its prompt selection, chat encoding, warm-up, multi-turn prompts and the rotation
of methods from prompt to prompt), with each method built twice on one loaded int8 target: adaptive
speculation on, as `generate` runs, and off (`--no-adaptive`: the full tree every step). Ratios are over the
run's own plain decode; tau is tokens per target step.
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

import torch
from rich.console import Console

from specdec.benchmarks import suite
from specdec.benchmarks.command import command_line
from specdec.models.loader import load_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--methods", default="hybrid:suffix+recycle;recycle;suffix")
    parser.add_argument("--split", default="test")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    common = dict(target=args.target, quantize="int8", methods=args.methods, no_peers=True,
                  max_new_tokens=args.max_new_tokens, split=args.split)
    planned, full = suite.resolve_options(**common), suite.resolve_options(**common, adaptive=False)
    loaded = load_model(args.target, "cpu", "float32", show_progress=False)
    runners = suite.build_ours(planned, loaded, Console(quiet=True), [])
    for runner in suite.build_ours(full, loaded, Console(quiet=True), [])[1:]:  # plain decode once
        runner.key += " (full trees)"
        runners.append(runner)
    prompts = suite.select_prompts(planned)
    base = runners[0].llm
    warm = suite.encode_messages(base, [{"role": "user", "content": prompts[0]["prompt"]}])
    for runner in runners:
        runner.run(warm, min(8, args.max_new_tokens), ignore_eos=False)
    seconds, tokens, decoded, steps = defaultdict(float), defaultdict(int), defaultdict(int), defaultdict(int)
    for i, prompt in enumerate(prompts):
        shift = i % len(runners)
        for runner in runners[shift:] + runners[:shift]:
            run = suite.run_prompt(runner, prompt, base, planned)
            seconds[runner.key] += run.seconds
            tokens[runner.key] += len(run.tokens)
            decoded[runner.key] += run.decoded
            steps[runner.key] += run.steps
    plain = tokens[runners[0].key] / seconds[runners[0].key]
    command = command_line("bench/planner_ab.py", parser, args, skip=("out",), env="OMP_NUM_THREADS=1")
    lines = [f"Planned against full trees, {len(prompts)} {args.split} prompts, int8, batch 1, one thread", "",
             "| method | tok/s | over plain | tau |", "|---|---|---|---|"]
    for runner in runners:
        rate = tokens[runner.key] / seconds[runner.key]
        lines.append(f"| {runner.key} | {rate:.1f} | {rate / plain:.2f}x | "
                     f"{decoded[runner.key] / max(steps[runner.key], 1):.2f} |")
    lines += ["", f"Command: `{command}`", ""]
    print("\n".join(lines))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("\n".join(lines))


if __name__ == "__main__":
    main()
