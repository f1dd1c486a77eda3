"""How much int8 (dynamic W8A8) changes the default model: agreement with fp32 and log-likelihood.

    python bench/int8_quality.py --per-category 2 --new-tokens 64

For each prompt, the fp32 model writes its greedy answer. Then both models score that same text, teacher-forced:
* greedy agreement: the fraction of answer positions where the int8 model's argmax equals the fp32 greedy token
  (fp32 agrees with itself by construction);
* mean log-likelihood per answer token of the fp32 greedy text under each model (closer to fp32's is better).
Also reported: how many answers, generated freely by int8, are identical to fp32's.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from rich.console import Console

from specdec import LLM, SamplingParams
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
    parser.add_argument("--out", type=Path, default=RESULTS / "int8_quality.json")
    args = parser.parse_args()
    console = Console()
    prompts = []
    for category in CATEGORIES:
        prompts += [p["prompt"] for p in bench_prompts([category], split=args.split)[: args.per_category]]
    fp32 = LLM("smollm2-135m", show_progress=False)
    int8 = LLM("smollm2-135m", quantize="int8", show_progress=False)
    params = SamplingParams(max_new_tokens=args.new_tokens)
    agree = total = same_answers = 0
    ll_fp32, ll_int8 = [], []
    with console.status("scoring") as status:
        for i, prompt in enumerate(prompts):
            status.update(f"prompt {i + 1}/{len(prompts)}")
            ids = fp32.encode(prompt)
            answer = fp32.generate([ids], params)[0].token_ids
            free_int8 = int8.generate([ids], params)[0].token_ids
            same_answers += answer == free_int8
            argmax_int8, lp_int8 = score(int8, ids, answer)
            _, lp_fp32 = score(fp32, ids, answer)
            agree += int((argmax_int8 == torch.tensor(answer)).sum())
            total += len(answer)
            ll_fp32.append(float(lp_fp32.mean()))
            ll_int8.append(float(lp_int8.mean()))
    result = {
        "prompts": len(prompts), "answer_tokens": total,
        "greedy_agreement": agree / total,
        "identical_free_answers": same_answers / len(prompts),
        "mean_loglik_fp32_text_under_fp32": sum(ll_fp32) / len(ll_fp32),
        "mean_loglik_fp32_text_under_int8": sum(ll_int8) / len(ll_int8),
        "command": f"python bench/int8_quality.py --per-category {args.per_category} --new-tokens {args.new_tokens}"
                   f" --split {args.split}",
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    console.print_json(json.dumps(result))


if __name__ == "__main__":
    main()
