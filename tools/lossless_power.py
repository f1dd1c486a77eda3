"""Power report of the lossless-sampling test: the p-value of every case under the real verifier over several
seeds (each should exceed 0.001), and of every planted wrong rule (each should be below 1e-6).

    python tools/lossless_power.py                 # 5 seeds, writes bench/results/lossless_power.{json,md}
    python tools/lossless_power.py --seeds 1 --out -   # quick look, print only

It runs exactly what tests/verifier/test_lossless_sampling.py runs (the same cases, sample sizes and
statistic, from tests/verifier/lossless.py), with other request seeds. Run it from the repository root.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import pytest
import torch

from tests.verifier import lossless as L


def run(seeds: int, only: list[str] | None) -> dict:
    torch.set_num_threads(1)
    models = L.build_models()
    joints: dict = {}
    report: dict = {"cases": {}, "planted": {}}

    def fit(case: L.Case, seed: int) -> dict:
        key = (case.params.temperature, case.params.top_k, case.params.top_p)
        if key not in joints:
            joints[key] = L.exact_joint(models.target, case.params)
        start = time.perf_counter()
        sampled = L.sample(models, case, seed)
        result = L.goodness_of_fit(sampled.tokens, joints[key])
        return {"seed": seed, "p": result.p_value, "impossible": result.impossible, "views": result.views,
                "accept_depth1": sampled.accept_depth1, "accept_full": sampled.accept_full,
                "seconds": time.perf_counter() - start}

    for name, case in L.CASES.items():
        if only and name not in only:
            continue
        report["cases"][name] = [fit(case, seed) for seed in range(seeds)]
        print(name, " ".join(f"{r['p']:.3g}" for r in report["cases"][name]), flush=True)
    monkeypatch = pytest.MonkeyPatch()
    for name, (bug, case_name) in L.PLANTED_CASES.items():
        if only and name not in only:
            continue
        case = L.CASES[case_name]
        rows = []
        for seed in range(seeds):
            rule = L.planted_rule(bug, case.params.temperature)
            L.patch_verifier(monkeypatch, rule)
            try:
                rows.append(dict(fit(case, seed), calls=rule.calls, case=case_name))
            finally:
                monkeypatch.undo()
        report["planted"][name] = rows
        print(name, " ".join(f"{r['p']:.3g}" for r in rows), flush=True)
    return report


def markdown(report: dict) -> str:
    lines = ["# Lossless-sampling test: power report", "",
             "Written by `python tools/lossless_power.py`. p-values of the combined statistic (Bonferroni over the "
             "joint and the adjacent pairs; 0 = a sample in a cell of probability 0).", "",
             "## Real verifier (each p should exceed 0.001)", "",
             "| case | acceptance at depth 1 | full path accepted | p over seeds | min p |", "|---|---|---|---|---|"]
    for name, rows in report["cases"].items():
        ps = ", ".join(f"{r['p']:.3g}" for r in rows)
        lines.append(f"| {name} | {rows[0]['accept_depth1']:.2f} | {rows[0]['accept_full']:.2f} | {ps} | "
                     f"{min(r['p'] for r in rows):.3g} |")
    lines += ["", "## Planted wrong rules (each p should be below 1e-6)", "",
              "| rule | case | p over seeds | max p |", "|---|---|---|---|"]
    for name, rows in report["planted"].items():
        ps = ", ".join(f"{r['p']:.2g}" for r in rows)
        lines.append(f"| {name} | {rows[0]['case']} | {ps} | {max(r['p'] for r in rows):.2g} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--only", nargs="*", help="case or planted-rule names to run (default: all)")
    parser.add_argument("--out", default="bench/results/lossless_power", help="path stem, or - to print only")
    args = parser.parse_args()
    report = run(args.seeds, args.only)
    text = markdown(report)
    print(text)
    if args.out != "-":
        Path(args.out).with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
        Path(args.out).with_suffix(".md").write_text(text)


if __name__ == "__main__":
    main()
