"""The fast tokenizer (tokenizer.json through `tokenizers`, no transformers import) gives exactly what the
transformers tokenizer gives: ids, text, chat template; folders it cannot vouch for load through transformers."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from specdec.models.tokenizer import FastTokenizer, load_tokenizer

TEXTS = ["hi", "Hello world!  ", "  leading spaces", "日本語 テキスト 🎉", "<|im_start|>user\nx<|im_end|>",
         "a\n\n\tb", "don't . , ?", "x" * 500, "def f(x):\n    return x ** 2\n"]
CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "q"}, {"role": "assistant", "content": "a"},
     {"role": "user", "content": "more {{ braces }} and {% tags %}"}],
]


@pytest.fixture(scope="module")
def pair(default_model):
    from transformers import AutoTokenizer

    folder = Path(default_model.source)
    return FastTokenizer.from_folder(folder), AutoTokenizer.from_pretrained(str(folder))


def test_the_default_model_loads_the_fast_tokenizer(default_model):
    assert isinstance(default_model.tokenizer, FastTokenizer)


def test_encode_matches_transformers(pair):
    fast, hf = pair
    for text in TEXTS:
        for special in (True, False):
            assert fast.encode(text, add_special_tokens=special) == hf.encode(text, add_special_tokens=special), text


def test_decode_matches_transformers_on_random_ids(pair):
    fast, hf = pair
    rng = random.Random(0)
    for _ in range(300):
        ids = [rng.randrange(len(hf)) for _ in range(rng.randrange(1, 40))]
        for skip in (True, False):
            assert fast.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip), ids


def test_chat_template_matches_transformers(pair):
    fast, hf = pair
    for messages in CONVERSATIONS:
        for prompt in (True, False):
            ours = fast.apply_chat_template(messages, tokenize=False, add_generation_prompt=prompt)
            assert ours == hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=prompt)


def test_vocabulary_and_special_tokens_match_transformers(pair):
    fast, hf = pair
    assert fast.get_vocab() == hf.get_vocab() and len(fast) == len(hf)
    assert (fast.eos_token_id, fast.bos_token_id, fast.pad_token_id) == (hf.eos_token_id, hf.bos_token_id,
                                                                         hf.pad_token_id)
    assert fast.special_tokens_map == hf.special_tokens_map and fast.model_max_length == hf.model_max_length
    assert fast.convert_ids_to_tokens([1, 2]) == hf.convert_ids_to_tokens([1, 2])  # anything else: transformers


@pytest.mark.parametrize("edit", [
    lambda cfg: {**cfg, "tokenizer_class": "LlamaTokenizer"},
    lambda cfg: {**cfg, "add_bos_token": True},
])
def test_folders_whose_tokenizer_transformers_rewrites_load_through_transformers(default_model, tmp_path, edit):
    folder = tmp_path / "tok"
    folder.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"):
        if (Path(default_model.source) / name).exists():
            shutil.copy(Path(default_model.source) / name, folder / name)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps(edit(config)))
    assert FastTokenizer.from_folder(folder) is None
    assert not isinstance(load_tokenizer(folder), FastTokenizer)


def test_loading_the_fast_tokenizer_imports_no_transformers(default_model):
    code = (f"import sys; from specdec.models.tokenizer import load_tokenizer; t = load_tokenizer({default_model.source!r}); "
            "t.apply_chat_template([{'role': 'user', 'content': 'hi'}], add_generation_prompt=True); "
            "assert 'transformers' not in sys.modules and 'torch' not in sys.modules; print('ok')")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                            cwd=Path(__file__).resolve().parents[2])
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr
