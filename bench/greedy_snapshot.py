"""Greedy output of every drafter on the dev prompts, as token ids: a snapshot to compare two versions of the code.

    python bench/greedy_snapshot.py --out before.json            # on the old code
    python bench/greedy_snapshot.py --compare before.json        # on the new code: exit 1 on any difference

A refactor that keeps behaviour must keep every token of every (drafter, tree, precision, prompt) cell. Uses
only the public API (`LLM`, `SamplingParams`), so the same script runs on both versions. Also records tau per
cell: a change of tree builder may change tau (never the output).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from specdec import LLM, SamplingParams
from specdec.data import CATEGORIES, bench_prompts

CELLS = ("none|", "ngram|", "ngram:branches=2|dynamic:depth=4,topk=2,budget=8", "draft|", "draft|static:tree-8",
         "draft:layers=6|chain:k=3", "medusa|", "medusa|dynamic:depth=4,topk=4,budget=16", "eagle|",
         "eagle|chain:k=4", "oracle:alpha=0.7|static:tree-8")


def snapshot(quantize: str | None, per_category: int, new_tokens: int) -> dict:
    records = bench_prompts(split="dev")
    prompts = [r["prompt"] for c in CATEGORIES for r in [r for r in records if r.get("category") == c][:per_category]]
    loaded = LLM("smollm2-135m", quantize=quantize, show_progress=False, num_threads=1).loaded
    llm = LLM.from_loaded(loaded, quantize=quantize)
    params = SamplingParams(max_new_tokens=new_tokens)
    cells = {}
    for cell in CELLS:
        drafter, tree = cell.split("|")
        llm.use(drafter, tree or None)
        outs = llm.generate(prompts, params)
        taus = [o.metrics.mean_accepted_tokens for o in outs]
        cells[cell] = {"tokens": [o.token_ids for o in outs], "tau": sum(taus) / len(taus)}
        print(f"{quantize or 'fp32'} {cell:55s} tau {cells[cell]['tau']:.3f}", file=sys.stderr, flush=True)
    return cells


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--compare", type=Path)
    parser.add_argument("--per-category", type=int, default=1)
    parser.add_argument("--new-tokens", type=int, default=40)
    args = parser.parse_args()
    torch.set_num_threads(1)
    result = {mode: snapshot(None if mode == "fp32" else mode, args.per_category, args.new_tokens)
              for mode in ("fp32", "int8")}
    if args.out:
        args.out.write_text(json.dumps(result) + "\n")
    if args.compare:
        before = json.loads(args.compare.read_text())
        diffs = [f"{mode} {cell}" for mode in result for cell in result[mode]
                 if cell in before.get(mode, {}) and before[mode][cell]["tokens"] != result[mode][cell]["tokens"]]
        for mode in result:
            for cell, now in result[mode].items():
                old = before.get(mode, {}).get(cell)
                same = old is not None and old["tokens"] == now["tokens"]
                print(f"{mode} {cell:55s} {'same' if same else 'DIFFERENT'} tau {old and old['tau'] or 0:.3f} -> "
                      f"{now['tau']:.3f}")
        sys.exit(1 if diffs else 0)


if __name__ == "__main__":
    main()
