"""A/B of where the weights live: each method with its weights on 4 KiB pages and on 2 MiB huge pages.

    OMP_NUM_THREADS=1 python bench/huge_pages_ab.py --methods "none;hybrid:suffix+recycle" --split dev

Two copies of the int8 target are loaded; one stays where torch allocated it (the heap's 4 KiB pages, as
every load was before specdec/models/huge_pages.py), the other's weights, and its drafters', move onto advised
huge pages. Every (method, pages) pair holds its own engine, and each prompt runs through all of them in turn
(interleaved, so drift on a shared machine hits all alike), once (drafters that remember earlier outputs would
overstate a second pass). Reports tok/s, each pair's speedup over plain decode on 4 KiB pages and over plain
decode on the same pages, tau, and whether the greedy tokens are the same both ways (they must be: the weights
keep their bits).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch

from specdec.api import LLM
from specdec.benchmarks.command import command_line
from specdec.benchmarks.runs import parse_methods
from specdec.benchmarks.suite import OursRunner, SuiteOptions, run_interleaved, select_prompts
from specdec.models import huge_pages
from specdec.models.loader import load_model

PAGES = ("4 KiB", "2 MiB")


def build_runners(args: argparse.Namespace) -> list[tuple[tuple[str, str], OursRunner]]:
    """Every (method, pages) engine; each page size with its own copy of the target."""
    methods = parse_methods(args.methods)
    if ("none", None) not in methods:
        methods.insert(0, ("none", None))
    runners = []
    for pages in PAGES:
        os.environ["SPECDEC_HUGE_PAGES"] = "1" if pages == "2 MiB" else "0"
        loaded = load_model(args.target, quantize=args.quantize, show_progress=False)
        for drafter, tree in methods:
            llm = LLM.from_loaded(loaded, drafter, tree, quantize=args.quantize)
            runners.append(((drafter + (f"|{tree}" if tree else ""), pages), OursRunner(drafter, drafter, llm)))
    os.environ.pop("SPECDEC_HUGE_PAGES")
    if not huge_pages.supported():
        raise SystemExit("no transparent huge pages here (not Linux, or MADV_HUGEPAGE missing)")
    return runners


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--quantize", default="int8")
    ap.add_argument("--methods", default="none;hybrid:suffix+recycle")
    ap.add_argument("--split", default="dev")
    ap.add_argument("--categories", default="conversation,translation,summarization,qa,math,rag")
    ap.add_argument("--prompts-per-category", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="bench/results/huge_pages_ab.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    options = SuiteOptions(target=args.target, quantize=args.quantize, max_new_tokens=args.max_new_tokens,
                           prompts_per_category=args.prompts_per_category,
                           categories=tuple(args.categories.split(",")), split=args.split)
    runners = build_runners(args)
    prompts = select_prompts(options)
    totals, tokens = run_interleaved(runners, prompts, options)
    rate = {key: len(run.tokens) / run.seconds for key, run in totals.items()}
    rows = []
    for (method, pages), run in totals.items():
        rows.append({"method": method, "pages": pages, "tok_s": rate[(method, pages)],
                     "speedup_vs_plain_4k": rate[(method, pages)] / rate[("none", PAGES[0])],
                     "speedup_vs_plain_same_pages": rate[(method, pages)] / rate[("none", pages)],
                     "tau": run.decoded / max(run.steps, 1), "ms_per_step": 1000 * run.seconds / max(run.steps, 1),
                     "same_tokens_both_pages": sum(a == b for a, b in zip(tokens[(method, pages)],
                                                                          tokens[(method, PAGES[0])]))})
    result = {"command": command_line("bench/huge_pages_ab.py", ap, args, env="OMP_NUM_THREADS=1"),
              "prompts": len(prompts), "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"| method | weights on | tok/s | vs plain on 4 KiB | vs plain same pages | tau | ms/step "
          f"| same tokens as 4 KiB (of {len(prompts)}) |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['method']} | {row['pages']} | {row['tok_s']:.1f} | {row['speedup_vs_plain_4k']:.2f}x | "
              f"{row['speedup_vs_plain_same_pages']:.2f}x | {row['tau']:.2f} | {row['ms_per_step']:.1f} | "
              f"{row['same_tokens_both_pages']} |")


if __name__ == "__main__":
    main()
