"""Held-out tau of the shipped drafters: full trees every step (adaptive speculation off), greedy.

    python bench/heldout_tau.py --quantize int8 --per-category 2 --new-tokens 64

Prompts come from `specdec/data/prompts` split `test`, which no trainer reads (`--split dev` to choose settings
on, never the test split). Writes bench/results/heldout_tau.{json,md}.

`--split train` is a diagnostic, not a held-out figure: the last `--per-category` prompts of each category of
`specdec/data/train_prompts.jsonl` (the free-written ones, whose answers the shipped heads trained on). A head's
tau on answers it was fitted to bounds what more data of the same kind can give it on answers it never saw.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import Progress

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specdec import LLM  # noqa: E402
from specdec.benchmarks.command import command_line  # noqa: E402
from specdec.data import CATEGORIES, bench_prompts, train_prompts  # noqa: E402
from specdec.training.common import measure_tau  # noqa: E402

RESULTS = Path(__file__).parent / "results"
DEFAULT_METHODS = ("ngram|chain:k=5;draft|chain:k=4;medusa|static:medusa-8;medusa|static:medusa-64;"
                   "eagle|dynamic:depth=5,topk=3,budget=7;eagle|chain:k=4")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--quantize", default="int8", help="int8 or none")
    parser.add_argument("--methods", default=DEFAULT_METHODS, help="'drafter|tree;...'")
    parser.add_argument("--per-category", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--split", default="test", choices=["test", "dev", "train"],
                        help="test (report), dev (choose settings on it, never on test) or train (answers the "
                             "heads trained on: a ceiling, not a held-out figure)")
    parser.add_argument("--kv-cache-dtype", default="auto", help="the target's K/V cache: auto, float32 or bfloat16")
    parser.add_argument("--out", type=Path, default=RESULTS / "heldout_tau.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    console = Console()
    if args.split == "train":  # the last ones of each category: free-written, like the bench prompts
        records, chosen = train_prompts(), slice(-args.per_category, None)
    else:
        records, chosen = bench_prompts(split=args.split), slice(args.per_category)
    prompts = [r["prompt"] for c in CATEGORIES for r in [r for r in records if r.get("category") == c][chosen]]
    quantize = None if args.quantize == "none" else args.quantize
    loaded = LLM(args.target, quantize=quantize, show_progress=False, num_threads=args.threads).loaded
    methods = [m.partition("|")[::2] for m in args.methods.split(";")]  # "drafter" alone: its default tree
    rows = []
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("held-out tau", total=len(methods))
        for drafter, tree in methods:
            rows.append({"drafter": drafter, "tree": tree,
                         **measure_tau(loaded, drafter, tree or None, prompts, args.new_tokens,
                                       args.kv_cache_dtype)})
            progress.advance(task)
    command = command_line("bench/heldout_tau.py", parser, args, skip=("out",))
    result = {"target": args.target, "prompts": len(prompts), "quantize": args.quantize, "rows": rows,
              "command": command}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    title = "Tau on training answers" if args.split == "train" else "Held-out tau"
    lines = [f"{title} ({len(prompts)} {args.split} prompts, {args.new_tokens} new tokens, greedy, {args.quantize}, "
             f"{args.kv_cache_dtype} K/V cache, full trees every step)", "", "| drafter | tree | tau |",
             "|---|---|---|"]
    lines += [f"| {r['drafter']} | `{r['tree']}` | {r['tau']:.3f} |" for r in rows]
    lines += ["", f"Command: `{command}`", ""]
    args.out.with_suffix(".md").write_text("\n".join(lines))
    console.print("\n".join(lines))


if __name__ == "__main__":
    main()
