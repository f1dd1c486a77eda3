"""Fit an optimal static tree to a drafter's measured acceptance, then check it on prompts it never saw.

1. Measure acceptance by depth and sibling rank with a dense dynamic tree on the dev split of the bench prompts.
2. Build the tree of `--budget` nodes that maximises expected accepted length under that profile
   (`specdec.experiments.optimal_tree`) and save it as a static tree file (`--tree static:FILE`).
3. Measure tau (greedy) on the test split with the fitted tree and the built-in trees of the same size.

    python bench/optimal_tree.py                      # smollm2-135m, int8, the shipped `draft`, 16 nodes

Outputs in bench/results/: optimal_tree_<drafter>_<budget>.json (the tree), ..._fit.json (the fitting
report), ..._results.{json,csv,png} (the test reports) and ....md (the table, with this command).
Greedy tau does not depend on timing; tokens/s does, and on a shared CPU it is only indicative.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from specdec import LLM, SamplingParams  # noqa: E402
from specdec.config import EngineConfig  # noqa: E402
from specdec.data import CATEGORIES, bench_prompts  # noqa: E402
from specdec.experiments import (AcceptanceProfile, expected_accepted_length, measure_acceptance,  # noqa: E402
                                 optimal_tree, save_reports, save_tree)
from specdec.tree.spec import TreeKind, choices_of, parse_tree_spec  # noqa: E402


def pick(split: str, per_category: int) -> list[dict]:
    records = bench_prompts(split=split)
    return [r for c in CATEGORIES for r in [x for x in records if x["category"] == c][:per_category]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--quantize", default="int8", choices=["int8", "none"])
    ap.add_argument("--drafter", default="draft")
    ap.add_argument("--fit-tree", default="dynamic:depth=6,topk=8,budget=48")
    ap.add_argument("--budget", type=int, default=16)
    ap.add_argument("--compare", nargs="*", default=["static:tree-16", "chain:k=16"])
    ap.add_argument("--per-category", type=int, default=3, help="prompts per category in each split")
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--min-offered", type=int, default=10, help="ignore (depth, rank) cells seen fewer times")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = ap.parse_args()
    command = ("python bench/optimal_tree.py " + shlex.join(sys.argv[1:])).strip()
    out = Path(args.out)
    stem = f"optimal_tree_{re.sub(r'[^A-Za-z0-9]+', '_', args.drafter).strip('_')}_{args.budget}"
    params = SamplingParams(max_new_tokens=args.new_tokens)
    log = lambda msg: print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)  # noqa: E731

    llm = LLM(args.target, quantize=None if args.quantize == "none" else args.quantize, num_threads=args.threads,
              show_progress=False, engine_config=EngineConfig(kv_cache_tokens=16384))
    dev, test = pick("dev", args.per_category), pick("test", args.per_category)
    log(f"fitting on {len(dev)} dev prompts with {args.drafter} / {args.fit_tree}")
    fit = measure_acceptance(llm, dev, params, drafter=args.drafter, tree=args.fit_tree)
    fit.save_json(out / f"{stem}_fit.json")
    profile = AcceptanceProfile.of(fit, min_offered=args.min_offered)
    choices = optimal_tree(profile, args.budget)
    tree_path = save_tree(choices, out / f"{stem}.json", profile, meta={
        "fitted_on": f"{len(dev)} dev bench prompts, {args.new_tokens} new tokens, greedy",
        "target": args.target, "quantize": args.quantize, "drafter": args.drafter, "fit_tree": args.fit_tree,
        "command": command,
    })
    log(f"fit tau {fit.tau:.3f}; optimal {len(choices)}-node tree -> {tree_path}")

    fitted_spec = f"static:{tree_path.relative_to(ROOT) if tree_path.is_relative_to(ROOT) else tree_path}"
    trees = [fitted_spec, *args.compare]
    reports, rows = [], []
    for tree in trees:
        spec = parse_tree_spec(tree)
        dynamic = spec.kind is TreeKind.DYNAMIC
        predicted = None if dynamic else 1.0 + expected_accepted_length(list(choices_of(spec)), profile)
        report = measure_acceptance(llm, test, params, drafter=args.drafter, tree=tree)
        reports.append(report)
        rows.append({"tree": tree, "nodes": spec.budget, "depth": spec.depth, "predicted_tau": predicted,
                     "test_tau": report.tau, "tokens_per_second": report.tokens_per_second,
                     "draft_fraction": report.stats.draft_fraction,
                     "categories": {c: s.tau for c, s in report.categories.items()}})
        log(f"{tree}: predicted tau {predicted if predicted is None else round(predicted, 3)}, "
            f"test tau {report.tau:.3f}, {report.tokens_per_second:.1f} tok/s")
    save_reports(reports, out / f"{stem}_results")
    summary = {"command": command, "target": args.target, "quantize": args.quantize, "drafter": args.drafter,
               "fit": {"tree": args.fit_tree, "prompts": len(dev), "tau": fit.tau, "profile": profile.rows},
               "test_prompts": len(test), "new_tokens": args.new_tokens, "rows": rows}
    (out / f"{stem}_summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    (out / f"{stem}.md").write_text(markdown(summary, choices))
    log(f"wrote {out / (stem + '.md')}")


def markdown(summary: dict, choices: list) -> str:
    lines = [
        f"# Optimal {len(choices)}-node tree for `{summary['drafter']}` on `{summary['target']}`"
        f" ({summary['quantize']})", "",
        f"Fitted on {summary['fit']['prompts']} dev prompts with `{summary['fit']['tree']}` "
        f"(tau {summary['fit']['tau']:.3f}); measured greedily on {summary['test_prompts']} test prompts, "
        f"{summary['new_tokens']} new tokens each. Predicted tau = 1 + expected accepted length under the fitted "
        "positional profile.", "",
        "| tree | nodes | depth | predicted tau | test tau | tok/s | draft share |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in summary["rows"]:
        predicted = "-" if r["predicted_tau"] is None else f"{r['predicted_tau']:.3f}"
        lines.append(f"| `{r['tree']}` | {r['nodes']} | {r['depth']} | {predicted} | {r['test_tau']:.3f} | "
                     f"{r['tokens_per_second']:.1f} | {100 * r['draft_fraction']:.0f}% |")
    lines += ["", f"Tree: `{json.dumps([list(c) for c in choices])}`", "",
              "tok/s is from a shared CPU and only indicative; greedy tau does not depend on timing.", "",
              f"Command: `{summary['command']}`", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
