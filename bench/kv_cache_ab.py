"""A/B of the target's K/V cache precision: each method with a float32 cache and with a bfloat16 one (AMX tiles).

    OMP_NUM_THREADS=1 python bench/kv_cache_ab.py --methods "none;hybrid:suffix+recycle;recycle" --split test

Every (method, cache precision) pair holds its own engine around one loaded int8 target; each prompt runs through
all of them in turn (interleaved, so drift on a shared machine hits all alike), once: a second pass over the
same prompts would meet drafters that remember them (suffix's tree of earlier outputs, Token Recycling's
matrix) and overstate what they accept (tau 2.63 against 2.16 for the hybrid in a two-pass run). Reports
tok/s, each pair's speedup over plain decode with the float32 cache and over plain decode at its own precision,
tokens per target step (tau), and how many prompts give the same greedy tokens at both precisions (a bfloat16
cache changes the model's numbers; speculation at either precision still gives its own plain output, which
the column "same as plain" checks).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from specdec.api import LLM
from specdec.benchmarks.command import command_line
from specdec.benchmarks.suite import OursRunner, SuiteOptions, run_interleaved, select_prompts
from specdec.config import EngineConfig
from specdec.benchmarks.runs import parse_methods
from specdec.kernels import cpu as cpu_kernels
from specdec.models.loader import load_model

PRECISIONS = ("float32", "bfloat16")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--quantize", default="int8")
    ap.add_argument("--methods", default="none;hybrid:suffix+recycle")
    ap.add_argument("--split", default="test")
    ap.add_argument("--categories", default="conversation,translation,summarization,qa,math,rag")
    ap.add_argument("--prompts-per-category", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="bench/results/kv_cache_ab.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if not cpu_kernels.bf16_attention():
        raise SystemExit("this CPU has no AMX-BF16: a bfloat16 cache would run the torch reference")
    options = SuiteOptions(target=args.target, quantize=args.quantize, max_new_tokens=args.max_new_tokens,
                           prompts_per_category=args.prompts_per_category,
                           categories=tuple(args.categories.split(",")), split=args.split)
    loaded = load_model(args.target, quantize=args.quantize, show_progress=False)
    methods = parse_methods(args.methods)
    if ("none", None) not in methods:
        methods.insert(0, ("none", None))
    runners = []
    for kv in PRECISIONS:
        config = EngineConfig(kv_cache_dtype=kv)
        for drafter, tree in methods:
            llm = LLM.from_loaded(loaded, drafter, tree, quantize=args.quantize, engine_config=config)
            runners.append(((drafter + (f"|{tree}" if tree else ""), kv), OursRunner(drafter, drafter, llm)))
    prompts = select_prompts(options)
    totals, tokens = run_interleaved(runners, prompts, options)
    rate = {key: len(run.tokens) / run.seconds for key, run in totals.items()}
    rows = []
    for (method, kv), run in totals.items():
        plain = ("none", kv)
        rows.append({"method": method, "kv_cache": kv, "tok_s": rate[(method, kv)],
                     "speedup_vs_plain_float32": rate[(method, kv)] / rate[("none", "float32")],
                     "speedup_vs_plain_same_cache": rate[(method, kv)] / rate[plain],
                     "tau": run.decoded / max(run.steps, 1), "ms_per_step": 1000 * run.seconds / max(run.steps, 1),
                     "same_as_plain": sum(a == b for a, b in zip(tokens[(method, kv)], tokens[plain])),
                     "same_as_float32_cache": sum(a == b for a, b in zip(tokens[(method, kv)],
                                                                         tokens[(method, "float32")]))})
    result = {"command": command_line("bench/kv_cache_ab.py", ap, args, env="OMP_NUM_THREADS=1"),
              "prompts": len(prompts), "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"| method | K/V cache | tok/s | vs plain fp32 cache | vs plain same cache | tau | ms/step | same as plain "
          f"| same tokens as fp32 cache (of {len(prompts)}) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['method']} | {row['kv_cache']} | {row['tok_s']:.1f} | {row['speedup_vs_plain_float32']:.2f}x | "
              f"{row['speedup_vs_plain_same_cache']:.2f}x | {row['tau']:.2f} | {row['ms_per_step']:.1f} | "
              f"{row['same_as_plain']} | {row['same_as_float32_cache']} |")


if __name__ == "__main__":
    main()
