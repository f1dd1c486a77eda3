"""Throughput under load: output tok/s against concurrency, our continuous batching vs transformers' batches.

For each concurrency level c, the same requests (bench prompts, chat template, greedy, up to --new-tokens each,
stopping at EOS as real requests do) run through:

* our engine with `max_num_seqs = c`, once per method (plain decode and each drafter, adaptive speculation on,
  as users run it): requests join and leave the batch at every step;
* transformers `generate` on batches of c prompts (static batching: left padding, and every sequence in a batch
  keeps stepping until the longest is done), fp32.

Levels run one after another; within a level the methods run round by round (`--rounds`, the order reversed
every other round) and each method's tok/s is its tokens over its seconds summed over the rounds, so drift on a
shared machine hits every method alike (single back-to-back passes moved plain decode by 15% between runs).
Outputs are checked too: each of our methods' greedy text must equal our plain decode's (the `agree` column), so
speed never hides a wrong answer.

    python bench/throughput.py --modes fp32,int8 --levels 1,4,16,64 --methods none,ngram,draft

Writes bench/results/throughput.{json,md,png}.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import Progress

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specdec import LLM, EngineConfig, SamplingParams  # noqa: E402
from specdec.benchmarks.command import command_line  # noqa: E402
from specdec.data import bench_prompts  # noqa: E402

RESULTS = Path(__file__).parent / "results"
MODES = {"fp32": (torch.float32, None), "int8": (torch.float32, "int8"), "int7": (torch.float32, "int7")}
TREES = {"ngram": "chain:k=5", "draft": "chain:k=4"}


def requests_for(level: int, per_level: int) -> list[str]:
    prompts = [r["prompt"] for r in bench_prompts(split="test")] + [r["prompt"] for r in bench_prompts(split="dev")]
    count = max(level * per_level, 4)
    return [prompts[i % len(prompts)] for i in range(count)]


def run_ours(llm: LLM, prompts: list[str], new_tokens: int) -> dict:
    """One pass over the prompts. Besides the clock, it counts the target's work, forwards and the tokens they
    carried (prompt chunks and verified tree rows): figures no other tenant of a shared machine can move, so a
    method that plans speculation away can be seen to run plain decode's forwards whatever its tok/s says."""
    params = SamplingParams(max_new_tokens=new_tokens)
    runner, work = llm.engine.runner, {"forwards": 0, "forward_tokens": 0}
    forward = runner.run

    def counted(chunks, *args, **kwargs):
        work["forwards"] += 1
        work["forward_tokens"] += sum(len(chunk.tokens) for chunk in chunks)
        return forward(chunks, *args, **kwargs)

    runner.run = counted
    try:
        start = time.perf_counter()
        outputs = llm.generate(prompts, params)
        seconds = time.perf_counter() - start
    finally:
        del runner.run
    tokens = sum(len(o.token_ids) for o in outputs)
    steps = sum(o.metrics.target_steps for o in outputs)
    return {"tokens": tokens, "seconds": seconds, "tok_s": tokens / seconds, "steps": steps,
            "tau": sum(sum(o.metrics.accepted_per_step) for o in outputs) / max(steps, 1),
            "cached_prompt_tokens": sum(o.metrics.cached_prompt_tokens for o in outputs),
            "texts": [o.text for o in outputs], **work}


def merge_rounds(runs: list[dict]) -> dict:
    """One method's rounds as one run: tokens and seconds summed, tau over all its steps."""
    tokens, seconds, steps = (sum(r[k] for r in runs) for k in ("tokens", "seconds", "steps"))
    return {"tokens": tokens, "seconds": seconds, "tok_s": tokens / seconds, "steps": steps, "rounds": len(runs),
            "forwards": sum(r["forwards"] for r in runs), "forward_tokens": sum(r["forward_tokens"] for r in runs),
            "tau": sum(r["tau"] * r["steps"] for r in runs) / max(steps, 1),
            "cached_prompt_tokens": sum(r["cached_prompt_tokens"] for r in runs)}


def run_transformers(model, tokenizer, encoded: list[list[int]], level: int, new_tokens: int, eos: set[int]) -> dict:
    """Static batches of `level` prompts, left-padded; tokens after a sequence's EOS are padding, not output."""
    pad = tokenizer.eos_token_id
    tokens, start = 0, time.perf_counter()
    for i in range(0, len(encoded), level):
        batch = encoded[i: i + level]
        width = max(map(len, batch))
        ids = torch.full((len(batch), width), pad, dtype=torch.int64)
        mask = torch.zeros((len(batch), width), dtype=torch.int64)
        for row, seq in enumerate(batch):
            ids[row, width - len(seq):] = torch.tensor(seq)
            mask[row, width - len(seq):] = 1
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False,
                                 pad_token_id=pad)
        for row in out[:, width:].tolist():
            n = next((k + 1 for k, t in enumerate(row) if t in eos), len(row))
            tokens += n
    seconds = time.perf_counter() - start
    return {"tokens": tokens, "seconds": seconds, "tok_s": tokens / seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--modes", default="fp32,int8", help="our engine's precision(s); transformers runs fp32")
    parser.add_argument("--levels", default="1,4,16,64")
    parser.add_argument("--methods", default="none,ngram,draft", help="drafters (adaptive speculation on)")
    parser.add_argument("--per-level", type=int, default=2, help="requests per level = level x this (at least 4)")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=1, help="runs of every method per level, interleaved")
    parser.add_argument("--no-transformers", action="store_true")
    parser.add_argument("--out", type=Path, default=RESULTS / "throughput.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    console = Console()
    levels = [int(x) for x in args.levels.split(",")]
    methods = [m.strip() for m in args.methods.split(",")]
    modes = [m.strip() for m in args.modes.split(",")]

    engines: dict[str, LLM] = {}
    for mode in modes:
        dtype, quantize = MODES[mode]
        with console.status(f"loading the {mode} engine"):
            engines[mode] = LLM(args.target, dtype=dtype, quantize=quantize, show_progress=False,
                                num_threads=args.threads,
                                engine_config=EngineConfig(max_num_seqs=1, kv_cache_tokens=4096))
    first = engines[modes[0]]
    hf = None
    if not args.no_transformers:
        from transformers import AutoModelForCausalLM

        with console.status("loading transformers"):
            hf = AutoModelForCausalLM.from_pretrained(str(first.loaded.source), dtype=torch.float32).eval()
    eos = set(first.loaded.model.config.eos_token_ids) | {first.tokenizer.eos_token_id}

    for llm in engines.values():  # warm up every path once
        llm.use("none")
        llm.generate(["Hello"], SamplingParams(max_new_tokens=4))

    rows = []
    total = len(levels) * (len(modes) * len(methods) * args.rounds + (hf is not None))
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("throughput runs", total=total)
        for level in levels:
            prompts = requests_for(level, args.per_level)
            encoded = [first.encode(p) for p in prompts]
            if hf is not None:
                progress.update(task, description=f"c={level}: transformers")
                rows.append({"level": level, "engine": "transformers", "mode": "fp32", "method": "generate",
                             **run_transformers(hf, first.tokenizer, encoded, level, args.new_tokens, eos)})
                progress.advance(task)
            for mode, llm in engines.items():
                llm.engine_config = EngineConfig(max_num_seqs=level, kv_cache_tokens=min(900 * level, 49152))
                runs: dict[str, list[dict]] = {method: [] for method in methods}
                for round_index in range(args.rounds):
                    for method in methods if round_index % 2 == 0 else methods[::-1]:
                        progress.update(task, description=f"c={level}: specdec {mode} {method}")
                        llm.use(method, TREES.get(method))
                        runs[method].append(run_ours(llm, prompts, args.new_tokens))
                        progress.advance(task)
                plain_texts = runs["none"][0]["texts"] if "none" in runs else None
                for method in methods:
                    agree = None
                    if plain_texts is not None:  # every round's texts against plain decode's first
                        pairs = [(a, b) for run in runs[method] for a, b in zip(run["texts"], plain_texts)]
                        agree = sum(a == b for a, b in pairs) / len(pairs)
                    rows.append({"level": level, "engine": "specdec", "mode": mode, "method": method,
                                 "agree": agree, **merge_rounds(runs[method])})
            console.print(f"c={level}: " + ", ".join(f"{r['engine'][:2]}-{r['mode']}-{r['method']} {r['tok_s']:.1f}"
                                                     for r in rows if r["level"] == level))
    for row in rows:
        same = [r for r in rows if r["level"] == row["level"]]
        plain = next((r for r in same if r["engine"] == "specdec" and r["mode"] == row["mode"] and r["method"] == "none"), None)
        peer = next((r for r in same if r["engine"] == "transformers"), None)
        row["vs_plain"] = row["tok_s"] / plain["tok_s"] if plain and row["engine"] == "specdec" else None
        if plain and row["engine"] == "specdec":  # the target's work against plain decode's: forwards, tokens
            row["forwards_vs_plain"] = row["forwards"] / plain["forwards"]
            row["forward_tokens_vs_plain"] = row["forward_tokens"] / plain["forward_tokens"]
        row["vs_transformers"] = row["tok_s"] / peer["tok_s"] if peer else None

    command = command_line("bench/throughput.py", parser, args, skip=("out",))
    result = {"target": args.target, "new_tokens": args.new_tokens, "threads": args.threads, "rows": rows,
              "command": command}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    markdown = render_markdown(result)
    args.out.with_suffix(".md").write_text(markdown)
    plot(result, args.out.with_suffix(".png"))
    console.print(markdown)


def render_markdown(result: dict) -> str:
    lines = [f"Output tok/s by concurrency ({result['target']}, greedy, up to {result['new_tokens']} new tokens, "
             f"{result['threads']} thread(s)). Ratios: over transformers `generate` (fp32, static batches) and over "
             "our plain decode in the same precision.", "",
             "| concurrency | engine | precision | method | tok/s | vs transformers | vs our plain | tau "
             "| agrees with plain | forwards vs plain | forward tokens vs plain |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        fmt = lambda x, suffix="x": "-" if x is None else f"{x:.2f}{suffix}"  # noqa: E731
        lines.append(f"| {r['level']} | {r['engine']} | {r['mode']} | {r['method']} | {r['tok_s']:.1f} | "
                     f"{fmt(r['vs_transformers'])} | {fmt(r.get('vs_plain'))} | {fmt(r.get('tau'), '')} | "
                     f"{fmt(r.get('agree'), '')} | {fmt(r.get('forwards_vs_plain'))} | "
                     f"{fmt(r.get('forward_tokens_vs_plain'))} |")
    lines += ["", f"Command: `{result['command']}`", ""]
    return "\n".join(lines)


def plot(result: dict, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install -e '.[bench]'): no plot written")
        return
    series: dict[str, list[tuple[int, float]]] = {}
    for r in result["rows"]:
        name = "transformers generate (fp32)" if r["engine"] == "transformers" else f"specdec {r['mode']} {r['method']}"
        series.setdefault(name, []).append((r["level"], r["tok_s"]))
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, points in series.items():
        xs, ys = zip(*sorted(points))
        ax.plot(xs, ys, marker="o", label=name, linestyle="--" if name.startswith("transformers") else "-")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrency (requests in flight)")
    ax.set_ylabel("output tokens / s")
    ax.set_title(f"Throughput on {result['target']} (CPU, {result['threads']} thread)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
