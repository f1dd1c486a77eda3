"""Choosing N for reduced-vocabulary drafters: the head's cost against what it keeps.

    python bench/reduced_vocab.py --sizes 1024,2048,4096,8192,16384,0 --prompts 8 --new-tokens 64

For each N (0 = the full 49,152-token head): the int8 reduced head's time for 1, 4 and 8 rows (the frontier
sizes of the default trees), interleaved N by N in one process, and the greedy tau of `eagle:vocab=N` with
its default tree, full trees every step, on prompts of the corpus's held-out records (every 10th; never the
bench prompts, so N is not tuned on them). Writes bench/results/reduced_vocab.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from specdec import LLM
from specdec.benchmarks.command import command_line
from specdec.drafters.heads.reduced_vocab import VOCAB_DIR, draft_vocab, reduced_from
from specdec.models.quant import quantize_int8_
from specdec.training.common import measure_tau
from specdec.training.corpus_store import default_corpus_dir, is_held_out, load_records, tokenizer_fingerprint

RESULTS = Path(__file__).parent / "results"


def head_costs(loaded, sizes: list[int], rows: tuple[int, ...], repeats: int) -> dict[int, dict[int, float]]:
    """Median ms per call of each head, the heads taking turns so machine load hits them alike."""
    target = loaded.model
    vocab = target.config.vocab_size
    heads = {}
    for n in sizes:
        if n:
            heads[n] = reduced_from(target, draft_vocab("smollm2-135m", n, vocab, VOCAB_DIR / "smollm2-135m.safetensors"))
            quantize_int8_(heads[n])
        else:
            heads[n] = target.lm_head
    times: dict[int, dict[int, list[float]]] = {n: {r: [] for r in rows} for n in sizes}
    inputs = {r: torch.randn(r, target.config.hidden_size) for r in rows}
    with torch.inference_mode():
        for _ in range(repeats):
            for r in rows:
                for n, head in heads.items():
                    start = time.perf_counter()
                    head(inputs[r])
                    times[n][r].append((time.perf_counter() - start) * 1e3)
    return {n: {r: sorted(t)[len(t) // 2] for r, t in per.items()} for n, per in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1024,2048,4096,8192,16384,0")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--drafter", default="eagle")
    parser.add_argument("--out", type=Path, default=RESULTS / "reduced_vocab.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    sizes = [int(s) for s in args.sizes.split(",")]
    llm = LLM("smollm2-135m", quantize="int8", show_progress=False, num_threads=1)
    loaded = llm.loaded
    vocab = loaded.model.config.vocab_size
    records = load_records(default_corpus_dir("smollm2-135m"), vocab, tokenizer_fingerprint(loaded.tokenizer, vocab))
    held = [r["prompt_ids"] for i, r in enumerate(records) if is_held_out(i)][: args.prompts]
    costs = head_costs(loaded, sizes, (1, 4, 8), args.repeats)
    rows = []
    for n in sizes:
        spec = f"{args.drafter}:vocab={n}"
        tau = measure_tau(loaded, spec, None, held, args.new_tokens)["tau"]
        rows.append({"vocab": n or vocab, "ms_1": costs[n][1], "ms_4": costs[n][4], "ms_8": costs[n][8], "tau": tau})
        print(rows[-1], flush=True)
    command = command_line("bench/reduced_vocab.py", parser, args, skip=("out",))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"rows": rows, "held_out_prompts": len(held), "corpus_records": len(records),
                                    "command": command}, indent=2) + "\n")
    lines = [f"Reduced-vocabulary {args.drafter} (int8 head, one thread, shared machine; tau: {len(held)} held-out "
             f"corpus prompts, {args.new_tokens} tokens, greedy, full trees)", "",
             "| N | head ms, 1 row | 4 rows | 8 rows | tau |", "|---|---|---|---|---|"]
    lines += [f"| {r['vocab']} | {r['ms_1']:.3f} | {r['ms_4']:.3f} | {r['ms_8']:.3f} | {r['tau']:.3f} |" for r in rows]
    lines += ["", f"Command: `{command}`", ""]
    args.out.with_suffix(".md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
