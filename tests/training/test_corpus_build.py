"""The training corpus: ShareGPT prompts survive a truncated file, an interrupted build resumes without
duplicates or losses, and a corpus made for another tokenizer is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specdec.errors import ConfigError
from specdec.training.corpus_build import PromptStats, build_corpus, collect_prompts, encode_prompts, engine_generator
from specdec.training.corpus_store import (RECORDS, Manifest, iter_records, load_records, open_store,
                                           tokenizer_fingerprint)
from specdec.training.sharegpt import read_sharegpt


def _conversation(cid: str, first_from: str, text: str) -> dict:
    return {"id": cid, "conversations": [{"from": first_from, "value": text}, {"from": "gpt", "value": "reply"}]}


def test_sharegpt_parser_recovers_whole_records_from_a_truncated_file(tmp_path: Path):
    records = [_conversation("a_0", "human", "First question?"), _conversation("b_0", "gpt", "not a prompt"),
               _conversation("c_0", "human", "Second, with \"quotes\" and ] brackets ["),
               _conversation("d_0", "human", "This one is cut off")]
    text = json.dumps(records, indent=2)
    cut = text.index("This one is cut") + 8  # inside the last record, as in the wheel's file
    path = tmp_path / "sharegpt.json"
    path.write_text(text[:cut])
    with pytest.raises(json.JSONDecodeError):
        json.loads(path.read_text())
    assert read_sharegpt(path) == [("a_0", "First question?"), ("c_0", "Second, with \"quotes\" and ] brackets [")]
    path.write_text(text)  # the whole file: every human-first conversation
    assert [cid for cid, _ in read_sharegpt(path)] == ["a_0", "c_0", "d_0"]


def test_prompts_exclude_bench_prompts_and_repeats():
    stats = PromptStats()
    items = collect_prompts([("x", "Tell me  a joke"), ("y", "tell me a JOKE"), ("z", "What is 2+2?")],
                            [{"id": "t1", "prompt": "Write a poem"}], ["What is 2+2?"], seed=0, stats=stats)
    assert sorted(i.text for i in items) == ["Tell me  a joke", "Write a poem"]
    assert (stats.duplicates, stats.bench_dropped) == (1, 1)
    fits = encode_prompts(items, lambda text: list(range(len(text))), max_prompt_tokens=14, context=100,
                          new_tokens=8, stats=stats)
    assert [i for i, _ in fits] == ["train:t1"] and stats.too_long == 1


def _manifest(vocab: int = 100, sha: str = "abc") -> Manifest:
    return Manifest(target="tiny", vocab_size=vocab, tokenizer_sha256=sha, new_tokens=4, temperature=0.0, seed=0,
                    max_prompt_tokens=16)


def _answers(batch):
    """A deterministic fake target; finishes requests out of order, as continuous batching does."""
    for index in reversed(range(len(batch))):
        yield index, [(t * 7 + 1) % 100 for t in batch[index]][:4], "length"


def _interrupting(after: int):
    count = 0

    def generate(batch):
        nonlocal count
        for item in _answers(batch):
            if count == after:
                raise KeyboardInterrupt
            count += 1
            yield item

    return generate


def test_interrupted_build_resumes_without_duplicates_or_losses(tmp_path: Path):
    prompts = [(f"p{i}", [i, i + 1, i + 2]) for i in range(23)]
    with open_store(tmp_path / "whole", _manifest()) as store:
        build_corpus(store, prompts, _answers, chunk=5)
    expected = {r["id"]: r for r in iter_records(tmp_path / "whole")}
    assert len(expected) == 23

    folder = tmp_path / "resumed"
    with pytest.raises(KeyboardInterrupt):
        with open_store(folder, _manifest()) as store:
            build_corpus(store, prompts, _interrupting(after=12), chunk=5)
    with (folder / RECORDS).open("ab") as f:  # a kill in the middle of a write leaves a partial line
        f.write(b'{"id": "p13", "prompt_ids": [13, 1')
    with open_store(folder, _manifest()) as store:
        assert len(store.done) == 12
        assert build_corpus(store, prompts, _answers, chunk=5) == 11
    lines = (folder / RECORDS).read_bytes().splitlines()
    got = [json.loads(line) for line in lines]
    assert len(got) == 23 and len({r["id"] for r in got}) == 23
    assert {r["id"]: r for r in got} == expected
    with open_store(folder, _manifest()) as store:  # a finished corpus: nothing left to do
        assert build_corpus(store, prompts, _answers, chunk=5) == 0


def test_corpus_of_another_vocabulary_is_refused(tmp_path: Path):
    with open_store(tmp_path, _manifest()) as store:
        store.append("p0", [1, 2], [3], "length")
    with pytest.raises(ConfigError, match="another tokenizer.*vocabulary is 200"):
        open_store(tmp_path, _manifest(vocab=200))
    with pytest.raises(ConfigError, match="different tokens"):
        load_records(tmp_path, 100, "other-sha")
    with pytest.raises(ConfigError, match="other settings"):
        open_store(tmp_path, Manifest(**{**_manifest().__dict__, "new_tokens": 8}))
    assert [r["id"] for r in load_records(tmp_path, 100, "abc")] == ["p0"]


def test_fingerprint_tells_tokenizers_apart():
    class Vocab:
        def __init__(self, table):
            self.table = table

        def get_vocab(self):
            return self.table

    assert tokenizer_fingerprint(Vocab({"a": 0, "b": 1}), 2) == tokenizer_fingerprint(Vocab({"b": 1, "a": 0}), 2)
    assert tokenizer_fingerprint(Vocab({"a": 0, "b": 1}), 2) != tokenizer_fingerprint(Vocab({"a": 1, "b": 0}), 2)
    assert tokenizer_fingerprint(Vocab({"a": 0, "b": 1}), 2) != tokenizer_fingerprint(Vocab({"a": 0, "b": 1}), 3)


def test_fingerprint_is_computed_once_per_tokenizer_and_again_when_tokens_are_added():
    class Growing:
        def __init__(self):
            self.table, self.reads = {"a": 0, "b": 1}, 0

        def get_vocab(self):
            self.reads += 1
            return dict(self.table)

        def __len__(self):
            return len(self.table)

    tok = Growing()
    first = tokenizer_fingerprint(tok, 3)
    assert tokenizer_fingerprint(tok, 3) == first and tok.reads == 1
    tok.table["c"] = 2  # an added token: the ids now mean something else for id 2
    assert tokenizer_fingerprint(tok, 3) != first and tok.reads == 2


def test_engine_answers_are_the_targets_greedy_answers(default_llm):
    from specdec.config import SamplingParams

    prompts = [default_llm.encode(text) for text in ("Name a colour.", "What is a cat?", "Say hi.")]
    got = {index: ids for index, ids, _ in engine_generator(default_llm, new_tokens=6)(prompts)}
    plain = default_llm.generate(prompts, SamplingParams(max_new_tokens=6), chat=False)
    assert [got[i] for i in range(3)] == [o.token_ids for o in plain]


def test_trainers_read_the_training_records_of_a_matching_corpus(tmp_path: Path):
    from types import SimpleNamespace

    from specdec.training.common import corpus_from_store

    class Tok:
        def get_vocab(self):
            return {f"t{i}": i for i in range(100)}

    loaded = SimpleNamespace(tokenizer=Tok(), model=SimpleNamespace(config=SimpleNamespace(vocab_size=100)))
    manifest = Manifest(**{**_manifest().__dict__, "tokenizer_sha256": tokenizer_fingerprint(Tok(), 100)})
    with open_store(tmp_path, manifest) as store:
        for i in range(25):
            store.append(f"p{i}", [i, 1], [i % 7, 2, 3], "length")
    corpus = corpus_from_store(tmp_path, loaded)
    assert len(corpus.prompt_ids) == 22  # records 0, 10 and 20 are held out
    assert [p[0] for p in corpus.prompt_ids][:10] == [1, 2, 3, 4, 5, 6, 7, 8, 9, 11]
    other = SimpleNamespace(tokenizer=Tok(), model=SimpleNamespace(config=SimpleNamespace(vocab_size=120)))
    with pytest.raises(ConfigError, match="another tokenizer"):
        corpus_from_store(tmp_path, other)
