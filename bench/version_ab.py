"""Speed of two checkouts of specdec, back to back: did a change slow a step down?

    python bench/version_ab.py --old ../baseline --new . --rounds 3

Each round runs the same workload once under each checkout (alternating which goes first), each in its own
process with that checkout first on `sys.path`, one thread. The workload is the public API only (`LLM`,
`SamplingParams`), so it runs on both versions: plain decode and n-gram speculation, int8 and fp32, greedy,
batch 1, on dev prompts. Reported: tok/s per (mode, method) and the median new/old ratio over rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

WORKLOAD = r"""
import json, sys, time, torch
torch.set_num_threads(1)
from specdec import LLM, SamplingParams
from specdec.data import bench_prompts
prompts = [r["prompt"] for r in bench_prompts(["summarization", "conversation", "code"], "dev")][:3]
out = {}
for mode in ("int8", "fp32"):
    q = "int8" if mode == "int8" else None
    loaded = LLM("smollm2-135m", quantize=q, show_progress=False, num_threads=1).loaded
    llm = LLM.from_loaded(loaded, quantize=q)
    for drafter in ("none", "ngram"):
        llm.use(drafter)
        llm.generate(prompts[:1], SamplingParams(max_new_tokens=8))  # warm-up
        start = time.perf_counter()
        outs = [llm.generate([p], SamplingParams(max_new_tokens=NEW))[0] for p in prompts]
        seconds = time.perf_counter() - start
        out[f"{mode} {drafter}"] = sum(len(o.token_ids) for o in outs) / seconds
print(json.dumps(out))
"""


def run(tree: Path, new_tokens: int) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=str(tree.resolve()), OMP_NUM_THREADS="1")
    code = WORKLOAD.replace("NEW", str(new_tokens))
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=tree, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", type=Path, required=True)
    parser.add_argument("--new", type=Path, default=Path("."))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rows: list[tuple[dict, dict]] = []
    for r in range(args.rounds):
        first, second = (args.old, args.new) if r % 2 == 0 else (args.new, args.old)
        a, b = run(first, args.new_tokens), run(second, args.new_tokens)
        old, new = (a, b) if first == args.old else (b, a)
        rows.append((old, new))
        print(f"round {r + 1}: " + ", ".join(f"{k} {old[k]:.1f} -> {new[k]:.1f}" for k in old), flush=True)
    summary = {k: {"old_tok_s": statistics.median(o[k] for o, _ in rows),
                   "new_tok_s": statistics.median(n[k] for _, n in rows),
                   "ratio": statistics.median(n[k] / o[k] for o, n in rows)} for k in rows[0][0]}
    for k, v in summary.items():
        print(f"{k:12s} old {v['old_tok_s']:6.1f} tok/s  new {v['new_tok_s']:6.1f} tok/s  new/old {v['ratio']:.3f}")
    if args.out:
        args.out.write_text(json.dumps({"rounds": args.rounds, "new_tokens": args.new_tokens, "summary": summary,
                                        "when": time.strftime("%Y-%m-%d %H:%M")}, indent=2) + "\n")


if __name__ == "__main__":
    main()
