"""Plain decode speed: specdec against transformers' `generate`, same model, same prompts, measured interleaved.

    python bench/plain_decode.py                      # fp32, bf16 and int8, 128 new tokens, greedy, batch 1
    python bench/plain_decode.py --modes fp32 --prompts 2 --threads 1

For every prompt and repetition the engines run back to back (A, B, A, B, ...), so drift in the shared machine's
speed hits both sides alike; the ratios are medians of per-pair ratios. Speed is end-to-end: new tokens divided by
the wall time of the whole call, prefill included, for both engines. The bandwidth bound is weight bytes read per
token divided by a measured copy bandwidth: the speed a batch-1 decode could reach if it only streamed weights.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from specdec import LLM, SamplingParams
from specdec.data import bench_prompts

RESULTS = Path(__file__).resolve().parent / "results"
MODES = {  # name: (our dtype, our quantization, transformers dtype to compare with)
    "fp32": ("float32", None, torch.float32),
    "bf16": ("bfloat16", None, torch.bfloat16),
    "int8": ("float32", "int8", torch.float32),
}


def spread(items: list, n: int) -> list:
    """`n` items evenly spaced over the whole list (all of them if it is shorter), so a few prompts still
    come from every category instead of the first one."""
    if n >= len(items):
        return list(items)
    return [items[i * len(items) // n] for i in range(max(n, 0))]


def copy_bandwidth(gib: float = 0.5, reps: int = 5) -> float:
    """Bytes per second moved by a large tensor copy (read + write)."""
    src = torch.empty(int(gib * 2**30) // 4, dtype=torch.float32).fill_(1.0)
    dst = torch.empty_like(src)
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - start)
    return 2 * src.numel() * 4 / min(times)


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of weights one decode step reads (int8 packed weights counted through their modules)."""
    from specdec.models.quant import Int8DynamicLinear

    seen, total = set(), 0
    for module in model.modules():
        if isinstance(module, Int8DynamicLinear):  # int8 weights, one byte each (+ fp32 per-channel scales)
            total += module.in_features * module.out_features + 4 * module.out_features
            continue
        for param in module.parameters(recurse=False):
            if id(param) not in seen and param.dim() == 2 and param.shape[0] * param.shape[1] > 0:
                if not isinstance(module, torch.nn.Embedding):  # embeddings: one row is read, not the matrix
                    seen.add(id(param))
                    total += param.numel() * param.element_size()
    return total


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--modes", default="fp32,bf16,int8")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--out", type=Path, default=RESULTS / "plain_decode.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    console = Console()
    from transformers import AutoModelForCausalLM

    modes = [m.strip() for m in args.modes.split(",")]
    prompts = spread([p["prompt"] for p in bench_prompts(split="dev")], args.prompts)
    bandwidth = copy_bandwidth()
    rows = []
    for mode in modes:
        dtype, quantize, hf_dtype = MODES[mode]
        with console.status(f"loading {mode} models"):
            ours = LLM(args.target, dtype=dtype, quantize=quantize, show_progress=False)
            hf = AutoModelForCausalLM.from_pretrained(ours.loaded.source, dtype=hf_dtype).eval()
        pad = ours.tokenizer.eos_token_id
        encoded = [ours.encode(p) for p in prompts]
        run_ours(ours, encoded[0], 8)  # warm up both
        run_transformers(hf, encoded[0], 8, pad)
        ours_speeds, hf_speeds, ratios = [], [], []
        with Progress(console=console, transient=True) as progress:
            task = progress.add_task(f"{mode}: interleaved runs", total=len(encoded) * args.reps)
            for _ in range(args.reps):
                for ids in encoded:
                    b = run_transformers(hf, ids, args.new_tokens, pad)
                    a = run_ours(ours, ids, args.new_tokens)
                    ours_speeds.append(a)
                    hf_speeds.append(b)
                    ratios.append(a / b)
                    progress.advance(task)
        bound = bandwidth / weight_bytes(ours.model)
        rows.append({
            "mode": mode, "ours_tok_s": statistics.median(ours_speeds), "transformers_tok_s": statistics.median(hf_speeds),
            "transformers_dtype": str(hf_dtype).replace("torch.", ""), "ratio": statistics.median(ratios),
            "bandwidth_bound_tok_s": bound, "fraction_of_bound": statistics.median(ours_speeds) / bound,
        })
        del ours, hf
    result = {"target": args.target, "new_tokens": args.new_tokens, "prompts": len(prompts), "reps": args.reps,
              "threads": args.threads, "copy_bandwidth_gb_s": bandwidth / 1e9, "rows": rows,
              "command": "python bench/plain_decode.py " + " ".join(
                  f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k != "out")}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    table = Table(title=f"plain decode, batch 1, greedy, {args.new_tokens} new tokens, {args.threads} thread(s); "
                        f"copy bandwidth {bandwidth / 1e9:.1f} GB/s")
    for col in ("mode", "specdec tok/s", "transformers tok/s", "ratio", "% of bandwidth bound"):
        table.add_column(col)
    for r in rows:
        table.add_row(f"{r['mode']} (vs transformers {r['transformers_dtype']})", f"{r['ours_tok_s']:.1f}",
                      f"{r['transformers_tok_s']:.1f}", f"{r['ratio']:.2f}x", f"{100 * r['fraction_of_bound']:.0f}%")
    console.print(table)
    console.print(f"[dim]wrote {args.out}[/]")


if __name__ == "__main__":
    main()
