"""Batch mode (`specdec generate --prompts-file`): stdout carries JSONL only, nothing that finished is lost,
bad records become error records while the rest run, and the output path is checked before the model loads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli.runner import TINY, assert_user_error, run_cli

# Every check below must fail before the model would load: this target does not exist, so reaching the load
# would give "model not found" instead of the message the test expects.
MISSING_MODEL = ["--target", "/no/such/model", "--no-chat"]


def write_prompts(path: Path, lines: list) -> Path:
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return path


def records(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_results_on_stdout_are_plain_jsonl_and_progress_goes_to_stderr(tmp_path):
    """Issue 18: the progress bar went to stdout and the console hard-wrapped the JSON lines at 80 columns."""
    long_text = "count " + " ".join(str(i) for i in range(60))  # a prompt and a record wider than 80 columns
    prompts = write_prompts(tmp_path / "in.jsonl", [{"prompt": long_text}, {"prompt": "b b b"}, {"prompt": "c"}])
    result = run_cli("generate", *TINY, "--prompts-file", str(prompts), "--max-new-tokens", "6")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 3 and all(len(line) > 80 for line in lines)
    rows = [json.loads(line) for line in lines]  # every line parses: nothing else is on stdout
    assert sorted(r["index"] for r in rows) == [0, 1, 2]
    assert {r["prompt"] for r in rows} == {long_text, "b b b", "c"}
    assert "generating" in result.stderr and "wrote 3 result(s)" in result.stderr


def test_batch_mode_writes_one_result_per_prompt(tmp_path):
    prompts = write_prompts(tmp_path / "in.jsonl", [{"prompt": f"count {i} {i} {i}"} for i in range(5)])
    out = tmp_path / "out.jsonl"
    result = run_cli("generate", *TINY, "--prompts-file", str(prompts), "--output", str(out), "--max-new-tokens",
                     "6", "--max-concurrency", "2", "--drafter", "ngram")
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""
    rows = sorted(records(out.read_text()), key=lambda r: r["index"])
    assert [r["index"] for r in rows] == list(range(5))
    assert all(len(r["token_ids"]) == 6 and r["finish_reason"] == "length" for r in rows)


def test_a_malformed_line_and_an_overlong_prompt_become_error_records_while_the_rest_run(tmp_path):
    """Issue 18: one over-long prompt aborted the whole batch (0 of 3 done); a malformed line rejected the file."""
    prompts = write_prompts(tmp_path / "in.jsonl", [
        {"prompt": "first", "id": "a"}, "{not json", {"text": "no prompt field"}, {"prompt": "word " * 1100},
        {"prompt": "last", "id": "z"},
    ])
    out = tmp_path / "out.jsonl"
    result = run_cli("generate", *TINY, "--prompts-file", str(prompts), "--output", str(out), "--max-new-tokens", "4")
    assert result.returncode == 1, result.stderr  # some records failed; each says why
    assert "Traceback" not in result.stderr
    rows = {r["index"]: r for r in records(out.read_text())}
    assert sorted(rows) == [0, 1, 2, 3, 4]
    assert rows[0]["id"] == "a" and len(rows[0]["token_ids"]) == 4
    assert rows[4]["id"] == "z" and len(rows[4]["token_ids"]) == 4
    assert "line 2" in rows[1]["error"] and "malformed JSON" in rows[1]["error"]
    assert "line 3" in rows[2]["error"] and '"prompt"' in rows[2]["error"]
    assert "context" in rows[3]["error"] and rows[3]["line"] == 4
    assert "2 result(s)" in result.stderr and "3 record(s) failed" in result.stderr


@pytest.mark.parametrize("make_output, words", [
    (lambda tmp: tmp, "is a folder"),
    (lambda tmp: Path("/proc/specdec-results.jsonl"), "cannot write --output"),
    (lambda tmp: tmp / "in.jsonl", "is the prompts file itself"),
])
def test_an_unusable_output_is_refused_before_the_model_loads(tmp_path, make_output, words):
    """Issue 18: these showed a traceback after generating everything."""
    prompts = write_prompts(tmp_path / "in.jsonl", [{"prompt": "hi"}])
    result = run_cli("generate", *MISSING_MODEL, "--prompts-file", str(prompts), "--output", str(make_output(tmp_path)))
    assert_user_error(result, words)


def test_a_missing_output_folder_is_created(tmp_path):
    prompts = write_prompts(tmp_path / "in.jsonl", [{"prompt": "hi"}, {"prompt": "there"}])
    out = tmp_path / "new" / "sub" / "out.jsonl"
    result = run_cli("generate", *TINY, "--prompts-file", str(prompts), "--output", str(out), "--max-new-tokens", "3")
    assert result.returncode == 0, result.stderr
    assert len(records(out.read_text())) == 2


def test_an_output_holding_results_is_neither_overwritten_nor_appended_to_by_accident(tmp_path):
    prompts = write_prompts(tmp_path / "in.jsonl", [{"prompt": "hi"}])
    out = tmp_path / "out.jsonl"
    out.write_text('{"index": 0, "text": "precious"}\n')
    assert_user_error(run_cli("generate", *MISSING_MODEL, "--prompts-file", str(prompts), "--output", str(out)),
                      "--resume")
    assert out.read_text() == '{"index": 0, "text": "precious"}\n'
    result = run_cli("generate", *TINY, "--prompts-file", str(prompts), "--output", str(out), "--overwrite",
                     "--max-new-tokens", "2")
    assert result.returncode == 0, result.stderr
    assert "precious" not in out.read_text() and len(records(out.read_text())) == 1


def test_resume_runs_only_the_missing_records_and_drops_a_cut_last_line(tmp_path):
    prompts = write_prompts(tmp_path / "in.jsonl", [{"prompt": f"p{i}"} for i in range(4)])
    out = tmp_path / "out.jsonl"
    full = run_cli("generate", *TINY, "--prompts-file", str(prompts), "--max-new-tokens", "5")
    reference = {r["index"]: r["token_ids"] for r in records(full.stdout)}
    kept = [line for line in full.stdout.splitlines() if json.loads(line)["index"] in (0, 2)]
    out.write_text("\n".join(kept) + '\n{"index": 3, "text": "cut by a ki')  # a SIGKILL mid-write
    result = run_cli("generate", *TINY, "--prompts-file", str(prompts), "--output", str(out), "--resume",
                     "--max-new-tokens", "5")
    assert result.returncode == 0, result.stderr
    assert "2 of 4 records already" in result.stderr and "half-written" in result.stderr
    rows = records(out.read_text())
    assert sorted(r["index"] for r in rows) == [0, 1, 2, 3]
    assert {r["index"]: r["token_ids"] for r in rows} == reference


def test_missing_or_empty_prompts_files_are_clear_errors(tmp_path):
    assert_user_error(run_cli("generate", *MISSING_MODEL, "--prompts-file", str(tmp_path / "none.jsonl")),
                      "prompt file not found")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    assert_user_error(run_cli("generate", *MISSING_MODEL, "--prompts-file", str(empty)), "holds no prompts")


def test_resume_needs_an_output_file(tmp_path):
    prompts = write_prompts(tmp_path / "in.jsonl", [{"prompt": "hi"}])
    assert_user_error(run_cli("generate", *MISSING_MODEL, "--prompts-file", str(prompts), "--resume"), "--output")
