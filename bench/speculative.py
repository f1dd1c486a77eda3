"""Speculative decoding against our own plain decode: tau, tok/s and speedup per drafter and prompt category.

    python bench/speculative.py                                   # int8 and fp32 targets, ngram and draft
    python bench/speculative.py --precisions int8 --methods "ngram|chain:k=5;draft|chain:k=4" --per-category 2

Greedy (T=0), batch 1. For every prompt, plain decode and each method run back to back (interleaved), so the
shared machine's drift hits them alike. Speed is end-to-end (new tokens / wall time of the call, prefill and
drafting included). Speedup per category = that category's total tokens/s of a method over plain decode's,
from the same interleaved runs. Writes JSON, a markdown table and a PNG under bench/results/.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import Progress

from specdec import LLM, SamplingParams
from specdec.benchmarks.command import command_line
from specdec.data import CATEGORIES, bench_prompts
from specdec.benchmarks.runs import parse_methods
from specdec.models.loader import load_model

RESULTS = Path(__file__).resolve().parent / "results"
DEFAULT_METHODS = "ngram|chain:k=5;ngram:branches=4|dynamic:depth=6,topk=4,budget=16;draft|chain:k=4"


def timed_generate(llm: LLM, ids: list[int], new_tokens: int) -> tuple[float, float, int]:
    start = time.perf_counter()
    out = llm.generate([ids], SamplingParams(max_new_tokens=new_tokens))[0]
    elapsed = time.perf_counter() - start
    return elapsed, out.metrics.mean_accepted_tokens, len(out.token_ids)


def run_precision(precision: str, args, methods, prompts, console: Console) -> list[dict]:
    loaded = load_model(args.target, show_progress=False)
    quantize = "int8" if precision == "int8" else None
    plain = LLM.from_loaded(loaded, "none", quantize=quantize)
    engines = {f"{d}|{t or 'default'}": LLM.from_loaded(loaded, d, t, quantize=quantize) for d, t in methods}
    totals: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])  # time, tokens, tau-sum, n
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task(f"{precision}: interleaved runs", total=len(prompts))
        warm = plain.encode(prompts[0]["prompt"])
        for llm in [plain, *engines.values()]:
            timed_generate(llm, warm, 8)
        for p in prompts:
            ids = plain.encode(p["prompt"])
            for name, llm in [("plain", plain), *engines.items()]:
                elapsed, tau, n = timed_generate(llm, ids, args.new_tokens)
                for key in ((name, p["category"]), (name, "overall")):
                    t = totals[key]
                    t[0] += elapsed
                    t[1] += n
                    t[2] += tau
                    t[3] += 1
            progress.advance(task)
    rows = []
    for (name, category), (elapsed, tokens, tau_sum, n) in sorted(totals.items()):
        plain_elapsed, plain_tokens, _, _ = totals[("plain", category)]
        speed = tokens / elapsed
        rows.append({"precision": precision, "method": name, "category": category, "tau": tau_sum / n,
                     "tok_s": speed, "speedup": speed / (plain_tokens / plain_elapsed), "prompts": int(n)})
    return rows


def markdown(rows: list[dict]) -> str:
    categories = [c for c in [*CATEGORIES, "overall"] if any(r["category"] == c for r in rows)]
    lines = ["| precision | method | " + " | ".join(categories) + " |",
             "|---|---|" + "---|" * len(categories)]
    keys = sorted({(r["precision"], r["method"]) for r in rows}, key=lambda k: (k[0], k[1] != "plain", k[1]))
    index = {(r["precision"], r["method"], r["category"]): r for r in rows}
    for precision, method in keys:
        cells = []
        for c in categories:
            r = index.get((precision, method, c))
            cells.append(f"{r['speedup']:.2f}x (tau {r['tau']:.2f}, {r['tok_s']:.1f} tok/s)" if r else "")
        lines.append(f"| {precision} | {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    precisions = sorted({r["precision"] for r in rows})
    fig, axes = plt.subplots(1, len(precisions), figsize=(7 * len(precisions), 4), squeeze=False)
    for ax, precision in zip(axes[0], precisions):
        subset = [r for r in rows if r["precision"] == precision and r["method"] != "plain"]
        methods = sorted({r["method"] for r in subset})
        categories = [c for c in [*CATEGORIES, "overall"] if any(r["category"] == c for r in subset)]
        width = 0.8 / max(len(methods), 1)
        for i, method in enumerate(methods):
            values = [next((r["speedup"] for r in subset if r["method"] == method and r["category"] == c), 0)
                      for c in categories]
            ax.bar([x + i * width for x in range(len(categories))], values, width, label=method)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks([x + 0.4 - width / 2 for x in range(len(categories))], categories, rotation=30)
        ax.set_ylabel("speedup over plain decode")
        ax.set_title(f"{precision} target")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--precisions", default="int8,fp32")
    parser.add_argument("--methods", default=DEFAULT_METHODS, help="drafter|tree, separated by ;")
    parser.add_argument("--split", default="test")
    parser.add_argument("--per-category", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--out", type=Path, default=RESULTS / "speculative")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    console = Console()
    methods = parse_methods(args.methods)
    by_category: dict[str, list[dict]] = defaultdict(list)
    for p in bench_prompts(split=args.split):
        if len(by_category[p["category"]]) < args.per_category:
            by_category[p["category"]].append(p)
    prompts = [p for c in CATEGORIES for p in by_category.get(c, [])]
    rows = []
    for precision in [p.strip() for p in args.precisions.split(",")]:
        rows += run_precision(precision, args, methods, prompts, console)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    command = command_line("bench/speculative.py", parser, args, skip=("out",))
    table = markdown(rows)
    args.out.with_suffix(".json").write_text(json.dumps({"command": command, "rows": rows}, indent=2))
    args.out.with_suffix(".md").write_text(f"Command: `{command}`\n\n{table}\n")
    plot(rows, args.out.with_suffix(".png"))
    console.print(table, markup=False)
    console.print(f"[dim]{command}\nwrote {args.out}.{{json,md,png}}[/]")


if __name__ == "__main__":
    main()
