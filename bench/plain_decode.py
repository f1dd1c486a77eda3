"""Plain decode speed: specdec against transformers' `generate` and llama.cpp, same model, same prompts, interleaved.

    python bench/plain_decode.py                       # fp32 and int8 (+ int4), 128 new tokens, greedy, batch 1
    python bench/plain_decode.py --modes int8,int4 --threads 1 --llama-cpp
    python bench/plain_decode.py --modes fp32 --prompts 2 --threads 1

Prompts: `--prompts N` spread evenly over the dev split; the default 7 gives one per category (conversation,
translation, summarization, qa, math, rag, code), so the long summarization and RAG prompts (about 350 tokens)
are in.
For every prompt and repetition every engine runs once, back to back (transformers, each of our modes,
llama.cpp), so drift in a shared machine's speed hits all alike; ratios are medians of per-prompt ratios.
Speed is end-to-end: new tokens divided by the wall time of the whole call, prefill included, for every engine.
The bandwidth bound is weight bytes read per token divided by a measured copy bandwidth: the speed a batch-1
decode could reach if it only streamed weights.

`--llama-cpp` needs llama-cpp-python (the `llama` extra; build it with the CPU features of the machine, see the
extra's comment in pyproject.toml) and runs the target's own GGUF (the default model's is in the cache).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from specdec import LLM, SamplingParams
from specdec.benchmarks.command import command_line
from specdec.data import bench_prompts
from specdec.models import huge_pages

RESULTS = Path(__file__).resolve().parent / "results"
MODES = {  # name: (our dtype, our quantization, transformers dtype to compare with)
    "fp32": ("float32", None, torch.float32),
    "bf16": ("bfloat16", None, torch.bfloat16),
    "int8": ("float32", "int8", torch.float32),
    "int4": ("float32", "int4", torch.float32),
}


def copy_bandwidth(gib: float = 0.5, reps: int = 5) -> float:
    """Bytes per second moved by a large tensor copy (read + write), on huge pages as the weights are
    (specdec/models/huge_pages.py) where the system has them."""
    n = int(gib * 2**30)
    if huge_pages.supported():
        src, dst = (huge_pages.huge_page_bytes(n).view(torch.float32) for _ in range(2))
    else:
        src, dst = (torch.empty(n // 4, dtype=torch.float32) for _ in range(2))
    src.fill_(1.0)
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - start)
    return 2 * src.numel() * 4 / min(times)


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of weights one decode step reads (quantized layers counted through their own buffers)."""
    from specdec.models.qlinear import QLinear
    from specdec.models.quant import Int8DynamicLinear

    seen, total = set(), 0
    for module in model.modules():
        if isinstance(module, QLinear):  # what the kernels read: not the tiles beside the blocks (cold_tensors)
            skip = {"bias", *module.cold_tensors()}
            total += sum(b.numel() * b.element_size() for name, b in module.named_buffers() if name not in skip)
            continue
        if isinstance(module, Int8DynamicLinear):  # int8 weights, one byte each (+ fp32 per-channel scales)
            total += module.in_features * module.out_features + 4 * module.out_features
            continue
        for param in module.parameters(recurse=False):
            if id(param) not in seen and param.dim() == 2 and param.shape[0] * param.shape[1] > 0:
                if not isinstance(module, torch.nn.Embedding):  # embeddings: one row is read, not the matrix
                    seen.add(id(param))
                    total += param.numel() * param.element_size()
    return total


def spread(items: list, n: int) -> list:
    """`n` items evenly spaced over the whole list (all of them if it is shorter), so a few prompts still
    come from every category instead of the first one."""
    if n >= len(items):
        return list(items)
    return [items[i * len(items) // n] for i in range(max(n, 0))]


def run_ours(llm: LLM, ids: list[int], new_tokens: int) -> float:
    start = time.perf_counter()
    out = llm.generate([ids], SamplingParams(max_new_tokens=new_tokens, ignore_eos=True))[0]
    assert len(out.token_ids) == new_tokens
    return new_tokens / (time.perf_counter() - start)


def run_transformers(model, ids: list[int], new_tokens: int, pad: int) -> float:
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(torch.tensor([ids]), max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                             do_sample=False, pad_token_id=pad)
    assert out.shape[1] - len(ids) == new_tokens
    return new_tokens / (time.perf_counter() - start)


def load_llama_cpp(gguf: Path, threads: int):
    from llama_cpp import Llama  # the `llama` extra

    return Llama(model_path=str(gguf), n_ctx=2048, n_threads=threads, n_threads_batch=threads, n_batch=512,
                 verbose=False)


def run_llama_cpp(llama, ids: list[int], new_tokens: int) -> float:
    """Greedy, exactly `new_tokens` tokens (EOS ignored: `generate` yields until we stop), prefill included."""
    start = time.perf_counter()
    count = 0
    for _ in llama.generate(ids, temp=0.0, top_k=1, repeat_penalty=1.0, reset=True):
        count += 1
        if count == new_tokens:
            break
    return new_tokens / (time.perf_counter() - start)


def target_gguf(target: str) -> Path:
    """The GGUF a target alias is converted from (fetched into the cache if it is not there)."""
    from specdec.models.registry import fetch_gguf, is_alias

    if not is_alias(target):
        raise SystemExit(f"--llama-cpp needs a GGUF alias target; {target} is not one")
    return fetch_gguf(target, show_progress=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--modes", default="fp32,int8,int4", help=f"comma list of {', '.join(MODES)}")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--prompts", type=int, default=7)
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--llama-cpp", action="store_true", help="add llama.cpp on the target's GGUF as a peer")
    parser.add_argument("--out", type=Path, default=RESULTS / "plain_decode.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    console = Console()
    from transformers import AutoModelForCausalLM

    modes = [m.strip() for m in args.modes.split(",")]
    prompts = spread([p["prompt"] for p in bench_prompts(split="dev")], args.prompts)
    bandwidth = copy_bandwidth()
    with console.status("loading models"):
        ours = {m: LLM(args.target, dtype=MODES[m][0], quantize=MODES[m][1], show_progress=False,
                       num_threads=args.threads) for m in modes}
        any_llm = next(iter(ours.values()))
        hf = {str(d): AutoModelForCausalLM.from_pretrained(any_llm.loaded.source, dtype=d).eval()
              for d in {MODES[m][2] for m in modes}}
        llama = load_llama_cpp(target_gguf(args.target), args.threads) if args.llama_cpp else None
    pad = any_llm.tokenizer.eos_token_id
    encoded = [any_llm.encode(p) for p in prompts]
    for llm in ours.values():  # warm up every engine
        run_ours(llm, encoded[0], 8)
    for model in hf.values():
        run_transformers(model, encoded[0], 8, pad)
    if llama is not None:
        run_llama_cpp(llama, encoded[0], 8)
    speeds: dict[str, list[float]] = {name: [] for name in [*modes, *hf, "llama.cpp"]}
    for rep in range(args.reps):
        for i, ids in enumerate(encoded):
            console.print(f"[dim]rep {rep + 1}/{args.reps}, prompt {i + 1}/{len(encoded)} ({len(ids)} tokens)[/]")
            for name, model in hf.items():
                speeds[name].append(run_transformers(model, ids, args.new_tokens, pad))
            for mode, llm in ours.items():
                speeds[mode].append(run_ours(llm, ids, args.new_tokens))
            if llama is not None:
                speeds["llama.cpp"].append(run_llama_cpp(llama, ids, args.new_tokens))
    rows = []
    for mode in modes:
        hf_name = str(MODES[mode][2])
        bound = bandwidth / weight_bytes(ours[mode].model)
        row = {"mode": mode, "ours_tok_s": statistics.median(speeds[mode]),
               "transformers_tok_s": statistics.median(speeds[hf_name]),
               "transformers_dtype": hf_name.replace("torch.", ""),
               "ratio": statistics.median(a / b for a, b in zip(speeds[mode], speeds[hf_name])),
               "bandwidth_bound_tok_s": bound, "fraction_of_bound": statistics.median(speeds[mode]) / bound,
               "per_prompt_tok_s": speeds[mode]}
        if llama is not None:
            row["llama_cpp_tok_s"] = statistics.median(speeds["llama.cpp"])
            row["ratio_vs_llama_cpp"] = statistics.median(a / b for a, b in zip(speeds[mode], speeds["llama.cpp"]))
        rows.append(row)
    result = {"target": args.target, "new_tokens": args.new_tokens, "prompts": len(prompts),
              "prompt_tokens": [len(ids) for ids in encoded], "reps": args.reps, "threads": args.threads,
              "copy_bandwidth_gb_s": bandwidth / 1e9, "rows": rows,
              "llama_cpp_per_prompt_tok_s": speeds["llama.cpp"] or None,
              "command": command_line("bench/plain_decode.py", parser, args, skip=("out",))}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    table = Table(title=f"plain decode, batch 1, greedy, {args.new_tokens} new tokens, {args.threads} thread(s), "
                        f"{len(prompts)} prompts; copy bandwidth {bandwidth / 1e9:.1f} GB/s")
    columns = ["mode", "specdec tok/s", "transformers tok/s", "vs transformers", "% of bandwidth bound"]
    if llama is not None:
        columns[3:3] = ["llama.cpp tok/s", "vs llama.cpp"]
    for col in columns:
        table.add_column(col)
    for r in rows:
        cells = [f"{r['mode']} (vs transformers {r['transformers_dtype']})", f"{r['ours_tok_s']:.1f}",
                 f"{r['transformers_tok_s']:.1f}", f"{r['ratio']:.2f}x", f"{100 * r['fraction_of_bound']:.0f}%"]
        if llama is not None:
            cells[3:3] = [f"{r['llama_cpp_tok_s']:.1f}", f"{r['ratio_vs_llama_cpp']:.2f}x"]
        table.add_row(*cells)
    console.print(table)
    console.print(f"[dim]wrote {args.out}[/]")


if __name__ == "__main__":
    main()
