"""Is EAGLE's low acceptance on the test prompts the head, or the engine? Teacher-forced agreement beside it.

    OMP_NUM_THREADS=1 python bench/eagle_agreement.py --heads specdec/assets/eagle/smollm2-135m,runs/x/eagle

For each test prompt (two per category) the int8 target answers greedily (64 tokens); then, offline, the fp32
target's final-norm features of prompt + answer go through each head as in training (dense attention, float
weights, the 4,096-token draft vocabulary), and at every answer position the head's argmax is compared with the
token the target chose: the teacher-forced depth-1 agreement. The engine drafts only some positions (with
`chain:k=1` a step that accepts emits a bonus token, whose position is never drafted), so the second table
replays that walk over the same hits: what `chain:k=1` would accept if the engine matched the offline head. If
the engine's acceptance (`bench/heldout_tau.py` with `chain:k=1`: tau - 1, about) is well below the replay,
the engine loses something the head has (int8 weights, features, a bug); if not, the head is the limit.

With `--corpus FOLDER` (a `specdec data build` corpus) the first table also gets rows for the corpus's own
answers, first `--new-tokens` of each: `--corpus-per-group` records of each training-prompt category
(`train-<category>`, ours, mostly seen in training) and three times as many ShareGPT first turns: how far the
test answers' agreement is from what the head reaches on the kind of text it was trained on.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specdec import LLM, SamplingParams  # noqa: E402
from specdec.data import CATEGORIES, bench_prompts  # noqa: E402
from specdec.drafters.heads.eagle_checkpoint import load_eagle  # noqa: E402
from specdec.drafters.heads.reduced_vocab import draft_vocab, head_rows  # noqa: E402
from specdec.models.dense import dense_forward  # noqa: E402
from specdec.models.loader import load_model  # noqa: E402
from specdec.training.eagle import DenseAttention  # noqa: E402


def chain1_walk(hits: list[bool]) -> list[bool]:
    """The positions a `chain:k=1` run drafts: after an accepted draft the next position is the bonus token."""
    walked, j = [], 0
    while j < len(hits):
        walked.append(hits[j])
        j += 2 if hits[j] else 1
    return walked


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--heads", default="specdec/assets/eagle/smollm2-135m", help="comma list of EAGLE folders")
    parser.add_argument("--split", default="test")
    parser.add_argument("--per-category", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--corpus", type=Path, help="also rows for this corpus's answers, by prompt kind")
    parser.add_argument("--corpus-per-group", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(1)
    heads = args.heads.split(",")
    llm = LLM("smollm2-135m", quantize="int8", show_progress=False, num_threads=1)
    target = load_model("smollm2-135m", "cpu", "float32", show_progress=False).model
    ids = draft_vocab("smollm2-135m", args.vocab, target.config.vocab_size)
    rows = head_rows(target, ids)
    models = [load_eagle(Path(h), target.config, torch.device("cpu"), torch.float32)[0].eval() for h in heads]
    every = {(c, i): [] for c in CATEGORIES for i in range(len(heads))}
    walked = {(c, i): [] for c in CATEGORIES for i in range(len(heads))}
    answers = [(category, llm.encode(record["prompt"], chat=True), list(llm.generate(
        [record["prompt"]], SamplingParams(max_new_tokens=args.new_tokens, temperature=0))[0].token_ids))
        for category in CATEGORIES for record in bench_prompts([category], args.split)[: args.per_category]]
    groups = corpus_answers(args.corpus, args.corpus_per_group, args.new_tokens) if args.corpus else []
    for category, prompt, answer in answers + groups:
        seq = torch.tensor([prompt + answer])
        with torch.inference_mode():
            features = dense_forward(target, seq)[0]
            pairs = seq.shape[1] - 1
            embeds = target.embed_tokens(seq[0, 1:]).float()
            # the output at pair t = (f_t, x_{t+1}) guesses x_{t+2}; the drafted answer tokens are 1..A-1
            at = torch.arange(len(prompt) - 1, len(prompt) + len(answer) - 2)
            for i, model in enumerate(models):
                out_rows = model(embeds, features[:-1], torch.arange(pairs),
                                 DenseAttention(1, pairs, model.config.layer))
                guess = ids[(out_rows @ rows.T).argmax(-1)]
                hits = (guess[at] == seq[0, at + 2]).tolist()
                every.setdefault((category, i), []).extend(hits)  # corpus groups get their rows here
                if (category, i) in walked:
                    walked[(category, i)] += chain1_walk(hits)
    names = " | ".join(f"`{h}`" for h in heads)
    for title, table in (("every answer position", every), ("positions a chain:k=1 run drafts", walked)):
        print(f"\nTeacher-forced depth-1 agreement, {title}\n\n| category | {names} |\n|---|" + "---|" * len(heads))
        extra = sorted({g for g, _ in table} - set(CATEGORIES))
        for category in (*CATEGORIES, "all", *extra):
            cells = []
            for i in range(len(heads)):
                hits = (sum((table[(c, i)] for c in CATEGORIES), []) if category == "all"
                        else table[(category, i)])
                cells.append(f"{sum(hits) / max(len(hits), 1):.3f}")
            print(f"| {category} | " + " | ".join(cells) + " |")


def corpus_answers(folder: Path, per_group: int, length: int) -> list[tuple[str, list[int], list[int]]]:
    """(group, prompt ids, first `length` answer ids) for `per_group` random records of each training-prompt
    category and `3 * per_group` ShareGPT ones (fixed seed)."""
    import random

    from specdec.data import train_prompts
    from specdec.training.corpus_store import iter_records

    kind = {r["id"]: r["category"] for r in train_prompts()}
    groups: dict[str, list[dict]] = {}
    for record in iter_records(folder.expanduser()):
        source, _, rid = record["id"].partition(":")
        name = f"train-{kind[rid]}" if source == "train" and rid in kind else source
        if len(record["token_ids"]) >= 4:
            groups.setdefault(name, []).append(record)
    rng, out = random.Random(0), []
    for name in sorted(groups):
        count = per_group * 3 if name == "sharegpt" else per_group if name.startswith("train-") else 0
        for record in rng.sample(groups[name], min(count, len(groups[name]))):
            out.append((name, record["prompt_ids"], record["token_ids"][:length]))
    return out


if __name__ == "__main__":
    main()
