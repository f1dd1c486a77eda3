"""Why did a method run slower than plain decode under load? Every engine step of a throughput workload, logged.

    OMP_NUM_THREADS=1 python bench/step_log.py --level 64 --methods none,hybrid:suffix+recycle --rounds 2

The workload is bench/throughput.py's at one concurrency level (its requests, int8, greedy, `--new-tokens`).
Each method runs on a fresh engine per round (its planner kept across rounds, as `LLM.use` keeps it), rounds
interleaved. Printed per run: every step that verified drafted nodes (decoding sequences, prefill tokens in the
same step, nodes verified, nodes accepted, the step's verify-side milliseconds, the drafter's proposing and its
reading of the verified step (`after`), and the decode-only step prices
the planner had measured by then, as (rows, ms)); then totals by kind of step: all, and drafted. With the
planner of commit 7593fae this log showed the hybrid's first plans at 64 requests verifying 100-220 rows beside
1,900-token prefills and 346 rows in one 417 ms decode step; run this file from a worktree of that commit to
see it again.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from specdec import LLM, EngineConfig, SamplingParams  # noqa: E402
from specdec.engine.engine import Engine  # noqa: E402
from throughput import requests_for  # noqa: E402


def logged_steps(log: list[dict]):
    """Wrap `Engine._observe` (the engine's end-of-step bookkeeping, which sees the step's batch, trees,
    results and timing) so that every step appends one record to `log`. A diagnostic hook, not an API."""
    observe = Engine._observe

    def wrapped(self, batch, trees, results, timing):
        log.append({"decodes": len(batch.decodes), "prefill": sum(n for _, n in batch.prefills),
                    "nodes": sum(len(t) - 1 for t in trees),
                    "accepted": sum(r.num_accepted_drafts for r in results),
                    "verify_s": timing.committed - timing.proposed - timing.drafter_after,
                    "propose_s": timing.proposed - timing.start, "after_s": timing.drafter_after,
                    "prices": [(round(x), round(y * 1000)) for x, y in sorted(self.planner.cost._buckets.values())]
                    if self.planner is not None else []})
        return observe(self, batch, trees, results, timing)

    Engine._observe = wrapped


def totals(steps: list[dict]) -> str:
    return (f"{len(steps)} steps, {sum(s['nodes'] for s in steps)} nodes, {sum(s['accepted'] for s in steps)} "
            f"accepted, verify {sum(s['verify_s'] for s in steps):.2f} s, "
            f"drafting {sum(s['propose_s'] + s['after_s'] for s in steps):.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--level", type=int, default=64, help="concurrency (max_num_seqs)")
    parser.add_argument("--methods", default="none,hybrid:suffix+recycle")
    parser.add_argument("--per-level", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(1)
    llm = LLM(args.target, dtype=torch.float32, quantize="int8", show_progress=False, num_threads=1,
              engine_config=EngineConfig(max_num_seqs=1, kv_cache_tokens=4096))
    llm.use("none")
    llm.generate(["Hello"], SamplingParams(max_new_tokens=4))  # warm-up
    prompts = requests_for(args.level, args.per_level)
    llm.engine_config = EngineConfig(max_num_seqs=args.level, kv_cache_tokens=min(900 * args.level, 49152))
    log: list[dict] = []
    logged_steps(log)
    methods = [m.strip() for m in args.methods.split(",")]
    for round_index in range(args.rounds):
        for method in methods if round_index % 2 == 0 else methods[::-1]:
            llm.use(method)
            log.clear()
            start = time.perf_counter()
            outputs = llm.generate(prompts, SamplingParams(max_new_tokens=args.new_tokens))
            seconds = time.perf_counter() - start
            tokens = sum(len(o.token_ids) for o in outputs)
            print(f"== round {round_index + 1}, {method}: {tokens / seconds:.1f} tok/s ({seconds:.2f} s)")
            for s in log:
                if s["nodes"]:
                    print(f"  decodes {s['decodes']} prefill {s['prefill']} nodes {s['nodes']} accepted "
                          f"{s['accepted']} verify {s['verify_s'] * 1000:.0f} ms, "
                          f"propose {s['propose_s'] * 1000:.1f} ms, after {s['after_s'] * 1000:.1f} ms; "
                          f"prices {s['prices']}")
            print(f"  all: {totals(log)}")
            print(f"  drafted: {totals([s for s in log if s['nodes']])}")


if __name__ == "__main__":
    main()
