"""Where an engine step's time goes with a real drafter, by engine phase and drafter method.

    OMP_NUM_THREADS=1 python bench/step_phases.py --drafters "none;hybrid:suffix+recycle"

bench/profile_step.py splits the model's forward (linears, attention, ...) under the oracle drafter, whose
proposals cost nothing; this is the other half: the host work a real drafter adds around the forward. Every
`Engine` phase (`_propose`, `_forward`, `_verify`, `_commit`, `_observe`, ...), the runner's forward and KV
commit, the lookup drafters' propose / observe methods, and a model drafter's level (its forward, EAGLE's
one-call layer and packing, its head `_logits`, the tree growth in `_trees` / `_chains`) are wrapped by a
wall-clock timer (about 0.1 us a call); each drafter generates greedily for the dev prompts (one per category,
int8 target, one thread) after a short warm-up, and the table gives milliseconds per engine step (prefill
steps included, so `_forward` carries each prompt's prefill spread over its steps). Timers nest: a drafter
method's time is inside the engine phase that calls it.
"""

from __future__ import annotations

import argparse
import collections
import functools
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specdec import LLM, SamplingParams  # noqa: E402
from specdec.data import CATEGORIES, bench_prompts  # noqa: E402
from specdec.drafters import draft_model, eagle, hybrid, model_drafter, recycle, suffix  # noqa: E402
from specdec.drafters.heads import eagle_fast  # noqa: E402
from specdec.engine import engine, runner  # noqa: E402

PHASES = ("step", "_schedule", "_propose", "_forward", "_processed", "_check_finite", "_verify", "_finish_prefills",
          "_commit", "_observe", "_emit")
DRAFTER_METHODS = ((hybrid.HybridDrafter, ("propose", "observe_verified", "commit")),
                   (recycle.RecycleDrafter, ("propose_scored", "observe_verified")),
                   (suffix.SuffixDrafter, ("propose_scored",)),
                   # a model drafter's level: its forward (the kernels in `eagle_layer` / `runner.run`), its head
                   # (`_logits`), the tree growth around them (`_trees` holds the later levels' forwards)
                   (model_drafter.ModelDrafter, ("_propose", "_trees", "_chains")),
                   (eagle.EagleDrafter, ("_forward", "_logits", "commit")),
                   (draft_model.DraftModelDrafter, ("_forward",)))
MODULE_FUNCTIONS = ((eagle_fast, "forward", "eagle_fast.forward"), (eagle, "pack", "pack (EAGLE)"))


def instrument(totals: dict[str, float], counts: collections.Counter) -> None:
    """Wrap each timed method in place (this process only)."""
    def wrap(cls: type, name: str, label: str) -> None:
        original = getattr(cls, name)

        @functools.wraps(original)
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                totals[label] += time.perf_counter() - start
                counts[label] += 1

        setattr(cls, name, timed)

    for name in PHASES:
        wrap(engine.Engine, name, name)
    wrap(runner.ModelRunner, "run", "runner.run")
    wrap(runner.ModelRunner, "commit_path", "runner.commit_path")
    for cls, names in DRAFTER_METHODS:
        for name in names:
            wrap(cls, name, f"{cls.__name__}.{name}")
    for module, name, label in MODULE_FUNCTIONS:  # module-level functions, looked up at call time
        wrap(module, name, label)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--drafters", default="none;hybrid:suffix+recycle", help="';'-separated drafter specs")
    parser.add_argument("--split", default="dev")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--quantize", default="int8")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    categories = [c for c in CATEGORIES if c != "code"]
    prompts = [p["prompt"] for c in categories for p in bench_prompts([c], args.split)[:1]]
    totals: dict[str, float] = collections.defaultdict(float)
    counts: collections.Counter = collections.Counter()
    instrument(totals, counts)
    for drafter in args.drafters.split(";"):
        llm = LLM("smollm2-135m", quantize=args.quantize, drafter=drafter, show_progress=False)
        llm.generate(prompts[:1], SamplingParams(max_new_tokens=32))  # warm-up: kernels, planner
        totals.clear()
        counts.clear()
        outputs = [llm.generate([p], SamplingParams(max_new_tokens=args.new_tokens))[0] for p in prompts]
        steps, tokens = counts["step"], sum(len(o.token_ids) for o in outputs)
        print(f"\n{drafter}: {len(prompts)} {args.split} prompts, {steps} steps, {tokens} tokens, "
              f"tau {tokens / steps:.2f}")
        print("| timer | ms per step | calls |\n|---|---|---|")
        for label in sorted(totals, key=lambda k: -totals[k]):
            print(f"| {label} | {1e3 * totals[label] / steps:.3f} | {counts[label]} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
