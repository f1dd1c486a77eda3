"""tools/mix_corpus.py: the order, cut, filters and held-out rule of a corpus written for `--corpus FILE`."""

from __future__ import annotations

import json

import torch

from tools import mix_corpus


def _folder(path, prefix: str, n: int, sha: str = "abc"):
    path.mkdir()
    manifest = {"target": "t", "vocab_size": 100, "tokenizer_sha256": sha, "new_tokens": 8, "temperature": 0.0,
                "seed": 0, "max_prompt_tokens": 64, "format": 1}
    (path / "manifest.json").write_text(json.dumps(manifest))
    rows = [{"id": f"{prefix if i % 2 else 'sharegpt:'}{i}", "prompt_ids": [1, i], "token_ids": [i, 2],
             "finish": "stop"} for i in range(n)]
    (path / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_mix_then_append_keeps_order_and_leaves_held_out_records_out(tmp_path):
    a = _folder(tmp_path / "a", "train:", 30)
    b = _folder(tmp_path / "b", "grounded:", 12)
    out = tmp_path / "corpus.pt"
    assert mix_corpus.main(["--out", str(out), "--mix", f"{a}@20", "--mix", str(b), "--first", "10",
                            "--append", str(a), "--only-ids", "train:"]) == 0
    corpus = torch.load(out)
    firsts = [p[1] for p in corpus["prompt_ids"]]
    mixed, appended = firsts[:10], firsts[10:]
    held_out = {i for i in range(30) if mix_corpus.is_held_out(i)}
    assert held_out and not held_out & set(appended)
    assert sorted(appended) == [i for i in range(30) if i % 2 and i not in held_out]  # train: ids only
    assert len(mixed) == 10 and all(i < 20 for i in mixed)  # a@20 and b's 0..11
    assert corpus["response_ids"][0] == [firsts[0], 2]


def test_corpora_of_different_tokenizers_are_refused(tmp_path, capsys):
    a = _folder(tmp_path / "a", "train:", 4)
    b = _folder(tmp_path / "b", "train:", 4, sha="other")
    assert mix_corpus.main(["--out", str(tmp_path / "c.pt"), "--mix", str(a), "--append", str(b)]) == 1
    assert "different tokenizers" in capsys.readouterr().err
    assert not (tmp_path / "c.pt").exists()


def test_a_folder_that_is_not_a_corpus_is_one_error_line(tmp_path, capsys):
    assert mix_corpus.main(["--out", str(tmp_path / "c.pt"), "--mix", str(tmp_path / "nowhere")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error:") and "not a specdec corpus" in err and "Traceback" not in err
