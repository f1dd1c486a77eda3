"""`specdec serve` as a user runs it: a subprocess that listens, answers the openai client, and refuses bad
options with one red line."""

from __future__ import annotations

import re
import subprocess
import time

import openai

from tests.cli.runner import ROOT, assert_user_error, cli_env, command, run_cli


def test_serve_answers_the_openai_client():
    proc = subprocess.Popen(command("serve", "--target", "dummy:tiny-llama", "--port", "0", "--threads", "1",
                                    "--model-name", "tiny"), stderr=subprocess.PIPE, text=True, env=cli_env(),
                            cwd=ROOT)
    try:
        port, deadline, seen = None, time.monotonic() + 120, []
        while port is None and time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line and proc.poll() is not None:
                break
            seen.append(line)
            match = re.search(r"running on http://127\.0\.0\.1:(\d+)", line)
            port = int(match.group(1)) if match else None
        assert port is not None, "".join(seen)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=60)
        out = client.completions.create(model="tiny", prompt="hello", max_tokens=5, temperature=0)
        assert out.usage.completion_tokens == 5
        # speculation is on by default: the hybrid on a 3-node chain, the best measured on both serving goals
        served = client.models.list().data[0].model_extra["specdec"]
        assert (served["drafter"], served["tree"]) == ("hybrid:suffix+recycle", "chain:k=2")
    finally:
        proc.terminate()
        proc.wait(30)
        proc.stderr.close()


def test_serve_bad_options_get_one_clear_line():
    assert_user_error(run_cli("serve", "--target", "dummy:tiny-llama", "--port", "70000"), "--port")
    assert_user_error(run_cli("serve", "--target", "dummy:tiny-llama", "--drafter", "nope"), "unknown drafter")
    assert_user_error(run_cli("serve", "--target", "dummy:tiny-llama", "--prefill-while-decoding", "-1"),
                      "--prefill-while-decoding")
