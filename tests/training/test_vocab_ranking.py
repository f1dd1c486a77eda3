"""`specdec data vocab --from-prompts`: a token ranking from the corpus prompts' own text (the prompts
`collect_prompts` gives the corpus builder, bench prompts excluded: tested there), for a target too slow to
answer them (the Qwen pair's draft vocabulary); a missing ShareGPT file is one clear error."""

from __future__ import annotations

import json
from pathlib import Path

from specdec.drafters.heads.reduced_vocab import read_ranking
from tests.cli.runner import assert_user_error, run_cli


def write_sharegpt(path: Path, firsts: list[str]) -> Path:
    records = [{"id": f"c{i}", "conversations": [{"from": "human", "value": text}, {"from": "gpt", "value": "ok"}]}
               for i, text in enumerate(firsts)]
    path.write_text(json.dumps(records))
    return path


def test_the_ranking_counts_the_prompts_text(default_model, tmp_path):
    tokenizer = default_model.tokenizer
    firsts = [f"Tell me about zebra {i}:" + " zebra" * 40 for i in range(100)]  # above the training prompts' words
    out = tmp_path / "ranking.safetensors"
    result = run_cli("data", "vocab", "--target", "smollm2-135m", "--from-prompts", "--sharegpt",
                     str(write_sharegpt(tmp_path / "sharegpt.json", firsts)), "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert "prompts" in result.stdout and "top    512" in result.stdout
    ranking = read_ranking(out, default_model.model.config.vocab_size).tolist()
    zebra = tokenizer.encode(" zebra", add_special_tokens=False)
    assert all(ranking.index(t) < 10 for t in zebra), [ranking.index(t) for t in zebra]


def test_a_missing_sharegpt_file_is_one_clear_error(tmp_path):
    result = run_cli("data", "vocab", "--target", "smollm2-135m", "--from-prompts", "--sharegpt",
                     str(tmp_path / "nowhere.json"), "--out", str(tmp_path / "r.safetensors"))
    assert_user_error(result, "does not exist")


def test_then_prompts_orders_the_tokens_the_answers_tie_on_by_prompt_frequency():
    import torch

    from specdec.drafters.heads.reduced_vocab import ranking_with_tiebreak

    counts = torch.tensor([3, 0, 3, 0, 1])  # answers: ids 0 and 2 tie, ids 1 and 3 never appear
    prompts = torch.tensor([0, 5, 1, 2, 9])
    assert ranking_with_tiebreak(counts, prompts).tolist() == [2, 0, 4, 1, 3]


def test_from_prompts_and_then_prompts_together_are_one_clear_error(tmp_path):
    result = run_cli("data", "vocab", "--target", "smollm2-135m", "--from-prompts", "--then-prompts",
                     "--out", str(tmp_path / "r.safetensors"))
    assert_user_error(result, "--then-prompts ranks the answers first")
