"""bench/eagle_agreement.py: the corpus rows group records by prompt kind and cut answers to the tested length;
the chain:k=1 walk skips the bonus position after every accepted draft."""

from __future__ import annotations

import json

from bench import eagle_agreement as agreement
from specdec.data import train_prompts


def test_corpus_rows_group_by_kind_and_cut_answers(tmp_path):
    kinds = {}
    for record in train_prompts():
        kinds.setdefault(record["category"], record["id"])
    rows = [{"id": f"train:{rid}", "prompt_ids": [1, 2], "token_ids": list(range(10))} for rid in kinds.values()]
    rows += [{"id": f"sharegpt:s{i}", "prompt_ids": [3], "token_ids": list(range(9))} for i in range(5)]
    rows += [{"id": "grounded:g0", "prompt_ids": [4], "token_ids": list(range(9))},
             {"id": "sharegpt:short", "prompt_ids": [5], "token_ids": [1, 2]}]
    (tmp_path / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = agreement.corpus_answers(tmp_path, per_group=1, length=6)
    groups = sorted(name for name, _, _ in out)
    assert groups == sorted(["sharegpt"] * 3 + [f"train-{kind}" for kind in kinds])  # 3x ShareGPT, no grounded
    assert all(len(answer) == 6 for _, _, answer in out)  # cut; the 2-token answer is never drawn


def test_chain1_walk_skips_the_bonus_position():
    assert agreement.chain1_walk([True, False, False, True, True, False]) == [True, False, True, False]
