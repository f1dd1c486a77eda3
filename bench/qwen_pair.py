"""A realistic CPU pair: Qwen2.5-Coder-1.5B (int8) with its 0.5B sibling as draft, against llama.cpp on the same GGUFs.

    python bench/qwen_pair.py                                   # 2 code + 2 conversation test prompts, 128 tokens
    python bench/qwen_pair.py --per-category 1 --new-tokens 64 --no-llama-cpp

Greedy, batch 1, one thread. For every prompt each configuration runs once, back to back (interleaved), so a
shared machine's drift hits them alike: ours (plain int8; the 0.5B int8 draft as a chain and as a small tree;
ngram, recycle and suffix drafters) and llama.cpp through llama-cpp-python (plain decode, and its prompt-lookup
decoding, `LlamaPromptLookupDecoding`) on the very GGUF files our models were converted from. Speed is
end-to-end (new tokens over the wall time of the call, prefill and drafting included). Each engine's speedup is
over its own plain decode, per category: total tokens over total time of a method, over plain's. Outputs are
checked: every one of our greedy speculative outputs must equal our plain greedy output (int8 is exact here).
Writes bench/results/qwen_pair.json and .md.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from collections import defaultdict
from pathlib import Path

import torch
from rich.console import Console

from specdec import LLM, SamplingParams
from specdec.benchmarks.command import command_line
from specdec.config import EngineConfig
from specdec.data import bench_prompts
from specdec.engine.engine import Engine
from specdec.engine.planner import SpeculationPlanner
from specdec.models.loader import load_model
from specdec.tree.spec import parse_tree_spec

from plain_decode import copy_bandwidth, weight_bytes  # bench/ is the script's own folder

RESULTS = Path(__file__).resolve().parent / "results"
CONFIGS = [  # (label, drafter, tree); configurations with one drafter spec share its draft model
    ("plain int8", "none", None),
    ("draft:0.5b chain k=2", "draft:quantize=int8", "chain:k=2"),
    ("draft:0.5b chain k=3", "draft:quantize=int8", "chain:k=3"),
    ("draft:0.5b chain k=4", "draft:quantize=int8", "chain:k=4"),
    ("draft:0.5b chain k=5", "draft:quantize=int8", "chain:k=5"),
    ("draft:0.5b chain k=6", "draft:quantize=int8", "chain:k=6"),
    ("draft:0.5b tree", "draft:quantize=int8", "dynamic:depth=4,topk=2,budget=8"),
    ("draft:0.5b default tree", "draft", None),  # what `--drafter draft` gives
    # reduced heads (the 0.5B with its head cut to the most frequent tokens)
    ("draft:0.5b vocab=16384 chain k=2", "draft:quantize=int8,vocab=16384", "chain:k=2"),
    ("draft:0.5b vocab=32768 chain k=2", "draft:quantize=int8,vocab=32768", "chain:k=2"),
    ("draft:0.5b vocab=16384 chain k=3", "draft:quantize=int8,vocab=16384", "chain:k=3"),
    ("draft:0.5b vocab=32768 chain k=3", "draft:quantize=int8,vocab=32768", "chain:k=3"),
    ("draft:0.5b vocab=16384 chain k=4", "draft:quantize=int8,vocab=16384", "chain:k=4"),
    ("draft:0.5b vocab=32768 chain k=4", "draft:quantize=int8,vocab=32768", "chain:k=4"),
    ("draft:0.5b vocab=16384 chain k=5", "draft:quantize=int8,vocab=16384", "chain:k=5"),
    ("draft:0.5b vocab=32768 chain k=5", "draft:quantize=int8,vocab=32768", "chain:k=5"),
    # the 0.5B's layers at 4 bits (vocab=0: its full head; the default draft adds vocab=32768 on AVX-512)
    ("draft:0.5b int4 chain k=3", "draft:quantize=int4,vocab=0", "chain:k=3"),
    ("draft:0.5b int4 chain k=4", "draft:quantize=int4,vocab=0", "chain:k=4"),
    ("draft:0.5b int4 chain k=5", "draft:quantize=int4,vocab=0", "chain:k=5"),
    ("draft:0.5b int4 chain k=6", "draft:quantize=int4,vocab=0", "chain:k=6"),
    ("draft:0.5b int4 tree", "draft:quantize=int4,vocab=0", "dynamic:depth=4,topk=2,budget=8"),
    ("draft:0.5b int4 vocab=32768 chain k=3", "draft:quantize=int4,vocab=32768", "chain:k=3"),
    ("draft:0.5b int4 vocab=32768 chain k=5", "draft:quantize=int4,vocab=32768", "chain:k=5"),
    ("draft:0.5b int4 vocab=32768 chain k=4", "draft:quantize=int4,vocab=32768", "chain:k=4"),
    ("draft:0.5b default no twin", "draft:twin=0", None),  # the int4 draft's prompt on its int4 layers
    ("ngram", "ngram", "chain:k=5"),
    ("recycle", "recycle", "chain:k=4"),
    ("suffix", "suffix", "chain:k=6"),
]
PLD_TOKENS = 10  # llama-cpp-python's default num_pred_tokens


def llama_cpp_build() -> str:
    import llama_cpp

    info = llama_cpp.llama_print_system_info().decode().strip()
    return f"llama-cpp-python {llama_cpp.__version__}; {info}"


def load_llama(gguf: Path, pld: bool):
    from llama_cpp import Llama
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    draft = LlamaPromptLookupDecoding(num_pred_tokens=PLD_TOKENS) if pld else None
    return Llama(model_path=str(gguf), n_ctx=2048, n_threads=1, n_threads_batch=1, n_batch=512, verbose=False,
                 draft_model=draft)


def run_llama(llama, ids: list[int], new_tokens: int) -> tuple[float, list[int]]:
    start = time.perf_counter()
    out = []
    for token in llama.generate(ids, temp=0.0, top_k=1, repeat_penalty=1.0, reset=True):
        out.append(token)
        if len(out) == new_tokens:
            break
    return time.perf_counter() - start, out


def run_ours(llm: LLM, ids: list[int], new_tokens: int) -> tuple[float, list[int], float]:
    start = time.perf_counter()
    out = llm.generate([ids], SamplingParams(max_new_tokens=new_tokens, ignore_eos=True))[0]
    return time.perf_counter() - start, out.token_ids, out.metrics.mean_accepted_tokens


def build_engines(target: str, kv_tokens: int, configs: list[tuple[str, str, str | None]], adaptive: bool = False
                  ) -> tuple[dict[str, LLM], object]:
    engine_config = EngineConfig(kv_cache_tokens=kv_tokens, adaptive_speculation=adaptive)
    loaded = load_model(target, show_progress=False, quantize="int8")
    engines: dict[str, LLM] = {}
    first: dict[str, str] = {}  # drafter spec -> the label that built it
    for label, drafter, tree in configs:
        if drafter.startswith("draft") and drafter in first:
            llm = LLM.from_loaded(loaded, "none", quantize="int8", engine_config=engine_config)
            shared = engines[first[drafter]].drafter  # one 0.5B draft model per drafter spec, several tree shapes
            spec = parse_tree_spec(tree, engine_config.max_tree_nodes) if tree else shared.default_tree()
            llm.engine = Engine(loaded.model, llm.tokenizer, engine_config, shared, spec, SpeculationPlanner())
            llm.drafter, llm.tree_spec, llm.drafter_spec = shared, spec, drafter
        else:
            llm = LLM.from_loaded(loaded, drafter, tree, quantize="int8", engine_config=engine_config)
            first[drafter] = label
        engines[label] = llm
    return engines, loaded


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="qwen2.5-coder-1.5b")
    parser.add_argument("--draft", default="qwen2.5-coder-0.5b", help="alias whose GGUF llama.cpp would draft with")
    parser.add_argument("--categories", default="code,conversation")
    parser.add_argument("--per-category", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--kv-tokens", type=int, default=2048)
    parser.add_argument("--split", default="test", choices=("test", "dev"))
    parser.add_argument("--methods", default="", help="comma list of method labels to run (default: all); "
                                                        "'plain int8' always runs")
    parser.add_argument("--adaptive", action="store_true", help="let the planner choose each step's depth (as "
                                                                   "`specdec generate` does); default: fixed trees")
    parser.add_argument("--no-llama-cpp", action="store_true")
    parser.add_argument("--out", type=Path, default=RESULTS / "qwen_pair.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    console = Console()
    prompts = []
    for category in args.categories.split(","):
        prompts += bench_prompts(category, split=args.split)[: args.per_category]
    wanted = {m.strip() for m in args.methods.split(",") if m.strip()}
    unknown = wanted - {label for label, _, _ in CONFIGS}
    if unknown:
        parser.error(f"unknown --methods {sorted(unknown)}; known: {[label for label, _, _ in CONFIGS]}")
    configs = [c for c in CONFIGS if not wanted or c[0] in wanted or c[0] == "plain int8"]
    started = time.perf_counter()
    engines, loaded = build_engines(args.target, args.kv_tokens, configs, args.adaptive)
    console.print(f"[dim]loaded our engines in {time.perf_counter() - started:.0f} s[/]")
    llamas = {}
    build = None
    if not args.no_llama_cpp:
        from specdec.models.registry import fetch_gguf

        gguf = fetch_gguf(args.target, show_progress=False)
        build = llama_cpp_build()
        llamas = {"llama.cpp plain": load_llama(gguf, False),
                  f"llama.cpp prompt lookup (k={PLD_TOKENS})": load_llama(gguf, True)}
    plain_llm = engines["plain int8"]
    encoded = [plain_llm.encode(p["prompt"]) for p in prompts]
    for llm in engines.values():  # warm-up: kernels, allocator, the draft's first forward
        run_ours(llm, encoded[0], 4)
    for llama in llamas.values():
        run_llama(llama, encoded[0], 4)
    runs: dict[str, list[dict]] = defaultdict(list)
    mismatches = []
    for i, (p, ids) in enumerate(zip(prompts, encoded)):
        console.print(f"prompt {i + 1}/{len(prompts)} ({p['id']}, {len(ids)} tokens)")
        plain_tokens = None
        for label, llm in engines.items():
            seconds, tokens, tau = run_ours(llm, ids, args.new_tokens)
            if plain_tokens is None:
                plain_tokens = tokens
            elif tokens != plain_tokens:
                mismatches.append(f"{label} on {p['id']}")
            runs[label].append({"id": p["id"], "category": p["category"], "seconds": seconds, "tokens": len(tokens),
                                "tau": tau})
            console.print(f"  {label:<34} {len(tokens) / seconds:6.2f} tok/s  tau {tau:.2f}")
        for label, llama in llamas.items():
            seconds, tokens = run_llama(llama, ids, args.new_tokens)
            runs[label].append({"id": p["id"], "category": p["category"], "seconds": seconds, "tokens": len(tokens),
                                "same_as_ours": tokens == plain_tokens})
            console.print(f"  {label:<34} {len(tokens) / seconds:6.2f} tok/s")
    result = summarize(runs, [p["category"] for p in prompts], list(llamas))
    bandwidth, weights = copy_bandwidth(), weight_bytes(loaded.model)
    plain_speed = result["table"]["plain int8"]["all"]["tok_s"]
    result.update({
        "copy_bandwidth_gb_s": bandwidth / 1e9, "weight_bytes_per_token": weights,
        "bandwidth_bound_tok_s": bandwidth / weights, "plain_fraction_of_bound": plain_speed * weights / bandwidth,
        "target": args.target, "draft": args.draft, "new_tokens": args.new_tokens,
        "prompts": [p["id"] for p in prompts], "split": args.split,
        "prompt_tokens": [len(ids) for ids in encoded], "threads": 1, "llama_cpp_build": build,
        "speculative_equals_plain": not mismatches, "mismatches": mismatches,
        "machine": platform.processor() or platform.machine(), "shared_machine": True, "runs": runs,
        "command": command_line("bench/qwen_pair.py", parser, args, skip=("out",), env="OMP_NUM_THREADS=1"),
    })
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    args.out.with_suffix(".md").write_text(markdown(result))
    console.print(markdown(result))


def summarize(runs: dict[str, list[dict]], categories: list[str], llama_labels: list[str]) -> dict:
    """tok/s per method and category (total tokens / total seconds), speedups over the engine's own plain."""
    cats = list(dict.fromkeys(categories)) + ["all"]

    def speed(label: str, cat: str) -> float:
        rows = [r for r in runs[label] if cat == "all" or r["category"] == cat]
        return sum(r["tokens"] for r in rows) / sum(r["seconds"] for r in rows)

    table = {}
    for label, rows in runs.items():
        base = llama_labels[0] if label in llama_labels else "plain int8"
        table[label] = {cat: {"tok_s": speed(label, cat), "speedup": speed(label, cat) / speed(base, cat)}
                        for cat in cats}
        for cat in cats:
            cat_taus = [r["tau"] for r in rows if "tau" in r and (cat == "all" or r["category"] == cat)]
            if cat_taus:
                table[label][cat]["tau"] = sum(cat_taus) / len(cat_taus)
        if llama_labels and label not in llama_labels:
            for cat in cats:
                table[label][cat]["vs_llama_cpp_plain"] = speed(label, cat) / speed(llama_labels[0], cat)
    return {"categories": cats, "table": table}


def markdown(result: dict) -> str:
    cats = result["categories"]
    lines = [f"# {result['target']} (int8) + {result['draft']} draft vs llama.cpp, greedy, batch 1, 1 thread, "
             f"{result['new_tokens']} new tokens",
             "",
             f"Prompts: {', '.join(result['prompts'])} ({result.get('split', 'test')} split). Shared 2-core "
             "machine: other jobs ran throughout, so absolute speeds are low and noisy; the runs are interleaved, so "
             "ratios are the figures to read.",
             f"llama.cpp build: {result['llama_cpp_build']}",
             f"Our speculative outputs equal our plain greedy output: {result['speculative_equals_plain']}",
             f"Bandwidth bound of our plain int8 decode: {result['weight_bytes_per_token'] / 1e6:.0f} MB of weights "
             f"a token at a measured {result['copy_bandwidth_gb_s']:.1f} GB/s copy bandwidth = "
             f"{result['bandwidth_bound_tok_s']:.1f} tok/s; plain reached {100 * result['plain_fraction_of_bound']:.0f}%.",
             "",
             "| method | " + " | ".join(f"{c} tok/s | {c} speedup" for c in cats)
             + " | tau (all) | vs llama.cpp plain (all) |",
             "|---|" + "---|---|" * len(cats) + "---|---|"]
    for label, row in result["table"].items():
        cells = [f"{row[c]['tok_s']:.2f} | {row[c]['speedup']:.2f}x" for c in cats]
        tau = f"{row['all']['tau']:.2f}" if "tau" in row["all"] else ""
        vs = f"{row['all']['vs_llama_cpp_plain']:.2f}x" if "vs_llama_cpp_plain" in row["all"] else ""
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {tau} | {vs} |")
    lines += ["", "Speedup: over the same engine's own plain decode (ours over plain int8, llama.cpp's over its "
              "plain decode), total tokens over total seconds per category.", "", f"    {result['command']}", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
