"""How much int8 (dynamic W8A8) changes the default model: agreement with fp32 and log-likelihood.

    python bench/int8_quality.py --per-category 2 --new-tokens 64
    python bench/int8_quality.py --per-category 2 --new-tokens 64 --quantize int8,int7 \
        --out bench/results/int7_quality.json

For each prompt, the fp32 model writes its greedy answer. Then both models score that same text, teacher-forced:
* greedy agreement: the fraction of answer positions where the int8 model's argmax equals the fp32 greedy token
  (fp32 agrees with itself by construction);
* mean log-likelihood per answer token of the fp32 greedy text under each model (closer to fp32's is better).
Also reported: how many answers, generated freely by int8, are identical to fp32's. `--quantize` names the
formats to score (each gets its own keys, `_int7` and so on, past the first); `int8@bfloat16` is int8 with a
bfloat16 K/V cache (EngineConfig.kv_cache_dtype: attention on AMX tiles), to see what that precision costs:

    python bench/int8_quality.py --per-category 2 --new-tokens 64 --quantize int8,int8@bfloat16 \
        --out bench/results/kv_cache_ab/quality_dev.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from rich.console import Console

from specdec import LLM, SamplingParams
from specdec.benchmarks.command import command_line
from specdec.config import EngineConfig
from specdec.data import CATEGORIES, bench_prompts
from specdec.kvcache import BlockTable
from specdec.engine.runner import Chunk

RESULTS = Path(__file__).resolve().parent / "results"


def score(llm: LLM, prompt_ids: list[int], answer: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(argmax, log-prob of the given answer token) at every answer position, teacher-forced."""
    ids = prompt_ids + answer
    runner = llm.engine.runner
    table = BlockTable()
    logits = runner.run([Chunk(table, ids, list(range(len(ids))), None, "all")])[0].logits
    runner.cache.free(table)
    rows = logits[len(prompt_ids) - 1: len(ids) - 1]
    logp = torch.log_softmax(rows.float(), dim=-1)
    return rows.argmax(-1), logp.gather(1, torch.tensor(answer)[:, None])[:, 0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-category", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--split", default="dev")
    parser.add_argument("--quantize", default="int8", help="comma list of weight formats (int8, int7, int4)")
    parser.add_argument("--out", type=Path, default=RESULTS / "int8_quality.json")
    args = parser.parse_args()
    console = Console()
    prompts = []
    for category in CATEGORIES:
        prompts += [p["prompt"] for p in bench_prompts([category], split=args.split)[: args.per_category]]
    fp32 = LLM("smollm2-135m", show_progress=False)
    formats = args.quantize.split(",")
    quantized = {}
    for q in formats:
        weights, _, kv = q.partition("@")
        quantized[q] = LLM("smollm2-135m", quantize=weights, show_progress=False,
                           engine_config=EngineConfig(kv_cache_dtype=kv or "auto"))
    params = SamplingParams(max_new_tokens=args.new_tokens)
    total = 0
    agree, same_answers, ll = dict.fromkeys(formats, 0), dict.fromkeys(formats, 0), {q: [] for q in ["fp32", *formats]}
    with console.status("scoring") as status:
        for i, prompt in enumerate(prompts):
            status.update(f"prompt {i + 1}/{len(prompts)}")
            ids = fp32.encode(prompt)
            answer = fp32.generate([ids], params)[0].token_ids
            total += len(answer)
            ll["fp32"].append(float(score(fp32, ids, answer)[1].mean()))
            for q, llm in quantized.items():
                same_answers[q] += answer == llm.generate([ids], params)[0].token_ids
                argmax, lp = score(llm, ids, answer)
                agree[q] += int((argmax == torch.tensor(answer)).sum())
                ll[q].append(float(lp.mean()))
    result = {"prompts": len(prompts), "answer_tokens": total,
              "mean_loglik_fp32_text_under_fp32": sum(ll["fp32"]) / len(ll["fp32"])}
    for n, q in enumerate(formats):
        tail = "" if n == 0 else f"_{q.replace('@', '_kv_')}"
        result.update({
            f"greedy_agreement{tail}": agree[q] / total,
            f"identical_free_answers{tail}": same_answers[q] / len(prompts),
            f"mean_loglik_fp32_text_under_{q.replace('@', '_kv_')}": sum(ll[q]) / len(ll[q]),
        })
    result["command"] = command_line("bench/int8_quality.py", parser, args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    console.print_json(json.dumps(result))


if __name__ == "__main__":
    main()
