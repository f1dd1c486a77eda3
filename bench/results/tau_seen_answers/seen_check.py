"""Which of `--split train`'s prompts the shipped EAGLE head's last run trained on, and how long their answers are.

    python bench/results/tau_seen_answers/seen_check.py [PER_CATEGORY]

A prompt counts as seen when its record in the `specdec data build` corpus (`~/.cache/specdec/corpora/smollm2-135m`,
id `train:<id>`) has prompt token ids that are among the run's sequences (`/work/runs/own_corpus.pt`, written by
`tools/mix_corpus.py`, see `specdec/assets/eagle/smollm2-135m/README.md`). Both live on the training machine only.
"""
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from specdec.data import CATEGORIES, train_prompts  # noqa: E402

per_category = int(sys.argv[1]) if len(sys.argv) > 1 else 2
records = train_prompts()
chosen = [r for c in CATEGORIES for r in [r for r in records if r.get("category") == c][-per_category:]]
corpus = {}
with open(Path("~/.cache/specdec/corpora/smollm2-135m/records.jsonl").expanduser()) as f:
    for line in f:
        record = json.loads(line)
        if record["id"].startswith("train:"):
            corpus[record["id"].removeprefix("train:")] = record
run = torch.load("/work/runs/own_corpus.pt", map_location="cpu", weights_only=False)
trained = {tuple(p.tolist() if hasattr(p, "tolist") else p) for p in run["prompt_ids"]}
seen = 0
for r in chosen:
    record = corpus.get(r["id"])
    was_seen = record is not None and tuple(record["prompt_ids"]) in trained
    seen += was_seen
    answer = len(record["token_ids"]) if record else "-"
    print(f"{r['id']} {r['category']:<13} seen={was_seen} answer_tokens={answer}")
print(f"{seen} of {len(chosen)} seen in training")
