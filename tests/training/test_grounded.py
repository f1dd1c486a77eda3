"""Grounded prompts (summaries, retrieval answers, translations of ShareGPT replies) and training on several
corpora at once (`--corpus` repeated)."""

from __future__ import annotations

import json
import random
from pathlib import Path
from types import SimpleNamespace

import pytest

from specdec.errors import ConfigError
from specdec.training.common import Corpus, mixed_corpus, obtain_corpus
from specdec.training.grounded import KINDS, grounded_prompts, is_prose, translation_prompt
from specdec.training.sharegpt import first_exchanges, read_records

PROSE = ("The river runs through the old town and past the market. Boats carry fruit and cloth to the harbour "
         "every morning, and the traders shout their prices across the water.\n\nIn winter the river freezes "
         "at its edges. Children skate near the bridge while their parents buy roasted chestnuts from a stall "
         "that has stood there for forty years.\n\nVisitors often ask why the town never built a second bridge. "
         "The answer is money: the council spent it on a new school instead, and most people agree it was right.")


def _exchange(cid: str, ask: str, reply: str) -> tuple[str, str, str]:
    return cid, ask, reply


def test_first_exchanges_pair_the_first_question_with_its_reply_in_a_truncated_file(tmp_path: Path):
    records = [{"id": "a", "conversations": [{"from": "human", "value": "Why?"}, {"from": "gpt", "value": "Because."}]},
               {"id": "b", "conversations": [{"from": "gpt", "value": "hi"}, {"from": "human", "value": "x"}]},
               {"id": "c", "conversations": [{"from": "human", "value": "Only a question"}]},
               {"id": "d", "conversations": [{"from": "human", "value": "Q"}, {"from": "gpt", "value": "cut here"}]}]
    text = json.dumps(records)
    path = tmp_path / "sharegpt.json"
    path.write_text(text[: text.index("cut here") + 3])
    assert list(first_exchanges(read_records(path))) == [("a", "Why?", "Because.")]


def test_grounded_prompts_take_turns_quote_their_reply_and_skip_code():
    usable = [_exchange(f"c{i}", f"What happens to the river in winter number {i}?", PROSE) for i in range(9)]
    code = [_exchange("code", "Fix my script", "Here is the fix:\n```python\nprint('hi')\n```\n" + PROSE)]
    items = grounded_prompts(usable + code, 6, seed=3)
    assert [item.id.split(":")[1] for item in items] == list(KINDS) * 2
    assert all(not item.id.endswith(":code") for item in items)
    summary, retrieval, translation = items[:3]
    assert PROSE in summary.text
    assert "Question: What happens to the river in winter" in retrieval.text and "[1] " in retrieval.text
    assert any(sentence in translation.text for sentence in PROSE.replace("\n", " ").split(". "))
    assert grounded_prompts(usable + code, 6, seed=3) == items  # deterministic for a seed
    assert grounded_prompts(usable, 6, seed=4) != items


def test_prose_filter_and_translation_spans_leave_out_lists_and_markup():
    assert is_prose(PROSE) and not is_prose("Use `ls` here") and not is_prose("| a | b |")
    assert not is_prose("Это текст на русском языке, а не английский.")
    assert translation_prompt("1. First item here.\n2. Second item there.", random.Random(0)) is None
    text = translation_prompt(PROSE, random.Random(0))
    assert text is not None and "1." not in text


def test_several_corpora_mix_in_proportion_and_keep_every_pair():
    a = Corpus([[1, i] for i in range(30)], [[100 + i] for i in range(30)], 2.0)
    b = Corpus([[2, i] for i in range(10)], [[200 + i] for i in range(10)], 1.0)
    mixed = mixed_corpus([a, b])
    pairs = sorted(zip(map(tuple, mixed.prompt_ids), map(tuple, mixed.response_ids)))
    assert pairs == sorted([((1, i), (100 + i,)) for i in range(30)] + [((2, i), (200 + i,)) for i in range(10)])
    assert mixed.seconds == 3.0 and mixed_corpus([a]) is a
    assert any(p[0] == 2 for p in mixed.prompt_ids[:20]) and any(p[0] == 2 for p in mixed.prompt_ids[20:])


def test_trainers_read_repeated_corpora_and_name_a_missing_one(tmp_path: Path):
    import torch

    for name, first in (("a.pt", 1), ("b.pt", 2)):
        torch.save({"prompt_ids": [[first, i] for i in range(8)], "response_ids": [[3, 4]] * 8, "seconds": 0.0},
                   tmp_path / name)
    loaded = SimpleNamespace(model=SimpleNamespace(config=SimpleNamespace(vocab_size=50)))
    cfg = SimpleNamespace(corpus=[str(tmp_path / "a.pt"), str(tmp_path / "b.pt")], max_prompts=12)
    corpus = obtain_corpus(cfg, loaded, tmp_path, False, lambda *a: None, 4)
    assert len(corpus.prompt_ids) == 12 and {p[0] for p in corpus.prompt_ids} == {1, 2}
    cfg.corpus = [str(tmp_path / "a.pt"), str(tmp_path / "missing.pt")]
    with pytest.raises(ConfigError, match="missing.pt does not exist"):
        obtain_corpus(cfg, loaded, tmp_path, False, lambda *a: None, 4)


def test_only_grounded_without_a_count_is_one_clear_error(tmp_path: Path):
    from tests.cli.runner import assert_user_error, run_cli

    result = run_cli("data", "build", "--only-grounded", "--out", str(tmp_path / "corpus"))
    assert_user_error(result, "--only-grounded needs --grounded N")
    result = run_cli("data", "build", "--grounded", "-5", "--out", str(tmp_path / "corpus"))
    assert_user_error(result, "--grounded must be >= 0")
