"""Token Recycling from a warm matrix against an empty one, each request on a fresh drafter.

    OMP_NUM_THREADS=1 python bench/recycle_warm.py --split test --per-category 2 --new-tokens 128

A new `specdec generate` process builds its drafter once, for one request: the shipped warm matrix
(`specdec/assets/recycle/`) is then all the drafter knows at its first step. So here every request gets a
drafter built anew (`LLM.use`), as such a process would; the bench suite, by contrast, runs a category's prompts
one after another on one drafter, which learns as it goes. Methods run interleaved prompt by prompt, greedy,
int8, batch 1, the planner on (as `specdec generate` runs), one thread; each method's tok/s is over the same
prompts' plain decode. Writes bench/results/recycle_warm/<split>.{md,json}.

`--quantize int8,int7` runs every method on each weight format (one model each, interleaved too): each row's
speedup is over its own format's plain decode, and the last column over the first format's.

"draft ms/step" is the engine's drafting time per verify step (proposing, and the drafter's bookkeeping after
verification), against the verify side (forward, verification, KV commit) of the same steps.

"decode phase" leaves out each request's prefill (time to its first token): speculation cannot shorten the
prompt's forward, so at 128 new tokens that fixed part (18% of plain decode's time on the test prompts, one
AVX2 core) dilutes every end-to-end ratio.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from specdec.api import LLM
from specdec.benchmarks.command import command_line
from specdec.config import EngineConfig, SamplingParams
from specdec.data import CATEGORIES, bench_prompts

RESULTS = Path(__file__).resolve().parent / "results" / "recycle_warm"
METHODS = "none;recycle:warm=none;recycle;hybrid:suffix+recycle:warm=none;hybrid:suffix+recycle"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--split", default="test", choices=("dev", "test"))
    parser.add_argument("--per-category", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--methods", default=METHODS, help="';'-separated 'drafter[|tree]' specs, 'none' first")
    parser.add_argument("--no-adaptive", action="store_true", help="planner off: every step verifies the full tree "
                                                                     "(tau of the drafter alone)")
    parser.add_argument("--quantize", default="int8", help="comma list of weight formats (int8, int7, int4)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    methods = args.methods.split(";")
    records = bench_prompts(split=args.split)
    prompts = [(c, r["prompt"]) for c in CATEGORIES
               for r in [r for r in records if r["category"] == c][: args.per_category]]
    formats = args.quantize.split(",")
    llms = {q: LLM("smollm2-135m", quantize=q, show_progress=False, num_threads=1,
                   engine_config=EngineConfig(adaptive_speculation=not args.no_adaptive)) for q in formats}
    params = SamplingParams(max_new_tokens=args.new_tokens)
    for llm in llms.values():
        llm.generate(["Warm up."], SamplingParams(max_new_tokens=8))
    runs = [(q, m) for m in methods for q in formats]
    totals = {run: {"seconds": 0.0, "tokens": 0, "accepted": 0, "steps": 0, "same": 0, "decode_s": 0.0,
                    "decode_tokens": 0, "draft_s": 0.0, "verify_s": 0.0} for run in runs}
    for n, (category, prompt) in enumerate(prompts):
        reference = {}
        for q, method in runs:
            drafter, _, tree = method.partition("|")
            llms[q].use(drafter, tree or None)  # a fresh drafter: what a new process starts from
            start = time.perf_counter()
            out = llms[q].generate([prompt], params)[0]
            seconds = time.perf_counter() - start
            t = totals[q, method]
            t["seconds"] += seconds
            t["tokens"] += len(out.token_ids)
            t["accepted"] += sum(out.metrics.accepted_per_step)
            t["steps"] += out.metrics.target_steps
            t["decode_s"] += seconds - out.metrics.ttft_s
            t["draft_s"] += out.metrics.draft_time_s
            t["verify_s"] += out.metrics.verify_time_s
            t["decode_tokens"] += len(out.token_ids) - 1
            t["same"] += out.token_ids == reference.setdefault(q, out.token_ids)
        print(f"{n + 1}/{len(prompts)} {category}", flush=True)

    def speed(run: tuple[str, str]) -> float:
        return totals[run]["tokens"] / totals[run]["seconds"]

    def decode_speed(run: tuple[str, str]) -> float:
        return totals[run]["decode_tokens"] / totals[run]["decode_s"]

    rows = []
    for q, method in sorted(runs, key=lambda run: formats.index(run[0])):
        t = totals[q, method]
        rows.append({"quantize": q, "method": method, "tok_s": round(speed((q, method)), 2),
                     "speedup": round(speed((q, method)) / speed((q, methods[0])), 3),
                     "over_first_format_plain": round(speed((q, method)) / speed((formats[0], methods[0])), 3),
                     "decode_phase_speedup": round(decode_speed((q, method)) / decode_speed((q, methods[0])), 3),
                     "draft_ms_per_step": round(1e3 * t["draft_s"] / max(1, t["steps"]), 3),
                     "draft_share_of_verify": round(t["draft_s"] / max(1e-9, t["verify_s"]), 4),
                     "tau": round(t["accepted"] / max(1, t["steps"]), 3),
                     "same_as_plain": f"{t['same']}/{len(prompts)}"})
    command = command_line("bench/recycle_warm.py", parser, args, skip=("out",), env="OMP_NUM_THREADS=1")
    lines = [f"Command: `{command}`", "", f"{len(prompts)} {args.split} prompts, each method on a fresh drafter per "
             f"request, interleaved; {time.strftime('%Y-%m-%d %H:%M')}.", "",
             f"| weights | method | tok/s | over plain | over {formats[0]} plain | tau (planner "
             f"{'off' if args.no_adaptive else 'on'}) | decode phase over plain | draft ms/step (% of the verify "
             "side) | same output as plain |", "|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['quantize']} | {r['method']} | {r['tok_s']} | {r['speedup']:.2f}x | "
              f"{r['over_first_format_plain']:.2f}x | {r['tau']:.2f} | {r['decode_phase_speedup']:.2f}x | "
              f"{r['draft_ms_per_step']:.2f} ({100 * r['draft_share_of_verify']:.1f}%) | {r['same_as_plain']} |"
              for r in rows]
    out = args.out or RESULTS / (args.split + ("_full_trees" if args.no_adaptive else ""))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    out.with_suffix(".json").write_text(json.dumps({"command": command, "rows": rows}, indent=1) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
