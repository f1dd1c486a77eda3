"""The fault test of issue 18: a batch run killed midway (SIGINT, then SIGKILL) keeps every record that
finished, parseable, and `--resume` completes the rest with the same greedy output as an uninterrupted run."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.cli.runner import TINY, cli_env, command, run_cli

N_PROMPTS = 36  # at ~1000 tok/s a shorter batch can finish before a starved test process sends its signal
ARGS = ["--max-new-tokens", "160", "--max-concurrency", "1"]  # one request at a time: records finish one by one


def _prompts(tmp_path: Path) -> Path:
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps({"id": f"q{i}", "prompt": f"prompt number {i}: " + "abc " * i}) + "\n"
                            for i in range(N_PROMPTS)))
    return path


def _complete_lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def _kill_midway(prompts: Path, out: Path, sig: int) -> subprocess.CompletedProcess:
    """Start a batch run, wait until a few records are on disk, then send `sig`."""
    # As at a terminal, SIGINT must reach the run: a test suite started in the background by a non-interactive
    # shell (`bash -c '... &'`) inherits SIGINT ignored, and Python then installs no KeyboardInterrupt handler.
    proc = subprocess.Popen(command("generate", *TINY, "--prompts-file", str(prompts), "--output", str(out), *ARGS),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env(),
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 600
    while _complete_lines(out) < 3:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"the run ended (or stalled) before 3 records were written: {proc.communicate()[1]}")
        time.sleep(0.05)
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict[str, list[int]]:
    tmp = tmp_path_factory.mktemp("reference")
    result = run_cli("generate", *TINY, "--prompts-file", str(_prompts(tmp)), *ARGS)
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(rows) == N_PROMPTS
    return {r["id"]: r["token_ids"] for r in rows}


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["SIGINT", "SIGKILL"])
def test_a_killed_batch_keeps_what_finished_and_resume_completes_it_identically(tmp_path, reference, sig):
    prompts, out = _prompts(tmp_path), tmp_path / "out.jsonl"
    killed = _kill_midway(prompts, out, sig)
    if sig == signal.SIGINT:
        assert killed.returncode == 130, killed.stderr
        assert "interrupted" in killed.stderr and "--resume" in killed.stderr
        assert "Traceback" not in killed.stderr
    else:
        assert killed.returncode == -signal.SIGKILL
    data = out.read_bytes()
    kept = [json.loads(line) for line in data.split(b"\n")[: data.count(b"\n")]]  # every complete line parses
    assert 3 <= len(kept) < N_PROMPTS, "the kill should land midway"
    for row in kept:  # what was kept is exactly what an uninterrupted run produces
        assert row["token_ids"] == reference[row["id"]]

    resumed = run_cli("generate", *TINY, "--prompts-file", str(prompts), "--output", str(out), "--resume", *ARGS)
    assert resumed.returncode == 0, resumed.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r["id"] for r in rows) == sorted(reference)  # each record once: none lost, none repeated
    assert {r["id"]: r["token_ids"] for r in rows} == reference
