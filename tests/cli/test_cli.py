"""The command line, run as a user runs it: a subprocess. Bad input gets one red line and exit code 2."""

from __future__ import annotations

import json

import pytest

from tests.cli.runner import TINY, assert_user_error, run_cli as specdec


def test_generate_streams_text_and_prints_stats_on_the_default_model(default_model):
    result = specdec("generate", "What is the capital of France?", "--max-new-tokens", "16")
    assert result.returncode == 0, result.stderr
    assert "Paris" in result.stdout
    assert "tok/s" in result.stderr and "TTFT" in result.stderr


def test_generate_json_with_a_drafter():
    result = specdec("generate", "hello hello hello hello", *TINY, "--max-new-tokens", "8", "--json",
                     "--drafter", "ngram", "--tree", "chain:k=3")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert len(data["token_ids"]) == 8 and data["finish_reason"] == "length"
    assert data["metrics"]["target_steps"] >= 1


@pytest.mark.parametrize("drafter", ["recycle", "suffix", "hybrid:suffix+recycle"])
def test_generate_with_the_model_free_drafters_out_of_the_box(drafter):
    result = specdec("generate", "one two three one two three one two", *TINY, "--max-new-tokens", "12", "--json",
                     "--drafter", drafter)
    assert result.returncode == 0, result.stderr
    assert len(json.loads(result.stdout)["token_ids"]) == 12


def test_show_acceptance_names_the_proposer_of_hybrid_tokens(default_model):
    prompt = "Repeat exactly, five times: the quick brown fox jumps over the lazy dog."
    result = specdec("generate", prompt, "--max-new-tokens", "64", "--drafter", "hybrid:suffix+recycle",
                     "--show-acceptance")
    assert result.returncode == 0, result.stderr
    assert "accepted drafted tokens by proposer" in result.stderr
    assert "the drafter(s) that proposed the token" in result.stderr


@pytest.mark.parametrize("args,words", [
    (["--target", "/no/such/model"], "model not found"),
    (["--max-new-tokens", "0"], "--max-new-tokens must"),
    (["--temperature", "-1"], "temperature"),
    (["--top-p", "1.5"], "--top-p must"),
    (["--dtype", "float8"], "unknown dtype"),
    (["--drafter", "medusa2000"], "unknown drafter"),
    (["--drafter", "ngram", "--tree", "static:no-such-tree"], "no built-in tree"),
    (["--drafter", "ngram", "--tree", "chain:k=500"], "budget"),
    (["--device", "cuda"], "cuda"),
])
def test_bad_input_gets_one_clear_line(args, words):
    assert_user_error(specdec("generate", "hi", *TINY, *args), words)


def test_unreadable_gguf_is_a_clear_error(tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 20)
    assert_user_error(specdec("generate", "hi", "--target", str(bad)), "cannot read GGUF")


def test_prompt_longer_than_the_context_is_refused():
    assert_user_error(specdec("generate", "word " * 1100, *TINY), "context")


def test_models_lists_the_default_alias():
    result = specdec("models")
    assert result.returncode == 0, result.stderr
    assert "smollm2-135m" in result.stdout


def test_batch_mode_writes_one_result_per_prompt(tmp_path):
    prompts = tmp_path / "in.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": f"count {i} {i} {i}"}) for i in range(5)) + "\n")
    out = tmp_path / "out.jsonl"
    result = specdec("generate", *TINY, "--prompts-file", str(prompts), "--output", str(out), "--max-new-tokens",
                     "6", "--max-concurrency", "2", "--drafter", "ngram")
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["index"] for r in rows] == list(range(5))
    assert all(len(r["token_ids"]) == 6 for r in rows)


def test_generate_json_with_penalties_logprobs_and_two_samples():
    result = specdec("generate", "hello hello hello hello", *TINY, "--max-new-tokens", "6", "--json",
                     "--drafter", "ngram", "--temperature", "0.8", "--seed", "3", "--frequency-penalty", "0.5",
                     "--presence-penalty", "0.2", "--repetition-penalty", "1.2", "--min-p", "0.05",
                     "--logit-bias", "65=1.5", "--stop-token-id", "0", "--min-new-tokens", "2", "--logprobs", "2",
                     "--n", "2")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert len(data["samples"]) == 2 and data["samples"][0]["token_ids"] == data["token_ids"]
    for sample in data["samples"]:
        assert [lp["token_id"] for lp in sample["logprobs"]] == sample["token_ids"]
        assert all(len(lp["top"]) <= 2 and lp["logprob"] <= 0 for lp in sample["logprobs"])


@pytest.mark.parametrize("args,words", [
    (["--frequency-penalty", "3"], "--frequency-penalty must"),
    (["--min-p", "2"], "--min-p must"),
    (["--logit-bias", "abc"], "TOKEN_ID=BIAS"),
    (["--logit-bias", "5=500"], "--logit-bias values"),
    (["--logit-bias", "999999=1"], "outside the model's vocabulary"),
    (["--logprobs", "50"], "logprobs must"),
    (["--n", "0"], "n must"),
    (["--min-new-tokens", "500"], "--min-new-tokens must"),
])
def test_bad_sampling_controls_get_one_clear_line(args, words):
    assert_user_error(specdec("generate", "hi", *TINY, *args), words)
