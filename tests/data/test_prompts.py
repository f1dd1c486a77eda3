"""Bench prompt sets, the draft-head training corpus, and the JSONL prompt loader."""

from __future__ import annotations

import json
import re

import pytest

from specdec.data import (
    BENCH_DIR,
    CATEGORIES,
    TRAIN_PROMPTS_PATH,
    bench_prompts,
    load_prompts,
    train_prompts,
)
from specdec.errors import SpecdecError

PER_CATEGORY = 14


def _norm(text: str) -> str:
    return " ".join(text.lower().split())


# ---------------------------------------------------------------------------------------------- bench files


@pytest.mark.parametrize("category", CATEGORIES)
def test_category_file_has_14_prompts_split_7_7(category):
    recs = load_prompts(BENCH_DIR / f"{category}.jsonl")
    assert len(recs) == PER_CATEGORY
    assert [r["id"] for r in recs] == [f"{category}-{i:02d}" for i in range(1, PER_CATEGORY + 1)]
    for r in recs:
        assert r["category"] == category
        assert isinstance(r["prompt"], str) and r["prompt"].strip() == r["prompt"] and r["prompt"]
        # split rule: odd-numbered ids are dev, even-numbered ids are test
        n = int(r["id"].rsplit("-", 1)[1])
        assert r["split"] == ("dev" if n % 2 else "test"), r["id"]
    assert sum(r["split"] == "dev" for r in recs) == 7
    assert sum(r["split"] == "test" for r in recs) == 7


@pytest.mark.parametrize("category", CATEGORIES)
def test_bench_files_are_one_json_object_per_line(category):
    lines = (BENCH_DIR / f"{category}.jsonl").read_text(encoding="utf-8").splitlines()
    assert len(lines) == PER_CATEGORY
    for line in lines:
        assert isinstance(json.loads(line), dict)


def test_conversation_prompts_are_multi_turn():
    for r in bench_prompts(["conversation"]):
        turns = r["turns"]
        assert len(turns) >= 2 and all(isinstance(t, str) and t.strip() for t in turns)
        assert turns[0] == r["prompt"]


def test_only_conversation_has_turns():
    others = [c for c in CATEGORIES if c != "conversation"]
    assert all("turns" not in r for r in bench_prompts(others))


@pytest.mark.parametrize("category", ["summarization", "rag"])
def test_long_passage_prompts(category):
    for r in bench_prompts([category]):
        words = len(r["prompt"].split())
        assert 150 <= words <= 450, (r["id"], words)


def test_rag_prompts_have_numbered_documents_and_a_quoting_question():
    for r in bench_prompts(["rag"]):
        p = r["prompt"]
        docs = re.findall(r"^\[(\d)\] ", p, flags=re.MULTILINE)
        assert 2 <= len(docs) <= 4 and docs == [str(i) for i in range(1, len(docs) + 1)], r["id"]
        assert "Question:" in p and "quote" in p.lower(), r["id"]


def test_translation_prompts_name_two_languages():
    for r in bench_prompts(["translation"]):
        langs = {lang for lang in ("English", "French", "German", "Spanish") if lang in r["prompt"]}
        assert "English" in langs and len(langs) == 2, r["id"]


def test_math_and_code_prompts_look_like_their_category():
    assert all("step by step" in r["prompt"] for r in bench_prompts(["math"]))
    assert all("Python" in r["prompt"] for r in bench_prompts(["code"]))


def test_bench_ids_and_prompts_unique():
    recs = bench_prompts()
    assert len(recs) == PER_CATEGORY * len(CATEGORIES)
    assert len({r["id"] for r in recs}) == len(recs)
    assert len({_norm(r["prompt"]) for r in recs}) == len(recs)


def test_bench_prompts_filters():
    assert len(bench_prompts(split="dev")) == 7 * len(CATEGORIES)
    assert len(bench_prompts(split="test")) == 7 * len(CATEGORIES)
    picked = bench_prompts(["rag", "math"], split="test")
    assert [r["category"] for r in picked] == ["rag"] * 7 + ["math"] * 7
    assert {r["split"] for r in picked} == {"test"}


def test_bench_prompts_bad_arguments():
    with pytest.raises(ValueError, match="split"):
        bench_prompts(split="train")
    with pytest.raises(FileNotFoundError, match="poetry"):
        bench_prompts(["poetry"])


def test_bench_prompts_from_another_directory(tmp_path):
    (tmp_path / "qa.jsonl").write_text(
        json.dumps({"id": "qa-01", "category": "qa", "prompt": "Why?", "split": "dev"}) + "\n", encoding="utf-8"
    )
    assert [r["prompt"] for r in bench_prompts(["qa"], directory=tmp_path)] == ["Why?"]
    assert bench_prompts(["qa"], split="test", directory=tmp_path) == []


# ------------------------------------------------------------------------------------------- train corpus


def test_train_corpus_size_fields_and_ids():
    recs = train_prompts()
    assert len(recs) >= 600
    assert [r["id"] for r in recs] == [f"train-{i:04d}" for i in range(1, len(recs) + 1)]
    for r in recs:
        assert r["category"] in CATEGORIES
        assert isinstance(r["prompt"], str) and r["prompt"].strip()
        assert "split" not in r
    counts = {c: sum(r["category"] == c for r in recs) for c in CATEGORIES}
    assert min(counts.values()) >= 50, counts
    assert len({_norm(r["prompt"]) for r in recs}) == len(recs)


def test_train_corpus_has_long_passages():
    for category in ("summarization", "rag"):
        long_ones = [r for r in train_prompts([category]) if len(r["prompt"].split()) >= 150]
        assert len(long_ones) >= 40, category


def test_train_corpus_disjoint_from_bench():
    bench = {_norm(r["prompt"]) for r in bench_prompts()}
    bench_turns = {_norm(t) for r in bench_prompts() for t in r.get("turns", [])}
    for r in train_prompts():
        assert _norm(r["prompt"]) not in bench, r["id"]
        for t in r.get("turns", []):
            assert _norm(t) not in bench_turns, r["id"]


def test_written_prompts_stay_clear_of_bench_paraphrases(tmp_path, monkeypatch):
    """A hand-written prompt that rewords a bench prompt is refused; the shipped ones all pass (build() runs)."""
    from tools import make_train_prompts as tool

    bench = [tool.content_words(r["prompt"]) for r in bench_prompts()]
    test_qa = bench_prompts(["qa"], "test")[0]["prompt"]
    assert tool.closest_bench(test_qa.replace("?", " exactly?"), bench) >= tool.WRITTEN_OVERLAP
    assert tool.closest_bench("How do submarines control their depth under water?", bench) < tool.WRITTEN_OVERLAP
    (tmp_path / "qa.jsonl").write_text(json.dumps({"category": "qa", "prompt": test_qa.upper() + " Briefly."}) + "\n")
    monkeypatch.setattr(tool, "WRITTEN", tmp_path)
    with pytest.raises(ValueError, match="too close to a bench prompt"):
        tool.build()


def test_train_corpus_matches_generator():
    from tools import make_train_prompts

    text = make_train_prompts.render(make_train_prompts.build())
    assert text == TRAIN_PROMPTS_PATH.read_text(encoding="utf-8"), (
        "train_prompts.jsonl is stale: python tools/make_train_prompts.py"
    )


# ------------------------------------------------------------------------------------------- load_prompts


def _write(tmp_path, text: str | bytes, name: str = "p.jsonl"):
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def test_load_prompts_reads_records_and_skips_blank_lines(tmp_path):
    path = _write(tmp_path, '{"prompt": "a", "extra": 1}\n\n   \n{"prompt": "b"}\n')
    assert load_prompts(path) == [{"prompt": "a", "extra": 1}, {"prompt": "b"}]
    assert load_prompts(str(path)) == load_prompts(path)


def test_load_prompts_missing_file_names_the_path(tmp_path):
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(FileNotFoundError, match=re.escape(str(missing))) as info:
        load_prompts(missing)
    assert isinstance(info.value, SpecdecError)


def test_load_prompts_directory_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="not a file"):
        load_prompts(tmp_path)


def test_load_prompts_malformed_line_names_the_line(tmp_path):
    path = _write(tmp_path, '{"prompt": "ok"}\n{"prompt": "broken"\n')
    with pytest.raises(ValueError, match=r"line 2: malformed JSON") as info:
        load_prompts(path)
    assert str(path) in str(info.value)
    assert isinstance(info.value, SpecdecError)


def test_load_prompts_missing_prompt_field(tmp_path):
    path = _write(tmp_path, '{"prompt": "ok"}\n{"id": "x"}\n')
    with pytest.raises(ValueError, match=r'line 2: missing required field "prompt"'):
        load_prompts(path)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('["prompt"]', "expected a JSON object"),
        ('{"prompt": ""}', "non-empty string"),
        ('{"prompt": 3}', "non-empty string"),
        ('{"prompt": "a", "turns": "a"}', '"turns"'),
        ('{"prompt": "a", "turns": []}', '"turns"'),
        ('{"prompt": "a", "turns": ["a", ""]}', '"turns"'),
    ],
)
def test_load_prompts_bad_records(tmp_path, line, message):
    path = _write(tmp_path, line + "\n")
    with pytest.raises(ValueError, match=re.escape(message)) as info:
        load_prompts(path)
    assert "line 1" in str(info.value)


def test_load_prompts_duplicate_id(tmp_path):
    path = _write(tmp_path, '{"id": "a", "prompt": "x"}\n{"id": "b", "prompt": "y"}\n{"id": "a", "prompt": "z"}\n')
    with pytest.raises(ValueError, match=r"line 3: duplicate id 'a' \(first used on line 1\)"):
        load_prompts(path)


def test_load_prompts_invalid_utf8_names_the_line(tmp_path):
    path = _write(tmp_path, b'{"prompt": "ok"}\n{"prompt": "caf\xe9"}\n')
    with pytest.raises(ValueError, match=r"line 2: not valid UTF-8"):
        load_prompts(path)


def test_load_prompts_accepts_utf8_bom_and_non_ascii(tmp_path):
    path = _write(tmp_path, '\ufeff{"prompt": "¿Dónde está la estación?"}\n')
    assert load_prompts(path) == [{"prompt": "¿Dónde está la estación?"}]
